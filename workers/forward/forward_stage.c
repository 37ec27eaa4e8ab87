/* Forward stage glue: SEQ_OPEN / SEQ_CLOSE / STEP -> tp_forward calls.
 *
 * The broker numbers jobs by slot; tp_forward numbers KV sequences by
 * seq_id. slot_of[] maps one to the other (linear scan: a step touches at
 * most kv_slots sequences and kv_slots is small).
 *
 * Prefix cache: the broker sends prompts as it always did; every prompt
 * chunk of a STEP is first offered to the cache (tp_forward_seq_reuse),
 * and only what the cache does not hold is computed. A chunk wholly in the
 * cache is dropped from the step; a chunk that asks for output always
 * keeps its last token. STEP_RESULT says which slots took how many
 * positions (cached_slots / cached) and how the cache stands (cache).
 *
 * Jobs that arrive together with a common prefix: a prompt chunk whose
 * first page equals an earlier item's in the same STEP (same position,
 * same cached pages before it) waits for a second pass: the first pass
 * computes the earlier item and caches its full pages, then the waiting
 * chunk takes them from the cache and only its rest is computed.
 *
 * Speculative decoding: an item flagged TP_ITEM_VERIFY (the job's last
 * token and the guesses after it) is never offered to the cache and gives
 * a row of output after each of its tokens, in order (its slot repeated in
 * STEP_RESULT's slots). With the sample stage in this process its rows are
 * sampled as a chain: row r + 1 only while row r's candidate equals the
 * token fed after it (tp_sample_stage_pick accepting row r's candidate
 * first), so the candidates are exactly those of one plain step each. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/forward.h"
#include "tokpipe/model.h"
#include "tokpipe/stage.h"

struct tp_forward_stage {
    const tp_model *model;
    tp_forward *fwd;
    tp_sample_stage *sampler;   /* fused sample stage, or NULL */
    int kv_slots, max_pos, max_batch_tokens, threads;
    int vocab;
    /* per seq_id: the broker slot using it, valid when used[] */
    uint32_t *slot_of;
    bool *used;
    /* step scratch */
    tp_fwd_item *items;
    int *tokens;
    float *logits;
    uint32_t *out_slots;
    int32_t *cands;
    /* per item of the step after trimming: its slot and accepted token */
    uint32_t *item_slot;
    int32_t *item_acc;
    int32_t *hit_slots, *hits; /* items that took cached positions */
    uint32_t n_hits;
    /* the two passes of a step: pass[] items, row r of the logits is
     * pass[r]; row_item[r] its index in items[] */
    tp_fwd_item *pass;
    uint32_t *row_item;
    bool *twin;
    /* verify items: item_verify[i] per item (after trimming); their rows
     * (vrows, vrows_cap rows), and the output when they make it outgrow the
     * item-sized buffers (obuf; out_slots and cands grown to out_cap) */
    bool *item_verify;
    float *vrows, *obuf;
    size_t vrows_cap, obuf_cap, out_cap;
    float **all;
    /* embeddings: per seq_id its pooling (TP_POOL_*, NONE: a generating
     * job) and the pooled vector so far (dim floats); per item whether it
     * asked for the vector (TP_ITEM_EMBED); the EMBEDDED columns */
    int dim, model_pool;
    int *pool_of;
    float *pooled;
    tp_fwd_pool *item_pool, *pass_pool;   /* parallel to items[], pass[] */
    bool *item_embed;
    uint32_t *emb_slots;
    float *emb_out;
};

static int alloc_scratch(tp_forward_stage *st)
{
    size_t n = (size_t)st->kv_slots;
    st->slot_of = calloc(n, sizeof *st->slot_of);
    st->used = calloc(n, sizeof *st->used);
    st->items = calloc(n, sizeof *st->items);
    st->tokens = calloc((size_t)st->max_batch_tokens, sizeof *st->tokens);
    st->logits = malloc(n * (size_t)st->vocab * sizeof *st->logits);
    st->out_slots = calloc(n, sizeof *st->out_slots);
    st->cands = calloc(n, sizeof *st->cands);
    st->item_slot = calloc(n, sizeof *st->item_slot);
    st->item_acc = calloc(n, sizeof *st->item_acc);
    st->hit_slots = calloc(n, sizeof *st->hit_slots);
    st->hits = calloc(n, sizeof *st->hits);
    st->pass = calloc(n, sizeof *st->pass);
    st->row_item = calloc(n, sizeof *st->row_item);
    st->twin = calloc(n, sizeof *st->twin);
    st->item_verify = calloc(n, sizeof *st->item_verify);
    st->all = calloc(n, sizeof *st->all);
    st->out_cap = n;
    st->pool_of = calloc(n, sizeof *st->pool_of);
    st->pooled = calloc(n * (size_t)st->dim, sizeof *st->pooled);
    st->item_embed = calloc(n, sizeof *st->item_embed);
    st->item_pool = calloc(n, sizeof *st->item_pool);
    st->pass_pool = calloc(n, sizeof *st->pass_pool);
    st->emb_slots = calloc(n, sizeof *st->emb_slots);
    st->emb_out = calloc(n * (size_t)st->dim, sizeof *st->emb_out);
    return st->slot_of && st->used && st->items && st->tokens && st->logits && st->out_slots && st->cands &&
                   st->item_slot && st->item_acc && st->hit_slots && st->hits && st->pass && st->row_item &&
                   st->twin && st->pool_of && st->pooled && st->item_embed && st->item_pool &&
                   st->pass_pool && st->emb_slots && st->emb_out && st->item_verify && st->all
               ? 0
               : TP_ENOMEM;
}

static int make_forward(tp_forward_stage *st, tp_err *err)
{
    int rc = tp_forward_new(st->model, st->kv_slots, st->max_pos, st->max_batch_tokens, &st->fwd, err);
    if (!rc)
        rc = tp_forward_set_threads(st->fwd, st->threads ? st->threads : tp_forward_default_threads(), err);
    return rc;
}

int tp_forward_stage_new(const tp_model *model, int kv_slots, int max_pos, int max_batch_tokens, int threads,
                         tp_forward_stage **out, tp_err *err)
{
    tp_forward_stage *st = calloc(1, sizeof *st);
    if (!st)
        return tp_err_set(err, TP_ENOMEM, "forward stage: out of memory");
    st->model = model;
    st->kv_slots = kv_slots;
    st->max_pos = max_pos;
    st->max_batch_tokens = max_batch_tokens;
    st->threads = threads;
    st->vocab = tp_model_get_config(model)->vocab_size;
    st->dim = tp_model_get_config(model)->dim;
    /* a model whose file names no pooling: its last token's state, as
     * decoder embedding models (Qwen3-Embedding) pool */
    st->model_pool = tp_model_get_config(model)->pooling ? tp_model_get_config(model)->pooling : TP_POOL_LAST;
    int rc = make_forward(st, err);
    if (!rc && alloc_scratch(st))
        rc = tp_err_set(err, TP_ENOMEM, "forward stage: out of memory for %d sequences", kv_slots);
    if (rc) {
        tp_forward_stage_free(st);
        return rc;
    }
    *out = st;
    return 0;
}

void tp_forward_stage_free(tp_forward_stage *st)
{
    if (!st)
        return;
    tp_forward_free(st->fwd);
    free(st->slot_of);
    free(st->used);
    free(st->items);
    free(st->tokens);
    free(st->logits);
    free(st->out_slots);
    free(st->cands);
    free(st->item_slot);
    free(st->item_acc);
    free(st->hit_slots);
    free(st->hits);
    free(st->pass);
    free(st->row_item);
    free(st->twin);
    free(st->item_verify);
    free(st->all);
    free(st->vrows);
    free(st->obuf);
    free(st->pool_of);
    free(st->pooled);
    free(st->item_embed);
    free(st->item_pool);
    free(st->pass_pool);
    free(st->emb_slots);
    free(st->emb_out);
    free(st);
}

int tp_forward_stage_set_kv_type(tp_forward_stage *st, tp_kv_type t, tp_err *err)
{
    return tp_forward_set_kv_type(st->fwd, t, err);
}

int tp_forward_stage_set_prefix_cache(tp_forward_stage *st, bool on, int extra_pages, tp_err *err)
{
    return tp_forward_set_prefix_cache(st->fwd, on, extra_pages, err);
}

size_t tp_forward_stage_page_bytes(const tp_forward_stage *st)
{
    return tp_forward_page_bytes(st->fwd);
}

int tp_forward_stage_set_kernel(tp_forward_stage *st, tp_fwd_kernel k, tp_err *err)
{
    return tp_forward_set_kernel(st->fwd, k, err);
}

void tp_forward_stage_set_sampler(tp_forward_stage *st, tp_sample_stage *ss)
{
    st->sampler = ss;
}

int tp_forward_stage_kv_slots(const tp_forward_stage *st)
{
    return st->kv_slots;
}

int tp_forward_stage_max_positions(const tp_forward_stage *st)
{
    return tp_forward_max_positions(st->fwd);
}

int tp_forward_stage_max_batch_tokens(const tp_forward_stage *st)
{
    return tp_forward_max_batch_tokens(st->fwd);
}

void tp_forward_stage_reset(tp_forward_stage *st)
{
    for (int i = 0; i < st->kv_slots; i++)
        if (st->used[i]) {
            tp_forward_seq_close(st->fwd, i);
            st->used[i] = false;
        }
}

static int find_seq(const tp_forward_stage *st, uint32_t slot)
{
    for (int i = 0; i < st->kv_slots; i++)
        if (st->used[i] && st->slot_of[i] == slot)
            return i;
    return -1;
}

static int seq_open(tp_forward_stage *st, const tp_msg *m, const tp_stage_io *io)
{
    uint32_t slot = m->slot.slot;
    int old = find_seq(st, slot);
    if (old >= 0) {   /* a re-open restarts the sequence */
        tp_forward_seq_close(st->fwd, old);
        st->used[old] = false;
    }
    int seq;
    tp_err e;
    if (tp_forward_seq_open(st->fwd, &seq, &e))
        return tp_stage_result(io, m, TP_ST_OVERLOADED, e.msg);
    if (seq < 0 || seq >= st->kv_slots) {   /* tp_forward promises ids < kv_slots */
        tp_forward_seq_close(st->fwd, seq);
        return tp_stage_result(io, m, TP_ST_INTERNAL, "forward: sequence id outside the pool");
    }
    st->used[seq] = true;
    st->slot_of[seq] = slot;
    st->pool_of[seq] = m->slot.pool == TP_POOL_MODEL ? st->model_pool : (int)m->slot.pool;
    return tp_stage_result(io, m, TP_ST_OK, NULL);
}

static int seq_close(tp_forward_stage *st, const tp_msg *m, const tp_stage_io *io)
{
    int seq = find_seq(st, m->slot.slot);
    if (seq < 0)
        return tp_stage_result(io, m, TP_ST_NOT_FOUND, "SEQ_CLOSE: unknown slot");
    tp_forward_seq_close(st->fwd, seq);
    st->used[seq] = false;
    return tp_stage_result(io, m, TP_ST_OK, NULL);
}

static int step_error(const tp_msg *m, const tp_stage_io *io, uint32_t status, const char *error)
{
    tp_msg r;
    tp_msg_init_reply(&r, m, TP_CMD_STEP_RESULT, status, error);
    r.step_result.step = m->step.step;
    return io->reply(io->ctx, &r);
}

static bool is_chunk(const tp_fwd_item *it)
{
    return it->n_tokens > 1 || it->skip_logits;   /* decode items are 1 token with output */
}

/* Mean and CLS pooling read hidden states the cache does not keep: their
 * chunks are computed whole. */
static bool cacheable(const tp_fwd_pool *p)
{
    return p->pool != TP_POOL_MEAN && p->pool != TP_POOL_CLS;
}

/* Offer a prompt chunk to the cache: *it keeps what is left to compute
 * (its last token when it wants output or a last-token embedding). */
static void take_cached(tp_forward_stage *st, tp_fwd_item *it, const tp_fwd_pool *p, uint32_t slot)
{
    if (!cacheable(p))
        return;
    int got = tp_forward_seq_reuse(st->fwd, it->seq_id, it->pos, it->tokens, it->n_tokens,
                                   !it->skip_logits || p->pool == TP_POOL_LAST);
    if (got <= 0)
        return;
    st->hit_slots[st->n_hits] = (int32_t)slot;
    st->hits[st->n_hits++] = got;
    it->pos += got;
    it->tokens += got;
    it->n_tokens -= got;
}

/* Item b can wait for item a (earlier in the step): both chunks start at
 * the same position after the same cached pages with the same first page
 * of tokens, so a's pass caches what b needs. */
static bool twins(const tp_forward_stage *st, uint32_t ia, uint32_t ib)
{
    const tp_fwd_item *a = &st->items[ia], *b = &st->items[ib];
    return is_chunk(a) && is_chunk(b) && cacheable(&st->item_pool[ia]) && cacheable(&st->item_pool[ib]) &&
           a->pos == b->pos && a->n_tokens >= TP_KV_PAGE &&
           b->n_tokens >= TP_KV_PAGE && !memcmp(a->tokens, b->tokens, TP_KV_PAGE * sizeof *a->tokens) &&
           tp_forward_seq_same_pages(st->fwd, a->seq_id, b->seq_id, a->pos);
}

/* Run the step's items in one pass, or two when some wait for a twin
 * (above): rows of st->logits in pass order, row_item[] saying whose.
 * *n_rows: the rows. */
static int run_passes(tp_forward_stage *st, uint32_t n_items, uint32_t *n_rows, tp_err *e)
{
    uint32_t n = 0;
    size_t vr = 0;
    for (uint32_t i = 0; i < n_items; i++) {
        st->twin[i] = false;
        for (uint32_t k = 0; k < i && !st->twin[i] && !st->item_verify[i]; k++)
            st->twin[i] = !st->twin[k] && !st->item_verify[k] && twins(st, k, i);
        if (!st->twin[i]) {
            st->row_item[n] = i;
            vr += st->item_verify[i] ? (size_t)st->items[i].n_tokens : 0;
            st->pass_pool[n] = st->item_pool[i];
            st->pass[n++] = st->items[i];
        }
    }
    if (vr > st->vrows_cap) {
        float *p = realloc(st->vrows, vr * (size_t)st->vocab * sizeof *p);
        if (!p)
            return tp_err_set(e, TP_ENOMEM, "forward: out of memory for %zu verify rows", vr);
        st->vrows = p;
        st->vrows_cap = vr;
    }
    /* verify items (never twins: all in this pass) get their rows in vrows */
    vr = 0;
    for (uint32_t r = 0; r < n; r++) {
        st->all[r] = st->item_verify[st->row_item[r]] ? st->vrows + vr * (size_t)st->vocab : NULL;
        vr += st->all[r] ? (size_t)st->pass[r].n_tokens : 0;
    }
    int rc = tp_forward_step_full(st->fwd, st->pass, (int)n, st->logits, vr ? st->all : NULL, st->pass_pool, e);
    uint32_t first = n;
    for (uint32_t i = 0; i < n_items && !rc; i++) {
        if (!st->twin[i])
            continue;
        take_cached(st, &st->items[i], &st->item_pool[i], st->item_slot[i]);
        if (st->items[i].n_tokens == 0)
            continue;   /* wholly cached now, no output wanted */
        st->row_item[n] = i;
        st->pass_pool[n] = st->item_pool[i];
        st->pass[n++] = st->items[i];
    }
    if (!rc && n > first)
        rc = tp_forward_step_pooled(st->fwd, st->pass + first, (int)(n - first),
                                    st->logits + (size_t)first * (size_t)st->vocab, st->pass_pool + first, e);
    *n_rows = n;
    return rc;
}

/* Build the tp_fwd_item list from the STEP columns, prompt chunks trimmed
 * by what the prefix cache holds; *n_items: the items left. Slots and
 * counts are checked before any item is offered to the cache; a STEP that
 * tp_forward_step rejects later (a bad token id, say) may leave a sequence
 * longer by the cached positions it took, which hold exactly what
 * computing them would have. */
static int build_items(tp_forward_stage *st, const tp_m_step *s, uint32_t *n_items, char *why, size_t why_len)
{
    if (s->n > (uint32_t)st->kv_slots || s->n_tokens > (uint32_t)st->max_batch_tokens) {
        snprintf(why, why_len, "STEP: %u items / %u tokens exceed the pool (%d) or max_batch_tokens (%d)",
                 s->n, s->n_tokens, st->kv_slots, st->max_batch_tokens);
        return -1;
    }
    for (size_t i = 0; i < s->n_tokens; i++)
        st->tokens[i] = tp_raw_i32(s->tokens, i);
    size_t off = 0;
    for (uint32_t i = 0; i < s->n; i++) {
        uint32_t slot = tp_raw_u32(s->slots, i);
        int seq = find_seq(st, slot);
        if (seq < 0) {
            snprintf(why, why_len, "STEP item %u: slot %u is not open", i, slot);
            return -1;
        }
        uint32_t nt = tp_raw_u32(s->ntok, i);
        if (nt < 1 || nt > s->n_tokens - off) {
            snprintf(why, why_len, "STEP item %u: ntok %u outside 1..%zu (the tokens left)", i, nt, s->n_tokens - off);
            return -1;
        }
        st->items[i] = (tp_fwd_item){
            .seq_id = seq,
            .pos = (int)tp_raw_u32(s->pos, i),
            .tokens = st->tokens + off,
            .n_tokens = (int)nt,
            .skip_logits = !(tp_raw_u8(s->flags, i) & TP_ITEM_OUTPUT),
        };
        st->item_pool[i] = (tp_fwd_pool){st->pool_of[seq], st->pooled + (size_t)seq * (size_t)st->dim};
        st->item_embed[i] = (tp_raw_u8(s->flags, i) & TP_ITEM_EMBED) != 0;
        if (st->item_pool[i].pool != TP_POOL_NONE && st->items[i].pos == 0)   /* a (re)start: pool anew */
            memset(st->item_pool[i].pooled, 0, (size_t)st->dim * sizeof(float));
        st->item_slot[i] = slot;
        st->item_acc[i] = s->accepted.data ? tp_raw_i32(s->accepted, i) : -1;
        st->item_verify[i] = (tp_raw_u8(s->flags, i) & TP_ITEM_VERIFY) != 0;
        if (st->item_verify[i])
            st->items[i].skip_logits = false;
        /* only the invariant kernel verifies (its rows equal plain steps'),
         * and not on a hybrid model (its recurrent state cannot roll back);
         * else the job's own token alone: one candidate, no guess taken */
        if (st->item_verify[i] && (tp_forward_kernel(st->fwd) != TP_FWD_KERNEL_INVARIANT ||
                                   tp_model_get_config(st->model)->full_attn_interval > 0)) {
            st->item_verify[i] = false;
            st->items[i].n_tokens = 1;
        }
        off += nt;
    }
    for (uint32_t i = 0; i < s->n; i++)
        for (uint32_t k = 0; k < i; k++)
            if (st->items[k].seq_id == st->items[i].seq_id) {
                snprintf(why, why_len, "STEP item %u: slot %u appears twice", i, st->item_slot[i]);
                return -1;
            }
    st->n_hits = 0;
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->n; i++) {
        tp_fwd_item it = st->items[i];
        if (is_chunk(&it) && !st->item_verify[i])
            take_cached(st, &it, &st->item_pool[i], st->item_slot[i]);
        if (it.n_tokens == 0)
            continue;   /* wholly cached, and no output wanted */
        st->items[n] = it;
        st->item_slot[n] = st->item_slot[i];
        st->item_acc[n] = st->item_acc[i];
        st->item_verify[n] = st->item_verify[i];
        st->item_embed[n] = st->item_embed[i];
        st->item_pool[n] = st->item_pool[i];
        n++;
    }
    *n_items = n;
    return 0;
}

/* Room for n output rows: out_slots and cands, and obuf when rows (the
 * verify rows go there without a sampler in this process). */
static int grow_out(tp_forward_stage *st, size_t n, bool rows)
{
    if (n > st->out_cap) {
        uint32_t *sl = realloc(st->out_slots, n * sizeof *sl);
        if (sl)
            st->out_slots = sl;
        int32_t *c = realloc(st->cands, n * sizeof *c);
        if (c)
            st->cands = c;
        if (!sl || !c)
            return TP_ENOMEM;
        st->out_cap = n;
    }
    if (rows && n > st->obuf_cap) {
        float *o = realloc(st->obuf, n * (size_t)st->vocab * sizeof *o);
        if (!o)
            return TP_ENOMEM;
        st->obuf = o;
        st->obuf_cap = n;
    }
    return 0;
}

/* A verify item's output: its rows (to out), or with the sampler here the
 * chain of candidates: row t + 1 is sampled only while row t's candidate
 * equals the token the item fed after it, that candidate accepted first
 * (the rows past the first mismatch saw a context the job does not have). */
static void out_verify(tp_forward_stage *st, bool sample, const tp_fwd_item *it, const float *rows, uint32_t slot,
                       int32_t acc, float *out, uint32_t *n_out)
{
    size_t v = (size_t)st->vocab;
    if (!sample) {
        memcpy(out + (size_t)*n_out * v, rows, (size_t)it->n_tokens * v * sizeof *rows);
        for (int t = 0; t < it->n_tokens; t++)
            st->out_slots[(*n_out)++] = slot;
        return;
    }
    for (int t = 0; t < it->n_tokens; t++) {
        const float *row = rows + (size_t)t * v;
        int32_t *c = &st->cands[*n_out];
        tp_err e;
        if (tp_sample_stage_pick(st->sampler, slot, TP_SAMPLE_INDEX_TRACKED, acc, row, c, &e)) {
            fprintf(stderr, "forward: sample: %s\n", e.msg);
            *c = -1;
        }
        tp_sample_stage_lp_item(st->sampler, *n_out, slot, row, *c);
        st->out_slots[(*n_out)++] = slot;
        if (*c < 0 || t + 1 == it->n_tokens || *c != it->tokens[t + 1])
            return;
        acc = *c;
    }
}

/* EMBEDDED for the items that asked for their embedding (none: nothing
 * sent): the pooled vector, a mean divided by the positions it summed. */
static int send_embedded(tp_forward_stage *st, const tp_msg *m, uint32_t n_items, const tp_stage_io *io)
{
    uint32_t n = 0;
    size_t d = (size_t)st->dim;
    for (uint32_t i = 0; i < n_items; i++) {
        const tp_fwd_item *it = &st->items[i];
        const tp_fwd_pool *p = &st->item_pool[i];
        if (!st->item_embed[i] || p->pool == TP_POOL_NONE)
            continue;
        float *out = st->emb_out + (size_t)n * d;
        float div = p->pool == TP_POOL_MEAN ? (float)(it->pos + it->n_tokens) : 1.0f;
        for (size_t j = 0; j < d; j++)
            out[j] = p->pooled[j] / div;
        st->emb_slots[n++] = st->item_slot[i];
    }
    if (!n)
        return 0;
    tp_msg r;
    tp_msg_init_reply(&r, m, TP_CMD_EMBEDDED, TP_ST_OK, NULL);
    r.embedded.step = m->step.step;
    r.embedded.n = n;
    r.embedded.dim = (uint32_t)d;
    r.embedded.slots = (tp_raw){st->emb_slots, n};
    r.embedded.embd = (tp_raw){st->emb_out, n * d};
    return io->reply(io->ctx, &r);
}

static int step(tp_forward_stage *st, const tp_msg *m, const tp_stage_io *io)
{
    const tp_m_step *s = &m->step;
    char why[256];
    if (s->sample && !st->sampler)
        return step_error(m, io, TP_ST_BAD_REQUEST, "STEP: sample requested but this worker has no sample stage");
    uint32_t n_items = 0;
    if (build_items(st, s, &n_items, why, sizeof why))
        return step_error(m, io, TP_ST_BAD_REQUEST, why);
    tp_err e;
    tp_err_clear(&e);
    uint32_t n_rows = 0;
    if (run_passes(st, n_items, &n_rows, &e))
        return step_error(m, io, TP_ST_BAD_REQUEST, e.msg);
    /* Compact the output rows to the front (row r -> row n_out <= r), in
     * pass order; with verify items, every row goes to obuf instead (they
     * make more rows than items). */
    size_t v = (size_t)st->vocab, total = 0;
    bool verify = false;
    for (uint32_t r = 0; r < n_rows; r++) {
        uint32_t i = st->row_item[r];
        verify |= st->item_verify[i];
        total += st->items[i].skip_logits ? 0 : st->item_verify[i] ? (size_t)st->items[i].n_tokens : 1;
    }
    if (grow_out(st, total, verify && !s->sample))
        return step_error(m, io, TP_ST_INTERNAL, "STEP: out of memory for the verify rows");
    float *out = verify && !s->sample ? st->obuf : st->logits;
    uint32_t n_out = 0;
    if (s->sample && tp_sample_stage_lp_reset(st->sampler, (uint32_t)(total ? total : 1)))
        return step_error(m, io, TP_ST_INTERNAL, "STEP: out of memory for logprobs");
    for (uint32_t r = 0; r < n_rows; r++) {
        uint32_t i = st->row_item[r];
        if (st->items[i].skip_logits)
            continue;
        uint32_t slot = st->item_slot[i];
        if (st->item_verify[i]) {
            out_verify(st, s->sample, &st->pass[r], st->all[r], slot, st->item_acc[i], out, &n_out);
            continue;
        }
        float *row = st->logits + (size_t)r * v;
        if (s->sample) {
            int32_t acc = st->item_acc[i];
            /* a failed job gets candidate -1 (the stop stage finishes it
             * with an error); its batch mates go on */
            if (tp_sample_stage_pick(st->sampler, slot, TP_SAMPLE_INDEX_TRACKED, acc, row, &st->cands[n_out], &e)) {
                fprintf(stderr, "forward: sample: %s\n", e.msg);
                st->cands[n_out] = -1;
            }
            tp_sample_stage_lp_item(st->sampler, n_out, slot, row, st->cands[n_out]);
        } else if (out != st->logits || n_out != r) {
            memmove(out + (size_t)n_out * v, row, v * sizeof *row);
        }
        st->out_slots[n_out++] = slot;
    }
    if (send_embedded(st, m, n_items, io))
        return step_error(m, io, TP_ST_INTERNAL, "STEP: EMBEDDED not sent");
    tp_msg r;
    tp_msg_init_reply(&r, m, TP_CMD_STEP_RESULT, TP_ST_OK, NULL);
    r.step_result.step = s->step;
    r.step_result.n = n_out;
    r.step_result.sampled = s->sample;
    r.step_result.vocab = s->sample ? 0 : (uint32_t)st->vocab;
    r.step_result.slots = (tp_raw){st->out_slots, n_out};
    r.step_result.out = s->sample ? (tp_raw){st->cands, n_out} : (tp_raw){out, (size_t)n_out * v};
    if (s->sample)
        r.step_result.lp = tp_sample_stage_lp_cols(st->sampler, n_out);
    r.step_result.cached_slots = st->hit_slots;
    r.step_result.n_cached_slots = st->n_hits;
    r.step_result.cached = st->hits;
    r.step_result.n_cached = st->n_hits;
    uint64_t cache[TP_CACHE_COUNT] = {0};
    tp_fwd_prefix_stats ps;
    tp_forward_prefix_stats(st->fwd, &ps);
    tp_fwd_kv_stats ks;
    tp_forward_kv_stats(st->fwd, &ks);
    cache[TP_CACHE_KV_HELD] = ks.held_bytes;
    cache[TP_CACHE_KV_POOL] = ks.pool_bytes;
    r.step_result.cache = cache;
    r.step_result.n_cache = TP_CACHE_COUNT;
    if (ps.enabled) {
        cache[TP_CACHE_LOOKUPS] = ps.lookups;
        cache[TP_CACHE_HIT_TOKENS] = ps.hit_tokens;
        cache[TP_CACHE_PROMPT_TOKENS] = ps.prefill_tokens;
        cache[TP_CACHE_EVICTIONS] = ps.evictions;
        cache[TP_CACHE_PAGES_USED] = ps.pages_used;
        cache[TP_CACHE_PAGES_CACHED] = ps.pages_cached;
        cache[TP_CACHE_PAGES_TOTAL] = ps.pages_total;
        cache[TP_CACHE_PAGE_BYTES] = ps.page_bytes;
    }
    return io->reply(io->ctx, &r);
}

int tp_forward_stage_handle(tp_forward_stage *st, const tp_msg *m, const tp_stage_io *io)
{
    switch (m->cmd) {
    case TP_CMD_SEQ_OPEN:
        return seq_open(st, m, io);
    case TP_CMD_SEQ_CLOSE:
        return seq_close(st, m, io);
    case TP_CMD_STEP:
        return step(st, m, io);
    default:
        return TP_ENOTFOUND;
    }
}
