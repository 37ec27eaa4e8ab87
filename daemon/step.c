/* The step cycle: continuously batched decoding.
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

#include "step.h"
#include "drafting.h"
#include "guess.h"
#include "log.h"
#include "outbox.h"
#include "pin.h"
#include "registry.h"
#include "tokpipe/zwire.h"

static int cols_reserve(bcols *c, size_t n, size_t n_tokens, size_t n_logits)
{
    if (n > c->cap) {
        size_t nc = n * 2;
        void *p[8] = {realloc(c->slots, nc * 4), realloc(c->pos, nc * 4), realloc(c->ntok, nc * 4),
                      realloc(c->index, nc * 4), realloc(c->flags, nc), realloc(c->acc, nc * 4),
                      realloc(c->cands, nc * 4), realloc(c->guess, nc * 4)};
        /* realloc failure leaves the old block valid: keep whichever we got */
        if (p[0]) c->slots = p[0];
        if (p[1]) c->pos = p[1];
        if (p[2]) c->ntok = p[2];
        if (p[3]) c->index = p[3];
        if (p[4]) c->flags = p[4];
        if (p[5]) c->acc = p[5];
        if (p[6]) c->cands = p[6];
        if (p[7]) c->guess = p[7];
        for (int i = 0; i < 8; i++)
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

void step_free(broker *b)
{
    bcols *c = &b->cols;
    free(c->slots);
    free(c->pos);
    free(c->ntok);
    free(c->index);
    free(c->flags);
    free(c->acc);
    free(c->cands);
    free(c->guess);
    free(c->tokens);
    free(c->logits);
    free(c->ids);
    memset(c, 0, sizeof *c);
}

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
    for (uint32_t i = 0; i < b->jt.cap; i++) {
        const bjob *j = &b->jt.jobs[i];
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
    /* the last prompt chunk: logits, or an embedding job's vector (it ends there) */
    c->flags[n] = nt == left ? (j->embed ? TP_ITEM_EMBED : TP_ITEM_OUTPUT) : 0;
    c->ntok[n] = nt;
    return nt;
}

/* May j join a step at wi? Not while candidates of it wait to go to its
 * stop worker again (stop_resend): a stop worker takes a job's candidates
 * in order. */
static bool ready_at(const bjob *j, int wi)
{
    return j->state == J_RUNNING && j->fwd == wi && j->phase == P_READY && !j->cancel && j->smp >= 0 &&
           !j->stop_resend;
}

/* A job that lost a worker processing it (recover.c) is stepped alone, with
 * nothing else in flight at its forward worker: if it crashes this one
 * too, no other job is charged with the loss. */
static bjob *ready_suspect(broker *b, int wi)
{
    if (!b->stats.workers_lost)
        return NULL;
    for (uint32_t i = 0; i < b->jt.cap; i++)
        if (ready_at(&b->jt.jobs[i], wi) && jobs_suspect(&b->jt.jobs[i]))
            return &b->jt.jobs[i];
    return NULL;
}

/* A step at forward worker wi: of `alone` only when given, else of the
 * first suspect there, else of the READY jobs step_size allows. */
static bool build_step(broker *b, int wi, bjob *alone)
{
    bworker *w = &b->workers[wi];
    bcols *c = &b->cols;
    if (!alone)
        alone = ready_suspect(b, wi);
    if (alone && w->steps_inflight)
        return false;
    uint32_t max_items = alone ? 1 : step_size(b, wi);
    if (!max_items)
        return false;
    uint32_t budget = (uint32_t)b->cfg->max_batch_tokens;
    if (w->max_batch_tokens && w->max_batch_tokens < budget)
        budget = w->max_batch_tokens;
    if (cols_reserve(c, max_items, budget, 0))
        return false;
    uint32_t n = 0, n_tokens = 0, running = guess_running(b, wi);
    uint64_t step = ++b->next_step;
    /* decode items first (running jobs never wait behind a prompt), then
     * prompt chunks in admission order */
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t i = 0; i < b->jt.cap && n < max_items && n_tokens < budget; i++) {
            bjob *j = alone ? alone : &b->jt.jobs[i];
            if (!ready_at(j, wi))
                continue;
            bool prefill = feed_left(j) > 1;
            if (prefill != (pass == 1))
                continue;
            uint32_t nt = add_item(c, n, n_tokens, j, budget - n_tokens, b->cfg->prefill_chunk);
            n_tokens += guess_item(b, j, n, n_tokens + nt, prefill, w->seq_len, running, budget - n_tokens);
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
    m.task = out_task(b);
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
    if (out_worker(b, wi, &m))
        return false;   /* marked gone: when it is lost its jobs are fed again elsewhere */
    w->steps_inflight++;
    w->step_suspect = alone != NULL;
    b->stats.forward_steps++;
    b->stats.forward_rows += n;
    b->stats.forward_tokens += n_tokens;
    return true;
}

/* A job that lost a stop worker while its verdicts were computed there
 * (recover.c) has its next verdicts computed alone, as a suspect's step
 * is: its candidates go to that worker when no worker of the step cycle
 * owes anything, and no step goes anywhere until they are answered. A
 * crash or hang of the stop worker meanwhile is then surely its doing,
 * even when the dead worker's last answers never left it. True while such
 * a job holds the steps back. */
static bool stop_suspect_alone(broker *b)
{
    bjob *s = NULL;
    for (uint32_t i = 0; i < b->jt.cap; i++) {
        bjob *j = &b->jt.jobs[i];
        if (j->state != J_RUNNING)
            continue;
        bool held = jobs_suspect(j) && j->loss_stage == TP_SI_STOP && !j->cancel;
        if (held && !s && registry_usable(b, j->stp) && registry_usable(b, j->fwd) && j->smp >= 0)
            s = j;
        else if (!held && j->stop_resend && registry_usable(b, j->stp))
            pin_stop_resend(b, j, j->stp);   /* no longer a stop suspect (forgiven, or lost a worker elsewhere since) */
    }
    if (!s)
        return false;
    bool quiet = true;
    for (int wi = 0; wi < B_MAX_WORKERS && quiet; wi++) {
        const bworker *w = &b->workers[wi];
        quiet = !w->live || !(w->stages & (TP_STAGE_FORWARD | TP_STAGE_SAMPLE | TP_STAGE_STOP)) ||
                (w->n_owed == 0 && w->steps_inflight == 0);
    }
    if (s->stop_resend) {
        if (quiet)
            pin_stop_resend(b, s, s->stp);
        return true;
    }
    if (s->phase == P_FORWARD || s->phase == P_SAMPLE || s->n_cand > s->n_verd)
        return true;   /* its step or its verdicts are being computed */
    if (s->phase != P_READY)
        return false;
    if (quiet)
        build_step(b, s->fwd, s);
    return true;
}

void step_run(broker *b)
{
    if (b->stats.workers_lost && stop_suspect_alone(b))
        return;   /* a stop suspect's verdicts are computed alone */
    drafting_run(b);   /* draft jobs about to decode ask for their guesses first */
    for (int wi = 0; wi < B_MAX_WORKERS; wi++) {
        bworker *w = &b->workers[wi];
        while (registry_usable(b, wi) && (w->stages & TP_STAGE_FORWARD) && w->steps_inflight < b->cfg->micro_batches &&
               !w->step_suspect && !drafting_holds(b, wi) && build_step(b, wi, NULL))
            ;
    }
}

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
    int32_t *drafts = malloc((n ? n : 1) * 2 * sizeof *drafts);   /* guess_draft_row */
    bool spec = false;
    for (int wi = 0; wi < B_MAX_WORKERS; wi++) {
        if (!registry_usable(b, wi) || !(b->workers[wi].stages & TP_STAGE_STOP))
            continue;
        if (cols_reserve(c, n, 0, 0))
            break;
        uint32_t k = 0;
        for (uint32_t i = 0; i < n; i++) {
            bjob *j = jobs_by_slot(&b->jt, slots[i]);
            if (!j || j->stp != wi || j->stop_resend)
                continue;   /* (a job's earlier candidates go first: pin_stop_resend sends this one too) */
            if (sel)
                sel[k] = i;
            c->slots[k] = slots[i];
            spec |= guess_draft_row(drafts, n, k, j);
            c->cands[k++] = cands[i];
        }
        if (!k)
            continue;
        tp_msg m;
        tp_msg_init(&m, TP_FAM_WRK, TP_CMD_STOP_STEP);
        m.task = out_task(b);
        m.stop_step.step = step;
        m.stop_step.n = k;
        m.stop_step.slots = (tp_raw){c->slots, k};
        m.stop_step.candidates = (tp_raw){c->cands, k};
        guess_draft_cols(&m.stop_step, spec ? drafts : NULL, n, k);
        lp_pick pk = {0};
        if (with_lp && !pick_lp(lp, src, sel, k, &pk, &m.stop_step.lp))
            m.stop_step.lp = (tp_lp_cols){0};
        out_worker(b, wi, &m);
        free(pk.lp);
        free(pk.top);
        free(pk.ids);
    }
    free(sel);
    free(drafts);
}

/* A new candidate c of job j: queue it for its verdict and make it the
 * job's next input. An invalid candidate (-1: the sampler failed) is never
 * fed; its verdict finishes the job with an error. */
static void on_candidate(broker *b, bjob *j, int32_t c)
{
    if (jobs_append_cand(j, c)) {
        pin_release(b, j, TP_REASON_ERROR, "broker out of memory");
        return;
    }
    j->pending = c;
    j->acc_for_sampler = c;
    j->phase = pin_can_decode_ahead(b, j) ? P_READY : P_STOP;
}

/* Cancelled jobs among those whose candidates just went to stop: end them
 * now (after the STOP_STEP, so the stop worker decides that candidate
 * before it sees the STOP_CLOSE). */
static void end_cancelled(broker *b, const uint32_t *slots, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        bjob *j = jobs_by_slot(&b->jt, slots[i]);
        if (j && j->state == J_RUNNING && j->cancel && j->phase == P_READY)
            pin_release(b, j, TP_REASON_CANCELLED, NULL);
    }
}

/* Jobs of a step at wi in phase `phase` whose slot is listed move on. */
static bjob *step_job(broker *b, uint32_t slot, uint64_t step, int phase)
{
    bjob *j = jobs_by_slot(&b->jt, slot);
    if (!j || j->state != J_RUNNING || j->step != step || j->phase != phase)
        return NULL;
    return j;
}

static void fail_step(broker *b, int wi, uint64_t step, int phase, const tp_msg *m)
{
    char why[TP_ERR_MSG_MAX];
    snprintf(why, sizeof why, "%s from %s: %u %.*s", tp_cmd_name(TP_FAM_WRK, m->cmd), b->workers[wi].instance,
             m->status, (int)m->error.len, m->error.ptr);
    blog("%s", why);
    for (uint32_t i = 0; i < b->jt.cap; i++) {
        bjob *j = &b->jt.jobs[i];
        bool hit = phase == P_STOP ? j->state == J_RUNNING && j->stp == wi && j->n_cand > j->n_verd
                                   : j->state == J_RUNNING && j->step == step && j->phase == phase;
        if (hit)
            pin_release(b, j, TP_REASON_ERROR, why);
    }
}

/* After STEP_RESULT: jobs without output (a prompt chunk that is not the
 * last) are ready again; the others go to sample or stop. */
static void release_quiet_items(broker *b, int wi, uint64_t step)
{
    for (uint32_t i = 0; i < b->jt.cap; i++) {
        bjob *j = &b->jt.jobs[i];
        if (j->state == J_RUNNING && j->fwd == wi && j->step == step && j->phase == P_FORWARD) {
            j->phase = P_READY;
            if (j->cancel)
                pin_release(b, j, TP_REASON_CANCELLED, NULL);
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
        uint32_t k = 0, t = 0;
        bool whole = true, guessed = false;   /* whole: every row, in order: forward the frame as is */
        for (uint32_t i = 0; i < r->n; i++) {
            bjob *j = step_job(b, tp_raw_u32(r->slots, i), step, P_SAMPLE);
            if (!j || j->smp != wi) {
                whole = false;
                continue;
            }
            guessed |= guess_sample_row(c, k, j, &t);
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
        m.task = out_task(b);
        m.sample.step = step;
        m.sample.n = k;
        m.sample.vocab = (uint32_t)v;
        m.sample.slots = (tp_raw){c->slots, k};
        m.sample.index = (tp_raw){c->index, k};
        m.sample.accepted = (tp_raw){c->acc, k};
        m.sample.logits = whole ? (tp_raw){r->out.data, (size_t)k * v} : (tp_raw){c->logits, (size_t)k * v};
        m.sample.guess = guessed ? (tp_raw){c->guess, k} : (tp_raw){0};
        out_worker(b, wi, &m);
    }
}

/* The candidates one result brings (item i of it: src[]), for their stop
 * workers. */
typedef struct picked {
    uint32_t *slots, *src;
    int32_t *cands;
    uint32_t k;
} picked;

static bool picked_init(picked *p, uint32_t n)
{
    p->slots = malloc((n ? n : 1) * sizeof *p->slots);
    p->cands = malloc((n ? n : 1) * sizeof *p->cands);
    p->src = malloc((n ? n : 1) * sizeof *p->src);
    p->k = 0;
    return p->slots && p->cands && p->src;
}

static void picked_add(broker *b, picked *p, bjob *j, uint32_t i, int32_t c, const tp_lp_cols *lp)
{
    on_candidate(b, j, c);
    if (j->n_cand && j->cands[j->n_cand - 1] == c)
        joblp_on_candidate(j, j->n_cand - 1, lp, i);
    p->src[p->k] = i;
    p->slots[p->k] = j->slot;
    p->cands[p->k++] = c;
}

/* To the stop workers; then the cancelled jobs among them end. */
static void picked_send(broker *b, const picked *p, uint64_t step, const tp_lp_cols *lp)
{
    send_candidates(b, step, p->slots, p->cands, p->k, lp, p->src);
    end_cancelled(b, p->slots, p->k);
}

static void picked_free(picked *p)
{
    free(p->slots), free(p->cands), free(p->src);
}

/* Prompt positions the worker took from its prefix cache, per job (only
 * the prompt's: a job re-prefilled after it generated keeps its count),
 * and the worker's cache figures for STATS. */
static void note_cache_hits(broker *b, int wi, const tp_m_step_result *r)
{
    for (size_t i = 0; i < r->n_cached_slots; i++) {
        bjob *j = jobs_by_slot(&b->jt, (uint32_t)r->cached_slots[i]);
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
    b->workers[wi].step_suspect = false;
    if (m->status != TP_ST_OK) {
        fail_step(b, wi, r->step, P_FORWARD, m);
        return;
    }
    note_cache_hits(b, wi, r);
    /* output items move on; then whoever is still in FORWARD had none */
    picked p;
    bool ok = picked_init(&p, r->n);
    guess_rows rj = {0};
    for (uint32_t i = 0; ok && i < r->n; i++) {
        bjob *j = guess_row_job(b, &rj, tp_raw_u32(r->slots, i), r->step, P_FORWARD, r->sampled);
        if (!j || j->fwd != wi)
            continue;
        guess_row_seen(&rj, j, TP_SI_FORWARD);
        if (r->sampled)
            picked_add(b, &p, j, i, tp_raw_i32(r->out, i), &r->lp);
        else
            j->phase = P_SAMPLE;   /* (a verify item's later rows: found no more in P_FORWARD) */
    }
    guess_row_job(b, &rj, UINT32_MAX, 0, P_FORWARD, r->sampled);
    release_quiet_items(b, wi, r->step);
    if (r->sampled)
        picked_send(b, &p, r->step, &r->lp);
    else
        send_sample(b, r->step, r);
    picked_free(&p);
}

/* EMBEDDED (before its STEP's STEP_RESULT): each embedding job it names
 * is done: the broker publishes its FINISH with the vector (reason length,
 * detail "embedding", no completion tokens) and lets go of its workers. */
static void on_embedded(broker *b, int wi, const tp_msg *m)
{
    const tp_m_embedded *r = &m->embedded;
    for (uint32_t i = 0; i < r->n; i++) {
        bjob *j = step_job(b, tp_raw_u32(r->slots, i), r->step, P_FORWARD);
        if (!j || j->fwd != wi || !j->embed)
            continue;
        jobs_progress(j, TP_SI_FORWARD);
        tp_msg ev;
        if (jobs_own_finish(j, TP_REASON_LENGTH, NULL, &ev)) {
            ev.finish.detail = tp_str_of("embedding");
            ev.finish.embedding = (tp_raw){(const float *)r->embd.data + (size_t)i * r->dim, r->dim};
            out_event(b, &ev);
            const bjob *resumed;
            jobs_on_event(&b->jt, &ev, &resumed);
            j->result_ready = true;
        }
        pin_release(b, j, TP_REASON_NONE, NULL);
    }
}

static void on_sampled(broker *b, int wi, const tp_msg *m)
{
    const tp_m_sampled *r = &m->sampled;
    if (m->status != TP_ST_OK) {
        fail_step(b, wi, r->step, P_SAMPLE, m);
        return;
    }
    picked p;
    bool ok = picked_init(&p, r->n);
    guess_rows rj = {0};
    for (uint32_t i = 0; ok && i < r->n; i++) {
        bjob *j = guess_row_job(b, &rj, tp_raw_u32(r->slots, i), r->step, P_SAMPLE, true);
        if (!j || j->smp != wi)
            continue;
        guess_row_seen(&rj, j, TP_SI_SAMPLE);
        picked_add(b, &p, j, i, tp_raw_i32(r->candidates, i), &r->lp);
    }
    guess_row_job(b, &rj, UINT32_MAX, 0, P_SAMPLE, true);
    picked_send(b, &p, r->step, &r->lp);
    picked_free(&p);
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
        bjob *j = jobs_by_slot(&b->jt, tp_raw_u32(r->slots, i));
        if (!j || j->n_verd >= j->n_cand || j->state == J_FINISHED || (j->state == J_RUNNING && j->stp != wi) ||
            (j->state == J_CLOSING && j->close_stp != wi))
            continue;   /* a verdict on a candidate decoded after the job ended, or of a replaced worker */
        jobs_progress(j, TP_SI_STOP);
        int32_t c = j->cands[j->n_verd++];
        uint8_t fin = tp_raw_u8(r->finish, i);
        if (tp_raw_u8(r->accepted, i))
            jobs_append_out(j, c);
        if (j->state != J_RUNNING)
            continue;   /* cancelled while this candidate was checked: keep its token, nothing else */
        if (fin != TP_REASON_NONE) {
            j->engine_reason = fin < TP_REASON_COUNT ? fin : TP_REASON_ERROR;
            pin_release(b, j, TP_REASON_NONE, NULL);
            continue;
        }
        if (j->phase == P_STOP && (pin_can_decode_ahead(b, j) || j->n_verd == j->n_cand))
            j->phase = P_READY;
        if (j->cancel && j->phase == P_READY)
            pin_release(b, j, TP_REASON_CANCELLED, NULL);
    }
}

/* RESULT of an OPEN (or CLOSE): a refused OPEN fails its job. */
static void on_open_result(broker *b, int wi, const tp_msg *m)
{
    if (m->status == TP_ST_OK)
        return;
    for (uint32_t i = 0; i < b->jt.cap; i++) {
        bjob *j = &b->jt.jobs[i];
        if (j->state != J_RUNNING || (j->open_task[0] != m->task && j->open_task[1] != m->task &&
                                      j->open_task[2] != m->task))
            continue;
        char why[TP_ERR_MSG_MAX];
        snprintf(why, sizeof why, "worker %s refused the job: %u %.*s", b->workers[wi].instance, m->status,
                 (int)m->error.len, m->error.ptr);
        blog("%s", why);
        if (j->phase == P_READY)
            pin_release(b, j, TP_REASON_ERROR, why);
        else
            j->cancel = true, j->engine_reason = TP_REASON_ERROR;
        return;
    }
}

/* A forward, sample or stop worker's result (TOKENIZED goes to admit.c). */
void step_on_result(broker *b, int wi, const tp_msg *m)
{
    switch (m->cmd) {
    case TP_CMD_STEP_RESULT:
        on_step_result(b, wi, m);
        break;
    case TP_CMD_EMBEDDED:
        on_embedded(b, wi, m);
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
    }
}
