/* The lowered grammar shared by the GBNF compiler (gbnf.c) and the runtime
 * (gmatch.c). Not a public interface. */
#ifndef TOKPIPE_GRAMMAR_INTERNAL_H
#define TOKPIPE_GRAMMAR_INTERNAL_H

#include <stdint.h>
#include <stdlib.h>

#include "tokpipe/grammar.h"

/* An element of a rule alternative. Alternatives are stored back to back in
 * one array, each ended by GE_END, so "the element after this one" is the
 * next index (a stack entry is just an element index). */
enum { GE_END = 0, GE_BYTES = 1, GE_REF = 2, GE_TOKEN = 3 };

typedef struct gel {
    uint32_t type : 2;
    uint32_t v : 30;      /* GE_BYTES: byte set index; GE_REF: rule id; GE_TOKEN: token reference */
} gel;

/* A token reference <[id]> / <text> / <"text">, ! for "any token but".
 * Resolved to an id only against a vocabulary (tp_gengine_new,
 * tp_grammar_check_tokens): the grammar stays vocabulary independent. */
typedef struct gtokref {
    char *text;           /* the token's text (NULL: by id) */
    size_t len;
    int32_t id;           /* by id; -1 by text */
    int neg;
    int line, col;        /* where it is written (errors name it) */
} gtokref;

typedef struct grule {
    char *name;
    uint32_t *alts;       /* element index of each alternative's first element */
    int n_alts, cap_alts;
    int defined;          /* 0: only referenced so far; 1: defined; 2: a helper */
    size_t ref_at;        /* text offset of the first reference (for errors) */
} grule;

struct tp_grammar {
    gel *el;
    size_t n_el, cap_el;
    uint64_t (*sets)[4];  /* 256-bit byte sets */
    size_t n_sets, cap_sets;
    grule *rules;
    int n_rules;
    size_t cap_rules;
    int root;
    gtokref *toks;
    size_t n_toks, cap_toks;
};

/* Make room for need elements of size bytes in *p (capacity *cap, doubled
 * as it grows). -1 when out of memory, *p unchanged. */
static inline int gr_grow(void **p, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap * 2 : 16;
    while (c < need)
        c *= 2;
    void *n = realloc(*p, c * size);
    if (!n)
        return -1;
    *p = n;
    *cap = c;
    return 0;
}

static inline int gset_has(const uint64_t *s, unsigned b) { return (int)((s[b >> 6] >> (b & 63)) & 1); }

#endif
