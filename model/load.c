/* A model's files: model, tokenizer, chat template (see load.h). */
#include "tokpipe/load.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool given(const char *s) { return s && *s; }

static int load_tokenizer(const tp_load_spec *s, tp_loaded *l, tp_err *err)
{
    const char *opt = s->tokenizer_opt ? s->tokenizer_opt : "model.tokenizer";
    int vocab = l->model ? tp_model_get_config(l->model)->vocab_size : 0;
    int rc;
    if (given(s->tokenizer))
        rc = tp_tokenizer_open(s->tokenizer, vocab, &l->tok, err); /* a tokenizer.bin needs the model's size */
    else if (!l->model)
        rc = tp_tokenizer_open(s->model, 0, &l->tok, err);
    else if ((rc = tp_model_tokenizer(l->model, &l->tok, err)) == TP_ENOTFOUND)
        return tp_err_set(err, TP_EINVAL, "%s has no embedded vocabulary: give one with %s", s->model, opt);
    if (rc)
        return rc;
    int n = tp_tokenizer_vocab_size(l->tok);
    if (vocab && n != vocab)
        return tp_err_set(err, TP_EINVAL, "the tokenizer %s has %d tokens but the model's vocabulary is %d",
                          given(s->tokenizer) ? s->tokenizer : s->model, n, vocab);
    return 0;
}

/* The texts a template names as bos_token and eos_token. */
static int special_texts(tp_loaded *l, tp_err *err)
{
    if (!l->tok)
        return 0;
    int ids[2] = {tp_tokenizer_bos_id(l->tok), tp_tokenizer_eos_id(l->tok)};
    char **text[2] = {&l->bos_text, &l->eos_text};
    for (int k = 0; k < 2; k++) {
        size_t len = 0;
        const char *p = ids[k] >= 0 ? tp_tokenizer_piece(l->tok, ids[k], &len) : NULL;
        if (p && !(*text[k] = strndup(p, len)))
            return tp_err_set(err, TP_ENOMEM, "out of memory");
    }
    return 0;
}

static int load_template(const tp_load_spec *s, tp_loaded *l, tp_err *err)
{
    const char *opt = s->template_opt ? s->template_opt : "model.chat_template";
    bool named = given(s->chat_template);
    const char *src = named ? s->chat_template : given(s->tokenizer) ? s->tokenizer : s->model;
    tp_err e;
    tp_err_clear(&e);
    int rc = tp_chat_template_load(src, !named, &l->tmpl, &e);
    if (rc == TP_ENOTFOUND && !named && src != s->model) /* a tokenizer.bin beside a GGUF model */
        rc = tp_chat_template_load(s->model, true, &l->tmpl, &e);
    if (rc && named)
        return tp_err_set(err, rc, "%s: %s", opt, e.msg);
    if (rc == TP_ENOTFOUND && (s->what & TP_LOAD_TEMPLATE_REQUIRED))
        return tp_err_set(err, TP_EINVAL,
                          "%s has no chat template: give one with %s (a .jinja file, e.g. from the model's "
                          "tokenizer_config.json, or a GGUF file that has one)", s->model, opt);
    if (rc && (s->what & TP_LOAD_TEMPLATE_REQUIRED))
        return tp_err_set(err, rc, "%s", e.msg);
    if (rc)
        snprintf(l->template_why, sizeof l->template_why, "no usable chat template (%.380s); give one with %s",
                 e.msg, opt);
    return 0;
}

int tp_load(const tp_load_spec *s, tp_loaded *out, tp_err *err)
{
    memset(out, 0, sizeof *out);
    if (!given(s->model))
        return tp_err_set(err, TP_EINVAL, "no model file is named");
    int rc = 0;
    if (s->what & TP_LOAD_MODEL)
        rc = tp_model_load(s->model, &out->model, err);
    if (!rc && (s->what & TP_LOAD_TOKENIZER))
        rc = load_tokenizer(s, out, err);
    else if (!rc && (s->what & TP_LOAD_TOKENIZER_IF_ANY)) {
        tp_err e;
        tp_err_clear(&e);
        if (load_tokenizer(s, out, &e)) {
            tp_tokenizer_free(out->tok);
            out->tok = NULL;
            snprintf(out->tokenizer_why, sizeof out->tokenizer_why, "%s", e.msg);
        }
    }
    if (!rc && (s->what & (TP_LOAD_TEMPLATE | TP_LOAD_TEMPLATE_REQUIRED)))
        rc = load_template(s, out, err);
    if (!rc)
        rc = special_texts(out, err);
    if (rc)
        tp_loaded_free(out);
    return rc;
}

void tp_loaded_free(tp_loaded *l)
{
    tp_model_free(l->model);
    tp_tokenizer_free(l->tok);
    tp_chat_template_free(l->tmpl);
    free(l->bos_text);
    free(l->eos_text);
    memset(l, 0, sizeof *l);
}
