/* log.c: the shim's only output: warnings, and a debug log switched on by KREX_DEBUG=1. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "shim.h"

static int debug_state = -1; /* -1 unknown, 0 off, 1 on: KREX_DEBUG is read once */

static void emit(const char *fmt, va_list ap)
{
    char buf[512];
    int n = snprintf(buf, sizeof buf, "krex[%d]: ", (int)getpid());
    if (n < 0)
        return;
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    if (m < 0)
        return;
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof buf - 2)
        len = sizeof buf - 2;
    buf[len++] = '\n';
    /* One write(2): lines from several processes never interleave mid-line. */
    ssize_t w = write(STDERR_FILENO, buf, len);
    (void)w;
}

void krex_warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    emit(fmt, ap);
    va_end(ap);
}

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
    emit(fmt, ap);
    va_end(ap);
}
