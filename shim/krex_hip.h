/*
 * krex_hip.h: the HIP runtime types and entry points KREX needs, declared here so that neither
 * the simulated HIP runtime (shim/sim_hip/) nor its tests need ROCm to build.
 *
 * Every prototype, type and constant below, and every prototype of the hook table
 * shim/hip/hip_hooks.def (declared from it at the end), is copied from ROCm's own headers,
 * repository ROCm/rocm-systems, spelled as C sees them (`__dparm(x)` default arguments dropped,
 * as the real headers do in C):
 *   projects/hip/include/hip/hip_runtime_api.h   at 003a5d106dc36c137c76d6c8bb51f7fa5564bdfc
 *   projects/hip/include/hip/hip_ext.h           at 1451ac86ca7fe32766c973b31b660936261290ff
 *   projects/hip/include/hip/driver_types.h      at 12b6b91ea6f2f89005ce1e9bb0ea1cdb92e04048
 *   projects/clr/hipamd/include/hip/amd_detail/amd_hip_runtime_pt_api.h (the _spt twins)
 *                                                at 54550d35954a61611c9739f1d85ac5a8822fbf1b
 * (hip_ext.h declares hipExtModuleLaunchKernel `extern "C"` for C++ only; its C form is the
 * same prototype. HIP_API_SYMBOL(X_spt) is hipX_spt in the public ABI.)
 *
 * Handles are opaque pointers to the real headers' struct tags; only what is passed by value
 * or read (dim3, launch parameter lists, 3D copy parameters) is spelled out, with the real
 * layout. Plain C: no extern "C", nothing C++-only.
 */
#ifndef KREX_HIP_H
#define KREX_HIP_H

#include <stddef.h>
#include <stdint.h>

/* ---- Errors (hip_runtime_api.h). ---- */

typedef enum hipError_t {
    hipSuccess = 0,
    hipErrorInvalidValue = 1,
    hipErrorOutOfMemory = 2,
    hipErrorMemoryAllocation = 2,
    hipErrorNotInitialized = 3,
    hipErrorInitializationError = 3,
    hipErrorDeinitialized = 4,
    hipErrorProfilerDisabled = 5,
    hipErrorProfilerNotInitialized = 6,
    hipErrorProfilerAlreadyStarted = 7,
    hipErrorProfilerAlreadyStopped = 8,
    hipErrorInvalidConfiguration = 9,
    hipErrorInvalidPitchValue = 12,
    hipErrorInvalidSymbol = 13,
    hipErrorInvalidDevicePointer = 17,
    hipErrorInvalidMemcpyDirection = 21,
    hipErrorInsufficientDriver = 35,
    hipErrorMissingConfiguration = 52,
    hipErrorPriorLaunchFailure = 53,
    hipErrorInvalidDeviceFunction = 98,
    hipErrorNoDevice = 100,
    hipErrorInvalidDevice = 101,
    hipErrorInvalidImage = 200,
    hipErrorInvalidContext = 201,
    hipErrorContextAlreadyCurrent = 202,
    hipErrorMapFailed = 205,
    hipErrorMapBufferObjectFailed = 205,
    hipErrorUnmapFailed = 206,
    hipErrorArrayIsMapped = 207,
    hipErrorAlreadyMapped = 208,
    hipErrorNoBinaryForGpu = 209,
    hipErrorAlreadyAcquired = 210,
    hipErrorNotMapped = 211,
    hipErrorNotMappedAsArray = 212,
    hipErrorNotMappedAsPointer = 213,
    hipErrorECCNotCorrectable = 214,
    hipErrorUnsupportedLimit = 215,
    hipErrorContextAlreadyInUse = 216,
    hipErrorPeerAccessUnsupported = 217,
    hipErrorInvalidKernelFile = 218,
    hipErrorInvalidGraphicsContext = 219,
    hipErrorInvalidSource = 300,
    hipErrorFileNotFound = 301,
    hipErrorSharedObjectSymbolNotFound = 302,
    hipErrorSharedObjectInitFailed = 303,
    hipErrorOperatingSystem = 304,
    hipErrorInvalidHandle = 400,
    hipErrorInvalidResourceHandle = 400,
    hipErrorIllegalState = 401,
    hipErrorNotFound = 500,
    hipErrorNotReady = 600,
    hipErrorIllegalAddress = 700,
    hipErrorLaunchOutOfResources = 701,
    hipErrorLaunchTimeOut = 702,
    hipErrorPeerAccessAlreadyEnabled = 704,
    hipErrorPeerAccessNotEnabled = 705,
    hipErrorSetOnActiveProcess = 708,
    hipErrorContextIsDestroyed = 709,
    hipErrorAssert = 710,
    hipErrorHostMemoryAlreadyRegistered = 712,
    hipErrorHostMemoryNotRegistered = 713,
    hipErrorLaunchFailure = 719,
    hipErrorCooperativeLaunchTooLarge = 720,
    hipErrorNotSupported = 801,
    hipErrorStreamCaptureUnsupported = 900,
    hipErrorStreamCaptureInvalidated = 901,
    hipErrorStreamCaptureMerge = 902,
    hipErrorStreamCaptureUnmatched = 903,
    hipErrorStreamCaptureUnjoined = 904,
    hipErrorStreamCaptureIsolation = 905,
    hipErrorStreamCaptureImplicit = 906,
    hipErrorCapturedEvent = 907,
    hipErrorStreamCaptureWrongThread = 908,
    hipErrorGraphExecUpdateFailure = 910,
    hipErrorInvalidChannelDescriptor = 911,
    hipErrorInvalidTexture = 912,
    hipErrorInvalidResourceType = 914,
    hipErrorInvalidResourceConfiguration = 915,
    hipErrorStreamDetached = 916,
    hipErrorUnknown = 999,
    hipErrorRuntimeMemory = 1052,
    hipErrorRuntimeOther = 1053,
    hipErrorInvalidClusterSize = 1054,
    hipErrorTbd
} hipError_t;

/* ---- hipGetProcAddress (hip_runtime_api.h). ---- */

#define HIP_GET_PROC_ADDRESS_DEFAULT 0x0
#define HIP_GET_PROC_ADDRESS_LEGACY_STREAM 0x1
#define HIP_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 0x2

typedef enum hipDriverProcAddressQueryResult {
    HIP_GET_PROC_ADDRESS_SUCCESS = 0,
    HIP_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    HIP_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2
} hipDriverProcAddressQueryResult;

/* ---- Handles. ---- */

typedef void *hipDeviceptr_t; /* driver_types.h */
typedef struct hipArray *hipArray_t;
typedef const struct hipArray *hipArray_const_t;
typedef struct ihipStream_t *hipStream_t;
typedef struct ihipEvent_t *hipEvent_t;
typedef struct ihipModule_t *hipModule_t;
typedef struct ihipModuleSymbol_t *hipFunction_t;
typedef struct ihipGraph *hipGraph_t;
typedef struct hipGraphNode *hipGraphNode_t;
typedef struct hipGraphExec *hipGraphExec_t;

/* The null stream (0) is the legacy default stream; these two are fixed handles. */
#define hipStreamPerThread ((hipStream_t)2)
#define hipStreamLegacy ((hipStream_t)1)

/* Flags (hip_runtime_api.h). */
#define hipStreamDefault 0x00
#define hipStreamNonBlocking 0x01
#define hipEventDefault 0x0
#define hipEventBlockingSync 0x1
#define hipEventDisableTiming 0x2
#define hipEventInterprocess 0x4
#define hipHostMallocDefault 0x0
#define hipExtAnyOrderLaunch 0x01

#define HIP_LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define HIP_LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)
#define HIP_LAUNCH_PARAM_END ((void *)0x03)

/* ---- Copies (driver_types.h). ---- */

typedef enum hipMemcpyKind {
    hipMemcpyHostToHost = 0,
    hipMemcpyHostToDevice = 1,
    hipMemcpyDeviceToHost = 2,
    hipMemcpyDeviceToDevice = 3,
    hipMemcpyDefault = 4,
    hipMemcpyDeviceToDeviceNoCU = 1024
} hipMemcpyKind;

typedef struct hipPitchedPtr {
    void *ptr;
    size_t pitch;
    size_t xsize;
    size_t ysize;
} hipPitchedPtr;

typedef struct hipExtent {
    size_t width; /* in bytes for linear memory */
    size_t height;
    size_t depth;
} hipExtent;

typedef struct hipPos {
    size_t x;
    size_t y;
    size_t z;
} hipPos;

typedef struct hipMemcpy3DParms {
    hipArray_t srcArray;
    struct hipPos srcPos;
    struct hipPitchedPtr srcPtr;
    hipArray_t dstArray;
    struct hipPos dstPos;
    struct hipPitchedPtr dstPtr;
    struct hipExtent extent;
    enum hipMemcpyKind kind;
} hipMemcpy3DParms;

/* ---- Launches (hip_runtime_api.h). ---- */

typedef struct dim3 {
    uint32_t x;
    uint32_t y;
    uint32_t z;
} dim3;

typedef struct hipLaunchParams_t {
    void *func;
    dim3 gridDim;
    dim3 blockDim;
    void **args;
    size_t sharedMem;
    hipStream_t stream;
} hipLaunchParams;

typedef struct hipFunctionLaunchParams_t {
    hipFunction_t function;
    unsigned int gridDimX;
    unsigned int gridDimY;
    unsigned int gridDimZ;
    unsigned int blockDimX;
    unsigned int blockDimY;
    unsigned int blockDimZ;
    unsigned int sharedMemBytes;
    hipStream_t hStream;
    void **kernelParams;
} hipFunctionLaunchParams;

typedef void (*hipHostFn_t)(void *userData);

typedef struct hipKernelNodeParams {
    dim3 blockDim;
    void **extra;
    void *func;
    dim3 gridDim;
    void **kernelParams;
    unsigned int sharedMemBytes;
} hipKernelNodeParams;

/* ---- Initialisation, versions, devices, errors. ---- */

hipError_t hipDeviceReset(void);
hipError_t hipGetLastError(void);
hipError_t hipPeekAtLastError(void);
const char *hipGetErrorName(hipError_t hip_error);
const char *hipGetErrorString(hipError_t hipError);

/* ---- Streams and events. ---- */

hipError_t hipStreamDestroy(hipStream_t stream);
hipError_t hipStreamSynchronize(hipStream_t stream);
hipError_t hipStreamQuery(hipStream_t stream);
hipError_t hipEventDestroy(hipEvent_t event);
hipError_t hipEventSynchronize(hipEvent_t event);
hipError_t hipEventQuery(hipEvent_t event);
hipError_t hipEventElapsedTime(float *ms, hipEvent_t start, hipEvent_t stop);

/* ---- Memory. ---- */

hipError_t hipFree(void *ptr);
hipError_t hipHostFree(void *ptr);

/* ---- Modules. ---- */

hipError_t hipModuleUnload(hipModule_t module);
hipError_t hipModuleGetFunction(hipFunction_t *function, hipModule_t module, const char *kname);

/* ---- Graphs. ---- */

hipError_t hipGraphCreate(hipGraph_t *pGraph, unsigned int flags);
hipError_t hipGraphDestroy(hipGraph_t graph);
hipError_t hipGraphAddKernelNode(hipGraphNode_t *pGraphNode, hipGraph_t graph,
                                 const hipGraphNode_t *pDependencies, size_t numDependencies,
                                 const hipKernelNodeParams *pNodeParams);
hipError_t hipGraphInstantiate(hipGraphExec_t *pGraphExec, hipGraph_t graph,
                               hipGraphNode_t *pErrorNode, char *pLogBuffer, size_t bufferSize);
hipError_t hipGraphExecDestroy(hipGraphExec_t graphExec);

/* ---- The hooked entry points, declared from their one list: the hook table
 * shim/hip/hip_hooks.def (every work-submitting function, gated; hipSetDevice, tracked; the
 * calls that may start HIP on a device; hipGetProcAddress; hipDeviceSynchronize, for the
 * drain). ---- */

#define KREX_HIP_DECL_(name, params, args) hipError_t name params;
#define KREX_HIP_GATE(name, ...) KREX_HIP_DECL_(name, __VA_ARGS__)
#define KREX_HIP_TRACK(name, ...) KREX_HIP_DECL_(name, __VA_ARGS__)
#define KREX_HIP_OPEN(name, ...) KREX_HIP_DECL_(name, __VA_ARGS__)
#define KREX_HIP_REAL(name, ...) KREX_HIP_DECL_(name, __VA_ARGS__)
#define KREX_HIP_LOOKUP(name, ...) KREX_HIP_DECL_(name, __VA_ARGS__)
#include "hip/hip_hooks.def"
#undef KREX_HIP_GATE
#undef KREX_HIP_TRACK
#undef KREX_HIP_OPEN
#undef KREX_HIP_REAL
#undef KREX_HIP_LOOKUP
#undef KREX_HIP_DECL_

#endif /* KREX_HIP_H */
