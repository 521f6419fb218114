/*
 * shim.h: the preload library's internal header (one for all its files).
 *
 * The hot path (krex_enter/krex_leave) is inline here: one seq_cst add to our own slot, one
 * load of our gate's word, one relaxed counter, and the matching subtract. No getenv, no
 * syscall, no lock, no scan of other slots (what made HAMi slow: docs/shim.md, "The hot path").
 */
#ifndef KREX_SHIM_H
#define KREX_SHIM_H

#include <stdint.h>

#include "krex_common.h"
#include "krex_cuda.h"

#define KREX_EXPORT __attribute__((visibility("default")))
#define KREX_HIDDEN __attribute__((visibility("hidden")))

/* Every include of hooks.def below sees KREX_GATE_MEM and KREX_DRIVER as KREX_GATE and
 * KREX_MEM (hooks.def's defaults): ids, pointer types and kinds are theirs. */
/* Hook ids: every entry of hooks.def, then the two hand-written look-up wrappers. */
enum krex_hook_id {
#define KREX_GATE(name, ...) KREX_H_##name,
#define KREX_TRACK(name, ...) KREX_H_##name,
#define KREX_MEM(name, ...) KREX_H_##name,
#define KREX_REAL(name, ...) KREX_H_##name,
#include "hooks.def"
#undef KREX_GATE
#undef KREX_TRACK
#undef KREX_MEM
#undef KREX_REAL
    KREX_H_cuGetProcAddress,
    KREX_H_cuGetProcAddress_v2,
    KREX_H_COUNT
};

/* Pointer types of every hooked exact name: krex_pfn_<name>. */
#define KREX_PFN_(name, params, args) typedef CUresult(*krex_pfn_##name) params;
#define KREX_GATE(name, ...) KREX_PFN_(name, __VA_ARGS__)
#define KREX_TRACK(name, ...) KREX_PFN_(name, __VA_ARGS__)
#define KREX_MEM(name, ...) KREX_PFN_(name, __VA_ARGS__)
#define KREX_REAL(name, ...) KREX_PFN_(name, __VA_ARGS__)
#include "hooks.def"
#undef KREX_GATE
#undef KREX_TRACK
#undef KREX_MEM
#undef KREX_REAL
typedef CUresult (*krex_pfn_cuGetProcAddress)(const char *, void **, int, cuuint64_t);
typedef CUresult (*krex_pfn_cuGetProcAddress_v2)(const char *, void **, int, cuuint64_t,
                                                 CUdriverProcAddressQueryResult *);

enum krex_hook_kind {
    KREX_KIND_GATE,
    KREX_KIND_TRACK,
    KREX_KIND_MEM,
    KREX_KIND_REAL,
    KREX_KIND_LOOKUP
};

struct krex_hook {
    const char *name;          /* exact ELF name */
    enum krex_hook_kind kind;
    void *wrapper;             /* our exported function of that name (NULL for REAL) */
};

/* hooks.c: the table, and the real driver's addresses of every entry. */
KREX_HIDDEN extern const struct krex_hook krex_hooks[KREX_H_COUNT];
KREX_HIDDEN extern void *krex_real[KREX_H_COUNT];
/* Resolve every entry from the library that holds `addr` (NULL: libcuda.so.1), once. */
KREX_HIDDEN void krex_resolve_from(const void *addr);
KREX_HIDDEN int krex_hook_find(const char *name);
KREX_HIDDEN CUresult krex_missing(enum krex_hook_id id);
KREX_HIDDEN extern __thread int krex_in_resolve;

static inline void *krex_real_get(enum krex_hook_id id)
{
    void *p = __atomic_load_n(&krex_real[id], __ATOMIC_ACQUIRE);
    if (KREX_UNLIKELY(!p)) {
        krex_resolve_from(NULL);
        p = __atomic_load_n(&krex_real[id], __ATOMIC_ACQUIRE);
    }
    return p;
}

/* lookup.c, deepbind.c: the loader's entries (docs/shim.md, "Look-up paths"). The real ones: */
KREX_HIDDEN void *krex_real_next(void **cache, const char *name, const char *const *versions);
KREX_HIDDEN void *krex_real_dlsym_get(void);
KREX_HIDDEN void *krex_real_dlvsym_get(void);
KREX_HIDDEN void *krex_real_dlopen_get(void);
KREX_HIDDEN void *krex_real_dlmopen_get(void);
/* Whether a file name is a GPU driver's (libcuda.so*, libcudart.so*, libamdhip64.so*). */
KREX_HIDDEN int krex_is_gpu_driver(const char *file);
/* Our entry of a loader function named `name` when p is the real one, else p. */
KREX_HIDDEN void *krex_loader_entry(const char *name, void *p);
/* Count the process as reaching the GPU where the shim cannot gate it (the slot's `ungated`). */
KREX_HIDDEN void krex_count_ungated(void);
/* Counts it when p, found for `name`, lies in a GPU driver other than the one the shim gates. */
KREX_HIDDEN void krex_ungated_if_driver(const void *p, const char *name);

/* gate.c: this process's registration and the gate. */
KREX_HIDDEN extern struct krex_slot *krex_self;   /* NULL until registered */
KREX_HIDDEN extern struct krex_gate *krex_my_gate;  /* the first of our GPUs' gates */
/* A command of several GPUs (KREX_GPU=0,1) is shut out while any of its gates is closed to it:
 * the others, krex_my_gates[1..krex_n_gates-1], are checked after the first. */
KREX_HIDDEN extern struct krex_gate *krex_my_gates[KREX_MAX_GPUS];
KREX_HIDDEN extern uint32_t krex_n_gates;
KREX_HIDDEN extern uint32_t krex_my_tenant;
KREX_HIDDEN struct krex_slot *krex_register(void); /* NULL: pass everything through */
KREX_HIDDEN void krex_gate_block(struct krex_slot *s);
/* How often a thread blocked at a closed gate looks whether the controller that closed it is
 * still there (its liveness lock, shim/krex_layout.h): gate.c. */
#define KREX_CONTROLLER_POLL_NS 200000000ULL
KREX_HIDDEN void krex_note_unmatched(void);

/* Whether the gate word shuts out slot s. The tenant is read from the slot, not cached: the
 * controller re-assigns a pool worker's slot to the tenant whose command it runs. The slot's
 * first cache line is ours and already touched by the in-flight count, so this costs nothing. */
static inline int krex_closed_to(const struct krex_slot *s, uint64_t word)
{
    uint32_t owner = KREX_GATE_OWNER(word);
    return owner != 0 && owner != __atomic_load_n(&s->tenant, __ATOMIC_RELAXED);
}

/* Whether any of our gates shuts out slot s (one load for a command of one GPU). */
static inline int krex_shut_out(const struct krex_slot *s)
{
    if (krex_closed_to(s, KREX_LOAD(&krex_my_gate->word)))
        return 1;
    for (uint32_t i = 1; KREX_UNLIKELY(i < krex_n_gates); i++)
        if (krex_closed_to(s, KREX_LOAD(&krex_my_gates[i]->word)))
            return 1;
    return 0;
}

/* Our slot, registering at the first call; NULL in pass-through. */
static inline struct krex_slot *krex_slot_self(void)
{
    struct krex_slot *s = __atomic_load_n(&krex_self, __ATOMIC_ACQUIRE);
    return KREX_LIKELY(s) ? s : krex_register();
}

/* Announce, then check (docs/shim.md, region protocol step 2: why in this order). Returns our
 * slot, or NULL in pass-through. Not counted in `intercepted` (a context's creation, which
 * submits no work): krex_enter counts. */
static inline struct krex_slot *krex_enter_uncounted(void)
{
    struct krex_slot *s = krex_slot_self();
    if (KREX_UNLIKELY(!s))
        return NULL;
    KREX_ADD(&s->in_flight, 1);
    if (KREX_UNLIKELY(krex_shut_out(s)))
        krex_gate_block(s);
    return s;
}

static inline struct krex_slot *krex_enter(void)
{
    struct krex_slot *s = krex_enter_uncounted();
    if (KREX_LIKELY(s))
        KREX_COUNT(&s->intercepted);
    return s;
}

static inline void krex_leave(struct krex_slot *s)
{
    if (!s)
        return;
    /* Behind a closed gate the controller may be waiting for this count to reach 0. */
    if (KREX_SUB(&s->in_flight, 1) == 0 && krex_shut_out(s))
        krex_futex_wake(&s->in_flight, INT32_MAX);
}

/*
 * The body of every gated wrapper, CUDA's (preload/hooks.c) and HIP's (hip/hip_hooks.c), each
 * generated from its hook table: look the real function up, announce and check the gate, call,
 * withdraw. `real` is the looked-up address (of type void *), `missing` what to return without
 * one (evaluated only then), `args` the parenthesised argument list.
 */
#define KREX_GATED_BODY(ret_t, pfn_t, real, missing, args)                                       \
    {                                                                                            \
        pfn_t krex_real_ = (pfn_t)(real);                                                        \
        if (KREX_UNLIKELY(!krex_real_))                                                          \
            return missing;                                                                      \
        struct krex_slot *krex_s_ = krex_enter();                                                \
        ret_t krex_r_ = krex_real_ args;                                                         \
        krex_leave(krex_s_);                                                                     \
        return krex_r_;                                                                          \
    }

/* pace.c: pacing (docs/shim.md, "Pacing"): KREX_PACE_US in ns, read at the first launch
 * (KREX_PACE_UNREAD until then); 0: off. A launch's stream expression in hooks.def:
 * KREX_PACE_NONE where there is none to pace. In a forked child the parent's markers are
 * forgotten (drain.c's krex_drain_forget calls krex_pace_forget). */
KREX_HIDDEN extern uint64_t krex_pace_ns;
#define KREX_PACE_UNREAD UINT64_MAX
#define KREX_PACE_NONE ((CUstream)(intptr_t)-1)
#define KREX_PACE_PTSZ(s) ((s) ? (s) : KREX_PACE_NONE)
#define KREX_PACE_EX(config, ptsz)                                                               \
    (!(config) ? KREX_PACE_NONE : (ptsz) && !(config)->hStream ? KREX_PACE_NONE : (config)->hStream)
KREX_HIDDEN void krex_pace_forget(void);
KREX_HIDDEN void krex_pace_wait_slow(CUstream s);
KREX_HIDDEN void krex_pace_mark_slow(CUstream s);

/* Before a launch on s: wait while s has more than the pace queued (outside our regions). */
static inline void krex_pace_wait(CUstream s)
{
    if (s != KREX_PACE_NONE && KREX_UNLIKELY(__atomic_load_n(&krex_pace_ns, __ATOMIC_RELAXED)))
        krex_pace_wait_slow(s);
}

/* After a launch on s answered r, still announced by slot sl: its marker. */
static inline void krex_pace_mark(struct krex_slot *sl, CUstream s, CUresult r)
{
    if (s != KREX_PACE_NONE && KREX_UNLIKELY(__atomic_load_n(&krex_pace_ns, __ATOMIC_RELAXED)) &&
        sl && r == CUDA_SUCCESS)
        krex_pace_mark_slow(s);
}

/* drain.c: contexts this process used. */
KREX_HIDDEN void krex_ctx_track(CUcontext ctx, CUdevice dev);
KREX_HIDDEN void krex_ctx_untrack(CUcontext ctx);
/* drain_thread.c: the drain thread; the vendor's part (drain.c, hip/hip_drain.c) syncs what
 * the process used and forgets it in a forked child. */
KREX_HIDDEN int krex_drain_start(struct krex_slot *s);
KREX_HIDDEN void krex_drain_after_fork(void);
KREX_HIDDEN void krex_drain_sync(void);
KREX_HIDDEN void krex_drain_forget(void);

/* mem.c: device memory (docs/shim.md, "Device memory"). In a forked child the parent's
 * allocations are forgotten (drain.c's krex_drain_forget calls it). */
KREX_HIDDEN void krex_mem_forget(void);

/* mem.c: waiting for device memory, for every call the driver can answer with out-of-memory
 * (docs/shim.md, "Waiting instead of failing"). Through KREX_MEM_RETRY below. */
struct krex_mem_wait {
    struct krex_slot *s;
    const char *what, *how;
    uint64_t bytes, start, deadline, last_grant, last_retry;
    uint32_t grant, deny, seen;
    unsigned kind, grants, retries, failed;
    int me, active;
};
KREX_HIDDEN int krex_mem_wait_begin(struct krex_mem_wait *w, struct krex_slot *s, uint64_t bytes,
                                    int dev, unsigned kind, const char *what);
KREX_HIDDEN int krex_mem_wait_next(struct krex_mem_wait *w);
KREX_HIDDEN CUresult krex_mem_wait_end(struct krex_mem_wait *w, CUresult r);

/*
 * Run `attempt` (a statement that sets the CUresult r); when it answers
 * CUDA_ERROR_OUT_OF_MEMORY and `slot` (evaluated only then) is not NULL, wait for the
 * controller's grants and run it again, until it answers anything else or the wait is over.
 * bytes: what the call asks for (0: the driver's own memory, size unknown); dev: its device,
 * -1 for the current context's; kind: KREX_MEM_*. A gated attempt announces itself anew each
 * time: nothing is in flight while it waits.
 */
#define KREX_MEM_RETRY(r, slot, bytes, dev, kind, what, attempt)                                 \
    do {                                                                                         \
        attempt;                                                                                 \
        if (KREX_UNLIKELY((r) == CUDA_ERROR_OUT_OF_MEMORY)) {                                    \
            struct krex_slot *krex_ws_ = (slot);                                                 \
            if (krex_ws_) {                                                                      \
                struct krex_mem_wait krex_w_;                                                    \
                if (krex_mem_wait_begin(&krex_w_, krex_ws_, (bytes), (dev), (kind), (what)))     \
                    while (krex_mem_wait_next(&krex_w_)) {                                       \
                        attempt;                                                                 \
                        if ((r) != CUDA_ERROR_OUT_OF_MEMORY)                                     \
                            break;                                                               \
                    }                                                                            \
                (r) = krex_mem_wait_end(&krex_w_, (r));                                          \
            }                                                                                    \
        }                                                                                        \
    } while (0)

/* log.c */
KREX_HIDDEN void krex_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
KREX_HIDDEN void krex_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif /* KREX_SHIM_H */
