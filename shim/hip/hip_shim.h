/*
 * hip_shim.h: the internal header of libkrex-hip.so (the HIP wrappers). The gate, the slot and
 * the region markers are the CUDA shim's own (shim.h, gate.c, region.c): vendor-neutral.
 */
#ifndef KREX_HIP_SHIM_H
#define KREX_HIP_SHIM_H

#include "../preload/shim.h"
#include "krex_hip.h"

/* Hook ids: every entry of hip_hooks.def. */
enum krex_hip_hook_id {
#define KREX_HIP_GATE(name, ...) KREX_HIP_##name,
#define KREX_HIP_TRACK(name, ...) KREX_HIP_##name,
#define KREX_HIP_OPEN(name, ...) KREX_HIP_##name,
#define KREX_HIP_REAL(name, ...) KREX_HIP_##name,
#define KREX_HIP_LOOKUP(name, ...) KREX_HIP_##name,
#include "hip_hooks.def"
#undef KREX_HIP_GATE
#undef KREX_HIP_TRACK
#undef KREX_HIP_OPEN
#undef KREX_HIP_REAL
#undef KREX_HIP_LOOKUP
    KREX_HIP_COUNT
};

/* Pointer types of every hooked name: krex_pfn_<name>. */
#define KREX_HIP_PFN_(name, params, args) typedef hipError_t(*krex_pfn_##name) params;
#define KREX_HIP_GATE(name, ...) KREX_HIP_PFN_(name, __VA_ARGS__)
#define KREX_HIP_TRACK(name, ...) KREX_HIP_PFN_(name, __VA_ARGS__)
#define KREX_HIP_OPEN(name, ...) KREX_HIP_PFN_(name, __VA_ARGS__)
#define KREX_HIP_REAL(name, ...) KREX_HIP_PFN_(name, __VA_ARGS__)
#define KREX_HIP_LOOKUP(name, ...) KREX_HIP_PFN_(name, __VA_ARGS__)
#include "hip_hooks.def"
#undef KREX_HIP_GATE
#undef KREX_HIP_TRACK
#undef KREX_HIP_OPEN
#undef KREX_HIP_REAL
#undef KREX_HIP_LOOKUP

/* hip_hooks.c: the real functions, looked up in libamdhip64 on first use. */
KREX_HIDDEN void *krex_hip_real_get(enum krex_hip_hook_id id);

/* hip_drain.c: devices the process used (hipSetDevice). */
KREX_HIDDEN void krex_hip_device_used(int device);

#endif /* KREX_HIP_SHIM_H */
