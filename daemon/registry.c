/* Worker registry: READY / WELCOME, expiry, and what each worker message
 * is for the floors above. Any message from a worker counts as a heartbeat
 * (MDP); a worker silent for `liveness` intervals, or whose connection
 * closed, is marked gone, and recover.c moves the jobs pinned to it to
 * other workers of its stages. (broker.c sends the heartbeats: finding a
 * closed connection needs the socket's answer at once.) */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "registry.h"
#include "log.h"
#include "outbox.h"
#include "tokpipe/zwire.h"

#define MAX_MALFORMED 16   /* per worker, then DISCONNECT */

int registry_find(broker *b, const void *ident, size_t len)
{
    for (int i = 0; i < B_MAX_WORKERS; i++) {
        const bworker *w = &b->workers[i];
        if (w->live && w->ident_len == len && !memcmp(w->ident, ident, len))
            return i;
    }
    return -1;
}

/* May work go to worker wi? Not when a send to it failed. */
bool registry_usable(const broker *b, int wi)
{
    return wi >= 0 && b->workers[wi].live && !b->workers[wi].gone;
}

int registry_count(const broker *b, unsigned stage_bit)
{
    int n = 0;
    for (int i = 0; i < B_MAX_WORKERS; i++)
        n += b->workers[i].live && (b->workers[i].stages & stage_bit);
    return n;
}

/* The model every model-bearing worker must share (the first live one;
 * a draft worker runs a model of its own). */
const bworker *registry_model(const broker *b)
{
    for (int i = 0; i < B_MAX_WORKERS; i++)
        if (b->workers[i].live && b->workers[i].model_id[0] && (b->workers[i].stages & TP_STAGE_FORWARD))
            return &b->workers[i];
    for (int i = 0; i < B_MAX_WORKERS; i++)
        if (b->workers[i].live && b->workers[i].model_id[0] && b->workers[i].stages != TP_STAGE_DRAFT)
            return &b->workers[i];
    return NULL;
}

static void send_raw(broker *b, const tp_frame *ident, uint8_t cmd, const char *reason)
{
    tp_msg m;
    tp_msg_init(&m, TP_FAM_WRK, cmd);
    m.disconnect.reason = tp_str_of(reason);
    out_ident(b, ident, &m);
}

/* Worker wi is lost (its jobs are recover.c's): said in the log, counted,
 * and told, in case it still runs (stopped, not dead): it then drops its
 * state when it reads this, and registers anew. */
void registry_lose(broker *b, int wi, const char *why)
{
    bworker *w = &b->workers[wi];
    blog("worker %s lost: %s", w->instance, why);
    b->stats.workers_lost++;
    tp_frame id = {w->ident, w->ident_len};
    send_raw(b, &id, TP_CMD_DISCONNECT, why);
}

void registry_drop(broker *b, int wi)
{
    bworker *w = &b->workers[wi];
    for (size_t i = 0; i < w->n_owed; i++)
        free(w->owed[i].slots);
    free(w->owed);
    memset(w, 0, sizeof *w);
}

/* The moving average of answer times per stage: 1/8 of each new one. */
#define ANSWER_EWMA 0.125

void registry_answered(broker *b, int wi, const tp_msg *m)
{
    bworker *w = &b->workers[wi];
    size_t k = 0;
    while (k < w->n_owed && w->owed[k].task != m->task)
        k++;
    if (k == w->n_owed)
        return;   /* not a task it owes (noted out of memory, or answered twice) */
    int64_t now = tp_now_ms();
    /* it started on this task when it sent its last answer, unless the
     * task came later */
    int64_t start = w->owed[k].sent_ms > w->last_answer_ms ? w->owed[k].sent_ms : w->last_answer_ms;
    double *avg = &b->stats.answer_ms[w->owed[k].si];
    *avg = *avg ? *avg + ANSWER_EWMA * ((double)(now - start) - *avg) : (double)(now - start);
    w->last_answer_ms = now;
    /* answered in order: what came before it was skipped, not pending */
    for (size_t i = 0; i <= k; i++)
        free(w->owed[i].slots);
    memmove(w->owed, w->owed + k + 1, (w->n_owed - k - 1) * sizeof *w->owed);
    w->n_owed -= k + 1;
}

int64_t registry_step_limit_ms(const broker *b, int si)
{
    int64_t floor_ms = (int64_t)b->cfg->step_timeout_s * 1000;
    double usual = b->stats.answer_ms[si] * b->cfg->step_timeout_factor;
    return usual > (double)floor_ms ? (int64_t)usual : floor_ms;
}

/* A TOKENIZE task of worker wi ended (answered, or its job went). */
void registry_tok_done(broker *b, int wi)
{
    bworker *w = &b->workers[wi];
    if (--w->tok_inflight <= 0)
        w->tok_suspect = false;
}

static void copy_name(char *dst, tp_str s)
{
    size_t n = s.len > TP_PROTO_MAX_NAME ? TP_PROTO_MAX_NAME : s.len;
    memcpy(dst, s.ptr, n);
    dst[n] = '\0';
}

/* Every field of a READY against the model the config names (or, when
 * the broker could not read it, the first live worker's): a worker of
 * another model, or one claiming a vocabulary or context the model does
 * not have, would corrupt every job routed to it. */
static bool ready_valid(const broker *b, const tp_m_ready *r, const char *model, char *why, size_t cap)
{
    const bworker *w = registry_model(b);
    const char *ref = b->model_id[0] ? b->model_id : w ? w->model_id : NULL;
    uint32_t vocab = b->model_id[0] ? b->model_vocab : w ? w->vocab : 0;
    uint32_t seq = b->model_id[0] ? b->model_seq_len : 0;
    if (r->stages & TP_STAGE_DRAFT) {
        /* a draft worker runs speculative.draft_model, whose vocabulary
         * must be the target's: its guesses are the target's token ids */
        ref = b->draft_model_id[0] ? b->draft_model_id : NULL;
        seq = 0;
        if (r->stages != TP_STAGE_DRAFT) {
            snprintf(why, cap, "the draft stage fuses with no other stage");
            return false;
        }
        if (vocab && r->vocab_size != vocab) {
            snprintf(why, cap, "draft model '%s': its vocabulary has %u tokens, the target model's has %u", model,
                     r->vocab_size, vocab);
            return false;
        }
    }
    if (!model[0])
        snprintf(why, cap, "READY has an empty model_id");
    else if (ref && strcmp(model, ref))
        snprintf(why, cap, "model '%s' differs from '%s'", model, ref);
    else if (vocab && r->vocab_size != vocab)
        snprintf(why, cap, "vocab_size %u differs from the model's %u", r->vocab_size, vocab);
    else if (seq && r->seq_len > seq)
        snprintf(why, cap, "seq_len %u exceeds the model's context %u", r->seq_len, seq);
    else if ((r->stages & TP_STAGE_FORWARD) && r->seq_len == 0)
        snprintf(why, cap, "a forward worker with seq_len 0");
    else if (r->capacity > B_MAX_CAPACITY)
        snprintf(why, cap, "capacity %u exceeds %u", r->capacity, B_MAX_CAPACITY);
    else if (r->max_batch_tokens > B_MAX_BATCH_TOKENS)
        snprintf(why, cap, "max_batch_tokens %u exceeds %u", r->max_batch_tokens, B_MAX_BATCH_TOKENS);
    else
        return true;
    return false;
}

bool registry_on_ready(broker *b, const tp_frame *ident, const tp_m_ready *r)
{
    char model[TP_PROTO_MAX_MODEL_ID + 1];
    size_t ml = r->model_id.len > TP_PROTO_MAX_MODEL_ID ? TP_PROTO_MAX_MODEL_ID : r->model_id.len;
    memcpy(model, r->model_id.ptr, ml);
    model[ml] = '\0';
    char why[TP_PROTO_MAX_MODEL_ID * 2 + 120];
    if (!ready_valid(b, r, model, why, sizeof why)) {
        blog("refusing worker %.*s: %s", (int)r->instance.len, r->instance.ptr, why);
        send_raw(b, ident, TP_CMD_DISCONNECT, why);
        return false;
    }
    int wi = -1;
    for (int i = 0; i < B_MAX_WORKERS && wi < 0; i++)
        if (!b->workers[i].live)
            wi = i;
    if (wi < 0 || ident->len > B_IDENT_MAX) {
        send_raw(b, ident, TP_CMD_DISCONNECT, "broker has no room for more workers");
        return false;
    }
    bworker *w = &b->workers[wi];
    memset(w, 0, sizeof *w);
    w->live = true;
    memcpy(w->ident, ident->data, ident->len);
    w->ident_len = ident->len;
    w->stages = r->stages;
    copy_name(w->instance, r->instance);
    strcpy(w->model_id, model);
    w->incarnation = r->incarnation;
    w->capacity = r->capacity ? r->capacity : 1;
    w->vocab = r->vocab_size;
    w->seq_len = r->seq_len;
    w->max_batch_tokens = r->max_batch_tokens;
    w->bos = r->bos_id;
    w->eos = r->eos_id;
    w->worker_no = b->next_worker_no++;
    w->last_recv = w->last_send = tp_now_ms();
    tp_msg m;
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_WELCOME);
    m.welcome.incarnation = b->incarnation;
    m.welcome.heartbeat_ms = (uint32_t)b->cfg->heartbeat_ms;
    m.welcome.liveness = (uint32_t)b->cfg->liveness;
    m.welcome.worker_no = w->worker_no;
    out_worker(b, wi, &m);
    blog("worker %s registered (stages 0x%x, capacity %u)", w->instance, w->stages, w->capacity);
    return true;
}

int registry_on_message(broker *b, const tp_frame *ident, const tp_frame *frames, size_t n, tp_msg *m, int *wip)
{
    tp_err e;
    tp_err_clear(&e);
    int wi = *wip = registry_find(b, ident->data, ident->len);
    if (wi >= 0)
        b->workers[wi].last_recv = tp_now_ms();
    if (tp_proto_decode(TP_FAM_WRK, frames, n, m, &e)) {
        b->stats.malformed_back++;
        blog("dropped a malformed worker message: %s", e.msg);
        if (wi >= 0 && ++b->workers[wi].malformed > MAX_MALFORMED && !b->workers[wi].gone) {
            b->workers[wi].gone = true;
            b->workers[wi].gone_why = "too many malformed messages";
        }
        return REG_DONE;
    }
    if (m->cmd == TP_CMD_READY) {
        if (wi >= 0) {
            /* READY again = a restarted worker: its state is gone, so its
             * jobs are, but it registers anew: no DISCONNECT, which would
             * make it drop this connection too */
            blog("worker %s registered again: its old state is gone", b->workers[wi].instance);
            b->stats.workers_lost++;
        }
        return REG_READY;
    }
    if (wi < 0) {
        /* a worker from before a broker restart, or one declared lost that
         * runs again (its late results are for jobs already re-queued):
         * make it register again */
        if (m->cmd != TP_CMD_DISCONNECT) {
            /* late: its answers and heartbeats, after a partition healed */
            b->stats.replies_refused++;
            if (m->cmd != TP_CMD_HEARTBEAT)
                blog("ignored %s from an unregistered worker; told to send READY", tp_cmd_name(TP_FAM_WRK, m->cmd));
            send_raw(b, ident, TP_CMD_DISCONNECT, "unknown worker: send READY");
        }
        return REG_DONE;
    }
    if (m->cmd == TP_CMD_DISCONNECT) {
        blog("worker %s disconnected", b->workers[wi].instance);
        b->stats.workers_lost++;
        return REG_LOST;
    }
    if (m->cmd == TP_CMD_TOKENIZED || m->cmd == TP_CMD_STEP_RESULT || m->cmd == TP_CMD_SAMPLED ||
        m->cmd == TP_CMD_VERDICTS)
        registry_answered(b, wi, m);
    return m->cmd == TP_CMD_HEARTBEAT ? REG_DONE : REG_RESULT;
}

/* Workers silent for `liveness` heartbeat intervals are gone; so are those
 * that owe the answer to a task past its step deadline, even if they send
 * heartbeats. Either one that stopped in the middle of a task is hung:
 * its loss counts against the job it was computing (recover.c). */
void registry_tick(broker *b, int64_t now)
{
    int64_t dead_after = (int64_t)b->cfg->heartbeat_ms * b->cfg->liveness;
    for (int i = 0; i < B_MAX_WORKERS; i++) {
        bworker *w = &b->workers[i];
        if (!w->live || w->gone)
            continue;
        if (w->n_owed) {
            const bowed *o = &w->owed[0];
            int64_t start = o->sent_ms > w->last_answer_ms ? o->sent_ms : w->last_answer_ms;
            if (now - start > registry_step_limit_ms(b, o->si)) {
                w->gone = w->hung = true;
                w->gone_why = "step deadline: no answer to its task";
                continue;
            }
        }
        if (now - w->last_recv > dead_after) {
            w->gone = true;
            w->hung = w->n_owed > 0;
            w->gone_why = w->hung ? "heartbeat expired in the middle of a task" : "heartbeat expired";
        }
    }
}
