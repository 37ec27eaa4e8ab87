/* The GBNF of "a valid call of one of the offered functions" in a family's
 * syntax (tp_toolcall_grammar): what tool_choice required / a named
 * function holds the output to from its first token. */
#include <cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tc_internal.h"
#include "tokpipe/grammar.h"
#include "tokpipe/jschema.h"

/* s as a GBNF string literal (markers hold newlines and quotes). */
static void literal(tp_buf *b, const char *s)
{
    tp_buf_add(b, "\"", 1);
    for (; *s; s++) {
        if (*s == '\n')
            tp_buf_puts(b, "\\n");
        else if (*s == '"' || *s == '\\') {
            tp_buf_add(b, "\\", 1);
            tp_buf_add(b, s, 1);
        } else
            tp_buf_add(b, s, 1);
    }
    tp_buf_add(b, "\"", 1);
}

static bool word_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Copy the GBNF g with every rule name (definitions and references) given
 * prefix pre, so that each function's schema rules (all of them named
 * root, string, ... by the compiler) live side by side. Literals, classes,
 * repetition counts and comments are copied as they are. */
static void renamed(tp_buf *b, const char *g, const char *pre)
{
    const char *s = g;
    while (*s) {
        char c = *s;
        if (c == '"' || c == '[') {
            char end = c == '"' ? '"' : ']';
            const char *t = s + 1;
            while (*t && *t != end)
                t += (*t == '\\' && t[1]) ? 2 : 1;
            if (*t)
                t++;
            tp_buf_add(b, s, (size_t)(t - s));
            s = t;
        } else if (c == '{' || c == '#') {
            const char *t = s;
            while (*t && *t != (c == '{' ? '}' : '\n'))
                t++;
            tp_buf_add(b, s, (size_t)(t - s));
            s = t;
        } else if (word_char(c)) {
            const char *t = s;
            while (word_char(*t))
                t++;
            tp_buf_puts(b, pre);
            tp_buf_add(b, s, (size_t)(t - s));
            s = t;
        } else {
            tp_buf_add(b, s, 1);
            s++;
        }
    }
}

/* The pieces of the families' markers that a vocabulary may hold as one
 * special token (Mistral's [TOOL_CALLS] is a control token, Qwen's
 * <tool_call> an added one): written as a token reference when the
 * vocabulary names them, so that the grammar asks for that token (a
 * control token has no bytes the engine could match as text). */
static const char *const control_pieces[] = {
    "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "<|START_ACTION|>", "<|END_ACTION|>",
    TC_DS_CALLS_BEGIN, TC_DS_CALLS_END, TC_DS_CALL_BEGIN, TC_DS_CALL_END, TC_DS_SEP, "</think>", "<|END_THINKING|>",
    NULL};

static bool in_shape(const tc_family_def *d, const char *piece)
{
    const char *const shape[] = {d->calls_open, d->calls_sep, d->calls_close, d->call_open,
                                 d->call_close, d->name_close, d->markers ? d->markers[0] : NULL,
                                 d->markers && d->markers[0] ? d->markers[1] : NULL};
    for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++)
        if (shape[i] && strstr(shape[i], piece))
            return true;
    return false;
}

size_t tp_toolcall_control_pieces(tp_tc_family f, const char **out, size_t cap)
{
    const tc_family_def *d = tc_family(f);
    size_t n = 0;
    for (size_t i = 0; d && control_pieces[i]; i++)
        if (in_shape(d, control_pieces[i]) && n < cap)
            out[n++] = control_pieces[i];
    return n;
}

const char *tp_toolcall_trigger(tp_tc_family f)
{
    const tc_family_def *d = tc_family(f);
    if (!d || !d->calls_open)
        return NULL;
    return d->trigger ? d->trigger : d->markers[0];
}

/* s as GBNF: literals, with each control piece the vocabulary names as a
 * token reference, and (unless exact) each run of whitespace as tc-ws: a
 * model spaces its calls its own way (Qwen writes <tool_call>{"name":...
 * as often as the template's <tool_call>\n{"name": ...), and a grammar
 * that insisted on one spacing would push it off its path. skip_ws: leave
 * out s's leading whitespace (a lazy grammar starts at its trigger). */
static void text_out(tp_buf *b, const char *s, const tp_gnames *names, bool skip_ws, bool exact)
{
    while (skip_ws && (*s == ' ' || *s == '\n'))
        s++;
    char run[256];
    size_t n = 0;
    bool first = true;
#define FLUSH()                                                                                                \
    if (n) {                                                                                                   \
        run[n] = 0;                                                                                            \
        tp_buf_puts(b, first ? "" : " ");                                                                      \
        literal(b, run);                                                                                       \
        first = false;                                                                                         \
        n = 0;                                                                                                 \
    }
    while (*s) {
        const char *hit = NULL;
        for (size_t i = 0; names && names->find && control_pieces[i] && !hit; i++)
            if (!strncmp(s, control_pieces[i], strlen(control_pieces[i])) &&
                names->find(names->ctx, control_pieces[i], strlen(control_pieces[i])) >= 0)
                hit = control_pieces[i];
        if (hit) {
            FLUSH();
            char *ref = tp_grammar_token_ref(hit, strlen(hit), false);
            if (!ref) {
                tp_buf_fail(b, TP_ENOMEM);
                return;
            }
            tp_buf_puts(b, first ? "" : " ");
            tp_buf_puts(b, ref);
            free(ref);
            first = false;
            s += strlen(hit);
            continue;
        }
        if (!exact && (*s == ' ' || *s == '\n')) {
            FLUSH();
            while (*s == ' ' || *s == '\n')
                s++;
            tp_buf_puts(b, first ? "tc-ws" : " tc-ws");
            first = false;
            continue;
        }
        if (n == sizeof run - 1)
            FLUSH();
        run[n++] = *s++;
    }
    FLUSH();
#undef FLUSH
    if (first)
        tp_buf_puts(b, "\"\"");
}

const char *tp_toolcall_grammar_trigger(tp_tc_family f, tp_tcg_from from)
{
    if (from == TP_TCG_LAZY)
        return tp_toolcall_trigger(f);
    if (from == TP_TCG_AFTER_THINK)
        return tc_family(f) && tc_family(f)->think_close ? tc_family(f)->think_close : "</think>";
    return NULL;
}

int tp_toolcall_grammar(tp_tc_family f, const char *tools_json, size_t len, const char *only, bool parallel,
                        tp_tcg_from from, const tp_gnames *names, const tp_jschema_opts *o, char **gbnf, tp_err *err)
{
    bool lazy = from == TP_TCG_LAZY;
    *gbnf = NULL;
    const tc_family_def *d = tc_family(f);
    if (!d || !d->calls_open)
        return tp_err_set(err, TP_EINVAL, "tool_choice: the model's chat template has no tool-call syntax");
    int rc = tp_tools_check(tools_json, len, err);
    if (rc)
        return rc;
    if (lazy && !tp_toolcall_trigger(f))
        return tp_err_set(err, TP_EINVAL, "tool_choice: the %s syntax has no marker a lazy grammar could wait for",
                          d->name);
    cJSON *a = cJSON_ParseWithLength(tools_json, len);
    if (!a)
        return tp_err_set(err, TP_ENOMEM, "out of memory");
    tp_buf b = {0}, rules = {0};
    int i = 0, n = 0;
    tp_buf_puts(&b, "call ::= ");
    for (const cJSON *t = a->child; t; t = t->next, i++) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const char *name = cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring;
        if (only && strcmp(only, name))
            continue;
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        /* no parameters: the call takes an object all the same */
        char *schema = params ? cJSON_PrintUnformatted(params) : strdup("{\"type\": \"object\"}");
        char *g = NULL;
        tp_err e;
        rc = schema ? tp_jschema_to_gbnf(schema, strlen(schema), o, &g, &e) : TP_ENOMEM;
        free(schema);
        if (rc) {
            if (rc == TP_ENOMEM)
                tp_err_set(err, TP_ENOMEM, "out of memory");
            else
                tp_err_set(err, rc, "tools[%d].function.parameters (%s): cannot be enforced under tool_choice: %s", i,
                           name, e.msg);
            goto out;
        }
        char pre[24];
        snprintf(pre, sizeof pre, "f%d-", i);
        renamed(&rules, g, pre);
        tp_buf_puts(&rules, "\n");
        free(g);
        if (n++)
            tp_buf_puts(&b, " | ");
        tp_buf_puts(&b, "(");
        if (d->call_open[0]) {
            text_out(&b, d->call_open, names, false, d->exact_space);
            tp_buf_puts(&b, " ");
        }
        if (d->name_key) {
            char head[192];
            snprintf(head, sizeof head, "\"{\" tc-ws \"\\\"%s\\\"\" tc-ws \":\" tc-ws \"\\\"%s\\\"\" tc-ws \",\" tc-ws "
                     "\"\\\"%s\\\"\" tc-ws \":\" tc-ws ", d->name_key, name, d->args_key);
            tp_buf_puts(&b, head);
        } else {
            /* the name stands outside the JSON (Functionary, DeepSeek R1):
             * the newline after it is the parsers' end of the name */
            literal(&b, name);
            tp_buf_puts(&b, " ");
            text_out(&b, d->name_close, names, false, true);
        }
        tp_buf_puts(&b, " ");
        tp_buf_puts(&b, pre);
        tp_buf_puts(&b, d->name_key ? "root tc-ws \"}\"" : "root");
        if (d->call_close[0]) {
            tp_buf_puts(&b, " ");
            text_out(&b, d->call_close, names, false, d->exact_space);
        }
        tp_buf_puts(&b, ")");
    }
    if (!n) {
        rc = tp_err_set(err, TP_EINVAL, "tool_choice: function '%s' is not one of the offered tools", only);
        goto out;
    }
    tp_buf_puts(&b, "\nroot ::= ");
    if (from == TP_TCG_AFTER_THINK) {
        /* the thinking the prompt opened ends first; the call follows */
        text_out(&b, tp_toolcall_grammar_trigger(f, from), names, false, false);
        tp_buf_puts(&b, " tc-ws ");
    }
    if (lazy && d->recipient_first) {
        /* Functionary v3.2 waits for the >>> that opens a later segment */
        text_out(&b, d->calls_sep, names, false, true);
        tp_buf_puts(&b, " ");
    }
    if (d->calls_open[0]) {
        text_out(&b, d->calls_open, names, lazy || from == TP_TCG_AFTER_THINK, false);
        tp_buf_puts(&b, " ");
    }
    tp_buf_puts(&b, "call");
    if (parallel) {
        tp_buf_puts(&b, " (");
        if (d->calls_sep[0])
            text_out(&b, d->calls_sep, names, false, d->exact_space);
        tp_buf_puts(&b, " call)*");
    }
    if (d->calls_close[0]) {
        tp_buf_puts(&b, " ");
        text_out(&b, d->calls_close, names, false, false);
    }
    /* bounded, so that a model held to a call cannot space forever */
    tp_buf_puts(&b, "\ntc-ws ::= [ \\t\\n]{0,4}\n");
    tp_buf_add(&b, rules.data ? rules.data : "", rules.len);
    if (b.err || rules.err)
        rc = tp_err_set(err, TP_ENOMEM, "out of memory");
    else if (b.len > (o ? o->max_gbnf_bytes : TP_JSCHEMA_DEF_MAX_GBNF_BYTES))
        rc = tp_err_set(err, TP_ERANGE, "tools: the grammar of a call is %zu bytes, over the limit of %zu", b.len,
                        (size_t)(o ? o->max_gbnf_bytes : TP_JSCHEMA_DEF_MAX_GBNF_BYTES));
out:
    cJSON_Delete(a);
    free(rules.data);
    if (rc)
        free(b.data);
    else
        *gbnf = b.data;
    return rc;
}
