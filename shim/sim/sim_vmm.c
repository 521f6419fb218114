/*
 * sim_vmm.c: the virtual memory management calls (cuMemAddressReserve, cuMemCreate, cuMemMap,
 * cuMemSetAccess, ...), as PyTorch's expandable segments use them, backed for real:
 *
 *   cuMemAddressReserve  mmap PROT_NONE (MAP_NORESERVE): address space only
 *   cuMemCreate          memfd_create + ftruncate: physical memory, charged to the GPU
 *                        (sim_mem.c) at once; host pages only once touched
 *   cuMemMap             mmap MAP_FIXED|MAP_SHARED of the memfd into a reserved range, still
 *                        inaccessible (PROT_NONE), as on the real driver until cuMemSetAccess
 *   cuMemSetAccess       mprotect
 *   cuMemUnmap           the range goes back to PROT_NONE address space
 *   cuMemRelease         drops the handle; as in the real driver the physical memory is freed
 *                        (and uncharged) once it is both released and no longer mapped
 *   cuMemAddressFree     munmap
 *
 * Copies and sets into a mapped, accessible range work like any other (they are memmoves); one
 * into a range without access faults the process (the real driver reports an illegal address).
 * The granularity is 2 MiB, minimum and recommended. Bookkeeping is process-local, in lists
 * under sim_proc_lock (linear searches: fine for thousands of mappings).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "sim.h"

#define SIM_VMM_GRAN (2ULL << 20)
#define SIM_MAGIC_PHYS 0x50485931U

struct sim_phys {
    uint32_t magic;
    int released;
    int fd;
    uint32_t gpu;
    size_t size;
    unsigned maps;
    struct sim_phys *next;
};

struct sim_range { /* a reservation */
    uintptr_t base;
    size_t size;
    struct sim_range *next;
};

struct sim_map {
    uintptr_t ptr;
    size_t size;
    struct sim_phys *phys;
    struct sim_map *next;
};

/* Under sim_proc_lock. */
static struct sim_phys *sim_physs;
static struct sim_range *sim_ranges;
static struct sim_map *sim_maps;

void sim_vmm_after_fork_child(void)
{
    /* The child keeps the mappings fork gave it, but none of them is its device memory. */
    sim_physs = NULL;
    sim_ranges = NULL;
    sim_maps = NULL;
}

static struct sim_phys *sim_phys_find(CUmemGenericAllocationHandle h)
{
    for (struct sim_phys *p = sim_physs; p; p = p->next)
        if ((CUmemGenericAllocationHandle)(uintptr_t)p == h && !p->released)
            return p;
    return NULL;
}

/* Unlink `p` (released, unmapped) and close its memfd; the caller uncharges and frees it. */
static void sim_phys_unlink(struct sim_phys *p)
{
    for (struct sim_phys **l = &sim_physs; *l; l = &(*l)->next) {
        if (*l == p) {
            *l = p->next;
            break;
        }
    }
    close(p->fd);
    p->magic = SIM_MAGIC_DEAD;
}

static void sim_phys_free(struct sim_phys *p)
{
    sim_mem_uncharge(p->gpu, p->size);
    free(p);
}

static struct sim_range *sim_range_of(uintptr_t ptr, size_t size)
{
    for (struct sim_range *r = sim_ranges; r; r = r->next)
        if (ptr >= r->base && size <= r->size && ptr - r->base <= r->size - size)
            return r;
    return NULL;
}

static int sim_overlaps(uintptr_t a, size_t an, uintptr_t b, size_t bn)
{
    return a < b + bn && b < a + an;
}

/* Whether [ptr, ptr+size) is exactly covered by mappings (any number, adjacent). */
static int sim_fully_mapped(uintptr_t ptr, size_t size)
{
    uintptr_t at = ptr, end = ptr + size;
    while (at < end) {
        const struct sim_map *m = sim_maps;
        while (m && !(m->ptr <= at && at < m->ptr + m->size))
            m = m->next;
        if (!m)
            return 0;
        at = m->ptr + m->size;
    }
    return 1;
}

/* Location of a device, as a CUmemLocation names it: the GPU, or -1. */
static int sim_location_gpu(const CUmemLocation *loc)
{
    if (loc->type != CU_MEM_LOCATION_TYPE_DEVICE)
        return -1;
    return sim_ordinal_gpu(loc->id);
}

static CUresult sim_prop_check(const CUmemAllocationProp *prop, int *gpu)
{
    if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return prop->location.type == CU_MEM_LOCATION_TYPE_INVALID ? CUDA_ERROR_INVALID_VALUE
                                                                   : CUDA_ERROR_NOT_SUPPORTED;
    *gpu = sim_location_gpu(&prop->location);
    return *gpu < 0 ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

CUresult sim_cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                           CUmemAllocationGranularity_flags option)
{
    if (!granularity || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                         option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    int gpu;
    CUresult r = sim_prop_check(prop, &gpu);
    if (r == CUDA_SUCCESS)
        *granularity = (size_t)SIM_VMM_GRAN;
    return r;
}
SIM_EXPORT(cuMemGetAllocationGranularity);

CUresult sim_cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                 CUdeviceptr addr, unsigned long long flags)
{
    if (!ptr || size == 0 || size % SIM_VMM_GRAN || flags != 0 ||
        (alignment & (alignment - 1)) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = sim_ensure_init();
    if (r != CUDA_SUCCESS)
        return r;
    size_t align = alignment > SIM_VMM_GRAN ? alignment : (size_t)SIM_VMM_GRAN;
    const int prot = PROT_NONE, fl = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    void *base = MAP_FAILED;
    if (addr && addr % align == 0) { /* the hint, if the kernel grants exactly it */
        base = mmap((void *)(uintptr_t)addr, size, prot, fl, -1, 0);
        if (base != MAP_FAILED && (uintptr_t)base != addr) {
            munmap(base, size);
            base = MAP_FAILED;
        }
    }
    if (base == MAP_FAILED) {
        if (size > SIZE_MAX - align)
            return CUDA_ERROR_OUT_OF_MEMORY;
        char *raw = mmap(NULL, size + align, prot, fl, -1, 0);
        if (raw == MAP_FAILED)
            return CUDA_ERROR_OUT_OF_MEMORY;
        uintptr_t b = ((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1);
        size_t head = b - (uintptr_t)raw, tail = align - head;
        if (head)
            munmap(raw, head);
        if (tail)
            munmap((void *)(b + size), tail);
        base = (void *)b;
    }
    struct sim_range *rg = malloc(sizeof *rg);
    if (!rg) {
        munmap(base, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    rg->base = (uintptr_t)base;
    rg->size = size;
    pthread_mutex_lock(&sim_proc_lock);
    rg->next = sim_ranges;
    sim_ranges = rg;
    pthread_mutex_unlock(&sim_proc_lock);
    *ptr = (CUdeviceptr)rg->base;
    return CUDA_SUCCESS;
}
SIM_EXPORT(cuMemAddressReserve);

/* Drop the mappings inside [ptr, ptr+size) (with sim_proc_lock): the range goes back to
 * reserved address space; handles that are released and now unmapped go onto *dead. */
static void sim_unmap_range(uintptr_t ptr, size_t size, struct sim_phys **dead)
{
    for (struct sim_map **l = &sim_maps; *l;) {
        struct sim_map *m = *l;
        if (m->ptr < ptr || m->ptr + m->size > ptr + size) {
            l = &m->next;
            continue;
        }
        *l = m->next;
        mmap((void *)m->ptr, m->size, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        struct sim_phys *p = m->phys;
        if (--p->maps == 0 && p->released) {
            sim_phys_unlink(p);
            p->next = *dead;
            *dead = p;
        }
        free(m);
    }
}

static void sim_free_dead(struct sim_phys *dead)
{
    while (dead) {
        struct sim_phys *next = dead->next;
        sim_phys_free(dead);
        dead = next;
    }
}

/* The whole reservation, as reserved. Mappings still in it are unmapped first (the real
 * driver's behaviour there is not checked: callers unmap first). */
CUresult sim_cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    if (!ptr || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_proc_lock);
    struct sim_range **l = &sim_ranges, *rg;
    while ((rg = *l) && !(rg->base == (uintptr_t)ptr && rg->size == size))
        l = &rg->next;
    struct sim_phys *dead = NULL;
    if (rg) {
        *l = rg->next;
        sim_unmap_range(rg->base, rg->size, &dead);
        munmap((void *)rg->base, rg->size);
    }
    pthread_mutex_unlock(&sim_proc_lock);
    free(rg);
    sim_free_dead(dead);
    return rg ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
SIM_EXPORT(cuMemAddressFree);

CUresult sim_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                         const CUmemAllocationProp *prop, unsigned long long flags)
{
    if (!handle || size == 0 || size % SIM_VMM_GRAN || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    int gpu;
    CUresult r = sim_prop_check(prop, &gpu);
    if (r != CUDA_SUCCESS)
        return r;
    if (prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE &&
        prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (size > sim_mem_capacity((uint32_t)gpu))
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct sim_phys *p = calloc(1, sizeof *p);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    r = sim_mem_charge((uint32_t)gpu, size);
    if (r != CUDA_SUCCESS) {
        free(p);
        return r;
    }
    p->fd = memfd_create("krex-sim-vmm", MFD_CLOEXEC);
    if (p->fd < 0 || ftruncate(p->fd, (off_t)size) != 0) {
        sim_warn("cannot back simulated physical memory (%zu bytes): %s", size, strerror(errno));
        if (p->fd >= 0)
            close(p->fd);
        sim_mem_uncharge((uint32_t)gpu, size);
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    p->magic = SIM_MAGIC_PHYS;
    p->gpu = (uint32_t)gpu;
    p->size = size;
    pthread_mutex_lock(&sim_proc_lock);
    p->next = sim_physs;
    sim_physs = p;
    pthread_mutex_unlock(&sim_proc_lock);
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)p;
    return CUDA_SUCCESS;
}
SIM_EXPORT(cuMemCreate);

CUresult sim_cuMemRelease(CUmemGenericAllocationHandle handle)
{
    pthread_mutex_lock(&sim_proc_lock);
    struct sim_phys *p = sim_phys_find(handle);
    int now = 0;
    if (p) {
        p->released = 1;
        now = p->maps == 0;
        if (now)
            sim_phys_unlink(p);
    }
    pthread_mutex_unlock(&sim_proc_lock);
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    if (now)
        sim_phys_free(p); /* else at its last cuMemUnmap */
    return CUDA_SUCCESS;
}
SIM_EXPORT(cuMemRelease);

CUresult sim_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                      CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    if (!ptr || size == 0 || flags != 0 || ptr % SIM_VMM_GRAN || size % SIM_VMM_GRAN ||
        offset % SIM_VMM_GRAN)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_map *m = malloc(sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&sim_proc_lock);
    struct sim_phys *p = sim_phys_find(handle);
    if (!p || offset > p->size || size > p->size - offset || !sim_range_of(ptr, size)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        for (const struct sim_map *o = sim_maps; o && r == CUDA_SUCCESS; o = o->next)
            if (sim_overlaps(o->ptr, o->size, ptr, size))
                r = CUDA_ERROR_ALREADY_MAPPED;
    }
    if (r == CUDA_SUCCESS &&
        mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, p->fd,
             (off_t)offset) == MAP_FAILED)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) {
        m->ptr = (uintptr_t)ptr;
        m->size = size;
        m->phys = p;
        m->next = sim_maps;
        sim_maps = m;
        p->maps++;
    }
    pthread_mutex_unlock(&sim_proc_lock);
    if (r != CUDA_SUCCESS)
        free(m);
    return r;
}
SIM_EXPORT(cuMemMap);

/* The range must be made of whole mappings (one or several, adjacent). */
CUresult sim_cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    if (!ptr || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uintptr_t a = (uintptr_t)ptr;
    struct sim_phys *dead = NULL;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&sim_proc_lock);
    if (!sim_fully_mapped(a, size)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        for (const struct sim_map *m = sim_maps; m && r == CUDA_SUCCESS; m = m->next)
            if (sim_overlaps(m->ptr, m->size, a, size) &&
                (m->ptr < a || m->ptr + m->size > a + size))
                r = CUDA_ERROR_INVALID_VALUE; /* would cut a mapping */
    }
    if (r == CUDA_SUCCESS)
        sim_unmap_range(a, size, &dead);
    pthread_mutex_unlock(&sim_proc_lock);
    sim_free_dead(dead);
    return r;
}
SIM_EXPORT(cuMemUnmap);

/* Every device named gets the access asked; the host, which is every simulated device's
 * memory, gets the most any of them was given. */
CUresult sim_cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                            size_t count)
{
    if (!ptr || size == 0 || !desc || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    int prot = PROT_NONE;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
            return CUDA_ERROR_INVALID_VALUE;
        if (sim_location_gpu(&desc[i].location) < 0)
            return CUDA_ERROR_INVALID_DEVICE;
        switch (desc[i].flags) {
        case CU_MEM_ACCESS_FLAGS_PROT_NONE:
            break;
        case CU_MEM_ACCESS_FLAGS_PROT_READ:
            prot |= PROT_READ;
            break;
        case CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
            prot |= PROT_READ | PROT_WRITE;
            break;
        default:
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&sim_proc_lock);
    if (!sim_fully_mapped((uintptr_t)ptr, size))
        r = CUDA_ERROR_INVALID_VALUE;
    else if (mprotect((void *)(uintptr_t)ptr, size, prot) != 0)
        r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&sim_proc_lock);
    return r;
}
SIM_EXPORT(cuMemSetAccess);
