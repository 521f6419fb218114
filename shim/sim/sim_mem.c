/*
 * sim_mem.c: device-memory accounting for the whole simulated node.
 *
 * Each simulated GPU has a capacity (KREX_SIM_MEM_BYTES, fixed in the segment by the process
 * that created the node). What is in use on a GPU is the sum, over the processes of the node,
 * of the bytes each holds there: one entry per process in the segment (pid and start time),
 * changed under the model lock, so that an allocation's check and its charge are one step for
 * the whole node. Nothing is derived from the entries, so a process that dies inside the lock
 * leaves nothing to repair: its entry is at worst one allocation off, and it goes when the
 * process does.
 *
 * The real driver frees a process's device memory when the process exits, however it exits.
 * Here a dead process's entry is dropped when an allocation would otherwise fail, at every
 * cuMemGetInfo, and at the model's periodic collection of dead owners (sim_reap_dead, every
 * 50 ms of any process's calls). A zombie (killed, not yet waited for) is dead for this
 * purpose, as its memory is gone on a real GPU too.
 *
 * An entry also carries its process's checkpoint state (sim_ckpt.c): a checkpoint moves its
 * `used` bytes to `swapped`, which are off the GPU and count nowhere, and a restore moves them
 * back. A dead process's entry goes with its swapped bytes.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "sim.h"

#define S sim_shm

static int sim_mem_self = -1;    /* this process's entry, once it has one */
static uint64_t sim_self_start;  /* this process's start time, 0 until read */

/* State ('R', 'S', 'Z', ...) and start time of process `pid` from /proc; 0 when it is gone,
 * -1 when /proc cannot tell. */
static int sim_proc_stat(int32_t pid, char *state, uint64_t *start)
{
    char path[64], buf[1024];
    if (pid > 0)
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    else
        snprintf(path, sizeof path, "/proc/self/stat");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT || errno == ESRCH ? 0 : -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return n == 0 ? 0 : -1;
    buf[n] = '\0';
    /* pid (comm) state ppid ... : the command may hold anything, so start after its last ')'. */
    const char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ' || !p[2])
        return -1;
    *state = p[2];
    /* Field 22, starttime: 19 fields after the state (field 3). */
    p += 2;
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p)
            return -1;
        p++;
    }
    unsigned long long v = 0;
    if (sscanf(p, "%llu", &v) != 1)
        return -1;
    *start = v;
    return 1;
}

static uint64_t sim_my_start(void)
{
    if (!sim_self_start) {
        char st;
        uint64_t t = 0;
        if (sim_proc_stat(0, &st, &t) == 1)
            sim_self_start = t;
    }
    return sim_self_start;
}

int sim_mem_alive(const struct sim_mem_proc *e)
{
    if (e->pid == (int32_t)sim_pid)
        return 1;
    char state = '?';
    uint64_t start = 0;
    int r = sim_proc_stat(e->pid, &state, &start);
    if (r == 0)
        return 0;
    if (r < 0) /* no /proc: the pid alone (as the rest of the model does) */
        return kill((pid_t)e->pid, 0) == 0 || errno == EPERM;
    if (state == 'Z' || state == 'X')
        return 0; /* exited (its memory is gone on a real GPU), not yet waited for */
    return e->start == 0 || start == e->start; /* else: the pid was reused */
}

unsigned sim_mem_reap_node(struct sim_shm *s)
{
    unsigned n = 0;
    for (uint32_t i = 0; i < SIM_MAX_MEM_PROCS; i++) {
        struct sim_mem_proc *e = &s->mem_procs[i];
        if (e->pid == 0 || sim_mem_alive(e))
            continue;
        uint64_t held = 0, swapped = 0;
        for (uint32_t g = 0; g < SIM_MAX_GPUS; g++) {
            held += e->used[g];
            swapped += e->swapped[g];
        }
        sim_debug("freeing %llu byte(s) of device memory (and %llu checkpointed) of dead "
                  "process %d",
                  (unsigned long long)held, (unsigned long long)swapped, (int)e->pid);
        memset(e, 0, sizeof *e);
        n++;
    }
    return n;
}

unsigned sim_mem_reap(void)
{
    return sim_mem_reap_node(S);
}

uint64_t sim_mem_used_node(const struct sim_shm *s, uint32_t gpu)
{
    uint64_t used = 0;
    for (uint32_t i = 0; i < SIM_MAX_MEM_PROCS; i++)
        if (s->mem_procs[i].pid != 0)
            used += s->mem_procs[i].used[gpu];
    return used;
}

static uint64_t sim_mem_used_locked(uint32_t gpu)
{
    return sim_mem_used_node(S, gpu);
}

/* This process's entry; with `make`, a new one if it has none (NULL when the table is full). */
static struct sim_mem_proc *sim_mem_entry(int make)
{
    uint64_t start = sim_my_start();
    if (sim_mem_self >= 0) {
        struct sim_mem_proc *e = &S->mem_procs[sim_mem_self];
        if (e->pid == (int32_t)sim_pid && e->start == start)
            return e;
        sim_mem_self = -1;
    }
    if (!make)
        return NULL;
    for (uint32_t i = 0; i < SIM_MAX_MEM_PROCS; i++) {
        struct sim_mem_proc *e = &S->mem_procs[i];
        if (e->pid == 0) {
            memset(e, 0, sizeof *e);
            e->pid = (int32_t)sim_pid;
            e->start = start;
            sim_mem_self = (int)i;
            return e;
        }
    }
    return NULL;
}

CUresult sim_mem_charge(uint32_t gpu, uint64_t bytes)
{
    if (gpu >= SIM_MAX_GPUS)
        return CUDA_ERROR_INVALID_VALUE;
    if (bytes == 0)
        return CUDA_SUCCESS; /* what the driver takes for itself is 0 unless configured: no
                              * lock, and no entry for a process that holds nothing */
    CUresult r = sim_model_lock_raw();
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t cap = S->mem_capacity[gpu];
    uint64_t used = sim_mem_used_locked(gpu);
    if ((used > cap || bytes > cap - used) && sim_mem_reap() > 0)
        used = sim_mem_used_locked(gpu);
    if (used > cap || bytes > cap - used) {
        sim_model_unlock();
        sim_debug("out of memory on simulated GPU %u: %llu byte(s) asked, %llu of %llu in use",
                  gpu, (unsigned long long)bytes, (unsigned long long)used,
                  (unsigned long long)cap);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct sim_mem_proc *e = sim_mem_entry(1);
    if (!e && sim_mem_reap() > 0)
        e = sim_mem_entry(1);
    if (e)
        e->used[gpu] += bytes;
    sim_model_unlock();
    if (!e) {
        sim_warn("more than %u processes hold device memory on the simulated node; this "
                 "allocation fails",
                 SIM_MAX_MEM_PROCS);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

void sim_mem_uncharge(uint32_t gpu, uint64_t bytes)
{
    if (gpu >= SIM_MAX_GPUS || bytes == 0 || sim_model_lock_raw() != CUDA_SUCCESS)
        return;
    struct sim_mem_proc *e = sim_mem_entry(0);
    if (e) {
        e->used[gpu] -= bytes < e->used[gpu] ? bytes : e->used[gpu];
        /* An entry that is not RUNNING stays, as its state is in it (its process's calls wait
         * in sim_model_lock_raw meanwhile, so this is only a guard). */
        int any = e->state != CU_PROCESS_STATE_RUNNING || e->busy != 0;
        for (uint32_t g = 0; g < SIM_MAX_GPUS; g++)
            any |= e->used[g] != 0 || e->swapped[g] != 0;
        if (!any) { /* holds nothing: let another process have the entry */
            memset(e, 0, sizeof *e);
            sim_mem_self = -1;
        }
    }
    sim_model_unlock();
}

CUresult sim_mem_info(uint32_t gpu, uint64_t *used, uint64_t *capacity)
{
    if (gpu >= SIM_MAX_GPUS)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = sim_model_lock_raw();
    if (r != CUDA_SUCCESS)
        return r;
    sim_mem_reap();
    *used = sim_mem_used_locked(gpu);
    *capacity = S->mem_capacity[gpu];
    sim_model_unlock();
    return CUDA_SUCCESS;
}

int sim_mem_frozen(void)
{
    const struct sim_mem_proc *e = sim_mem_entry(0);
    return e &&
           (e->state == CU_PROCESS_STATE_LOCKED || e->state == CU_PROCESS_STATE_CHECKPOINTED);
}

uint64_t sim_mem_capacity(uint32_t gpu)
{
    return gpu < SIM_MAX_GPUS && S ? __atomic_load_n(&S->mem_capacity[gpu], __ATOMIC_RELAXED)
                                   : 0;
}

int sim_ordinal_gpu(int ordinal)
{
    if (sim_ensure_init() != CUDA_SUCCESS)
        return -1;
    if (ordinal < 0 || (unsigned)ordinal >= sim_cfg.n_visible)
        return -1;
    return sim_cfg.visible[ordinal];
}

void sim_mem_after_fork_child(void)
{
    /* The child holds none of its parent's device memory (the real driver's state does not
     * survive fork either): a fresh entry at its first allocation, and no inherited pointers. */
    sim_mem_self = -1;
    sim_self_start = 0;
    sim_allocs_after_fork_child();
    sim_vmm_after_fork_child();
}
