/* Prefix-aware choice of a forward worker (SGLang's cache-aware router,
 * load-aware): a job goes to the forward worker whose prefix cache most
 * likely holds the longest start of its prompt, unless that worker is
 * clearly busier than the least loaded one; with no worker holding any of
 * it, to the least loaded (choose_forward).
 *
 * The broker mirrors what each forward worker holds without asking it:
 * every sequence a worker computes leaves its full 16-token pages in the
 * worker's cache (workers/forward/prefix_cache.h), keyed by the whole
 * token prefix up to the page's end. The mirror keeps a hash of that
 * prefix per page (a hash chain, as the worker's keys) in a direct-mapped
 * table per worker: a job's prompt pages when it is pinned (its chunks are
 * computed there next, so jobs arriving together with it follow it), and
 * its prompt + generated pages when it ends. A mirror is an estimate: a
 * page the worker has since evicted, or a slot another page overwrote,
 * only makes a choice worse, never an output different (the worker checks
 * every page key in full). A worker that restarted (new incarnation)
 * starts with an empty mirror, as its cache does. */
#include "route.h"
#include "choose.h"
#include "tokpipe/forward.h"

#include <stdlib.h>
#include <string.h>

#define ROUTE_SLOTS (1u << 14) /* pages mirrored per worker (128 KiB) */
/* "Clearly busier": more running jobs than the least loaded worker by
 * more than this plus half of that worker's count. */
#define ROUTE_SLACK 2

struct route_mirror {
    uint64_t incarnation;
    uint64_t key[ROUTE_SLOTS]; /* 0 = empty */
};

/* The chain: h(k+1) = mix(h(k), page k's tokens); never 0. */
static uint64_t chain(uint64_t h, const int32_t *t)
{
    for (int i = 0; i < TP_KV_PAGE; i++) {
        h ^= (uint64_t)(uint32_t)t[i];
        h *= 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
    }
    return h ? h : 1;
}

#define CHAIN_SEED 0x243F6A8885A308D3ull

/* The mirror of forward worker wi, emptied if the worker restarted; NULL
 * when none can be had. */
static struct route_mirror *mirror(broker *b, int wi, bool create)
{
    struct route_mirror *m = b->route[wi];
    const bworker *w = &b->workers[wi];
    if (m && m->incarnation != w->incarnation) {
        memset(m->key, 0, sizeof m->key);
        m->incarnation = w->incarnation;
    }
    if (!m && create && (m = calloc(1, sizeof *m))) {
        m->incarnation = w->incarnation;
        b->route[wi] = m;
    }
    return m;
}

/* Full pages of ids[0..n) + more[0..n_more) (read as one sequence). */
static void page_of(const int32_t *ids, uint32_t n, const int32_t *more, uint32_t k, int32_t *page)
{
    for (uint32_t i = 0; i < TP_KV_PAGE; i++) {
        uint32_t p = k * TP_KV_PAGE + i;
        page[i] = p < n ? ids[p] : more[p - n];
    }
}

void route_note(broker *b, int wi, const int32_t *ids, uint32_t n, const int32_t *more, uint32_t n_more)
{
    if (wi < 0 || !b->cfg->prefix_cache)
        return;
    struct route_mirror *m = mirror(b, wi, true);
    if (!m)
        return;
    uint64_t h = CHAIN_SEED;
    int32_t page[TP_KV_PAGE];
    for (uint32_t k = 0; (k + 1) * TP_KV_PAGE <= n + n_more; k++) {
        page_of(ids, n, more, k, page);
        h = chain(h, page);
        m->key[h % ROUTE_SLOTS] = h;
    }
}

/* Leading pages of ids[0..n) the mirror of wi holds (the last prompt
 * token is always computed, so pages up to n - 1 count). */
static uint32_t held(broker *b, int wi, const int32_t *ids, uint32_t n)
{
    struct route_mirror *m = mirror(b, wi, false);
    if (!m || n == 0)
        return 0;
    uint64_t h = CHAIN_SEED;
    uint32_t k = 0;
    for (; (k + 1) * TP_KV_PAGE <= n - 1; k++) {
        h = chain(h, ids + (size_t)k * TP_KV_PAGE);
        if (m->key[h % ROUTE_SLOTS] != h)
            break;
    }
    return k;
}

int route_forward(broker *b, const bjob *j)
{
    int least = choose_forward(b);
    if (least < 0 || !b->cfg->prefix_cache || !j->prompt)
        return least;
    int min_load = b->workers[least].n_fwd, best = least;
    uint32_t best_held = held(b, least, j->prompt, j->n_prompt);
    for (int i = 0; i < B_MAX_WORKERS; i++) {
        const bworker *w = &b->workers[i];
        if (i == least || !choose_forward_can_take(b, i) || w->n_fwd > min_load + ROUTE_SLACK + min_load / 2)
            continue;
        uint32_t h = held(b, i, j->prompt, j->n_prompt);
        const bworker *bw = &b->workers[best];
        /* equal holdings: the less loaded; none held: of the least loaded,
         * the one caching least, so distinct prefixes spread over the
         * workers (and each worker's cache holds more of its own) */
        bool better = h > best_held || (h == best_held && h > 0 && w->n_fwd < bw->n_fwd) ||
                      (h == 0 && best_held == 0 && w->n_fwd == bw->n_fwd &&
                       w->cache[TP_CACHE_PAGES_CACHED] < bw->cache[TP_CACHE_PAGES_CACHED]);
        if (better) {
            best = i;
            best_held = h;
        }
    }
    return best;
}

void route_free(broker *b)
{
    for (int i = 0; i < B_MAX_WORKERS; i++) {
        free(b->route[i]);
        b->route[i] = NULL;
    }
}
