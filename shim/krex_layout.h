/*
 * krex_layout.h: the one definition of KREX's shared-memory layout.
 *
 * The preload library (shim/) and the Python control plane (krex/_native via cffi) both compile
 * this header. Fixed-width fields only, no ABI-dependent types, every struct a multiple of a
 * cache line; tests/c/test_layout.c checks each size and offset and cffi checks its cdef against
 * it. Shared fields are accessed with __atomic builtins (sequentially consistent where the region
 * protocol needs it): never through _Atomic types, which cffi cannot parse.
 *
 * Segment = header | gates[KREX_MAX_GPUS] | slots[n_slots].
 * 1.1: krex_slot.gpus (the GPU mask of a command that holds several GPUs).
 * 1.2: krex_slot's device-memory fields (mem_*), carved out of cache line 1 (docs/memory.md).
 * 2.0: krex_slot grows a cache line (drained_calls, the kind of a memory wait, waits per kind);
 *      mem_release becomes mem_deny (deadlocks are broken by preemption, docs/memory.md).
 * 2.1: krex_header.controller_pid: a controller holds the segment's liveness lock (below), so
 *      threads blocked at a closed gate pass once no one holds it (docs/shim.md, "A dead
 *      controller").
 * 2.2: krex_slot.mem_failed: the memory waiters' retries that failed, so that the controller
 *      judges "a retry failed" by the process's word, not by how long it has been since a grant
 *      (docs/memory.md).
 * Any change of a size or offset bumps KREX_LAYOUT_MAJOR; fields carved out of reserved space
 * bump KREX_LAYOUT_MINOR.
 */
#ifndef KREX_LAYOUT_H
#define KREX_LAYOUT_H

#include <stdint.h>

#define KREX_SHM_MAGIC 0x5845524BU /* "KREX" read as little-endian bytes */
#define KREX_LAYOUT_MAJOR 2U
#define KREX_LAYOUT_MINOR 2U
#define KREX_MAX_GPUS 16U
#define KREX_MAX_SLOTS 4096U
#define KREX_CACHELINE 64U

/* header.state */
#define KREX_SEG_INITIALISING 0U
#define KREX_SEG_READY 1U

/* slot.state */
#define KREX_SLOT_FREE 0U
#define KREX_SLOT_CLAIMING 1U
#define KREX_SLOT_LIVE 2U

/* Gate word: epoch in the high 32 bits, owner tenant in the low 32 bits; owner 0 = open. */
#define KREX_GATE_OWNER(w) ((uint32_t)((w) & 0xFFFFFFFFULL))
#define KREX_GATE_EPOCH(w) ((uint32_t)((w) >> 32))
#define KREX_GATE_WORD(epoch, owner) (((uint64_t)(uint32_t)(epoch) << 32) | (uint64_t)(uint32_t)(owner))

/* What a memory wait waits in (krex_slot.mem_kind, mem_kind_waits): every way the driver can
 * answer out-of-memory (docs/memory.md). */
#define KREX_MEM_ALLOC 0U   /* the allocation family: cuMemAlloc*, VMM, arrays */
#define KREX_MEM_CONTEXT 1U /* context creation (the driver's own memory for it) */
#define KREX_MEM_MODULE 2U  /* module and library loading, eager or lazy (first use) */
#define KREX_MEM_LAUNCH 3U  /* a launch (the local memory its kernel needs) */
#define KREX_MEM_GRAPH 4U   /* graph instantiation, upload and launch */
#define KREX_MEM_KINDS 5U
#define KREX_MEM_KIND_SLOTS 8U /* entries of mem_kind_waits (room for more kinds) */

/* Status codes shared by the C helpers and Python (krex/core/shm.py maps them to exceptions). */
#define KREX_OK 0
#define KREX_E_SMALL -1      /* segment smaller than its header or than total_size */
#define KREX_E_MAGIC -2      /* not a KREX segment */
#define KREX_E_VERSION -3    /* layout major version differs */
#define KREX_E_GEOMETRY -4   /* sizes or counts inconsistent: corrupt or foreign build */
#define KREX_E_NOT_READY -5  /* creator never finished initialising it */
#define KREX_E_ARG -6        /* bad argument (GPU index, tenant 0, ...) */
#define KREX_E_TIMEOUT -7    /* a wait ran out of time */

#define KREX_OVERFLOW_PIDS 8

/* The controller's liveness lock (2.1): an open-file-description read lock (F_OFD_SETLK,
 * F_RDLCK) on these bytes of the segment's file, held for the controller's life; the kernel
 * drops it when the controller dies, however it dies. Anyone may ask without taking anything
 * (F_OFD_GETLK for F_WRLCK: F_UNLCK = no controller); whoever would reopen a dead controller's
 * gates holds a write lock on them meanwhile, which no live controller's read lock allows. */
#define KREX_LIVENESS_LOCK_START 0
#define KREX_LIVENESS_LOCK_LEN 1

struct krex_header {
    uint32_t magic;        /* KREX_SHM_MAGIC */
    uint16_t major;        /* KREX_LAYOUT_MAJOR */
    uint16_t minor;        /* KREX_LAYOUT_MINOR */
    uint32_t header_size;  /* sizeof(struct krex_header) */
    uint32_t gate_size;    /* sizeof(struct krex_gate) */
    uint32_t slot_size;    /* sizeof(struct krex_slot) */
    uint32_t n_gpus;       /* gates in use (<= KREX_MAX_GPUS) */
    uint32_t n_slots;      /* process slots in this segment (<= KREX_MAX_SLOTS) */
    uint32_t state;        /* KREX_SEG_*; READY is written last by the creator */
    uint64_t total_size;   /* bytes: header + all gates + n_slots slots */
    uint64_t created_ns;   /* CLOCK_REALTIME at creation, for diagnostics */
    uint32_t creator_pid;
    uint32_t overflow;     /* processes that found no free slot (their regions are unclean) */
    uint32_t overflow_pids[KREX_OVERFLOW_PIDS]; /* 1.3: the first of them, so that the count
                                                   ends when they do (0: an unused entry) */
    uint32_t controller_pid; /* 2.1: the controller that holds the liveness lock, as it wrote
                                at its start (0: none ever did; blocked threads then wait for
                                the gate or its deadline only) */
    uint32_t reserved0;
    uint64_t reserved[4];
};

struct krex_gate {
    uint64_t word;         /* KREX_GATE_WORD(epoch, owner); seq_cst stores and loads */
    uint32_t wake;         /* futex word: bumped on every open, blocked threads wait on it */
    uint32_t reserved0;
    uint64_t deadline_ns;  /* CLOCK_MONOTONIC; past it blocked threads pass (0 = none) */
    uint64_t regions;      /* closes so far, for statistics */
    uint64_t reserved[4];
};

struct krex_slot {
    /* Cache line 0: written by the owning process (hot path touches only this line). */
    uint32_t state;        /* KREX_SLOT_* */
    uint32_t pid;          /* in the controller's pid namespace */
    uint64_t start_time;   /* /proc/<pid>/stat field 22: a recycled pid has another */
    uint32_t tenant;       /* > 0; the controller re-assigns a pool worker's (per command) */
    uint32_t gpu;          /* gate index */
    uint32_t in_flight;    /* calls between announce and return; futex word for the quiesce */
    uint32_t drain_ack;    /* futex word: the drain_req value the drain thread last drained for */
    uint64_t intercepted;  /* work-submitting calls that reached the driver through the shim */
    uint64_t blocked;      /* of those, calls that waited at a closed gate first */
    uint64_t unmatched;    /* gated look-ups whose pointer matched no known export */
    uint32_t gpus;         /* 1.1: bit i = works on GPU i (a command of several); 0 = just gpu */
    uint32_t ungated;      /* 1.3: ways this process reaches a GPU driver that the shim cannot
                              gate (dlmopen, a second copy, unroutable RTLD_DEEPBIND) */
    /* Cache line 1: drain requests and device memory (1.2). drain_req, mem_grant and
     * mem_deny are written by the controller, the rest by the owning process. Allocations
     * are rare next to launches, so the two writers sharing this line costs nothing measurable. */
    uint32_t drain_req;    /* futex word: drain requests so far (each adds 1; see krex_control.h) */
    uint32_t mem_grant;    /* futex word: the controller adds 1 to let this process's memory
                              waiter retry its allocation */
    uint64_t mem_bytes;    /* device bytes the process holds now (allocations less frees) */
    uint64_t mem_peak;     /* the most mem_bytes ever was */
    uint64_t mem_want;     /* bytes of the allocation it is waiting for; 0: not waiting */
    uint64_t mem_since_ns; /* CLOCK_MONOTONIC when that wait began (the waiters' order) */
    uint64_t mem_wait_ns;  /* ns spent waiting for memory, all waits ended so far */
    uint32_t mem_waits;    /* allocations that waited */
    uint32_t mem_deny;     /* the controller adds 1: the current wait could not end well even
                              with the GPU to this command alone; it ends with the driver's
                              out-of-memory error, counted in mem_oom_alone (2.0; was
                              mem_release) */
    uint32_t mem_oom_alone;  /* out-of-memory errors returned that would have happened alone */
    uint32_t mem_oom_shared; /* out-of-memory errors returned only because others held memory
                                (a wait that ran out of time): the command's later regions are
                                not clean, and it runs again (docs/memory.md) */
    /* Cache line 2 (2.0): written by the owning process (the drain thread and memory waits). */
    uint64_t drained_calls; /* `intercepted` as the drain thread read it before its last
                               completed drain: equal to intercepted, nothing was submitted
                               since, so nothing is queued and a region need not drain it */
    uint32_t mem_kind;      /* KREX_MEM_* of the current memory wait (meaningful while mem_want) */
    uint32_t mem_seen;      /* the controller adds 1 as it passes over this process's waiter
                               (not its turn): a live controller, so the waiter does not retry
                               on its own and take memory out of turn (written by the
                               controller, in a line the process writes only on memory waits) */
    uint32_t mem_kind_waits[KREX_MEM_KIND_SLOTS]; /* memory waits so far, per KREX_MEM_* */
    uint32_t mem_failed; /* 2.2: memory waiters' retries that failed (out of memory again), so
                            far: a grant followed by a failure here is a retry that was made (a
                            loaded machine may run the waiter long after its grant) */
    uint32_t reserved4;
    uint64_t reserved3[1];
};

struct krex_segment {
    struct krex_header header;
    struct krex_gate gates[KREX_MAX_GPUS];
    struct krex_slot slots[];
};

#define KREX_SEGMENT_SIZE(n_slots) \
    ((uint64_t)sizeof(struct krex_segment) + (uint64_t)(n_slots) * sizeof(struct krex_slot))

#endif /* KREX_LAYOUT_H */
