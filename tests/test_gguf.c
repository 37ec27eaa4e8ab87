/* GGUF v3 parser: the real stories260K.gguf, and corrupted copies of it
 * that must be rejected with a message naming the broken field. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/gguf.h"
#include "tokpipe/model.h"
#include "support/model_files.h"

static uint8_t *real(size_t *size)
{
    uint8_t *b = model_file_read("stories260K.gguf", size);
    if (!b)
        fail_msg("cannot read stories260K.gguf from TP_MODELS");
    return b;
}

static void parses_stories260k_directory_and_metadata(void **state)
{
    (void)state;
    size_t size;
    uint8_t *b = real(&size);
    tp_gguf *g;
    tp_err e;
    assert_int_equal(tp_gguf_parse(b, size, &g, &e), 0);
    assert_int_equal(tp_gguf_n_tensors(g), 48);
    const tp_gguf_tensor *t = tp_gguf_tensor_find(g, "token_embd.weight");
    assert_non_null(t);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->dims[0], 64);
    assert_int_equal(t->dims[1], 512);
    assert_int_equal(t->type, TP_GGML_F32);
    /* README: tensor data starts at byte 14176 */
    uint64_t lowest = UINT64_MAX;
    for (uint64_t i = 0; i < tp_gguf_n_tensors(g); i++) {
        uint64_t off = (uint64_t)((const uint8_t *)tp_gguf_tensor_at(g, i)->data - b);
        lowest = off < lowest ? off : lowest;
    }
    assert_int_equal(lowest, 14176);
    int64_t v;
    assert_int_equal(tp_gguf_get_int(g, "llama.block_count", &v, &e), 0);
    assert_int_equal(v, 5);
    double eps;
    assert_int_equal(tp_gguf_get_float(g, "llama.attention.layer_norm_rms_epsilon", &eps, &e), 0);
    assert_float_equal(eps, 1e-5, 1e-9);
    tp_gguf_str *toks;
    uint64_t n;
    assert_int_equal(tp_gguf_get_str_array(g, "tokenizer.ggml.tokens", &toks, &n, &e), 0);
    assert_int_equal(n, 512);
    assert_int_equal(toks[0].len, 5);
    assert_memory_equal(toks[0].ptr, "<unk>", 5);
    free(toks);
    assert_int_equal(tp_gguf_get_int(g, "no.such.key", &v, &e), TP_ENOTFOUND);
    assert_non_null(strstr(e.msg, "no.such.key"));
    assert_int_equal(tp_gguf_get_int(g, "general.architecture", &v, &e), TP_EFORMAT);
    tp_gguf_free(g);
    free(b);
}

/* Offset of the tensor-info record that follows the name. */
static size_t after_name(const uint8_t *b, size_t size, const char *name)
{
    const uint8_t *p = memmem(b, size, name, strlen(name));
    /* the first hit could be metadata text; tensor infos follow the KVs */
    const uint8_t *last = p;
    while (p) {
        last = p;
        p = memmem(p + 1, size - (size_t)(p + 1 - b), name, strlen(name));
    }
    assert_non_null(last);
    return (size_t)(last - b) + strlen(name);
}

typedef struct corruption {
    const char *what;
    size_t off;
    uint64_t value;
    int width;
    int via_model; /* 1: load through tp_model (type checks live there) */
    const char *msg;
} corruption;

static void check_rejected(const uint8_t *b, size_t size, const corruption *c)
{
    uint8_t *copy = malloc(size);
    memcpy(copy, b, size);
    memcpy(copy + c->off, &c->value, (size_t)c->width);
    tp_err e = {0, ""};
    int rc;
    if (c->via_model) {
        tp_model *m = NULL;
        rc = tp_model_from_memory(copy, size, &m, &e);
        tp_model_free(m);
    } else {
        tp_gguf *g = NULL;
        rc = tp_gguf_parse(copy, size, &g, &e);
        tp_gguf_free(g);
    }
    if (rc == 0 || !strstr(e.msg, c->msg))
        fail_msg("%s: rc %d message '%s', want '%s'", c->what, rc, e.msg, c->msg);
    free(copy);
}

static void corrupted_fields_are_rejected_by_name(void **state)
{
    (void)state;
    size_t size;
    uint8_t *b = real(&size);
    size_t emb = after_name(b, size, "token_embd.weight"); /* n_dims u32, dims, type u32, offset u64 */
    /* "general.architecture", then type u32 and length u64, then "llama" */
    size_t arch = (size_t)((uint8_t *)memmem(b, size, "general.architecture", 20) - b) + 20 + 12;
    assert_memory_equal(b + arch, "llama", 5);
    uint64_t dims1 = 0;
    memcpy(&dims1, b + emb + 12, 8);
    uint64_t off = 0;
    memcpy(&off, b + emb + 4 + 16 + 4, 8);
    corruption cases[] = {
        {"magic", 0, 0x47554747, 4, 0, "bad magic"},
        {"version", 4, 2, 4, 0, "version 2"},
        {"tensor count", 8, 1ull << 60, 8, 0, "tensor count"},
        {"metadata count", 16, 1ull << 60, 8, 0, "metadata count"},
        {"first key length", 24, 1ull << 40, 8, 0, "metadata key length"},
        {"n_dims", emb, 5, 4, 0, "5 dimensions"},
        {"dimension", emb + 12, 1ull << 40, 8, 0, "extends past the end"},
        {"dimension overflow", emb + 12, 1ull << 63, 8, 0, "too large"},
        {"zero dimension", emb + 4, 0, 8, 0, "dimension 0 (0) is zero"},
        {"offset alignment", emb + 24, off + 4, 8, 0, "not a multiple of the alignment"},
        {"offset past end", emb + 24, 1ull << 50, 8, 0, "extends past the end"},
        {"tensor type", emb + 20, TP_GGML_IQ4_NL, 4, 1, "type iq4_nl (20), which tokpipe does not read"},
        {"unknown tensor type", emb + 20, 31, 4, 1, "type unknown (31)"},
        {"shape", emb + 12, dims1 - 1, 8, 1, "output.weight' has shape [64, 512] (2 dims), expected [64, 511]"},
        {"architecture", arch + 4, 'x', 1, 1, "general.architecture 'llamx' is not supported"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_rejected(b, size, &cases[i]);
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(parses_stories260k_directory_and_metadata),
        cmocka_unit_test(corrupted_fields_are_rejected_by_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
