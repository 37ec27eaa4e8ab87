/* The logprobs a job's TOKEN events carried, kept for STATUS (a client
 * that could not subscribe first catches up on them too). Only jobs that
 * asked for logprobs have any; a job whose events skipped an index (a lost
 * stop worker's) keeps none, since the rows it missed cannot be rebuilt. */
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
