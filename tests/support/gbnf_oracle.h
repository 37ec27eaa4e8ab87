/* A deliberately naive GBNF recognizer for tests: its own small parser into
 * a tree, and a backtracking matcher over code points. Shares no code with
 * workers/grammar. Slow (exponential in the worst case); fine for short
 * texts and the grammars the tests write. */
#ifndef TOKPIPE_GBNF_ORACLE_H
#define TOKPIPE_GBNF_ORACLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gbnf_oracle gbnf_oracle;

/* NULL if the text does not parse (the oracle knows only well-formed
 * grammars; error reporting is the engine's job). */
gbnf_oracle *gbnf_oracle_new(const char *gbnf);
void gbnf_oracle_free(gbnf_oracle *o);

/* Whether text[0, n) is a prefix of some sentence of the language; a
 * trailing incomplete UTF-8 sequence counts when some character it could
 * begin fits. Invalid UTF-8 anywhere else: false. */
bool gbnf_oracle_prefix(gbnf_oracle *o, const uint8_t *text, size_t n);

/* Whether text[0, n) is a whole sentence. */
bool gbnf_oracle_complete(gbnf_oracle *o, const uint8_t *text, size_t n);

#endif
