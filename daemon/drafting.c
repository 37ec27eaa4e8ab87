/* Speculative decoding with a draft model, at the broker: a job in mode
 * draft gets its guesses from a draft worker (a small model with the
 * target's vocabulary) before its decode step, and verifies them in that
 * step exactly as prompt lookup's guesses are verified (guess.c): the
 * guesses change the speed, never a token.
 *
 * A round trip of its own, not pipelined with the forward step: a job's
 * guesses continue its last candidate, which exists only once the step
 * before came back, so the draft for step n + 1 cannot run beside step n
 * of the same job. The draft goes out as soon as the job is READY (often
 * while its forward worker computes the other micro-batch, so the round
 * trip hides behind it), and the forward worker's next step waits for the
 * answers of its jobs, at most speculative.draft_timeout_ms; a job whose
 * guesses did not come steps without any. The draft jobs of one draft
 * worker share one DRAFT, which it computes as one batched step per guess.
 *
 * What the draft worker holds of a job is the broker's to know, like a
 * forward worker's KV (draft_fed: the tokens of prompt + candidates it
 * has), and is rebuilt the same way: a job new to a draft worker, or one
 * whose draft worker was lost or could not serve it, is fed from position
 * 0. Nothing waits for a draft worker forever and no job depends on one:
 * without any, draft jobs decode plainly. */
#include <stdlib.h>
#include <string.h>

#include "drafting.h"
#include "choose.h"
#include "guess.h"
#include "log.h"
#include "outbox.h"
#include "registry.h"
#include "tokpipe/zwire.h"

/* Is j about to decode, all its workers in place, and without guesses
 * for its position yet? */
static bool wants_draft(const broker *b, const bjob *j)
{
    uint32_t total = j->n_prompt + j->n_cand;
    return j->state == J_RUNNING && j->draft_mode && j->phase == P_READY && !j->cancel && !j->stop_resend &&
           registry_usable(b, j->fwd) && j->smp >= 0 && j->stp >= 0 && total - j->n_fed == 1 && j->pending >= 0 &&
           j->draft_task == 0 && j->draft_for != total && j->draft_losses < B_POISON_TRIES;
}

/* How many guesses j asks its draft worker for now (0: none in this
 * step, which is then planned: draft_for says so), as guess_want allows
 * at its forward worker; the draft worker's context holds its tokens and
 * all guesses but the last. */
static int ask_k(broker *b, bjob *j)
{
    const bworker *f = &b->workers[j->fwd], *d = &b->workers[j->dft];
    uint32_t budget = (uint32_t)b->cfg->max_batch_tokens;
    if (f->max_batch_tokens && f->max_batch_tokens < budget)
        budget = f->max_batch_tokens;
    uint32_t seq_len = f->seq_len;
    if (d->seq_len && (!seq_len || d->seq_len + 1 < seq_len))
        seq_len = d->seq_len + 1;
    int k = guess_want(b, j, seq_len, guess_running(b, j->fwd), budget);
    if (k <= 0) {
        j->draft_for = j->n_prompt + j->n_cand;
        j->n_drafted = 0;
    }
    return k > TP_PROTO_MAX_DRAFT ? TP_PROTO_MAX_DRAFT : k;
}

/* The columns of one DRAFT. */
typedef struct dcols {
    uint32_t *slots, *pos, *ntok, *k;
    int32_t *tokens;
    uint32_t n, n_tokens;
} dcols;

static void dcols_free(dcols *c)
{
    free(c->slots);
    free(c->pos);
    free(c->ntok);
    free(c->k);
    free(c->tokens);
}

/* Item of j: its tokens from draft_fed on. false: out of memory. */
static bool add_item(dcols *c, size_t *tok_cap, bjob *j, int k)
{
    uint32_t total = j->n_prompt + j->n_cand;
    if (j->draft_fed >= total)   /* (never more than all but the last: guess.c) */
        j->draft_fed = total - 1;
    uint32_t nt = total - j->draft_fed;
    if (c->n_tokens + nt > *tok_cap) {
        size_t cap = (c->n_tokens + nt) * 2;
        int32_t *t = realloc(c->tokens, cap * sizeof *t);
        if (!t)
            return false;
        c->tokens = t;
        *tok_cap = cap;
    }
    for (uint32_t p = j->draft_fed; p < total; p++)
        c->tokens[c->n_tokens++] = p < j->n_prompt ? j->prompt[p] : j->cands[p - j->n_prompt];
    c->slots[c->n] = j->slot;
    c->pos[c->n] = j->draft_fed;
    c->ntok[c->n] = nt;
    c->k[c->n++] = (uint32_t)k;
    return true;
}

/* One DRAFT to worker wi with the jobs of it that asked (k[slot] > 0). */
static void send_draft(broker *b, int wi, const int *k, uint32_t n_jobs)
{
    dcols c = {0};
    size_t tok_cap = 0;
    c.slots = malloc(n_jobs * sizeof *c.slots);
    c.pos = malloc(n_jobs * sizeof *c.pos);
    c.ntok = malloc(n_jobs * sizeof *c.ntok);
    c.k = malloc(n_jobs * sizeof *c.k);
    bool ok = c.slots && c.pos && c.ntok && c.k;
    for (uint32_t i = 0; ok && i < b->jt.cap && c.n < TP_PROTO_MAX_ITEMS; i++)
        if (k[i] > 0 && b->jt.jobs[i].dft == wi)
            ok = add_item(&c, &tok_cap, &b->jt.jobs[i], k[i]);
    if (ok && c.n) {
        tp_msg m;
        tp_msg_init(&m, TP_FAM_WRK, TP_CMD_DRAFT);
        m.task = out_task(b);
        m.draft.n = c.n;
        m.draft.n_tokens = c.n_tokens;
        m.draft.slots = (tp_raw){c.slots, c.n};
        m.draft.pos = (tp_raw){c.pos, c.n};
        m.draft.ntok = (tp_raw){c.ntok, c.n};
        m.draft.k = (tp_raw){c.k, c.n};
        m.draft.tokens = (tp_raw){c.tokens, c.n_tokens};
        if (!out_worker(b, wi, &m)) {
            int64_t now = tp_now_ms();
            for (uint32_t i = 0; i < c.n; i++) {
                bjob *j = jobs_by_slot(&b->jt, c.slots[i]);
                j->draft_task = m.task;
                j->draft_sent_ms = now;
                j->draft_fed = j->n_prompt + j->n_cand;   /* it holds them once it has read this */
            }
        }
    }
    dcols_free(&c);
}

void drafting_run(broker *b)
{
    if (!*b->cfg->spec_draft_model)
        return;   /* no job is in mode draft (front.c refuses them) */
    int *k = NULL;
    uint32_t asking[B_MAX_WORKERS] = {0};
    for (uint32_t i = 0; i < b->jt.cap; i++) {
        bjob *j = &b->jt.jobs[i];
        if (!wants_draft(b, j))
            continue;
        if (!registry_usable(b, j->dft)) {
            int d = choose_draft(b);
            if (d < 0)
                continue;   /* none with room: it decodes plainly meanwhile */
            j->dft = d;
            j->draft_fed = 0;
            b->workers[d].n_dft++;
        }
        if (!k && !(k = calloc(b->jt.cap, sizeof *k)))
            return;
        if ((k[i] = ask_k(b, j)) > 0)
            asking[j->dft]++;
    }
    for (int wi = 0; wi < B_MAX_WORKERS; wi++)
        if (asking[wi])
            send_draft(b, wi, k, asking[wi]);
    free(k);
}

bool drafting_holds(broker *b, int wi)
{
    if (!*b->cfg->spec_draft_model)
        return false;
    int64_t now = tp_now_ms();
    for (uint32_t i = 0; i < b->jt.cap; i++) {
        const bjob *j = &b->jt.jobs[i];
        if (j->state == J_RUNNING && j->fwd == wi && j->draft_task && j->phase == P_READY && !j->cancel &&
            now - j->draft_sent_ms < b->cfg->spec_draft_timeout_ms)
            return true;
    }
    return false;
}

void drafting_on_result(broker *b, int wi, const tp_msg *m)
{
    const tp_m_drafted *r = &m->drafted;
    if (m->status != TP_ST_OK) {
        /* what it holds of these jobs is not known: from the start next time */
        blog("DRAFTED from %s: %u %.*s", b->workers[wi].instance, m->status, (int)m->error.len, m->error.ptr);
        for (uint32_t i = 0; i < b->jt.cap; i++)
            if (b->jt.jobs[i].draft_task == m->task && b->jt.jobs[i].dft == wi)
                b->jt.jobs[i].draft_task = 0, b->jt.jobs[i].draft_fed = 0;
        return;
    }
    size_t at = 0;
    for (uint32_t i = 0; i < r->n; i++) {
        uint32_t n = tp_raw_u32(r->ngot, i);
        bjob *j = jobs_by_slot(&b->jt, tp_raw_u32(r->slots, i));
        size_t from = at;
        at += n;
        if (!j || j->draft_task != m->task || j->dft != wi)
            continue;   /* a job that ended, or moved to another draft worker */
        j->draft_task = 0;
        uint32_t total = j->n_prompt + j->n_cand;
        if (n == 0) {
            j->draft_fed = 0;   /* it could not serve the job: feed it all next time */
        } else if (j->state == J_RUNNING && j->draft_fed == total && j->phase == P_READY &&
                   total - j->n_fed == 1) {
            /* still at the position they continue (a job that stepped
             * without them, past the timeout, has moved on) */
            for (uint32_t g = 0; g < n && g < TP_SPEC_MAX_DRAFT; g++)
                j->drafted[g] = tp_raw_i32(r->guesses, from + g);
            j->n_drafted = n < TP_SPEC_MAX_DRAFT ? n : TP_SPEC_MAX_DRAFT;
            j->draft_for = total;
        }
    }
}

void drafting_lost(broker *b, int wi)
{
    for (uint32_t i = 0; i < b->jt.cap; i++) {
        bjob *j = &b->jt.jobs[i];
        if (j->dft != wi)
            continue;
        /* a job whose DRAFT it was computing may be what brought it down:
         * after B_POISON_TRIES such losses the job drafts no more */
        if (j->draft_task && ++j->draft_losses == B_POISON_TRIES)
            blog("job %s: lost %d draft workers while they drafted for it; it decodes without guesses", j->id,
                 B_POISON_TRIES);
        j->dft = -1;
        j->draft_task = 0;
        j->draft_fed = 0;
    }
}

void drafting_release(broker *b, bjob *j)
{
    if (j->dft < 0)
        return;
    if (registry_usable(b, j->dft)) {
        tp_msg m;
        tp_msg_init(&m, TP_FAM_WRK, TP_CMD_DRAFT_CLOSE);
        m.task = out_task(b);
        m.slot.slot = j->slot;
        out_worker(b, j->dft, &m);
    }
    b->workers[j->dft].n_dft--;
    j->dft = -1;
    j->draft_task = 0;
    j->draft_for = 0;
}
