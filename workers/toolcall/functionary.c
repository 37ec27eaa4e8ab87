/* Functionary (MeetKai).
 * v3.1 (Llama 3.1 based): <function=NAME>{...}</function>, several in a
 *   row; <|python_tag|>code for the python tool.
 * v3.2: the generation prompt ends in ">>>", so the output starts with a
 *   recipient line: "all\n" then text, or "NAME\n" then the arguments;
 *   further segments start with ">>>" again. */
#include <string.h>

#include "tc_internal.h"

static const char *const v31_m[] = {"<function=", "<|python_tag|>", NULL};
static const char *const args_k[] = {"arguments", "parameters", NULL};

static int parse_v31(const char *s, size_t n, tc_out *o)
{
    size_t i = 0;
    while (i < n) {
        const char *f = tc_find(s + i, n - i, "<function=");
        const char *py = tc_find(s + i, n - i, "<|python_tag|>");
        if (py && (!f || py < f)) {
            tp_buf_add(&o->content, s + i, (size_t)(py - (s + i)));
            size_t at = (size_t)(py - s) + 14;
            return tc_python_tag(s + at, n - at, o, args_k);
        }
        if (!f) {
            tp_buf_add(&o->content, s + i, n - i);
            break;
        }
        tp_buf_add(&o->content, s + i, (size_t)(f - (s + i)));
        i = (size_t)(f - s) + 10;
        const char *gt = memchr(s + i, '>', n - i);
        if (!gt || gt == s + i)
            return -1;
        size_t name0 = i, name_len = (size_t)(gt - (s + i));
        i += name_len + 1;
        size_t v = tc_json_span(s + i, n - i);
        if (!v || s[i] != '{' || tc_add_call(o, s + name0, name_len, s + i, v))
            return -1;
        i += v;
        if (tc_starts(s + i, n - i, "</function>"))
            i += 11;
        else if (i + tc_ws(s + i, n - i) < n)
            return -1;
    }
    return 0;
}

static const char *const v32_m[] = {">>>", NULL};

static int parse_v32(const char *s, size_t n, tc_out *o)
{
    size_t i = 0;
    while (i < n) {
        if (tc_starts(s + i, n - i, ">>>"))
            i += 3;
        const char *nl = memchr(s + i, '\n', n - i);
        if (!nl)
            return -1;
        size_t r0 = i, rlen = (size_t)(nl - (s + i));
        i += rlen + 1;
        const char *next = tc_find(s + i, n - i, ">>>");
        size_t end = next ? (size_t)(next - s) : n;
        if (rlen == 3 && !memcmp(s + r0, "all", 3)) {
            tp_buf_add(&o->content, s + i, end - i);
        } else if (rlen == 6 && !memcmp(s + r0, "python", 6)) {
            if (tc_python_tag(s + i, end - i, o, args_k))
                return -1;
        } else {
            size_t w = tc_ws(s + i, end - i);
            size_t v = tc_json_span(s + i + w, end - i - w);
            if (!rlen || !v || s[i + w] != '{' || i + w + v + tc_ws(s + i + w + v, end - i - w - v) != end ||
                tc_add_call(o, s + r0, rlen, s + i + w, v))
                return -1;
        }
        i = end;
    }
    return 0;
}

static const char *const v31_detect[] = {"<function=", "<|start_header_id|>", NULL};
static const char *const v32_detect[] = {">>>all", NULL};

const tc_family_def tc_functionary_v31 = {
    .name = "functionary_v3.1", .detect_all = v31_detect, .markers = v31_m, .parse = parse_v31, .calls_open = "", .calls_sep = "",
    .calls_close = "", .call_open = "<function=", .name_close = ">", .call_close = "</function>"};
const tc_family_def tc_functionary_v32 = {
    .name = "functionary_v3.2", .detect_all = v32_detect, .markers = v32_m, .recipient_first = true, .parse = parse_v32, .calls_open = "",
    .calls_sep = ">>>", .calls_close = "", .call_open = "", .name_close = "\n", .call_close = ""};
