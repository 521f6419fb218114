/*
 * sim_api_device.c: initialisation, driver version, and the simulated devices, which look
 * like H200s (compute capability 9.0, 132 SMs, 141 GB unless KREX_SIM_MEM_BYTES says).
 *
 * cuInit is not required first: every entry point initialises on first use (leniency), and
 * cuInit just reports how that went.
 */
#include <stdio.h>

#include "sim.h"

CUresult sim_cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = sim_ensure_init();
    if (r != CUDA_SUCCESS)
        return r;
    return sim_cfg.n_visible ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}
SIM_EXPORT(cuInit);

CUresult sim_cuDriverGetVersion(int *version)
{
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    *version = SIM_DRIVER_VERSION;
    return CUDA_SUCCESS;
}
SIM_EXPORT(cuDriverGetVersion);

CUresult sim_cuDeviceGetCount(int *count)
{
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = sim_ensure_init();
    if (r != CUDA_SUCCESS)
        return r;
    *count = (int)sim_cfg.n_visible;
    return CUDA_SUCCESS;
}
SIM_EXPORT(cuDeviceGetCount);

CUresult sim_cuDeviceGet(CUdevice *device, int ordinal)
{
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = sim_ensure_init();
    if (r != CUDA_SUCCESS)
        return r;
    if (ordinal < 0 || (unsigned)ordinal >= sim_cfg.n_visible)
        return CUDA_ERROR_INVALID_DEVICE;
    /* The handle is the simulated GPU itself: CUDA_VISIBLE_DEVICES=2 makes ordinal 0 GPU 2. */
    *device = sim_cfg.visible[ordinal];
    return CUDA_SUCCESS;
}
SIM_EXPORT(cuDeviceGet);

CUresult sim_cuDeviceGetName(char *name, int len, CUdevice dev)
{
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = sim_check_device(dev);
    if (r == CUDA_SUCCESS)
        snprintf(name, (size_t)len, "KREX simulated GPU %d", dev);
    return r;
}
SIM_EXPORT(cuDeviceGetName);

/* The unversioned name keeps its CUDA 2.x ABI: a 32-bit count, saturated. */
CUresult sim_cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = sim_check_device(dev);
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t cap = sim_mem_capacity((uint32_t)dev);
    *bytes = cap > 0xFFFFFFFFULL ? 0xFFFFFFFFU : (unsigned int)cap;
    return CUDA_SUCCESS;
}
SIM_EXPORT(cuDeviceTotalMem);

CUresult sim_cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = sim_check_device(dev);
    if (r == CUDA_SUCCESS)
        *bytes = (size_t)sim_mem_capacity((uint32_t)dev); /* the node's KREX_SIM_MEM_BYTES */
    return r;
}
SIM_EXPORT(cuDeviceTotalMem_v2);

/* H200-like values; 0 for anything not listed. Numbers are CUdevice_attribute values. */
static int sim_attribute(int attrib, CUdevice dev)
{
    switch (attrib) {
    case 1: return 1024;        /* MAX_THREADS_PER_BLOCK */
    case 2: return 1024;        /* MAX_BLOCK_DIM_X */
    case 3: return 1024;        /* MAX_BLOCK_DIM_Y */
    case 4: return 64;          /* MAX_BLOCK_DIM_Z */
    case 5: return 2147483647;  /* MAX_GRID_DIM_X */
    case 6: return 65535;       /* MAX_GRID_DIM_Y */
    case 7: return 65535;       /* MAX_GRID_DIM_Z */
    case 8: return 49152;       /* MAX_SHARED_MEMORY_PER_BLOCK */
    case 9: return 65536;       /* TOTAL_CONSTANT_MEMORY */
    case 10: return 32;         /* WARP_SIZE */
    case 11: return 2147483647; /* MAX_PITCH */
    case 12: return 65536;      /* MAX_REGISTERS_PER_BLOCK */
    case 13: return 1980000;    /* CLOCK_RATE, kHz */
    case 14: return 512;        /* TEXTURE_ALIGNMENT */
    case 15: return 1;          /* GPU_OVERLAP */
    case 16: return 132;        /* MULTIPROCESSOR_COUNT */
    case 19: return 1;          /* CAN_MAP_HOST_MEMORY */
    case 31: return 1;          /* CONCURRENT_KERNELS */
    case 32: return 1;          /* ECC_ENABLED */
    case 33: return 0x18 + dev; /* PCI_BUS_ID */
    case 36: return 2619000;    /* MEMORY_CLOCK_RATE, kHz */
    case 37: return 6144;       /* GLOBAL_MEMORY_BUS_WIDTH */
    case 38: return 52428800;   /* L2_CACHE_SIZE */
    case 39: return 2048;       /* MAX_THREADS_PER_MULTIPROCESSOR */
    case 40: return 3;          /* ASYNC_ENGINE_COUNT */
    case 41: return 1;          /* UNIFIED_ADDRESSING */
    case 75: return 9;          /* COMPUTE_CAPABILITY_MAJOR */
    case 76: return 0;          /* COMPUTE_CAPABILITY_MINOR */
    case 81: return 233472;     /* MAX_SHARED_MEMORY_PER_MULTIPROCESSOR */
    case 82: return 65536;      /* MAX_REGISTERS_PER_MULTIPROCESSOR */
    case 83: return 1;          /* MANAGED_MEMORY */
    case 95: return 1;          /* COOPERATIVE_LAUNCH */
    case 97: return 232448;     /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    case 106: return 32;        /* MAX_BLOCKS_PER_MULTIPROCESSOR */
    default: return 0;
    }
}

CUresult sim_cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev)
{
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = sim_check_device(dev);
    if (r == CUDA_SUCCESS)
        *pi = sim_attribute(attrib, dev);
    return r;
}
SIM_EXPORT(cuDeviceGetAttribute);
