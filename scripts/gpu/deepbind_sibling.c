/*
 * deepbind_sibling.c: a sibling whose GPU work comes from a library it loads with
 * dlopen(..., RTLD_DEEPBIND) (issue #49; scripts/gpu/deepbind_lib.c). It takes its slot the
 * ordinary way first (its own context through the shim, as a framework would), so that the
 * only way its work could pass the gate is the deep-bound library's own binding to the driver.
 * usage: deepbind_sibling LIB PTX [nested]      (scripts/gpu/security_check.py)
 */
#define _GNU_SOURCE
#include "ck.h"
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    const char *ptx = read_ptx(argv[2]);
    if (!ptx)
        return 1;
    CUdevice dev;
    CUcontext ctx;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    fprintf(stderr, "loading %s with RTLD_DEEPBIND\n", argv[1]);
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (!lib) {
        fprintf(stderr, "dlopen(%s, RTLD_DEEPBIND): %s\n", argv[1], dlerror());
        return 1;
    }
    int (*deep_spin)(const char *, int) = (int (*)(const char *, int))dlsym(lib, "deep_spin");
    if (!deep_spin) {
        fprintf(stderr, "dlsym(deep_spin): %s\n", dlerror());
        return 1;
    }
    return deep_spin(ptx, argc > 3 && strcmp(argv[3], "nested") == 0);
}
