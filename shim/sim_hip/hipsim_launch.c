/*
 * hipsim_launch.c: modules, kernel launches, host functions and graphs.
 *
 * Module functions are the driver's (any image loads, any name is a function, and a kernel's
 * length is its first parameter). Launches by host function pointer (hipLaunchKernel and
 * friends) have no module: any non-NULL pointer launches the spin kernel of the current device
 * with the arguments given (args[0] points at the uint64_t length). Cooperative launches are
 * plain launches; the multi-device ones launch each entry.
 *
 * A graph is a list of kernel nodes (hipGraphAddKernelNode), each keeping its dimensions and
 * length; an instantiated graph launches them in order on the stream, or, with no node, queues
 * the driver's graph launch (a zero-length job), so that a graph launch is always a submission.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "hipsim.h"

/* The driver's launch-parameter keys: HIP's differ in the end marker only. */
#define HS_CU_PARAM_END ((void *)0x00)
#define HS_EXTRA_MAX 64

hipError_t hs_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                     unsigned by, unsigned bz, unsigned shmem, hipStream_t s, void **params,
                     void **extra)
{
    hipError_t e = hs_enter();
    if (e != hipSuccess)
        return e;
    void *cu_extra[HS_EXTRA_MAX + 1];
    void **x = NULL;
    if (extra) {
        size_t i = 0;
        for (; i < HS_EXTRA_MAX && extra[i] != HIP_LAUNCH_PARAM_END; i++)
            cu_extra[i] = extra[i];
        cu_extra[i] = HS_CU_PARAM_END;
        x = cu_extra;
    }
    return hs_err(cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, HS_STREAM(s), params, x));
}

/* The spin kernel, for launches by host function pointer. */
static hipError_t hs_host_kernel(const void *host_fn, size_t shmem, CUfunction *f)
{
    if (!host_fn)
        return hipErrorInvalidDeviceFunction;
    if (shmem > UINT_MAX)
        return hipErrorInvalidValue;
    return hs_spin_function(f);
}

/* ---- Modules. ---- */

hipError_t hipModuleLoadData(hipModule_t *module, const void *image)
{
    if (!module || !image)
        return hs_ret(hipErrorInvalidValue);
    hipError_t e = hs_enter();
    if (e != hipSuccess)
        return hs_ret(e);
    return hs_ret(hs_err(cuModuleLoadData((CUmodule *)module, image)));
}

hipError_t hipModuleUnload(hipModule_t module)
{
    if (!module)
        return hs_ret(hipErrorInvalidHandle);
    return hs_ret(hs_err(cuModuleUnload((CUmodule)module)));
}

hipError_t hipModuleGetFunction(hipFunction_t *function, hipModule_t module, const char *kname)
{
    if (!function || !kname)
        return hs_ret(hipErrorInvalidValue);
    if (!module)
        return hs_ret(hipErrorInvalidHandle);
    return hs_ret(hs_err(cuModuleGetFunction((CUfunction *)function, (CUmodule)module, kname)));
}

/* ---- Launches. ---- */

hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned int gridDimX, unsigned int gridDimY,
                                 unsigned int gridDimZ, unsigned int blockDimX,
                                 unsigned int blockDimY, unsigned int blockDimZ,
                                 unsigned int sharedMemBytes, hipStream_t stream,
                                 void **kernelParams, void **extra)
{
    return hs_ret(hs_launch((CUfunction)f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                            blockDimZ, sharedMemBytes, stream, kernelParams, extra));
}

hipError_t hipLaunchKernel(const void *function_address, dim3 numBlocks, dim3 dimBlocks,
                           void **args, size_t sharedMemBytes, hipStream_t stream)
{
    CUfunction f;
    hipError_t e = hs_host_kernel(function_address, sharedMemBytes, &f);
    if (e != hipSuccess)
        return hs_ret(e);
    /* through the PLT */
    return hipModuleLaunchKernel((hipFunction_t)f, numBlocks.x, numBlocks.y, numBlocks.z,
                                 dimBlocks.x, dimBlocks.y, dimBlocks.z,
                                 (unsigned int)sharedMemBytes, stream, args, NULL);
}

hipError_t hipLaunchKernel_spt(const void *function_address, dim3 numBlocks, dim3 dimBlocks,
                               void **args, size_t sharedMemBytes, hipStream_t stream)
{
    return hipLaunchKernel(function_address, numBlocks, dimBlocks, args, sharedMemBytes,
                           HS_SPT(stream));
}

/* The events bracket the kernel in its stream (ROCm stamps them from the kernel itself). */
static hipError_t hs_launch_timed(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                  unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                  hipStream_t s, void **params, void **extra, hipEvent_t start,
                                  hipEvent_t stop)
{
    hipError_t e = hs_enter();
    if (e == hipSuccess && start)
        e = hs_err(cuEventRecord(HS_EVENT(start), HS_STREAM(s)));
    if (e == hipSuccess)
        e = hs_launch(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
    if (e == hipSuccess && stop)
        e = hs_err(cuEventRecord(HS_EVENT(stop), HS_STREAM(s)));
    return e;
}

hipError_t hipExtLaunchKernel(const void *function_address, dim3 numBlocks, dim3 dimBlocks,
                              void **args, size_t sharedMemBytes, hipStream_t stream,
                              hipEvent_t startEvent, hipEvent_t stopEvent, int flags)
{
    (void)flags; /* hipExtAnyOrderLaunch: the simulated streams run in order anyway */
    CUfunction f;
    hipError_t e = hs_host_kernel(function_address, sharedMemBytes, &f);
    if (e != hipSuccess)
        return hs_ret(e);
    return hs_ret(hs_launch_timed(f, numBlocks.x, numBlocks.y, numBlocks.z, dimBlocks.x,
                                  dimBlocks.y, dimBlocks.z, (unsigned)sharedMemBytes, stream,
                                  args, NULL, startEvent, stopEvent));
}

/* Sizes in work-items: the grid is the global size over the block, rounded up. */
hipError_t hipExtModuleLaunchKernel(hipFunction_t f, uint32_t globalWorkSizeX,
                                    uint32_t globalWorkSizeY, uint32_t globalWorkSizeZ,
                                    uint32_t localWorkSizeX, uint32_t localWorkSizeY,
                                    uint32_t localWorkSizeZ, size_t sharedMemBytes,
                                    hipStream_t hStream, void **kernelParams, void **extra,
                                    hipEvent_t startEvent, hipEvent_t stopEvent, uint32_t flags)
{
    (void)flags;
    if (!localWorkSizeX || !localWorkSizeY || !localWorkSizeZ || sharedMemBytes > UINT_MAX)
        return hs_ret(hipErrorInvalidValue);
    unsigned gx = (unsigned)(((uint64_t)globalWorkSizeX + localWorkSizeX - 1) / localWorkSizeX);
    unsigned gy = (unsigned)(((uint64_t)globalWorkSizeY + localWorkSizeY - 1) / localWorkSizeY);
    unsigned gz = (unsigned)(((uint64_t)globalWorkSizeZ + localWorkSizeZ - 1) / localWorkSizeZ);
    return hs_ret(hs_launch_timed((CUfunction)f, gx, gy, gz, localWorkSizeX, localWorkSizeY,
                                  localWorkSizeZ, (unsigned)sharedMemBytes, hStream, kernelParams,
                                  extra, startEvent, stopEvent));
}

hipError_t hipLaunchCooperativeKernel(const void *f, dim3 gridDim, dim3 blockDimX,
                                      void **kernelParams, unsigned int sharedMemBytes,
                                      hipStream_t stream)
{
    CUfunction fn;
    hipError_t e = hs_host_kernel(f, sharedMemBytes, &fn);
    if (e != hipSuccess)
        return hs_ret(e);
    return hs_ret(hs_launch(fn, gridDim.x, gridDim.y, gridDim.z, blockDimX.x, blockDimX.y,
                            blockDimX.z, sharedMemBytes, stream, kernelParams, NULL));
}

hipError_t hipLaunchCooperativeKernel_spt(const void *f, dim3 gridDim, dim3 blockDim,
                                          void **kernelParams, uint32_t sharedMemBytes,
                                          hipStream_t hStream)
{
    return hipLaunchCooperativeKernel(f, gridDim, blockDim, kernelParams, sharedMemBytes,
                                      HS_SPT(hStream));
}

/* Each entry in its own stream; the first failure stops the list. */
hipError_t hipLaunchCooperativeKernelMultiDevice(hipLaunchParams *launchParamsList, int numDevices,
                                                 unsigned int flags)
{
    (void)flags; /* no pre- or post-synchronisation to skip between simulated streams */
    if (!launchParamsList || numDevices <= 0 || numDevices > hs_device_count())
        return hs_ret(hipErrorInvalidValue);
    for (int i = 0; i < numDevices; i++) {
        const hipLaunchParams *p = &launchParamsList[i];
        CUfunction f;
        hipError_t e = hs_host_kernel(p->func, p->sharedMem, &f);
        if (e == hipSuccess)
            e = hs_launch(f, p->gridDim.x, p->gridDim.y, p->gridDim.z, p->blockDim.x,
                          p->blockDim.y, p->blockDim.z, (unsigned)p->sharedMem, p->stream,
                          p->args, NULL);
        if (e != hipSuccess)
            return hs_ret(e);
    }
    return hipSuccess;
}

hipError_t hipModuleLaunchCooperativeKernel(hipFunction_t f, unsigned int gridDimX,
                                            unsigned int gridDimY, unsigned int gridDimZ,
                                            unsigned int blockDimX, unsigned int blockDimY,
                                            unsigned int blockDimZ, unsigned int sharedMemBytes,
                                            hipStream_t stream, void **kernelParams)
{
    return hs_ret(hs_launch((CUfunction)f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                            blockDimZ, sharedMemBytes, stream, kernelParams, NULL));
}

hipError_t hipModuleLaunchCooperativeKernelMultiDevice(hipFunctionLaunchParams *launchParamsList,
                                                       unsigned int numDevices, unsigned int flags)
{
    (void)flags;
    if (!launchParamsList || numDevices == 0 || numDevices > (unsigned)hs_device_count())
        return hs_ret(hipErrorInvalidValue);
    for (unsigned i = 0; i < numDevices; i++) {
        const hipFunctionLaunchParams *p = &launchParamsList[i];
        hipError_t e = hs_launch((CUfunction)p->function, p->gridDimX, p->gridDimY, p->gridDimZ,
                                 p->blockDimX, p->blockDimY, p->blockDimZ, p->sharedMemBytes,
                                 p->hStream, p->kernelParams, NULL);
        if (e != hipSuccess)
            return hs_ret(e);
    }
    return hipSuccess;
}

/* ---- Host functions: the driver runs them when the stream reaches them. ---- */

hipError_t hipLaunchHostFunc(hipStream_t stream, hipHostFn_t fn, void *userData)
{
    if (!fn)
        return hs_ret(hipErrorInvalidValue);
    hipError_t e = hs_enter();
    if (e != hipSuccess)
        return hs_ret(e);
    return hs_ret(hs_err(cuLaunchHostFunc(HS_STREAM(stream), (CUhostFn)fn, userData)));
}

hipError_t hipLaunchHostFunc_spt(hipStream_t stream, hipHostFn_t fn, void *userData)
{
    return hipLaunchHostFunc(HS_SPT(stream), fn, userData);
}

/* ---- Graphs. ---- */

/* A kernel node as launched: the parameters are copied when the node is made, as in HIP; of
 * the kernel's arguments only the first (its length) matters to the simulator. */
struct hipGraphNode {
    struct hipGraphNode *next;
    unsigned grid[3], block[3], shmem;
    uint64_t ns;
};

struct ihipGraph {
    struct hipGraphNode *head, **tail;
};

struct hipGraphExec {
    size_t n;
    struct hipGraphNode nodes[]; /* copies, in insertion order */
};

/* The first 8 bytes of the first argument, from kernelParams or HIP's `extra` buffer. */
static uint64_t hs_first_arg(void **params, void **extra)
{
    uint64_t ns = 0;
    if (params) {
        if (params[0])
            memcpy(&ns, params[0], sizeof ns);
        return ns;
    }
    const void *buf = NULL;
    size_t size = sizeof ns;
    for (size_t i = 0; extra && i < HS_EXTRA_MAX && extra[i] != HIP_LAUNCH_PARAM_END; i += 2) {
        if (extra[i] == HIP_LAUNCH_PARAM_BUFFER_POINTER)
            buf = extra[i + 1];
        else if (extra[i] == HIP_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1])
            memcpy(&size, extra[i + 1], sizeof size);
        else
            break;
    }
    if (buf)
        memcpy(&ns, buf, size < sizeof ns ? size : sizeof ns);
    return ns;
}

hipError_t hipGraphCreate(hipGraph_t *pGraph, unsigned int flags)
{
    if (!pGraph || flags != 0)
        return hs_ret(hipErrorInvalidValue);
    struct ihipGraph *g = malloc(sizeof *g);
    if (!g)
        return hs_ret(hipErrorOutOfMemory);
    g->head = NULL;
    g->tail = &g->head;
    *pGraph = g;
    return hipSuccess;
}

hipError_t hipGraphDestroy(hipGraph_t graph)
{
    if (!graph)
        return hs_ret(hipErrorInvalidValue);
    for (struct hipGraphNode *n = graph->head, *next; n; n = next) {
        next = n->next;
        free(n);
    }
    free(graph);
    return hipSuccess;
}

/* Dependencies are accepted and not kept: the nodes run in the order they were added. */
hipError_t hipGraphAddKernelNode(hipGraphNode_t *pGraphNode, hipGraph_t graph,
                                 const hipGraphNode_t *pDependencies, size_t numDependencies,
                                 const hipKernelNodeParams *pNodeParams)
{
    if (!pGraphNode || !graph || !pNodeParams || (numDependencies && !pDependencies))
        return hs_ret(hipErrorInvalidValue);
    const hipKernelNodeParams *p = pNodeParams;
    if (!p->func)
        return hs_ret(hipErrorInvalidDeviceFunction);
    if (!p->gridDim.x || !p->gridDim.y || !p->gridDim.z || !p->blockDim.x || !p->blockDim.y ||
        !p->blockDim.z)
        return hs_ret(hipErrorInvalidValue);
    struct hipGraphNode *n = calloc(1, sizeof *n);
    if (!n)
        return hs_ret(hipErrorOutOfMemory);
    n->grid[0] = p->gridDim.x;
    n->grid[1] = p->gridDim.y;
    n->grid[2] = p->gridDim.z;
    n->block[0] = p->blockDim.x;
    n->block[1] = p->blockDim.y;
    n->block[2] = p->blockDim.z;
    n->shmem = p->sharedMemBytes;
    n->ns = hs_first_arg(p->kernelParams, p->extra);
    *graph->tail = n;
    graph->tail = &n->next;
    *pGraphNode = n;
    return hipSuccess;
}

hipError_t hipGraphInstantiate(hipGraphExec_t *pGraphExec, hipGraph_t graph,
                               hipGraphNode_t *pErrorNode, char *pLogBuffer, size_t bufferSize)
{
    if (pErrorNode)
        *pErrorNode = NULL;
    if (pLogBuffer && bufferSize)
        pLogBuffer[0] = '\0';
    if (!pGraphExec || !graph)
        return hs_ret(hipErrorInvalidValue);
    size_t count = 0;
    for (const struct hipGraphNode *n = graph->head; n; n = n->next)
        count++;
    struct hipGraphExec *x = malloc(sizeof *x + count * sizeof x->nodes[0]);
    if (!x)
        return hs_ret(hipErrorOutOfMemory);
    x->n = 0;
    for (const struct hipGraphNode *n = graph->head; n; n = n->next)
        x->nodes[x->n++] = *n;
    *pGraphExec = x;
    return hipSuccess;
}

hipError_t hipGraphExecDestroy(hipGraphExec_t graphExec)
{
    if (!graphExec)
        return hs_ret(hipErrorInvalidValue);
    free(graphExec);
    return hipSuccess;
}

hipError_t hipGraphLaunch(hipGraphExec_t graphExec, hipStream_t stream)
{
    if (!graphExec)
        return hs_ret(hipErrorInvalidValue);
    hipError_t e = hs_enter();
    if (e != hipSuccess)
        return hs_ret(e);
    if (graphExec->n == 0)
        return hs_ret(hs_err(cuGraphLaunch((CUgraphExec)graphExec, HS_STREAM(stream))));
    CUfunction f;
    e = hs_spin_function(&f);
    for (size_t i = 0; e == hipSuccess && i < graphExec->n; i++) {
        struct hipGraphNode *n = &graphExec->nodes[i];
        void *params[] = {&n->ns};
        e = hs_launch(f, n->grid[0], n->grid[1], n->grid[2], n->block[0], n->block[1],
                      n->block[2], n->shmem, stream, params, NULL);
    }
    return hs_ret(e);
}

hipError_t hipGraphLaunch_spt(hipGraphExec_t graphExec, hipStream_t stream)
{
    return hipGraphLaunch(graphExec, HS_SPT(stream));
}
