/*
 * sim_util.c: configuration, logging (its front: sim_warn, sim_debug), clocks and robust locks
 * of the simulated GPU.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "krex_log.h"
#include "sim.h"

struct sim_config sim_cfg;

/* The writer is shim/log.c, shared with the preload library; the prefix is the simulator's. */
#define LOG_HEAD "krex-sim (simulated GPU): [pid "
#define LOG_TAIL "] "

void sim_warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    krex_log_write(LOG_HEAD, LOG_TAIL, fmt, ap);
    va_end(ap);
}

void sim_debug(const char *fmt, ...)
{
    if (!sim_cfg.debug)
        return;
    va_list ap;
    va_start(ap, fmt);
    krex_log_write(LOG_HEAD, LOG_TAIL, fmt, ap);
    va_end(ap);
}

double sim_env_number(const char *name, double dflt, double lo, double hi)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return dflt;
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end != '\0' || !(v >= lo && v <= hi)) {
        sim_warn("ignoring %s=\"%s\" (expected a number in [%g, %g]); using %g", name, s, lo, hi,
                 dflt);
        return dflt;
    }
    return v;
}

/* Sizes: see sim_parse_bytes in sim.h. */
#define SIM_BYTES_MAX (1ULL << 50)
#define SIM_MEM_MIN (1ULL << 20)

int sim_parse_bytes(const char *s, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    int ok = errno == 0 && end != s && s[0] >= '0' && s[0] <= '9';
    unsigned shift = 0;
    if (ok && *end) {
        static const char units[] = "KMGT";
        const char *u = strchr(units, end[0] == 'k' ? 'K' : end[0]);
        if (!u || !*u) {
            ok = 0;
        } else {
            shift = 10U * (unsigned)(u - units + 1);
            const char *rest = end + 1;
            ok = !*rest || !strcmp(rest, "B") || !strcmp(rest, "iB");
        }
    }
    if (ok && (v > (SIM_BYTES_MAX >> shift)))
        ok = 0;
    if (ok)
        *out = (uint64_t)v << shift;
    return ok;
}

/* A size from the environment (sim_parse_bytes), at least `lo` (`range` says so in words);
 * unset: `dflt`; malformed or out of range: `dflt`, with a warning. */
static uint64_t sim_env_bytes(const char *name, uint64_t dflt, uint64_t lo, const char *range)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return dflt;
    uint64_t bytes = 0;
    if (!sim_parse_bytes(s, &bytes) || bytes < lo) {
        sim_warn("ignoring %s=\"%s\" (expected bytes, optionally with K, M, G or T, %s); using "
                 "%llu",
                 name, s, range, (unsigned long long)dflt);
        return dflt;
    }
    return bytes;
}

void sim_config_load(void)
{
    struct sim_config *c = &sim_cfg;
    const char *dbg = getenv("KREX_SIM_DEBUG");
    c->debug = dbg && *dbg && strcmp(dbg, "0") != 0;

    const char *name = getenv("KREX_SIM_SHM");
    if (name && *name) {
        snprintf(c->shm_name, sizeof c->shm_name, "%s%s", name[0] == '/' ? "" : "/", name);
    } else {
        snprintf(c->shm_name, sizeof c->shm_name, "/krex-sim-%u", (unsigned)getuid());
    }
    double gpus = sim_env_number("KREX_SIM_GPUS", 1, 0, 1e9);
    if (gpus > SIM_MAX_GPUS) {
        sim_warn("KREX_SIM_GPUS=%g is more than the %u simulated GPUs a node can have; using %u",
                 gpus, SIM_MAX_GPUS, SIM_MAX_GPUS);
        gpus = SIM_MAX_GPUS;
    }
    c->n_gpus = (unsigned)gpus;
    /* CUDA_VISIBLE_DEVICES as the real driver reads it: indices up to the first one that is
     * not a device (or repeats one); unset means every GPU. */
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    c->n_visible = 0;
    if (!vis) {
        for (unsigned i = 0; i < c->n_gpus; i++)
            c->visible[c->n_visible++] = (int)i;
    } else {
        const char *p = vis;
        while (*p && c->n_visible < SIM_MAX_GPUS) {
            char *end = NULL;
            errno = 0;
            long v = strtol(p, &end, 10);
            if (errno || end == p || v < 0 || (unsigned long)v >= c->n_gpus)
                break;
            int seen = 0;
            for (unsigned i = 0; i < c->n_visible; i++)
                seen |= c->visible[i] == (int)v;
            if (seen)
                break;
            c->visible[c->n_visible++] = (int)v;
            if (*end != ',')
                break;
            p = end + 1;
        }
    }
    c->ctx_create_ns = sim_env_number("KREX_SIM_CTX_CREATE_MS", 0, 0, 3600e3) * 1e6;
    c->copy_bytes_per_ns = sim_env_number("KREX_SIM_COPY_GBPS", 50, 1e-6, 1e9);
    c->launch_gap_ns = sim_env_number("KREX_SIM_LAUNCH_GAP_US", 1000, 0, 1e6) * 1e3;

    c->mem_bytes = sim_env_bytes("KREX_SIM_MEM_BYTES", SIM_TOTAL_MEM, SIM_MEM_MIN,
                                 "between 1 MiB and 1 PiB");
    /* What the driver allocates for itself (docs/simulator.md, "Device memory"). */
    c->ctx_bytes = sim_env_bytes("KREX_SIM_CTX_BYTES", 0, 0, "up to 1 PiB");
    c->module_bytes = sim_env_bytes("KREX_SIM_MODULE_BYTES", 0, 0, "up to 1 PiB");
    c->local_bytes = sim_env_bytes("KREX_SIM_LOCAL_BYTES", 0, 0, "up to 1 PiB");
    c->graph_bytes = sim_env_bytes("KREX_SIM_GRAPH_BYTES", 0, 0, "up to 1 PiB");
    /* As the real driver reads it, where only LAZY turns lazy loading on; its default has been
     * lazy since CUDA 12.2, the simulator's stays eager (so a module costs its memory at load
     * unless a workload asks otherwise). */
    const char *loading = getenv("CUDA_MODULE_LOADING");
    c->lazy_loading = loading && strcmp(loading, "LAZY") == 0;

    const char *w = getenv("KREX_SIM_WITNESS");
    snprintf(c->witness_path, sizeof c->witness_path, "%s", w ? w : "");
    c->tenant = (uint32_t)sim_env_number("KREX_TENANT", 0, 0, UINT32_MAX);

    sim_debug("config: shm %s, %u GPU(s), context creation %.3f ms, copies %.3f GB/s, launch "
              "gap %.1f us%s%s",
              c->shm_name, c->n_gpus, c->ctx_create_ns / 1e6, c->copy_bytes_per_ns,
              c->launch_gap_ns / 1e3, c->witness_path[0] ? ", witness " : "", c->witness_path);
    sim_debug("config: the driver's own device memory: context %llu, module %llu (%s loading), "
              "local %llu, graph %llu byte(s)",
              (unsigned long long)c->ctx_bytes, (unsigned long long)c->module_bytes,
              c->lazy_loading ? "lazy" : "eager", (unsigned long long)c->local_bytes,
              (unsigned long long)c->graph_bytes);
}

int64_t sim_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void sim_sleep_until(int64_t abs_ns)
{
    struct timespec ts = {.tv_sec = abs_ns / 1000000000LL, .tv_nsec = abs_ns % 1000000000LL};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

void sim_robust_init(pthread_mutex_t *m)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(m, &a);
    pthread_mutexattr_destroy(&a);
}

int sim_robust_lock(pthread_mutex_t *m, int *recovered)
{
    *recovered = 0;
    int r = pthread_mutex_lock(m);
    if (r == EOWNERDEAD) {
        /* Its holder died inside: we own it now; make it usable again and let the caller
         * repair whatever the dead holder left half done. */
        pthread_mutex_consistent(m);
        *recovered = 1;
        r = 0;
    }
    if (r != 0)
        sim_warn("cannot take a lock of the simulated node (%s)", strerror(r));
    return r;
}
