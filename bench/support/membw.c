/* A read-only stream over a buffer far past any L3 (see membw.h). */
#include "membw.h"
#include "timing.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define STREAM_BYTES ((size_t)512 << 20)
#define STREAM_THREADS 256

typedef struct {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
} part;

static void *sum_part(void *arg)
{
    part *w = arg;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0; /* four chains: the loads, not the adds, set the pace */
    for (size_t i = 0; i + 4 <= w->n; i += 4) {
        s0 += w->p[i];
        s1 += w->p[i + 1];
        s2 += w->p[i + 2];
        s3 += w->p[i + 3];
    }
    w->sum = s0 + s1 + s2 + s3;
    return NULL;
}

double bench_stream_gbps(int threads)
{
    if (threads < 1 || threads > STREAM_THREADS)
        return 0;
    uint64_t *buf = malloc(STREAM_BYTES);
    if (!buf)
        return 0;
    memset(buf, 1, STREAM_BYTES);
    size_t words = STREAM_BYTES / 8, share = words / (size_t)threads / 4 * 4;
    part parts[STREAM_THREADS];
    pthread_t tid[STREAM_THREADS];
    double best = 0;
    volatile uint64_t sink = 0;
    for (int pass = 0; pass < 4; pass++) {
        double t0 = bench_now();
        int started = 0;
        for (int i = 0; i < threads; i++) {
            parts[i] = (part){buf + (size_t)i * share, share, 0};
            if (i == 0 || pthread_create(&tid[i], NULL, sum_part, &parts[i]) == 0)
                started = i + 1;
            else
                break;
        }
        sum_part(&parts[0]);
        for (int i = 1; i < started; i++)
            pthread_join(tid[i], NULL);
        double t = bench_now() - t0;
        for (int i = 0; i < started; i++)
            sink += parts[i].sum;
        double gbps = (double)started * (double)share * 8 / t / 1e9;
        if (pass > 0 && gbps > best)
            best = gbps;
    }
    (void)sink;
    free(buf);
    return best;
}
