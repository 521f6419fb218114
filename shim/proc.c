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

uint64_t krex_proc_start_time(uint32_t pid)
{
    char path[64];
    char buf[1024];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    /* The command name (field 2) may hold spaces and parentheses: count from the last ')'. */
    char *p = strrchr(buf, ')');
    if (!p)
        return 0;
    p++;
    /* p now points before field 3; field 22 is 19 fields further. */
    for (int field = 3; field < 22; field++) {
        p = strchr(p + 1, ' ');
        if (!p)
            return 0;
    }
    unsigned long long v = 0;
    if (sscanf(p + 1, "%llu", &v) != 1)
        return 0;
    return (uint64_t)v;
}

int krex_pid_alive(uint32_t pid, uint64_t start_time)
{
    if (pid == 0)
        return 0;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH)
        return 0;
    /* A zombie still has its stat entry; it will never submit again, so treat it as dead. */
    char path[64];
    char buf[512];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (!p || p[1] == '\0' || p[2] == 'Z' || p[2] == 'X')
        return 0;
    return krex_proc_start_time(pid) == start_time;
}
