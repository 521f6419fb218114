/* cuda_api.h: prototypes the test programs call, from KREX's own declarations (no toolkit). */
#ifndef KREX_TEST_CUDA_API_H
#define KREX_TEST_CUDA_API_H

#include "krex_cuda.h"

#define DECL_(name, params, args) CUresult name params; typedef CUresult(*krex_pfn_##name) params;
#define KREX_GATE(name, ...) DECL_(name, __VA_ARGS__)
#define KREX_TRACK(name, ...) DECL_(name, __VA_ARGS__)
#define KREX_MEM(name, ...) DECL_(name, __VA_ARGS__)
#define KREX_REAL(name, ...) DECL_(name, __VA_ARGS__)
#include "hooks.def"
#undef KREX_GATE
#undef KREX_TRACK
#undef KREX_MEM
#undef KREX_REAL
#undef DECL_

CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *dev, int ordinal);
CUresult cuDeviceGetCount(int *count);
CUresult cuModuleLoadData(CUmodule *mod, const void *image);
CUresult cuModuleGetFunction(CUfunction *f, CUmodule mod, const char *name);
CUresult cuStreamCreate(CUstream *s, unsigned int flags);
CUresult cuStreamSynchronize(CUstream s);
CUresult cuEventCreate(CUevent *e, unsigned int flags);
CUresult cuEventSynchronize(CUevent e);
CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status);
typedef CUresult (*krex_pfn_cuGetProcAddress)(const char *, void **, int, cuuint64_t);
typedef CUresult (*krex_pfn_cuGetProcAddress_v2)(const char *, void **, int, cuuint64_t,
                                                 CUdriverProcAddressQueryResult *);

#define CHECK(call)                                                                              \
    do {                                                                                         \
        CUresult rc_ = (call);                                                                   \
        if (rc_ != CUDA_SUCCESS) {                                                               \
            fprintf(stderr, "%s:%d: %s returned %d\n", __FILE__, __LINE__, #call, (int)rc_);     \
            exit(3);                                                                             \
        }                                                                                        \
    } while (0)

#endif
