/* log.c: the one log writer, compiled into libkrex.so, libkrex-hip.so and the simulated driver. */
#include <stdio.h>
#include <unistd.h>

#include "krex_log.h"

void krex_log_write(const char *head, const char *tail, const char *fmt, va_list ap)
{
    char line[1024];
    int n = snprintf(line, sizeof line, "%s%d%s", head, (int)getpid(), tail);
    if (n < 0 || (size_t)n >= sizeof line)
        return;
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    if (m < 0)
        return;
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    /* One write(2): lines from several processes never interleave mid-line. */
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}
