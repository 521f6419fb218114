/* proc.c: futexes, clocks and process identity, shared by the shim and the control module. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "krex_common.h"

int krex_futex_wait(uint32_t *word, uint32_t expected, uint64_t timeout_ns)
{
    struct timespec ts;
    struct timespec *tsp = NULL;
    if (timeout_ns != UINT64_MAX) {
        ts.tv_sec = (time_t)(timeout_ns / 1000000000ULL);
        ts.tv_nsec = (long)(timeout_ns % 1000000000ULL);
        tsp = &ts;
    }
    /* FUTEX_WAIT takes a relative timeout. Returns 0, or -errno (EAGAIN, ETIMEDOUT, EINTR). */
    long r = syscall(SYS_futex, word, FUTEX_WAIT, expected, tsp, NULL, 0);
    return r == 0 ? 0 : -errno;
}

int krex_futex_wake(uint32_t *word, int n)
{
    long r = syscall(SYS_futex, word, FUTEX_WAKE, n, NULL, NULL, 0);
    return r < 0 ? -errno : (int)r;
}

uint64_t krex_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* Fields 3 (state) and 22 (start time) of /proc/<pid>/stat, from one read: -1 if there is no
 * such process (or nothing after the command name), else 0 with *state the state letter and
 * *start_time the start time (0 if the line has no readable field 22). */
static int read_stat(uint32_t pid, char *state, uint64_t *start_time)
{
    char path[64];
    char buf[1024];
    *state = '\0';
    *start_time = 0;
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    /* The command name (field 2) may hold spaces and parentheses: count from the last ')'. */
    char *p = strrchr(buf, ')');
    if (!p)
        return -1;
    p++;
    if (*p == '\0')
        return -1;
    *state = p[1];
    /* p now points before field 3; field 22 is 19 fields further. */
    for (int field = 3; field < 22; field++) {
        p = strchr(p + 1, ' ');
        if (!p)
            return 0;
    }
    unsigned long long v = 0;
    if (sscanf(p + 1, "%llu", &v) == 1)
        *start_time = (uint64_t)v;
    return 0;
}

uint64_t krex_proc_start_time(uint32_t pid)
{
    char state;
    uint64_t start_time;
    read_stat(pid, &state, &start_time);
    return start_time;
}

int krex_pid_alive(uint32_t pid, uint64_t start_time)
{
    if (pid == 0)
        return 0;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH)
        return 0;
    char state;
    uint64_t started;
    if (read_stat(pid, &state, &started) != 0)
        return 0;
    /* A zombie still has its stat entry; it will never submit again, so treat it as dead. */
    if (state == 'Z' || state == 'X')
        return 0;
    return started == start_time;
}

int krex_slot_take_dead(struct krex_slot *s)
{
    uint32_t live = KREX_SLOT_LIVE;
    if (KREX_LOAD(&s->state) != KREX_SLOT_LIVE ||
        krex_pid_alive(KREX_LOAD(&s->pid), KREX_LOAD(&s->start_time)))
        return 0;
    if (!__atomic_compare_exchange_n(&s->state, &live, KREX_SLOT_CLAIMING, 0, __ATOMIC_SEQ_CST,
                                     __ATOMIC_SEQ_CST))
        return 0;
    /* Freed and claimed again by a new process between the look and the CAS: give it back. */
    if (krex_pid_alive(KREX_LOAD(&s->pid), KREX_LOAD(&s->start_time))) {
        KREX_STORE(&s->state, KREX_SLOT_LIVE);
        return 0;
    }
    return 1;
}
