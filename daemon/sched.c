/* The schedule: tokenize dispatch, admission to a forward/sample/stop
 * worker set, and the continuously batched decode loop.
 *
 * A running job cycles through phases: READY (may join the next step) ->
 * FORWARD (in a STEP at its forward worker) -> SAMPLE (logits at its sample
 * worker; skipped when the forward worker samples in process) -> READY with
 * the candidate as the next input, while the candidate is checked by the
 * job's stop worker. Decoding ahead of the verdict is exact, not a guess: a
 * candidate is either accepted (then it is the next input) or it finishes
 * the job (then the step computed ahead is dropped with the sequence). So
 * the stop stage is off the forward's critical path; a job waits for its
 * verdict only when it is at max_tokens (the verdict will finish it) or has
 * B_RING - 1 verdicts outstanding. batching.decode_ahead: false makes
 * every job wait for each verdict instead, so a stopping candidate never
 * reaches the KV cache at all. Each forward worker keeps up to
 * batching.micro_batches steps in flight, so it computes one batch while
 * the others are sampled and stop-checked. A prompt is fed in chunks of
 * batching.prefill_chunk tokens, one chunk per step, next to the decode
 * items of running jobs, so a long prompt never stalls them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker.h"
#include "tokpipe/rand.h"
#include "tokpipe/zwire.h"

/* ---- scratch for building one message ---------------------------------- */

static int cols_reserve(bcols *c, size_t n, size_t n_tokens, size_t n_logits)
{
    if (n > c->cap) {
        size_t nc = n * 2;
        void *p[7] = {realloc(c->slots, nc * 4), realloc(c->pos, nc * 4), realloc(c->ntok, nc * 4),
                      realloc(c->index, nc * 4), realloc(c->flags, nc), realloc(c->acc, nc * 4),
                      realloc(c->cands, nc * 4)};
        /* realloc failure leaves the old block valid: keep whichever we got */
        if (p[0]) c->slots = p[0];
        if (p[1]) c->pos = p[1];
        if (p[2]) c->ntok = p[2];
        if (p[3]) c->index = p[3];
        if (p[4]) c->flags = p[4];
        if (p[5]) c->acc = p[5];
        if (p[6]) c->cands = p[6];
        for (int i = 0; i < 7; i++)
            if (!p[i])
                return TP_ENOMEM;
        c->cap = nc;
    }
    if (n_tokens > c->tok_cap) {
        int32_t *t = realloc(c->tokens, n_tokens * 2 * sizeof *t);
        if (!t)
            return TP_ENOMEM;
        c->tokens = t;
        c->tok_cap = n_tokens * 2;
    }
    if (n_logits > c->logit_cap) {
        float *l = realloc(c->logits, n_logits * sizeof *l);
        if (!l)
            return TP_ENOMEM;
        c->logits = l;
        c->logit_cap = n_logits;
    }
    return 0;
}

void sched_free(broker *b)
{
    bcols *c = &b->cols;
    free(c->slots);
    free(c->pos);
    free(c->ntok);
    free(c->index);
    free(c->flags);
    free(c->acc);
    free(c->cands);
    free(c->tokens);
    free(c->logits);
    memset(c, 0, sizeof *c);
}

/* ---- closing jobs ------------------------------------------------------- */

static uint64_t task_id(broker *b)
{
    return ++b->next_task;
}

static uint64_t send_slot_cmd(broker *b, int wi, uint8_t cmd, uint32_t slot)
{
    if (wi < 0 || !b->workers[wi].live)
        return 0;
    tp_msg m;
    tp_msg_init(&m, TP_FAM_WRK, cmd);
    m.task = task_id(b);
    m.slot.slot = slot;
    broker_send_worker(b, wi, &m);
    return m.task;
}

static void send_stop_close(broker *b, bjob *j, int finish, const char *error)
{
    if (j->stp < 0 || !b->workers[j->stp].live)
        return;
    tp_msg m;
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_STOP_CLOSE);
    m.task = task_id(b);
    m.stop_close.slot = j->slot;
    m.stop_close.finish = finish;
    m.stop_close.job_error = tp_str_of(error);
    broker_send_worker(b, j->stp, &m);
}

static void attach_stop(broker *b, bjob *j, int t);
static int pick_stop(broker *b);
static bool can_decode_ahead(const broker *b, const bjob *j);

static void set_close_error(bjob *j, const char *error)
{
    free(j->close_error);
    j->close_error = error ? strdup(error) : NULL;   /* NULL on ENOMEM: the FINISH says "error" */
}

/* Let go of the job's workers. finish: NONE (the stop stage already
 * published FINISH), CANCELLED or ERROR (the stop stage publishes it now).
 * Without a live stop worker another one rebuilds the job's stop state
 * and publishes the FINISH, so held-back text is released as usual; with
 * no stop worker at all the broker publishes FINISH itself. */
static void release_job(broker *b, bjob *j, int finish, const char *error)
{
    if (j->fwd >= 0) {
        send_slot_cmd(b, j->fwd, TP_CMD_SEQ_CLOSE, j->slot);
        b->workers[j->fwd].n_fwd--;
    }
    if (j->smp >= 0) {
        send_slot_cmd(b, j->smp, TP_CMD_SAMPLE_CLOSE, j->slot);
        b->workers[j->smp].n_smp--;
    }
    bool stop_live = registry_usable(b, j->stp);
    if (stop_live)
        send_stop_close(b, j, finish, error);
    if (j->stp >= 0)
        b->workers[j->stp].n_stp--;
    if (finish == TP_REASON_NONE)   /* candidates decoded past the finishing one never count */
        j->n_cand = j->n_verd;
    j->close_stp = stop_live ? j->stp : -1;
    j->close_finish = finish;
    set_close_error(j, error);
    j->fwd = j->smp = j->stp = -1;
    j->state = J_CLOSING;
    j->closing_since = tp_now_ms();
    j->lost_ms = 0;
    if (!j->engine_reason)
        j->engine_reason = finish;
    if (j->result_ready) {
        jobs_mark_finished(b, j);
    } else if (!stop_live && finish != TP_REASON_NONE) {
        int t = pick_stop(b);
        if (t >= 0)
            attach_stop(b, j, t);
        else
            broker_publish_finish(b, j, finish, error);
    }
}

void sched_fail_job(broker *b, bjob *j, const char *why)
{
    if (j->state == J_RUNNING) {
        release_job(b, j, TP_REASON_ERROR, why);
        return;
    }
    if (j->state == J_TOKENIZE && j->tok_worker >= 0 && b->workers[j->tok_worker].live)
        b->workers[j->tok_worker].tok_inflight--;
    if (j->state == J_TOKENIZE || j->state == J_ADMIT)
        broker_publish_finish(b, j, TP_REASON_ERROR, why);
}

void sched_cancel_job(broker *b, bjob *j)
{
    if (j->state == J_RUNNING) {
        j->cancel = true;
        if (j->phase == P_READY)
            release_job(b, j, TP_REASON_CANCELLED, NULL);
        return;   /* else when its step comes back */
    }
    if (j->state == J_TOKENIZE && j->tok_worker >= 0 && b->workers[j->tok_worker].live)
        b->workers[j->tok_worker].tok_inflight--;
    if (j->state == J_TOKENIZE || j->state == J_ADMIT)
        broker_publish_finish(b, j, TP_REASON_CANCELLED, NULL);
}

static void note_loss(bjob *j, int64_t now)
{
    if (!j->lost_ms)
        j->lost_ms = now;
    if (!j->recover_t0)
        j->recover_t0 = now;
}

/* Worker wi is gone: the jobs pinned to it lose that stage and wait for
 * another worker of it (sched_recover, at once if one has room). What the
 * lost worker held is rebuilt from the job record: the KV cache from
 * prompt + candidates, the sampler from the candidates (its random stream
 * is counted by accepted tokens, so it draws the same), the stop state
 * from the tokens subscribers were sent. Work in flight there is dropped:
 * a step being computed (its jobs are fed again), logits being sampled
 * (the last position is computed again), candidates being checked (sent
 * again to the new stop worker). */
void sched_worker_lost(broker *b, int wi)
{
    bworker *w = &b->workers[wi];
    w->live = false;   /* nothing more is sent to it */
    int64_t now = tp_now_ms();
    for (uint32_t i = 0; i < b->jobs_cap; i++) {
        bjob *j = &b->jobs[i];
        if (j->state == J_TOKENIZE && j->tok_worker == wi) {
            j->tok_worker = -1;   /* tokenizing is idempotent: queue it again */
            j->tok_task = 0;
            b->stats.recovered[TP_SI_TOKENIZE]++;
        } else if (j->state == J_RUNNING && (j->fwd == wi || j->smp == wi || j->stp == wi)) {
            if (j->result_ready) {
                /* subscribers already have its FINISH: nothing to rebuild */
                if (j->fwd == wi) j->fwd = -1;
                if (j->smp == wi) j->smp = -1;
                if (j->stp == wi) j->stp = -1;
                release_job(b, j, TP_REASON_NONE, NULL);
                continue;
            }
            if (j->fwd == wi) {
                j->fwd = -1;
                j->n_fed = 0;
                if (j->phase == P_FORWARD)
                    j->phase = P_READY;
            }
            if (j->smp == wi)
                j->smp = -1;   /* a job in P_SAMPLE is rewound when it gets a sampler */
            if (j->stp == wi)
                j->stp = -1;
            note_loss(j, now);
        } else if (j->state == J_CLOSING && j->close_stp == wi && !j->result_ready) {
            j->close_stp = -1;
            note_loss(j, now);
        }
    }
    memset(w, 0, sizeof *w);
    sched_recover(b, now);
}

/* ---- tokenize ---------------------------------------------------------------- */

static int pick_worker(broker *b, unsigned stage, int (*load)(const bworker *))
{
    int best = -1, best_load = 0;
    for (int i = 0; i < B_MAX_WORKERS; i++) {
        const bworker *w = &b->workers[i];
        if (!registry_usable(b, i) || !(w->stages & stage))
            continue;
        int l = load(w);
        if (l >= (int)w->capacity)
            continue;
        if (best < 0 || l < best_load) {
            best = i;
            best_load = l;
        }
    }
    return best;
}

static int load_tok(const bworker *w) { return w->tok_inflight; }
static int load_smp(const bworker *w) { return w->n_smp; }
static int load_stp(const bworker *w) { return w->n_stp; }

static void dispatch_tokenize(broker *b, bjob *j)
{
    int wi = pick_worker(b, TP_STAGE_TOKENIZE, load_tok);
    if (wi < 0)
        return;
    tp_msg m;
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_TOKENIZE);
    m.task = j->tok_task = task_id(b);
    m.tokenize.slot = j->slot;
    m.tokenize.text = (tp_str){j->prompt_text, j->prompt_len};
    m.tokenize.add_bos = true;
    m.tokenize.parse_special = j->parse_special;
    m.tokenize.messages = j->messages;
    m.tokenize.n_messages = j->n_messages;
    if (broker_send_worker(b, wi, &m))
        return;   /* it is marked gone: lost at the next safe point, the prompt goes elsewhere */
    j->tok_worker = wi;
    b->workers[wi].tok_inflight++;
}

/* A rendered conversation ends when the model ends its turn: the
 * template's end-of-turn ids join the job's stop ids (once each). */
static int chat_add_stop_ids(bjob *j, const tp_m_tokenized *t)
{
    tp_params *p = &j->params;
    /* the stop ids' block also holds logit_bias (front.c copy_request):
     * build the grown block whole and move the bias along */
    size_t nb = p->logit_bias.n, ni = p->n_stop_token_ids + t->n_stop_ids + 1;
    int32_t *ids = malloc((ni + 2 * nb) * sizeof *ids);
    if (!ids)
        return TP_ENOMEM;
    if (p->n_stop_token_ids)
        memcpy(ids, p->stop_token_ids, p->n_stop_token_ids * sizeof *ids);
    if (nb) {
        memcpy(ids + ni, p->logit_bias.ids, nb * sizeof *ids);
        memcpy(ids + ni + nb, p->logit_bias.values, nb * sizeof(float));
        p->logit_bias.ids = ids + ni;
        p->logit_bias.values = (float *)(void *)(ids + ni + nb);
    }
    free(p->stop_token_ids);
    p->stop_token_ids = ids;
    for (size_t i = 0; i < t->n_stop_ids; i++) {
        bool have = false;
        for (size_t k = 0; k < p->n_stop_token_ids && !have; k++)
            have = ids[k] == t->stop_ids[i];
        if (!have)
            ids[p->n_stop_token_ids++] = t->stop_ids[i];
    }
    p->set |= TP_P_STOP_TOKEN_IDS;   /* sent to the stop stage only when marked set */
    return 0;
}

static void on_tokenized(broker *b, int wi, const tp_msg *m)
{
    bjob *j = jobs_by_slot(b, m->tokenized.slot);
    if (!j || j->state != J_TOKENIZE || j->tok_task != m->task || j->tok_worker != wi)
        return;   /* late reply for a cancelled or re-queued job */
    b->workers[wi].tok_inflight--;
    j->tok_worker = -1;
    if (m->status != TP_ST_OK) {
        char why[TP_ERR_MSG_MAX];
        snprintf(why, sizeof why, "tokenize: %.*s", (int)m->error.len, m->error.ptr);
        sched_fail_job(b, j, why);
        return;
    }
    const bworker *model = registry_model(b);
    uint32_t seq_len = model ? model->seq_len : 0;
    /* truncate_prompt_tokens keeps the last N ids (vLLM's rule) */
    size_t n = m->tokenized.ids.n, skip = 0;
    if ((j->params.set & TP_P_TRUNCATE_PROMPT) && n > (size_t)j->params.truncate_prompt_tokens)
        skip = n - (size_t)j->params.truncate_prompt_tokens;
    n -= skip;
    if (n == 0 || (seq_len && n >= seq_len)) {
        char why[160];
        snprintf(why, sizeof why, "prompt: %zu tokens, the model's context holds %u", n, seq_len);
        /* FINISH says so with both counts and its own code, before any TOKEN */
        j->n_prompt = (uint32_t)n;
        j->context_refused = n ? seq_len : 0;
        sched_fail_job(b, j, why);
        return;
    }
    j->prompt = malloc(n * sizeof *j->prompt);
    if (!j->prompt) {
        sched_fail_job(b, j, "broker out of memory");
        return;
    }
    memcpy(j->prompt, (const char *)m->tokenized.ids.data + skip * sizeof *j->prompt, n * sizeof *j->prompt);
    j->n_prompt = (uint32_t)n;
    if (j->n_messages && m->tokenized.n_stop_ids && chat_add_stop_ids(j, &m->tokenized)) {
        sched_fail_job(b, j, "broker out of memory");
        return;
    }
    free(j->prompt_text);
    j->prompt_text = NULL;
    free(j->messages);
    j->messages = NULL;
    j->n_messages = 0;
    j->state = J_ADMIT;
}

/* ---- admission and recovery --------------------------------------------------- */

static int pick_forward(broker *b)
{
    int best = -1, best_load = 0;
    for (int i = 0; i < B_MAX_WORKERS; i++) {
        const bworker *w = &b->workers[i];
        int cap = (int)w->capacity < b->cfg->max_num_seqs ? (int)w->capacity : b->cfg->max_num_seqs;
        if (!registry_usable(b, i) || !(w->stages & TP_STAGE_FORWARD) || w->n_fwd >= cap)
            continue;
        if (best < 0 || w->n_fwd < best_load) {
            best = i;
            best_load = w->n_fwd;
        }
    }
    return best;
}

static int pick_stop(broker *b)
{
    return pick_worker(b, TP_STAGE_STOP, load_stp);
}

/* The sampler of a job on forward worker f: f itself when it samples in
 * process, else the least loaded sample worker. */
static int pick_sample(broker *b, int f)
{
    return (b->workers[f].stages & TP_STAGE_SAMPLE) ? f : pick_worker(b, TP_STAGE_SAMPLE, load_smp);
}

static const char *const stage_word[TP_SI_COUNT] = {"tokenize", "forward", "sample", "stop"};

static void log_recovery(broker *b, const bjob *j, int si, int wi, uint32_t replayed)
{
    if (j->lost_ms || j->state == J_CLOSING)
        broker_log(b, "job %s: %s continues on worker %s after a lost worker (%u tokens replayed, %lld ms after the loss)",
                   j->id, stage_word[si], b->workers[wi].instance, replayed,
                   (long long)(j->lost_ms ? tp_now_ms() - j->lost_ms : 0));
}

/* SEQ_OPEN at f; the whole sequence (prompt + candidates) is prefilled
 * again there in chunks, next to the running jobs. */
static void attach_forward(broker *b, bjob *j, int f)
{
    bool again = j->n_cand > 0 || j->lost_ms;
    j->fwd = f;
    b->workers[f].n_fwd++;
    j->n_fed = 0;
    if (j->n_cand == 0)   /* the prompt is prefilled again: its hits are counted again */
        j->cached = 0;
    if (j->phase == P_FORWARD)
        j->phase = P_READY;
    j->open_task[0] = send_slot_cmd(b, f, TP_CMD_SEQ_OPEN, j->slot);
    if (again) {
        b->stats.recovered[TP_SI_FORWARD]++;
        log_recovery(b, j, TP_SI_FORWARD, f, j->n_prompt + j->n_cand);
    }
}

/* SAMPLE_OPEN at s. replay: the candidates so far, which the sampler
 * accepts (penalty window, random stream position) before its next draw. */
static void attach_sample(broker *b, bjob *j, int s)
{
    uint32_t n_replay = j->n_cand;
    if (n_replay && j->cands[n_replay - 1] < 0)
        n_replay--;   /* a failed draw: its verdict ends the job */
    bool again = n_replay > 0 || j->lost_ms;
    j->smp = s;
    b->workers[s].n_smp++;
    tp_msg m;
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_SAMPLE_OPEN);
    m.task = task_id(b);
    m.sample_open.slot = j->slot;
    m.sample_open.params = j->params;
    m.sample_open.params.set &= ~(TP_P_STOP);   /* the sampler has no use for them */
    m.sample_open.params.stop = NULL;
    m.sample_open.params.n_stop = 0;
    int32_t ban[TP_PROTO_MAX_STOP_IDS + 1];
    size_t nb = 0;
    for (size_t i = 0; i < j->params.n_stop_token_ids && nb < TP_PROTO_MAX_STOP_IDS; i++)
        ban[nb++] = j->params.stop_token_ids[i];
    if (!j->params.ignore_eos && b->workers[s].eos >= 0)
        ban[nb++] = b->workers[s].eos;
    m.sample_open.ban_ids = ban;
    m.sample_open.n_ban_ids = nb;
    m.sample_open.context = (tp_raw){j->prompt, j->n_prompt};
    m.sample_open.replay = (tp_raw){j->cands, n_replay};
    j->open_task[1] = m.task;
    broker_send_worker(b, s, &m);
    j->acc_for_sampler = -1;
    if (j->phase == P_SAMPLE) {
        /* its logits were at the lost sampler: compute the last position again */
        uint32_t total = j->n_prompt + j->n_cand;
        if (j->n_fed > total - 1)
            j->n_fed = total - 1;
        j->phase = P_READY;
    }
    if (again) {
        b->stats.recovered[TP_SI_SAMPLE]++;
        log_recovery(b, j, TP_SI_SAMPLE, s, n_replay);
    }
}

/* STOP_OPEN at t, replaying the tokens subscribers were sent, so events
 * go on at the first seq the broker has not forwarded; the candidates
 * after them are checked again (STOP_STEP), and a closing job is closed
 * again. A job that reached max_tokens with its last TOKEN forwarded but
 * not its FINISH has that candidate checked again: the TOKEN repeated is
 * dropped by seq (jobs_event_wanted), the FINISH goes out. */
static void attach_stop(broker *b, bjob *j, int t)
{
    uint32_t k = j->n_tok_ids < j->n_cand ? j->n_tok_ids : j->n_cand;
    uint32_t next_seq = (uint32_t)(j->last_seq + 1);
    if (k > 0 && k >= (uint32_t)j->params.max_tokens && next_seq > 0) {
        k--;
        next_seq--;
    }
    bool again = j->n_cand > 0 || j->lost_ms || j->state == J_CLOSING;
    tp_msg m;
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_STOP_OPEN);
    m.task = task_id(b);
    tp_m_stop_open *o = &m.stop_open;
    o->slot = j->slot;
    o->job_id = tp_str_of(j->id);
    o->params = j->params;
    o->prompt_tokens = j->n_prompt;
    o->prev_token = j->prompt[j->n_prompt - 1];
    o->next_seq = next_seq;
    o->t_submit_us = j->t_submit_wall;
    o->t_start_us = j->t_start_wall;
    o->replay = (tp_raw){j->cands, k};
    /* a new pin per attachment: events of a worker the job left (lost, or
     * stopped and running again) or of anyone else are not believed */
    j->stop_pin = tp_random_u64() | 1;
    o->pin = j->stop_pin;
    /* admit lowered max_tokens to the room the context leaves: the stop
     * worker's FINISH then says the context ended the job */
    const bworker *model = registry_model(b);
    uint32_t ctx = j->fwd >= 0 ? b->workers[j->fwd].seq_len : model ? model->seq_len : 0;
    if (ctx && j->n_prompt + (uint32_t)j->params.max_tokens >= ctx)
        o->context_length = ctx;
    o->cached_tokens = j->cached;
    j->open_task[2] = m.task;
    broker_send_worker(b, t, &m);
    /* the verdicts after the replayed tokens come again */
    j->n_verd = k;
    if (j->n_out > k)
        j->n_out = k;
    while (j->n_out < k)
        jobs_append_out(j, j->cands[j->n_out]);
    if (j->n_cand > k) {
        tp_msg st;
        tp_msg_init(&st, TP_FAM_WRK, TP_CMD_STOP_STEP);
        st.task = task_id(b);
        st.stop_step.step = ++b->next_step;
        st.stop_step.n = j->n_cand - k;
        uint32_t *slots = malloc((j->n_cand - k) * sizeof *slots);
        if (slots) {
            for (uint32_t i = 0; i < j->n_cand - k; i++)
                slots[i] = j->slot;
            st.stop_step.slots = (tp_raw){slots, j->n_cand - k};
            st.stop_step.candidates = (tp_raw){j->cands + k, j->n_cand - k};
            broker_send_worker(b, t, &st);
            free(slots);
        }
    }
    if (j->state == J_CLOSING) {
        j->close_stp = t;
        j->closing_since = tp_now_ms();
        j->lost_ms = 0;
        tp_msg c;
        tp_msg_init(&c, TP_FAM_WRK, TP_CMD_STOP_CLOSE);
        c.task = task_id(b);
        c.stop_close.slot = j->slot;
        c.stop_close.finish = j->close_finish;
        c.stop_close.job_error = tp_str_of(j->close_error);
        broker_send_worker(b, t, &c);
    } else {
        j->stp = t;
        b->workers[t].n_stp++;
        /* every candidate may have been published already (a stopped
         * worker that ran again before it was told DISCONNECT): then no
         * verdict is coming, and the job must not wait for one */
        if (j->phase == P_STOP && j->pending >= 0 && (j->n_verd == j->n_cand || can_decode_ahead(b, j)))
            j->phase = P_READY;
    }
    if (again) {
        b->stats.recovered[TP_SI_STOP]++;
        log_recovery(b, j, TP_SI_STOP, t, k);
    }
}

/* Pin j to a forward, sample and stop worker; false if one is missing. */
static bool admit(broker *b, bjob *j)
{
    int f = pick_forward(b);
    if (f < 0)
        return false;
    int s = pick_sample(b, f);
    int t = pick_stop(b);
    if (s < 0 || t < 0)
        return false;
    const bworker *fw = &b->workers[f];
    /* The context window bounds what can be generated: past it the job
     * ends as `length`, as if max_tokens were smaller (tokpipe run does the
     * same, so both give the same tokens). */
    if (j->n_prompt >= fw->seq_len) {
        char why[128];
        snprintf(why, sizeof why, "prompt: %u tokens, the model's context holds %u", j->n_prompt, fw->seq_len);
        j->context_refused = fw->seq_len;
        sched_fail_job(b, j, why);
        return true;
    }
    int32_t room = (int32_t)(fw->seq_len - j->n_prompt);
    if (j->params.max_tokens > room)
        j->params.max_tokens = room;
    if (j->params.min_tokens > j->params.max_tokens)
        j->params.min_tokens = j->params.max_tokens;
    /* a sampler rebuilt after a loss must draw what the lost one would
     * have: the job's random stream needs a seed that outlives the worker */
    if (!(j->params.set & TP_P_SEED)) {
        j->params.seed = tp_random_u64();
        j->params.set |= TP_P_SEED;
    }
    j->state = J_RUNNING;
    j->phase = P_READY;
    j->t_start_wall = tp_wall_us();
    attach_forward(b, j, f);
    attach_sample(b, j, s);
    attach_stop(b, j, t);
    return true;
}

/* Jobs that lost a worker get another one of that stage as soon as one has
 * room; past recovery.deadline_ms without one, the job ends in `error`
 * naming the stage (the only way a lost worker ends a job). */
void sched_recover(broker *b, int64_t now)
{
    int64_t deadline = b->cfg->recovery_deadline_ms;
    for (uint32_t i = 0; i < b->jobs_cap; i++) {
        bjob *j = &b->jobs[i];
        if (j->state == J_RUNNING && j->result_ready && (j->fwd < 0 || j->smp < 0 || j->stp < 0)) {
            /* its FINISH reached subscribers (a late event of the lost
             * worker): nothing left to rebuild */
            release_job(b, j, TP_REASON_NONE, NULL);
        } else if (j->state == J_RUNNING && (j->fwd < 0 || j->smp < 0 || j->stp < 0)) {
            if (j->fwd < 0) {
                int f = pick_forward(b);
                if (f >= 0) {
                    attach_forward(b, j, f);
                    if ((b->workers[f].stages & TP_STAGE_SAMPLE) && j->smp != f && j->smp >= 0) {
                        /* a fused worker samples its own rows: the sampler moves too */
                        send_slot_cmd(b, j->smp, TP_CMD_SAMPLE_CLOSE, j->slot);
                        b->workers[j->smp].n_smp--;
                        j->smp = -1;
                    }
                }
            }
            if (j->fwd >= 0 && j->smp < 0) {
                int s = pick_sample(b, j->fwd);
                if (s >= 0)
                    attach_sample(b, j, s);
            }
            if (j->stp < 0) {
                int t = pick_stop(b);
                if (t >= 0)
                    attach_stop(b, j, t);
            }
            if (j->fwd >= 0 && j->smp >= 0 && j->stp >= 0) {
                j->lost_ms = 0;
            } else if (now - j->lost_ms > deadline) {
                char why[160];
                snprintf(why, sizeof why, "recovery: no %s worker within %lld ms", j->fwd < 0 ? "forward" : j->smp < 0 ? "sample" : "stop",
                         (long long)deadline);
                broker_log(b, "job %s: %s", j->id, why);
                release_job(b, j, TP_REASON_ERROR, why);
            }
        } else if (j->state == J_CLOSING && !j->result_ready && j->close_stp < 0 && j->lost_ms) {
            int t = pick_stop(b);
            if (t >= 0) {
                attach_stop(b, j, t);
            } else if (now - j->lost_ms > deadline) {
                char why[160];
                snprintf(why, sizeof why, "recovery: no stop worker within %lld ms", (long long)deadline);
                broker_log(b, "job %s: %s", j->id, why);
                int reason = j->close_finish == TP_REASON_CANCELLED ? TP_REASON_CANCELLED : TP_REASON_ERROR;
                broker_publish_finish(b, j, reason, reason == TP_REASON_ERROR ? why : NULL);
            }
        }
    }
}

void sched_start_job(broker *b, bjob *j)
{
    j->state = j->prompt ? J_ADMIT : J_TOKENIZE;
    if (j->state == J_TOKENIZE)
        dispatch_tokenize(b, j);
}

static void admit_waiting(broker *b)
{
    for (;;) {
        bjob *first = NULL;
        for (uint32_t i = 0; i < b->jobs_cap; i++) {
            bjob *j = &b->jobs[i];
            if (j->state == J_TOKENIZE && j->tok_worker < 0)
                dispatch_tokenize(b, j);
            if (j->state == J_ADMIT && (!first || j->seqno < first->seqno))
                first = j;
        }
        if (!first || !admit(b, first))
            return;
    }
}

/* ---- steps ------------------------------------------------------------------- */

/* Should forward worker wi get a new step now, and of at most how many
 * items? A step of a few rows costs nearly as much as a full one (every
 * weight is read once per step), so the running jobs are kept in
 * micro_batches groups of equal size: no step takes more than
 * ceil(running / micro_batches) items, the jobs not in a step now are
 * shared by the steps that may still be sent, and a step waits until its
 * share is READY - jobs being sampled or waiting for a stop verdict join
 * it rather than riding alone in a later step. A looser rule (send once
 * half a group is READY) let 16 jobs settle into three steps per cycle,
 * 8 + 4 + 4 or 8 + 7 + 1; without any rule 32 jobs ran as 16 + 15 + 1,
 * and the 1-row step cost a third of a full one. With no job about to
 * become READY and nothing in flight, whatever is READY goes. */
static uint32_t step_size(broker *b, int wi)
{
    const bworker *w = &b->workers[wi];
    uint32_t ready = 0, coming = 0, computing = 0;
    for (uint32_t i = 0; i < b->jobs_cap; i++) {
        const bjob *j = &b->jobs[i];
        if (j->state != J_RUNNING || j->fwd != wi)
            continue;
        ready += j->phase == P_READY && !j->cancel && j->smp >= 0;
        coming += j->phase == P_SAMPLE || j->phase == P_STOP;
        computing += j->phase == P_FORWARD;
    }
    if (!ready)
        return 0;
    uint32_t free_steps = (uint32_t)(b->cfg->micro_batches - w->steps_inflight);
    uint32_t left = (uint32_t)w->n_fwd > computing ? (uint32_t)w->n_fwd - computing : ready;
    uint32_t mb = (uint32_t)b->cfg->micro_batches, group = ((uint32_t)w->n_fwd + mb - 1) / mb;
    uint32_t share = (left + free_steps - 1) / free_steps;
    if (share > group)   /* an uneven split (1 + 31) evens out over a cycle */
        share = group;
    if (ready >= share)
        return share;
    return w->steps_inflight == 0 && coming == 0 ? ready : 0;
}

/* Tokens of j still to feed: its sequence is prompt + candidates, the
 * last candidate being the next decode input. More than one = a prefill
 * (the prompt, or the whole sequence again on a new forward worker). */
static uint32_t feed_left(const bjob *j)
{
    return j->n_prompt + j->n_cand - j->n_fed;
}

/* Add j to the step being built; returns the tokens it takes. */
static uint32_t add_item(bcols *c, uint32_t n, uint32_t n_tokens, bjob *j, uint32_t budget, int chunk)
{
    uint32_t left = feed_left(j);
    uint32_t nt = left < (uint32_t)chunk ? left : (uint32_t)chunk;
    if (nt > budget)
        nt = budget;
    if (nt < 1)
        nt = 1;
    c->slots[n] = j->slot;
    c->pos[n] = j->n_fed;
    c->acc[n] = j->acc_for_sampler;
    for (uint32_t k = 0; k < nt; k++) {
        uint32_t p = j->n_fed + k;
        c->tokens[n_tokens + k] = p < j->n_prompt ? j->prompt[p] : j->cands[p - j->n_prompt];
    }
    c->flags[n] = nt == left ? TP_ITEM_OUTPUT : 0;
    c->ntok[n] = nt;
    return nt;
}

static bool build_step(broker *b, int wi)
{
    bworker *w = &b->workers[wi];
    bcols *c = &b->cols;
    uint32_t max_items = step_size(b, wi);
    if (!max_items)
        return false;
    uint32_t budget = (uint32_t)b->cfg->max_batch_tokens;
    if (w->max_batch_tokens && w->max_batch_tokens < budget)
        budget = w->max_batch_tokens;
    if (cols_reserve(c, max_items, budget, 0))
        return false;
    uint32_t n = 0, n_tokens = 0;
    uint64_t step = ++b->next_step;
    /* decode items first (running jobs never wait behind a prompt), then
     * prompt chunks in admission order */
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t i = 0; i < b->jobs_cap && n < max_items && n_tokens < budget; i++) {
            bjob *j = &b->jobs[i];
            if (j->state != J_RUNNING || j->fwd != wi || j->phase != P_READY || j->cancel || j->smp < 0)
                continue;
            bool prefill = feed_left(j) > 1;
            if (prefill != (pass == 1))
                continue;
            uint32_t nt = add_item(c, n, n_tokens, j, budget - n_tokens, b->cfg->prefill_chunk);
            j->phase = P_FORWARD;
            j->step = step;
            if (w->stages & TP_STAGE_SAMPLE)   /* the STEP carries it to the fused sampler */
                j->acc_for_sampler = -1;
            j->n_fed += nt;
            n_tokens += nt;
            n++;
        }
    }
    if (!n)
        return false;
    tp_msg m;
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_STEP);
    m.task = task_id(b);
    tp_m_step *s = &m.step;
    s->step = step;
    s->n = n;
    s->n_tokens = n_tokens;
    s->sample = (w->stages & TP_STAGE_SAMPLE) != 0;
    s->slots = (tp_raw){c->slots, n};
    s->pos = (tp_raw){c->pos, n};
    s->ntok = (tp_raw){c->ntok, n};
    s->flags = (tp_raw){c->flags, n};
    s->tokens = (tp_raw){c->tokens, n_tokens};
    s->accepted = (tp_raw){c->acc, n};
    if (broker_send_worker(b, wi, &m))
        return false;   /* marked gone: when it is lost its jobs are fed again elsewhere */
    w->steps_inflight++;
    b->stats.forward_steps++;
    b->stats.forward_rows += n;
    b->stats.forward_tokens += n_tokens;
    return true;
}

static void run_steps(broker *b)
{
    for (int wi = 0; wi < B_MAX_WORKERS; wi++) {
        bworker *w = &b->workers[wi];
        while (registry_usable(b, wi) && (w->stages & TP_STAGE_FORWARD) && w->steps_inflight < b->cfg->micro_batches &&
               build_step(b, wi))
            ;
    }
}

void sched_run(broker *b)
{
    sched_recover(b, tp_now_ms());   /* jobs that lost a worker before new ones */
    admit_waiting(b);
    run_steps(b);
}

/* ---- results ------------------------------------------------------------------ */

/* Rows src[0, k) of the logprob columns lp (NULL or without frames: none),
 * for the k candidates one stop worker gets. Owned by the caller. */
typedef struct lp_pick {
    float *lp, *top;
    int32_t *ids;
} lp_pick;

static bool pick_lp(const tp_lp_cols *lp, const uint32_t *src, const uint32_t *sel, uint32_t k, lp_pick *out,
                    tp_lp_cols *cols)
{
    size_t w = lp->top_n;
    out->lp = malloc((k ? k : 1) * sizeof *out->lp);
    size_t cells = (size_t)k * w > 0 ? (size_t)k * w : 1;
    out->top = malloc(cells * sizeof *out->top);
    out->ids = malloc(cells * sizeof *out->ids);
    if (!out->lp || !out->top || !out->ids)
        return false;
    for (uint32_t i = 0; i < k; i++) {
        size_t from = src[sel[i]];
        out->lp[i] = tp_raw_f32(lp->logprobs, from);
        for (size_t c = 0; c < w; c++) {
            out->ids[i * w + c] = tp_raw_i32(lp->top_ids, from * w + c);
            out->top[i * w + c] = tp_raw_f32(lp->top_logprobs, from * w + c);
        }
    }
    *cols = (tp_lp_cols){lp->top_n, {out->lp, k}, {out->ids, k * w}, {out->top, k * w}};
    return true;
}

/* The candidates of a step's output items go to the items' stop workers,
 * with their logprob rows (src[i]: item i's row in lp) when the sampler
 * sent any. */
static void send_candidates(broker *b, uint64_t step, const uint32_t *slots, const int32_t *cands, uint32_t n,
                            const tp_lp_cols *lp, const uint32_t *src)
{
    bcols *c = &b->cols;
    bool with_lp = lp && lp->logprobs.data && src;
    uint32_t *sel = with_lp ? malloc((n ? n : 1) * sizeof *sel) : NULL;
    if (with_lp && !sel)
        with_lp = false;   /* out of memory: the tokens still go on, without logprobs */
    /* each row's cached_tokens, for its FINISH (none when out of memory) */
    int32_t *cached = malloc((n ? n : 1) * sizeof *cached);
    for (int wi = 0; wi < B_MAX_WORKERS; wi++) {
        if (!registry_usable(b, wi) || !(b->workers[wi].stages & TP_STAGE_STOP))
            continue;
        if (cols_reserve(c, n, 0, 0))
            break;
        uint32_t k = 0;
        for (uint32_t i = 0; i < n; i++) {
            bjob *j = jobs_by_slot(b, slots[i]);
            if (!j || j->stp != wi)
                continue;
            if (sel)
                sel[k] = i;
            c->slots[k] = slots[i];
            if (cached)
                cached[k] = (int32_t)j->cached;
            c->cands[k++] = cands[i];
        }
        if (!k)
            continue;
        tp_msg m;
        tp_msg_init(&m, TP_FAM_WRK, TP_CMD_STOP_STEP);
        m.task = task_id(b);
        m.stop_step.step = step;
        m.stop_step.n = k;
        m.stop_step.slots = (tp_raw){c->slots, k};
        m.stop_step.candidates = (tp_raw){c->cands, k};
        m.stop_step.cached = cached;
        m.stop_step.n_cached = cached ? k : 0;
        lp_pick pk = {0};
        if (with_lp && !pick_lp(lp, src, sel, k, &pk, &m.stop_step.lp))
            m.stop_step.lp = (tp_lp_cols){0};
        broker_send_worker(b, wi, &m);
        free(pk.lp);
        free(pk.top);
        free(pk.ids);
    }
    free(sel);
    free(cached);
}

/* ---- candidates and verdicts ---------------------------------------------- */

static bool can_decode_ahead(const broker *b, const bjob *j)
{
    return b->cfg->decode_ahead && j->n_cand - j->n_verd < B_RING - 1 && j->n_cand < (uint32_t)j->params.max_tokens && j->pending >= 0;
}

/* A new candidate c of job j: queue it for its verdict and make it the
 * job's next input. An invalid candidate (-1: the sampler failed) is never
 * fed; its verdict finishes the job with an error. */
static void on_candidate(broker *b, bjob *j, int32_t c)
{
    if (jobs_append_cand(j, c)) {
        release_job(b, j, TP_REASON_ERROR, "broker out of memory");
        return;
    }
    j->pending = c;
    j->acc_for_sampler = c;
    j->phase = can_decode_ahead(b, j) ? P_READY : P_STOP;
}

/* Cancelled jobs among those whose candidates just went to stop: end them
 * now (after the STOP_STEP, so the stop worker decides that candidate
 * before it sees the STOP_CLOSE). */
static void end_cancelled(broker *b, const uint32_t *slots, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        bjob *j = jobs_by_slot(b, slots[i]);
        if (j && j->state == J_RUNNING && j->cancel && j->phase == P_READY)
            release_job(b, j, TP_REASON_CANCELLED, NULL);
    }
}

/* Jobs of a step at wi in phase `phase` whose slot is listed move on. */
static bjob *step_job(broker *b, uint32_t slot, uint64_t step, int phase)
{
    bjob *j = jobs_by_slot(b, slot);
    if (!j || j->state != J_RUNNING || j->step != step || j->phase != phase)
        return NULL;
    return j;
}

static void fail_step(broker *b, int wi, uint64_t step, int phase, const tp_msg *m)
{
    char why[TP_ERR_MSG_MAX];
    snprintf(why, sizeof why, "%s from %s: %u %.*s", tp_cmd_name(TP_FAM_WRK, m->cmd), b->workers[wi].instance,
             m->status, (int)m->error.len, m->error.ptr);
    broker_log(b, "%s", why);
    for (uint32_t i = 0; i < b->jobs_cap; i++) {
        bjob *j = &b->jobs[i];
        bool hit = phase == P_STOP ? j->state == J_RUNNING && j->stp == wi && j->n_cand > j->n_verd
                                   : j->state == J_RUNNING && j->step == step && j->phase == phase;
        if (hit)
            release_job(b, j, TP_REASON_ERROR, why);
    }
}

/* After STEP_RESULT: jobs without output (a prompt chunk that is not the
 * last) are ready again; the others go to sample or stop. */
static void release_quiet_items(broker *b, int wi, uint64_t step)
{
    for (uint32_t i = 0; i < b->jobs_cap; i++) {
        bjob *j = &b->jobs[i];
        if (j->state == J_RUNNING && j->fwd == wi && j->step == step && j->phase == P_FORWARD) {
            j->phase = P_READY;
            if (j->cancel)
                release_job(b, j, TP_REASON_CANCELLED, NULL);
        }
    }
}

static void send_sample(broker *b, uint64_t step, const tp_m_step_result *r)
{
    bcols *c = &b->cols;
    size_t v = r->vocab;
    for (int wi = 0; wi < B_MAX_WORKERS; wi++) {
        if (!registry_usable(b, wi) || !(b->workers[wi].stages & TP_STAGE_SAMPLE))
            continue;
        if (cols_reserve(c, r->n, 0, (size_t)r->n * v))
            return;
        uint32_t k = 0;
        bool whole = true;   /* every row, in order: forward the frame as is */
        for (uint32_t i = 0; i < r->n; i++) {
            bjob *j = step_job(b, tp_raw_u32(r->slots, i), step, P_SAMPLE);
            if (!j || j->smp != wi) {
                whole = false;
                continue;
            }
            c->slots[k] = j->slot;
            c->index[k] = j->n_cand;
            c->acc[k] = j->acc_for_sampler;
            j->acc_for_sampler = -1;
            whole = whole && k == i;
            k++;
        }
        if (!k)
            continue;
        if (!whole) {   /* this sampler's rows only */
            uint32_t row = 0;
            for (uint32_t i = 0; i < r->n; i++)
                if (row < k && tp_raw_u32(r->slots, i) == c->slots[row])
                    memcpy(c->logits + (size_t)row++ * v, (const char *)r->out.data + (size_t)i * v * 4, v * 4);
        }
        tp_msg m;
        tp_msg_init(&m, TP_FAM_WRK, TP_CMD_SAMPLE);
        m.task = task_id(b);
        m.sample.step = step;
        m.sample.n = k;
        m.sample.vocab = (uint32_t)v;
        m.sample.slots = (tp_raw){c->slots, k};
        m.sample.index = (tp_raw){c->index, k};
        m.sample.accepted = (tp_raw){c->acc, k};
        m.sample.logits = whole ? (tp_raw){r->out.data, (size_t)k * v} : (tp_raw){c->logits, (size_t)k * v};
        broker_send_worker(b, wi, &m);
    }
}

/* Prompt positions the worker took from its prefix cache, per job (only
 * the prompt's: a job re-prefilled after it generated keeps its count),
 * and the worker's cache figures for STATS. */
static void note_cache_hits(broker *b, int wi, const tp_m_step_result *r)
{
    for (size_t i = 0; i < r->n_cached_slots; i++) {
        bjob *j = jobs_by_slot(b, (uint32_t)r->cached_slots[i]);
        if (j && j->state == J_RUNNING && j->fwd == wi && j->step == r->step && j->n_cand == 0) {
            j->cached += (uint32_t)r->cached[i];
            if (j->cached >= j->n_prompt)   /* a worker's claim, never more than the rule allows */
                j->cached = j->n_prompt ? j->n_prompt - 1 : 0;
        }
    }
    if (r->n_cache >= TP_CACHE_COUNT)
        memcpy(b->workers[wi].cache, r->cache, sizeof b->workers[wi].cache);
}

static void on_step_result(broker *b, int wi, const tp_msg *m)
{
    const tp_m_step_result *r = &m->step_result;
    if (b->workers[wi].steps_inflight > 0)
        b->workers[wi].steps_inflight--;
    if (m->status != TP_ST_OK) {
        fail_step(b, wi, r->step, P_FORWARD, m);
        return;
    }
    note_cache_hits(b, wi, r);
    /* output items move on; then whoever is still in FORWARD had none */
    uint32_t *slots = malloc((r->n ? r->n : 1) * sizeof *slots);
    int32_t *cands = malloc((r->n ? r->n : 1) * sizeof *cands);
    uint32_t *src = malloc((r->n ? r->n : 1) * sizeof *src);
    uint32_t k = 0;
    for (uint32_t i = 0; slots && cands && src && i < r->n; i++) {
        bjob *j = step_job(b, tp_raw_u32(r->slots, i), r->step, P_FORWARD);
        if (!j || j->fwd != wi)
            continue;
        if (r->sampled) {
            int32_t c = tp_raw_i32(r->out, i);
            on_candidate(b, j, c);
            src[k] = i;
            slots[k] = j->slot;
            cands[k++] = c;
        } else {
            j->phase = P_SAMPLE;
        }
    }
    release_quiet_items(b, wi, r->step);
    if (r->sampled) {
        send_candidates(b, r->step, slots, cands, k, &r->lp, src);
        end_cancelled(b, slots, k);
    } else {
        send_sample(b, r->step, r);
    }
    free(slots);
    free(cands);
    free(src);
}

static void on_sampled(broker *b, int wi, const tp_msg *m)
{
    const tp_m_sampled *r = &m->sampled;
    if (m->status != TP_ST_OK) {
        fail_step(b, wi, r->step, P_SAMPLE, m);
        return;
    }
    uint32_t *slots = malloc((r->n ? r->n : 1) * sizeof *slots);
    int32_t *cands = malloc((r->n ? r->n : 1) * sizeof *cands);
    uint32_t *src = malloc((r->n ? r->n : 1) * sizeof *src);
    uint32_t k = 0;
    for (uint32_t i = 0; slots && cands && src && i < r->n; i++) {
        bjob *j = step_job(b, tp_raw_u32(r->slots, i), r->step, P_SAMPLE);
        if (!j || j->smp != wi)
            continue;
        int32_t c = tp_raw_i32(r->candidates, i);
        on_candidate(b, j, c);
        src[k] = i;
        slots[k] = j->slot;
        cands[k++] = c;
    }
    send_candidates(b, r->step, slots, cands, k, &r->lp, src);
    end_cancelled(b, slots, k);
    free(slots);
    free(cands);
    free(src);
}

static void on_verdicts(broker *b, int wi, const tp_msg *m)
{
    const tp_m_verdicts *r = &m->verdicts;
    if (m->status != TP_ST_OK) {
        fail_step(b, wi, r->step, P_STOP, m);
        return;
    }
    /* a stop worker answers a job's candidates in the order it got them */
    for (uint32_t i = 0; i < r->n; i++) {
        bjob *j = jobs_by_slot(b, tp_raw_u32(r->slots, i));
        if (!j || j->n_verd >= j->n_cand || j->state == J_FINISHED || (j->state == J_RUNNING && j->stp != wi) ||
            (j->state == J_CLOSING && j->close_stp != wi))
            continue;   /* a verdict on a candidate decoded after the job ended, or of a replaced worker */
        int32_t c = j->cands[j->n_verd++];
        uint8_t fin = tp_raw_u8(r->finish, i);
        if (tp_raw_u8(r->accepted, i))
            jobs_append_out(j, c);
        if (j->state != J_RUNNING)
            continue;   /* cancelled while this candidate was checked: keep its token, nothing else */
        if (fin != TP_REASON_NONE) {
            j->engine_reason = fin < TP_REASON_COUNT ? fin : TP_REASON_ERROR;
            release_job(b, j, TP_REASON_NONE, NULL);
            continue;
        }
        if (j->phase == P_STOP && (can_decode_ahead(b, j) || j->n_verd == j->n_cand))
            j->phase = P_READY;
        if (j->cancel && j->phase == P_READY)
            release_job(b, j, TP_REASON_CANCELLED, NULL);
    }
}

/* RESULT of an OPEN (or CLOSE): a refused OPEN fails its job. */
static void on_open_result(broker *b, int wi, const tp_msg *m)
{
    if (m->status == TP_ST_OK)
        return;
    for (uint32_t i = 0; i < b->jobs_cap; i++) {
        bjob *j = &b->jobs[i];
        if (j->state != J_RUNNING || (j->open_task[0] != m->task && j->open_task[1] != m->task &&
                                      j->open_task[2] != m->task))
            continue;
        char why[TP_ERR_MSG_MAX];
        snprintf(why, sizeof why, "worker %s refused the job: %u %.*s", b->workers[wi].instance, m->status,
                 (int)m->error.len, m->error.ptr);
        broker_log(b, "%s", why);
        if (j->phase == P_READY)
            release_job(b, j, TP_REASON_ERROR, why);
        else
            j->cancel = true, j->engine_reason = TP_REASON_ERROR;
        return;
    }
}

void sched_on_result(broker *b, int wi, const tp_msg *m)
{
    switch (m->cmd) {
    case TP_CMD_TOKENIZED:
        on_tokenized(b, wi, m);
        break;
    case TP_CMD_STEP_RESULT:
        on_step_result(b, wi, m);
        break;
    case TP_CMD_SAMPLED:
        on_sampled(b, wi, m);
        break;
    case TP_CMD_VERDICTS:
        on_verdicts(b, wi, m);
        break;
    case TP_CMD_RESULT:
        on_open_result(b, wi, m);
        break;
    default:
        b->stats.malformed_back++;
        broker_log(b, "worker %s sent %s, which workers do not send", b->workers[wi].instance,
                   tp_cmd_name(TP_FAM_WRK, m->cmd));
        return;
    }
    sched_run(b);
}
