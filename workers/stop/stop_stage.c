/* Stop stage glue: STOP_OPEN / STOP_STEP / STOP_CLOSE -> tp_detok + tp_stop,
 * publishing each job's TOKEN and FINISH events before the step's VERDICTS
 * go back to the broker. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/detok.h"
#include "tokpipe/grammar.h"
#include "tokpipe/stage.h"
#include "tokpipe/stop.h"
#include "tokpipe/toolcall.h"
#include "tokpipe/rand.h"
#include "tokpipe/zwire.h"

typedef struct stop_job {
    tp_slot at;               /* first: the stage's slot table (stage.h) */
    char job_id[TP_PROTO_MAX_JOB_ID + 1];
    tp_stop *stop;
    tp_detok *detok;
    uint32_t seq;             /* next event seq */
    uint64_t pin;             /* from STOP_OPEN, in every event */
    uint32_t prompt_tokens;
    uint32_t draft_tokens, draft_accepted; /* speculative decoding's counts (STOP_STEP), for FINISH */
    uint64_t t_submit_us, t_start_us, t_first_us;
    int top_n;                /* logprob alternatives in TOKEN events; -1: no logprobs */
    bool has_seed;
    uint64_t seed;            /* reported in FINISH */
    uint32_t context_length;  /* nonzero: max_tokens was lowered to fit this context */
    tp_gmatch *gm;            /* the job's grammar position, or NULL */
    tp_tcsplit *split;        /* params.parse_tool_calls / parse_reasoning: content, thinking, calls */
    uint64_t content_len;     /* bytes of content published (FINISH text_len) */
    bool deltas;              /* the splitter's last feed released call deltas not yet published */
} stop_job;

/* One candidate's logprob row from STOP_STEP (stride = the message's top_n). */
typedef struct lp_row {
    bool present;
    float logprob;
    const tp_lp_cols *cols;
    size_t item;
} lp_row;

struct tp_stop_stage {
    const tp_tokenizer *tok;
    const int *eos;
    int n_eos;
    tp_stop_stage_limits lim;
    tp_tc_syntax syntax;       /* the model's tool-call syntax (family none: calls stay text) */
    tp_slots jobs;             /* lim.capacity stop_jobs */
    uint32_t *v_slots;         /* VERDICTS columns */
    uint8_t *v_acc, *v_fin;
    size_t v_cap;
    tp_gcache *gc;             /* grammars: FINISH says whether the output is complete */
};

int tp_stop_stage_new(const tp_tokenizer *tok, const int *eos_ids, int n_eos, const tp_stop_stage_limits *lim,
                      tp_stop_stage **out, tp_err *err)
{
    tp_stop_stage *st = calloc(1, sizeof *st);
    if (!st || tp_slots_init(&st->jobs, lim->capacity, sizeof(stop_job))) {
        free(st);
        return tp_err_set(err, TP_ENOMEM, "stop stage: out of memory");
    }
    st->tok = tok;
    st->eos = eos_ids;
    st->n_eos = n_eos;
    st->lim = *lim;
    int rc = tp_gcache_new(tok, eos_ids, n_eos, NULL, NULL, 32, &st->gc, err);
    if (rc) {
        tp_stop_stage_free(st);
        return rc;
    }
    *out = st;
    return 0;
}

void tp_stop_stage_set_grammar_limits(tp_stop_stage *st, const tp_grammar_limits *gl, const tp_gengine_limits *el)
{
    tp_gcache *c = NULL;
    if (tp_gcache_new(st->tok, st->eos, st->n_eos, gl, el, 32, &c, NULL))
        return;
    tp_gcache_free(st->gc);
    st->gc = c;
}

void tp_stop_stage_set_syntax(tp_stop_stage *st, const tp_tc_syntax *syn)
{
    st->syntax = *syn;
}

static void job_free(tp_stop_stage *st, stop_job *j)
{
    tp_gcache_release(st->gc, j->gm);
    tp_tcsplit_free(j->split);
    tp_stop_free(j->stop);
    tp_detok_free(j->detok);
    memset(j, 0, sizeof *j);
}

void tp_stop_stage_reset(tp_stop_stage *st)
{
    for (int i = 0; i < st->jobs.capacity; i++) {
        stop_job *j = tp_slots_at(&st->jobs, i);
        if (j->at.used)
            job_free(st, j);
    }
}

void tp_stop_stage_free(tp_stop_stage *st)
{
    if (!st)
        return;
    tp_stop_stage_reset(st);
    tp_gcache_free(st->gc);
    tp_slots_free(&st->jobs);
    free(st->v_slots);
    free(st->v_acc);
    free(st->v_fin);
    free(st);
}

static stop_job *find_job(tp_stop_stage *st, uint32_t slot) { return tp_slots_find(&st->jobs, slot); }

/* ---- events ---------------------------------------------------------------- */

/* The splitter's call deltas of this step as TOKEN tool_calls (id and name
 * in each, arguments the fragment). */
static size_t call_deltas(stop_job *j, tp_tool_call *out)
{
    const tp_tc_delta *d;
    size_t n = j->split && j->deltas ? tp_tcsplit_deltas(j->split, &d) : 0;
    j->deltas = false;
    size_t k = 0;
    for (size_t i = 0; i < n && k < TP_PROTO_MAX_TOOL_CALLS; i++)
        out[k++] = (tp_tool_call){tp_str_of(d[i].id), tp_str_of(d[i].name), {d[i].arguments, d[i].arguments_len}};
    return k;
}

static int publish_token(stop_job *j, int32_t id, const char *text, size_t len, const char *rs, size_t rlen,
                         const lp_row *lp, const tp_stage_io *io)
{
    tp_msg ev;
    tp_tool_call calls[TP_PROTO_MAX_TOOL_CALLS];
    float lpv = NAN;
    int32_t ids[TP_PROTO_MAX_TOP_LOGPROBS];
    float lps[TP_PROTO_MAX_TOP_LOGPROBS];
    uint32_t k = j->top_n > 0 ? (uint32_t)j->top_n : 0;
    tp_msg_init(&ev, TP_FAM_EVT, TP_CMD_TOKEN);
    ev.token.job_id = tp_str_of(j->job_id);
    ev.token.seq = j->seq++;
    ev.token.index = (uint32_t)tp_stop_completion_tokens(j->stop) - 1;
    ev.token.text = (tp_str){text, len};
    if (rlen)
        ev.token.reasoning = (tp_str){rs, rlen};
    if ((ev.token.n_tool_calls = call_deltas(j, calls)))
        ev.token.tool_calls = calls;
    j->content_len += len;
    ev.token.ids = (tp_raw){&id, 1};
    ev.token.pin = j->pin;
    if (j->top_n >= 0) {
        /* the job asked: a row that did not come (a sampler that lost it)
         * reads NaN / id -1, so the frames still line up with the ids */
        for (uint32_t c = 0; c < k; c++) {
            bool have = lp->present && c < lp->cols->top_n;
            size_t at = lp->item * lp->cols->top_n + c;
            ids[c] = have ? tp_raw_i32(lp->cols->top_ids, at) : -1;
            lps[c] = have ? tp_raw_f32(lp->cols->top_logprobs, at) : -INFINITY;
        }
        lpv = lp->present ? lp->logprob : NAN;
        ev.token.lp = (tp_lp_cols){k, {&lpv, 1}, {ids, k}, {lps, k}};
    }
    return io->publish(io->ctx, &ev);
}

/* last: the job's last accepted token when this step accepted it (its
 * marker, if a control token, ends the splitter's text), else -1 */
static int publish_finish(stop_job *j, const tp_stop_step *s, int32_t last, const char *text, size_t len,
                          const char *error, const tp_stage_io *io)
{
    tp_msg ev;
    tp_msg_init(&ev, TP_FAM_EVT, TP_CMD_FINISH);
    tp_m_finish *f = &ev.finish;
    f->job_id = tp_str_of(j->job_id);
    f->seq = j->seq++;
    f->pin = j->pin;
    f->reason = (int)s->finish;   /* tp_finish_reason and TP_REASON_* share numbers */
    if (s->matched_str)
        f->matched = (tp_matched){.kind = TP_MATCHED_STR, .str = {s->matched_str, s->matched_len}};
    else if (s->matched_id >= 0)
        f->matched = (tp_matched){.kind = TP_MATCHED_ID, .id = s->matched_id};
    tp_tool_call calls[TP_PROTO_MAX_TOOL_CALLS];
    if (j->split) {
        /* what the splitter held: call text parsed, the rest is content */
        const char *rs;
        size_t rlen;
        if (tp_tcsplit_finish_token(j->split, last, text, len, &text, &len, &rs, &rlen))
            return TP_ENOMEM;
        const tp_tc_call *tc;
        size_t n = tp_tcsplit_calls(j->split, &tc);
        for (size_t i = 0; i < n && i < TP_PROTO_MAX_TOOL_CALLS; i++)
            calls[i] = (tp_tool_call){tp_str_of(tc[i].id), tp_str_of(tc[i].name), {tc[i].arguments, tc[i].arguments_len}};
        f->tool_calls = calls;
        f->n_tool_calls = n < TP_PROTO_MAX_TOOL_CALLS ? n : TP_PROTO_MAX_TOOL_CALLS;
        f->tool_calls_cut = n && !tp_tcsplit_calls_whole(j->split);
        const char *all = tp_tcsplit_reasoning(j->split, &rlen);
        if (rlen)
            f->reasoning_content = (tp_str){all, rlen > TP_PROTO_MAX_TEXT ? TP_PROTO_MAX_TEXT : rlen};
    }
    f->text = (tp_str){text, len};
    f->job_error = tp_str_of(error);
    f->prompt_tokens = j->prompt_tokens;
    f->draft_tokens = j->draft_tokens;
    f->draft_accepted = j->draft_accepted;
    f->completion_tokens = (uint32_t)tp_stop_completion_tokens(j->stop);
    size_t total;
    tp_stop_text(j->stop, &total);
    /* split: the content alone (what TOKEN and FINISH texts carry) */
    f->text_len = j->split ? j->content_len + len : total;
    uint64_t now = tp_wall_us();
    f->timings.queue_us = j->t_start_us > j->t_submit_us ? j->t_start_us - j->t_submit_us : 0;
    f->timings.ttft_us = j->t_first_us > j->t_submit_us ? j->t_first_us - j->t_submit_us : 0;
    f->timings.total_us = now > j->t_submit_us ? now - j->t_submit_us : 0;
    if (j->has_seed)
        f->set |= TP_ACK_SEED, f->seed = j->seed;
    if (j->gm) {
        /* complete: the final text (after any stop cut) is a whole sentence */
        f->set |= TP_FIN_GRAMMAR;
        f->grammar_complete = tp_gmatch_complete(j->gm, (const uint8_t *)tp_stop_text(j->stop, &total), total,
                                                 f->reason == TP_REASON_STOP_STRING);
        if (f->reason == TP_REASON_EOS && tp_gmatch_accepting(j->gm))
            f->detail = tp_str_of("grammar");
    }
    if (f->reason == TP_REASON_LENGTH) {
        /* say which limit ended it: the context, or the producer's max_tokens */
        bool ctx = j->context_length && j->prompt_tokens + f->completion_tokens >= j->context_length;
        f->detail = tp_str_of(ctx ? "context" : "max_tokens");
        f->context_length = ctx ? j->context_length : 0;
    }
    return io->publish(io->ctx, &ev);
}

/* ---- STOP_OPEN --------------------------------------------------------------- */

/* Calls' ids differ per job but not per worker: a stop worker rebuilt
 * after a loss replays the job and must name the calls it streamed as the
 * lost one did (job id, submission time and seed are the job's own). */
static uint64_t call_id_seed(const tp_m_stop_open *o)
{
    uint64_t h = 1469598103934665603ull;   /* FNV-1a */
    for (size_t i = 0; i < o->job_id.len; i++)
        h = (h ^ (unsigned char)o->job_id.ptr[i]) * 1099511628211ull;
    return h ^ o->t_submit_us ^ (o->params.seed * 0x9E3779B97F4A7C15ull);
}

static int open_job(tp_stop_stage *st, const tp_m_stop_open *o, stop_job *j, tp_err *e)
{
    const tp_params *p = &o->params;
    size_t ns = p->n_stop;
    const char **strs = calloc(ns ? ns : 1, sizeof *strs);
    size_t *lens = calloc(ns ? ns : 1, sizeof *lens);
    if (!strs || !lens) {
        free(strs);
        free(lens);
        return tp_err_set(e, TP_ENOMEM, "stop: out of memory");
    }
    for (size_t i = 0; i < ns; i++) {
        strs[i] = p->stop[i].ptr;
        lens[i] = p->stop[i].len;
    }
    /* a stop string naming a control token stops on that token too */
    int32_t *ids = malloc((p->n_stop_token_ids + ns + 1) * sizeof *ids);
    if (!ids) {
        free(strs);
        free(lens);
        return tp_err_set(e, TP_ENOMEM, "stop: out of memory");
    }
    if (p->n_stop_token_ids)
        memcpy(ids, p->stop_token_ids, p->n_stop_token_ids * sizeof *ids);
    size_t n_ids = p->n_stop_token_ids + tp_detok_control_stops(st->tok, strs, lens, ns, ids + p->n_stop_token_ids);
    tp_stop_config c = {
        .stop = strs, .stop_len = lens, .n_stop = ns,
        .stop_ids = ids, .n_stop_ids = n_ids,
        .eos_ids = (const int32_t *)st->eos, .n_eos_ids = (size_t)st->n_eos,
        .ignore_eos = p->ignore_eos,
        .min_tokens = (p->set & TP_P_MIN_TOKENS) ? p->min_tokens : 0,
        .max_tokens = (p->set & TP_P_MAX_TOKENS) ? p->max_tokens : TP_STOP_NO_LIMIT,
        .include_stop_str_in_output = p->include_stop_str_in_output,
        .vocab_size = tp_tokenizer_vocab_size(st->tok),
        .max_stop_strings = (size_t)st->lim.max_stop_strings,
        .max_stop_len = (size_t)st->lim.max_stop_len,
    };
    int rc = tp_stop_new(&c, &j->stop, e);
    free(strs);
    free(lens);
    free(ids);
    if (rc)
        return rc;
    int32_t prev = o->prev_token >= 0 ? o->prev_token : tp_tokenizer_bos_id(st->tok);
    if ((rc = tp_detok_new(st->tok, prev, &j->detok, e)))
        return rc;
    /* a lazy grammar (tool_choice auto) is the sampler's alone: the output
     * before its trigger is no sentence of it */
    if ((p->set & TP_P_GBNF) && !p->grammar_trigger.ptr &&
        (rc = tp_gcache_matcher(st->gc, p->gbnf.ptr, p->gbnf.len, &j->gm, e)))
        return rc;
    if (p->parse_tool_calls || p->parse_reasoning) {
        tp_tcsplit_opts so = {
            .tools = p->parse_tool_calls, .reasoning = p->parse_reasoning,
            .parallel = !(p->set & TP_P_PARALLEL_TOOL_CALLS) || p->parallel_tool_calls,
            .id_seed = call_id_seed(o),
        };
        if ((rc = tp_tcsplit_new(&st->syntax, &so, &j->split, e)))
            return rc;
        tp_tcsplit_controls(j->split, st->tok);
    }
    /* Rebuild after a lost stop worker: replay accepted tokens silently. */
    for (size_t i = 0; i < o->replay.n; i++) {
        int32_t id = tp_raw_i32(o->replay, i);
        size_t n;
        const uint8_t *b = tp_detok_bytes(j->detok, id, &n, e);
        tp_stop_step s;
        if (!b || tp_stop_feed(j->stop, id, b, n, &s))
            return tp_err_set(e, TP_EINVAL, "replay[%zu]: token %d cannot be replayed", i, id);
        if (s.accepted && (rc = tp_detok_accept(j->detok, id, e)))
            return rc;
        if (s.accepted && j->gm)
            tp_gmatch_accept(j->gm, id, NULL);
        if (j->split) {
            /* the splitter's state is rebuilt too; what it publishes was
             * published by the lost worker */
            const char *c, *r;
            size_t cn, rn;
            if ((rc = tp_tcsplit_feed_token(j->split, s.accepted ? id : -1, s.chunk, s.chunk_len,
                                            tp_stop_held_bytes(j->stop), &c, &cn, &r, &rn)))
                return tp_err_set(e, rc, "stop: out of memory");
            j->content_len += cn;
        }
    }
    return 0;
}

static int stop_open(tp_stop_stage *st, const tp_msg *m, const tp_stage_io *io)
{
    const tp_m_stop_open *o = &m->stop_open;
    bool reopen;
    stop_job *j = tp_slots_open(&st->jobs, o->slot, &reopen);
    if (reopen)
        job_free(st, j);   /* a re-open replaces the job */
    if (!j)
        return tp_stage_result(io, m, TP_ST_OVERLOADED, "stop: no room for another job");
    if (o->job_id.len > TP_PROTO_MAX_JOB_ID)
        return tp_stage_result(io, m, TP_ST_BAD_REQUEST, "job_id: too long");
    tp_err e;
    tp_err_clear(&e);
    if (open_job(st, o, j, &e)) {
        job_free(st, j);
        return tp_stage_result(io, m, TP_ST_BAD_REQUEST, e.msg);
    }
    tp_slots_take(j, o->slot);
    memcpy(j->job_id, o->job_id.ptr, o->job_id.len);
    j->job_id[o->job_id.len] = '\0';
    j->seq = o->next_seq;
    j->pin = o->pin;
    j->prompt_tokens = o->prompt_tokens;
    j->t_submit_us = o->t_submit_us;
    j->t_start_us = o->t_start_us;
    j->top_n = o->params.logprobs ? o->params.top_logprobs : -1;
    j->has_seed = (o->params.set & TP_P_SEED) != 0;
    j->seed = o->params.seed;
    j->context_length = o->context_length;
    return tp_stage_result(io, m, TP_ST_OK, NULL);
}

/* ---- STOP_STEP --------------------------------------------------------------- */

static int grow_verdicts(tp_stop_stage *st, size_t n)
{
    if (n <= st->v_cap)
        return 0;
    uint32_t *s = realloc(st->v_slots, n * sizeof *s);
    if (s)
        st->v_slots = s;
    uint8_t *a = realloc(st->v_acc, n);
    if (a)
        st->v_acc = a;
    uint8_t *f = realloc(st->v_fin, n);
    if (f)
        st->v_fin = f;
    if (!s || !a || !f)
        return TP_ENOMEM;
    st->v_cap = n;
    return 0;
}

/* Decide one candidate of job j and publish what it releases. */
static int feed_one(stop_job *j, int32_t cand, const lp_row *lp, uint8_t *acc, uint8_t *fin, const tp_stage_io *io)
{
    tp_err e;
    size_t n;
    tp_stop_step s;
    const uint8_t *b = tp_detok_bytes(j->detok, cand, &n, &e);
    int rc = b ? tp_stop_feed(j->stop, cand, b, n, &s) : tp_stop_fail(j->stop, &s);
    if (rc) {
        *acc = 0;
        *fin = TP_REASON_ERROR;
        return 0;
    }
    *acc = s.accepted;
    *fin = (uint8_t)s.finish;
    if (s.accepted) {
        tp_detok_accept(j->detok, cand, &e);
        if (!j->t_first_us)
            j->t_first_us = tp_wall_us();
        if (j->gm)
            tp_gmatch_accept(j->gm, cand, NULL);
        const char *text = s.chunk, *rs = "";
        size_t len = s.chunk_len, rlen = 0;
        if (j->split && s.finish == TP_FINISH_NONE) {
            if ((rc = tp_tcsplit_feed_token(j->split, cand, s.chunk, s.chunk_len, tp_stop_held_bytes(j->stop), &text,
                                            &len, &rs, &rlen)))
                return rc;
            j->deltas = true;
        }
        if (j->split && s.finish != TP_FINISH_NONE) {
            /* the last chunk goes to FINISH, which ends the splitter */
            if ((rc = publish_token(j, cand, "", 0, "", 0, lp, io)))
                return rc;
            return publish_finish(j, &s, cand, s.chunk, s.chunk_len, NULL, io);
        }
        if ((rc = publish_token(j, cand, text, len, rs, rlen, lp, io)))
            return rc;
        if (s.finish != TP_FINISH_NONE)
            return publish_finish(j, &s, -1, "", 0, NULL, io);
        /* a position with no continuation ends the job: stopping here is
         * what the grammar says, not a step that could only take EOS */
        tp_stop_step end;
        if (j->gm && tp_gmatch_done(j->gm) && !tp_stop_end(j->stop, &end)) {
            *fin = (uint8_t)end.finish;
            return publish_finish(j, &end, -1, end.chunk, end.chunk_len, NULL, io);
        }
        return 0;
    }
    if (s.finish != TP_FINISH_NONE)
        return publish_finish(j, &s, -1, s.chunk, s.chunk_len, b ? NULL : e.msg, io);
    return 0;
}

static int stop_step(tp_stop_stage *st, const tp_msg *m, const tp_stage_io *io)
{
    const tp_m_stop_step *s = &m->stop_step;
    if (grow_verdicts(st, s->n ? s->n : 1))
        return TP_ENOMEM;
    for (uint32_t i = 0; i < s->n; i++) {
        uint32_t slot = tp_raw_u32(s->slots, i);
        st->v_slots[i] = slot;
        stop_job *j = find_job(st, slot);
        if (!j || tp_stop_finish_reason(j->stop) != TP_FINISH_NONE) {
            st->v_acc[i] = 0;
            st->v_fin[i] = TP_REASON_ERROR;
            continue;
        }
        if (s->n_draft_tokens == s->n && s->n_draft_accepted == s->n)
            j->draft_tokens = (uint32_t)s->draft_tokens[i], j->draft_accepted = (uint32_t)s->draft_accepted[i];
        lp_row lp = {s->lp.logprobs.data != NULL, 0.0f, &s->lp, i};
        if (lp.present)
            lp.logprob = tp_raw_f32(s->lp.logprobs, i);
        int rc = feed_one(j, tp_raw_i32(s->candidates, i), &lp, &st->v_acc[i], &st->v_fin[i], io);
        if (rc)
            return rc;
    }
    tp_msg r;
    tp_msg_init_reply(&r, m, TP_CMD_VERDICTS, TP_ST_OK, NULL);
    r.verdicts.step = s->step;
    r.verdicts.n = s->n;
    r.verdicts.slots = (tp_raw){st->v_slots, s->n};
    r.verdicts.accepted = (tp_raw){st->v_acc, s->n};
    r.verdicts.finish = (tp_raw){st->v_fin, s->n};
    return io->reply(io->ctx, &r);
}

/* ---- STOP_CLOSE -------------------------------------------------------------- */

static int stop_close(tp_stop_stage *st, const tp_msg *m, const tp_stage_io *io)
{
    const tp_m_stop_close *c = &m->stop_close;
    stop_job *j = find_job(st, c->slot);
    if (!j)
        return tp_stage_result(io, m, TP_ST_NOT_FOUND, "STOP_CLOSE: unknown slot");
    int rc = 0;
    if ((c->finish == TP_REASON_CANCELLED || c->finish == TP_REASON_ERROR) &&
        tp_stop_finish_reason(j->stop) == TP_FINISH_NONE) {
        tp_stop_step s;
        int frc = c->finish == TP_REASON_CANCELLED ? tp_stop_cancel(j->stop, &s) : tp_stop_fail(j->stop, &s);
        char err[TP_PROTO_MAX_ERROR + 1];
        size_t el = c->job_error.len < TP_PROTO_MAX_ERROR ? c->job_error.len : TP_PROTO_MAX_ERROR;
        memcpy(err, c->job_error.ptr ? c->job_error.ptr : "", el);
        err[el] = '\0';
        if (!frc)
            rc = publish_finish(j, &s, -1, s.chunk, s.chunk_len, c->finish == TP_REASON_ERROR ? err : NULL, io);
    }
    job_free(st, j);
    return rc ? rc : tp_stage_result(io, m, TP_ST_OK, NULL);
}

int tp_stop_stage_handle(tp_stop_stage *st, const tp_msg *m, const tp_stage_io *io)
{
    switch (m->cmd) {
    case TP_CMD_STOP_OPEN:
        return stop_open(st, m, io);
    case TP_CMD_STOP_STEP:
        return stop_step(st, m, io);
    case TP_CMD_STOP_CLOSE:
        return stop_close(st, m, io);
    default:
        return TP_ENOTFOUND;
    }
}
