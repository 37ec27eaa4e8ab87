/* Hermes 2/3 and Qwen 2.5/3: each call is
 *   <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
 * (several in a row for parallel calls), text may come before and after. */
#include "tc_internal.h"

static const char *const open_m[] = {"<tool_call>", NULL};
static const char *const name_k[] = {"name", NULL};
static const char *const args_k[] = {"arguments", "parameters", NULL};

static int parse(const char *s, size_t n, tc_out *o)
{
    size_t i = 0;
    while (i < n) {
        const char *at = tc_find(s + i, n - i, "<tool_call>");
        if (!at) {
            tp_buf_add(&o->content, s + i, n - i);
            break;
        }
        tp_buf_add(&o->content, s + i, (size_t)(at - (s + i)));
        i = (size_t)(at - s) + 11;
        i += tc_ws(s + i, n - i);
        size_t v = tc_json_span(s + i, n - i);
        if (!v || !tc_call_object(o, s + i, v, name_k, args_k))
            return -1;
        i += v;
        i += tc_ws(s + i, n - i);
        if (tc_starts(s + i, n - i, "</tool_call>"))
            i += 12;
        else if (i < n)
            return -1;   /* an unclosed call is one only at the very end (a stop at the close tag) */
        i += tc_ws(s + i, n - i);
    }
    return 0;
}

const tc_family_def tc_hermes = {.name = "hermes", .detect_all = open_m, .markers = open_m, .parse = parse,
    .calls_open = "", .calls_sep = "\n", .calls_close = "", .call_open = "<tool_call>\n", .call_close = "\n</tool_call>", .name_key = "name", .args_key = "arguments"};
