/* nodriver.c: calls a gated entry point found through dlsym(RTLD_DEFAULT) where no driver is
 * loadable: the shim must answer CUDA_ERROR_NOT_FOUND (500) each time, warn once, never hang. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

#include "cuda_api.h"

int main(void)
{
    krex_pfn_cuLaunchKernel f = (krex_pfn_cuLaunchKernel)dlsym(RTLD_DEFAULT, "cuLaunchKernel");
    if (!f) {
        puts("no symbol");
        return 2;
    }
    for (int i = 0; i < 2; i++)
        printf("%d\n", (int)f(0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0));
    return 0;
}
