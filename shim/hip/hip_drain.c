/*
 * hip_drain.c: the HIP part of the drain (docs/shim.md, region protocol step 3; the thread is
 * drain_thread.c's).
 *
 * HIP has no context to synchronise from another thread: the thread makes each device the
 * process used current (hipSetDevice is per thread) and synchronises it (hipDeviceSynchronize
 * waits for every stream of this process on that device). Devices are learned from hipSetDevice;
 * a process that never called it uses device 0.
 */
#define _GNU_SOURCE
#include "hip_shim.h"

static uint64_t devices_used; /* bit d: the process called hipSetDevice(d) */

void krex_hip_device_used(int device)
{
    if (device >= 0 && device < 64)
        __atomic_or_fetch(&devices_used, 1ULL << device, __ATOMIC_RELAXED);
}

void krex_drain_sync(void)
{
    krex_pfn_hipSetDevice set = (krex_pfn_hipSetDevice)krex_hip_real_get(KREX_HIP_hipSetDevice);
    krex_pfn_hipDeviceSynchronize sync =
        (krex_pfn_hipDeviceSynchronize)krex_hip_real_get(KREX_HIP_hipDeviceSynchronize);
    if (!set || !sync)
        return;
    uint64_t used = __atomic_load_n(&devices_used, __ATOMIC_RELAXED);
    if (!used)
        used = 1; /* the default device */
    for (int d = 0; d < 64; d++) {
        if (!(used >> d & 1))
            continue;
        hipError_t r = set(d);
        if (r == hipSuccess)
            r = sync();
        if (r != hipSuccess)
            krex_debug("drain: synchronising HIP device %d returned %d", d, (int)r);
    }
}

void krex_drain_forget(void)
{
    /* HIP is unusable in a forked child until it initialises again. */
    devices_used = 0;
}
