/*
 * sim_shm.c: the simulated node's shared segment, and the library's one-time initialisation.
 *
 * Every process that names the same KREX_SIM_SHM sees the same simulated GPUs. The first one
 * creates the segment (O_CREAT|O_EXCL), lays it out and sets `ready` last; the others wait
 * (bounded) for `ready`, then check magic, version and size before trusting anything in it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "krexsim.h"
#include "sim.h"

struct sim_shm *sim_shm;
pid_t sim_pid;

#define SIM_READY_WAIT_NS 2000000000LL /* how long to wait for another creator */
#define SIM_POLL_NS 1000000LL
#define SIM_FIX "remove it (rm /dev/shm%s) or set KREX_SIM_SHM to another name"

void sim_shm_init_layout(struct sim_shm *s)
{
    s->magic = SIM_SHM_MAGIC;
    s->version = SIM_SHM_VERSION;
    s->size = sizeof *s;
    s->epoch_ns = sim_mono_ns();
    s->last_reap_ns = s->epoch_ns;
    sim_robust_init(&s->model_lock);
    sim_robust_init(&s->ctx_lock);
    for (uint32_t g = 0; g < SIM_MAX_GPUS; g++) {
        s->gpus[g].t = 0;
        s->gpus[g].n_active = 0;
    }
    for (uint32_t i = 0; i < SIM_MAX_JOBS; i++) {
        s->jobs[i].next = i + 1 < SIM_MAX_JOBS ? i + 1 : SIM_NONE;
        s->jobs[i].stream = SIM_NONE;
    }
    for (uint32_t i = 0; i < SIM_MAX_STREAMS; i++)
        s->streams[i].next_free = i + 1 < SIM_MAX_STREAMS ? i + 1 : SIM_NONE;
    for (uint32_t i = 0; i < SIM_MAX_EVENTS; i++)
        s->events[i].next_free = i + 1 < SIM_MAX_EVENTS ? i + 1 : SIM_NONE;
    s->free_job = 0;
    s->free_stream = 0;
    s->free_event = 0;
    /* The node's capacity is its creator's: every process of the node then agrees. */
    for (uint32_t g = 0; g < SIM_MAX_GPUS; g++)
        s->mem_capacity[g] = sim_cfg.mem_bytes;
}

static CUresult sim_shm_create(int fd, const char *name)
{
    size_t size = sizeof(struct sim_shm);
    if (ftruncate(fd, (off_t)size) != 0) {
        sim_warn("cannot size shared segment %s: %s", name, strerror(errno));
        shm_unlink(name);
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        sim_warn("cannot map shared segment %s: %s", name, strerror(errno));
        shm_unlink(name);
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    struct sim_shm *s = p; /* ftruncate zero-filled it */
    sim_shm_init_layout(s);
    __atomic_store_n(&s->ready, 1U, __ATOMIC_RELEASE);
    sim_shm = s;
    sim_debug("created simulated node %s (%zu bytes)", name, size);
    return CUDA_SUCCESS;
}

int sim_shm_ours(const struct stat *st)
{
    return st->st_uid == geteuid() && !(st->st_mode & 022);
}

/* Give up on an existing segment: one clear line, and the caller fails cuInit. */
static CUresult sim_shm_refuse(const char *name, const char *why, const char *detail)
{
    sim_warn("shared segment %s %s%s; " SIM_FIX, name, why, detail, name);
    return CUDA_ERROR_NOT_INITIALIZED;
}

static CUresult sim_shm_attach(int fd, const char *name)
{
    int64_t deadline = sim_mono_ns() + SIM_READY_WAIT_NS;
    struct stat st;
    /* Ours alone, as the daemon's gates segment must be (krex/core/shm.py, attach): another uid's
     * segment, or one anyone may write, would let them share (and steer) our simulated GPUs. */
    if (fstat(fd, &st) != 0) {
        sim_warn("cannot stat shared segment %s: %s", name, strerror(errno));
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (!sim_shm_ours(&st)) {
        char detail[96];
        snprintf(detail, sizeof detail, " (uid %u, mode %o; this process runs as uid %u)",
                 (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777), (unsigned)geteuid());
        return sim_shm_refuse(name, "is not this user's alone", detail);
    }
    /* Size 0: its creator has not sized it yet (ftruncate sets the final size at once). */
    for (;;) {
        if (fstat(fd, &st) != 0) {
            sim_warn("cannot stat shared segment %s: %s", name, strerror(errno));
            return CUDA_ERROR_NOT_INITIALIZED;
        }
        if (st.st_size > 0)
            break;
        if (sim_mono_ns() > deadline)
            return sim_shm_refuse(name, "stayed empty for 2 s (did its creator die?)", "");
        sim_sleep_until(sim_mono_ns() + SIM_POLL_NS);
    }
    size_t len = (size_t)st.st_size;
    if (len < offsetof(struct sim_shm, model_lock))
        return sim_shm_refuse(name, "is too small to be a simulated node", "");
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        sim_warn("cannot map shared segment %s: %s", name, strerror(errno));
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    struct sim_shm *s = p;
    /* Wait (bounded) for the creator to finish; refuse a foreign segment as soon as it shows. */
    for (;;) {
        uint32_t magic = __atomic_load_n(&s->magic, __ATOMIC_ACQUIRE);
        int ready = __atomic_load_n(&s->ready, __ATOMIC_ACQUIRE) != 0;
        const char *why = NULL;
        char detail[160] = "";
        if (magic != 0 && magic != SIM_SHM_MAGIC) {
            why = "is not a KREX simulated-GPU segment (wrong magic)";
        } else if (magic == SIM_SHM_MAGIC &&
                   (s->version != SIM_SHM_VERSION || s->size != sizeof *s || len != sizeof *s)) {
            why = "was made by another version of the simulated GPU";
            snprintf(detail, sizeof detail, " (layout %u, %llu bytes; this library uses %u, %zu)",
                     s->version, (unsigned long long)s->size, SIM_SHM_VERSION, sizeof *s);
        } else if (ready && magic == SIM_SHM_MAGIC) {
            sim_shm = s;
            sim_debug("attached to simulated node %s", name);
            const char *want = getenv("KREX_SIM_MEM_BYTES");
            if (want && *want && s->mem_capacity[0] != sim_cfg.mem_bytes)
                sim_warn("KREX_SIM_MEM_BYTES=%s is not the capacity of simulated node %s, which "
                         "its creator fixed at %llu bytes per GPU; using the node's",
                         want, name, (unsigned long long)s->mem_capacity[0]);
            return CUDA_SUCCESS;
        } else if (sim_mono_ns() > deadline) {
            why = "never became ready within 2 s (did its creator die while initialising it?)";
        }
        if (why) {
            munmap(p, len);
            return sim_shm_refuse(name, why, detail);
        }
        sim_sleep_until(sim_mono_ns() + SIM_POLL_NS);
    }
}

static CUresult sim_shm_open(void)
{
    const char *name = sim_cfg.shm_name;
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) {
        CUresult r = sim_shm_create(fd, name);
        close(fd);
        return r;
    }
    if (errno != EEXIST) {
        sim_warn("cannot create shared segment %s: %s", name, strerror(errno));
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) {
        sim_warn("cannot open shared segment %s: %s", name, strerror(errno));
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    CUresult r = sim_shm_attach(fd, name);
    close(fd);
    return r;
}

/* ---- One-time initialisation. ---- */

static pthread_once_t sim_once = PTHREAD_ONCE_INIT;
static CUresult sim_init_result = CUDA_ERROR_NOT_INITIALIZED;

static void sim_atfork_prepare(void) { pthread_mutex_lock(&sim_proc_lock); }
static void sim_atfork_parent(void) { pthread_mutex_unlock(&sim_proc_lock); }

static void sim_atfork_child(void)
{
    /* A forked child is a new process of the simulated node: same segment (the mapping is
     * inherited), none of the parent's contexts or streams, its own submission count. */
    pthread_mutex_init(&sim_proc_lock, NULL);
    sim_pid = getpid();
    sim_ctx_after_fork_child();
    sim_mem_after_fork_child();
    sim_held_after_fork_child();
    sim_hooks_after_fork_child();
}

static void sim_init_once(void)
{
    sim_config_load();
    sim_pid = getpid();
    pthread_atfork(sim_atfork_prepare, sim_atfork_parent, sim_atfork_child);
    sim_witness_map();
    sim_init_result = sim_shm_open();
}

CUresult sim_ensure_init(void)
{
    pthread_once(&sim_once, sim_init_once);
    return sim_init_result;
}

_Static_assert(offsetof(struct sim_shm, model_holder) == KREXSIM_MODEL_HOLDER_OFFSET,
               "krexsim.h documents where the model lock's holder is");
_Static_assert(offsetof(struct sim_shm, ctx_holder) == KREXSIM_CTX_HOLDER_OFFSET,
               "krexsim.h documents where the context lock's holder is");
_Static_assert(offsetof(struct sim_shm, model_lock) == KREXSIM_MODEL_LOCK_OFFSET,
               "krexsim.h documents where the model lock is");
_Static_assert(offsetof(struct sim_shm, ctx_lock) == KREXSIM_CTX_LOCK_OFFSET,
               "krexsim.h documents where the context lock is");
