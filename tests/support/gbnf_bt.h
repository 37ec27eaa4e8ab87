/* A brute-force GBNF recognizer for tests of the schema compiler: a tiny
 * parser of llama.cpp's GBNF into a tree and a backtracking matcher over
 * code points (continuation passing). No code shared with workers/grammar;
 * exponential in the worst case, bounded by a step budget; fine for the
 * short JSON texts tests feed it. */
#ifndef TOKPIPE_GBNF_BT_H
#define TOKPIPE_GBNF_BT_H

#include <stdbool.h>
#include <stddef.h>

typedef struct gbt gbt;

/* NULL when the text does not parse or names an undefined rule; *why (if
 * non-NULL) then points at a static description. */
gbt *gbt_new(const char *gbnf, const char **why);
void gbt_free(gbt *g);

/* 1: text[0,n) is a sentence of `root`; 0: it is not; -1: the step budget
 * ran out (undecided) or the text is not valid UTF-8. */
int gbt_match(gbt *g, const char *text, size_t n);

#endif
