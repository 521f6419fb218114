/*
 * sim_ctx.c: per-process state of the simulated driver: contexts, each thread's current-
 * context stack, the default streams, and the handle pool.
 *
 * Contexts are per process. Each has a legacy default stream (NULL or CU_STREAM_LEGACY in a
 * plain entry point), made on first use; each thread has its own per-thread default stream
 * per context (CU_STREAM_PER_THREAD, or NULL in a _ptsz/_ptds entry point). Simplification:
 * the legacy stream does not synchronise implicitly with the other streams of its context;
 * it is just one more in-order stream.
 *
 * Context structs are never freed (a destroyed one stays, marked dead), so that a stale
 * CUcontext reads as CUDA_ERROR_CONTEXT_IS_DESTROYED instead of as freed memory.
 *
 * Device memory a context takes for itself, as a real one does (a few hundred MiB on an
 * H200): KREX_SIM_CTX_BYTES, charged node-wide when the context comes into being (cuCtxCreate*,
 * a primary context's first retain) and given back when it goes (cuCtxDestroy*, the last
 * release), or with the process. Its local-memory reservation grows with the kernels launched
 * in it (sim_ctx_reserve_local) and goes with it too.
 */
#include <stdlib.h>
#include <string.h>

#include "sim.h"

pthread_mutex_t sim_proc_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- Handles. ---- */

static struct sim_handle *sim_handle_pool;

struct sim_handle *sim_handle_new(uint32_t magic)
{
    pthread_mutex_lock(&sim_proc_lock);
    struct sim_handle *h = sim_handle_pool;
    if (h)
        sim_handle_pool = h->link;
    pthread_mutex_unlock(&sim_proc_lock);
    if (!h)
        h = malloc(sizeof *h);
    if (!h)
        return NULL;
    memset(h, 0, sizeof *h);
    h->magic = magic;
    h->slot = h->gen = SIM_NONE;
    return h;
}

void sim_handle_kill(struct sim_handle *h)
{
    pthread_mutex_lock(&sim_proc_lock);
    h->magic = SIM_MAGIC_DEAD;
    h->link = sim_handle_pool;
    sim_handle_pool = h;
    pthread_mutex_unlock(&sim_proc_lock);
}

/* ---- Contexts and the current-context stack. ---- */

#define SIM_CTX_STACK 64

static struct CUctx_st *sim_all_ctx; /* created contexts, under sim_proc_lock */
static uint64_t sim_ctx_serial;

/* Primary contexts: one struct per device, (re)activated by the first retain. */
static struct CUctx_st sim_primary[SIM_MAX_GPUS];
static unsigned sim_primary_refs[SIM_MAX_GPUS];
static pthread_mutex_t sim_primary_lock = PTHREAD_MUTEX_INITIALIZER;

/* Contexts' device memory (mem_own, mem_local) and their death, so that a launch never grows
 * the reservation of a context that is being given back. Taken before the model lock. */
static pthread_mutex_t sim_ctx_mem_lock = PTHREAD_MUTEX_INITIALIZER;

static __thread struct {
    unsigned n;
    struct CUctx_st *s[SIM_CTX_STACK];
} tls_ctx;

static uint64_t sim_ctx_new_id(void)
{
    return __atomic_add_fetch(&sim_ctx_serial, 1, __ATOMIC_RELAXED);
}

CUresult sim_check_device(CUdevice dev)
{
    CUresult r = sim_ensure_init();
    if (r != CUDA_SUCCESS)
        return r;
    for (unsigned i = 0; i < sim_cfg.n_visible; i++)
        if (sim_cfg.visible[i] == dev)
            return CUDA_SUCCESS; /* a device this process sees (CUDA_VISIBLE_DEVICES) */
    return CUDA_ERROR_INVALID_DEVICE;
}

CUresult sim_ctx_check(struct CUctx_st *c)
{
    if (!c || c->magic != SIM_MAGIC_CTX)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!__atomic_load_n(&c->alive, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    return CUDA_SUCCESS;
}

CUcontext sim_ctx_top(void)
{
    return tls_ctx.n ? tls_ctx.s[tls_ctx.n - 1] : NULL;
}

CUresult sim_ctx_current(struct CUctx_st **out)
{
    CUresult r = sim_ensure_init();
    if (r != CUDA_SUCCESS)
        return r;
    struct CUctx_st *c = sim_ctx_top();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    r = sim_ctx_check(c);
    if (r == CUDA_SUCCESS)
        *out = c;
    return r;
}

CUresult sim_ctx_push(CUcontext ctx)
{
    CUresult r = sim_ctx_check(ctx);
    if (r != CUDA_SUCCESS)
        return r;
    if (tls_ctx.n >= SIM_CTX_STACK)
        return CUDA_ERROR_OUT_OF_MEMORY;
    tls_ctx.s[tls_ctx.n++] = ctx;
    return CUDA_SUCCESS;
}

CUresult sim_ctx_pop(CUcontext *pctx)
{
    if (!tls_ctx.n)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext c = tls_ctx.s[--tls_ctx.n];
    if (pctx)
        *pctx = c;
    return CUDA_SUCCESS;
}

CUresult sim_ctx_set_current(CUcontext ctx)
{
    if (!ctx) { /* unbind: pop the top, if any */
        if (tls_ctx.n)
            tls_ctx.n--;
        return CUDA_SUCCESS;
    }
    CUresult r = sim_ctx_check(ctx);
    if (r != CUDA_SUCCESS)
        return r;
    if (tls_ctx.n)
        tls_ctx.s[tls_ctx.n - 1] = ctx;
    else
        tls_ctx.s[tls_ctx.n++] = ctx;
    return CUDA_SUCCESS;
}

/* Take the node's context lock and publish this process as its holder, unless the process is
 * locked (cuCheckpointProcessLock): then wait, holding neither lock, until it is unlocked. A
 * lock waits for the holder of the context lock (sim_ckpt.c), and this looks under the model
 * lock after publishing: whichever comes first, a locked process never creates a context (so
 * its charge below never waits), and it never stalls the others' creations while it waits. */
static CUresult sim_ctx_lock_take(CUdevice dev)
{
    for (;;) {
        int recovered;
        if (sim_robust_lock(&sim_shm->ctx_lock, &recovered) != 0)
            return CUDA_ERROR_UNKNOWN;
        __atomic_store_n(&sim_shm->ctx_holder_gpu, (uint32_t)dev + 1, __ATOMIC_RELEASE);
        __atomic_store_n(&sim_shm->ctx_holder, (uint32_t)sim_pid, __ATOMIC_RELEASE);
        if (recovered)
            sim_debug("a process died while creating a context; going on");
        int frozen = 0;
        CUresult r = sim_model_lock_any(&frozen);
        if (r == CUDA_SUCCESS)
            sim_model_unlock();
        if (r != CUDA_SUCCESS || !frozen)
            return CUDA_SUCCESS; /* a broken node fails the charge instead */
        __atomic_store_n(&sim_shm->ctx_holder, 0, __ATOMIC_RELEASE);
        __atomic_store_n(&sim_shm->ctx_holder_gpu, 0, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&sim_shm->ctx_lock);
        if (sim_model_lock_raw() == CUDA_SUCCESS) /* waits while the process is locked */
            sim_model_unlock();
    }
}

/* Context creation takes KREX_SIM_CTX_CREATE_MS under one lock for the whole node, as the
 * real driver serialises context creation node-wide. The model lock is not held. Meanwhile the
 * process is one of the GPU's users, as a real one is in NVML's list from early in its
 * context's creation. The context's own memory is charged first: when it does not fit, the
 * creation fails with CUDA_ERROR_OUT_OF_MEMORY at once, and nothing is created. */
static CUresult sim_ctx_creation(CUdevice dev)
{
    CUresult r = sim_ctx_lock_take(dev);
    if (r != CUDA_SUCCESS)
        return r;
    r = sim_mem_charge((uint32_t)dev, sim_cfg.ctx_bytes);
    if (r == CUDA_SUCCESS && sim_cfg.ctx_create_ns > 0)
        sim_sleep_until(sim_mono_ns() + (int64_t)sim_cfg.ctx_create_ns);
    __atomic_store_n(&sim_shm->ctx_holder, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&sim_shm->ctx_holder_gpu, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&sim_shm->ctx_lock);
    if (r != CUDA_SUCCESS)
        sim_debug("no memory for a context on simulated GPU %d (%llu byte(s))", dev,
                  (unsigned long long)sim_cfg.ctx_bytes);
    return r;
}

/* After a successful sim_ctx_creation: the context holds what it charged. */
static void sim_ctx_activate(struct CUctx_st *c, int dev, int primary, unsigned flags)
{
    c->magic = SIM_MAGIC_CTX;
    c->device = dev;
    c->primary = primary;
    c->flags = flags;
    c->id = sim_ctx_new_id();
    c->legacy_slot = c->legacy_gen = SIM_NONE;
    c->mem_own = sim_cfg.ctx_bytes;
    c->mem_local = 0;
    __atomic_store_n(&c->alive, 1, __ATOMIC_RELEASE);
}

CUresult sim_ctx_reserve_local(struct CUctx_st *c, uint64_t need)
{
    pthread_mutex_lock(&sim_ctx_mem_lock);
    CUresult r = sim_ctx_check(c);
    if (r == CUDA_SUCCESS && need > c->mem_local) {
        r = sim_mem_charge((uint32_t)c->device, need - c->mem_local);
        if (r == CUDA_SUCCESS) {
            sim_debug("local memory of context %p on simulated GPU %d: %llu byte(s)", (void *)c,
                      c->device, (unsigned long long)need);
            c->mem_local = need;
        }
    }
    pthread_mutex_unlock(&sim_ctx_mem_lock);
    return r;
}

CUresult sim_stream_ctx(CUstream s, struct CUctx_st **out)
{
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
        return sim_ctx_current(out);
    if (s->h.magic != SIM_MAGIC_STREAM)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = sim_ctx_check(s->h.ctx);
    if (r == CUDA_SUCCESS)
        *out = s->h.ctx;
    return r;
}

CUresult sim_ctx_create(CUcontext *pctx, unsigned flags, CUdevice dev)
{
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = sim_check_device(dev);
    if (r != CUDA_SUCCESS)
        return r;
    if (tls_ctx.n >= SIM_CTX_STACK)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct CUctx_st *c = calloc(1, sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    r = sim_ctx_creation(dev);
    if (r != CUDA_SUCCESS) {
        free(c);
        return r;
    }
    sim_ctx_activate(c, dev, 0, flags);
    pthread_mutex_lock(&sim_proc_lock);
    c->next_all = sim_all_ctx;
    sim_all_ctx = c;
    pthread_mutex_unlock(&sim_proc_lock);
    tls_ctx.s[tls_ctx.n++] = c; /* cuCtxCreate pushes the new context */
    *pctx = c;
    sim_debug("created context %p on simulated GPU %d", (void *)c, dev);
    return CUDA_SUCCESS;
}

/* Let go of every stream of context c (its queued work still runs), mark it dead, and give
 * back its device memory. */
static void sim_ctx_retire(struct CUctx_st *c)
{
    if (sim_model_lock(NULL) == CUDA_SUCCESS) {
        for (uint32_t i = 0; i < SIM_MAX_STREAMS; i++) {
            const struct sim_stream *st = &sim_shm->streams[i];
            if (st->owner == (int32_t)sim_pid && st->ctx_id == c->id)
                sim_stream_release(i, st->gen);
        }
        sim_model_unlock();
    }
    pthread_mutex_lock(&sim_ctx_mem_lock);
    __atomic_store_n(&c->alive, 0, __ATOMIC_RELEASE);
    uint64_t held = c->mem_own + c->mem_local;
    c->mem_own = c->mem_local = 0;
    pthread_mutex_unlock(&sim_ctx_mem_lock);
    sim_mem_uncharge((uint32_t)c->device, held);
}

CUresult sim_ctx_destroy(CUcontext ctx)
{
    CUresult r = sim_ensure_init();
    if (r != CUDA_SUCCESS)
        return r;
    r = sim_ctx_check(ctx);
    if (r != CUDA_SUCCESS)
        return r;
    if (ctx->primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    sim_ctx_synchronize(ctx);
    sim_ctx_retire(ctx);
    if (tls_ctx.n && tls_ctx.s[tls_ctx.n - 1] == ctx)
        tls_ctx.n--;
    sim_debug("destroyed context %p", (void *)ctx);
    return CUDA_SUCCESS;
}

/* ---- Synchronising a context: all of this process's work in it. ---- */

struct sim_ctx_cond {
    unsigned n;
    struct {
        uint32_t slot, gen;
        uint64_t seq;
    } s[SIM_MAX_STREAMS];
};

static int sim_ctx_done(void *arg)
{
    const struct sim_ctx_cond *c = arg;
    for (unsigned i = 0; i < c->n; i++) {
        const struct sim_stream *st = &sim_shm->streams[c->s[i].slot];
        if (st->gen == c->s[i].gen && st->owner == (int32_t)sim_pid &&
            st->completed < c->s[i].seq && st->head != SIM_NONE)
            return 0;
    }
    return 1;
}

CUresult sim_ctx_synchronize(struct CUctx_st *c)
{
    struct sim_ctx_cond *cond = malloc(sizeof *cond);
    if (!cond)
        return CUDA_ERROR_OUT_OF_MEMORY;
    cond->n = 0;
    CUresult r = sim_model_lock(NULL);
    if (r != CUDA_SUCCESS) {
        free(cond);
        return r;
    }
    for (uint32_t i = 0; i < SIM_MAX_STREAMS; i++) {
        const struct sim_stream *st = &sim_shm->streams[i];
        if (st->owner == (int32_t)sim_pid && st->ctx_id == c->id && st->head != SIM_NONE) {
            cond->s[cond->n].slot = i;
            cond->s[cond->n].gen = st->gen;
            cond->s[cond->n].seq = st->submitted;
            cond->n++;
        }
    }
    sim_model_unlock();
    r = cond->n ? sim_wait((uint32_t)c->device, sim_ctx_done, cond) : CUDA_SUCCESS;
    free(cond);
    return r;
}

/* ---- Primary contexts. ---- */

CUresult sim_primary_retain(CUcontext *pctx, CUdevice dev)
{
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = sim_check_device(dev);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&sim_primary_lock);
    struct CUctx_st *c = &sim_primary[dev];
    if (sim_primary_refs[dev] == 0) {
        /* Activation: a context creation like any other (a failed one leaves it inactive, and
         * the next retain tries again). */
        r = sim_ctx_creation(dev);
        if (r != CUDA_SUCCESS) {
            pthread_mutex_unlock(&sim_primary_lock);
            return r;
        }
        sim_ctx_activate(c, dev, 1, c->flags);
        sim_debug("activated the primary context of simulated GPU %d", dev);
    }
    __atomic_store_n(&sim_primary_refs[dev], sim_primary_refs[dev] + 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&sim_primary_lock);
    *pctx = c;
    return CUDA_SUCCESS;
}

CUresult sim_primary_release(CUdevice dev)
{
    CUresult r = sim_check_device(dev);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&sim_primary_lock);
    unsigned refs = sim_primary_refs[dev];
    if (refs > 1)
        __atomic_store_n(&sim_primary_refs[dev], refs - 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&sim_primary_lock);
    if (refs == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (refs > 1)
        return CUDA_SUCCESS;
    /* The last reference: drain its work without holding the lock (cuDevicePrimaryCtxGetState
     * and other devices' retains must not wait for it), then deactivate, unless someone
     * retained it meanwhile. */
    sim_ctx_synchronize(&sim_primary[dev]);
    pthread_mutex_lock(&sim_primary_lock);
    refs = sim_primary_refs[dev];
    if (refs > 0)
        __atomic_store_n(&sim_primary_refs[dev], refs - 1, __ATOMIC_RELEASE);
    if (refs == 1) {
        sim_ctx_retire(&sim_primary[dev]);
        sim_debug("deactivated the primary context of simulated GPU %d", dev);
    }
    pthread_mutex_unlock(&sim_primary_lock);
    return refs ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult sim_primary_state(CUdevice dev, unsigned *flags, int *active)
{
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = sim_check_device(dev);
    if (r != CUDA_SUCCESS)
        return r;
    /* Without sim_primary_lock: never waits behind an activation or a release. */
    *flags = __atomic_load_n(&sim_primary[dev].flags, __ATOMIC_ACQUIRE);
    *active = __atomic_load_n(&sim_primary_refs[dev], __ATOMIC_ACQUIRE) > 0;
    return CUDA_SUCCESS;
}

/* ---- Default streams. ---- */

#define SIM_PTDS_CACHE 8

/* One thread's per-thread default streams, one per context it used; released at thread
 * exit (their queued work still runs). */
struct sim_ptds_set {
    unsigned n;
    struct {
        struct CUctx_st *ctx;
        uint64_t ctx_id;
        uint32_t slot, gen;
    } e[SIM_PTDS_CACHE];
};

static __thread struct sim_ptds_set *tls_ptds;
static pthread_key_t sim_ptds_key;
static pthread_once_t sim_ptds_key_once = PTHREAD_ONCE_INIT;

static void sim_ptds_thread_exit(void *p)
{
    struct sim_ptds_set *set = p;
    tls_ptds = NULL; /* a later destructor's CUDA call starts afresh */
    if (set->n && sim_model_lock(NULL) == CUDA_SUCCESS) {
        for (unsigned i = 0; i < set->n; i++)
            sim_stream_release(set->e[i].slot, set->e[i].gen);
        sim_model_unlock();
    }
    free(set);
}

static void sim_ptds_key_init(void)
{
    pthread_key_create(&sim_ptds_key, sim_ptds_thread_exit);
}

static uint32_t sim_new_stream(struct CUctx_st *c, uint32_t *gen)
{
    uint32_t slot = sim_stream_alloc((uint32_t)c->device, c->id);
    if (slot == SIM_NONE) {
        sim_warn("no free stream slot on the simulated node (%u in use)", SIM_MAX_STREAMS);
        return SIM_NONE;
    }
    *gen = sim_shm->streams[slot].gen;
    return slot;
}

/* With the model lock held. */
static CUresult sim_per_thread_stream(struct CUctx_st *c, struct sim_target *out)
{
    struct sim_ptds_set *set = tls_ptds;
    if (!set) {
        pthread_once(&sim_ptds_key_once, sim_ptds_key_init);
        set = calloc(1, sizeof *set);
        if (!set)
            return CUDA_ERROR_OUT_OF_MEMORY;
        tls_ptds = set;
        pthread_setspecific(sim_ptds_key, set);
    }
    unsigned i;
    for (i = 0; i < set->n; i++) {
        if (set->e[i].ctx == c && set->e[i].ctx_id == c->id &&
            sim_stream_valid(set->e[i].slot, set->e[i].gen))
            break;
    }
    if (i == set->n) {
        /* Reuse the entry of a context that is gone, else let go of the first one's stream
         * (its queued work still runs; a thread with more live contexts than this cache
         * holds gets a fresh per-thread stream when it comes back to one). */
        for (i = 0; i < set->n; i++)
            if (set->e[i].ctx_id != set->e[i].ctx->id || !set->e[i].ctx->alive ||
                !sim_stream_valid(set->e[i].slot, set->e[i].gen))
                break;
        if (i == set->n && set->n == SIM_PTDS_CACHE) {
            sim_stream_release(set->e[0].slot, set->e[0].gen);
            i = 0;
        } else if (i < set->n) {
            sim_stream_release(set->e[i].slot, set->e[i].gen);
        }
        uint32_t gen, slot = sim_new_stream(c, &gen);
        if (slot == SIM_NONE)
            return CUDA_ERROR_OUT_OF_MEMORY;
        set->e[i].ctx = c;
        set->e[i].ctx_id = c->id;
        set->e[i].slot = slot;
        set->e[i].gen = gen;
        if (i == set->n)
            set->n++;
    }
    out->slot = set->e[i].slot;
    out->gen = set->e[i].gen;
    return CUDA_SUCCESS;
}

/* With the model lock held. */
static CUresult sim_legacy_stream(struct CUctx_st *c, struct sim_target *out)
{
    if (!sim_stream_valid(c->legacy_slot, c->legacy_gen)) {
        uint32_t gen, slot = sim_new_stream(c, &gen);
        if (slot == SIM_NONE)
            return CUDA_ERROR_OUT_OF_MEMORY;
        c->legacy_slot = slot;
        c->legacy_gen = gen;
    }
    out->slot = c->legacy_slot;
    out->gen = c->legacy_gen;
    return CUDA_SUCCESS;
}

CUresult sim_resolve_stream(CUstream s, enum sim_null_stream null_is, struct sim_target *out)
{
    struct CUctx_st *c;
    CUresult r;
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) {
        r = sim_ctx_current(&c);
        if (r != CUDA_SUCCESS)
            return r;
        int per_thread = s == CU_STREAM_PER_THREAD || (s == NULL && null_is == SIM_NULL_PER_THREAD);
        r = per_thread ? sim_per_thread_stream(c, out) : sim_legacy_stream(c, out);
    } else {
        const struct sim_handle *h = &s->h;
        if (h->magic != SIM_MAGIC_STREAM)
            return CUDA_ERROR_INVALID_HANDLE;
        c = h->ctx;
        r = sim_ctx_check(c);
        if (r == CUDA_SUCCESS && !sim_stream_valid(h->slot, h->gen))
            r = CUDA_ERROR_INVALID_HANDLE;
        out->slot = h->slot;
        out->gen = h->gen;
    }
    if (r != CUDA_SUCCESS)
        return r;
    out->ctx = c;
    out->gpu = (uint32_t)c->device;
    return CUDA_SUCCESS;
}

/* ---- fork. ---- */

void sim_ctx_after_fork_child(void)
{
    /* None of the parent's contexts (or the streams in them) belong to the child. */
    for (struct CUctx_st *c = sim_all_ctx; c; c = c->next_all)
        c->alive = 0;
    for (unsigned d = 0; d < SIM_MAX_GPUS; d++) {
        sim_primary[d].alive = 0;
        sim_primary_refs[d] = 0;
    }
    pthread_mutex_init(&sim_primary_lock, NULL);
    pthread_mutex_init(&sim_ctx_mem_lock, NULL);
    tls_ctx.n = 0;
    if (tls_ptds) {
        free(tls_ptds); /* the child's copy: the streams in it are the parent's */
        tls_ptds = NULL;
        pthread_setspecific(sim_ptds_key, NULL);
    }
}
