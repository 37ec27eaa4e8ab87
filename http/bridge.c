/* The bridge thread: the only owner of the gateway's ZeroMQ sockets (a
 * DEALER on the broker's front, a SUB on its events). It turns queued HTTP
 * calls into SUBMIT / STATS requests, follows the jobs' events and writes
 * the answers back into the calls (gw.h says who owns what).
 *
 * Every job id the gateway submits starts with a random per-run prefix and
 * the SUB socket subscribes to that prefix once, then to the heartbeat
 * topic: the first heartbeat proves the subscription is in force, so no
 * job of this gateway can lose its first events, and no per-job
 * subscription dance is needed.
 *
 * A standby pair (standby.peer_front/peer_events): both fronts on the
 * DEALER, both event streams on the SUB. A broker lost (heartbeats stop, or
 * a new incarnation heartbeats) costs no client anything: its open jobs are
 * submitted again with their ids, params and first-ACK seeds, and the
 * replayed events whose seq was already forwarded are dropped. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>
#include <microhttpd.h>
#include <zmq.h>

#include "gw.h"

#include <cjson/cJSON.h>
#include "tokpipe/zsec.h"
#include "tokpipe/zwire.h"

#define REQ_CANCEL_BIT (UINT64_C(1) << 63)
#define REQ_SHIFT 12                 /* low bits: 0 = STATS, i + 1 = SUBMIT of choice i */
#define POLL_MS 100
#define RESEND_MS 50                 /* a passive (or not yet ready) broker refused a SUBMIT: again after */
#define REACK_MS 1000                /* a resubmitted job not ACKed: SUBMIT again (a 409 says it got there) */
#define MAX_POLL_FDS 1024

typedef struct bridge {
    gw *g;
    void *zctx, *dealer, *sub;
    char prefix[16];                 /* "h1a2b3c4d-": every job id of this run */
    bool ready;                      /* first heartbeat seen */
    bool standby;                    /* a standby pair: the front and events of both brokers */
    bool lost;                       /* jobs resubmitted after a silence: the next incarnation is expected */
    uint64_t incarnation;
    int64_t last_beat_ms, silence_ms;
    gw_call **calls;                 /* calls the bridge holds a reference to */
    size_t n_calls, cap_calls;
} bridge;

static void log_line(const char *fmt, const char *a)
{
    fprintf(stderr, "tokpipe-http: ");
    fprintf(stderr, fmt, a);
    fputc('\n', stderr);
}

static bool str_is(tp_str s, const char *want)
{
    return s.ptr && s.len == strlen(want) && !memcmp(s.ptr, want, s.len);
}

/* ---- answering calls (bridge side) -------------------------------------- */

/* Hand the connection back to MHD if it waits for us. Caller holds
 * gw.lock; MHD_resume_connection only queues the connection for MHD's
 * thread, which takes gw.lock in its callbacks only after that. */
static void wake_locked(gw_call *c)
{
    if (c->suspended && !c->http_done) {
        c->suspended = false;
        MHD_resume_connection(c->conn);
    }
}

static void reply(bridge *b, gw_call *c, int status, char *body, const char *ctype, int retry_after)
{
    pthread_mutex_lock(&b->g->lock);
    if (!c->replied) {
        c->status = body ? status : 500;
        c->body = body;
        c->body_len = body ? strlen(body) : 0;
        c->content_type = ctype;
        c->retry_after = retry_after;
        c->replied = true;
        c->out_done = true;
        wake_locked(c);
    } else {
        free(body);
    }
    pthread_mutex_unlock(&b->g->lock);
}

static void reply_error(bridge *b, gw_call *c, int status, const char *msg, const char *param, int retry)
{
    reply(b, c, status, c->api ? c->api->error(status, msg, param, NULL) : gw_error_json(status, msg, param),
          "application/json", retry);
}

/* A 400 with a string code: context_length_exceeded (OpenAI's code, the
 * prompt does not fit the context) or prompt_too_large. */
static void reply_rejected(bridge *b, gw_call *c, const char *msg, const char *param, const char *code)
{
    reply(b, c, 400, c->api->error(400, msg, param, code), "application/json", 0);
}

/* The TP_CODE_* of a FINISH error_code that says the client erred, or NULL. */
static const char *rejected_code(tp_str code)
{
    if (code.ptr && str_is(code, TP_CODE_CONTEXT))
        return TP_CODE_CONTEXT;
    if (code.ptr && str_is(code, TP_CODE_PROMPT_SIZE))
        return TP_CODE_PROMPT_SIZE;
    return NULL;
}

/* Streaming: append SSE bytes (takes s) and wake the connection. */
static void push(bridge *b, gw_call *c, char *s, bool done)
{
    pthread_mutex_lock(&b->g->lock);
    if (s && tp_buf_puts(&c->out, s))
        done = true;   /* out of memory: end the stream rather than lose bytes in its middle */
    if (done)
        c->out_done = true;
    wake_locked(c);
    pthread_mutex_unlock(&b->g->lock);
    free(s);
}

static void send_cancel(bridge *b, const gw_choice *ch)
{
    tp_msg m;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_CANCEL);
    m.req = REQ_CANCEL_BIT;
    m.jobref.job_id = tp_str_of(ch->job_id);
    tp_err e;
    /* a standby pair: the DEALER deals two sends to both brokers in turn,
     * so the active one gets it (the passive one refuses; with one broker
     * up, the second finds the job gone: both replies are ignored) */
    for (int k = 0; k < (b->standby ? 2 : 1); k++)
        if (tp_zsend_msg(b->dealer, NULL, 0, &m, &e))
            log_line("cancel: %s", e.msg);
}

/* Cancel the call's jobs that may still run (accepted and not finished). */
static void cancel_jobs(bridge *b, gw_call *c)
{
    if (c->cancelled)
        return;
    c->cancelled = true;
    for (size_t i = 0; i < c->n_ch; i++)
        if (c->ch[i].acked && !c->ch[i].finished)
            send_cancel(b, &c->ch[i]);
}

static void fail_call(bridge *b, gw_call *c, int status, const char *msg, const char *param, int retry)
{
    cancel_jobs(b, c);
    if (c->oreq.stream && c->replied) {
        /* the 200 and some chunks are out: say it in the stream */
        push(b, c, c->api->stream_error(status, msg, param), true);
        return;
    }
    reply_error(b, c, status, msg, param, retry);
}

/* The answer is complete (out_done is written by this thread only). */
static bool call_over(const gw_call *c)
{
    return c->out_done;
}

/* Streaming: all jobs accepted, so the answer is 200 and SSE follows. */
static void start_stream(bridge *b, gw_call *c)
{
    pthread_mutex_lock(&b->g->lock);
    c->status = 200;
    c->content_type = "text/event-stream";
    c->replied = true;
    wake_locked(c);
    pthread_mutex_unlock(&b->g->lock);
    if (c->api->open)
        push(b, c, c->api->open(c, b->g->model_name), false);
}

/* ---- the call table ------------------------------------------------------ */

static int add_call(bridge *b, gw_call *c)
{
    if (b->n_calls == b->cap_calls) {
        size_t cap = b->cap_calls ? 2 * b->cap_calls : 64;
        gw_call **p = realloc(b->calls, cap * sizeof *p);
        if (!p)
            return -1;
        b->calls = p;
        b->cap_calls = cap;
    }
    b->calls[b->n_calls++] = c;
    return 0;
}

static void free_choices(gw_call *c)
{
    for (size_t i = 0; i < c->n_ch; i++) {
        tp_buf_free(&c->ch[i].text);
        tp_buf_free(&c->ch[i].reasoning);
        cJSON_Delete(c->ch[i].tool_calls);
        for (size_t k = 0; k < c->ch[i].n_scalls; k++)
            free(c->ch[i].scalls[k].id);
        free(c->ch[i].scalls);
        free(c->ch[i].matched_buf);
        free(c->ch[i].error);
        free(c->ch[i].embd);
        gw_lp_free(&c->ch[i].lp);
    }
    free(c->ch);
    c->ch = NULL;
}

static void drop_call(bridge *b, size_t k)
{
    gw_call *c = b->calls[k];
    b->calls[k] = b->calls[--b->n_calls];
    pthread_mutex_lock(&b->g->lock);
    free_choices(c);
    c->n_ch = 0;
    gw_call_unref(c);
    pthread_mutex_unlock(&b->g->lock);
}

static gw_call *find_call(bridge *b, uint64_t no)
{
    for (size_t i = 0; i < b->n_calls; i++)
        if (b->calls[i]->no == no)
            return b->calls[i];
    return NULL;
}

/* Job ids are PREFIX + call number + "-" + choice. */
static gw_choice *find_job(bridge *b, const tp_str *id, gw_call **call)
{
    size_t pl = strlen(b->prefix);
    if (id->len <= pl || memcmp(id->ptr, b->prefix, pl))
        return NULL;
    char tmp[TP_PROTO_MAX_JOB_ID + 1];
    size_t n = id->len < sizeof tmp - 1 ? id->len : sizeof tmp - 1;
    memcpy(tmp, id->ptr, n);
    tmp[n] = '\0';
    char *end;
    uint64_t no = strtoull(tmp + pl, &end, 10);
    if (*end != '-')
        return NULL;
    size_t i = strtoull(end + 1, &end, 10);
    gw_call *c = find_call(b, no);
    if (!c || *end || i >= c->n_ch)
        return NULL;
    *call = c;
    return &c->ch[i];
}

/* ---- sending ------------------------------------------------------------- */

static void send_stats(bridge *b, gw_call *c)
{
    tp_msg m;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_STATS);
    m.req = c->no << REQ_SHIFT;
    tp_err e;
    /* a standby pair: one to each broker (the DEALER deals in turn); the
     * passive one's answer has no workers (on_stats waits for the other) */
    c->stats_left = b->standby ? 2 : 1;
    for (int k = 0; k < c->stats_left; k++)
        if (tp_zsend_msg(b->dealer, NULL, 0, &m, &e)) {
            reply_error(b, c, 503, e.msg, NULL, 0);
            return;
        }
}

/* The field an encoder or broker message names: the word before ": "
 * ("encode SUBMIT: params.top_p: 1.5 is outside (0, 1]" -> "top_p"). */
static void param_of_message(const gw_call *c, const char *msg, const char *field, char *out, size_t cap)
{
    char f[TP_PROTO_MAX_NAME + 1] = "";
    if (field && field[0]) {
        snprintf(f, sizeof f, "%s", field);
    } else if (msg) {
        for (const char *p = strstr(msg, ": "); p; p = strstr(p + 2, ": ")) {
            const char *w = p;
            while (w > msg && w[-1] != ' ')
                w--;
            size_t n = (size_t)(p - w);
            if (n < sizeof f && (!strncmp(w, "params.", 7) || !strncmp(w, "prompt", 6) ||
                                 !strncmp(w, "messages", 8) || !strncmp(w, "tool", 4))) {
                memcpy(f, w, n);
                f[n] = '\0';
                break;
            }
        }
    }
    c->api->param(f, out, cap);
}

/* The encoder's message without its "encode SUBMIT: " preamble. */
static const char *plain_message(const char *msg)
{
    const char *p = strncmp(msg, "encode ", 7) ? NULL : strstr(msg, ": ");
    return p ? p + 2 : msg;
}

/* The limits the broker applies (the same configuration), checked here
 * too: a request far over them would not fit one SUBMIT header (4 MiB)
 * and the encoder's refusal would name no field. */
static bool within_limits(bridge *b, gw_call *c)
{
    const tp_config *cfg = b->g->cfg;
    char msg[192];
    for (size_t i = 0; i < c->oreq.n_prompts; i++) {
        const oai_prompt *p = &c->oreq.prompts[i];
        if (p->text && p->text_len > (size_t)cfg->max_prompt_bytes) {
            snprintf(msg, sizeof msg, "prompt: %zu bytes, the limit is %d", p->text_len, cfg->max_prompt_bytes);
            fail_call(b, c, 413, msg, "prompt", 0);
            return false;
        }
    }
    size_t bytes = 0;
    for (size_t i = 0; i < c->oreq.n_messages; i++)
        bytes += c->oreq.messages[i].role.len + c->oreq.messages[i].content.len;
    if (bytes > (size_t)cfg->max_prompt_bytes) {
        snprintf(msg, sizeof msg, "messages: %zu bytes of roles and contents, the limit is %d", bytes,
                 cfg->max_prompt_bytes);
        fail_call(b, c, 413, msg, "messages", 0);
        return false;
    }
    const tp_params *p = &c->oreq.params;
    for (size_t i = 0; i < p->n_stop; i++)
        if (p->stop[i].len > (size_t)cfg->max_stop_len) {
            /* the broker's words for it (daemon/front.c) */
            char field[48], param[64];
            snprintf(field, sizeof field, "params.stop[%zu]", i);
            c->api->param(field, param, sizeof param);
            snprintf(msg, sizeof msg, "%s: %zu bytes, the limit is %d", field, p->stop[i].len, cfg->max_stop_len);
            fail_call(b, c, 413, msg, param, 0);
            return false;
        }
    return true;
}

/* The encoder refused a SUBMIT header over TP_PROTO_MAX_HEADER: name the
 * field that holds the most of it (repeated stop strings can get there
 * within every per-field limit). */
static void fail_header(bridge *b, gw_call *c, const tp_m_submit *s, const char *why)
{
    size_t prompt = s->prompt.len, msgs = 0, stops = 0;
    for (size_t i = 0; i < s->n_messages; i++)
        msgs += s->messages[i].role.len + s->messages[i].content.len;
    for (size_t i = 0; i < s->params.n_stop; i++)
        stops += s->params.stop[i].len;
    const char *field = stops >= prompt && stops >= msgs ? "stop" : msgs > prompt ? "messages" : "prompt";
    char msg[TP_ERR_MSG_MAX + 160];
    snprintf(msg, sizeof msg,
             "%s: the job does not fit one request to tokpiped (%s; PROTOCOL.md limits: a SUBMIT header holds "
             "at most %u bytes)", field, why, TP_PROTO_MAX_HEADER);
    fail_call(b, c, 413, msg, field, 0);
}

/* SUBMIT choice i of c: its prompt and params as the request gave them,
 * and once an ACK reported it, that seed (a resubmission replays the job).
 * 0 sent; -1 the call failed (answered); 1 the socket refused it now. */
static int submit_one(bridge *b, gw_call *c, size_t i)
{
    gw_choice *ch = &c->ch[i];
    const oai_prompt *p = c->oreq.n_prompts ? &c->oreq.prompts[ch->prompt] : NULL;
    tp_msg m;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_SUBMIT);
    m.req = (c->no << REQ_SHIFT) | (i + 1);
    m.submit.job_id = tp_str_of(ch->job_id);
    if (!p) {
        m.submit.messages = c->oreq.messages;
        m.submit.n_messages = c->oreq.n_messages;
        m.submit.tools = c->oreq.tools;
        if (c->oreq.tool_choice)
            m.submit.tool_choice = tp_str_of(c->oreq.tool_choice);
        if (c->oreq.tool_choice_name)
            m.submit.tool_choice_name = tp_str_of(c->oreq.tool_choice_name);
        if (c->oreq.reasoning_effort)
            m.submit.reasoning_effort = tp_str_of(c->oreq.reasoning_effort);
    } else if (p->text)
        m.submit.prompt = (tp_str){p->text, p->text_len};
    else
        m.submit.prompt_ids = (tp_raw){p->ids, p->n_ids};
    m.submit.params = c->oreq.params;
    m.submit.embed = tp_str_of(c->oreq.embed);
    /* choice j of a prompt: seed + j, so n > 1 gives n different samples
     * that each replay alone with that seed */
    if (c->oreq.has_seed)
        m.submit.params.seed += i % (size_t)c->oreq.n;
    if (ch->seeded) {
        m.submit.params.set |= TP_P_SEED;
        m.submit.params.seed = ch->seed;
    }
    ch->sent_ms = tp_now_ms();
    tp_err e;
    tp_err_clear(&e);
    int rc = tp_zsend_msg(b->dealer, NULL, 0, &m, &e);
    if (rc == TP_ERANGE && strstr(e.msg, "header: ")) {
        fail_header(b, c, &m.submit, strstr(e.msg, "header: "));
        return -1;
    }
    if (rc && rc != TP_EIO) {   /* our encoder refused it: a bad value */
        char param[64];
        param_of_message(c, e.msg, NULL, param, sizeof param);
        fail_call(b, c, 400, plain_message(e.msg), param, 0);
        return -1;
    }
    if (rc && !ch->resubmitted) {
        fail_call(b, c, 503, e.msg, NULL, 0);
        return -1;
    }
    return rc ? 1 : 0;
}

static void submit_all(bridge *b, gw_call *c)
{
    if (!within_limits(b, c))
        return;
    for (size_t i = 0; i < c->n_ch; i++)
        if (submit_one(b, c, i) < 0)
            return;
}

/* The broker that had c's jobs is lost (gone silent, or a new incarnation
 * heartbeats): submit each unfinished one again, same id, params and seed,
 * to whichever broker serves now. Jobs are deterministic, so the new run's
 * events repeat the old ones: those of seq < skip were forwarded already
 * and are dropped (on_event), and the client's stream goes on unbroken. */
static void resubmit_call(bridge *b, gw_call *c)
{
    int64_t now = tp_now_ms();
    size_t n = 0;
    for (size_t i = 0; i < c->n_ch; i++) {
        gw_choice *ch = &c->ch[i];
        if (ch->finished)
            continue;
        if (ch->next_seq > ch->skip)
            ch->skip = ch->next_seq;
        ch->next_seq = 0;
        if (ch->acked) {
            ch->acked = false;
            c->n_acked--;
        }
        ch->resubmitted = true;
        ch->resend_ms = 0;
        n++;
    }
    if (!n)
        return;
    c->deadline_ms = now + b->g->cfg->http_timeout_ms;   /* for the new ACKs (sweep) */
    pthread_mutex_lock(&b->g->lock);
    b->g->counters.jobs_resubmitted += n;
    if (c->oreq.stream)
        b->g->counters.streams_resumed++;
    pthread_mutex_unlock(&b->g->lock);
    for (size_t i = 0; i < c->n_ch; i++) {
        gw_choice *ch = &c->ch[i];
        if (!ch->finished && submit_one(b, c, i) > 0)
            ch->resend_ms = now + RESEND_MS;
        if (call_over(c))
            return;
    }
}

static void resubmit_open(bridge *b, const char *why)
{
    size_t n = 0;
    for (size_t i = 0; i < b->n_calls; i++) {
        gw_call *c = b->calls[i];
        if (c->n_ch && !call_over(c) && !c->cancelled) {
            resubmit_call(b, c);
            n++;
        }
    }
    if (n) {
        char line[200];
        snprintf(line, sizeof line, "%s: %zu call(s) submitted again (same job ids and seeds)", why, n);
        log_line("%s", line);
    }
}

/* The token before the first generated one, which its bytes may depend on
 * (SentencePiece drops the leading space after BOS): the last id of an
 * id prompt; BOS for an empty text prompt that gets one; else none. */
static int32_t first_prev(const bridge *b, const gw_call *c, size_t prompt)
{
    const oai_prompt *p = c->oreq.n_prompts ? &c->oreq.prompts[prompt] : NULL;
    if (!p)
        return -1;
    if (!p->text)
        return p->ids[p->n_ids - 1];
    if (!p->text_len && b->g->tok && tp_tokenizer_add_bos(b->g->tok))
        return tp_tokenizer_bos_id(b->g->tok);
    return -1;
}

static void start_call(bridge *b, gw_call *c)
{
    c->deadline_ms = tp_now_ms() + b->g->cfg->http_timeout_ms;
    if (!b->ready) {
        c->waiting = true;
        return;
    }
    c->waiting = false;
    if (c->kind != GW_CALL_COMPLETION) {
        send_stats(b, c);
        return;
    }
    /* a conversation is one prompt */
    size_t n = (c->oreq.kind == OAI_CHAT ? 1 : c->oreq.n_prompts) * (size_t)c->oreq.n;
    c->ch = calloc(n, sizeof *c->ch);
    if (!c->ch) {
        reply_error(b, c, 500, "gateway: out of memory", NULL, 0);
        return;
    }
    c->n_ch = n;
    for (size_t i = 0; i < n; i++) {
        c->ch[i].prompt = i / (size_t)c->oreq.n;
        if (c->oreq.logprobs)
            gw_lp_init(&c->ch[i].lp, (uint32_t)c->oreq.top_logprobs, first_prev(b, c, c->ch[i].prompt));
        snprintf(c->ch[i].job_id, sizeof c->ch[i].job_id, "%s%" PRIu64 "-%zu", b->prefix, c->no, i);
    }
    submit_all(b, c);
}

/* ---- replies and events -------------------------------------------------- */

static void on_ack(bridge *b, gw_call *c, size_t i, const tp_msg *m)
{
    gw_choice *ch = &c->ch[i];
    bool passive = m->status == TP_ST_UNAVAILABLE && str_is(m->error, TP_STANDBY_PASSIVE_ERROR);
    if ((passive && b->standby) || (ch->resubmitted && m->status == TP_ST_UNAVAILABLE)) {
        /* a passive standby broker: the DEALER takes the other one next; a
         * broker that just took over may have no workers yet (sweep gives
         * up at the deadline) */
        ch->resend_ms = tp_now_ms() + RESEND_MS;
        return;
    }
    /* a resubmission that meets its own job: an earlier SUBMIT of ours got there */
    bool ours = ch->resubmitted && m->status == TP_ST_CONFLICT;
    if ((m->status == 200 && m->cmd == TP_CMD_ACK) || ours) {
        ch->acked = true;
        c->n_acked++;
        if (!ours && !ch->seeded && (m->ack.set & TP_ACK_SEED)) {
            ch->seed = m->ack.seed;
            ch->seeded = true;
        }
        if (c->cancelled)   /* the call failed meanwhile: this job is not wanted */
            send_cancel(b, ch);
        /* a stream's 200 waits for every job's first event (on_event): a
         * prompt found too long after the ACK is still a 400 */
        return;
    }
    char msg[TP_PROTO_MAX_ERROR + 1], param[64];
    snprintf(msg, sizeof msg, "%.*s", (int)m->error.len, m->error.ptr ? m->error.ptr : "");
    const char *field = m->cmd == TP_CMD_ACK ? NULL : m->bad_field;
    char fieldbuf[TP_PROTO_MAX_NAME + 1] = "";
    if (m->cmd == TP_CMD_ACK && m->ack.field.ptr)
        snprintf(fieldbuf, sizeof fieldbuf, "%.*s", (int)m->ack.field.len, m->ack.field.ptr), field = fieldbuf;
    param_of_message(c, msg, field, param, sizeof param);
    /* a constraint refused at admission is named as the request gave it
     * (response_format rather than the SUBMIT key it became) */
    if (c->oreq.constraint_param[0] &&
        (!strcmp(param, "grammar") || !strcmp(param, "json_schema") || !strcmp(param, "json_mode")))
        snprintf(param, sizeof param, "%s", c->oreq.constraint_param);
    int st = m->status;
    int http = st == 400 || st == 413 || st == 429 || st == 503 ? st : 500;
    if (!msg[0])
        snprintf(msg, sizeof msg, "tokpiped refused the job (status %d)", st);
    if (st == 400 && m->cmd == TP_CMD_ACK && m->ack.error_code.ptr &&
        str_is(m->ack.error_code, TP_CODE_CONTEXT)) {
        cancel_jobs(b, c);
        reply_rejected(b, c, msg, param, TP_CODE_CONTEXT);
        return;
    }
    fail_call(b, c, http, msg, param, st == 429 ? 1 : 0);
}

static bool no_workers(const tp_m_stats_reply *s)
{
    for (int k = 0; k < 4; k++)
        if (s->workers[k])
            return false;
    return true;
}

static void on_stats(bridge *b, gw_call *c, const tp_msg *m)
{
    if (c->stats_left-- > 1 && (m->cmd != TP_CMD_STATS_REPLY || m->status != 200 || no_workers(&m->stats_reply)))
        return;   /* maybe the passive broker of a pair: the other's answer follows */
    if (m->cmd != TP_CMD_STATS_REPLY || m->status != 200) {
        reply_error(b, c, 503, "tokpiped did not answer STATS", NULL, 0);
        return;
    }
    if (c->kind == GW_CALL_HEALTH) {
        int st;
        char *body = gw_health_json(&m->stats_reply, &st);
        reply(b, c, st, body, "application/json", 0);
    } else {
        gw_counters gc;
        pthread_mutex_lock(&b->g->lock);
        gc = b->g->counters;
        pthread_mutex_unlock(&b->g->lock);
        reply(b, c, 200, gw_metrics_text(&m->stats_reply, &gc), "text/plain; version=0.0.4; charset=utf-8", 0);
    }
}

static void on_front(bridge *b, tp_zmsg *z)
{
    tp_msg m;
    tp_err e;
    int rc = tp_proto_decode(TP_FAM_JOB, z->f, z->n, &m, &e);
    if (rc && m.req == 0) {
        log_line("undecodable reply from tokpiped: %s", e.msg);
        tp_msg_clear(&m);
        return;
    }
    if (!(m.req & REQ_CANCEL_BIT)) {
        gw_call *c = find_call(b, m.req >> REQ_SHIFT);
        size_t low = m.req & ((1u << REQ_SHIFT) - 1);
        if (c && low == 0 && c->kind != GW_CALL_COMPLETION)
            on_stats(b, c, &m);
        else if (c && low >= 1 && low <= c->n_ch && !c->ch[low - 1].acked)
            on_ack(b, c, low - 1, &m);
    }
    tp_msg_clear(&m);
}

static int keep_matched(gw_choice *ch, const tp_matched *mt)
{
    ch->matched = *mt;
    if (mt->kind == TP_MATCHED_STR) {
        ch->matched_buf = malloc(mt->str.len + 1);
        if (!ch->matched_buf)
            return -1;
        memcpy(ch->matched_buf, mt->str.ptr, mt->str.len);
        ch->matched_buf[mt->str.len] = '\0';
        ch->matched.str = (tp_str){ch->matched_buf, mt->str.len};
    }
    return 0;
}

/* A text delta of choice i, with the logprobs entries of the tokens it
 * completes (lp.h); final/all as gw_lp_release. */
static void deliver_text(bridge *b, gw_call *c, size_t i, const tp_str *t, bool final, bool all)
{
    gw_choice *ch = &c->ch[i];
    size_t from = ch->lp_sent, to = from;
    if (c->oreq.logprobs)
        to = gw_lp_release(&ch->lp, t->len, final, all);
    if (!t->len && to == from)
        return;   /* held back: nothing that can no longer change */
    if (c->oreq.stream) {
        ch->lp_sent = to;
        push(b, c, c->api->text(c, b->g->model_name, i, t->ptr, t->len, from, to), false);
    } else if (tp_buf_add(&ch->text, t->ptr, t->len)) {
        fail_call(b, c, 500, "gateway: out of memory", NULL, 0);
    }
}

/* Thinking text of choice i: kept, and streamed as delta.reasoning_content. */
static void deliver_reasoning(bridge *b, gw_call *c, size_t i, const char *s, size_t n)
{
    gw_choice *ch = &c->ch[i];
    if (tp_buf_add(&ch->reasoning, s, n)) {
        fail_call(b, c, 500, "gateway: out of memory", NULL, 0);
        return;
    }
    if (c->oreq.stream) {
        push(b, c, c->api->reasoning(c, b->g->model_name, i, s, n), false);
        ch->reasoning_sent = ch->reasoning.len;
    }
}

/* Streaming: the part of call (id, name, arguments) not yet out, as
 * OpenAI's chunks: its first chunk when it is new, then what its
 * arguments add to the bytes already sent (TOKEN deltas carry a fragment;
 * FINISH the whole, of which only the tail is new). */
static void deliver_call(bridge *b, gw_call *c, size_t i, const tp_tool_call *t, bool whole)
{
    gw_choice *ch = &c->ch[i];
    size_t k = 0;
    while (k < ch->n_scalls && (strlen(ch->scalls[k].id) != t->id.len || memcmp(ch->scalls[k].id, t->id.ptr, t->id.len)))
        k++;
    if (k == ch->n_scalls) {
        if (ch->n_scalls == ch->cap_scalls) {
            size_t cap = ch->cap_scalls ? ch->cap_scalls * 2 : 4;
            struct gw_scall *p = realloc(ch->scalls, cap * sizeof *p);
            if (!p) {
                fail_call(b, c, 500, "gateway: out of memory", NULL, 0);
                return;
            }
            ch->scalls = p;
            ch->cap_scalls = cap;
        }
        char *id = strndup(t->id.ptr ? t->id.ptr : "", t->id.len);
        if (!id) {
            fail_call(b, c, 500, "gateway: out of memory", NULL, 0);
            return;
        }
        ch->scalls[ch->n_scalls++] = (struct gw_scall){id, 0, 0};
        push(b, c, c->api->call(c, b->g->model_name, i, k, t->id.ptr, t->id.len, t->name.ptr, t->name.len, "", 0),
             false);
    }
    struct gw_scall *sc = &ch->scalls[k];
    size_t from = whole ? sc->sent : 0;
    if (t->arguments.len > from) {
        push(b, c, c->api->call(c, b->g->model_name, i, k, NULL, 0, NULL, 0, t->arguments.ptr + from,
                                t->arguments.len - from), false);
        sc->sent += t->arguments.len - from;
    }
}

/* FINISH's whole reasoning (its tail not yet streamed) and parsed calls. */
static void finish_split(bridge *b, gw_call *c, size_t i, const tp_m_finish *f)
{
    gw_choice *ch = &c->ch[i];
    const tp_str *r = &f->reasoning_content;
    if (r->len > ch->reasoning.len && !memcmp(r->ptr, ch->reasoning.data ? ch->reasoning.data : "", ch->reasoning.len))
        deliver_reasoning(b, c, i, r->ptr + ch->reasoning.len, r->len - ch->reasoning.len);
    if (f->n_tool_calls) {
        cJSON *a = cJSON_CreateArray();
        for (size_t k = 0; a && k < f->n_tool_calls; k++) {
            const tp_tool_call *t = &f->tool_calls[k];
            cJSON *o = cJSON_CreateObject(), *fn = cJSON_CreateObject();
            char *id = strndup(t->id.ptr, t->id.len), *name = strndup(t->name.ptr, t->name.len);
            char *args = strndup(t->arguments.ptr, t->arguments.len);
            if (!o || !fn || !id || !name || !args) {
                cJSON_Delete(o);
                cJSON_Delete(fn);
                cJSON_Delete(a);
                a = NULL;
            } else {
                cJSON_AddStringToObject(o, "id", id);
                cJSON_AddStringToObject(o, "type", "function");
                cJSON_AddStringToObject(fn, "name", name);
                cJSON_AddStringToObject(fn, "arguments", args);
                cJSON_AddItemToObject(o, "function", fn);
                cJSON_AddItemToArray(a, o);
            }
            free(id);
            free(name);
            free(args);
        }
        if (!a)
            fail_call(b, c, 500, "gateway: out of memory", NULL, 0);
        ch->tool_calls = a;
    }
}

/* Answer the call with choice ch's `error` finish. */
static void fail_choice(bridge *b, gw_call *c, const gw_choice *ch)
{
    const char *param = c->oreq.kind == OAI_CHAT ? "messages" : "prompt";
    if (ch->rejected) {
        /* the broker's "prompt: N tokens, the model's context holds M", the
         * tokenize stage's "messages: the conversation renders to N bytes, ..." */
        const char *msg = ch->error ? ch->error : "the prompt is too long";
        if (c->oreq.stream && c->replied) {
            fail_call(b, c, 400, msg, param, 0);
        } else {
            cancel_jobs(b, c);
            reply_rejected(b, c, msg, param, ch->rejected);
        }
        return;
    }
    /* a conversation the chat template cannot render is the request's
     * fault (PROTOCOL.md: the error says "messages: ") */
    const char *err = ch->error;
    const char *bad = err ? strstr(err, "messages: ") : NULL;
    if (!bad && err)
        bad = strstr(err, "messages[");   /* a call's arguments the template cannot take */
    const char *tools = err && !bad ? strstr(err, "tools") : NULL;
    if (tools && (tools[5] == ':' || tools[5] == '[')) {
        fail_call(b, c, 400, tools, "tools", 0);
        return;
    }
    if (bad) {
        fail_call(b, c, 400, bad, "messages", 0);
        return;
    }
    char msg[TP_PROTO_MAX_ERROR + 64];
    snprintf(msg, sizeof msg, "job %s failed: %s", ch->job_id, ch->error ? ch->error : "error");
    fail_call(b, c, 500, msg, NULL, 0);
}

static void all_finished(bridge *b, gw_call *c)
{
    for (size_t i = 0; i < c->n_ch; i++)
        if (c->ch[i].reason == TP_REASON_ERROR) {
            fail_choice(b, c, &c->ch[i]);
            return;
        }
    char msg[256], param[64];
    int st = !c->oreq.stream && c->api->refuse ? c->api->refuse(c, msg, sizeof msg, param, sizeof param) : 0;
    if (st)
        reply_error(b, c, st, msg, param, 0);
    else if (c->oreq.stream)
        push(b, c, c->api->close(c, b->g->model_name), true);
    else
        reply(b, c, 200, c->api->body(c, b->g->model_name), "application/json", 0);
}

static void on_event(bridge *b, tp_zmsg *z)
{
    tp_msg m;
    tp_err e;
    if (tp_proto_decode(TP_FAM_EVT, z->f, z->n, &m, &e)) {
        tp_msg_clear(&m);
        return;
    }
    if (m.cmd == TP_CMD_HEARTBEAT) {
        if (b->ready && m.beat.incarnation != b->incarnation && !b->lost)
            /* a new broker knows none of our jobs: run them again there */
            resubmit_open(b, "tokpiped restarted (a new incarnation heartbeats)");
        /* after a silence the jobs went out already: to this broker, or
         * (passive refusals) they go on trying until it serves */
        b->lost = false;
        b->ready = true;
        b->incarnation = m.beat.incarnation;
        b->last_beat_ms = tp_now_ms();
        b->silence_ms = (int64_t)m.beat.interval_ms * m.beat.liveness;
        tp_msg_clear(&m);
        return;
    }
    gw_call *c = NULL;
    gw_choice *ch = NULL;
    if (m.cmd == TP_CMD_TOKEN)
        ch = find_job(b, &m.token.job_id, &c);
    else if (m.cmd == TP_CMD_FINISH)
        ch = find_job(b, &m.finish.job_id, &c);
    if (!ch || ch->finished || c->cancelled) {
        tp_msg_clear(&m);
        return;
    }
    size_t i = (size_t)(ch - c->ch);
    uint32_t seq = m.cmd == TP_CMD_TOKEN ? m.token.seq : m.finish.seq;
    if (ch->resubmitted && ch->next_seq == 0 && ch->skip && seq == ch->skip)
        ch->next_seq = seq;   /* the broker thought lost goes on (a late heartbeat; our SUBMIT met a 409) */
    if (seq != ch->next_seq) {
        /* PUB/SUB dropped events (a slow gateway past the high-water mark):
         * the text would have a hole, so say so instead */
        fail_call(b, c, 500, "events of the job were lost (gateway too slow)", NULL, 0);
        tp_msg_clear(&m);
        return;
    }
    ch->next_seq++;
    if (seq < ch->skip) {   /* a resubmitted job's replay of what was forwarded */
        tp_msg_clear(&m);
        return;
    }
    if (c->oreq.stream && !c->replied && m.cmd == TP_CMD_FINISH && m.finish.reason == TP_REASON_ERROR) {
        /* before the 200: the error is the answer's status (a prompt too
         * long for the context is a 400, not an error event) */
        ch->finished = true;
        ch->reason = m.finish.reason;
        ch->rejected = rejected_code(m.finish.error_code);
        if (m.finish.job_error.ptr)
            ch->error = strndup(m.finish.job_error.ptr, m.finish.job_error.len);
        fail_choice(b, c, ch);
        tp_msg_clear(&m);
        return;
    }
    if (!ch->started) {
        ch->started = true;
        if (++c->n_started == c->n_ch && c->oreq.stream && !c->replied)
            start_stream(b, c);
    }
    if (m.cmd == TP_CMD_TOKEN) {
        if (c->oreq.logprobs && gw_lp_add(&ch->lp, b->g->tok, m.token.ids, &m.token.lp)) {
            fail_call(b, c, 500, "gateway: out of memory", NULL, 0);
            tp_msg_clear(&m);
            return;
        }
        deliver_text(b, c, i, &m.token.text, false, false);
        if (m.token.reasoning.len)
            deliver_reasoning(b, c, i, m.token.reasoning.ptr, m.token.reasoning.len);
        for (size_t k = 0; c->oreq.stream && k < m.token.n_tool_calls; k++)
            deliver_call(b, c, i, &m.token.tool_calls[k], false);
    } else {
        finish_split(b, c, i, &m.finish);
        /* only a stop string cuts accepted tokens' text */
        deliver_text(b, c, i, &m.finish.text, true, m.finish.reason != TP_REASON_STOP_STRING);
        ch->finished = true;
        c->n_finished++;
        ch->reason = m.finish.reason;
        ch->prompt_tokens = m.finish.prompt_tokens;
        ch->cached_tokens = m.finish.cached_tokens;
        ch->draft_tokens = m.finish.draft_tokens;
        ch->draft_accepted = m.finish.draft_accepted;
        ch->completion_tokens = m.finish.completion_tokens;
        ch->constrained = (m.finish.set & TP_FIN_GRAMMAR) != 0;
        ch->grammar_complete = ch->constrained && m.finish.grammar_complete;
        ch->tool_calls_cut = m.finish.tool_calls_cut;
        if (keep_matched(ch, &m.finish.matched))
            ch->matched.kind = TP_MATCHED_NONE;
        if (m.finish.job_error.ptr)
            ch->error = strndup(m.finish.job_error.ptr, m.finish.job_error.len);
        ch->rejected = rejected_code(m.finish.error_code);
        if (m.finish.embedding.n && (ch->embd = malloc(m.finish.embedding.n * sizeof *ch->embd))) {
            tp_raw_copy(ch->embd, m.finish.embedding, sizeof *ch->embd);
            ch->n_embd = m.finish.embedding.n;
        }
        for (size_t k = 0; c->oreq.stream && ch->reason != TP_REASON_ERROR && k < m.finish.n_tool_calls; k++)
            deliver_call(b, c, i, &m.finish.tool_calls[k], true);
        if (c->oreq.stream && ch->reason != TP_REASON_ERROR)
            push(b, c, c->api->finish(c, b->g->model_name, i), false);
        if (c->n_finished == c->n_ch)
            all_finished(b, c);
    }
    tp_msg_clear(&m);
}

/* ---- the loop ------------------------------------------------------------ */

static void take_inbox(bridge *b)
{
    uint64_t v;
    ssize_t r = read(b->g->wake_fd, &v, sizeof v);
    (void)r;
    pthread_mutex_lock(&b->g->lock);
    gw_call *list = b->g->inbox;
    b->g->inbox = b->g->inbox_tail = NULL;
    pthread_mutex_unlock(&b->g->lock);
    while (list) {
        gw_call *c = list;
        list = c->next;
        c->next = NULL;
        if (add_call(b, c)) {
            reply_error(b, c, 500, "gateway: out of memory", NULL, 0);
            pthread_mutex_lock(&b->g->lock);
            gw_call_unref(c);
            pthread_mutex_unlock(&b->g->lock);
            continue;
        }
        start_call(b, c);
    }
}

/* A suspended connection whose client hung up: its socket reads EOF. */
static bool client_gone(int fd)
{
    char ch;
    ssize_t n = recv(fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static void sweep(bridge *b, zmq_pollitem_t *fds, gw_call **fd_call, size_t n_fds)
{
    for (size_t k = 0; k < n_fds; k++) {
        if (!(fds[k].revents & (ZMQ_POLLIN | ZMQ_POLLERR)))
            continue;
        gw_call *c = fd_call[k];
        if (client_gone(fds[k].fd)) {
            pthread_mutex_lock(&b->g->lock);
            b->g->counters.client_gone++;
            pthread_mutex_unlock(&b->g->lock);
            cancel_jobs(b, c);
            c->watch_fd = false;
            /* let MHD see the dead socket and finish the connection */
            fail_call(b, c, 499, "client closed the connection", NULL, 0);
        } else {
            c->watch_fd = false;   /* pipelined bytes: MHD's, not ours to judge */
        }
    }
    int64_t now = tp_now_ms();
    bool silent = b->ready && b->silence_ms && now - b->last_beat_ms > b->silence_ms;
    if (silent && b->standby) {
        /* the active broker is lost: the other one takes over on our
         * requests (Binary Star), and the heartbeats it sends end this */
        if (!b->lost)
            resubmit_open(b, "no heartbeat from tokpiped: the broker is lost, to its standby");
        b->lost = true;
        silent = false;
    }
    for (size_t k = 0; k < b->n_calls;) {
        gw_call *c = b->calls[k];
        pthread_mutex_lock(&b->g->lock);
        bool gone = c->http_done;
        pthread_mutex_unlock(&b->g->lock);
        if (gone && !call_over(c)) {
            pthread_mutex_lock(&b->g->lock);
            b->g->counters.client_gone++;
            pthread_mutex_unlock(&b->g->lock);
        }
        if (gone)
            cancel_jobs(b, c);
        bool acks_pending = c->n_ch ? c->n_acked < c->n_ch && !c->cancelled : !c->replied;
        if (!gone && (c->waiting || acks_pending) && now > c->deadline_ms) {
            char msg[160];
            snprintf(msg, sizeof msg, "tokpiped did not answer within %d ms (http.timeout_ms)",
                     b->g->cfg->http_timeout_ms);
            fail_call(b, c, 503, msg, NULL, 0);
        }
        if (!gone && silent && !call_over(c))
            fail_call(b, c, 503, "no heartbeat from tokpiped: the broker is gone", NULL, 0);
        for (size_t i = 0; !gone && !call_over(c) && !c->cancelled && i < c->n_ch; i++) {
            gw_choice *ch = &c->ch[i];
            if (ch->acked || ch->finished)
                continue;
            bool again = ch->resend_ms && now >= ch->resend_ms;
            /* a resubmission to a broker lost before it answered */
            again |= ch->resubmitted && !ch->resend_ms && now - ch->sent_ms > REACK_MS;
            if (again) {
                ch->resend_ms = 0;
                if (submit_one(b, c, i) > 0)
                    ch->resend_ms = now + RESEND_MS;
            }
        }
        if (gone) {
            drop_call(b, k);
            continue;
        }
        if (c->waiting && b->ready)
            start_call(b, c);
        k++;
    }
}

static int open_sockets(bridge *b, tp_err *err)
{
    const tp_config *cfg = b->g->cfg;
    tp_zsec_client sec;
    int rc = tp_zsec_client_load(cfg, &sec, err);
    if (rc)
        return rc;
    b->zctx = zmq_ctx_new();
    if (!b->zctx)
        return tp_err_set(err, TP_EIO, "zmq_ctx_new: %s", zmq_strerror(errno));
    b->dealer = zmq_socket(b->zctx, ZMQ_DEALER);
    b->sub = zmq_socket(b->zctx, ZMQ_SUB);
    int zero = 0, hwm = cfg->sndhwm;
    if (!b->dealer || !b->sub)
        return tp_err_set(err, TP_EIO, "zmq_socket: %s", zmq_strerror(errno));
    zmq_setsockopt(b->dealer, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(b->sub, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(b->dealer, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(b->sub, ZMQ_RCVHWM, &hwm, sizeof hwm);
    if ((rc = tp_zsec_client_apply(&sec, b->dealer, cfg->ep_front, err)) ||
        (rc = tp_zsec_client_apply(&sec, b->sub, cfg->ep_events, err)))
        return rc;
    b->standby = cfg->peer_front && *cfg->peer_front && cfg->peer_events && *cfg->peer_events;
    if (b->standby) {
        /* requests only to a broker with a live connection, not queued
         * for a dead one; and never a bridge blocked when both are down */
        int ms = POLL_MS, one = 1;
        zmq_setsockopt(b->dealer, ZMQ_IMMEDIATE, &one, sizeof one);
        zmq_setsockopt(b->dealer, ZMQ_SNDTIMEO, &ms, sizeof ms);
    }
    if (zmq_connect(b->dealer, cfg->ep_front))
        return tp_err_set(err, TP_EIO, "connect %s: %s", cfg->ep_front, zmq_strerror(errno));
    if (zmq_connect(b->sub, cfg->ep_events))
        return tp_err_set(err, TP_EIO, "connect %s: %s", cfg->ep_events, zmq_strerror(errno));
    /* a standby pair: both fronts, both event streams (a passive broker
     * publishes nothing; the heartbeats are the active one's) */
    if (b->standby && ((rc = tp_zsec_client_apply(&sec, b->dealer, cfg->peer_front, err)) ||
                       (rc = tp_zsec_client_apply(&sec, b->sub, cfg->peer_events, err))))
        return rc;
    if (b->standby && zmq_connect(b->dealer, cfg->peer_front))
        return tp_err_set(err, TP_EIO, "connect %s: %s", cfg->peer_front, zmq_strerror(errno));
    if (b->standby && zmq_connect(b->sub, cfg->peer_events))
        return tp_err_set(err, TP_EIO, "connect %s: %s", cfg->peer_events, zmq_strerror(errno));
    uint32_t r;
    if (getrandom(&r, sizeof r, 0) != sizeof r)
        r = (uint32_t)getpid() * 2654435761u;
    snprintf(b->prefix, sizeof b->prefix, "h%08x-", r);
    /* jobs first, heartbeat last: its answer proves both are in force */
    if (zmq_setsockopt(b->sub, ZMQ_SUBSCRIBE, b->prefix, strlen(b->prefix)) ||
        zmq_setsockopt(b->sub, ZMQ_SUBSCRIBE, TP_EVT_HEARTBEAT_TOPIC, strlen(TP_EVT_HEARTBEAT_TOPIC)))
        return tp_err_set(err, TP_EIO, "subscribe: %s", zmq_strerror(errno));
    return 0;
}

static void drain(bridge *b, void *sock, void (*fn)(bridge *, tp_zmsg *))
{
    for (;;) {
        tp_zmsg z;
        if (tp_zmsg_recv(sock, &z, ZMQ_DONTWAIT))
            return;
        fn(b, &z);
        tp_zmsg_close(&z);
    }
}

static void shut_down(bridge *b)
{
    pthread_mutex_lock(&b->g->lock);
    b->g->stopping = true;
    pthread_mutex_unlock(&b->g->lock);
    take_inbox(b);
    for (size_t i = 0; i < b->n_calls; i++)
        if (!call_over(b->calls[i]))
            fail_call(b, b->calls[i], 503, "the gateway is shutting down", NULL, 0);
        else
            cancel_jobs(b, b->calls[i]);
    while (b->n_calls)
        drop_call(b, b->n_calls - 1);
    free(b->calls);
}

void *gw_bridge_main(void *arg)
{
    bridge b = {.g = arg};
    tp_err e;
    tp_err_clear(&e);
    if (open_sockets(&b, &e))
        log_line("%s", e.msg);   /* every call then times out with 503, naming the wait */
    zmq_pollitem_t *items = calloc(MAX_POLL_FDS + 3, sizeof *items);
    gw_call **fd_call = calloc(MAX_POLL_FDS, sizeof *fd_call);
    while (!b.g->quit && items && fd_call) {
        size_t n = 0;
        items[n++] = (zmq_pollitem_t){.socket = b.dealer, .events = ZMQ_POLLIN};
        items[n++] = (zmq_pollitem_t){.socket = b.sub, .events = ZMQ_POLLIN};
        items[n++] = (zmq_pollitem_t){.fd = b.g->wake_fd, .events = ZMQ_POLLIN};
        size_t n_fds = 0;
        if (!b.dealer) {   /* no broker sockets: only wait for calls to time out */
            n = 0;
            items[n++] = (zmq_pollitem_t){.fd = b.g->wake_fd, .events = ZMQ_POLLIN};
        }
        /* Only suspended connections: MHD neither reads nor closes their
         * sockets until we resume them, so polling them is safe. */
        pthread_mutex_lock(&b.g->lock);
        for (size_t i = 0; i < b.n_calls && n_fds < MAX_POLL_FDS; i++) {
            gw_call *c = b.calls[i];
            if (b.dealer && c->suspended && !c->http_done && c->watch_fd && c->client_fd >= 0) {
                fd_call[n_fds] = c;
                items[n + n_fds++] = (zmq_pollitem_t){.fd = c->client_fd, .events = ZMQ_POLLIN};
            }
        }
        pthread_mutex_unlock(&b.g->lock);
        int rc = zmq_poll(items, (int)(n + n_fds), POLL_MS);
        if (rc < 0 && zmq_errno() != EINTR)
            break;
        take_inbox(&b);
        if (b.dealer) {
            drain(&b, b.sub, on_event);
            drain(&b, b.dealer, on_front);
        }
        sweep(&b, items + n, fd_call, n_fds);
    }
    shut_down(&b);
    free(items);
    free(fd_call);
    if (b.dealer)
        zmq_close(b.dealer);
    if (b.sub)
        zmq_close(b.sub);
    if (b.zctx)
        zmq_ctx_term(b.zctx);
    return NULL;
}
