/*
 * region.c: krex_region_begin()/krex_region_end() for C and C++ benchmarks.
 *
 * The same client as krex/tenant/markers.py (docs/protocol.md): the outermost begin of a thread opens
 * a connection of its own to the daemon (KREX_SOCKET), sends region_begin and waits for the
 * grant; the matching end sends region_end on it, reads the reply and closes it. Nested calls
 * only count. Outside krex (KREX_SOCKET or KREX_TENANT unset) both return 0 and do nothing.
 * None of this is on the hot path: the environment is read at the outermost begin.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

#define CONNECT_RETRY_NS 5000000000ULL /* retry connecting while the daemon comes up */
#define DEFAULT_WAIT_S 600.0           /* KREX_REGION_WAIT_S when unset */
#define END_REPLY_S 60.0               /* the bound on the reply to region_end */
#define MAX_WAIT_S 1e9                 /* "forever", yet nanoseconds still fit in 64 bits */
#define REPLY_MAX 16384                /* our replies are short; longer means a broken peer */

static __thread int depth;
static __thread int failed; /* begins that failed (and warned): their ends fail quietly */
static __thread int conn = -1;
static __thread pid_t conn_pid; /* the process that opened conn (a fork child inherits both) */

struct tenant {
    const char *socket;
    unsigned long id;
    double wait_s;
};

/* 1 inside krex, 0 outside, -1 (after one warning) when the environment is malformed. */
static int read_env(struct tenant *t)
{
    const char *sock = getenv("KREX_SOCKET"), *id = getenv("KREX_TENANT");
    if (!sock || !*sock || !id || !*id)
        return 0;
    char *end;
    errno = 0;
    t->socket = sock;
    t->id = strtoul(id, &end, 10);
    if (id[0] < '0' || id[0] > '9' || errno || *end || t->id == 0) {
        krex_warn("krex_region_begin: KREX_TENANT must be a positive integer, not '%s'", id);
        return -1;
    }
    const char *wait = getenv("KREX_REGION_WAIT_S");
    t->wait_s = DEFAULT_WAIT_S;
    if (wait && *wait) {
        errno = 0;
        t->wait_s = strtod(wait, &end);
        if (errno || *end || !(t->wait_s > 0) || !isfinite(t->wait_s)) {
            krex_warn("krex_region_begin: KREX_REGION_WAIT_S must be a positive number of "
                      "seconds, not '%s'",
                      wait);
            return -1;
        }
        if (t->wait_s > MAX_WAIT_S)
            t->wait_s = MAX_WAIT_S;
    }
    return 1;
}

static int connect_daemon(const char *path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path) {
        krex_warn("krex_region_begin: KREX_SOCKET is too long for a unix socket: %s", path);
        return -1;
    }
    strcpy(addr.sun_path, path);
    uint64_t deadline = krex_now_ns() + CONNECT_RETRY_NS;
    long delay_ns = 10000000; /* 10 ms, doubling to 250 ms */
    for (;;) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            krex_warn("krex_region_begin: socket: %s", strerror(errno));
            return -1;
        }
        if (connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0)
            return fd;
        int err = errno;
        close(fd);
        if (err == EINTR)
            continue;
        int retry = err == ENOENT || err == ECONNREFUSED || err == EAGAIN;
        uint64_t now = krex_now_ns();
        if (!retry || now >= deadline) {
            krex_warn("krex_region_begin: cannot connect to the krex daemon at %s: %s%s", path,
                      strerror(err), retry ? " (retried for 5 s; is the daemon running?)" : "");
            return -1;
        }
        /* The socket appears when the daemon starts: there is nothing to block on. */
        if ((uint64_t)delay_ns > deadline - now)
            delay_ns = (long)(deadline - now);
        struct timespec ts = {.tv_sec = 0, .tv_nsec = delay_ns};
        nanosleep(&ts, NULL);
        delay_ns = delay_ns * 2 > 250000000 ? 250000000 : delay_ns * 2;
    }
}

static int send_line(int fd, const char *line, size_t len)
{
    while (len) {
        /* MSG_NOSIGNAL: a daemon that went away is an error here, not a SIGPIPE. */
        ssize_t n = send(fd, line, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        line += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Read one reply line into buf within limit_s (SO_RCVTIMEO, reset to what is left after each
 * interrupted or partial read). 0 on success, -1 with errno (EAGAIN: timed out, EPIPE: EOF). */
static int recv_line(int fd, char *buf, size_t size, double limit_s)
{
    uint64_t deadline = krex_now_ns() + (uint64_t)(limit_s * 1e9);
    size_t have = 0;
    for (;;) {
        uint64_t now = krex_now_ns();
        if (now >= deadline) {
            errno = EAGAIN;
            return -1;
        }
        uint64_t left = deadline - now;
        struct timeval tv = {.tv_sec = (time_t)(left / 1000000000ULL),
                             .tv_usec = (suseconds_t)(left % 1000000000ULL / 1000)};
        if (tv.tv_sec == 0 && tv.tv_usec == 0)
            tv.tv_usec = 1; /* zero would mean no time-out at all */
        if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0)
            return -1;
        ssize_t n = recv(fd, buf + have, size - 1 - have, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        if (n == 0) {
            errno = EPIPE;
            return -1;
        }
        have += (size_t)n;
        buf[have] = '\0';
        if (memchr(buf, '\n', have))
            return 0;
        if (have == size - 1) {
            errno = EMSGSIZE;
            return -1;
        }
    }
}

/* The reply says "ok": true. A full JSON parser is not needed: we only look for the key. */
static int reply_ok(const char *reply)
{
    const char *p = strstr(reply, "\"ok\"");
    if (!p)
        return 0;
    p += 4;
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p++ != ':')
        return 0;
    while (*p == ' ' || *p == '\t')
        p++;
    return strncmp(p, "true", 4) == 0;
}

/* The daemon's "error" string (escapes left as they are), for the one warning line. */
static void reply_error(const char *reply, char *out, size_t size)
{
    snprintf(out, size, "no reason given");
    const char *p = strstr(reply, "\"error\"");
    if (!p || !(p = strchr(p + 7, '"')))
        return;
    size_t n = 0;
    for (p++; *p && *p != '"' && n + 1 < size; p++) {
        if (*p == '\\' && p[1])
            out[n++] = *p++;
        if (n + 1 < size)
            out[n++] = *p;
    }
    out[n] = '\0';
}

/* One request and its reply. 0 when the daemon said ok; -1 after one warning otherwise. */
static int exchange(int fd, const char *what, const char *request, size_t len, double limit_s)
{
    char reply[REPLY_MAX];
    if (send_line(fd, request, len) != 0) {
        krex_warn("%s: lost the connection to the krex daemon: %s", what, strerror(errno));
        return -1;
    }
    if (recv_line(fd, reply, sizeof reply, limit_s) != 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            krex_warn("%s: the krex daemon did not answer within %g s%s", what, limit_s,
                      strcmp(what, "krex_region_begin") == 0 ? " (KREX_REGION_WAIT_S)" : "");
        else if (errno == EPIPE)
            krex_warn("%s: the krex daemon closed the connection without answering", what);
        else
            krex_warn("%s: reading the krex daemon's reply: %s", what, strerror(errno));
        return -1;
    }
    if (!reply_ok(reply)) {
        char error[256];
        reply_error(reply, error, sizeof error);
        krex_warn("%s: the krex daemon refused: %s", what, error);
        return -1;
    }
    return 0;
}

KREX_EXPORT int krex_region_begin(void)
{
    if (depth > 0) {
        depth++;
        return 0;
    }
    struct tenant t;
    int inside = read_env(&t);
    if (inside < 0)
        failed++;
    if (inside <= 0)
        return inside;
    int fd = connect_daemon(t.socket);
    if (fd < 0) {
        failed++;
        return -1;
    }
    char request[128];
    int len = snprintf(request, sizeof request,
                       "{\"v\":1,\"op\":\"region_begin\",\"tenant\":%lu,\"pid\":%d}\n", t.id,
                       (int)getpid());
    /* On failure the close is the daemon's EOF: it gives up the grant (or never gives it). */
    if (exchange(fd, "krex_region_begin", request, (size_t)len, t.wait_s) != 0) {
        close(fd);
        failed++;
        return -1;
    }
    conn = fd;
    conn_pid = getpid();
    depth = 1;
    return 0;
}

KREX_EXPORT int krex_region_end(void)
{
    if (depth == 0) {
        if (failed > 0) {
            failed--; /* the end of a begin that failed: that one already said why */
            return -1;
        }
        const char *sock = getenv("KREX_SOCKET"), *id = getenv("KREX_TENANT");
        if (!sock || !*sock || !id || !*id)
            return 0; /* outside krex: begin did nothing either */
        krex_warn("krex_region_end: no region to end (no krex_region_begin before it)");
        return -1;
    }
    if (--depth > 0)
        return 0;
    int fd = conn;
    conn = -1;
    if (conn_pid != getpid()) {
        /* Began in our parent before a fork: its region, not ours to end. */
        close(fd);
        return 0;
    }
    static const char request[] = "{\"v\":1,\"op\":\"region_end\"}\n";
    int rc = exchange(fd, "krex_region_end", request, sizeof request - 1, END_REPLY_S);
    close(fd);
    return rc;
}
