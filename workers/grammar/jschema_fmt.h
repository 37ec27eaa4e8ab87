/* String formats of the JSON Schema compiler (jschema_formats.c). */
#ifndef TOKPIPE_JSCHEMA_FMT_H
#define TOKPIPE_JSCHEMA_FMT_H

#include "jschema_int.h"

enum { FMT_DATE = 1, FMT_TIME = 2, FMT_DT = 4, FMT_UUID = 8, FMT_IPV4 = 16, FMT_EMAIL = 32 };

/* Known format name: adds the rule groups it needs to *needs, its length
 * range in characters to lo/hi (SIZE_MAX: unbounded); the GBNF rule is
 * `fmt-NAME`. -1 when the format is not known. */
int fmt_lookup(const char *name, unsigned *needs, size_t *lo, size_t *hi);

/* Append the rules of the groups in needs. */
void fmt_rules(tp_buf *b, unsigned needs);

#endif
