/* Grammar-constrained decoding: a GBNF compiler and the runtime that turns a
 * grammar and a model's vocabulary into token masks.
 *
 * Three objects, apart on purpose:
 *   tp_grammar  the compiled grammar (GBNF as llama.cpp's grammars/README.md
 *               defines it), lowered to bytes: every character class becomes
 *               the UTF-8 byte sequences of its code points, so the runtime
 *               never decodes UTF-8 and a token may end inside a character.
 *               Vocabulary independent (token references keep their names
 *               until an engine binds them), immutable, shareable.
 *   tp_gvocab   one model's vocabulary as bytes (SentencePiece U+2581 ->
 *               space, byte fallback <0xNN> -> that byte, control tokens
 *               without bytes), sorted into a flat preorder token trie, and
 *               the end-of-generation ids. Built once per model; read only.
 *   tp_gengine  grammar x vocabulary: the lazily built DFA over parser
 *               states and the token masks cached per state. Matchers of
 *               many jobs with the same grammar share one engine. Not
 *               thread-safe (it memoizes as it goes): one thread per engine.
 *   tp_gmatch   one job's position: a state of the engine. Rebuilt by
 *               replaying accepted tokens (recovery), cloned by copying.
 *
 * Runtime model. A parser state is the set of pushdown stacks llama.cpp's
 * grammar keeps, with every stack interned (hash-consed) and every set
 * interned, so a set is a small integer: a DFA state built on demand (as
 * RE2 builds its DFA). Each state keeps its 256 byte transitions once
 * computed and, once asked, its token mask. A mask is computed by walking
 * the vocabulary trie in preorder with one table lookup per node and
 * skipping a whole subtree at the first dead byte (llguidance's design);
 * states recur (the inside of a JSON string is one state whatever came
 * before in it), so most masks are a copy. Limits bound the DFA and the
 * cache: reaching the DFA limit is an error for the job (TP_ERANGE), the
 * mask cache is simply emptied.
 *
 * Semantics of a mask: token t is allowed when its bytes, appended to the
 * output so far, leave a prefix of some string of the language (partial
 * UTF-8 sequences allowed), or when a token reference (below) on top of a
 * stack takes it; tokens with no bytes (control, unknown, unused) never
 * otherwise; the end-of-generation ids exactly when the output so far is a
 * whole sentence of the language (or a reference names one). "Done": a
 * whole sentence that admits no further byte. */
#ifndef TOKPIPE_GRAMMAR_H
#define TOKPIPE_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokpipe/error.h"
#include "tokpipe/limits.h" /* the limits' defaults */

typedef struct tp_grammar_limits {
    size_t max_bytes;
    int max_rules;
    int max_nesting;
    size_t max_elements;
    int max_repeat;
    int max_compile_ms;
} tp_grammar_limits;

void tp_grammar_limits_default(tp_grammar_limits *l);

typedef struct tp_grammar tp_grammar;

/* Compile GBNF text gbnf[0..len) (need not be NUL terminated). The start
 * rule is `root`. Refused with TP_EFORMAT and "line L col C: ..." for a
 * syntax error, an undefined rule, a missing root, left recursion (named);
 * TP_ERANGE for a limit (named). limits NULL = defaults. On success *out is
 * owned by the caller (tp_grammar_free). Time: linear in the lowered size;
 * the nesting limit bounds the recursion. */
int tp_grammar_compile(const char *gbnf, size_t len, const tp_grammar_limits *limits, tp_grammar **out,
                       tp_err *err);

void tp_grammar_free(tp_grammar *g);

/* Number of rules after lowering (groups and repetitions become rules). */
int tp_grammar_n_rules(const tp_grammar *g);

/* The grammar as normalized GBNF, after lowering: every rule on one line,
 * helper rules named NAME-N, terminals as byte classes [\xNN-\xNN].
 * Malloc'd NUL-terminated text, caller frees; NULL when out of memory. */
char *tp_grammar_print(const tp_grammar *g);

/* ---- token references ----
 * A grammar may name single tokens, as llama.cpp's GBNF does: <[id]> is
 * the token with that id; <text>, where text runs from < to the first >
 * on the line (<|im_end|>, <think>, <｜tool▁calls▁begin｜>), the special
 * (control or user-defined) token whose vocabulary text is exactly that;
 * tokpipe's <"text">, with a literal's escapes, names a special token of
 * any other shape ([TOOL_CALLS]); a leading ! (!<|end|>) matches any one
 * token that has text, except that one. A reference matches that token id
 * only, never the same characters spelt by other tokens; control tokens
 * stay forbidden wherever the grammar does not name them. The names are
 * resolved against a vocabulary (tp_gengine_new, tp_grammar_check_tokens):
 * a grammar that names a token the vocabulary lacks is refused there. */

/* The GBNF reference to the special token whose text is text[0, len)
 * (valid UTF-8), negated or not, in the form the compiler reads:
 * malloc'd NUL-terminated text, caller frees; NULL when out of memory. For
 * grammar writers (tool-call syntaxes whose markers are control tokens). */
char *tp_grammar_token_ref(const char *text, size_t len, bool negated);

/* How many token references g has. */
size_t tp_grammar_n_token_refs(const tp_grammar *g);

/* A vocabulary as far as references need it: its size (<[id]> must be
 * below it) and find(ctx, text, len), the id of the special token with
 * that text or -1 (NULL: none has a name). */
typedef struct tp_gnames {
    int n_vocab;
    int (*find)(void *ctx, const char *text, size_t len);
    void *ctx;
} tp_gnames;

/* Resolve every token reference of g (ids, if not NULL, gets the id of
 * each, tp_grammar_n_token_refs of them). TP_EINVAL naming the first that
 * does not resolve, with its line and column. */
int tp_grammar_check_tokens(const tp_grammar *g, const tp_gnames *names, int32_t *ids, tp_err *err);

/* ---- vocabulary ---- */

typedef struct tp_gvocab tp_gvocab;
struct tp_tokenizer;

/* From a tokenizer: each id's bytes as tp_tokenizer_token_bytes gives them
 * without context (so SentencePiece's space after BOS is kept: the first
 * token of an output after a bare BOS is matched with its space); control,
 * unknown and unused tokens have none. eog (n_eog ids) are the ids that end
 * generation; ids outside the vocabulary are ignored. tok is only read
 * during the call. Cost: one sort of the vocabulary (~20 ms for 150k). */
int tp_gvocab_from_tokenizer(const struct tp_tokenizer *tok, const int *eog, int n_eog, tp_gvocab **out,
                             tp_err *err);

/* From explicit token bytes (tests, benches): bytes[i] with lens[i] bytes;
 * lens[i] == 0 marks a token with no bytes (never allowed unless an eog). */
int tp_gvocab_new(int n, const uint8_t *const *bytes, const size_t *lens, const int *eog, int n_eog,
                  tp_gvocab **out, tp_err *err);

/* Give the special tokens ids[0, n) their texts (copied), for <text>
 * references (tp_gvocab_from_tokenizer names every control, user-defined
 * and unknown token by its piece). A later call adds to the names. */
int tp_gvocab_name_tokens(tp_gvocab *v, int n, const int *ids, const char *const *texts, const size_t *lens,
                          tp_err *err);

/* The id of the special token named text[0, len), -1 if none (a
 * tp_gnames find). */
int tp_gvocab_find_name(void *v, const char *text, size_t len);

void tp_gvocab_free(tp_gvocab *v);
int tp_gvocab_size(const tp_gvocab *v);
/* Borrowed bytes of token id (NULL, *len 0 outside the vocabulary). */
const uint8_t *tp_gvocab_bytes(const tp_gvocab *v, int id, size_t *len);
bool tp_gvocab_is_eog(const tp_gvocab *v, int id);
/* Bytes of memory the vocabulary index holds. */
size_t tp_gvocab_memory(const tp_gvocab *v);

/* ---- engine and matcher ---- */

typedef struct tp_gengine tp_gengine;

typedef struct tp_gengine_limits {
    int max_states;       /* DFA states; more is an error for the matcher */
    size_t mask_bytes;    /* mask cache; beyond it the cache is emptied */
} tp_gengine_limits;

void tp_gengine_limits_default(tp_gengine_limits *l);

/* The config's grammar.* keys as the compiler's limits and (el not NULL)
 * the engine's. */
struct tp_config;
void tp_grammar_limits_from_config(const struct tp_config *c, tp_grammar_limits *gl, tp_gengine_limits *el);

/* g and v are borrowed and must outlive the engine. limits NULL = defaults.
 * TP_EINVAL naming it when a token reference of g does not resolve in v. */
int tp_gengine_new(const tp_grammar *g, const tp_gvocab *v, const tp_gengine_limits *limits, tp_gengine **out,
                   tp_err *err);
void tp_gengine_free(tp_gengine *e);
/* Bytes the engine holds now (DFA + masks). */
size_t tp_gengine_memory(const tp_gengine *e);
const tp_grammar *tp_gengine_grammar(const tp_gengine *e);
const tp_gvocab *tp_gengine_vocab(const tp_gengine *e);

typedef struct tp_gmatch tp_gmatch;

/* A matcher at the start of the grammar. e is borrowed (outlives it). */
int tp_gmatch_new(tp_gengine *e, tp_gmatch **out, tp_err *err);
void tp_gmatch_free(tp_gmatch *m);
/* The engine m works on (borrowed). */
tp_gengine *tp_gmatch_engine(const tp_gmatch *m);
/* A copy at the same position (same engine). NULL when out of memory. */
tp_gmatch *tp_gmatch_clone(const tp_gmatch *m);

/* Words of a mask: bit t of mask[t / 64] is token t. */
static inline size_t tp_gmask_words(int vocab) { return ((size_t)vocab + 63) / 64; }

/* Write the allowed tokens as a bitset (tp_gmask_words(vocab) words).
 * TP_ERANGE when the engine's state limit is reached. */
int tp_gmatch_mask(tp_gmatch *m, uint64_t *mask, tp_err *err);

/* Whether token may come next (the same answer as its mask bit, without
 * building the mask: one walk of its bytes). */
bool tp_gmatch_allows(tp_gmatch *m, int32_t token);

/* out[t] = logits[t] where mask allows t, -inf elsewhere (vocab floats):
 * what a sampler sees, so every selection step works on the constrained
 * distribution. */
void tp_grammar_apply_mask(const uint64_t *mask, const float *logits, float *out, int vocab);

/* Advance by token. TP_EINVAL (naming the token) if the grammar does not
 * allow it; the matcher is then unchanged. An end-of-generation id is
 * allowed exactly when accepting and makes the matcher finished. */
int tp_gmatch_accept(tp_gmatch *m, int32_t token, tp_err *err);

/* Advance by raw bytes (the whole text must be allowed, else TP_EINVAL and
 * no change). For tests and for checking a document. */
int tp_gmatch_accept_bytes(tp_gmatch *m, const uint8_t *b, size_t n, tp_err *err);

/* The output so far is a whole sentence of the language. */
bool tp_gmatch_accepting(const tp_gmatch *m);
/* Accepting and no byte may follow, or an end-of-generation token taken. */
bool tp_gmatch_done(const tp_gmatch *m);
/* Whether a job's final text (text[0, len), after any stop cut; cut: a
 * stop string cut it) is a whole sentence: the text replayed from the start
 * — or, for a grammar with token references (no bytes of the text), m's
 * own position when nothing was cut. */
bool tp_gmatch_complete(const tp_gmatch *m, const uint8_t *text, size_t len, bool cut);

/* Bytes one matcher holds (all a job's grammar state: the engine is shared). */
size_t tp_gmatch_memory(const tp_gmatch *m);

/* Tokens accepted so far. */
size_t tp_gmatch_n_accepted(const tp_gmatch *m);

/* ---- a stage's grammars ----
 * What a worker stage keeps: the vocabulary index (built on the first
 * grammar asked for, so a worker that never sees one pays nothing) and the
 * compiled grammars with their engines, shared by every job with the same
 * text (JSON mode compiles once, its masks are computed once for all). At
 * most max_grammars are kept; one no matcher uses is dropped for a new one.
 * Not thread-safe. */
typedef struct tp_gcache tp_gcache;

/* tok (borrowed, outlives the cache; NULL: every grammar is refused, naming
 * why) gives the token bytes; eog (copied) the end-of-generation ids;
 * limits NULL = defaults. */
int tp_gcache_new(const struct tp_tokenizer *tok, const int *eog, int n_eog, const tp_grammar_limits *gl,
                  const tp_gengine_limits *el, int max_grammars, tp_gcache **out, tp_err *err);
void tp_gcache_free(tp_gcache *c);

/* A matcher at the start of grammar text[0, len), compiled now or found;
 * release it with tp_gcache_release. Errors as tp_grammar_compile's. */
int tp_gcache_matcher(tp_gcache *c, const char *text, size_t len, tp_gmatch **out, tp_err *err);
void tp_gcache_release(tp_gcache *c, tp_gmatch *m);

/* The vocabulary size, once built (0 before the first grammar). */
int tp_gcache_vocab_size(const tp_gcache *c);

#endif
