/* libFuzzer target: the GGUF parser and the GGUF model loader on arbitrary
 * bytes, including typed (F16 ... Q6_K) matrices read in place. Every lookup result is read through so ASan sees any bad extent. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/gguf.h"
#include "tokpipe/model.h"
#include "tokpipe/vocab.h"
#include "../workers/forward/quant.h"

static void walk(const tp_gguf *g)
{
    volatile uint8_t sink = 0;
    for (uint64_t i = 0; i < tp_gguf_n_tensors(g); i++) {
        const tp_gguf_tensor *t = tp_gguf_tensor_at(g, i);
        for (uint64_t j = 0; j < t->name.len; j++)
            sink ^= (uint8_t)t->name.ptr[j];
        if (t->data && t->nbytes)
            sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->nbytes - 1];
    }
    tp_gguf_str *toks;
    uint64_t n;
    if (tp_gguf_get_str_array(g, "tokenizer.ggml.tokens", &toks, &n, NULL) == 0) {
        for (uint64_t i = 0; i < n; i++)
            if (toks[i].len)
                sink ^= (uint8_t)toks[i].ptr[toks[i].len - 1];
        free(toks);
    }
    for (uint64_t i = 0; i < tp_gguf_n_kv(g); i++) { /* what the GGUF writer copies */
        tp_gguf_kv_view kv;
        if (tp_gguf_kv_at(g, i, &kv, NULL) == 0 && kv.raw_len)
            sink ^= kv.raw[0] ^ kv.raw[kv.raw_len - 1] ^ (uint8_t)kv.key.ptr[kv.key.len ? kv.key.len - 1 : 0];
    }
    uint32_t type;
    const uint8_t *raw;
    if (tp_gguf_get_array(g, "tokenizer.ggml.scores", &type, &n, &raw, NULL) == 0 && n)
        sink ^= raw[0];
    (void)sink;
}

/* Read the last row of a typed matrix the way the forward pass does
 * (dequantization for the embedding, the scalar kernel for a matmul, and
 * with AVX-512 VNNI the panel the forward builds at load and its kernel). */
static void read_last_row(const tp_wmat *w)
{
    if (w->type == TP_GGML_F32 || w->rows < 1)
        return;
    float *row = malloc((size_t)w->cols * sizeof(float)), *y = calloc((size_t)w->rows, sizeof(float));
    tp_qact a;
    if (row && y && tp_qact_init(&a, 1, w->cols) == 0) {
        tp_wmat_dequant_row(w, w->rows - 1, row);
        tp_qact_prepare(&a, w->type, row, w->cols, 1, w->cols);
        tp_qmatmul_rows(w, &a, y, w->rows, w->rows - 1, w->rows, false);
        tp_wmat p = *w;
        p.panel = NULL;
        if (tp_qpanel_build(&p, NULL) == 0 && p.panel) {
            tp_qmatmul_rows(&p, &a, y, w->rows, w->rows - 1, w->rows, true);
            tp_qpanel_free(&p);
        }
        tp_qact_free(&a);
    }
    free(row);
    free(y);
}

static void read_typed(const tp_model *m)
{
    const tp_model_weights *w = tp_model_get_weights(m);
    read_last_row(&w->m.token_embedding);
    read_last_row(&w->m.wcls);
    const tp_layer_weights *l = &w->layers[tp_model_get_config(m)->n_layers - 1];
    const tp_wmat *v[] = {&l->m.wq, &l->m.wk, &l->m.wv, &l->m.wo, &l->m.w1, &l->m.w2, &l->m.w3};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        if (v[i]->rows) /* a MoE model has experts instead of w1, w2, w3 */
            read_last_row(v[i]);
    int ne = tp_model_get_config(m)->n_expert;
    if (ne) {
        read_last_row(&l->m.wr);
        read_last_row(&l->w1_exps[ne - 1]);
        read_last_row(&l->w2_exps[ne - 1]);
        read_last_row(&l->w3_exps[ne - 1]);
    }
    if (tp_model_get_config(m)->shexp_ff) { /* qwen35moe's shared expert */
        read_last_row(&l->m.w1_shexp);
        read_last_row(&l->m.w2_shexp);
        read_last_row(&l->m.w3_shexp);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tp_gguf *g;
    if (tp_gguf_parse(data, size, &g, NULL) == 0) {
        walk(g);
        tp_gguf_free(g);
    }
    tp_model *m;
    tp_err e;
    tp_tokenizer *t;
    if (tp_model_from_memory(data, size, &m, &e) == 0) {
        read_typed(m);
        const tp_gguf_vocab *v;
        if (tp_model_vocab_get(m, &v, NULL) == 0 && v->spec.n > 0)
            (void)*(volatile const char *)(v->spec.lens[v->spec.n - 1] ? v->spec.pieces[v->spec.n - 1] : "");
        if (tp_model_tokenizer(m, &t, NULL) == 0)
            tp_tokenizer_free(t);
        tp_model_free(m);
    }
    if (tp_tokenizer_from_gguf_mem(data, size, &t, NULL) == 0) { /* vocab-only path */
        int ids[16];
        size_t n;
        tp_tokenizer_encode(t, "Once upon a time", 16, true, ids, 16, &n, NULL);
        tp_tokenizer_free(t);
    }
    return 0;
}
