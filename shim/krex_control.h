/*
 * krex_control.h: the control side of the region protocol (docs/shim.md: steps 1-3 and exit),
 * compiled into the cffi module krex._native and driven from krex/core/shm.py.
 *
 * Every function takes the mapped segment; the caller maps it (posix_ipc + mmap) and checks it
 * with krex_seg_check first. All waits are bounded by a timeout in nanoseconds. Atomics live
 * here, never in Python.
 */
#ifndef KREX_CONTROL_H
#define KREX_CONTROL_H

#include <stdint.h>

#include "krex_layout.h"

/* Initialise a zeroed mapping of `size` bytes as a segment; READY is written last. */
int krex_seg_init(void *base, uint64_t size, uint32_t n_gpus, uint32_t n_slots);
/* Validate a mapping of `size` bytes: KREX_OK or one KREX_E_* code. Reads nothing past size. */
int krex_seg_check(const void *base, uint64_t size);
/* A one-line English description of a KREX_* status code. */
const char *krex_strerror(int code);

/* Step 1: close gate `gpu` to everyone but `owner` (> 0); returns the new epoch.
 * deadline_ns (CLOCK_MONOTONIC, 0 = none): blocked threads pass after it even if the
 * controller never opens the gate (the last line of defence against a dead controller). */
int64_t krex_gate_close(struct krex_segment *seg, uint32_t gpu, uint32_t owner,
                        uint64_t deadline_ns);
/* Exit: open gate `gpu` and wake every thread blocked on it. */
int krex_gate_open(struct krex_segment *seg, uint32_t gpu);
/* The gate word, read with a sequentially consistent load. */
uint64_t krex_gate_word(const struct krex_segment *seg, uint32_t gpu);
/* The controller that holds the segment's liveness lock (layout 2.1): written by a controller
 * once it holds the lock, before it closes any gate; read by anyone (0: none declared). */
void krex_seg_set_controller(struct krex_segment *seg, uint32_t pid);
uint32_t krex_seg_controller(const struct krex_segment *seg);

/* Step 2: wait until no live sibling slot on `gpu` (tenant != owner) is in flight.
 * Slots of dead processes (pid gone, or start time changed) are not waited for; they stay
 * until krex_slots_reap frees them (after the controller has read their counters).
 * Returns KREX_OK, KREX_E_TIMEOUT (then *busy = slots still in flight) or KREX_E_ARG. */
int krex_quiesce(struct krex_segment *seg, uint32_t gpu, uint32_t owner, uint64_t timeout_ns,
                 uint32_t *busy);

/* Step 3: ask every live sibling slot on `gpu` to drain. A slot's drain_req counts requests
 * (regions on two GPUs may ask one process of both at once); tickets[i] (n_slots entries) gets
 * the count our request made for slot i, 0 where none was asked. A slot that submitted nothing
 * since its last completed drain (drained_calls == intercepted; called behind a closed,
 * quiesced gate, so nothing can be submitted meanwhile) has nothing queued and is not asked: a
 * process waiting for memory, or idle, costs the region nothing (docs/memory.md). Returns how
 * many were asked (>= 0) or KREX_E_ARG. */
int krex_drain_request(struct krex_segment *seg, uint32_t gpu, uint32_t owner, uint32_t *tickets);
/* Wait until every slot asked has acknowledged its ticket or a later request (drain_ack caught
 * up: it drained after we asked); dead ones, and slots no longer siblings, are skipped.
 * Returns KREX_OK, KREX_E_TIMEOUT (then *pending = slots that did not answer) or KREX_E_ARG. */
int krex_drain_await(struct krex_segment *seg, uint32_t gpu, uint32_t owner,
                     const uint32_t *tickets, uint64_t timeout_ns, uint32_t *pending);

/* Free the slots of dead processes; returns how many were freed. */
int krex_slots_reap(struct krex_segment *seg);
/* Re-assign live slot `i` of process `pid` to `tenant` (a pool worker starting or finishing a
 * command): its gate checks and the drain then treat it as that tenant's, and its memory
 * figures (peak, waits, out-of-memory counts) start again from what it holds now. KREX_E_ARG if
 * the slot is not `pid`'s live slot or tenant is 0. */
int krex_slot_set_tenant(struct krex_segment *seg, uint32_t i, uint32_t pid, uint32_t tenant);

/* A consistent-enough copy of slot `i` (each field read atomically), for reports and tests. */
struct krex_slot_view {
    uint32_t state;
    uint32_t pid;
    uint64_t start_time;
    uint32_t tenant;
    uint32_t gpu;
    uint32_t in_flight;
    uint32_t drain_ack;
    uint32_t drain_req;
    uint32_t alive;
    uint32_t gpus;  /* GPU mask: bit i = GPU i (a slot with mask 0 reads as 1 << gpu) */
    uint32_t ungated; /* 1.3: ways to a driver past the shim (dlmopen, deepbind.c) */
    uint64_t intercepted;
    uint64_t blocked;
    uint64_t unmatched;
    /* Device memory (1.2, docs/memory.md). */
    uint64_t mem_bytes;
    uint64_t mem_peak;
    uint64_t mem_want;
    uint64_t mem_since_ns;
    uint64_t mem_wait_ns;
    uint32_t mem_waits;
    uint32_t mem_grant;
    uint32_t mem_deny;
    uint32_t mem_oom_alone;
    uint32_t mem_oom_shared;
    uint32_t mem_kind; /* 2.0 */
    uint32_t mem_seen; /* 2.0 */
    uint64_t drained_calls; /* 2.0 */
    uint32_t mem_kind_waits[KREX_MEM_KIND_SLOTS]; /* 2.0 */
    uint32_t mem_failed; /* 2.2 */
};
int krex_slot_read(const struct krex_segment *seg, uint32_t i, struct krex_slot_view *out);
/* Free slot `i` if its process is dead, first copying it into *out (its final counters, for
 * the controller to fold): 1 if freed, 0 if not (free, alive, or being claimed), KREX_E_ARG.
 * Taking the slot and a shim's reclaiming it (krex_register) are one compare-and-swap apart,
 * so a dead process's counters are folded by the controller or carried on by a process of its
 * tenant that reclaimed its slot, never both (docs/shim.md, "The drain"). */
int krex_slot_reap(struct krex_segment *seg, uint32_t i, struct krex_slot_view *out);

/* Memory arbitration (docs/memory.md): let the memory waiter of slot `i` retry its allocation
 * (mem_grant += 1, wake), or end its wait with the driver's out-of-memory error, counted as one
 * it would have had alone (mem_deny += 1, wake). KREX_E_ARG for a bad index. */
int krex_mem_grant(struct krex_segment *seg, uint32_t i);
int krex_mem_deny(struct krex_segment *seg, uint32_t i);
/* The controller passed over slot `i`'s memory waiter (not its turn): mem_seen += 1, no wake. */
int krex_mem_seen(struct krex_segment *seg, uint32_t i);

/* /proc/<pid>/stat start time (field 22), or 0 if the process does not exist. */
uint64_t krex_proc_start_time(uint32_t pid);
/* CLOCK_MONOTONIC in nanoseconds (the clock of deadlines). */
uint64_t krex_now_ns(void);

#endif /* KREX_CONTROL_H */
