/*
 * sim_api_mem.c: device memory, copies and sets.
 *
 * Device memory is host memory: a CUdeviceptr is the address of a host block (256-byte
 * aligned; from 1 MiB up an mmap with MAP_NORESERVE, so that a simulated GPU's worth of
 * allocations needs no host RAM until touched), recorded in a per-process table so that
 * cuMemFree can tell its own pointers from anything else without touching the memory. What
 * each process holds is charged, node-wide, against its GPU's capacity (sim_mem.c):
 * allocations fail with CUDA_ERROR_OUT_OF_MEMORY when the node's processes hold too much.
 * cuMemAlloc, cuMemAllocPitch, cuMemAllocManaged, the stream-ordered allocations and arrays
 * all count. Stream-ordered memory is charged at cuMemAlloc*Async and given back at
 * cuMemFreeAsync, at the call: a pool keeps nothing (a release threshold of 0, the default
 * pool's default).
 *
 * Copies and sets move the bytes at the call, immediately, before their job is queued; what
 * goes through the model is their duration, bytes / KREX_SIM_COPY_GBPS, as a job in the
 * stream that shares the GPU like a kernel. (A host memmove slower than the simulated
 * bandwidth still shows when the stream is idle: the job cannot complete before the call
 * returns. Behind other work, as in a benchmark loop, copies measure exactly.) Synchronous variants run in the legacy (or, _ptds,
 * per-thread) default stream and wait for their job to complete.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "sim.h"

#define SIM_ALLOC_ALIGN 256U
#define SIM_ALLOC_BUCKETS 4096U
#define SIM_MMAP_MIN (1U << 20) /* blocks this big or bigger are mmap'd, lazily */
#define SIM_PITCH_ALIGN 512U

enum sim_alloc_kind { SIM_ALLOC_DEVICE, SIM_ALLOC_MANAGED, SIM_ALLOC_ASYNC };

struct sim_alloc {
    struct sim_alloc *next;
    uintptr_t ptr;
    size_t size; /* rounded up to SIM_ALLOC_ALIGN: what is charged */
    uint32_t gpu;
    int kind;     /* enum sim_alloc_kind */
    int mapped;   /* mmap'd (else aligned_alloc'd) */
    struct CUmemPoolHandle_st *pool; /* stream-ordered: the pool it came from */
};

/* A memory pool: process-local, as in the real driver (no IPC export here). It never keeps
 * freed memory, whatever its release threshold: what it holds is what is allocated from it. */
#define SIM_MAGIC_POOL 0x504F4F31U
struct CUmemPoolHandle_st {
    uint32_t magic;
    int alive;      /* 0 once destroyed: its outstanding allocations still count until freed */
    int is_default;
    uint32_t gpu;
    uint64_t max_size; /* CUmemPoolProps.maxSize; 0: up to the GPU's capacity */
    uint64_t used;     /* bytes allocated from it and not yet freed (under sim_proc_lock) */
};

/* Under sim_proc_lock. */
static struct sim_alloc *sim_allocs[SIM_ALLOC_BUCKETS];
static struct CUmemPoolHandle_st sim_default_pools[SIM_MAX_GPUS];

static struct sim_alloc **sim_alloc_bucket(uintptr_t p)
{
    return &sim_allocs[((p / SIM_ALLOC_ALIGN) * 0x9E3779B97F4A7C15ULL) >> 52];
}

void sim_allocs_after_fork_child(void)
{
    /* The inherited blocks stay mapped in the child (fork copies them); they are no longer
     * allocations of the simulated GPU, and the child is charged for nothing. */
    memset(sim_allocs, 0, sizeof sim_allocs);
    for (uint32_t g = 0; g < SIM_MAX_GPUS; g++)
        sim_default_pools[g].used = 0;
}

static void *sim_host_alloc(size_t size, int *mapped)
{
    *mapped = size >= SIM_MMAP_MIN;
    if (!*mapped)
        return aligned_alloc(SIM_ALLOC_ALIGN, size);
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void sim_host_free(void *p, size_t size, int mapped)
{
    if (mapped)
        munmap(p, size);
    else
        free(p);
}

/* Allocate `bytes` on simulated GPU `gpu`, charged to this process (and to `pool`). */
static CUresult sim_alloc_on(uint32_t gpu, size_t bytes, int kind,
                             struct CUmemPoolHandle_st *pool, CUdeviceptr *dptr)
{
    if (bytes > sim_mem_capacity(gpu) || bytes > SIZE_MAX - SIM_ALLOC_ALIGN)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t size = (bytes + SIM_ALLOC_ALIGN - 1) & ~(size_t)(SIM_ALLOC_ALIGN - 1);
    if (pool) {
        pthread_mutex_lock(&sim_proc_lock);
        int room = !pool->max_size || (pool->used <= pool->max_size &&
                                       size <= pool->max_size - pool->used);
        if (room)
            pool->used += size;
        pthread_mutex_unlock(&sim_proc_lock);
        if (!room)
            return CUDA_ERROR_OUT_OF_MEMORY; /* the pool's maxSize */
    }
    CUresult r = sim_mem_charge(gpu, size);
    struct sim_alloc *a = NULL;
    void *p = NULL;
    if (r == CUDA_SUCCESS) {
        a = malloc(sizeof *a);
        p = a ? sim_host_alloc(size, &a->mapped) : NULL;
        if (!p) {
            free(a);
            sim_mem_uncharge(gpu, size);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    if (r != CUDA_SUCCESS) {
        if (pool) {
            pthread_mutex_lock(&sim_proc_lock);
            pool->used -= size;
            pthread_mutex_unlock(&sim_proc_lock);
        }
        return r;
    }
    a->ptr = (uintptr_t)p;
    a->size = size;
    a->gpu = gpu;
    a->kind = kind;
    a->pool = pool;
    pthread_mutex_lock(&sim_proc_lock);
    struct sim_alloc **b = sim_alloc_bucket(a->ptr);
    a->next = *b;
    *b = a;
    pthread_mutex_unlock(&sim_proc_lock);
    *dptr = (CUdeviceptr)a->ptr;
    return CUDA_SUCCESS;
}

/* Free an allocation of this process: CUDA_ERROR_INVALID_VALUE if `dptr` is not one. */
static CUresult sim_free_ptr(CUdeviceptr dptr)
{
    uintptr_t p = (uintptr_t)dptr;
    pthread_mutex_lock(&sim_proc_lock);
    struct sim_alloc **link = sim_alloc_bucket(p), *a;
    while ((a = *link) && a->ptr != p)
        link = &a->next;
    if (a) {
        *link = a->next;
        if (a->pool)
            a->pool->used -= a->size;
    }
    pthread_mutex_unlock(&sim_proc_lock);
    if (!a)
        return CUDA_ERROR_INVALID_VALUE; /* not an allocation of ours (or freed already) */
    sim_host_free((void *)a->ptr, a->size, a->mapped);
    sim_mem_uncharge(a->gpu, a->size);
    free(a);
    return CUDA_SUCCESS;
}

static CUresult sim_current_gpu(uint32_t *gpu)
{
    struct CUctx_st *c;
    CUresult r = sim_ctx_current(&c);
    if (r == CUDA_SUCCESS)
        *gpu = (uint32_t)c->device;
    return r;
}

CUresult sim_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
    if (!dptr || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint32_t gpu;
    CUresult r = sim_current_gpu(&gpu);
    return r != CUDA_SUCCESS ? r : sim_alloc_on(gpu, bytes, SIM_ALLOC_DEVICE, NULL, dptr);
}
SIM_EXPORT(cuMemAlloc_v2);

/* Rows of WidthInBytes, each starting at a multiple of 512 bytes (the pitch). */
CUresult sim_cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                size_t Height, unsigned int ElementSizeBytes)
{
    if (!dptr || !pPitch || WidthInBytes == 0 || Height == 0 ||
        (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    if (WidthInBytes > SIZE_MAX - SIM_PITCH_ALIGN)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t pitch = (WidthInBytes + SIM_PITCH_ALIGN - 1) & ~(size_t)(SIM_PITCH_ALIGN - 1);
    if (Height > SIZE_MAX / pitch)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint32_t gpu;
    CUresult r = sim_current_gpu(&gpu);
    if (r == CUDA_SUCCESS)
        r = sim_alloc_on(gpu, pitch * Height, SIM_ALLOC_DEVICE, NULL, dptr);
    if (r == CUDA_SUCCESS)
        *pPitch = pitch;
    return r;
}
SIM_EXPORT(cuMemAllocPitch_v2);

/* Managed memory counts against the current device's capacity like device memory (the real
 * driver lets it oversubscribe the device and charges only what is resident). */
CUresult sim_cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags)
{
    if (!dptr || bytes == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    uint32_t gpu;
    CUresult r = sim_current_gpu(&gpu);
    return r != CUDA_SUCCESS ? r : sim_alloc_on(gpu, bytes, SIM_ALLOC_MANAGED, NULL, dptr);
}
SIM_EXPORT(cuMemAllocManaged);

CUresult sim_cuMemFree_v2(CUdeviceptr dptr)
{
    if (dptr == 0)
        return CUDA_SUCCESS;
    return sim_free_ptr(dptr);
}
SIM_EXPORT(cuMemFree_v2);

CUresult sim_cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    if (!free_bytes || !total_bytes)
        return CUDA_ERROR_INVALID_VALUE;
    uint32_t gpu;
    CUresult r = sim_current_gpu(&gpu);
    uint64_t used = 0, cap = 0;
    if (r == CUDA_SUCCESS)
        r = sim_mem_info(gpu, &used, &cap);
    if (r != CUDA_SUCCESS)
        return r;
    *free_bytes = (size_t)(used < cap ? cap - used : 0);
    *total_bytes = (size_t)cap;
    return CUDA_SUCCESS;
}
SIM_EXPORT(cuMemGetInfo_v2);

/* ---- Stream-ordered allocation and pools. ---- */

static CUresult sim_pool_check(struct CUmemPoolHandle_st *pool)
{
    if (!pool || pool->magic != SIM_MAGIC_POOL || !pool->alive)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* The GPU of stream `s` (checked as a launch would check it). */
static CUresult sim_stream_gpu(CUstream s, enum sim_null_stream null_is, uint32_t *gpu)
{
    CUresult r = sim_model_lock(NULL);
    if (r != CUDA_SUCCESS)
        return r;
    struct sim_target tg;
    r = sim_resolve_stream(s, null_is, &tg);
    sim_model_unlock();
    if (r == CUDA_SUCCESS)
        *gpu = tg.gpu;
    return r;
}

static struct CUmemPoolHandle_st *sim_default_pool(uint32_t gpu)
{
    struct CUmemPoolHandle_st *p = &sim_default_pools[gpu];
    pthread_mutex_lock(&sim_proc_lock);
    if (p->magic != SIM_MAGIC_POOL) {
        p->gpu = gpu;
        p->is_default = 1;
        p->alive = 1;
        p->max_size = 0;
        p->magic = SIM_MAGIC_POOL;
    }
    pthread_mutex_unlock(&sim_proc_lock);
    return p;
}

static CUresult sim_alloc_async(CUdeviceptr *dptr, size_t bytes, struct CUmemPoolHandle_st *pool,
                                CUstream s, enum sim_null_stream null_is)
{
    if (!dptr || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (pool && sim_pool_check(pool) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_VALUE;
    uint32_t gpu;
    CUresult r = sim_stream_gpu(s, null_is, &gpu);
    if (r != CUDA_SUCCESS)
        return r;
    if (!pool)
        pool = sim_default_pool(gpu);
    /* A pool's memory is on its device, whichever device the stream's is. */
    return sim_alloc_on(pool->gpu, bytes, SIM_ALLOC_ASYNC, pool, dptr);
}

static CUresult sim_free_async(CUdeviceptr dptr, CUstream s, enum sim_null_stream null_is)
{
    uint32_t gpu;
    CUresult r = sim_stream_gpu(s, null_is, &gpu);
    if (r != CUDA_SUCCESS)
        return r;
    if (dptr == 0)
        return CUDA_SUCCESS;
    return sim_free_ptr(dptr); /* at the call, not when the stream reaches the free */
}

CUresult sim_cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream s)
{
    return sim_alloc_async(dptr, bytes, NULL, s, SIM_NULL_LEGACY);
}
SIM_EXPORT(cuMemAllocAsync);

CUresult sim_cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream s)
{
    return sim_alloc_async(dptr, bytes, NULL, s, SIM_NULL_PER_THREAD);
}
SIM_EXPORT(cuMemAllocAsync_ptsz);

CUresult sim_cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                                     CUstream s)
{
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    return sim_alloc_async(dptr, bytes, pool, s, SIM_NULL_LEGACY);
}
SIM_EXPORT(cuMemAllocFromPoolAsync);

CUresult sim_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                                          CUstream s)
{
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    return sim_alloc_async(dptr, bytes, pool, s, SIM_NULL_PER_THREAD);
}
SIM_EXPORT(cuMemAllocFromPoolAsync_ptsz);

CUresult sim_cuMemFreeAsync(CUdeviceptr dptr, CUstream s)
{
    return sim_free_async(dptr, s, SIM_NULL_LEGACY);
}
SIM_EXPORT(cuMemFreeAsync);

CUresult sim_cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s)
{
    return sim_free_async(dptr, s, SIM_NULL_PER_THREAD);
}
SIM_EXPORT(cuMemFreeAsync_ptsz);

CUresult sim_cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    if (!pool_out)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = sim_check_device(dev);
    if (r == CUDA_SUCCESS)
        *pool_out = sim_default_pool((uint32_t)dev);
    return r;
}
SIM_EXPORT(cuDeviceGetDefaultMemPool);

CUresult sim_cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    if (!pool || !props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    if (props->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return props->location.type == CU_MEM_LOCATION_TYPE_INVALID ? CUDA_ERROR_INVALID_VALUE
                                                                    : CUDA_ERROR_NOT_SUPPORTED;
    if (props->handleTypes != CU_MEM_HANDLE_TYPE_NONE &&
        props->handleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    int gpu = sim_ordinal_gpu(props->location.id);
    if (gpu < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    struct CUmemPoolHandle_st *p = calloc(1, sizeof *p);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->magic = SIM_MAGIC_POOL;
    p->alive = 1;
    p->gpu = (uint32_t)gpu;
    p->max_size = props->maxSize;
    *pool = p;
    return CUDA_SUCCESS;
}
SIM_EXPORT(cuMemPoolCreate);

/* As the real driver: allocations still outstanding stay valid (and counted) until freed.
 * The pool itself is never freed, so that a stale handle reads as destroyed. */
CUresult sim_cuMemPoolDestroy(CUmemoryPool pool)
{
    if (sim_pool_check(pool) != CUDA_SUCCESS || pool->is_default)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_proc_lock);
    pool->alive = 0;
    pthread_mutex_unlock(&sim_proc_lock);
    return CUDA_SUCCESS;
}
SIM_EXPORT(cuMemPoolDestroy);

/* Nothing to trim: the simulated pools keep no freed memory. */
CUresult sim_cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    (void)minBytesToKeep;
    return sim_pool_check(pool);
}
SIM_EXPORT(cuMemPoolTrimTo);

/* ---- Arrays: counted, with no backing (no simulated call reads or writes an array). ---- */

#define SIM_MAGIC_ARRAY 0x41525231U
struct CUarray_st {
    uint32_t magic;
    uint32_t gpu;
    uint64_t bytes;
};

static size_t sim_format_bytes(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
        return 4;
    }
    return 0;
}

CUresult sim_cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *d)
{
    if (!pHandle || !d || d->Width == 0)
        return CUDA_ERROR_INVALID_VALUE;
    size_t elem = sim_format_bytes(d->Format);
    if (elem == 0 || (d->NumChannels != 1 && d->NumChannels != 2 && d->NumChannels != 4))
        return CUDA_ERROR_INVALID_VALUE;
    size_t rows = d->Height ? d->Height : 1, row = elem * d->NumChannels;
    if (d->Width > SIZE_MAX / row || rows > SIZE_MAX / (d->Width * row))
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint32_t gpu;
    CUresult r = sim_current_gpu(&gpu);
    if (r != CUDA_SUCCESS)
        return r;
    struct CUarray_st *a = calloc(1, sizeof *a);
    if (!a)
        return CUDA_ERROR_OUT_OF_MEMORY;
    a->bytes = (d->Width * row * rows + SIM_ALLOC_ALIGN - 1) & ~(uint64_t)(SIM_ALLOC_ALIGN - 1);
    a->gpu = gpu;
    r = sim_mem_charge(gpu, a->bytes);
    if (r != CUDA_SUCCESS) {
        free(a);
        return r;
    }
    a->magic = SIM_MAGIC_ARRAY;
    *pHandle = a;
    return CUDA_SUCCESS;
}
SIM_EXPORT(cuArrayCreate_v2);

/* The struct is kept (marked dead), so that a second destroy reads as an invalid handle. */
CUresult sim_cuArrayDestroy(CUarray h)
{
    if (!h)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_proc_lock);
    int ok = h->magic == SIM_MAGIC_ARRAY;
    if (ok)
        h->magic = SIM_MAGIC_DEAD;
    pthread_mutex_unlock(&sim_proc_lock);
    if (!ok)
        return CUDA_ERROR_INVALID_HANDLE;
    sim_mem_uncharge(h->gpu, h->bytes);
    return CUDA_SUCCESS;
}
SIM_EXPORT(cuArrayDestroy);

/* ---- Copies and sets. ---- */

#define SIM_PTR(d) ((void *)(uintptr_t)(d))

/* Queue a job of `bytes` worth of transfer time, then run `move` (the bytes themselves).
 * Synchronous: also wait for the job. */
struct sim_move {
    void *dst;
    const void *src; /* copies */
    size_t n;        /* elements */
    size_t elem;     /* element size: 1 for copies, 1 or 4 for sets */
    uint32_t value;  /* sets */
    int is_set;
};

static void sim_move_bytes(const struct sim_move *m)
{
    if (!m->is_set) {
        memmove(m->dst, m->src, m->n);
    } else if (m->elem == 1) {
        memset(m->dst, (int)(m->value & 0xFF), m->n);
    } else {
        uint32_t *p = m->dst;
        for (size_t i = 0; i < m->n; i++)
            p[i] = m->value;
    }
}

static CUresult sim_transfer(const struct sim_move *m, CUstream s, enum sim_null_stream null_is,
                             int sync)
{
    int64_t arrive = sim_mono_ns();
    sim_count_submission();
    if (m->n && (!m->dst || (!m->is_set && !m->src)))
        return CUDA_ERROR_INVALID_VALUE;
    if (m->n > SIZE_MAX / m->elem)
        return CUDA_ERROR_INVALID_VALUE;
    size_t bytes = m->n * m->elem;
    struct sim_work w = {.kind = m->is_set ? SIM_JOB_SET : SIM_JOB_COPY,
                         .duration_ns = (double)bytes / sim_cfg.copy_bytes_per_ns,
                         .event = SIM_NONE,
                         .event_gen = 0};
    struct sim_target tg;
    uint64_t seq;
    /* Check the stream first, so that a failing call moves nothing. */
    CUresult r = sim_model_lock(NULL);
    if (r != CUDA_SUCCESS)
        return r;
    r = sim_resolve_stream(s, null_is, &tg);
    sim_model_unlock();
    if (r != CUDA_SUCCESS)
        return r;
    /* Move the bytes before the job is queued, outside the lock; the job still arrives when
     * the call did, so that host memmove time does not add to the simulated copy. */
    if (bytes)
        sim_move_bytes(m);
    r = sim_submit(s, null_is, &w, arrive, &tg, &seq);
    if (r != CUDA_SUCCESS)
        return r;
    return sync ? sim_wait_stream(&tg, seq) : CUDA_SUCCESS;
}

static CUresult sim_copy(void *dst, const void *src, size_t n, CUstream s,
                         enum sim_null_stream null_is, int sync)
{
    struct sim_move m = {.dst = dst, .src = src, .n = n, .elem = 1, .value = 0, .is_set = 0};
    return sim_transfer(&m, s, null_is, sync);
}

static CUresult sim_set(CUdeviceptr dst, uint32_t value, size_t elem, size_t n, CUstream s,
                        enum sim_null_stream null_is, int sync)
{
    struct sim_move m = {
        .dst = SIM_PTR(dst), .src = NULL, .n = n, .elem = elem, .value = value, .is_set = 1};
    return sim_transfer(&m, s, null_is, sync);
}

#define SIM_LEG SIM_NULL_LEGACY
#define SIM_PT SIM_NULL_PER_THREAD

/* Synchronous copies. */
CUresult sim_cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    return sim_copy(SIM_PTR(dst), src, n, NULL, SIM_LEG, 1);
}
SIM_EXPORT(cuMemcpyHtoD_v2);

CUresult sim_cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n)
{
    return sim_copy(SIM_PTR(dst), src, n, NULL, SIM_PT, 1);
}
SIM_EXPORT(cuMemcpyHtoD_v2_ptds);

CUresult sim_cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    return sim_copy(dst, SIM_PTR(src), n, NULL, SIM_LEG, 1);
}
SIM_EXPORT(cuMemcpyDtoH_v2);

CUresult sim_cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n)
{
    return sim_copy(dst, SIM_PTR(src), n, NULL, SIM_PT, 1);
}
SIM_EXPORT(cuMemcpyDtoH_v2_ptds);

CUresult sim_cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    return sim_copy(SIM_PTR(dst), SIM_PTR(src), n, NULL, SIM_LEG, 1);
}
SIM_EXPORT(cuMemcpyDtoD_v2);

CUresult sim_cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    return sim_copy(SIM_PTR(dst), SIM_PTR(src), n, NULL, SIM_PT, 1);
}
SIM_EXPORT(cuMemcpyDtoD_v2_ptds);

CUresult sim_cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    return sim_copy(SIM_PTR(dst), SIM_PTR(src), n, NULL, SIM_LEG, 1);
}
SIM_EXPORT(cuMemcpy);

CUresult sim_cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    return sim_copy(SIM_PTR(dst), SIM_PTR(src), n, NULL, SIM_PT, 1);
}
SIM_EXPORT(cuMemcpy_ptds);

/* Asynchronous copies. */
CUresult sim_cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    return sim_copy(SIM_PTR(dst), SIM_PTR(src), n, s, SIM_LEG, 0);
}
SIM_EXPORT(cuMemcpyAsync);

CUresult sim_cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    return sim_copy(SIM_PTR(dst), SIM_PTR(src), n, s, SIM_PT, 0);
}
SIM_EXPORT(cuMemcpyAsync_ptsz);

CUresult sim_cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
    return sim_copy(SIM_PTR(dst), src, n, s, SIM_LEG, 0);
}
SIM_EXPORT(cuMemcpyHtoDAsync_v2);

CUresult sim_cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
    return sim_copy(SIM_PTR(dst), src, n, s, SIM_PT, 0);
}
SIM_EXPORT(cuMemcpyHtoDAsync_v2_ptsz);

CUresult sim_cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
    return sim_copy(dst, SIM_PTR(src), n, s, SIM_LEG, 0);
}
SIM_EXPORT(cuMemcpyDtoHAsync_v2);

CUresult sim_cuMemcpyDtoHAsync_v2_ptsz(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
    return sim_copy(dst, SIM_PTR(src), n, s, SIM_PT, 0);
}
SIM_EXPORT(cuMemcpyDtoHAsync_v2_ptsz);

CUresult sim_cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    return sim_copy(SIM_PTR(dst), SIM_PTR(src), n, s, SIM_LEG, 0);
}
SIM_EXPORT(cuMemcpyDtoDAsync_v2);

CUresult sim_cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    return sim_copy(SIM_PTR(dst), SIM_PTR(src), n, s, SIM_PT, 0);
}
SIM_EXPORT(cuMemcpyDtoDAsync_v2_ptsz);

/* Sets. */
CUresult sim_cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n)
{
    return sim_set(dst, v, 1, n, NULL, SIM_LEG, 1);
}
SIM_EXPORT(cuMemsetD8_v2);

CUresult sim_cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char v, size_t n)
{
    return sim_set(dst, v, 1, n, NULL, SIM_PT, 1);
}
SIM_EXPORT(cuMemsetD8_v2_ptds);

CUresult sim_cuMemsetD32_v2(CUdeviceptr dst, unsigned int v, size_t n)
{
    return sim_set(dst, v, 4, n, NULL, SIM_LEG, 1);
}
SIM_EXPORT(cuMemsetD32_v2);

CUresult sim_cuMemsetD32_v2_ptds(CUdeviceptr dst, unsigned int v, size_t n)
{
    return sim_set(dst, v, 4, n, NULL, SIM_PT, 1);
}
SIM_EXPORT(cuMemsetD32_v2_ptds);

CUresult sim_cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s)
{
    return sim_set(dst, v, 1, n, s, SIM_LEG, 0);
}
SIM_EXPORT(cuMemsetD8Async);

CUresult sim_cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char v, size_t n, CUstream s)
{
    return sim_set(dst, v, 1, n, s, SIM_PT, 0);
}
SIM_EXPORT(cuMemsetD8Async_ptsz);

CUresult sim_cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream s)
{
    return sim_set(dst, v, 4, n, s, SIM_LEG, 0);
}
SIM_EXPORT(cuMemsetD32Async);

CUresult sim_cuMemsetD32Async_ptsz(CUdeviceptr dst, unsigned int v, size_t n, CUstream s)
{
    return sim_set(dst, v, 4, n, s, SIM_PT, 0);
}
SIM_EXPORT(cuMemsetD32Async_ptsz);
