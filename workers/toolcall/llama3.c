/* Llama 3.1-3.3: a call is the whole answer, a JSON object
 *   {"name": "f", "parameters": {...}}   (3.1 also "type": "function")
 * several separated by ';' for parallel calls; or, for the built-in tools
 * and code, <|python_tag|> followed by NAME.call(k=v, ...), a JSON call, or
 * Python code (the "python" tool, {"code": ...}). */
#include <stdlib.h>
#include <string.h>

#include "tc_internal.h"

static const char *const open_m[] = {"<|python_tag|>", NULL};
static const char *const name_k[] = {"name", NULL};
static const char *const args_k[] = {"parameters", "arguments", NULL};

static bool ident(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* NAME.call(k="v", n=1, ...) -> {"k": "v", "n": 1}: Python literals a
 * built-in call uses (strings in either quotes, numbers, True/False). */
static int builtin_call(const char *s, size_t n, tc_out *o)
{
    size_t i = 0;
    while (i < n && ident(s[i]))
        i++;
    size_t name_len = i;
    if (!name_len || !tc_starts(s + i, n - i, ".call("))
        return -1;
    i += 6;
    tp_buf a = {0};
    tp_buf_add(&a, "{", 1);
    bool first = true;
    for (;;) {
        while (i < n && s[i] == ' ')
            i++;
        if (i < n && s[i] == ')')
            break;
        size_t k0 = i;
        while (i < n && ident(s[i]))
            i++;
        if (i == k0 || i >= n || s[i] != '=')
            goto bad;
        if (!first)
            tp_buf_add(&a, ", ", 2);
        first = false;
        tp_buf_json_str(&a, s + k0, i - k0);
        tp_buf_add(&a, ": ", 2);
        i++;
        if (i < n && (s[i] == '"' || s[i] == '\'')) {
            char q = s[i++];
            size_t v0 = i;
            while (i < n && s[i] != q)
                i += s[i] == '\\' ? 2 : 1;
            if (i >= n)
                goto bad;
            tp_buf_json_str(&a, s + v0, i - v0);
            i++;
        } else if (tc_starts(s + i, n - i, "True") || tc_starts(s + i, n - i, "False")) {
            bool t = s[i] == 'T';
            tp_buf_add(&a, t ? "true" : "false", t ? 4 : 5);
            i += t ? 4 : 5;
        } else {
            size_t v = tc_json_span(s + i, n - i);
            if (!v || (s[i] != '-' && (s[i] < '0' || s[i] > '9')))
                goto bad;
            tp_buf_add(&a, s + i, v);
            i += v;
        }
        while (i < n && s[i] == ' ')
            i++;
        if (i < n && s[i] == ',')
            i++;
    }
    i++;
    if (i + tc_ws(s + i, n - i) != n)
        goto bad;
    tp_buf_add(&a, "}", 1);
    int rc = a.err ? -1 : tc_add_call(o, s, name_len, a.data, a.len);
    tp_buf_free(&a);
    return rc;
bad:
    tp_buf_free(&a);
    return -1;
}

int tc_python_tag(const char *s, size_t n, tc_out *o, const char *const *args_keys)
{
    size_t i = tc_ws(s, n);
    size_t v = tc_json_span(s + i, n - i);
    if (v && s[i] == '{' && i + v + tc_ws(s + i + v, n - i - v) == n && tc_call_object(o, s + i, v, name_k, args_keys))
        return 0;
    if (!builtin_call(s + i, n - i, o))
        return 0;
    /* code for the python tool */
    size_t end = n;
    while (end > i && (s[end - 1] == ' ' || s[end - 1] == '\n'))
        end--;
    if (end == i)
        return -1;
    tp_buf a = {0};
    tp_buf_add(&a, "{\"code\": ", 9);
    tp_buf_json_str(&a, s + i, end - i);
    tp_buf_add(&a, "}", 1);
    int rc = a.err ? -1 : tc_add_call(o, "python", 6, a.data, a.len);
    tp_buf_free(&a);
    return rc;
}

static int parse(const char *s, size_t n, tc_out *o)
{
    if (tc_starts(s, n, "<|python_tag|>"))
        return tc_python_tag(s + 14, n - 14, o, args_k);
    size_t i = 0;
    while (i < n) {
        i += tc_ws(s + i, n - i);
        size_t v = tc_json_span(s + i, n - i);
        if (!v || s[i] != '{' || !tc_call_object(o, s + i, v, name_k, args_k))
            return -1;
        i += v;
        i += tc_ws(s + i, n - i);
        if (i < n && s[i] == ';')
            i++;
        i += tc_ws(s + i, n - i);
    }
    return o->n_calls ? 0 : -1;
}

static const char *const detect_all[] = {"<|start_header_id|>", "tools", NULL};
static const char *const detect_any[] = {"<|python_tag|>", "ipython", NULL};

/* The trigger's space: whatever whitespace the call grammar's tc-ws lets
 * in after its "{". */
const tc_family_def tc_llama3 = {.name = "llama3", .detect_all = detect_all, .detect_any = detect_any,
    .markers = open_m, .json_at_start = true, .parse = parse, .trigger = "{ \"name\"",
    .calls_open = "", .calls_sep = "; ", .calls_close = "", .call_open = "", .call_close = "", .name_key = "name", .args_key = "parameters"};
