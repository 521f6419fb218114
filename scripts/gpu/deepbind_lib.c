/*
 * deepbind_lib.c: a library that reaches the driver on its own, for a sibling that loads it with
 * dlopen(..., RTLD_DEEPBIND) (issue #49): deep-bound, its references bind to its own
 * dependencies (libcuda.so.1) before the preloaded shim. deep_spin launches `spin` kernels from
 * PTX over every SM until killed, printing "ready" once the first one ran; with `nested`, the
 * launch entry comes from the library's own dlopen of libcuda.so.1 and dlsym on it, as a
 * plugin that loads the driver by path would.
 * Built by scripts/gpu_check.sh (PARTS=security, SECURITY_CASES with deepbind).
 */
#define _GNU_SOURCE
#include "ck.h"
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);

__attribute__((visibility("default"))) int deep_spin(const char *ptx, int nested)
{
    launch_fn launch = cuLaunchKernel;
    if (nested) {
        void *lib = dlopen("libcuda.so.1", RTLD_NOW);
        launch = lib ? (launch_fn)dlsym(lib, "cuLaunchKernel") : NULL;
        if (!launch) {
            fprintf(stderr, "dlopen/dlsym of libcuda.so.1: %s\n", dlerror());
            return 1;
        }
    }
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction spin;
    int sms = 0;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    CK(cuModuleLoadData(&mod, ptx));
    CK(cuModuleGetFunction(&spin, mod, "spin"));
    long long cycles = 2000000; /* about 1 ms at 1.98 GHz */
    void *args[] = {&cycles};
    for (long i = 0;; i++) {
        CK(launch(spin, (unsigned)sms * 4, 1, 1, 128, 1, 1, 0, NULL, args, NULL));
        CK(cuCtxSynchronize());
        if (i == 0) {
            printf("ready\n");
            fflush(stdout);
        }
    }
}
