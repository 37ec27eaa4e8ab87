/* The property both GBNF-writing fuzz targets check (fuzz_jschema,
 * fuzz_regex): a refusal carries a message and no text; a success is GBNF
 * within the byte limit, starting at root, that the engine's compiler reads
 * back, stopped by nothing but a limit. Takes ownership of g. */
#ifndef TOKPIPE_FUZZ_GBNF_OUT_H
#define TOKPIPE_FUZZ_GBNF_OUT_H

#include <stdlib.h>
#include <string.h>

#include "tokpipe/grammar.h"

static void check_gbnf_out(int rc, char *g, tp_err *err, size_t max_gbnf_bytes)
{
    if (rc) {
        if (g || !err->msg[0]) __builtin_trap();
        return;
    }
    if (!g || strncmp(g, "root ::= ", 9) || strlen(g) > max_gbnf_bytes) __builtin_trap();
    tp_grammar_limits gl;
    tp_grammar_limits_default(&gl);
    gl.max_compile_ms = 600000;
    gl.max_bytes = max_gbnf_bytes;
    tp_grammar *gr = NULL;
    rc = tp_grammar_compile(g, strlen(g), &gl, &gr, err);
    if (rc && rc != TP_ERANGE) __builtin_trap();
    tp_grammar_free(gr);
    free(g);
}

#endif
