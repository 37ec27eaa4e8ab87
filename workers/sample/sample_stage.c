/* Sample stage glue: SAMPLE_OPEN / SAMPLE / SAMPLE_CLOSE -> tp_sampler.
 *
 * The broker tells the stage which candidate was accepted since the slot's
 * last sample (the `accepted` column); the stage feeds it to the sampler
 * (penalty window, random stream) before drawing the next candidate. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokpipe/glazy.h"
#include "tokpipe/grammar.h"
#include "tokpipe/rand.h"
#include "tokpipe/sampler.h"
#include "tokpipe/stage.h"

#define GCACHE_MAX 32   /* grammars a worker keeps compiled; an unused one goes for a new one */

typedef struct sample_job {
    tp_slot at;            /* first: the stage's slot table (stage.h) */
    tp_sampler *s;
    int top_n;             /* alternatives per logprob; -1: the job did not ask for logprobs */
    tp_logprobs_mode lp_mode;
    tp_gmatch *gm;         /* the job's grammar position, or NULL */
    tp_glazy *lazy;        /* params.grammar_trigger: gm applies from the trigger on */
} sample_job;

#define LP_STRIDE TP_PROTO_MAX_TOP_LOGPROBS

struct tp_sample_stage {
    int vocab;
    const int *eos;
    int n_eos;
    tp_slots jobs;         /* of sample_job */
    float *row;            /* aligned copy of an unaligned logits row */
    uint32_t *o_slots;
    int32_t *o_cands;
    size_t o_cap;
    /* logprob columns: rows of LP_STRIDE while filling, compacted to
     * lp_top_n by lp_cols */
    float *lp, *lp_top;
    int32_t *lp_ids;
    tp_logprob *lp_tmp;
    size_t lp_cap;
    bool lp_any;
    uint32_t lp_top_n;
    /* grammars: the tokenizer (borrowed), its byte index built on the first
     * constrained job, the engines, the masked row of the last pick */
    tp_gcache *gc;
    uint64_t *gmask;
    float *mrow;
    int64_t mrow_slot;     /* slot whose masked row mrow holds, -1 none */
};

int tp_sample_stage_new(int capacity, int vocab_size, const int *eos_ids, int n_eos, tp_sample_stage **out,
                        tp_err *err)
{
    tp_sample_stage *st = calloc(1, sizeof *st);
    if (st && !tp_slots_init(&st->jobs, capacity, sizeof(sample_job)))
        st->row = malloc((size_t)vocab_size * sizeof *st->row);
    if (!st || !st->row) {
        tp_sample_stage_free(st);
        return tp_err_set(err, TP_ENOMEM, "sample stage: out of memory");
    }
    st->vocab = vocab_size;
    st->eos = eos_ids;
    st->n_eos = n_eos;
    st->mrow_slot = -1;
    tp_sample_stage_set_grammar(st, NULL, NULL, NULL);
    if (!st->gc) {
        tp_sample_stage_free(st);
        return tp_err_set(err, TP_ENOMEM, "sample stage: out of memory");
    }
    *out = st;
    return 0;
}

void tp_sample_stage_set_grammar(tp_sample_stage *st, const tp_tokenizer *tok, const tp_grammar_limits *gl,
                                 const tp_gengine_limits *el)
{
    tp_gcache *c = NULL;
    if (tp_gcache_new(tok, st->eos, st->n_eos, gl, el, GCACHE_MAX, &c, NULL))
        return;   /* out of memory: the old cache stays */
    tp_gcache_free(st->gc);
    st->gc = c;
}

static void job_drop(tp_sample_stage *st, sample_job *j)
{
    tp_sampler_free(j->s);
    tp_glazy_free(j->lazy);
    tp_gcache_release(st->gc, j->gm);
    memset(j, 0, sizeof *j);
}

void tp_sample_stage_reset(tp_sample_stage *st)
{
    for (int i = 0; i < st->jobs.capacity; i++) {
        sample_job *j = tp_slots_at(&st->jobs, i);
        if (j->at.used)
            job_drop(st, j);
    }
}

void tp_sample_stage_free(tp_sample_stage *st)
{
    if (!st)
        return;
    tp_sample_stage_reset(st);
    tp_slots_free(&st->jobs);
    free(st->row);
    free(st->o_slots);
    free(st->o_cands);
    free(st->lp);
    free(st->lp_top);
    free(st->lp_ids);
    free(st->lp_tmp);
    tp_gcache_free(st->gc);
    free(st->gmask);
    free(st->mrow);
    free(st);
}

static sample_job *find_job(tp_sample_stage *st, uint32_t slot) { return tp_slots_find(&st->jobs, slot); }

static int open_sampler(tp_sample_stage *st, const tp_m_sample_open *o, tp_sampler **out, tp_err *e)
{
    const tp_params *p = &o->params;
    tp_sampler_params sp = tp_sampler_params_default();
    if (p->set & TP_P_TEMPERATURE) sp.temperature = (float)p->temperature;
    if (p->set & TP_P_TOP_K) sp.top_k = p->top_k;
    if (p->set & TP_P_TOP_P) sp.top_p = (float)p->top_p;
    if (p->set & TP_P_MIN_P) sp.min_p = (float)p->min_p;
    if (p->set & TP_P_REPETITION_PENALTY) sp.repetition_penalty = (float)p->repetition_penalty;
    if (p->set & TP_P_PRESENCE_PENALTY) sp.presence_penalty = (float)p->presence_penalty;
    if (p->set & TP_P_FREQUENCY_PENALTY) sp.frequency_penalty = (float)p->frequency_penalty;
    if (p->set & TP_P_PENALTY_WINDOW) sp.penalty_window = p->penalty_window;
    if (p->set & TP_P_MIN_TOKENS) sp.min_tokens = p->min_tokens;
    if (p->set & TP_P_TYPICAL_P) sp.typical_p = (float)p->typical_p;
    sp.bias_ids = p->logit_bias.ids;
    sp.bias_values = p->logit_bias.values;
    sp.n_bias = p->logit_bias.n;
    /* the broker always sends a seed (it reports it to the producer); a
     * bare SAMPLE_OPEN without one still gets a random stream */
    sp.seed = (p->set & TP_P_SEED) ? p->seed : tp_random_u64();
    /* banned below min_tokens: the broker's list, plus every EOS id of the
     * model unless EOS is an ordinary token for this job */
    size_t nb = o->n_ban_ids + (size_t)st->n_eos;
    int32_t *ban = malloc((nb ? nb : 1) * sizeof *ban);
    if (!ban)
        return tp_err_set(e, TP_ENOMEM, "sample: out of memory");
    size_t k = 0;
    for (size_t i = 0; i < o->n_ban_ids; i++)
        ban[k++] = o->ban_ids[i];
    for (int i = 0; !p->ignore_eos && i < st->n_eos; i++)
        ban[k++] = st->eos[i];
    sp.ban_ids = ban;
    sp.n_ban = k;
    int32_t *ctx = malloc((o->context.n ? o->context.n : 1) * sizeof *ctx);
    if (!ctx) {
        free(ban);
        return tp_err_set(e, TP_ENOMEM, "sample: out of memory");
    }
    tp_raw_copy(ctx, o->context, 4);
    int rc = tp_sampler_new(&sp, st->vocab, ctx, o->context.n, out, e);
    free(ban);
    free(ctx);
    /* Rebuild after a lost sampler: accept the job's tokens so far, so the
     * penalty window and the random stream stand where they stood. */
    for (size_t i = 0; !rc && i < o->replay.n; i++)
        if ((rc = tp_sampler_accept(*out, tp_raw_i32(o->replay, i), e))) {
            tp_sampler_free(*out);
            *out = NULL;
        }
    return rc;
}

static int accept_grammar(sample_job *j, int32_t token, tp_err *e)
{
    return j->lazy ? tp_glazy_accept(j->lazy, token, e) : tp_gmatch_accept(j->gm, token, e);
}

/* The matcher that masks this step: a lazy grammar's only once triggered. */
static tp_gmatch *masking(const sample_job *j)
{
    return j->lazy ? tp_glazy_active(j->lazy) : j->gm;
}

/* The job's grammar, and its position rebuilt from the tokens accepted so
 * far (a lost sampler's state, as the penalty window is). */
static int open_grammar(tp_sample_stage *st, sample_job *j, const tp_m_sample_open *o, tp_err *e)
{
    int rc = tp_gcache_matcher(st->gc, o->params.gbnf.ptr, o->params.gbnf.len, &j->gm, e);
    if (rc)
        return rc;
    if (tp_gcache_vocab_size(st->gc) != st->vocab)
        return tp_err_set(e, TP_EINVAL, "params.gbnf: the tokenizer has %d tokens, the model %d",
                          tp_gcache_vocab_size(st->gc), st->vocab);
    if (!st->gmask) {
        st->gmask = malloc(tp_gmask_words(st->vocab) * sizeof *st->gmask);
        st->mrow = malloc((size_t)st->vocab * sizeof *st->mrow);
        if (!st->gmask || !st->mrow)
            return tp_err_set(e, TP_ENOMEM, "sample: out of memory");
    }
    const tp_str *t = &o->params.grammar_trigger;
    if (t->ptr && (rc = tp_glazy_new(j->gm, t->ptr, t->len, &j->lazy, e)))
        return rc;
    for (size_t i = 0; i < o->replay.n; i++)
        if ((rc = accept_grammar(j, tp_raw_i32(o->replay, i), e)))
            return rc;
    return 0;
}

static int sample_open(tp_sample_stage *st, const tp_msg *m, const tp_stage_io *io)
{
    const tp_m_sample_open *o = &m->sample_open;
    bool reopen;
    sample_job *j = tp_slots_open(&st->jobs, o->slot, &reopen);
    if (reopen)
        job_drop(st, j);
    if (!j)
        return tp_stage_result(io, m, TP_ST_OVERLOADED, "sample: no room for another job");
    tp_err e;
    tp_err_clear(&e);
    if (open_sampler(st, o, &j->s, &e))
        return tp_stage_result(io, m, TP_ST_BAD_REQUEST, e.msg);
    if ((o->params.set & TP_P_GBNF) && open_grammar(st, j, o, &e)) {
        job_drop(st, j);
        return tp_stage_result(io, m, TP_ST_BAD_REQUEST, e.msg);
    }
    tp_slots_take(j, o->slot);
    j->top_n = o->params.logprobs ? o->params.top_logprobs : -1;
    j->lp_mode = tp_params_lpmode(&o->params) == TP_LPMODE_PROCESSED ? TP_LOGPROBS_PROCESSED : TP_LOGPROBS_RAW;
    return tp_stage_result(io, m, TP_ST_OK, NULL);
}

static int sample_close(tp_sample_stage *st, const tp_msg *m, const tp_stage_io *io)
{
    sample_job *j = find_job(st, m->slot.slot);
    if (!j)
        return tp_stage_result(io, m, TP_ST_NOT_FOUND, "SAMPLE_CLOSE: unknown slot");
    job_drop(st, j);
    return tp_stage_result(io, m, TP_ST_OK, NULL);
}

int tp_sample_stage_pick(tp_sample_stage *st, uint32_t slot, uint32_t index, int32_t accepted,
                         const float *logits, int32_t *candidate, tp_err *err)
{
    sample_job *j = find_job(st, slot);
    if (!j)
        return tp_err_set(err, TP_ENOTFOUND, "sample: slot %u is not open", slot);
    int rc;
    if (accepted >= 0 && (rc = tp_sampler_accept(j->s, accepted, err)))
        return rc;
    if (accepted >= 0 && j->gm && (rc = accept_grammar(j, accepted, err)))
        return rc;
    if (index != TP_SAMPLE_INDEX_TRACKED && index != tp_sampler_n_accepted(j->s))
        return tp_err_set(err, TP_ESTATE, "sample: slot %u: index %u but %zu tokens were accepted", slot, index,
                          tp_sampler_n_accepted(j->s));
    st->mrow_slot = -1;
    tp_gmatch *gm = masking(j);
    if (gm) {
        /* the mask goes in before every selection step, so the draw is
         * from the constrained distribution itself */
        if ((rc = tp_gmatch_mask(gm, st->gmask, err)))
            return rc;
        tp_grammar_apply_mask(st->gmask, logits, st->mrow, st->vocab);
        st->mrow_slot = slot;
        return tp_sampler_sample(j->s, st->mrow, candidate, err);
    }
    return tp_sampler_sample(j->s, logits, candidate, err);
}

static int grow_out(tp_sample_stage *st, size_t n)
{
    if (n <= st->o_cap)
        return 0;
    uint32_t *s = realloc(st->o_slots, n * sizeof *s);
    if (s)
        st->o_slots = s;
    int32_t *c = realloc(st->o_cands, n * sizeof *c);
    if (c)
        st->o_cands = c;
    if (!s || !c)
        return TP_ENOMEM;
    st->o_cap = n;
    return 0;
}

int tp_sample_stage_lp_reset(tp_sample_stage *st, uint32_t n)
{
    st->lp_any = false;
    st->lp_top_n = 0;
    if (n <= st->lp_cap)
        return 0;
    float *lp = realloc(st->lp, n * sizeof *lp);
    if (lp)
        st->lp = lp;
    float *top = realloc(st->lp_top, (size_t)n * LP_STRIDE * sizeof *top);
    if (top)
        st->lp_top = top;
    int32_t *ids = realloc(st->lp_ids, (size_t)n * LP_STRIDE * sizeof *ids);
    if (ids)
        st->lp_ids = ids;
    if (!st->lp_tmp)
        st->lp_tmp = malloc(LP_STRIDE * sizeof *st->lp_tmp);
    if (!lp || !top || !ids || !st->lp_tmp)
        return TP_ENOMEM;
    st->lp_cap = n;
    return 0;
}

void tp_sample_stage_lp_item(tp_sample_stage *st, uint32_t i, uint32_t slot, const float *logits, int32_t cand)
{
    sample_job *j = find_job(st, slot);
    if (i >= st->lp_cap)
        return;
    st->lp[i] = NAN;
    for (int k = 0; k < LP_STRIDE; k++)
        st->lp_ids[(size_t)i * LP_STRIDE + k] = -1, st->lp_top[(size_t)i * LP_STRIDE + k] = -INFINITY;
    if (!j || j->top_n < 0 || cand < 0)
        return;
    st->lp_any = true;
    if ((uint32_t)j->top_n > st->lp_top_n)
        st->lp_top_n = (uint32_t)j->top_n;
    /* processed logprobs are those of the constrained distribution */
    if (j->gm && j->lp_mode == TP_LOGPROBS_PROCESSED && st->mrow_slot == (int64_t)slot)
        logits = st->mrow;
    size_t n = 0;
    tp_err e;
    if (tp_sampler_logprobs(j->s, logits, j->lp_mode, cand, (size_t)j->top_n, &st->lp[i], st->lp_tmp, &n, &e)) {
        fprintf(stderr, "sample: logprobs: %s\n", e.msg);
        return;
    }
    for (size_t k = 0; k < n; k++) {
        st->lp_ids[(size_t)i * LP_STRIDE + k] = st->lp_tmp[k].id;
        st->lp_top[(size_t)i * LP_STRIDE + k] = st->lp_tmp[k].logprob;
    }
}

tp_lp_cols tp_sample_stage_lp_cols(tp_sample_stage *st, uint32_t n)
{
    if (!st->lp_any || n > st->lp_cap)
        return (tp_lp_cols){0};
    uint32_t k = st->lp_top_n;
    /* rows of LP_STRIDE -> rows of k, moving down in place */
    for (size_t i = 0; i < n; i++) {
        memmove(st->lp_ids + i * k, st->lp_ids + i * LP_STRIDE, k * sizeof *st->lp_ids);
        memmove(st->lp_top + i * k, st->lp_top + i * LP_STRIDE, k * sizeof *st->lp_top);
    }
    return (tp_lp_cols){k, {st->lp, n}, {st->lp_ids, (size_t)n * k}, {st->lp_top, (size_t)n * k}};
}

static int sample(tp_sample_stage *st, const tp_msg *m, const tp_stage_io *io)
{
    const tp_m_sample *s = &m->sample;
    tp_msg r;
    tp_msg_init_reply(&r, m, TP_CMD_SAMPLED, TP_ST_OK, NULL);
    r.sampled.step = s->step;
    tp_err e;
    tp_err_clear(&e);
    if (s->vocab != (uint32_t)st->vocab) {
        snprintf(e.msg, sizeof e.msg, "SAMPLE: vocab %u, the model has %d", s->vocab, st->vocab);
        r.status = TP_ST_BAD_REQUEST;
        r.error = tp_str_of(e.msg);
        return io->reply(io->ctx, &r);
    }
    if (grow_out(st, s->n ? s->n : 1) || tp_sample_stage_lp_reset(st, s->n ? s->n : 1))
        return TP_ENOMEM;
    size_t v = (size_t)st->vocab;
    uint32_t n_out = 0;
    bool chain_broken = false;
    for (uint32_t i = 0; i < s->n; i++) {
        /* a verify item's rows (guess: speculative decoding) are a chain:
         * row i follows row i - 1 of the same slot only while that row's
         * candidate equalled its guess, accepted first; the rest of the
         * chain is skipped */
        uint32_t slot = tp_raw_u32(s->slots, i);
        bool chained = s->guess.data && i > 0 && tp_raw_u32(s->slots, i - 1) == slot &&
                       tp_raw_i32(s->guess, i - 1) >= 0;
        if (chained && (n_out == 0 || st->o_slots[n_out - 1] != slot || chain_broken))
            continue;
        chain_broken = false;
        const char *src = (const char *)s->logits.data + (size_t)i * v * sizeof(float);
        const float *row = (const float *)(const void *)src;
        if ((uintptr_t)src % _Alignof(float)) {
            memcpy(st->row, src, v * sizeof(float));
            row = st->row;
        }
        st->o_slots[n_out] = slot;
        uint32_t index = chained ? TP_SAMPLE_INDEX_TRACKED : tp_raw_u32(s->index, i);
        int32_t acc = chained ? st->o_cands[n_out - 1] : tp_raw_i32(s->accepted, i);
        /* one job's failure must not fail its batch mates: candidate -1
         * makes the stop stage finish that job with an error */
        if (tp_sample_stage_pick(st, slot, index, acc, row, &st->o_cands[n_out], &e)) {
            fprintf(stderr, "sample: %s\n", e.msg);
            st->o_cands[n_out] = -1;
        }
        tp_sample_stage_lp_item(st, n_out, slot, row, st->o_cands[n_out]);
        int32_t g = s->guess.data ? tp_raw_i32(s->guess, i) : -1;
        chain_broken = g < 0 || st->o_cands[n_out] != g;
        n_out++;
    }
    r.sampled.lp = tp_sample_stage_lp_cols(st, n_out);
    r.sampled.n = n_out;
    r.sampled.slots = (tp_raw){st->o_slots, n_out};
    r.sampled.candidates = (tp_raw){st->o_cands, n_out};
    return io->reply(io->ctx, &r);
}

int tp_sample_stage_handle(tp_sample_stage *st, const tp_msg *m, const tp_stage_io *io)
{
    switch (m->cmd) {
    case TP_CMD_SAMPLE_OPEN:
        return sample_open(st, m, io);
    case TP_CMD_SAMPLE_CLOSE:
        return sample_close(st, m, io);
    case TP_CMD_SAMPLE:
        return sample(st, m, io);
    default:
        return TP_ENOTFOUND;
    }
}
