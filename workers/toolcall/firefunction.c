/* Firefunction v2: " functools[{"name": "f", "arguments": {...}}, ...]" (no
 * closing marker). */
#include "tc_internal.h"

static const char *const open_m[] = {"functools[", NULL};
static const char *const name_k[] = {"name", NULL};
static const char *const args_k[] = {"arguments", "parameters", NULL};

static int parse(const char *s, size_t n, tc_out *o)
{
    size_t i = 9;   /* at the '[' */
    size_t v = tc_call_array(o, s + i, n - i, name_k, args_k);
    if (!v)
        return -1;
    i += v;
    i += tc_ws(s + i, n - i);
    tcb_put(&o->content, s + i, n - i);
    return 0;
}

const tc_family_def tc_firefunction_v2 = {.name = "firefunction_v2", .markers = open_m, .parse = parse};
