/*
 * audit.c: libkrex-hip-audit.so, the dynamic linker's audit module (LD_AUDIT) that routes an
 * application's bindings of HIP's work-submitting functions to KREX's wrappers.
 *
 * Why not LD_PRELOAD, as for CUDA: libamdhip64 calls its own exported functions internally, so
 * a preloaded library exporting the same names would receive HIP's internal calls too (on ROCm 7
 * that breaks HIP's initialisation: HAMi issue #1707; docs/hip.md). Here no library exports a
 * hip* name. The wrappers live in libkrex-hip.so (preloaded, under the names krex_hip_<name>),
 * and this module answers the linker's la_symbind64 for a binding whose definer is libamdhip64
 * and whose referrer is neither libamdhip64 (HIP's own calls stay HIP's) nor libkrex-hip.so
 * (which looks the real functions up with dlsym). Since glibc 2.35 dlsym on a handle is reported
 * here too, which covers programs that dlopen libamdhip64 RTLD_LOCAL (Triton's AMD backend).
 *
 * The module lives in a link-map namespace of its own, with its own libc: nothing here takes a
 * lock, allocates, or reads the environment. libkrex-hip.so's wrapper addresses are found by
 * reading its dynamic symbol table from its link map, once, when it is mapped.
 */
#define _GNU_SOURCE
#include <elf.h>
#include <link.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "krex_elf.h"

#define KREX_AUDIT_EXPORT __attribute__((visibility("default")))

/* The hooked names: every entry of hip_hooks.def. */
static const char *const names[] = {
#define KREX_HIP_GATE(name, ...) #name,
#define KREX_HIP_TRACK(name, ...) #name,
#define KREX_HIP_OPEN(name, ...) #name,
#define KREX_HIP_REAL(name, ...)
#define KREX_HIP_LOOKUP(name, ...) #name,
#include "hip_hooks.def"
#undef KREX_HIP_GATE
#undef KREX_HIP_TRACK
#undef KREX_HIP_OPEN
#undef KREX_HIP_REAL
#undef KREX_HIP_LOOKUP
};
#define N_NAMES (sizeof names / sizeof names[0])

static uintptr_t wrappers[N_NAMES]; /* krex_hip_<name> in libkrex-hip.so, 0 if absent */
static struct link_map *hip_map;    /* libamdhip64 */
static struct link_map *krex_map;   /* libkrex-hip.so */
static unsigned long redirected;     /* for the debugger's eyes only */

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static int starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* Fill wrappers[] from libkrex-hip.so's exported krex_hip_<name> functions. */
static void find_wrappers(struct link_map *m)
{
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const uint32_t *hash = NULL, *gnu = NULL;
    for (const ElfW(Dyn) *d = m->l_ld; d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB:
            symtab = (const ElfW(Sym) *)krex_dyn_ptr(m->l_addr, d->d_un.d_ptr);
            break;
        case DT_STRTAB:
            strtab = (const char *)krex_dyn_ptr(m->l_addr, d->d_un.d_ptr);
            break;
        case DT_HASH:
            hash = (const uint32_t *)krex_dyn_ptr(m->l_addr, d->d_un.d_ptr);
            break;
        case DT_GNU_HASH:
            gnu = (const uint32_t *)krex_dyn_ptr(m->l_addr, d->d_un.d_ptr);
            break;
        }
    }
    if (!symtab || !strtab)
        return;
    size_t n = krex_symbol_count(hash, gnu);
    for (size_t i = 0; i < n; i++) {
        const ElfW(Sym) *s = &symtab[i];
        if (s->st_shndx == SHN_UNDEF || ELF64_ST_TYPE(s->st_info) != STT_FUNC)
            continue;
        const char *name = strtab + s->st_name;
        if (!starts_with(name, "krex_hip_"))
            continue;
        for (size_t k = 0; k < N_NAMES; k++)
            if (strcmp(name + 9, names[k]) == 0)
                wrappers[k] = m->l_addr + s->st_value;
    }
}

KREX_AUDIT_EXPORT unsigned int la_version(unsigned int version)
{
    return version < LAV_CURRENT ? version : LAV_CURRENT;
}

KREX_AUDIT_EXPORT unsigned int la_objopen(struct link_map *map, Lmid_t lmid, uintptr_t *cookie)
{
    *cookie = (uintptr_t)map;
    if (lmid != LM_ID_BASE)
        return 0; /* other namespaces (ours included) are left alone */
    const char *name = base_name(map->l_name ? map->l_name : "");
    if (starts_with(name, "libamdhip64.so")) {
        hip_map = map;
        return LA_FLG_BINDTO | LA_FLG_BINDFROM;
    }
    if (strcmp(name, "libkrex-hip.so") == 0) {
        krex_map = map;
        find_wrappers(map);
    }
    return LA_FLG_BINDFROM;
}

KREX_AUDIT_EXPORT uintptr_t la_symbind64(ElfW(Sym) *sym, unsigned int ndx, uintptr_t *refcook,
                                         uintptr_t *defcook, unsigned int *flags,
                                         const char *symname)
{
    (void)ndx;
    (void)flags;
    struct link_map *def = (struct link_map *)*defcook;
    struct link_map *ref = (struct link_map *)*refcook;
    if (def != hip_map || !hip_map || ref == hip_map || ref == krex_map || !symname)
        return sym->st_value;
    if (symname[0] != 'h' || symname[1] != 'i' || symname[2] != 'p')
        return sym->st_value;
    for (size_t k = 0; k < N_NAMES; k++) {
        if (wrappers[k] && strcmp(symname, names[k]) == 0) {
            __atomic_add_fetch(&redirected, 1, __ATOMIC_RELAXED);
            return wrappers[k];
        }
    }
    return sym->st_value;
}
