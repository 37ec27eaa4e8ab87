/* A job's workers: pinning it to a forward, sample and stop worker (the
 * OPEN messages, with what a replacement must replay), letting go of them
 * (the CLOSE messages), and the ways a job ends before its stop worker
 * says so: failed, cancelled, or a FINISH the broker publishes itself. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pin.h"
#include "choose.h"
#include "drafting.h"
#include "log.h"
#include "outbox.h"
#include "registry.h"
#include "route.h"
#include "tokpipe/rand.h"
#include "tokpipe/zwire.h"

/* A FINISH the broker publishes itself: for jobs that never reached a stop
 * worker (cancelled or failed while queued) or whose stop worker is gone. */
void pin_publish_finish(broker *b, bjob *j, int reason, const char *error)
{
    tp_msg ev;
    if (!jobs_own_finish(j, reason, error, &ev))
        return;
    out_event(b, &ev);
    const bjob *resumed;
    jobs_on_event(&b->jt, &ev, &resumed);
    if (j->state != J_FINISHED)   /* RUNNING jobs end when released */
        j->result_ready = true;
}

uint64_t pin_slot_cmd(broker *b, int wi, uint8_t cmd, uint32_t slot)
{
    if (wi < 0 || !b->workers[wi].live)
        return 0;
    tp_msg m;
    tp_msg_init(&m, TP_FAM_WRK, cmd);
    m.task = out_task(b);
    m.slot.slot = slot;
    out_worker(b, wi, &m);
    return m.task;
}

static void send_stop_close(broker *b, bjob *j, int finish, const char *error)
{
    if (j->stp < 0 || !b->workers[j->stp].live)
        return;
    tp_msg m;
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_STOP_CLOSE);
    m.task = out_task(b);
    m.stop_close.slot = j->slot;
    m.stop_close.finish = finish;
    m.stop_close.job_error = tp_str_of(error);
    out_worker(b, j->stp, &m);
}

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
void pin_release(broker *b, bjob *j, int finish, const char *error)
{
    if (j->fwd >= 0) {
        /* its worker caches the prompt and the candidates it was fed */
        uint32_t fed = j->n_fed > j->n_prompt ? j->n_fed - j->n_prompt : 0;
        route_note(b, j->fwd, j->prompt, j->n_fed < j->n_prompt ? j->n_fed : j->n_prompt, j->cands,
                   fed < j->n_cand ? fed : j->n_cand);
        pin_slot_cmd(b, j->fwd, TP_CMD_SEQ_CLOSE, j->slot);
        b->workers[j->fwd].n_fwd--;
    }
    if (j->smp >= 0) {
        pin_slot_cmd(b, j->smp, TP_CMD_SAMPLE_CLOSE, j->slot);
        b->workers[j->smp].n_smp--;
    }
    drafting_release(b, j);
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
        jobs_mark_finished(&b->jt, j);
    } else if (!stop_live && finish != TP_REASON_NONE) {
        int t = choose_stop(b);
        if (t >= 0)
            pin_stop(b, j, t);
        else
            pin_publish_finish(b, j, finish, error);
    }
}

void pin_fail(broker *b, bjob *j, const char *why)
{
    if (j->state == J_RUNNING) {
        pin_release(b, j, TP_REASON_ERROR, why);
        return;
    }
    if (j->state == J_TOKENIZE && j->tok_worker >= 0 && b->workers[j->tok_worker].live)
        registry_tok_done(b, j->tok_worker);
    if (j->state == J_TOKENIZE || j->state == J_ADMIT)
        pin_publish_finish(b, j, TP_REASON_ERROR, why);
}

void pin_cancel(broker *b, bjob *j)
{
    if (j->state == J_RUNNING) {
        j->cancel = true;
        if (j->phase == P_READY)
            pin_release(b, j, TP_REASON_CANCELLED, NULL);
        return;   /* else when its step comes back */
    }
    if (j->state == J_TOKENIZE && j->tok_worker >= 0 && b->workers[j->tok_worker].live)
        registry_tok_done(b, j->tok_worker);
    if (j->state == J_TOKENIZE || j->state == J_ADMIT)
        pin_publish_finish(b, j, TP_REASON_CANCELLED, NULL);
}

bool pin_can_decode_ahead(const broker *b, const bjob *j)
{
    return b->cfg->decode_ahead && j->n_cand - j->n_verd < B_RING - 1 && j->n_cand < (uint32_t)j->params.max_tokens && j->pending >= 0;
}

static void log_recovery(broker *b, const bjob *j, int si, int wi, uint32_t replayed)
{
    if (j->lost_ms || j->state == J_CLOSING)
        blog("job %s: %s continues on worker %s after a lost worker (%u tokens replayed, %lld ms after the loss)",
                   j->id, tp_config_stage_name(si), b->workers[wi].instance, replayed,
                   (long long)(j->lost_ms ? tp_now_ms() - j->lost_ms : 0));
}

/* SEQ_OPEN at f; the whole sequence (prompt + candidates) is prefilled
 * again there in chunks, next to the running jobs. */
void pin_forward(broker *b, bjob *j, int f)
{
    bool again = j->n_cand > 0 || j->lost_ms;
    j->fwd = f;
    b->workers[f].n_fwd++;
    j->n_fed = 0;
    if (j->n_cand == 0)   /* the prompt is prefilled again: its hits are counted again */
        j->cached = 0;
    if (j->phase == P_FORWARD)
        j->phase = P_READY;
    tp_msg m;
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_SEQ_OPEN);
    m.task = out_task(b);
    m.slot.slot = j->slot;
    m.slot.pool = j->embed;   /* an embedding job: the worker pools its hidden states */
    out_worker(b, f, &m);
    j->open_task[0] = m.task;
    if (again) {
        b->stats.recovered[TP_SI_FORWARD]++;
        log_recovery(b, j, TP_SI_FORWARD, f, j->n_prompt + j->n_cand);
    }
}

/* SAMPLE_OPEN at s. replay: the candidates so far, which the sampler
 * accepts (penalty window, random stream position) before its next draw. */
void pin_sample(broker *b, bjob *j, int s)
{
    uint32_t n_replay = j->n_cand;
    if (n_replay && j->cands[n_replay - 1] < 0)
        n_replay--;   /* a failed draw: its verdict ends the job */
    bool again = n_replay > 0 || j->lost_ms;
    j->smp = s;
    b->workers[s].n_smp++;
    tp_msg m;
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_SAMPLE_OPEN);
    m.task = out_task(b);
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
    out_worker(b, s, &m);
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
void pin_stop_resend(broker *b, bjob *j, int t)
{
    uint32_t k = j->n_verd;
    j->stop_resend = false;
    if (j->n_cand <= k)
        return;
    tp_msg st;
    tp_msg_init(&st, TP_FAM_WRK, TP_CMD_STOP_STEP);
    st.task = out_task(b);
    st.stop_step.step = ++b->next_step;
    st.stop_step.n = j->n_cand - k;
    uint32_t *slots = malloc((j->n_cand - k) * sizeof *slots);
    if (slots) {
        for (uint32_t i = 0; i < j->n_cand - k; i++)
            slots[i] = j->slot;
        st.stop_step.slots = (tp_raw){slots, j->n_cand - k};
        st.stop_step.candidates = (tp_raw){j->cands + k, j->n_cand - k};
        /* with the rows the sampler sent: their TOKEN events carry them */
        st.stop_step.lp = joblp_candidates(j, k, j->n_cand);
        out_worker(b, t, &st);
        free(slots);
    }
}

void pin_stop(broker *b, bjob *j, int t)
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
    m.task = out_task(b);
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
    j->open_task[2] = m.task;
    out_worker(b, t, &m);
    /* the verdicts after the replayed tokens come again */
    j->n_verd = k;
    if (j->n_out > k)
        j->n_out = k;
    while (j->n_out < k)
        jobs_append_out(j, j->cands[j->n_out]);
    /* a job the stop stage lost a worker on has its verdicts computed
     * alone: step.c sends them once nothing else is owed there */
    j->stop_resend = j->n_cand > k;
    if (j->stop_resend && !(j->state == J_RUNNING && jobs_suspect(j) && j->loss_stage == TP_SI_STOP))
        pin_stop_resend(b, j, t);
    if (j->state == J_CLOSING) {
        j->close_stp = t;
        j->closing_since = tp_now_ms();
        j->lost_ms = 0;
        tp_msg c;
        tp_msg_init(&c, TP_FAM_WRK, TP_CMD_STOP_CLOSE);
        c.task = out_task(b);
        c.stop_close.slot = j->slot;
        c.stop_close.finish = j->close_finish;
        c.stop_close.job_error = tp_str_of(j->close_error);
        out_worker(b, t, &c);
    } else {
        j->stp = t;
        b->workers[t].n_stp++;
        /* every candidate may have been published already (a stopped
         * worker that ran again before it was told DISCONNECT): then no
         * verdict is coming, and the job must not wait for one */
        if (j->phase == P_STOP && j->pending >= 0 && (j->n_verd == j->n_cand || pin_can_decode_ahead(b, j)))
            j->phase = P_READY;
    }
    if (again) {
        b->stats.recovered[TP_SI_STOP]++;
        log_recovery(b, j, TP_SI_STOP, t, k);
    }
}
