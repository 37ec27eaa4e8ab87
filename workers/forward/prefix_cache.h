/* Private to the forward stage (and its tests): the KV pool's pages and the
 * prefix cache over them.
 *
 * The KV pool is cut into pages of TP_KV_PAGE positions (the keys and
 * values of those positions in every layer that keeps them all; sliding
 * layers' in the page's window part, below); a sequence's block table lists its
 * pages in position order. This module owns the pages' bookkeeping, never
 * their bytes: reference counts, a free list, and the cache.
 *
 * The cache: a full page whose positions hold the tokens t[0..16) after a
 * prefix whose last page is `parent` (-1 for the first page) is keyed by
 * (parent, t). Following the keys from -1 gives a hash chain over full
 * pages (vLLM's automatic prefix caching); a key is compared exactly
 * (parent id and every token), so a hash collision can never hand out the
 * wrong page. A cached page is shared by reference: any number of
 * sequences hold it in their tables, nobody writes it (tp_pcache_shared),
 * and when nobody holds it it stays cached until its page is needed for
 * something else: then the least recently used cached page that no
 * sequence holds and that no cached page names as parent (a leaf) is
 * evicted. Evicting leaves only keeps every key's parent id valid: a page
 * id is reused only after every key naming it is gone.
 *
 * Not thread-safe (the tp_forward owning it is not either). */
#ifndef TOKPIPE_FORWARD_PREFIX_CACHE_H
#define TOKPIPE_FORWARD_PREFIX_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokpipe/forward.h"

typedef struct tp_pcache tp_pcache;

/* Counters since tp_pcache_new (STATS, /metrics). */
typedef struct tp_pcache_stats {
    uint64_t lookups;      /* reuse attempts (tp_forward_seq_reuse calls that could hit) */
    uint64_t hits;         /* of those, how many took at least one page */
    uint64_t hit_tokens;   /* positions taken from the cache instead of computed */
    uint64_t prefill_tokens; /* prompt positions asked for: computed + taken from the cache */
    uint64_t evictions;    /* cached pages given up for new ones */
    uint32_t pages_total;  /* the pool */
    uint32_t pages_used;   /* held by at least one sequence */
    uint32_t pages_cached; /* in the cache (held or not) */
} tp_pcache_stats;

/* A pool of n_pages pages, all free. cache false: pages are only handed
 * out and taken back (no key is ever stored). NULL when out of memory. */
tp_pcache *tp_pcache_new(int n_pages, bool cache);
void tp_pcache_free(tp_pcache *pc);

bool tp_pcache_enabled(const tp_pcache *pc);

/* A page for one sequence to write (reference count 1, not cached): a
 * free one (the most recently freed first: its memory is already touched)
 * or, when none is free, the least recently used evictable cached page.
 * -1 when every page is held (the caller sized the pool so that cannot
 * happen; see forward.c). */
int tp_pcache_alloc(tp_pcache *pc);

/* One more holder of page p (a sequence taking a cached page). */
void tp_pcache_ref(tp_pcache *pc, int p);

/* One holder fewer. At 0 a cached page stays cached (evictable), any other
 * page is free again. */
void tp_pcache_unref(tp_pcache *pc, int p);

/* May page p be written by its holder? Not when it is cached or held by
 * more than one sequence. */
bool tp_pcache_shared(const tp_pcache *pc, int p);

/* The cached page keyed (parent, tokens[0..TP_KV_PAGE)), marked as just
 * used, or -1. The caller takes a reference if it keeps it. */
int tp_pcache_lookup(tp_pcache *pc, int parent, const int32_t *tokens);

/* Offer page p (held by the caller, fully written, its positions holding
 * tokens after the prefix ending in cached page parent) to the cache.
 * Returns the page the caller should hold from now on: p itself (now
 * cached) or, when the same key is already cached, that page with a
 * reference taken for the caller (the caller then drops p: the two hold
 * the same bits, since a position's KV depends only on the tokens up to
 * it). With the cache off, returns p unchanged. */
int tp_pcache_publish(tp_pcache *pc, int p, int parent, const int32_t *tokens);

/* WINDOW PARTS. A model with sliding-window layers keeps those layers'
 * keys and values apart from the page: a page's window part (a page of
 * its own in a second, smaller pool) holds the sliding layers of its 16
 * positions, and may be let go while the page (the other layers) stays.
 * A holder that still needs a page's sliding layers "claims" its part;
 * a sequence claims the parts of the pages its next queries can see
 * (forward.c) and releases the rest. A part nobody claims is freed at
 * once unless its page is cached: then it stays with the page until its
 * memory is needed for another part (least recently released first), so
 * a prefix hit can still use it; a cached page may thus have no part
 * (tp_pcache_part < 0), and a hit that would need it is cut (forward.c).
 * A page that is freed or evicted frees its part. Without parts
 * (tp_pcache_set_parts never called, or 0) these calls do nothing. */

/* Give the pool n_parts window parts, all free (only on a new pool, before
 * any page is handed out). TP_ENOMEM. */
int tp_pcache_set_parts(tp_pcache *pc, int n_parts);

/* Page p's window part, or -1 (none: never had one, or let go). */
int tp_pcache_part(const tp_pcache *pc, int p);

/* One more claim on page p's part, giving it one when it has none (a free
 * part, else the least recently released unclaimed one, taken from its
 * page; its bytes are then undefined). Returns the part, or -1 when every
 * part is claimed (the caller sized the parts so that cannot happen). */
int tp_pcache_part_claim(tp_pcache *pc, int p);

/* One claim fewer on p's part (which must have one). */
void tp_pcache_part_release(tp_pcache *pc, int p);

/* The caller's claim on page from's part moves to page to, which holds
 * the same positions' bits (tp_pcache_publish gave it for from): to's own
 * part is claimed when it has one, else from's part is handed to it.
 * from must be held by the caller alone and not cached. */
void tp_pcache_part_move(tp_pcache *pc, int from, int to);

/* Parts in all, and parts claimed by at least one holder. */
int tp_pcache_parts_total(const tp_pcache *pc);
int tp_pcache_parts_claimed(const tp_pcache *pc);

/* Count a reuse attempt that took n_tokens positions from the cache. */
void tp_pcache_count_lookup(tp_pcache *pc, int n_tokens);

/* Count n prompt positions asked for (computed or taken). */
void tp_pcache_count_prefill(tp_pcache *pc, int n);

void tp_pcache_get_stats(const tp_pcache *pc, tp_pcache_stats *out);

#endif
