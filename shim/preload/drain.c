/*
 * drain.c: the CUDA contexts this process used, and the CUDA part of the drain (docs/shim.md,
 * region protocol step 3): the drain thread (drain_thread.c) synchronises every context the
 * process used (the gate already stops new work).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>

#include "shim.h"

#define KREX_MAX_CTX 64

struct tracked {
    CUcontext ctx;
    CUdevice dev; /* >= 0: a primary context of this device; -1: a created one */
};

static struct tracked ctxs[KREX_MAX_CTX];
static int n_ctxs;
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;

void krex_ctx_track(CUcontext ctx, CUdevice dev)
{
    if (!ctx)
        return;
    pthread_mutex_lock(&ctx_lock);
    int i;
    for (i = 0; i < n_ctxs; i++)
        if (ctxs[i].ctx == ctx)
            break;
    if (i < n_ctxs) {
        if (dev >= 0)
            ctxs[i].dev = dev;
    } else if (n_ctxs < KREX_MAX_CTX) {
        ctxs[n_ctxs].ctx = ctx;
        ctxs[n_ctxs].dev = dev;
        n_ctxs++;
    } else {
        static int warned;
        if (!warned++)
            krex_warn("more than %d contexts in one process: the drain skips the rest",
                      KREX_MAX_CTX);
    }
    pthread_mutex_unlock(&ctx_lock);
}

void krex_ctx_untrack(CUcontext ctx)
{
    pthread_mutex_lock(&ctx_lock);
    for (int i = 0; i < n_ctxs; i++) {
        if (ctxs[i].ctx == ctx) {
            ctxs[i] = ctxs[--n_ctxs];
            break;
        }
    }
    pthread_mutex_unlock(&ctx_lock);
}

void krex_drain_sync(void)
{
    struct tracked copy[KREX_MAX_CTX];
    pthread_mutex_lock(&ctx_lock);
    int n = n_ctxs;
    memcpy(copy, ctxs, sizeof(struct tracked) * (size_t)n);
    pthread_mutex_unlock(&ctx_lock);
    /* Sync without the lock held: a context whose work never ends must not block the program's
     * own context calls (the controller times the drain out instead). */
    krex_pfn_cuCtxSetCurrent set = (krex_pfn_cuCtxSetCurrent)krex_real[KREX_H_cuCtxSetCurrent];
    krex_pfn_cuCtxSynchronize sync =
        (krex_pfn_cuCtxSynchronize)krex_real[KREX_H_cuCtxSynchronize];
    krex_pfn_cuDevicePrimaryCtxGetState state =
        (krex_pfn_cuDevicePrimaryCtxGetState)krex_real[KREX_H_cuDevicePrimaryCtxGetState];
    if (!set || !sync)
        return;
    for (int i = 0; i < n; i++) {
        if (copy[i].dev >= 0 && state) {
            unsigned int flags = 0;
            int active = 0;
            if (state(copy[i].dev, &flags, &active) == CUDA_SUCCESS && !active)
                continue; /* released primary context: nothing can be queued on it */
        }
        CUresult r = set(copy[i].ctx);
        if (r == CUDA_SUCCESS)
            r = sync();
        if (r == CUDA_ERROR_INVALID_CONTEXT || r == CUDA_ERROR_CONTEXT_IS_DESTROYED)
            krex_ctx_untrack(copy[i].ctx);
        else if (r != CUDA_SUCCESS)
            krex_debug("drain: synchronising context %p returned %d", (void *)copy[i].ctx, r);
    }
    set(NULL);
}

void krex_drain_forget(void)
{
    /* Threads don't survive fork; the contexts don't either (CUDA is unusable in a forked
     * child until it creates new ones, which the tracking hooks will see). */
    pthread_mutex_init(&ctx_lock, NULL);
    n_ctxs = 0;
    krex_mem_forget();
    krex_pace_forget();
}

/* Tracked entry points: passed through, the context remembered (or forgotten). */
#define REAL(name) ((krex_pfn_##name)krex_real_get(KREX_H_##name))
#define PASS(name, call)                                                                         \
    krex_pfn_##name real = REAL(name);                                                           \
    if (!real)                                                                                   \
        return krex_missing(KREX_H_##name);                                                      \
    CUresult r = real call

/* A process with a context has a slot, one without is not ours: the slot is taken before the
 * driver starts creating the context, since NVML lists the process from early in that (up to
 * seconds when many processes create theirs at once), and a region's audit would otherwise see
 * a tenant's process on the GPU with no slot. The creation is gated: a sibling's process
 * without a context, which a region may leave running (regions.freeze = contexts), gets one
 * only once the gate opens. The driver takes device memory for a context: an out-of-memory
 * answer waits as an allocation does (nothing is created when it fails, so trying again is
 * safe), instead of reaching the runtime, which may keep the failure. Each try passes the
 * gate first (announced and withdrawn at once): the creation itself is not in flight, so a
 * region's quiesce never waits for a sibling's context (seconds when many start at once); one
 * that passed before the gate closed holds its slot already, so the freeze takes it. */
#define CTX_NEW(name, dev, call)                                                                 \
    struct krex_slot *s = krex_register();                                                       \
    krex_pfn_##name real = REAL(name);                                                           \
    if (!real)                                                                                   \
        return krex_missing(KREX_H_##name);                                                      \
    CUresult r;                                                                                  \
    KREX_MEM_RETRY(r, s, 0, dev, KREX_MEM_CONTEXT, #name, {                                      \
        krex_leave(krex_enter_uncounted());                                                      \
        r = real call;                                                                           \
    })

KREX_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    CTX_NEW(cuDevicePrimaryCtxRetain, dev, (pctx, dev));
    if (r == CUDA_SUCCESS && pctx)
        krex_ctx_track(*pctx, dev);
    return r;
}

#define CREATE(name, params, args)                                                               \
    KREX_EXPORT CUresult name params                                                             \
    {                                                                                            \
        CTX_NEW(name, dev, args);                                                                \
        if (r == CUDA_SUCCESS && pctx)                                                           \
            krex_ctx_track(*pctx, -1);                                                           \
        return r;                                                                                \
    }
CREATE(cuCtxCreate, (CUcontext * pctx, unsigned int flags, CUdevice dev), (pctx, flags, dev))
CREATE(cuCtxCreate_v2, (CUcontext * pctx, unsigned int flags, CUdevice dev), (pctx, flags, dev))
CREATE(cuCtxCreate_v3,
       (CUcontext * pctx, CUexecAffinityParam *params, int n, unsigned int flags, CUdevice dev),
       (pctx, params, n, flags, dev))
CREATE(cuCtxCreate_v4,
       (CUcontext * pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev),
       (pctx, params, flags, dev))

#define USE(name)                                                                                \
    KREX_EXPORT CUresult name(CUcontext ctx)                                                     \
    {                                                                                            \
        krex_ctx_track(ctx, -1);                                                                 \
        PASS(name, (ctx));                                                                       \
        return r;                                                                                \
    }
USE(cuCtxSetCurrent)
USE(cuCtxPushCurrent)
USE(cuCtxPushCurrent_v2)

#define DESTROY(name)                                                                            \
    KREX_EXPORT CUresult name(CUcontext ctx)                                                     \
    {                                                                                            \
        krex_ctx_untrack(ctx);                                                                   \
        PASS(name, (ctx));                                                                       \
        return r;                                                                                \
    }
DESTROY(cuCtxDestroy)
DESTROY(cuCtxDestroy_v2)
