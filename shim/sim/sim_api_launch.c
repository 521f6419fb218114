/*
 * sim_api_launch.c: kernel launches, host functions and graph launches.
 *
 * A kernel's run time in nanoseconds is its first parameter read as a uint64_t:
 * *(uint64_t *)kernelParams[0], or, without kernelParams, the first 8 bytes of the
 * CU_LAUNCH_PARAM_BUFFER_POINTER buffer in `extra`; otherwise 0. Any non-NULL CUfunction
 * launches, and a CUkernel cast to one. A kernel may need local memory (sim_api_module.c):
 * before anything is queued, its launch raises the stream's context's reservation to that need
 * (sim_ctx_reserve_local) and loads its library if that has not been loaded into a context yet;
 * when the memory does not fit, the launch fails with CUDA_ERROR_OUT_OF_MEMORY and queues
 * nothing. The function handle is read only once a kernel of the process can need either (so
 * without KREX_SIM_LOCAL_BYTES and "@local=" names, any non-NULL pointer launches, as ever).
 *
 * Host functions run synchronously at the call: the calling thread waits (in model time)
 * until the stream reaches the host function's place, runs it, and returns; later work in the
 * stream is queued after it returns, so stream order holds.
 *
 * Graphs are empty: cuGraphCreate makes one, cuGraphInstantiateWithFlags instantiates it,
 * charging KREX_SIM_GRAPH_BYTES of device memory on the current context's device (the memory
 * the driver takes for an executable graph) until cuGraphExecDestroy. Graph launches are
 * no-ops: any non-NULL CUgraphExec queues a zero-length job.
 */
#include <string.h>

#include "sim.h"

static double sim_kernel_ns(void **params, void **extra)
{
    uint64_t ns = 0;
    if (params) {
        if (params[0])
            memcpy(&ns, params[0], sizeof ns);
        return (double)ns;
    }
    if (!extra)
        return 0;
    const void *buf = NULL;
    size_t size = sizeof ns;
    for (unsigned i = 0; i < 64 && extra[i] != SIM_CU_LAUNCH_PARAM_END; i += 2) {
        if (extra[i] == SIM_CU_LAUNCH_PARAM_BUFFER_POINTER)
            buf = extra[i + 1];
        else if (extra[i] == SIM_CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1])
            memcpy(&size, extra[i + 1], sizeof size);
        else
            break; /* not a key this convention knows: stop reading */
    }
    if (buf)
        memcpy(&ns, buf, size < sizeof ns ? size : sizeof ns);
    return (double)ns;
}

/* What kernel f needs before it can be queued in stream s: its library loaded, its local
 * memory reserved in the stream's context. */
static CUresult sim_launch_needs(CUfunction f, CUstream s)
{
    if (!__atomic_load_n(&sim_launch_reads_fn, __ATOMIC_ACQUIRE))
        return CUDA_SUCCESS;
    struct sim_handle *h = &f->h;
    if (h->magic != SIM_MAGIC_FUNC && h->magic != SIM_MAGIC_KERNEL)
        return CUDA_SUCCESS; /* not one of ours (or unloaded): launches as it always has */
    struct CUctx_st *c;
    CUresult r = sim_stream_ctx(s, &c);
    if (r == CUDA_SUCCESS && h->owner)
        r = sim_handle_charge(h->owner, c, sim_cfg.module_bytes);
    if (r == CUDA_SUCCESS && h->bytes)
        r = sim_ctx_reserve_local(c, h->bytes);
    return r;
}

static CUresult sim_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                           unsigned by, unsigned bz, CUstream s, void **params, void **extra,
                           enum sim_null_stream null_is)
{
    int64_t arrive = sim_mono_ns();
    sim_count_submission();
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!gx || !gy || !gz || !bx || !by || !bz)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = sim_launch_needs(f, s);
    if (r != CUDA_SUCCESS)
        return r;
    struct sim_work w = {.kind = SIM_JOB_KERNEL,
                         .duration_ns = sim_kernel_ns(params, extra),
                         .event = SIM_NONE,
                         .event_gen = 0};
    struct sim_target tg;
    uint64_t seq;
    return sim_submit(s, null_is, &w, arrive, &tg, &seq);
}

CUresult sim_cuLaunchKernel(SIM_SIG_LAUNCH)
{
    (void)shmem;
    return sim_launch(f, gx, gy, gz, bx, by, bz, s, params, extra, SIM_NULL_LEGACY);
}
SIM_EXPORT(cuLaunchKernel);

CUresult sim_cuLaunchKernel_ptsz(SIM_SIG_LAUNCH)
{
    (void)shmem;
    return sim_launch(f, gx, gy, gz, bx, by, bz, s, params, extra, SIM_NULL_PER_THREAD);
}
SIM_EXPORT(cuLaunchKernel_ptsz);

static CUresult sim_launch_ex(const CUlaunchConfig *cfg, CUfunction f, void **params,
                              void **extra, enum sim_null_stream null_is)
{
    if (!cfg) {
        sim_count_submission();
        return CUDA_ERROR_INVALID_VALUE;
    }
    return sim_launch(f, cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ, cfg->blockDimX,
                      cfg->blockDimY, cfg->blockDimZ, cfg->hStream, params, extra, null_is);
}

CUresult sim_cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params,
                              void **extra)
{
    return sim_launch_ex(config, f, params, extra, SIM_NULL_LEGACY);
}
SIM_EXPORT(cuLaunchKernelEx);

CUresult sim_cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params,
                                   void **extra)
{
    return sim_launch_ex(config, f, params, extra, SIM_NULL_PER_THREAD);
}
SIM_EXPORT(cuLaunchKernelEx_ptsz);

CUresult sim_cuLaunchCooperativeKernel(SIM_SIG_LAUNCH_COOP)
{
    (void)shmem;
    return sim_launch(f, gx, gy, gz, bx, by, bz, s, params, NULL, SIM_NULL_LEGACY);
}
SIM_EXPORT(cuLaunchCooperativeKernel);

CUresult sim_cuLaunchCooperativeKernel_ptsz(SIM_SIG_LAUNCH_COOP)
{
    (void)shmem;
    return sim_launch(f, gx, gy, gz, bx, by, bz, s, params, NULL, SIM_NULL_PER_THREAD);
}
SIM_EXPORT(cuLaunchCooperativeKernel_ptsz);

/* ---- Host functions. ---- */

static CUresult sim_host_func(CUstream s, CUhostFn fn, void *data, enum sim_null_stream null_is)
{
    sim_count_submission();
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_work w = {
        .kind = SIM_JOB_MARKER, .duration_ns = 0, .event = SIM_NONE, .event_gen = 0};
    struct sim_target tg;
    uint64_t seq;
    CUresult r = sim_submit(s, null_is, &w, 0, &tg, &seq);
    if (r == CUDA_SUCCESS)
        r = sim_wait_stream(&tg, seq);
    if (r == CUDA_SUCCESS)
        fn(data);
    return r;
}

CUresult sim_cuLaunchHostFunc(CUstream s, CUhostFn fn, void *data)
{
    return sim_host_func(s, fn, data, SIM_NULL_LEGACY);
}
SIM_EXPORT(cuLaunchHostFunc);

CUresult sim_cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void *data)
{
    return sim_host_func(s, fn, data, SIM_NULL_PER_THREAD);
}
SIM_EXPORT(cuLaunchHostFunc_ptsz);

/* ---- Graphs. ---- */

static CUresult sim_graph_launch(CUgraphExec g, CUstream s, enum sim_null_stream null_is)
{
    sim_count_submission();
    if (!g)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_work w = {
        .kind = SIM_JOB_MARKER, .duration_ns = 0, .event = SIM_NONE, .event_gen = 0};
    struct sim_target tg;
    uint64_t seq;
    return sim_submit(s, null_is, &w, 0, &tg, &seq);
}

CUresult sim_cuGraphLaunch(CUgraphExec g, CUstream s)
{
    return sim_graph_launch(g, s, SIM_NULL_LEGACY);
}
SIM_EXPORT(cuGraphLaunch);

CUresult sim_cuGraphLaunch_ptsz(CUgraphExec g, CUstream s)
{
    return sim_graph_launch(g, s, SIM_NULL_PER_THREAD);
}
SIM_EXPORT(cuGraphLaunch_ptsz);

CUresult sim_cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
    if (!phGraph || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = sim_ensure_init();
    if (r != CUDA_SUCCESS)
        return r;
    struct sim_handle *h = sim_handle_new(SIM_MAGIC_GRAPH);
    if (!h)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *phGraph = (CUgraph)h;
    return CUDA_SUCCESS;
}
SIM_EXPORT(cuGraphCreate);

CUresult sim_cuGraphDestroy(CUgraph g)
{
    if (!g || g->h.magic != SIM_MAGIC_GRAPH)
        return CUDA_ERROR_INVALID_VALUE;
    sim_handle_kill(&g->h); /* its execs live on, as in the driver */
    return CUDA_SUCCESS;
}
SIM_EXPORT(cuGraphDestroy);

/* The flags (auto-free on launch, upload, device launch, node priority) are accepted and
 * ignored. */
CUresult sim_cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph g,
                                         unsigned long long flags)
{
    (void)flags;
    if (!phGraphExec || !g || g->h.magic != SIM_MAGIC_GRAPH)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = sim_ctx_current(&c);
    if (r != CUDA_SUCCESS)
        return r;
    struct sim_handle *h;
    r = sim_handle_new_charged(SIM_MAGIC_GRAPH_EXEC, c, sim_cfg.graph_bytes, &h);
    if (r == CUDA_SUCCESS)
        *phGraphExec = (CUgraphExec)h;
    return r;
}
SIM_EXPORT(cuGraphInstantiateWithFlags);

CUresult sim_cuGraphExecDestroy(CUgraphExec e)
{
    if (!e || e->h.magic != SIM_MAGIC_GRAPH_EXEC)
        return CUDA_ERROR_INVALID_VALUE;
    sim_handle_drop(&e->h);
    return CUDA_SUCCESS;
}
SIM_EXPORT(cuGraphExecDestroy);
