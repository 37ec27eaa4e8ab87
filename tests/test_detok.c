/* tp_detok on the real vocabularies ($TP_MODELS/tokenizer.bin, the
 * 32000-token Llama 2 one, and tok512.bin), and detok + tp_stop together. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/detok.h"
#include "tokpipe/stop.h"
#include "tokpipe/tokenizer.h"

static tp_tokenizer *load(const char *name)
{
    const char *dir = getenv("TP_MODELS");
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir ? dir : "../shared/models", name);
    tp_tokenizer *tok;
    tp_err err;
    if (tp_tokenizer_load(path, 0, &tok, &err)) fail_msg("load %s: %s", path, err.msg);
    return tok;
}

/* Decode ids[from..n) after context ids[from-1] into buf; returns length. */
static size_t decode(const tp_tokenizer *tok, const int *ids, size_t from, size_t n, char *buf)
{
    tp_detok *d;
    tp_err err;
    if (tp_detok_new(tok, ids[from - 1], &d, &err)) fail_msg("detok_new: %s", err.msg);
    size_t out = 0, len;
    for (size_t i = from; i < n; i++) {
        const uint8_t *b = tp_detok_bytes(d, ids[i], &len, &err);
        if (!b) fail_msg("detok_bytes(%d): %s", ids[i], err.msg);
        memcpy(buf + out, b, len);
        out += len;
        assert_int_equal(tp_detok_accept(d, ids[i], &err), 0);
    }
    tp_detok_free(d);
    return out;
}

static void detok_drops_leading_space_only_after_bos(void **state)
{
    (void)state;
    tp_tokenizer *tok = load("tokenizer.bin");
    const int ids[] = {1, 9038, 2501, 263, 931};   /* README: "Once upon a time" */
    char buf[64];
    size_t n = decode(tok, ids, 1, 5, buf);
    assert_int_equal(n, 16);
    assert_memory_equal(buf, "Once upon a time", 16);
    const int mid[] = {263, 9038};   /* after " a", " Once" keeps its space */
    n = decode(tok, mid, 1, 2, buf);
    assert_int_equal(n, 5);
    assert_memory_equal(buf, " Once", 5);
    tp_tokenizer_free(tok);
    tok = load("tok512.bin");
    const int small[] = {1, 403, 407, 261, 378};
    n = decode(tok, small, 1, 5, buf);
    assert_int_equal(n, 16);
    assert_memory_equal(buf, "Once upon a time", 16);
    tp_tokenizer_free(tok);
}

static void detok_byte_fallback_tokens_give_one_raw_byte(void **state)
{
    (void)state;
    tp_tokenizer *tok = load("tokenizer.bin");
    tp_detok *d;
    assert_int_equal(tp_detok_new(tok, 1, &d, NULL), 0);
    for (int b = 0; b < 256; b++) {
        char piece[8];
        snprintf(piece, sizeof piece, "<0x%02X>", b);
        size_t plen, len;
        const char *p = tp_tokenizer_piece(tok, 3 + b, &plen);
        assert_int_equal(plen, 6);
        assert_memory_equal(p, piece, 6);
        const uint8_t *bytes = tp_detok_bytes(d, 3 + b, &len, NULL);
        assert_int_equal(len, 1);
        assert_int_equal(bytes[0], b);
    }
    size_t len;
    tp_detok_bytes(d, tp_tokenizer_eos_id(tok), &len, NULL);
    assert_int_equal(len, 0);
    tp_detok_bytes(d, tp_tokenizer_bos_id(tok), &len, NULL);
    assert_int_equal(len, 0);
    tp_detok_free(d);
    tp_tokenizer_free(tok);
}

static void detok_rejects_ids_outside_the_vocabulary(void **state)
{
    (void)state;
    tp_tokenizer *tok = load("tok512.bin");
    tp_detok *d;
    tp_err err;
    assert_int_equal(tp_detok_new(tok, 512, &d, &err), TP_ERANGE);
    assert_non_null(strstr(err.msg, "512"));
    assert_int_equal(tp_detok_new(tok, 1, &d, &err), 0);
    size_t len;
    assert_null(tp_detok_bytes(d, -1, &len, &err));
    assert_int_equal(err.code, TP_ERANGE);
    assert_int_equal(tp_detok_accept(d, 600, &err), TP_ERANGE);
    tp_detok_free(d);
    tp_detok_free(NULL);
    tp_tokenizer_free(tok);
}

/* Every llama.cpp tokenizer test input (spaces, tabs, newlines, accents,
 * CJK, emoji, byte fallback) comes back byte for byte: encode with BOS,
 * detokenize after the BOS. */
static void detok_round_trips_the_llama_cpp_test_inputs(void **state)
{
    (void)state;
    tp_tokenizer *tok = load("tokenizer.bin");
    const char *dir = getenv("TP_MODELS");
    char path[1024];
    snprintf(path, sizeof path, "%s/llama.cpp-vocab/ggml-vocab-llama-spm.gguf.inp",
             dir ? dir : "../shared/models");
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    static char all[1 << 16];
    size_t total = fread(all, 1, sizeof all - 1, f);
    fclose(f);
    all[total] = '\0';
    const char *sep = "\n__ggml_vocab_test__\n";
    int cases = 0;
    static int ids[4096];
    static char out[1 << 14];
    for (char *p = all, *q; *p; p = q + strlen(sep)) {
        q = strstr(p, sep);
        if (!q) break;
        size_t n_ids;
        assert_int_equal(tp_tokenizer_encode(tok, p, (size_t)(q - p), true, ids, 4096, &n_ids, NULL), 0);
        size_t n = decode(tok, ids, 1, n_ids, out);
        if (n != (size_t)(q - p) || memcmp(out, p, n))
            fail_msg("input %d '%.*s' decodes to '%.*s'", cases, (int)(q - p), p, (int)n, out);
        cases++;
    }
    assert_true(cases >= 40);
    tp_tokenizer_free(tok);
}

/* The stage as the worker runs it: real ids through detok and tp_stop;
 * returns the final text (static buffer). */
static const char *run_real(const tp_tokenizer *tok, const char *text, const char *stop)
{
    static int ids[256];
    static char out[512];
    size_t n_ids, len;
    assert_int_equal(tp_tokenizer_encode(tok, text, strlen(text), true, ids, 256, &n_ids, NULL), 0);
    const char *stops[] = {stop};
    tp_stop_config c = {.stop = stops, .n_stop = 1, .max_tokens = TP_STOP_NO_LIMIT,
                        .vocab_size = tp_tokenizer_vocab_size(tok)};
    tp_stop *s;
    tp_detok *d;
    assert_int_equal(tp_stop_new(&c, &s, NULL), 0);
    assert_int_equal(tp_detok_new(tok, ids[0], &d, NULL), 0);
    tp_stop_step st;
    for (size_t i = 1; i < n_ids && tp_stop_finish_reason(s) == TP_FINISH_NONE; i++) {
        const uint8_t *b = tp_detok_bytes(d, ids[i], &len, NULL);
        assert_int_equal(tp_stop_feed(s, ids[i], b, len, &st), 0);
        if (st.accepted) tp_detok_accept(d, ids[i], NULL);
    }
    if (tp_stop_finish_reason(s) == TP_FINISH_NONE) tp_stop_cancel(s, &st);
    snprintf(out, sizeof out, "%s", tp_stop_text(s, &len));
    tp_stop_free(s);
    tp_detok_free(d);
    return out;
}

/* The llama emoji is not in the vocabulary: it arrives as four byte tokens
 * and a stop spanning them still cuts at the exact byte; a stop inside
 * the word token "world" too. */
static void detok_and_stop_cut_real_tokens_at_the_byte(void **state)
{
    (void)state;
    tp_tokenizer *tok = load("tokenizer.bin");
    const char *text = "Hello world, \xF0\x9F\xA6\x99 says hi.";
    assert_string_equal(run_real(tok, text, "\xF0\x9F\xA6\x99 s"), "Hello world, ");
    assert_string_equal(run_real(tok, text, "ld, "), "Hello wor");
    assert_string_equal(run_real(tok, text, "nothing"), text);
    tp_tokenizer_free(tok);
}

/* §B9: "</s>" as a stop string could never match text; it names EOS. */
static void detok_control_id_finds_tokens_that_render_as_nothing(void **state)
{
    (void)state;
    tp_tokenizer *tok = load("tokenizer.bin");
    assert_int_equal(tp_detok_control_id(tok, "</s>", 4), tp_tokenizer_eos_id(tok));
    assert_int_equal(tp_detok_control_id(tok, "<s>", 3), tp_tokenizer_bos_id(tok));
    assert_int_equal(tp_detok_control_id(tok, "<unk>", 5), tp_tokenizer_unk_id(tok));
    assert_int_equal(tp_detok_control_id(tok, "Once", 4), -1);
    assert_int_equal(tp_detok_control_id(tok, "<0x0A>", 6), -1);   /* a byte token has text */
    tp_tokenizer_free(tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(detok_drops_leading_space_only_after_bos),
        cmocka_unit_test(detok_byte_fallback_tokens_give_one_raw_byte),
        cmocka_unit_test(detok_rejects_ids_outside_the_vocabulary),
        cmocka_unit_test(detok_round_trips_the_llama_cpp_test_inputs),
        cmocka_unit_test(detok_and_stop_cut_real_tokens_at_the_byte),
        cmocka_unit_test(detok_control_id_finds_tokens_that_render_as_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
