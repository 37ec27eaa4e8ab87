/* Byte-level BPE: the pre-tokenizer rules (Llama 3 and Qwen 2 against a
 * hand-evaluated oracle of their published regexes and hand-derived
 * splits; names and refusals), the GPT-2 byte alphabet, and encoding with
 * the real GPT-2 vocabulary. The llama.cpp test vectors of every vocabulary
 * are checked end to end in tokenizer_test.py. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/model_files.h"
#include "support/pretok_oracle.h"
#include "tokpipe/bpe.h"
#include "tokpipe/tokenizer.h"

static tp_pretok *pretok(const char *name, bool *ign)
{
    tp_pretok *p = NULL;
    tp_err e;
    if (tp_pretok_new(name, strlen(name), &p, ign, &e))
        fail_msg("%s: %s", name, e.msg);
    return p;
}

/* The words of text joined with '|' (the texts below have no '|'). */
static void split_str(const tp_pretok *p, const char *text, char *out, size_t cap)
{
    size_t *ends, n;
    tp_err e;
    if (tp_pretok_split(p, text, strlen(text), &ends, &n, &e))
        fail_msg("split '%s': %s", text, e.msg);
    size_t o = 0, from = 0;
    for (size_t i = 0; i < n; i++) {
        if (i)
            out[o++] = '|';
        assert_true(o + (ends[i] - from) < cap);
        memcpy(out + o, text + from, ends[i] - from);
        o += ends[i] - from;
        from = ends[i];
    }
    out[o] = '\0';
    assert_int_equal(from, strlen(text));
    free(ends);
}

static void expect_split(const tp_pretok *p, const char *text, const char *want)
{
    char got[512];
    split_str(p, text, got, sizeof got);
    if (strcmp(got, want))
        fail_msg("%s: '%s' split as '%s', want '%s'", tp_pretok_name(p), text, got, want);
}

static void llama3_splits_as_its_regex_says(void **state)
{
    (void)state;
    bool ign = false;
    tp_pretok *p = pretok("llama-bpe", &ign);
    assert_true(ign); /* Llama 3 words already in the vocabulary skip merges */
    assert_string_equal(tp_pretok_name(p), "llama3");
    /* derived by hand from the regex in Llama 3's tokenizer.json */
    expect_split(p, "Hello world", "Hello| world");
    expect_split(p, "I'M here, y'all", "I|'M| here|,| y|'all");
    expect_split(p, "1234567", "123|456|7");
    expect_split(p, "a  b", "a| | b");
    expect_split(p, "x\n\n  y", "x|\n\n| | y");
    expect_split(p, "hello!!!\n\nok", "hello|!!!\n\n|ok");
    expect_split(p, "\xf0\x9f\xa6\x99.cpp", "\xf0\x9f\xa6\x99.|cpp");
    expect_split(p, "(word\tend", "(word|\tend");
    expect_split(p, "trailing   ", "trailing|   ");
    tp_pretok_free(p);
}

/* gpt-oss's o200k (tokenizer.ggml.pre gpt-4o), derived by hand from the
 * regex in its tokenizer.json (tiktoken's o200k_base) */
static void gpt4o_splits_cased_words_and_digits_by_three(void **state)
{
    (void)state;
    bool ign = true;
    tp_pretok *p = pretok("gpt-4o", &ign);
    assert_false(ign);
    expect_split(p, "Hello world", "Hello| world");
    expect_split(p, "HELLOworld camelCase", "HELLOworld| camel|Case");
    expect_split(p, "I'M here, y'all", "I'M| here|,| y|'all"); /* 'all: no contraction */
    expect_split(p, "1234567", "123|456|7");
    expect_split(p, "a  b", "a| | b");
    expect_split(p, "foo/bar\n\nok", "foo|/bar|\n\n|ok");
    expect_split(p, "end!!!\n", "end|!!!\n");
    tp_pretok_free(p);
}

static void qwen2_splits_digits_one_by_one(void **state)
{
    (void)state;
    bool ign = true;
    tp_pretok *p = pretok("qwen2", &ign);
    assert_false(ign);
    expect_split(p, "1234567", "1|2|3|4|5|6|7");
    expect_split(p, "Hello world 42!", "Hello| world| |4|2|!");
    tp_pretok_free(p);
}

/* Random text from pieces that exercise every alternative: letters of
 * several scripts, digits of several systems, contractions in both cases,
 * punctuation, symbols, marks, every kind of space and line break. */
static const char *const PIECES[] = {
    "a", "Z", "\xc3\xa9", "\xd0\x96", "\xe6\x97\xa5", "\xea\xb0\x80", "\xd9\x85", "\xe0\xa4\xa8",
    "0", "7", "\xd9\xa3", "\xe2\x85\xa0", "\xc2\xbd", "'", "'s", "'T", "'re", "'VE", "'ll", "'D",
    "'m", ".", ",", "!", "?", "(", ")", "-", "\xe2\x80\x94", "\xe3\x80\x82", "$", "+", "\xf0\x9f\xa6\x99",
    "\xe2\x9c\x85", "\xcc\x81", "\xe2\x80\x8d", " ", " ", " ", "  ", "\t", "\n", "\r\n", "\r", "\x0b",
    "\xc2\xa0", "\xc2\x85", "\xe2\x80\xa8", "\xe3\x80\x80", "\xe2\x80\x83", "\xef\xbf\xbd", "\xcd\xb8",
};

static void pcre2_rules_equal_the_hand_evaluated_regex(void **state)
{
    (void)state;
    const char *names[] = {"llama-bpe", "qwen2"};
    srand(1234);
    for (int k = 0; k < 2; k++) {
        tp_pretok *p = pretok(names[k], NULL);
        for (int t = 0; t < 3000; t++) {
            char text[512];
            size_t len = 0;
            int n = 1 + rand() % 40;
            for (int i = 0; i < n; i++) {
                const char *s = PIECES[rand() % (int)(sizeof PIECES / sizeof PIECES[0])];
                memcpy(text + len, s, strlen(s));
                len += strlen(s);
            }
            size_t *ends, nw, want[512];
            tp_err e;
            assert_int_equal(tp_pretok_split(p, text, len, &ends, &nw, &e), 0);
            size_t nwant = pretok_oracle_split(text, len, k == 0, want);
            if (nw != nwant || memcmp(ends, want, nw * sizeof *ends)) {
                char got[1024];
                text[len] = '\0';
                split_str(p, text, got, sizeof got);
                fail_msg("%s: text '%s' split as '%s' (%zu words), the regex gives %zu words",
                         names[k], text, got, nw, nwant);
            }
            free(ends);
        }
        tp_pretok_free(p);
    }
}

static void deepseek_v3_splits_as_its_regexes_say(void **state)
{
    (void)state;
    bool ign = true;
    tp_pretok *p = pretok("deepseek-v3", &ign);
    assert_false(ign);
    assert_string_equal(tp_pretok_name(p), "deepseek-v3");
    /* derived by hand from the three Split regexes of DeepSeek V3's
     * tokenizer.json */
    expect_split(p, "1234567 apples", "123|456|7| apples");
    expect_split(p, "x = 12+3", "x| =| |12|+|3");
    expect_split(p, "(word.cpp) don't", "(word|.cpp|)| don|'t");
    expect_split(p, "\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c, hi", /* 你好世界 */
                 "\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c|,| hi");
    expect_split(p, "\xe3\x81\x93\xe3\x82\x93\xe3\x82\xab\xe3\x82\xbf", /* こんカタ: kana, one piece */
                 "\xe3\x81\x93\xe3\x82\x93\xe3\x82\xab\xe3\x82\xbf");
    expect_split(p, "a \xea\xb0\x80\xeb\x82\x98", "a| \xea\xb0\x80\xeb\x82\x98"); /* Hangul is a plain letter run */
    expect_split(p, "hello!!!\n\nok", "hello|!!!\n\n|ok");
    expect_split(p, "x\n\n  y", "x|\n\n| | y");
    expect_split(p, "trailing   ", "trailing|   ");
    expect_split(p, "e\xcc\x81t\xc3\xa9", "e\xcc\x81t\xc3\xa9"); /* marks stay with the letters */
    tp_pretok_free(p);
}

/* Text from PIECES and DeepSeek V3's own classes: ASCII punctuation before
 * ASCII and other letters, CJK and kana next to Han outside U+4E00-U+9FA5,
 * marks, zero-width joiners, digit runs longer than three. */
static const char *const DS3_PIECES[] = {
    "(", "[", "\\", "`", "~", "_", "@", "abc", "Q", "\xe4\xb8\xad", "\xe9\xbe\xa5", "\xe9\xbe\xa6",
    "\xe3\x81\x82", "\xe3\x82\xa2", "\xe3\x83\xbc", "\xe3\x80\x81", "\xef\xbc\x81", "123", "4567",
    "\xe2\x80\x8d", "\xcc\x81\xcc\x81", "\xf0\xa0\x80\x80", "\xe1\x84\x80", "\x01", "\xc2\xad", "+=",
};

static void deepseek_v3_rules_equal_the_hand_evaluated_regexes(void **state)
{
    (void)state;
    tp_pretok *p = pretok("deepseek-v3", NULL);
    size_t n_base = sizeof PIECES / sizeof PIECES[0], n_ds = sizeof DS3_PIECES / sizeof DS3_PIECES[0];
    srand(4321);
    for (int t = 0; t < 4000; t++) {
        char text[640];
        size_t len = 0;
        int n = 1 + rand() % 40;
        for (int i = 0; i < n; i++) {
            size_t k = (size_t)rand() % (n_base + n_ds);
            const char *s = k < n_base ? PIECES[k] : DS3_PIECES[k - n_base];
            memcpy(text + len, s, strlen(s));
            len += strlen(s);
        }
        size_t *ends, nw, want[640];
        tp_err e;
        assert_int_equal(tp_pretok_split(p, text, len, &ends, &nw, &e), 0);
        size_t nwant = pretok_oracle_split_deepseek_v3(text, len, want);
        if (nw != nwant || memcmp(ends, want, nw * sizeof *ends)) {
            char got[2048];
            text[len] = '\0';
            split_str(p, text, got, sizeof got);
            fail_msg("deepseek-v3: text '%s' split as '%s' (%zu words), the regexes give %zu words", text, got,
                     nw, nwant);
        }
        free(ends);
    }
    tp_pretok_free(p);
}

static void unknown_pre_tokenizer_is_refused_by_name(void **state)
{
    (void)state;
    tp_pretok *p = NULL;
    tp_err e;
    assert_int_equal(tp_pretok_new("llama4-bpe", 10, &p, NULL, &e), TP_EFORMAT);
    assert_null(p);
    assert_non_null(strstr(e.msg, "'llama4-bpe'"));
}

static void every_named_rule_set_compiles(void **state)
{
    (void)state;
    const char *names[] = {"default", "gpt-2", "llama3", "llama-v3", "llama-bpe", "falcon3",
                           "dbrx", "smaug-bpe", "qwen2", "stablelm2", "deepseek-llm",
                           "deepseek-coder", "deepseek-v3", "falcon", "starcoder", "refact", "smollm", "mpt",
                           "gpt-4o", "llama4"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        tp_pretok *p = pretok(names[i], NULL);
        char got[256];
        split_str(p, "Hi, 123 \xe6\x97\xa5\xe6\x9c\xac x\n", got, sizeof got);
        tp_pretok_free(p);
    }
}

static void invalid_utf8_is_refused_with_its_offset(void **state)
{
    (void)state;
    tp_pretok *p = pretok("gpt-2", NULL);
    size_t *ends, n;
    tp_err e;
    assert_int_equal(tp_pretok_split(p, "ok \xe6\x97 x", 7, &ends, &n, &e), TP_EINVAL);
    assert_non_null(strstr(e.msg, "byte 3"));
    tp_pretok_free(p);
}

static void byte_alphabet_maps_every_byte_back(void **state)
{
    (void)state;
    /* "Ġ" (U+0120) is the space, "Ċ" (U+010A) the newline, printable ASCII
     * stands for itself, and text outside the alphabet is kept */
    uint8_t out[16];
    assert_int_equal(tp_bpe_unmap("\xc4\xa0hi\xc4\x8a", 6, out), 4);
    assert_memory_equal(out, " hi\n", 4);
    assert_int_equal(tp_bpe_unmap("\xc4\x80\xc5\x83", 4, out), 2); /* U+0100, U+0143 */
    assert_int_equal(out[0], 0x00);
    assert_int_equal(out[1], 0xAD); /* the 68th byte without a visible self */
    assert_int_equal(tp_bpe_unmap("\xe6\x97\xa5", 3, out), 3);
    assert_memory_equal(out, "\xe6\x97\xa5", 3);
}

static void gpt2_vocabulary_encodes_and_decodes(void **state)
{
    (void)state;
    char path[4096];
    model_file_path("llama.cpp-vocab/ggml-vocab-gpt-2.gguf", path, sizeof path);
    tp_tokenizer *t;
    tp_err e;
    assert_int_equal(tp_tokenizer_open(path, 0, &t, &e), 0);
    assert_int_equal(tp_tokenizer_kind(t), TP_TOKENIZER_BPE);
    assert_false(tp_tokenizer_add_bos(t));
    const char *text = " Hello, y'all! \xf0\x9f\xa6\x99 42<|endoftext|>";
    int ids[64], sp[64];
    size_t n, ns;
    assert_int_equal(tp_tokenizer_encode_ex(t, text, strlen(text), 0, ids, 64, &n, &e), 0);
    assert_int_equal(tp_tokenizer_encode_ex(t, text, strlen(text), TP_ENCODE_SPECIAL, sp, 64, &ns, &e), 0);
    assert_int_equal(sp[ns - 1], 50256); /* the control token, only when asked */
    for (size_t i = 0; i < n; i++)
        assert_int_not_equal(ids[i], 50256);
    char back[128];
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        size_t k;
        const uint8_t *b = tp_tokenizer_token_bytes(t, i ? ids[i - 1] : -1, ids[i], &k);
        memcpy(back + o, b, k);
        o += k;
    }
    assert_int_equal(o, strlen(text));
    assert_memory_equal(back, text, o);
    size_t k;
    tp_tokenizer_token_bytes(t, -1, 50256, &k);
    assert_int_equal(k, 0); /* control tokens render as nothing */
    const int32_t *eog;
    assert_int_equal(tp_tokenizer_eog_ids(t, &eog), 1);
    assert_int_equal(eog[0], 50256);
    assert_int_equal(tp_tokenizer_encode_ex(t, "a\xff", 2, 0, ids, 64, &n, &e), TP_EINVAL);
    tp_tokenizer_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(llama3_splits_as_its_regex_says),
        cmocka_unit_test(qwen2_splits_digits_one_by_one),
        cmocka_unit_test(gpt4o_splits_cased_words_and_digits_by_three),
        cmocka_unit_test(pcre2_rules_equal_the_hand_evaluated_regex),
        cmocka_unit_test(deepseek_v3_splits_as_its_regexes_say),
        cmocka_unit_test(deepseek_v3_rules_equal_the_hand_evaluated_regexes),
        cmocka_unit_test(unknown_pre_tokenizer_is_refused_by_name),
        cmocka_unit_test(every_named_rule_set_compiles),
        cmocka_unit_test(invalid_utf8_is_refused_with_its_offset),
        cmocka_unit_test(byte_alphabet_maps_every_byte_back),
        cmocka_unit_test(gpt2_vocabulary_encodes_and_decodes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
