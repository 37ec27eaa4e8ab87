/* The fallback for templates that take tools but show no syntax of their
 * own (llama.cpp's "generic" format): the answer is one JSON object,
 *   {"tool_calls": [{"name": "f", "arguments": {...}}, ...]}
 *   {"tool_call": {"name": "f", "arguments": {...}}}
 *   {"name": "f", "arguments": {...}}
 *   {"response": "plain text"}     (content, no call) */
#include <stdlib.h>

#include "tc_internal.h"

static const char *const name_k[] = {"name", NULL};
static const char *const args_k[] = {"arguments", "parameters", NULL};

static int parse(const char *s, size_t n, tc_out *o)
{
    size_t i = tc_ws(s, n);
    size_t v = tc_json_span(s + i, n - i);
    if (!v || s[i] != '{' || i + v + tc_ws(s + i + v, n - i - v) != n)
        return -1;
    const char *m;
    size_t mn;
    if (tc_json_member(s + i, v, "tool_calls", &m, &mn))
        return tc_call_array(o, m, mn, name_k, args_k) ? 0 : -1;
    if (tc_json_member(s + i, v, "tool_call", &m, &mn))
        return tc_call_object(o, m, mn, name_k, args_k) ? 0 : -1;
    if (tc_json_member(s + i, v, "response", &m, &mn) && m[0] == '"') {
        size_t len;
        char *t = tc_json_string(m, mn, &len);
        if (!t)
            return -1;
        tp_buf_add(&o->content, t, len);
        free(t);
        return 0;
    }
    return tc_call_object(o, s + i, v, name_k, args_k) ? 0 : -1;
}

static const char *const detect_m[] = {"tools", NULL};

/* The lazy grammar's trigger is exact: its grammar spells calls_open so. */
const tc_family_def tc_generic = {.name = "generic", .detect_all = detect_m, .json_at_start = true, .parse = parse,
    .trigger = "{\"tool_calls\"",
    .calls_open = "{\"tool_calls\": [", .calls_sep = ", ", .calls_close = "]}", .call_open = "", .call_close = "", .name_key = "name", .args_key = "arguments"};
