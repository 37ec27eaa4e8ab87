#include "tokpipe/jschema.h"

#include <stdlib.h>

void tp_jschema_opts_default(tp_jschema_opts *o)
{
    o->max_schema_bytes = TP_JSCHEMA_DEF_MAX_SCHEMA_BYTES;
    o->max_depth = TP_JSCHEMA_DEF_MAX_DEPTH;
    o->max_gbnf_bytes = TP_JSCHEMA_DEF_MAX_GBNF_BYTES;
}

int tp_jschema_to_gbnf(const char *schema_json, size_t len, const tp_jschema_opts *o, char **gbnf,
                       tp_err *err)
{
    (void)schema_json, (void)len, (void)o;
    *gbnf = NULL;
    return tp_err_set(err, TP_EINVAL, "json schema: not yet implemented");
}

int tp_jschema_json_mode_gbnf(char **gbnf, tp_err *err)
{
    *gbnf = NULL;
    return tp_err_set(err, TP_EINVAL, "json mode: not yet implemented");
}

int tp_regex_to_gbnf(const char *re, size_t len, const tp_jschema_opts *o, char **gbnf,
                     tp_err *err)
{
    (void)re, (void)len, (void)o;
    *gbnf = NULL;
    return tp_err_set(err, TP_EINVAL, "regex: not yet implemented");
}
