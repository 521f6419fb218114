/*
 * hip_hooks.c: libkrex-hip.so's wrappers, generated from hip_hooks.def, and the one place the
 * real HIP functions are looked up.
 *
 * Each wrapper is exported as krex_hip_<name>, never under the HIP name (audit.c says why);
 * the audit module hands its address to every binding of <name> from outside libamdhip64.
 * The real functions come from dlsym on libamdhip64's handle: bindings made by this library
 * are the ones the audit module leaves alone.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "hip_shim.h"

/* The table (below the wrappers it points to): name, kind and wrapper of every entry. */
static const struct krex_hook hip_hooks[KREX_HIP_COUNT];

static void *hip_real[KREX_HIP_COUNT];
static pthread_once_t resolve_once = PTHREAD_ONCE_INIT;

static void resolve(void)
{
    /* The wrappers only run once a program bound a HIP function: the library is loaded. */
    static const char *const libs[] = {"libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6"};
    void *h = NULL;
    for (size_t i = 0; !h && i < sizeof libs / sizeof libs[0]; i++)
        h = dlopen(libs[i], RTLD_LAZY | RTLD_NOLOAD);
    if (!h) {
        krex_warn("libamdhip64 is not loaded: HIP calls cannot be forwarded");
        return;
    }
    for (int i = 0; i < KREX_HIP_COUNT; i++)
        __atomic_store_n(&hip_real[i], dlsym(h, hip_hooks[i].name), __ATOMIC_RELEASE);
}

void *krex_hip_real_get(enum krex_hip_hook_id id)
{
    void *p = __atomic_load_n(&hip_real[id], __ATOMIC_ACQUIRE);
    if (KREX_UNLIKELY(!p)) {
        pthread_once(&resolve_once, resolve);
        p = __atomic_load_n(&hip_real[id], __ATOMIC_ACQUIRE);
    }
    return p;
}

static hipError_t missing(enum krex_hip_hook_id id)
{
    static int warned;
    if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
        krex_warn("%s is not in the loaded libamdhip64", hip_hooks[id].name);
    return hipErrorNotInitialized;
}

/* Gated wrappers: announce, check the gate, call, withdraw (the CUDA shim's hot path). */
#define KREX_HIP_GATE_(name, params, args)                                                       \
    KREX_EXPORT hipError_t krex_hip_##name params KREX_GATED_BODY(                               \
        hipError_t, krex_pfn_##name, krex_hip_real_get(KREX_HIP_##name),                         \
        missing(KREX_HIP_##name), args)

/* Calls that may start HIP on a device: the slot first, then the call. A process that started
 * HIP on a device has a slot, one that did not is not ours: ROCm lists a process from its
 * runtime's start (a program's first HIP call, whichever it is), the simulated driver from its
 * context's creation. The slot is taken before such a call goes on, as the CUDA shim takes it
 * before a context (drain.c), so that a region's audit never sees a tenant's process on the GPU
 * with no slot. */
#define KREX_HIP_OPEN_(name, params, args)                                                       \
    KREX_EXPORT hipError_t krex_hip_##name params                                                \
    {                                                                                            \
        krex_slot_self();                                                                        \
        krex_pfn_##name real = (krex_pfn_##name)krex_hip_real_get(KREX_HIP_##name);              \
        return real ? real args : missing(KREX_HIP_##name);                                      \
    }
#define KREX_HIP_GATE(name, ...) KREX_HIP_GATE_(name, __VA_ARGS__)
#define KREX_HIP_TRACK(name, ...)
#define KREX_HIP_OPEN(name, ...) KREX_HIP_OPEN_(name, __VA_ARGS__)
#define KREX_HIP_REAL(name, ...)
#define KREX_HIP_LOOKUP(name, ...)
#include "hip_hooks.def"
#undef KREX_HIP_GATE
#undef KREX_HIP_TRACK
#undef KREX_HIP_OPEN
#undef KREX_HIP_REAL
#undef KREX_HIP_LOOKUP

/* Tracked: the devices the drain must synchronise. It may start HIP too: the slot first. */
KREX_EXPORT hipError_t krex_hip_hipSetDevice(int device)
{
    krex_slot_self();
    krex_pfn_hipSetDevice real = (krex_pfn_hipSetDevice)krex_hip_real_get(KREX_HIP_hipSetDevice);
    if (!real)
        return missing(KREX_HIP_hipSetDevice);
    hipError_t r = real(device);
    if (r == hipSuccess)
        krex_hip_device_used(device);
    return r;
}

KREX_EXPORT hipError_t krex_hip_hipGetProcAddress(const char *symbol, void **pfn, int hipVersion,
                                                  uint64_t flags,
                                                  hipDriverProcAddressQueryResult *symbolStatus);

/* The table: the handwritten wrappers are declared above, the gated ones generated. */
static const struct krex_hook hip_hooks[KREX_HIP_COUNT] = {
#define KREX_HIP_GATE(name, ...)                                                                 \
    [KREX_HIP_##name] = {#name, KREX_KIND_GATE, (void *)krex_hip_##name},
#define KREX_HIP_TRACK(name, ...)                                                                \
    [KREX_HIP_##name] = {#name, KREX_KIND_TRACK, (void *)krex_hip_##name},
#define KREX_HIP_OPEN(name, ...) KREX_HIP_TRACK(name, __VA_ARGS__)
#define KREX_HIP_REAL(name, ...) [KREX_HIP_##name] = {#name, KREX_KIND_REAL, NULL},
#define KREX_HIP_LOOKUP(name, ...)                                                               \
    [KREX_HIP_##name] = {#name, KREX_KIND_LOOKUP, (void *)krex_hip_##name},
#include "hip_hooks.def"
#undef KREX_HIP_GATE
#undef KREX_HIP_TRACK
#undef KREX_HIP_OPEN
#undef KREX_HIP_REAL
#undef KREX_HIP_LOOKUP
};

/* The wrapper address handed out for a real function, or NULL. */
static void *wrapper_of(const void *real)
{
    for (int i = 0; i < KREX_HIP_COUNT; i++)
        if (hip_hooks[i].wrapper && krex_hip_real_get((enum krex_hip_hook_id)i) == real)
            return hip_hooks[i].wrapper;
    return NULL;
}

/* hipGetProcAddress: the real one answers (its version and per-thread-stream rules), then a
 * hooked function's address is swapped for its wrapper, matched by address so that whichever
 * variant the real one picked (e.g. an _spt twin) gets its own wrapper. */
KREX_EXPORT hipError_t krex_hip_hipGetProcAddress(const char *symbol, void **pfn, int hipVersion,
                                                  uint64_t flags,
                                                  hipDriverProcAddressQueryResult *symbolStatus)
{
    krex_pfn_hipGetProcAddress real =
        (krex_pfn_hipGetProcAddress)krex_hip_real_get(KREX_HIP_hipGetProcAddress);
    if (!real)
        return missing(KREX_HIP_hipGetProcAddress);
    hipError_t r = real(symbol, pfn, hipVersion, flags, symbolStatus);
    if (r == hipSuccess && pfn && *pfn) {
        void *w = wrapper_of(*pfn);
        if (w)
            *pfn = w;
    }
    return r;
}
