/* A model's files, loaded one way by every program: the model, its
 * tokenizer and its chat template, with the same defaults and the same
 * refusals in the worker, `tokpipe run`, `tokpipe chat` and the gateway.
 *
 * Defaults, as a user of llama.cpp expects them: no tokenizer named means
 * the vocabulary inside the model file; no template named means the one in
 * the vocabulary's GGUF file, else the model's (a tokenizer.bin beside a
 * GGUF model). */
#ifndef TOKPIPE_LOAD_H
#define TOKPIPE_LOAD_H

#include "tokpipe/chat_template.h"
#include "tokpipe/error.h"
#include "tokpipe/model.h"
#include "tokpipe/tokenizer.h"

enum {
    TP_LOAD_MODEL = 1,             /* the weights (tp_model_load) */
    TP_LOAD_TOKENIZER = 2,         /* the vocabulary (the model's, or .tokenizer) */
    TP_LOAD_TEMPLATE = 4,          /* the chat template if there is one (else .why) */
    TP_LOAD_TEMPLATE_REQUIRED = 8, /* the chat template, or an error saying what to give */
    TP_LOAD_TOKENIZER_IF_ANY = 16, /* the vocabulary if it loads (else tokenizer_why) */
};

typedef struct tp_load_spec {
    const char *model;         /* model.path / --model */
    const char *tokenizer;     /* model.tokenizer / --tokenizer; NULL or "": the model's own */
    const char *chat_template; /* model.chat_template / --chat-template; NULL or "": from a GGUF */
    /* how the user names the two options, for errors: "model.tokenizer" or
     * "--tokenizer FILE" (NULL: the config keys) */
    const char *tokenizer_opt, *template_opt;
    unsigned what;             /* TP_LOAD_* */
} tp_load_spec;

typedef struct tp_loaded {
    tp_model *model;           /* NULL unless TP_LOAD_MODEL */
    tp_tokenizer *tok;         /* NULL unless TP_LOAD_TOKENIZER */
    tp_chat_template *tmpl;    /* NULL: no template (why says why) */
    char *bos_text, *eos_text; /* the vocabulary's BOS / EOS pieces, as templates use them (NULL: none) */
    char template_why[TP_ERR_MSG_MAX];  /* without a template: the reason and what to set */
    char tokenizer_why[TP_ERR_MSG_MAX]; /* TP_LOAD_TOKENIZER_IF_ANY without one: why */
} tp_loaded;

/* Load what s->what asks for. A tokenizer without the model is read from
 * s->tokenizer, else from the model file (its vocabulary only). The
 * tokenizer and the model must agree on the vocabulary size. A template
 * the user named must load; one looked for in a GGUF file may be absent
 * (TP_LOAD_TEMPLATE: tmpl NULL and template_why set; TP_LOAD_TEMPLATE_REQUIRED:
 * TP_EINVAL naming the option). Errors name the file. On error *out holds
 * nothing. Free with tp_loaded_free. */
int tp_load(const tp_load_spec *s, tp_loaded *out, tp_err *err);

/* Frees what *l holds; a field set to NULL was taken by the caller. */
void tp_loaded_free(tp_loaded *l);

#endif
