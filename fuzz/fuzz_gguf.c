/* libFuzzer target: the GGUF parser and the GGUF model loader on arbitrary
 * bytes. Every lookup result is read through so ASan sees any bad extent. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/gguf.h"
#include "tokpipe/model.h"

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
        tp_model_vocab v;
        if (tp_model_vocab_get(m, &v, NULL) == 0 && v.n > 0)
            (void)*(volatile const char *)(v.piece_lens[v.n - 1] ? v.pieces[v.n - 1] : "");
        if (tp_model_tokenizer(m, &t, NULL) == 0)
            tp_tokenizer_free(t);
        tp_model_free(m);
    }
    if (tp_model_tokenizer_from_memory(data, size, &t, NULL) == 0) { /* vocab-only path */
        int ids[16];
        size_t n;
        tp_tokenizer_encode(t, "Once upon a time", 16, true, ids, 16, &n, NULL);
        tp_tokenizer_free(t);
    }
    return 0;
}
