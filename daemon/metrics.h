/* tokpiped's latency histograms and load gauges for STATS (PROTOCOL.md,
 * STATS_REPLY `histograms`, `jobs_running`, ...): the job table calls the
 * two hooks, front.c asks metrics_fill when it answers STATS. */
#ifndef TOKPIPED_METRICS_H
#define TOKPIPED_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "tokpipe/protocol.h"

#define B_HIST_BOUNDS 18   /* upper bounds, 100 us .. 60 s (metrics.c) */

typedef struct bhist {
    uint64_t count, sum_us;
    uint64_t buckets[B_HIST_BOUNDS + 1];
} bhist;

typedef struct bmetrics {
    bhist h[TP_HIST_COUNT];
} bmetrics;

struct broker;

/* A job finished: its queue time, time to first token (when it had a
 * token) and end-to-end time. */
void metrics_on_finish(bmetrics *m, const tp_timings *t);

/* A TOKEN event of a job carrying n_ids accepted ids arrived; *last_us is
 * the job's previous token time (0 none), updated. The gap between two
 * events, spread over the ids of the second, is the inter-token latency
 * (what a streaming client sees between tokens). */
void metrics_on_token(bmetrics *m, uint64_t *last_us, size_t n_ids);

/* Fill the STATS gauges and histograms of s. The histograms borrow m and a
 * static table of bounds: encode s before m changes. */
void metrics_fill(const struct broker *b, tp_m_stats_reply *s);

#endif
