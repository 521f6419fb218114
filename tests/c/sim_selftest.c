/*
 * sim_selftest.c: checks of the simulated GPU (shim/sim/, built as libcuda.so.1).
 *
 * Build: gcc -std=gnu11 -O2 -Wall -Wextra -pthread -Ishim tests/c/sim_selftest.c -o sim_selftest
 *            -L<dir> -l:libcuda.so.1 -Wl,-rpath,<dir> -ldl -lm -lpthread  (tests/test_sim.py does)
 * Run it with a private KREX_SIM_SHM (it makes and removes one of its own when unset).
 * Prints "N passed, M failed"; exits non-zero on any failure.
 *
 * A kernel's run time is its first parameter, in nanoseconds (the simulator's convention).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "krex_cuda.h"
#include "sim/krexsim.h"
#include "sim/sim.h" /* the segment's layout, for the killed-lock-holder test */

/* The driver entry points used here, by exact ELF name (krex_cuda.h declares types only). */
CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int *v);
CUresult cuDeviceGet(CUdevice *d, int ordinal);
CUresult cuDeviceGetCount(int *n);
CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev);
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active);
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *p, unsigned int flags, CUdevice dev);
CUresult cuCtxDestroy_v2(CUcontext ctx);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxGetCurrent(CUcontext *pctx);
CUresult cuCtxPushCurrent_v2(CUcontext ctx);
CUresult cuCtxPopCurrent_v2(CUcontext *pctx);
CUresult cuCtxSynchronize(void);
CUresult cuCtxGetDevice(CUdevice *d);
CUresult cuModuleLoadData(CUmodule *m, const void *image);
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name);
CUresult cuModuleUnload(CUmodule m);
CUresult cuStreamCreate(CUstream *s, unsigned int flags);
CUresult cuStreamDestroy_v2(CUstream s);
CUresult cuStreamSynchronize(CUstream s);
CUresult cuStreamQuery(CUstream s);
CUresult cuEventCreate(CUevent *e, unsigned int flags);
CUresult cuEventRecord(CUevent e, CUstream s);
CUresult cuEventRecord_ptsz(CUevent e, CUstream s);
CUresult cuEventQuery(CUevent e);
CUresult cuEventSynchronize(CUevent e);
CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b);
CUresult cuEventDestroy_v2(CUevent e);
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n);
CUresult cuMemFree_v2(CUdeviceptr p);
CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n);
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);
CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n);
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s);
CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dst, CUdeviceptr src, size_t n, CUstream s);
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n);
CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream s);
CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                        CUstream s, void **params, void **extra);
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                             unsigned int bx, unsigned int by, unsigned int bz,
                             unsigned int shmem, CUstream s, void **params, void **extra);
CUresult cuLaunchKernelEx(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra);
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                   unsigned int gz, unsigned int bx, unsigned int by,
                                   unsigned int bz, unsigned int shmem, CUstream s,
                                   void **params);
CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *data);
CUresult cuGraphLaunch(CUgraphExec g, CUstream s);
CUresult cuGetErrorName(CUresult e, const char **s);
CUresult cuGetErrorString(CUresult e, const char **s);
CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t flags);
CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status);

/* ---- Checking. ---- */

static int n_pass, n_fail;

#define CHECK(cond, ...)                                                                       \
    do {                                                                                       \
        if (cond) {                                                                            \
            n_pass++;                                                                          \
        } else {                                                                               \
            n_fail++;                                                                          \
            printf("FAIL %s:%d: ", __func__, __LINE__);                                        \
            printf(__VA_ARGS__);                                                               \
            printf("\n");                                                                      \
            fflush(stdout);                                                                    \
        }                                                                                      \
    } while (0)

#define CHECK_CU(call, want)                                                                   \
    do {                                                                                       \
        CUresult r_ = (call);                                                                  \
        CHECK(r_ == (want), "%s returned %d, expected %d", #call, (int)r_, (int)(want));       \
    } while (0)

#define OK(call) CHECK_CU(call, CUDA_SUCCESS)

#define MS 1000000ULL /* nanoseconds */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static CUfunction kernel; /* any function handle: its run time is its first parameter */

static CUresult launch(CUstream s, uint64_t ns)
{
    void *params[] = {&ns};
    return cuLaunchKernel(kernel, 1, 1, 1, 32, 1, 1, 0, s, params, NULL);
}

/* Queue n kernels of `ns` each with events around them; fill ms[0..n-1] after syncing. */
static void timed_kernels(CUstream s, int n, uint64_t ns, float *ms)
{
    CUevent ev[16];
    for (int i = 0; i <= n; i++)
        OK(cuEventCreate(&ev[i], 0));
    OK(cuEventRecord(ev[0], s));
    for (int i = 0; i < n; i++) {
        OK(launch(s, ns));
        OK(cuEventRecord(ev[i + 1], s));
    }
    OK(cuEventSynchronize(ev[n]));
    for (int i = 0; i < n; i++) {
        ms[i] = -1;
        OK(cuEventElapsedTime_v2(&ms[i], ev[i], ev[i + 1]));
    }
    for (int i = 0; i <= n; i++)
        OK(cuEventDestroy_v2(ev[i]));
}

static int near(double got, double want, double rel)
{
    return fabs(got - want) <= want * rel;
}

static CUcontext primary(int dev)
{
    CUcontext c = NULL;
    OK(cuDevicePrimaryCtxRetain(&c, dev));
    OK(cuCtxSetCurrent(c));
    return c;
}

/* ---- Tests. ---- */

static void test_basics(void)
{
    int v = 0, n = 0, a = -1;
    OK(cuInit(0));
    OK(cuDriverGetVersion(&v));
    CHECK(v == 13000, "driver version %d", v);
    OK(cuDeviceGetCount(&n));
    const char *want_n = getenv("KREX_SIM_GPUS");
    CHECK(n == atoi(want_n), "device count %d, KREX_SIM_GPUS=%s", n, want_n);
    CUdevice d = -1;
    OK(cuDeviceGet(&d, 0));
    CHECK(d == 0, "device %d", d);
    CHECK_CU(cuDeviceGet(&d, n), CUDA_ERROR_INVALID_DEVICE);
    char name[64];
    OK(cuDeviceGetName(name, sizeof name, 0));
    CHECK(strcmp(name, "KREX simulated GPU 0") == 0, "name \"%s\"", name);
    size_t total = 0;
    OK(cuDeviceTotalMem_v2(&total, 0));
    CHECK(total > 140000000000ULL && total < 160000000000ULL, "total memory %zu", total);
    const int attrs[][2] = {{75, 9}, {76, 0}, {16, 132}, {10, 32}, {1, 1024}, {9999, 0}};
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
        OK(cuDeviceGetAttribute(&a, attrs[i][0], 0));
        CHECK(a == attrs[i][1], "attribute %d = %d", attrs[i][0], a);
    }
    OK(cuDeviceGetAttribute(&a, 13, 0));
    CHECK(a > 1000000, "clock rate %d kHz", a);
    const char *s = NULL;
    OK(cuGetErrorName(CUDA_ERROR_NOT_READY, &s));
    CHECK(s && strcmp(s, "CUDA_ERROR_NOT_READY") == 0, "error name %s", s ? s : "(null)");
    OK(cuGetErrorString(CUDA_ERROR_INVALID_VALUE, &s));
    CHECK(s && strcmp(s, "invalid argument") == 0, "error string %s", s ? s : "(null)");
    CHECK_CU(cuGetErrorName((CUresult)12345, &s), CUDA_ERROR_INVALID_VALUE);
}

static void *no_context_thread(void *arg)
{
    (void)arg;
    CUstream s;
    CUcontext c = (CUcontext)1;
    OK(cuCtxGetCurrent(&c));
    CHECK(c == NULL, "a new thread has no current context");
    CHECK_CU(cuStreamCreate(&s, 0), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_CU(launch(NULL, 1000), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_CU(cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
    return NULL;
}

static void test_contexts(void)
{
    pthread_t t;
    pthread_create(&t, NULL, no_context_thread, NULL);
    pthread_join(t, NULL);

    unsigned flags = 1;
    int active = 0;
    OK(cuDevicePrimaryCtxGetState(0, &flags, &active));
    CHECK(active == 1, "primary context active after retain");
    CUcontext cur = NULL, popped = NULL, mine = NULL;
    OK(cuCtxGetCurrent(&cur));
    OK(cuCtxCreate_v4(&mine, NULL, 0, 1));
    OK(cuCtxGetCurrent(&popped));
    CHECK(popped == mine, "cuCtxCreate pushes the new context");
    CUdevice d = -1;
    OK(cuCtxGetDevice(&d));
    CHECK(d == 1, "new context's device %d", d);
    OK(cuCtxPopCurrent_v2(&popped));
    CHECK(popped == mine, "pop returns it");
    OK(cuCtxGetCurrent(&popped));
    CHECK(popped == cur, "the previous context is current again");
    OK(cuCtxPushCurrent_v2(mine));
    OK(cuCtxDestroy_v2(mine));
    OK(cuCtxGetCurrent(&popped));
    CHECK(popped == cur, "destroy pops the destroyed current context");
    CHECK_CU(cuCtxPushCurrent_v2(mine), CUDA_ERROR_CONTEXT_IS_DESTROYED);
}

static void test_alone(void)
{
    /* The product: a kernel alone measures its length, host load or not. */
    CUstream s;
    OK(cuStreamCreate(&s, 0));
    float ms[10];
    double worst = 0;
    for (int rep = 0; rep < 5; rep++) {
        timed_kernels(s, 4, 2 * MS, ms);
        for (int i = 0; i < 4; i++) {
            double err = fabs(ms[i] - 2.0) * 1e3; /* microseconds */
            if (err > worst)
                worst = err;
            CHECK(near(ms[i], 2.0, 0.01), "a 2 ms kernel alone measured %.6f ms", ms[i]);
        }
    }
    /* Back to back (one event pair around one kernel, stream idle before). */
    for (int rep = 0; rep < 10; rep++) {
        timed_kernels(s, 1, 2 * MS, ms);
        double err = fabs(ms[0] - 2.0) * 1e3;
        if (err > worst)
            worst = err;
        CHECK(near(ms[0], 2.0, 0.01), "a 2 ms kernel alone measured %.6f ms", ms[0]);
    }
    printf("alone: worst error of a 2 ms kernel over 30 runs: %.3f us\n", worst);
    const char *g = getenv("KREX_SIM_LAUNCH_GAP_US");
    if (!g || atof(g) > 0)
        CHECK(worst <= 1.0, "a kernel alone measures its length within 1 us: %.3f us", worst);
    OK(cuStreamDestroy_v2(s));
}

static void test_not_ready(void)
{
    CUstream s;
    CUevent a, b, never;
    float ms = 0;
    OK(cuStreamCreate(&s, 0));
    OK(cuEventCreate(&a, 0));
    OK(cuEventCreate(&b, 0));
    OK(cuEventCreate(&never, 0));
    CHECK_CU(cuEventElapsedTime_v2(&ms, a, never), CUDA_ERROR_INVALID_HANDLE);
    OK(cuEventQuery(never)); /* never recorded: nothing to wait for */
    double t0 = now_ms();
    OK(cuEventRecord(a, s));
    OK(launch(s, 2 * MS));
    OK(cuEventRecord(b, s));
    CHECK_CU(cuEventQuery(b), CUDA_ERROR_NOT_READY);
    CHECK_CU(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
    CHECK_CU(cuEventElapsedTime_v2(&ms, a, b), CUDA_ERROR_NOT_READY);
    OK(cuEventSynchronize(b));
    double waited = now_ms() - t0;
    CHECK(waited >= 1.99, "cuEventSynchronize returned after %.3f ms of a 2 ms kernel", waited);
    OK(cuEventQuery(b));
    OK(cuStreamQuery(s));
    OK(cuEventElapsedTime_v2(&ms, a, b));
    CHECK(near(ms, 2.0, 0.01), "measured %.6f ms", ms);
    CHECK_CU(cuEventElapsedTime_v2(&ms, a, never), CUDA_ERROR_INVALID_HANDLE);
    OK(cuEventDestroy_v2(a));
    OK(cuEventDestroy_v2(b));
    OK(cuEventDestroy_v2(never));
    CHECK_CU(cuEventQuery(a), CUDA_ERROR_INVALID_HANDLE);
    OK(cuStreamDestroy_v2(s));
}

static void test_stream_order(void)
{
    CUstream s;
    CUevent ev[4];
    OK(cuStreamCreate(&s, 0));
    for (int i = 0; i < 4; i++)
        OK(cuEventCreate(&ev[i], 0));
    const uint64_t len[3] = {1 * MS, 2 * MS, MS / 2};
    OK(cuEventRecord(ev[0], s));
    for (int i = 0; i < 3; i++) {
        OK(launch(s, len[i]));
        OK(cuEventRecord(ev[i + 1], s));
    }
    OK(cuStreamSynchronize(s));
    for (int i = 0; i < 3; i++) {
        float ms = 0;
        OK(cuEventElapsedTime_v2(&ms, ev[i], ev[i + 1]));
        CHECK(near(ms, len[i] / 1e6, 0.01), "job %d of the stream took %.6f ms, not %.3f", i, ms,
              len[i] / 1e6);
    }
    float all = 0;
    OK(cuEventElapsedTime_v2(&all, ev[0], ev[3]));
    CHECK(near(all, 3.5, 0.01), "in order: %.6f ms for 1 + 2 + 0.5 ms", all);

    /* cuCtxSynchronize covers every stream of the context. */
    CUstream s2;
    OK(cuStreamCreate(&s2, 0));
    OK(launch(s, 1 * MS));
    OK(cuEventRecord(ev[0], s));
    OK(launch(s2, 2 * MS));
    OK(cuEventRecord(ev[1], s2));
    OK(cuCtxSynchronize());
    OK(cuEventQuery(ev[0]));
    OK(cuEventQuery(ev[1]));
    for (int i = 0; i < 4; i++)
        OK(cuEventDestroy_v2(ev[i]));
    OK(cuStreamDestroy_v2(s));
    OK(cuStreamDestroy_v2(s2));
}

/* ---- Sharing between threads and processes. ---- */

#define SHARE_N 6

struct share_arg {
    int dev;
    pthread_barrier_t *barrier;
    float ms[SHARE_N];
};

static void *share_thread(void *p)
{
    struct share_arg *a = p;
    CUcontext c = NULL;
    OK(cuDevicePrimaryCtxRetain(&c, a->dev));
    OK(cuCtxSetCurrent(c));
    CUstream s;
    OK(cuStreamCreate(&s, 0));
    pthread_barrier_wait(a->barrier);
    timed_kernels(s, SHARE_N, 2 * MS, a->ms);
    OK(cuStreamDestroy_v2(s));
    OK(cuDevicePrimaryCtxRelease_v2(a->dev));
    return NULL;
}

/* Sum of n kernel times. */
static double total_ms(const float *ms, int n)
{
    double t = 0;
    for (int i = 0; i < n; i++)
        t += ms[i];
    return t;
}

/* Two sides ran SHARE_N 2 ms kernels each on one GPU. When they started together, processor
 * sharing makes every middle kernel take 4 ms and each side span 24 ms. A loaded machine can
 * start one side late (the scheduler, not the simulator): such a try says 0 and is tried again. */
static int aligned_pair(const float *a, const float *b)
{
    double two = SHARE_N * 2.0 * 2;
    return near(total_ms(a, SHARE_N), two, 0.02) && near(total_ms(b, SHARE_N), two, 0.02);
}

/* 1 = the pair started together and was checked; 0 = it never did in SHARE_TRIES tries, so the
 * last is held to what sharing gives whatever the start offset d: both spans 24 - d ms (work
 * is conserved), above the 12 ms of a GPU that does not share. */
static void check_shared_pair(const char *what, const float *a, const float *b, int aligned)
{
    if (aligned) {
        for (int i = 1; i < SHARE_N - 1; i++)
            CHECK(near(a[i], 4.0, 0.02) && near(b[i], 4.0, 0.02),
                  "%s: kernel %d took %.4f / %.4f ms, expected 4.0", what, i, a[i], b[i]);
        return;
    }
    double work = SHARE_N * 2.0, ta = total_ms(a, SHARE_N), tb = total_ms(b, SHARE_N);
    CHECK(near(ta, tb, 0.02) && ta > work + 0.5 && ta < 2 * work * 1.02,
          "%s: spans %.4f / %.4f ms: not one shared GPU (equal, between %.0f and %.0f)", what, ta,
          tb, work, 2 * work);
}

#define SHARE_TRIES 10

/* Two threads, each with 2 ms kernels back to back: on one GPU each kernel takes 4 ms. */
static void run_share_threads(int dev_a, int dev_b, double want)
{
    struct share_arg a, b;
    int tries = 0, aligned = 0;
    while (!aligned && tries++ < SHARE_TRIES) {
        pthread_barrier_t barrier;
        pthread_barrier_init(&barrier, NULL, 2);
        a = (struct share_arg){.dev = dev_a, .barrier = &barrier};
        b = (struct share_arg){.dev = dev_b, .barrier = &barrier};
        pthread_t ta, tb;
        pthread_create(&ta, NULL, share_thread, &a);
        pthread_create(&tb, NULL, share_thread, &b);
        pthread_join(ta, NULL);
        pthread_join(tb, NULL);
        pthread_barrier_destroy(&barrier);
        if (dev_a == dev_b) {
            aligned = aligned_pair(a.ms, b.ms);
            if (aligned || tries == SHARE_TRIES)
                check_shared_pair("threads on one GPU", a.ms, b.ms, aligned);
            continue;
        }
        /* Different GPUs: neither slows the other, whenever each starts. */
        for (int i = 0; i < SHARE_N; i++)
            CHECK(near(a.ms[i], want, 0.02) && near(b.ms[i], want, 0.02),
                  "GPUs %d/%d: kernel %d took %.4f / %.4f ms, expected %.1f", dev_a, dev_b, i,
                  a.ms[i], b.ms[i], want);
        aligned = 1;
    }
    printf("threads on GPUs %d and %d: middle kernels %.4f / %.4f ms (expected %.1f)%s, "
           "%d tries\n",
           dev_a, dev_b, a.ms[2], b.ms[2], want, aligned ? "" : " (never started together)",
           tries > SHARE_TRIES ? SHARE_TRIES : tries);
}

static void test_threads_share(void)
{
    run_share_threads(0, 0, 4.0);
    run_share_threads(0, 1, 2.0); /* each GPU has its own processor-sharing set */
}

/* Read exactly n bytes (a pipe). */
static int read_all(int fd, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

/* One try of two processes with SHARE_N 2 ms kernels each on GPU 0; 1 = both results back. */
static int processes_share_once(float ms[2][SHARE_N])
{
    int ready[2], go[2], res[2];
    if (pipe(ready) || pipe(go) || pipe(res)) {
        CHECK(0, "pipe: %s", strerror(errno));
        return 0;
    }
    fflush(stdout); /* the children must not print the parent's buffered lines again */
    pid_t kids[2];
    for (int k = 0; k < 2; k++) {
        kids[k] = fork();
        if (kids[k] == 0) {
            n_fail = 0; /* the child's exit status says what failed in the child */
            /* A child is a new process of the simulated node: its own context and streams. */
            primary(0);
            CUstream s;
            OK(cuStreamCreate(&s, 0));
            char c = 'r';
            if (write(ready[1], &c, 1) != 1 || read_all(go[0], &c, 1) != 0)
                _exit(3);
            float mine[SHARE_N];
            timed_kernels(s, SHARE_N, 2 * MS, mine);
            if (write(res[1], mine, sizeof mine) != (ssize_t)sizeof mine)
                _exit(3);
            fflush(stdout); /* _exit does not flush: the child's FAIL lines must show */
            _exit(n_fail ? 1 : 0);
        }
    }
    char c;
    for (int k = 0; k < 2; k++)
        CHECK(read_all(ready[0], &c, 1) == 0, "child %d ready", k);
    char both[2] = {'g', 'g'};
    CHECK(write(go[1], both, 2) == 2, "release children");
    int ok = 1;
    for (int k = 0; k < 2; k++) {
        int got = read_all(res[0], ms[k], sizeof ms[k]) == 0;
        CHECK(got, "result from child %d", k);
        ok = ok && got;
    }
    for (int k = 0; k < 2; k++) {
        int st = 0;
        waitpid(kids[k], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d exit status %d", k, st);
    }
    close(ready[0]), close(ready[1]), close(go[0]), close(go[1]), close(res[0]), close(res[1]);
    return ok;
}

static void test_processes_share(void)
{
    float ms[2][SHARE_N];
    int tries = 0, aligned = 0;
    while (!aligned && tries++ < SHARE_TRIES) {
        if (!processes_share_once(ms))
            return;
        aligned = aligned_pair(ms[0], ms[1]);
        if (aligned || tries == SHARE_TRIES)
            check_shared_pair("processes on one GPU", ms[0], ms[1], aligned);
    }
    printf("processes on GPU 0: a middle kernel took %.4f ms (expected 4.0)%s, %d tries\n",
           ms[0][2], aligned ? "" : " (never started together)",
           tries > SHARE_TRIES ? SHARE_TRIES : tries);
}

/* ---- Host gaps (KREX_SIM_LAUNCH_GAP_US, default 1000 us). ---- */

static void test_launch_gap(void)
{
    const char *g = getenv("KREX_SIM_LAUNCH_GAP_US");
    if (g && atof(g) != 1000) {
        printf("skipped the launch-gap test: KREX_SIM_LAUNCH_GAP_US=%s\n", g);
        return;
    }
    CUstream s;
    CUevent a, b, c, d;
    float ms = 0;
    OK(cuStreamCreate(&s, 0));
    OK(cuEventCreate(&a, 0));
    OK(cuEventCreate(&b, 0));
    OK(cuEventCreate(&c, 0));
    OK(cuEventCreate(&d, 0));
    /* A host gap longer than that is idle device time, and measured. */
    OK(cuEventRecord(a, s));
    usleep(2000);
    OK(launch(s, 1 * MS));
    OK(cuEventRecord(b, s));
    OK(cuStreamSynchronize(s));
    OK(cuEventElapsedTime_v2(&ms, a, b));
    CHECK(ms >= 2.99, "a 2 ms host sleep before a 1 ms kernel measured %.4f ms", ms);
    /* The event that ended a measurement is not moved by the next launch: only a marker that
     * is the very last thing queued before the launch is. */
    OK(cuEventRecord(a, s));
    OK(launch(s, 1000));
    usleep(300); /* the kernel is done: the stream is idle */
    OK(cuEventRecord(b, s));
    usleep(300);
    OK(cuEventRecord(c, s));
    OK(launch(s, 1 * MS));
    OK(cuEventRecord(d, s));
    OK(cuStreamSynchronize(s));
    OK(cuEventElapsedTime_v2(&ms, b, c));
    CHECK(ms >= 0.29, "b stayed before c: %.4f ms apart", ms);
    OK(cuEventElapsedTime_v2(&ms, c, d));
    CHECK(ms == 1.0f, "the kernel after c measured %.6f ms", ms);
    OK(cuEventElapsedTime_v2(&ms, a, b));
    CHECK(ms >= 0.3, "a..b kept the host time: %.4f ms", ms);
    OK(cuEventDestroy_v2(a));
    OK(cuEventDestroy_v2(b));
    OK(cuEventDestroy_v2(c));
    OK(cuEventDestroy_v2(d));
    OK(cuStreamDestroy_v2(s));
}

/* ---- Default streams. ---- */

struct default_arg {
    CUcontext ctx;
};

static void *default_stream_thread(void *p)
{
    struct default_arg *a = p;
    OK(cuCtxSetCurrent(a->ctx));
    CUevent e1, e2, e3;
    OK(cuEventCreate(&e1, 0));
    OK(cuEventCreate(&e2, 0));
    OK(cuEventCreate(&e3, 0));
    /* The legacy stream is the context's: behind the main thread's kernel. */
    OK(cuEventRecord(e1, NULL));
    CHECK_CU(cuEventQuery(e1), CUDA_ERROR_NOT_READY);
    /* This thread's per-thread stream is idle: its markers complete at once. */
    OK(cuEventRecord(e2, CU_STREAM_PER_THREAD));
    OK(cuEventQuery(e2));
    OK(cuEventRecord_ptsz(e3, NULL));
    OK(cuEventQuery(e3));
    OK(cuEventSynchronize(e1));
    OK(cuEventDestroy_v2(e1));
    OK(cuEventDestroy_v2(e2));
    OK(cuEventDestroy_v2(e3));
    return NULL;
}

static void test_default_streams(void)
{
    struct default_arg a;
    OK(cuCtxGetCurrent(&a.ctx));
    OK(launch(NULL, 100 * MS)); /* legacy default stream; long enough for the thread */
    pthread_t t;
    pthread_create(&t, NULL, default_stream_thread, &a);
    pthread_join(t, NULL);
    OK(cuStreamSynchronize(NULL));

    /* Per-thread stream of this thread vs. legacy: different streams, so they share. */
    CUevent e[2];
    OK(cuEventCreate(&e[0], 0));
    OK(cuEventCreate(&e[1], 0));
    OK(cuEventRecord(e[0], CU_STREAM_PER_THREAD));
    void *params[] = {&(uint64_t){2 * MS}};
    OK(cuLaunchKernel_ptsz(kernel, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
    OK(launch(CU_STREAM_LEGACY, 2 * MS));
    OK(cuEventRecord(e[1], CU_STREAM_PER_THREAD));
    OK(cuCtxSynchronize());
    float ms = 0;
    OK(cuEventElapsedTime_v2(&ms, e[0], e[1]));
    /* Shared: about 4 ms; serialised it would be 2 ms. The host gap between the two launches
     * adds to it under load, hence the loose bound. */
    CHECK(near(ms, 4.0, 0.10), "per-thread and legacy streams shared the GPU: %.4f ms", ms);
    OK(cuEventDestroy_v2(e[0]));
    OK(cuEventDestroy_v2(e[1]));
}

/* ---- Launch variants. ---- */

static void hostfn(void *p) { *(double *)p = now_ms(); }

static void test_launch_variants(void)
{
    CUstream s;
    CUevent a, b;
    float ms = 0;
    OK(cuStreamCreate(&s, 0));
    OK(cuEventCreate(&a, 0));
    OK(cuEventCreate(&b, 0));

    /* The run time through `extra` (no kernelParams). */
    uint64_t ns = MS;
    size_t size = sizeof ns;
    void *extra[] = {(void *)1, &ns, (void *)2, &size, (void *)0};
    OK(cuEventRecord(a, s));
    OK(cuLaunchKernel(kernel, 1, 1, 1, 1, 1, 1, 0, s, NULL, extra));
    OK(cuEventRecord(b, s));
    OK(cuEventSynchronize(b));
    OK(cuEventElapsedTime_v2(&ms, a, b));
    CHECK(near(ms, 1.0, 0.01), "extra buffer: %.4f ms", ms);

    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.hStream = s;
    uint64_t ns2 = MS / 2;
    void *params[] = {&ns2};
    OK(cuEventRecord(a, s));
    OK(cuLaunchKernelEx(&cfg, kernel, params, NULL));
    OK(cuLaunchCooperativeKernel(kernel, 1, 1, 1, 1, 1, 1, 0, s, params));
    OK(cuEventRecord(b, s));
    OK(cuEventSynchronize(b));
    OK(cuEventElapsedTime_v2(&ms, a, b));
    CHECK(near(ms, 1.0, 0.01), "cuLaunchKernelEx + cuLaunchCooperativeKernel: %.4f ms", ms);

    CHECK_CU(cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, s, params, NULL),
             CUDA_ERROR_INVALID_HANDLE);
    CHECK_CU(cuGraphLaunch(NULL, s), CUDA_ERROR_INVALID_VALUE);
    OK(cuEventRecord(a, s));
    OK(cuGraphLaunch((CUgraphExec)(uintptr_t)0x1234, s));
    OK(cuEventRecord(b, s));
    OK(cuEventElapsedTime_v2(&ms, a, b));
    CHECK(ms >= 0 && ms < 0.01, "a no-op graph takes no time: %.6f ms", ms);

    /* Host functions run when the stream reaches them. */
    double ran = 0, t0 = now_ms();
    OK(launch(s, 2 * MS));
    OK(cuLaunchHostFunc(s, hostfn, &ran));
    CHECK(ran - t0 >= 1.99, "host function ran %.3f ms after a 2 ms kernel", ran - t0);
    OK(cuEventDestroy_v2(a));
    OK(cuEventDestroy_v2(b));
    OK(cuStreamDestroy_v2(s));
}

/* ---- Memory. ---- */

static void test_copies(void)
{
    enum { N = 1 << 20 };
    size_t free0 = 0, free1 = 0, total = 0;
    OK(cuMemGetInfo_v2(&free0, &total));
    CUdeviceptr d1 = 0, d2 = 0;
    OK(cuMemAlloc_v2(&d1, N));
    OK(cuMemAlloc_v2(&d2, N));
    CHECK(d1 % 256 == 0 && d2 % 256 == 0, "device pointers aligned");
    OK(cuMemGetInfo_v2(&free1, &total));
    CHECK(free0 - free1 == 2 * N, "allocations show in cuMemGetInfo (%zu)", free0 - free1);
    unsigned char *h = malloc(N), *back = malloc(N);
    for (int i = 0; i < N; i++)
        h[i] = (unsigned char)(i * 7 + 3);
    OK(cuMemcpyHtoD_v2(d1, h, N));
    OK(cuMemcpyDtoD_v2_ptds(d2, d1, N));
    memset(back, 0, N);
    OK(cuMemcpyDtoH_v2(back, d2, N));
    CHECK(memcmp(h, back, N) == 0, "HtoD, DtoD, DtoH move the bytes");
    OK(cuMemsetD8_v2(d1, 0xAB, 100));
    OK(cuMemcpy((CUdeviceptr)(uintptr_t)back, d1, 100));
    CHECK(back[0] == 0xAB && back[99] == 0xAB && back[100] == h[100], "cuMemsetD8");

    CUstream s;
    OK(cuStreamCreate(&s, 0));
    OK(cuMemsetD32Async(d2, 0x01020304U, 16, s));
    uint32_t w[17];
    OK(cuMemcpyDtoHAsync_v2_ptsz(w, d2, sizeof w, s));
    OK(cuStreamSynchronize(s));
    CHECK(w[0] == 0x01020304U && w[15] == 0x01020304U && w[16] != 0x01020304U,
          "cuMemsetD32Async: %08x %08x %08x", w[0], w[15], w[16]);

    /* Copies take bytes / bandwidth (KREX_SIM_COPY_GBPS, default 50 GB/s) in the stream.
     * Queued behind a kernel, so that the host's own memmove time cannot show. */
    const char *gbps_s = getenv("KREX_SIM_COPY_GBPS");
    double gbps = gbps_s && *gbps_s ? atof(gbps_s) : 50.0;
    CUevent a, b;
    OK(cuEventCreate(&a, 0));
    OK(cuEventCreate(&b, 0));
    OK(launch(s, 5 * MS));
    OK(cuEventRecord(a, s));
    OK(cuMemcpyHtoDAsync_v2(d1, h, N, s));
    OK(cuEventRecord(b, s));
    OK(cuEventSynchronize(b));
    float ms = 0;
    OK(cuEventElapsedTime_v2(&ms, a, b));
    double want = N / gbps / 1e6;
    CHECK(near(ms, want, 0.01), "a %d-byte copy took %.6f ms, expected %.6f", N, ms, want);
    OK(cuEventDestroy_v2(a));
    OK(cuEventDestroy_v2(b));
    OK(cuStreamDestroy_v2(s));

    OK(cuMemFree_v2(d1));
    OK(cuMemFree_v2(d2));
    CHECK_CU(cuMemFree_v2(d2), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemGetInfo_v2(&free1, &total));
    CHECK(free1 == free0, "memory given back");
    free(h);
    free(back);
}

/* ---- cuGetProcAddress. ---- */

static const char *const exported[] = {
    "cuInit", "cuDriverGetVersion", "cuDeviceGet", "cuDeviceGetCount", "cuDeviceGetName",
    "cuDeviceTotalMem", "cuDeviceTotalMem_v2", "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2",
    "cuDevicePrimaryCtxGetState", "cuCtxCreate", "cuCtxCreate_v2", "cuCtxCreate_v3",
    "cuCtxCreate_v4", "cuCtxDestroy", "cuCtxDestroy_v2", "cuCtxSetCurrent", "cuCtxGetCurrent",
    "cuCtxPushCurrent", "cuCtxPushCurrent_v2", "cuCtxPopCurrent", "cuCtxPopCurrent_v2",
    "cuCtxSynchronize", "cuCtxGetDevice", "cuModuleLoadData", "cuModuleGetFunction",
    "cuModuleUnload", "cuStreamCreate", "cuStreamDestroy", "cuStreamDestroy_v2",
    "cuStreamSynchronize", "cuStreamSynchronize_ptsz", "cuStreamQuery", "cuStreamQuery_ptsz",
    "cuEventCreate", "cuEventRecord", "cuEventRecord_ptsz", "cuEventRecordWithFlags",
    "cuEventRecordWithFlags_ptsz", "cuEventQuery", "cuEventSynchronize", "cuEventElapsedTime",
    "cuEventElapsedTime_v2", "cuEventDestroy", "cuEventDestroy_v2", "cuMemAlloc_v2",
    "cuMemFree_v2", "cuMemGetInfo_v2", "cuMemcpyHtoD_v2", "cuMemcpyHtoD_v2_ptds",
    "cuMemcpyDtoH_v2", "cuMemcpyDtoH_v2_ptds", "cuMemcpyDtoD_v2", "cuMemcpyDtoD_v2_ptds",
    "cuMemcpy", "cuMemcpy_ptds", "cuMemcpyAsync", "cuMemcpyAsync_ptsz", "cuMemcpyHtoDAsync_v2",
    "cuMemcpyHtoDAsync_v2_ptsz", "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync_v2_ptsz",
    "cuMemcpyDtoDAsync_v2", "cuMemcpyDtoDAsync_v2_ptsz", "cuMemsetD8_v2", "cuMemsetD8_v2_ptds",
    "cuMemsetD32_v2", "cuMemsetD32_v2_ptds", "cuMemsetD8Async", "cuMemsetD8Async_ptsz",
    "cuMemsetD32Async", "cuMemsetD32Async_ptsz", "cuLaunchKernel", "cuLaunchKernel_ptsz",
    "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz", "cuLaunchCooperativeKernel",
    "cuLaunchCooperativeKernel_ptsz", "cuLaunchHostFunc", "cuLaunchHostFunc_ptsz",
    "cuGraphLaunch", "cuGraphLaunch_ptsz", "cuGetErrorName", "cuGetErrorString",
    "cuGetProcAddress", "cuGetProcAddress_v2", "krexsim_submissions",
};

static void test_procaddr(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CHECK(lib != NULL, "libcuda.so.1 is loaded: %s", dlerror());
    if (!lib)
        return;
    /* Every export is its own function: mapping an address back to a name is unambiguous. */
    size_t n = sizeof exported / sizeof exported[0];
    void *addr[sizeof exported / sizeof exported[0]];
    int missing = 0, shared = 0;
    for (size_t i = 0; i < n; i++) {
        addr[i] = dlsym(lib, exported[i]);
        if (!addr[i]) {
            missing++;
            printf("dlsym %s: %s\n", exported[i], dlerror());
        }
        for (size_t j = 0; j < i; j++) {
            if (addr[i] && addr[i] == addr[j]) {
                shared++;
                printf("%s and %s share an address\n", exported[i], exported[j]);
            }
        }
    }
    CHECK(missing == 0 && shared == 0, "%d export(s) missing, %d address(es) shared", missing,
          shared);

    const cuuint64_t DEF = CU_GET_PROC_ADDRESS_DEFAULT, LEG = CU_GET_PROC_ADDRESS_LEGACY_STREAM,
                     PTD = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    static const struct {
        const char *sym;
        int ver;
        int flags; /* 0 default, 1 legacy, 2 per-thread */
        const char *exact; /* NULL: not found */
        CUdriverProcAddressQueryResult status;
    } cases[] = {
        {"cuMemcpyHtoD", 12000, 0, "cuMemcpyHtoD_v2", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuMemcpyHtoD", 3020, 1, "cuMemcpyHtoD_v2", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuMemcpyHtoD", 12000, 2, "cuMemcpyHtoD_v2_ptds", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuMemcpyHtoD", 3010, 0, NULL, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT},
        {"cuMemcpyHtoDAsync", 12000, 2, "cuMemcpyHtoDAsync_v2_ptsz", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuMemcpyAsync", 12000, 2, "cuMemcpyAsync_ptsz", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuMemcpy", 12000, 2, "cuMemcpy_ptds", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuMemsetD32", 12000, 0, "cuMemsetD32_v2", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuMemAlloc", 12000, 2, "cuMemAlloc_v2", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuCtxCreate", 2000, 0, "cuCtxCreate", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuCtxCreate", 3020, 0, "cuCtxCreate_v2", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuCtxCreate", 11040, 0, "cuCtxCreate_v3", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuCtxCreate", 12040, 0, "cuCtxCreate_v3", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuCtxCreate", 12050, 0, "cuCtxCreate_v4", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuCtxCreate", 13000, 2, "cuCtxCreate_v4", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuCtxDestroy", 3020, 0, "cuCtxDestroy", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuCtxDestroy", 4000, 0, "cuCtxDestroy_v2", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuStreamDestroy", 12000, 0, "cuStreamDestroy_v2", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuDevicePrimaryCtxRelease", 10020, 0, "cuDevicePrimaryCtxRelease",
         CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuDevicePrimaryCtxRelease", 11000, 0, "cuDevicePrimaryCtxRelease_v2",
         CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuEventElapsedTime", 12060, 0, "cuEventElapsedTime", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuEventElapsedTime", 12080, 0, "cuEventElapsedTime_v2", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuLaunchKernel", 12000, 0, "cuLaunchKernel", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuLaunchKernel", 12000, 1, "cuLaunchKernel", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuLaunchKernel", 12000, 2, "cuLaunchKernel_ptsz", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuLaunchKernelEx", 11050, 0, NULL, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT},
        {"cuEventRecord", 12000, 2, "cuEventRecord_ptsz", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuStreamSynchronize", 12000, 2, "cuStreamSynchronize_ptsz",
         CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuGraphLaunch", 12000, 2, "cuGraphLaunch_ptsz", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuLaunchHostFunc", 12000, 0, "cuLaunchHostFunc", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuGetProcAddress", 11030, 0, "cuGetProcAddress", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuInit", 12000, 2, "cuInit", CU_GET_PROC_ADDRESS_SUCCESS},
        {"cuNoSuchThing", 12000, 0, NULL, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND},
        {"cuMemcpyHtoD_v2", 12000, 0, NULL, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cuuint64_t fl = cases[i].flags == 2 ? PTD : cases[i].flags == 1 ? LEG : DEF;
        void *p = (void *)1, *p1 = (void *)1;
        CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)99;
        CUresult r = cuGetProcAddress_v2(cases[i].sym, &p, cases[i].ver, fl, &st);
        CUresult r1 = cuGetProcAddress(cases[i].sym, &p1, cases[i].ver, fl);
        void *want = cases[i].exact ? dlsym(lib, cases[i].exact) : NULL;
        CHECK(r == (cases[i].exact ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND) && r1 == r,
              "%s@%d/%d: result %d/%d", cases[i].sym, cases[i].ver, cases[i].flags, r, r1);
        CHECK(st == cases[i].status, "%s@%d: status %d, expected %d", cases[i].sym,
              cases[i].ver, (int)st, (int)cases[i].status);
        CHECK(p == want && p1 == want && (want || !cases[i].exact),
              "%s@%d/%d: got %p, dlsym(%s) is %p", cases[i].sym, cases[i].ver, cases[i].flags,
              p, cases[i].exact ? cases[i].exact : "-", want);
    }
    /* symbolStatus may be NULL; the pointer works. */
    void *p = NULL;
    OK(cuGetProcAddress_v2("cuDriverGetVersion", &p, 12000, 0, NULL));
    int v = 0;
    if (p)
        OK(((CUresult(*)(int *))p)(&v));
    CHECK(v == 13000, "called through cuGetProcAddress: %d", v);
    CHECK_CU(cuGetProcAddress_v2("cuInit", &p, 12000, 4, NULL), CUDA_ERROR_INVALID_VALUE);
    dlclose(lib);
}

/* ---- Context creation: timed, and serialised across the node. ---- */

static double ctx_ms(void)
{
    const char *s = getenv("KREX_SIM_CTX_CREATE_MS");
    return s ? atof(s) : 0;
}

static void test_ctx_creation(void)
{
    double want = ctx_ms();
    CUcontext cur = NULL, c = NULL;
    OK(cuCtxGetCurrent(&cur));
    double t0 = now_ms();
    OK(cuCtxCreate_v2(&c, 0, 0));
    double took = now_ms() - t0;
    CHECK(took >= want * 0.99 && took < want + 40, "cuCtxCreate took %.1f ms, expected %.0f",
          took, want);
    OK(cuCtxDestroy_v2(c));
    OK(cuCtxSetCurrent(cur));

    /* Two processes creating contexts at once: one after the other, node-wide. */
    int go[2], res[2];
    if (pipe(go) || pipe(res)) {
        CHECK(0, "pipe");
        return;
    }
    pid_t kids[2];
    for (int k = 0; k < 2; k++) {
        kids[k] = fork();
        if (kids[k] == 0) {
            char ch;
            if (read_all(go[0], &ch, 1) != 0)
                _exit(3);
            double t[2];
            CUcontext cc = NULL;
            t[0] = now_ms();
            CUresult r = cuCtxCreate_v2(&cc, 0, k);
            t[1] = now_ms();
            if (write(res[1], t, sizeof t) != (ssize_t)sizeof t)
                _exit(3);
            _exit(r == CUDA_SUCCESS ? 0 : 1);
        }
    }
    char both[2] = {'g', 'g'};
    CHECK(write(go[1], both, 2) == 2, "release children");
    double t[2][2] = {{0, 0}, {0, 0}};
    for (int k = 0; k < 2; k++)
        CHECK(read_all(res[0], t[k], sizeof t[k]) == 0, "times from child %d", k);
    for (int k = 0; k < 2; k++) {
        int st = 0;
        waitpid(kids[k], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d created its context", k);
    }
    double start = fmin(t[0][0], t[1][0]), end = fmax(t[0][1], t[1][1]);
    double first = fmin(t[0][1], t[1][1]);
    CHECK(first - start >= want * 0.99, "the first creation took %.1f ms", first - start);
    CHECK(end - start >= 2 * want * 0.99 && end - start < 2 * want + 60,
          "two creations took %.1f ms in all, expected %.0f (serialised)", end - start,
          2 * want);
    printf("context creation: one %.1f ms, two processes at once %.1f ms in all\n", took,
           end - start);
    close(go[0]), close(go[1]), close(res[0]), close(res[1]);
}

/* A process killed inside context creation (holding the node-wide lock) blocks no one. */
static void test_killed_in_ctx_lock(void)
{
    double want = ctx_ms();
    if (want < 20) {
        printf("skipped the killed-creator test: KREX_SIM_CTX_CREATE_MS < 20\n");
        return;
    }
    int ready[2];
    if (pipe(ready)) {
        CHECK(0, "pipe");
        return;
    }
    pid_t kid = fork();
    if (kid == 0) {
        char ch = 'r';
        if (write(ready[1], &ch, 1) != 1)
            _exit(3);
        CUcontext cc;
        cuCtxCreate_v2(&cc, 0, 0);
        _exit(0);
    }
    char ch;
    CHECK(read_all(ready[0], &ch, 1) == 0, "child ready");
    usleep((useconds_t)(want * 1000 / 3));
    kill(kid, SIGKILL);
    waitpid(kid, NULL, 0);
    CUcontext cur = NULL, c = NULL;
    OK(cuCtxGetCurrent(&cur));
    double t0 = now_ms();
    OK(cuCtxCreate_v2(&c, 0, 0));
    double took = now_ms() - t0;
    CHECK(took < want + 40, "creation after a killed creator took %.1f ms", took);
    OK(cuCtxDestroy_v2(c));
    OK(cuCtxSetCurrent(cur));
    close(ready[0]), close(ready[1]);
}

/* A process killed holding the model lock, in the middle of an update, blocks no one and
 * leaves no damage: the next locker repairs the model. */
static void test_killed_in_model_lock(void)
{
    int fd = shm_open(getenv("KREX_SIM_SHM"), O_RDWR, 0);
    CHECK(fd >= 0, "shm_open: %s", strerror(errno));
    if (fd < 0)
        return;
    struct sim_shm *seg =
        mmap(NULL, sizeof *seg, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    CHECK(seg != MAP_FAILED, "mmap: %s", strerror(errno));
    if (seg == MAP_FAILED)
        return;
    CUstream s;
    CUevent a, b;
    OK(cuStreamCreate(&s, 0));
    OK(cuEventCreate(&a, 0));
    OK(cuEventCreate(&b, 0));
    OK(cuEventRecord(a, s));
    OK(launch(s, 20 * MS));
    OK(cuEventRecord(b, s));
    pid_t kid = fork();
    if (kid == 0) {
        pthread_mutex_lock(&seg->model_lock);
        seg->gpus[0].n_active = 0; /* an update half done: GPU 0 lost its running jobs */
        raise(SIGKILL);
        _exit(0);
    }
    waitpid(kid, NULL, 0);
    OK(cuEventSynchronize(b));
    float ms = 0;
    OK(cuEventElapsedTime_v2(&ms, a, b));
    CHECK(near(ms, 20.0, 0.01), "the kernel still took %.4f ms after the repair", ms);
    OK(cuEventDestroy_v2(a));
    OK(cuEventDestroy_v2(b));
    OK(cuStreamDestroy_v2(s));
    munmap(seg, sizeof *seg);
}

/* The work of a process that dies is dropped: it stops slowing the others down. */
static void test_dead_process_dropped(void)
{
    int ready[2];
    if (pipe(ready)) {
        CHECK(0, "pipe");
        return;
    }
    pid_t kid = fork();
    if (kid == 0) {
        primary(1);
        for (int i = 0; i < 5; i++)
            launch(NULL, 2000 * MS);
        char ch = 'r';
        if (write(ready[1], &ch, 1) != 1)
            _exit(3);
        pause();
        _exit(0);
    }
    char ch;
    CHECK(read_all(ready[0], &ch, 1) == 0, "child ready");
    kill(kid, SIGKILL);
    waitpid(kid, NULL, 0);
    usleep(60000); /* dead owners are looked for at least every 50 ms */
    CUcontext cur = NULL;
    OK(cuCtxGetCurrent(&cur));
    CUcontext c1 = primary(1);
    (void)c1;
    CUstream s;
    OK(cuStreamCreate(&s, 0));
    float ms[2];
    timed_kernels(s, 2, 2 * MS, ms);
    CHECK(near(ms[0], 2.0, 0.01) && near(ms[1], 2.0, 0.01),
          "after the other process died its kernels no longer share: %.4f, %.4f ms", ms[0],
          ms[1]);
    OK(cuStreamDestroy_v2(s));
    OK(cuDevicePrimaryCtxRelease_v2(1));
    OK(cuCtxSetCurrent(cur));
    close(ready[0]), close(ready[1]);
}

/* A full job table makes submissions wait, like a real GPU's full queue. */
static void test_full_queue(void)
{
    CUstream s;
    OK(cuStreamCreate(&s, 0));
    OK(launch(s, 100 * MS));
    double t0 = now_ms();
    int bad = 0;
    for (unsigned i = 0; i < SIM_MAX_JOBS + 100; i++)
        bad += cuGraphLaunch((CUgraphExec)(uintptr_t)1, s) != CUDA_SUCCESS;
    double blocked = now_ms() - t0;
    CHECK(bad == 0, "%d submissions failed on a full job table", bad);
    CHECK(blocked >= 90, "submissions waited %.1f ms for the 100 ms kernel to free the table",
          blocked);
    OK(cuStreamSynchronize(s));
    OK(cuStreamDestroy_v2(s));
}

/* ---- Test hooks. ---- */

static struct krexsim_witness *witness;

static void test_witness(void)
{
    if (!witness) {
        CHECK(0, "no witness");
        return;
    }
    CUstream s;
    CUevent e;
    OK(cuStreamCreate(&s, 0));
    OK(cuEventCreate(&e, 0));
    unsigned long long c0 = krexsim_submissions();
    uint64_t s0 = __atomic_load_n(&witness->submissions, __ATOMIC_SEQ_CST);
    uint64_t v0 = __atomic_load_n(&witness->violations, __ATOMIC_SEQ_CST);
    __atomic_store_n(&witness->granted, 0, __ATOMIC_SEQ_CST); /* open: nobody violates */
    OK(launch(s, 1000));
    OK(cuEventRecord(e, s));
    OK(cuGraphLaunch((CUgraphExec)(uintptr_t)1, s));
    __atomic_store_n(&witness->granted, 3, __ATOMIC_SEQ_CST); /* ours (KREX_TENANT=3) */
    OK(cuMemsetD32Async(0, 0, 0, s));
    OK(cuStreamSynchronize(s)); /* not a submission */
    __atomic_store_n(&witness->granted, 7, __ATOMIC_SEQ_CST); /* someone else's */
    OK(launch(s, 1000));
    __atomic_store_n(&witness->granted, 0, __ATOMIC_SEQ_CST);
    CHECK(krexsim_submissions() - c0 == 5, "krexsim_submissions counted %llu",
          krexsim_submissions() - c0);
    CHECK(witness->submissions - s0 == 5, "witness counted %llu submissions",
          (unsigned long long)(witness->submissions - s0));
    CHECK(witness->violations - v0 == 1, "witness counted %llu violations",
          (unsigned long long)(witness->violations - v0));
    OK(cuStreamSynchronize(s));
    OK(cuEventDestroy_v2(e));
    OK(cuStreamDestroy_v2(s));
}

int main(void)
{
    /* Defaults for a standalone run; the environment wins. */
    char shm[64];
    int own_shm = !getenv("KREX_SIM_SHM");
    snprintf(shm, sizeof shm, "/krex-sim-selftest-%d", (int)getpid());
    setenv("KREX_SIM_SHM", shm, 0);
    setenv("KREX_SIM_GPUS", "2", 0);
    setenv("KREX_SIM_CTX_CREATE_MS", "50", 0);
    setenv("KREX_TENANT", "3", 1);
    char wpath[64];
    snprintf(wpath, sizeof wpath, "/dev/shm/krexsim-selftest-witness-%d", (int)getpid());
    int wfd = open(wpath, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (wfd >= 0 && ftruncate(wfd, 64) == 0) {
        witness = mmap(NULL, 64, PROT_READ | PROT_WRITE, MAP_SHARED, wfd, 0);
        if (witness == MAP_FAILED)
            witness = NULL;
        setenv("KREX_SIM_WITNESS", wpath, 1);
    }
    if (wfd >= 0)
        close(wfd);
    if (atoi(getenv("KREX_SIM_GPUS")) < 2) {
        printf("sim_selftest needs KREX_SIM_GPUS >= 2\n");
        return 2;
    }

    test_basics();
    primary(0);
    CUmodule mod;
    OK(cuModuleLoadData(&mod, "any image"));
    OK(cuModuleGetFunction(&kernel, mod, "sleep_kernel"));

    test_contexts();
    test_alone();
    test_not_ready();
    test_launch_gap();
    test_stream_order();
    test_threads_share();
    test_processes_share();
    test_default_streams();
    test_launch_variants();
    test_copies();
    test_procaddr();
    test_ctx_creation();
    test_killed_in_ctx_lock();
    test_killed_in_model_lock();
    test_dead_process_dropped();
    test_full_queue();
    test_witness();

    OK(cuModuleUnload(mod));
    OK(cuDevicePrimaryCtxRelease_v2(0));
    unlink(wpath);
    if (own_shm)
        shm_unlink(shm);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
