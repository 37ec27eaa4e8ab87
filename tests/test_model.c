/* Model loading: llama2.c and GGUF on the real stories260K files, tiny
 * in-memory checkpoints (GQA, separate classifier), and rejection of
 * truncated or corrupted files with a message naming the problem. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/model.h"
#include "tokpipe/vocab.h"
#include "support/model_files.h"
#include "support/tiny_model.h"

static tp_model *load(const char *name)
{
    char path[4096];
    model_file_path(name, path, sizeof path);
    tp_model *m = NULL;
    tp_err e;
    if (tp_model_load(path, &m, &e))
        fail_msg("cannot load %s: %s", path, e.msg);
    return m;
}

static void llama2c_header_gives_the_readme_shape(void **state)
{
    (void)state;
    tp_model *m = load("stories260K.bin");
    const tp_model_config *c = tp_model_get_config(m);
    int got[] = {c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size, c->seq_len,
                 c->kv_dim, c->head_size};
    int want[] = {64, 172, 5, 8, 4, 512, 512, 32, 8};
    assert_memory_equal(got, want, sizeof want);
    assert_true(c->shared_classifier);
    assert_float_equal(c->norm_eps, 1e-5f, 0);
    assert_float_equal(c->rope_theta, 10000.0f, 0);
    const tp_model_weights *w = tp_model_get_weights(m);
    assert_ptr_equal(w->wcls, w->token_embedding);
    const int *eos;
    assert_int_equal(tp_model_eos_ids(m, &eos), 2);
    assert_int_equal(eos[0], 1);
    assert_int_equal(eos[1], 2);
    assert_int_equal(tp_model_get_format(m), TP_MODEL_LLAMA2C);
    assert_non_null(strstr(tp_model_identity(m), "llama2c dim=64 hidden=172 layers=5 heads=8 kv_heads=4"));
    const tp_gguf_vocab *v;
    tp_err e;
    assert_int_equal(tp_model_vocab_get(m, &v, &e), TP_ENOTFOUND);
    tp_model_free(m);
}

static void gguf_gives_same_shape_weights_and_embedded_vocab(void **state)
{
    (void)state;
    tp_model *b = load("stories260K.bin"), *g = load("stories260K.gguf");
    const tp_model_config *cb = tp_model_get_config(b), *cg = tp_model_get_config(g);
    assert_int_equal(cg->dim, cb->dim);
    assert_int_equal(cg->hidden_dim, cb->hidden_dim);
    assert_int_equal(cg->n_layers, cb->n_layers);
    assert_int_equal(cg->n_kv_heads, cb->n_kv_heads);
    assert_int_equal(cg->vocab_size, 512);
    assert_int_equal(cg->seq_len, 2048); /* the converter's default context_length */
    assert_false(cg->shared_classifier); /* output.weight is stored explicitly */
    const tp_model_weights *wb = tp_model_get_weights(b), *wg = tp_model_get_weights(g);
    size_t d = 64, h = 172, kvd = 32;
    assert_memory_equal(wb->token_embedding, wg->token_embedding, 512 * d * 4);
    assert_memory_equal(wb->wcls, wg->wcls, 512 * d * 4);
    assert_memory_equal(wb->rms_final, wg->rms_final, d * 4);
    for (int l = 0; l < 5; l++) {
        const tp_layer_weights *x = &wb->layers[l], *y = &wg->layers[l];
        /* Same bytes: llama.cpp's llama2.c converter does not permute wq/wk. */
        assert_memory_equal(x->wq, y->wq, d * d * 4);
        assert_memory_equal(x->wk, y->wk, kvd * d * 4);
        assert_memory_equal(x->wv, y->wv, kvd * d * 4);
        assert_memory_equal(x->wo, y->wo, d * d * 4);
        assert_memory_equal(x->w1, y->w1, h * d * 4);
        assert_memory_equal(x->w2, y->w2, h * d * 4);
        assert_memory_equal(x->w3, y->w3, h * d * 4);
        assert_memory_equal(x->rms_att, y->rms_att, d * 4);
        assert_memory_equal(x->rms_ffn, y->rms_ffn, d * 4);
    }
    const tp_gguf_vocab *v;
    tp_err e;
    assert_int_equal(tp_model_vocab_get(g, &v, &e), 0);
    assert_int_equal(v->spec.n, 512);
    assert_int_equal(v->spec.bos_id, 1);
    assert_int_equal(v->spec.eos_id, 2);
    assert_int_equal(v->spec.kind, TP_TOKENIZER_SPM);
    assert_string_equal(v->model, "llama");
    assert_int_equal(v->spec.lens[3], 6);
    assert_memory_equal(v->spec.pieces[3], "<0x00>", 6);
    assert_int_equal(v->spec.types[3], 6); /* byte token */
    const int *eos;
    assert_int_equal(tp_model_eos_ids(g, &eos), 2);
    assert_int_equal(eos[0], 1);
    assert_int_equal(eos[1], 2);
    assert_string_not_equal(tp_model_identity(b), tp_model_identity(g));
    tp_model_free(b);
    tp_model_free(g);
}

static void negative_vocab_means_classifier_after_freq_cis(void **state)
{
    (void)state;
    tiny_shape sh = {16, 24, 2, 4, 1, 10, 6, 1};
    float *ck;
    tp_model *m = tiny_model_new(&sh, 3, 0.1f, &ck);
    const tp_model_config *c = tp_model_get_config(m);
    assert_false(c->shared_classifier);
    assert_int_equal(c->vocab_size, 10);
    assert_int_equal(c->kv_dim, 4);
    const tp_model_weights *w = tp_model_get_weights(m);
    assert_ptr_equal(w->wcls, (const float *)ck + 7 + tiny_llama_floats(&sh) - 10 * 16);
    assert_ptr_equal(w->layers[1].wk, (const float *)ck + 7 + 10 * 16 + 2 * 16 + 2 * 256 + 64);
    tp_model_free(m);
    free(ck);
}

static void every_truncation_of_either_file_is_rejected(void **state)
{
    (void)state;
    const char *files[] = {"stories260K.bin", "stories260K.gguf"};
    for (int fi = 0; fi < 2; fi++) {
        size_t size;
        uint8_t *full = model_file_read(files[fi], &size);
        assert_non_null(full);
        for (size_t cut = 0; cut < size; cut += cut < 16384 ? 1 : 4093) {
            uint8_t *copy = malloc(cut ? cut : 1);
            memcpy(copy, full, cut);
            tp_model *m = NULL;
            tp_err e = {0, ""};
            int rc = tp_model_from_memory(copy, cut, &m, &e);
            if (rc == 0 || e.msg[0] == '\0')
                fail_msg("%s cut at %zu bytes: rc %d, message '%s'", files[fi], cut, rc, e.msg);
            free(copy);
        }
        free(full);
    }
}

static void llama2c_bad_header_fields_are_named(void **state)
{
    (void)state;
    size_t size;
    uint8_t *full = model_file_read("stories260K.bin", &size);
    assert_non_null(full);
    struct { int field; int32_t value; const char *msg; } cases[] = {
        {0, 0, "dim = 0"},
        {0, 63, "dim 63 is not a multiple of n_heads 8"},
        {1, -5, "hidden_dim = -5"},
        {3, 6, "dim 64 is not a multiple of n_heads 6"},
        {4, 16, "n_kv_heads = 16"},
        {4, 3, "n_heads 8 is not a multiple of n_kv_heads 3"},
        {5, INT32_MIN, "vocab_size"},
        {5, 513, "needs exactly"},
        {5, -512, "needs exactly"}, /* claims a classifier the file lacks */
        {6, 0x7fffffff, "seq_len"},
        {0, 0x616b3432, "ak42"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t *copy = malloc(size);
        memcpy(copy, full, size);
        memcpy(copy + 4 * cases[i].field, &cases[i].value, 4);
        tp_model *m = NULL;
        tp_err e = {0, ""};
        int rc = tp_model_from_memory(copy, size, &m, &e);
        if (rc != TP_EFORMAT || !strstr(e.msg, cases[i].msg))
            fail_msg("header field %d = %d: rc %d '%s', want '%s'", cases[i].field, cases[i].value, rc,
                     e.msg, cases[i].msg);
        free(copy);
    }
    /* One extra byte is as wrong as a missing one. */
    uint8_t *longer = malloc(size + 4);
    memcpy(longer, full, size);
    tp_model *m;
    tp_err e;
    assert_int_equal(tp_model_from_memory(longer, size + 4, &m, &e), TP_EFORMAT);
    free(longer);
    free(full);
}

static void encode(tp_tokenizer *t, const char *text, bool bos, int *ids, size_t *n)
{
    tp_err e;
    if (tp_tokenizer_encode(t, text, strlen(text), bos, ids, 64, n, &e))
        fail_msg("encode '%s': %s", text, e.msg);
}

static void gguf_embedded_vocab_encodes_like_run_c(void **state)
{
    (void)state;
    tp_model *m = load("stories260K.gguf");
    tp_tokenizer *t;
    tp_err e;
    assert_int_equal(tp_model_tokenizer(m, &t, &e), 0);
    tp_model_free(m); /* the tokenizer owns copies */
    int ids[64];
    size_t n;
    encode(t, "Once upon a time", true, ids, &n);
    const int want[] = {1, 403, 407, 261, 378}; /* README: run.c with tok512.bin */
    assert_int_equal(n, 5);
    assert_memory_equal(ids, want, sizeof want);
    tp_tokenizer_free(t);
    tp_model *b = load("stories260K.bin");
    assert_int_equal(tp_model_tokenizer(b, &t, &e), TP_ENOTFOUND);
    tp_model_free(b);
}

static void vocab_only_gguf_files_give_a_tokenizer(void **state)
{
    (void)state;
    char path[4096];
    tp_tokenizer *t;
    tp_err e;
    model_file_path("llama.cpp-vocab/ggml-vocab-llama-spm.gguf", path, sizeof path);
    assert_int_equal(tp_tokenizer_open(path, 0, &t, &e), 0);
    int ids[64];
    size_t n;
    encode(t, "Hello world", false, ids, &n);
    const int want[] = {15043, 3186}; /* the file's own .out test vector */
    assert_int_equal(n, 2);
    assert_memory_equal(ids, want, sizeof want);
    assert_int_equal(tp_tokenizer_vocab_size(t), 32000);
    tp_tokenizer_free(t);
    model_file_path("llama.cpp-vocab/ggml-vocab-gpt-2.gguf", path, sizeof path);
    assert_int_equal(tp_tokenizer_open(path, 0, &t, &e), 0);
    assert_int_equal(tp_tokenizer_kind(t), TP_TOKENIZER_BPE);
    encode(t, "Hello world", false, ids, &n);
    const int want_bpe[] = {15496, 995}; /* the gpt-2 file's own .out vector */
    assert_int_equal(n, 2);
    assert_memory_equal(ids, want_bpe, sizeof want_bpe);
    tp_tokenizer_free(t);
    model_file_path("stories260K.bin", path, sizeof path);
    /* a checkpoint is neither a GGUF vocabulary nor a tokenizer.bin */
    assert_int_equal(tp_tokenizer_open(path, 0, &t, &e), TP_EFORMAT);
    assert_non_null(strstr(e.msg, "stories260K.bin"));
}

static void missing_file_is_an_io_error_naming_the_path(void **state)
{
    (void)state;
    tp_model *m;
    tp_err e;
    assert_int_equal(tp_model_load("/nonexistent/model.bin", &m, &e), TP_EIO);
    assert_non_null(strstr(e.msg, "/nonexistent/model.bin"));
    assert_null(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(llama2c_header_gives_the_readme_shape),
        cmocka_unit_test(gguf_gives_same_shape_weights_and_embedded_vocab),
        cmocka_unit_test(negative_vocab_means_classifier_after_freq_cis),
        cmocka_unit_test(every_truncation_of_either_file_is_rejected),
        cmocka_unit_test(llama2c_bad_header_fields_are_named),
        cmocka_unit_test(gguf_embedded_vocab_encodes_like_run_c),
        cmocka_unit_test(vocab_only_gguf_files_give_a_tokenizer),
        cmocka_unit_test(missing_file_is_an_io_error_naming_the_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
