/* KV pages and the prefix cache over them (prefix_cache.h). */
#include "prefix_cache.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

struct tp_pcache {
    int n;
    bool cache;
    int *ref;          /* holders per page */
    bool *cached;
    int *parent;       /* cached pages: the key's parent (-1 = first page) */
    int *children;     /* cached pages naming this one as parent */
    int32_t *tokens;   /* cached pages: [page][TP_KV_PAGE] the key's tokens */
    uint64_t *tick;    /* last use, for LRU */
    int *next;         /* hash chain within a bucket */
    int *bucket;       /* n_buckets heads */
    unsigned n_buckets;
    int *free_stack;   /* free pages, the top (most recently freed) first */
    int n_free;
    uint64_t clock;
    tp_pcache_stats st;
    /* window parts (prefix_cache.h); n_parts 0: none */
    int n_parts, parts_claimed;
    int *part;         /* [page] its part, or -1 */
    int *claims;       /* [page] claims on its part */
    int *owner;        /* [part] its page, or -1 when free */
    uint64_t *released; /* [part] when its last claim went: LRU among unclaimed parts */
    int *part_free;    /* free parts, the most recently freed on top */
    int n_part_free;
};

tp_pcache *tp_pcache_new(int n_pages, bool cache)
{
    if (n_pages < 1)
        return NULL;
    tp_pcache *pc = calloc(1, sizeof *pc);
    if (!pc)
        return NULL;
    size_t n = (size_t)n_pages;
    pc->n = n_pages;
    pc->cache = cache;
    unsigned nb = 16;
    while (nb < 2 * (unsigned)n_pages && nb < (1u << 30))
        nb <<= 1;
    pc->n_buckets = nb;
    pc->ref = calloc(n, sizeof *pc->ref);
    pc->cached = calloc(n, sizeof *pc->cached);
    pc->parent = calloc(n, sizeof *pc->parent);
    pc->children = calloc(n, sizeof *pc->children);
    pc->tokens = calloc(n * TP_KV_PAGE, sizeof *pc->tokens);
    pc->tick = calloc(n, sizeof *pc->tick);
    pc->next = calloc(n, sizeof *pc->next);
    pc->bucket = malloc(nb * sizeof *pc->bucket);
    pc->free_stack = malloc(n * sizeof *pc->free_stack);
    if (!pc->ref || !pc->cached || !pc->parent || !pc->children || !pc->tokens || !pc->tick || !pc->next ||
        !pc->bucket || !pc->free_stack) {
        tp_pcache_free(pc);
        return NULL;
    }
    for (unsigned i = 0; i < nb; i++)
        pc->bucket[i] = -1;
    /* page 0 on top: low pages are used first, so an idle pool's untouched
     * tail costs no memory */
    for (int i = 0; i < n_pages; i++)
        pc->free_stack[i] = n_pages - 1 - i;
    pc->n_free = n_pages;
    pc->st.pages_total = (uint32_t)n_pages;
    return pc;
}

void tp_pcache_free(tp_pcache *pc)
{
    if (!pc)
        return;
    free(pc->ref);
    free(pc->cached);
    free(pc->parent);
    free(pc->children);
    free(pc->tokens);
    free(pc->tick);
    free(pc->next);
    free(pc->bucket);
    free(pc->free_stack);
    free(pc->part);
    free(pc->claims);
    free(pc->owner);
    free(pc->released);
    free(pc->part_free);
    free(pc);
}

int tp_pcache_set_parts(tp_pcache *pc, int n_parts)
{
    if (n_parts <= 0)
        return 0;
    size_t n = (size_t)pc->n, k = (size_t)n_parts;
    pc->part = malloc(n * sizeof *pc->part);
    pc->claims = calloc(n, sizeof *pc->claims);
    pc->owner = malloc(k * sizeof *pc->owner);
    pc->released = calloc(k, sizeof *pc->released);
    pc->part_free = malloc(k * sizeof *pc->part_free);
    if (!pc->part || !pc->claims || !pc->owner || !pc->released || !pc->part_free)
        return TP_ENOMEM;
    for (size_t i = 0; i < n; i++)
        pc->part[i] = -1;
    for (int i = 0; i < n_parts; i++) { /* part 0 on top, as pages */
        pc->owner[i] = -1;
        pc->part_free[i] = n_parts - 1 - i;
    }
    pc->n_parts = pc->n_part_free = n_parts;
    return 0;
}

/* Page p (held by nobody now) gives its part back. */
static void part_free(tp_pcache *pc, int p)
{
    if (!pc->n_parts || pc->part[p] < 0)
        return;
    assert(pc->claims[p] == 0);
    int k = pc->part[p];
    pc->owner[k] = -1;
    pc->part[p] = -1;
    pc->part_free[pc->n_part_free++] = k;
}

bool tp_pcache_enabled(const tp_pcache *pc) { return pc->cache; }

/* FNV-1a over the parent id and the tokens: only picks the bucket; keys
 * are compared in full. */
static void fnv_word(uint64_t *h, uint32_t w)
{
    for (int b = 0; b < 4; b++) {
        *h ^= (w >> (8 * b)) & 0xff;
        *h *= 1099511628211ull;
    }
}

static unsigned key_bucket(const tp_pcache *pc, int parent, const int32_t *tokens)
{
    uint64_t h = 1469598103934665603ull;
    fnv_word(&h, (uint32_t)parent);
    for (int i = 0; i < TP_KV_PAGE; i++)
        fnv_word(&h, (uint32_t)tokens[i]);
    return (unsigned)(h ^ (h >> 32)) & (pc->n_buckets - 1);
}

static bool key_equal(const tp_pcache *pc, int p, int parent, const int32_t *tokens)
{
    return pc->parent[p] == parent &&
           !memcmp(pc->tokens + (size_t)p * TP_KV_PAGE, tokens, TP_KV_PAGE * sizeof *tokens);
}

static void uncache(tp_pcache *pc, int p)
{
    unsigned b = key_bucket(pc, pc->parent[p], pc->tokens + (size_t)p * TP_KV_PAGE);
    for (int *at = &pc->bucket[b]; *at >= 0; at = &pc->next[*at])
        if (*at == p) {
            *at = pc->next[p];
            break;
        }
    if (pc->parent[p] >= 0)
        pc->children[pc->parent[p]]--;
    pc->cached[p] = false;
    pc->st.pages_cached--;
}

/* The least recently used cached page nobody holds and no key names as
 * parent, or -1. A linear scan: it runs once per page allocated when no
 * page is free, against the cost of computing a page's 16 positions. */
static int lru_victim(const tp_pcache *pc)
{
    int best = -1;
    for (int p = 0; p < pc->n; p++)
        if (pc->cached[p] && pc->ref[p] == 0 && pc->children[p] == 0 && (best < 0 || pc->tick[p] < pc->tick[best]))
            best = p;
    return best;
}

int tp_pcache_alloc(tp_pcache *pc)
{
    int p;
    if (pc->n_free > 0) {
        p = pc->free_stack[--pc->n_free];
    } else {
        p = lru_victim(pc);
        if (p < 0)
            return -1;
        uncache(pc, p);
        part_free(pc, p);
        pc->st.evictions++;
    }
    pc->ref[p] = 1;
    pc->st.pages_used++;
    return p;
}

void tp_pcache_ref(tp_pcache *pc, int p)
{
    if (pc->ref[p]++ == 0)
        pc->st.pages_used++;
}

void tp_pcache_unref(tp_pcache *pc, int p)
{
    if (--pc->ref[p] > 0)
        return;
    pc->st.pages_used--;
    if (!pc->cached[p]) {
        part_free(pc, p);
        pc->free_stack[pc->n_free++] = p;
    }
}

int tp_pcache_part(const tp_pcache *pc, int p) { return pc->n_parts ? pc->part[p] : -1; }

/* The unclaimed part released longest ago (its page is cached: an
 * unclaimed part of any other page was freed), or -1. A linear scan, as
 * lru_victim. */
static int part_victim(const tp_pcache *pc)
{
    int best = -1;
    for (int k = 0; k < pc->n_parts; k++) {
        int o = pc->owner[k];
        if (o >= 0 && pc->claims[o] == 0 && (best < 0 || pc->released[k] < pc->released[best]))
            best = k;
    }
    return best;
}

int tp_pcache_part_claim(tp_pcache *pc, int p)
{
    if (!pc->n_parts)
        return -1;
    if (pc->part[p] < 0) {
        int k;
        if (pc->n_part_free > 0) {
            k = pc->part_free[--pc->n_part_free];
        } else {
            if ((k = part_victim(pc)) < 0)
                return -1;
            pc->part[pc->owner[k]] = -1;
        }
        pc->owner[k] = p;
        pc->part[p] = k;
    }
    if (pc->claims[p]++ == 0)
        pc->parts_claimed++;
    return pc->part[p];
}

void tp_pcache_part_release(tp_pcache *pc, int p)
{
    if (!pc->n_parts)
        return;
    assert(pc->part[p] >= 0 && pc->claims[p] > 0);
    if (--pc->claims[p] > 0)
        return;
    pc->parts_claimed--;
    if (pc->cached[p])
        pc->released[pc->part[p]] = ++pc->clock;
    else
        part_free(pc, p);
}

void tp_pcache_part_move(tp_pcache *pc, int from, int to)
{
    if (!pc->n_parts || from == to)
        return;
    if (pc->part[to] >= 0) {
        tp_pcache_part_release(pc, from);
        tp_pcache_part_claim(pc, to); /* has one: takes nothing */
        return;
    }
    assert(pc->claims[from] == 1 && !pc->cached[from] && pc->claims[to] == 0);
    int k = pc->part[from];
    pc->part[from] = -1;
    pc->claims[from] = 0;
    pc->part[to] = k;
    pc->owner[k] = to;
    pc->claims[to] = 1;
}

int tp_pcache_parts_total(const tp_pcache *pc) { return pc->n_parts; }
int tp_pcache_parts_claimed(const tp_pcache *pc) { return pc->parts_claimed; }

bool tp_pcache_shared(const tp_pcache *pc, int p)
{
    return pc->cached[p] || pc->ref[p] > 1;
}

int tp_pcache_lookup(tp_pcache *pc, int parent, const int32_t *tokens)
{
    if (!pc->cache)
        return -1;
    for (int p = pc->bucket[key_bucket(pc, parent, tokens)]; p >= 0; p = pc->next[p])
        if (pc->cached[p] && key_equal(pc, p, parent, tokens)) {
            pc->tick[p] = ++pc->clock;
            return p;
        }
    return -1;
}

int tp_pcache_publish(tp_pcache *pc, int p, int parent, const int32_t *tokens)
{
    if (!pc->cache || pc->cached[p])
        return p;
    unsigned b = key_bucket(pc, parent, tokens);
    for (int q = pc->bucket[b]; q >= 0; q = pc->next[q])
        if (pc->cached[q] && key_equal(pc, q, parent, tokens)) {
            pc->tick[q] = ++pc->clock;
            tp_pcache_ref(pc, q);
            return q;
        }
    pc->cached[p] = true;
    pc->parent[p] = parent;
    memcpy(pc->tokens + (size_t)p * TP_KV_PAGE, tokens, TP_KV_PAGE * sizeof *tokens);
    pc->next[p] = pc->bucket[b];
    pc->bucket[b] = p;
    pc->tick[p] = ++pc->clock;
    if (parent >= 0)
        pc->children[parent]++;
    pc->st.pages_cached++;
    return p;
}

void tp_pcache_count_lookup(tp_pcache *pc, int n_tokens)
{
    pc->st.lookups++;
    pc->st.hits += n_tokens > 0;
    pc->st.hit_tokens += (uint64_t)n_tokens;
}

void tp_pcache_count_prefill(tp_pcache *pc, int n)
{
    pc->st.prefill_tokens += (uint64_t)n;
}

void tp_pcache_get_stats(const tp_pcache *pc, tp_pcache_stats *out)
{
    *out = pc->st;
}
