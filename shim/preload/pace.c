/*
 * pace.c: pacing (docs/shim.md, "Pacing"). A region's drain waits for the work its siblings
 * have already queued: a gate stops new work, nothing makes queued work finish sooner. With
 * KREX_PACE_US set (`[regions] pace_ms`), a thread outside its own regions waits before a
 * launch (a kernel or a graph) while that launch would leave its stream with more than that
 * much GPU work queued, one launch always allowed: a drain then waits for about that much per
 * stream, or one launch, however far ahead of the GPU the program runs.
 *
 * The driver does not say how much work a stream has queued: it is estimated. After a launch
 * a marker (an event without timing) is recorded on the stream when none of its markers is
 * outstanding or no estimate is known yet, else after PACE_BATCH launches, PACE_GAP_NS, or an
 * eighth of the pace of estimated work; each covers the launches since the one before. A
 * marker seen complete gives its launches' time on the GPU: from the later of its record and
 * the previous marker's completion to when it was seen complete, per launch. Where both ends
 * are known (seen by polls at most PACE_SEEN_NS apart, as a wait polls) that time is known;
 * else (the program synced and went on) it is a bound: above the time where its start is
 * known (the least such stands in until a known one comes), else perhaps below it (the
 * largest stands in until a better one comes). The stream's estimate is a running mean of the
 * known ones: the time a launch takes on the GPU shared with everyone else, what a drain waits
 * for. Queued work: the launches not seen complete times that, less what the oldest marker's
 * launches ran already; the oldest's age raises the estimate where it is still running longer.
 *
 * Never inside a region of our own tenant (its timings are not paced), never on a stream that
 * is being captured (its launches do not run, a marker would join the graph). The marker is
 * recorded while the launch is still announced (between krex_enter and krex_leave), so no
 * call of ours passes a closed gate. Our event calls run in the relaxed capture mode: another
 * thread's capture is not broken by them. A wait polls (no blocking call the program could
 * not get out of) and gives a marker up after PACE_GIVE_UP_NS: a kernel that waits for
 * something the host does after the launch (a flag, another stream) is never held up by
 * pacing for longer. Any error of ours forgets the stream's markers; the program's own call is
 * never affected.
 *
 * Per launch, kept cheap: the stream's oldest marker is queried only where the launch would be
 * over the pace or PACE_LOOK_NS passed since the last look (a completion seen within
 * PACE_SEEN_NS still counts as timed); the capture mode is relaxed only around our event
 * calls; the launch's marker half takes the context its wait half found (the thread's, which
 * the launch does not change).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shim.h"

#define PACE_STREAMS 32            /* streams paced at once (the least recently used is reused) */
#define PACE_MARKS 64              /* outstanding markers a stream (full: no more are recorded) */
#define PACE_BATCH 16              /* launches a marker covers at most */
#define PACE_GAP_NS 200000ULL      /* ... or launched over at most this long */
#define PACE_SEEN_NS 1000000ULL    /* a completion seen within this of the last look is timed */
#define PACE_GIVE_UP_NS 100000000ULL /* the longest a launch waits for one marker */
#define PACE_POLL_MIN_NS 20000ULL
#define PACE_POLL_MAX_NS 200000ULL
#define PACE_LOOK_NS 50000ULL      /* under the pace, the oldest marker is queried this often */

uint64_t krex_pace_ns = KREX_PACE_UNREAD;

struct mark {
    CUevent ev;
    uint64_t rec_ns;
    uint32_t launches;
};

struct paced {
    CUcontext ctx; /* NULL: a free entry */
    CUstream stream;
    struct mark ring[PACE_MARKS]; /* outstanding markers, the oldest at head */
    uint32_t head, n;
    CUevent spare[PACE_MARKS]; /* completed markers' events, recorded again */
    uint32_t n_spare;
    uint32_t pending;          /* launches since the last marker */
    uint64_t last_rec_ns;      /* the last marker's record */
    uint64_t done_ns;          /* when the previous marker completed (as seen) */
    int done_known;            /* ... known, not an upper bound */
    uint64_t seen_ns;          /* when the oldest was last seen not complete */
    uint64_t looked_ns;        /* when the markers were last queried */
    uint64_t per_launch_ns;    /* the estimate; 0: none yet */
    int basis;                 /* what per_launch_ns stands on: BASIS_* */
    uint64_t given_up_ns;      /* a marker recorded at or before this is not waited for */
    uint64_t used_ns;
};

static struct paced table[PACE_STREAMS];
static pthread_mutex_t pace_lock = PTHREAD_MUTEX_INITIALIZER;

/* The context the thread's last paced wait found, for its launch's marker (the launch does
 * not change it); NULL once taken, or where the wait paced nothing. */
static __thread CUcontext waited_ctx;
static __thread CUstream waited_stream;

#define REAL(name) ((krex_pfn_##name)krex_real_get(KREX_H_##name))

/* The pace in ns, KREX_PACE_US read at the first call (0: off). */
static uint64_t pace_of_env(void)
{
    uint64_t ns = __atomic_load_n(&krex_pace_ns, __ATOMIC_RELAXED);
    if (KREX_LIKELY(ns != KREX_PACE_UNREAD))
        return ns;
    const char *v = getenv("KREX_PACE_US");
    char *end = NULL;
    unsigned long long us = v && *v ? strtoull(v, &end, 10) : 0;
    ns = 0;
    if (v && *v && (*end || v[0] == '-' || us > 10000000ULL))
        krex_warn("KREX_PACE_US must be microseconds from 0 to 10000000 (got \"%s\"): not "
                  "pacing",
                  v);
    else
        ns = us * 1000ULL;
    __atomic_store_n(&krex_pace_ns, ns, __ATOMIC_RELAXED);
    return ns;
}

void krex_pace_forget(void)
{
    /* The parent's events are not the child's (CUDA does not survive a fork). */
    pthread_mutex_init(&pace_lock, NULL);
    memset(table, 0, sizeof table);
    waited_ctx = NULL;
}

/* Whether our tenant holds one of our gates: inside its region nothing is paced. */
static int in_own_region(const struct krex_slot *s)
{
    uint32_t me = __atomic_load_n(&s->tenant, __ATOMIC_RELAXED);
    for (uint32_t i = 0; i < krex_n_gates; i++)
        if (KREX_GATE_OWNER(KREX_LOAD(&krex_my_gates[i]->word)) == me)
            return 1;
    return 0;
}

/* Where a launch is paced: the pace, the launching thread's context, its capture mode. */
struct pacing {
    uint64_t pace;
    CUcontext ctx;
    CUstreamCaptureMode saved;
    int relaxed;
};

/* Before an event call of ours: the thread in the relaxed capture mode (once a half), so that
 * another thread's capture is not broken by it. */
static void relax(struct pacing *p)
{
    krex_pfn_cuThreadExchangeStreamCaptureMode x = REAL(cuThreadExchangeStreamCaptureMode);
    if (p->relaxed)
        return;
    p->saved = CU_STREAM_CAPTURE_MODE_RELAXED;
    p->relaxed = x && x(&p->saved) == CUDA_SUCCESS;
}

/* Forget e's markers (their events kept for later records) and its estimate. */
static void forget(struct paced *e)
{
    while (e->n) {
        struct mark *m = &e->ring[e->head];
        if (e->n_spare < PACE_MARKS)
            e->spare[e->n_spare++] = m->ev;
        e->head = (e->head + 1) % PACE_MARKS;
        e->n--;
    }
    e->pending = 0;
    e->per_launch_ns = 0;
    e->basis = e->done_known = 0;
    e->done_ns = e->seen_ns = 0;
}

/* The entry of (ctx, s): found, else a free one, else the least recently used without
 * outstanding markers (its events destroyed: they may be another context's); NULL if none. */
static struct paced *find(struct pacing *p, CUstream s, uint64_t now)
{
    CUcontext ctx = p->ctx;
    struct paced *free_e = NULL, *idle = NULL;
    for (int i = 0; i < PACE_STREAMS; i++) {
        struct paced *e = &table[i];
        if (e->ctx == ctx && e->stream == s) {
            e->used_ns = now;
            return e;
        }
        if (!e->ctx) {
            if (!free_e)
                free_e = e;
        } else if (!e->n && (!idle || e->used_ns < idle->used_ns)) {
            idle = e;
        }
    }
    struct paced *e = free_e ? free_e : idle;
    if (!e)
        return NULL;
    krex_pfn_cuEventDestroy_v2 destroy = REAL(cuEventDestroy_v2);
    if (e->n_spare)
        relax(p);
    for (uint32_t i = 0; destroy && i < e->n_spare; i++)
        destroy(e->spare[i]);
    memset(e, 0, sizeof *e);
    e->ctx = ctx;
    e->stream = s;
    e->used_ns = now;
    return e;
}

/* What a stream's estimate stands on, weakest first. A time whose completion was seen late
 * (the program synced and went on) but whose start is known is at least the launches' time:
 * the least of those stands; one whose start is not known either may be less than it (a
 * previous completion seen late makes it start late): the largest of those stands, only until
 * a better one comes. */
enum { BASIS_NONE, BASIS_GUESS, BASIS_ABOVE, BASIS_KNOWN };

/* The oldest marker completed, seen at `now`: its launches' time, where it can be told. Its
 * completion is known where it was seen not complete (or one before it: the stream's order)
 * since its record, at most PACE_SEEN_NS before; its start where it was recorded after the
 * previous marker completed, or that completion is known. */
static void completed(struct paced *e, uint64_t now)
{
    struct mark *m = &e->ring[e->head];
    int done = e->seen_ns >= m->rec_ns && now - e->seen_ns <= PACE_SEEN_NS;
    int begun = m->rec_ns >= e->done_ns || e->done_known;
    uint64_t start = m->rec_ns > e->done_ns ? m->rec_ns : e->done_ns;
    uint64_t at = done ? e->seen_ns + (now - e->seen_ns) / 2 : now;
    uint64_t per = (at > start ? at - start : 0) / (m->launches ? m->launches : 1);
    int basis = done && begun ? BASIS_KNOWN : begun ? BASIS_ABOVE : BASIS_GUESS;
    if (basis == BASIS_KNOWN && e->basis == BASIS_KNOWN)
        e->per_launch_ns = (3 * e->per_launch_ns + per) / 4;
    else if (basis > e->basis)
        e->per_launch_ns = per; /* a better kind of time than the estimate stood on */
    else if (basis == e->basis &&
             (basis == BASIS_ABOVE ? per < e->per_launch_ns : per > e->per_launch_ns))
        e->per_launch_ns = per; /* the least of the bounds above, the largest of the guesses */
    if (basis > e->basis)
        e->basis = basis;
    e->done_ns = at;
    e->done_known = done;
    if (e->n_spare < PACE_MARKS)
        e->spare[e->n_spare++] = m->ev;
    e->head = (e->head + 1) % PACE_MARKS;
    e->n--;
}

/* Pop the markers that completed; 0, or -1 after an error (e forgotten). */
static int poll_marks(struct pacing *p, struct paced *e, uint64_t now)
{
    krex_pfn_cuEventQuery query = REAL(cuEventQuery);
    if (e->n)
        relax(p);
    e->looked_ns = now;
    while (e->n) {
        CUresult r = query ? query(e->ring[e->head].ev) : CUDA_ERROR_NOT_FOUND;
        if (r == CUDA_SUCCESS) {
            completed(e, now);
        } else if (r == CUDA_ERROR_NOT_READY) {
            e->seen_ns = now;
            return 0;
        } else {
            forget(e);
            return -1;
        }
    }
    return 0;
}

/* The GPU time e still has queued, and the next launch's (`*next`). */
static uint64_t queued_ns(const struct paced *e, uint64_t now, uint64_t *next)
{
    uint64_t launches = e->pending, per = e->per_launch_ns, ran = 0;
    for (uint32_t i = 0; i < e->n; i++)
        launches += e->ring[(e->head + i) % PACE_MARKS].launches;
    if (e->n) {
        const struct mark *m = &e->ring[e->head];
        uint64_t start = m->rec_ns > e->done_ns ? m->rec_ns : e->done_ns;
        ran = now > start ? now - start : 0;
        uint64_t least = ran / (m->launches ? m->launches : 1);
        if (per < least)
            per = least; /* still running: each of its launches takes at least that */
    }
    *next = per;
    uint64_t all = launches * per;
    return all > ran ? all - ran : 0;
}

static void nap(uint64_t ns)
{
    if (ns < PACE_POLL_MIN_NS)
        ns = PACE_POLL_MIN_NS;
    if (ns > PACE_POLL_MAX_NS)
        ns = PACE_POLL_MAX_NS;
    struct timespec ts = {0, (long)ns};
    nanosleep(&ts, NULL);
}

static CUcontext current_context(void)
{
    krex_pfn_cuCtxGetCurrent get = REAL(cuCtxGetCurrent);
    CUcontext ctx = NULL;
    if (!get || get(&ctx) != CUDA_SUCCESS)
        return NULL;
    return ctx;
}

/* The start of both halves: 0 where nothing is paced (off, pass-through, our own region, no
 * context); else the thread holds the lock (end()). `ctx`: the context, where known. */
static int begin(struct pacing *p, CUcontext ctx)
{
    p->pace = pace_of_env();
    p->relaxed = 0;
    struct krex_slot *me = p->pace ? krex_slot_self() : NULL;
    if (!me || in_own_region(me) || !(p->ctx = ctx ? ctx : current_context()))
        return 0;
    pthread_mutex_lock(&pace_lock);
    return 1;
}

static void end(struct pacing *p)
{
    pthread_mutex_unlock(&pace_lock);
    if (p->relaxed)
        REAL(cuThreadExchangeStreamCaptureMode)(&p->saved);
}

void krex_pace_wait_slow(CUstream s)
{
    struct pacing p;
    waited_ctx = NULL;
    if (!begin(&p, NULL))
        return;
    waited_ctx = p.ctx;
    waited_stream = s;
    uint64_t now = krex_now_ns(), first = now;
    struct paced *e = find(&p, s, now);
    while (e && e->ctx == p.ctx && e->stream == s && e->n) {
        uint64_t next, q = queued_ns(e, now, &next);
        if (now - e->looked_ns >= PACE_LOOK_NS || q + next > p.pace) {
            /* A look due, or over the pace by what is known without one: the markers now. */
            if (poll_marks(&p, e, now) != 0 || !e->n)
                break;
            q = queued_ns(e, now, &next);
        }
        if (q + next <= p.pace || e->ring[e->head].rec_ns <= e->given_up_ns)
            break;
        if (now - first > PACE_GIVE_UP_NS) {
            /* Not done in that long: maybe waiting for the host. Not waited for again. */
            e->given_up_ns = e->ring[(e->head + e->n - 1) % PACE_MARKS].rec_ns;
            break;
        }
        pthread_mutex_unlock(&pace_lock);
        nap((q + next - p.pace) / 2);
        pthread_mutex_lock(&pace_lock);
        now = krex_now_ns();
    }
    end(&p);
}

static int capturing(CUstream s)
{
    krex_pfn_cuStreamIsCapturing is = REAL(cuStreamIsCapturing);
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (!is)
        return 0; /* a driver without capture */
    return is(s, &st) != CUDA_SUCCESS || st != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* Record a marker of e's pending launches on s (called with the lock held). */
static void record(struct pacing *p, struct paced *e, CUstream s, uint64_t now)
{
    krex_pfn_cuEventRecord rec = REAL(cuEventRecord);
    krex_pfn_cuEventCreate create = REAL(cuEventCreate);
    if (!rec || !create || e->n == PACE_MARKS)
        return;
    relax(p);
    if (capturing(s)) {
        e->pending = 0; /* captured launches run when the graph does, as its launch */
        return;
    }
    CUevent ev = NULL;
    if (e->n_spare)
        ev = e->spare[--e->n_spare];
    else if (create(&ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
        return;
    if (rec(ev, s) != CUDA_SUCCESS) {
        krex_pfn_cuEventDestroy_v2 destroy = REAL(cuEventDestroy_v2);
        if (destroy)
            destroy(ev);
        forget(e);
        return;
    }
    e->ring[(e->head + e->n) % PACE_MARKS] = (struct mark){ev, now, e->pending};
    e->n++;
    e->pending = 0;
    e->last_rec_ns = now;
}

void krex_pace_mark_slow(CUstream s)
{
    struct pacing p;
    CUcontext ctx = waited_stream == s ? waited_ctx : NULL;
    waited_ctx = NULL;
    if (!begin(&p, ctx))
        return;
    uint64_t now = krex_now_ns();
    struct paced *e = find(&p, s, now);
    if (e) {
        e->pending++;
        if (!e->n || !e->per_launch_ns || e->pending >= PACE_BATCH ||
            now - e->last_rec_ns >= PACE_GAP_NS || 8 * e->pending * e->per_launch_ns >= p.pace)
            record(&p, e, s, now);
    }
    end(&p);
}
