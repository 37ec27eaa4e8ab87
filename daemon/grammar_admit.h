/* Structured output at admission: the one place the broker looks at a
 * job's grammar, JSON schema or JSON mode. */
#ifndef TOKPIPE_DAEMON_GRAMMAR_ADMIT_H
#define TOKPIPE_DAEMON_GRAMMAR_ADMIT_H

#include "tokpipe/config.h"
#include "tokpipe/error.h"
#include "tokpipe/protocol.h"

/* If p asks for a constraint (grammar, json_schema, json_mode: true),
 * *gbnf gets the GBNF text the sample stage will apply (json_schema and
 * json_mode compiled to GBNF here), malloc'd, caller frees; the text is
 * compiled once with the engine, under c's grammar.* limits, so a bad
 * schema or grammar is refused now, before any token. No constraint: 0
 * and *gbnf NULL. Failure: TP_EINVAL/TP_ERANGE, err says what is wrong and
 * field (cap bytes) names the key, e.g. "params.json_schema". */
int grammar_admit(const tp_config *c, const tp_params *p, char **gbnf, char *field, size_t cap, tp_err *err);

#endif
