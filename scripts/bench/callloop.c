/* callloop.c: N calls of cuLaunchKernel (direct binding); prints ns per call. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "krex_cuda.h"

CUresult cuLaunchKernel(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                        unsigned int, unsigned int, unsigned int, CUstream, void **, void **);

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 10000000;
    struct timespec a, b;
    cuLaunchKernel(0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0); /* registers with the shim */
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++)
        if (cuLaunchKernel(0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0) != CUDA_SUCCESS)
            return 1;
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
    printf("%.3f\n", ns / (double)n);
    return 0;
}
