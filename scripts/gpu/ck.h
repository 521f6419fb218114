/* ck.h: the GPU check programs' one way to fail on a driver error: print the call and its
 * CUresult, and return 1 from main. */
#ifndef KREX_GPU_CK_H
#define KREX_GPU_CK_H

#include <cuda.h>
#include <stdio.h>

#define CK(x)                                                                                    \
    do {                                                                                         \
        CUresult r_ = (x);                                                                       \
        if (r_ != CUDA_SUCCESS) {                                                                \
            fprintf(stderr, "%s failed: %d\n", #x, (int)r_);                                     \
            return 1;                                                                            \
        }                                                                                        \
    } while (0)

#endif
