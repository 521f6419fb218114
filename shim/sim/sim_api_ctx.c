/*
 * sim_api_ctx.c: context entry points (modules: sim_api_module.c).
 *
 * Every versioned spelling is its own function (its own address), as in the real driver,
 * so that a caller that maps addresses back to names is never ambiguous.
 */
#include "sim.h"

/* ---- Primary contexts. ---- */

CUresult sim_cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    return sim_primary_retain(pctx, dev);
}
SIM_EXPORT(cuDevicePrimaryCtxRetain);

CUresult sim_cuDevicePrimaryCtxRelease(CUdevice dev) { return sim_primary_release(dev); }
SIM_EXPORT(cuDevicePrimaryCtxRelease);

CUresult sim_cuDevicePrimaryCtxRelease_v2(CUdevice dev) { return sim_primary_release(dev); }
SIM_EXPORT(cuDevicePrimaryCtxRelease_v2);

CUresult sim_cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    return sim_primary_state(dev, flags, active);
}
SIM_EXPORT(cuDevicePrimaryCtxGetState);

/* ---- Created contexts. ---- */

CUresult sim_cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return sim_ctx_create(pctx, flags, dev);
}
SIM_EXPORT(cuCtxCreate);

CUresult sim_cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return sim_ctx_create(pctx, flags, dev);
}
SIM_EXPORT(cuCtxCreate_v2);

/* Execution-affinity parameters are accepted and ignored. */
CUresult sim_cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n,
                            unsigned int flags, CUdevice dev)
{
    if (n < 0 || (n > 0 && !params))
        return CUDA_ERROR_INVALID_VALUE;
    return sim_ctx_create(pctx, flags, dev);
}
SIM_EXPORT(cuCtxCreate_v3);

/* Creation parameters (affinity, CIG) are accepted and ignored. */
CUresult sim_cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                            CUdevice dev)
{
    (void)params;
    return sim_ctx_create(pctx, flags, dev);
}
SIM_EXPORT(cuCtxCreate_v4);

CUresult sim_cuCtxDestroy(CUcontext ctx) { return sim_ctx_destroy(ctx); }
SIM_EXPORT(cuCtxDestroy);

CUresult sim_cuCtxDestroy_v2(CUcontext ctx) { return sim_ctx_destroy(ctx); }
SIM_EXPORT(cuCtxDestroy_v2);

/* ---- The current context. ---- */

CUresult sim_cuCtxSetCurrent(CUcontext ctx)
{
    CUresult r = sim_ensure_init();
    return r != CUDA_SUCCESS ? r : sim_ctx_set_current(ctx);
}
SIM_EXPORT(cuCtxSetCurrent);

CUresult sim_cuCtxGetCurrent(CUcontext *pctx)
{
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = sim_ensure_init();
    if (r == CUDA_SUCCESS)
        *pctx = sim_ctx_top();
    return r;
}
SIM_EXPORT(cuCtxGetCurrent);

CUresult sim_cuCtxPushCurrent(CUcontext ctx)
{
    CUresult r = sim_ensure_init();
    return r != CUDA_SUCCESS ? r : sim_ctx_push(ctx);
}
SIM_EXPORT(cuCtxPushCurrent);

CUresult sim_cuCtxPushCurrent_v2(CUcontext ctx)
{
    CUresult r = sim_ensure_init();
    return r != CUDA_SUCCESS ? r : sim_ctx_push(ctx);
}
SIM_EXPORT(cuCtxPushCurrent_v2);

CUresult sim_cuCtxPopCurrent(CUcontext *pctx)
{
    CUresult r = sim_ensure_init();
    return r != CUDA_SUCCESS ? r : sim_ctx_pop(pctx);
}
SIM_EXPORT(cuCtxPopCurrent);

CUresult sim_cuCtxPopCurrent_v2(CUcontext *pctx)
{
    CUresult r = sim_ensure_init();
    return r != CUDA_SUCCESS ? r : sim_ctx_pop(pctx);
}
SIM_EXPORT(cuCtxPopCurrent_v2);

/* Waits for all of this process's work in the current context (every stream of it). */
CUresult sim_cuCtxSynchronize(void)
{
    struct CUctx_st *c;
    CUresult r = sim_ctx_current(&c);
    return r != CUDA_SUCCESS ? r : sim_ctx_synchronize(c);
}
SIM_EXPORT(cuCtxSynchronize);

CUresult sim_cuCtxGetDevice(CUdevice *device)
{
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = sim_ctx_current(&c);
    if (r == CUDA_SUCCESS)
        *device = c->device;
    return r;
}
SIM_EXPORT(cuCtxGetDevice);
