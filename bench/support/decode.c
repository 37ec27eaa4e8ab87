#include "decode.h"

#include <stdlib.h>

int bench_tok_of(int i, int vocab) { return 3 + (i * 7919) % (vocab - 3); }

/* A new sequence (*sid, left open) and its prompt_len-token prompt in one
 * step, timed by clock into *secs. -1 with err set (and no sequence) on
 * failure. */
static int prompt_step(tp_forward *f, int vocab, int prompt_len, double (*clock)(void), float *logits, int *sid,
                       double *secs, tp_err *err)
{
    int *toks = malloc(sizeof(int) * (size_t)prompt_len);
    if (!toks) {
        tp_err_set(err, TP_ENOMEM, "out of memory");
        return -1;
    }
    int rc = tp_forward_seq_open(f, sid, err);
    if (!rc) {
        for (int i = 0; i < prompt_len; i++)
            toks[i] = bench_tok_of(i, vocab);
        tp_fwd_item it = {*sid, 0, toks, prompt_len, false};
        double t0 = clock();
        rc = tp_forward_step(f, &it, 1, logits, err);
        *secs = clock() - t0;
        if (rc)
            tp_forward_seq_close(f, *sid);
    }
    free(toks);
    return rc ? -1 : 0;
}

double bench_decode_rate(tp_forward *f, int vocab, int prompt_len, int n, double (*clock)(void), tp_err *err)
{
    float *logits = malloc(sizeof(float) * (size_t)vocab);
    double rate = -1, secs;
    int sid;
    if (!logits) {
        tp_err_set(err, TP_ENOMEM, "out of memory");
        return -1;
    }
    if (prompt_step(f, vocab, prompt_len, clock, logits, &sid, &secs, err))
        goto out;
    double t0 = clock();
    for (int k = 0; k < n; k++) {
        int tok = bench_tok_of(k + 100, vocab);
        tp_fwd_item d = {sid, prompt_len + k, &tok, 1, false};
        if (tp_forward_step(f, &d, 1, logits, err))
            goto close;
    }
    rate = n / (clock() - t0);
close:
    tp_forward_seq_close(f, sid);
out:
    free(logits);
    return rate;
}

double bench_prefill_rate(tp_forward *f, int vocab, int prompt_len, double (*clock)(void), tp_err *err)
{
    float *logits = malloc(sizeof(float) * (size_t)vocab);
    double rate = -1, secs;
    int sid;
    if (!logits) {
        tp_err_set(err, TP_ENOMEM, "out of memory");
        return -1;
    }
    if (!prompt_step(f, vocab, prompt_len, clock, logits, &sid, &secs, err)) {
        rate = prompt_len / secs;
        tp_forward_seq_close(f, sid);
    }
    free(logits);
    return rate;
}

double bench_batched_rate(tp_forward *f, int vocab, int seqs, int prompt_len, int n, double (*clock)(void), tp_err *err)
{
    float *logits = malloc(sizeof(float) * (size_t)vocab * (size_t)seqs);
    int *sid = calloc((size_t)seqs, sizeof *sid), *toks = malloc(sizeof(int) * (size_t)(seqs * prompt_len));
    tp_fwd_item *it = calloc((size_t)seqs, sizeof *it);
    double rate = -1;
    int open = 0;
    if (!logits || !sid || !toks || !it) {
        tp_err_set(err, TP_ENOMEM, "out of memory");
        goto out;
    }
    for (; open < seqs; open++) {
        if (tp_forward_seq_open(f, &sid[open], err))
            goto close;
        for (int i = 0; i < prompt_len; i++)
            toks[open * prompt_len + i] = bench_tok_of(open * 31 + i, vocab);
        it[open] = (tp_fwd_item){sid[open], 0, &toks[open * prompt_len], prompt_len, false};
    }
    if (tp_forward_step(f, it, seqs, logits, err))
        goto close;
    double t0 = clock();
    for (int k = 0; k < n; k++) {
        for (int s = 0; s < seqs; s++) {
            toks[s] = bench_tok_of(k * 7 + s + 100, vocab);
            it[s] = (tp_fwd_item){sid[s], prompt_len + k, &toks[s], 1, false};
        }
        if (tp_forward_step(f, it, seqs, logits, err))
            goto close;
    }
    rate = (double)seqs * n / (clock() - t0);
close:
    for (int s = 0; s < open; s++)
        tp_forward_seq_close(f, sid[s]);
out:
    free(logits), free(sid), free(toks), free(it);
    return rate;
}
