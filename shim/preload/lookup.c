/*
 * lookup.c: the look-up paths into the driver. dlsym on a handle, cuGetProcAddress and
 * cuGetProcAddress_v2 (and the runtime's self-look-up of cuGetProcAddress through them) hand
 * back our wrapper for exactly the function the driver returned: the pointer is identified by
 * comparing it with the real addresses of the exact ELF names, never guessed from the name asked
 * for (the ABI depends on the version and flags, not on the name).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>

#include "shim.h"

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym;

KREX_HIDDEN void *krex_real_dlsym_get(void)
{
    dlsym_fn f = __atomic_load_n(&real_dlsym, __ATOMIC_ACQUIRE);
    if (KREX_UNLIKELY(!f)) {
        /* Not _dl_sym or __libc_dlsym (gone in glibc 2.34); no bare dlsym call in the shim. */
        static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
        for (size_t i = 0; !f && i < sizeof versions / sizeof versions[0]; i++)
            f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
        __atomic_store_n(&real_dlsym, f, __ATOMIC_RELEASE);
    }
    return (void *)f;
}

/* Handles other than RTLD_NEXT arrive here from the trampoline in dlsym_x86_64.S. */
KREX_HIDDEN void *krex_dlsym_hook(void *handle, const char *name)
{
    dlsym_fn f = (dlsym_fn)krex_real_dlsym_get();
    if (!f)
        return NULL;
    void *p = f(handle, name);
    if (!p || krex_in_resolve)
        return p;
    int i = krex_hook_find(name);
    if (i < 0 || p == krex_hooks[i].wrapper)
        return p;
    krex_resolve_from(p);
    if (__atomic_load_n(&krex_real[i], __ATOMIC_ACQUIRE) == p)
        return krex_hooks[i].wrapper;
    /* Same name, another library's function: not ours to wrap. */
    krex_debug("dlsym(%s) is not the driver's: passed through", name);
    return p;
}

/* Whether `symbol` is the base name of a gated entry (e.g. "cuMemcpyHtoD" for cuMemcpyHtoD_v2). */
static int is_gated_base(const char *symbol)
{
    size_t n = strlen(symbol);
    for (int i = 0; i < KREX_H_COUNT; i++) {
        const char *e = krex_hooks[i].name;
        if (krex_hooks[i].kind == KREX_KIND_GATE && strncmp(e, symbol, n) == 0 &&
            (e[n] == '\0' || e[n] == '_'))
            return 1;
    }
    return 0;
}

static void *identify(const char *symbol, void *p)
{
    for (int i = 0; i < KREX_H_COUNT; i++)
        if (krex_hooks[i].wrapper && __atomic_load_n(&krex_real[i], __ATOMIC_ACQUIRE) == p)
            return krex_hooks[i].wrapper;
    if (symbol && is_gated_base(symbol)) {
        /* A work-submitting entry we cannot identify would bypass the gate: count it so that
         * the GPU check (and a region's report) can show it. */
        krex_note_unmatched();
        krex_debug("cuGetProcAddress(%s) returned %p, which matches no exported name", symbol, p);
    }
    return p;
}

KREX_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                      cuuint64_t flags)
{
    krex_pfn_cuGetProcAddress real =
        (krex_pfn_cuGetProcAddress)krex_real_get(KREX_H_cuGetProcAddress);
    if (!real)
        return krex_missing(KREX_H_cuGetProcAddress);
    CUresult r = real(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && pfn && *pfn)
        *pfn = identify(symbol, *pfn);
    return r;
}

KREX_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                         cuuint64_t flags,
                                         CUdriverProcAddressQueryResult *symbolStatus)
{
    krex_pfn_cuGetProcAddress_v2 real =
        (krex_pfn_cuGetProcAddress_v2)krex_real_get(KREX_H_cuGetProcAddress_v2);
    if (!real)
        return krex_missing(KREX_H_cuGetProcAddress_v2);
    /* symbolStatus may be NULL (it is, from cudaGetDeviceCount): passed through as given. */
    CUresult r = real(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (r == CUDA_SUCCESS && pfn && *pfn)
        *pfn = identify(symbol, *pfn);
    return r;
}

/* dlmopen into a namespace of its own loads a second copy of the driver that LD_PRELOAD does
 * not reach: its work is never gated nor drained (docs/security.md, case 3). Passed through,
 * and counted in the process's slot (`ungated`), so that regions beside it say so. */
typedef void *(*dlmopen_fn)(Lmid_t, const char *, int);

static int is_gpu_driver(const char *file)
{
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    return strncmp(base, "libcuda.so", 10) == 0 || strncmp(base, "libamdhip64.so", 14) == 0 ||
           strncmp(base, "libcudart.so", 12) == 0;
}

KREX_EXPORT void *dlmopen(Lmid_t lmid, const char *file, int flags)
{
    static dlmopen_fn real;
    dlmopen_fn f = __atomic_load_n(&real, __ATOMIC_ACQUIRE);
    if (KREX_UNLIKELY(!f)) {
        static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.3.4"};
        for (size_t i = 0; !f && i < sizeof versions / sizeof versions[0]; i++)
            f = (dlmopen_fn)dlvsym(RTLD_NEXT, "dlmopen", versions[i]);
        if (!f)
            return NULL;
        __atomic_store_n(&real, f, __ATOMIC_RELEASE);
    }
    void *h = f(lmid, file, flags);
    /* Counted once the copy is loaded (a dlmopen that failed loaded nothing to gate). */
    if (h && lmid != LM_ID_BASE && file && is_gpu_driver(file)) {
        struct krex_slot *s = krex_register();
        krex_warn("dlmopen(%s) into a namespace of its own: the GPU work through it is not "
                  "gated or drained, and regions beside this process are reported unclean",
                  file);
        if (s)
            KREX_ADD(&s->ungated, 1);
    }
    return h;
}
