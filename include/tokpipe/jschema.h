/* JSON Schema, JSON mode and regex -> GBNF text (llama.cpp's dialect, root
 * rule `root`), the input of the grammar engine (tokpipe/grammar.h).
 *
 * Compilers only: no token masks here. Every keyword of the schema is either
 * enforced by the grammar or refused with TP_EINVAL and a message naming it
 * (annotations such as title/description/examples/default are ignored).
 * The JSON the grammars accept is bounded so that a model cannot write
 * forever: between tokens at most TP_JSCHEMA_WS_MAX whitespace characters
 * (space, \t, \n, \r), numbers with at most TP_JSCHEMA_INT_DIGITS integer and
 * TP_JSCHEMA_FRAC_DIGITS fraction digits, and nothing after the root value.
 *
 * Hostile input is bounded by tp_jschema_opts: the schema's size, its
 * nesting depth and the size of the GBNF produced; going past a limit is
 * TP_ERANGE naming the limit. Pure functions: no global state, thread-safe. */
#ifndef TOKPIPE_JSCHEMA_H
#define TOKPIPE_JSCHEMA_H

#include <stddef.h>

#include "tokpipe/error.h"

#define TP_JSCHEMA_WS_MAX 20          /* whitespace chars allowed between two JSON tokens */
#define TP_JSCHEMA_INT_DIGITS 16      /* digits before the point (llama.cpp's bound) */
#define TP_JSCHEMA_FRAC_DIGITS 16     /* digits after the point */
#define TP_JSCHEMA_EXP_DIGITS 3       /* digits of an exponent */

#define TP_JSCHEMA_DEF_MAX_SCHEMA_BYTES (256u * 1024u)
#define TP_JSCHEMA_DEF_MAX_DEPTH 64
#define TP_JSCHEMA_DEF_MAX_GBNF_BYTES (1024u * 1024u)

typedef struct tp_jschema_opts {
    size_t max_schema_bytes;  /* refuse a longer schema (or regex) text */
    int max_depth;            /* nesting of schemas, $ref chains and regex groups */
    size_t max_gbnf_bytes;    /* refuse when the produced GBNF would be longer */
} tp_jschema_opts;

/* Fill o with the TP_JSCHEMA_DEF_* limits. */
void tp_jschema_opts_default(tp_jschema_opts *o);

/* Compile a JSON Schema (Draft 2020-12 subset, JSON text of len bytes, not
 * necessarily NUL-terminated) to GBNF. o NULL = defaults. On success *gbnf
 * is a malloc'd NUL-terminated GBNF text whose start rule is `root` (caller
 * frees); on failure *gbnf is NULL and err names the keyword or limit. */
int tp_jschema_to_gbnf(const char *schema_json, size_t len, const tp_jschema_opts *o, char **gbnf,
                       tp_err *err);

/* JSON mode: GBNF for any JSON object (same bounds as above). Caller frees. */
int tp_jschema_json_mode_gbnf(char **gbnf, tp_err *err);

/* Compile a regular expression (the subset JSON Schema's `pattern` uses:
 * anchors ^ $, literals and escapes, . [classes] \d \w \s \D \W \S, groups
 * (...) (?:...), alternation, * + ? {m} {m,} {m,n}) to GBNF whose `root`
 * matches exactly the strings the regex matches in full (an unanchored side
 * allows any characters there, as ECMA-262 search does). The strings are
 * raw characters, not JSON-escaped. Refuses (naming it) what it cannot do:
 * backreferences, lookaround, lazy or possessive quantifiers, flags. */
int tp_regex_to_gbnf(const char *re, size_t len, const tp_jschema_opts *o, char **gbnf,
                     tp_err *err);

#endif
