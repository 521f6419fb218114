/*
 * workload.c: a tenant for tests and the demo, written against the driver API (it runs on the
 * simulated GPU, where a kernel's first parameter is its length in nanoseconds).
 *
 *   workload measure NS REPS      time REPS kernels of NS ns between events; print JSON
 *   workload hammer NS SECONDS    launch NS-ns kernels back to back for SECONDS
 *   workload submit THREADS N [NS] THREADS threads each submit N kernels (of NS ns, default
 *                                 0), copies and sets
 *   workload hold-copy BYTES      one synchronous copy (in flight for BYTES / bandwidth)
 *   workload bench REGIONS OUTSIDE_MS REPS NS...
 *                                 for each NS: launch 1 ms kernels for OUTSIDE_MS (work outside
 *                                 regions), then time REPS kernels of NS ns, inside a region
 *                                 (krex_region_begin/end) when REGIONS is 1; print JSON
 *   workload fork-child N         register, fork; the child makes N gated calls, prints
 *                                 "child PID" and sleeps until killed (at most 60 s)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_api.h"

static CUcontext ctx;
static CUfunction fn;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void setup(void)
{
    CUdevice dev;
    CUmodule mod;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, "krex spin kernel"));
    CHECK(cuModuleGetFunction(&fn, mod, "krex_spin"));
}

static CUresult launch(CUstream s, uint64_t ns)
{
    void *params[] = {&ns};
    return cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, params, NULL);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A warm-up launch, then reps kernels of ns ns each between two events; sorted times in ms. */
static double *time_kernel(CUstream s, CUevent start, CUevent stop, uint64_t ns, int reps)
{
    double *ms = calloc((size_t)reps, sizeof(double));
    CHECK(launch(s, ns));
    CHECK(cuStreamSynchronize(s));
    for (int i = 0; i < reps; i++) {
        CHECK(cuEventRecord(start, s));
        CHECK(launch(s, ns));
        CHECK(cuEventRecord(stop, s));
        CHECK(cuEventSynchronize(stop));
        float t = 0;
        CHECK(cuEventElapsedTime(&t, start, stop));
        ms[i] = t;
    }
    qsort(ms, (size_t)reps, sizeof(double), cmp_double);
    return ms;
}

static int measure(uint64_t ns, int reps)
{
    CUstream s;
    CUevent start, end;
    CHECK(cuStreamCreate(&s, 0));
    CHECK(cuEventCreate(&start, 0));
    CHECK(cuEventCreate(&end, 0));
    double *ms = time_kernel(s, start, end, ns, reps);
    printf("{\"kernel_ms\": %.6f, \"reps\": %d, \"median_ms\": %.6f, \"min_ms\": %.6f, "
           "\"max_ms\": %.6f}\n",
           (double)ns / 1e6, reps, ms[reps / 2], ms[0], ms[reps - 1]);
    free(ms);
    return 0;
}

static int hammer(uint64_t ns, double seconds)
{
    CUstream s;
    CUevent ev;
    CHECK(cuStreamCreate(&s, 0));
    CHECK(cuEventCreate(&ev, 0));
    double stop = now_s() + seconds;
    long n = 0;
    printf("hammering\n");
    fflush(stdout);
    while (now_s() < stop) {
        /* Keep two kernels queued, so the GPU never idles between them. */
        CHECK(launch(s, ns));
        CHECK(launch(s, ns));
        CHECK(cuEventRecord(ev, s));
        CHECK(cuEventSynchronize(ev));
        n += 2;
    }
    printf("{\"launched\": %ld}\n", n);
    return 0;
}

struct submitter {
    int n;
    uint64_t ns;
    CUdeviceptr buf;
};

static void *submit_main(void *arg)
{
    struct submitter *w = arg;
    CUstream s;
    char host[64];
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuStreamCreate(&s, 0));
    for (int i = 0; i < w->n; i++) {
        switch (i % 4) {
        case 0:
        case 1:
            CHECK(launch(s, w->ns));
            break;
        case 2:
            CHECK(cuMemcpyHtoDAsync_v2(w->buf, host, sizeof host, s));
            break;
        default:
            CHECK(cuMemsetD8Async(w->buf, (unsigned char)i, sizeof host, s));
            break;
        }
        if (i % 64 == 63)
            CHECK(cuStreamSynchronize(s));
    }
    CHECK(cuStreamSynchronize(s));
    return NULL;
}

static int submit(int threads, int n, uint64_t ns)
{
    pthread_t t[64];
    struct submitter w[64];
    if (threads < 1 || threads > 64)
        return 2;
    for (int i = 0; i < threads; i++) {
        w[i].n = n;
        w[i].ns = ns;
        CHECK(cuMemAlloc_v2(&w[i].buf, 64));
        pthread_create(&t[i], NULL, submit_main, &w[i]);
    }
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    printf("{\"submitted\": %ld}\n", (long)threads * n);
    return 0;
}

static int hold_copy(size_t bytes)
{
    CUdeviceptr d;
    char *h = calloc(bytes, 1);
    CHECK(cuMemAlloc_v2(&d, bytes));
    CHECK(launch(NULL, 0)); /* register with the shim before announcing the long call */
    printf("copying\n");
    fflush(stdout);
    CHECK(cuMemcpyHtoD_v2(d, h, bytes));
    printf("copied\n");
    return 0;
}

typedef int (*region_fn)(void);

static int bench(int regions, double outside_ms, int reps, int n, char **ns_list)
{
    /* The markers come from the preloaded libkrex.so (C benchmarks link nothing else). */
    region_fn begin = (region_fn)dlsym(RTLD_DEFAULT, "krex_region_begin");
    region_fn end = (region_fn)dlsym(RTLD_DEFAULT, "krex_region_end");
    if (regions && (!begin || !end)) {
        fprintf(stderr, "workload: krex_region_begin/end not found (is libkrex.so preloaded?)\n");
        return 2;
    }
    CUstream s, bg;
    CUevent start, stop, ev;
    CHECK(cuStreamCreate(&s, 0));
    CHECK(cuStreamCreate(&bg, 0));
    CHECK(cuEventCreate(&start, 0));
    CHECK(cuEventCreate(&stop, 0));
    CHECK(cuEventCreate(&ev, 0));
    printf("{\"results\": [");
    for (int k = 0; k < n; k++) {
        uint64_t ns = strtoull(ns_list[k], NULL, 10);
        double until = now_s() + outside_ms / 1e3;
        while (now_s() < until) {
            CHECK(launch(bg, 1000000));
            CHECK(cuEventRecord(ev, bg));
            CHECK(cuEventSynchronize(ev));
        }
        if (regions && begin() != 0)
            return 3;
        double *ms = time_kernel(s, start, stop, ns, reps); /* warm-up inside, like do_bench */
        if (regions && end() != 0)
            return 3;
        printf("%s{\"kernel_ms\": %.6f, \"median_ms\": %.6f, \"max_ms\": %.6f}", k ? ", " : "",
               (double)ns / 1e6, ms[reps / 2], ms[reps - 1]);
        free(ms);
    }
    printf("]}\n");
    return 0;
}

static int fork_child(int n)
{
    CHECK(launch(NULL, 0)); /* the parent registers first */
    pid_t pid = fork();
    if (pid < 0)
        return 2;
    if (pid == 0) {
        /* A CUDA context does not survive fork; the calls may fail, but each one must reach the
         * shim of a newly registered process (its own slot and drain thread). */
        for (int i = 0; i < n; i++)
            (void)launch(NULL, 0);
        printf("child %d\n", (int)getpid());
        fflush(stdout);
        sleep(60);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        fprintf(stderr, "usage: workload measure|hammer|submit|hold-copy ...\n");
        return 2;
    }
    setup();
    if (!strcmp(argv[1], "measure") && argc == 4)
        return measure(strtoull(argv[2], NULL, 10), atoi(argv[3]));
    if (!strcmp(argv[1], "hammer") && argc == 4)
        return hammer(strtoull(argv[2], NULL, 10), atof(argv[3]));
    if (!strcmp(argv[1], "submit") && (argc == 4 || argc == 5))
        return submit(atoi(argv[2]), atoi(argv[3]), argc == 5 ? strtoull(argv[4], NULL, 10) : 0);
    if (!strcmp(argv[1], "bench") && argc >= 6)
        return bench(atoi(argv[2]), atof(argv[3]), atoi(argv[4]), argc - 5, argv + 5);
    if (!strcmp(argv[1], "fork-child") && argc == 3)
        return fork_child(atoi(argv[2]));
    if (!strcmp(argv[1], "hold-copy") && argc == 3)
        return hold_copy(strtoull(argv[2], NULL, 10));
    fprintf(stderr, "workload: bad arguments\n");
    return 2;
}
