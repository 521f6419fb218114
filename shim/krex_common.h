/*
 * krex_common.h: small helpers shared by the preload library and the control module.
 */
#ifndef KREX_COMMON_H
#define KREX_COMMON_H

#include <stdint.h>
#include <time.h>

#include "krex_layout.h"

#define KREX_LIKELY(x) __builtin_expect(!!(x), 1)
#define KREX_UNLIKELY(x) __builtin_expect(!!(x), 0)

#define KREX_LOAD(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define KREX_STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
#define KREX_ADD(p, v) __atomic_add_fetch((p), (v), __ATOMIC_SEQ_CST)
#define KREX_SUB(p, v) __atomic_sub_fetch((p), (v), __ATOMIC_SEQ_CST)
#define KREX_COUNT(p) __atomic_fetch_add((p), 1, __ATOMIC_RELAXED)

/* Shared (not private) futexes: the words live in a MAP_SHARED segment across processes. */
int krex_futex_wait(uint32_t *word, uint32_t expected, uint64_t timeout_ns);
int krex_futex_wake(uint32_t *word, int n);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t krex_now_ns(void);
/* /proc/<pid>/stat field 22 (start time in clock ticks since boot), 0 if no such process. */
uint64_t krex_proc_start_time(uint32_t pid);
/* A slot's process is alive: pid exists and still has the recorded start time. */
int krex_pid_alive(uint32_t pid, uint64_t start_time);
/* Take a slot whose process died (LIVE -> CLAIMING): 1 if the caller now owns it (no one else
 * claims a slot being claimed), 0 if not. The controller takes one to fold and free it, a shim
 * with no free slot to reuse it. */
int krex_slot_take_dead(struct krex_slot *s);

int krex_seg_init(void *base, uint64_t size, uint32_t n_gpus, uint32_t n_slots);
int krex_seg_check(const void *base, uint64_t size);
const char *krex_strerror(int code);

#endif /* KREX_COMMON_H */
