/*
 * sim_wait.c: waiting on the model, and queueing work into it.
 *
 * A waiter never holds the model lock while it sleeps and never spins: it sleeps until the
 * next job completion the model predicts (CLOCK_MONOTONIC, absolute), then re-checks. New
 * work from other processes can only push completions later, so waking at a prediction is
 * never too late; when it is too early the waiter simply sleeps again. Oversleeping does not
 * distort the model: completions are computed in model time, whenever they are observed.
 */
#include "sim.h"

#define SIM_MAX_SLEEP_NS 100000000LL    /* re-check at least this often */
#define SIM_FULL_WAIT_NS 10000000000LL  /* how long a submission waits for a free job slot */
#define SIM_FULL_POLL_NS 10000000LL

/* Earliest predicted completion on `gpu`, or on any GPU when it is SIM_NONE or idle. */
static double sim_next_wake(uint32_t gpu)
{
    double t = gpu < SIM_MAX_GPUS ? sim_next_completion(gpu) : -1;
    if (t >= 0)
        return t;
    for (uint32_t g = 0; g < SIM_MAX_GPUS; g++) {
        double tg = sim_next_completion(g);
        if (tg >= 0 && (t < 0 || tg < t))
            t = tg;
    }
    return t;
}

/* Sleep until model time t (capped), or a short while when nothing is predicted. */
static void sim_sleep_model(double t, int64_t epoch, int64_t cap_ns)
{
    int64_t now = sim_mono_ns();
    int64_t wake = now + cap_ns;
    if (t >= 0) {
        int64_t at = epoch + (int64_t)t + 1; /* round up: never wake early by a fraction */
        if (at < wake)
            wake = at;
    }
    sim_sleep_until(wake);
}

CUresult sim_wait(uint32_t gpu, sim_cond_fn cond, void *arg)
{
    for (;;) {
        CUresult r = sim_model_lock(NULL);
        if (r != CUDA_SUCCESS)
            return r;
        if (cond(arg)) {
            sim_model_unlock();
            return CUDA_SUCCESS;
        }
        double t = sim_next_wake(gpu);
        int64_t epoch = sim_shm->epoch_ns;
        sim_model_unlock();
        if (t < 0) {
            /* Unfinished work that is nowhere on a GPU: only a broken model does that. */
            sim_warn("internal error: waiting for work that no simulated GPU holds");
            return CUDA_ERROR_UNKNOWN;
        }
        sim_sleep_model(t, epoch, SIM_MAX_SLEEP_NS);
    }
}

struct sim_stream_cond {
    uint32_t slot, gen;
    uint64_t seq;
};

static int sim_stream_done(void *arg)
{
    const struct sim_stream_cond *c = arg;
    const struct sim_stream *st = &sim_shm->streams[c->slot];
    /* A slot no longer ours (freed once drained, or dropped) has nothing left to wait for. */
    return st->gen != c->gen || st->owner != (int32_t)sim_pid || st->completed >= c->seq ||
           st->head == SIM_NONE;
}

CUresult sim_wait_stream(const struct sim_target *tg, uint64_t seq)
{
    struct sim_stream_cond c = {.slot = tg->slot, .gen = tg->gen, .seq = seq};
    return sim_wait(tg->gpu, sim_stream_done, &c);
}

CUresult sim_submit(CUstream s, enum sim_null_stream null_is, const struct sim_work *w,
                    int64_t arrive_ns, struct sim_target *tg, uint64_t *seq)
{
    int64_t deadline = 0;
    for (;;) {
        CUresult r = sim_model_lock_raw();
        if (r != CUDA_SUCCESS)
            return r;
        r = sim_resolve_stream(s, null_is, tg);
        if (r == CUDA_SUCCESS && w->event != SIM_NONE && !sim_event_valid(w->event, w->event_gen))
            r = CUDA_ERROR_INVALID_HANDLE;
        int full = 0;
        if (r == CUDA_SUCCESS) {
            /* The job arrives at arrive_ns, or now; if another process already took the model
             * past that, at the model's time (it never goes backwards). Only its GPU needs to
             * be brought up to date: the GPUs are independent. */
            if (!arrive_ns) {
                /* As late as possible: bring the GPU close to now first (it may have work to
                 * catch up on), then read the clock again for the instant of arrival. */
                sim_model_advance_gpu(tg->gpu, sim_mono_ns());
                arrive_ns = sim_mono_ns();
            }
            sim_model_advance_gpu(tg->gpu, arrive_ns);
            r = sim_enqueue(tg->slot, w, seq);
            full = r == CUDA_ERROR_OUT_OF_MEMORY;
        }
        if (!full) {
            sim_model_unlock();
            return r;
        }
        /* The job table is full (dead owners already collected): wait like a full queue. */
        double t = sim_next_wake(SIM_NONE);
        int64_t epoch = sim_shm->epoch_ns;
        sim_model_unlock();
        arrive_ns = 0; /* it arrives when there is room */
        int64_t mono = sim_mono_ns();
        if (!deadline) {
            deadline = mono + SIM_FULL_WAIT_NS;
            sim_debug("job table full (%u jobs); waiting for room", SIM_MAX_JOBS);
        }
        if (mono >= deadline) {
            sim_warn("the simulated GPUs' job table (%u jobs) stayed full for %lld s; failing "
                     "the submission with CUDA_ERROR_OUT_OF_MEMORY",
                     SIM_MAX_JOBS, SIM_FULL_WAIT_NS / 1000000000LL);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        int64_t cap = deadline - mono < SIM_FULL_POLL_NS ? deadline - mono : SIM_FULL_POLL_NS;
        sim_sleep_model(t, epoch, cap);
    }
}
