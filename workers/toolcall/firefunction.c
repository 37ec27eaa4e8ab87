/* Firefunction v2: " functools[{"name": "f", "arguments": {...}}, ...]" (no
 * closing marker). */
#include "tc_internal.h"

static const char *const open_m[] = {"functools[", NULL};
static const char *const name_k[] = {"name", NULL};
static const char *const args_k[] = {"arguments", "parameters", NULL};

static int parse(const char *s, size_t n, tc_out *o)
{
    return tc_marker_array(s, n, 9, NULL, o, name_k, args_k);   /* from the '[' */
}

const tc_family_def tc_firefunction_v2 = {.name = "firefunction_v2", .detect_all = open_m, .markers = open_m,
    .parse = parse, .tools_as_functions = true,
    .calls_open = " functools[", .calls_sep = ", ", .calls_close = "]", .call_open = "", .call_close = "", .name_key = "name", .args_key = "arguments"};
