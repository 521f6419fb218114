/*
 * paths.c: calls the simulated driver through every path a program can take (global binding,
 * dlsym on a handle, dlsym(RTLD_NEXT), cuGetProcAddress v1, v2, v2 with the per-thread flag,
 * the self-look-up) and checks, call by call, that the shim counted it exactly once and that
 * the driver received it exactly once. Prints "N passed, N failed".
 *
 * Run with LD_PRELOAD=libkrex.so, the simulated libcuda.so.1 on the library path, KREX_SHM,
 * KREX_TENANT (and a segment the test created).
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
#include <unistd.h>

#include "cuda_api.h"
#include "krex_layout.h"

static struct krex_slot *self;
static unsigned long long (*sim_submissions)(void);
static int passed, failed;
static CUfunction fn;
static CUstream stream;
static CUdeviceptr dbuf;
static char hbuf[256];
static void *libcuda;

static uint64_t counted(void) { return __atomic_load_n(&self->intercepted, __ATOMIC_SEQ_CST); }

static void find_slot(void)
{
    const char *name = getenv("KREX_SHM");
    int fd = shm_open(name, O_RDONLY, 0);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        perror("shm_open");
        exit(2);
    }
    struct krex_segment *seg = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    for (uint32_t i = 0; i < seg->header.n_slots; i++)
        if (seg->slots[i].state == KREX_SLOT_LIVE && seg->slots[i].pid == (uint32_t)getpid())
            self = &seg->slots[i];
    if (!self) {
        fprintf(stderr, "no slot for pid %d\n", getpid());
        exit(2);
    }
}

/* Run one call, then check that both counters moved by exactly one. */
#define EXPECT_ONE(label, call)                                                                  \
    do {                                                                                         \
        uint64_t c0 = counted();                                                                 \
        unsigned long long d0 = sim_submissions();                                               \
        CUresult r_ = (call);                                                                    \
        uint64_t dc = counted() - c0;                                                            \
        unsigned long long dd = sim_submissions() - d0;                                          \
        if (r_ == CUDA_SUCCESS && dc == 1 && dd == 1) {                                          \
            passed++;                                                                            \
            printf("ok   %-44s shim +%llu driver +%llu\n", label, (unsigned long long)dc, dd);  \
        } else {                                                                                 \
            failed++;                                                                            \
            printf("FAIL %-44s rc %d shim +%llu driver +%llu\n", label, (int)r_,                 \
                   (unsigned long long)dc, dd);                                                  \
        }                                                                                        \
    } while (0)

#define EXPECT(label, cond)                                                                      \
    do {                                                                                         \
        if (cond) {                                                                              \
            passed++;                                                                            \
            printf("ok   %s\n", label);                                                          \
        } else {                                                                                 \
            failed++;                                                                            \
            printf("FAIL %s\n", label);                                                          \
        }                                                                                        \
    } while (0)

static uint64_t kernel_ns = 1000;
static void *params[] = {&kernel_ns};

static CUresult launch(krex_pfn_cuLaunchKernel f)
{
    return f(fn, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL);
}

static CUresult launch_ex(krex_pfn_cuLaunchKernelEx f)
{
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.hStream = stream;
    return f(&cfg, fn, params, NULL);
}

static void *lookup_v1(const char *sym, cuuint64_t flags)
{
    krex_pfn_cuGetProcAddress gpa = (krex_pfn_cuGetProcAddress)dlsym(libcuda, "cuGetProcAddress");
    void *p = NULL;
    return gpa && gpa(sym, &p, 12000, flags) == CUDA_SUCCESS ? p : NULL;
}

static void *lookup_v2(const char *sym, int version, cuuint64_t flags)
{
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    return cuGetProcAddress_v2(sym, &p, version, flags, &st) == CUDA_SUCCESS ? p : NULL;
}

int main(void)
{
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUevent ev;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, "any image"));
    CHECK(cuModuleGetFunction(&fn, mod, "krex_kernel"));
    CHECK(cuStreamCreate(&stream, 0));
    CHECK(cuEventCreate(&ev, 0));
    CHECK(cuMemAlloc_v2(&dbuf, sizeof hbuf));
    libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    sim_submissions = (unsigned long long (*)(void))dlsym(libcuda, "krexsim_submissions");
    if (!libcuda || !sim_submissions) {
        fprintf(stderr, "not the simulated driver\n");
        return 2;
    }
    CHECK(launch(cuLaunchKernel)); /* registers this process */
    find_slot();

    /* 1. Global binding. */
    EXPECT_ONE("global cuLaunchKernel", launch(cuLaunchKernel));
    EXPECT_ONE("global cuLaunchKernel_ptsz", launch(cuLaunchKernel_ptsz));
    EXPECT_ONE("global cuLaunchKernelEx", launch_ex(cuLaunchKernelEx));
    EXPECT_ONE("global cuMemcpyHtoD_v2", cuMemcpyHtoD_v2(dbuf, hbuf, sizeof hbuf));
    EXPECT_ONE("global cuMemcpyDtoH_v2", cuMemcpyDtoH_v2(hbuf, dbuf, sizeof hbuf));
    EXPECT_ONE("global cuMemcpyAsync", cuMemcpyAsync(dbuf, dbuf, 16, stream));
    EXPECT_ONE("global cuMemsetD8_v2", cuMemsetD8_v2(dbuf, 7, sizeof hbuf));
    EXPECT_ONE("global cuMemsetD32Async", cuMemsetD32Async(dbuf, 7, 4, stream));
    EXPECT_ONE("global cuEventRecord", cuEventRecord(ev, stream));
    EXPECT_ONE("global cuGraphLaunch", cuGraphLaunch((CUgraphExec)0x1, stream));

    /* 2. dlsym on the driver's handle (how the runtimes and Triton start). */
    EXPECT_ONE("dlsym cuLaunchKernel",
               launch((krex_pfn_cuLaunchKernel)dlsym(libcuda, "cuLaunchKernel")));
    EXPECT_ONE("dlsym cuLaunchKernelEx",
               launch_ex((krex_pfn_cuLaunchKernelEx)dlsym(libcuda, "cuLaunchKernelEx")));
    EXPECT_ONE("dlsym cuMemcpyHtoD_v2",
               ((krex_pfn_cuMemcpyHtoD_v2)dlsym(libcuda, "cuMemcpyHtoD_v2"))(dbuf, hbuf, 8));
    EXPECT_ONE("dlsym cuMemsetD8Async_ptsz", ((krex_pfn_cuMemsetD8Async_ptsz)dlsym(
                                                 libcuda, "cuMemsetD8Async_ptsz"))(dbuf, 1, 8, 0));
    EXPECT_ONE("dlsym(RTLD_NEXT) cuLaunchKernel",
               launch((krex_pfn_cuLaunchKernel)dlsym(RTLD_NEXT, "cuLaunchKernel")));
    EXPECT_ONE("dlsym(RTLD_DEFAULT) cuLaunchKernel",
               launch((krex_pfn_cuLaunchKernel)dlsym(RTLD_DEFAULT, "cuLaunchKernel")));

    /* 3. cuGetProcAddress, the 4-argument v1 (itself found through dlsym). */
    EXPECT_ONE("v1 cuLaunchKernel", launch((krex_pfn_cuLaunchKernel)lookup_v1("cuLaunchKernel", 0)));
    EXPECT_ONE("v1 cuLaunchKernelEx",
               launch_ex((krex_pfn_cuLaunchKernelEx)lookup_v1("cuLaunchKernelEx", 0)));
    EXPECT_ONE("v1 cuMemcpyHtoD (-> _v2)",
               ((krex_pfn_cuMemcpyHtoD_v2)lookup_v1("cuMemcpyHtoD", 0))(dbuf, hbuf, 8));

    /* 4. cuGetProcAddress_v2 (5 arguments), default and per-thread-default-stream flags. */
    EXPECT_ONE("v2 cuLaunchKernel",
               launch((krex_pfn_cuLaunchKernel)lookup_v2("cuLaunchKernel", 12080, 0)));
    EXPECT_ONE("v2 cuLaunchKernelEx",
               launch_ex((krex_pfn_cuLaunchKernelEx)lookup_v2("cuLaunchKernelEx", 12080, 0)));
    EXPECT_ONE("v2 cuMemsetD8 (-> _v2)",
               ((krex_pfn_cuMemsetD8_v2)lookup_v2("cuMemsetD8", 12080, 0))(dbuf, 3, 8));
    EXPECT_ONE("v2 cuMemcpyDtoH (-> _v2)",
               ((krex_pfn_cuMemcpyDtoH_v2)lookup_v2("cuMemcpyDtoH", 12080, 0))(hbuf, dbuf, 8));
    void *pt = lookup_v2("cuLaunchKernel", 12080, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    EXPECT("v2 per-thread flag gives the _ptsz wrapper", pt && pt == (void *)cuLaunchKernel_ptsz);
    EXPECT_ONE("v2 ptsz cuLaunchKernel", launch((krex_pfn_cuLaunchKernel)pt));
    void *pds = lookup_v2("cuMemcpyHtoD", 12080, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    EXPECT("v2 per-thread flag gives the _v2_ptds copy", pds == (void *)cuMemcpyHtoD_v2_ptds);
    EXPECT_ONE("v2 ptds cuMemcpyHtoD", ((krex_pfn_cuMemcpyHtoD_v2)pds)(dbuf, hbuf, 8));
    EXPECT_ONE("v2 ptsz cuLaunchKernelEx",
               launch_ex((krex_pfn_cuLaunchKernelEx)lookup_v2(
                   "cuLaunchKernelEx", 12080, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)));

    /* 5. The self-look-up: the runtime asks cuGetProcAddress for cuGetProcAddress. */
    krex_pfn_cuGetProcAddress_v2 self_v2 =
        (krex_pfn_cuGetProcAddress_v2)lookup_v2("cuGetProcAddress", 12080, 0);
    EXPECT("self-look-up at 12080 gives our 5-argument wrapper",
           self_v2 == (krex_pfn_cuGetProcAddress_v2)cuGetProcAddress_v2);
    krex_pfn_cuGetProcAddress self_v1 =
        (krex_pfn_cuGetProcAddress)lookup_v2("cuGetProcAddress", 11030, 0);
    EXPECT("self-look-up at 11030 gives our 4-argument wrapper",
           self_v1 == (krex_pfn_cuGetProcAddress)cuGetProcAddress);
    void *p = NULL;
    if (self_v2)
        self_v2("cuLaunchKernel", &p, 12080, 0, NULL); /* symbolStatus may be NULL */
    EXPECT_ONE("self-look-up then cuLaunchKernel", launch((krex_pfn_cuLaunchKernel)p));

    /* 6. Everything else passes through untouched: the driver's own function comes back. */
    void *count_fn = dlsym(libcuda, "cuDeviceGetCount");
    Dl_info info;
    EXPECT("dlsym of an ungated name is the driver's own",
           count_fn && dladdr(count_fn, &info) && strstr(info.dli_fname, "libcuda.so.1"));
    void *sync_fn = lookup_v2("cuStreamSynchronize", 12080, 0);
    EXPECT("cuGetProcAddress of an ungated name is the driver's own",
           sync_fn && sync_fn == dlsym(libcuda, "cuStreamSynchronize"));
    uint64_t c0 = counted();
    int n = 0;
    CHECK(cuDeviceGetCount(&n));
    CHECK(cuStreamSynchronize(stream));
    EXPECT("ungated calls are not counted", counted() == c0);
    EXPECT("no look-up went unidentified", __atomic_load_n(&self->unmatched, __ATOMIC_SEQ_CST) == 0);

    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
