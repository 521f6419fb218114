/*
 * mem_user.c: device memory through the shim (tests/test_memory_shim.py).
 *
 *   mem_user paths         every allocation and free entry point the driver has, through every
 *                          look-up path (the symbol as the program binds it, dlsym on the
 *                          driver's handle, cuGetProcAddress v1, v2, v2 per-thread), each
 *                          checked: the shim's wrapper came back, mem_bytes went up by the
 *                          allocation and back down, mem_peak stayed. "N passed, N failed".
 *   mem_user hold BYTES    allocate BYTES (cuMemAlloc_v2), print "held <slot>", free at the
 *                          first line on stdin, print "freed", exit at the next (or EOF).
 *   mem_user alloc BYTES   allocate BYTES, print "rc <result> <seconds> <slot>", free, exit.
 *
 * Entry points the driver lacks are skipped ("skip ..."), not failed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cuda_api.h"
#include "krex_layout.h"

static struct krex_slot *self;
static long self_index = -1;
static void *libcuda;
static CUstream stream;
static int passed, failed, skipped;

static void find_slot(void)
{
    const char *name = getenv("KREX_SHM");
    if (!name)
        return; /* not under KREX */
    int fd = shm_open(name, O_RDONLY, 0);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0)
        return;
    struct krex_segment *seg = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (seg == MAP_FAILED)
        return;
    for (uint32_t i = 0; i < seg->header.n_slots; i++)
        if (seg->slots[i].state == KREX_SLOT_LIVE && seg->slots[i].pid == (uint32_t)getpid()) {
            self = &seg->slots[i];
            self_index = (long)i;
        }
}

static uint64_t held(void) { return self ? __atomic_load_n(&self->mem_bytes, __ATOMIC_SEQ_CST) : 0; }
static uint64_t peak(void) { return self ? __atomic_load_n(&self->mem_peak, __ATOMIC_SEQ_CST) : 0; }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- The look-up paths: each returns the pointer a program would call, or NULL. ---- */
enum path { P_BOUND, P_DLSYM, P_V1, P_V2, P_V2_PT, N_PATHS };
static const char *const path_names[N_PATHS] = {"bound", "dlsym", "v1", "v2", "v2-per-thread"};

static void *look_up(enum path p, const char *exact, const char *base)
{
    void *fn = NULL;
    CUdriverProcAddressQueryResult st;
    switch (p) {
    case P_BOUND: /* what the dynamic linker binds a call to (the preloaded shim first) */
        return dlsym(RTLD_DEFAULT, exact);
    case P_DLSYM:
        return dlsym(libcuda, exact);
    case P_V1: {
        krex_pfn_cuGetProcAddress gpa =
            (krex_pfn_cuGetProcAddress)dlsym(libcuda, "cuGetProcAddress");
        return gpa && gpa(base, &fn, 12080, 0) == CUDA_SUCCESS ? fn : NULL;
    }
    case P_V2:
        return cuGetProcAddress_v2(base, &fn, 12080, 0, &st) == CUDA_SUCCESS ? fn : NULL;
    case P_V2_PT:
        return cuGetProcAddress_v2(base, &fn, 12080, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                                   &st) == CUDA_SUCCESS
                   ? fn
                   : NULL;
    default:
        return NULL;
    }
}

/* The pointer `p` for `exact` through path `path` must be the shim's wrapper of that name. */
static void *resolve(enum path path, const char *exact, const char *base, const char *label)
{
    if (!dlsym(libcuda, exact)) {
        skipped++;
        printf("skip %-14s %-30s (the driver has no %s)\n", path_names[path], label, exact);
        return NULL;
    }
    void *want = dlsym(RTLD_DEFAULT, exact);
    void *p = look_up(path, exact, base);
    if (!p && (path == P_V1 || path == P_V2 || path == P_V2_PT)) {
        skipped++;
        printf("skip %-14s %-30s (the driver's cuGetProcAddress has no %s)\n", path_names[path],
               label, base);
        return NULL;
    }
    if (p != want) {
        failed++;
        printf("FAIL %-14s %-30s %p is not the shim's %s %p\n", path_names[path], label, p, exact,
               want);
        return NULL;
    }
    return p;
}

#define MIB (1024ULL * 1024ULL)

/* After an allocation of `bytes` (rc r) and its free (rc f): both succeeded, mem_bytes went up by
 * `bytes` in between and came back, mem_peak is at least what it was then. */
static void check(const char *path, const char *label, CUresult r, uint64_t before,
                  uint64_t during, uint64_t bytes, CUresult f, uint64_t after)
{
    int ok = r == CUDA_SUCCESS && f == CUDA_SUCCESS && during == before + bytes &&
             after == before && peak() >= during;
    if (ok)
        passed++;
    else
        failed++;
    printf("%s %-14s %-30s rc %d/%d bytes %llu -> %llu -> %llu (+%llu), peak %llu\n",
           ok ? "ok  " : "FAIL", path, label, (int)r, (int)f, (unsigned long long)before,
           (unsigned long long)during, (unsigned long long)after, (unsigned long long)bytes,
           (unsigned long long)peak());
}

/* The properties of a device allocation on device 0 (CUmemAllocationProp's first bytes;
 * check_cuda_h.c checks the offsets the shim reads). */
struct prop {
    int type;
    int handle_types;
    CUmemLocation location;
    void *win32;
    unsigned char flags[8];
    unsigned char pad[32];
};

struct array_desc {
    size_t Width, Height;
    unsigned int Format, NumChannels;
};
struct array3d_desc {
    size_t Width, Height, Depth;
    unsigned int Format, NumChannels, Flags;
};

typedef CUresult (*pool_fn)(CUmemoryPool *, CUdevice);

static void run_paths(void)
{
    CUdeviceptr d = 0;
    for (int pi = 0; pi < N_PATHS; pi++) {
        enum path p = (enum path)pi;
        const char *pn = path_names[p];
        int pt = p == P_V2_PT;
        uint64_t b0, b1;
        CUresult r, f;

        krex_pfn_cuMemFree_v2 mfree = resolve(p, "cuMemFree_v2", "cuMemFree", "cuMemFree");
        krex_pfn_cuMemFreeAsync mfree_async =
            resolve(p, pt ? "cuMemFreeAsync_ptsz" : "cuMemFreeAsync", "cuMemFreeAsync",
                    pt ? "cuMemFreeAsync (_ptsz)" : "cuMemFreeAsync");

        krex_pfn_cuMemAlloc_v2 a1 = resolve(p, "cuMemAlloc_v2", "cuMemAlloc", "cuMemAlloc");
        if (a1 && mfree) {
            b0 = held();
            r = a1(&d, 3 * MIB);
            b1 = held();
            f = r == CUDA_SUCCESS ? mfree(d) : r;
            check(pn, "cuMemAlloc/cuMemFree", r, b0, b1, 3 * MIB, f, held());
        }
        krex_pfn_cuMemAllocPitch_v2 a2 =
            resolve(p, "cuMemAllocPitch_v2", "cuMemAllocPitch", "cuMemAllocPitch");
        if (a2 && mfree) {
            size_t pitch = 0;
            b0 = held();
            r = a2(&d, &pitch, 1000, 100, 4);
            b1 = held();
            f = r == CUDA_SUCCESS ? mfree(d) : r;
            check(pn, "cuMemAllocPitch (pitch*height)", r, b0, b1, (uint64_t)pitch * 100, f,
                  held());
        }
        krex_pfn_cuMemAllocManaged a3 =
            resolve(p, "cuMemAllocManaged", "cuMemAllocManaged", "cuMemAllocManaged");
        if (a3 && mfree) {
            b0 = held();
            r = a3(&d, 2 * MIB, 1 /* CU_MEM_ATTACH_GLOBAL */);
            b1 = held();
            f = r == CUDA_SUCCESS ? mfree(d) : r;
            check(pn, "cuMemAllocManaged", r, b0, b1, 2 * MIB, f, held());
        }
        krex_pfn_cuMemAllocAsync a4 =
            resolve(p, pt ? "cuMemAllocAsync_ptsz" : "cuMemAllocAsync", "cuMemAllocAsync",
                    pt ? "cuMemAllocAsync (_ptsz)" : "cuMemAllocAsync");
        if (a4 && mfree_async) {
            b0 = held();
            r = a4(&d, 5 * MIB, stream);
            b1 = held();
            f = r == CUDA_SUCCESS ? mfree_async(d, stream) : r;
            check(pn, "cuMemAllocAsync/cuMemFreeAsync", r, b0, b1, 5 * MIB, f, held());
        }
        krex_pfn_cuMemAllocFromPoolAsync a5 =
            resolve(p, pt ? "cuMemAllocFromPoolAsync_ptsz" : "cuMemAllocFromPoolAsync",
                    "cuMemAllocFromPoolAsync",
                    pt ? "cuMemAllocFromPoolAsync (_ptsz)" : "cuMemAllocFromPoolAsync");
        pool_fn get_pool = (pool_fn)dlsym(libcuda, "cuDeviceGetDefaultMemPool");
        CUmemoryPool pool = NULL;
        if (a5 && mfree_async && get_pool && get_pool(&pool, 0) == CUDA_SUCCESS) {
            b0 = held();
            r = a5(&d, 4 * MIB, pool, stream);
            b1 = held();
            f = r == CUDA_SUCCESS ? mfree_async(d, stream) : r;
            check(pn, "cuMemAllocFromPoolAsync", r, b0, b1, 4 * MIB, f, held());
        }
        krex_pfn_cuMemCreate a6 = resolve(p, "cuMemCreate", "cuMemCreate", "cuMemCreate");
        krex_pfn_cuMemRelease rel = resolve(p, "cuMemRelease", "cuMemRelease", "cuMemRelease");
        if (a6 && rel) {
            struct prop pr;
            memset(&pr, 0, sizeof pr);
            pr.type = 1; /* CU_MEM_ALLOCATION_TYPE_PINNED */
            pr.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            pr.location.id = 0;
            CUmemGenericAllocationHandle h = 0;
            b0 = held();
            r = a6(&h, 4 * MIB, (const CUmemAllocationProp *)(void *)&pr, 0);
            b1 = held();
            f = r == CUDA_SUCCESS ? rel(h) : r;
            check(pn, "cuMemCreate/cuMemRelease", r, b0, b1, 4 * MIB, f, held());
        }
        krex_pfn_cuArrayDestroy adel =
            resolve(p, "cuArrayDestroy", "cuArrayDestroy", "cuArrayDestroy");
        krex_pfn_cuArrayCreate_v2 a7 =
            resolve(p, "cuArrayCreate_v2", "cuArrayCreate", "cuArrayCreate");
        if (a7 && adel) {
            struct array_desc ad = {256, 128, 0x20 /* FLOAT */, 2};
            CUarray arr = NULL;
            b0 = held();
            r = a7(&arr, (const CUDA_ARRAY_DESCRIPTOR *)(void *)&ad);
            b1 = held();
            f = r == CUDA_SUCCESS ? adel(arr) : r;
            check(pn, "cuArrayCreate/cuArrayDestroy", r, b0, b1, 256 * 128 * 2 * 4, f, held());
        }
        krex_pfn_cuArray3DCreate_v2 a8 =
            resolve(p, "cuArray3DCreate_v2", "cuArray3DCreate", "cuArray3DCreate");
        if (a8 && adel) {
            struct array3d_desc ad = {64, 32, 8, 0x01 /* UNSIGNED_INT8 */, 4, 0};
            CUarray arr = NULL;
            b0 = held();
            r = a8(&arr, (const CUDA_ARRAY3D_DESCRIPTOR *)(void *)&ad);
            b1 = held();
            f = r == CUDA_SUCCESS ? adel(arr) : r;
            check(pn, "cuArray3DCreate/cuArrayDestroy", r, b0, b1, 64 * 32 * 8 * 4, f, held());
        }
    }
    /* A free of something never allocated through us changes nothing (and never waits). */
    uint64_t b0 = held();
    CUresult r = cuMemFree_v2((CUdeviceptr)0x1000);
    int ok = r != CUDA_SUCCESS && held() == b0;
    ok ? passed++ : failed++;
    printf("%s bound          a foreign free is the driver's error, nothing counted (rc %d)\n",
           ok ? "ok  " : "FAIL", (int)r);
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
}

static void wait_line(void)
{
    char buf[64];
    if (!fgets(buf, sizeof buf, stdin))
        return;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        fprintf(stderr, "usage: mem_user paths | hold BYTES | alloc BYTES\n");
        return 2;
    }
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuStreamCreate(&stream, 0));
    libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!libcuda || !dlsym(libcuda, "krexsim_submissions")) {
        fprintf(stderr, "not the simulated driver\n");
        return 2;
    }
    if (strcmp(argv[1], "paths") == 0) {
        /* Registration happens at the first intercepted call: a small allocation. */
        CUdeviceptr d;
        CHECK(cuMemAlloc_v2(&d, 256));
        CHECK(cuMemFree_v2(d));
        find_slot();
        if (!self) {
            fprintf(stderr, "no slot for pid %d\n", getpid());
            return 2;
        }
        run_paths();
        return failed ? 1 : 0;
    }
    if (argc < 3)
        return 2;
    unsigned long long bytes = strtoull(argv[2], NULL, 0);
    CUdeviceptr d = 0;
    if (strcmp(argv[1], "hold") == 0) {
        CHECK(cuMemAlloc_v2(&d, bytes));
        find_slot();
        printf("held %ld\n", self_index);
        wait_line();
        CHECK(cuMemFree_v2(d));
        printf("freed\n");
        wait_line();
        return 0;
    }
    if (strcmp(argv[1], "alloc") == 0) {
        /* Register first (a tiny allocation), so that the test can find the slot while the
         * real one waits. */
        CUdeviceptr t;
        CHECK(cuMemAlloc_v2(&t, 256));
        find_slot();
        printf("slot %ld\n", self_index);
        double t0 = now_s();
        CUresult r = cuMemAlloc_v2(&d, bytes);
        printf("rc %d %.3f %ld\n", (int)r, now_s() - t0, self_index);
        if (r == CUDA_SUCCESS)
            CHECK(cuMemFree_v2(d));
        CHECK(cuMemFree_v2(t));
        return 0;
    }
    return 2;
}
