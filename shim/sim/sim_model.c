/*
 * sim_model.c: the device model, shared by every process of the simulated node.
 *
 * An event-driven simulation over CLOCK_MONOTONIC, kept in the shared segment and advanced
 * lazily: every call that touches the model takes the model lock and first brings the GPUs up
 * to "now" (a submission: its GPU, up to the instant its job arrived), processing job
 * completions in time order. Model time is nanoseconds since the segment's epoch, in doubles
 * (exact to well under a nanosecond for months), and never goes backwards.
 *
 * Each GPU does processor sharing: the head jobs of its non-empty streams (one per stream:
 * streams run in order) are active, and k active jobs each progress at 1/k of full speed.
 * Kernels, copies and sets all share the GPU this way; zero-length jobs (event markers, no-op
 * graphs, host-function markers) finish the instant they become active. An event's timestamp
 * is the model time its marker finished (see sim_absorb_launch_gap for the one exception).
 *
 * Jobs of a process that has died are dropped, not run to completion, when the model notices
 * the death (as of the model's last advance): at most SIM_REAP_NS of host time after it, on
 * any process's next call, and whenever a table is full.
 *
 * Advancing and repairing work on an explicit segment (sim_node_*), as a lock of the checkpoint
 * API must bring a node up to now to see whether a process's work is done, also from a process
 * that only mapped the node by name (krexsim_checkpoint); the rest works on this process's node.
 */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "sim.h"

#define S sim_shm
#define SIM_EPS_NS 1e-3         /* remaining work this small counts as done */
#define SIM_REAP_NS 50000000LL  /* how often to look for dead owners */
#define SIM_FROZEN_POLL_NS 1000000LL /* how often a locked process's call looks again */

/* ---- Slots. ---- */

static uint32_t sim_job_alloc(void)
{
    uint32_t j = S->free_job;
    if (j != SIM_NONE)
        S->free_job = S->jobs[j].next;
    return j;
}

static void sim_job_free(struct sim_shm *s, uint32_t j)
{
    s->jobs[j].stream = SIM_NONE;
    s->jobs[j].next = s->free_job;
    s->free_job = j;
}

static void sim_gpu_activate(struct sim_shm *s, uint32_t gpu, uint32_t slot)
{
    struct sim_gpu *g = &s->gpus[gpu];
    s->streams[slot].active_pos = g->n_active;
    g->active[g->n_active++] = slot;
}

static void sim_gpu_deactivate(struct sim_shm *s, uint32_t gpu, uint32_t slot)
{
    struct sim_gpu *g = &s->gpus[gpu];
    uint32_t pos = s->streams[slot].active_pos;
    uint32_t last = g->active[--g->n_active];
    g->active[pos] = last;
    s->streams[last].active_pos = pos;
    s->streams[slot].active_pos = SIM_NONE;
}

static void sim_stream_free(struct sim_shm *s, uint32_t slot)
{
    struct sim_stream *st = &s->streams[slot];
    st->owner = 0;
    st->gen++;
    st->destroyed = 0;
    st->next_free = s->free_stream;
    s->free_stream = slot;
}

uint32_t sim_stream_alloc(uint32_t gpu, uint64_t ctx_id)
{
    uint32_t slot = S->free_stream;
    if (slot == SIM_NONE && sim_reap_dead() > 0)
        slot = S->free_stream;
    if (slot == SIM_NONE)
        return SIM_NONE;
    struct sim_stream *st = &S->streams[slot];
    S->free_stream = st->next_free;
    st->owner = (int32_t)sim_pid;
    st->gpu = gpu;
    st->destroyed = 0;
    st->ctx_id = ctx_id;
    st->head = st->tail = SIM_NONE;
    st->active_pos = SIM_NONE;
    st->next_free = SIM_NONE;
    st->submitted = st->completed = 0;
    st->mark_event = SIM_NONE;
    st->done_hint = SIM_NONE;
    return slot;
}

int sim_stream_valid(uint32_t slot, uint32_t gen)
{
    return slot < SIM_MAX_STREAMS && S->streams[slot].owner == (int32_t)sim_pid &&
           S->streams[slot].gen == gen && !S->streams[slot].destroyed;
}

void sim_stream_release(uint32_t slot, uint32_t gen)
{
    if (!sim_stream_valid(slot, gen))
        return;
    S->streams[slot].destroyed = 1; /* its queued work still runs, as on a real GPU */
    if (S->streams[slot].head == SIM_NONE)
        sim_stream_free(S, slot);
}

uint32_t sim_event_alloc(void)
{
    uint32_t slot = S->free_event;
    if (slot == SIM_NONE && sim_reap_dead() > 0)
        slot = S->free_event;
    if (slot == SIM_NONE)
        return SIM_NONE;
    struct sim_event *ev = &S->events[slot];
    S->free_event = ev->next_free;
    ev->owner = (int32_t)sim_pid;
    ev->state = SIM_EV_NEVER;
    ev->gpu = 0;
    ev->t = 0;
    ev->next_free = SIM_NONE;
    return slot;
}

int sim_event_valid(uint32_t slot, uint32_t gen)
{
    return slot < SIM_MAX_EVENTS && S->events[slot].owner == (int32_t)sim_pid &&
           S->events[slot].gen == gen;
}

static void sim_event_release(uint32_t slot)
{
    struct sim_event *ev = &S->events[slot];
    ev->owner = 0;
    ev->gen++; /* a marker still queued for it will find the generation changed */
    ev->state = SIM_EV_NEVER;
    ev->next_free = S->free_event;
    S->free_event = slot;
}

void sim_event_free(uint32_t slot, uint32_t gen)
{
    if (sim_event_valid(slot, gen))
        sim_event_release(slot);
}

/* ---- Processor sharing. ---- */

/* Note in the driver's record (struct sim_gpu_done) that a job of stream `st`'s owner completed
 * on its GPU at model time t. */
static void sim_note_done(struct sim_shm *s, struct sim_stream *st, double t)
{
    struct sim_gpu_done *d = &s->done[st->gpu];
    int64_t t_ns = (int64_t)t;
    uint32_t h = st->done_hint;
    if (h >= SIM_DONE_PROCS || d->procs[h].pid != st->owner) {
        uint32_t pick = 0; /* a free entry, else the one that completed longest ago */
        for (h = 0; h < SIM_DONE_PROCS; h++) {
            const struct sim_done *e = &d->procs[h], *p = &d->procs[pick];
            if (e->pid == st->owner)
                break;
            if (p->pid != 0 && (e->pid == 0 || e->t_ns < p->t_ns))
                pick = h;
        }
        if (h == SIM_DONE_PROCS) {
            /* A new process: the entry picked gives way. Its pid is cleared first, so a reader
             * never pairs one process's pid with another's time (it reads the pid before and
             * after the time). */
            h = pick;
            struct sim_done *e = &d->procs[h];
            if (e->pid != 0 && e->t_ns > d->evicted_ns)
                __atomic_store_n(&d->evicted_ns, e->t_ns, __ATOMIC_RELEASE);
            __atomic_store_n(&e->pid, 0, __ATOMIC_RELEASE);
            __atomic_store_n(&e->t_ns, t_ns, __ATOMIC_RELEASE);
            __atomic_store_n(&e->pid, st->owner, __ATOMIC_RELEASE);
        }
        st->done_hint = h;
    }
    if (t_ns > d->procs[h].t_ns)
        __atomic_store_n(&d->procs[h].t_ns, t_ns, __ATOMIC_RELEASE);
}

/* The head job of stream `slot` finished at model time t: stamp its event, pop it, start the
 * next one; zero-length jobs that become head finish at the same instant. */
static void sim_stream_complete_head(struct sim_shm *s, uint32_t slot, double t)
{
    struct sim_stream *st = &s->streams[slot];
    sim_note_done(s, st, t);
    for (;;) {
        uint32_t j = st->head;
        struct sim_job *job = &s->jobs[j];
        if (job->event != SIM_NONE) {
            struct sim_event *ev = &s->events[job->event];
            if (ev->owner && ev->gen == job->event_gen && ev->rec == job->event_rec) {
                ev->state = SIM_EV_DONE;
                ev->t = t;
            }
        }
        st->head = job->next;
        st->completed++;
        sim_job_free(s, j);
        if (st->head == SIM_NONE) {
            st->tail = SIM_NONE;
            sim_gpu_deactivate(s, st->gpu, slot);
            if (st->destroyed)
                sim_stream_free(s, slot);
            return;
        }
        if (s->jobs[st->head].remaining > SIM_EPS_NS)
            return;
    }
}

static double sim_gpu_min_remaining(const struct sim_shm *s, const struct sim_gpu *g)
{
    double rmin = -1;
    for (uint32_t i = 0; i < g->n_active; i++) {
        double r = s->jobs[s->streams[g->active[i]].head].remaining;
        if (rmin < 0 || r < rmin)
            rmin = r;
    }
    return rmin;
}

/* Bring GPU `gpu` up to model time `now`, completing jobs in time order. */
static void sim_gpu_advance(struct sim_shm *s, uint32_t gpu, double now)
{
    struct sim_gpu *g = &s->gpus[gpu];
    while (g->n_active > 0) {
        double k = (double)g->n_active;
        double rmin = sim_gpu_min_remaining(s, g);
        if (rmin < 0)
            rmin = 0;
        double t_done = g->t + rmin * k;
        if (t_done > now) {
            /* No completion before now: everyone progresses by its share. */
            double share = (now - g->t) / k;
            if (share > 0) {
                for (uint32_t i = 0; i < g->n_active; i++)
                    s->jobs[s->streams[g->active[i]].head].remaining -= share;
                g->t = now;
            }
            return;
        }
        for (uint32_t i = 0; i < g->n_active; i++)
            s->jobs[s->streams[g->active[i]].head].remaining -= rmin;
        g->t = t_done;
        for (uint32_t i = 0; i < g->n_active;) {
            uint32_t slot = g->active[i];
            if (s->jobs[s->streams[slot].head].remaining <= SIM_EPS_NS) {
                sim_stream_complete_head(s, slot, g->t);
                /* Still here with a new head: next. Gone: the last one moved into i. */
                if (i < g->n_active && g->active[i] == slot)
                    i++;
            } else {
                i++;
            }
        }
    }
    if (now > g->t)
        g->t = now;
}

double sim_next_completion(uint32_t gpu)
{
    if (gpu >= SIM_MAX_GPUS)
        return -1;
    const struct sim_gpu *g = &S->gpus[gpu];
    double rmin = sim_gpu_min_remaining(S, g);
    if (rmin < 0)
        return -1;
    return g->t + rmin * (double)g->n_active;
}

/* A job with work arrives at idle stream `st` right after an event marker that completed
 * there at once, within KREX_SIM_LAUNCH_GAP_US: move that event's timestamp up to now, the
 * job's start. The gap between the two calls is the host's (the simulator's own API overhead,
 * an interrupt, a preemption), not device time; without this, an event record followed by a
 * launch on an idle stream would measure it. Only the very last thing queued qualifies, so an
 * event that ended a previous measurement is never moved. */
static void sim_absorb_launch_gap(uint32_t slot, uint32_t gen, uint32_t rec, double now)
{
    struct sim_event *ev = &S->events[slot];
    if (ev->owner && ev->gen == gen && ev->rec == rec && ev->state == SIM_EV_DONE &&
        now >= ev->t && now - ev->t <= sim_cfg.launch_gap_ns)
        ev->t = now;
}

CUresult sim_enqueue(uint32_t slot, const struct sim_work *w, uint64_t *seq)
{
    struct sim_stream *st = &S->streams[slot];
    uint32_t j = sim_job_alloc();
    if (j == SIM_NONE && sim_reap_dead() > 0)
        j = sim_job_alloc();
    if (j == SIM_NONE)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct sim_job *job = &S->jobs[j];
    job->next = SIM_NONE;
    job->stream = slot;
    job->kind = (uint32_t)w->kind;
    job->remaining = w->duration_ns > 0 ? w->duration_ns : 0;
    job->event = w->event;
    job->event_gen = w->event_gen;
    job->event_rec = 0;
    if (w->event != SIM_NONE) {
        struct sim_event *ev = &S->events[w->event];
        ev->rec++;
        ev->state = SIM_EV_PENDING;
        ev->gpu = st->gpu;
        job->event_rec = ev->rec;
    }
    *seq = ++st->submitted;
    uint32_t mark = st->mark_event; /* only the very last thing queued counts */
    st->mark_event = SIM_NONE;
    if (st->head == SIM_NONE) {
        /* An idle stream starts the job now (the model was just brought up to now). */
        double now = S->gpus[st->gpu].t;
        st->head = st->tail = j;
        sim_gpu_activate(S, st->gpu, slot);
        if (job->remaining > SIM_EPS_NS) {
            if (mark != SIM_NONE)
                sim_absorb_launch_gap(mark, st->mark_gen, st->mark_rec, now);
        } else {
            uint32_t rec = job->event_rec;
            sim_stream_complete_head(S, slot, now); /* frees the job */
            if (w->event != SIM_NONE) {
                st->mark_event = w->event;
                st->mark_gen = w->event_gen;
                st->mark_rec = rec;
            }
        }
    } else {
        S->jobs[st->tail].next = j;
        st->tail = j;
    }
    return CUDA_SUCCESS;
}

/* ---- Dead owners. ---- */

struct sim_pid_cache {
    int32_t pid[32];
    int alive[32];
    unsigned n;
};

static int sim_pid_alive(struct sim_pid_cache *c, int32_t pid)
{
    if (pid == (int32_t)sim_pid)
        return 1;
    for (unsigned i = 0; i < c->n; i++)
        if (c->pid[i] == pid)
            return c->alive[i];
    /* EPERM: it exists but belongs to someone else. A zombie still counts as alive. */
    int alive = kill((pid_t)pid, 0) == 0 || errno == EPERM;
    if (c->n < 32) {
        c->pid[c->n] = pid;
        c->alive[c->n] = alive;
        c->n++;
    }
    return alive;
}

static void sim_stream_drop(uint32_t slot)
{
    struct sim_stream *st = &S->streams[slot];
    if (st->head != SIM_NONE) {
        sim_gpu_deactivate(S, st->gpu, slot);
        for (uint32_t j = st->head, n = 0; j != SIM_NONE && n < SIM_MAX_JOBS; n++) {
            uint32_t next = S->jobs[j].next;
            sim_job_free(S, j);
            j = next;
        }
    }
    st->head = st->tail = SIM_NONE;
    st->completed = st->submitted;
    sim_stream_free(S, slot);
}

unsigned sim_reap_dead(void)
{
    struct sim_pid_cache cache = {.n = 0};
    unsigned dropped = 0;
    for (uint32_t i = 0; i < SIM_MAX_STREAMS; i++) {
        int32_t owner = S->streams[i].owner;
        if (owner && !sim_pid_alive(&cache, owner)) {
            sim_debug("dropping stream %u of dead process %d (%llu job(s) not run)", i,
                      (int)owner,
                      (unsigned long long)(S->streams[i].submitted - S->streams[i].completed));
            sim_stream_drop(i);
            dropped++;
        }
    }
    for (uint32_t i = 0; i < SIM_MAX_EVENTS; i++) {
        int32_t owner = S->events[i].owner;
        if (owner && !sim_pid_alive(&cache, owner)) {
            sim_event_release(i);
            dropped++;
        }
    }
    dropped += sim_mem_reap(); /* their device memory too */
    S->last_reap_ns = sim_mono_ns();
    return dropped;
}

/* ---- Repair after a process died holding the model lock. ---- */

/* Rebuild everything derived (free lists, active sets, tails) from the stream FIFOs, cutting
 * each FIFO where it stops making sense. Jobs no FIFO reaches are freed. */
static void sim_model_repair(struct sim_shm *s)
{
    /* One user at a time: the model lock is one node's, and krexsim_checkpoint (sim_hooks.c)
     * lets a process lock other nodes than its own. */
    static pthread_mutex_t reached_lock = PTHREAD_MUTEX_INITIALIZER;
    static uint8_t reached[SIM_MAX_JOBS];
    pthread_mutex_lock(&reached_lock);
    memset(reached, 0, sizeof reached);
    for (uint32_t g = 0; g < SIM_MAX_GPUS; g++)
        s->gpus[g].n_active = 0;
    s->free_stream = SIM_NONE;
    for (uint32_t i = SIM_MAX_STREAMS; i-- > 0;) {
        struct sim_stream *st = &s->streams[i];
        if (!st->owner || st->gpu >= SIM_MAX_GPUS) {
            st->owner = 0;
            st->next_free = s->free_stream;
            s->free_stream = i;
            continue;
        }
        uint32_t prev = SIM_NONE, j = st->head;
        uint64_t n = 0;
        while (j < SIM_MAX_JOBS && !reached[j] && s->jobs[j].stream == i) {
            reached[j] = 1;
            prev = j;
            j = s->jobs[j].next;
            n++;
        }
        if (prev == SIM_NONE) {
            st->head = st->tail = SIM_NONE;
        } else {
            s->jobs[prev].next = SIM_NONE;
            st->tail = prev;
        }
        if (st->submitted < st->completed + n)
            st->submitted = st->completed + n;
        st->completed = st->submitted - n;
        st->mark_event = SIM_NONE;
        if (st->head != SIM_NONE) {
            sim_gpu_activate(s, st->gpu, i);
        } else if (st->destroyed) {
            st->owner = 0;
            st->gen++;
            st->next_free = s->free_stream;
            s->free_stream = i;
        }
    }
    s->free_job = SIM_NONE;
    for (uint32_t j = SIM_MAX_JOBS; j-- > 0;) {
        if (!reached[j])
            sim_job_free(s, j);
    }
    s->free_event = SIM_NONE;
    for (uint32_t i = SIM_MAX_EVENTS; i-- > 0;) {
        if (!s->events[i].owner) {
            s->events[i].next_free = s->free_event;
            s->free_event = i;
        }
    }
    pthread_mutex_unlock(&reached_lock);
    sim_warn("a process died while holding the simulated node's lock; model repaired");
}

/* ---- The lock. ---- */

double sim_model_now(void)
{
    return (double)(sim_mono_ns() - S->epoch_ns);
}

/* Take segment s's model lock for process `holder`, repairing the model if the lock's last
 * holder died in it. */
static CUresult sim_lock_seg(struct sim_shm *s, uint32_t holder)
{
    int recovered;
    if (sim_robust_lock(&s->model_lock, &recovered) != 0)
        return CUDA_ERROR_UNKNOWN;
    __atomic_store_n(&s->model_holder, holder, __ATOMIC_RELEASE);
    if (recovered)
        sim_model_repair(s);
    return CUDA_SUCCESS;
}

CUresult sim_model_lock_any(int *frozen)
{
    CUresult r = sim_ensure_init();
    if (r != CUDA_SUCCESS)
        return r;
    r = sim_lock_seg(S, (uint32_t)sim_pid);
    if (r != CUDA_SUCCESS)
        return r;
    if (sim_mono_ns() - S->last_reap_ns >= SIM_REAP_NS)
        sim_reap_dead();
    *frozen = sim_mem_frozen();
    return CUDA_SUCCESS;
}

CUresult sim_model_lock_raw(void)
{
    /* A process that cuCheckpointProcessLock locked (or checkpointed since) makes no further
     * call into the node until it is unlocked: every call that touches the node comes through
     * here, so it waits here, never holding the lock while it waits (sim_ckpt.c). */
    for (;;) {
        int frozen;
        CUresult r = sim_model_lock_any(&frozen);
        if (r != CUDA_SUCCESS || !frozen)
            return r;
        sim_model_unlock();
        sim_sleep_until(sim_mono_ns() + SIM_FROZEN_POLL_NS);
    }
}

CUresult sim_node_lock(struct sim_shm *s)
{
    return sim_lock_seg(s, (uint32_t)getpid());
}

void sim_node_unlock(struct sim_shm *s)
{
    __atomic_store_n(&s->model_holder, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&s->model_lock);
}

void sim_node_advance(struct sim_shm *s, int64_t mono_ns)
{
    double t = (double)(mono_ns - s->epoch_ns);
    for (uint32_t g = 0; g < SIM_MAX_GPUS; g++)
        sim_gpu_advance(s, g, t); /* no-op for a GPU already past t */
}

void sim_model_advance(int64_t mono_ns)
{
    sim_node_advance(S, mono_ns);
}

void sim_model_advance_gpu(uint32_t gpu, int64_t mono_ns)
{
    sim_gpu_advance(S, gpu, (double)(mono_ns - S->epoch_ns));
}

CUresult sim_model_lock(double *now)
{
    CUresult r = sim_model_lock_raw();
    if (r != CUDA_SUCCESS)
        return r;
    /* Read the clock under the lock, so that model time never goes backwards. */
    int64_t mono = sim_mono_ns();
    sim_model_advance(mono);
    if (now)
        *now = (double)(mono - S->epoch_ns);
    return CUDA_SUCCESS;
}

void sim_model_unlock(void)
{
    sim_node_unlock(S);
}
