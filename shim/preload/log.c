/* log.c: the shim's only output: warnings, and a debug log switched on by KREX_DEBUG=1 (the
 * writer is shim/log.c, shared with the simulated driver). */
#include <stdarg.h>
#include <stdlib.h>

#include "krex_log.h"
#include "shim.h"

#define LOG_HEAD "krex["
#define LOG_TAIL "]: "

static int debug_state = -1; /* -1 unknown, 0 off, 1 on: KREX_DEBUG is read once */

void krex_debug(const char *fmt, ...)
{
    int on = __atomic_load_n(&debug_state, __ATOMIC_RELAXED);
    if (on < 0) {
        const char *v = getenv("KREX_DEBUG");
        on = v && v[0] && v[0] != '0';
        __atomic_store_n(&debug_state, on, __ATOMIC_RELAXED);
    }
    if (!on)
        return;
    va_list ap;
    va_start(ap, fmt);
    krex_log_write(LOG_HEAD, LOG_TAIL, fmt, ap);
    va_end(ap);
}

void krex_warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    krex_log_write(LOG_HEAD, LOG_TAIL, fmt, ap);
    va_end(ap);
}
