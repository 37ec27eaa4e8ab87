/* Recovery: a lost worker's jobs move to other workers of its stages and
 * what it held is replayed there (pin.c); a job that keeps losing the
 * workers processing it is a poison job and ends instead of being handed
 * on; a closing job whose FINISH event was lost gets one. */
#include <stdio.h>
#include <string.h>

#include "recover.h"
#include "choose.h"
#include "drafting.h"
#include "log.h"
#include "pin.h"
#include "registry.h"
#include "route.h"
#include "spawn.h"
#include "tokpipe/zwire.h"

static void note_loss(bjob *j, int64_t now)
{
    if (!j->lost_ms)
        j->lost_ms = now;
    if (!j->recover_t0)
        j->recover_t0 = now;
}

/* The stage (TP_SI_*) of j that worker wi was processing when it was lost,
 * or -1 when j only waited there: a tokenize task, a step being computed,
 * logits being sampled, candidates (or a close) awaiting the stop worker. */
static int busy_stage(const bjob *j, int wi)
{
    if (j->state == J_TOKENIZE)
        return j->tok_worker == wi ? TP_SI_TOKENIZE : -1;
    if (j->state == J_CLOSING)
        return j->close_stp == wi && !j->result_ready ? TP_SI_STOP : -1;
    if (j->state != J_RUNNING || j->result_ready)
        return -1;
    if (j->fwd == wi && j->phase == P_FORWARD)
        return TP_SI_FORWARD;
    if (j->smp == wi && j->phase == P_SAMPLE)
        return TP_SI_SAMPLE;
    if (j->stp == wi && j->n_cand > j->n_verd)
        return TP_SI_STOP;
    return -1;
}

/* Was j's work (at stage si) in the task worker w was computing when it
 * was lost? A worker answers its owed tasks in order (state.h: bowed), so
 * a hung one, whose answers still leave, was computing its oldest; one
 * that died may have answered a few more that its death swallowed, so it
 * was computing any of them. Jobs merely pinned to it computed nothing
 * there, and a worker that owed nothing computed nothing. */
static bool in_computed_task(const bworker *w, const bjob *j, int si)
{
    for (size_t t = 0; t < (w->hung ? 1 : w->n_owed) && t < w->n_owed; t++) {
        if (w->owed[t].si != si)
            continue;
        for (uint32_t k = 0; k < w->owed[t].n; k++)
            if (w->owed[t].slots[k] == j->slot)
                return true;
    }
    return false;
}

/* Worker wi was processing j when it was lost. j becomes a suspect, tried
 * apart from other jobs from now on (choose.c, step.c), until it gets a
 * result of that stage (jobs_progress). The loss counts against j only when
 * the worker died or hung (past its step deadline, or silent while it owed
 * an answer) and j was the one job in the task it was computing (counts):
 * which of several jobs brought a worker down is not known, and a worker
 * killed from outside while a batch is in flight says nothing about any of
 * them; tried alone, a job that does it again is known. True when j
 * is now a poison job (B_POISON_TRIES such losses at one stage without a
 * result there in between), with why saying so. */
static bool charge(bjob *j, int si, bool counts, const char *cause, char *why, size_t cap)
{
    if (j->loss_stage != si)
        j->losses = 0;
    j->loss_stage = (int8_t)si;
    j->suspect = true;
    if (!counts || ++j->losses < B_POISON_TRIES)
        return false;
    snprintf(why, cap, "%s worker lost %s while processing this job (%s); not handed on again",
             tp_config_stage_name(si), B_POISON_TRIES == 2 ? "twice" : "repeatedly", cause);
    return true;
}

/* A poison job ends in `error` with why, never handed to another worker:
 * its FINISH comes from a live stop worker it still holds, else from the
 * broker. */
static void end_poison(broker *b, bjob *j, int si, const char *why)
{
    b->stats.jobs_poisoned++;
    blog("job %s: poison: %s", j->id, why);
    if (j->state == J_RUNNING && si != TP_SI_STOP && registry_usable(b, j->stp)) {
        pin_release(b, j, TP_REASON_ERROR, why);
        return;
    }
    pin_publish_finish(b, j, TP_REASON_ERROR, why);
    if (j->state == J_RUNNING)
        pin_release(b, j, TP_REASON_ERROR, why);
}

/* Worker wi is gone (why): the jobs pinned to it lose that stage and wait
 * for another worker of it (recover_run, at once if one has room). What the
 * lost worker held is rebuilt from the job record: the KV cache from
 * prompt + candidates, the sampler from the candidates (its random stream
 * is counted by accepted tokens, so it draws the same), the stop state
 * from the tokens subscribers were sent. Work in flight there is dropped:
 * a step being computed (its jobs are fed again), logits being sampled
 * (the last position is computed again), candidates being checked (sent
 * again to the new stop worker). */
void recover_worker_lost(broker *b, int wi, const char *cause, bool died)
{
    bworker *w = &b->workers[wi];
    w->live = false;   /* nothing more is sent to it */
    drafting_lost(b, wi);   /* (no job waits for a draft worker: its jobs draft elsewhere later) */
    int64_t now = tp_now_ms();
    int busy = 0;
    for (uint32_t i = 0; i < b->jt.cap; i++) {
        int si = busy_stage(&b->jt.jobs[i], wi);
        busy += si >= 0 && in_computed_task(w, &b->jt.jobs[i], si);
    }
    for (uint32_t i = 0; i < b->jt.cap; i++) {
        bjob *j = &b->jt.jobs[i];
        int si = busy_stage(j, wi);
        if (si >= 0 && !in_computed_task(w, j, si))
            si = -1;   /* queued there, not computed: simply moves */
        char why[TP_PROTO_MAX_ERROR];
        bool poison = si >= 0 && charge(j, si, died && busy == 1, cause, why, sizeof why);
        if (j->state == J_TOKENIZE && j->tok_worker == wi) {
            j->tok_worker = -1;   /* tokenizing is idempotent: queue it again */
            j->tok_task = 0;
            if (poison) {
                end_poison(b, j, si, why);
                continue;
            }
            b->stats.recovered[TP_SI_TOKENIZE]++;
        } else if (j->state == J_RUNNING && (j->fwd == wi || j->smp == wi || j->stp == wi)) {
            if (j->result_ready) {
                /* subscribers already have its FINISH: nothing to rebuild */
                if (j->fwd == wi) j->fwd = -1;
                if (j->smp == wi) j->smp = -1;
                if (j->stp == wi) j->stp = -1;
                pin_release(b, j, TP_REASON_NONE, NULL);
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
            if (poison) {
                end_poison(b, j, si, why);
                continue;
            }
            note_loss(j, now);
        } else if (j->state == J_CLOSING && j->close_stp == wi && !j->result_ready) {
            j->close_stp = -1;
            if (poison) {
                end_poison(b, j, si, why);
                continue;
            }
            note_loss(j, now);
        }
    }
    registry_drop(b, wi);
    recover_run(b, now);
}

/* Lose worker wi: it is told (in case it still runs) and its jobs move. A
 * hung worker reads nothing: one tokpiped started is killed, so that it
 * is started again. */
void recover_lose(broker *b, int wi, const char *why, bool died)
{
    bworker *w = &b->workers[wi];
    if (!w->live)
        return;
    registry_lose(b, wi, why);
    if (w->hung) {
        b->stats.workers_hung++;
        if (b->spawn && spawn_kill(b, w->instance))
            blog("worker %s killed: hung", w->instance);
    }
    recover_worker_lost(b, wi, why, died);
}

/* Lose the workers marked gone (a send failed, heartbeats expired, too
 * many malformed messages): done here, between messages, not in the
 * middle of building one. */
void recover_reap(broker *b)
{
    for (int i = 0; i < B_MAX_WORKERS; i++)
        if (b->workers[i].live && b->workers[i].gone)
            recover_lose(b, i, b->workers[i].gone_why ? b->workers[i].gone_why : "connection closed",
                         !b->workers[i].gone_why || b->workers[i].hung);
}

/* A closing job whose stop worker never published its FINISH (the event
 * was lost): the broker publishes one so the job ends. */
void recover_lost_finish(broker *b, int64_t now)
{
    for (uint32_t i = 0; i < b->jt.cap; i++) {
        bjob *j = &b->jt.jobs[i];
        if (j->state == J_CLOSING && j->close_stp >= 0 && now - j->closing_since > B_CLOSING_GRACE_MS)
            pin_publish_finish(b, j, j->engine_reason ? j->engine_reason : TP_REASON_ERROR, "finish event lost");
    }
}

/* Jobs that lost a worker get another one of that stage as soon as one has
 * room; past recovery.deadline_ms without one, the job ends in `error`
 * naming the stage (the only way a lost worker ends a job). */
void recover_run(broker *b, int64_t now)
{
    int64_t deadline = b->cfg->recovery_deadline_ms;
    for (uint32_t i = 0; i < b->jt.cap; i++) {
        bjob *j = &b->jt.jobs[i];
        if (j->state == J_RUNNING && j->result_ready && (j->fwd < 0 || j->smp < 0 || j->stp < 0)) {
            /* its FINISH reached subscribers (a late event of the lost
             * worker): nothing left to rebuild */
            pin_release(b, j, TP_REASON_NONE, NULL);
        } else if (j->state == J_RUNNING && (j->fwd < 0 || j->smp < 0 || j->stp < 0)) {
            if (j->fwd < 0) {
                int f = route_forward(b, j);
                if (f >= 0) {
                    pin_forward(b, j, f);
                    route_note(b, f, j->prompt, j->n_prompt, NULL, 0);
                    if ((b->workers[f].stages & TP_STAGE_SAMPLE) && j->smp != f && j->smp >= 0) {
                        /* a fused worker samples its own rows: the sampler moves too */
                        pin_slot_cmd(b, j->smp, TP_CMD_SAMPLE_CLOSE, j->slot);
                        b->workers[j->smp].n_smp--;
                        j->smp = -1;
                    }
                }
            }
            if (j->fwd >= 0 && j->smp < 0) {
                int s = choose_sample(b, j->fwd);
                if (s >= 0)
                    pin_sample(b, j, s);
            }
            if (j->stp < 0) {
                int t = choose_stop(b);
                if (t >= 0)
                    pin_stop(b, j, t);
            }
            if (j->fwd >= 0 && j->smp >= 0 && j->stp >= 0) {
                j->lost_ms = 0;
            } else if (now - j->lost_ms > deadline) {
                char why[160];
                snprintf(why, sizeof why, "recovery: no %s worker within %lld ms", j->fwd < 0 ? "forward" : j->smp < 0 ? "sample" : "stop",
                         (long long)deadline);
                blog("job %s: %s", j->id, why);
                pin_release(b, j, TP_REASON_ERROR, why);
            }
        } else if (j->state == J_CLOSING && !j->result_ready && j->close_stp < 0 && j->lost_ms) {
            int t = choose_stop(b);
            if (t >= 0) {
                pin_stop(b, j, t);
            } else if (now - j->lost_ms > deadline) {
                char why[160];
                snprintf(why, sizeof why, "recovery: no stop worker within %lld ms", (long long)deadline);
                blog("job %s: %s", j->id, why);
                int reason = j->close_finish == TP_REASON_CANCELLED ? TP_REASON_CANCELLED : TP_REASON_ERROR;
                pin_publish_finish(b, j, reason, reason == TP_REASON_ERROR ? why : NULL);
            }
        }
    }
}
