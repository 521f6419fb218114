/*
 * lookup.c: the look-up paths into the driver. dlsym on a handle, cuGetProcAddress and
 * cuGetProcAddress_v2 (and the runtime's self-look-up of cuGetProcAddress through them) hand
 * back our wrapper for exactly the function the driver returned: the pointer is identified by
 * comparing it with the real addresses of the exact ELF names, never guessed from the name asked
 * for (the ABI depends on the version and flags, not on the name).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <string.h>

#include "shim.h"

typedef void *(*dlsym_fn)(void *, const char *);

/* The real `name`, the next after ours, under the first of `versions` (NULL-terminated) that the
 * C library has; looked up once. Not _dl_sym or __libc_dlsym (gone in glibc 2.34). */
KREX_HIDDEN void *krex_real_next(void **cache, const char *name, const char *const *versions)
{
    void *f = __atomic_load_n(cache, __ATOMIC_ACQUIRE);
    if (KREX_UNLIKELY(!f)) {
        for (size_t i = 0; !f && versions[i]; i++)
            f = dlvsym(RTLD_NEXT, name, versions[i]);
        __atomic_store_n(cache, f, __ATOMIC_RELEASE);
    }
    return f;
}

/* No bare dlsym call in the shim: this is the real one. */
void *krex_real_dlsym_get(void)
{
    static void *real;
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", NULL};
    return krex_real_next(&real, "dlsym", versions);
}

/* What a look-up by name that found p hands back: our wrapper when p is the driver's function of
 * that exact name, our own loader entry when p is the real one (the caller's later look-ups
 * then come back through us too). */
static void *looked_up(const char *name, void *p)
{
    if (!p || krex_in_resolve)
        return p;
    int i = krex_hook_find(name);
    if (i < 0)
        return krex_loader_entry(name, p);
    if (p == krex_hooks[i].wrapper)
        return p;
    krex_resolve_from(p);
    if (__atomic_load_n(&krex_real[i], __ATOMIC_ACQUIRE) == p)
        return krex_hooks[i].wrapper;
    /* A second copy of the driver (e.g. opened by another path) is never gated: say so. */
    krex_ungated_if_driver(p, name);
    /* Same name, another library's function: not ours to wrap. */
    krex_debug("dlsym(%s) is not the driver's: passed through", name);
    return p;
}

/* Handles other than RTLD_NEXT arrive here from the trampolines in dlsym_x86_64.S. */
KREX_HIDDEN void *krex_dlsym_hook(void *handle, const char *name)
{
    dlsym_fn f = (dlsym_fn)krex_real_dlsym_get();
    return f ? looked_up(name, f(handle, name)) : NULL;
}

/* dlsym(RTLD_DEFAULT, ...) from a deep-bound library (krex_dlsym_deep_entry, reached by jumps:
 * the return address is the caller's). Natively its own scope comes first, then the global
 * one; the shim makes the call, so it asks both (the caller's handle finds what it or, for the
 * library dlopen'd, its dependencies define). */
KREX_HIDDEN void *krex_dlsym_default_deep(void *handle, const char *name)
{
    dlsym_fn f = (dlsym_fn)krex_real_dlsym_get();
    if (!f)
        return NULL;
    struct link_map *cm = NULL;
    Dl_info info;
    void *p = NULL;
    if (dladdr1(__builtin_return_address(0), &info, (void **)&cm, RTLD_DL_LINKMAP) && cm)
        p = f(cm, name);
    return looked_up(name, p ? p : f(handle, name));
}

/* dlvsym: the driver's entries carry no version, so any version finds them (it used to hand
 * back the real cuLaunchKernel). */
typedef void *(*dlvsym_fn)(void *, const char *, const char *);

KREX_HIDDEN void *krex_dlvsym_hook(void *handle, const char *name, const char *version)
{
    dlvsym_fn f = (dlvsym_fn)krex_real_dlvsym_get();
    return f ? looked_up(name, f(handle, name, version)) : NULL;
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

KREX_HIDDEN int krex_is_gpu_driver(const char *file)
{
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    return strncmp(base, "libcuda.so", 10) == 0 || strncmp(base, "libamdhip64.so", 14) == 0 ||
           strncmp(base, "libcudart.so", 12) == 0;
}

KREX_HIDDEN void *krex_real_dlmopen_get(void)
{
    static void *real;
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.3.4", NULL};
    return krex_real_next(&real, "dlmopen", versions);
}

KREX_EXPORT void *dlmopen(Lmid_t lmid, const char *file, int flags)
{
    dlmopen_fn f = (dlmopen_fn)krex_real_dlmopen_get();
    if (!f)
        return NULL;
    void *h = f(lmid, file, flags);
    /* Counted once the copy is loaded (a dlmopen that failed loaded nothing to gate). */
    if (h && lmid != LM_ID_BASE && file && krex_is_gpu_driver(file)) {
        krex_warn("dlmopen(%s) into a namespace of its own: the GPU work through it is not "
                  "gated or drained, and regions beside this process are reported unclean",
                  file);
        krex_count_ungated();
    }
    return h;
}

/* Our dlmopen under a name of the shim's own, for deepbind.c to write into GOTs. */
extern __typeof__(dlmopen) krex_dlmopen_entry
    __attribute__((alias("dlmopen"), visibility("hidden"), nothrow));
