/* tokpipe generate: submit jobs to tokpiped, follow their events, print the
 * text as it streams (one prompt) or one JSON line per prompt (--json, the
 * same fields as `tokpipe run --json`).
 *
 * No event is lost silently: the client subscribes and waits for the
 * broker's first heartbeat before submitting; a job whose events show a gap
 * in `seq` (or that goes quiet) is completed from STATUS, whose result is
 * the authority. Streamed output only ever prints a prefix of the final
 * text. The broker's heartbeats tell a restarted broker and a silent one
 * (STATUS, then an error if it does not answer within --timeout) from a
 * quiet one. A restarted broker knows none of the old one's jobs: each
 * unfinished one is submitted again with the same id, prompt, parameters
 * and seed (every job is sent a seed for that), and its output goes on
 * where it stopped: the bytes already printed are checked, not printed
 * again, so the text printed is that of an undisturbed run. */
#include "tools.h"

#include <cjson/cJSON.h>
#include <signal.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include "client.h"
#include "evfmt.h"
#include "genopts.h"
#include "tokpipe/spec.h"
#include "tokpipe/buf.h"
#include "tokpipe/rand.h"

const char cmd_generate_summary[] = "generate through the daemon: submit, stream the text (or --json)";

#define IDLE_POLL_MS 1000  /* no event for this long: ask STATUS */

typedef struct job {
    char id[TP_PROTO_MAX_JOB_ID + 1];
    const char *prompt;
    uint64_t req;
    bool accepted, done, gap;
    uint32_t next_seq;
    tp_buf text;              /* final text (assembled from events or STATUS); lenient: a
                                 piece lost to memory is a gap that STATUS fills */
    int32_t *ids;
    size_t n_ids, cap_ids;
    size_t printed;           /* bytes of text already written to stdout */
    uint64_t seed;            /* sent with every SUBMIT of the job, so a resubmission replays it */
    char *was;                /* after a resubmission: the text printed before it, to check */
    size_t was_len;
    bool diverged;            /* the resubmitted job's text differs from what was printed */
    int reason;
    uint32_t prompt_tokens, completion_tokens;
    uint32_t cached_tokens;   /* of the prompt, taken from the forward worker's prefix cache */
    uint32_t draft_tokens, draft_accepted; /* speculative decoding's guesses, verified and taken */
    bool spec;                /* it speculated (asked, or FINISH counted guesses): --json says how much */
    cJSON *matched;           /* string, id or null (as in `run --json`) */
    char error[TP_PROTO_MAX_ERROR + 1];   /* reason error: what went wrong */
    uint32_t rejected;        /* the ACK's status when the SUBMIT was refused, else 0 */
    char detail[16];          /* FINISH detail of a length finish */
    int grammar_complete;     /* FINISH grammar_complete: 1, 0, or -1 absent */
    cJSON *logprobs;          /* --logprobs: one entry per TOKEN id, as `run --json` */
    cJSON *tool_calls;        /* FINISH tool_calls (OpenAI's shape) */
    bool tool_calls_cut;      /* FINISH tool_calls_cut: a call is not whole */
    cJSON *reasoning;         /* FINISH reasoning_content */
} job;

typedef struct gen {
    genopts g;
    tp_client_args a;
    job *jobs;
    size_t n;
    bool stream;              /* one prompt, not --json: print deltas as they come */
    tp_client *c;
    tp_str stops[GENOPTS_MAX_STOPS];   /* params.stop of every SUBMIT */
    bool results_out;         /* print_results done: stdout ends a line */
    int sigfd;                /* read end of the interrupt pipe, -1 none */
    int sigfd_w;
} gen;

static const char usage_head[] =
    "usage: tokpipe generate --prompt TEXT [--prompt TEXT ...] [options]\n"
    "\n"
    "Submits one job per --prompt to tokpiped (all at once: they run\n"
    "concurrently), subscribes to their events and prints the text as it\n"
    "streams (one prompt), the texts in prompt order (several prompts), or with\n"
    "--json one line per prompt, in order, with the fields of `tokpipe run --json`:\n"
    "  {\"prompt\",\"text\",\"tokens\",\"finish_reason\",\"finish_detail\",\"matched\",\n"
    "   \"prompt_tokens\",\"cached_tokens\",\"completion_tokens\",\"seed\",\"logprobs\"}\n"
    "A generation option left out takes the daemon's default (its config's\n"
    "generation.* keys; the defaults shown below are the shipped ones); without\n"
    "--seed each job gets a random seed (sent with it, shown in --json). When\n"
    "tokpiped restarts, the unfinished jobs are submitted again with the same ids\n"
    "and seeds and the output goes on where it stopped.\n"
    "A prompt the daemon refuses (e.g. 429 overloaded) is named on stderr; the other\n"
    "prompts still run to the end and are printed, and the refused one prints an empty\n"
    "line (--json: {\"prompt\",\"status\",\"error\"}) in its place.\n"
    "exit status: 0 ok, 1 a job was rejected, failed or cancelled (named on stderr; the\n"
    "output is still printed) / the daemon is unreachable or gone, or a resubmitted\n"
    "job's text differed from what was printed, 2 bad usage, 130 interrupted (its jobs\n"
    "cancelled).\n\n";

static int usage(FILE *out, int rc)
{
    fputs(usage_head, out);
    genopts_print_help(out);
    fputs(TP_CLIENT_ARGS_HELP, out);
    return rc;
}

static int append_ids(job *j, tp_raw ids)
{
    if (j->n_ids + ids.n > j->cap_ids) {
        size_t cap = (j->n_ids + ids.n) * 2 + 16;
        int32_t *p = realloc(j->ids, cap * sizeof *p);
        if (!p)
            return -1;
        j->ids = p, j->cap_ids = cap;
    }
    for (size_t i = 0; i < ids.n; i++)
        j->ids[j->n_ids++] = tp_raw_i32(ids, i);
    return 0;
}

static void fill_params(const genopts *g, tp_params *p, tp_str *stops)
{
    memset(p, 0, sizeof *p);
    if (g->one_call) {
        p->parallel_tool_calls = false;
        p->set |= TP_P_PARALLEL_TOOL_CALLS;
    }
    /* only what the command line gave: the rest takes the daemon's
     * configured defaults (generation.*) and limits */
    static const struct {
        genopt_flag flag;
        uint32_t bit;
    } sent[] = {
        {GO_MAX_TOKENS, TP_P_MAX_TOKENS}, {GO_MIN_TOKENS, TP_P_MIN_TOKENS}, {GO_TEMPERATURE, TP_P_TEMPERATURE},
        {GO_TOP_P, TP_P_TOP_P}, {GO_TOP_K, TP_P_TOP_K}, {GO_MIN_P, TP_P_MIN_P},
        {GO_REPETITION_PENALTY, TP_P_REPETITION_PENALTY}, {GO_PRESENCE_PENALTY, TP_P_PRESENCE_PENALTY},
        {GO_FREQUENCY_PENALTY, TP_P_FREQUENCY_PENALTY}, {GO_PENALTY_WINDOW, TP_P_PENALTY_WINDOW},
        {GO_SEED, TP_P_SEED},
    };
    for (size_t i = 0; i < sizeof sent / sizeof *sent; i++)
        if (g->given & (1u << sent[i].flag))
            p->set |= sent[i].bit;
    if (g->ignore_eos)
        p->set |= TP_P_IGNORE_EOS;
    if (g->include_stop)
        p->set |= TP_P_INCLUDE_STOP;
    p->max_tokens = g->max_tokens, p->min_tokens = g->min_tokens, p->temperature = g->temperature;
    p->top_p = g->top_p, p->top_k = g->top_k, p->min_p = g->min_p;
    p->repetition_penalty = g->repetition_penalty, p->presence_penalty = g->presence_penalty;
    p->frequency_penalty = g->frequency_penalty, p->seed = g->seed;
    p->penalty_window = g->penalty_window;
    p->ignore_eos = g->ignore_eos, p->include_stop_str_in_output = g->include_stop;
    for (size_t i = 0; i < g->n_stops; i++)
        stops[i] = tp_str_of(g->stops[i]);
    if (g->n_stops)
        p->set |= TP_P_STOP, p->stop = stops, p->n_stop = g->n_stops;
    if (g->n_stop_ids)
        p->set |= TP_P_STOP_TOKEN_IDS, p->stop_token_ids = (int32_t *)g->stop_ids, p->n_stop_token_ids = g->n_stop_ids;
    if (g->logprobs)
        p->set |= TP_P_LOGPROBS | TP_P_TOP_LOGPROBS, p->logprobs = true, p->top_logprobs = g->top_logprobs;
    if (g->given & (1u << GO_LOGPROBS_MODE))
        p->set |= TP_P_LOGPROBS_MODE, p->logprobs_mode = tp_str_of(g->lp_processed ? "processed" : "raw");
    if (g->given & (1u << GO_TYPICAL_P))
        p->set |= TP_P_TYPICAL_P, p->typical_p = g->typical_p;
    if (g->n_bias)
        p->set |= TP_P_LOGIT_BIAS,
            p->logit_bias = (tp_logit_bias){(int32_t *)g->bias_ids, (float *)g->bias_values, g->n_bias};
    if (g->truncate_prompt_tokens)
        p->set |= TP_P_TRUNCATE_PROMPT, p->truncate_prompt_tokens = g->truncate_prompt_tokens;
    if (g->spec_given)
        p->speculative.set |= TP_SPEC_P_MODE, p->speculative.mode = tp_str_of(tp_spec_mode_name(g->spec_mode));
    if (g->spec_n_max)
        p->speculative.set |= TP_SPEC_P_N_MAX, p->speculative.n_max = g->spec_n_max;
    /* sent as given: the daemon compiles and checks them */
    if (g->grammar)
        p->set |= TP_P_GRAMMAR, p->grammar = (tp_str){g->grammar, g->grammar_len};
    if (g->json_schema)
        p->set |= TP_P_JSON_SCHEMA, p->json_schema = (tp_str){g->json_schema, g->json_schema_len};
    if (g->json_mode)
        p->set |= TP_P_JSON_MODE, p->json_mode = true;
}

static void fill_submit(gen *s, const job *j, tp_msg *m)
{
    tp_msg_init(m, TP_FAM_JOB, TP_CMD_SUBMIT);
    m->submit.job_id = tp_str_of(j->id);
    if (s->g.n_messages) {
        m->submit.messages = s->g.messages;
        m->submit.n_messages = s->g.n_messages;
    } else {
        m->submit.prompt = tp_str_of(j->prompt);
    }
    fill_params(&s->g, &m->submit.params, s->stops);
    m->submit.parse_special = s->g.parse_special;
    m->submit.tools = s->g.tools;
    if (s->g.tool_choice)
        m->submit.tool_choice = tp_str_of(s->g.tool_choice);
    if (s->g.tool_choice_name)
        m->submit.tool_choice_name = tp_str_of(s->g.tool_choice_name);
    if (s->g.reasoning_effort.ptr)
        m->submit.reasoning_effort = s->g.reasoning_effort;
    m->submit.params.set |= TP_P_SEED;
    m->submit.params.seed = j->seed;
}

/* Send every SUBMIT, then collect the ACKs. A refused prompt is named on
 * stderr and marked; the accepted ones go on (check_outcomes makes the
 * exit status 1). */
static int submit_all(gen *s, tp_err *err)
{
    for (size_t i = 0; i < s->n; i++) {
        s->jobs[i].seed = (s->g.given & (1u << GO_SEED)) ? s->g.seed : tp_random_u64();
        s->jobs[i].spec = s->g.spec_given && s->g.spec_mode != TP_SPEC_OFF;
        tp_msg m;
        fill_submit(s, &s->jobs[i], &m);
        int rc = tp_client_send(s->c, &m, &s->jobs[i].req, err);
        if (rc)
            return rc;
    }
    int again = 0;
    for (size_t got = 0; got < s->n; got++) {
        tp_recv r;
        int rc = tp_client_recv_reply(s->c, &r, err);
        if (rc)
            return rc;
        for (size_t i = 0; i < s->n; i++) {
            job *j = &s->jobs[i];
            if (j->req != r.m.req && !(r.m.req == 0 && r.m.cmd == TP_CMD_ERROR))
                continue;
            if (tp_client_passive_refusal(&r.m) && again++ < 200) {
                /* a passive standby broker: to the other one (the DEALER's next connection) */
                tp_msg m;
                fill_submit(s, j, &m);
                usleep(20 * 1000);
                rc = tp_client_send(s->c, &m, &j->req, err);
                got--;
            } else if (r.m.status == TP_ST_OK && r.m.cmd == TP_CMD_ACK) {
                j->accepted = true;
                if (r.m.ack.set & TP_ACK_SEED)   /* a broker that does not say keeps the one sent */
                    j->seed = r.m.ack.seed;
            } else {
                fprintf(stderr, "tokpipe generate: prompt %zu rejected (%u): %.*s\n", i + 1, r.m.status,
                        (int)r.m.error.len, r.m.error.ptr ? r.m.error.ptr : "");
                j->rejected = r.m.status ? r.m.status : TP_ST_BAD_REQUEST;
                j->done = true;
                snprintf(j->error, sizeof j->error, "%.*s", (int)r.m.error.len, r.m.error.ptr ? r.m.error.ptr : "");
            }
            break;
        }
        tp_recv_free(&r);
        if (rc)
            return rc;
    }
    return 0;
}

/* The logprob entries of one TOKEN event (see `run --json`). */
static void add_logprobs(job *j, const tp_m_token *t)
{
    cJSON *rows = evfmt_logprobs(t->ids, &t->lp);
    if (!rows)
        return;
    if (!j->logprobs)
        j->logprobs = cJSON_CreateArray();
    for (cJSON *e; j->logprobs && (e = cJSON_DetachItemFromArray(rows, 0));)
        cJSON_AddItemToArray(j->logprobs, e);
    cJSON_Delete(rows);
}

static job *find_job(gen *s, tp_str id)
{
    for (size_t i = 0; i < s->n; i++)
        if (strlen(s->jobs[i].id) == id.len && !memcmp(s->jobs[i].id, id.ptr, id.len))
            return &s->jobs[i];
    return NULL;
}

/* After a resubmission the text comes again from its start: the part
 * printed before must come out the same (it is not printed again). */
static void check_reprint(job *j, size_t from)
{
    size_t end = j->text.len < j->was_len ? j->text.len : j->was_len;
    if (from < end && memcmp(j->text.data + from, j->was + from, end - from))
        j->diverged = true;
}

static void emit(gen *s, job *j, tp_str text)
{
    size_t from = j->text.len;
    if (tp_buf_add(&j->text, text.ptr, text.len))
        j->gap = true; /* out of memory: STATUS will supply the text */
    check_reprint(j, from);
    if (s->stream && !j->gap && j->text.len > j->printed) {
        fwrite(j->text.data + j->printed, 1, j->text.len - j->printed, stdout);
        fflush(stdout);
        j->printed = j->text.len;
    }
}

static void on_event(gen *s, const tp_msg *m)
{
    tp_str id = m->cmd == TP_CMD_TOKEN ? m->token.job_id : m->finish.job_id;
    uint32_t seq = m->cmd == TP_CMD_TOKEN ? m->token.seq : m->finish.seq;
    job *j = find_job(s, id);
    if (!j || j->done)
        return;
    if (seq != j->next_seq)
        j->gap = true;
    j->next_seq = seq + 1;
    if (m->cmd == TP_CMD_TOKEN) {
        if (append_ids(j, m->token.ids))
            j->gap = true;
        add_logprobs(j, &m->token);
        emit(s, j, m->token.text);
        return;
    }
    emit(s, j, m->finish.text);
    j->reason = m->finish.reason;
    cJSON_Delete(j->matched);
    j->matched = evfmt_matched(&m->finish.matched);
    snprintf(j->error, sizeof j->error, "%.*s", (int)m->finish.job_error.len,
             m->finish.job_error.ptr ? m->finish.job_error.ptr : "");
    j->prompt_tokens = m->finish.prompt_tokens;
    j->cached_tokens = m->finish.cached_tokens;
    j->draft_tokens = m->finish.draft_tokens;
    j->draft_accepted = m->finish.draft_accepted;
    j->spec |= j->draft_tokens > 0;
    j->completion_tokens = m->finish.completion_tokens;
    if (m->finish.set & TP_ACK_SEED)
        j->seed = m->finish.seed;
    snprintf(j->detail, sizeof j->detail, "%.*s", (int)m->finish.detail.len,
             m->finish.detail.ptr ? m->finish.detail.ptr : "");
    j->grammar_complete = (m->finish.set & TP_FIN_GRAMMAR) ? m->finish.grammar_complete : -1;
    cJSON_Delete(j->tool_calls);
    cJSON_Delete(j->reasoning);
    j->tool_calls = m->finish.n_tool_calls ? evfmt_tool_calls(m->finish.tool_calls, m->finish.n_tool_calls) : NULL;
    j->tool_calls_cut = m->finish.tool_calls_cut;
    j->reasoning = m->finish.reasoning_content.ptr ? evfmt_str(m->finish.reasoning_content) : NULL;
    j->done = !j->gap;
}

/* Complete j from STATUS if it finished; 0 ok (done or still running),
 * TP_ENOTFOUND when the broker does not know it. */
static int catch_up(gen *s, job *j, tp_err *err)
{
    tp_msg m;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_STATUS);
    m.jobref.job_id = tp_str_of(j->id);
    tp_recv r;
    int rc = tp_client_call(s->c, &m, &r, err);
    if (rc)
        return rc;
    const tp_m_status_reply *st = &r.m.status_reply;
    if (r.m.cmd != TP_CMD_STATUS_REPLY || r.m.status != TP_ST_OK) {
        rc = tp_err_set(err, TP_ENOTFOUND, "job %s: tokpiped does not know it (%u %.*s): it restarted, or the job "
                        "expired", j->id, r.m.status, (int)r.m.error.len, r.m.error.ptr ? r.m.error.ptr : "");
    } else if (st->state == TP_STATE_FINISHED) {
        tp_buf_reset(&j->text), j->n_ids = 0;
        if (tp_buf_add(&j->text, st->text.ptr, st->text.len) || append_ids(j, st->tokens))
            rc = tp_err_set(err, TP_ENOMEM, "out of memory");
        j->reason = st->reason, j->prompt_tokens = st->prompt_tokens, j->cached_tokens = st->cached_tokens;
        cJSON_Delete(j->matched);
        j->matched = evfmt_matched(&st->matched);
        snprintf(j->error, sizeof j->error, "%.*s", (int)st->job_error.len, st->job_error.ptr ? st->job_error.ptr : "");
        j->completion_tokens = st->completion_tokens, j->done = true;
        check_reprint(j, 0);
        cJSON_Delete(j->logprobs);   /* the events had a gap: STATUS has them all */
        j->logprobs = evfmt_logprobs(st->tokens, &st->lp);
        if (s->stream && j->printed <= j->text.len) {
            fwrite(j->text.data + j->printed, 1, j->text.len - j->printed, stdout);
            j->printed = j->text.len;
        }
    }
    tp_recv_free(&r);
    return rc;
}

static size_t pending(const gen *s)
{
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++)
        n += s->jobs[i].accepted && !s->jobs[i].done;
    return n;
}

static void say(const gen *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A line on stderr, on a line of its own after streamed text. */
static void say(const gen *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    fprintf(stderr, "%stokpipe generate: ", s->stream && s->jobs[0].printed && !s->results_out ? "\n" : "");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* Submit j again to a restarted broker: same id, prompt, parameters and
 * seed, so it generates the same text; its events start again at seq 0. */
static int resubmit(gen *s, job *j, size_t i, tp_err *err)
{
    if (j->printed > j->was_len) {   /* keep what was printed, to check the replay against */
        char *w = realloc(j->was, j->printed + 1);
        if (!w)
            return tp_err_set(err, TP_ENOMEM, "out of memory");
        memcpy(w, j->text.data, j->printed);
        j->was = w, j->was_len = j->printed;
    }
    tp_buf_reset(&j->text), j->n_ids = 0, j->next_seq = 0, j->gap = false, j->reason = TP_REASON_NONE;
    /* a broker just started has no workers yet and answers 503: retry
     * for as long as --timeout allows */
    int timeout = s->a.timeout_ms > 0 ? s->a.timeout_ms : 5000;
    for (int waited = 0;; waited += 100) {
        tp_msg m;
        fill_submit(s, j, &m);
        tp_recv r;
        int rc = tp_client_call(s->c, &m, &r, err);
        if (rc)
            return rc;
        bool ok = r.m.cmd == TP_CMD_ACK && r.m.status == TP_ST_OK;
        bool later = r.m.status == TP_ST_UNAVAILABLE && waited < timeout;
        if (!ok && !later)
            rc = tp_err_set(err, TP_ENOTFOUND, "job %s (prompt %zu): the restarted tokpiped refused it again (%u %.*s)",
                            j->id, i + 1, r.m.status, (int)r.m.error.len, r.m.error.ptr ? r.m.error.ptr : "");
        tp_recv_free(&r);
        if (!later)
            return rc;
        usleep(100 * 1000);
    }
}

/* The broker restarted: ask it about every pending job; the ones it does
 * not know are submitted again (named on stderr). */
static int after_restart(gen *s, tp_err *err)
{
    const tp_client_live *l = tp_client_liveness(s->c);
    say(s, "tokpiped restarted (incarnation %016llx, was %016llx): checking %zu job(s)",
        (unsigned long long)l->incarnation, (unsigned long long)l->prev_incarnation, pending(s));
    for (size_t i = 0; i < s->n; i++) {
        job *j = &s->jobs[i];
        if (!j->accepted || j->done)
            continue;
        int rc = catch_up(s, j, err);
        if (rc == TP_ENOTFOUND) {
            say(s, "job %s (prompt %zu) is unknown to the restarted tokpiped: submitting it again (seed %llu), "
                "output goes on after the %zu bytes printed", j->id, i + 1, (unsigned long long)j->seed, j->printed);
            rc = resubmit(s, j, i, err);
        }
        if (rc)
            return rc;
    }
    return 0;
}

/* No heartbeat for interval x liveness: STATUS tells a broker whose events
 * do not reach us from one that is gone (no reply within --timeout). */
static int after_silence(gen *s, tp_err *err)
{
    const tp_client_live *l = tp_client_liveness(s->c);
    say(s, "no heartbeat from tokpiped on %s for %lld ms (one is due every %u ms): asking it about %zu job(s)",
        tp_client_events(s->c), (long long)l->silent_ms, l->interval_ms, pending(s));
    for (size_t i = 0; i < s->n; i++) {
        job *j = &s->jobs[i];
        int rc = j->accepted && !j->done ? catch_up(s, j, err) : 0;
        if (rc == TP_ENOTFOUND)   /* a restarted broker: its heartbeat (a new incarnation) follows */
            continue;
        if (rc == TP_EIO) {
            char why[TP_ERR_MSG_MAX];
            snprintf(why, sizeof why, "%s", err->msg);
            return tp_err_set(err, TP_EIO, "tokpiped is gone: no heartbeat for %lld ms and %s",
                              (long long)l->silent_ms, why);
        }
        if (rc)
            return rc;
    }
    return 0;
}

static int on_news(gen *s, int news, tp_err *err)
{
    if (news == TP_NEXT_RESTARTED)
        return after_restart(s, err);
    if (news == TP_NEXT_SILENT)
        return after_silence(s, err);
    if (news == TP_NEXT_ALIVE)
        say(s, "tokpiped heartbeats again (none for %lld ms)", (long long)tp_client_liveness(s->c)->silent_ms);
    return 0;
}

static int follow(gen *s, tp_err *err)
{
    while (pending(s)) {
        tp_recv ev;
        int rc = tp_client_next_event(s->c, IDLE_POLL_MS, &ev, err);
        if (rc < 0)
            return rc;
        if (rc == TP_NEXT_EVENT) {
            on_event(s, &ev.m);
            tp_recv_free(&ev);
        } else if (rc != TP_NEXT_TIMEOUT) {
            if ((rc = on_news(s, rc, err)))
                return rc;
            continue;
        }
        for (size_t i = 0; i < s->n; i++) {
            job *j = &s->jobs[i];
            /* quiet for a poll interval, or finished with a gap: STATUS decides */
            bool stuck = rc == TP_NEXT_TIMEOUT || (j->gap && j->reason != TP_REASON_NONE);
            if (j->accepted && !j->done && stuck && (rc = catch_up(s, j, err)) < 0)
                return rc;
        }
    }
    return 0;
}

static void print_json(const job *j)
{
    cJSON *o = cJSON_CreateObject(), *toks = cJSON_CreateArray();
    if (j->prompt)
        cJSON_AddStringToObject(o, "prompt", j->prompt);
    else
        cJSON_AddNullToObject(o, "prompt");
    if (j->rejected) {
        cJSON_AddNumberToObject(o, "status", j->rejected);
        cJSON_AddStringToObject(o, "error", j->error);
        cJSON_Delete(toks);
        evfmt_print_line(stdout, o);
        return;
    }
    cJSON_AddStringToObject(o, "text", tp_buf_str(&j->text));
    for (size_t i = 0; i < j->n_ids; i++)
        cJSON_AddItemToArray(toks, cJSON_CreateNumber(j->ids[i]));
    cJSON_AddItemToObject(o, "tokens", toks);
    /* a job that ended for its calls says so, as an OpenAI gateway does */
    bool called = tp_reason_ends_in_calls(j->reason, j->tool_calls ? (size_t)cJSON_GetArraySize(j->tool_calls) : 0,
                                          j->tool_calls_cut);
    cJSON_AddStringToObject(o, "finish_reason", called ? "tool_calls" : tp_reason_name(j->reason));
    if (j->detail[0])
        cJSON_AddStringToObject(o, "finish_detail", j->detail);
    if (j->grammar_complete >= 0)
        cJSON_AddBoolToObject(o, "grammar_complete", j->grammar_complete);
    cJSON_AddItemToObject(o, "matched", j->matched ? cJSON_Duplicate(j->matched, 1) : cJSON_CreateNull());
    cJSON_AddNumberToObject(o, "prompt_tokens", j->prompt_tokens);
    cJSON_AddNumberToObject(o, "cached_tokens", j->cached_tokens);
    cJSON_AddNumberToObject(o, "completion_tokens", j->completion_tokens);
    char seed[24];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)j->seed);
    cJSON_AddRawToObject(o, "seed", seed);
    if (j->spec) {   /* as tokpipe run --json */
        cJSON_AddNumberToObject(o, "draft_tokens", j->draft_tokens);
        cJSON_AddNumberToObject(o, "draft_accepted", j->draft_accepted);
    }
    if (j->logprobs)
        cJSON_AddItemToObject(o, "logprobs", cJSON_Duplicate(j->logprobs, 1));
    if (j->reasoning)
        cJSON_AddItemToObject(o, "reasoning_content", cJSON_Duplicate(j->reasoning, 1));
    if (j->tool_calls)
        cJSON_AddItemToObject(o, "tool_calls", cJSON_Duplicate(j->tool_calls, 1));
    evfmt_print_line(stdout, o);
}

static void print_results(const gen *s)
{
    for (size_t i = 0; i < s->n; i++) {
        const job *j = &s->jobs[i];
        if (s->g.json)
            print_json(j);
        else if (s->stream)
            putchar('\n');
        else
            printf("%s\n", tp_buf_str(&j->text));
    }
    fflush(stdout);
}

/* Ctrl-C: cancel every job still running (all CANCELs first, then the
 * replies), so the daemon stops spending forward steps on them. A second
 * Ctrl-C meanwhile kills us the default way. */
static void cancel_all(gen *s)
{
    tp_err err;
    size_t sent = 0;
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    tp_client_set_interrupt_fd(s->c, -1);
    for (size_t i = 0; i < s->n; i++) {
        job *j = &s->jobs[i];
        if (!j->accepted || j->done)
            continue;
        tp_msg m;
        tp_msg_init(&m, TP_FAM_JOB, TP_CMD_CANCEL);
        m.jobref.job_id = tp_str_of(j->id);
        sent += tp_client_send(s->c, &m, NULL, &err) == 0;
    }
    for (size_t k = 0; k < sent; k++) {
        tp_recv r;
        if (tp_client_recv_reply(s->c, &r, &err))
            break;
        tp_recv_free(&r);
    }
    fprintf(stderr, "%stokpipe generate: interrupted, cancelled %zu job(s)\n", s->stream ? "\n" : "", sent);
}

/* Self-pipe for SIGINT/SIGTERM. A handler can reach nothing but static
 * storage, so the write end is this file's one static: set once before the
 * handlers are installed and never changed. (Blocking the signals and using
 * a signalfd is not enough: a thread created before main, e.g. by a
 * library's constructor, may not block them and would take the signal.) */
static int interrupt_pipe_w = -1;

static void on_signal(int sig)
{
    (void)sig;
    int saved = errno;
    if (write(interrupt_pipe_w, "!", 1) < 0) {
        /* pipe full: an interrupt is already pending */
    }
    errno = saved;
}

static void catch_signals(gen *s)
{
    int p[2];
    s->sigfd = s->sigfd_w = -1;
    if (interrupt_pipe_w >= 0 || pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0)
        return;
    s->sigfd = p[0], s->sigfd_w = p[1];
    interrupt_pipe_w = p[1];
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

static int parse(gen *s, int argc, char **argv, tp_err *err)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            return 1;
        int rc = genopts_parse_one(&s->g, argc, argv, &i, err);
        if (rc == 0)
            rc = tp_client_parse_arg(&s->a, argc, argv, &i, err);
        if (rc < 0)
            return rc;
        if (rc == 0)
            return tp_err_set(err, TP_EINVAL, "unknown argument '%s'", argv[i]);
    }
    return genopts_check_prompt(&s->g, err);
}

/* A job that ended in error, or was cancelled by someone else, is a
 * failure of this command: named on stderr, exit status 1. */
static int check_outcomes(gen *s, tp_err *err)
{
    size_t bad = 0;
    for (size_t i = 0; i < s->n; i++) {
        const job *j = &s->jobs[i];
        if (j->rejected) {
            bad++;
            continue;   /* named on stderr when its ACK came */
        }
        if (j->reason == TP_REASON_ERROR)
            say(s, "job %s (prompt %zu) failed: %s", j->id, i + 1, j->error[0] ? j->error : "error");
        else if (j->reason == TP_REASON_CANCELLED)
            say(s, "job %s (prompt %zu) was cancelled (by another client, or tokpiped shutting down)", j->id, i + 1);
        if (j->diverged)
            say(s, "job %s (prompt %zu): after tokpiped restarted, its text differs from what was printed", j->id,
                i + 1);
        bad += j->reason == TP_REASON_ERROR || j->reason == TP_REASON_CANCELLED || j->diverged;
    }
    return bad ? tp_err_set(err, TP_ESTATE, "%zu of %zu job(s) did not complete", bad, s->n) : 0;
}

static int run(gen *s, tp_err *err)
{
    s->jobs = calloc(s->n, sizeof *s->jobs);
    if (!s->jobs)
        return tp_err_set(err, TP_ENOMEM, "out of memory");
    catch_signals(s);
    int rc = tp_client_open(&s->a, true, true, &s->c, err);
    if (!rc)
        tp_client_set_interrupt_fd(s->c, s->sigfd);
    for (size_t i = 0; i < s->n; i++)
        s->jobs[i].text.lenient = true;
    for (size_t i = 0; i < s->n && !rc; i++) {
        s->jobs[i].prompt = s->g.n_messages ? NULL : s->g.prompts[i];
        s->jobs[i].grammar_complete = -1;
        tp_client_job_id(s->jobs[i].id, sizeof s->jobs[i].id, (unsigned)i);
        rc = tp_client_subscribe(s->c, s->jobs[i].id, err);
    }
    if (!rc)   /* last: its first heartbeat shows the job subscriptions are in force */
        rc = tp_client_subscribe_heartbeat(s->c, err);
    if (!rc)
        rc = tp_client_wait_events_ready(s->c, err);
    if (!rc)
        rc = submit_all(s, err);
    if (!rc)
        rc = follow(s, err);
    if (rc == TP_ESTATE && !strcmp(err->msg, "interrupted") && s->sigfd >= 0) {
        cancel_all(s);
        return 130;
    }
    if (!rc) {
        print_results(s);
        s->results_out = true;
        rc = check_outcomes(s, err);
    }
    return rc;
}

/* The SUBMIT every prompt would carry, encoded and dropped: a flag value the
 * protocol refuses (--max-tokens 0) is bad usage, found before anything is
 * sent, as the values the flag parser checks itself are. */
static int check_submit(gen *s, tp_err *err)
{
    job probe;
    memset(&probe, 0, sizeof probe);
    snprintf(probe.id, sizeof probe.id, "probe");
    probe.prompt = s->g.n_messages || !s->g.n_prompts ? NULL : s->g.prompts[0];
    tp_msg m;
    fill_submit(s, &probe, &m);
    tp_wire w;
    int rc = tp_proto_encode(&m, &w, err);
    if (!rc)
        tp_wire_free(&w);
    return rc;
}

int cmd_generate(int argc, char **argv)
{
    gen s;
    tp_err err = {0};
    memset(&s, 0, sizeof s);
    genopts_init(&s.g);
    int rc = parse(&s, argc, argv, &err);
    if (rc == 1)
        return usage(stdout, 0);
    if (rc < 0) {
        fprintf(stderr, "tokpipe generate: %s\n", err.msg);
        return usage(stderr, 2);
    }
    if (check_submit(&s, &err)) {
        const char *why = strstr(err.msg, ": ");   /* past the encoder's "encode SUBMIT" */
        fprintf(stderr, "tokpipe generate: %s\n", why ? why + 2 : err.msg);
        genopts_free(&s.g);
        return usage(stderr, 2);
    }
    s.n = s.g.n_messages ? 1 : s.g.n_prompts;
    s.stream = s.n == 1 && !s.g.json;
    s.sigfd = -1;
    rc = run(&s, &err);
    if (rc && rc != 130)
        fprintf(stderr, "%stokpipe generate: %s\n", s.stream && s.jobs && s.jobs[0].printed && !s.results_out ? "\n" : "",
                err.msg);
    for (size_t i = 0; s.jobs && i < s.n; i++)
        tp_buf_free(&s.jobs[i].text), free(s.jobs[i].ids), free(s.jobs[i].was), cJSON_Delete(s.jobs[i].matched),
            cJSON_Delete(s.jobs[i].logprobs), cJSON_Delete(s.jobs[i].tool_calls), cJSON_Delete(s.jobs[i].reasoning);
    free(s.jobs);
    genopts_free(&s.g);
    tp_client_free(s.c);
    if (s.sigfd >= 0)
        close(s.sigfd), close(s.sigfd_w);
    return rc == 130 ? 130 : rc ? 1 : 0;
}
