/*
 * mem.c: device memory (docs/shim.md, "Device memory"): the KREX_MEM entries of hooks.def.
 *
 * Allocations and frees are never gated (a sibling blocked at a closed gate must still be able
 * to free). Each successful allocation is remembered in a per-process map, key (kind, pointer
 * or handle) -> (bytes, device), and added to the slot's mem_bytes (mem_peak follows); a free
 * takes its entry out and subtracts it. Allocations are rare next to launches: the map is a
 * mutex-protected hash table, never touched on the launch path.
 *
 * An allocation that fails with CUDA_ERROR_OUT_OF_MEMORY in a process with a slot waits for the
 * controller instead of failing, unless it could not succeed even alone (its bytes plus what
 * this process holds exceed the device's total memory): see krex_mem_wait_begin/next/end below
 * and the contract in shim/krex_layout.h (mem_*) and shim/krex_control.h (krex_mem_grant).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#include "mem_views.h"

/* ---- The map. ---- */
enum mem_kind { MEM_PTR = 1, MEM_HANDLE = 2, MEM_ARRAY = 3 };

struct mem_ent {
    struct mem_ent *next;
    uint64_t key;
    uint64_t bytes;
    int kind;
    int dev;
};

#define MEM_BUCKETS 4096U
static struct mem_ent *buckets[MEM_BUCKETS];
static pthread_mutex_t map_lock = PTHREAD_MUTEX_INITIALIZER;

static struct mem_ent **bucket(int kind, uint64_t key)
{
    uint64_t h = (key ^ ((uint64_t)kind << 61)) * 0x9E3779B97F4A7C15ULL;
    return &buckets[h >> 52];
}

/* ---- KREX_MEM_WAIT_S, read once (at the first memory call with a slot). ---- */
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static uint64_t wait_limit_ns = 600ULL * 1000000000ULL;

static void mem_init(void)
{
    const char *v = getenv("KREX_MEM_WAIT_S");
    if (!v || !*v)
        return;
    char *end = NULL;
    errno = 0;
    double s = strtod(v, &end);
    if (errno || *end || !(s >= 0) || s > 1e9) {
        krex_warn("KREX_MEM_WAIT_S must be a number of seconds >= 0 (got \"%s\"): using 600", v);
        return;
    }
    wait_limit_ns = (uint64_t)(s * 1e9);
}

/* The slot memory is counted in (registering at the first call, like a gated call), or NULL:
 * not under KREX, everything passes through. */
static struct krex_slot *mem_slot(void)
{
    struct krex_slot *s = krex_slot_self();
    if (s)
        pthread_once(&init_once, mem_init);
    return s;
}

static void count_add(struct krex_slot *s, uint64_t bytes)
{
    uint64_t now = __atomic_add_fetch(&s->mem_bytes, bytes, __ATOMIC_RELAXED);
    uint64_t peak = __atomic_load_n(&s->mem_peak, __ATOMIC_RELAXED);
    while (now > peak && !__atomic_compare_exchange_n(&s->mem_peak, &peak, now, 1,
                                                      __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

static void count_sub(struct krex_slot *s, uint64_t bytes)
{
    /* Never below 0: what we subtract was added (the map holds only what we counted). */
    uint64_t cur = __atomic_load_n(&s->mem_bytes, __ATOMIC_RELAXED);
    uint64_t next;
    do
        next = cur > bytes ? cur - bytes : 0;
    while (!__atomic_compare_exchange_n(&s->mem_bytes, &cur, next, 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED));
}

static int current_device(void)
{
    krex_pfn_cuCtxGetDevice get = (krex_pfn_cuCtxGetDevice)krex_real_get(KREX_H_cuCtxGetDevice);
    CUdevice d = -1;
    if (!get || get(&d) != CUDA_SUCCESS)
        return -1;
    return d;
}

/* A successful allocation: remember it and count it. An entry already under the key was freed
 * where we could not see it (a context destroyed with it): it is replaced, its bytes uncounted. */
static void note_alloc(struct krex_slot *s, int kind, uint64_t key, uint64_t bytes, int dev)
{
    if (!s)
        return;
    struct mem_ent *e = malloc(sizeof *e);
    uint64_t stale = 0;
    pthread_mutex_lock(&map_lock);
    struct mem_ent **link = bucket(kind, key), *old;
    while ((old = *link) && !(old->kind == kind && old->key == key))
        link = &old->next;
    if (old) {
        stale = old->bytes;
        *link = old->next;
    }
    if (e) {
        e->key = key;
        e->kind = kind;
        e->bytes = bytes;
        e->dev = dev;
        struct mem_ent **b = bucket(kind, key);
        e->next = *b;
        *b = e;
    }
    pthread_mutex_unlock(&map_lock);
    free(old);
    if (stale)
        count_sub(s, stale);
    if (e)
        count_add(s, bytes);
}

/* Take the entry out before the real free (so that a thread allocating the same address after
 * the free cannot lose its entry to us); put it back if the free fails. */
static struct mem_ent *take(int kind, uint64_t key)
{
    pthread_mutex_lock(&map_lock);
    struct mem_ent **link = bucket(kind, key), *e;
    while ((e = *link) && !(e->kind == kind && e->key == key))
        link = &e->next;
    if (e)
        *link = e->next;
    pthread_mutex_unlock(&map_lock);
    return e;
}

static void put_back(struct mem_ent *e)
{
    pthread_mutex_lock(&map_lock);
    struct mem_ent **b = bucket(e->kind, e->key);
    e->next = *b;
    *b = e;
    pthread_mutex_unlock(&map_lock);
}

/* The end of a free: r is the real free's result. */
static CUresult freed(struct mem_ent *e, CUresult r)
{
    if (!e)
        return r;
    struct krex_slot *s = __atomic_load_n(&krex_self, __ATOMIC_ACQUIRE);
    if (r == CUDA_SUCCESS) {
        if (s)
            count_sub(s, e->bytes);
        free(e);
    } else {
        put_back(e);
    }
    return r;
}

#define MAX_WAITERS 64
struct waiter {
    uint64_t bytes;
    uint64_t since;
    int used;
};
static struct waiter waiters[MAX_WAITERS];
static pthread_mutex_t wait_lock = PTHREAD_MUTEX_INITIALIZER;

void krex_mem_forget(void)
{
    /* The child of a fork: the allocations belong to the parent's contexts, which the child
     * cannot use; the child's slot starts at 0. The entries are dropped without free (the
     * child has one thread, but malloc's state is not ours to trust here): a bounded leak. */
    pthread_mutex_init(&map_lock, NULL);
    memset(buckets, 0, sizeof buckets);
    /* The parent's waiting threads are not in the child. */
    pthread_mutex_init(&wait_lock, NULL);
    memset(waiters, 0, sizeof waiters);
}

/* ---- Waiting for memory. ---- */

/* This process's waiters (the table above): mem_want is the largest of their allocations,
 * mem_since_ns when the earliest of them began waiting. */

/* Under wait_lock: publish the waiters' summary (since first, then want). */
static void publish(struct krex_slot *s)
{
    uint64_t want = 0, since = UINT64_MAX;
    for (int i = 0; i < MAX_WAITERS; i++) {
        if (!waiters[i].used)
            continue;
        if (waiters[i].bytes > want)
            want = waiters[i].bytes;
        if (waiters[i].since < since)
            since = waiters[i].since;
    }
    if (want) {
        KREX_STORE(&s->mem_since_ns, since);
        KREX_STORE(&s->mem_want, want);
    } else {
        KREX_STORE(&s->mem_want, 0);
    }
}

static int join(struct krex_slot *s, uint64_t bytes, uint64_t since, unsigned kind)
{
    pthread_mutex_lock(&wait_lock);
    int me = -1;
    for (int i = 0; i < MAX_WAITERS && me < 0; i++)
        if (!waiters[i].used)
            me = i;
    /* The kind first: the controller reads it once it sees mem_want. */
    KREX_STORE(&s->mem_kind, kind);
    if (me >= 0) {
        waiters[me].bytes = bytes ? bytes : 1; /* want 0 would read as "not waiting" */
        waiters[me].since = since;
        waiters[me].used = 1;
        publish(s);
    }
    pthread_mutex_unlock(&wait_lock);
    return me;
}

static void leave(struct krex_slot *s, int me, uint64_t waited, unsigned kind)
{
    pthread_mutex_lock(&wait_lock);
    __atomic_add_fetch(&s->mem_wait_ns, waited, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&s->mem_waits, 1U, __ATOMIC_SEQ_CST);
    if (kind < KREX_MEM_KIND_SLOTS)
        __atomic_add_fetch(&s->mem_kind_waits[kind], 1U, __ATOMIC_SEQ_CST);
    if (me >= 0)
        waiters[me].used = 0;
    publish(s);
    pthread_mutex_unlock(&wait_lock);
}

#define NS_S 1000000000ULL
#define SLICE_NS (100 * 1000000ULL)
#define SILENT_NS (2 * NS_S) /* no grant for this long: the controller may be gone */
#define RETRY_NS (1 * NS_S)  /* then retry on our own this often */

static const char *const kind_names[KREX_MEM_KINDS] = {"allocation", "context creation",
                                                       "module load", "launch", "graph"};

static const char *kind_name(unsigned kind)
{
    return kind < KREX_MEM_KINDS ? kind_names[kind] : "call";
}

/*
 * The call just failed with CUDA_ERROR_OUT_OF_MEMORY (docs/shim.md, "Waiting instead of
 * failing"): 0 when the error goes back at once (it could not succeed even alone: counted in
 * mem_oom_alone), else the wait has begun (w filled in, the slot says what it waits for).
 * bytes: what it asked for (0: the driver's own memory, of a size we cannot know); dev: the
 * device, -1 for the current context's.
 */
int krex_mem_wait_begin(struct krex_mem_wait *w, struct krex_slot *s, uint64_t bytes, int dev,
                        unsigned kind, const char *what)
{
    memset(w, 0, sizeof *w);
    w->s = s;
    w->bytes = bytes;
    w->kind = kind;
    w->what = what;
    pthread_once(&init_once, mem_init);
    if (dev < 0)
        dev = current_device();
    size_t total = 0;
    krex_pfn_cuDeviceTotalMem_v2 tot =
        (krex_pfn_cuDeviceTotalMem_v2)krex_real_get(KREX_H_cuDeviceTotalMem_v2);
    uint64_t held = __atomic_load_n(&s->mem_bytes, __ATOMIC_RELAXED);
    /* The driver's own memory (bytes 0) may be asked for with no device current yet (a
     * context being created): only the controller can judge that one. */
    int known = dev >= 0 && tot && tot(&total, dev) == CUDA_SUCCESS && total > 0;
    if (bytes && (!known || bytes > (uint64_t)total - (held < total ? held : total))) {
        __atomic_add_fetch(&s->mem_oom_alone, 1U, __ATOMIC_SEQ_CST);
        krex_debug("memory: %s of %llu bytes is out of memory even alone (this process holds "
                   "%llu of %llu on device %d): returning the error",
                   what, (unsigned long long)bytes, (unsigned long long)held,
                   (unsigned long long)total, dev);
        return 0;
    }
    /* Snapshot the controller's words before anyone can see us wait: a grant that follows our
     * mem_want must be seen as a change. */
    w->grant = KREX_LOAD(&s->mem_grant);
    w->deny = KREX_LOAD(&s->mem_deny);
    w->seen = KREX_LOAD(&s->mem_seen);
    w->start = w->last_grant = w->last_retry = krex_now_ns();
    w->deadline = w->start + wait_limit_ns;
    w->me = join(s, bytes, w->start, kind);
    w->active = 1;
    krex_debug("memory: %s (%s) of %llu bytes waits (this process holds %llu of %llu on "
               "device %d; at most %.1f s)",
               what, kind_name(kind), (unsigned long long)bytes, (unsigned long long)held,
               (unsigned long long)total, dev, (double)wait_limit_ns / 1e9);
    return 1;
}

/* Sleep until the call may be tried again (1), or the wait is over without success (0): the
 * controller denied it (it could not succeed alone), or KREX_MEM_WAIT_S ran out. Holds no
 * gate announcement: a waiter never keeps a region's quiesce waiting. */
int krex_mem_wait_next(struct krex_mem_wait *w)
{
    struct krex_slot *s = w->s;
    if (w->retries != w->failed) {
        /* Called again: the retry made failed (out of memory again). Said before anything
         * else, so that the controller's "a retry failed" is one that was made. */
        w->failed = w->retries;
        __atomic_add_fetch(&s->mem_failed, 1U, __ATOMIC_SEQ_CST);
    }
    for (;;) {
        uint32_t g = KREX_LOAD(&s->mem_grant);
        if (KREX_LOAD(&s->mem_deny) != w->deny) {
            w->how = "denied by the controller: it could not succeed alone";
            __atomic_add_fetch(&s->mem_oom_alone, 1U, __ATOMIC_SEQ_CST);
            return 0;
        }
        uint64_t now = krex_now_ns();
        int retry = 0;
        uint32_t seen = KREX_LOAD(&s->mem_seen);
        if (g != w->grant) {
            w->grant = g;
            w->last_grant = now;
            w->grants++;
            retry = 1;
        } else if (seen != w->seen) {
            w->seen = seen; /* the controller is there and it is not our turn: wait on */
            w->last_grant = now;
        } else if (now - w->last_grant >= SILENT_NS && now - w->last_retry >= RETRY_NS) {
            retry = 1; /* nothing from the controller: see for ourselves */
        }
        if (retry && now < w->deadline) {
            w->last_retry = now;
            w->retries++;
            return 1;
        }
        if (now >= w->deadline) {
            w->how = "timed out (KREX_MEM_WAIT_S)";
            __atomic_add_fetch(&s->mem_oom_shared, 1U, __ATOMIC_SEQ_CST);
            return 0;
        }
        uint64_t left = w->deadline - now;
        krex_futex_wait(&s->mem_grant, g, left < SLICE_NS ? left : SLICE_NS);
    }
}

/* The wait (if one began) is over with result r: account for it; returns r. */
CUresult krex_mem_wait_end(struct krex_mem_wait *w, CUresult r)
{
    if (!w->active)
        return r;
    uint64_t waited = krex_now_ns() - w->start;
    leave(w->s, w->me, waited, w->kind);
    if (!w->how)
        w->how = r == CUDA_SUCCESS ? "succeeded" : "failed otherwise";
    krex_debug("memory: %s (%s) of %llu bytes %s after %.3f s (%u grants, %u attempts; "
               "result %d)",
               w->what, kind_name(w->kind), (unsigned long long)w->bytes, w->how,
               (double)waited / 1e9, w->grants, w->retries, (int)r);
    return r;
}

/* Allocations register at their first call (their bytes are counted from the first). */
#define ALLOC_RETRY(r, s, bytes, dev, what, attempt)                                             \
    do {                                                                                         \
        s = mem_slot();                                                                          \
        KREX_MEM_RETRY(r, s, bytes, dev, KREX_MEM_ALLOC, what, attempt);                         \
    } while (0)

#define REAL(name) ((krex_pfn_##name)krex_real_get(KREX_H_##name))
#define NEED(name)                                                                               \
    krex_pfn_##name real = REAL(name);                                                           \
    if (KREX_UNLIKELY(!real))                                                                    \
    return krex_missing(KREX_H_##name)

/* ---- Allocations. ---- */

KREX_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
    NEED(cuMemAlloc_v2);
    struct krex_slot *s;
    CUresult r;
    ALLOC_RETRY(r, s, bytes, -1, "cuMemAlloc", r = real(dptr, bytes));
    if (r == CUDA_SUCCESS && s && dptr)
        note_alloc(s, MEM_PTR, *dptr, bytes, current_device());
    return r;
}

KREX_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
                                        size_t height, unsigned int elem)
{
    NEED(cuMemAllocPitch_v2);
    struct krex_slot *s;
    CUresult r;
    /* The pitch is known only on success: the wait judges width * height. */
    ALLOC_RETRY(r, s, (uint64_t)width * height, -1, "cuMemAllocPitch",
                r = real(dptr, pitch, width, height, elem));
    if (r == CUDA_SUCCESS && s && dptr && pitch)
        note_alloc(s, MEM_PTR, *dptr, (uint64_t)*pitch * height, current_device());
    return r;
}

KREX_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags)
{
    NEED(cuMemAllocManaged);
    struct krex_slot *s;
    CUresult r;
    ALLOC_RETRY(r, s, bytes, -1, "cuMemAllocManaged", r = real(dptr, bytes, flags));
    if (r == CUDA_SUCCESS && s && dptr)
        note_alloc(s, MEM_PTR, *dptr, bytes, current_device());
    return r;
}

#define ALLOC_ASYNC(name)                                                                        \
    KREX_EXPORT CUresult name(CUdeviceptr *dptr, size_t bytes, CUstream stream)                  \
    {                                                                                            \
        NEED(name);                                                                              \
        struct krex_slot *s;                                                                     \
        CUresult r;                                                                              \
        ALLOC_RETRY(r, s, bytes, -1, #name, r = real(dptr, bytes, stream));                      \
        if (r == CUDA_SUCCESS && s && dptr)                                                      \
            note_alloc(s, MEM_PTR, *dptr, bytes, current_device());                              \
        return r;                                                                                \
    }
ALLOC_ASYNC(cuMemAllocAsync)
ALLOC_ASYNC(cuMemAllocAsync_ptsz)

#define ALLOC_POOL(name)                                                                         \
    KREX_EXPORT CUresult name(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,                \
                              CUstream stream)                                                   \
    {                                                                                            \
        NEED(name);                                                                              \
        struct krex_slot *s;                                                                     \
        CUresult r;                                                                              \
        ALLOC_RETRY(r, s, bytes, -1, #name, r = real(dptr, bytes, pool, stream));                \
        if (r == CUDA_SUCCESS && s && dptr)                                                      \
            note_alloc(s, MEM_PTR, *dptr, bytes, current_device());                              \
        return r;                                                                                \
    }
ALLOC_POOL(cuMemAllocFromPoolAsync)
ALLOC_POOL(cuMemAllocFromPoolAsync_ptsz)

KREX_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                 const CUmemAllocationProp *prop, unsigned long long flags)
{
    NEED(cuMemCreate);
    /* The device is the one the properties name (a host location: the current context's). */
    const struct krex_mem_prop_head *h = (const struct krex_mem_prop_head *)(const void *)prop;
    int dev = h && h->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? h->location.id : -1;
    struct krex_slot *s;
    CUresult r;
    ALLOC_RETRY(r, s, size, dev, "cuMemCreate", r = real(handle, size, prop, flags));
    if (r == CUDA_SUCCESS && s && handle)
        note_alloc(s, MEM_HANDLE, *handle, size, dev >= 0 ? dev : current_device());
    return r;
}

/* Array bytes: an estimate from the descriptor (elements * channels * element size); the
 * driver's layout (alignment, tiling) may take more. */
static uint64_t format_bytes(unsigned int format)
{
    switch (format) {
    case 0x01: /* UNSIGNED_INT8 */
    case 0x08: /* SIGNED_INT8 */
        return 1;
    case 0x02: /* UNSIGNED_INT16 */
    case 0x09: /* SIGNED_INT16 */
    case 0x10: /* HALF */
        return 2;
    case 0x03: /* UNSIGNED_INT32 */
    case 0x0a: /* SIGNED_INT32 */
    case 0x20: /* FLOAT */
        return 4;
    default:
        return 4; /* the newer packed, normalised and block-compressed formats: 4 at most per
                     channel for all but a few; an estimate */
    }
}

static uint64_t array_bytes(size_t w, size_t h, size_t d, unsigned int format, unsigned int ch)
{
    return (uint64_t)w * (h ? h : 1) * (d ? d : 1) * (ch ? ch : 1) * format_bytes(format);
}

KREX_EXPORT CUresult cuArrayCreate_v2(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    NEED(cuArrayCreate_v2);
    const struct krex_array_desc *d = (const struct krex_array_desc *)(const void *)desc;
    uint64_t bytes = d ? array_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels) : 0;
    struct krex_slot *s;
    CUresult r;
    ALLOC_RETRY(r, s, bytes, -1, "cuArrayCreate", r = real(arr, desc));
    if (r == CUDA_SUCCESS && s && arr)
        note_alloc(s, MEM_ARRAY, (uint64_t)(uintptr_t)*arr, bytes, current_device());
    return r;
}

KREX_EXPORT CUresult cuArray3DCreate_v2(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    NEED(cuArray3DCreate_v2);
    const struct krex_array3d_desc *d = (const struct krex_array3d_desc *)(const void *)desc;
    uint64_t bytes =
        d ? array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels) : 0;
    struct krex_slot *s;
    CUresult r;
    ALLOC_RETRY(r, s, bytes, -1, "cuArray3DCreate", r = real(arr, desc));
    if (r == CUDA_SUCCESS && s && arr)
        note_alloc(s, MEM_ARRAY, (uint64_t)(uintptr_t)*arr, bytes, current_device());
    return r;
}

/* ---- Frees: never wait, never gated. ---- */

KREX_EXPORT CUresult cuMemFree_v2(CUdeviceptr p)
{
    NEED(cuMemFree_v2);
    struct mem_ent *e = p ? take(MEM_PTR, p) : NULL;
    return freed(e, real(p));
}

#define FREE_ASYNC(name)                                                                         \
    KREX_EXPORT CUresult name(CUdeviceptr p, CUstream stream)                                    \
    {                                                                                            \
        NEED(name);                                                                              \
        struct mem_ent *e = p ? take(MEM_PTR, p) : NULL;                                         \
        return freed(e, real(p, stream));                                                        \
    }
FREE_ASYNC(cuMemFreeAsync)
FREE_ASYNC(cuMemFreeAsync_ptsz)

KREX_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    NEED(cuMemRelease);
    struct mem_ent *e = take(MEM_HANDLE, handle);
    return freed(e, real(handle));
}

KREX_EXPORT CUresult cuArrayDestroy(CUarray arr)
{
    NEED(cuArrayDestroy);
    struct mem_ent *e = arr ? take(MEM_ARRAY, (uint64_t)(uintptr_t)arr) : NULL;
    return freed(e, real(arr));
}
