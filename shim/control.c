/*
 * control.c: the controller's side of the region protocol (docs/shim.md, "The region protocol":
 * steps 1-3 and exit).
 *
 * Ordering argument (step 2): the shim announces (in_flight += 1, seq_cst) and then loads the
 * gate word (seq_cst); we store the gate word (seq_cst) and then load in_flight (seq_cst). In
 * the single total order of seq_cst operations either our load sees the announcement, and we
 * wait for it, or the shim's load comes after our store and sees the gate closed.
 */
#include <errno.h>
#include <stdint.h>

#include "krex_common.h"
#include "krex_control.h"

/* The GPUs a slot's process works on: its mask (a command of several GPUs), else its gpu. */
static uint32_t slot_gpus(const struct krex_slot *s)
{
    uint32_t mask = KREX_LOAD(&s->gpus);
    return mask ? mask : 1U << (KREX_LOAD(&s->gpu) & 31U);
}

static int is_sibling(const struct krex_slot *s, uint32_t gpu, uint32_t owner)
{
    return KREX_LOAD(&s->state) == KREX_SLOT_LIVE && (slot_gpus(s) >> gpu & 1U) &&
           KREX_LOAD(&s->tenant) != owner;
}

/* A live slot whose process is gone: nothing it announced can still reach the driver. Waits
 * skip such slots but leave them to krex_slots_reap, so that the controller can read their
 * counters first. */
static int gone(const struct krex_slot *s)
{
    return KREX_LOAD(&s->state) == KREX_SLOT_LIVE && !krex_pid_alive(s->pid, s->start_time);
}

static void free_taken(struct krex_slot *s)
{
    /* A dead process can hold nothing in flight: clear it so nobody waits on it again. */
    KREX_STORE(&s->in_flight, 0);
    KREX_STORE(&s->state, KREX_SLOT_FREE);
}

/* Free a slot whose process died, unless someone else took it first. */
static int reap_if_dead(struct krex_slot *s)
{
    if (!krex_slot_take_dead(s))
        return 0;
    free_taken(s);
    return 1;
}

static int bad_gpu(const struct krex_segment *seg, uint32_t gpu)
{
    return !seg || gpu >= seg->header.n_gpus;
}

/* One bounded wait on a slot's word while it still reads `seen`: KREX_E_TIMEOUT once the
 * deadline has passed, else KREX_OK after a futex wait of at most 50 ms, and the caller looks
 * again. The shim wakes the word when it changes; the 50 ms bound is what notices a process
 * that died mid-call (it never wakes anyone), through the caller's liveness check. */
static int wait_slice(uint32_t *word, uint32_t seen, uint64_t deadline)
{
    uint64_t now = krex_now_ns();
    if (now >= deadline)
        return KREX_E_TIMEOUT;
    uint64_t slice = deadline - now;
    if (slice > 50000000ULL)
        slice = 50000000ULL;
    krex_futex_wait(word, seen, slice);
    return KREX_OK;
}

int64_t krex_gate_close(struct krex_segment *seg, uint32_t gpu, uint32_t owner,
                        uint64_t deadline_ns)
{
    if (bad_gpu(seg, gpu) || owner == 0)
        return KREX_E_ARG;
    struct krex_gate *g = &seg->gates[gpu];
    uint32_t epoch = KREX_GATE_EPOCH(KREX_LOAD(&g->word)) + 1;
    if (epoch == 0) /* epoch 0 means "never drained": skip it on wrap-around */
        epoch = 1;
    KREX_STORE(&g->deadline_ns, deadline_ns);
    KREX_STORE(&g->word, KREX_GATE_WORD(epoch, owner));
    KREX_ADD(&g->regions, 1);
    return (int64_t)epoch;
}

int krex_gate_open(struct krex_segment *seg, uint32_t gpu)
{
    if (bad_gpu(seg, gpu))
        return KREX_E_ARG;
    struct krex_gate *g = &seg->gates[gpu];
    uint64_t w = KREX_LOAD(&g->word);
    KREX_STORE(&g->word, KREX_GATE_WORD(KREX_GATE_EPOCH(w), 0));
    KREX_STORE(&g->deadline_ns, 0);
    /* Waiters re-read the gate after reading `wake`; bumping it after the store means a waiter
     * that read the old value either sees the open gate or has its futex wait fail. */
    KREX_ADD(&g->wake, 1);
    krex_futex_wake(&g->wake, INT32_MAX);
    return KREX_OK;
}

uint64_t krex_gate_word(const struct krex_segment *seg, uint32_t gpu)
{
    if (bad_gpu(seg, gpu))
        return 0;
    return KREX_LOAD(&seg->gates[gpu].word);
}

void krex_seg_set_controller(struct krex_segment *seg, uint32_t pid)
{
    KREX_STORE(&seg->header.controller_pid, pid);
}

uint32_t krex_seg_controller(const struct krex_segment *seg)
{
    return KREX_LOAD(&seg->header.controller_pid);
}

int krex_quiesce(struct krex_segment *seg, uint32_t gpu, uint32_t owner, uint64_t timeout_ns,
                 uint32_t *busy)
{
    if (bad_gpu(seg, gpu))
        return KREX_E_ARG;
    uint64_t deadline = krex_now_ns() + timeout_ns;
    for (uint32_t i = 0; i < seg->header.n_slots; i++) {
        struct krex_slot *s = &seg->slots[i];
        for (;;) {
            if (!is_sibling(s, gpu, owner))
                break;
            uint32_t n = KREX_LOAD(&s->in_flight);
            if (n == 0)
                break;
            if (gone(s))
                break;
            /* The shim wakes this word when in_flight drops to 0 behind a closed gate. */
            if (wait_slice(&s->in_flight, n, deadline) == KREX_OK)
                continue;
            uint32_t count = 0;
            for (uint32_t j = i; j < seg->header.n_slots; j++)
                if (is_sibling(&seg->slots[j], gpu, owner) &&
                    KREX_LOAD(&seg->slots[j].in_flight) != 0)
                    count++;
            if (busy)
                *busy = count;
            return KREX_E_TIMEOUT;
        }
    }
    if (busy)
        *busy = 0;
    return KREX_OK;
}

int krex_drain_request(struct krex_segment *seg, uint32_t gpu, uint32_t owner, uint32_t *tickets)
{
    if (bad_gpu(seg, gpu) || !tickets)
        return KREX_E_ARG;
    int asked = 0;
    for (uint32_t i = 0; i < seg->header.n_slots; i++) {
        struct krex_slot *s = &seg->slots[i];
        tickets[i] = 0;
        if (!is_sibling(s, gpu, owner))
            continue;
        if (KREX_LOAD(&s->drained_calls) == KREX_LOAD(&s->intercepted))
            continue; /* nothing submitted since its last drain: nothing queued */
        uint32_t t = KREX_ADD(&s->drain_req, 1);
        if (t == 0) /* 0 means "not asked" in tickets: skip it on wrap-around */
            t = KREX_ADD(&s->drain_req, 1);
        tickets[i] = t;
        krex_futex_wake(&s->drain_req, INT32_MAX);
        asked++;
    }
    return asked;
}

/* Whether ack has reached ticket t (wrap-safe: requests are counted modulo 2^32). */
static int answered(uint32_t ack, uint32_t t)
{
    return (int32_t)(ack - t) >= 0;
}

int krex_drain_await(struct krex_segment *seg, uint32_t gpu, uint32_t owner,
                     const uint32_t *tickets, uint64_t timeout_ns, uint32_t *pending)
{
    if (bad_gpu(seg, gpu) || !tickets)
        return KREX_E_ARG;
    uint64_t deadline = krex_now_ns() + timeout_ns;
    for (uint32_t i = 0; i < seg->header.n_slots; i++) {
        struct krex_slot *s = &seg->slots[i];
        for (;;) {
            if (!tickets[i] || !is_sibling(s, gpu, owner))
                break;
            uint32_t ack = KREX_LOAD(&s->drain_ack);
            if (answered(ack, tickets[i]))
                break;
            if (gone(s))
                break;
            if (wait_slice(&s->drain_ack, ack, deadline) == KREX_OK)
                continue;
            uint32_t count = 0;
            for (uint32_t j = i; j < seg->header.n_slots; j++) {
                struct krex_slot *t = &seg->slots[j];
                if (tickets[j] && is_sibling(t, gpu, owner) && !gone(t) &&
                    !answered(KREX_LOAD(&t->drain_ack), tickets[j]))
                    count++;
            }
            if (pending)
                *pending = count;
            return KREX_E_TIMEOUT;
        }
    }
    if (pending)
        *pending = 0;
    return KREX_OK;
}

int krex_slots_reap(struct krex_segment *seg)
{
    int freed = 0;
    for (uint32_t i = 0; seg && i < seg->header.n_slots; i++)
        freed += reap_if_dead(&seg->slots[i]);
    return freed;
}

int krex_slot_reap(struct krex_segment *seg, uint32_t i, struct krex_slot_view *out)
{
    if (!seg || !out || i >= seg->header.n_slots)
        return KREX_E_ARG;
    struct krex_slot *s = &seg->slots[i];
    if (!krex_slot_take_dead(s))
        return 0;
    /* Ours: its counters are final and nobody else reads them as unfolded from now on. */
    krex_slot_read(seg, i, out);
    free_taken(s);
    return 1;
}

int krex_slot_set_tenant(struct krex_segment *seg, uint32_t i, uint32_t pid, uint32_t tenant)
{
    if (!seg || i >= seg->header.n_slots || tenant == 0)
        return KREX_E_ARG;
    struct krex_slot *s = &seg->slots[i];
    if (KREX_LOAD(&s->state) != KREX_SLOT_LIVE || KREX_LOAD(&s->pid) != pid)
        return KREX_E_ARG;
    KREX_STORE(&s->tenant, tenant);
    /* A pool worker's slot serves one command after another: its counters and memory figures
     * start again for each (the H200 run of 2026-12-01 reported one command's waits and peak
     * in the next one's report); the controller folds the old tenant's first. The worker is
     * idle here, between commands: no call races these stores of fields it otherwise writes. */
    KREX_STORE(&s->intercepted, 0);
    KREX_STORE(&s->blocked, 0);
    KREX_STORE(&s->mem_peak, KREX_LOAD(&s->mem_bytes));
    KREX_STORE(&s->mem_wait_ns, 0);
    KREX_STORE(&s->mem_waits, 0);
    KREX_STORE(&s->mem_oom_alone, 0);
    KREX_STORE(&s->mem_oom_shared, 0);
    for (uint32_t k = 0; k < KREX_MEM_KIND_SLOTS; k++)
        KREX_STORE(&s->mem_kind_waits[k], 0);
    /* intercepted restarts at 0: a value no drain saw, so the next region drains it once. */
    KREX_STORE(&s->drained_calls, UINT64_MAX);
    return KREX_OK;
}

int krex_slot_read(const struct krex_segment *seg, uint32_t i, struct krex_slot_view *out)
{
    if (!seg || !out || i >= seg->header.n_slots)
        return KREX_E_ARG;
    const struct krex_slot *s = &seg->slots[i];
    out->state = KREX_LOAD(&s->state);
    out->pid = KREX_LOAD(&s->pid);
    out->start_time = KREX_LOAD(&s->start_time);
    out->tenant = KREX_LOAD(&s->tenant);
    out->gpu = KREX_LOAD(&s->gpu);
    out->gpus = slot_gpus(s);
    out->in_flight = KREX_LOAD(&s->in_flight);
    out->drain_ack = KREX_LOAD(&s->drain_ack);
    out->drain_req = KREX_LOAD(&s->drain_req);
    out->alive = out->state == KREX_SLOT_LIVE && krex_pid_alive(out->pid, out->start_time);
    out->intercepted = KREX_LOAD(&s->intercepted);
    out->blocked = KREX_LOAD(&s->blocked);
    out->unmatched = KREX_LOAD(&s->unmatched);
    out->ungated = KREX_LOAD(&s->ungated);
    out->mem_bytes = KREX_LOAD(&s->mem_bytes);
    out->mem_peak = KREX_LOAD(&s->mem_peak);
    out->mem_want = KREX_LOAD(&s->mem_want);
    out->mem_since_ns = KREX_LOAD(&s->mem_since_ns);
    out->mem_wait_ns = KREX_LOAD(&s->mem_wait_ns);
    out->mem_waits = KREX_LOAD(&s->mem_waits);
    out->mem_grant = KREX_LOAD(&s->mem_grant);
    out->mem_deny = KREX_LOAD(&s->mem_deny);
    out->mem_kind = KREX_LOAD(&s->mem_kind);
    out->mem_seen = KREX_LOAD(&s->mem_seen);
    out->mem_failed = KREX_LOAD(&s->mem_failed);
    out->drained_calls = KREX_LOAD(&s->drained_calls);
    for (uint32_t k = 0; k < KREX_MEM_KIND_SLOTS; k++)
        out->mem_kind_waits[k] = KREX_LOAD(&s->mem_kind_waits[k]);
    out->mem_oom_alone = KREX_LOAD(&s->mem_oom_alone);
    out->mem_oom_shared = KREX_LOAD(&s->mem_oom_shared);
    return KREX_OK;
}

/* The waiter sleeps on mem_grant (a denial bumps it too, so one futex word wakes it for both). */
static int mem_poke(struct krex_segment *seg, uint32_t i, int deny)
{
    if (!seg || i >= seg->header.n_slots)
        return KREX_E_ARG;
    struct krex_slot *s = &seg->slots[i];
    if (deny)
        __atomic_add_fetch(&s->mem_deny, 1U, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&s->mem_grant, 1U, __ATOMIC_SEQ_CST);
    krex_futex_wake(&s->mem_grant, INT32_MAX);
    return KREX_OK;
}

int krex_mem_grant(struct krex_segment *seg, uint32_t i)
{
    return mem_poke(seg, i, 0);
}

int krex_mem_deny(struct krex_segment *seg, uint32_t i)
{
    return mem_poke(seg, i, 1);
}

int krex_mem_seen(struct krex_segment *seg, uint32_t i)
{
    if (!seg || i >= seg->header.n_slots)
        return KREX_E_ARG;
    __atomic_add_fetch(&seg->slots[i].mem_seen, 1U, __ATOMIC_SEQ_CST);
    return KREX_OK;
}
