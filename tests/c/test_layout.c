/*
 * test_layout.c: every size and offset of the shared layout, against the numbers the layout
 * promises (a change here is a change of KREX_LAYOUT_MAJOR). Prints "N passed, N failed".
 */
#include <stddef.h>
#include <stdio.h>

#include "krex_layout.h"

static int passed, failed;

#define AT(type, field, want)                                                                    \
    do {                                                                                         \
        size_t got = offsetof(struct type, field);                                               \
        if (got == (want))                                                                       \
            passed++;                                                                            \
        else {                                                                                   \
            failed++;                                                                            \
            printf("FAIL offsetof(%s, %s) = %zu, want %d\n", #type, #field, got, (want));       \
        }                                                                                        \
    } while (0)
#define SIZE(type, want)                                                                         \
    do {                                                                                         \
        if (sizeof(struct type) == (want))                                                       \
            passed++;                                                                            \
        else {                                                                                   \
            failed++;                                                                            \
            printf("FAIL sizeof(%s) = %zu, want %d\n", #type, sizeof(struct type), (want));      \
        }                                                                                        \
    } while (0)

int main(void)
{
    SIZE(krex_header, 128);
    AT(krex_header, magic, 0);
    AT(krex_header, major, 4);
    AT(krex_header, minor, 6);
    AT(krex_header, header_size, 8);
    AT(krex_header, gate_size, 12);
    AT(krex_header, slot_size, 16);
    AT(krex_header, n_gpus, 20);
    AT(krex_header, n_slots, 24);
    AT(krex_header, state, 28);
    AT(krex_header, total_size, 32);
    AT(krex_header, created_ns, 40);
    AT(krex_header, creator_pid, 48);
    AT(krex_header, overflow, 52);
    AT(krex_header, overflow_pids, 56);
    AT(krex_header, controller_pid, 88);
    AT(krex_header, reserved, 96);

    SIZE(krex_gate, 64);
    AT(krex_gate, word, 0);
    AT(krex_gate, wake, 8);
    AT(krex_gate, deadline_ns, 16);
    AT(krex_gate, regions, 24);
    AT(krex_gate, reserved, 32);

    SIZE(krex_slot, 192);
    AT(krex_slot, state, 0);
    AT(krex_slot, pid, 4);
    AT(krex_slot, start_time, 8);
    AT(krex_slot, tenant, 16);
    AT(krex_slot, gpu, 20);
    AT(krex_slot, in_flight, 24);
    AT(krex_slot, drain_ack, 28);
    AT(krex_slot, intercepted, 32);
    AT(krex_slot, blocked, 40);
    AT(krex_slot, unmatched, 48);
    AT(krex_slot, gpus, 56);
    AT(krex_slot, ungated, 60);
    AT(krex_slot, drain_req, 64);
    AT(krex_slot, mem_grant, 68);
    AT(krex_slot, mem_bytes, 72);
    AT(krex_slot, mem_peak, 80);
    AT(krex_slot, mem_want, 88);
    AT(krex_slot, mem_since_ns, 96);
    AT(krex_slot, mem_wait_ns, 104);
    AT(krex_slot, mem_waits, 112);
    AT(krex_slot, mem_deny, 116);
    AT(krex_slot, mem_oom_alone, 120);
    AT(krex_slot, mem_oom_shared, 124);
    AT(krex_slot, drained_calls, 128);
    AT(krex_slot, mem_kind, 136);
    AT(krex_slot, mem_seen, 140);
    AT(krex_slot, mem_kind_waits, 144);
    AT(krex_slot, mem_failed, 176);
    AT(krex_slot, reserved4, 180);
    AT(krex_slot, reserved3, 184);

    SIZE(krex_segment, 128 + 16 * 64);
    AT(krex_segment, gates, 128);
    AT(krex_segment, slots, 128 + 16 * 64);
    if (KREX_SEGMENT_SIZE(256) == 1152 + 256 * 192)
        passed++;
    else
        failed++, printf("FAIL KREX_SEGMENT_SIZE\n");
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
