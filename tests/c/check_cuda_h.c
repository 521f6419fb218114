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
#define KREX_REAL(name, ...) CHK_(name, __VA_ARGS__)
#include "hooks.def"
_Static_assert(__builtin_types_compatible_p(__typeof__(&cuGetProcAddress),
                                            CUresult (*)(const char *, void **, int, cuuint64_t)),
               "cuGetProcAddress (4 arguments)");
#endif

int main(void)
{
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
