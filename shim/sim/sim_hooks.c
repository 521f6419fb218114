/*
 * sim_hooks.c: test hooks. krexsim_submissions counts this process's work-submitting calls;
 * the witness (see krexsim.h) lets KREX's property tests check, across processes, that every
 * submission happened while its tenant held the GPU.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sim.h"

static unsigned long long sim_submissions;
static struct krexsim_witness *sim_witness;

/* Called once, from initialisation. */
void sim_witness_map(void)
{
    const char *path = sim_cfg.witness_path;
    if (!path[0])
        return;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        sim_warn("cannot open the witness %s: %s; no witness in this process", path,
                 strerror(errno));
        return;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < sizeof(struct krexsim_witness)) {
        sim_warn("the witness %s is smaller than %zu bytes; no witness in this process", path,
                 sizeof(struct krexsim_witness));
        close(fd);
        return;
    }
    void *p = mmap(NULL, sizeof(struct krexsim_witness), PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                   0);
    close(fd);
    if (p == MAP_FAILED) {
        sim_warn("cannot map the witness %s: %s; no witness in this process", path,
                 strerror(errno));
        return;
    }
    sim_witness = p;
    sim_debug("witness %s mapped, tenant %u", path, (unsigned)sim_cfg.tenant);
}

void sim_count_submission(void)
{
    sim_ensure_init(); /* maps the witness, whatever becomes of the segment */
    __atomic_add_fetch(&sim_submissions, 1, __ATOMIC_SEQ_CST);
    struct krexsim_witness *w = sim_witness;
    if (!w)
        return;
    __atomic_add_fetch(&w->submissions, 1, __ATOMIC_SEQ_CST);
    uint32_t owner = __atomic_load_n(&w->granted, __ATOMIC_SEQ_CST);
    if (owner != 0 && owner != sim_cfg.tenant)
        __atomic_add_fetch(&w->violations, 1, __ATOMIC_SEQ_CST);
}

void sim_hooks_after_fork_child(void)
{
    __atomic_store_n(&sim_submissions, 0, __ATOMIC_SEQ_CST);
}

unsigned long long sim_krexsim_submissions(void)
{
    return __atomic_load_n(&sim_submissions, __ATOMIC_SEQ_CST);
}
SIM_EXPORT(krexsim_submissions);

/* A node's segment mapped, read-write if `writable` (NULL if there is none of this build's
 * size, magic and version, or a writable one is not ready yet); the caller unmaps it. */
static struct sim_shm *map_node_rw(const char *shm_name, int writable)
{
    int fd = shm_open(shm_name, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC, 0);
    if (fd < 0)
        return NULL;
    struct stat st;
    /* Not another uid's (nor one anyone may write): its pids would be taken for our GPUs'. */
    if (fstat(fd, &st) != 0 || (size_t)st.st_size != sizeof(struct sim_shm) ||
        !sim_shm_ours(&st)) {
        close(fd);
        return NULL;
    }
    struct sim_shm *s = mmap(NULL, sizeof *s, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                             MAP_SHARED, fd, 0);
    close(fd);
    if (s == MAP_FAILED)
        return NULL;
    /* A writer takes the node's lock, which its creator sets up before `ready`. */
    if (s->magic != SIM_SHM_MAGIC || s->version != SIM_SHM_VERSION ||
        (writable && !__atomic_load_n(&s->ready, __ATOMIC_ACQUIRE))) {
        munmap(s, sizeof *s);
        return NULL;
    }
    return s;
}

/* A node's segment mapped read-only (NULL if it cannot be, or if `gpu` is not one of its
 * GPUs), for the controller's snapshots below; the caller unmaps it. */
static const struct sim_shm *map_node(const char *shm_name, unsigned gpu)
{
    return gpu < SIM_MAX_GPUS ? map_node_rw(shm_name, 0) : NULL;
}

/* The processes that hold streams on simulated GPU `gpu` of the node `shm_name` (distinct
 * live pids, at most `max` of them into `pids`); -1 if the node cannot be read. For the
 * controller, which looks for GPU users that are not its tenants. It reads the node without
 * its lock: a snapshot good enough to find a process that stays. */
int sim_krexsim_users(const char *shm_name, unsigned gpu, int *pids, int max)
{
    const struct sim_shm *s = map_node(shm_name, gpu);
    if (!s)
        return -1;
    int n = 0;
    /* A process creating a context on this GPU (NVML lists such a process too). */
    uint32_t creator = __atomic_load_n(&s->ctx_holder, __ATOMIC_ACQUIRE);
    if (creator && max > 0 && __atomic_load_n(&s->ctx_holder_gpu, __ATOMIC_ACQUIRE) == gpu + 1 &&
        (kill((pid_t)creator, 0) == 0 || errno == EPERM))
        pids[n++] = (int)creator;
    for (unsigned i = 0; i < SIM_MAX_STREAMS && n < max; i++) {
        int32_t owner = __atomic_load_n(&s->streams[i].owner, __ATOMIC_RELAXED);
        if (owner <= 0 || s->streams[i].gpu != gpu || s->streams[i].destroyed)
            continue;
        if (kill(owner, 0) != 0 && errno != EPERM)
            continue;
        int seen = 0;
        for (int j = 0; j < n; j++)
            seen |= pids[j] == owner;
        if (!seen)
            pids[n++] = owner;
    }
    munmap((void *)s, sizeof *s);
    return n;
}
SIM_EXPORT(krexsim_users);

/* Device memory held on simulated GPU `gpu` of node `shm_name`, per live process: up to `max`
 * pids and their bytes; returns how many, or -1 if the node cannot be read. A snapshot read
 * without the node's lock (as NVML's per-process list is one); a dead process's entry is left
 * out even before the node drops it. */
int sim_krexsim_mem_users(const char *shm_name, unsigned gpu, int *pids,
                          unsigned long long *bytes, int max)
{
    const struct sim_shm *s = map_node(shm_name, gpu);
    if (!s)
        return -1;
    int n = 0;
    for (unsigned i = 0; i < SIM_MAX_MEM_PROCS && n < max; i++) {
        int32_t pid = __atomic_load_n(&s->mem_procs[i].pid, __ATOMIC_RELAXED);
        uint64_t used = __atomic_load_n(&s->mem_procs[i].used[gpu], __ATOMIC_RELAXED);
        if (pid <= 0 || used == 0)
            continue;
        if (kill(pid, 0) != 0 && errno != EPERM)
            continue;
        pids[n] = pid;
        bytes[n] = used;
        n++;
    }
    munmap((void *)s, sizeof *s);
    return n;
}
SIM_EXPORT(krexsim_mem_users);

static int add_pid(int *pids, int n, int max, int pid)
{
    for (int j = 0; j < n; j++)
        if (pids[j] == pid)
            return n;
    if (n < max)
        pids[n++] = pid;
    return n;
}

/* The processes whose work on simulated GPU `gpu` of node `shm_name` the driver's own record
 * shows: queued or running now (as of the node's latest update: every call into the driver
 * brings it up to date), and with since_ns > 0 also completed at or after CLOCK_MONOTONIC time
 * since_ns. What a tenant's drain acknowledgement claims is checked against this. Up to `max`
 * distinct pids into `pids`; returns how many, or -1 if the node cannot be read. *lost = 1 when
 * the record gave up the entry of a process that completed work at or after since_ns (more than
 * SIM_DONE_PROCS processes completed work on the GPU since): who that was is unknown. Read
 * without the node's lock, as krexsim_users is. */
int sim_krexsim_busy(const char *shm_name, unsigned gpu, long long since_ns, int *pids, int max,
                     int *lost)
{
    if (lost)
        *lost = 0;
    const struct sim_shm *s = map_node(shm_name, gpu);
    if (!s)
        return -1;
    int n = 0;
    for (unsigned i = 0; i < SIM_MAX_STREAMS; i++) {
        int32_t owner = __atomic_load_n(&s->streams[i].owner, __ATOMIC_RELAXED);
        if (owner <= 0 || s->streams[i].gpu != gpu ||
            __atomic_load_n(&s->streams[i].head, __ATOMIC_RELAXED) == SIM_NONE)
            continue;
        if (kill(owner, 0) != 0 && errno != EPERM)
            continue; /* its jobs are dropped, not run */
        n = add_pid(pids, n, max, owner);
    }
    if (since_ns > 0) {
        const struct sim_gpu_done *d = &s->done[gpu];
        int64_t since_t = (int64_t)since_ns - s->epoch_ns; /* model time */
        for (unsigned i = 0; i < SIM_DONE_PROCS; i++) {
            int32_t pid = __atomic_load_n(&d->procs[i].pid, __ATOMIC_ACQUIRE);
            int64_t t = __atomic_load_n(&d->procs[i].t_ns, __ATOMIC_ACQUIRE);
            if (pid > 0 && t >= since_t &&
                __atomic_load_n(&d->procs[i].pid, __ATOMIC_ACQUIRE) == pid)
                n = add_pid(pids, n, max, pid);
        }
        /* Last: an entry that changed hands while it was read raised this first. */
        int64_t evicted = __atomic_load_n(&d->evicted_ns, __ATOMIC_ACQUIRE);
        if (lost && evicted > 0 && evicted >= since_t)
            *lost = 1;
    }
    munmap((void *)s, sizeof *s);
    return n;
}
SIM_EXPORT(krexsim_busy);

/* The checkpoint API for a process that is not on the node (the krex daemon): op (enum
 * sim_ckpt_op: 0 state, 1 lock, 2 checkpoint, 3 restore, 4 unlock) on process pid of node
 * shm_name, with the lock's timeout_ms (0: none), as the cuCheckpointProcess* entry points do
 * it (sim_ckpt.c). Returns the CUresult (CUDA_ERROR_NOT_INITIALIZED when the node cannot be
 * mapped); *state (if not NULL) is the process's state after it, -1 when it has none. The
 * node is mapped for the call alone, so any number of calls leave nothing mapped. */
int sim_krexsim_checkpoint(const char *shm_name, int op, int pid, unsigned timeout_ms,
                           int *state)
{
    int st = -1;
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (shm_name && op >= SIM_CKPT_STATE && op <= SIM_CKPT_UNLOCK) {
        struct sim_shm *s = map_node_rw(shm_name, 1);
        r = CUDA_ERROR_NOT_INITIALIZED;
        if (s) {
            r = sim_ckpt(s, (enum sim_ckpt_op)op, (int32_t)pid, timeout_ms, &st);
            munmap(s, sizeof *s);
        }
    }
    if (state)
        *state = st;
    return (int)r;
}
SIM_EXPORT(krexsim_checkpoint);
