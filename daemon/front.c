/* Producer requests on the frontend ROUTER: SUBMIT, CANCEL, STATUS, STATS.
 * Every request gets exactly one reply; a malformed one gets ERROR with the
 * decoder's status and message and is counted. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "front.h"
#include "guess.h"
#include "admit.h"
#include "info.h"
#include "metrics.h"
#include "outbox.h"
#include "pin.h"
#include "registry.h"
#include "sched.h"
#include "standby.h"
#include "grammar_admit.h"
#include "tokpipe/rand.h"
#include "tokpipe/stop.h"
#include "tokpipe/zwire.h"

typedef struct reply_to {
    tp_frame env[2];    /* identity (+ the empty delimiter of a REQ peer) */
    size_t n_env;
} reply_to;

static void reply(broker *b, const reply_to *to, tp_msg *m)
{
    out_reply(b, to->env, to->n_env, m);
}

static void ack(broker *b, const reply_to *to, uint64_t req, uint32_t status, const char *job_id, const char *field,
                const char *fmt, ...) __attribute__((format(printf, 7, 8)));

static void ack(broker *b, const reply_to *to, uint64_t req, uint32_t status, const char *job_id, const char *field,
                const char *fmt, ...)
{
    char msg[TP_PROTO_MAX_ERROR];
    msg[0] = '\0';
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
    }
    tp_msg m;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_ACK);
    m.req = req;
    m.status = status;
    m.error = tp_str_of(msg[0] ? msg : NULL);
    m.ack.job_id = tp_str_of(job_id);
    m.ack.field = tp_str_of(field && field[0] ? field : NULL);   /* "": no field at fault, none named */
    if (status != TP_ST_OK && m.error.len == 0)
        m.error = tp_str_of("rejected");
    reply(b, to, &m);
}

/* ---- SUBMIT ------------------------------------------------------------------ */

/* Fill keys the producer left out from the configured defaults. */
static void apply_defaults(const tp_config *c, tp_params *p)
{
    if (!(p->set & TP_P_MAX_TOKENS))
        p->max_tokens = c->def_max_tokens;
    if (!(p->set & TP_P_MIN_TOKENS))
        p->min_tokens = 0;
    if (!(p->set & TP_P_TEMPERATURE))
        p->temperature = c->def_temperature;
    if (!(p->set & TP_P_TOP_P))
        p->top_p = c->def_top_p;
    if (!(p->set & TP_P_TOP_K))
        p->top_k = c->def_top_k;
    if (!(p->set & TP_P_MIN_P))
        p->min_p = c->def_min_p;
    if (!(p->set & TP_P_REPETITION_PENALTY))
        p->repetition_penalty = c->def_repetition_penalty;
    if (!(p->set & TP_P_PRESENCE_PENALTY))
        p->presence_penalty = c->def_presence_penalty;
    if (!(p->set & TP_P_FREQUENCY_PENALTY))
        p->frequency_penalty = c->def_frequency_penalty;
    if (!(p->set & TP_P_PENALTY_WINDOW))
        p->penalty_window = c->def_penalty_window;
    p->set |= TP_P_MAX_TOKENS | TP_P_MIN_TOKENS | TP_P_TEMPERATURE | TP_P_TOP_P | TP_P_TOP_K | TP_P_MIN_P |
              TP_P_REPETITION_PENALTY | TP_P_PRESENCE_PENALTY | TP_P_FREQUENCY_PENALTY | TP_P_PENALTY_WINDOW;
}

typedef struct verdict {
    uint32_t status;
    char field[64];
    char msg[TP_PROTO_MAX_ERROR];
    const char *code;          /* TP_CODE_* or NULL */
    uint32_t prompt_tokens, context_length;   /* with TP_CODE_CONTEXT */
} verdict;

static bool bad(verdict *v, uint32_t status, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static bool bad(verdict *v, uint32_t status, const char *field, const char *fmt, ...)
{
    v->status = status;
    snprintf(v->field, sizeof v->field, "%s", field);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->msg, sizeof v->msg, fmt, ap);
    va_end(ap);
    return false;
}

/* The broker's limits and the stop stage's own validation (tp_stop_new
 * names the field exactly as the stop worker would). */
static bool check_params(broker *b, const tp_params *p, uint32_t vocab, verdict *v)
{
    const tp_config *c = b->cfg;
    if (p->max_tokens > c->max_tokens_limit)
        return bad(v, TP_ST_BAD_REQUEST, "params.max_tokens", "params.max_tokens: %d exceeds the limit %d",
                   p->max_tokens, c->max_tokens_limit);
    if (p->penalty_window > c->max_penalty_window)
        return bad(v, TP_ST_BAD_REQUEST, "params.penalty_window",
                   "params.penalty_window: %d exceeds the limit %d", p->penalty_window, c->max_penalty_window);
    if (p->min_tokens > p->max_tokens)
        return bad(v, TP_ST_BAD_REQUEST, "params.min_tokens", "params.min_tokens: %d > max_tokens %d",
                   p->min_tokens, p->max_tokens);
    if (guess_mode(c, p) == TP_SPEC_DRAFT && !*c->spec_draft_model)
        return bad(v, TP_ST_BAD_REQUEST, "params.speculative.mode",
                   "params.speculative.mode: draft needs a draft model and none is configured "
                   "(speculative.draft_model)");
    /* the limit counts distinct strings: copies of one match as one */
    if (p->n_stop > (size_t)c->max_stop_strings) {
        const char **ss = calloc(p->n_stop, sizeof *ss);
        size_t *ls = calloc(p->n_stop, sizeof *ls);
        for (size_t i = 0; ss && ls && i < p->n_stop; i++)
            ss[i] = p->stop[i].ptr, ls[i] = p->stop[i].len;
        size_t distinct = ss && ls ? tp_stop_count_distinct(ss, ls, p->n_stop) : SIZE_MAX;
        free(ss);
        free(ls);
        if (distinct == SIZE_MAX)
            return bad(v, TP_ST_INTERNAL, "", "broker out of memory");
        if (distinct > (size_t)c->max_stop_strings)
            return bad(v, TP_ST_TOO_LARGE, "params.stop", "params.stop: %zu distinct strings, the limit is %d",
                       distinct, c->max_stop_strings);
    }
    for (size_t i = 0; i < p->n_stop; i++)
        if (p->stop[i].len > (size_t)c->max_stop_len) {
            char f[40];
            snprintf(f, sizeof f, "params.stop[%zu]", i);
            return bad(v, TP_ST_TOO_LARGE, f, "%s: %zu bytes, the limit is %d", f, p->stop[i].len, c->max_stop_len);
        }
    for (size_t i = 0; i < p->logit_bias.n; i++)
        if ((uint32_t)p->logit_bias.ids[i] >= vocab) {
            char f[48];
            snprintf(f, sizeof f, "params.logit_bias.%d", (int)p->logit_bias.ids[i]);
            return bad(v, TP_ST_BAD_REQUEST, f, "%s: token id outside the vocabulary [0, %u)", f, vocab);
        }
    if (p->n_stop_token_ids > (size_t)c->max_stop_ids)
        return bad(v, TP_ST_TOO_LARGE, "params.stop_token_ids", "params.stop_token_ids: %zu ids, the limit is %d",
                   p->n_stop_token_ids, c->max_stop_ids);
    const char **strs = calloc(p->n_stop + 1, sizeof *strs);
    size_t *lens = calloc(p->n_stop + 1, sizeof *lens);
    if (!strs || !lens) {
        free(strs);
        free(lens);
        return bad(v, TP_ST_INTERNAL, "", "broker out of memory");
    }
    for (size_t i = 0; i < p->n_stop; i++) {
        strs[i] = p->stop[i].ptr;
        lens[i] = p->stop[i].len;
    }
    tp_stop_config sc = {
        .stop = strs, .stop_len = lens, .n_stop = p->n_stop,
        .stop_ids = p->stop_token_ids, .n_stop_ids = p->n_stop_token_ids,
        .min_tokens = p->min_tokens, .max_tokens = p->max_tokens,
        .include_stop_str_in_output = p->include_stop_str_in_output, .vocab_size = (int32_t)vocab,
        .max_stop_strings = (size_t)c->max_stop_strings, .max_stop_len = (size_t)c->max_stop_len,
    };
    tp_stop *st = NULL;
    tp_err e;
    tp_err_clear(&e);
    int rc = tp_stop_new(&sc, &st, &e);
    tp_stop_free(st);
    free(strs);
    free(lens);
    if (rc) {
        /* tp_stop names fields like "stop_token_ids[0]: ..." */
        char f[64];
        snprintf(f, sizeof f, "params.%.*s", (int)strcspn(e.msg, ":"), e.msg);
        return bad(v, TP_ST_BAD_REQUEST, f, "params.%s", e.msg);
    }
    return true;
}

static bool check_workers(broker *b, bool text, verdict *v)
{
    unsigned need[] = {TP_STAGE_FORWARD, TP_STAGE_STOP, TP_STAGE_SAMPLE, TP_STAGE_TOKENIZE};
    unsigned bit = 0;
    for (size_t i = 0; i < (text ? 4u : 3u) && !bit; i++)
        if (!registry_count(b, need[i]))
            bit = need[i];
    const char *missing = bit ? tp_stage_name(bit) : NULL;
    if (missing && (b->stages_failed & bit))
        return bad(v, TP_ST_UNAVAILABLE, "",
                   "no %s worker: the ones tokpiped starts fail at start (bad model or configuration; "
                   "tokpiped's log says why) and are no longer restarted", missing);
    if (missing)
        return bad(v, TP_ST_UNAVAILABLE, "", "no %s worker is registered yet; retry later", missing);
    return true;
}

static bool check_submit(broker *b, const tp_m_submit *s, verdict *v)
{
    if (b->draining)
        return bad(v, TP_ST_UNAVAILABLE, "", "the broker is shutting down");
    if (!check_workers(b, (s->prompt.ptr != NULL) || s->n_messages, v))
        return false;
    if (s->job_id.len && jobs_find(&b->jt, s->job_id.ptr, s->job_id.len))
        return bad(v, TP_ST_CONFLICT, "job_id", "job_id: '%.*s' is already in use", (int)s->job_id.len, s->job_id.ptr);
    if (b->jt.n_active >= b->cfg->max_concurrent_jobs)
        return bad(v, TP_ST_OVERLOADED, "", "%d jobs are active, the limit is %d; retry later", b->jt.n_active,
                   b->cfg->max_concurrent_jobs);
    const bworker *model = registry_model(b);
    uint32_t vocab = model ? model->vocab : 0;
    if ((s->prompt.ptr != NULL) && s->prompt.len > (size_t)b->cfg->max_prompt_bytes)
        return bad(v, TP_ST_TOO_LARGE, "prompt", "prompt: %zu bytes, the limit is %d", s->prompt.len,
                   b->cfg->max_prompt_bytes);
    if ((s->prompt.ptr != NULL) && s->prompt.len == 0)
        return bad(v, TP_ST_BAD_REQUEST, "prompt", "prompt: empty");
    if (s->n_messages) {
        size_t bytes = tp_chat_msgs_bytes(s->messages, s->n_messages) + s->tools.len;
        if (bytes > (size_t)b->cfg->max_prompt_bytes)
            return bad(v, TP_ST_TOO_LARGE, "messages", "messages: %zu bytes of text and tools, the limit is %d",
                       bytes, b->cfg->max_prompt_bytes);
    } else if (!(s->prompt.ptr != NULL)) {
        size_t n = s->prompt_ids.n;
        if ((s->params.set & TP_P_TRUNCATE_PROMPT) && n > (size_t)s->params.truncate_prompt_tokens)
            n = (size_t)s->params.truncate_prompt_tokens;
        if (model && model->seq_len && n >= model->seq_len) {
            v->code = TP_CODE_CONTEXT;
            v->prompt_tokens = (uint32_t)n;
            v->context_length = model->seq_len;
            return bad(v, TP_ST_BAD_REQUEST, "prompt", "prompt: %zu tokens, the model's context holds %u", n,
                       model->seq_len);
        }
        for (size_t i = 0; i < s->prompt_ids.n; i++) {
            int32_t id = tp_raw_i32(s->prompt_ids, i);
            if (id < 0 || (uint32_t)id >= vocab)
                return bad(v, TP_ST_BAD_REQUEST, "prompt", "prompt[%zu]: token id %d outside the vocabulary [0, %u)",
                           i, id, vocab);
        }
    }
    tp_params p = s->params;
    apply_defaults(b->cfg, &p);
    return check_params(b, &p, vocab, v);
}

/* How the stop stage splits a chat job's output, unless the producer said:
 * thinking apart always (a template that does not think never opens it),
 * tool calls when tools are offered and tool_choice is not none. */
static void chat_output(tp_params *p, const tp_m_submit *s)
{
    bool none = s->tool_choice.len == 4 && !memcmp(s->tool_choice.ptr, "none", 4);
    if (!(p->set & TP_P_PARSE_REASONING)) {
        p->parse_reasoning = true;
        p->set |= TP_P_PARSE_REASONING;
    }
    if (!(p->set & TP_P_PARSE_TOOL_CALLS) && s->tools.ptr && !none) {
        p->parse_tool_calls = true;
        p->set |= TP_P_PARSE_TOOL_CALLS;
    }
}

/* Copy what the job keeps from the request (the frames go away). */
static int copy_request(bjob *j, const tp_m_submit *s, const tp_config *c)
{
    tp_params *p = &j->params;
    *p = s->params;
    apply_defaults(c, p);
    size_t bytes = 0;
    for (size_t i = 0; i < s->params.n_stop; i++)
        bytes += s->params.stop[i].len;
    p->stop = calloc(s->params.n_stop + 1, sizeof *p->stop);
    j->stop_buf = malloc(bytes + 1);
    p->stop_token_ids = malloc((s->params.n_stop_token_ids + 1) * sizeof *p->stop_token_ids);
    if (!p->stop || !j->stop_buf || !p->stop_token_ids)
        return TP_ENOMEM;
    char *w = j->stop_buf;
    for (size_t i = 0; i < s->params.n_stop; i++) {
        memcpy(w, s->params.stop[i].ptr, s->params.stop[i].len);
        p->stop[i] = (tp_str){w, s->params.stop[i].len};
        w += s->params.stop[i].len;
    }
    memcpy(p->stop_token_ids, s->params.stop_token_ids, s->params.n_stop_token_ids * sizeof *p->stop_token_ids);
    /* logit_bias lives in the same block as the stop ids, so the job table
     * frees it with them */
    size_t nb = s->params.logit_bias.n, ni = s->params.n_stop_token_ids + 1;
    if (nb) {
        int32_t *blk = realloc(p->stop_token_ids, (ni + 2 * nb) * sizeof *blk);
        if (!blk)
            return TP_ENOMEM;
        p->stop_token_ids = blk;
        p->logit_bias.ids = blk + ni;
        p->logit_bias.values = (float *)(void *)(blk + ni + nb);
        memcpy(p->logit_bias.ids, s->params.logit_bias.ids, nb * sizeof *blk);
        memcpy(p->logit_bias.values, s->params.logit_bias.values, nb * sizeof(float));
    }
    p->set &= ~(TP_P_GRAMMAR | TP_P_JSON_SCHEMA | TP_P_JSON_MODE);
    p->grammar = p->json_schema = (tp_str){0};
    p->json_mode = false;
    if (j->gbnf) {
        p->gbnf = (tp_str){j->gbnf, strlen(j->gbnf)};
        p->set |= TP_P_GBNF;
    }
    p->grammar_trigger = tp_str_of(j->gtrigger);
    /* the request's frames go away: the mode becomes one of our literals */
    if (p->set & TP_P_LOGPROBS_MODE)
        p->logprobs_mode = tp_str_of(tp_params_lpmode(p) == TP_LPMODE_PROCESSED ? "processed" : "raw");
    if (p->speculative.set & TP_SPEC_P_MODE)
        p->speculative.mode = tp_str_of(tp_spec_mode_name(guess_mode(c, p)));
    if (!(p->set & TP_P_SEED)) {   /* reported in ACK and FINISH, so the job can be replayed */
        p->seed = tp_random_u64();
        p->set |= TP_P_SEED;
    }
    j->embed = s->embed.ptr ? (uint8_t)tp_pool_parse(s->embed) : 0;
    if (s->n_messages) {
        if (tp_chat_msgs_dup(s->messages, s->n_messages, s->tools, &j->messages, &j->tools))
            return TP_ENOMEM;
        j->n_messages = s->n_messages;
        j->prompt_len = 0;
        if (s->reasoning_effort.ptr) /* the protocol checked it is one of three words */
            snprintf(j->reasoning_effort, sizeof j->reasoning_effort, "%.*s", (int)s->reasoning_effort.len,
                     s->reasoning_effort.ptr);
        chat_output(p, s);
    } else if ((s->prompt.ptr != NULL)) {
        if (!(j->prompt_text = malloc(s->prompt.len + 1)))
            return TP_ENOMEM;
        memcpy(j->prompt_text, s->prompt.ptr, s->prompt.len);
        j->prompt_len = s->prompt.len;
        j->parse_special = s->parse_special;
    } else {
        size_t n = s->prompt_ids.n, skip = 0;
        if ((p->set & TP_P_TRUNCATE_PROMPT) && n > (size_t)p->truncate_prompt_tokens)
            skip = n - (size_t)p->truncate_prompt_tokens;
        if (!(j->prompt = malloc((n - skip) * sizeof *j->prompt)))
            return TP_ENOMEM;
        memcpy(j->prompt, (const char *)s->prompt_ids.data + skip * sizeof *j->prompt, (n - skip) * sizeof *j->prompt);
        j->n_prompt = (uint32_t)(n - skip);
    }
    return 0;
}

static void on_submit(broker *b, const reply_to *to, const tp_msg *m)
{
    const tp_m_submit *s = &m->submit;
    b->stats.jobs_submitted++;
    verdict v = {0};
    char *gbnf = NULL, gfield[64];
    const char *trigger = NULL;
    tp_err ge;
    tp_gnames gn;
    info_gnames(b, &gn);
    if (s->params.gbnf.ptr)
        bad(&v, TP_ST_BAD_REQUEST, "params.gbnf", "params.gbnf: set by the broker (what params.grammar, json_schema, "
            "json_mode or tool_choice compile to), not by producers");
    else if (s->params.grammar_trigger.ptr)
        bad(&v, TP_ST_BAD_REQUEST, "params.grammar_trigger", "params.grammar_trigger: set by the broker (tool_choice "
            "\"auto\"), not by producers");
    else if (check_submit(b, s, &v) &&
             ((s->tools.ptr && grammar_admit_tools(b->cfg, &gn, &b->gmemo, info_tool_family(b), info_think_open(b), s, &gbnf,
                                                   &trigger, gfield, sizeof gfield, &ge)) ||
              (!gbnf && grammar_admit(b->cfg, &gn, &b->gmemo, &s->params, &gbnf, gfield, sizeof gfield, &ge))))
        bad(&v, ge.code == TP_ENOMEM ? TP_ST_INTERNAL : TP_ST_BAD_REQUEST, gfield, "%s", ge.msg);
    if (v.status) {
        b->stats.jobs_rejected++;
        char id[TP_PROTO_MAX_JOB_ID + 1];
        snprintf(id, sizeof id, "%.*s", (int)s->job_id.len, s->job_id.ptr);
        tp_msg r;
        tp_msg_init(&r, TP_FAM_JOB, TP_CMD_ACK);
        r.req = m->req;
        r.status = v.status;
        r.error = tp_str_of(v.msg[0] ? v.msg : "rejected");
        r.ack.job_id = tp_str_of(id);
        r.ack.field = tp_str_of(v.field[0] ? v.field : NULL);   /* 429/503 blame no field */
        r.ack.error_code = tp_str_of(v.code);
        r.ack.prompt_tokens = v.prompt_tokens;
        r.ack.context_length = v.context_length;
        reply(b, to, &r);
        return;
    }
    char id[TP_PROTO_MAX_JOB_ID + 1];
    if (s->job_id.len)
        snprintf(id, sizeof id, "%.*s", (int)s->job_id.len, s->job_id.ptr);
    else
        snprintf(id, sizeof id, "j-%08x-%llu", (unsigned)b->incarnation, (unsigned long long)++b->next_auto_id);
    bjob *j = jobs_new(&b->jt, id, strlen(id));
    if (j) {
        /* workers get the GBNF only, whatever the request said */
        j->gbnf = gbnf;
        j->gtrigger = gbnf ? trigger : NULL;
        gbnf = NULL;
    }
    if (!j || copy_request(j, s, b->cfg)) {
        free(gbnf);
        if (j)
            jobs_release(&b->jt, j);
        b->stats.jobs_rejected++;
        ack(b, to, m->req, TP_ST_OVERLOADED, id, "", "the job table is full; retry later");
        return;
    }
    j->t_submit_wall = tp_wall_us();
    j->t_submit_ms = tp_now_ms();
    tp_msg r;
    tp_msg_init(&r, TP_FAM_JOB, TP_CMD_ACK);
    r.req = m->req;
    r.status = TP_ST_OK;
    r.ack.job_id = tp_str_of(id);
    r.ack.set = TP_ACK_SEED;
    r.ack.seed = j->params.seed;
    reply(b, to, &r);
    admit_start(b, j);
    sched_run(b);
}

/* ---- CANCEL / STATUS / STATS --------------------------------------------------- */

static void on_cancel(broker *b, const reply_to *to, const tp_msg *m)
{
    const tp_str *id = &m->jobref.job_id;
    char ids[TP_PROTO_MAX_JOB_ID + 1];
    snprintf(ids, sizeof ids, "%.*s", (int)id->len, id->ptr);
    bjob *j = jobs_find(&b->jt, id->ptr, id->len);
    if (!j) {
        ack(b, to, m->req, TP_ST_NOT_FOUND, ids, "job_id", "job_id: unknown job '%s'", ids);
        return;
    }
    if (j->state == J_FINISHED || j->state == J_CLOSING || j->cancel) {
        ack(b, to, m->req, TP_ST_CONFLICT, ids, "job_id", "job '%s' already finished", ids);
        return;
    }
    ack(b, to, m->req, TP_ST_OK, ids, NULL, NULL);
    pin_cancel(b, j);
    sched_run(b);
}

static int state_of(const bjob *j)
{
    if (j->result_ready)   /* its FINISH went out: the result is final, whatever the workers still do */
        return TP_STATE_FINISHED;
    switch (j->state) {
    case J_TOKENIZE:
    case J_ADMIT:
        return TP_STATE_QUEUED;
    case J_FINISHED:
        return TP_STATE_FINISHED;
    default:
        return TP_STATE_RUNNING;
    }
}

static void on_status(broker *b, const reply_to *to, const tp_msg *m)
{
    const tp_str *id = &m->jobref.job_id;
    bjob *j = jobs_find(&b->jt, id->ptr, id->len);
    tp_msg r;
    tp_msg_init(&r, TP_FAM_JOB, TP_CMD_STATUS_REPLY);
    r.req = m->req;
    tp_m_status_reply *s = &r.status_reply;
    s->job_id = *id;
    s->last_seq = -1;
    if (!j) {
        r.status = TP_ST_NOT_FOUND;
        r.error = tp_str_of("unknown job (never submitted, or expired)");
        s->state = TP_STATE_UNKNOWN;
        reply(b, to, &r);
        return;
    }
    r.status = TP_ST_OK;
    s->state = state_of(j);
    s->prompt_tokens = j->n_prompt;
    s->cached_tokens = j->cached;
    s->last_seq = j->last_seq;
    s->text = (tp_str){j->text ? j->text : "", j->text_len};
    s->text_len = jobs_text_total(j);
    /* running: exactly what the events up to last_seq carried, so a client
     * can continue from the events after it */
    static const int32_t none[1];
    bool done = s->state == TP_STATE_FINISHED;
    bool table = j->state == J_FINISHED;   /* else shown[]: the events up to now, FINISH included */
    s->tokens = table ? (tp_raw){j->out ? j->out : none, j->n_out} : (tp_raw){j->shown ? j->shown : none, j->n_shown};
    s->completion_tokens = (uint32_t)s->tokens.n;
    s->lp = joblp_status(j, s->tokens.n);
    s->reasoning_content = jobfields_reasoning(j);
    const tp_tool_call *calls;
    if ((s->n_tool_calls = jobfields_calls(j, &calls)))
        s->tool_calls = (tp_tool_call *)calls;
    if (done) {
        s->reason = j->reason;
        s->matched = j->matched;
        s->job_error = tp_str_of(j->job_error);
        s->timings = j->timings;
    }
    reply(b, to, &r);
}

static void on_stats(broker *b, const reply_to *to, const tp_msg *m)
{
    tp_msg r;
    tp_msg_init(&r, TP_FAM_JOB, TP_CMD_STATS_REPLY);
    r.req = m->req;
    r.status = TP_ST_OK;
    tp_m_stats_reply *s = &r.stats_reply;
    const bstats *st = &b->stats;
    s->uptime_ms = (uint64_t)(tp_now_ms() - b->t_start_ms);
    s->jobs_submitted = st->jobs_submitted;
    const bjobcounts *jc = &b->jt.c;
    s->jobs_rejected = st->jobs_rejected + jc->jobs_rejected;
    s->jobs_active = (uint64_t)b->jt.n_active;
    s->jobs_finished = jc->jobs_finished;
    s->tokens_generated = jc->tokens_generated;
    s->events_published = st->events_published;
    s->malformed_front = st->malformed_front;
    s->malformed_back = st->malformed_back;
    s->malformed_events = st->malformed_events;
    s->forward_steps = st->forward_steps;
    s->forward_rows = st->forward_rows;
    s->forward_tokens = st->forward_tokens;
    s->spec_drafted = st->spec_drafted;
    s->spec_accepted = st->spec_accepted;
    s->spec_verify_steps = st->spec_verify_steps;
    s->spec_verify_tokens = st->spec_verify_tokens;
    s->zap_refused = tp_zsec_server_refused(b->zsec);
    s->stages_failed = b->stages_failed;
    s->workers_lost = st->workers_lost;
    s->jobs_poisoned = st->jobs_poisoned;
    s->workers_hung = st->workers_hung;
    s->replies_refused = st->replies_refused;
    memcpy(s->recovered, st->recovered, sizeof s->recovered);
    s->recovery_count = jc->recovery_n;
    s->recovery_ms_total = jc->recovery_ms_sum;
    s->recovery_ms_max = jc->recovery_ms_max;
    s->events_duplicate = st->events_duplicate;
    s->events_refused = st->events_refused;
    for (int i = 0; i < 5; i++)
        s->workers[i] = (uint64_t)registry_count(b, 1u << i);
    memcpy(s->finish, jc->finish, sizeof s->finish);
    tp_trigger trig[sizeof jc->triggers / sizeof jc->triggers[0]];
    for (size_t i = 0; i < jc->n_triggers; i++) {
        trig[i].key = jc->triggers[i].key;
        if (trig[i].key.kind == TP_MATCHED_STR)
            trig[i].key.str.ptr = jc->triggers[i].str;
        trig[i].count = jc->triggers[i].count;
        trig[i].truncated = jc->triggers[i].truncated;
    }
    s->triggers = trig;
    s->n_triggers = jc->n_triggers;
    s->triggers_other = jc->triggers_other;
    metrics_fill(b, s);
    reply(b, to, &r);
}

/* ---- entry -------------------------------------------------------------------- */

void front_on_message(broker *b, const tp_frame *frames, size_t n, bool too_many)
{
    if (n < 2)
        return;   /* an identity alone: nothing to answer */
    reply_to to = {{frames[0]}, 1};
    size_t first = 1;
    if (frames[1].len == 0) {   /* a REQ peer's delimiter, echoed back */
        to.env[to.n_env++] = frames[1];
        first = 2;
    }
    if (too_many) {
        b->stats.malformed_front++;
        tp_msg r;
        tp_msg_init(&r, TP_FAM_JOB, TP_CMD_ERROR);
        r.status = TP_ST_TOO_LARGE;
        r.error = tp_str_of("too many frames in one message");
        reply(b, &to, &r);
        return;
    }
    tp_msg m;
    tp_err e;
    tp_err_clear(&e);
    if (tp_proto_decode(TP_FAM_JOB, frames + first, n - first, &m, &e)) {
        b->stats.malformed_front++;
        /* a SUBMIT all the same (PROTOCOL.md STATS: the command byte said so), also when the
         * frame count was refused before the decoder read that byte */
        bool said_submit = n - first >= 2 && frames[first + 1].len == 1 &&
                           *(const uint8_t *)frames[first + 1].data == TP_CMD_SUBMIT;
        if (said_submit && m.status != TP_ST_BAD_VERSION) {
            b->stats.jobs_submitted++;
            b->stats.jobs_rejected++;
        }
        tp_msg r;
        tp_msg_init(&r, TP_FAM_JOB, TP_CMD_ERROR);
        r.req = m.req;
        r.status = m.status ? m.status : TP_ST_BAD_REQUEST;
        r.error = tp_str_of(e.msg[0] ? e.msg : "malformed request");
        r.ack.field = tp_str_of(m.bad_field[0] ? m.bad_field : NULL);
        reply(b, &to, &r);
        tp_msg_clear(&m);
        return;
    }
    if ((m.cmd == TP_CMD_SUBMIT || m.cmd == TP_CMD_CANCEL || m.cmd == TP_CMD_STATUS) && !standby_client_request(b)) {
        /* Binary Star: a passive broker refuses, so the client tries the
         * other one (PROTOCOL.md "Standby broker") */
        tp_msg r;
        tp_msg_init(&r, TP_FAM_JOB, TP_CMD_ERROR);
        r.req = m.req;
        r.status = TP_ST_UNAVAILABLE;
        r.error = tp_str_of(TP_STANDBY_PASSIVE_ERROR);
        reply(b, &to, &r);
        tp_msg_clear(&m);
        return;
    }
    switch (m.cmd) {
    case TP_CMD_SUBMIT:
        on_submit(b, &to, &m);
        break;
    case TP_CMD_CANCEL:
        on_cancel(b, &to, &m);
        break;
    case TP_CMD_STATUS:
        on_status(b, &to, &m);
        break;
    case TP_CMD_STATS:
        on_stats(b, &to, &m);
        break;
    case TP_CMD_INFO: {
        tp_msg r;
        info_reply(b, m.req, &r);
        reply(b, &to, &r);
        break;
    }
    default: {
        b->stats.malformed_front++;
        tp_msg r;
        tp_msg_init(&r, TP_FAM_JOB, TP_CMD_ERROR);
        r.req = m.req;
        r.status = TP_ST_UNKNOWN_COMMAND;
        r.error = tp_str_of("not a request a producer may send");
        reply(b, &to, &r);
    }
    }
    tp_msg_clear(&m);
}
