/* libFuzzer target: the regex -> GBNF compiler (JSON Schema `pattern`).
 * Property: any input compiles to GBNF within the limits or is refused
 * with a message (the GBNF reads back through the engine's compiler); the exploding forms ((a{1000}){1000}) are refused by the
 * expansion bound, never expanded. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/jschema.h"
#include "gbnf_out.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tp_jschema_opts o;
    tp_jschema_opts_default(&o);
    o.max_schema_bytes = 4096;
    o.max_depth = 32;
    o.max_gbnf_bytes = 1 << 18;
    char *g = NULL;
    tp_err err = {0};
    int rc = tp_regex_to_gbnf((const char *)data, size, &o, &g, &err);
    check_gbnf_out(rc, g, &err, o.max_gbnf_bytes);
    return 0;
}
