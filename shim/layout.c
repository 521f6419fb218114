/* layout.c: creation and validation of the shared segment (the one place that knows its rules). */
#include <string.h>

#include "krex_common.h"

_Static_assert(sizeof(struct krex_header) == 128, "krex_header must stay 128 bytes");
_Static_assert(sizeof(struct krex_gate) == KREX_CACHELINE, "a gate is one cache line");
_Static_assert(sizeof(struct krex_slot) == 3 * KREX_CACHELINE, "a slot is three cache lines");
_Static_assert(__builtin_offsetof(struct krex_slot, drain_req) == KREX_CACHELINE,
               "controller-written fields start the slot's second cache line");
_Static_assert(sizeof(struct krex_segment) == 128 + KREX_MAX_GPUS * KREX_CACHELINE,
               "slots follow the gates");

int krex_seg_init(void *base, uint64_t size, uint32_t n_gpus, uint32_t n_slots)
{
    if (!base || n_gpus == 0 || n_gpus > KREX_MAX_GPUS || n_slots == 0 ||
        n_slots > KREX_MAX_SLOTS || size < KREX_SEGMENT_SIZE(n_slots))
        return KREX_E_ARG;
    struct krex_segment *seg = base;
    memset(seg, 0, KREX_SEGMENT_SIZE(n_slots));
    struct krex_header *h = &seg->header;
    h->magic = KREX_SHM_MAGIC;
    h->major = (uint16_t)KREX_LAYOUT_MAJOR;
    h->minor = (uint16_t)KREX_LAYOUT_MINOR;
    h->header_size = sizeof(struct krex_header);
    h->gate_size = sizeof(struct krex_gate);
    h->slot_size = sizeof(struct krex_slot);
    h->n_gpus = n_gpus;
    h->n_slots = n_slots;
    h->total_size = KREX_SEGMENT_SIZE(n_slots);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    h->created_ns = (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
    KREX_STORE(&h->state, KREX_SEG_READY);
    return KREX_OK;
}

int krex_seg_check(const void *base, uint64_t size)
{
    if (!base || size < sizeof(struct krex_header))
        return KREX_E_SMALL;
    const struct krex_header *h = base;
    if (h->magic != KREX_SHM_MAGIC)
        return KREX_E_MAGIC;
    if (h->major != KREX_LAYOUT_MAJOR)
        return KREX_E_VERSION;
    if (h->header_size != sizeof(struct krex_header) || h->gate_size != sizeof(struct krex_gate) ||
        h->slot_size != sizeof(struct krex_slot) || h->n_gpus == 0 ||
        h->n_gpus > KREX_MAX_GPUS || h->n_slots == 0 || h->n_slots > KREX_MAX_SLOTS ||
        h->total_size != KREX_SEGMENT_SIZE(h->n_slots))
        return KREX_E_GEOMETRY;
    if (size < h->total_size)
        return KREX_E_SMALL;
    if (__atomic_load_n(&h->state, __ATOMIC_ACQUIRE) != KREX_SEG_READY)
        return KREX_E_NOT_READY;
    return KREX_OK;
}

const char *krex_strerror(int code)
{
    switch (code) {
    case KREX_OK:
        return "ok";
    case KREX_E_SMALL:
        return "segment is smaller than its layout requires (truncated or not a KREX segment)";
    case KREX_E_MAGIC:
        return "segment does not start with the KREX magic (not a KREX segment, or corrupt)";
    case KREX_E_VERSION:
        return "segment layout has another major version (krex daemon and library differ)";
    case KREX_E_GEOMETRY:
        return "segment sizes or counts are inconsistent (corrupt, or another build of krex)";
    case KREX_E_NOT_READY:
        return "segment was never fully initialised by its creator";
    case KREX_E_ARG:
        return "invalid argument";
    case KREX_E_TIMEOUT:
        return "timed out";
    default:
        return "unknown krex status";
    }
}
