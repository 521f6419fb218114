/*
 * deepbind.c: libraries that bind to the driver past the preload (docs/security.md, case 3).
 *
 * dlopen(..., RTLD_DEEPBIND) puts a library's own dependencies before the global scope in its
 * look-ups, so its references to the driver, and to dlopen and dlsym, bind to libcuda and libc
 * rather than to the preloaded shim: its launches were never gated nor its contexts drained.
 * The load is done as asked (deep binding keeps a library's own symbols; dropping the flag
 * would change what it runs); then, in every object the call newly loaded, each GOT entry of a
 * driver entry the shim hooks, or of dlsym, dlvsym, dlopen or dlmopen, that is bound (or will
 * bind) to the real function is rewritten to ours. Its work is then gated and drained like any
 * other, and its own look-ups (the driver opened by path, dlsym on it) come back through us.
 * What cannot be routed so (another kind of relocation, a page that cannot be made writable,
 * a second copy of the driver) counts the process as ungated: regions beside it are unclean.
 *
 * Not routed: what the library does in its own constructors, which run inside dlopen, before
 * its GOT can be rewritten.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "krex_elf.h"
#include "shim.h"

typedef void *(*dlopen_fn)(const char *, int);
typedef void *(*dlmopen_fn)(Lmid_t, const char *, int);
typedef void *(*dlsym_fn)(void *, const char *);

/* Our entries (dlsym_x86_64.S, lookup.c). */
extern char krex_dlsym_entry[], krex_dlsym_deep_entry[], krex_dlvsym_entry[], krex_dlopen_entry[];
void *krex_dlmopen_entry(Lmid_t, const char *, int);

/* ---- An object's dynamic section. ---- */

struct dyn {
    const ElfW(Sym) *sym;
    const char *str;
    const ElfW(Rela) *jmprel, *rela;
    const ElfW(Rel) *rel;
    size_t n_jmprel, n_rela, n_rel;
    const uint32_t *hash, *gnu_hash;
    int search_path; /* DT_RPATH or DT_RUNPATH */
};

static const void *dyn_ptr(ElfW(Addr) base, ElfW(Addr) v)
{
    return (const void *)krex_dyn_ptr(base, v);
}

static void dyn_read(ElfW(Addr) base, const ElfW(Dyn) *d, struct dyn *o)
{
    memset(o, 0, sizeof *o);
    ElfW(Xword) pltrel = DT_RELA, pltsz = 0, relasz = 0, relsz = 0;
    for (; d && d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB: o->sym = dyn_ptr(base, d->d_un.d_ptr); break;
        case DT_STRTAB: o->str = dyn_ptr(base, d->d_un.d_ptr); break;
        case DT_JMPREL: o->jmprel = dyn_ptr(base, d->d_un.d_ptr); break;
        case DT_PLTRELSZ: pltsz = d->d_un.d_val; break;
        case DT_PLTREL: pltrel = d->d_un.d_val; break;
        case DT_RELA: o->rela = dyn_ptr(base, d->d_un.d_ptr); break;
        case DT_RELASZ: relasz = d->d_un.d_val; break;
        case DT_REL: o->rel = dyn_ptr(base, d->d_un.d_ptr); break;
        case DT_RELSZ: relsz = d->d_un.d_val; break;
        case DT_HASH: o->hash = dyn_ptr(base, d->d_un.d_ptr); break;
        case DT_GNU_HASH: o->gnu_hash = dyn_ptr(base, d->d_un.d_ptr); break;
        case DT_RPATH:
        case DT_RUNPATH: o->search_path = 1; break;
        default: break;
        }
    }
    o->n_jmprel = o->jmprel ? pltsz / sizeof(ElfW(Rela)) : 0;
    o->n_rela = o->rela ? relasz / sizeof(ElfW(Rela)) : 0;
    o->n_rel = o->rel ? relsz / sizeof(ElfW(Rel)) : 0;
    if (pltrel != DT_RELA) { /* PLT relocations without addends: not x86-64's, not handled */
        o->rel = (const ElfW(Rel) *)o->jmprel;
        o->n_rel = o->jmprel ? pltsz / sizeof(ElfW(Rel)) : 0;
        o->jmprel = NULL;
        o->n_jmprel = 0;
    }
}

/* ---- The real loader entries. ---- */

KREX_HIDDEN void *krex_real_dlvsym_get(void)
{
    static void *real;
    void *f = __atomic_load_n(&real, __ATOMIC_ACQUIRE);
    if (KREX_UNLIKELY(!f)) {
        /* dlvsym itself is ours, so the real one is read from the symbol table of the C
         * library that holds dladdr (libc; libdl before glibc 2.34), which we do not wrap. */
        Dl_info info;
        struct link_map *m = NULL;
        if (dladdr1((const void *)(uintptr_t)dladdr, &info, (void **)&m, RTLD_DL_LINKMAP) && m) {
            struct dyn o;
            dyn_read(m->l_addr, m->l_ld, &o);
            size_t n = o.sym && o.str ? krex_symbol_count(o.hash, o.gnu_hash) : 0;
            for (size_t i = 1; !f && i < n; i++) {
                const ElfW(Sym) *s = &o.sym[i];
                if (s->st_shndx != SHN_UNDEF && ELF64_ST_TYPE(s->st_info) == STT_FUNC &&
                    strcmp(o.str + s->st_name, "dlvsym") == 0)
                    f = (void *)(m->l_addr + s->st_value);
            }
        }
        __atomic_store_n(&real, f, __ATOMIC_RELEASE);
    }
    return f;
}

KREX_HIDDEN void *krex_real_dlopen_get(void)
{
    static void *real;
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", NULL};
    return krex_real_next(&real, "dlopen", versions);
}

static const struct loader_entry {
    const char *name;
    void *(*real)(void);
    void *ours, *deep; /* ours; what a deep-bound object's GOT gets */
} loader_entries[] = {
    {"dlsym", krex_real_dlsym_get, krex_dlsym_entry, krex_dlsym_deep_entry},
    {"dlvsym", krex_real_dlvsym_get, krex_dlvsym_entry, krex_dlvsym_entry},
    {"dlopen", krex_real_dlopen_get, krex_dlopen_entry, krex_dlopen_entry},
    {"dlmopen", krex_real_dlmopen_get, (void *)krex_dlmopen_entry, (void *)krex_dlmopen_entry},
};
#define N_LOADER (sizeof loader_entries / sizeof loader_entries[0])

static int loader_find(const char *name)
{
    if (name[0] != 'd' || name[1] != 'l')
        return -1;
    for (size_t i = 0; i < N_LOADER; i++)
        if (strcmp(loader_entries[i].name, name) == 0)
            return (int)i;
    return -1;
}

KREX_HIDDEN void *krex_loader_entry(const char *name, void *p)
{
    int i = loader_find(name);
    return i >= 0 && p && p == loader_entries[i].real() ? loader_entries[i].ours : p;
}

KREX_HIDDEN void krex_count_ungated(void)
{
    struct krex_slot *s = krex_register();
    if (s)
        KREX_ADD(&s->ungated, 1);
}

KREX_HIDDEN void krex_ungated_if_driver(const void *p, const char *name)
{
    Dl_info info;
    if (!dladdr(p, &info) || !info.dli_fname || !krex_is_gpu_driver(info.dli_fname))
        return;
    static int warned;
    if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
        krex_warn("%s from %s is not in the driver the shim gates (a second copy): its GPU work "
                  "is not gated or drained, and regions beside this process are reported unclean",
                  name, info.dli_fname);
    krex_count_ungated();
}

/* ---- Opening as the caller would. ---- */

static void *open_in(Lmid_t ns, const char *file, int flags)
{
    if (ns == LM_ID_BASE || !file) {
        dlopen_fn f = (dlopen_fn)krex_real_dlopen_get();
        return f ? f(file, flags) : NULL;
    }
    dlmopen_fn f = (dlmopen_fn)krex_real_dlmopen_get();
    return f ? f(ns, file, flags) : NULL;
}

/* file with every $ORIGIN and ${ORIGIN} made the directory of `cm` (the caller). */
static const char *expand_origin(const struct link_map *cm, const char *file, char *buf, size_t n)
{
    char dir[PATH_MAX];
    const char *name = cm->l_name;
    if (!name || !name[0]) { /* the main program */
        ssize_t k = readlink("/proc/self/exe", dir, sizeof dir - 1);
        if (k <= 0)
            return file;
        dir[k] = '\0';
    } else if (snprintf(dir, sizeof dir, "%s", name) >= (int)sizeof dir) {
        return file;
    }
    char *slash = strrchr(dir, '/');
    if (!slash)
        return file;
    *slash = '\0';
    size_t used = 0;
    for (const char *s = file; *s;) {
        size_t skip = strncmp(s, "$ORIGIN", 7) == 0 ? 7 : strncmp(s, "${ORIGIN}", 9) == 0 ? 9 : 0;
        const char *piece = skip ? dir : s;
        size_t len = skip ? strlen(dir) : 1;
        if (used + len >= n)
            return file;
        memcpy(buf + used, piece, len);
        used += len;
        s += skip ? skip : 1;
    }
    buf[used] = '\0';
    return buf;
}

/*
 * The name to open so that the loader finds what it would for the caller: the shim makes the
 * real call, and dlopen resolves $ORIGIN and a bare name's search path (the caller's DT_RPATH
 * or DT_RUNPATH) from its caller. Found along the caller's search path (dlinfo's
 * RTLD_DI_SERINFO), the full path; else the name as given (the shim has no search path of its
 * own: the library path and the cache are the same from here).
 */
static const char *name_as(struct link_map *cm, Lmid_t ns, const char *file, char *buf, size_t n)
{
    if (!cm || !file)
        return file;
    if (strstr(file, "$ORIGIN") || strstr(file, "${ORIGIN}"))
        return expand_origin(cm, file, buf, n);
    struct dyn d;
    dyn_read(cm->l_addr, cm->l_ld, &d);
    if (strchr(file, '/') || !d.search_path)
        return file;
    void *loaded = open_in(ns, file, RTLD_LAZY | RTLD_NOLOAD);
    if (loaded) { /* loaded already under that name: no search happens */
        dlclose(loaded);
        return file;
    }
    Dl_serinfo size;
    if (dlinfo(cm, RTLD_DI_SERINFOSIZE, &size) != 0)
        return file;
    Dl_serinfo *si = malloc(size.dls_size);
    if (!si)
        return file;
    si->dls_size = size.dls_size;
    si->dls_cnt = size.dls_cnt;
    const char *found = file;
    if (dlinfo(cm, RTLD_DI_SERINFO, si) == 0)
        for (unsigned i = 0; found == file && i < si->dls_cnt; i++) {
            const char *dir = si->dls_serpath[i].dls_name;
            if (snprintf(buf, n, "%s/%s", dir[0] ? dir : ".", file) < (int)n &&
                access(buf, R_OK) == 0)
                found = buf;
        }
    free(si);
    return found;
}

/* ---- Objects and their GOTs. ---- */

struct obj {
    ElfW(Addr) base;
    const ElfW(Phdr) *phdr;
    ElfW(Half) phnum;
    char *name; /* set for new objects */
};

struct objs {
    struct obj *v;
    size_t n, cap;
    const struct objs *before; /* collecting the new ones: those not in here */
    int incomplete;
};

static int seen(const struct objs *o, const struct dl_phdr_info *info)
{
    for (size_t i = 0; i < o->n; i++)
        if (o->v[i].base == info->dlpi_addr && o->v[i].phdr == info->dlpi_phdr)
            return 1;
    return 0;
}

/* Runs under the loader's list lock: copies only (no dl* call here). */
static int collect(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    struct objs *o = arg;
    if (o->before && seen(o->before, info))
        return 0;
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 64;
        struct obj *v = realloc(o->v, cap * sizeof *v);
        if (!v) {
            o->incomplete = 1;
            return 1;
        }
        o->v = v;
        o->cap = cap;
    }
    struct obj *e = &o->v[o->n++];
    *e = (struct obj){info->dlpi_addr, info->dlpi_phdr, info->dlpi_phnum, NULL};
    if (o->before && !(e->name = strdup(info->dlpi_name ? info->dlpi_name : "")))
        o->incomplete = 1;
    return 0;
}

static const ElfW(Phdr) *segment_of(const struct obj *o, uintptr_t a)
{
    for (ElfW(Half) i = 0; i < o->phnum; i++) {
        const ElfW(Phdr) *p = &o->phdr[i];
        if (p->p_type == PT_LOAD && a >= o->base + p->p_vaddr &&
            a < o->base + p->p_vaddr + p->p_memsz)
            return p;
    }
    return NULL;
}

/* Store `want` in the GOT entry at a; RELRO (read-only after relocation) is made writable for
 * the store and read-only again. Returns 0, or -1 when the page could not be written. */
static int got_write(const struct obj *o, void **a, void *want)
{
    const ElfW(Phdr) *seg = segment_of(o, (uintptr_t)a);
    if (!seg)
        return -1;
    uintptr_t page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t page = (uintptr_t)a & ~(page_size - 1);
    int relro = 0;
    for (ElfW(Half) i = 0; i < o->phnum; i++) {
        const ElfW(Phdr) *p = &o->phdr[i];
        /* The loader protects the whole pages inside the RELRO range. */
        uintptr_t lo = (o->base + p->p_vaddr) & ~(page_size - 1);
        uintptr_t hi = (o->base + p->p_vaddr + p->p_memsz) & ~(page_size - 1);
        if (p->p_type == PT_GNU_RELRO && page >= lo && page < hi)
            relro = 1;
    }
    int prot = (seg->p_flags & PF_R ? PROT_READ : 0) | (seg->p_flags & PF_W ? PROT_WRITE : 0) |
               (seg->p_flags & PF_X ? PROT_EXEC : 0);
    if (relro)
        prot = PROT_READ;
    if (prot & PROT_WRITE) {
        __atomic_store_n(a, want, __ATOMIC_RELEASE);
        return 0;
    }
    if (mprotect((void *)page, page_size, prot | PROT_READ | PROT_WRITE) != 0)
        return -1;
    __atomic_store_n(a, want, __ATOMIC_RELEASE);
    mprotect((void *)page, page_size, prot);
    return 0;
}

/* Route one relocation. Returns 1 when it reaches the driver (or the loader) past the shim and
 * could not be routed through it, else 0. */
static int route(const struct obj *o, const struct dyn *d, ElfW(Xword) info, ElfW(Addr) offset,
                 ElfW(Sxword) addend, int has_addend, void *handle)
{
    uint32_t si = (uint32_t)ELF64_R_SYM(info), type = (uint32_t)ELF64_R_TYPE(info);
    const ElfW(Sym) *s = &d->sym[si];
    /* The object's own definition of the name is its own business, not a binding past us. */
    if (si == 0 || s->st_shndx != SHN_UNDEF)
        return 0;
    const char *name = d->str + s->st_name;
    int hook = krex_hook_find(name), li = hook < 0 ? loader_find(name) : -1;
    if (hook < 0 && li < 0)
        return 0;
    if (!has_addend ||
        (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT && type != R_X86_64_64) ||
        (type == R_X86_64_64 && addend != 0)) {
        krex_debug("%s: relocation %u of %s not handled", o->name, type, name);
        return 1;
    }
    void **a = (void **)(o->base + offset);
    void *cur = __atomic_load_n(a, __ATOMIC_ACQUIRE);
    /* A lazy PLT entry still points into its own object: it will bind to what the handle's
     * look-up finds (deep binding searches the library's own dependencies first); nothing
     * there means the global scope, where the shim comes first. */
    if (segment_of(o, (uintptr_t)cur)) {
        dlsym_fn f = (dlsym_fn)krex_real_dlsym_get();
        cur = f ? f(handle, name) : NULL;
        if (!cur)
            return 0;
    }
    void *want;
    if (hook >= 0) {
        if (cur == krex_hooks[hook].wrapper)
            return 0;
        krex_resolve_from(cur);
        if (__atomic_load_n(&krex_real[hook], __ATOMIC_ACQUIRE) != cur) {
            Dl_info di;
            /* A second copy of the driver is never gated; another library's function of that
             * name is not ours to wrap. */
            return dladdr(cur, &di) && di.dli_fname && krex_is_gpu_driver(di.dli_fname);
        }
        want = krex_hooks[hook].wrapper;
    } else {
        if (cur != loader_entries[li].real())
            return 0;
        want = loader_entries[li].deep;
    }
    if (got_write(o, a, want) == 0)
        return 0;
    krex_debug("%s: the GOT entry of %s could not be written", o->name, name);
    return 1;
}

/* Route every GOT entry of one new object; returns how many could not be. */
static int route_object(const struct obj *o, void *handle)
{
    const ElfW(Dyn) *dynamic = NULL;
    for (ElfW(Half) i = 0; i < o->phnum; i++)
        if (o->phdr[i].p_type == PT_DYNAMIC)
            dynamic = (const ElfW(Dyn) *)(o->base + o->phdr[i].p_vaddr);
    if (!dynamic)
        return 0;
    struct dyn d;
    dyn_read(o->base, dynamic, &d);
    if (!d.sym || !d.str)
        return 0;
    int bad = 0;
    for (size_t i = 0; i < d.n_jmprel; i++)
        bad += route(o, &d, d.jmprel[i].r_info, d.jmprel[i].r_offset, d.jmprel[i].r_addend, 1,
                     handle);
    for (size_t i = 0; i < d.n_rela; i++)
        bad += route(o, &d, d.rela[i].r_info, d.rela[i].r_offset, d.rela[i].r_addend, 1, handle);
    for (size_t i = 0; i < d.n_rel; i++)
        bad += route(o, &d, d.rel[i].r_info, d.rel[i].r_offset, 0, 0, handle);
    return bad;
}

/* From the dlopen trampoline (dlsym_x86_64.S) when flags hold RTLD_DEEPBIND; reached by a
 * jump, so the return address is the caller's. */
KREX_HIDDEN void *krex_dlopen_deep(const char *file, int flags)
{
    const void *caller = __builtin_return_address(0);
    struct link_map *cm = NULL;
    Lmid_t ns = LM_ID_BASE;
    Dl_info info;
    if (dladdr1(caller, &info, (void **)&cm, RTLD_DL_LINKMAP) && cm)
        dlinfo(cm, RTLD_DI_LMID, &ns);
    struct objs before = {0}, after = {0};
    dl_iterate_phdr(collect, &before);
    char buf[PATH_MAX];
    void *h = open_in(ns, name_as(cm, ns, file, buf, sizeof buf), flags);
    if (!h) {
        free(before.v);
        return NULL;
    }
    int saved_errno = errno;
    /* Without a full list of what was there before, every object counts as new (routing an
     * object bound the ordinary way changes nothing: it reaches the shim first anyway). */
    after.before = before.incomplete ? NULL : &before;
    dl_iterate_phdr(collect, &after);
    int bad = after.incomplete;
    for (size_t i = 0; i < after.n; i++) {
        struct obj *o = &after.v[i];
        /* Held while we write into it: an object another thread loaded may go meanwhile. */
        void *pin = o->name && o->name[0] ? open_in(ns, o->name, RTLD_LAZY | RTLD_NOLOAD) : NULL;
        if (pin || !after.before)
            bad += route_object(o, h);
        if (pin)
            dlclose(pin);
        free(o->name);
    }
    free(after.v);
    free(before.v);
    if (bad) {
        krex_warn("dlopen(%s, RTLD_DEEPBIND): %d reference(s) to the GPU driver past the shim "
                  "could not be routed through it: its GPU work is not gated or drained, and "
                  "regions beside this process are reported unclean",
                  file ? file : "NULL", bad);
        krex_count_ungated();
    }
    dlerror(); /* our look-ups' errors are not the caller's: its dlopen succeeded */
    errno = saved_errno;
    return h;
}
