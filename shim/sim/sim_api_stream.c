/*
 * sim_api_stream.c: stream and event entry points.
 *
 * An event record queues a zero-length marker; the event's timestamp is the model time at
 * which that marker completed (the simulated device's clock, not the host's), so elapsed
 * times between events measure simulated GPU time whatever the host's load. A marker
 * recorded into an idle stream completes at once; if a launch follows it there within
 * KREX_SIM_LAUNCH_GAP_US, its timestamp becomes that launch's start (sim_model.c).
 * cuEventSynchronize waits for the latest record made before the call.
 */
#include "sim.h"

/* ---- Streams. ---- */

CUresult sim_cuStreamCreate(CUstream *phStream, unsigned int flags)
{
    (void)flags; /* CU_STREAM_NON_BLOCKING changes nothing: see sim_ctx.c on the legacy stream */
    if (!phStream)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = sim_ctx_current(&c);
    if (r != CUDA_SUCCESS)
        return r;
    struct sim_handle *h = sim_handle_new(SIM_MAGIC_STREAM);
    if (!h)
        return CUDA_ERROR_OUT_OF_MEMORY;
    r = sim_model_lock(NULL);
    if (r != CUDA_SUCCESS) {
        sim_handle_kill(h);
        return r;
    }
    uint32_t slot = sim_stream_alloc((uint32_t)c->device, c->id);
    if (slot != SIM_NONE)
        h->gen = sim_shm->streams[slot].gen;
    sim_model_unlock();
    if (slot == SIM_NONE) {
        sim_warn("no free stream slot on the simulated node (%u in use)", SIM_MAX_STREAMS);
        sim_handle_kill(h);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    h->slot = slot;
    h->ctx = c;
    h->flags = flags;
    *phStream = (CUstream)h;
    return CUDA_SUCCESS;
}
SIM_EXPORT(cuStreamCreate);

static CUresult sim_stream_destroy(CUstream s)
{
    if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD ||
        s->h.magic != SIM_MAGIC_STREAM)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = sim_model_lock(NULL);
    if (r != CUDA_SUCCESS)
        return r;
    sim_stream_release(s->h.slot, s->h.gen); /* queued work still runs, then the slot frees */
    sim_model_unlock();
    sim_handle_kill(&s->h);
    return CUDA_SUCCESS;
}

CUresult sim_cuStreamDestroy(CUstream s) { return sim_stream_destroy(s); }
SIM_EXPORT(cuStreamDestroy);

CUresult sim_cuStreamDestroy_v2(CUstream s) { return sim_stream_destroy(s); }
SIM_EXPORT(cuStreamDestroy_v2);

static CUresult sim_stream_sync(CUstream s, enum sim_null_stream null_is)
{
    struct sim_target tg;
    CUresult r = sim_model_lock(NULL);
    if (r != CUDA_SUCCESS)
        return r;
    r = sim_resolve_stream(s, null_is, &tg);
    uint64_t seq = r == CUDA_SUCCESS ? sim_shm->streams[tg.slot].submitted : 0;
    sim_model_unlock();
    return r != CUDA_SUCCESS ? r : sim_wait_stream(&tg, seq);
}

CUresult sim_cuStreamSynchronize(CUstream s) { return sim_stream_sync(s, SIM_NULL_LEGACY); }
SIM_EXPORT(cuStreamSynchronize);

CUresult sim_cuStreamSynchronize_ptsz(CUstream s)
{
    return sim_stream_sync(s, SIM_NULL_PER_THREAD);
}
SIM_EXPORT(cuStreamSynchronize_ptsz);

static CUresult sim_stream_query(CUstream s, enum sim_null_stream null_is)
{
    struct sim_target tg;
    CUresult r = sim_model_lock(NULL);
    if (r != CUDA_SUCCESS)
        return r;
    r = sim_resolve_stream(s, null_is, &tg);
    if (r == CUDA_SUCCESS && sim_shm->streams[tg.slot].head != SIM_NONE)
        r = CUDA_ERROR_NOT_READY;
    sim_model_unlock();
    return r;
}

CUresult sim_cuStreamQuery(CUstream s) { return sim_stream_query(s, SIM_NULL_LEGACY); }
SIM_EXPORT(cuStreamQuery);

CUresult sim_cuStreamQuery_ptsz(CUstream s) { return sim_stream_query(s, SIM_NULL_PER_THREAD); }
SIM_EXPORT(cuStreamQuery_ptsz);

/* ---- Events. ---- */

static int sim_event_ok(CUevent e)
{
    return e && e->h.magic == SIM_MAGIC_EVENT;
}

CUresult sim_cuEventCreate(CUevent *phEvent, unsigned int flags)
{
    if (!phEvent)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = sim_ctx_current(&c);
    if (r != CUDA_SUCCESS)
        return r;
    struct sim_handle *h = sim_handle_new(SIM_MAGIC_EVENT);
    if (!h)
        return CUDA_ERROR_OUT_OF_MEMORY;
    r = sim_model_lock(NULL);
    if (r != CUDA_SUCCESS) {
        sim_handle_kill(h);
        return r;
    }
    uint32_t slot = sim_event_alloc();
    if (slot != SIM_NONE)
        h->gen = sim_shm->events[slot].gen;
    sim_model_unlock();
    if (slot == SIM_NONE) {
        sim_warn("no free event slot on the simulated node (%u in use)", SIM_MAX_EVENTS);
        sim_handle_kill(h);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    h->slot = slot;
    h->ctx = c;
    h->flags = flags;
    *phEvent = (CUevent)h;
    return CUDA_SUCCESS;
}
SIM_EXPORT(cuEventCreate);

static CUresult sim_event_record(CUevent e, CUstream s, unsigned flags,
                                 enum sim_null_stream null_is)
{
    sim_count_submission();
    if (!sim_event_ok(e))
        return CUDA_ERROR_INVALID_HANDLE;
    if (flags & ~1U) /* CU_EVENT_RECORD_EXTERNAL is the only flag */
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_work w = {
        .kind = SIM_JOB_MARKER, .duration_ns = 0, .event = e->h.slot, .event_gen = e->h.gen};
    struct sim_target tg;
    uint64_t seq;
    return sim_submit(s, null_is, &w, 0, &tg, &seq);
}

CUresult sim_cuEventRecord(CUevent e, CUstream s)
{
    return sim_event_record(e, s, 0, SIM_NULL_LEGACY);
}
SIM_EXPORT(cuEventRecord);

CUresult sim_cuEventRecord_ptsz(CUevent e, CUstream s)
{
    return sim_event_record(e, s, 0, SIM_NULL_PER_THREAD);
}
SIM_EXPORT(cuEventRecord_ptsz);

CUresult sim_cuEventRecordWithFlags(CUevent e, CUstream s, unsigned int flags)
{
    return sim_event_record(e, s, flags, SIM_NULL_LEGACY);
}
SIM_EXPORT(cuEventRecordWithFlags);

CUresult sim_cuEventRecordWithFlags_ptsz(CUevent e, CUstream s, unsigned int flags)
{
    return sim_event_record(e, s, flags, SIM_NULL_PER_THREAD);
}
SIM_EXPORT(cuEventRecordWithFlags_ptsz);

CUresult sim_cuEventQuery(CUevent e)
{
    if (!sim_event_ok(e))
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = sim_model_lock(NULL);
    if (r != CUDA_SUCCESS)
        return r;
    if (!sim_event_valid(e->h.slot, e->h.gen))
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (sim_shm->events[e->h.slot].state == SIM_EV_PENDING)
        r = CUDA_ERROR_NOT_READY;
    sim_model_unlock();
    return r;
}
SIM_EXPORT(cuEventQuery);

struct sim_event_cond {
    uint32_t slot, gen, rec;
};

static int sim_event_done(void *arg)
{
    const struct sim_event_cond *c = arg;
    const struct sim_event *ev = &sim_shm->events[c->slot];
    /* Done, destroyed, or recorded again since the wait began (then the wait is over). */
    return ev->gen != c->gen || ev->rec != c->rec || ev->state != SIM_EV_PENDING;
}

CUresult sim_cuEventSynchronize(CUevent e)
{
    if (!sim_event_ok(e))
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = sim_model_lock(NULL);
    if (r != CUDA_SUCCESS)
        return r;
    const struct sim_event *ev = &sim_shm->events[e->h.slot];
    struct sim_event_cond c = {.slot = e->h.slot, .gen = e->h.gen, .rec = ev->rec};
    uint32_t gpu = ev->gpu;
    int pending = ev->state == SIM_EV_PENDING;
    if (!sim_event_valid(e->h.slot, e->h.gen))
        r = CUDA_ERROR_INVALID_HANDLE;
    sim_model_unlock();
    if (r != CUDA_SUCCESS || !pending)
        return r;
    return sim_wait(gpu, sim_event_done, &c);
}
SIM_EXPORT(cuEventSynchronize);

static CUresult sim_event_elapsed(float *ms, CUevent start, CUevent end)
{
    if (!ms)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_event_ok(start) || !sim_event_ok(end))
        return CUDA_ERROR_INVALID_HANDLE;
    if ((start->h.flags | end->h.flags) & SIM_CU_EVENT_DISABLE_TIMING)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = sim_model_lock(NULL);
    if (r != CUDA_SUCCESS)
        return r;
    const struct sim_event *a = &sim_shm->events[start->h.slot];
    const struct sim_event *b = &sim_shm->events[end->h.slot];
    if (!sim_event_valid(start->h.slot, start->h.gen) ||
        !sim_event_valid(end->h.slot, end->h.gen) || a->state == SIM_EV_NEVER ||
        b->state == SIM_EV_NEVER)
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (a->state == SIM_EV_PENDING || b->state == SIM_EV_PENDING)
        r = CUDA_ERROR_NOT_READY;
    else
        *ms = (float)((b->t - a->t) / 1e6);
    sim_model_unlock();
    return r;
}

CUresult sim_cuEventElapsedTime(float *ms, CUevent start, CUevent end)
{
    return sim_event_elapsed(ms, start, end);
}
SIM_EXPORT(cuEventElapsedTime);

CUresult sim_cuEventElapsedTime_v2(float *ms, CUevent start, CUevent end)
{
    return sim_event_elapsed(ms, start, end);
}
SIM_EXPORT(cuEventElapsedTime_v2);

static CUresult sim_event_destroy(CUevent e)
{
    if (!sim_event_ok(e))
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = sim_model_lock(NULL);
    if (r != CUDA_SUCCESS)
        return r;
    sim_event_free(e->h.slot, e->h.gen); /* a marker still queued for it stamps nothing */
    sim_model_unlock();
    sim_handle_kill(&e->h);
    return CUDA_SUCCESS;
}

CUresult sim_cuEventDestroy(CUevent e) { return sim_event_destroy(e); }
SIM_EXPORT(cuEventDestroy);

CUresult sim_cuEventDestroy_v2(CUevent e) { return sim_event_destroy(e); }
SIM_EXPORT(cuEventDestroy_v2);
