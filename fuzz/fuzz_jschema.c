/* libFuzzer target: the JSON Schema -> GBNF compiler. Property: any input
 * either compiles to NUL-terminated GBNF within the output limit, starting
 * with the root rule, or is refused with a message, and the GBNF always reads back through the engine's
 * compiler (a limit aside); never a crash, a hang
 * or unbounded memory (small limits keep each run short). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/jschema.h"
#include "gbnf_out.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tp_jschema_opts o;
    tp_jschema_opts_default(&o);
    o.max_schema_bytes = 1 << 16;
    o.max_depth = 24;
    o.max_gbnf_bytes = 1 << 18;
    char *g = NULL;
    tp_err err = {0};
    int rc = tp_jschema_to_gbnf((const char *)data, size, &o, &g, &err);
    check_gbnf_out(rc, g, &err, o.max_gbnf_bytes);
    return 0;
}
