/* Logprobs of one choice (lp.h). */
#include "lp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/utf8.h"

void gw_lp_init(gw_lp *l, uint32_t top_n, int32_t prev0)
{
    memset(l, 0, sizeof *l);
    l->top_n = top_n;
    l->prev0 = prev0;
}

void gw_lp_free(gw_lp *l)
{
    if (!l)
        return;
    free(l->ids);
    free(l->lps);
    free(l->top_ids);
    free(l->top_lps);
    free(l->end);
    free(l->off);
    free(l->raw);
    memset(l, 0, sizeof *l);
}

static int grow(void **p, size_t cap, size_t size)
{
    void *q = realloc(*p, cap * size);
    if (!q)
        return -1;
    *p = q;
    return 0;
}

static int reserve(gw_lp *l, size_t more)
{
    if (l->n + more <= l->cap)
        return 0;
    size_t cap = l->cap ? l->cap : 16;
    while (cap < l->n + more)
        cap *= 2;
    size_t k = l->top_n ? l->top_n : 1;
    if (grow((void **)&l->ids, cap, sizeof *l->ids) || grow((void **)&l->lps, cap, sizeof *l->lps) ||
        grow((void **)&l->top_ids, cap * k, sizeof *l->top_ids) ||
        grow((void **)&l->top_lps, cap * k, sizeof *l->top_lps) || grow((void **)&l->end, cap, sizeof *l->end) ||
        grow((void **)&l->off, cap, sizeof *l->off))
        return -1;
    l->cap = cap;
    return 0;
}

static int add_raw(gw_lp *l, const uint8_t *b, size_t n)
{
    if (l->raw_len + n > l->raw_cap) {
        size_t cap = l->raw_cap ? l->raw_cap : 256;
        while (cap < l->raw_len + n)
            cap *= 2;
        if (grow((void **)&l->raw, cap, 1))
            return -1;
        l->raw_cap = cap;
    }
    if (n)
        memcpy(l->raw + l->raw_len, b, n);
    l->raw_len += n;
    return 0;
}

const uint8_t *gw_lp_bytes(const gw_lp *l, const tp_tokenizer *tok, size_t k, int32_t alt, size_t *len)
{
    *len = 0;
    int32_t prev = k ? l->ids[k - 1] : l->prev0;
    int32_t id = alt >= 0 ? alt : l->ids[k];
    if (!tok || id < 0)
        return NULL;
    const uint8_t *b = tp_tokenizer_token_bytes(tok, prev, id, len);
    if (!b)
        *len = 0;
    return b;
}

int gw_lp_add(gw_lp *l, const tp_tokenizer *tok, tp_raw ids, const tp_lp_cols *lp)
{
    if (reserve(l, ids.n))
        return -1;
    uint32_t k = l->top_n;
    bool have = lp && lp->logprobs.data;
    for (size_t i = 0; i < ids.n; i++) {
        size_t t = l->n;
        l->ids[t] = tp_raw_i32(ids, i);
        l->lps[t] = have && i < lp->logprobs.n ? tp_raw_f32(lp->logprobs, i) : NAN;
        for (uint32_t c = 0; c < k; c++) {
            /* the event's rows are top_n wide; ours are the job's top_n */
            size_t at = have ? i * lp->top_n + c : 0;
            bool in = have && c < lp->top_n && at < lp->top_ids.n && at < lp->top_logprobs.n;
            l->top_ids[t * k + c] = in ? tp_raw_i32(lp->top_ids, at) : -1;
            l->top_lps[t * k + c] = in ? tp_raw_f32(lp->top_logprobs, at) : -INFINITY;
        }
        l->n++;
        size_t len;
        const uint8_t *b = gw_lp_bytes(l, tok, t, -1, &len);
        if (add_raw(l, b, len)) {
            l->n--;
            return -1;
        }
        l->end[t] = l->raw_len;
    }
    return 0;
}

static size_t start_of(const gw_lp *l, size_t k)
{
    return k ? l->end[k - 1] : 0;
}

size_t gw_lp_release(gw_lp *l, size_t text_len, bool final, bool all)
{
    l->text_len += text_len;
    while (l->rw < l->raw_len) {
        size_t sub = 0, s, o;
        bool inc = false;
        size_t len = tp_utf8_seq(l->raw + l->rw, l->raw_len - l->rw, &sub, &inc);
        if (len) {
            s = o = len;
        } else if (inc && !final) {
            break;   /* the stop stage holds an unfinished character back */
        } else {
            s = sub ? sub : 1;
            o = 3;   /* U+FFFD */
        }
        if (l->ow + o > l->text_len)
            break;
        /* a token starting inside this character starts where it does */
        while (l->n_off < l->n && start_of(l, l->n_off) < l->rw + s)
            l->off[l->n_off++] = l->oc;
        l->rw += s;
        l->ow += o;
        l->oc++;
    }
    while (l->n_off < l->n && start_of(l, l->n_off) <= l->rw)
        l->off[l->n_off++] = l->oc;
    while (l->released < l->n_off && l->end[l->released] <= l->rw)
        l->released++;
    if (all) {
        while (l->n_off < l->n)
            l->off[l->n_off++] = l->oc;
        l->released = l->n;
    }
    return l->released;
}
