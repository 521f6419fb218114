/*
 * hipsim_core.c: initialisation, devices, the per-thread device and its context, errors,
 * versions and hipGetProcAddress.
 *
 * HIP keeps a current device per thread (device 0 until hipSetDevice) and uses that device's
 * primary context; here each device's primary context is retained once per process, and made
 * current for the driver in each thread that uses it (hs_enter).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "hipsim.h"

/* ---- Errors. ---- */

static __thread hipError_t hs_last_error;

hipError_t hs_err(CUresult r)
{
    switch (r) {
    case CUDA_SUCCESS:
        return hipSuccess;
    case CUDA_ERROR_INVALID_VALUE:
        return hipErrorInvalidValue;
    case CUDA_ERROR_OUT_OF_MEMORY:
        return hipErrorOutOfMemory;
    case CUDA_ERROR_NOT_INITIALIZED:
        return hipErrorNotInitialized;
    case CUDA_ERROR_DEINITIALIZED:
        return hipErrorDeinitialized;
    case CUDA_ERROR_NO_DEVICE:
        return hipErrorNoDevice;
    case CUDA_ERROR_INVALID_DEVICE:
        return hipErrorInvalidDevice;
    case CUDA_ERROR_INVALID_IMAGE:
        return hipErrorInvalidImage;
    case CUDA_ERROR_INVALID_CONTEXT:
        return hipErrorInvalidContext;
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
        return hipErrorContextIsDestroyed;
    case CUDA_ERROR_INVALID_HANDLE:
        return hipErrorInvalidHandle;
    case CUDA_ERROR_NOT_FOUND:
        return hipErrorNotFound;
    case CUDA_ERROR_NOT_READY:
        return hipErrorNotReady;
    case CUDA_ERROR_NOT_SUPPORTED:
        return hipErrorNotSupported;
    default:
        return hipErrorUnknown;
    }
}

hipError_t hs_ret(hipError_t e)
{
    if (e != hipSuccess)
        hs_last_error = e;
    return e;
}

hipError_t hipGetLastError(void)
{
    hipError_t e = hs_last_error;
    hs_last_error = hipSuccess;
    return e;
}

hipError_t hipPeekAtLastError(void) { return hs_last_error; }

/* Names as the enum spells them (the first name of a shared value); texts as ROCm words the
 * common ones, the name spelled out for the rest. */
static const struct {
    hipError_t code;
    const char *name;
    const char *text;
} hs_errors[] = {
    {hipSuccess, "hipSuccess", "no error"},
    {hipErrorInvalidValue, "hipErrorInvalidValue", "invalid argument"},
    {hipErrorOutOfMemory, "hipErrorOutOfMemory", "out of memory"},
    {hipErrorNotInitialized, "hipErrorNotInitialized", "initialization error"},
    {hipErrorDeinitialized, "hipErrorDeinitialized", "driver shutting down"},
    {hipErrorProfilerDisabled, "hipErrorProfilerDisabled", "profiler disabled"},
    {hipErrorProfilerNotInitialized, "hipErrorProfilerNotInitialized", "profiler not initialized"},
    {hipErrorProfilerAlreadyStarted, "hipErrorProfilerAlreadyStarted", "profiler already started"},
    {hipErrorProfilerAlreadyStopped, "hipErrorProfilerAlreadyStopped", "profiler already stopped"},
    {hipErrorInvalidConfiguration, "hipErrorInvalidConfiguration", "invalid configuration"},
    {hipErrorInvalidPitchValue, "hipErrorInvalidPitchValue", "invalid pitch value"},
    {hipErrorInvalidSymbol, "hipErrorInvalidSymbol", "invalid symbol"},
    {hipErrorInvalidDevicePointer, "hipErrorInvalidDevicePointer", "invalid device pointer"},
    {hipErrorInvalidMemcpyDirection, "hipErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {hipErrorInsufficientDriver, "hipErrorInsufficientDriver", "insufficient driver"},
    {hipErrorMissingConfiguration, "hipErrorMissingConfiguration", "missing configuration"},
    {hipErrorPriorLaunchFailure, "hipErrorPriorLaunchFailure", "prior launch failure"},
    {hipErrorInvalidDeviceFunction, "hipErrorInvalidDeviceFunction", "invalid device function"},
    {hipErrorNoDevice, "hipErrorNoDevice", "no ROCm-capable device is detected"},
    {hipErrorInvalidDevice, "hipErrorInvalidDevice", "invalid device ordinal"},
    {hipErrorInvalidImage, "hipErrorInvalidImage", "device kernel image is invalid"},
    {hipErrorInvalidContext, "hipErrorInvalidContext", "invalid device context"},
    {hipErrorContextAlreadyCurrent, "hipErrorContextAlreadyCurrent", "context already current"},
    {hipErrorMapFailed, "hipErrorMapFailed", "mapping of buffer object failed"},
    {hipErrorUnmapFailed, "hipErrorUnmapFailed", "unmap failed"},
    {hipErrorArrayIsMapped, "hipErrorArrayIsMapped", "array is mapped"},
    {hipErrorAlreadyMapped, "hipErrorAlreadyMapped", "already mapped"},
    {hipErrorNoBinaryForGpu, "hipErrorNoBinaryForGpu", "no kernel image is available"},
    {hipErrorAlreadyAcquired, "hipErrorAlreadyAcquired", "already acquired"},
    {hipErrorNotMapped, "hipErrorNotMapped", "not mapped"},
    {hipErrorNotMappedAsArray, "hipErrorNotMappedAsArray", "not mapped as array"},
    {hipErrorNotMappedAsPointer, "hipErrorNotMappedAsPointer", "not mapped as pointer"},
    {hipErrorECCNotCorrectable, "hipErrorECCNotCorrectable", "uncorrectable ECC error"},
    {hipErrorUnsupportedLimit, "hipErrorUnsupportedLimit", "unsupported limit"},
    {hipErrorContextAlreadyInUse, "hipErrorContextAlreadyInUse", "context already in use"},
    {hipErrorPeerAccessUnsupported, "hipErrorPeerAccessUnsupported", "peer access unsupported"},
    {hipErrorInvalidKernelFile, "hipErrorInvalidKernelFile", "invalid kernel file"},
    {hipErrorInvalidGraphicsContext, "hipErrorInvalidGraphicsContext",
     "invalid graphics context"},
    {hipErrorInvalidSource, "hipErrorInvalidSource", "device kernel image is invalid"},
    {hipErrorFileNotFound, "hipErrorFileNotFound", "file not found"},
    {hipErrorSharedObjectSymbolNotFound, "hipErrorSharedObjectSymbolNotFound",
     "shared object symbol not found"},
    {hipErrorSharedObjectInitFailed, "hipErrorSharedObjectInitFailed",
     "shared object initialization failed"},
    {hipErrorOperatingSystem, "hipErrorOperatingSystem", "OS call failed"},
    {hipErrorInvalidHandle, "hipErrorInvalidHandle", "invalid resource handle"},
    {hipErrorIllegalState, "hipErrorIllegalState", "illegal state"},
    {hipErrorNotFound, "hipErrorNotFound", "named symbol not found"},
    {hipErrorNotReady, "hipErrorNotReady", "device not ready"},
    {hipErrorIllegalAddress, "hipErrorIllegalAddress", "an illegal memory access was encountered"},
    {hipErrorLaunchOutOfResources, "hipErrorLaunchOutOfResources", "too many resources requested"},
    {hipErrorLaunchTimeOut, "hipErrorLaunchTimeOut", "the launch timed out"},
    {hipErrorPeerAccessAlreadyEnabled, "hipErrorPeerAccessAlreadyEnabled",
     "peer access is already enabled"},
    {hipErrorPeerAccessNotEnabled, "hipErrorPeerAccessNotEnabled",
     "peer access has not been enabled"},
    {hipErrorSetOnActiveProcess, "hipErrorSetOnActiveProcess", "set on active process"},
    {hipErrorContextIsDestroyed, "hipErrorContextIsDestroyed", "context is destroyed"},
    {hipErrorAssert, "hipErrorAssert", "device-side assert triggered"},
    {hipErrorHostMemoryAlreadyRegistered, "hipErrorHostMemoryAlreadyRegistered",
     "part or all of the requested memory range is already mapped"},
    {hipErrorHostMemoryNotRegistered, "hipErrorHostMemoryNotRegistered",
     "pointer does not correspond to a registered memory region"},
    {hipErrorLaunchFailure, "hipErrorLaunchFailure", "unspecified launch failure"},
    {hipErrorCooperativeLaunchTooLarge, "hipErrorCooperativeLaunchTooLarge",
     "too many blocks in cooperative launch"},
    {hipErrorNotSupported, "hipErrorNotSupported", "operation not supported"},
    {hipErrorStreamCaptureUnsupported, "hipErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {hipErrorStreamCaptureInvalidated, "hipErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {hipErrorStreamCaptureMerge, "hipErrorStreamCaptureMerge",
     "operation would result in a merge of separate capture sequences"},
    {hipErrorStreamCaptureUnmatched, "hipErrorStreamCaptureUnmatched",
     "capture was not ended in the same stream as it began"},
    {hipErrorStreamCaptureUnjoined, "hipErrorStreamCaptureUnjoined",
     "capturing stream has unjoined work"},
    {hipErrorStreamCaptureIsolation, "hipErrorStreamCaptureIsolation",
     "dependency created on uncaptured work in another stream"},
    {hipErrorStreamCaptureImplicit, "hipErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {hipErrorCapturedEvent, "hipErrorCapturedEvent",
     "operation not permitted on an event last recorded in a capturing stream"},
    {hipErrorStreamCaptureWrongThread, "hipErrorStreamCaptureWrongThread",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {hipErrorGraphExecUpdateFailure, "hipErrorGraphExecUpdateFailure",
     "the graph update was not performed because it included changes which violated "
     "constraints specific to instantiated graph update"},
    {hipErrorInvalidChannelDescriptor, "hipErrorInvalidChannelDescriptor",
     "invalid channel descriptor"},
    {hipErrorInvalidTexture, "hipErrorInvalidTexture", "invalid texture"},
    {hipErrorInvalidResourceType, "hipErrorInvalidResourceType", "invalid resource type"},
    {hipErrorInvalidResourceConfiguration, "hipErrorInvalidResourceConfiguration",
     "invalid resource configuration"},
    {hipErrorStreamDetached, "hipErrorStreamDetached", "stream is detached"},
    {hipErrorUnknown, "hipErrorUnknown", "unknown error"},
    {hipErrorRuntimeMemory, "hipErrorRuntimeMemory", "runtime memory call returned error"},
    {hipErrorRuntimeOther, "hipErrorRuntimeOther", "runtime call other than memory returned error"},
    {hipErrorInvalidClusterSize, "hipErrorInvalidClusterSize", "invalid cluster size"},
    {hipErrorTbd, "hipErrorTbd", "hipErrorTbd"},
};

static int hs_error_index(hipError_t e)
{
    for (size_t i = 0; i < sizeof hs_errors / sizeof hs_errors[0]; i++)
        if (hs_errors[i].code == e)
            return (int)i;
    return -1;
}

/* Unknown codes read as hipErrorUnknown, as in ROCm. */
const char *hipGetErrorName(hipError_t hip_error)
{
    int i = hs_error_index(hip_error);
    return i >= 0 ? hs_errors[i].name : "hipErrorUnknown";
}

const char *hipGetErrorString(hipError_t hipError)
{
    int i = hs_error_index(hipError);
    return i >= 0 ? hs_errors[i].text : "unknown error";
}

/* ---- Initialisation and versions. ---- */

static pthread_once_t hs_once = PTHREAD_ONCE_INIT;
static CUresult hs_init_result = CUDA_ERROR_NOT_INITIALIZED;
static int hs_count; /* devices this process sees: fixed for its life */

static void hs_init_once(void)
{
    hs_init_result = cuInit(0);
    if (hs_init_result == CUDA_SUCCESS && cuDeviceGetCount(&hs_count) != CUDA_SUCCESS)
        hs_count = 0;
    if (hs_count > HS_MAX_DEVICES)
        hs_count = HS_MAX_DEVICES;
}

hipError_t hs_init(void)
{
    pthread_once(&hs_once, hs_init_once);
    return hs_err(hs_init_result);
}

int hs_device_count(void) { return hs_init() == hipSuccess ? hs_count : 0; }

hipError_t hipInit(unsigned int flags)
{
    if (flags != 0)
        return hs_ret(hipErrorInvalidValue);
    hipError_t e = hs_init();
    if (e != hipSuccess)
        return hs_ret(e);
    int n;
    return hipGetDeviceCount(&n); /* through the PLT, as ROCm does */
}

hipError_t hipDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return hs_ret(hipErrorInvalidValue);
    *driverVersion = HS_HIP_VERSION;
    return hipSuccess;
}

hipError_t hipRuntimeGetVersion(int *runtimeVersion)
{
    if (!runtimeVersion)
        return hs_ret(hipErrorInvalidValue);
    *runtimeVersion = HS_HIP_VERSION;
    return hipSuccess;
}

/* ---- Devices and contexts. ---- */

static pthread_mutex_t hs_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext hs_primary[HS_MAX_DEVICES]; /* under hs_lock; retained once, never released */
static CUfunction hs_spin[HS_MAX_DEVICES];   /* under hs_lock */
static __thread int hs_device;               /* this thread's device (hipSetDevice) */
static __thread CUcontext hs_bound;          /* the context this thread last made current */
static __thread int hs_bound_device;         /* ... and its device */

static hipError_t hs_primary_ctx(int ordinal, CUcontext *out)
{
    hipError_t e = hs_init();
    if (e != hipSuccess)
        return e;
    if (ordinal < 0 || ordinal >= hs_device_count())
        return hipErrorInvalidDevice;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&hs_lock);
    if (!hs_primary[ordinal]) {
        CUdevice dev;
        r = cuDeviceGet(&dev, ordinal);
        if (r == CUDA_SUCCESS)
            r = cuDevicePrimaryCtxRetain(&hs_primary[ordinal], dev);
    }
    *out = hs_primary[ordinal];
    pthread_mutex_unlock(&hs_lock);
    return hs_err(r);
}

hipError_t hs_enter(void)
{
    if (hs_bound && hs_bound_device == hs_device)
        return hipSuccess; /* the common case: no lock */
    CUcontext c;
    hipError_t e = hs_primary_ctx(hs_device, &c);
    if (e == hipSuccess)
        e = hs_err(cuCtxSetCurrent(c));
    if (e == hipSuccess) {
        hs_bound = c;
        hs_bound_device = hs_device;
    }
    return e;
}

hipError_t hs_spin_function(CUfunction *f)
{
    hipError_t e = hs_enter();
    if (e != hipSuccess)
        return e;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&hs_lock);
    if (!hs_spin[hs_device]) {
        CUmodule m;
        r = cuModuleLoadData(&m, "krex spin kernel");
        if (r == CUDA_SUCCESS)
            r = cuModuleGetFunction(&hs_spin[hs_device], m, "krex_spin");
    }
    *f = hs_spin[hs_device];
    pthread_mutex_unlock(&hs_lock);
    return hs_err(r);
}

hipError_t hipGetDeviceCount(int *count)
{
    if (!count)
        return hs_ret(hipErrorInvalidValue);
    hipError_t e = hs_init();
    if (e != hipSuccess)
        return hs_ret(e);
    *count = hs_device_count();
    return *count ? hipSuccess : hs_ret(hipErrorNoDevice);
}

hipError_t hipSetDevice(int deviceId)
{
    hipError_t e = hs_init();
    if (e != hipSuccess)
        return hs_ret(e);
    int n = hs_device_count();
    if (n == 0)
        return hs_ret(hipErrorNoDevice);
    if (deviceId < 0 || deviceId >= n)
        return hs_ret(hipErrorInvalidDevice);
    hs_device = deviceId;
    return hs_ret(hs_enter());
}

hipError_t hipGetDevice(int *deviceId)
{
    if (!deviceId)
        return hs_ret(hipErrorInvalidValue);
    hipError_t e = hs_init();
    if (e != hipSuccess)
        return hs_ret(e);
    *deviceId = hs_device;
    return hipSuccess;
}

/* Waits for all of this process's work on the current device. */
hipError_t hipDeviceSynchronize(void)
{
    hipError_t e = hs_enter();
    return hs_ret(e != hipSuccess ? e : hs_err(cuCtxSynchronize()));
}

/* Nothing of the device's state is torn down (the simulator keeps the primary context for the
 * process's life); the device's work is waited for. */
hipError_t hipDeviceReset(void)
{
    hipError_t e = hs_enter();
    return hs_ret(e != hipSuccess ? e : hs_err(cuCtxSynchronize()));
}

/* ---- hipGetProcAddress. ---- */

/* This library's own handle and base address: lookups must find its own definitions, never a
 * preloaded library's (dlsym on a handle searches that object first, then what it needs). */
static void *hs_self;
static void *hs_self_base;

static void hs_self_open_once(void)
{
    Dl_info info;
    if (dladdr((void *)&hs_self, &info) && info.dli_fname) {
        hs_self_base = info.dli_fbase;
        hs_self = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    }
}

/* The address of exactly `name` in this library, or NULL (names of what it links against are
 * not ours, and are not found). */
static void *hs_own_symbol(const char *name)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, hs_self_open_once);
    if (!hs_self || strncmp(name, "hip", 3) != 0)
        return NULL;
    void *p = dlsym(hs_self, name);
    Dl_info info;
    if (!p || !dladdr(p, &info) || info.dli_fbase != hs_self_base)
        return NULL;
    return p;
}

/* hipVersion is not checked: every function here exists in every version that has
 * hipGetProcAddress. With HIP_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM the _spt twin is
 * preferred where one exists, as the header documents. */
hipError_t hipGetProcAddress(const char *symbol, void **pfn, int hipVersion, uint64_t flags,
                             hipDriverProcAddressQueryResult *symbolStatus)
{
    (void)hipVersion;
    if (!symbol || !pfn || flags > HIP_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
        return hs_ret(hipErrorInvalidValue);
    void *p = NULL;
    if (flags == HIP_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        char spt[256];
        size_t n = strlen(symbol);
        if (n + sizeof "_spt" <= sizeof spt) {
            memcpy(spt, symbol, n);
            memcpy(spt + n, "_spt", sizeof "_spt");
            p = hs_own_symbol(spt);
        }
    }
    if (!p)
        p = hs_own_symbol(symbol);
    *pfn = p;
    if (symbolStatus)
        *symbolStatus = p ? HIP_GET_PROC_ADDRESS_SUCCESS : HIP_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return p ? hipSuccess : hs_ret(hipErrorNotFound);
}
