/* Draft stage glue: DRAFT / DRAFT_CLOSE -> tp_draft_propose on the draft
 * model's own tp_forward (tokpipe/draft.h).
 *
 * A job's sequence here is opened by its first DRAFT (pos 0: the broker
 * feeds the whole sequence to a draft worker new to the job) and closed by
 * DRAFT_CLOSE. An item the worker cannot serve (no room for another
 * sequence, a pos past what it holds: it lost the job) gets no guesses;
 * the broker then feeds the job from position 0 next time. Nothing here
 * matters to exactness: the guesses only change how many tokens a verify
 * step may keep. */
#include <stdlib.h>

#include "tokpipe/draft.h"
#include "tokpipe/spec.h"
#include "tokpipe/stage.h"

typedef struct dseq {
    tp_slot s;
    int seq;   /* its tp_forward sequence */
} dseq;

struct tp_draft_stage {
    tp_forward *fwd;
    tp_slots jobs;
    /* DRAFT scratch, grown to the largest message */
    tp_draft_item *items;
    int32_t *guesses, *out;
    int *ngot;
    uint32_t *ngot_col;
    size_t cap;
    int32_t *tokens;   /* the message's tokens, aligned (a frame's bytes need not be) */
    size_t tok_cap;
};

int tp_draft_stage_new(const tp_model *draft, int kv_slots, int max_pos, int max_batch_tokens, int threads,
                       tp_draft_stage **out, tp_err *err)
{
    *out = NULL;
    tp_draft_stage *st = calloc(1, sizeof *st);
    if (!st)
        return tp_err_set(err, TP_ENOMEM, "draft stage: out of memory");
    int rc = tp_forward_new(draft, kv_slots, max_pos, max_batch_tokens, &st->fwd, err);
    if (!rc && threads != 1)
        rc = tp_forward_set_threads(st->fwd, threads > 0 ? threads : tp_forward_default_threads(), err);
    if (!rc && tp_slots_init(&st->jobs, kv_slots, sizeof(dseq)))
        rc = tp_err_set(err, TP_ENOMEM, "draft stage: out of memory for %d jobs", kv_slots);
    if (rc) {
        tp_draft_stage_free(st);
        return rc;
    }
    *out = st;
    return 0;
}

int tp_draft_stage_kv_slots(const tp_draft_stage *st)
{
    return tp_forward_kv_slots(st->fwd);
}

int tp_draft_stage_max_positions(const tp_draft_stage *st)
{
    return tp_forward_max_positions(st->fwd);
}

static void drop(tp_draft_stage *st, dseq *d)
{
    tp_forward_seq_close(st->fwd, d->seq);
    d->s.used = false;
}

void tp_draft_stage_reset(tp_draft_stage *st)
{
    for (int i = 0; i < st->jobs.capacity; i++) {
        dseq *d = tp_slots_at(&st->jobs, i);
        if (d->s.used)
            drop(st, d);
    }
}

void tp_draft_stage_free(tp_draft_stage *st)
{
    if (!st)
        return;
    if (st->fwd && st->jobs.e)
        tp_draft_stage_reset(st);
    tp_forward_free(st->fwd);
    tp_slots_free(&st->jobs);
    free(st->items);
    free(st->guesses);
    free(st->out);
    free(st->ngot);
    free(st->ngot_col);
    free(st->tokens);
    free(st);
}

static int grow(tp_draft_stage *st, size_t n, size_t n_tokens)
{
    if (n_tokens > st->tok_cap) {
        int32_t *t = realloc(st->tokens, n_tokens * sizeof *t);
        if (!t)
            return TP_ENOMEM;
        st->tokens = t;
        st->tok_cap = n_tokens;
    }
    if (n <= st->cap)
        return 0;
    void *p[5] = {realloc(st->items, n * sizeof *st->items),
                  realloc(st->guesses, n * TP_SPEC_MAX_DRAFT * sizeof *st->guesses),
                  realloc(st->out, n * TP_SPEC_MAX_DRAFT * sizeof *st->out), realloc(st->ngot, n * sizeof *st->ngot),
                  realloc(st->ngot_col, n * sizeof *st->ngot_col)};
    /* realloc failure leaves the old block valid: keep whichever we got */
    if (p[0]) st->items = p[0];
    if (p[1]) st->guesses = p[1];
    if (p[2]) st->out = p[2];
    if (p[3]) st->ngot = p[3];
    if (p[4]) st->ngot_col = p[4];
    for (int i = 0; i < 5; i++)
        if (!p[i])
            return TP_ENOMEM;
    st->cap = n;
    return 0;
}

/* The sequence of slot for an item at pos: the job's, or a new one when
 * pos is 0 (a job new here, or fed again from the start); -1 when the
 * item cannot be served. */
static int seq_for(tp_draft_stage *st, uint32_t slot, uint32_t pos)
{
    dseq *d = tp_slots_find(&st->jobs, slot);
    if (d)
        return d->seq;
    bool reopen;
    if (pos != 0 || !(d = tp_slots_open(&st->jobs, slot, &reopen)))
        return -1;
    tp_err e;
    if (tp_forward_seq_open(st->fwd, &d->seq, &e))
        return -1;
    tp_slots_take(d, slot);
    return d->seq;
}

static int draft(tp_draft_stage *st, const tp_msg *m, const tp_stage_io *io)
{
    const tp_m_draft *q = &m->draft;
    tp_msg r;
    if (grow(st, q->n, q->n_tokens)) {
        tp_msg_init_reply(&r, m, TP_CMD_DRAFTED, TP_ST_INTERNAL, "draft: out of memory");
        return io->reply(io->ctx, &r);
    }
    for (size_t i = 0; i < q->n_tokens; i++)
        st->tokens[i] = tp_raw_i32(q->tokens, i);
    size_t at = 0;
    int n = 0;
    int *which = st->ngot;   /* (scratch until the call: the message item of each served one) */
    for (uint32_t i = 0; i < q->n; i++) {
        uint32_t nt = tp_raw_u32(q->ntok, i);
        int seq = seq_for(st, tp_raw_u32(q->slots, i), tp_raw_u32(q->pos, i));
        st->ngot_col[i] = 0;
        if (seq >= 0) {
            st->items[n] = (tp_draft_item){.seq_id = seq, .pos = (int)tp_raw_u32(q->pos, i),
                                           .tokens = st->tokens + at, .n_tokens = (int)nt,
                                           .k = (int)tp_raw_u32(q->k, i)};
            which[n++] = (int)i;
        }
        at += nt;
    }
    /* the served items' message indexes, before tp_draft_propose writes ngot */
    for (int s = 0; s < n; s++)
        st->ngot_col[which[s]] = (uint32_t)s + 1;
    tp_err e;
    int rc = tp_draft_propose(st->fwd, st->items, n, st->guesses, st->ngot, &e);
    if (rc) {
        tp_msg_init_reply(&r, m, TP_CMD_DRAFTED, TP_ST_INTERNAL, e.msg);
        return io->reply(io->ctx, &r);
    }
    size_t g = 0;
    for (uint32_t i = 0; i < q->n; i++) {
        int s = (int)st->ngot_col[i] - 1;
        st->ngot_col[i] = s >= 0 ? (uint32_t)st->ngot[s] : 0;
        for (int t = 0; s >= 0 && t < st->ngot[s]; t++)
            st->out[g++] = st->guesses[(size_t)s * TP_SPEC_MAX_DRAFT + t];
    }
    tp_msg_init_reply(&r, m, TP_CMD_DRAFTED, TP_ST_OK, NULL);
    r.drafted.n = q->n;
    r.drafted.slots = q->slots;
    r.drafted.ngot = (tp_raw){st->ngot_col, q->n};
    r.drafted.guesses = (tp_raw){st->out, g};
    return io->reply(io->ctx, &r);
}

static int draft_close(tp_draft_stage *st, const tp_msg *m, const tp_stage_io *io)
{
    dseq *d = tp_slots_find(&st->jobs, m->slot.slot);
    if (!d)
        return tp_stage_result(io, m, TP_ST_NOT_FOUND, "DRAFT_CLOSE: unknown slot");
    drop(st, d);
    return tp_stage_result(io, m, TP_ST_OK, NULL);
}

int tp_draft_stage_handle(tp_draft_stage *st, const tp_msg *m, const tp_stage_io *io)
{
    switch (m->cmd) {
    case TP_CMD_DRAFT:
        return draft(st, m, io);
    case TP_CMD_DRAFT_CLOSE:
        return draft_close(st, m, io);
    default:
        return TP_ENOTFOUND;
    }
}
