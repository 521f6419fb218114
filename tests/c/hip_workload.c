/*
 * hip_workload.c: a tenant written against the HIP runtime API (shim/krex_hip.h), for the
 * simulated HIP runtime (libamdhip64.so from shim/sim_hip/, where a kernel's first parameter is
 * its length in nanoseconds). The HIP twin of workload.c.
 *
 *   hip_workload measure NS REPS   time REPS kernels of NS ns between events; print JSON
 *   hip_workload hammer NS SECONDS launch NS-ns kernels back to back for SECONDS
 *   hip_workload submit THREADS N [NS]
 *                                  THREADS threads each submit N kernels (of NS ns, default 0,
 *                                  through hipModuleLaunchKernel and hipLaunchKernel), copies
 *                                  (hipMemcpyAsync) and sets (hipMemsetAsync)
 *   hip_workload bench REGIONS OUTSIDE_MS REPS NS...
 *                                  as workload.c's bench
 * Path modes: each makes a known number of gated calls and prints {"calls": N}:
 *   direct N      hipModuleLaunchKernel called directly
 *   dlsym N       hipModuleLaunchKernel through dlopen("libamdhip64.so") + dlsym
 *   procaddr N    hipModuleLaunchKernel through hipGetProcAddress
 *   spt N         hipLaunchKernel_spt (the per-thread-stream twin)
 *   internal N    hipMemcpy, which calls hipMemcpyAsync and hipStreamSynchronize inside HIP: an
 *                 interceptor that sees only the application's calls counts N
 *   every         each work-submitting entry point of krex_hip.h once, in a fixed order
 * Each of these calls submits exactly one job to the simulated driver.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "krex_hip.h"

#define CHECK(call)                                                                              \
    do {                                                                                         \
        hipError_t rc_ = (call);                                                                 \
        if (rc_ != hipSuccess) {                                                                 \
            fprintf(stderr, "%s:%d: %s returned %d (%s)\n", __FILE__, __LINE__, #call, (int)rc_, \
                    hipGetErrorName(rc_));                                                       \
            exit(3);                                                                             \
        }                                                                                        \
    } while (0)

static hipFunction_t fn;

/* What hipLaunchKernel is given: a host stub, as the compiler would register (the simulated
 * runtime launches its spin kernel for any). */
static void spin_stub(void) {}
#define SPIN_STUB ((const void *)(uintptr_t)spin_stub)

static const dim3 one = {1, 1, 1};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void setup(void)
{
    hipModule_t mod;
    CHECK(hipInit(0));
    CHECK(hipSetDevice(0));
    CHECK(hipModuleLoadData(&mod, "krex spin kernel"));
    CHECK(hipModuleGetFunction(&fn, mod, "krex_spin"));
}

static hipError_t launch(hipStream_t s, uint64_t ns)
{
    void *params[] = {&ns};
    return hipModuleLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, params, NULL);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A warm-up launch, then reps kernels of ns ns each between two events; sorted times in ms. */
static double *time_kernel(hipStream_t s, hipEvent_t start, hipEvent_t stop, uint64_t ns,
                           int reps)
{
    double *ms = calloc((size_t)reps, sizeof(double));
    CHECK(launch(s, ns));
    CHECK(hipStreamSynchronize(s));
    for (int i = 0; i < reps; i++) {
        CHECK(hipEventRecord(start, s));
        CHECK(launch(s, ns));
        CHECK(hipEventRecord(stop, s));
        CHECK(hipEventSynchronize(stop));
        float t = 0;
        CHECK(hipEventElapsedTime(&t, start, stop));
        ms[i] = t;
    }
    qsort(ms, (size_t)reps, sizeof(double), cmp_double);
    return ms;
}

static int measure(uint64_t ns, int reps)
{
    hipStream_t s;
    hipEvent_t start, end;
    if (reps < 1)
        return 2;
    CHECK(hipStreamCreate(&s));
    CHECK(hipEventCreate(&start));
    CHECK(hipEventCreate(&end));
    double *ms = time_kernel(s, start, end, ns, reps);
    printf("{\"kernel_ms\": %.6f, \"reps\": %d, \"median_ms\": %.6f, \"min_ms\": %.6f, "
           "\"max_ms\": %.6f}\n",
           (double)ns / 1e6, reps, ms[reps / 2], ms[0], ms[reps - 1]);
    free(ms);
    return 0;
}

static int hammer(uint64_t ns, double seconds)
{
    hipStream_t s;
    hipEvent_t ev;
    CHECK(hipStreamCreate(&s));
    CHECK(hipEventCreate(&ev));
    double stop = now_s() + seconds;
    long n = 0;
    /* Keep two kernels queued, so the GPU never idles between them. */
    CHECK(launch(s, ns));
    CHECK(launch(s, ns));
    printf("hammering\n");
    fflush(stdout);
    for (;;) {
        CHECK(hipEventRecord(ev, s));
        CHECK(hipEventSynchronize(ev));
        n += 2;
        if (now_s() >= stop)
            break;
        CHECK(launch(s, ns));
        CHECK(launch(s, ns));
    }
    printf("{\"launched\": %ld}\n", n);
    return 0;
}

struct submitter {
    int n;
    uint64_t ns;
    void *buf;
};

static void *submit_main(void *arg)
{
    struct submitter *w = arg;
    hipStream_t s;
    char host[64] = {0};
    CHECK(hipSetDevice(0));
    CHECK(hipStreamCreate(&s));
    for (int i = 0; i < w->n; i++) {
        uint64_t ns = w->ns;
        void *args[] = {&ns};
        switch (i % 4) {
        case 0:
            CHECK(launch(s, ns));
            break;
        case 1:
            CHECK(hipLaunchKernel(SPIN_STUB, one, one, args, 0, s));
            break;
        case 2:
            CHECK(hipMemcpyAsync(w->buf, host, sizeof host, hipMemcpyHostToDevice, s));
            break;
        default:
            CHECK(hipMemsetAsync(w->buf, i & 0xFF, sizeof host, s));
            break;
        }
        if (i % 64 == 63)
            CHECK(hipStreamSynchronize(s));
    }
    CHECK(hipStreamSynchronize(s));
    CHECK(hipStreamDestroy(s));
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
        CHECK(hipMalloc(&w[i].buf, 64));
        pthread_create(&t[i], NULL, submit_main, &w[i]);
    }
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    printf("{\"submitted\": %ld}\n", (long)threads * n);
    return 0;
}

typedef int (*region_fn)(void);

static int bench(int regions, double outside_ms, int reps, int n, char **ns_list)
{
    /* The markers come from the preloaded libkrex.so (C benchmarks link nothing else). */
    region_fn begin = (region_fn)dlsym(RTLD_DEFAULT, "krex_region_begin");
    region_fn end = (region_fn)dlsym(RTLD_DEFAULT, "krex_region_end");
    if (regions && (!begin || !end)) {
        fprintf(stderr,
                "hip_workload: krex_region_begin/end not found (is libkrex.so preloaded?)\n");
        return 2;
    }
    if (reps < 1)
        return 2;
    hipStream_t s, bg;
    hipEvent_t start, stop, ev;
    CHECK(hipStreamCreate(&s));
    CHECK(hipStreamCreate(&bg));
    CHECK(hipEventCreate(&start));
    CHECK(hipEventCreate(&stop));
    CHECK(hipEventCreate(&ev));
    printf("{\"results\": [");
    for (int k = 0; k < n; k++) {
        uint64_t ns = strtoull(ns_list[k], NULL, 10);
        double until = now_s() + outside_ms / 1e3;
        while (now_s() < until) {
            CHECK(launch(bg, 1000000));
            CHECK(hipEventRecord(ev, bg));
            CHECK(hipEventSynchronize(ev));
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

/* ---- Path modes. ---- */

typedef hipError_t (*module_launch_fn)(hipFunction_t, unsigned int, unsigned int, unsigned int,
                                       unsigned int, unsigned int, unsigned int, unsigned int,
                                       hipStream_t, void **, void **);

/* Calls through a pointer the test got from the library. */
static int launches_through(module_launch_fn f, int n)
{
    uint64_t ns = 0;
    void *params[] = {&ns};
    for (int i = 0; i < n; i++)
        CHECK(f(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
    CHECK(hipDeviceSynchronize());
    printf("{\"calls\": %d}\n", n);
    return 0;
}

/* Direct calls, bound by the dynamic linker like any call to the library. */
static int path_direct(int n)
{
    uint64_t ns = 0;
    void *params[] = {&ns};
    for (int i = 0; i < n; i++)
        CHECK(hipModuleLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
    CHECK(hipDeviceSynchronize());
    printf("{\"calls\": %d}\n", n);
    return 0;
}

static int path_dlsym(int n)
{
    void *h = dlopen("libamdhip64.so", RTLD_LAZY | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "hip_workload: dlopen: %s\n", dlerror());
        return 2;
    }
    module_launch_fn f = (module_launch_fn)dlsym(h, "hipModuleLaunchKernel");
    if (!f) {
        fprintf(stderr, "hip_workload: dlsym: %s\n", dlerror());
        return 2;
    }
    return launches_through(f, n);
}

static int path_procaddr(int n)
{
    void *p = NULL;
    hipDriverProcAddressQueryResult status = HIP_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CHECK(hipGetProcAddress("hipModuleLaunchKernel", &p, 700, 0, &status));
    if (!p || status != HIP_GET_PROC_ADDRESS_SUCCESS) {
        fprintf(stderr, "hip_workload: hipGetProcAddress: status %d\n", (int)status);
        return 2;
    }
    return launches_through((module_launch_fn)p, n);
}

static int path_spt(int n)
{
    uint64_t ns = 0;
    void *args[] = {&ns};
    for (int i = 0; i < n; i++)
        CHECK(hipLaunchKernel_spt(SPIN_STUB, one, one, args, 0, NULL));
    CHECK(hipStreamSynchronize(hipStreamPerThread));
    printf("{\"calls\": %d}\n", n);
    return 0;
}

static int path_internal(int n)
{
    char host[64] = {0};
    void *dev;
    CHECK(hipMalloc(&dev, sizeof host));
    for (int i = 0; i < n; i++)
        CHECK(hipMemcpy(dev, host, sizeof host, hipMemcpyHostToDevice));
    printf("{\"calls\": %d}\n", n);
    return 0;
}

static void host_fn(void *data) { ++*(int *)data; }

/* Each work-submitting entry point once, with small valid arguments (2D and 3D ones contiguous,
 * so that each is one job), then a check that the bytes moved. */
static int every(void)
{
    enum { N = 64 };
    int calls = 0, host_calls = 0;
#define CALL(expr)                                                                               \
    do {                                                                                         \
        CHECK(expr);                                                                             \
        calls++;                                                                                 \
    } while (0)

    hipStream_t s;
    hipEvent_t ev;
    CHECK(hipStreamCreate(&s));
    CHECK(hipEventCreate(&ev));
    char *a, *b, *host;
    CHECK(hipMalloc((void **)&a, N));
    CHECK(hipMalloc((void **)&b, N));
    CHECK(hipHostMalloc((void **)&host, N, hipHostMallocDefault));
    uint64_t ns = 1000;
    void *args[] = {&ns};

    hipGraph_t graph;
    hipGraphNode_t node;
    hipGraphExec_t exec;
    hipKernelNodeParams kp = {.blockDim = one,
                              .extra = NULL,
                              .func = (void *)(uintptr_t)spin_stub,
                              .gridDim = one,
                              .kernelParams = args,
                              .sharedMemBytes = 0};
    CHECK(hipGraphCreate(&graph, 0));
    CHECK(hipGraphAddKernelNode(&node, graph, NULL, 0, &kp));
    CHECK(hipGraphInstantiate(&exec, graph, NULL, NULL, 0));

    hipLaunchParams lp = {.func = (void *)(uintptr_t)spin_stub,
                          .gridDim = one,
                          .blockDim = one,
                          .args = args,
                          .sharedMem = 0,
                          .stream = s};
    hipFunctionLaunchParams fp = {.function = fn,
                                  .gridDimX = 1,
                                  .gridDimY = 1,
                                  .gridDimZ = 1,
                                  .blockDimX = 1,
                                  .blockDimY = 1,
                                  .blockDimZ = 1,
                                  .sharedMemBytes = 0,
                                  .hStream = s,
                                  .kernelParams = args};
    hipMemcpy3DParms p3 = {0};
    p3.srcPtr = (hipPitchedPtr){.ptr = a, .pitch = 16, .xsize = 16, .ysize = 2};
    p3.dstPtr = (hipPitchedPtr){.ptr = b, .pitch = 16, .xsize = 16, .ysize = 2};
    p3.extent = (hipExtent){.width = 16, .height = 2, .depth = 2};
    p3.kind = hipMemcpyDeviceToDevice;
    hipPitchedPtr pa = {.ptr = a, .pitch = 16, .xsize = 16, .ysize = 2};
    hipExtent e3 = {.width = 16, .height = 2, .depth = 2};

    /* Launches. */
    CALL(hipLaunchKernel(SPIN_STUB, one, one, args, 0, s));
    CALL(hipLaunchKernel_spt(SPIN_STUB, one, one, args, 0, s));
    CALL(hipModuleLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, args, NULL));
    CALL(hipExtLaunchKernel(SPIN_STUB, one, one, args, 0, s, NULL, NULL, 0));
    CALL(hipExtModuleLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, args, NULL, NULL, NULL, 0));
    CALL(hipLaunchCooperativeKernel(SPIN_STUB, one, one, args, 0, s));
    CALL(hipLaunchCooperativeKernel_spt(SPIN_STUB, one, one, args, 0, s));
    CALL(hipLaunchCooperativeKernelMultiDevice(&lp, 1, 0));
    CALL(hipModuleLaunchCooperativeKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, args));
    CALL(hipModuleLaunchCooperativeKernelMultiDevice(&fp, 1, 0));
    CALL(hipLaunchHostFunc(s, host_fn, &host_calls));
    CALL(hipLaunchHostFunc_spt(s, host_fn, &host_calls));
    CALL(hipGraphLaunch(exec, s));
    CALL(hipGraphLaunch_spt(exec, s));
    CALL(hipEventRecord(ev, s));
    CALL(hipEventRecord_spt(ev, s));

    /* Copies. */
    memset(host, 7, N);
    CALL(hipMemcpy(a, host, N, hipMemcpyHostToDevice));
    CALL(hipMemcpy_spt(b, a, N, hipMemcpyDeviceToDevice));
    CALL(hipMemcpyAsync(a, host, N, hipMemcpyHostToDevice, s));
    CALL(hipMemcpyAsync_spt(b, a, N, hipMemcpyDeviceToDevice, s));
    CALL(hipMemcpyWithStream(host, b, N, hipMemcpyDeviceToHost, s));
    CALL(hipMemcpyHtoD(a, host, N));
    CALL(hipMemcpyDtoH(host, a, N));
    CALL(hipMemcpyDtoD(b, a, N));
    CALL(hipMemcpyHtoDAsync(a, host, N, s));
    CALL(hipMemcpyDtoHAsync(host, a, N, s));
    CALL(hipMemcpyDtoDAsync(b, a, N, s));
    CALL(hipMemcpy2D(b, 16, a, 16, 16, 4, hipMemcpyDeviceToDevice));
    CALL(hipMemcpy2D_spt(b, 16, a, 16, 16, 4, hipMemcpyDeviceToDevice));
    CALL(hipMemcpy2DAsync(b, 16, a, 16, 16, 4, hipMemcpyDeviceToDevice, s));
    CALL(hipMemcpy2DAsync_spt(b, 16, a, 16, 16, 4, hipMemcpyDeviceToDevice, s));
    CALL(hipMemcpy3D(&p3));
    CALL(hipMemcpy3D_spt(&p3));
    CALL(hipMemcpy3DAsync(&p3, s));
    CALL(hipMemcpy3DAsync_spt(&p3, s));
    CALL(hipMemcpyPeer(b, 0, a, 0, N));
    CALL(hipMemcpyPeerAsync(b, 0, a, 0, N, s));
    CALL(hipMemcpyToSymbol(a, host, N / 2, N / 2, hipMemcpyHostToDevice));
    CALL(hipMemcpyToSymbol_spt(a, host, N / 2, N / 2, hipMemcpyHostToDevice));
    CALL(hipMemcpyToSymbolAsync(a, host, N / 2, 0, hipMemcpyHostToDevice, s));
    CALL(hipMemcpyToSymbolAsync_spt(a, host, N / 2, 0, hipMemcpyHostToDevice, s));
    CALL(hipMemcpyFromSymbol(host, a, N / 2, N / 2, hipMemcpyDeviceToHost));
    CALL(hipMemcpyFromSymbol_spt(host, a, N / 2, N / 2, hipMemcpyDeviceToHost));
    CALL(hipMemcpyFromSymbolAsync(host, a, N / 2, 0, hipMemcpyDeviceToHost, s));
    CALL(hipMemcpyFromSymbolAsync_spt(host, a, N / 2, 0, hipMemcpyDeviceToHost, s));

    /* Sets. */
    CALL(hipMemset(a, 1, N));
    CALL(hipMemset_spt(a, 1, N));
    CALL(hipMemsetAsync(a, 1, N, s));
    CALL(hipMemsetAsync_spt(a, 1, N, s));
    CALL(hipMemsetD8(a, 2, N));
    CALL(hipMemsetD8Async(a, 2, N, s));
    CALL(hipMemsetD16(a, 0x0302, N / 2));
    CALL(hipMemsetD16Async(a, 0x0302, N / 2, s));
    CALL(hipMemsetD32(a, 0x04030201, N / 4));
    CALL(hipMemsetD32Async(a, 0x04030201, N / 4, s));
    CALL(hipMemset2D(a, 16, 5, 16, 4));
    CALL(hipMemset2D_spt(a, 16, 5, 16, 4));
    CALL(hipMemset2DAsync(a, 16, 5, 16, 4, s));
    CALL(hipMemset2DAsync_spt(a, 16, 5, 16, 4, s));
    CALL(hipMemset3D(pa, 6, e3));
    CALL(hipMemset3D_spt(pa, 6, e3));
    CALL(hipMemset3DAsync(pa, 6, e3, s));
    CALL(hipMemset3DAsync_spt(pa, 6, e3, s));
#undef CALL

    CHECK(hipDeviceSynchronize());
    CHECK(hipStreamSynchronize(s));
    /* The last set left 6 in the first 64 bytes of a; the host functions ran. */
    CHECK(hipMemcpyDtoH(host, a, N));
    calls++; /* a gated call too: the count is every gated call this program made */
    for (int i = 0; i < N; i++) {
        if (host[i] != 6) {
            fprintf(stderr, "hip_workload: byte %d is %d after the sets, not 6\n", i, host[i]);
            return 4;
        }
    }
    if (host_calls != 2) {
        fprintf(stderr, "hip_workload: %d host functions ran, not 2\n", host_calls);
        return 4;
    }
    CHECK(hipGraphExecDestroy(exec));
    CHECK(hipGraphDestroy(graph));
    CHECK(hipHostFree(host));
    CHECK(hipFree(a));
    CHECK(hipFree(b));
    printf("{\"calls\": %d}\n", calls);
    return 0;
}

/* first CALL: CALL is the program's first HIP call (each starts HIP on device 0), then it waits
 * to be killed: whether its slot was taken before the GPU listed it. */
static int first(const char *call)
{
    hipError_t e;
    if (!strcmp(call, "hipSetDevice")) {
        e = hipSetDevice(0);
    } else if (!strcmp(call, "hipMalloc")) {
        void *p;
        e = hipMalloc(&p, 64);
    } else if (!strcmp(call, "hipStreamCreate")) {
        hipStream_t s;
        e = hipStreamCreate(&s);
    } else {
        fprintf(stderr, "hip_workload: first: unknown call %s\n", call);
        return 2;
    }
    if (e != hipSuccess)
        return 1;
    sleep(60);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        fprintf(stderr, "usage: hip_workload measure|hammer|submit|bench|direct|dlsym|procaddr|"
                        "spt|internal|every|first ...\n");
        return 2;
    }
    if (!strcmp(argv[1], "first") && argc == 3)
        return first(argv[2]); /* before setup(): its call is the first */
    setup();
    const char *mode = argv[1];
    if (!strcmp(mode, "measure") && argc == 4)
        return measure(strtoull(argv[2], NULL, 10), atoi(argv[3]));
    if (!strcmp(mode, "hammer") && argc == 4)
        return hammer(strtoull(argv[2], NULL, 10), atof(argv[3]));
    if (!strcmp(mode, "submit") && (argc == 4 || argc == 5))
        return submit(atoi(argv[2]), atoi(argv[3]), argc == 5 ? strtoull(argv[4], NULL, 10) : 0);
    if (!strcmp(mode, "bench") && argc >= 6)
        return bench(atoi(argv[2]), atof(argv[3]), atoi(argv[4]), argc - 5, argv + 5);
    if (!strcmp(mode, "direct") && argc == 3)
        return path_direct(atoi(argv[2]));
    if (!strcmp(mode, "dlsym") && argc == 3)
        return path_dlsym(atoi(argv[2]));
    if (!strcmp(mode, "procaddr") && argc == 3)
        return path_procaddr(atoi(argv[2]));
    if (!strcmp(mode, "spt") && argc == 3)
        return path_spt(atoi(argv[2]));
    if (!strcmp(mode, "internal") && argc == 3)
        return path_internal(atoi(argv[2]));
    if (!strcmp(mode, "every") && argc == 2)
        return every();
    fprintf(stderr, "hip_workload: bad arguments\n");
    return 2;
}
