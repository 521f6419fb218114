/*
 * krex_elf.h: reading a loaded object's dynamic section, for the HIP audit module
 * (shim/hip/audit.c) and the preload's deep-binding routes (shim/preload/deepbind.c).
 */
#ifndef KREX_ELF_H
#define KREX_ELF_H

#include <elf.h>
#include <link.h>
#include <stddef.h>
#include <stdint.h>

/* glibc relocates the pointers of a writable dynamic section in place (l_ld); a read-only one,
 * and other loaders, leave them as offsets from the load address: take either. */
static inline uintptr_t krex_dyn_ptr(ElfW(Addr) base, ElfW(Addr) p)
{
    return p < base ? p + base : p;
}

/* How many entries the dynamic symbol table has (from DT_HASH, or by walking DT_GNU_HASH). */
static inline size_t krex_symbol_count(const uint32_t *hash, const uint32_t *gnu)
{
    if (hash)
        return hash[1]; /* nchain */
    if (!gnu)
        return 0;
    uint32_t nbuckets = gnu[0], symoffset = gnu[1], bloom = gnu[2];
    const uint32_t *buckets = gnu + 4 + bloom * (sizeof(ElfW(Addr)) / 4);
    const uint32_t *chain = buckets + nbuckets;
    uint32_t last = 0;
    for (uint32_t i = 0; i < nbuckets; i++)
        if (buckets[i] > last)
            last = buckets[i];
    if (last < symoffset)
        return symoffset;
    while (!(chain[last - symoffset] & 1))
        last++;
    return last + 1;
}

#endif /* KREX_ELF_H */
