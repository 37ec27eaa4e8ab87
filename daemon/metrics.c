/* Latency histograms and load gauges for STATS (metrics.h). */
#include "metrics.h"
#include "state.h"

#include "tokpipe/zwire.h"

/* Prometheus-style latency buckets (µs): from a fast decode step on a tiny
 * model to a long generation, about 2.5x apart. */
static const uint64_t bounds_us[B_HIST_BOUNDS] = {
    100,     250,     500,      1000,     2500,     5000,      10000,     25000,     50000,
    100000,  250000,  500000,   1000000,  2500000,  5000000,   10000000,  30000000,  60000000,
};

static void observe(bhist *h, uint64_t us)
{
    size_t i = 0;
    while (i < B_HIST_BOUNDS && us > bounds_us[i])
        i++;
    h->buckets[i]++;
    h->count++;
    h->sum_us += us;
}

void metrics_on_finish(bmetrics *m, const tp_timings *t)
{
    if (!t->total_us)
        return;   /* no FINISH timings (never published) */
    /* a job cancelled before its first step has no queue time to report */
    if (t->queue_us || t->ttft_us)
        observe(&m->h[TP_HIST_QUEUE], t->queue_us);
    if (t->ttft_us)
        observe(&m->h[TP_HIST_TTFT], t->ttft_us);
    observe(&m->h[TP_HIST_E2E], t->total_us);
}

void metrics_on_token(bmetrics *m, uint64_t *last_us, size_t n_ids)
{
    if (!n_ids)
        return;
    uint64_t now = tp_now_us();
    if (*last_us) {
        uint64_t per = (now - *last_us) / n_ids;
        for (size_t i = 0; i < n_ids; i++)
            observe(&m->h[TP_HIST_ITL], per);
    }
    *last_us = now;
}

void metrics_fill(const broker *b, tp_m_stats_reply *s)
{
    for (uint32_t i = 0; i < b->jt.cap; i++) {
        int st = b->jt.jobs[i].state;
        s->jobs_waiting += st == J_TOKENIZE || st == J_ADMIT;
        s->jobs_running += st == J_RUNNING || st == J_CLOSING;
    }
    for (int i = 0; i < B_MAX_WORKERS; i++) {
        const bworker *w = &b->workers[i];
        if (w->live && (w->stages & TP_STAGE_FORWARD)) {
            s->kv_slots_used += (uint64_t)w->n_fwd;
            s->kv_slots_total += w->capacity;
            s->prefix_lookups += w->cache[TP_CACHE_LOOKUPS];
            s->prefix_hit_tokens += w->cache[TP_CACHE_HIT_TOKENS];
            s->prefix_prompt_tokens += w->cache[TP_CACHE_PROMPT_TOKENS];
            s->prefix_evictions += w->cache[TP_CACHE_EVICTIONS];
            s->prefix_pages_used += w->cache[TP_CACHE_PAGES_USED];
            s->prefix_pages_cached += w->cache[TP_CACHE_PAGES_CACHED];
            s->prefix_pages_total += w->cache[TP_CACHE_PAGES_TOTAL];
            s->prefix_bytes += w->cache[TP_CACHE_PAGES_CACHED] * w->cache[TP_CACHE_PAGE_BYTES];
            /* as of its last step; a worker whose sequences all closed since holds none */
            s->kv_bytes_held += w->n_fwd ? w->cache[TP_CACHE_KV_HELD] : 0;
            s->kv_bytes_pool += w->cache[TP_CACHE_KV_POOL];
        }
    }
    for (int h = 0; h < TP_HIST_COUNT; h++) {
        const bhist *x = &b->jt.metrics.h[h];
        s->hist[h] = (tp_hist){.count = x->count, .sum_us = x->sum_us, .bounds_us = (uint64_t *)bounds_us,
                               .n_bounds = B_HIST_BOUNDS, .buckets = (uint64_t *)x->buckets,
                               .n_buckets = B_HIST_BOUNDS + 1};
    }
}
