/*
 * region_user.c: a C benchmark that marks its regions through <krex.h>.
 *
 *   region_user nested    begin, begin, end, end (one region on the wire)
 *   region_user once      begin, end
 *   region_user threads   two threads, each begin ... end, both inside at once
 *
 * Prints the return values in call order ("rc 0 0 0 0"), or "no libkrex" when libkrex.so is
 * not loaded (the weak symbols are NULL). Exits 0 when every call returned 0.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "krex.h"

static pthread_barrier_t inside;
static int results[2][2];

static void *thread_region(void *arg)
{
    int *rc = arg;
    rc[0] = krex_region_begin();
    pthread_barrier_wait(&inside); /* both threads hold their region at once */
    rc[1] = krex_region_end();
    return NULL;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "nested";
    if (!krex_region_begin || !krex_region_end) {
        printf("no libkrex\n");
        return 2;
    }
    int rc[4] = {0, 0, 0, 0}, n = 0;
    if (strcmp(mode, "nested") == 0) {
        rc[n++] = krex_region_begin();
        rc[n++] = krex_region_begin();
        rc[n++] = krex_region_end();
        rc[n++] = krex_region_end();
    } else if (strcmp(mode, "once") == 0) {
        rc[n++] = krex_region_begin();
        rc[n++] = krex_region_end();
    } else if (strcmp(mode, "threads") == 0) {
        pthread_t t[2];
        pthread_barrier_init(&inside, NULL, 2);
        for (int i = 0; i < 2; i++)
            pthread_create(&t[i], NULL, thread_region, results[i]);
        for (int i = 0; i < 2; i++) {
            pthread_join(t[i], NULL);
            rc[n++] = results[i][0];
            rc[n++] = results[i][1];
        }
    } else {
        fprintf(stderr, "region_user: unknown mode %s\n", mode);
        return 2;
    }
    int failed = 0;
    printf("rc");
    for (int i = 0; i < n; i++) {
        printf(" %d", rc[i]);
        failed |= rc[i] != 0;
    }
    printf("\n");
    return failed;
}
