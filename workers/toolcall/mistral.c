/* Mistral Nemo: [TOOL_CALLS][{"name": "f", "arguments": {...}, "id": "a1b2c3d4e"}, ...]
 * The template refuses call ids that are not 9 characters: ids are made so. */
#include "tc_internal.h"

static const char *const open_m[] = {"[TOOL_CALLS]", NULL};
static const char *const name_k[] = {"name", NULL};
static const char *const args_k[] = {"arguments", "parameters", NULL};

static int parse(const char *s, size_t n, tc_out *o)
{
    return tc_marker_array(s, n, 12, NULL, o, name_k, args_k);
}

const tc_family_def tc_mistral = {.name = "mistral", .detect_all = open_m, .markers = open_m, .parse = parse, .id_len = 9,
    .calls_open = "[TOOL_CALLS][", .calls_sep = ", ", .calls_close = "]", .call_open = "", .call_close = "", .name_key = "name", .args_key = "arguments"};
