/* A grammar vocabulary made from a tokenizer file, as the constrained
 * decoding benchmarks load one per vocabulary they measure. */
#ifndef BENCH_SUPPORT_GVOCAB_H
#define BENCH_SUPPORT_GVOCAB_H

#include "tokpipe/grammar.h"

/* The tp_gvocab of the tokenizer at path, its end-of-generation ids (the
 * first 16) ending the grammars; *build_s (when not NULL) gets the seconds
 * tp_gvocab_from_tokenizer took. NULL when the tokenizer does not open or
 * the vocabulary cannot be made, said on stdout as "name: skipped (why)".
 * Caller frees with tp_gvocab_free. */
tp_gvocab *bench_gvocab_open(const char *name, const char *path, double *build_s);

#endif
