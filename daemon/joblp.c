/* The logprobs a job's TOKEN events carried, kept for STATUS (a client
 * that could not subscribe first catches up on them too). Only jobs that
 * asked for logprobs have any; a job whose events skipped an index (a lost
 * stop worker's) keeps none, since the rows it missed cannot be rebuilt.
 *
 * And the rows the sampler sent with each candidate, by candidate index:
 * a candidate whose verdict a lost stop worker owed goes to the next one
 * with its row (pin_stop_resend), so the TOKEN event it becomes carries the
 * logprobs an undisturbed run's does. The sampler that computed them may be
 * gone too, and a replaying one draws the candidate without them. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "jobs.h"

struct joblp {
    uint32_t top_n;
    size_t n, cap;       /* rows */
    bool broken;         /* an event skipped an index: STATUS shows none */
    float *lp, *top;
    int32_t *ids;
};

struct jobclp {          /* candidate rows: index i = cands[i]; NaN logprob = none came */
    uint32_t top_n;
    size_t n, cap;
    float *lp, *top;
    int32_t *ids;
};

void joblp_free(bjob *j)
{
    if (!j->lp)
        return;
    free(j->lp->lp);
    free(j->lp->top);
    free(j->lp->ids);
    free(j->lp);
    j->lp = NULL;
}

void joblp_cand_free(bjob *j)
{
    if (!j->clp)
        return;
    free(j->clp->lp);
    free(j->clp->top);
    free(j->clp->ids);
    free(j->clp);
    j->clp = NULL;
}

static bool grow(struct joblp *l, size_t need)
{
    if (need <= l->cap)
        return true;
    size_t cap = need * 2 + 16, cells = cap * l->top_n > 0 ? cap * l->top_n : 1;
    float *lp = realloc(l->lp, cap * sizeof *lp);
    if (lp)
        l->lp = lp;
    float *top = realloc(l->top, cells * sizeof *top);
    if (top)
        l->top = top;
    int32_t *ids = realloc(l->ids, cells * sizeof *ids);
    if (ids)
        l->ids = ids;
    if (!lp || !top || !ids)
        return false;
    l->cap = cap;
    return true;
}

void joblp_on_token(bjob *j, const tp_m_token *t)
{
    if (!t->lp.logprobs.data)
        return;
    if (!j->lp) {
        if (!(j->lp = calloc(1, sizeof *j->lp)))
            return;
        j->lp->top_n = t->lp.top_n;
    }
    struct joblp *l = j->lp;
    if (l->broken)
        return;
    if (t->index < l->n)
        l->n = t->index;   /* a rebuilt stop worker publishes from where it was */
    if (t->index > l->n || t->lp.top_n != l->top_n || !grow(l, l->n + t->ids.n)) {
        l->broken = true;
        return;
    }
    size_t w = l->top_n;
    for (size_t i = 0; i < t->ids.n; i++, l->n++) {
        l->lp[l->n] = tp_raw_f32(t->lp.logprobs, i);
        for (size_t c = 0; c < w; c++) {
            l->ids[l->n * w + c] = tp_raw_i32(t->lp.top_ids, i * w + c);
            l->top[l->n * w + c] = tp_raw_f32(t->lp.top_logprobs, i * w + c);
        }
    }
}

tp_lp_cols joblp_status(const bjob *j, size_t n_tokens)
{
    const struct joblp *l = j->lp;
    if (!l && !n_tokens && j->params.logprobs) {
        /* no token yet: empty columns, so top_n is there all the same */
        static const float none[1];
        uint32_t k = (uint32_t)j->params.top_logprobs;
        return (tp_lp_cols){k, {none, 0}, {none, 0}, {none, 0}};
    }
    if (!l || l->broken || l->n < n_tokens)
        return (tp_lp_cols){0};
    size_t w = l->top_n;
    return (tp_lp_cols){l->top_n, {l->lp, n_tokens}, {l->ids, n_tokens * w}, {l->top, n_tokens * w}};
}

void joblp_on_candidate(bjob *j, uint32_t index, const tp_lp_cols *lp, size_t row)
{
    if (!j->params.logprobs || !lp || !lp->logprobs.data || row >= lp->logprobs.n)
        return;
    if (!j->clp && !(j->clp = calloc(1, sizeof *j->clp)))
        return;
    struct jobclp *c = j->clp;
    if (!c->cap)
        c->top_n = lp->top_n;
    if (lp->top_n != c->top_n)
        return;
    size_t w = c->top_n;
    if (index >= c->cap) {
        size_t cap = (size_t)index * 2 + 16, cells = cap * w > 0 ? cap * w : 1;
        float *l = realloc(c->lp, cap * sizeof *l);
        if (l)
            c->lp = l;
        float *top = realloc(c->top, cells * sizeof *top);
        if (top)
            c->top = top;
        int32_t *ids = realloc(c->ids, cells * sizeof *ids);
        if (ids)
            c->ids = ids;
        if (!l || !top || !ids)
            return;
        c->cap = cap;
    }
    for (; c->n < index; c->n++)   /* rows that never came (out of memory): none */
        c->lp[c->n] = NAN;
    c->lp[index] = tp_raw_f32(lp->logprobs, row);
    for (size_t k = 0; k < w; k++) {
        c->ids[index * w + k] = tp_raw_i32(lp->top_ids, row * w + k);
        c->top[index * w + k] = tp_raw_f32(lp->top_logprobs, row * w + k);
    }
    if (c->n <= index)
        c->n = (size_t)index + 1;
}

tp_lp_cols joblp_candidates(const bjob *j, uint32_t from, uint32_t to)
{
    const struct jobclp *c = j->clp;
    if (!c || to > c->n || from >= to)
        return (tp_lp_cols){0};
    size_t w = c->top_n, n = to - from;
    return (tp_lp_cols){c->top_n, {c->lp + from, n}, {c->ids + from * w, n * w}, {c->top + from * w, n * w}};
}
