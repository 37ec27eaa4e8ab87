/* libFuzzer target: the regex -> GBNF compiler (JSON Schema `pattern`).
 * Property: any input compiles to GBNF within the limits or is refused
 * with a message (the GBNF reads back through the engine's compiler); the exploding forms ((a{1000}){1000}) are refused by the
 * expansion bound, never expanded. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/grammar.h"
#include "tokpipe/jschema.h"

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
    if (rc) {
        if (g || !err.msg[0]) __builtin_trap();
        return 0;
    }
    if (!g || strncmp(g, "root ::= ", 9) || strlen(g) > o.max_gbnf_bytes) __builtin_trap();
    /* what it writes is GBNF the engine reads: only a limit may stop it */
    tp_grammar_limits gl;
    tp_grammar_limits_default(&gl);
    gl.max_compile_ms = 600000;
    gl.max_bytes = o.max_gbnf_bytes;
    tp_grammar *gr = NULL;
    rc = tp_grammar_compile(g, strlen(g), &gl, &gr, &err);
    if (rc && rc != TP_ERANGE) __builtin_trap();
    tp_grammar_free(gr);
    free(g);
    return 0;
}
