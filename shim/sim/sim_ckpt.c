/*
 * sim_ckpt.c: the driver's checkpoint API (cuCheckpointProcess*, CUDA 12.8 and later), with
 * which one process locks another CUDA process, takes its device memory off the GPU
 * (checkpoint), puts it back (restore) and unlocks it. The state lives in the process's memory
 * entry in the node's segment (struct sim_mem_proc), so any process can act on any other: the
 * node's processes through the cuda.h entry points below, the krex daemon, which is on no node,
 * through krexsim_checkpoint (sim_hooks.c), which maps the node by name. All of it works on an
 * explicit segment for that reason.
 *
 *   lock        RUNNING -> LOCKED once the process has no job queued or running on any GPU,
 *               and is not creating a context: that stands for "no call of it in progress in
 *               the driver" (a process inside cuCtxSynchronize waits for its jobs). With a
 *               timeout that passes first: CUDA_ERROR_NOT_READY, still RUNNING. A locked
 *               process's calls into the node wait (sim_model_lock_raw) until it runs again.
 *   checkpoint  LOCKED -> CHECKPOINTED after KREX_SIM_CHECKPOINT_S_PER_GIB (0.47, measured on
 *               an H100) per GiB it holds: its bytes then move from `used` to `swapped`.
 *   restore     CHECKPOINTED -> LOCKED: its swapped bytes are charged back at once, if every
 *               GPU has room for them (else CUDA_ERROR_OUT_OF_MEMORY, still CHECKPOINTED), then
 *               KREX_SIM_RESTORE_S_PER_GIB (0.17) per GiB pass.
 *   unlock      LOCKED -> RUNNING.
 * Any other transition is CUDA_ERROR_ILLEGAL_STATE; a pid without a live entry (one that holds
 * no device memory, or is gone) CUDA_ERROR_INVALID_VALUE, except for the state, which is
 * RUNNING for a live process without one.
 *
 * The modelled times pass outside the model lock, with the entry marked busy (the caller's pid
 * and the step), so that nothing else takes it meanwhile: a second caller's step waits for the
 * first. A caller that dies during its step leaves the entry as that step left it: a checkpoint
 * has moved nothing (LOCKED), a restore has charged everything (LOCKED).
 */
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <unistd.h>

#include "sim.h"

#define SIM_CKPT_POLL_NS 1000000LL /* how often a waiting step looks again */
#define SIM_GIB (1024.0 * 1024.0 * 1024.0)

_Static_assert(sizeof(CUcheckpointLockArgs) == 64, "cuda.h's CUcheckpointLockArgs");
_Static_assert(sizeof(CUcheckpointRestoreArgs) == 64, "cuda.h's CUcheckpointRestoreArgs");
_Static_assert(offsetof(CUcheckpointRestoreArgs, gpuPairsCount) == 8,
               "cuda.h's CUcheckpointRestoreArgs");

static int sim_pid_exists(int32_t pid)
{
    return pid > 0 && (kill((pid_t)pid, 0) == 0 || errno == EPERM);
}

/* The live entry of process pid on node s, or NULL; with s's lock held. A caller that died
 * in a step on it is forgotten here (see the top). */
static struct sim_mem_proc *sim_ckpt_entry(struct sim_shm *s, int32_t pid)
{
    for (uint32_t i = 0; i < SIM_MAX_MEM_PROCS; i++) {
        struct sim_mem_proc *e = &s->mem_procs[i];
        if (e->pid != pid || !sim_mem_alive(e))
            continue;
        if (e->busy && !sim_pid_exists(e->busy)) {
            if (e->busy_op == SIM_CKPT_RESTORE)
                e->state = CU_PROCESS_STATE_LOCKED;
            e->busy = 0;
            e->busy_op = 0;
        }
        return e;
    }
    return NULL;
}

/* Take s's lock and pid's live entry, once no other caller's step is under way on it. With
 * CUDA_SUCCESS the lock is held. */
static CUresult sim_ckpt_take(struct sim_shm *s, int32_t pid, struct sim_mem_proc **out)
{
    for (;;) {
        CUresult r = sim_node_lock(s);
        if (r != CUDA_SUCCESS)
            return r;
        struct sim_mem_proc *e = sim_ckpt_entry(s, pid);
        if (!e) {
            sim_node_unlock(s);
            return CUDA_ERROR_INVALID_VALUE;
        }
        if (!e->busy) {
            *out = e;
            return CUDA_SUCCESS;
        }
        sim_node_unlock(s);
        sim_sleep_until(sim_mono_ns() + SIM_CKPT_POLL_NS);
    }
}

/* Whether process pid is inside a driver call, as far as the model can tell: with a job
 * queued or running on a GPU (s advanced to now), or creating a context. */
static int sim_ckpt_in_call(struct sim_shm *s, int32_t pid)
{
    if (__atomic_load_n(&s->ctx_holder, __ATOMIC_ACQUIRE) == (uint32_t)pid)
        return 1;
    for (uint32_t i = 0; i < SIM_MAX_STREAMS; i++)
        if (s->streams[i].owner == pid && s->streams[i].head != SIM_NONE)
            return 1;
    return 0;
}

static CUresult sim_ckpt_lock(struct sim_shm *s, int32_t pid, unsigned timeout_ms, int *state)
{
    int64_t deadline = timeout_ms ? sim_mono_ns() + (int64_t)timeout_ms * 1000000LL : 0;
    for (;;) {
        struct sim_mem_proc *e;
        CUresult r = sim_ckpt_take(s, pid, &e);
        if (r != CUDA_SUCCESS)
            return r;
        *state = (int)e->state;
        if (e->state != CU_PROCESS_STATE_RUNNING) {
            sim_node_unlock(s);
            return SIM_CUDA_ERROR_ILLEGAL_STATE;
        }
        sim_node_advance(s, sim_mono_ns());
        int in_call = sim_ckpt_in_call(s, pid);
        if (!in_call)
            e->state = CU_PROCESS_STATE_LOCKED;
        *state = (int)e->state;
        sim_node_unlock(s);
        if (!in_call) {
            sim_debug("locked process %d", (int)pid);
            return CUDA_SUCCESS;
        }
        int64_t now = sim_mono_ns();
        if (deadline && now >= deadline)
            return CUDA_ERROR_NOT_READY;
        int64_t wake = now + SIM_CKPT_POLL_NS;
        sim_sleep_until(deadline && deadline < wake ? deadline : wake);
    }
}

/* Let `seconds_per_gib` (a variable of the caller's environment, default dflt) times `bytes`
 * pass: the modelled time of a checkpoint or restore. */
static void sim_ckpt_take_time(const char *var, double dflt, uint64_t bytes)
{
    double s_per_gib = sim_env_number(var, dflt, 0, 1e6);
    double ns = s_per_gib * 1e9 * ((double)bytes / SIM_GIB);
    if (ns >= 1)
        sim_sleep_until(sim_mono_ns() + (int64_t)ns);
}

/* The second half of a step: back under the lock, the entry if it is still the one this caller
 * marked busy (NULL, and the lock released, when its process died meanwhile). */
static struct sim_mem_proc *sim_ckpt_retake(struct sim_shm *s, int32_t pid)
{
    if (sim_node_lock(s) != CUDA_SUCCESS)
        return NULL;
    struct sim_mem_proc *e = sim_ckpt_entry(s, pid);
    if (!e || e->busy != (int32_t)getpid()) {
        sim_node_unlock(s);
        return NULL;
    }
    e->busy = 0;
    e->busy_op = 0;
    return e;
}

static CUresult sim_ckpt_checkpoint(struct sim_shm *s, int32_t pid, int *state)
{
    struct sim_mem_proc *e;
    CUresult r = sim_ckpt_take(s, pid, &e);
    if (r != CUDA_SUCCESS)
        return r;
    *state = (int)e->state;
    if (e->state != CU_PROCESS_STATE_LOCKED) {
        sim_node_unlock(s);
        return SIM_CUDA_ERROR_ILLEGAL_STATE;
    }
    uint64_t bytes = 0;
    for (uint32_t g = 0; g < SIM_MAX_GPUS; g++)
        bytes += e->used[g];
    e->busy = (int32_t)getpid();
    e->busy_op = SIM_CKPT_CHECKPOINT;
    sim_node_unlock(s);
    /* The memory goes at the end: a real checkpoint frees it once copied to the host. */
    sim_ckpt_take_time("KREX_SIM_CHECKPOINT_S_PER_GIB", 0.47, bytes);
    e = sim_ckpt_retake(s, pid);
    if (!e) {
        *state = -1;
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (uint32_t g = 0; g < SIM_MAX_GPUS; g++) {
        e->swapped[g] += e->used[g];
        e->used[g] = 0;
    }
    e->state = CU_PROCESS_STATE_CHECKPOINTED;
    *state = (int)e->state;
    sim_node_unlock(s);
    sim_debug("checkpointed process %d: %llu byte(s) off the GPU", (int)pid,
              (unsigned long long)bytes);
    return CUDA_SUCCESS;
}

/* Whether every GPU of s has room for e's swapped bytes; with s's lock held. */
static int sim_ckpt_fits(const struct sim_shm *s, const struct sim_mem_proc *e)
{
    for (uint32_t g = 0; g < SIM_MAX_GPUS; g++) {
        uint64_t cap = s->mem_capacity[g], used = sim_mem_used_node(s, g);
        if (e->swapped[g] && (used > cap || e->swapped[g] > cap - used))
            return 0;
    }
    return 1;
}

static CUresult sim_ckpt_restore(struct sim_shm *s, int32_t pid, int *state)
{
    struct sim_mem_proc *e;
    CUresult r = sim_ckpt_take(s, pid, &e);
    if (r != CUDA_SUCCESS)
        return r;
    *state = (int)e->state;
    if (e->state != CU_PROCESS_STATE_CHECKPOINTED) {
        sim_node_unlock(s);
        return SIM_CUDA_ERROR_ILLEGAL_STATE;
    }
    /* The memory is taken at the start, in one step for the whole node, as an allocation
     * is: a restore that began cannot find it gone at the end. What the real driver does when
     * the GPU is short is not known (docs/simulator.md). */
    if (!sim_ckpt_fits(s, e) && (sim_mem_reap_node(s) == 0 || !sim_ckpt_fits(s, e))) {
        sim_node_unlock(s);
        sim_debug("cannot restore process %d: its GPUs are short of memory", (int)pid);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uint64_t bytes = 0;
    for (uint32_t g = 0; g < SIM_MAX_GPUS; g++) {
        bytes += e->swapped[g];
        e->used[g] += e->swapped[g];
        e->swapped[g] = 0;
    }
    e->busy = (int32_t)getpid();
    e->busy_op = SIM_CKPT_RESTORE;
    sim_node_unlock(s);
    sim_ckpt_take_time("KREX_SIM_RESTORE_S_PER_GIB", 0.17, bytes);
    e = sim_ckpt_retake(s, pid);
    if (!e) {
        *state = -1;
        return CUDA_ERROR_INVALID_VALUE;
    }
    e->state = CU_PROCESS_STATE_LOCKED;
    *state = (int)e->state;
    sim_node_unlock(s);
    sim_debug("restored process %d: %llu byte(s) back on the GPU", (int)pid,
              (unsigned long long)bytes);
    return CUDA_SUCCESS;
}

static CUresult sim_ckpt_unlock(struct sim_shm *s, int32_t pid, int *state)
{
    struct sim_mem_proc *e;
    CUresult r = sim_ckpt_take(s, pid, &e);
    if (r != CUDA_SUCCESS)
        return r;
    if (e->state == CU_PROCESS_STATE_LOCKED)
        e->state = CU_PROCESS_STATE_RUNNING;
    else
        r = SIM_CUDA_ERROR_ILLEGAL_STATE;
    *state = (int)e->state;
    sim_node_unlock(s);
    return r;
}

/* The state alone: no waiting for another caller's step (what that step started from shows,
 * as the real driver's state changes when a step returns). */
static CUresult sim_ckpt_state(struct sim_shm *s, int32_t pid, int *state)
{
    CUresult r = sim_node_lock(s);
    if (r != CUDA_SUCCESS)
        return r;
    const struct sim_mem_proc *e = pid > 0 ? sim_ckpt_entry(s, pid) : NULL;
    if (e)
        *state = (int)e->state;
    sim_node_unlock(s);
    if (e)
        return CUDA_SUCCESS;
    if (!sim_pid_exists(pid))
        return CUDA_ERROR_INVALID_VALUE;
    *state = CU_PROCESS_STATE_RUNNING; /* holds no device memory: nothing to lock */
    return CUDA_SUCCESS;
}

CUresult sim_ckpt(struct sim_shm *s, enum sim_ckpt_op op, int32_t pid, unsigned timeout_ms,
                  int *state)
{
    *state = -1;
    if (pid <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    switch (op) {
    case SIM_CKPT_STATE:
        return sim_ckpt_state(s, pid, state);
    case SIM_CKPT_LOCK:
        return sim_ckpt_lock(s, pid, timeout_ms, state);
    case SIM_CKPT_CHECKPOINT:
        return sim_ckpt_checkpoint(s, pid, state);
    case SIM_CKPT_RESTORE:
        return sim_ckpt_restore(s, pid, state);
    case SIM_CKPT_UNLOCK:
        return sim_ckpt_unlock(s, pid, state);
    }
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---- The entry points, for the processes of this process's node. They never wait while the
 * calling process is itself locked (they take the lock as krexsim_checkpoint does). ---- */

CUresult sim_cuCheckpointProcessGetState(int pid, CUprocessState *state)
{
    if (!state)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = sim_ensure_init();
    if (r != CUDA_SUCCESS)
        return r;
    int st;
    r = sim_ckpt(sim_shm, SIM_CKPT_STATE, pid, 0, &st);
    if (r == CUDA_SUCCESS)
        *state = (CUprocessState)st;
    return r;
}
SIM_EXPORT(cuCheckpointProcessGetState);

static CUresult sim_ckpt_call(enum sim_ckpt_op op, int pid, unsigned timeout_ms)
{
    CUresult r = sim_ensure_init();
    if (r != CUDA_SUCCESS)
        return r;
    int st;
    return sim_ckpt(sim_shm, op, pid, timeout_ms, &st);
}

/* args may be NULL (no timeout); its reserved fields are not checked. */
CUresult sim_cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args)
{
    return sim_ckpt_call(SIM_CKPT_LOCK, pid, args ? args->timeoutMs : 0);
}
SIM_EXPORT(cuCheckpointProcessLock);

CUresult sim_cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args)
{
    (void)args;
    return sim_ckpt_call(SIM_CKPT_CHECKPOINT, pid, 0);
}
SIM_EXPORT(cuCheckpointProcessCheckpoint);

/* Restoring onto other GPUs (gpuPairs) is not modelled. */
CUresult sim_cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args)
{
    if (args && (args->gpuPairs || args->gpuPairsCount))
        return CUDA_ERROR_NOT_SUPPORTED;
    return sim_ckpt_call(SIM_CKPT_RESTORE, pid, 0);
}
SIM_EXPORT(cuCheckpointProcessRestore);

CUresult sim_cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args)
{
    (void)args;
    return sim_ckpt_call(SIM_CKPT_UNLOCK, pid, 0);
}
SIM_EXPORT(cuCheckpointProcessUnlock);

/* The simulator restores in the caller's thread: there is no restore thread to name. */
CUresult sim_cuCheckpointProcessGetRestoreThreadId(int pid, int *tid)
{
    (void)pid;
    (void)tid;
    return CUDA_ERROR_NOT_SUPPORTED;
}
SIM_EXPORT(cuCheckpointProcessGetRestoreThreadId);
