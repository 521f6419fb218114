/*
 * hipsim.h: internals of the simulated HIP runtime (libamdhip64.so built from shim/sim_hip/),
 * a CPU-only stand-in for ROCm's libamdhip64 on top of the simulated CUDA driver (shim/sim/,
 * libcuda.so.1): devices are the simulated GPUs, streams, events, memory and modules are the
 * driver's, and a kernel's run time is its first parameter read as a uint64_t (docs/simulator.md).
 *
 * Why its exported functions call each other through their exported names:
 * ROCm 7's libamdhip64 implements several entry points by calling other EXPORTED entry points
 * (hipMemcpy -> hipMemcpyAsync + hipStreamSynchronize, the _spt twins -> the plain ones, ...),
 * and it is linked without -Bsymbolic, so those calls go through its PLT. A wrapper library
 * LD_PRELOADed in front of it that exports the same names therefore also receives HIP's own
 * internal calls: it gates a call twice, or recurses into itself (HAMi issue #1707). KREX
 * intercepts HIP with LD_AUDIT instead, which binds only the application's own references. To
 * test that, this library reproduces the hazard on purpose:
 *   - it is linked WITHOUT -Bsymbolic / -Bsymbolic-functions (unlike the simulated libcuda);
 *   - every hip* function has default visibility (krex_hip.h is included under
 *     `#pragma GCC visibility push(default)`, as the real header does) and is compiled -fPIC
 *     WITHOUT -fno-semantic-interposition, so GCC neither inlines nor binds these calls locally;
 *   - the internal paths below call the exported names, so each call is a call through the PLT
 *     (tests/test_sim_hip.py checks the disassembly):
 *       hipMemcpy          -> hipMemcpyAsync(..., 0), hipStreamSynchronize(0)
 *       hipMemset          -> hipMemsetAsync(..., 0), hipStreamSynchronize(0)
 *       hipMemcpyHtoD/DtoH/DtoD -> hipMemcpy
 *       hipMemsetD8        -> hipMemset
 *       hipLaunchKernel    -> hipModuleLaunchKernel
 *       hipInit            -> hipGetDeviceCount
 *       X_spt(..., s)      -> X(..., s ? s : hipStreamPerThread)
 *       X_spt(...) (synchronous) -> XAsync(..., hipStreamPerThread),
 *                                   hipStreamSynchronize(hipStreamPerThread)
 * Every other path goes straight to the driver (hidden hs_* helpers), as ROCm's internal
 * ihip* functions do.
 *
 * Layers: hipsim_core.c (init, devices, per-thread device and context, errors, versions,
 * hipGetProcAddress), hipsim_stream.c (streams, events, synchronisation), hipsim_mem.c
 * (allocation, copies, sets), hipsim_launch.c (modules, launches, host functions, graphs).
 */
#ifndef KREX_HIPSIM_H
#define KREX_HIPSIM_H

#include <stddef.h>
#include <stdint.h>

#include "krex_cuda.h"

/* The exported API: default visibility whatever -fvisibility says. */
#pragma GCC visibility push(default)
#include "krex_hip.h"
#pragma GCC visibility pop

#define HS_HIDDEN __attribute__((visibility("hidden")))

/* What HIP reports as its runtime and driver version (HIP_VERSION: major * 10^7 + minor * 10^5
 * + patch): a ROCm 7.1 runtime. */
#define HS_HIP_VERSION 70100000
#define HS_MAX_DEVICES 16

/* ---- The simulated driver's entry points we call (krex_cuda.h has the types only). ---- */

CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *dev, int ordinal);
CUresult cuDeviceGetCount(int *count);
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxSynchronize(void);
CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
CUresult cuModuleUnload(CUmodule hmod);
CUresult cuStreamCreate(CUstream *phStream, unsigned int flags);
CUresult cuStreamDestroy_v2(CUstream s);
CUresult cuStreamSynchronize(CUstream s);
CUresult cuStreamQuery(CUstream s);
CUresult cuEventCreate(CUevent *phEvent, unsigned int flags);
CUresult cuEventDestroy_v2(CUevent e);
CUresult cuEventRecord(CUevent e, CUstream s);
CUresult cuEventQuery(CUevent e);
CUresult cuEventSynchronize(CUevent e);
CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s);
CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream s);
CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                        CUstream s, void **params, void **extra);
CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *data);
CUresult cuGraphLaunch(CUgraphExec g, CUstream s);

/* Handles are the driver's: a hipStream_t is a CUstream (0, hipStreamLegacy and
 * hipStreamPerThread are the driver's NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD), a
 * hipEvent_t a CUevent, a hipModule_t a CUmodule, a hipFunction_t a CUfunction, and device
 * memory a CUdeviceptr. */
#define HS_STREAM(s) ((CUstream)(s))
#define HS_EVENT(e) ((CUevent)(e))
#define HS_DPTR(p) ((CUdeviceptr)(uintptr_t)(p))
/* The per-thread stream where an _spt twin was given the null stream. */
#define HS_SPT(s) ((s) ? (s) : hipStreamPerThread)

/* ---- hipsim_core.c ---- */

/* The driver's error as HIP's (the codes HIP shares with CUDA have the same values). */
HS_HIDDEN hipError_t hs_err(CUresult r);
/* Record e as this thread's last error unless it is hipSuccess; returns e. */
HS_HIDDEN hipError_t hs_ret(hipError_t e);
/* cuInit(0), once per process. */
HS_HIDDEN hipError_t hs_init(void);
/* Number of devices this process sees (0 when the driver cannot start). */
HS_HIDDEN int hs_device_count(void);
/* Make this thread's device (hipSetDevice; device 0 by default) and its primary context
 * current for the driver; every call that uses a context or the null stream starts here. */
HS_HIDDEN hipError_t hs_enter(void);
/* The spin kernel of the current device's context (loaded once): what host function pointers
 * (hipLaunchKernel and friends) launch, since the simulator runs no code. */
HS_HIDDEN hipError_t hs_spin_function(CUfunction *f);

/* ---- hipsim_launch.c ---- */

/* One kernel launch straight to the driver; `extra` in HIP's convention (END is 0x03). */
HS_HIDDEN hipError_t hs_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned shmem, hipStream_t s,
                               void **params, void **extra);

#endif /* KREX_HIPSIM_H */
