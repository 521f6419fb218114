/*
 * check_cuda_h.c: KREX's own CUDA declarations against the real cuda.h (built only where one is
 * installed). Compiled twice: with -DKREX_REAL_CUDA_H every hooks.def signature must be the
 * real prototype of that exact name (cuda.h in its internal mode declares every exact name);
 * without it, the program prints sizes and offsets of our types, which must equal the output of
 * the real-header build.
 */
#ifdef KREX_REAL_CUDA_H
#define __CUDA_API_VERSION_INTERNAL 1
#endif
#include <stddef.h>
#include <stdio.h>

#include "krex_cuda.h"

#ifdef KREX_REAL_CUDA_H
#define CHK_(name, params, args)                                                                 \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&name), CUresult(*) params),          \
                   "hooks.def signature of " #name " differs from cuda.h");
#define KREX_GATE(name, ...) CHK_(name, __VA_ARGS__)
#define KREX_TRACK(name, ...) CHK_(name, __VA_ARGS__)
#define KREX_MEM(name, ...) CHK_(name, __VA_ARGS__)
#define KREX_REAL(name, ...) CHK_(name, __VA_ARGS__)
#include "hooks.def"
_Static_assert(__builtin_types_compatible_p(__typeof__(&cuGetProcAddress),
                                            CUresult (*)(const char *, void **, int, cuuint64_t)),
               "cuGetProcAddress (4 arguments)");
#endif

/* The fields of the memory structs the shim reads (shim/preload/mem_views.h mirrors their
 * first bytes; the real build reads the real structs). */
#ifdef KREX_REAL_CUDA_H
#define PROP CUmemAllocationProp
#define ADESC CUDA_ARRAY_DESCRIPTOR
#define A3DESC CUDA_ARRAY3D_DESCRIPTOR
#else
#include "preload/mem_views.h"
#define PROP struct krex_mem_prop_head
#define ADESC struct krex_array_desc
#define A3DESC struct krex_array3d_desc
#endif

int main(void)
{
    printf("CUmemGenericAllocationHandle %zu\n", sizeof(CUmemGenericAllocationHandle));
    printf("CUmemAllocationProp type@%zu location@%zu/%zu\n", offsetof(PROP, type),
           offsetof(PROP, location), sizeof(((PROP *)0)->location));
    printf("CUDA_ARRAY_DESCRIPTOR %zu %zu %zu %zu\n", offsetof(ADESC, Width),
           offsetof(ADESC, Height), offsetof(ADESC, Format), offsetof(ADESC, NumChannels));
    printf("CUDA_ARRAY3D_DESCRIPTOR %zu %zu %zu %zu %zu %zu\n", offsetof(A3DESC, Width),
           offsetof(A3DESC, Height), offsetof(A3DESC, Depth), offsetof(A3DESC, Format),
           offsetof(A3DESC, NumChannels), offsetof(A3DESC, Flags));
    printf("formats %d %d %d %d %d %d %d %d\n", 0x01, 0x02, 0x03, 0x08, 0x09, 0x0a, 0x10, 0x20);
#ifdef KREX_REAL_CUDA_H
    printf("real formats %d %d %d %d %d %d %d %d\n", CU_AD_FORMAT_UNSIGNED_INT8,
           CU_AD_FORMAT_UNSIGNED_INT16, CU_AD_FORMAT_UNSIGNED_INT32, CU_AD_FORMAT_SIGNED_INT8,
           CU_AD_FORMAT_SIGNED_INT16, CU_AD_FORMAT_SIGNED_INT32, CU_AD_FORMAT_HALF,
           CU_AD_FORMAT_FLOAT);
#else
    printf("real formats %d %d %d %d %d %d %d %d\n", 0x01, 0x02, 0x03, 0x08, 0x09, 0x0a, 0x10,
           0x20);
#endif
    printf("CU_MEM_LOCATION_TYPE_DEVICE %d, CUDA_ERROR_OUT_OF_MEMORY %d\n",
           (int)CU_MEM_LOCATION_TYPE_DEVICE, (int)CUDA_ERROR_OUT_OF_MEMORY);
    printf("CUresult %zu\n", sizeof(CUresult));
    printf("CUdevice %zu\n", sizeof(CUdevice));
    printf("CUdeviceptr %zu\n", sizeof(CUdeviceptr));
    printf("CUstream %zu\n", sizeof(CUstream));
    printf("CUmemLocation %zu type@%zu id@%zu\n", sizeof(CUmemLocation),
           offsetof(CUmemLocation, type), offsetof(CUmemLocation, id));
    printf("CUlaunchConfig %zu hStream@%zu attrs@%zu numAttrs@%zu\n", sizeof(CUlaunchConfig),
           offsetof(CUlaunchConfig, hStream), offsetof(CUlaunchConfig, attrs),
           offsetof(CUlaunchConfig, numAttrs));
    printf("CUdriverProcAddressQueryResult %zu\n", sizeof(CUdriverProcAddressQueryResult));
    printf("flags %d %d %d\n", CU_GET_PROC_ADDRESS_DEFAULT, CU_GET_PROC_ADDRESS_LEGACY_STREAM,
           CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    printf("streams %p %p\n", (void *)CU_STREAM_LEGACY, (void *)CU_STREAM_PER_THREAD);
    printf("errors %d %d %d %d %d\n", CUDA_SUCCESS, CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_READY,
           CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_CONTEXT_IS_DESTROYED);
    return 0;
}
