/*
 * sim_entries.h: the hidden implementation of every exported driver name, one function per
 * exact ELF name (sim_<name>), with the ABI that name has in the real driver (cuda.h's
 * prototypes; the unversioned names keep their legacy ABI, e.g. cuDeviceTotalMem takes an
 * unsigned int *). Included by sim.h only.
 */
#ifndef KREX_SIM_ENTRIES_H
#define KREX_SIM_ENTRIES_H

#define SIM_SIG_LAUNCH                                                                        \
    CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,        \
        unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void **params,     \
        void **extra
#define SIM_SIG_LAUNCH_COOP                                                                   \
    CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,        \
        unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void **params

/* Initialisation, version, devices. */
SIM_HIDDEN CUresult sim_cuInit(unsigned int flags);
SIM_HIDDEN CUresult sim_cuDriverGetVersion(int *version);
SIM_HIDDEN CUresult sim_cuDeviceGet(CUdevice *device, int ordinal);
SIM_HIDDEN CUresult sim_cuDeviceGetCount(int *count);
SIM_HIDDEN CUresult sim_cuDeviceGetName(char *name, int len, CUdevice dev);
SIM_HIDDEN CUresult sim_cuDeviceTotalMem(unsigned int *bytes, CUdevice dev);
SIM_HIDDEN CUresult sim_cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
SIM_HIDDEN CUresult sim_cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev);

/* Contexts. */
SIM_HIDDEN CUresult sim_cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
SIM_HIDDEN CUresult sim_cuDevicePrimaryCtxRelease(CUdevice dev);
SIM_HIDDEN CUresult sim_cuDevicePrimaryCtxRelease_v2(CUdevice dev);
SIM_HIDDEN CUresult sim_cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags,
                                                   int *active);
SIM_HIDDEN CUresult sim_cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);
SIM_HIDDEN CUresult sim_cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
SIM_HIDDEN CUresult sim_cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n,
                                       unsigned int flags, CUdevice dev);
SIM_HIDDEN CUresult sim_cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params,
                                       unsigned int flags, CUdevice dev);
SIM_HIDDEN CUresult sim_cuCtxDestroy(CUcontext ctx);
SIM_HIDDEN CUresult sim_cuCtxDestroy_v2(CUcontext ctx);
SIM_HIDDEN CUresult sim_cuCtxSetCurrent(CUcontext ctx);
SIM_HIDDEN CUresult sim_cuCtxGetCurrent(CUcontext *pctx);
SIM_HIDDEN CUresult sim_cuCtxPushCurrent(CUcontext ctx);
SIM_HIDDEN CUresult sim_cuCtxPushCurrent_v2(CUcontext ctx);
SIM_HIDDEN CUresult sim_cuCtxPopCurrent(CUcontext *pctx);
SIM_HIDDEN CUresult sim_cuCtxPopCurrent_v2(CUcontext *pctx);
SIM_HIDDEN CUresult sim_cuCtxSynchronize(void);
SIM_HIDDEN CUresult sim_cuCtxGetDevice(CUdevice *device);

/* Modules and libraries. */
SIM_HIDDEN CUresult sim_cuModuleLoadData(CUmodule *module, const void *image);
SIM_HIDDEN CUresult sim_cuModuleLoadDataEx(CUmodule *module, const void *image,
                                           unsigned int numOptions, CUjit_option *options,
                                           void **optionValues);
SIM_HIDDEN CUresult sim_cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
SIM_HIDDEN CUresult sim_cuModuleUnload(CUmodule hmod);
SIM_HIDDEN CUresult sim_cuLibraryLoadData(CUlibrary *library, const void *code,
                                          CUjit_option *jitOptions, void **jitOptionsValues,
                                          unsigned int numJitOptions,
                                          CUlibraryOption *libraryOptions,
                                          void **libraryOptionValues,
                                          unsigned int numLibraryOptions);
SIM_HIDDEN CUresult sim_cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name);
SIM_HIDDEN CUresult sim_cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel);
SIM_HIDDEN CUresult sim_cuLibraryUnload(CUlibrary library);

/* Streams and events. */
SIM_HIDDEN CUresult sim_cuStreamCreate(CUstream *phStream, unsigned int flags);
SIM_HIDDEN CUresult sim_cuStreamDestroy(CUstream s);
SIM_HIDDEN CUresult sim_cuStreamDestroy_v2(CUstream s);
SIM_HIDDEN CUresult sim_cuStreamSynchronize(CUstream s);
SIM_HIDDEN CUresult sim_cuStreamSynchronize_ptsz(CUstream s);
SIM_HIDDEN CUresult sim_cuStreamQuery(CUstream s);
SIM_HIDDEN CUresult sim_cuStreamQuery_ptsz(CUstream s);
SIM_HIDDEN CUresult sim_cuEventCreate(CUevent *phEvent, unsigned int flags);
SIM_HIDDEN CUresult sim_cuEventRecord(CUevent e, CUstream s);
SIM_HIDDEN CUresult sim_cuEventRecord_ptsz(CUevent e, CUstream s);
SIM_HIDDEN CUresult sim_cuEventRecordWithFlags(CUevent e, CUstream s, unsigned int flags);
SIM_HIDDEN CUresult sim_cuEventRecordWithFlags_ptsz(CUevent e, CUstream s, unsigned int flags);
SIM_HIDDEN CUresult sim_cuEventQuery(CUevent e);
SIM_HIDDEN CUresult sim_cuEventSynchronize(CUevent e);
SIM_HIDDEN CUresult sim_cuEventElapsedTime(float *ms, CUevent start, CUevent end);
SIM_HIDDEN CUresult sim_cuEventElapsedTime_v2(float *ms, CUevent start, CUevent end);
SIM_HIDDEN CUresult sim_cuEventDestroy(CUevent e);
SIM_HIDDEN CUresult sim_cuEventDestroy_v2(CUevent e);

/* Memory. */
SIM_HIDDEN CUresult sim_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes);
SIM_HIDDEN CUresult sim_cuMemFree_v2(CUdeviceptr dptr);
SIM_HIDDEN CUresult sim_cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes);
SIM_HIDDEN CUresult sim_cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                           size_t Height, unsigned int ElementSizeBytes);
SIM_HIDDEN CUresult sim_cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags);
SIM_HIDDEN CUresult sim_cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *d);
SIM_HIDDEN CUresult sim_cuArrayDestroy(CUarray h);

/* Stream-ordered allocation and pools. */
SIM_HIDDEN CUresult sim_cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream s);
SIM_HIDDEN CUresult sim_cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream s);
SIM_HIDDEN CUresult sim_cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes,
                                                CUmemoryPool pool, CUstream s);
SIM_HIDDEN CUresult sim_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes,
                                                     CUmemoryPool pool, CUstream s);
SIM_HIDDEN CUresult sim_cuMemFreeAsync(CUdeviceptr dptr, CUstream s);
SIM_HIDDEN CUresult sim_cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s);
SIM_HIDDEN CUresult sim_cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev);
SIM_HIDDEN CUresult sim_cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props);
SIM_HIDDEN CUresult sim_cuMemPoolDestroy(CUmemoryPool pool);
SIM_HIDDEN CUresult sim_cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep);

/* Virtual memory management. */
SIM_HIDDEN CUresult sim_cuMemGetAllocationGranularity(size_t *granularity,
                                                      const CUmemAllocationProp *prop,
                                                      CUmemAllocationGranularity_flags option);
SIM_HIDDEN CUresult sim_cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                            CUdeviceptr addr, unsigned long long flags);
SIM_HIDDEN CUresult sim_cuMemAddressFree(CUdeviceptr ptr, size_t size);
SIM_HIDDEN CUresult sim_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                    const CUmemAllocationProp *prop, unsigned long long flags);
SIM_HIDDEN CUresult sim_cuMemRelease(CUmemGenericAllocationHandle handle);
SIM_HIDDEN CUresult sim_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                 CUmemGenericAllocationHandle handle, unsigned long long flags);
SIM_HIDDEN CUresult sim_cuMemUnmap(CUdeviceptr ptr, size_t size);
SIM_HIDDEN CUresult sim_cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                       size_t count);

/* Copies and sets. */
SIM_HIDDEN CUresult sim_cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n);
SIM_HIDDEN CUresult sim_cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n);
SIM_HIDDEN CUresult sim_cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);
SIM_HIDDEN CUresult sim_cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n);
SIM_HIDDEN CUresult sim_cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n);
SIM_HIDDEN CUresult sim_cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n);
SIM_HIDDEN CUresult sim_cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n);
SIM_HIDDEN CUresult sim_cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n);
SIM_HIDDEN CUresult sim_cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);
SIM_HIDDEN CUresult sim_cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n,
                                           CUstream s);
SIM_HIDDEN CUresult sim_cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n,
                                             CUstream s);
SIM_HIDDEN CUresult sim_cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void *src, size_t n,
                                                  CUstream s);
SIM_HIDDEN CUresult sim_cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s);
SIM_HIDDEN CUresult sim_cuMemcpyDtoHAsync_v2_ptsz(void *dst, CUdeviceptr src, size_t n,
                                                  CUstream s);
SIM_HIDDEN CUresult sim_cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n,
                                             CUstream s);
SIM_HIDDEN CUresult sim_cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n,
                                                  CUstream s);
SIM_HIDDEN CUresult sim_cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n);
SIM_HIDDEN CUresult sim_cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char v, size_t n);
SIM_HIDDEN CUresult sim_cuMemsetD32_v2(CUdeviceptr dst, unsigned int v, size_t n);
SIM_HIDDEN CUresult sim_cuMemsetD32_v2_ptds(CUdeviceptr dst, unsigned int v, size_t n);
SIM_HIDDEN CUresult sim_cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s);
SIM_HIDDEN CUresult sim_cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char v, size_t n,
                                             CUstream s);
SIM_HIDDEN CUresult sim_cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream s);
SIM_HIDDEN CUresult sim_cuMemsetD32Async_ptsz(CUdeviceptr dst, unsigned int v, size_t n,
                                              CUstream s);

/* Launches. */
SIM_HIDDEN CUresult sim_cuLaunchKernel(SIM_SIG_LAUNCH);
SIM_HIDDEN CUresult sim_cuLaunchKernel_ptsz(SIM_SIG_LAUNCH);
SIM_HIDDEN CUresult sim_cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f,
                                         void **params, void **extra);
SIM_HIDDEN CUresult sim_cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                              void **params, void **extra);
SIM_HIDDEN CUresult sim_cuLaunchCooperativeKernel(SIM_SIG_LAUNCH_COOP);
SIM_HIDDEN CUresult sim_cuLaunchCooperativeKernel_ptsz(SIM_SIG_LAUNCH_COOP);
SIM_HIDDEN CUresult sim_cuLaunchHostFunc(CUstream s, CUhostFn fn, void *data);
SIM_HIDDEN CUresult sim_cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void *data);
SIM_HIDDEN CUresult sim_cuGraphLaunch(CUgraphExec g, CUstream s);
SIM_HIDDEN CUresult sim_cuGraphLaunch_ptsz(CUgraphExec g, CUstream s);

/* Graphs (empty ones: what instantiation takes is what they are for). */
SIM_HIDDEN CUresult sim_cuGraphCreate(CUgraph *phGraph, unsigned int flags);
SIM_HIDDEN CUresult sim_cuGraphDestroy(CUgraph g);
SIM_HIDDEN CUresult sim_cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph g,
                                                    unsigned long long flags);
SIM_HIDDEN CUresult sim_cuGraphExecDestroy(CUgraphExec e);

/* Checkpoints (sim_ckpt.c). */
SIM_HIDDEN CUresult sim_cuCheckpointProcessGetState(int pid, CUprocessState *state);
SIM_HIDDEN CUresult sim_cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args);
SIM_HIDDEN CUresult sim_cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args);
SIM_HIDDEN CUresult sim_cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args);
SIM_HIDDEN CUresult sim_cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args);
SIM_HIDDEN CUresult sim_cuCheckpointProcessGetRestoreThreadId(int pid, int *tid);

/* Entry-point lookup. */
SIM_HIDDEN CUresult sim_cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                         cuuint64_t flags);
SIM_HIDDEN CUresult sim_cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                            cuuint64_t flags,
                                            CUdriverProcAddressQueryResult *symbolStatus);

/* Test hooks. */
SIM_HIDDEN unsigned long long sim_krexsim_submissions(void);
SIM_HIDDEN int sim_krexsim_users(const char *shm_name, unsigned gpu, int *pids, int max);
SIM_HIDDEN int sim_krexsim_mem_users(const char *shm_name, unsigned gpu, int *pids,
                                     unsigned long long *bytes, int max);
SIM_HIDDEN int sim_krexsim_busy(const char *shm_name, unsigned gpu, long long since_ns, int *pids,
                                int max, int *lost);
SIM_HIDDEN int sim_krexsim_checkpoint(const char *shm_name, int op, int pid, unsigned timeout_ms,
                                      int *state);

#endif /* KREX_SIM_ENTRIES_H */
