/*
 * sim_api_mem.c: device memory, copies and sets.
 *
 * Device memory is host memory: a CUdeviceptr is the address of an aligned_alloc'd block
 * (256-byte aligned), recorded in a per-process table so that cuMemFree can tell its own
 * pointers from anything else without touching the memory. Memory accounting (cuMemGetInfo)
 * is per process.
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

#include "sim.h"

#define SIM_ALLOC_ALIGN 256U
#define SIM_ALLOC_BUCKETS 4096U

struct sim_alloc {
    struct sim_alloc *next;
    uintptr_t ptr;
    size_t size; /* rounded up to SIM_ALLOC_ALIGN */
    int device;
};

/* Under sim_proc_lock. */
static struct sim_alloc *sim_allocs[SIM_ALLOC_BUCKETS];
static uint64_t sim_allocated[SIM_MAX_GPUS];

static struct sim_alloc **sim_alloc_bucket(uintptr_t p)
{
    return &sim_allocs[((p / SIM_ALLOC_ALIGN) * 0x9E3779B97F4A7C15ULL) >> 52];
}

CUresult sim_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
    if (!dptr || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = sim_ctx_current(&c);
    if (r != CUDA_SUCCESS)
        return r;
    if (bytes > SIM_TOTAL_MEM)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t size = (bytes + SIM_ALLOC_ALIGN - 1) & ~(size_t)(SIM_ALLOC_ALIGN - 1);
    struct sim_alloc *a = malloc(sizeof *a);
    void *p = aligned_alloc(SIM_ALLOC_ALIGN, size);
    if (!a || !p) {
        free(a);
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->ptr = (uintptr_t)p;
    a->size = size;
    a->device = c->device;
    pthread_mutex_lock(&sim_proc_lock);
    int room = sim_allocated[c->device] + size <= SIM_TOTAL_MEM;
    if (room) {
        sim_allocated[c->device] += size;
        struct sim_alloc **b = sim_alloc_bucket(a->ptr);
        a->next = *b;
        *b = a;
    }
    pthread_mutex_unlock(&sim_proc_lock);
    if (!room) {
        free(a);
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *dptr = (CUdeviceptr)a->ptr;
    return CUDA_SUCCESS;
}
SIM_EXPORT(cuMemAlloc_v2);

CUresult sim_cuMemFree_v2(CUdeviceptr dptr)
{
    if (dptr == 0)
        return CUDA_SUCCESS;
    uintptr_t p = (uintptr_t)dptr;
    pthread_mutex_lock(&sim_proc_lock);
    struct sim_alloc **link = sim_alloc_bucket(p), *a;
    while ((a = *link) && a->ptr != p)
        link = &a->next;
    if (a) {
        *link = a->next;
        sim_allocated[a->device] -= a->size;
    }
    pthread_mutex_unlock(&sim_proc_lock);
    if (!a)
        return CUDA_ERROR_INVALID_VALUE; /* not an allocation of ours (or freed already) */
    free((void *)a->ptr);
    free(a);
    return CUDA_SUCCESS;
}
SIM_EXPORT(cuMemFree_v2);

CUresult sim_cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    if (!free_bytes || !total_bytes)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = sim_ctx_current(&c);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&sim_proc_lock);
    *free_bytes = (size_t)(SIM_TOTAL_MEM - sim_allocated[c->device]);
    pthread_mutex_unlock(&sim_proc_lock);
    *total_bytes = (size_t)SIM_TOTAL_MEM;
    return CUDA_SUCCESS;
}
SIM_EXPORT(cuMemGetInfo_v2);

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
