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

/* The PTX file at path, NUL-terminated, in a static buffer (NULL, said on stderr, when it cannot
 * be read). */
static inline const char *read_ptx(const char *path)
{
    static char ptx[1 << 20];
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return NULL;
    }
    size_t n = fread(ptx, 1, sizeof ptx - 1, f);
    fclose(f);
    ptx[n] = 0;
    return ptx;
}

#endif
