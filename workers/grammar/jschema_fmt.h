/* String formats of the JSON Schema compiler (jschema_formats.c). */
#ifndef TOKPIPE_JSCHEMA_FMT_H
#define TOKPIPE_JSCHEMA_FMT_H

#include "jschema_int.h"

/* Known format name: adds its bit to *needs (for fmt_rules), its length
 * range in characters to lo/hi (SIZE_MAX: unbounded); the GBNF rule is
 * `fmt-NAME`. -1 when the format is not known. */
int fmt_lookup(const char *name, unsigned *needs, size_t *lo, size_t *hi);

/* The ECMA regex (anchored) of a known format, NULL when not known. */
const char *fmt_regex(const char *name);

/* Append the rules `fmt-NAME` of the formats in needs. 0 or a TP_E code
 * with err (a format's regex refused: a bug of ours). */
int fmt_rules(tp_buf *b, unsigned needs, int max_depth, tp_err *err);

#endif
