/* Speculative decoding at the broker (tokpipe/spec.h): which jobs guess,
 * what they guess, and what a verify item's result leaves.
 *
 * A decode item of a speculating job carries its last candidate and the
 * guesses prompt lookup makes from its prompt and candidates (STEP flag
 * TP_ITEM_VERIFY); the forward stage gives a row per position, the sample
 * stage samples them as a chain while each candidate equals its guess, so
 * the candidates are exactly those plain steps would give, and the stop
 * stage checks them one at a time as always. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "guess.h"

tp_spec_mode guess_mode(const tp_config *cfg, const tp_params *p)
{
    const tp_spec_params *sp = &p->speculative;
    if (!(sp->set & TP_SPEC_P_MODE))
        return (tp_spec_mode)cfg->spec_mode;
    tp_spec_mode m = TP_SPEC_OFF;
    char name[8];
    snprintf(name, sizeof name, "%.*s", (int)(sp->mode.len < sizeof name ? sp->mode.len : 0), sp->mode.ptr);
    tp_spec_mode_parse(name, &m, NULL);   /* (the codec let only the three names through) */
    return m;
}

void guess_init(broker *b, bjob *j)
{
    const tp_spec_params *sp = &j->params.speculative;
    tp_spec_mode mode = guess_mode(b->cfg, &j->params);
    tp_spec_init(&j->spec, mode != TP_SPEC_OFF ? (sp->set & TP_SPEC_P_N_MAX ? sp->n_max : b->cfg->spec_n_max) : 0);
    j->n_guess = 0;
    j->draft_mode = mode == TP_SPEC_DRAFT;
}

/* Can j guess in this step at all: a decode item, and a model and kernel
 * that verify? (workers.forward_kernel openblas, 1, cannot verify: its
 * rows depend on the step; nor a hybrid model: its recurrent state cannot
 * roll back past a step's start, and its forward stage would verify
 * nothing either) */
static bool may_guess(const broker *b, const bjob *j)
{
    return j->spec.n_max && j->n_prompt + j->n_cand - j->n_fed == 1 && j->pending >= 0 &&
           b->cfg->forward_kernel == 0 && !b->model_hybrid;
}

int guess_want(broker *b, bjob *j, uint32_t seq_len, uint32_t running, uint32_t budget)
{
    if (!may_guess(b, j))
        return 0;
    uint32_t total = j->n_prompt + j->n_cand;
    long left = (long)j->params.max_tokens - (long)j->n_cand - 1;
    long room = seq_len ? (long)seq_len - (long)total : left;
    if (left < room)
        room = left;
    if ((long)budget - 1 < room)
        room = (long)budget - 1;
    return tp_spec_want(&j->spec, (int)running, room > 0 ? (int)room : 0);
}

/* A draft job's guesses: those its draft worker proposed for this very
 * position (draft.c asked, and tp_spec_want was counted, then), as many as
 * the step's budget still holds; none when they did not come in time. */
static uint32_t take_drafted(const broker *b, bjob *j, uint32_t budget)
{
    uint32_t total = j->n_prompt + j->n_cand, n = 0;
    if (j->draft_for == total && may_guess(b, j)) {
        n = j->n_drafted < budget - 1 ? j->n_drafted : budget - 1;
        memcpy(j->guess, j->drafted, n * sizeof *j->guess);
        j->draft_base = total;
        j->draft_got = j->n_drafted;
    }
    j->draft_for = 0;
    return n;
}

/* Speculative decoding: the guesses j's decode item verifies in this step
 * (into j->guess, 0..n_guess): a draft job's from its draft worker, else
 * by prompt lookup over its prompt and candidates, as many as its
 * controller asks for and its max_tokens, its forward worker's context and
 * the step's budget leave room for. `running`: the jobs decoding at the
 * worker (a big batch is compute-bound: nobody guesses). */
uint32_t guess_plan(broker *b, bjob *j, uint32_t seq_len, uint32_t running, uint32_t budget)
{
    j->n_guess = 0;
    if (j->draft_mode)
        return j->n_guess = take_drafted(b, j, budget);
    int k = guess_want(b, j, seq_len, running, budget);
    if (k <= 0)
        return 0;
    uint32_t total = j->n_prompt + j->n_cand;
    bcols *c = &b->cols;
    if (total > c->ids_cap) {
        int32_t *ids = realloc(c->ids, (size_t)total * 2 * sizeof *ids);
        if (!ids)
            return 0;
        c->ids = ids;
        c->ids_cap = (size_t)total * 2;
    }
    memcpy(c->ids, j->prompt, (size_t)j->n_prompt * sizeof *c->ids);
    memcpy(c->ids + j->n_prompt, j->cands, (size_t)j->n_cand * sizeof *c->ids);
    j->n_guess = (uint32_t)tp_ngram_guess(c->ids, total, (size_t)k, j->guess);
    return j->n_guess;
}

uint32_t guess_running(broker *b, int wi)
{
    uint32_t running = 0;
    for (uint32_t i = 0; i < b->jt.cap; i++)
        running += b->jt.jobs[i].state == J_RUNNING && b->jt.jobs[i].fwd == wi;
    return running;
}

uint32_t guess_item(broker *b, bjob *j, uint32_t n, uint32_t at, bool prefill, uint32_t seq_len, uint32_t running,
                    uint32_t budget)
{
    bcols *c = &b->cols;
    uint32_t g = prefill ? (j->n_guess = 0) : guess_plan(b, j, seq_len, running, budget);
    if (g) {
        memcpy(c->tokens + at, j->guess, g * sizeof *j->guess);
        c->ntok[n] += g;
        c->flags[n] |= TP_ITEM_VERIFY;
    }
    return g;
}

bool guess_draft_row(int32_t *d, uint32_t n, uint32_t k, const bjob *j)
{
    if (d) {
        d[k] = j->spec.drafted < INT32_MAX ? (int32_t)j->spec.drafted : INT32_MAX;
        d[n + k] = j->spec.accepted < INT32_MAX ? (int32_t)j->spec.accepted : INT32_MAX;
    }
    return j->spec.n_max > 0;
}

void guess_draft_cols(tp_m_stop_step *s, int32_t *d, uint32_t n, uint32_t k)
{
    if (!d)
        return;
    s->draft_tokens = d;
    s->n_draft_tokens = k;
    s->draft_accepted = d + n;
    s->n_draft_accepted = k;
}

/* A verify item's result: m candidates came for j's guesses (the chain
 * stopped at the first that differed from its guess), so m - 1 guesses
 * were taken and their positions stay in the KV; the next item starts
 * after them (the forward worker overwrites the rest). */
void guess_settle(broker *b, bjob *j, uint32_t m)
{
    if (!j->n_guess)
        return;
    uint32_t taken = m > 0 ? m - 1 : 0;
    j->n_fed += taken;
    if (j->draft_mode && j->draft_base && j->draft_task == 0) {
        /* the draft worker fed its guesses but the last: those taken stay
         * the job's there too */
        uint32_t kept = j->draft_got > 0 && taken > j->draft_got - 1 ? j->draft_got - 1 : taken;
        if (j->draft_fed == j->draft_base)
            j->draft_fed += kept;
    }
    j->draft_base = 0;
    tp_spec_result(&j->spec, (int)j->n_guess, (int)taken);
    b->stats.spec_drafted += j->n_guess;
    b->stats.spec_accepted += taken;
    b->stats.spec_verify_steps++;
    b->stats.spec_verify_tokens += m;
    j->n_guess = 0;
}


bjob *guess_row_job(broker *b, guess_rows *rj, uint32_t slot, uint64_t step, int phase, bool chain)
{
    if (rj->j && rj->j->slot == slot && chain)
        return rj->j;
    if (rj->j && chain)
        guess_settle(b, rj->j, rj->got);
    *rj = (guess_rows){0};
    bjob *j = slot == UINT32_MAX ? NULL : jobs_by_slot(&b->jt, slot);
    return j && j->state == J_RUNNING && j->step == step && j->phase == phase ? j : NULL;
}

void guess_row_seen(guess_rows *rj, bjob *j, int si)
{
    rj->j = j;
    if (rj->got++ == 0)
        jobs_progress(j, si);
}

bool guess_sample_row(bcols *c, uint32_t k, const bjob *j, uint32_t *t)
{
    *t = k > 0 && c->slots[k - 1] == j->slot ? *t + 1 : 0;
    c->guess[k] = *t < j->n_guess ? j->guess[*t] : -1;
    return c->guess[k] >= 0;
}
