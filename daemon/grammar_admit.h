/* Structured output at admission: the one place the broker looks at a
 * job's grammar, JSON schema or JSON mode. */
#ifndef TOKPIPE_DAEMON_GRAMMAR_ADMIT_H
#define TOKPIPE_DAEMON_GRAMMAR_ADMIT_H

#include "tokpipe/config.h"
#include "tokpipe/error.h"
#include "tokpipe/grammar.h"
#include "tokpipe/protocol.h"
#include "tokpipe/toolcall.h"

/* The GBNF texts admission compiled and found good, by hash, so that a
 * schema or grammar many jobs send (an agent's tool set, an app's
 * response format) is compiled once by the broker, as each worker keeps
 * one engine per distinct text (tp_gcache). Two independent 64-bit hashes
 * and the length name a text; a ring forgets the oldest. Zeroed = empty;
 * forget it when the model's vocabulary may have changed (token
 * references are checked against it). */
#define GRAMMAR_MEMO_SIZE 256
typedef struct grammar_memo {
    struct { uint64_t h1, h2; size_t len; } e[GRAMMAR_MEMO_SIZE];
    size_t next;
    uint64_t hits, compiles;   /* what admission did, for tests */
} grammar_memo;

/* If p asks for a constraint (grammar, json_schema, json_mode: true),
 * *gbnf gets the GBNF text the sample stage will apply (json_schema and
 * json_mode compiled to GBNF here), malloc'd, caller frees; the text is
 * compiled once with the engine, under c's grammar.* limits, so a bad
 * schema or grammar is refused now, before any token; its token
 * references (<|name|>, <[id]>) must resolve against names (the model's
 * vocabulary size and the special tokens INFO lists). No constraint: 0
 * and *gbnf NULL. Failure: TP_EINVAL/TP_ERANGE, err says what is wrong and
 * field (cap bytes) names the key, e.g. "params.json_schema". */
int grammar_admit(const tp_config *c, const tp_gnames *names, grammar_memo *memo, const tp_params *p, char **gbnf,
                  char *field, size_t cap, tp_err *err);

/* tool_choice "required" / "function" of SUBMIT s: *gbnf the grammar of a
 * call (of tool_choice_name only, for "function") in syntax f, compiled
 * once under c's limits like any other. Another constraint in the same
 * job, an unknown name or a schema the compiler refuses: TP_EINVAL naming
 * it, field set. "auto" (or none given): the same grammar from the
 * syntax's trigger on, *trigger that text (static), where it can be held
 * (a marker to wait for, no constraint of the job's own, schemas the
 * compiler takes), else nothing: auto is never refused. think_open (the
 * template's prompt opens the thinking): required / named hold the
 * output from the thinking's end on (*trigger </think>). "none": 0, *gbnf
 * NULL. */
int grammar_admit_tools(const tp_config *c, const tp_gnames *names, grammar_memo *memo, tp_tc_family f,
                        bool think_open, const tp_m_submit *s, char **gbnf, const char **trigger, char *field,
                        size_t cap, tp_err *err);

#endif
