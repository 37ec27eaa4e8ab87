/* Chat templates: the Jinja subset the model hubs' `tokenizer.chat_template`
 * texts use, rendered the way Hugging Face transformers renders them
 * (trim_blocks, lstrip_blocks, the loopcontrols extension, the globals
 * raise_exception and strftime_now, and a `tojson` that keeps key order and
 * non-ASCII text as json.dumps(ensure_ascii=False) does).
 *
 * A template is parsed once and may be rendered any number of times, from
 * any number of threads (rendering never modifies it). A construct outside
 * the subset is refused with an error naming it and its line, at parse time
 * when it is syntactic (an unknown statement, filter or test) and at render
 * time otherwise (a method or value kind the renderer does not model):
 * never a wrong rendering. Rendering is bounded: nesting depth, steps
 * (statements and loop iterations), memory and output bytes are capped, so
 * a hostile template cannot hang or exhaust the process. */
#ifndef TOKPIPE_CHAT_TEMPLATE_H
#define TOKPIPE_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include <cJSON.h>

#include "tokpipe/error.h"

typedef struct tp_chat_template tp_chat_template;

#define TP_CHAT_MAX_TEMPLATE   (1u << 20)   /* bytes of template text */
#define TP_CHAT_MAX_DEPTH      64           /* expression / block / macro call nesting */
#define TP_CHAT_MAX_STEPS      2000000      /* statements + loop iterations per render */
#define TP_CHAT_MAX_MEMORY     (64u << 20)  /* bytes of values a render may build */
#define TP_CHAT_DEFAULT_OUTPUT (4u << 20)   /* rendered bytes unless the caller says */

/* Parse the len bytes of text (UTF-8; need not be NUL terminated). On
 * success *out is owned by the caller (tp_chat_template_free). Errors
 * (TP_EFORMAT syntax, TP_EINVAL unsupported construct, TP_ERANGE too big or
 * too deep) name the line and the construct. */
int tp_chat_template_new(const char *text, size_t len, tp_chat_template **out, tp_err *err);

void tp_chat_template_free(tp_chat_template *t);

/* What one render sees. messages: a JSON array (of objects with "role" and
 * "content", as OpenAI's API sends them; further fields such as tool_calls
 * pass through as JSON values). extra: NULL or a JSON object whose members
 * become further template variables (tools, documents, date_string, ...).
 * bos_token / eos_token: NULL leaves the variable undefined. max_output: cap
 * on the rendered bytes, 0 = TP_CHAT_DEFAULT_OUTPUT. All borrowed. */
typedef struct tp_chat_vars {
    const cJSON *messages;
    const cJSON *extra;
    /* Or, instead of messages and extra when non-NULL: the json_len bytes of
     * a JSON object whose members (messages among them) are the variables.
     * Read as Python's json.loads reads it: strings keep every byte (U+0000
     * included), integers stay integers however large (up to 64 bits; a
     * larger one is refused rather than rounded), 1.0 is a float. */
    const char *json;
    size_t json_len;
    const char *bos_token;
    const char *eos_token;
    bool add_generation_prompt;
    size_t max_output;
} tp_chat_vars;

/* Render t with v. On success *out (NUL terminated, *out_len bytes without
 * the NUL) is owned by the caller (free). A template's raise_exception(msg)
 * gives TP_EINVAL with a message ending in msg; a type error, an undefined
 * value used as a value or an unsupported method TP_EFORMAT; a limit
 * TP_ERANGE. Every message names the template line. */
int tp_chat_template_render(const tp_chat_template *t, const tp_chat_vars *v, char **out, size_t *out_len,
                            tp_err *err);

/* The template's source text (normalised: \r\n as \n, one trailing
 * newline dropped), borrowed from t. */
const char *tp_chat_template_source(const tp_chat_template *t, size_t *len);

/* The text t puts right after an assistant turn's content, up to the next
 * turn (e.g. "<|eot_id|>", "<|im_end|>\n", "<end_of_turn>\n", or eos_token):
 * found by rendering a probe conversation (user, assistant) without a
 * generation prompt. *out (NUL terminated) is owned by the caller (free); an
 * empty string when the content is last. Errors as for render. */
int tp_chat_template_turn_end(const tp_chat_template *t, const char *bos_token, const char *eos_token,
                              char **out, tp_err *err);

/* From a parsed GGUF file (struct tp_gguf, include/tokpipe/gguf.h): its
 * tokenizer.chat_template and the texts of its BOS and EOS tokens (NULL when
 * the file names none). Each *out is owned by the caller (free).
 * TP_ENOTFOUND when the file has no template. */
struct tp_gguf;
/* Parse the template in the file at path: a GGUF file's
 * tokenizer.chat_template (TP_ENOTFOUND when it has none), or else (unless
 * gguf_only: then TP_ENOTFOUND) the whole file as template text. Errors
 * name the path. */
int tp_chat_template_load(const char *path, bool gguf_only, tp_chat_template **out, tp_err *err);
int tp_chat_gguf_info(const struct tp_gguf *g, char **tmpl, char **bos, char **eos, tp_err *err);

#endif
