/*
 * sim_procaddr.c: cuGetProcAddress, as the real driver does it.
 *
 * The table maps a base name (what callers ask for, e.g. "cuMemcpyHtoD") to the exact
 * functions that implement it, each with the first CUDA version whose headers map the base
 * name onto it, and whether it is the per-thread-default-stream twin (_ptsz/_ptds). A lookup
 * picks the newest exact function whose version is <= cudaVersion; with
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM it prefers a per-thread twin where one exists.
 *
 * The addresses are those of the hidden sim_<name> functions, which the exported names alias:
 * exactly what dlsym(handle, "<exact name>") returns. Exact (versioned) names are not base
 * names and are not found, as in the real driver.
 */
#include <string.h>

#include "sim.h"

struct sim_proc_entry {
    const char *base;
    void *fn;
    int version; /* the first cudaVersion that gets this exact function */
    int per_thread;
};

#define E(base, exact, version) {base, (void *)sim_##exact, version, 0}
#define PT(base, exact, version) {base, (void *)sim_##exact, version, 1}

static const struct sim_proc_entry sim_proc_table[] = {
    E("cuInit", cuInit, 2000),
    E("cuDriverGetVersion", cuDriverGetVersion, 2020),
    E("cuDeviceGet", cuDeviceGet, 2000),
    E("cuDeviceGetCount", cuDeviceGetCount, 2000),
    E("cuDeviceGetName", cuDeviceGetName, 2000),
    E("cuDeviceTotalMem", cuDeviceTotalMem, 2000),
    E("cuDeviceTotalMem", cuDeviceTotalMem_v2, 3020),
    E("cuDeviceGetAttribute", cuDeviceGetAttribute, 2000),

    E("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain, 7000),
    E("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease, 7000),
    E("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2, 11000),
    E("cuDevicePrimaryCtxGetState", cuDevicePrimaryCtxGetState, 7000),
    E("cuCtxCreate", cuCtxCreate, 2000),
    E("cuCtxCreate", cuCtxCreate_v2, 3020),
    E("cuCtxCreate", cuCtxCreate_v3, 11040),
    E("cuCtxCreate", cuCtxCreate_v4, 12050),
    E("cuCtxDestroy", cuCtxDestroy, 2000),
    E("cuCtxDestroy", cuCtxDestroy_v2, 4000),
    E("cuCtxSetCurrent", cuCtxSetCurrent, 4000),
    E("cuCtxGetCurrent", cuCtxGetCurrent, 4000),
    E("cuCtxPushCurrent", cuCtxPushCurrent, 2000),
    E("cuCtxPushCurrent", cuCtxPushCurrent_v2, 4000),
    E("cuCtxPopCurrent", cuCtxPopCurrent, 2000),
    E("cuCtxPopCurrent", cuCtxPopCurrent_v2, 4000),
    E("cuCtxSynchronize", cuCtxSynchronize, 2000),
    E("cuCtxGetDevice", cuCtxGetDevice, 2000),

    E("cuModuleLoadData", cuModuleLoadData, 2000),
    E("cuModuleLoadDataEx", cuModuleLoadDataEx, 2010),
    E("cuModuleGetFunction", cuModuleGetFunction, 2000),
    E("cuModuleUnload", cuModuleUnload, 2000),
    E("cuLibraryLoadData", cuLibraryLoadData, 12000),
    E("cuLibraryGetKernel", cuLibraryGetKernel, 12000),
    E("cuKernelGetFunction", cuKernelGetFunction, 12000),
    E("cuLibraryUnload", cuLibraryUnload, 12000),

    E("cuStreamCreate", cuStreamCreate, 2000),
    E("cuStreamDestroy", cuStreamDestroy, 2000),
    E("cuStreamDestroy", cuStreamDestroy_v2, 4000),
    E("cuStreamSynchronize", cuStreamSynchronize, 2000),
    PT("cuStreamSynchronize", cuStreamSynchronize_ptsz, 7000),
    E("cuStreamQuery", cuStreamQuery, 2000),
    PT("cuStreamQuery", cuStreamQuery_ptsz, 7000),
    E("cuEventCreate", cuEventCreate, 2000),
    E("cuEventRecord", cuEventRecord, 2000),
    PT("cuEventRecord", cuEventRecord_ptsz, 7000),
    E("cuEventRecordWithFlags", cuEventRecordWithFlags, 11010),
    PT("cuEventRecordWithFlags", cuEventRecordWithFlags_ptsz, 11010),
    E("cuEventQuery", cuEventQuery, 2000),
    E("cuEventSynchronize", cuEventSynchronize, 2000),
    E("cuEventElapsedTime", cuEventElapsedTime, 2000),
    E("cuEventElapsedTime", cuEventElapsedTime_v2, 12080),
    E("cuEventDestroy", cuEventDestroy, 2000),
    E("cuEventDestroy", cuEventDestroy_v2, 4000),

    /* The v1 (32-bit) memory entry points (cuMemAlloc ... cuArrayCreate) are not provided:
     * below 3020 these are VERSION_NOT_SUFFICIENT. */
    E("cuMemAlloc", cuMemAlloc_v2, 3020),
    E("cuMemFree", cuMemFree_v2, 3020),
    E("cuMemGetInfo", cuMemGetInfo_v2, 3020),
    E("cuMemAllocPitch", cuMemAllocPitch_v2, 3020),
    E("cuMemAllocManaged", cuMemAllocManaged, 6000),
    E("cuArrayCreate", cuArrayCreate_v2, 3020),
    E("cuArrayDestroy", cuArrayDestroy, 2000),
    E("cuMemAllocAsync", cuMemAllocAsync, 11020),
    PT("cuMemAllocAsync", cuMemAllocAsync_ptsz, 11020),
    E("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync, 11020),
    PT("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync_ptsz, 11020),
    E("cuMemFreeAsync", cuMemFreeAsync, 11020),
    PT("cuMemFreeAsync", cuMemFreeAsync_ptsz, 11020),
    E("cuDeviceGetDefaultMemPool", cuDeviceGetDefaultMemPool, 11020),
    E("cuMemPoolCreate", cuMemPoolCreate, 11020),
    E("cuMemPoolDestroy", cuMemPoolDestroy, 11020),
    E("cuMemPoolTrimTo", cuMemPoolTrimTo, 11020),
    E("cuMemGetAllocationGranularity", cuMemGetAllocationGranularity, 10020),
    E("cuMemAddressReserve", cuMemAddressReserve, 10020),
    E("cuMemAddressFree", cuMemAddressFree, 10020),
    E("cuMemCreate", cuMemCreate, 10020),
    E("cuMemRelease", cuMemRelease, 10020),
    E("cuMemMap", cuMemMap, 10020),
    E("cuMemUnmap", cuMemUnmap, 10020),
    E("cuMemSetAccess", cuMemSetAccess, 10020),
    E("cuMemcpyHtoD", cuMemcpyHtoD_v2, 3020),
    PT("cuMemcpyHtoD", cuMemcpyHtoD_v2_ptds, 7000),
    E("cuMemcpyDtoH", cuMemcpyDtoH_v2, 3020),
    PT("cuMemcpyDtoH", cuMemcpyDtoH_v2_ptds, 7000),
    E("cuMemcpyDtoD", cuMemcpyDtoD_v2, 3020),
    PT("cuMemcpyDtoD", cuMemcpyDtoD_v2_ptds, 7000),
    E("cuMemcpy", cuMemcpy, 4000),
    PT("cuMemcpy", cuMemcpy_ptds, 7000),
    E("cuMemcpyAsync", cuMemcpyAsync, 4000),
    PT("cuMemcpyAsync", cuMemcpyAsync_ptsz, 7000),
    E("cuMemcpyHtoDAsync", cuMemcpyHtoDAsync_v2, 3020),
    PT("cuMemcpyHtoDAsync", cuMemcpyHtoDAsync_v2_ptsz, 7000),
    E("cuMemcpyDtoHAsync", cuMemcpyDtoHAsync_v2, 3020),
    PT("cuMemcpyDtoHAsync", cuMemcpyDtoHAsync_v2_ptsz, 7000),
    E("cuMemcpyDtoDAsync", cuMemcpyDtoDAsync_v2, 3020),
    PT("cuMemcpyDtoDAsync", cuMemcpyDtoDAsync_v2_ptsz, 7000),
    E("cuMemsetD8", cuMemsetD8_v2, 3020),
    PT("cuMemsetD8", cuMemsetD8_v2_ptds, 7000),
    E("cuMemsetD32", cuMemsetD32_v2, 3020),
    PT("cuMemsetD32", cuMemsetD32_v2_ptds, 7000),
    E("cuMemsetD8Async", cuMemsetD8Async, 3020),
    PT("cuMemsetD8Async", cuMemsetD8Async_ptsz, 7000),
    E("cuMemsetD32Async", cuMemsetD32Async, 3020),
    PT("cuMemsetD32Async", cuMemsetD32Async_ptsz, 7000),

    E("cuLaunchKernel", cuLaunchKernel, 4000),
    PT("cuLaunchKernel", cuLaunchKernel_ptsz, 7000),
    E("cuLaunchKernelEx", cuLaunchKernelEx, 11060),
    PT("cuLaunchKernelEx", cuLaunchKernelEx_ptsz, 11060),
    E("cuLaunchCooperativeKernel", cuLaunchCooperativeKernel, 9000),
    PT("cuLaunchCooperativeKernel", cuLaunchCooperativeKernel_ptsz, 9000),
    E("cuLaunchHostFunc", cuLaunchHostFunc, 10000),
    PT("cuLaunchHostFunc", cuLaunchHostFunc_ptsz, 10000),
    E("cuGraphLaunch", cuGraphLaunch, 10000),
    PT("cuGraphLaunch", cuGraphLaunch_ptsz, 10000),
    E("cuGraphCreate", cuGraphCreate, 10000),
    E("cuGraphDestroy", cuGraphDestroy, 10000),
    /* Only under its own name: the older cuGraphInstantiate (5 parameters) is not provided. */
    E("cuGraphInstantiateWithFlags", cuGraphInstantiateWithFlags, 11040),
    E("cuGraphExecDestroy", cuGraphExecDestroy, 10000),

    E("cuCheckpointProcessGetState", cuCheckpointProcessGetState, 12080),
    E("cuCheckpointProcessLock", cuCheckpointProcessLock, 12080),
    E("cuCheckpointProcessCheckpoint", cuCheckpointProcessCheckpoint, 12080),
    E("cuCheckpointProcessRestore", cuCheckpointProcessRestore, 12080),
    E("cuCheckpointProcessUnlock", cuCheckpointProcessUnlock, 12080),
    E("cuCheckpointProcessGetRestoreThreadId", cuCheckpointProcessGetRestoreThreadId, 12080),

    E("cuGetErrorName", cuGetErrorName, 6000),
    E("cuGetErrorString", cuGetErrorString, 6000),
    E("cuGetProcAddress", cuGetProcAddress, 11030),
    E("cuGetProcAddress", cuGetProcAddress_v2, 12000),
};

#define SIM_PROC_FLAGS                                                                         \
    (CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)

static CUresult sim_lookup(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                           CUdriverProcAddressQueryResult *status)
{
    sim_ensure_init(); /* for the configuration (debug output); lookups work regardless */
    if (!symbol || !pfn || (flags & ~(cuuint64_t)SIM_PROC_FLAGS))
        return CUDA_ERROR_INVALID_VALUE;
    int per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const struct sim_proc_entry *best = NULL, *best_pt = NULL;
    int known = 0;
    for (size_t i = 0; i < sizeof sim_proc_table / sizeof sim_proc_table[0]; i++) {
        const struct sim_proc_entry *e = &sim_proc_table[i];
        if (strcmp(e->base, symbol) != 0)
            continue;
        known = 1;
        if (e->version > cudaVersion)
            continue;
        const struct sim_proc_entry **slot = e->per_thread ? &best_pt : &best;
        if (!*slot || e->version > (*slot)->version)
            *slot = e;
    }
    const struct sim_proc_entry *pick = per_thread && best_pt ? best_pt : best;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    if (!known)
        st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    else if (!pick)
        st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    *pfn = st == CU_GET_PROC_ADDRESS_SUCCESS ? pick->fn : NULL;
    if (status)
        *status = st;
    sim_debug("cuGetProcAddress(\"%s\", %d, %llu) -> %p", symbol, cudaVersion,
              (unsigned long long)flags, *pfn);
    return st == CU_GET_PROC_ADDRESS_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult sim_cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    return sim_lookup(symbol, pfn, cudaVersion, flags, NULL);
}
SIM_EXPORT(cuGetProcAddress);

CUresult sim_cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                 cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
    return sim_lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}
SIM_EXPORT(cuGetProcAddress_v2);
