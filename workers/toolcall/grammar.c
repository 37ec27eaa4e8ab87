/* The GBNF of "a valid call of one of the offered functions" in a family's
 * syntax (tp_toolcall_grammar): what tool_choice required / a named
 * function holds the output to from its first token. */
#include <cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tc_internal.h"
#include "tokpipe/jschema.h"

typedef struct gbuf {
    char *p;
    size_t n, cap;
    bool oom;
} gbuf;

static void put(gbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void puts_(gbuf *b, const char *s)
{
    put(b, s, strlen(s));
}

/* s as a GBNF string literal (markers hold newlines and quotes). */
static void literal(gbuf *b, const char *s)
{
    put(b, "\"", 1);
    for (; *s; s++) {
        if (*s == '\n')
            puts_(b, "\\n");
        else if (*s == '"' || *s == '\\') {
            put(b, "\\", 1);
            put(b, s, 1);
        } else
            put(b, s, 1);
    }
    put(b, "\"", 1);
}

static bool word_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Copy the GBNF g with every rule name (definitions and references) given
 * prefix pre, so that each function's schema rules (all of them named
 * root, string, ... by the compiler) live side by side. Literals, classes,
 * repetition counts and comments are copied as they are. */
static void renamed(gbuf *b, const char *g, const char *pre)
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
            put(b, s, (size_t)(t - s));
            s = t;
        } else if (c == '{' || c == '#') {
            const char *t = s;
            while (*t && *t != (c == '{' ? '}' : '\n'))
                t++;
            put(b, s, (size_t)(t - s));
            s = t;
        } else if (word_char(c)) {
            const char *t = s;
            while (word_char(*t))
                t++;
            puts_(b, pre);
            put(b, s, (size_t)(t - s));
            s = t;
        } else {
            put(b, s, 1);
            s++;
        }
    }
}

/* A family can be held to a call when its markers are text: a marker that
 * is a control token ([TOOL_CALLS], <|python_tag|>, ...) has no bytes, and
 * the grammar engine never allows a token without bytes. Llama 3.x's plain
 * JSON call needs no marker. */
static bool enforceable(tp_tc_family f)
{
    return f == TP_TC_HERMES || f == TP_TC_LLAMA3 || f == TP_TC_GENERIC;
}

int tp_toolcall_grammar(tp_tc_family f, const char *tools_json, size_t len, const char *only, bool parallel,
                        const tp_jschema_opts *o, char **gbnf, tp_err *err)
{
    *gbnf = NULL;
    const tc_family_def *d = tc_family(f);
    if (!d || !d->calls_open)
        return tp_err_set(err, TP_EINVAL, "tool_choice: the model's chat template has no tool-call syntax");
    int rc = tp_tools_check(tools_json, len, err);
    if (rc)
        return rc;
    if (!enforceable(f))
        return tp_err_set(err, TP_EINVAL,
                          "tool_choice: a constrained call in the %s syntax is not enforced (its call marker is a "
                          "control token the grammar engine cannot emit); use \"auto\" or \"none\"",
                          d->name);
    cJSON *a = cJSON_ParseWithLength(tools_json, len);
    if (!a)
        return tp_err_set(err, TP_ENOMEM, "out of memory");
    gbuf b = {0}, rules = {0};
    int i = 0, n = 0;
    puts_(&b, "call ::= ");
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
        puts_(&rules, "\n");
        free(g);
        if (n++)
            puts_(&b, " | ");
        puts_(&b, "(");
        if (d->call_open[0]) {
            literal(&b, d->call_open);
            puts_(&b, " ");
        }
        char head[160];
        snprintf(head, sizeof head, "{\"%s\": \"%s\", \"%s\": ", d->name_key, name, d->args_key);
        literal(&b, head);
        puts_(&b, " ");
        puts_(&b, pre);
        puts_(&b, "root \"}\"");
        if (d->call_close[0]) {
            puts_(&b, " ");
            literal(&b, d->call_close);
        }
        puts_(&b, ")");
    }
    if (!n) {
        rc = tp_err_set(err, TP_EINVAL, "tool_choice: function '%s' is not one of the offered tools", only);
        goto out;
    }
    puts_(&b, "\nroot ::= ");
    if (d->calls_open[0]) {
        literal(&b, d->calls_open);
        puts_(&b, " ");
    }
    puts_(&b, "call");
    if (parallel) {
        puts_(&b, " (");
        literal(&b, d->calls_sep);
        puts_(&b, " call)*");
    }
    if (d->calls_close[0]) {
        puts_(&b, " ");
        literal(&b, d->calls_close);
    }
    puts_(&b, "\n");
    put(&b, rules.p ? rules.p : "", rules.n);
    if (b.oom || rules.oom)
        rc = tp_err_set(err, TP_ENOMEM, "out of memory");
    else if (b.n > (o ? o->max_gbnf_bytes : TP_JSCHEMA_DEF_MAX_GBNF_BYTES))
        rc = tp_err_set(err, TP_ERANGE, "tools: the grammar of a call is %zu bytes, over the limit of %zu", b.n,
                        (size_t)(o ? o->max_gbnf_bytes : TP_JSCHEMA_DEF_MAX_GBNF_BYTES));
out:
    cJSON_Delete(a);
    free(rules.p);
    if (rc)
        free(b.p);
    else
        *gbnf = b.p;
    return rc;
}
