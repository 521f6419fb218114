/*
 * krexsim.h: the test hooks of the simulated GPU (libcuda.so.1 built from shim/sim/).
 *
 * Tests include this header; the simulated driver exports krexsim_submissions and honours
 * the witness file described below. Nothing here exists in the real driver.
 */
#ifndef KREXSIM_H
#define KREXSIM_H

#include <stdint.h>

/*
 * The witness: when the environment variable KREX_SIM_WITNESS names a file (at least 64
 * bytes, created by the test), the simulated driver maps it once per process and, on every
 * work-submitting call (launches, graph launches, event records, copies, sets, host
 * functions), does with sequentially consistent atomics:
 *     submissions += 1;
 *     owner = granted;
 *     if (owner != 0 && owner != my_tenant) violations += 1;
 * where my_tenant is the integer in KREX_TENANT (0 when unset). The test sets `granted` to
 * the tenant that currently owns the GPU; a violation is a submission by anyone else.
 */
struct krexsim_witness {
    uint32_t granted;
    uint32_t pad;
    uint64_t submissions;
    uint64_t violations;
};

/*
 * Lock holders: the simulated node keeps its shared state under two process-shared locks (the
 * real driver has no such cross-process lock). A process frozen while holding one would stall
 * every other process on the node, the region's owner included. So the segment publishes, at
 * fixed byte offsets, the pid holding each lock (0 when free), and a controller that freezes
 * tenants on a simulated node thaws and refreezes any frozen holder.
 */
#define KREXSIM_MODEL_HOLDER_OFFSET 32
#define KREXSIM_CTX_HOLDER_OFFSET 36
/* The locks themselves (robust mutexes: their first 32-bit word holds the owner's thread id
 * while taken, which also covers the instants before and after the holder fields are set). */
#define KREXSIM_MODEL_LOCK_OFFSET 40
#define KREXSIM_CTX_LOCK_OFFSET 80

/* Work-submitting calls this process has made into the simulated driver (reset by fork). */
unsigned long long krexsim_submissions(void);

/* Processes holding streams on simulated GPU `gpu` of node `shm_name`: distinct live pids, at
 * most `max`, into `pids`; returns how many, or -1 if the node cannot be read. */
int krexsim_users(const char *shm_name, unsigned gpu, int *pids, int max);

/* Processes holding device memory on simulated GPU `gpu` of node `shm_name`: up to `max` live
 * pids into `pids` and the bytes each holds there into `bytes` (like the per-process list of
 * nvidia-smi); returns how many, or -1 if the node cannot be read. */
int krexsim_mem_users(const char *shm_name, unsigned gpu, int *pids, unsigned long long *bytes,
                      int max);

/* Processes whose work on simulated GPU `gpu` of node `shm_name` the simulated driver's own
 * record shows: queued or running now, and with since_ns > 0 also completed at or after
 * CLOCK_MONOTONIC time since_ns. Up to `max` distinct pids into `pids`; returns how many, or -1
 * if the node cannot be read. *lost = 1 when the record dropped (for want of room) a process
 * that completed work at or after since_ns. The daemon checks a sibling's drain acknowledgement
 * against it (docs/security.md). */
int krexsim_busy(const char *shm_name, unsigned gpu, long long since_ns, int *pids, int max,
                 int *lost);

/* The driver's checkpoint API (cuCheckpointProcess*) for a process that is not on node
 * `shm_name` (the daemon): `op` 0 state, 1 lock (timeout_ms: 0 none), 2 checkpoint, 3 restore,
 * 4 unlock, on process `pid`. Returns the CUresult (CUDA_ERROR_NOT_INITIALIZED if the node
 * cannot be mapped); *state, if not NULL, is the process's CUprocessState after the call (-1
 * when it has none). docs/simulator.md says what is modelled. */
int krexsim_checkpoint(const char *shm_name, int op, int pid, unsigned timeout_ms, int *state);

#endif /* KREXSIM_H */
