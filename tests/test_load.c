/* The one loader (model/load.c): which vocabulary and which chat template
 * each combination of model.path / model.tokenizer / model.chat_template
 * gives, and the refusals, on the real files in ../shared/models. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/load.h"
#include "support/model_files.h"

static char paths[8][4096];

static const char *mpath(int slot, const char *name)
{
    model_file_path(name, paths[slot], sizeof paths[slot]);
    return paths[slot];
}

static bool template_has(const tp_loaded *l, const char *needle)
{
    size_t n = 0;
    const char *src = tp_chat_template_source(l->tmpl, &n);
    char *copy = strndup(src, n);
    bool found = copy && strstr(copy, needle);
    free(copy);
    return found;
}

static void a_gguf_model_gives_its_own_vocabulary(void **state)
{
    (void)state;
    tp_load_spec s = {.model = mpath(0, "stories260K.gguf"), .what = TP_LOAD_MODEL | TP_LOAD_TOKENIZER};
    tp_loaded l;
    tp_err e;
    assert_int_equal(tp_load(&s, &l, &e), 0);
    assert_non_null(l.model);
    assert_int_equal(tp_tokenizer_vocab_size(l.tok), 512);
    assert_string_equal(l.bos_text, "<s>");
    assert_string_equal(l.eos_text, "</s>");
    assert_null(l.tmpl); /* not asked for */
    tp_loaded_free(&l);
    assert_null(l.model);
}

static void a_llama2c_model_needs_a_tokenizer_and_the_error_names_the_option(void **state)
{
    (void)state;
    tp_load_spec s = {.model = mpath(0, "stories260K.bin"), .tokenizer_opt = "--tokenizer FILE",
                      .what = TP_LOAD_MODEL | TP_LOAD_TOKENIZER};
    tp_loaded l;
    tp_err e;
    assert_int_equal(tp_load(&s, &l, &e), TP_EINVAL);
    assert_non_null(strstr(e.msg, "stories260K.bin has no embedded vocabulary"));
    assert_non_null(strstr(e.msg, "--tokenizer FILE"));
    assert_null(l.model);
    s.tokenizer = mpath(1, "tok512.bin");
    assert_int_equal(tp_load(&s, &l, &e), 0);
    assert_int_equal(tp_tokenizer_vocab_size(l.tok), 512);
    tp_loaded_free(&l);
}

static void a_vocabulary_of_another_size_is_refused_naming_both(void **state)
{
    (void)state;
    tp_load_spec s = {.model = mpath(0, "stories260K.gguf"),
                      .tokenizer = mpath(1, "llama.cpp-vocab/ggml-vocab-llama-spm.gguf"),
                      .what = TP_LOAD_MODEL | TP_LOAD_TOKENIZER};
    tp_loaded l;
    tp_err e;
    assert_int_not_equal(tp_load(&s, &l, &e), 0);
    assert_non_null(strstr(e.msg, "32000"));
    assert_non_null(strstr(e.msg, "512"));
    assert_null(l.model);
    assert_null(l.tok);
}

static void without_the_model_the_vocabulary_comes_from_the_model_file(void **state)
{
    (void)state;
    /* the gateway: token texts, no weights */
    tp_load_spec s = {.model = mpath(0, "hf-vocab/qwen3-vocab.gguf"), .what = TP_LOAD_TOKENIZER | TP_LOAD_TEMPLATE};
    tp_loaded l;
    tp_err e;
    assert_int_equal(tp_load(&s, &l, &e), 0);
    assert_null(l.model);
    assert_true(tp_tokenizer_vocab_size(l.tok) > 150000);
    assert_non_null(l.tmpl); /* the file's tokenizer.chat_template */
    assert_true(template_has(&l, "<|im_start|>"));
    assert_string_equal(l.template_why, "");
    tp_loaded_free(&l);
}

static void the_template_comes_from_the_named_file_then_the_vocabulary_then_the_model(void **state)
{
    (void)state;
    tp_loaded l;
    tp_err e;
    /* named: wins over the GGUF's own */
    tp_load_spec s = {.model = mpath(0, "hf-vocab/qwen3-vocab.gguf"),
                      .chat_template = mpath(1, "chat-templates/microsoft-Phi-3.5-mini-instruct.jinja"),
                      .what = TP_LOAD_TEMPLATE};
    assert_int_equal(tp_load(&s, &l, &e), 0);
    assert_true(template_has(&l, "<|end|>"));
    assert_false(template_has(&l, "<|im_start|>"));
    tp_loaded_free(&l);
    /* a GGUF vocabulary beside a model without a template: the vocabulary's */
    s = (tp_load_spec){.model = mpath(0, "stories260K.gguf"), .tokenizer = mpath(1, "hf-vocab/llama3-vocab.gguf"),
                       .what = TP_LOAD_TEMPLATE};
    assert_int_equal(tp_load(&s, &l, &e), 0);
    assert_true(template_has(&l, "<|start_header_id|>"));
    tp_loaded_free(&l);
    /* a tokenizer.bin beside a GGUF model that has one: the model's */
    s = (tp_load_spec){.model = mpath(0, "hf-vocab/qwen3-vocab.gguf"), .tokenizer = mpath(1, "tok512.bin"),
                       .what = TP_LOAD_TEMPLATE};
    assert_int_equal(tp_load(&s, &l, &e), 0);
    assert_true(template_has(&l, "<|im_start|>"));
    tp_loaded_free(&l);
}

static void no_template_is_a_reason_or_an_error_as_asked(void **state)
{
    (void)state;
    tp_loaded l;
    tp_err e;
    tp_load_spec s = {.model = mpath(0, "stories260K.gguf"), .what = TP_LOAD_TOKENIZER | TP_LOAD_TEMPLATE};
    assert_int_equal(tp_load(&s, &l, &e), 0);
    assert_null(l.tmpl);
    assert_non_null(strstr(l.template_why, "no usable chat template"));
    assert_non_null(strstr(l.template_why, "model.chat_template")); /* the config key by default */
    tp_loaded_free(&l);
    s.what = TP_LOAD_TOKENIZER | TP_LOAD_TEMPLATE_REQUIRED;
    s.template_opt = "--template FILE";
    assert_int_equal(tp_load(&s, &l, &e), TP_EINVAL);
    assert_non_null(strstr(e.msg, "stories260K.gguf has no chat template"));
    assert_non_null(strstr(e.msg, "--template FILE"));
    assert_null(l.tok);
    /* a template the user named must load, even where one is optional */
    s.what = TP_LOAD_TEMPLATE;
    s.chat_template = "/nonexistent/t.jinja";
    assert_int_equal(tp_load(&s, &l, &e), TP_EIO);
    assert_non_null(strstr(e.msg, "--template FILE"));
    assert_non_null(strstr(e.msg, "/nonexistent/t.jinja"));
}

static void a_vocabulary_that_does_not_load_is_a_reason_when_optional(void **state)
{
    (void)state;
    tp_loaded l;
    tp_err e;
    tp_load_spec s = {.model = mpath(0, "stories260K.bin"), .what = TP_LOAD_MODEL | TP_LOAD_TOKENIZER_IF_ANY};
    assert_int_equal(tp_load(&s, &l, &e), 0);
    assert_non_null(l.model);
    assert_null(l.tok);
    assert_non_null(strstr(l.tokenizer_why, "no embedded vocabulary"));
    tp_loaded_free(&l);
    s = (tp_load_spec){.what = TP_LOAD_MODEL};
    assert_int_equal(tp_load(&s, &l, &e), TP_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_gguf_model_gives_its_own_vocabulary),
        cmocka_unit_test(a_llama2c_model_needs_a_tokenizer_and_the_error_names_the_option),
        cmocka_unit_test(a_vocabulary_of_another_size_is_refused_naming_both),
        cmocka_unit_test(without_the_model_the_vocabulary_comes_from_the_model_file),
        cmocka_unit_test(the_template_comes_from_the_named_file_then_the_vocabulary_then_the_model),
        cmocka_unit_test(no_template_is_a_reason_or_an_error_as_asked),
        cmocka_unit_test(a_vocabulary_that_does_not_load_is_a_reason_when_optional),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
