/*
 * deep_lib.c: a library that reaches the driver on its own, for tests/test_deepbind.py. Loaded
 * with RTLD_DEEPBIND (deep_user.c), its references bind to the driver it depends on before the
 * preloaded shim. deep_run creates a context of its own (one the shim never saw, so nothing
 * drains it unless the shim sees the call) and launches kernels on the simulated GPU:
 *   "direct"  through the library's own references to the driver (PLT or GOT);
 *   "nested"  through the driver dlopen'd by path (DEEP_DRIVER) and dlsym, from the library.
 * Each round launches BATCH kernels of NS ns, then synchronises and prints "launched N". With
 * DEEP_WAIT set, the first round waits for a line on stdin after "ready".
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"

static void *driver; /* "nested": the driver this library opened by path */

static void *lookup(const char *name)
{
    void *p = dlsym(driver, name);
    if (!p) {
        fprintf(stderr, "deep_lib: dlsym(%s): %s\n", name, dlerror());
        exit(4);
    }
    return p;
}

/* A driver entry, called through the library's own binding or through dlsym on `driver`. */
#define CU(name, ...) (driver ? ((__typeof__(&name))lookup(#name))(__VA_ARGS__) : name(__VA_ARGS__))

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

long deep_run(const char *how, int batch, uint64_t ns, double seconds)
{
    if (strcmp(how, "nested") == 0) {
        const char *path = getenv("DEEP_DRIVER");
        driver = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
        if (!driver) {
            fprintf(stderr, "deep_lib: dlopen(%s): %s\n", path ? path : "(unset)", dlerror());
            exit(4);
        }
    }
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CHECK(CU(cuInit, 0));
    CHECK(CU(cuDeviceGet, &dev, 0));
    CHECK(CU(cuCtxCreate_v2, &ctx, 0, dev));
    CHECK(CU(cuModuleLoadData, &mod, "krex spin kernel"));
    CHECK(CU(cuModuleGetFunction, &fn, mod, "krex_spin"));
    printf("ready\n");
    fflush(stdout);
    if (getenv("DEEP_WAIT")) { /* launch only after a line on stdin (the test closes a gate) */
        char line[8];
        if (!fgets(line, sizeof line, stdin))
            exit(5);
    }
    long n = 0;
    double end = now_s() + seconds;
    do {
        for (int i = 0; i < batch; i++) {
            void *params[] = {&ns};
            CHECK(CU(cuLaunchKernel, fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
        }
        CHECK(CU(cuCtxSynchronize));
        n += batch;
        printf("launched %ld\n", n);
        fflush(stdout);
    } while (now_s() < end);
    return n;
}
