/*
 * hooks.c: the hook table, the one place real driver symbols are resolved, and the gated
 * wrappers, all generated from hooks.def.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>

#include "shim.h"

/* Generated gated wrappers: exported under the exact driver name. */
#define KREX_GATE_(name, params, args)                                                           \
    KREX_EXPORT CUresult name params KREX_GATED_BODY(CUresult, krex_pfn_##name,                  \
                                                     krex_real_get(KREX_H_##name),               \
                                                     krex_missing(KREX_H_##name), args)
/* A gated call the driver can answer with out-of-memory for memory of its own: that answer
 * waits (each try announced and checked at the gate anew). A launch on a stream is paced as
 * well (KREX_GATE_LAUNCH: pace.c): before it is announced (a wait there is the program's own,
 * nothing in flight), its marker recorded while it is; KREX_PACE_NONE paces nothing. */
#define KREX_GATE_MEM_(name, kind, params, args)                                                 \
    KREX_GATE_LAUNCH_(name, kind, KREX_PACE_NONE, params, args)
#define KREX_GATE_LAUNCH_(name, kind, stream, params, args)                                      \
    KREX_EXPORT CUresult name params                                                             \
    {                                                                                            \
        krex_pfn_##name krex_real_ = (krex_pfn_##name)krex_real_get(KREX_H_##name);              \
        if (KREX_UNLIKELY(!krex_real_))                                                          \
            return krex_missing(KREX_H_##name);                                                  \
        struct krex_slot *krex_s_;                                                               \
        CUresult krex_r_;                                                                        \
        CUstream krex_st_ = (stream);                                                            \
        krex_pace_wait(krex_st_);                                                                \
        KREX_MEM_RETRY(krex_r_, krex_s_, 0, -1, kind, #name, krex_s_ = krex_enter();             \
                       krex_r_ = krex_real_ args; krex_pace_mark(krex_s_, krex_st_, krex_r_);    \
                       krex_leave(krex_s_));                                                     \
        return krex_r_;                                                                          \
    }
/* The driver allocates for itself (modules, libraries, graphs): not gated, not counted; an
 * out-of-memory answer waits (the slot is looked at only then). */
#define KREX_DRIVER_(name, kind, params, args)                                                   \
    KREX_EXPORT CUresult name params                                                             \
    {                                                                                            \
        krex_pfn_##name krex_real_ = (krex_pfn_##name)krex_real_get(KREX_H_##name);              \
        if (KREX_UNLIKELY(!krex_real_))                                                          \
            return krex_missing(KREX_H_##name);                                                  \
        CUresult krex_r_;                                                                        \
        KREX_MEM_RETRY(krex_r_, krex_slot_self(), 0, -1, kind, #name, krex_r_ = krex_real_ args); \
        return krex_r_;                                                                          \
    }
#define KREX_GATE(name, ...) KREX_GATE_(name, __VA_ARGS__)
#define KREX_GATE_MEM(name, kind, ...) KREX_GATE_MEM_(name, kind, __VA_ARGS__)
#define KREX_GATE_LAUNCH(name, kind, stream, ...) KREX_GATE_LAUNCH_(name, kind, stream, __VA_ARGS__)
#define KREX_DRIVER(name, kind, ...) KREX_DRIVER_(name, kind, __VA_ARGS__)
#define KREX_TRACK(name, ...)
#define KREX_MEM(name, ...)
#define KREX_REAL(name, ...)
#include "hooks.def"
#undef KREX_GATE
#undef KREX_GATE_MEM
#undef KREX_GATE_LAUNCH
#undef KREX_DRIVER
#undef KREX_TRACK
#undef KREX_MEM
#undef KREX_REAL

/* The tracked, memory and look-up wrappers are written by hand (drain.c, mem.c, lookup.c);
 * declare them. (The table below sees KREX_GATE_MEM and KREX_GATE_LAUNCH as KREX_GATE,
 * KREX_DRIVER as KREX_MEM.) */
#define KREX_DECL_(name, params, args) CUresult name params;
#define KREX_GATE(name, ...)
#define KREX_GATE_MEM(name, ...)
#define KREX_DRIVER(name, ...)
#define KREX_TRACK(name, ...) KREX_DECL_(name, __VA_ARGS__)
#define KREX_MEM(name, ...) KREX_DECL_(name, __VA_ARGS__)
#define KREX_REAL(name, ...)
#include "hooks.def"
#undef KREX_GATE
#undef KREX_GATE_MEM
#undef KREX_DRIVER
#undef KREX_TRACK
#undef KREX_MEM
#undef KREX_REAL
CUresult cuGetProcAddress(const char *, void **, int, cuuint64_t);
CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t,
                             CUdriverProcAddressQueryResult *);

const struct krex_hook krex_hooks[KREX_H_COUNT] = {
#define KREX_GATE(name, ...) [KREX_H_##name] = {#name, KREX_KIND_GATE, (void *)name},
#define KREX_TRACK(name, ...) [KREX_H_##name] = {#name, KREX_KIND_TRACK, (void *)name},
#define KREX_MEM(name, ...) [KREX_H_##name] = {#name, KREX_KIND_MEM, (void *)name},
#define KREX_REAL(name, ...) [KREX_H_##name] = {#name, KREX_KIND_REAL, NULL},
#include "hooks.def"
#undef KREX_GATE
#undef KREX_TRACK
#undef KREX_MEM
#undef KREX_REAL
    [KREX_H_cuGetProcAddress] = {"cuGetProcAddress", KREX_KIND_LOOKUP, (void *)cuGetProcAddress},
    [KREX_H_cuGetProcAddress_v2] = {"cuGetProcAddress_v2", KREX_KIND_LOOKUP,
                                    (void *)cuGetProcAddress_v2},
};

void *krex_real[KREX_H_COUNT];
__thread int krex_in_resolve;

static int resolved;

/*
 * No lock of ours is held here: dlopen and dlsym take the loader's lock, and a thread inside a
 * library constructor (holding that lock) can call dlsym into us. Threads that race here do the
 * same idempotent work and store the same pointers.
 */
void krex_resolve_from(const void *addr)
{
    if (__atomic_load_n(&resolved, __ATOMIC_ACQUIRE))
        return;
    void *(*real_dlsym)(void *, const char *) =
        (void *(*)(void *, const char *))krex_real_dlsym_get();
    if (!real_dlsym)
        return;
    krex_in_resolve = 1;
    void *lib = NULL;
    Dl_info info = {0};
    /* The library that holds a pointer the program got from the driver is the driver. */
    if (addr && dladdr(addr, &info) && info.dli_fname)
        lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    if (!lib)
        lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    /* Not loaded at all: the symbols after ours in the search order are the driver's. */
    void *handle = lib ? lib : RTLD_NEXT;
    int found = 0;
    for (int i = 0; i < KREX_H_COUNT; i++) {
        void *p = real_dlsym(handle, krex_hooks[i].name);
        if (p == krex_hooks[i].wrapper)
            p = NULL; /* never call ourselves */
        __atomic_store_n(&krex_real[i], p, __ATOMIC_RELEASE);
        found += p != NULL;
    }
    krex_in_resolve = 0;
    /* No driver yet (e.g. called before libcuda was loaded): try again next time. */
    if (found && !__atomic_exchange_n(&resolved, 1, __ATOMIC_ACQ_REL))
        krex_debug("resolved %d of %d driver entry points from %s", found, (int)KREX_H_COUNT,
                   info.dli_fname && lib ? info.dli_fname : "libcuda.so.1");
}

int krex_hook_find(const char *name)
{
    /* Only cu + capital letter: a bare "cu" prefix also catches cudnn* and friends. */
    if (!name || name[0] != 'c' || name[1] != 'u' || name[2] < 'A' || name[2] > 'Z')
        return -1;
    for (int i = 0; i < KREX_H_COUNT; i++)
        if (krex_hooks[i].kind != KREX_KIND_REAL && strcmp(krex_hooks[i].name, name) == 0)
            return i;
    return -1;
}

CUresult krex_missing(enum krex_hook_id id)
{
    static int warned;
    if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
        krex_warn("the real driver has no %s (is libcuda.so.1 loadable?); returning "
                  "CUDA_ERROR_NOT_FOUND",
                  krex_hooks[id].name);
    return CUDA_ERROR_NOT_FOUND;
}
