#include "decode.h"

#include <stdlib.h>

int bench_tok_of(int i, int vocab) { return 3 + (i * 7919) % (vocab - 3); }

double bench_decode_rate(tp_forward *f, int vocab, int prompt_len, int n, double (*clock)(void), tp_err *err)
{
    int sid, *toks = malloc(sizeof(int) * (size_t)prompt_len);
    float *logits = malloc(sizeof(float) * (size_t)vocab);
    double rate = -1;
    if (!toks || !logits) {
        tp_err_set(err, TP_ENOMEM, "out of memory");
        goto out;
    }
    if (tp_forward_seq_open(f, &sid, err))
        goto out;
    for (int i = 0; i < prompt_len; i++)
        toks[i] = bench_tok_of(i, vocab);
    tp_fwd_item it = {sid, 0, toks, prompt_len, false};
    if (tp_forward_step(f, &it, 1, logits, err))
        goto close;
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
    free(toks);
    free(logits);
    return rate;
}
