/* A job's message fields beside its text: the thinking text and the tool
 * calls its events carried, kept for
 * STATUS (as the text is): a running job shows the calls as its TOKEN
 * deltas built them so far, a finished one FINISH's whole. Only jobs whose
 * output is split (params.parse_reasoning / parse_tool_calls) have any.
 * Bounded like the text: the reasoning and each call's arguments up to
 * TP_PROTO_MAX_TEXT bytes (whole deltas), TP_PROTO_MAX_TOOL_CALLS calls. */
#include <stdlib.h>
#include <string.h>

#include "jobs.h"
#include "tokpipe/buf.h"

/* Each text is a lenient tp_buf limited to TP_PROTO_MAX_TEXT: a delta is
 * kept whole or not at all (a refused one does not stop the later ones). */
struct jobfields {
    tp_buf reasoning;
    struct scall {
        tp_buf id, name, args;
    } *calls;
    size_t n, cap;
    tp_tool_call *view;   /* STATUS's array, pointing into calls */
};

static void text_init(tp_buf *b)
{
    tp_buf_init(b, TP_PROTO_MAX_TEXT);
    b->lenient = true;
}

/* An empty delta adds nothing, not even the memory: a text never given
 * stays NULL in STATUS's views. */
static void text_add(tp_buf *b, const char *s, size_t n)
{
    if (n)
        tp_buf_add(b, s, n);
}

static void drop_calls(struct jobfields *s)
{
    for (size_t i = 0; i < s->n; i++) {
        tp_buf_free(&s->calls[i].id);
        tp_buf_free(&s->calls[i].name);
        tp_buf_free(&s->calls[i].args);
    }
    s->n = 0;
}

void jobfields_free(bjob *j)
{
    if (!j->fields)
        return;
    drop_calls(j->fields);
    free(j->fields->calls);
    free(j->fields->view);
    tp_buf_free(&j->fields->reasoning);
    free(j->fields);
    j->fields = NULL;
}

static struct jobfields *get(bjob *j)
{
    if (!j->fields && (j->fields = calloc(1, sizeof *j->fields)))
        text_init(&j->fields->reasoning);
    return j->fields;
}

/* The call with id, added at the end when it is new (NULL: no room). */
static struct scall *call_of(struct jobfields *s, tp_str id, tp_str name)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->calls[i].id.len == id.len && !memcmp(s->calls[i].id.data, id.ptr, id.len))
            return &s->calls[i];
    if (s->n == TP_PROTO_MAX_TOOL_CALLS)
        return NULL;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 4;
        struct scall *c = realloc(s->calls, cap * sizeof *c);
        if (!c)
            return NULL;
        s->calls = c;
        s->cap = cap;
    }
    struct scall *c = &s->calls[s->n];
    text_init(&c->id);
    text_init(&c->name);
    text_init(&c->args);
    text_add(&c->id, id.ptr, id.len);
    text_add(&c->name, name.ptr, name.len);
    if (c->id.len != id.len || c->name.len != name.len) {
        tp_buf_free(&c->id);
        tp_buf_free(&c->name);
        return NULL;
    }
    s->n++;
    return c;
}

void jobfields_on_token(bjob *j, const tp_m_token *t)
{
    if (!t->reasoning.len && !t->n_tool_calls)
        return;
    struct jobfields *s = get(j);
    if (!s)
        return;
    text_add(&s->reasoning, t->reasoning.ptr, t->reasoning.len);
    for (size_t i = 0; i < t->n_tool_calls; i++) {
        struct scall *c = call_of(s, t->tool_calls[i].id, t->tool_calls[i].name);
        if (c)
            text_add(&c->args, t->tool_calls[i].arguments.ptr, t->tool_calls[i].arguments.len);
    }
}

void jobfields_on_finish(bjob *j, const tp_m_finish *f)
{
    if (!f->reasoning_content.len && !f->n_tool_calls && !j->fields)
        return;
    struct jobfields *s = get(j);
    if (!s)
        return;
    tp_buf_reset(&s->reasoning);
    text_add(&s->reasoning, f->reasoning_content.ptr, f->reasoning_content.len);
    drop_calls(s);
    for (size_t i = 0; i < f->n_tool_calls; i++) {
        struct scall *c = call_of(s, f->tool_calls[i].id, f->tool_calls[i].name);
        if (c)
            text_add(&c->args, f->tool_calls[i].arguments.ptr, f->tool_calls[i].arguments.len);
    }
}

tp_str jobfields_reasoning(const bjob *j)
{
    const struct jobfields *s = j->fields;
    return s && s->reasoning.len ? (tp_str){s->reasoning.data, s->reasoning.len} : (tp_str){0};
}

size_t jobfields_calls(bjob *j, const tp_tool_call **calls)
{
    struct jobfields *s = j->fields;
    *calls = NULL;
    if (!s || !s->n)
        return 0;
    tp_tool_call *v = realloc(s->view, s->n * sizeof *v);
    if (!v)
        return 0;
    s->view = v;
    for (size_t i = 0; i < s->n; i++) {
        const struct scall *c = &s->calls[i];
        v[i] = (tp_tool_call){{c->id.data, c->id.len}, {c->name.data, c->name.len}, {c->args.data ? c->args.data : "", c->args.len}};
    }
    *calls = v;
    return s->n;
}
