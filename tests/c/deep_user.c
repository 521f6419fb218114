/*
 * deep_user.c: deep_user LIB HOW BATCH NS SECONDS, for tests/test_deepbind.py. Takes its slot
 * through the shim (a primary context it never launches on), then loads LIB (deep_lib.c) with
 * RTLD_DEEPBIND, as some frameworks load their plugins, and runs its deep_run (HOW: "direct"
 * or "nested"): every launch is the library's own. Prints {"launches": N} at the end.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_api.h"

typedef long (*deep_run_fn)(const char *, int, uint64_t, double);

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: deep_user LIB HOW BATCH NS SECONDS\n");
        return 2;
    }
    CUcontext primary;
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&primary, 0)); /* device 0 (a CUdevice is its ordinal) */
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    deep_run_fn run = lib ? (deep_run_fn)dlsym(lib, "deep_run") : NULL;
    if (!run) {
        fprintf(stderr, "deep_user: %s\n", dlerror());
        return 4;
    }
    long n = run(argv[2], atoi(argv[3]), strtoull(argv[4], NULL, 10), atof(argv[5]));
    printf("{\"launches\": %ld}\n", n);
    return 0;
}
