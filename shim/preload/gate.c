/*
 * gate.c: this process's registration (segment, slot, tenant, GPU) and the slow path of the
 * gate: a thread that finds the gate closed to its tenant withdraws its announcement and sleeps
 * on the gate's futex until the gate opens (no spinning, no polling sleeps).
 *
 * Registration happens at the first intercepted call, never in a constructor. Anything wrong
 * with the environment or the segment means one warning and pass-through: the program runs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shim.h"

struct krex_slot *krex_self;
struct krex_gate *krex_my_gate;
struct krex_gate *krex_my_gates[KREX_MAX_GPUS];
uint32_t krex_n_gates;
static uint32_t my_gpu_mask;
uint32_t krex_my_tenant;

enum { REG_NONE, REG_DONE, REG_PASSTHROUGH };
static int reg_state = REG_NONE;
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
/* The gates (KREX_SHM). With KREX_SLOTS set, mapped read-only, and our slot comes from that
 * segment instead: the tenant's own, which no other tenant maps. Without it (tests, older
 * controllers) both are the one segment, mapped read-write. */
static struct krex_segment *seg;
static struct krex_segment *slots_seg;
/* The gates' file as mapped (its name, device and inode): where its controller's liveness lock
 * is looked for while a gate keeps a thread out (a dead controller, below). */
static char gates_name[256];
static dev_t gates_dev;
static ino_t gates_ino;
/* Per gate: the word of a closed gate whose controller was found dead; while the gate still
 * holds that word, our threads pass it at once (a successor's close has another epoch). */
static uint64_t dead_word[KREX_MAX_GPUS];
static int atfork_done;
/* Where a process that found no free slot keeps its counts: it is still gated, but the
 * controller cannot see it in flight, so the segment's overflow count marks regions unclean. */
static struct krex_slot private_slot;
static uint64_t pending_unmatched;

static void after_fork_child(void)
{
    /* The child is a new process: it needs its own slot and drain thread. The mapping is
     * inherited and stays valid. */
    pthread_mutex_init(&reg_lock, NULL);
    /* The child works for the tenant its parent worked for at the fork (a pool worker's slot
     * changes tenant per command), not the one in the environment the parent started with. */
    if (krex_self)
        krex_my_tenant = __atomic_load_n(&krex_self->tenant, __ATOMIC_RELAXED);
    krex_self = NULL;
    if (reg_state == REG_DONE)
        reg_state = REG_NONE;
    krex_drain_after_fork();
}

static int parse_u32(const char *s, uint32_t *out)
{
    if (!s || !*s)
        return -1;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > UINT32_MAX || s[0] == '-')
        return -1;
    *out = (uint32_t)v;
    return 0;
}

/* KREX_GPU: one GPU index, or several separated by commas (a command of several GPUs), each
 * below n_gpus and none twice. Fills the mask; -2 for an index the segment lacks, -1 for
 * anything else. */
static int parse_gpus(const char *text, uint32_t n_gpus, uint32_t *mask, uint32_t *first)
{
    char buf[128];
    size_t len = text ? strlen(text) : 0;
    if (!len || len >= sizeof buf || text[0] == ',' || text[len - 1] == ',' || strstr(text, ",,"))
        return -1;
    strcpy(buf, text);
    *mask = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        uint32_t g;
        if (parse_u32(tok, &g) || g >= KREX_MAX_GPUS || (*mask >> g & 1U))
            return -1;
        if (g >= n_gpus)
            return -2;
        if (!*mask)
            *first = g;
        *mask |= 1U << g;
    }
    return *mask ? 0 : -1;
}

/* Map and check a segment; NULL (with one warning) if it cannot be used. With `id`, the
 * file's device and inode are stored there. */
static struct krex_segment *map_segment(const char *name, int writable, struct stat *id)
{
    int fd = shm_open(name, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC, 0);
    if (fd < 0) {
        krex_warn("cannot open shared segment %s (%s): running without KREX", name,
                  strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < (off_t)sizeof(struct krex_header)) {
        krex_warn("shared segment %s is too small (%lld bytes): running without KREX", name,
                  (long long)st.st_size);
        close(fd);
        return NULL;
    }
    void *base = mmap(NULL, (size_t)st.st_size, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                      MAP_SHARED, fd, 0);
    close(fd);
    if (id)
        *id = st;
    if (base == MAP_FAILED) {
        krex_warn("cannot map shared segment %s (%s): running without KREX", name,
                  strerror(errno));
        return NULL;
    }
    int rc = krex_seg_check(base, (uint64_t)st.st_size);
    if (rc != KREX_OK) {
        const struct krex_header *h = base;
        krex_warn("shared segment %s is unusable: %s (layout %u.%u, this library %u.%u): "
                  "running without KREX",
                  name, krex_strerror(rc), rc == KREX_E_SMALL ? 0 : h->major,
                  rc == KREX_E_SMALL ? 0 : h->minor, KREX_LAYOUT_MAJOR, KREX_LAYOUT_MINOR);
        munmap(base, (size_t)st.st_size);
        return NULL;
    }
    return base;
}

static int attach(void)
{
    const char *name = getenv("KREX_SHM");
    if (!name || !*name) {
        krex_warn("KREX_SHM is not set: running without KREX (every call passes through)");
        return -1;
    }
    uint32_t tenant = 0, gpu = 0, mask = 1;
    if (parse_u32(getenv("KREX_TENANT"), &tenant) || tenant == 0) {
        krex_warn("KREX_TENANT must be a positive integer (got \"%s\"): running without KREX",
                  getenv("KREX_TENANT") ? getenv("KREX_TENANT") : "");
        return -1;
    }
    const char *slots_name = getenv("KREX_SLOTS");
    int own_slots = slots_name && *slots_name;
    struct stat gates_id;
    struct krex_segment *gates = map_segment(name, !own_slots, &gates_id);
    if (!gates)
        return -1;
    const char *g = getenv("KREX_GPU");
    int bad = g ? parse_gpus(g, gates->header.n_gpus, &mask, &gpu) : 0;
    if (bad) {
        if (bad == -2)
            krex_warn("KREX_GPU=%s but the segment has %u GPUs: running without KREX", g,
                      gates->header.n_gpus);
        else
            krex_warn("KREX_GPU must be GPU indices separated by commas, each once (got \"%s\"): "
                      "running without KREX",
                      g);
        munmap(gates, (size_t)gates->header.total_size);
        return -1;
    }
    struct krex_segment *slots = own_slots ? map_segment(slots_name, 1, NULL) : gates;
    if (!slots) {
        munmap(gates, (size_t)gates->header.total_size);
        return -1;
    }
    seg = gates;
    slots_seg = slots;
    if (strlen(name) < sizeof gates_name) {
        strcpy(gates_name, name);
        gates_dev = gates_id.st_dev;
        gates_ino = gates_id.st_ino;
    }
    krex_my_tenant = tenant;
    krex_my_gate = &seg->gates[gpu];
    /* The first gate, then the others in GPU order (mask == 1 << gpu for one GPU). */
    krex_my_gates[0] = krex_my_gate;
    uint32_t n = 1;
    for (uint32_t i = gpu + 1; i < KREX_MAX_GPUS; i++)
        if (mask >> i & 1U)
            krex_my_gates[n++] = &seg->gates[i];
    my_gpu_mask = n > 1 ? mask : 0;
    __atomic_store_n(&krex_n_gates, n, __ATOMIC_RELEASE);
    return 0;
}

/* carry: the slot was a dead process's of our tenant, whose counters the controller never
 * read (it frees a slot only as it reads it, krex_slot_reap): they carry on in ours, so the
 * tenant's totals keep them. Its memory peak does not (the region's room step reads a live
 * process's peak as what it may grow back to). */
static void fill_slot(struct krex_slot *s, uint32_t pid, uint64_t start, int carry)
{
    s->pid = pid;
    s->start_time = start;
    s->tenant = krex_my_tenant;
    s->gpu = (uint32_t)(krex_my_gate - seg->gates);
    s->gpus = my_gpu_mask;
    KREX_STORE(&s->in_flight, 0);
    KREX_STORE(&s->ungated, 0);
    if (!carry) {
        KREX_STORE(&s->intercepted, 0);
        KREX_STORE(&s->blocked, 0);
        KREX_STORE(&s->unmatched, 0);
        KREX_STORE(&s->mem_wait_ns, 0);
        KREX_STORE(&s->mem_waits, 0);
        KREX_STORE(&s->mem_oom_alone, 0);
        KREX_STORE(&s->mem_oom_shared, 0);
        for (uint32_t k = 0; k < KREX_MEM_KIND_SLOTS; k++)
            KREX_STORE(&s->mem_kind_waits[k], 0);
    }
    /* Nothing of ours is queued yet; carried counters are a dead process's, which no drain of
     * ours saw: the next region drains us once (docs/memory.md, the drain of a waiter). */
    KREX_STORE(&s->drained_calls, carry ? UINT64_MAX : 0);
    KREX_STORE(&s->mem_kind, 0);
    /* Device memory (1.2): a new process holds nothing yet. mem_grant and mem_deny are the
     * controller's words: a wait compares them with what it read as it began, never with 0. */
    KREX_STORE(&s->mem_bytes, 0);
    KREX_STORE(&s->mem_peak, 0);
    KREX_STORE(&s->mem_want, 0);
    KREX_STORE(&s->mem_since_ns, 0);
    /* An old request is not ours to answer. */
    KREX_STORE(&s->drain_ack, KREX_LOAD(&s->drain_req));
    KREX_STORE(&s->state, KREX_SLOT_LIVE);
}

static struct krex_slot *claim_slot(void)
{
    uint32_t pid = (uint32_t)getpid();
    uint64_t start = krex_proc_start_time(pid);
    /* First a free slot; then one whose process is gone (its pid, or its start time): one of
     * our tenant's first, whose counters carry on in ours; then anyone's, whose are lost. */
    for (int pass = 0; pass < 3; pass++) {
        for (uint32_t i = 0; i < slots_seg->header.n_slots; i++) {
            struct krex_slot *s = &slots_seg->slots[i];
            uint32_t free_state = KREX_SLOT_FREE;
            int taken;
            if (pass == 0)
                taken = KREX_LOAD(&s->state) == KREX_SLOT_FREE &&
                        __atomic_compare_exchange_n(&s->state, &free_state, KREX_SLOT_CLAIMING,
                                                    0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
            else
                taken = (pass == 2 || KREX_LOAD(&s->tenant) == krex_my_tenant) &&
                        krex_slot_take_dead(s);
            if (taken) {
                fill_slot(s, pid, start, pass > 0 && KREX_LOAD(&s->tenant) == krex_my_tenant);
                return s;
            }
        }
    }
    return NULL;
}

struct krex_slot *krex_register(void)
{
    int st = __atomic_load_n(&reg_state, __ATOMIC_ACQUIRE);
    if (st == REG_PASSTHROUGH)
        return NULL;
    pthread_mutex_lock(&reg_lock);
    struct krex_slot *s = krex_self;
    if (reg_state == REG_NONE) {
        if (!atfork_done) {
            pthread_atfork(NULL, NULL, after_fork_child);
            atfork_done = 1;
        }
        if (!seg && attach() != 0) {
            __atomic_store_n(&reg_state, REG_PASSTHROUGH, __ATOMIC_RELEASE);
            pthread_mutex_unlock(&reg_lock);
            return NULL;
        }
        s = claim_slot();
        if (!s) {
            KREX_ADD(&slots_seg->header.overflow, 1);
            /* Our pid in a free entry, so the controller can tell when we are gone. */
            for (int i = 0; i < KREX_OVERFLOW_PIDS; i++) {
                uint32_t none = 0;
                if (__atomic_compare_exchange_n(&slots_seg->header.overflow_pids[i], &none,
                                                (uint32_t)getpid(), 0, __ATOMIC_SEQ_CST,
                                                __ATOMIC_SEQ_CST))
                    break;
            }
            krex_warn("all %u slots of the KREX segment are taken: this process is gated but "
                      "invisible to the drain (its regions' neighbours report clean = false)",
                      slots_seg->header.n_slots);
            s = &private_slot;
        } else if (krex_drain_start(s) != 0) {
            krex_warn("cannot start the drain thread: regions on this GPU will not be clean");
        }
        KREX_ADD(&s->unmatched, __atomic_exchange_n(&pending_unmatched, 0, __ATOMIC_SEQ_CST));
        krex_debug("registered: tenant %u, gpu %u, slot %ld", krex_my_tenant, s->gpu,
                   s == &private_slot ? -1L : (long)(s - slots_seg->slots));
        __atomic_store_n(&krex_self, s, __ATOMIC_RELEASE);
        __atomic_store_n(&reg_state, REG_DONE, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&reg_lock);
    return s;
}

void krex_note_unmatched(void)
{
    struct krex_slot *s = __atomic_load_n(&krex_self, __ATOMIC_ACQUIRE);
    if (s)
        KREX_COUNT(&s->unmatched);
    else
        KREX_COUNT(&pending_unmatched);
}

/* The first of our gates that is closed to s, or NULL. */
static struct krex_gate *closed_gate(const struct krex_slot *s)
{
    for (uint32_t i = 0; i < krex_n_gates; i++)
        if (krex_closed_to(s, KREX_LOAD(&krex_my_gates[i]->word)))
            return krex_my_gates[i];
    return NULL;
}

/* Whether the controller that closed our gates is gone: one declared itself (layout 2.1), and
 * no one holds the liveness lock on the file we mapped (asked without taking anything, so a
 * successor starting meanwhile is never in the way). Anything we cannot tell (the name removed
 * or now another file's: a live controller may still use ours) is "not gone": the gate's
 * deadline remains. */
static int controller_gone(void)
{
    if (!KREX_LOAD(&seg->header.controller_pid) || !gates_name[0])
        return 0;
    int fd = shm_open(gates_name, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    struct stat st;
    int gone = 0;
    if (fstat(fd, &st) == 0 && st.st_dev == gates_dev && st.st_ino == gates_ino) {
        struct flock fl = {.l_type = F_WRLCK,
                           .l_whence = SEEK_SET,
                           .l_start = KREX_LIVENESS_LOCK_START,
                           .l_len = KREX_LIVENESS_LOCK_LEN};
        gone = fcntl(fd, F_OFD_GETLK, &fl) == 0 && fl.l_type == F_UNLCK;
    }
    close(fd);
    return gone;
}

void krex_gate_block(struct krex_slot *s)
{
    KREX_COUNT(&s->blocked);
    /* A blocked thread looks for its controller's liveness lock this often: a controller
     * SIGKILLed mid-region costs its siblings at most this, not the gate's deadline. */
    const uint64_t poll_ns = KREX_CONTROLLER_POLL_NS;
    uint64_t next_look = krex_now_ns() + poll_ns;
    for (;;) {
        /* Withdraw the announcement, and let a waiting controller see 0. */
        if (KREX_SUB(&s->in_flight, 1) == 0)
            krex_futex_wake(&s->in_flight, INT32_MAX);
        for (;;) {
            /* Sleep on one closed gate at a time; when it opens, look at all of them again. */
            struct krex_gate *g = closed_gate(s);
            if (!g)
                break;
            uint32_t seq = KREX_LOAD(&g->wake);
            uint64_t word = KREX_LOAD(&g->word);
            if (!krex_closed_to(s, word))
                continue;
            size_t gi = (size_t)(g - seg->gates);
            if (word == __atomic_load_n(&dead_word[gi], __ATOMIC_RELAXED)) {
                KREX_ADD(&s->in_flight, 1); /* closed by a controller found dead: pass */
                return;
            }
            uint64_t timeout = UINT64_MAX;
            uint64_t deadline = KREX_LOAD(&g->deadline_ns);
            uint64_t now = krex_now_ns();
            if (deadline) {
                if (now >= deadline) {
                    static int warned;
                    if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
                        krex_warn("gate held past its deadline (controller gone?): passing");
                    KREX_ADD(&s->in_flight, 1);
                    return;
                }
                timeout = deadline - now;
            }
            if (KREX_LOAD(&seg->header.controller_pid)) {
                if (now >= next_look) {
                    next_look = now + poll_ns;
                    if (controller_gone() && KREX_LOAD(&g->word) == word) {
                        __atomic_store_n(&dead_word[gi], word, __ATOMIC_RELAXED);
                        static int told;
                        if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
                            krex_warn("the controller that closed the gate (pid %u) is gone: "
                                      "passing",
                                      KREX_LOAD(&seg->header.controller_pid));
                        KREX_ADD(&s->in_flight, 1);
                        return;
                    }
                }
                if (next_look - now < timeout)
                    timeout = next_look - now;
            }
            krex_futex_wait(&g->wake, seq, timeout);
        }
        /* Announce again, then check again: a gate may have closed in between. */
        KREX_ADD(&s->in_flight, 1);
        if (!krex_shut_out(s))
            return;
    }
}
