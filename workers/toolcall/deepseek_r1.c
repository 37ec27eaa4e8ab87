/* DeepSeek R1:
 *   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜>
 *   (more calls, each on its own line) <｜tool▁calls▁end｜>
 * after its <think>...</think>. */
#include <string.h>

#include "tc_internal.h"

#define CALLS_BEGIN TC_DS_CALLS_BEGIN
#define CALLS_END TC_DS_CALLS_END
#define CALL_BEGIN TC_DS_CALL_BEGIN
#define CALL_END TC_DS_CALL_END
#define SEP TC_DS_SEP

static const char *const open_m[] = {CALLS_BEGIN, NULL};

static int parse(const char *s, size_t n, tc_out *o)
{
    size_t i = strlen(CALLS_BEGIN);
    for (;;) {
        i += tc_ws(s + i, n - i);
        if (!tc_starts(s + i, n - i, CALL_BEGIN))
            break;
        i += strlen(CALL_BEGIN);
        const char *sep = tc_find(s + i, n - i, SEP);
        if (!sep)
            return -1;
        i = (size_t)(sep - s) + strlen(SEP);
        const char *nl = memchr(s + i, '\n', n - i);
        if (!nl || nl == s + i)
            return -1;
        size_t name0 = i, name_len = (size_t)(nl - (s + i));
        i += name_len + 1;
        if (!tc_starts(s + i, n - i, "```json"))
            return -1;
        i += 7;
        i += tc_ws(s + i, n - i);
        size_t v = tc_json_span(s + i, n - i);
        if (!v || s[i] != '{' || tc_add_call(o, s + name0, name_len, s + i, v))
            return -1;
        i += v;
        i += tc_ws(s + i, n - i);
        if (tc_starts(s + i, n - i, "```"))
            i += 3;
        i += tc_ws(s + i, n - i);
        if (tc_starts(s + i, n - i, CALL_END))
            i += strlen(CALL_END);
        else if (i < n)
            return -1;
    }
    if (!o->n_calls)
        return -1;
    if (tc_starts(s + i, n - i, CALLS_END))
        i += strlen(CALLS_END);
    else if (i < n)
        return -1;
    tp_buf_add(&o->content, s + i, n - i);
    return 0;
}

const tc_family_def tc_deepseek_r1 = {
    .name = "deepseek_r1", .detect_all = open_m, .markers = open_m, .parse = parse, .calls_open = CALLS_BEGIN, .calls_sep = "\n",
    .calls_close = CALLS_END, .call_open = CALL_BEGIN "function" SEP, .name_close = "\n```json\n",
    .call_close = "\n```" CALL_END};
