/*
 * sim_mem_types.c: the memory types krex_cuda.h declares for the simulated driver, and the
 * prototypes of the simulated memory entry points and of those that take device memory for the
 * driver itself (modules, libraries, graphs), against the real cuda.h (built only where one is
 * installed; tests/test_sim_mem.py). Compiled twice: with -DKREX_REAL_CUDA_H each
 * signature below must be cuda.h's prototype of that exact name; without it, the same
 * signature must be the simulator's sim_<name> (shim/sim/sim_entries.h). Both builds print the
 * sizes, offsets and values of the types, which must be equal.
 */
#ifdef KREX_REAL_CUDA_H
#define __CUDA_API_VERSION_INTERNAL 1
#include <stddef.h>
#include <stdio.h>
#include "krex_cuda.h"
#define CHK(name, params)                                                                     \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&name), CUresult(*) params),       \
                   #name " differs from cuda.h");
#else
#include <stddef.h>
#include <stdio.h>
#include "sim/sim.h"
#define CHK(name, params)                                                                     \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&sim_##name), CUresult(*) params),  \
                   "the simulator's " #name " differs from cuda.h");
#endif

CHK(cuMemAlloc_v2, (CUdeviceptr *, size_t))
CHK(cuMemFree_v2, (CUdeviceptr))
CHK(cuMemGetInfo_v2, (size_t *, size_t *))
CHK(cuDeviceTotalMem_v2, (size_t *, CUdevice))
CHK(cuMemAllocPitch_v2, (CUdeviceptr *, size_t *, size_t, size_t, unsigned int))
CHK(cuMemAllocManaged, (CUdeviceptr *, size_t, unsigned int))
CHK(cuArrayCreate_v2, (CUarray *, const CUDA_ARRAY_DESCRIPTOR *))
CHK(cuArrayDestroy, (CUarray))
CHK(cuMemAllocAsync, (CUdeviceptr *, size_t, CUstream))
CHK(cuMemAllocAsync_ptsz, (CUdeviceptr *, size_t, CUstream))
CHK(cuMemAllocFromPoolAsync, (CUdeviceptr *, size_t, CUmemoryPool, CUstream))
CHK(cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *, size_t, CUmemoryPool, CUstream))
CHK(cuMemFreeAsync, (CUdeviceptr, CUstream))
CHK(cuMemFreeAsync_ptsz, (CUdeviceptr, CUstream))
CHK(cuDeviceGetDefaultMemPool, (CUmemoryPool *, CUdevice))
CHK(cuMemPoolCreate, (CUmemoryPool *, const CUmemPoolProps *))
CHK(cuMemPoolDestroy, (CUmemoryPool))
CHK(cuMemPoolTrimTo, (CUmemoryPool, size_t))
CHK(cuMemGetAllocationGranularity,
    (size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags))
CHK(cuMemAddressReserve, (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long))
CHK(cuMemAddressFree, (CUdeviceptr, size_t))
CHK(cuMemCreate,
    (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long))
CHK(cuMemRelease, (CUmemGenericAllocationHandle))
CHK(cuMemMap, (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long))
CHK(cuMemUnmap, (CUdeviceptr, size_t))
CHK(cuMemSetAccess, (CUdeviceptr, size_t, const CUmemAccessDesc *, size_t))
CHK(cuModuleLoadData, (CUmodule *, const void *))
CHK(cuModuleLoadDataEx, (CUmodule *, const void *, unsigned int, CUjit_option *, void **))
CHK(cuModuleGetFunction, (CUfunction *, CUmodule, const char *))
CHK(cuModuleUnload, (CUmodule))
CHK(cuLibraryLoadData, (CUlibrary *, const void *, CUjit_option *, void **, unsigned int,
                        CUlibraryOption *, void **, unsigned int))
CHK(cuLibraryGetKernel, (CUkernel *, CUlibrary, const char *))
CHK(cuKernelGetFunction, (CUfunction *, CUkernel))
CHK(cuLibraryUnload, (CUlibrary))
CHK(cuGraphCreate, (CUgraph *, unsigned int))
CHK(cuGraphInstantiateWithFlags, (CUgraphExec *, CUgraph, unsigned long long))
CHK(cuGraphExecDestroy, (CUgraphExec))
CHK(cuGraphDestroy, (CUgraph))

int main(void)
{
    printf("handle %zu pool %zu\n", sizeof(CUmemGenericAllocationHandle), sizeof(CUmemoryPool));
    printf("CUmemAllocationProp %zu type@%zu handles@%zu location@%zu win32@%zu flags@%zu\n",
           sizeof(CUmemAllocationProp), offsetof(CUmemAllocationProp, type),
           offsetof(CUmemAllocationProp, requestedHandleTypes),
           offsetof(CUmemAllocationProp, location),
           offsetof(CUmemAllocationProp, win32HandleMetaData),
           offsetof(CUmemAllocationProp, allocFlags));
    printf("CUmemAccessDesc %zu location@%zu flags@%zu\n", sizeof(CUmemAccessDesc),
           offsetof(CUmemAccessDesc, location), offsetof(CUmemAccessDesc, flags));
    printf("CUmemPoolProps %zu type@%zu handles@%zu location@%zu win32@%zu max@%zu usage@%zu\n",
           sizeof(CUmemPoolProps), offsetof(CUmemPoolProps, allocType),
           offsetof(CUmemPoolProps, handleTypes), offsetof(CUmemPoolProps, location),
           offsetof(CUmemPoolProps, win32SecurityAttributes), offsetof(CUmemPoolProps, maxSize),
           offsetof(CUmemPoolProps, usage));
    printf("CUDA_ARRAY_DESCRIPTOR %zu w@%zu h@%zu format@%zu channels@%zu\n",
           sizeof(CUDA_ARRAY_DESCRIPTOR), offsetof(CUDA_ARRAY_DESCRIPTOR, Width),
           offsetof(CUDA_ARRAY_DESCRIPTOR, Height), offsetof(CUDA_ARRAY_DESCRIPTOR, Format),
           offsetof(CUDA_ARRAY_DESCRIPTOR, NumChannels));
    printf("attach %d %d %d\n", CU_MEM_ATTACH_GLOBAL, CU_MEM_ATTACH_HOST, CU_MEM_ATTACH_SINGLE);
    printf("alloc types %d %d %d\n", CU_MEM_ALLOCATION_TYPE_INVALID,
           CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_ALLOCATION_TYPE_MANAGED);
    printf("locations %d %d %d %d %d\n", CU_MEM_LOCATION_TYPE_INVALID,
           CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_HOST, CU_MEM_LOCATION_TYPE_HOST_NUMA,
           CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT);
    printf("handle types %d %d %d %d %d\n", CU_MEM_HANDLE_TYPE_NONE,
           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, CU_MEM_HANDLE_TYPE_WIN32,
           CU_MEM_HANDLE_TYPE_WIN32_KMT, CU_MEM_HANDLE_TYPE_FABRIC);
    printf("access %d %d %d\n", CU_MEM_ACCESS_FLAGS_PROT_NONE, CU_MEM_ACCESS_FLAGS_PROT_READ,
           CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    printf("granularity %d %d\n", CU_MEM_ALLOC_GRANULARITY_MINIMUM,
           CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    printf("formats %d %d %d %d %d %d %d %d\n", CU_AD_FORMAT_UNSIGNED_INT8,
           CU_AD_FORMAT_UNSIGNED_INT16, CU_AD_FORMAT_UNSIGNED_INT32, CU_AD_FORMAT_SIGNED_INT8,
           CU_AD_FORMAT_SIGNED_INT16, CU_AD_FORMAT_SIGNED_INT32, CU_AD_FORMAT_HALF,
           CU_AD_FORMAT_FLOAT);
    printf("errors %d %d %d\n", CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_ALREADY_MAPPED,
           CUDA_ERROR_NOT_MAPPED);
    printf("code: CUjit_option %zu (first %d) CUlibraryOption %zu %d %d %d handles %zu %zu\n",
           sizeof(CUjit_option), CU_JIT_MAX_REGISTERS, sizeof(CUlibraryOption),
           CU_LIBRARY_HOST_UNIVERSAL_FUNCTION_AND_DATA_TABLE, CU_LIBRARY_BINARY_IS_PRESERVED,
           CU_LIBRARY_NUM_OPTIONS, sizeof(CUlibrary), sizeof(CUkernel));
    return 0;
}
