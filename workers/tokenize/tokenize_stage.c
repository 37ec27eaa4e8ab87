/* Tokenize stage glue: TOKENIZE {slot, text, add_bos, parse_special} ->
 * TOKENIZED + ids. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/chat_template.h"
#include "tokpipe/stage.h"
#include "tokpipe/toolcall.h"

#define TURN_END_MAX 4

struct tp_tokenize_stage {
    const tp_tokenizer *tok;
    int *ids;          /* scratch, grown to the longest prompt seen */
    size_t cap;
    tp_chat_template *chat;   /* NULL: messages refused with chat_why */
    char *bos, *eos;
    char chat_why[TP_ERR_MSG_MAX];
    tp_tc_syntax syntax;      /* the template's tool-call syntax */
    int32_t turn_end[TURN_END_MAX];
    int n_turn_end;
};

int tp_tokenize_stage_new(const tp_tokenizer *tok, tp_tokenize_stage **out, tp_err *err)
{
    tp_tokenize_stage *st = calloc(1, sizeof *st);
    if (!st)
        return tp_err_set(err, TP_ENOMEM, "tokenize stage: out of memory");
    st->tok = tok;
    *out = st;
    return 0;
}

void tp_tokenize_stage_free(tp_tokenize_stage *st)
{
    if (!st)
        return;
    free(st->ids);
    tp_chat_template_free(st->chat);
    free(st->bos);
    free(st->eos);
    free(st);
}

static int grow(tp_tokenize_stage *st, size_t len)
{
    size_t need = tp_tokenizer_max_ids(len);
    if (need > st->cap) {
        int *n = realloc(st->ids, need * sizeof *n);
        if (!n)
            return TP_ENOMEM;
        st->ids = n;
        st->cap = need;
    }
    return 0;
}

int tp_tokenize_stage_set_chat(tp_tokenize_stage *st, tp_chat_template *tmpl, const char *bos, const char *eos,
                               const char *why, tp_err *err)
{
    tp_chat_template_free(st->chat);
    free(st->bos);
    free(st->eos);
    st->chat = tmpl;
    st->bos = bos ? strdup(bos) : NULL;
    st->eos = eos ? strdup(eos) : NULL;
    st->n_turn_end = 0;
    snprintf(st->chat_why, sizeof st->chat_why, "%s", why ? why : "the model has no chat template");
    if ((bos && !st->bos) || (eos && !st->eos))
        return tp_err_set(err, TP_ENOMEM, "tokenize stage: out of memory");
    memset(&st->syntax, 0, sizeof st->syntax);
    if (!tmpl)
        return 0;
    tp_toolcall_syntax(tmpl, st->bos, st->eos, &st->syntax);
    if (!st->tok)
        return 0;   /* rendering only (tokpipe chat-template --openai) */
    char *end = NULL;
    tp_err e;
    if (tp_chat_template_turn_end(tmpl, st->bos, st->eos, &end, &e))
        return 0;   /* a template that needs more than a plain probe: no extra stop ids */
    size_t n = 0;
    int rc = grow(st, strlen(end));
    if (!rc)
        rc = tp_tokenizer_encode_ex(st->tok, end, strlen(end), TP_ENCODE_SPECIAL, st->ids, st->cap, &n, &e);
    free(end);
    if (rc || n == 0)
        return 0;
    int id = st->ids[0];
    int type = tp_tokenizer_token_type(st->tok, id);
    if (type != TP_TOKEN_CONTROL && type != TP_TOKEN_USER_DEFINED)
        return 0;   /* the turn ends in plain text: nothing to stop on but stop strings */
    const int32_t *eog;
    int n_eog = tp_tokenizer_eog_ids(st->tok, &eog);
    for (int k = 0; k < n_eog; k++)
        if (eog[k] == id)
            return 0;   /* already ends generation, as eos */
    st->turn_end[st->n_turn_end++] = id;
    return 0;
}

void tp_tokenize_stage_syntax(const tp_tokenize_stage *st, tp_tc_syntax *out)
{
    *out = st->syntax;
}

int tp_tokenize_stage_turn_end_ids(const tp_tokenize_stage *st, const int32_t **ids)
{
    *ids = st->turn_end;
    return st->n_turn_end;
}

static int reply_error(const tp_msg *m, const tp_stage_io *io, uint32_t status, const char *msg)
{
    tp_msg r;
    tp_msg_init_reply(&r, m, TP_CMD_TOKENIZED, status, msg);
    r.tokenized.slot = m->tokenize.slot;
    return io->reply(io->ctx, &r);
}

/* The variables' JSON object (*vars, *vlen bytes, ending in '}') with
 * "reasoning_effort": effort as its last member, as OpenAI's API passes
 * the request's field to gpt-oss's template. effort is one of three
 * words (the protocol checked): no escaping. */
static int add_effort(char **vars, size_t *vlen, tp_str effort)
{
    size_t n = *vlen;
    while (n && (*vars)[n - 1] != '}')
        n--;
    if (!n)
        return TP_EINVAL;
    char *v = realloc(*vars, n + effort.len + 32);
    if (!v)
        return TP_ENOMEM;
    *vars = v;
    bool empty = n >= 2 && v[n - 2] == '{';
    *vlen = n - 1 + (size_t)sprintf(v + n - 1, "%s\"reasoning_effort\":\"%.*s\"}", empty ? "" : ",", (int)effort.len,
                                    effort.ptr);
    return 0;
}

/* Render as tp_tokenize_stage_render does, with room for max_output bytes. */
static int render(const tp_tokenize_stage *st, const tp_chat_msg *msgs, size_t n, tp_str tools, tp_str effort,
                  size_t max_output, char **out, size_t *len, tp_err *err)
{
    if (!st->chat)
        return tp_err_set(err, TP_EINVAL, "messages: %s", st->chat_why);
    if (tools.ptr) {
        int rc = tp_tools_check(tools.ptr, tools.len, err);
        if (rc)
            return rc;
        if (st->syntax.family == TP_TC_NONE)
            return tp_err_set(err, TP_EINVAL, "tools: the model's chat template has no tool support");
    }
    char *vars = NULL;
    size_t vlen = 0;
    tp_err e;
    int rc = tp_toolcall_chat_vars(&st->syntax, msgs, n, tools, &vars, &vlen, &e);
    if (rc)
        return tp_err_set(err, rc, "%s", e.msg);
    if (effort.ptr && (rc = add_effort(&vars, &vlen, effort))) {
        free(vars);
        return tp_err_set(err, rc, "tokenize stage: out of memory");
    }
    tp_chat_vars v = {.json = vars, .json_len = vlen, .bos_token = st->bos, .eos_token = st->eos,
                      .add_generation_prompt = true, .max_output = max_output};
    rc = tp_chat_template_render(st->chat, &v, out, len, &e);
    free(vars);
    if (rc)
        return tp_err_set(err, rc, "messages: %s", e.msg);
    return 0;
}

int tp_tokenize_stage_render(const tp_tokenize_stage *st, const tp_chat_msg *msgs, size_t n, tp_str tools,
                             tp_str reasoning_effort, char **out, size_t *len, tp_err *err)
{
    return render(st, msgs, n, tools, reasoning_effort, TP_PROTO_MAX_PROMPT, out, len, err);
}

int tp_tokenize_stage_handle(tp_tokenize_stage *st, const tp_msg *m, const tp_stage_io *io)
{
    if (m->cmd != TP_CMD_TOKENIZE)
        return TP_ENOTFOUND;
    const tp_m_tokenize *t = &m->tokenize;
    const char *text = t->text.ptr;
    size_t len = t->text.len;
    char *rendered = NULL;
    tp_err e;
    tp_err_clear(&e);
    unsigned flags = (t->add_bos ? TP_ENCODE_ADD_SPECIAL : 0) | (t->parse_special ? TP_ENCODE_SPECIAL : 0);
    if (t->n_messages) {
        /* rendered with room past the limit, so that a conversation that
         * does not fit is told by how much (a 413: the client's error) */
        int rc = render(st, t->messages, t->n_messages, t->tools, t->reasoning_effort, TP_TOKENIZE_RENDER_ROOM,
                        &rendered, &len, &e);
        if (rc)
            return reply_error(m, io, rc == TP_ENOMEM ? TP_ST_INTERNAL : TP_ST_BAD_REQUEST, e.msg);
        if (len > TP_PROTO_MAX_PROMPT) {
            char why[160];
            snprintf(why, sizeof why, "messages: the conversation renders to %zu bytes, a prompt holds %u", len,
                     TP_PROTO_MAX_PROMPT);
            free(rendered);
            return reply_error(m, io, TP_ST_TOO_LARGE, why);
        }
        text = rendered;
        /* a rendered prompt carries its own BOS and turn tokens as text:
         * parse them, add nothing (what transformers' apply_chat_template does) */
        flags = TP_ENCODE_SPECIAL;
    }
    if (grow(st, len)) {
        free(rendered);
        return reply_error(m, io, TP_ST_INTERNAL, "tokenize: out of memory");
    }
    size_t n_ids = 0;
    int erc = tp_tokenizer_encode_ex(st->tok, text, len, flags, st->ids, st->cap, &n_ids, &e);
    free(rendered);
    if (erc)
        return reply_error(m, io, TP_ST_BAD_REQUEST, e.msg);
    /* e.g. no BOS asked for and only bytes the vocabulary has no token for:
     * there would be nothing to run the model on */
    if (n_ids == 0)
        return reply_error(m, io, TP_ST_BAD_REQUEST, "prompt: encodes to no tokens");
    if (n_ids > TP_PROTO_MAX_TOKENIZED) {
        /* unreachable for a text within TP_PROTO_MAX_PROMPT (the cap is
         * tp_tokenizer_max_ids of it); a reply the encoder refused would
         * end this worker, and the job would take the next one down */
        char why[128];
        snprintf(why, sizeof why, "%s: %zu tokens, more than the %u one job can hold",
                 t->n_messages ? "messages" : "prompt", n_ids, TP_PROTO_MAX_TOKENIZED);
        return reply_error(m, io, TP_ST_TOO_LARGE, why);
    }
    tp_msg r;
    tp_msg_init_reply(&r, m, TP_CMD_TOKENIZED, TP_ST_OK, NULL);
    r.tokenized.slot = t->slot;
    if (t->n_messages) {
        r.tokenized.stop_ids = st->turn_end;
        r.tokenized.n_stop_ids = (size_t)st->n_turn_end;
    }
    /* int and int32_t are the same width on every platform we build for */
    r.tokenized.ids = (tp_raw){st->ids, n_ids};
    return io->reply(io->ctx, &r);
}
