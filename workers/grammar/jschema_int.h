/* Internals shared by the JSON Schema and regex -> GBNF compilers: a growing
 * text buffer with a size limit, code point sets, and the writers of GBNF
 * literals and character classes. Not a public interface. */
#ifndef TOKPIPE_JSCHEMA_INT_H
#define TOKPIPE_JSCHEMA_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokpipe/buf.h"
#include "tokpipe/error.h"

#define JS_MAX_CP 0x10FFFFu

/* Text under construction is a tp_buf with a limit (tp_buf_init):
 * once the limit would be passed (or memory runs out) it stops growing
 * and keeps the failure in err, which callers check at their convenience
 * instead of after every write. */

/* A set of code points as sorted, disjoint, non-adjacent ranges. */
typedef struct cset {
    uint32_t (*r)[2];
    int n, cap;
    bool oom;
} cset;

void jcs_free(cset *s);
void jcs_add(cset *s, uint32_t lo, uint32_t hi);
void jcs_add_set(cset *s, const cset *t);
/* Complement over [0, JS_MAX_CP] minus the surrogates (never in UTF-8). */
void jcs_negate(cset *s);
bool jcs_has(const cset *s, uint32_t c);
uint64_t jcs_count(const cset *s);

/* Decode one UTF-8 sequence at s[0..n); returns its length (1-4) and the
 * code point, or 0 when invalid (overlong, surrogate, truncated). */
int js_utf8_next(const unsigned char *s, size_t n, uint32_t *cp);
/* UTF-8 of c (no checks); returns its length. */

/* GBNF string literal "..." of the code points in s (UTF-8, n bytes). Returns
 * false (writing nothing) when s is not valid UTF-8. */
bool jgb_lit(tp_buf *b, const char *s, size_t n);
/* GBNF literal of one code point. */
void jgb_lit_cp(tp_buf *b, uint32_t c);
/* GBNF character class [..] of a non-empty set. */
void jgb_class(tp_buf *b, const cset *s);

/* elem repeated m..M times (M < 0: unbounded), as one GBNF element; large
 * counts are written as blocks so the engine's {m,n} cap is never hit and
 * every count in the range stays reachable. elem must be one element. */
void jgb_repeat(tp_buf *b, const char *elem, long long m, long long M);

/* JSON string contents: the canonical JSON text of one code point (the way
 * Python's json.dumps(ensure_ascii=False) writes it: \" \\ \b \f \n \r \t,
 * other controls as \u00xx, everything else raw). Returns its length. */
size_t js_escape_cp(uint32_t c, char out[8]);
/* GBNF for one JSON string element whose decoded code point is in s,
 * canonically escaped; false when s is empty. */
bool jgb_json_class(tp_buf *b, const cset *s);
/* GBNF literal of the canonical JSON-escaped form of UTF-8 text s (without
 * the quotes); false when s is not valid UTF-8. */
bool jgb_json_lit(tp_buf *b, const char *s, size_t n);
/* The same with the quotes: the literal of a whole JSON string. */
bool jgb_json_str(tp_buf *b, const char *s, size_t n, bool quotes);

/* Regex -> GBNF expression (no rule header). json: the strings are JSON
 * string contents (each code point canonically escaped); raw: plain text.
 * anychar: the GBNF name of a rule matching any one element, used for the
 * unanchored sides. On success fills *minlen and *maxlen (code points, maxlen
 * SIZE_MAX if unbounded). max_depth bounds nesting, RX_MAX_ the expansion. */
int rx_compile_expr(const char *re, size_t len, bool json, const char *anychar, int max_depth,
                    tp_buf *out, size_t *minlen, size_t *maxlen, tp_err *err);

struct tp_jschema_opts;
/* The checks both entry points start with: *o NULL -> defaults (in def),
 * *gbnf NULL, text present and within max_schema_bytes ("WHAT: ..."). */
int js_begin(const char *what, const char *text, size_t len, const struct tp_jschema_opts **o,
             struct tp_jschema_opts *def, char **gbnf, tp_err *err);

/* ---- automata over code points (jschema_dfa.c) ----
 * For string keywords that must all hold (a format or pattern with
 * minLength/maxLength, a format with a pattern): each language becomes a
 * DFA, two are intersected, and the strings of the result within the
 * lengths are written as GBNF rules. */

typedef struct jnfa_e {
    int from, to;
    bool eps; /* no set: an epsilon edge */
    cset set;
} jnfa_e;

/* A Thompson NFA under construction; errors (out of memory) stick in oom. */
typedef struct jnfa {
    jnfa_e *e;
    int ne, ce;
    int n; /* states 0 .. n-1 */
    bool oom;
} jnfa;

int jnfa_state(jnfa *a);
/* an edge on the code points of set (copied), NULL: epsilon */
void jnfa_edge(jnfa *a, int from, int to, const cset *set);
void jnfa_free(jnfa *a);

/* A DFA over code points: state 0 starts, a state's transition sets are
 * disjoint, never a surrogate. Opaque. */
typedef struct jdfa jdfa;
void jdfa_free(jdfa *d);
/* Subset construction (caller frees); NULL with err when it needs more
 * than max_states states (TP_ERANGE) or memory. */
jdfa *jdfa_from_nfa(const jnfa *a, int start, int accept, int max_states, tp_err *err);
/* The strings both accept (caller frees); NULL as jdfa_from_nfa. */
jdfa *jdfa_product(const jdfa *x, const jdfa *y, int max_states, tp_err *err);
/* Append to rules the GBNF rules `BASE-N` (and `BASE-cN` for character
 * sets) of the strings of d with lo..hi code points (hi SIZE_MAX: no
 * bound), each code point canonically JSON-escaped, and the start rule's
 * name to expr. Returns 0, 1 when no string qualifies (nothing written),
 * or a negative TP_E code with err (more than max_rules rules or
 * JS_MAX_LEN_STATES pairs of state and count). */
int jdfa_write(const jdfa *d, size_t lo, size_t hi, const char *base, int max_rules, tp_buf *rules, tp_buf *expr,
               tp_err *err);

/* Regex -> DFA (caller frees *out): the same language rx_compile_expr
 * writes, over code points. */
int rx_compile_dfa(const char *re, size_t len, int max_depth, int max_states, jdfa **out, tp_err *err);

#define JS_MAX_DFA_STATES 4096     /* states of one string keyword's automaton, or of two intersected */
#define JS_MAX_DFA_WORK 4000000   /* subset members, edges and boundaries visited building one DFA */
#define JS_MAX_LEN_STATES 100000   /* (state, count) pairs explored for minLength/maxLength */
#define JS_MAX_LEN_RULES 3000      /* rules written for one string with its lengths */

#define RX_MAX_REPEAT 100000       /* largest {m,n} bound in a pattern */
#define RX_MAX_EXPANSION 200000    /* pattern size with every repetition unrolled */

#endif
