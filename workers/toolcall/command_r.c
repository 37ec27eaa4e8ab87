/* Cohere Command R.
 * R7B: <|START_ACTION|>[{"tool_call_id": "0", "tool_name": "f", "parameters": {...}}, ...]<|END_ACTION|>;
 *   its answer sits in <|START_RESPONSE|>...<|END_RESPONSE|> (dropped from
 *   the content) and its thinking in <|START_THINKING|>...<|END_THINKING|>.
 * R+ (tool_use template): Action: ```json\n[{"tool_name": "f", "parameters": {...}}]\n```
 *   where the tool "directly_answer" means no call. */
#include <string.h>

#include "tc_internal.h"

static const char *const r7b_m[] = {"<|START_ACTION|>", NULL};
static const char *const r7b_strip[] = {"<|START_RESPONSE|>", "<|END_RESPONSE|>", NULL};
static const char *const name_k[] = {"tool_name", "name", NULL};
static const char *const args_k[] = {"parameters", "arguments", NULL};

static int parse_r7b(const char *s, size_t n, tc_out *o)
{
    return tc_marker_array(s, n, 16, "<|END_ACTION|>", o, name_k, args_k);
}

static const char *const rplus_m[] = {"Action:", NULL};

static int parse_rplus(const char *s, size_t n, tc_out *o)
{
    size_t i = 7 + tc_ws(s + 7, n - 7);
    if (!tc_starts(s + i, n - i, "```json") || tc_marker_array(s, n, i + 7, "```", o, name_k, args_k))
        return -1;
    /* the template's own way of saying "no tool": not a call */
    size_t k = 0;
    for (size_t c = 0; c < o->n_calls; c++)
        if (strcmp(o->calls[c].name, "directly_answer") && strcmp(o->calls[c].name, "directly-answer"))
            o->calls[k++] = o->calls[c];
        else
            tc_call_release(&o->calls[c]);
    o->n_calls = k;
    return 0;
}

static const char *const rplus_detect_all[] = {"Action:", "tool_name", NULL};
static const char *const rplus_detect_any[] = {"directly-answer", "directly_answer", NULL};

const tc_family_def tc_command_r7b = {
    .name = "command_r7b", .detect_all = r7b_m, .think_open = "<|START_THINKING|>",
    .think_close = "<|END_THINKING|>", .markers = r7b_m, .strip = r7b_strip, .parse = parse_r7b,
    .calls_open = "<|START_ACTION|>[", .calls_sep = ", ", .calls_close = "]<|END_ACTION|>", .call_open = "",
    .call_close = "", .name_key = "tool_name", .args_key = "parameters"};
const tc_family_def tc_command_r_plus = {
    .name = "command_r_plus", .detect_all = rplus_detect_all, .detect_any = rplus_detect_any, .markers = rplus_m, .parse = parse_rplus, .calls_open = "Action: ```json\n[",
    .calls_sep = ", ", .calls_close = "]\n```", .call_open = "", .call_close = "", .name_key = "tool_name",
    .args_key = "parameters"};
