/*
 * mem_views.h: the first bytes of the driver structs the memory hooks read (shim/preload/mem.c):
 * CUmemAllocationProp, CUDA_ARRAY_DESCRIPTOR, CUDA_ARRAY3D_DESCRIPTOR. tests/c/check_cuda_h.c
 * compares their offsets with the real cuda.h's.
 */
#ifndef KREX_MEM_VIEWS_H
#define KREX_MEM_VIEWS_H

#include <stddef.h>

#include "krex_cuda.h"

struct krex_mem_prop_head {
    int type;                 /* CUmemAllocationType */
    int requestedHandleTypes; /* CUmemAllocationHandleType */
    CUmemLocation location;
};
struct krex_array_desc {
    size_t Width;
    size_t Height;
    unsigned int Format; /* CUarray_format */
    unsigned int NumChannels;
};
struct krex_array3d_desc {
    size_t Width;
    size_t Height;
    size_t Depth;
    unsigned int Format;
    unsigned int NumChannels;
    unsigned int Flags;
};

#endif /* KREX_MEM_VIEWS_H */
