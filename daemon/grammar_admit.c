/* Structured output at admission (grammar_admit.h). */
#include "grammar_admit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/grammar.h"
#include "tokpipe/jschema.h"

static void schema_opts(const tp_config *c, tp_jschema_opts *o)
{
    tp_jschema_opts_default(o);
    o->max_schema_bytes = (size_t)c->schema_max_bytes;
    o->max_depth = c->schema_max_depth;
    o->max_gbnf_bytes = (size_t)c->grammar_max_bytes;
}

/* Compile once so that a grammar past the engine's limits, or naming a
 * token the model lacks, is refused now (never at generation). */
static uint64_t fnv1a(const char *s, size_t n, uint64_t h)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    return h;
}

static int compile_check(const tp_config *c, const tp_gnames *names, grammar_memo *memo, const char *gbnf, tp_err *e)
{
    size_t len = strlen(gbnf);
    uint64_t h1 = fnv1a(gbnf, len, 0xcbf29ce484222325ull), h2 = fnv1a(gbnf, len, 0x84222325cbf29ce4ull);
    for (size_t i = 0; i < GRAMMAR_MEMO_SIZE; i++)
        if (memo->e[i].len == len && memo->e[i].h1 == h1 && memo->e[i].h2 == h2 && len) {
            memo->hits++;
            return 0;
        }
    memo->compiles++;
    int rc = 0;
    tp_grammar_limits gl;
    tp_grammar_limits_from_config(c, &gl, NULL);
    tp_grammar *g = NULL;
    rc = tp_grammar_compile(gbnf, len, &gl, &g, e);
    if (!rc && tp_grammar_n_token_refs(g))
        rc = tp_grammar_check_tokens(g, names, NULL, e);
    tp_grammar_free(g);
    if (!rc) {
        size_t k = memo->next++ % GRAMMAR_MEMO_SIZE;
        memo->e[k].h1 = h1, memo->e[k].h2 = h2, memo->e[k].len = len;
    }
    return rc;
}

int grammar_admit(const tp_config *c, const tp_gnames *names, grammar_memo *memo, const tp_params *p, char **gbnf,
                  char *field, size_t cap, tp_err *err)
{
    *gbnf = NULL;
    const char *key = NULL;
    int rc = 0;
    tp_err e;
    tp_err_clear(&e);
    if ((p->set & TP_P_JSON_SCHEMA) && p->json_schema.ptr) {
        key = "json_schema";
        tp_jschema_opts o;
        schema_opts(c, &o);
        rc = tp_jschema_to_gbnf(p->json_schema.ptr, p->json_schema.len, &o, gbnf, &e);
    } else if ((p->set & TP_P_JSON_MODE) && p->json_mode) {
        key = "json_mode";
        rc = tp_jschema_json_mode_gbnf(gbnf, &e);
    } else if ((p->set & TP_P_GRAMMAR) && p->grammar.ptr) {
        key = "grammar";
        if (!(*gbnf = strndup(p->grammar.ptr, p->grammar.len)))
            rc = tp_err_set(&e, TP_ENOMEM, "out of memory");
        else if (strlen(*gbnf) != p->grammar.len)
            rc = tp_err_set(&e, TP_EINVAL, "a NUL byte in the grammar");
    } else
        return 0;
    if (!rc)
        rc = compile_check(c, names, memo, *gbnf, &e);
    if (rc) {
        free(*gbnf);
        *gbnf = NULL;
        snprintf(field, cap, "params.%s", key);
        return tp_err_set(err, rc == TP_ENOMEM ? TP_ENOMEM : rc == TP_ERANGE ? TP_ERANGE : TP_EINVAL, "params.%s: %s",
                          key, e.msg);
    }
    return 0;
}

static bool str_is(tp_str s, const char *lit)
{
    return s.ptr && s.len == strlen(lit) && !memcmp(s.ptr, lit, s.len);
}

int grammar_admit_tools(const tp_config *c, const tp_gnames *names, grammar_memo *memo, tp_tc_family f,
                        bool think_open, const tp_m_submit *s, char **gbnf, const char **trigger, char *field,
                        size_t cap, tp_err *err)
{
    *gbnf = NULL;
    *trigger = NULL;
    bool named = str_is(s->tool_choice, "function");
    bool lazy = !named && !str_is(s->tool_choice, "required");
    if (lazy && s->tool_choice.ptr && !str_is(s->tool_choice, "auto"))
        return 0;   /* none */
    const tp_params *p = &s->params;
    bool other = ((p->set & TP_P_GRAMMAR) && p->grammar.ptr) || ((p->set & TP_P_JSON_SCHEMA) && p->json_schema.ptr) ||
                 ((p->set & TP_P_JSON_MODE) && p->json_mode);
    /* auto holds a call once it opens, where the syntax has a marker to
     * wait for and the job has no constraint of its own; what cannot be
     * held stays free (auto never refuses) */
    if (lazy && (other || !tp_toolcall_trigger(f)))
        return 0;
    snprintf(field, cap, "tool_choice");
    if (other)
        return tp_err_set(err, TP_EINVAL,
                          "tool_choice: \"%s\" constrains the output to a call; it cannot go with a grammar, "
                          "json_schema or json_mode (response_format)",
                          named ? "function" : "required");
    char only[TP_PROTO_MAX_NAME * 4 + 1];
    if (named)
        snprintf(only, sizeof only, "%.*s", (int)s->tool_choice_name.len, s->tool_choice_name.ptr);
    bool parallel = !(p->set & TP_P_PARALLEL_TOOL_CALLS) || p->parallel_tool_calls;
    tp_err e;
    tp_jschema_opts o;
    schema_opts(c, &o);
    /* a thinking the prompt opened ends before the call (unless the job
     * keeps the thinking in its content) */
    bool after = think_open && (!(p->set & TP_P_PARSE_REASONING) || p->parse_reasoning);
    tp_tcg_from from = lazy ? TP_TCG_LAZY : after ? TP_TCG_AFTER_THINK : TP_TCG_FIRST;
    int rc = tp_toolcall_grammar(f, s->tools.ptr, s->tools.len, named ? only : NULL, parallel, from, names, &o, gbnf,
                                 &e);
    if (!rc && (rc = compile_check(c, names, memo, *gbnf, &e)) != 0) {
        free(*gbnf);
        *gbnf = NULL;
    }
    if (rc && lazy) {
        field[0] = '\0';
        return rc == TP_ENOMEM ? tp_err_set(err, TP_ENOMEM, "out of memory") : 0;
    }
    if (rc)
        return tp_err_set(err, rc == TP_ENOMEM || rc == TP_ERANGE ? rc : TP_EINVAL, "%s", e.msg);
    *trigger = tp_toolcall_grammar_trigger(f, from);
    return 0;
}
