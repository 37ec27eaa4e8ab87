/* Structured output at admission (grammar_admit.h). */
#include "grammar_admit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/grammar.h"
#include "tokpipe/jschema.h"

int grammar_admit(const tp_config *c, const tp_params *p, char **gbnf, char *field, size_t cap, tp_err *err)
{
    *gbnf = NULL;
    const char *key = NULL;
    int rc = 0;
    tp_err e;
    tp_err_clear(&e);
    if ((p->set & TP_P_JSON_SCHEMA) && p->json_schema.ptr) {
        key = "json_schema";
        tp_jschema_opts o;
        tp_jschema_opts_default(&o);
        o.max_schema_bytes = (size_t)c->schema_max_bytes;
        o.max_depth = c->schema_max_depth;
        o.max_gbnf_bytes = (size_t)c->grammar_max_bytes;
        rc = tp_jschema_to_gbnf(p->json_schema.ptr, p->json_schema.len, &o, gbnf, &e);
    } else if ((p->set & TP_P_JSON_MODE) && p->json_mode) {
        key = "json_mode";
        rc = tp_jschema_json_mode_gbnf(gbnf, &e);
    } else if ((p->set & TP_P_GRAMMAR) && p->grammar.ptr) {
        key = "grammar";
        if (!(*gbnf = strndup(p->grammar.ptr, p->grammar.len)))
            rc = tp_err_set(&e, TP_ENOMEM, "out of memory");
        else if (strlen(*gbnf) != p->grammar.len)
            rc = tp_err_set(&e, TP_EINVAL, "a NUL byte in the grammar");
    } else
        return 0;
    if (!rc) {
        tp_grammar_limits gl;
        tp_config_grammar_limits(c, &gl, NULL);
        tp_grammar *g = NULL;
        rc = tp_grammar_compile(*gbnf, strlen(*gbnf), &gl, &g, &e);
        tp_grammar_free(g);
    }
    if (rc) {
        free(*gbnf);
        *gbnf = NULL;
        snprintf(field, cap, "params.%s", key);
        return tp_err_set(err, rc == TP_ENOMEM ? TP_ENOMEM : rc == TP_ERANGE ? TP_ERANGE : TP_EINVAL, "params.%s: %s",
                          key, e.msg);
    }
    return 0;
}
