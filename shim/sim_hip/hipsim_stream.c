/*
 * hipsim_stream.c: streams and events, which are the simulated driver's.
 *
 * The null stream is the driver's legacy stream of the thread's device, hipStreamPerThread
 * the driver's per-thread stream (hs_enter first makes the thread's device current, so that
 * both resolve to it). As in the simulator, the null stream does not synchronise implicitly
 * with other streams.
 */
#include "hipsim.h"

/* ---- Streams. ---- */

hipError_t hipStreamCreateWithFlags(hipStream_t *stream, unsigned int flags)
{
    if (!stream || (flags & ~(unsigned)hipStreamNonBlocking))
        return hs_ret(hipErrorInvalidValue);
    hipError_t e = hs_enter();
    if (e != hipSuccess)
        return hs_ret(e);
    /* hipStreamNonBlocking is CU_STREAM_NON_BLOCKING. */
    return hs_ret(hs_err(cuStreamCreate((CUstream *)stream, flags)));
}

hipError_t hipStreamCreate(hipStream_t *stream)
{
    if (!stream)
        return hs_ret(hipErrorInvalidValue);
    hipError_t e = hs_enter();
    if (e != hipSuccess)
        return hs_ret(e);
    return hs_ret(hs_err(cuStreamCreate((CUstream *)stream, 0)));
}

hipError_t hipStreamDestroy(hipStream_t stream)
{
    if (!stream || stream == hipStreamLegacy || stream == hipStreamPerThread)
        return hs_ret(hipErrorInvalidHandle);
    return hs_ret(hs_err(cuStreamDestroy_v2(HS_STREAM(stream))));
}

hipError_t hipStreamSynchronize(hipStream_t stream)
{
    hipError_t e = hs_enter();
    if (e != hipSuccess)
        return hs_ret(e);
    return hs_ret(hs_err(cuStreamSynchronize(HS_STREAM(stream))));
}

hipError_t hipStreamQuery(hipStream_t stream)
{
    hipError_t e = hs_enter();
    if (e != hipSuccess)
        return hs_ret(e);
    return hs_ret(hs_err(cuStreamQuery(HS_STREAM(stream))));
}

/* ---- Events. ---- */

/* HIP's creation flags that the driver shares (same bits); the AMD-only release and fence
 * flags change nothing in the simulator. */
#define HS_EVENT_CU_FLAGS (hipEventBlockingSync | hipEventDisableTiming | hipEventInterprocess)

hipError_t hipEventCreateWithFlags(hipEvent_t *event, unsigned flags)
{
    if (!event)
        return hs_ret(hipErrorInvalidValue);
    hipError_t e = hs_enter();
    if (e != hipSuccess)
        return hs_ret(e);
    return hs_ret(hs_err(cuEventCreate((CUevent *)event, flags & HS_EVENT_CU_FLAGS)));
}

hipError_t hipEventCreate(hipEvent_t *event)
{
    if (!event)
        return hs_ret(hipErrorInvalidValue);
    hipError_t e = hs_enter();
    if (e != hipSuccess)
        return hs_ret(e);
    return hs_ret(hs_err(cuEventCreate((CUevent *)event, 0)));
}

hipError_t hipEventDestroy(hipEvent_t event)
{
    if (!event)
        return hs_ret(hipErrorInvalidHandle);
    return hs_ret(hs_err(cuEventDestroy_v2(HS_EVENT(event))));
}

hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream)
{
    if (!event)
        return hs_ret(hipErrorInvalidHandle);
    hipError_t e = hs_enter();
    if (e != hipSuccess)
        return hs_ret(e);
    return hs_ret(hs_err(cuEventRecord(HS_EVENT(event), HS_STREAM(stream))));
}

hipError_t hipEventRecord_spt(hipEvent_t event, hipStream_t stream)
{
    return hipEventRecord(event, HS_SPT(stream));
}

/* An event never recorded is complete, for both (the driver agrees). */
hipError_t hipEventSynchronize(hipEvent_t event)
{
    if (!event)
        return hs_ret(hipErrorInvalidHandle);
    return hs_ret(hs_err(cuEventSynchronize(HS_EVENT(event))));
}

hipError_t hipEventQuery(hipEvent_t event)
{
    if (!event)
        return hs_ret(hipErrorInvalidHandle);
    return hs_ret(hs_err(cuEventQuery(HS_EVENT(event))));
}

/* Simulated device time between the two records, in ms. */
hipError_t hipEventElapsedTime(float *ms, hipEvent_t start, hipEvent_t stop)
{
    if (!ms)
        return hs_ret(hipErrorInvalidValue);
    if (!start || !stop)
        return hs_ret(hipErrorInvalidHandle);
    return hs_ret(hs_err(cuEventElapsedTime(ms, HS_EVENT(start), HS_EVENT(stop))));
}
