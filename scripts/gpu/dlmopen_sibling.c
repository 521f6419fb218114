/*
 * dlmopen_sibling.c: GPU work through a second copy of the driver that LD_PRELOAD cannot see
 * (issue #16's third case). Loads libcuda.so.1 with dlmopen(LM_ID_NEWLM), creates a context and
 * launches `spin` kernels from PTX over every SM until killed; prints "ready" once the first
 * one has run. Never touches the driver of the base namespace, so the shim's only view of it is
 * its dlmopen wrapper.
 * usage: dlmopen_sibling PTX      (scripts/gpu/security_check.py; built by scripts/gpu_check.sh)
 */
#define _GNU_SOURCE
#include "ck.h"
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#define SYM(name) name##_fn = (typeof(name##_fn))sym(lib, #name)

static void *sym(void *lib, const char *name)
{
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "dlsym(%s): %s\n", name, dlerror());
        exit(1);
    }
    return p;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    const char *ptx = read_ptx(argv[1]);
    if (!ptx)
        return 1;
    fprintf(stderr, "loading libcuda.so.1 with dlmopen(LM_ID_NEWLM)\n");
    void *lib = dlmopen(LM_ID_NEWLM, "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlmopen(LM_ID_NEWLM, libcuda.so.1) failed: %s\n", dlerror());
        return 1;
    }
    CUresult (*cuInit_fn)(unsigned);
    CUresult (*cuDeviceGet_fn)(CUdevice *, int);
    CUresult (*cuDevicePrimaryCtxRetain_fn)(CUcontext *, CUdevice);
    CUresult (*cuCtxSetCurrent_fn)(CUcontext);
    CUresult (*cuModuleLoadData_fn)(CUmodule *, const void *);
    CUresult (*cuModuleGetFunction_fn)(CUfunction *, CUmodule, const char *);
    CUresult (*cuLaunchKernel_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, unsigned, CUstream, void **, void **);
    CUresult (*cuCtxSynchronize_fn)(void);
    CUresult (*cuDeviceGetAttribute_fn)(int *, CUdevice_attribute, CUdevice);
    SYM(cuInit);
    SYM(cuDeviceGet);
    SYM(cuDevicePrimaryCtxRetain);
    SYM(cuCtxSetCurrent);
    SYM(cuModuleLoadData);
    SYM(cuModuleGetFunction);
    SYM(cuLaunchKernel);
    SYM(cuCtxSynchronize);
    SYM(cuDeviceGetAttribute);
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction spin;
    int sms = 0;
    CK(cuInit_fn(0));
    CK(cuDeviceGet_fn(&dev, 0));
    CK(cuDevicePrimaryCtxRetain_fn(&ctx, dev));
    CK(cuCtxSetCurrent_fn(ctx));
    CK(cuDeviceGetAttribute_fn(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    CK(cuModuleLoadData_fn(&mod, ptx));
    CK(cuModuleGetFunction_fn(&spin, mod, "spin"));
    long long cycles = 2000000; /* about 1 ms at 1.98 GHz */
    void *args[] = {&cycles};
    for (long i = 0;; i++) {
        CK(cuLaunchKernel_fn(spin, (unsigned)sms * 4, 1, 1, 128, 1, 1, 0, NULL, args, NULL));
        CK(cuCtxSynchronize_fn());
        if (i == 0) {
            printf("ready\n");
            fflush(stdout);
        }
    }
}
