/*
 * krex_log.h: the one log writer of KREX's C libraries (shim/log.c). Each library keeps its own
 * front: the preload and HIP libraries krex_warn/krex_debug ("krex[<pid>]: ", KREX_DEBUG), the
 * simulated driver sim_warn/sim_debug ("krex-sim (simulated GPU): [pid <pid>] ", KREX_SIM_DEBUG).
 */
#ifndef KREX_LOG_H
#define KREX_LOG_H

#include <stdarg.h>

/* Write "<head><pid><tail><message>\n" to stderr in one write(2), cut to 1 KiB. */
void krex_log_write(const char *head, const char *tail, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

#endif /* KREX_LOG_H */
