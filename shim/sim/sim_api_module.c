/*
 * sim_api_module.c: modules, and the library API that CUDA 12+ runtimes load their code with
 * (cuLibraryLoadData, cuLibraryGetKernel, cuKernelGetFunction, cuLibraryUnload).
 *
 * Any non-NULL image loads, and any name is a function or kernel. A name may hold
 * "@local=<size>" (a size as KREX_SIM_MEM_BYTES spells it, e.g. "spin@local=512M"): that kernel
 * needs that much local memory, reserved in the context it is launched in at its launch
 * (sim_ctx_reserve_local); a name without it needs KREX_SIM_LOCAL_BYTES.
 *
 * A loaded module or library holds KREX_SIM_MODULE_BYTES of device memory (its code and
 * globals), charged node-wide on the device of its context. Eager loading, the simulator's
 * default, charges at the load; lazy loading (CUDA_MODULE_LOADING=LAZY) at the first use of a
 * function: a module's first cuModuleGetFunction, a library's first cuLibraryGetKernel or
 * cuKernelGetFunction. A charge that does not fit fails that call with
 * CUDA_ERROR_OUT_OF_MEMORY and changes nothing, so the call can be retried. Unloading gives
 * the memory back; so does the process's death (sim_mem.c).
 *
 * A library is context-independent in the real driver (loaded into every context, eagerly or
 * at first use); here it is loaded once, into the context current when its charge is due, or,
 * when none is current then, into the first one that is at cuLibraryGetKernel,
 * cuKernelGetFunction or a launch of one of its kernels. A CUkernel launches as a CUfunction
 * does (the real driver accepts one cast to CUfunction), and cuKernelGetFunction returns the
 * kernel itself.
 */
#include <string.h>

#include "sim.h"

int sim_launch_reads_fn;

/* The device memory handles hold (loaded, bytes, gpu, pid and, once loaded, ctx). Taken before
 * the model lock, never inside it. */
static pthread_mutex_t sim_held_lock = PTHREAD_MUTEX_INITIALIZER;

CUresult sim_handle_charge(struct sim_handle *h, struct CUctx_st *c, uint64_t bytes)
{
    if (__atomic_load_n(&h->loaded, __ATOMIC_ACQUIRE))
        return CUDA_SUCCESS;
    pthread_mutex_lock(&sim_held_lock);
    CUresult r = CUDA_SUCCESS;
    if (!h->loaded) {
        r = sim_mem_charge((uint32_t)c->device, bytes);
        if (r == CUDA_SUCCESS) {
            h->ctx = c;
            h->gpu = (uint32_t)c->device;
            h->bytes = bytes;
            h->pid = (int32_t)sim_pid;
            __atomic_store_n(&h->loaded, 1, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&sim_held_lock);
    return r;
}

CUresult sim_handle_new_charged(uint32_t magic, struct CUctx_st *c, uint64_t bytes,
                                struct sim_handle **out)
{
    struct sim_handle *h = sim_handle_new(magic);
    if (!h)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = c ? sim_handle_charge(h, c, bytes) : CUDA_SUCCESS;
    if (r != CUDA_SUCCESS) {
        sim_handle_kill(h); /* nothing is made */
        return r;
    }
    *out = h;
    return CUDA_SUCCESS;
}

/* Give back what `h` holds (if this process charged it). */
static void sim_handle_give_back(struct sim_handle *h)
{
    pthread_mutex_lock(&sim_held_lock);
    /* A forked child's copy of its parent's handle holds nothing of the child's. */
    uint64_t held = h->loaded && h->pid == (int32_t)sim_pid ? h->bytes : 0;
    uint32_t gpu = h->gpu;
    h->bytes = 0;
    __atomic_store_n(&h->loaded, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&sim_held_lock);
    sim_mem_uncharge(gpu, held);
}

void sim_held_after_fork_child(void)
{
    pthread_mutex_init(&sim_held_lock, NULL);
}

/* The calling thread's current context if it is alive, else NULL (no error: a library loads
 * without one). */
static struct CUctx_st *sim_live_current(void)
{
    struct CUctx_st *c = sim_ctx_top();
    return c && sim_ctx_check(c) == CUDA_SUCCESS ? c : NULL;
}

/* The local memory a kernel named `name` needs: its "@local=<size>", else KREX_SIM_LOCAL_BYTES.
 * CUDA_ERROR_NOT_FOUND (with a warning) when what follows "@local=" is not a size. */
static CUresult sim_local_need(const char *name, uint64_t *need)
{
    static const char key[] = "@local=";
    const char *at = strstr(name, key);
    if (!at) {
        *need = sim_cfg.local_bytes;
        return CUDA_SUCCESS;
    }
    if (!sim_parse_bytes(at + sizeof key - 1, need)) {
        sim_warn("function name \"%s\": \"%s\" is not a size (bytes, optionally with K, M, G "
                 "or T, up to 1 PiB); no such function",
                 name, at + sizeof key - 1);
        return CUDA_ERROR_NOT_FOUND;
    }
    return CUDA_SUCCESS;
}

/* A function (magic SIM_MAGIC_FUNC) of module `code`, or a kernel (SIM_MAGIC_KERNEL) of library
 * `code`, that needs `need` bytes of local memory; kept in its list, so that unloading `code`
 * lets go of it. */
static CUresult sim_code_function(struct sim_handle *code, uint32_t magic, uint64_t need,
                                  struct sim_handle **out)
{
    struct sim_handle *f = sim_handle_new(magic);
    if (!f)
        return CUDA_ERROR_OUT_OF_MEMORY;
    f->ctx = code->ctx;
    f->owner = code;
    f->bytes = need;
    if (need > 0 || !__atomic_load_n(&code->loaded, __ATOMIC_ACQUIRE))
        __atomic_store_n(&sim_launch_reads_fn, 1, __ATOMIC_RELEASE);
    pthread_mutex_lock(&sim_proc_lock);
    f->link = code->link;
    code->link = f;
    pthread_mutex_unlock(&sim_proc_lock);
    *out = f;
    return CUDA_SUCCESS;
}

void sim_handle_drop(struct sim_handle *h)
{
    pthread_mutex_lock(&sim_proc_lock);
    struct sim_handle *f = h->link;
    h->link = NULL;
    pthread_mutex_unlock(&sim_proc_lock);
    while (f) {
        struct sim_handle *next = f->link;
        sim_handle_kill(f);
        f = next;
    }
    sim_handle_give_back(h);
    sim_handle_kill(h);
}

/* ---- Modules. ---- */

static CUresult sim_module_load(CUmodule *module, const void *image)
{
    if (!module || !image)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    CUresult r = sim_ctx_current(&c);
    if (r != CUDA_SUCCESS)
        return r;
    struct sim_handle *h;
    r = sim_handle_new_charged(SIM_MAGIC_MODULE, sim_cfg.lazy_loading ? NULL : c,
                               sim_cfg.module_bytes, &h);
    if (r != CUDA_SUCCESS)
        return r;
    h->ctx = c; /* what lazy loading loads it into */
    *module = (CUmodule)h;
    return CUDA_SUCCESS;
}

CUresult sim_cuModuleLoadData(CUmodule *module, const void *image)
{
    return sim_module_load(module, image);
}
SIM_EXPORT(cuModuleLoadData);

/* JIT options are accepted and ignored (nothing is compiled). */
CUresult sim_cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                                CUjit_option *options, void **optionValues)
{
    if (numOptions && (!options || !optionValues))
        return CUDA_ERROR_INVALID_VALUE;
    return sim_module_load(module, image);
}
SIM_EXPORT(cuModuleLoadDataEx);

CUresult sim_cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!hmod || hmod->h.magic != SIM_MAGIC_MODULE)
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t need;
    CUresult r = sim_local_need(name, &need); /* a name that is not one loads nothing */
    if (r != CUDA_SUCCESS)
        return r;
    /* Lazy loading: the module's first function loads it (a no-op once loaded). */
    r = sim_handle_charge(&hmod->h, hmod->h.ctx, sim_cfg.module_bytes);
    struct sim_handle *f = NULL;
    if (r == CUDA_SUCCESS)
        r = sim_code_function(&hmod->h, SIM_MAGIC_FUNC, need, &f);
    if (r == CUDA_SUCCESS)
        *hfunc = (CUfunction)f;
    return r;
}
SIM_EXPORT(cuModuleGetFunction);

CUresult sim_cuModuleUnload(CUmodule hmod)
{
    if (!hmod || hmod->h.magic != SIM_MAGIC_MODULE)
        return CUDA_ERROR_INVALID_HANDLE;
    sim_handle_drop(&hmod->h);
    return CUDA_SUCCESS;
}
SIM_EXPORT(cuModuleUnload);

/* ---- Libraries. ---- */

/* JIT and library options are accepted and ignored. */
CUresult sim_cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                               void **jitOptionsValues, unsigned int numJitOptions,
                               CUlibraryOption *libraryOptions, void **libraryOptionValues,
                               unsigned int numLibraryOptions)
{
    (void)jitOptionsValues;
    (void)libraryOptionValues;
    if (!library || !code || (numJitOptions && !jitOptions) ||
        (numLibraryOptions && !libraryOptions))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = sim_ensure_init();
    if (r != CUDA_SUCCESS)
        return r;
    struct CUctx_st *c = sim_live_current();
    struct sim_handle *h;
    r = sim_handle_new_charged(SIM_MAGIC_LIBRARY, sim_cfg.lazy_loading ? NULL : c,
                               sim_cfg.module_bytes, &h);
    if (r == CUDA_SUCCESS)
        *library = (CUlibrary)h;
    return r;
}
SIM_EXPORT(cuLibraryLoadData);

CUresult sim_cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
    if (!pKernel || !name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!library || library->h.magic != SIM_MAGIC_LIBRARY)
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t need;
    CUresult r = sim_local_need(name, &need);
    if (r != CUDA_SUCCESS)
        return r;
    /* Lazy loading (or an eager load made with no context current): loaded now, if a context
     * is current to load it into. */
    struct CUctx_st *c = sim_live_current();
    if (c)
        r = sim_handle_charge(&library->h, c, sim_cfg.module_bytes);
    struct sim_handle *k = NULL;
    if (r == CUDA_SUCCESS)
        r = sim_code_function(&library->h, SIM_MAGIC_KERNEL, need, &k);
    if (r == CUDA_SUCCESS)
        *pKernel = (CUkernel)k;
    return r;
}
SIM_EXPORT(cuLibraryGetKernel);

CUresult sim_cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    if (!pFunc)
        return CUDA_ERROR_INVALID_VALUE;
    if (!kernel || kernel->h.magic != SIM_MAGIC_KERNEL)
        return CUDA_ERROR_INVALID_HANDLE;
    struct CUctx_st *c;
    CUresult r = sim_ctx_current(&c);
    if (r == CUDA_SUCCESS)
        r = sim_handle_charge(kernel->h.owner, c, sim_cfg.module_bytes);
    if (r == CUDA_SUCCESS)
        *pFunc = (CUfunction)(void *)kernel; /* launches as the kernel does */
    return r;
}
SIM_EXPORT(cuKernelGetFunction);

CUresult sim_cuLibraryUnload(CUlibrary library)
{
    if (!library || library->h.magic != SIM_MAGIC_LIBRARY)
        return CUDA_ERROR_INVALID_HANDLE;
    sim_handle_drop(&library->h);
    return CUDA_SUCCESS;
}
SIM_EXPORT(cuLibraryUnload);
