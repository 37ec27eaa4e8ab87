/* Naive GBNF recognizer (see gbnf_oracle.h): a tree and continuation
 * passing over a linked list of pending nodes. */
#include "gbnf_oracle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The matcher is not instrumented by the sanitizers: its recursion's stack
 * frames (cont ks[64]) made the oracle seven times slower under ASan, and
 * the sanitizer build is there to check the engine the oracle judges. */
#if defined(__has_attribute)
#if __has_attribute(no_sanitize)
#define UNCHECKED __attribute__((no_sanitize("address", "undefined")))
#endif
#endif
#ifndef UNCHECKED
#define UNCHECKED
#endif

enum { N_ALT, N_SEQ, N_LIT, N_CLASS, N_REF, N_REP };

typedef struct node {
    int kind;
    struct node **kids;
    int n_kids;
    uint32_t *cps;       /* N_LIT: code points; N_CLASS: lo,hi pairs */
    int n_cps;
    int negate;
    char name[64];       /* N_REF */
    int rule;
    int min, max;        /* N_REP; max -1 = unbounded */
} node;

struct gbnf_oracle {
    char names[512][64];
    node *bodies[512];
    int n_rules;
    /* the text being matched */
    uint32_t *cp;
    size_t n_cp;
    uint8_t partial[4];
    int n_partial;
    bool complete;
    long budget;
};

typedef struct cont {
    node *n;
    int count;           /* N_REP: repetitions done */
    const struct cont *next;
} cont;

/* ---- parser ---- */

typedef struct rd {
    const char *s;
    int bad;
} rd;

static void ws(rd *r, int nl)
{
    for (;;) {
        if (*r->s == ' ' || *r->s == '\t' || *r->s == '\r' || (nl && *r->s == '\n'))
            r->s++;
        else if (*r->s == '#')
            while (*r->s && *r->s != '\n')
                r->s++;
        else
            return;
    }
}

static node *mk(int kind)
{
    node *n = calloc(1, sizeof *n);
    n->kind = kind;
    return n;
}

static void add_kid(node *p, node *k)
{
    p->kids = realloc(p->kids, (size_t)(p->n_kids + 1) * sizeof *p->kids);
    p->kids[p->n_kids++] = k;
}

static void add_cp(node *p, uint32_t c)
{
    p->cps = realloc(p->cps, (size_t)(p->n_cps + 1) * sizeof *p->cps);
    p->cps[p->n_cps++] = c;
}

static int hex(char c) { return c <= '9' ? c - '0' : (c | 32) - 'a' + 10; }

static uint32_t chr(rd *r)
{
    const unsigned char *s = (const unsigned char *)r->s;
    if (*s == '\\') {
        char e = (char)s[1];
        r->s += 2;
        int nh = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (!nh)
            return e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e == '0' ? 0 : (uint32_t)e;
        uint32_t v = 0;
        for (int i = 0; i < nh; i++)
            v = v * 16 + (uint32_t)hex(*r->s++);
        return v;
    }
    int n = *s < 0x80 ? 1 : *s < 0xE0 ? 2 : *s < 0xF0 ? 3 : 4;
    uint32_t v = n == 1 ? *s : *s & (0x7F >> n);
    for (int i = 1; i < n; i++)
        v = v << 6 | (s[i] & 0x3F);
    r->s += n;
    return v;
}

static node *alts(rd *r, int nl);

static int word(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_'; }

static node *seq(rd *r, int nl)
{
    node *q = mk(N_SEQ);
    for (;;) {
        ws(r, nl);
        node *a = NULL;
        if (*r->s == '"') {
            r->s++;
            a = mk(N_LIT);
            while (*r->s && *r->s != '"')
                add_cp(a, chr(r));
            if (!*r->s++)
                r->bad = 1;
        } else if (*r->s == '[') {
            r->s++;
            a = mk(N_CLASS);
            if (*r->s == '^')
                a->negate = 1, r->s++;
            while (*r->s && *r->s != ']') {
                uint32_t lo = chr(r), hi = lo;
                if (*r->s == '-' && r->s[1] != ']') {
                    r->s++;
                    hi = chr(r);
                }
                add_cp(a, lo);
                add_cp(a, hi);
            }
            if (!*r->s++)
                r->bad = 1;
        } else if (*r->s == '.') {
            r->s++;
            a = mk(N_CLASS);
            a->negate = 1;   /* [^] = everything */
        } else if (*r->s == '(') {
            r->s++;
            a = alts(r, 1);
            ws(r, 1);
            if (*r->s++ != ')')
                r->bad = 1;
        } else if (word(*r->s)) {
            const char *b = r->s;
            while (word(*r->s))
                r->s++;
            const char *save = r->s;
            ws(r, 0);
            if (!strncmp(r->s, "::=", 3)) {
                r->s = b;
                return q;
            }
            r->s = save;
            a = mk(N_REF);
            snprintf(a->name, sizeof a->name, "%.*s", (int)(r->s - b), b);
        } else
            return q;
        if (*r->s == '*' || *r->s == '+' || *r->s == '?' || *r->s == '{') {
            node *rep = mk(N_REP);
            add_kid(rep, a);
            char c = *r->s++;
            rep->min = c == '+';
            rep->max = c == '?' ? 1 : -1;
            if (c == '{') {
                rep->min = (int)strtol(r->s, (char **)&r->s, 10);
                rep->max = rep->min;
                if (*r->s == ',') {
                    r->s++;
                    rep->max = *r->s == '}' ? -1 : (int)strtol(r->s, (char **)&r->s, 10);
                }
                if (*r->s++ != '}')
                    r->bad = 1;
            }
            a = rep;
        }
        add_kid(q, a);
    }
}

static node *alts(rd *r, int nl)
{
    node *a = mk(N_ALT);
    for (;;) {
        add_kid(a, seq(r, nl));
        ws(r, nl);
        if (*r->s != '|')
            return a;
        r->s++;
        ws(r, 1);
    }
}

static void free_node(node *n)
{
    if (!n)
        return;
    for (int i = 0; i < n->n_kids; i++)
        free_node(n->kids[i]);
    free(n->kids);
    free(n->cps);
    free(n);
}

static int resolve(gbnf_oracle *o, node *n)
{
    if (n->kind == N_REF) {
        n->rule = -1;
        for (int i = 0; i < o->n_rules; i++)
            if (!strcmp(o->names[i], n->name))
                n->rule = i;
        if (n->rule < 0)
            return -1;
    }
    for (int i = 0; i < n->n_kids; i++)
        if (resolve(o, n->kids[i]))
            return -1;
    return 0;
}

gbnf_oracle *gbnf_oracle_new(const char *gbnf)
{
    gbnf_oracle *o = calloc(1, sizeof *o);
    rd r = {gbnf, 0};
    for (;;) {
        ws(&r, 1);
        if (!*r.s || r.bad || o->n_rules == 512)
            break;
        const char *b = r.s;
        while (word(*r.s))
            r.s++;
        snprintf(o->names[o->n_rules], 64, "%.*s", (int)(r.s - b), b);
        ws(&r, 0);
        if (strncmp(r.s, "::=", 3)) {
            r.bad = 1;
            break;
        }
        r.s += 3;
        ws(&r, 1);
        o->bodies[o->n_rules++] = alts(&r, 0);
    }
    int root = -1;
    for (int i = 0; i < o->n_rules; i++) {
        if (!strcmp(o->names[i], "root"))
            root = i;
        if (resolve(o, o->bodies[i]))
            r.bad = 1;
    }
    if (r.bad || root < 0) {
        gbnf_oracle_free(o);
        return NULL;
    }
    /* root first: rule 0 is where matching starts */
    node *t = o->bodies[0];
    o->bodies[0] = o->bodies[root];
    o->bodies[root] = t;
    char tn[64];
    memcpy(tn, o->names[0], 64);
    memcpy(o->names[0], o->names[root], 64);
    memcpy(o->names[root], tn, 64);
    for (int i = 0; i < o->n_rules; i++)
        resolve(o, o->bodies[i]);
    return o;
}

void gbnf_oracle_free(gbnf_oracle *o)
{
    if (!o)
        return;
    for (int i = 0; i < o->n_rules; i++)
        free_node(o->bodies[i]);
    free(o->cp);
    free(o);
}

/* ---- matching ---- */

UNCHECKED static bool in_class(const node *n, uint32_t c)
{
    bool in = false;
    for (int i = 0; i + 1 < n->n_cps; i += 2)
        if (c >= n->cps[i] && c <= n->cps[i + 1])
            in = true;
    return in != (bool)n->negate;
}

/* Does code point c's encoding start with the partial bytes? */
UNCHECKED static bool starts_with_partial(const gbnf_oracle *o, uint32_t c)
{
    uint8_t b[4];
    int n;
    if (c < 0x80) b[0] = (uint8_t)c, n = 1;
    else if (c < 0x800) b[0] = (uint8_t)(0xC0 | c >> 6), b[1] = (uint8_t)(0x80 | (c & 0x3F)), n = 2;
    else if (c < 0x10000)
        b[0] = (uint8_t)(0xE0 | c >> 12), b[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3F)), b[2] = (uint8_t)(0x80 | (c & 0x3F)), n = 3;
    else
        b[0] = (uint8_t)(0xF0 | c >> 18), b[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3F)),
        b[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3F)), b[3] = (uint8_t)(0x80 | (c & 0x3F)), n = 4;
    return n > o->n_partial && !memcmp(b, o->partial, (size_t)o->n_partial);
}

/* Some character of the class completes the partial sequence: try every
 * code point whose encoding could start so (slow and obviously right). */
UNCHECKED static bool class_fits_partial(const gbnf_oracle *o, const node *n)
{
    uint8_t lead = o->partial[0];
    int len = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
    uint32_t lo = lead & (0x7F >> len), hi = lo;
    for (int k = 1; k < len; k++) {
        uint32_t b = k < o->n_partial ? o->partial[k] & 0x3Fu : 0;
        lo = lo << 6 | b;
        hi = hi << 6 | (k < o->n_partial ? b : 0x3F);
    }
    for (uint32_t c = lo; c <= hi && c <= 0x10FFFF; c++)
        if ((c < 0xD800 || c > 0xDFFF) && starts_with_partial(o, c) && in_class(n, c))
            return true;
    return false;
}

UNCHECKED static bool m(gbnf_oracle *o, const cont *c, size_t i)
{
    if (--o->budget < 0)
        return false;
    bool at_end = i == o->n_cp;
    if (at_end && !o->complete && !o->n_partial)
        return true;
    if (!c)
        return at_end && !o->n_partial;
    node *n = c->n;
    switch (n->kind) {
    case N_LIT: {
        size_t k = 0;
        for (; k < (size_t)n->n_cps; k++) {
            if (i + k == o->n_cp) {
                if (o->complete)
                    return false;
                if (!o->n_partial)
                    return true;
                return starts_with_partial(o, n->cps[k]);
            }
            if (o->cp[i + k] != n->cps[k])
                return false;
        }
        return m(o, c->next, i + k);
    }
    case N_CLASS:
        if (at_end)
            return !o->complete && o->n_partial && class_fits_partial(o, n);
        return in_class(n, o->cp[i]) && m(o, c->next, i + 1);
    case N_REF: {
        cont k = {o->bodies[n->rule], 0, c->next};
        return m(o, &k, i);
    }
    case N_ALT:
        for (int a = 0; a < n->n_kids; a++) {
            cont k = {n->kids[a], 0, c->next};
            if (m(o, &k, i))
                return true;
        }
        return false;
    case N_SEQ: {
        if (!n->n_kids)
            return m(o, c->next, i);
        cont ks[64];
        const cont *next = c->next;
        for (int a = n->n_kids - 1; a >= 0; a--) {
            ks[a] = (cont){n->kids[a], 0, next};
            next = &ks[a];
        }
        return m(o, next, i);
    }
    default: { /* N_REP */
        if (c->count >= n->min && m(o, c->next, i))
            return true;
        if (n->max >= 0 && c->count >= n->max)
            return false;
        /* the next repetition must consume something, so this ends */
        cont again = {n, c->count + 1, c->next};
        cont body = {n->kids[0], 0, &again};
        if (c->count >= n->min && at_end && !o->n_partial)
            return false;
        return m(o, &body, i);
    }
    }
}

static bool run(gbnf_oracle *o, const uint8_t *t, size_t len, bool complete)
{
    free(o->cp);
    o->cp = malloc((len + 1) * sizeof *o->cp);
    o->n_cp = 0;
    o->n_partial = 0;
    for (size_t i = 0; i < len;) {
        uint8_t b = t[i];
        int n = b < 0x80 ? 1 : b >= 0xC2 && b < 0xE0 ? 2 : b >= 0xE0 && b < 0xF0 ? 3 : b >= 0xF0 && b < 0xF5 ? 4 : 0;
        if (!n)
            return false;
        if (i + (size_t)n > len) {   /* trailing partial sequence */
            for (size_t k = i + 1; k < len; k++)
                if ((t[k] & 0xC0) != 0x80)
                    return false;
            o->n_partial = (int)(len - i);
            memcpy(o->partial, t + i, len - i);
            break;
        }
        uint32_t v = n == 1 ? b : b & (0x7F >> n);
        for (int k = 1; k < n; k++) {
            if ((t[i + (size_t)k] & 0xC0) != 0x80)
                return false;
            v = v << 6 | (t[i + (size_t)k] & 0x3F);
        }
        if ((n == 3 && v < 0x800) || (n == 4 && (v < 0x10000 || v > 0x10FFFF)) || (v >= 0xD800 && v <= 0xDFFF))
            return false;
        o->cp[o->n_cp++] = v;
        i += (size_t)n;
    }
    if (complete && o->n_partial)
        return false;
    o->complete = complete;
    o->budget = 5000000;
    cont start = {o->bodies[0], 0, NULL};
    return m(o, &start, 0);
}

bool gbnf_oracle_prefix(gbnf_oracle *o, const uint8_t *text, size_t n) { return run(o, text, n, false); }

bool gbnf_oracle_complete(gbnf_oracle *o, const uint8_t *text, size_t n) { return run(o, text, n, true); }
