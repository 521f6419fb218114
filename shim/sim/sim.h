/*
 * sim.h: internals of the simulated GPU, a CPU-only stand-in for the NVIDIA driver
 * (libcuda.so.1) that lets KREX be tested on machines without a GPU.
 *
 * Layers, bottom up:
 *   sim_util.c     configuration (environment, read once), logging, clocks, robust locks
 *   sim_shm.c      the node's shared segment: create or attach, check; one-time init, fork
 *   sim_model.c    the device model in the segment: jobs, streams, events, processor sharing
 *   sim_wait.c     queueing work, and waiting for the model without holding its lock
 *   sim_ctx.c      per-process state: contexts, current-context stacks, default streams
 *   sim_mem.c      device-memory accounting for the node (capacity, per-process use)
 *   sim_api_*.c    the exported driver entry points (device, ctx, module, stream, mem,
 *                  launch)
 *   sim_vmm.c      the virtual memory management entry points (cuMemCreate, cuMemMap, ...)
 *   sim_errors.c   cuGetErrorName, cuGetErrorString
 *   sim_procaddr.c cuGetProcAddress
 *   sim_ckpt.c     the checkpoint API (cuCheckpointProcess*): lock, checkpoint, restore
 *   sim_hooks.c    krexsim_* test hooks and the witness
 *
 * Environment (read once per process): KREX_SIM_SHM (node segment, default /krex-sim-<uid>),
 * KREX_SIM_GPUS (1; at most 16), KREX_SIM_CTX_CREATE_MS (0), KREX_SIM_COPY_GBPS (50),
 * KREX_SIM_LAUNCH_GAP_US (1000; see sim_absorb_launch_gap in sim_model.c), KREX_SIM_MEM_BYTES
 * (device memory per GPU, SIM_TOTAL_MEM; only the node's creator's value counts),
 * KREX_SIM_CTX_BYTES, KREX_SIM_MODULE_BYTES, KREX_SIM_LOCAL_BYTES, KREX_SIM_GRAPH_BYTES (0: the
 * device memory the driver takes for itself, per process) and CUDA_MODULE_LOADING (LAZY or
 * not), KREX_SIM_DEBUG, KREX_SIM_WITNESS and KREX_TENANT (krexsim.h). Read at each call instead:
 * KREX_SIM_CHECKPOINT_S_PER_GIB and KREX_SIM_RESTORE_S_PER_GIB (sim_ckpt.c), from the caller's
 * environment, as the process that checkpoints another need not be of the node. The segment
 * always holds SIM_MAX_GPUS GPUs; KREX_SIM_GPUS only says how many of them this process sees.
 *
 * Processes are told apart by pid: an owner that kill(pid, 0) says is gone is dead (so all
 * processes of a node must share a pid namespace), and its streams, jobs and events are
 * collected.
 *
 * Every exported name is an alias of a hidden sim_<name> function (SIM_EXPORT), so that
 * cuGetProcAddress can hand out exactly the addresses dlsym finds, and so that calls inside
 * the library never go through an interposable symbol.
 */
#ifndef KREX_SIM_H
#define KREX_SIM_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "krex_cuda.h"
#include "krexsim.h"

#define SIM_HIDDEN __attribute__((visibility("hidden")))

/* Export `name` as an alias of the hidden sim_<name>, defined in the same file before it. */
#define SIM_EXPORT(name)                                                                      \
    extern __typeof__(sim_##name) name __attribute__((alias("sim_" #name), visibility("default")))

/* ---- Constants the shared header does not declare. ---- */

#define SIM_DRIVER_VERSION 13000
#define SIM_MAX_GPUS 16U
#define SIM_TOTAL_MEM (143771ULL * 1024ULL * 1024ULL) /* what an H200 reports */

#define SIM_CU_EVENT_DISABLE_TIMING 0x2U
#define SIM_CU_LAUNCH_PARAM_END ((void *)0x00)
#define SIM_CU_LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define SIM_CU_LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)
#define SIM_CUDA_ERROR_ILLEGAL_STATE ((CUresult)401) /* not in krex_cuda.h's enum */

/* The checkpoint API's types, as cuda.h (12.8 and later) declares them. */
#ifndef KREX_REAL_CUDA_H
typedef enum CUprocessState_enum {
    CU_PROCESS_STATE_RUNNING = 0,
    CU_PROCESS_STATE_LOCKED,
    CU_PROCESS_STATE_CHECKPOINTED,
    CU_PROCESS_STATE_FAILED
} CUprocessState;
typedef struct CUuuid_st {
    char bytes[16];
} CUuuid;
typedef struct CUcheckpointLockArgs_st {
    unsigned int timeoutMs; /* 0: no timeout */
    unsigned int reserved0;
    cuuint64_t reserved1[7];
} CUcheckpointLockArgs;
typedef struct CUcheckpointCheckpointArgs_st {
    cuuint64_t reserved[8];
} CUcheckpointCheckpointArgs;
typedef struct CUcheckpointGpuPair_st {
    CUuuid oldUuid;
    CUuuid newUuid;
} CUcheckpointGpuPair;
typedef struct CUcheckpointRestoreArgs_st {
    CUcheckpointGpuPair *gpuPairs;
    unsigned int gpuPairsCount;
    char reserved[52 - sizeof(CUcheckpointGpuPair *)];
    cuuint64_t reserved1;
} CUcheckpointRestoreArgs;
typedef struct CUcheckpointUnlockArgs_st {
    cuuint64_t reserved[8];
} CUcheckpointUnlockArgs;
#endif

/* ---- Configuration (sim_util.c), read once per process. ---- */

struct sim_config {
    char shm_name[256];       /* KREX_SIM_SHM, always with a leading '/' */
    unsigned n_gpus;          /* KREX_SIM_GPUS, 0..SIM_MAX_GPUS */
    unsigned n_visible;       /* CUDA_VISIBLE_DEVICES: ordinals this process sees */
    int visible[SIM_MAX_GPUS]; /* ordinal -> simulated GPU (the CUdevice handle) */
    double ctx_create_ns;     /* KREX_SIM_CTX_CREATE_MS, in ns */
    double copy_bytes_per_ns; /* KREX_SIM_COPY_GBPS: GB/s is bytes per ns */
    double launch_gap_ns;     /* KREX_SIM_LAUNCH_GAP_US: host gap absorbed after a marker */
    int debug;                /* KREX_SIM_DEBUG */
    char witness_path[4096];  /* KREX_SIM_WITNESS, "" when unset */
    uint32_t tenant;          /* KREX_TENANT */
    uint64_t mem_bytes;       /* KREX_SIM_MEM_BYTES: capacity per GPU, if this process
                               * creates the node (the segment's value is what counts) */
    /* Device memory the driver takes for itself, per process (default 0: none). */
    uint64_t ctx_bytes;       /* KREX_SIM_CTX_BYTES: a context */
    uint64_t module_bytes;    /* KREX_SIM_MODULE_BYTES: a loaded module or library */
    uint64_t local_bytes;     /* KREX_SIM_LOCAL_BYTES: a kernel's local memory without @local= */
    uint64_t graph_bytes;     /* KREX_SIM_GRAPH_BYTES: an instantiated graph */
    int lazy_loading;         /* CUDA_MODULE_LOADING=LAZY */
};

SIM_HIDDEN extern struct sim_config sim_cfg;

SIM_HIDDEN void sim_config_load(void);
/* A size as KREX_SIM_MEM_BYTES spells it: an integer number of bytes, optionally with a binary
 * suffix K, M, G or T (also KiB ... TiB, KB ... TB, and k: all powers of 1024), at most 1 PiB.
 * 1 and *out set when `s` is one, else 0. */
SIM_HIDDEN int sim_parse_bytes(const char *s, uint64_t *out);
/* A number from the environment, or `dflt` (with a warning) when unset or malformed. */
SIM_HIDDEN double sim_env_number(const char *name, double dflt, double lo, double hi);
/* One stderr line, prefixed "krex-sim (simulated GPU): ". sim_debug only with KREX_SIM_DEBUG. */
SIM_HIDDEN void sim_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
SIM_HIDDEN void sim_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
SIM_HIDDEN int64_t sim_mono_ns(void);
/* Sleep until CLOCK_MONOTONIC reaches abs_ns (returns early only if already past). */
SIM_HIDDEN void sim_sleep_until(int64_t abs_ns);
/* Lock a process-shared robust mutex; *recovered = 1 when its previous owner died in it. */
SIM_HIDDEN int sim_robust_lock(pthread_mutex_t *m, int *recovered);
SIM_HIDDEN void sim_robust_init(pthread_mutex_t *m);

/* ---- The shared segment (sim_shm.c, layout here so that sim_model.c can use it). ---- */

#define SIM_SHM_MAGIC 0x4D49534BU /* "KSIM" read as little-endian bytes */
#define SIM_SHM_VERSION 5U
#define SIM_MAX_STREAMS 1024U
#define SIM_MAX_EVENTS 8192U
#define SIM_MAX_JOBS 8192U
#define SIM_NONE UINT32_MAX
#define SIM_MAX_MEM_PROCS 512U
#define SIM_DONE_PROCS 64U

/* One piece of work queued in a stream: a kernel, copy, set, or zero-length marker. */
struct sim_job {
    uint32_t next;      /* next job of the same stream, or next free job */
    uint32_t stream;    /* owning stream slot; SIM_NONE when free */
    uint32_t event;     /* event slot stamped when this job completes, or SIM_NONE */
    uint32_t event_gen; /* ... as long as that slot still holds the same event */
    uint32_t event_rec; /* ... and was not recorded again since */
    uint32_t kind;      /* enum sim_job_kind, for debug output */
    double remaining;   /* nanoseconds of work left if it ran alone on the GPU */
};

enum sim_job_kind { SIM_JOB_KERNEL, SIM_JOB_COPY, SIM_JOB_SET, SIM_JOB_MARKER };

/* A stream: a FIFO of jobs; its head job is running (in its GPU's active set). */
struct sim_stream {
    int32_t owner;       /* pid of the owning process; 0 = free slot */
    uint32_t gen;        /* bumped when the slot is freed, so stale handles are caught */
    uint32_t gpu;
    uint32_t destroyed;  /* the owner let go of it: freed as soon as it is empty */
    uint64_t ctx_id;     /* the owner's context serial, for cuCtxSynchronize */
    uint32_t head, tail; /* job slots, SIM_NONE when empty */
    uint32_t active_pos; /* index in gpus[gpu].active while non-empty */
    uint32_t next_free;
    uint64_t submitted; /* jobs ever queued; a job's sequence number is this after queueing */
    uint64_t completed; /* jobs ever finished (or dropped) */
    /* The event of the marker that was the last thing queued, if it went into the idle
     * stream (and so completed at once): SIM_NONE otherwise. See sim_enqueue. */
    uint32_t mark_event, mark_gen, mark_rec;
    uint32_t done_hint; /* its owner's entry in done[gpu].procs, as last found (a hint) */
};

enum sim_event_state { SIM_EV_NEVER, SIM_EV_PENDING, SIM_EV_DONE };

struct sim_event {
    int32_t owner; /* pid; 0 = free slot */
    uint32_t gen;
    uint32_t state; /* enum sim_event_state */
    uint32_t gpu;   /* GPU of the stream it was last recorded in */
    uint32_t rec;   /* bumped by every record: only the latest marker stamps it */
    uint32_t next_free;
    double t; /* model time at which the latest marker completed */
};

/* One GPU's processor-sharing state: every active job progresses at 1/n_active. */
struct sim_gpu {
    double t; /* model time this state describes */
    uint32_t n_active;
    uint32_t pad;
    uint32_t active[SIM_MAX_STREAMS]; /* stream slots whose head job is running */
};

/* A process's device memory on each GPU (sim_mem.c). pid 0: a free entry. The start time
 * (/proc/<pid>/stat, clock ticks since boot) tells a reused pid from the process that made
 * the entry. Its checkpoint state (sim_ckpt.c) lives here too: only a process holding device
 * memory can be locked. */
struct sim_mem_proc {
    int32_t pid;
    uint32_t state; /* CUprocessState: RUNNING, LOCKED or CHECKPOINTED */
    uint64_t start;
    int32_t busy;     /* pid of the caller whose checkpoint or restore of it is under way */
    uint32_t busy_op; /* ... which (enum sim_ckpt_op); both 0 when none is */
    uint64_t used[SIM_MAX_GPUS];    /* bytes on the GPU: what counts as in use */
    uint64_t swapped[SIM_MAX_GPUS]; /* bytes a checkpoint took off the GPU, to restore */
};

/* The driver's own record of whose work ran on a GPU (krexsim_busy): per process, the model
 * time its latest job there completed. What a tenant's drain acknowledgement claims is checked
 * against it (docs/security.md). When more than SIM_DONE_PROCS processes have completed work on
 * a GPU, the entry with the oldest completion gives way and `evicted` keeps the latest time so
 * lost: a reader then knows that it cannot say who ran after that. pid 0: a free entry. Each
 * field is written with atomic stores under the model lock, and read without it. */
struct sim_done {
    int32_t pid;
    uint32_t pad;
    int64_t t_ns; /* model time, ns */
};
struct sim_gpu_done {
    int64_t evicted_ns;
    struct sim_done procs[SIM_DONE_PROCS];
};

struct sim_shm {
    /* Fixed prefix: checked before anything else is trusted. */
    uint32_t magic;
    uint32_t version;
    uint64_t size;  /* sizeof(struct sim_shm) of the creator */
    uint32_t ready; /* written last by the creator */
    uint32_t pad0;
    int64_t epoch_ns; /* CLOCK_MONOTONIC at creation: model time 0 */
    /* Pids holding the two locks (0: free), at the fixed offsets krexsim.h documents: the
     * controller must never leave a process frozen inside them (krexsim.h explains). */
    uint32_t model_holder;
    uint32_t ctx_holder;

    pthread_mutex_t model_lock; /* everything below */
    pthread_mutex_t ctx_lock;   /* node-wide context creation */
    int64_t last_reap_ns;
    uint32_t free_job, free_stream, free_event;
    /* 1 + the GPU whose context ctx_holder is creating (0: none): such a process is listed
     * among the GPU's users as NVML lists a process once the driver is creating its context
     * (krexsim_users). */
    uint32_t ctx_holder_gpu;
    struct sim_gpu gpus[SIM_MAX_GPUS];
    struct sim_stream streams[SIM_MAX_STREAMS];
    struct sim_event events[SIM_MAX_EVENTS];
    struct sim_job jobs[SIM_MAX_JOBS];
    /* Device memory (sim_mem.c), under the model lock: the capacity of each GPU, fixed by the
     * creator (KREX_SIM_MEM_BYTES), and what each live process holds. In use on a GPU = the
     * sum over the entries: nothing derived to repair when a holder dies in the lock. */
    uint64_t mem_capacity[SIM_MAX_GPUS];
    struct sim_mem_proc mem_procs[SIM_MAX_MEM_PROCS];
    /* Whose jobs completed on each GPU, and when (struct sim_gpu_done). */
    struct sim_gpu_done done[SIM_MAX_GPUS];
};

SIM_HIDDEN extern struct sim_shm *sim_shm;
SIM_HIDDEN extern pid_t sim_pid;

/* Configure, attach the segment, map the witness: once per process. CUDA_SUCCESS or the
 * error every call returns from then on. */
SIM_HIDDEN CUresult sim_ensure_init(void);
SIM_HIDDEN void sim_shm_init_layout(struct sim_shm *s);
/* Whether a node's segment (its fstat) is this user's alone: ours, writable by nobody else. */
struct stat;
SIM_HIDDEN int sim_shm_ours(const struct stat *st);

/* ---- The device model (sim_model.c). All functions with the model lock held. ---- */

/* Take the model lock and advance every GPU to now; returns the model time now. Both wait
 * (without the lock) while this process is locked or checkpointed (sim_ckpt.c). */
SIM_HIDDEN CUresult sim_model_lock(double *now);
/* Take the model lock without advancing (the caller advances, with sim_model_advance). */
SIM_HIDDEN CUresult sim_model_lock_raw(void);
/* sim_model_lock_raw that takes the lock even while this process is locked: *frozen says
 * whether it is (for a caller that must not wait holding another lock). */
SIM_HIDDEN CUresult sim_model_lock_any(int *frozen);
/* Advance every GPU, or just `gpu`, to CLOCK_MONOTONIC time mono_ns (never backwards). */
SIM_HIDDEN void sim_model_advance(int64_t mono_ns);
SIM_HIDDEN void sim_model_advance_gpu(uint32_t gpu, int64_t mono_ns);
SIM_HIDDEN void sim_model_unlock(void);
/* The same on segment s, which need not be this process's node (krexsim_checkpoint maps one by
 * name): its lock (repaired as sim_model_lock_raw repairs it; no reaping, no waiting while
 * locked), and every GPU advanced to CLOCK_MONOTONIC mono_ns. */
SIM_HIDDEN CUresult sim_node_lock(struct sim_shm *s);
SIM_HIDDEN void sim_node_unlock(struct sim_shm *s);
SIM_HIDDEN void sim_node_advance(struct sim_shm *s, int64_t mono_ns);
SIM_HIDDEN double sim_model_now(void);

SIM_HIDDEN uint32_t sim_stream_alloc(uint32_t gpu, uint64_t ctx_id); /* SIM_NONE if full */
/* Let go of a stream: freed now if empty, else once drained. */
SIM_HIDDEN void sim_stream_release(uint32_t slot, uint32_t gen);
SIM_HIDDEN int sim_stream_valid(uint32_t slot, uint32_t gen);
SIM_HIDDEN uint32_t sim_event_alloc(void);
SIM_HIDDEN void sim_event_free(uint32_t slot, uint32_t gen);
SIM_HIDDEN int sim_event_valid(uint32_t slot, uint32_t gen);

/* What a job to queue is. */
struct sim_work {
    enum sim_job_kind kind;
    double duration_ns;
    uint32_t event, event_gen; /* SIM_NONE: no event to stamp */
};
/* Queue `w` at the tail of stream `slot`; *seq = its sequence number. CUDA_ERROR_OUT_OF_MEMORY
 * when the job table is full (after collecting dead processes' jobs): the caller waits. */
SIM_HIDDEN CUresult sim_enqueue(uint32_t slot, const struct sim_work *w, uint64_t *seq);
/* Drop everything owned by processes that no longer exist; returns how many were dead. */
SIM_HIDDEN unsigned sim_reap_dead(void);
/* Model time of the next job completion on `gpu` as things stand, or -1 if it is idle. */
SIM_HIDDEN double sim_next_completion(uint32_t gpu);

/* ---- Device memory accounting, node-wide (sim_mem.c). ---- */

/* Charge `bytes` on simulated GPU `gpu` to this process: CUDA_ERROR_OUT_OF_MEMORY when the
 * GPU's capacity is short (after dropping dead processes' memory). Takes the model lock. */
SIM_HIDDEN CUresult sim_mem_charge(uint32_t gpu, uint64_t bytes);
SIM_HIDDEN void sim_mem_uncharge(uint32_t gpu, uint64_t bytes);
/* Node-wide bytes in use on `gpu` and its capacity (drops dead processes' memory first). */
SIM_HIDDEN CUresult sim_mem_info(uint32_t gpu, uint64_t *used, uint64_t *capacity);
SIM_HIDDEN uint64_t sim_mem_capacity(uint32_t gpu); /* after sim_ensure_init */
/* With the model lock held: free the entries of processes that are gone; how many. */
SIM_HIDDEN unsigned sim_mem_reap(void);
/* The same, and the bytes in use on `gpu`, for segment s (with its lock held). */
SIM_HIDDEN unsigned sim_mem_reap_node(struct sim_shm *s);
SIM_HIDDEN uint64_t sim_mem_used_node(const struct sim_shm *s, uint32_t gpu);
/* Whether the process of entry `e` is still the live process that made it. */
SIM_HIDDEN int sim_mem_alive(const struct sim_mem_proc *e);
/* With the model lock held: whether this process is locked or checkpointed (its calls wait). */
SIM_HIDDEN int sim_mem_frozen(void);
SIM_HIDDEN void sim_mem_after_fork_child(void);
SIM_HIDDEN void sim_allocs_after_fork_child(void); /* sim_api_mem.c */
SIM_HIDDEN void sim_vmm_after_fork_child(void);    /* sim_vmm.c */
/* The GPU a device ordinal (CUmemLocation.id) names for this process, or -1. */
SIM_HIDDEN int sim_ordinal_gpu(int ordinal);

/* ---- The checkpoint API (sim_ckpt.c). ---- */

/* What krexsim_checkpoint's `op` asks (krexsim.h). */
enum sim_ckpt_op {
    SIM_CKPT_STATE = 0,
    SIM_CKPT_LOCK = 1,
    SIM_CKPT_CHECKPOINT = 2,
    SIM_CKPT_RESTORE = 3,
    SIM_CKPT_UNLOCK = 4
};
/* Do `op` to process pid of node s (timeout_ms: the lock's; 0 none); the CUresult, and in
 * *state the process's state after it (-1 when it has none: a pid with no live process). */
SIM_HIDDEN CUresult sim_ckpt(struct sim_shm *s, enum sim_ckpt_op op, int32_t pid,
                             unsigned timeout_ms, int *state);

/* ---- Per-process state (sim_ctx.c). ---- */

#define SIM_MAGIC_CTX 0x43545831U
#define SIM_MAGIC_STREAM 0x53545231U
#define SIM_MAGIC_EVENT 0x45564E31U
#define SIM_MAGIC_MODULE 0x4D4F4431U
#define SIM_MAGIC_FUNC 0x46554E31U
#define SIM_MAGIC_LIBRARY 0x4C494231U
#define SIM_MAGIC_KERNEL 0x4B524E31U
#define SIM_MAGIC_GRAPH 0x47524631U
#define SIM_MAGIC_GRAPH_EXEC 0x47455831U
#define SIM_MAGIC_DEAD 0xDEADDEADU

struct CUctx_st {
    uint32_t magic;   /* SIM_MAGIC_CTX, for as long as the struct lives (it never is freed) */
    int alive;        /* 0 once destroyed (or, for a primary context, released to zero) */
    int device;
    int primary;
    unsigned flags;
    uint64_t id;      /* serial, new at every (re)activation: tags this context's streams */
    uint32_t legacy_slot, legacy_gen; /* the legacy default stream, made on first use */
    struct CUctx_st *next_all;
    /* Device memory the context holds on its device, given back when it goes (under
     * sim_ctx.c's lock): its own (KREX_SIM_CTX_BYTES) and its local-memory reservation, the
     * largest local need of the kernels launched in it so far. */
    uint64_t mem_own, mem_local;
};

/* Streams, events, modules, functions, libraries, kernels, graphs and graph execs: one handle
 * type, kept in a free list once dead so that a stale handle reads as dead instead of as freed
 * memory. */
struct sim_handle {
    uint32_t magic;
    uint32_t flags;
    uint32_t slot, gen; /* shared-segment slot (streams, events) */
    struct CUctx_st *ctx;
    struct sim_handle *link;  /* free list; for a module or library, its functions or kernels */
    struct sim_handle *owner; /* a function's module, a kernel's library */
    /* A module, library or graph exec: the device memory it holds on GPU `gpu` once `loaded`
     * (a module or library under lazy loading is loaded at its first use). A function or
     * kernel: the local memory it needs at launch. */
    uint64_t bytes;
    uint32_t gpu;
    int32_t pid; /* the process charged (a forked child's copy holds nothing of its own) */
    int loaded;
};
struct CUstream_st { struct sim_handle h; };
struct CUevent_st { struct sim_handle h; };
struct CUmod_st { struct sim_handle h; };
struct CUfunc_st { struct sim_handle h; };
struct CUlib_st { struct sim_handle h; };
struct CUkern_st { struct sim_handle h; };
struct CUgraph_st { struct sim_handle h; };
struct CUgraphExec_st { struct sim_handle h; };

SIM_HIDDEN struct sim_handle *sim_handle_new(uint32_t magic);
SIM_HIDDEN void sim_handle_kill(struct sim_handle *h);

/* The calling thread's current context: CUDA_ERROR_INVALID_CONTEXT when there is none,
 * CUDA_ERROR_CONTEXT_IS_DESTROYED when it is dead. */
SIM_HIDDEN CUresult sim_ctx_current(struct CUctx_st **out);
SIM_HIDDEN CUresult sim_ctx_check(struct CUctx_st *c);
SIM_HIDDEN CUresult sim_ctx_create(CUcontext *pctx, unsigned flags, CUdevice dev);
SIM_HIDDEN CUresult sim_ctx_destroy(CUcontext ctx);
SIM_HIDDEN CUresult sim_ctx_push(CUcontext ctx);
SIM_HIDDEN CUresult sim_ctx_pop(CUcontext *pctx);
SIM_HIDDEN CUresult sim_ctx_set_current(CUcontext ctx);
SIM_HIDDEN CUcontext sim_ctx_top(void);
SIM_HIDDEN CUresult sim_ctx_synchronize(struct CUctx_st *c);
SIM_HIDDEN CUresult sim_primary_retain(CUcontext *pctx, CUdevice dev);
SIM_HIDDEN CUresult sim_primary_release(CUdevice dev);
SIM_HIDDEN CUresult sim_primary_state(CUdevice dev, unsigned *flags, int *active);
SIM_HIDDEN CUresult sim_check_device(CUdevice dev);
/* Raise context c's local-memory reservation to `need` bytes, charging the difference:
 * CUDA_ERROR_OUT_OF_MEMORY when it does not fit (the reservation stays as it was). */
SIM_HIDDEN CUresult sim_ctx_reserve_local(struct CUctx_st *c, uint64_t need);
/* The context whose stream `s` is (NULL and the special handles: the current context), checked
 * without the model lock, as a launch must know it before it queues anything. */
SIM_HIDDEN CUresult sim_stream_ctx(CUstream s, struct CUctx_st **out);

/* ---- Device memory that handles hold: modules, libraries, graph execs (sim_api_module.c). */

/* Unless `h` holds its memory already (`loaded`): charge `bytes` on context c's device and
 * record it in `h`. CUDA_ERROR_OUT_OF_MEMORY (and `h` unchanged) when they do not fit. Loading
 * a module or library into c is this with KREX_SIM_MODULE_BYTES. */
SIM_HIDDEN CUresult sim_handle_charge(struct sim_handle *h, struct CUctx_st *c, uint64_t bytes);
/* A new handle of `magic` holding `bytes` on context c's device (c NULL: nothing yet); nothing
 * is made when they do not fit. */
SIM_HIDDEN CUresult sim_handle_new_charged(uint32_t magic, struct CUctx_st *c, uint64_t bytes,
                                           struct sim_handle **out);
/* Let go of a module, library or graph exec: of its functions or kernels, of the memory it
 * holds (if this process charged it), of itself. */
SIM_HIDDEN void sim_handle_drop(struct sim_handle *h);
SIM_HIDDEN void sim_held_after_fork_child(void);
/* Set once a kernel of this process can need something at its launch (local memory, or its
 * library still to load): until then a launch never reads its function handle. */
SIM_HIDDEN extern int sim_launch_reads_fn;

/* Which stream a NULL handle means in the calling entry point. */
enum sim_null_stream { SIM_NULL_LEGACY, SIM_NULL_PER_THREAD };

/* A stream handle resolved to its shared slot; with the model lock held. Creates the legacy
 * or per-thread default stream on first use. */
struct sim_target {
    uint32_t slot, gen, gpu;
    struct CUctx_st *ctx;
};
SIM_HIDDEN CUresult sim_resolve_stream(CUstream s, enum sim_null_stream null_is,
                                       struct sim_target *out);

/* ---- Waiting (sim_wait.c): sleeps without the lock until the condition holds. ---- */

/* A condition over the model, evaluated with the lock held. */
typedef int (*sim_cond_fn)(void *arg);
/* Wait until cond(arg) holds, waking at each predicted job completion on `gpu` (SIM_NONE:
 * on any GPU). Bounded: the condition must depend on queued work, which is all finite. */
SIM_HIDDEN CUresult sim_wait(uint32_t gpu, sim_cond_fn cond, void *arg);
/* Wait until job `seq` of stream slot/gen has completed. */
SIM_HIDDEN CUresult sim_wait_stream(const struct sim_target *tg, uint64_t seq);
/* Resolve stream `s`, check w's event, and queue `w` there; while the job table is full,
 * wait (bounded) for room. *tg and *seq say where it went.
 * arrive_ns: the CLOCK_MONOTONIC time at which the job reached the device, or 0 for "as
 * late as possible in this call". Kernels and copies pass the time they entered the sim
 * (after moving the bytes, for copies), markers 0: so between an event record and the
 * launch after it, only the few instructions that separate the two calls elapse. */
SIM_HIDDEN CUresult sim_submit(CUstream s, enum sim_null_stream null_is,
                               const struct sim_work *w, int64_t arrive_ns,
                               struct sim_target *tg, uint64_t *seq);

/* ---- Process-wide bookkeeping. ---- */

SIM_HIDDEN extern pthread_mutex_t sim_proc_lock; /* handles, contexts, memory accounting */
SIM_HIDDEN void sim_ctx_after_fork_child(void);

/* Count one work-submitting call and feed the witness (sim_hooks.c). */
SIM_HIDDEN void sim_count_submission(void);
SIM_HIDDEN void sim_hooks_after_fork_child(void);
SIM_HIDDEN void sim_witness_map(void);

/* ---- Errors (sim_errors.c). ---- */
SIM_HIDDEN CUresult sim_cuGetErrorName(CUresult error, const char **pStr);
SIM_HIDDEN CUresult sim_cuGetErrorString(CUresult error, const char **pStr);

/* ---- The internal entry points, one per exported name (cuGetProcAddress hands these out). */
#include "sim_entries.h"

#endif /* KREX_SIM_H */
