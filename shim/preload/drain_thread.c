/*
 * drain_thread.c: the drain thread (docs/shim.md, region protocol step 3), the same for every
 * vendor.
 *
 * It sleeps on its slot's drain_req futex (a count of requests). When the count moves it calls
 * the vendor's krex_drain_sync (drain.c: every CUDA context the process used; hip/hip_drain.c:
 * every HIP device), then acknowledges the count it saw before syncing: every request up to it
 * is served. It blocks every signal: signals meant for the program never land on it.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>

#include "shim.h"

static int drain_running;

static void *drain_main(void *arg)
{
    struct krex_slot *s = arg;
    for (;;) {
        uint32_t req = KREX_LOAD(&s->drain_req);
        if (req != KREX_LOAD(&s->drain_ack)) {
            /* Read before the sync: every call counted so far is drained by it (the gate is
             * closed and quiesced when the controller asks), so a region that finds the count
             * unchanged later has nothing of ours to wait for. */
            uint64_t calls = KREX_LOAD(&s->intercepted);
            krex_drain_sync();
            KREX_STORE(&s->drained_calls, calls);
            KREX_STORE(&s->drain_ack, req);
            krex_futex_wake(&s->drain_ack, INT32_MAX);
            continue;
        }
        krex_futex_wait(&s->drain_req, req, UINT64_MAX);
    }
    return NULL;
}

int krex_drain_start(struct krex_slot *s)
{
    if (drain_running)
        return 0;
    sigset_t all, old;
    sigfillset(&all);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    /* Room for the runtime's synchronise calls (HIP's need more than CUDA's 64 KiB). */
    pthread_attr_setstacksize(&attr, 256 * 1024);
    /* The new thread inherits this mask: it never takes the program's signals. */
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t t;
    int rc = pthread_create(&t, &attr, drain_main, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (rc == 0) {
        drain_running = 1;
        pthread_setname_np(t, "krex-drain");
    }
    return rc;
}

void krex_drain_after_fork(void)
{
    /* Threads don't survive fork; what the vendor tracked is the parent's. */
    drain_running = 0;
    krex_drain_forget();
}
