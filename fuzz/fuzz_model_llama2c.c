/* libFuzzer target: the llama2.c checkpoint loader on arbitrary bytes, and
 * one forward step over any model that loads (weights may be NaN/inf; the
 * step must still stay in bounds). */
#include <stdint.h>
#include <stdlib.h>

#include "tokpipe/forward.h"
#include "tokpipe/model.h"

#define MAX_FUZZ_LOGITS (1 << 16)

static void run_step(const tp_model *m)
{
    const tp_model_config *c = tp_model_get_config(m);
    if (c->vocab_size > MAX_FUZZ_LOGITS)
        return;
    tp_forward *f;
    int max_pos = c->seq_len < 4 ? c->seq_len : 4;
    if (tp_forward_new(m, 1, max_pos, 4, &f, NULL))
        return;
    int sid, toks[4] = {0, c->vocab_size - 1, c->vocab_size / 2, 1 % c->vocab_size};
    float *logits = malloc(sizeof(float) * (size_t)c->vocab_size);
    if (logits && tp_forward_seq_open(f, &sid, NULL) == 0) {
        tp_fwd_item it = {sid, 0, toks, max_pos, false};
        tp_forward_step(f, &it, 1, logits, NULL);
    }
    free(logits);
    tp_forward_free(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tp_model *m;
    if (tp_model_from_memory(data, size, &m, NULL) == 0) {
        const int *eos;
        tp_model_eos_ids(m, &eos);
        if (tp_model_get_config(m)->dim <= 256)
            run_step(m);
        tp_model_free(m);
    }
    return 0;
}
