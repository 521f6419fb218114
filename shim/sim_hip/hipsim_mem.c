/*
 * hipsim_mem.c: allocation, copies and sets.
 *
 * Device memory is the simulated driver's (host memory, addressed as CUdeviceptr), so every
 * pointer, host or device, can be handed to its copy: each copy or set is cuMemcpyAsync /
 * cuMemsetD8Async / cuMemsetD32Async on the stream (the driver moves the bytes at the call and
 * charges bytes / bandwidth of device time), and a synchronous one then waits for its stream.
 * The copy kind is checked, not needed. 2D and 3D copies and sets are one linear copy when
 * the rows are contiguous, else one per row; peer copies are plain copies (one address space);
 * a symbol is taken to be the device address of its data. Arrays are not simulated.
 *
 * The internal paths through exported names (hipsim.h) are marked "through the PLT".
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "hipsim.h"

/* ---- Allocation. ---- */

hipError_t hipMalloc(void **ptr, size_t size)
{
    if (!ptr)
        return hs_ret(hipErrorInvalidValue);
    *ptr = NULL;
    hipError_t e = hs_enter();
    if (e != hipSuccess || size == 0)
        return hs_ret(e);
    CUdeviceptr d = 0;
    e = hs_err(cuMemAlloc_v2(&d, size));
    if (e == hipSuccess)
        *ptr = (void *)(uintptr_t)d;
    return hs_ret(e);
}

/* Like ROCm, waits for the device first. */
hipError_t hipFree(void *ptr)
{
    hipError_t e = hs_enter();
    if (e != hipSuccess || !ptr)
        return hs_ret(e);
    e = hs_err(cuCtxSynchronize());
    if (e != hipSuccess)
        return hs_ret(e);
    CUresult r = cuMemFree_v2(HS_DPTR(ptr));
    return hs_ret(r == CUDA_ERROR_INVALID_VALUE ? hipErrorInvalidDevicePointer : hs_err(r));
}

/* Pinned host memory is plain memory; the list tells hipHostFree its own pointers from others
 * (a device pointer freed there would corrupt the driver's table). */
struct hs_host_block {
    struct hs_host_block *next;
    void *ptr;
};

static pthread_mutex_t hs_host_lock = PTHREAD_MUTEX_INITIALIZER;
static struct hs_host_block *hs_host_blocks;

hipError_t hipHostMalloc(void **ptr, size_t size, unsigned int flags)
{
    (void)flags; /* coherence, mapping, NUMA: nothing to choose between in host memory */
    if (!ptr)
        return hs_ret(hipErrorInvalidValue);
    *ptr = NULL;
    hipError_t e = hs_init();
    if (e != hipSuccess || size == 0)
        return hs_ret(e);
    struct hs_host_block *b = malloc(sizeof *b);
    void *p = NULL;
    if (!b || posix_memalign(&p, 4096, size) != 0) {
        free(b);
        return hs_ret(hipErrorOutOfMemory);
    }
    b->ptr = p;
    pthread_mutex_lock(&hs_host_lock);
    b->next = hs_host_blocks;
    hs_host_blocks = b;
    pthread_mutex_unlock(&hs_host_lock);
    *ptr = p;
    return hipSuccess;
}

hipError_t hipHostFree(void *ptr)
{
    if (!ptr)
        return hs_ret(hs_init());
    hipError_t e = hs_enter();
    if (e == hipSuccess)
        e = hs_err(cuCtxSynchronize());
    if (e != hipSuccess)
        return hs_ret(e);
    pthread_mutex_lock(&hs_host_lock);
    struct hs_host_block **link = &hs_host_blocks, *b;
    while ((b = *link) && b->ptr != ptr)
        link = &b->next;
    if (b)
        *link = b->next;
    pthread_mutex_unlock(&hs_host_lock);
    if (!b)
        return hs_ret(hipErrorInvalidValue);
    free(b->ptr);
    free(b);
    return hipSuccess;
}

/* ---- The driver calls every copy and set ends in. ---- */

static int hs_kind_ok(hipMemcpyKind kind)
{
    return (kind >= hipMemcpyHostToHost && kind <= hipMemcpyDefault) ||
           kind == hipMemcpyDeviceToDeviceNoCU;
}

static hipError_t hs_wait(hipError_t e, hipStream_t s, int sync)
{
    if (e != hipSuccess || !sync)
        return e;
    return hs_err(cuStreamSynchronize(HS_STREAM(s)));
}

static hipError_t hs_copy(void *dst, const void *src, size_t n, hipStream_t s, int sync)
{
    hipError_t e = hs_enter();
    if (e != hipSuccess)
        return e;
    return hs_wait(hs_err(cuMemcpyAsync(HS_DPTR(dst), HS_DPTR(src), n, HS_STREAM(s))), s, sync);
}

static hipError_t hs_set8(void *dst, unsigned char v, size_t n, hipStream_t s, int sync)
{
    hipError_t e = hs_enter();
    if (e != hipSuccess)
        return e;
    return hs_wait(hs_err(cuMemsetD8Async(HS_DPTR(dst), v, n, HS_STREAM(s))), s, sync);
}

/* 16-bit sets: a byte set when both bytes agree; else the pattern is staged in host memory
 * and copied (one job of the same size; the driver moves the bytes at the call, so the
 * staging buffer can go at once). */
static hipError_t hs_set16(void *dst, unsigned short v, size_t n, hipStream_t s, int sync)
{
    if ((v & 0xFF) == (v >> 8))
        return hs_set8(dst, (unsigned char)(v & 0xFF), n * 2, s, sync);
    if (n > SIZE_MAX / 2)
        return hipErrorInvalidValue;
    unsigned short *stage = malloc(n ? n * 2 : 1);
    if (!stage)
        return hipErrorOutOfMemory;
    for (size_t i = 0; i < n; i++)
        stage[i] = v;
    hipError_t e = hs_copy(dst, stage, n * 2, s, sync);
    free(stage);
    return e;
}

static hipError_t hs_set32(void *dst, unsigned int v, size_t n, hipStream_t s, int sync)
{
    hipError_t e = hs_enter();
    if (e != hipSuccess)
        return e;
    return hs_wait(hs_err(cuMemsetD32Async(HS_DPTR(dst), v, n, HS_STREAM(s))), s, sync);
}

/* A copy of depth slices of height rows of width bytes: one job if it is contiguous on both
 * sides, else one per row. Empty extents copy nothing. */
static hipError_t hs_copy_rows(char *dst, size_t dpitch, size_t dslice, const char *src,
                               size_t spitch, size_t sslice, size_t width, size_t height,
                               size_t depth, hipStream_t s, int sync)
{
    if (!width || !height || !depth)
        return hipSuccess;
    if (width > dpitch || width > spitch)
        return hipErrorInvalidPitchValue;
    size_t plane = width * height;
    if (dpitch == width && spitch == width && (depth == 1 || (dslice == plane && sslice == plane)))
        return hs_copy(dst, src, plane * depth, s, sync);
    for (size_t z = 0; z < depth; z++) {
        for (size_t y = 0; y < height; y++) {
            hipError_t e = hs_copy(dst + z * dslice + y * dpitch, src + z * sslice + y * spitch,
                                   width, s, 0);
            if (e != hipSuccess)
                return e;
        }
    }
    return hs_wait(hipSuccess, s, sync);
}

static hipError_t hs_set_rows(char *dst, size_t pitch, size_t slice, int value, size_t width,
                              size_t height, size_t depth, hipStream_t s, int sync)
{
    if (!width || !height || !depth)
        return hipSuccess;
    if (width > pitch)
        return hipErrorInvalidPitchValue;
    size_t plane = width * height;
    if (pitch == width && (depth == 1 || slice == plane))
        return hs_set8(dst, (unsigned char)value, plane * depth, s, sync);
    for (size_t z = 0; z < depth; z++) {
        for (size_t y = 0; y < height; y++) {
            hipError_t e = hs_set8(dst + z * slice + y * pitch, (unsigned char)value, width, s, 0);
            if (e != hipSuccess)
                return e;
        }
    }
    return hs_wait(hipSuccess, s, sync);
}

static hipError_t hs_copy_3d(const hipMemcpy3DParms *p, hipStream_t s, int sync)
{
    if (!p)
        return hipErrorInvalidValue;
    if (p->srcArray || p->dstArray)
        return hipErrorNotSupported; /* arrays are not simulated */
    if (!hs_kind_ok(p->kind))
        return hipErrorInvalidMemcpyDirection;
    const hipPitchedPtr *sp = &p->srcPtr, *dp = &p->dstPtr;
    if (p->extent.depth > 1 && (sp->ysize < p->extent.height || dp->ysize < p->extent.height))
        return hipErrorInvalidValue;
    size_t sslice = sp->pitch * sp->ysize, dslice = dp->pitch * dp->ysize;
    const char *src = (const char *)sp->ptr + p->srcPos.z * sslice + p->srcPos.y * sp->pitch +
                      p->srcPos.x;
    char *dst = (char *)dp->ptr + p->dstPos.z * dslice + p->dstPos.y * dp->pitch + p->dstPos.x;
    return hs_copy_rows(dst, dp->pitch, dslice, src, sp->pitch, sslice, p->extent.width,
                        p->extent.height, p->extent.depth, s, sync);
}

static hipError_t hs_set_3d(hipPitchedPtr p, int value, hipExtent extent, hipStream_t s, int sync)
{
    if (extent.depth > 1 && p.ysize < extent.height)
        return hipErrorInvalidValue;
    return hs_set_rows(p.ptr, p.pitch, p.pitch * p.ysize, value, extent.width, extent.height,
                       extent.depth, s, sync);
}

static int hs_peer_ok(int a, int b)
{
    int n = hs_device_count();
    return a >= 0 && a < n && b >= 0 && b < n;
}

/* ---- Linear copies. ---- */

hipError_t hipMemcpyAsync(void *dst, const void *src, size_t sizeBytes, hipMemcpyKind kind,
                          hipStream_t stream)
{
    if (!hs_kind_ok(kind))
        return hs_ret(hipErrorInvalidMemcpyDirection);
    return hs_ret(hs_copy(dst, src, sizeBytes, stream, 0));
}

hipError_t hipMemcpy(void *dst, const void *src, size_t sizeBytes, hipMemcpyKind kind)
{
    hipError_t e = hipMemcpyAsync(dst, src, sizeBytes, kind, NULL); /* through the PLT */
    return e != hipSuccess ? e : hipStreamSynchronize(NULL);        /* through the PLT */
}

hipError_t hipMemcpy_spt(void *dst, const void *src, size_t sizeBytes, hipMemcpyKind kind)
{
    hipError_t e = hipMemcpyAsync(dst, src, sizeBytes, kind, hipStreamPerThread);
    return e != hipSuccess ? e : hipStreamSynchronize(hipStreamPerThread);
}

hipError_t hipMemcpyAsync_spt(void *dst, const void *src, size_t sizeBytes, hipMemcpyKind kind,
                              hipStream_t stream)
{
    return hipMemcpyAsync(dst, src, sizeBytes, kind, HS_SPT(stream));
}

hipError_t hipMemcpyWithStream(void *dst, const void *src, size_t sizeBytes, hipMemcpyKind kind,
                               hipStream_t stream)
{
    if (!hs_kind_ok(kind))
        return hs_ret(hipErrorInvalidMemcpyDirection);
    return hs_ret(hs_copy(dst, src, sizeBytes, stream, 1));
}

hipError_t hipMemcpyHtoD(hipDeviceptr_t dst, const void *src, size_t sizeBytes)
{
    return hipMemcpy(dst, src, sizeBytes, hipMemcpyHostToDevice); /* through the PLT */
}

hipError_t hipMemcpyDtoH(void *dst, hipDeviceptr_t src, size_t sizeBytes)
{
    return hipMemcpy(dst, src, sizeBytes, hipMemcpyDeviceToHost); /* through the PLT */
}

hipError_t hipMemcpyDtoD(hipDeviceptr_t dst, hipDeviceptr_t src, size_t sizeBytes)
{
    return hipMemcpy(dst, src, sizeBytes, hipMemcpyDeviceToDevice); /* through the PLT */
}

hipError_t hipMemcpyHtoDAsync(hipDeviceptr_t dst, const void *src, size_t sizeBytes,
                              hipStream_t stream)
{
    return hs_ret(hs_copy(dst, src, sizeBytes, stream, 0));
}

hipError_t hipMemcpyDtoHAsync(void *dst, hipDeviceptr_t src, size_t sizeBytes, hipStream_t stream)
{
    return hs_ret(hs_copy(dst, src, sizeBytes, stream, 0));
}

hipError_t hipMemcpyDtoDAsync(hipDeviceptr_t dst, hipDeviceptr_t src, size_t sizeBytes,
                              hipStream_t stream)
{
    return hs_ret(hs_copy(dst, src, sizeBytes, stream, 0));
}

hipError_t hipMemcpyPeer(void *dst, int dstDeviceId, const void *src, int srcDeviceId,
                         size_t sizeBytes)
{
    if (!hs_peer_ok(dstDeviceId, srcDeviceId))
        return hs_ret(hipErrorInvalidDevice);
    return hs_ret(hs_copy(dst, src, sizeBytes, NULL, 1));
}

hipError_t hipMemcpyPeerAsync(void *dst, int dstDeviceId, const void *src, int srcDevice,
                              size_t sizeBytes, hipStream_t stream)
{
    if (!hs_peer_ok(dstDeviceId, srcDevice))
        return hs_ret(hipErrorInvalidDevice);
    return hs_ret(hs_copy(dst, src, sizeBytes, stream, 0));
}

/* ---- 2D and 3D copies. ---- */

hipError_t hipMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                            size_t height, hipMemcpyKind kind, hipStream_t stream)
{
    if (!hs_kind_ok(kind))
        return hs_ret(hipErrorInvalidMemcpyDirection);
    return hs_ret(hs_copy_rows(dst, dpitch, 0, src, spitch, 0, width, height, 1, stream, 0));
}

hipError_t hipMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                       size_t height, hipMemcpyKind kind)
{
    if (!hs_kind_ok(kind))
        return hs_ret(hipErrorInvalidMemcpyDirection);
    return hs_ret(hs_copy_rows(dst, dpitch, 0, src, spitch, 0, width, height, 1, NULL, 1));
}

hipError_t hipMemcpy2D_spt(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                           size_t height, hipMemcpyKind kind)
{
    hipError_t e =
        hipMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, hipStreamPerThread);
    return e != hipSuccess ? e : hipStreamSynchronize(hipStreamPerThread);
}

hipError_t hipMemcpy2DAsync_spt(void *dst, size_t dpitch, const void *src, size_t spitch,
                                size_t width, size_t height, hipMemcpyKind kind,
                                hipStream_t stream)
{
    return hipMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, HS_SPT(stream));
}

hipError_t hipMemcpy3DAsync(const struct hipMemcpy3DParms *p, hipStream_t stream)
{
    return hs_ret(hs_copy_3d(p, stream, 0));
}

hipError_t hipMemcpy3D(const struct hipMemcpy3DParms *p) { return hs_ret(hs_copy_3d(p, NULL, 1)); }

hipError_t hipMemcpy3D_spt(const struct hipMemcpy3DParms *p)
{
    hipError_t e = hipMemcpy3DAsync(p, hipStreamPerThread);
    return e != hipSuccess ? e : hipStreamSynchronize(hipStreamPerThread);
}

hipError_t hipMemcpy3DAsync_spt(const hipMemcpy3DParms *p, hipStream_t stream)
{
    return hipMemcpy3DAsync(p, HS_SPT(stream));
}

/* ---- Symbols: the symbol is the device address of its data. ---- */

static hipError_t hs_to_symbol(const void *symbol, const void *src, size_t n, size_t offset,
                               hipMemcpyKind kind, hipStream_t s, int sync)
{
    if (!symbol)
        return hipErrorInvalidSymbol;
    if (kind != hipMemcpyHostToDevice && kind != hipMemcpyDeviceToDevice &&
        kind != hipMemcpyDefault)
        return hipErrorInvalidMemcpyDirection;
    return hs_copy((char *)(uintptr_t)symbol + offset, src, n, s, sync);
}

static hipError_t hs_from_symbol(void *dst, const void *symbol, size_t n, size_t offset,
                                 hipMemcpyKind kind, hipStream_t s, int sync)
{
    if (!symbol)
        return hipErrorInvalidSymbol;
    if (kind != hipMemcpyDeviceToHost && kind != hipMemcpyDeviceToDevice &&
        kind != hipMemcpyDefault)
        return hipErrorInvalidMemcpyDirection;
    return hs_copy(dst, (const char *)symbol + offset, n, s, sync);
}

hipError_t hipMemcpyToSymbol(const void *symbol, const void *src, size_t sizeBytes, size_t offset,
                             hipMemcpyKind kind)
{
    return hs_ret(hs_to_symbol(symbol, src, sizeBytes, offset, kind, NULL, 1));
}

hipError_t hipMemcpyToSymbolAsync(const void *symbol, const void *src, size_t sizeBytes,
                                  size_t offset, hipMemcpyKind kind, hipStream_t stream)
{
    return hs_ret(hs_to_symbol(symbol, src, sizeBytes, offset, kind, stream, 0));
}

hipError_t hipMemcpyToSymbol_spt(const void *symbol, const void *src, size_t sizeBytes,
                                 size_t offset, hipMemcpyKind kind)
{
    hipError_t e =
        hipMemcpyToSymbolAsync(symbol, src, sizeBytes, offset, kind, hipStreamPerThread);
    return e != hipSuccess ? e : hipStreamSynchronize(hipStreamPerThread);
}

hipError_t hipMemcpyToSymbolAsync_spt(const void *symbol, const void *src, size_t sizeBytes,
                                      size_t offset, hipMemcpyKind kind, hipStream_t stream)
{
    return hipMemcpyToSymbolAsync(symbol, src, sizeBytes, offset, kind, HS_SPT(stream));
}

hipError_t hipMemcpyFromSymbol(void *dst, const void *symbol, size_t sizeBytes, size_t offset,
                               hipMemcpyKind kind)
{
    return hs_ret(hs_from_symbol(dst, symbol, sizeBytes, offset, kind, NULL, 1));
}

hipError_t hipMemcpyFromSymbolAsync(void *dst, const void *symbol, size_t sizeBytes, size_t offset,
                                    hipMemcpyKind kind, hipStream_t stream)
{
    return hs_ret(hs_from_symbol(dst, symbol, sizeBytes, offset, kind, stream, 0));
}

hipError_t hipMemcpyFromSymbol_spt(void *dst, const void *symbol, size_t sizeBytes, size_t offset,
                                   hipMemcpyKind kind)
{
    hipError_t e =
        hipMemcpyFromSymbolAsync(dst, symbol, sizeBytes, offset, kind, hipStreamPerThread);
    return e != hipSuccess ? e : hipStreamSynchronize(hipStreamPerThread);
}

hipError_t hipMemcpyFromSymbolAsync_spt(void *dst, const void *symbol, size_t sizeBytes,
                                        size_t offset, hipMemcpyKind kind, hipStream_t stream)
{
    return hipMemcpyFromSymbolAsync(dst, symbol, sizeBytes, offset, kind, HS_SPT(stream));
}

/* ---- Sets. ---- */

hipError_t hipMemsetAsync(void *dst, int value, size_t sizeBytes, hipStream_t stream)
{
    return hs_ret(hs_set8(dst, (unsigned char)value, sizeBytes, stream, 0));
}

hipError_t hipMemset(void *dst, int value, size_t sizeBytes)
{
    hipError_t e = hipMemsetAsync(dst, value, sizeBytes, NULL); /* through the PLT */
    return e != hipSuccess ? e : hipStreamSynchronize(NULL);    /* through the PLT */
}

hipError_t hipMemset_spt(void *dst, int value, size_t sizeBytes)
{
    hipError_t e = hipMemsetAsync(dst, value, sizeBytes, hipStreamPerThread);
    return e != hipSuccess ? e : hipStreamSynchronize(hipStreamPerThread);
}

hipError_t hipMemsetAsync_spt(void *dst, int value, size_t sizeBytes, hipStream_t stream)
{
    return hipMemsetAsync(dst, value, sizeBytes, HS_SPT(stream));
}

hipError_t hipMemsetD8(hipDeviceptr_t dest, unsigned char value, size_t count)
{
    return hipMemset(dest, value, count); /* through the PLT */
}

hipError_t hipMemsetD8Async(hipDeviceptr_t dest, unsigned char value, size_t count,
                            hipStream_t stream)
{
    return hs_ret(hs_set8(dest, value, count, stream, 0));
}

hipError_t hipMemsetD16(hipDeviceptr_t dest, unsigned short value, size_t count)
{
    return hs_ret(hs_set16(dest, value, count, NULL, 1));
}

hipError_t hipMemsetD16Async(hipDeviceptr_t dest, unsigned short value, size_t count,
                             hipStream_t stream)
{
    return hs_ret(hs_set16(dest, value, count, stream, 0));
}

hipError_t hipMemsetD32(hipDeviceptr_t dest, int value, size_t count)
{
    return hs_ret(hs_set32(dest, (unsigned int)value, count, NULL, 1));
}

hipError_t hipMemsetD32Async(hipDeviceptr_t dst, int value, size_t count, hipStream_t stream)
{
    return hs_ret(hs_set32(dst, (unsigned int)value, count, stream, 0));
}

hipError_t hipMemset2DAsync(void *dst, size_t pitch, int value, size_t width, size_t height,
                            hipStream_t stream)
{
    return hs_ret(hs_set_rows(dst, pitch, 0, value, width, height, 1, stream, 0));
}

hipError_t hipMemset2D(void *dst, size_t pitch, int value, size_t width, size_t height)
{
    return hs_ret(hs_set_rows(dst, pitch, 0, value, width, height, 1, NULL, 1));
}

hipError_t hipMemset2D_spt(void *dst, size_t pitch, int value, size_t width, size_t height)
{
    hipError_t e = hipMemset2DAsync(dst, pitch, value, width, height, hipStreamPerThread);
    return e != hipSuccess ? e : hipStreamSynchronize(hipStreamPerThread);
}

hipError_t hipMemset2DAsync_spt(void *dst, size_t pitch, int value, size_t width, size_t height,
                                hipStream_t stream)
{
    return hipMemset2DAsync(dst, pitch, value, width, height, HS_SPT(stream));
}

hipError_t hipMemset3DAsync(hipPitchedPtr pitchedDevPtr, int value, hipExtent extent,
                            hipStream_t stream)
{
    return hs_ret(hs_set_3d(pitchedDevPtr, value, extent, stream, 0));
}

hipError_t hipMemset3D(hipPitchedPtr pitchedDevPtr, int value, hipExtent extent)
{
    return hs_ret(hs_set_3d(pitchedDevPtr, value, extent, NULL, 1));
}

hipError_t hipMemset3D_spt(hipPitchedPtr pitchedDevPtr, int value, hipExtent extent)
{
    hipError_t e = hipMemset3DAsync(pitchedDevPtr, value, extent, hipStreamPerThread);
    return e != hipSuccess ? e : hipStreamSynchronize(hipStreamPerThread);
}

hipError_t hipMemset3DAsync_spt(hipPitchedPtr pitchedDevPtr, int value, hipExtent extent,
                                hipStream_t stream)
{
    return hipMemset3DAsync(pitchedDevPtr, value, extent, HS_SPT(stream));
}
