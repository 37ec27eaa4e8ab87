/* The batch-invariance workload (batch_runs.h). */
#include "batch_runs.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../workers/forward/kernels.h"

const int PROMPTS[NSEQ][12] = {
    {1, 403, 407, 261, 378}, {1, 300, 301}, {1, 265, 282, 295, 433, 426, 385, 328, 432, 358},
    {1}, {1, 13, 438, 310, 439, 419, 357}, {1, 432, 432, 432, 432, 432, 432, 432, 432, 432, 432, 432},
    {1, 500, 42}, {1, 290, 291, 292, 293, 294},
};
const int PLEN[NSEQ] = {5, 3, 10, 1, 7, 12, 3, 6};

tp_model *load_real(const char *name)
{
    const char *dir = getenv("TP_MODELS");
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", name[0] == '/' ? "" : dir ? dir : "../shared/models", name);
    tp_model *m = NULL;
    tp_err e;
    if (tp_model_load(path, &m, &e))
        fail_msg("cannot load %s: %s", path, e.msg);
    return m;
}


void run_alone(tp_model *m, float *out, int V, int threads, bool scalar, tp_kv_type kv)
{
    tp_err e;
    for (int s = 0; s < NSEQ; s++) {
        tp_forward *f;
        assert_int_equal(tp_forward_new(m, 1, 64, 16, &f, &e), 0);
        assert_int_equal(tp_forward_set_kv_type(f, kv, &e), 0);
        if (scalar)
            tp_forward_use_scalar_for_tests(f);
        assert_int_equal(tp_forward_set_threads(f, threads, &e), 0);
        tp_forward_split_all_for_tests(f);
        int sid;
        tp_forward_seq_open(f, &sid, &e);
        float *row = out + (size_t)s * (DECODE + 1) * V;
        tp_fwd_item it = {sid, 0, PROMPTS[s], PLEN[s], false};
        assert_int_equal(tp_forward_step(f, &it, 1, row, &e), 0);
        for (int k = 1; k <= DECODE; k++) {
            int tok = argmax(row + (size_t)(k - 1) * V, V);
            tp_fwd_item d = {sid, PLEN[s] + k - 1, &tok, 1, false};
            assert_int_equal(tp_forward_step(f, &d, 1, row + (size_t)k * V, &e), 0);
        }
        tp_forward_free(f);
    }
}

void run_batched(tp_model *m, float *out, int V, int threads, bool scalar, tp_kv_type kv)
{
    tp_err e;
    tp_forward *f;
    assert_int_equal(tp_forward_new(m, NSEQ, 64, 64, &f, &e), 0);
    assert_int_equal(tp_forward_set_kv_type(f, kv, &e), 0);
    assert_int_equal(tp_forward_kv_type(f), kv);
    if (scalar)
        tp_forward_use_scalar_for_tests(f);
    assert_int_equal(tp_forward_set_threads(f, threads, &e), 0);
    assert_int_equal(tp_forward_threads(f), threads);
    /* stories260K's matrices are too small to be worth a thread: split
     * them anyway, at every panel group and (token, head) boundary */
    tp_forward_split_all_for_tests(f);
    int sid[NSEQ], fed[NSEQ] = {0}, done[NSEQ] = {0}, toks[NSEQ];
    float *step_logits = malloc(sizeof(float) * NSEQ * V);
    for (int s = 0; s < NSEQ; s++)
        tp_forward_seq_open(f, &sid[s], &e);
    for (int step = 0; step < 64; step++) {
        tp_fwd_item items[NSEQ];
        int owner[NSEQ], n = 0;
        for (int s = 0; s < NSEQ && s <= step; s++) {
            if (done[s] > DECODE)
                continue;
            tp_fwd_item it = {sid[s], fed[s], NULL, 0, false};
            if (fed[s] < PLEN[s]) {
                it.tokens = PROMPTS[s] + fed[s];
                it.n_tokens = PLEN[s] - fed[s] < 3 ? PLEN[s] - fed[s] : 3;
                it.skip_logits = fed[s] + it.n_tokens < PLEN[s];
            } else {
                toks[s] = argmax(out + ((size_t)s * (DECODE + 1) + done[s] - 1) * V, V);
                it.tokens = &toks[s];
                it.n_tokens = 1;
            }
            owner[n] = s;
            items[n++] = it;
        }
        if (!n)
            break;
        if (tp_forward_step(f, items, n, step_logits, &e))
            fail_msg("batched step %d: %s", step, e.msg);
        for (int i = 0; i < n; i++) {
            int s = owner[i];
            fed[s] += items[i].n_tokens;
            if (!items[i].skip_logits)
                memcpy(out + ((size_t)s * (DECODE + 1) + done[s]++) * V, step_logits + (size_t)i * V,
                       sizeof(float) * V);
        }
    }
    free(step_logits);
    tp_forward_free(f);
}
