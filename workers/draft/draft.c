/* Speculative decoding's draft model: greedy guesses of many jobs, batched
 * (tokpipe/draft.h). */
#include "tokpipe/draft.h"

#include <stdlib.h>

#include "tokpipe/spec.h"

static int32_t argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* Can item it be served on f: its sequence holds pos positions or more,
 * and pos + its tokens + k - 1 guesses fit its slot? */
static bool servable(const tp_forward *f, const tp_draft_item *it)
{
    int len = tp_forward_seq_length(f, it->seq_id);
    return len >= 0 && it->pos >= 0 && it->pos <= len && it->n_tokens >= 1 && it->k >= 1 &&
           it->k <= TP_SPEC_MAX_DRAFT && (long)it->pos + it->n_tokens + it->k - 1 <= tp_forward_max_positions(f);
}

int tp_draft_propose(tp_forward *f, const tp_draft_item *items, int n, int32_t *guesses, int *ngot, tp_err *err)
{
    int vocab = tp_model_get_config(tp_forward_model(f))->vocab_size, budget = tp_forward_max_batch_tokens(f);
    float *logits = malloc((size_t)(n > 0 ? n : 1) * (size_t)vocab * sizeof *logits);
    tp_fwd_item *step = malloc((size_t)(n > 0 ? n : 1) * sizeof *step);
    int *row = malloc((size_t)(n > 0 ? n : 1) * sizeof *row), *fed = calloc((size_t)(n > 0 ? n : 1), sizeof *fed);
    int rc = 0;
    if (!logits || !step || !row || !fed) {
        rc = tp_err_set(err, TP_ENOMEM, "draft: out of memory for %d items", n);
        goto out;
    }
    for (int i = 0; i < n; i++) {
        ngot[i] = -1;   /* -1: servable, nothing guessed yet; stays 0 when not servable */
        if (!servable(f, &items[i])) {
            ngot[i] = 0;
            continue;
        }
        if (tp_forward_seq_length(f, items[i].seq_id) > items[i].pos &&
            tp_forward_seq_truncate(f, items[i].seq_id, items[i].pos))
            ngot[i] = 0;
    }
    /* The job's tokens, in chunks the step budget holds (a job new to
     * this worker feeds its whole sequence); a job's last chunk gives the
     * logits of its first guess. Then one step per further guess, each
     * feeding every job's last guess (round r: the jobs with r guesses). */
    for (int r = 0; rc == 0 && r < TP_SPEC_MAX_DRAFT;) {
        int m = 0, used = 0;
        for (int i = 0; i < n && used < budget; i++) {
            const tp_draft_item *it = &items[i];
            if (r == 0 && ngot[i] < 0 && fed[i] < it->n_tokens) {
                int take = it->n_tokens - fed[i] < budget - used ? it->n_tokens - fed[i] : budget - used;
                step[m] = (tp_fwd_item){.seq_id = it->seq_id, .pos = it->pos + fed[i],
                                        .tokens = (const int *)it->tokens + fed[i], .n_tokens = take,
                                        .skip_logits = fed[i] + take < it->n_tokens};
            } else if (r > 0 && ngot[i] == r && r < it->k && fed[i] == it->n_tokens + r - 1) {
                step[m] = (tp_fwd_item){.seq_id = it->seq_id, .pos = it->pos + fed[i],
                                        .tokens = (const int *)&guesses[(size_t)i * TP_SPEC_MAX_DRAFT + r - 1],
                                        .n_tokens = 1};
            } else {
                continue;
            }
            used += step[m].n_tokens;
            row[m++] = i;
        }
        if (m == 0) {   /* round r is done */
            r++;
            continue;
        }
        if ((rc = tp_forward_step(f, step, m, logits, err)))
            break;
        for (int s = 0; s < m; s++) {
            int i = row[s];
            fed[i] += step[s].n_tokens;
            if (step[s].skip_logits)
                continue;
            int got = ngot[i] < 0 ? 0 : ngot[i];
            guesses[(size_t)i * TP_SPEC_MAX_DRAFT + got] = argmax(logits + (size_t)s * vocab, vocab);
            ngot[i] = got + 1;
        }
    }
    for (int i = 0; i < n; i++)
        if (ngot[i] < 0 || rc)
            ngot[i] = 0;
out:
    free(logits);
    free(step);
    free(row);
    free(fed);
    return rc;
}

int tp_draft_check(int target_vocab, const tp_model *draft, const char *what, tp_err *err)
{
    const tp_model_config *c = tp_model_get_config(draft);
    if (c->full_attn_interval > 0)
        return tp_err_set(err, TP_EINVAL, "draft model %s: a hybrid model (recurrent layers) cannot roll back the "
                          "guesses the target does not take", what);
    return tp_draft_vocab_check(target_vocab, c->vocab_size, what, err);
}

int tp_draft_vocab_check(int target_vocab, int draft_vocab, const char *what, tp_err *err)
{
    if (draft_vocab == target_vocab)
        return 0;
    return tp_err_set(err, TP_EINVAL,
                      "draft model %s: its vocabulary has %d tokens, the target model's has %d (a draft model "
                      "must share the target's vocabulary)",
                      what, draft_vocab, target_vocab);
}
