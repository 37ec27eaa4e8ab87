/* libFuzzer target: any bytes as a model's output, split by every tool-call
 * family (whole, and in chunks whose sizes the input picks), and as tools
 * JSON / a JSON object for the member scanner, and as the variables JSON a
 * chat template renders from. Beyond the sanitizers it checks that feeding
 * in chunks gives the same content, reasoning and calls as feeding whole,
 * that the call deltas joined are the calls, that a parsed call's
 * arguments are JSON (all but the last: a call that streamed keeps what
 * was generated when the text breaks off), and that no content is lost:
 * without calls, content + reasoning hold every byte that is not a
 * thinking marker. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "tokpipe/buf.h"
#include "tokpipe/chat_template.h"
#include "tokpipe/grammar.h"
#include "tokpipe/jschema.h"
#include "tokpipe/toolcall.h"

typedef struct out {
    tp_buf content, reasoning;
    size_t n_calls;
    char names[1024];
} out;

/* out of memory ends the run: a lost piece would read as a finding */
static void add(tp_buf *b, const char *s, size_t len)
{
    if (tp_buf_add(b, s, len))
        abort();
}

static void run(tp_tc_family f, bool thinks, bool open, const uint8_t *d, size_t n, const uint8_t *cuts, size_t nc,
                out *o)
{
    memset(o, 0, sizeof *o);
    tp_tc_syntax syn = {.family = f, .thinks = thinks, .think_open = open};
    tp_tcsplit_opts opts = {.tools = true, .reasoning = true, .parallel = true, .id_seed = 1};
    tp_tcsplit *s;
    tp_err e;
    if (tp_tcsplit_new(&syn, &opts, &s, &e))
        abort();
    const char *c, *r;
    size_t cn, rn, at = 0, k = 0;
    /* the calls as their deltas build them */
    tp_buf dargs[8] = {0};
    size_t nd = 0;
    const tp_tc_delta *dl;
#define TAKE_DELTAS()                                                                                      \
    for (size_t q = 0, nq = tp_tcsplit_deltas(s, &dl); q < nq; q++) {                                     \
        if (dl[q].first && dl[q].index != nd++)                                                            \
            abort();                                                                                       \
        if (dl[q].index >= nd || !dl[q].id || !dl[q].name)                                                 \
            abort();                                                                                       \
        if (dl[q].index < 8)                                                                               \
            add(&dargs[dl[q].index], dl[q].arguments, dl[q].arguments_len);                               \
    }
    while (at < n) {
        size_t step = nc ? (size_t)cuts[k++ % nc] % 17 + 1 : n;
        if (step > n - at)
            step = n - at;
        if (tp_tcsplit_feed(s, (const char *)d + at, step, &c, &cn, &r, &rn))
            abort();
        add(&o->content, c, cn);
        add(&o->reasoning, r, rn);
        TAKE_DELTAS();
        at += step;
    }
    if (tp_tcsplit_finish(s, NULL, 0, &c, &cn, &r, &rn))
        abort();
    add(&o->content, c, cn);
    add(&o->reasoning, r, rn);
    TAKE_DELTAS();
#undef TAKE_DELTAS
    const tp_tc_call *calls;
    o->n_calls = tp_tcsplit_calls(s, &calls);
    if (nd != o->n_calls)
        abort();   /* every call has its deltas */
    for (size_t i = 0; i < o->n_calls; i++) {
        if (i < 8 && (dargs[i].len != calls[i].arguments_len ||
                      (dargs[i].len && memcmp(dargs[i].data, calls[i].arguments, dargs[i].len))))
            abort();   /* the fragments joined are the arguments */
        cJSON *j = cJSON_ParseWithLength(calls[i].arguments, calls[i].arguments_len);
        if ((!j && i + 1 < o->n_calls) || !calls[i].id || !calls[i].name[0])
            abort();   /* a parsed call's arguments are JSON, it has an id and a name */
        cJSON_Delete(j);
        strncat(o->names, calls[i].name, sizeof o->names - strlen(o->names) - 1);
    }
    for (size_t i = 0; i < 8; i++)
        tp_buf_free(&dargs[i]);
    tp_tcsplit_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    tp_tc_family f = (tp_tc_family)(data[0] % TP_TC_COUNT);
    bool thinks = data[1] & 1, open = data[1] & 2;
    size_t nc = data[2] % 8;
    if (size < 3 + nc)
        return 0;
    const uint8_t *cuts = data + 3, *text = data + 3 + nc;
    size_t n = size - 3 - nc;
    out whole, chunked;
    run(f, thinks, open, text, n, NULL, 0, &whole);
    run(f, thinks, open, text, n, cuts, nc, &chunked);
    if (whole.content.len != chunked.content.len || whole.reasoning.len != chunked.reasoning.len ||
        whole.n_calls != chunked.n_calls ||
        (whole.content.len && memcmp(whole.content.data, chunked.content.data, whole.content.len)) ||
        (whole.reasoning.len && memcmp(whole.reasoning.data, chunked.reasoning.data, whole.reasoning.len)) ||
        strcmp(whole.names, chunked.names))
        abort();   /* streaming must not change the message */
    if (!whole.n_calls && whole.content.len + whole.reasoning.len > n)
        abort();   /* nothing is made up */
    tp_buf_free(&whole.content), tp_buf_free(&whole.reasoning);
    tp_buf_free(&chunked.content), tp_buf_free(&chunked.reasoning);

    tp_err e;
    (void)tp_tools_check((const char *)text, n, &e);
    /* as offered tools under tool_choice required: GBNF the engine reads, or a refusal */
    tp_jschema_opts jo;
    tp_jschema_opts_default(&jo);
    jo.max_schema_bytes = 1 << 16;
    jo.max_depth = 24;
    jo.max_gbnf_bytes = 1 << 18;
    char *g = NULL;
    if (!tp_toolcall_grammar(f, (const char *)text, n, (data[1] & 4) ? "f" : NULL, data[1] & 8, (tp_tcg_from)((data[1] >> 4) % 3), NULL, &jo,
                             &g, &e)) {
        tp_grammar_limits gl;
        tp_grammar_limits_default(&gl);
        gl.max_compile_ms = 600000;
        gl.max_bytes = jo.max_gbnf_bytes;
        tp_grammar *gr = NULL;
        int grc = tp_grammar_compile(g, strlen(g), &gl, &gr, &e);
        if (grc && grc != TP_ERANGE)
            abort();
        tp_grammar_free(gr);
    } else if (g || !e.msg[0])
        abort();
    free(g);
    const char *v;
    size_t vn;
    if (tp_json_member_span((const char *)text, n, "tools", &v, &vn) && (v < (const char *)text || v + vn > (const char *)text + n))
        abort();
    /* the renderer's own JSON reader, with a template that prints everything */
    static tp_chat_template *t;
    if (!t && tp_chat_template_new("{{ messages | tojson }}{{ tools }}", 34, &t, &e))
        abort();
    tp_chat_vars vars = {.json = (const char *)text, .json_len = n, .max_output = 1u << 16};
    char *r = NULL;
    size_t rl = 0;
    if (tp_chat_template_render(t, &vars, &r, &rl, &e) && !e.msg[0])
        abort();   /* a failure says why */
    free(r);
    return 0;
}
