/*
 * launch_overhead.c: ns per cuLaunchKernel of an empty kernel in a tight loop (driver API,
 * direct binding). scripts/gpu/check.py runs it alternately with and without the shim.
 * usage: launch_overhead PTX LAUNCHES
 */
#include "ck.h"
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    const char *ptx = read_ptx(argv[1]);
    if (!ptx)
        return 2;
    long n = atol(argv[2]);
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CUstream s;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&mod, ptx));
    CK(cuModuleGetFunction(&fn, mod, "empty"));
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    for (int i = 0; i < 1000; i++)
        CK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
    CK(cuStreamSynchronize(s));
    double t0 = now();
    for (long i = 0; i < n; i++)
        CK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
    double t1 = now();
    CK(cuStreamSynchronize(s));
    printf("{\"launches\": %ld, \"ns_per_launch\": %.2f}\n", n, (t1 - t0) / (double)n);
    return 0;
}
