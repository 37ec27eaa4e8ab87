/* GBNF -> lowered byte grammar (grammar_internal.h).
 *
 * The dialect is llama.cpp's grammars/README.md: `name ::= alternatives`,
 * literals "..." and classes [...] / [^...] with escapes \n \r \t \\ \" \[
 * \] \- \xHH \uHHHH \UHHHHHHHH, `.` (any character), groups, * + ? {m}
 * {m,} {m,n} {,n}, # comments. A rule ends at a newline unless inside
 * parentheses or right after `::=` or `|`.
 *
 * Lowering, done while parsing: groups and repetitions become helper rules
 * (x* -> R ::= x R | ; x? -> R ::= x | ; {m,n} -> m copies and n-m nested
 * optionals), right recursion in tail position costs no stack at run time.
 * Characters become bytes: a class over code points becomes the UTF-8
 * byte-range sequences of its code points (the split of Rust regex-syntax's
 * Utf8Sequences: ranges cut where the encodings stop sharing a prefix), so
 * the runtime is a pure byte machine. Surrogates are not characters. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar_internal.h"
#include "tokpipe/buf.h"
#include "tokpipe/utf8.h"

void tp_grammar_limits_default(tp_grammar_limits *l)
{
    l->max_bytes = TP_GRAMMAR_DEFAULT_MAX_BYTES;
    l->max_rules = TP_GRAMMAR_DEFAULT_MAX_RULES;
    l->max_nesting = TP_GRAMMAR_DEFAULT_MAX_NESTING;
    l->max_elements = TP_GRAMMAR_DEFAULT_MAX_ELEMENTS;
    l->max_repeat = TP_GRAMMAR_DEFAULT_MAX_REPEAT;
    l->max_compile_ms = TP_GRAMMAR_DEFAULT_COMPILE_MS;
}

typedef struct seqv {
    gel *v;
    size_t n, cap;
} seqv;

typedef struct cprange {
    uint32_t lo, hi;
} cprange;

typedef struct parser {
    const char *s;
    size_t len, pos;
    tp_grammar *g;
    tp_grammar_limits lim;
    tp_err *err;
    int rc;
    int depth;
    int cur_rule;          /* the named rule being defined (helper names) */
    int n_helpers;
    int any_rule;          /* helper for `.`, -1 until needed */
    int single[256];       /* byte set index of each single byte, -1 until needed */
    struct timespec t0;
} parser;

/* ---- errors ---- */

static void line_col(const parser *p, size_t at, size_t *line, size_t *col)
{
    *line = 1, *col = 1;
    for (size_t i = 0; i < at && i < p->len; i++) {
        if (p->s[i] == '\n')
            ++*line, *col = 1;
        else
            ++*col;
    }
}

static int fail(parser *p, size_t at, int code, const char *fmt, const char *a)
{
    if (p->rc)
        return p->rc;
    size_t line, col;
    line_col(p, at, &line, &col);
    char msg[300];
    snprintf(msg, sizeof msg, fmt, a ? a : "");
    p->rc = tp_err_set(p->err, code, "grammar: line %zu col %zu: %s", line, col, msg);
    return p->rc;
}

static int oom(parser *p) { return fail(p, p->pos, TP_ENOMEM, "out of memory%s", NULL); }

static int seq_push(parser *p, seqv *q, gel e)
{
    if (q->n + 1 > p->lim.max_elements)
        return fail(p, p->pos, TP_ERANGE, "more elements than the limit (grammar.max_elements)%s", NULL);
    if (gr_grow((void **)&q->v, &q->cap, q->n + 1, sizeof *q->v))
        return oom(p);
    q->v[q->n++] = e;
    return 0;
}

static int seq_append(parser *p, seqv *q, const seqv *r)
{
    for (size_t i = 0; i < r->n && !p->rc; i++)
        seq_push(p, q, r->v[i]);
    return p->rc;
}

/* ---- grammar building ---- */

static int new_set(parser *p, const uint64_t s[4])
{
    tp_grammar *g = p->g;
    if (gr_grow((void **)&g->sets, &g->cap_sets, g->n_sets + 1, sizeof *g->sets))
        return oom(p), -1;
    memcpy(g->sets[g->n_sets], s, sizeof g->sets[0]);
    return (int)g->n_sets++;
}

static int byte_set(parser *p, unsigned lo, unsigned hi)
{
    if (lo == hi && p->single[lo] >= 0)
        return p->single[lo];
    uint64_t s[4] = {0};
    for (unsigned b = lo; b <= hi; b++)
        s[b >> 6] |= 1ull << (b & 63);
    int k = new_set(p, s);
    if (lo == hi)
        p->single[lo] = k;
    return k;
}

static int check_time(parser *p)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    double ms = (double)(t.tv_sec - p->t0.tv_sec) * 1e3 + (double)(t.tv_nsec - p->t0.tv_nsec) / 1e6;
    if (ms > p->lim.max_compile_ms)
        return fail(p, p->pos, TP_ERANGE, "compile took longer than the limit (grammar.max_compile_ms)%s", NULL);
    return 0;
}

static int add_rule(parser *p, const char *name, size_t nlen)
{
    tp_grammar *g = p->g;
    if (g->n_rules >= p->lim.max_rules)
        return fail(p, p->pos, TP_ERANGE, "more rules than the limit (grammar.max_rules)%s", NULL), -1;
    if (gr_grow((void **)&g->rules, &g->cap_rules, (size_t)g->n_rules + 1, sizeof *g->rules))
        return oom(p), -1;
    grule *r = &g->rules[g->n_rules];
    memset(r, 0, sizeof *r);
    r->name = strndup(name, nlen);
    if (!r->name)
        return oom(p), -1;
    if ((g->n_rules & 63) == 0 && check_time(p))
        return -1;
    return g->n_rules++;
}

static int find_rule(parser *p, const char *name, size_t nlen)
{
    for (int i = 0; i < p->g->n_rules; i++)
        if (p->g->rules[i].defined != 2 && strlen(p->g->rules[i].name) == nlen &&
            !memcmp(p->g->rules[i].name, name, nlen))
            return i;
    return -1;
}

static int helper_rule(parser *p)
{
    char name[160];
    const char *base = p->cur_rule >= 0 ? p->g->rules[p->cur_rule].name : "g";
    int n = snprintf(name, sizeof name, "%.120s-%d", base, ++p->n_helpers);
    int r = add_rule(p, name, (size_t)n);
    if (r >= 0)
        p->g->rules[r].defined = 2;   /* helpers are never found by name */
    return r;
}

/* Append alternative q (an END is added) to rule r. */
static int add_alt(parser *p, int r, const seqv *q)
{
    tp_grammar *g = p->g;
    if (g->n_el + q->n + 1 > p->lim.max_elements)
        return fail(p, p->pos, TP_ERANGE, "more elements than the limit (grammar.max_elements)%s", NULL);
    if (gr_grow((void **)&g->el, &g->cap_el, g->n_el + q->n + 1, sizeof *g->el))
        return oom(p);
    grule *ru = &g->rules[r];
    size_t ca = (size_t)ru->cap_alts;
    if (gr_grow((void **)&ru->alts, &ca, (size_t)ru->n_alts + 1, sizeof *ru->alts))
        return oom(p);
    ru->cap_alts = (int)ca;
    ru->alts[ru->n_alts++] = (uint32_t)g->n_el;
    if (q->n)
        memcpy(g->el + g->n_el, q->v, q->n * sizeof *q->v);
    g->n_el += q->n;
    g->el[g->n_el++] = (gel){GE_END, 0};
    return 0;
}

/* ---- UTF-8 lowering of code point classes ---- */

static int utf8_len(uint32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }

typedef struct bseq {
    uint8_t lo[4], hi[4];
    int n;
} bseq;

typedef struct bseqv {
    bseq *v;
    size_t n, cap;
} bseqv;

/* [lo, hi] with both ends of one encoded length -> byte range sequences. */
static int split_same_len(bseqv *out, uint32_t lo, uint32_t hi)
{
    int n = utf8_len(lo);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0)
                return split_same_len(out, lo, lo | m) || split_same_len(out, (lo | m) + 1, hi);
            if ((hi & m) != m)
                return split_same_len(out, lo, (hi & ~m) - 1) || split_same_len(out, hi & ~m, hi);
        }
    }
    if (gr_grow((void **)&out->v, &out->cap, out->n + 1, sizeof *out->v))
        return -1;
    bseq *s = &out->v[out->n++];
    tp_utf8_put(lo, (char *)s->lo);
    tp_utf8_put(hi, (char *)s->hi);
    s->n = n;
    return 0;
}

static int split_range(bseqv *out, uint32_t lo, uint32_t hi)
{
    static const uint32_t bounds[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    for (int k = 0; k < 4 && lo <= hi; k++) {
        if (lo > bounds[k])
            continue;
        uint32_t h = hi < bounds[k] ? hi : bounds[k];
        if (split_same_len(out, lo, h))
            return -1;
        lo = h + 1;
    }
    return 0;
}

/* Sort, merge, optionally negate, drop surrogates. */
static int cmp_range(const void *a, const void *b)
{
    const cprange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static size_t normalize(cprange *r, size_t n, int negate, cprange *out)
{
    if (n)
        qsort(r, n, sizeof *r, cmp_range);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m && r[i].lo <= out[m - 1].hi + 1) {
            if (r[i].hi > out[m - 1].hi)
                out[m - 1].hi = r[i].hi;
        } else
            out[m++] = r[i];
    }
    if (negate) {
        /* complement in place into a temp copy */
        cprange tmp[m + 1];
        memcpy(tmp, out, m * sizeof *out);
        size_t k = 0;
        uint32_t next = 0;
        for (size_t i = 0; i < m; i++) {
            if (tmp[i].lo > next)
                out[k++] = (cprange){next, tmp[i].lo - 1};
            next = tmp[i].hi + 1;
        }
        if (next <= 0x10FFFF)
            out[k++] = (cprange){next, 0x10FFFF};
        m = k;
    }
    /* cut the surrogates out: [lo, hi] may become two ranges */
    size_t k = 0;
    cprange res[2 * m + 1];
    for (size_t i = 0; i < m; i++) {
        cprange c = out[i];
        if (c.hi < 0xD800 || c.lo > 0xDFFF) {
            res[k++] = c;
            continue;
        }
        if (c.lo < 0xD800)
            res[k++] = (cprange){c.lo, 0xD7FF};
        if (c.hi > 0xDFFF)
            res[k++] = (cprange){0xE000, c.hi};
    }
    memcpy(out, res, k * sizeof *out);
    return k;
}

/* A class of code points as elements appended to q: one byte set when all
 * its code points are one byte long (or it has one sequence), else a helper
 * rule whose alternatives are the byte sequences. */
static int lower_class(parser *p, seqv *q, cprange *r, size_t n, int negate)
{
    cprange *norm = malloc((2 * n + 4) * sizeof *norm);
    if (!norm)
        return oom(p);
    size_t m = normalize(r, n, negate, norm);
    if (m == 0) {
        free(norm);
        return fail(p, p->pos, TP_EFORMAT, "character class matches nothing%s", NULL);
    }
    bseqv bs = {0};
    for (size_t i = 0; i < m; i++)
        if (split_range(&bs, norm[i].lo, norm[i].hi)) {
            free(norm);
            free(bs.v);
            return oom(p);
        }
    free(norm);
    /* the one-byte sequences form one set */
    uint64_t ascii[4] = {0};
    size_t n_multi = 0, n_ascii = 0;
    for (size_t i = 0; i < bs.n; i++) {
        if (bs.v[i].n == 1) {
            n_ascii++;
            for (unsigned b = bs.v[i].lo[0]; b <= bs.v[i].hi[0]; b++)
                ascii[b >> 6] |= 1ull << (b & 63);
        } else
            n_multi++;
    }
    if (n_multi == 0) {
        int k = new_set(p, ascii);
        free(bs.v);
        return k < 0 ? p->rc : seq_push(p, q, (gel){GE_BYTES, (uint32_t)k});
    }
    if (n_multi == 1 && n_ascii == 0) {
        for (int j = 0; j < bs.v[0].n && !p->rc; j++) {
            int k = byte_set(p, bs.v[0].lo[j], bs.v[0].hi[j]);
            if (k >= 0)
                seq_push(p, q, (gel){GE_BYTES, (uint32_t)k});
        }
        free(bs.v);
        return p->rc;
    }
    int h = helper_rule(p);
    seqv alt = {0};
    if (h >= 0 && n_ascii) {
        int k = new_set(p, ascii);
        if (k >= 0 && !seq_push(p, &alt, (gel){GE_BYTES, (uint32_t)k}))
            add_alt(p, h, &alt);
    }
    for (size_t i = 0; h >= 0 && i < bs.n && !p->rc; i++) {
        if (bs.v[i].n == 1)
            continue;
        alt.n = 0;
        for (int j = 0; j < bs.v[i].n && !p->rc; j++) {
            int k = byte_set(p, bs.v[i].lo[j], bs.v[i].hi[j]);
            if (k >= 0)
                seq_push(p, &alt, (gel){GE_BYTES, (uint32_t)k});
        }
        if (!p->rc)
            add_alt(p, h, &alt);
    }
    free(alt.v);
    free(bs.v);
    if (p->rc)
        return p->rc;
    return seq_push(p, q, (gel){GE_REF, (uint32_t)h});
}

/* ---- lexical ---- */

static int at_end(parser *p) { return p->pos >= p->len; }
static int peek(parser *p) { return at_end(p) ? -1 : (unsigned char)p->s[p->pos]; }

static int is_word(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Skip blanks and comments; newlines too when nl. */
static void skip_space(parser *p, int nl)
{
    while (!at_end(p)) {
        int c = peek(p);
        if (c == ' ' || c == '\t' || c == '\r')
            p->pos++;
        else if (c == '\n' && nl)
            p->pos++;
        else if (c == '#') {
            while (!at_end(p) && peek(p) != '\n')
                p->pos++;
        } else
            break;
    }
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One character of a literal or class (escapes decoded, UTF-8 decoded). */
static int read_char(parser *p, uint32_t *cp)
{
    size_t at = p->pos;
    int c = peek(p);
    if (c < 0)
        return fail(p, at, TP_EFORMAT, "unexpected end of grammar%s", NULL);
    if (c == '\\') {
        p->pos++;
        int e = peek(p);
        int nhex = 0;
        p->pos++;
        switch (e) {
        case 'n': *cp = '\n'; return 0;
        case 'r': *cp = '\r'; return 0;
        case 't': *cp = '\t'; return 0;
        case '0': *cp = 0; return 0;
        case '\\': case '"': case '[': case ']': case '-': case '^': case '/': case '\'': case '.':
            *cp = (uint32_t)e;
            return 0;
        case 'x': nhex = 2; break;
        case 'u': nhex = 4; break;
        case 'U': nhex = 8; break;
        default:
            return fail(p, at, TP_EFORMAT, "unknown escape \\%s", e < 0 ? "" : (char[]){(char)e, 0});
        }
        uint32_t v = 0;
        for (int i = 0; i < nhex; i++) {
            int h = hexval(peek(p));
            if (h < 0)
                return fail(p, at, TP_EFORMAT, "escape needs %s hex digits", nhex == 2 ? "2" : nhex == 4 ? "4" : "8");
            v = v * 16 + (uint32_t)h;
            p->pos++;
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
            return fail(p, at, TP_EFORMAT, "escape names no character (surrogate or beyond U+10FFFF)%s", NULL);
        *cp = v;
        return 0;
    }
    if (c < 0x80) {
        if (c < 0x20 && c != '\t')
            return fail(p, at, TP_EFORMAT, "control character in a literal or class (escape it)%s", NULL);
        p->pos++;
        *cp = (uint32_t)c;
        return 0;
    }
    size_t n = tp_utf8_get((const uint8_t *)p->s + p->pos, p->len - p->pos, cp);
    if (!n)
        return fail(p, at, TP_EFORMAT, "invalid UTF-8%s", NULL);
    p->pos += n;
    return 0;
}

static int parse_int(parser *p, int *out)
{
    size_t at = p->pos;
    long v = 0;
    if (peek(p) < '0' || peek(p) > '9')
        return fail(p, at, TP_EFORMAT, "expected a number in {m,n}%s", NULL);
    while (peek(p) >= '0' && peek(p) <= '9') {
        v = v * 10 + (peek(p) - '0');
        if (v > p->lim.max_repeat)
            return fail(p, at, TP_ERANGE, "repetition count over the limit (grammar.max_repeat)%s", NULL);
        p->pos++;
    }
    *out = (int)v;
    return 0;
}

/* ---- token references ---- */

/* <[id]>, <text> (llama.cpp's: the text is everything from < to the first
 * >, both included, e.g. <|im_end|>) or tokpipe's <"text"> for a token
 * text of any other shape (the string's escapes as a literal's); a leading
 * ! negates. One GE_TOKEN element. */
static int parse_token_ref(parser *p, seqv *q)
{
    size_t at = p->pos;
    gtokref t = {.id = -1};
    if (peek(p) == '!')
        t.neg = 1, p->pos++;
    size_t s0 = p->pos++;   /* the '<' */
    if (peek(p) == '[') {
        p->pos++;
        long v = 0;
        if (peek(p) < '0' || peek(p) > '9')
            return fail(p, at, TP_EFORMAT, "expected a token id in <[id]>%s", NULL);
        while (peek(p) >= '0' && peek(p) <= '9') {
            v = v * 10 + (peek(p) - '0');
            if (v > 0x3FFFFFFF)
                return fail(p, at, TP_EFORMAT, "token id too large in <[id]>%s", NULL);
            p->pos++;
        }
        if (peek(p) != ']' || p->pos + 1 >= p->len || p->s[p->pos + 1] != '>')
            return fail(p, at, TP_EFORMAT, "expected ]> after the token id%s", NULL);
        p->pos += 2;
        t.id = (int32_t)v;
    } else if (peek(p) == '"') {
        p->pos++;
        seqv bytes = {0};
        while (!p->rc && peek(p) != '"') {
            uint32_t cp;
            if (at_end(p) || peek(p) == '\n') {
                fail(p, at, TP_EFORMAT, "unterminated token text in <\"...\">%s", NULL);
                break;
            }
            if (read_char(p, &cp))
                break;
            uint8_t b[4];
            size_t nb = tp_utf8_put(cp, (char *)b);
            for (size_t i = 0; i < nb; i++)
                if (seq_push(p, &bytes, (gel){GE_BYTES, b[i]}))
                    break;
        }
        if (!p->rc && (p->pos + 1 >= p->len || p->s[p->pos + 1] != '>'))
            fail(p, at, TP_EFORMAT, "expected \"> after the token text%s", NULL);
        if (!p->rc && !bytes.n)
            fail(p, at, TP_EFORMAT, "empty token text in <\"\">%s", NULL);
        if (!p->rc && !(t.text = malloc(bytes.n)))
            oom(p);
        if (p->rc) {
            free(bytes.v);
            return p->rc;
        }
        for (size_t i = 0; i < bytes.n; i++)
            t.text[i] = (char)bytes.v[i].v;
        t.len = bytes.n;
        free(bytes.v);
        p->pos += 2;
    } else {
        while (!at_end(p) && peek(p) != '>' && peek(p) != '\n')
            p->pos++;
        if (peek(p) != '>')
            return fail(p, at, TP_EFORMAT, "unterminated token reference (expected > on the same line)%s", NULL);
        p->pos++;
        t.len = p->pos - s0;
        for (size_t i = s0; i < p->pos; i++)
            if ((unsigned char)p->s[i] < 0x20)
                return fail(p, at, TP_EFORMAT, "control character in a token reference%s", NULL);
        if (!tp_utf8_valid((const uint8_t *)p->s + s0, t.len, NULL))
            return fail(p, at, TP_EFORMAT, "invalid UTF-8 in a token reference%s", NULL);
        if (!(t.text = malloc(t.len)))
            return oom(p);
        memcpy(t.text, p->s + s0, t.len);
    }
    tp_grammar *g = p->g;
    if (gr_grow((void **)&g->toks, &g->cap_toks, g->n_toks + 1, sizeof *g->toks)) {
        free(t.text);
        return oom(p);
    }
    size_t line, col;
    line_col(p, at, &line, &col);
    t.line = (int)line, t.col = (int)col;
    g->toks[g->n_toks] = t;
    return seq_push(p, q, (gel){GE_TOKEN, (uint32_t)g->n_toks++});
}

/* ---- syntax ---- */

static int parse_alternates(parser *p, int rule, int nested);

/* `x` as one element: itself when it is one, else a helper rule. */
static int as_one(parser *p, const seqv *atom, gel *out)
{
    if (atom->n == 1) {
        *out = atom->v[0];
        return 0;
    }
    int h = helper_rule(p);
    if (h < 0 || add_alt(p, h, atom))
        return p->rc;
    *out = (gel){GE_REF, (uint32_t)h};
    return 0;
}

/* R ::= x R | (x* ), or R ::= x | (x?) when !star; returns REF R. */
static int loop_rule(parser *p, gel x, int star, gel tail, gel *out)
{
    int h = helper_rule(p);
    if (h < 0)
        return p->rc;
    gel body[2] = {x, star ? (gel){GE_REF, (uint32_t)h} : tail};
    seqv a = {body, (star || tail.type != GE_END) ? 2 : 1, 2};
    seqv empty = {0};
    if (add_alt(p, h, &a) || add_alt(p, h, &empty))
        return p->rc;
    *out = (gel){GE_REF, (uint32_t)h};
    return 0;
}

static int apply_repeat(parser *p, seqv *q, const seqv *atom, int min, int max /* -1: no bound */)
{
    size_t at = p->pos;
    if (max >= 0 && max < min)
        return fail(p, at, TP_EFORMAT, "{m,n} with n < m%s", NULL);
    if ((size_t)min * atom->n > p->lim.max_elements ||
        (max > 0 && (size_t)max * (atom->n + 3) > p->lim.max_elements))
        return fail(p, at, TP_ERANGE, "repetition expands past the limit (grammar.max_elements)%s", NULL);
    for (int i = 0; i < min && !p->rc; i++)
        seq_append(p, q, atom);
    if (p->rc || max == min)
        return p->rc;
    gel x, r;
    if (as_one(p, atom, &x))
        return p->rc;
    if (max < 0) {
        if (loop_rule(p, x, 1, (gel){GE_END, 0}, &r))
            return p->rc;
        return seq_push(p, q, r);
    }
    /* (x (x (x)?)?)? built from the inside out */
    gel tail = {GE_END, 0};
    for (int i = 0; i < max - min && !p->rc; i++) {
        if (loop_rule(p, x, 0, tail, &r))
            return p->rc;
        tail = r;
        if ((i & 255) == 255 && check_time(p))
            return p->rc;
    }
    return seq_push(p, q, tail);
}

static int parse_sequence(parser *p, seqv *q, int nested)
{
    for (;;) {
        skip_space(p, nested);
        int c = peek(p);
        size_t at = p->pos;
        seqv atom = {0};
        if (c == '"') {
            p->pos++;
            while (!p->rc && peek(p) != '"') {
                if (at_end(p) || peek(p) == '\n') {
                    fail(p, at, TP_EFORMAT, "unterminated string literal%s", NULL);
                    break;
                }
                uint32_t cp;
                if (read_char(p, &cp))
                    break;
                uint8_t b[4];
                size_t nb = tp_utf8_put(cp, (char *)b);
                for (size_t i = 0; i < nb && !p->rc; i++) {
                    int k = byte_set(p, b[i], b[i]);
                    if (k >= 0)
                        seq_push(p, &atom, (gel){GE_BYTES, (uint32_t)k});
                }
            }
            if (!p->rc)
                p->pos++;
        } else if (c == '[') {
            p->pos++;
            int neg = 0;
            if (peek(p) == '^')
                neg = 1, p->pos++;
            cprange *rs = NULL;
            size_t nr = 0, cap = 0;
            while (!p->rc && peek(p) != ']') {
                if (at_end(p) || peek(p) == '\n') {
                    fail(p, at, TP_EFORMAT, "unterminated character class%s", NULL);
                    break;
                }
                uint32_t lo, hi;
                if (read_char(p, &lo))
                    break;
                hi = lo;
                if (peek(p) == '-' && p->pos + 1 < p->len && p->s[p->pos + 1] != ']') {
                    p->pos++;
                    if (read_char(p, &hi))
                        break;
                    if (hi < lo) {
                        fail(p, at, TP_EFORMAT, "class range out of order%s", NULL);
                        break;
                    }
                }
                if (gr_grow((void **)&rs, &cap, nr + 1, sizeof *rs)) {
                    oom(p);
                    break;
                }
                rs[nr++] = (cprange){lo, hi};
            }
            if (!p->rc) {
                p->pos++;
                if (!nr && !neg)
                    fail(p, at, TP_EFORMAT, "empty character class%s", NULL);
                else
                    lower_class(p, &atom, rs, nr, neg);
            }
            free(rs);
        } else if (c == '.') {
            p->pos++;
            if (p->any_rule < 0) {
                cprange all = {0, 0x10FFFF};
                lower_class(p, &atom, &all, 1, 0);
                if (!p->rc)
                    p->any_rule = (int)atom.v[0].v;
            } else
                seq_push(p, &atom, (gel){GE_REF, (uint32_t)p->any_rule});
        } else if (c == '(') {
            p->pos++;
            if (++p->depth > p->lim.max_nesting) {
                fail(p, at, TP_ERANGE, "groups nested deeper than the limit (grammar.max_nesting)%s", NULL);
            } else {
                int h = helper_rule(p);
                if (h >= 0 && !parse_alternates(p, h, 1)) {
                    skip_space(p, 1);
                    if (peek(p) != ')')
                        fail(p, at, TP_EFORMAT, "missing ) for this group%s", NULL);
                    else {
                        p->pos++;
                        seq_push(p, &atom, (gel){GE_REF, (uint32_t)h});
                    }
                }
            }
            p->depth--;
        } else if (is_word(c)) {
            size_t s0 = p->pos;
            while (is_word(peek(p)))
                p->pos++;
            /* a name followed by ::= starts the next rule */
            size_t save = p->pos;
            skip_space(p, 0);
            if (p->pos + 3 <= p->len && !memcmp(p->s + p->pos, "::=", 3)) {
                p->pos = s0;
                return 0;
            }
            p->pos = save;
            int r = find_rule(p, p->s + s0, p->pos - s0);
            if (r < 0 && (r = add_rule(p, p->s + s0, p->pos - s0)) >= 0)
                p->g->rules[r].ref_at = s0;
            if (r >= 0)
                seq_push(p, &atom, (gel){GE_REF, (uint32_t)r});
        } else if (c == '<' || (c == '!' && p->pos + 1 < p->len && p->s[p->pos + 1] == '<')) {
            parse_token_ref(p, &atom);
        } else
            return p->rc;   /* end of the sequence: | ) newline or end */
        if (p->rc) {
            free(atom.v);
            return p->rc;
        }
        /* repetition */
        c = peek(p);
        if (c == '*' || c == '+' || c == '?') {
            p->pos++;
            apply_repeat(p, q, &atom, c == '+', c == '?' ? 1 : -1);
        } else if (c == '{') {
            p->pos++;
            int m = 0, n = -1;
            skip_space(p, 0);
            if (peek(p) != ',')
                parse_int(p, &m);
            skip_space(p, 0);
            if (!p->rc && peek(p) == ',') {
                p->pos++;
                skip_space(p, 0);
                if (peek(p) != '}')
                    parse_int(p, &n);
            } else
                n = m;
            skip_space(p, 0);
            if (!p->rc && peek(p) != '}')
                fail(p, p->pos, TP_EFORMAT, "expected } after {m,n}%s", NULL);
            if (!p->rc) {
                p->pos++;
                apply_repeat(p, q, &atom, m, n);
            }
        } else
            seq_append(p, q, &atom);
        free(atom.v);
        if (p->rc)
            return p->rc;
    }
}

static int parse_alternates(parser *p, int rule, int nested)
{
    seqv q = {0};
    for (;;) {
        q.n = 0;
        if (parse_sequence(p, &q, nested) || add_alt(p, rule, &q))
            break;
        skip_space(p, nested);
        if (peek(p) != '|')
            break;
        p->pos++;
        skip_space(p, 1);
    }
    free(q.v);
    return p->rc;
}

static int parse_rule(parser *p)
{
    size_t at = p->pos;
    size_t s0 = p->pos;
    while (is_word(peek(p)))
        p->pos++;
    if (p->pos == s0)
        return fail(p, at, TP_EFORMAT, "expected a rule name%s", NULL);
    size_t nlen = p->pos - s0;
    skip_space(p, 0);
    if (p->pos + 3 > p->len || memcmp(p->s + p->pos, "::=", 3))
        return fail(p, p->pos, TP_EFORMAT, "expected ::= after the rule name%s", NULL);
    p->pos += 3;
    int r = find_rule(p, p->s + s0, nlen);
    if (r >= 0 && p->g->rules[r].defined) {
        char name[130];
        snprintf(name, sizeof name, "%.*s", (int)(nlen > 120 ? 120 : nlen), p->s + s0);
        return fail(p, at, TP_EFORMAT, "rule %s is defined twice", name);
    }
    if (r < 0 && (r = add_rule(p, p->s + s0, nlen)) < 0)
        return p->rc;
    p->g->rules[r].defined = 1;
    p->cur_rule = r;
    p->n_helpers = 0;
    skip_space(p, 1);
    if (parse_alternates(p, r, 0))
        return p->rc;
    skip_space(p, 0);
    /* a word here is the next rule's name (the sequence stopped at its ::=) */
    if (!at_end(p) && peek(p) != '\n' && !is_word(peek(p)))
        return fail(p, p->pos, TP_EFORMAT, "unexpected character%s", NULL);
    return 0;
}

/* ---- checks after parsing ---- */

/* Left recursion would make the runtime expand forever: refuse it. A rule
 * reaches B "on the left" through the references that can come first in one
 * of its alternatives (after nullable ones). */
static int check_left_recursion(parser *p)
{
    tp_grammar *g = p->g;
    int n = g->n_rules;
    char *nullable = calloc((size_t)n, 1);
    char *color = calloc((size_t)n, 1);
    int *stack = malloc((size_t)n * 2 * sizeof *stack);
    if (!nullable || !color || !stack) {
        free(nullable), free(color), free(stack);
        return oom(p);
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < n; r++) {
            if (nullable[r])
                continue;
            for (int a = 0; a < g->rules[r].n_alts && !nullable[r]; a++) {
                size_t e = g->rules[r].alts[a];
                while (g->el[e].type == GE_REF && nullable[g->el[e].v])
                    e++;
                if (g->el[e].type == GE_END)
                    nullable[r] = 1, changed = 1;
            }
        }
    }
    /* iterative DFS over left-corner edges; stack holds (rule, next alt*BIG+elem) */
    for (int s = 0; s < n && !p->rc; s++) {
        if (color[s])
            continue;
        int sp = 0;
        stack[sp++] = s;
        stack[sp++] = 0;
        color[s] = 1;
        while (sp && !p->rc) {
            int r = stack[sp - 2];
            int k = stack[sp - 1]++;
            /* enumerate left-corner refs: k indexes (alt, position) pairs in order */
            int found = -1, idx = 0;
            for (int a = 0; a < g->rules[r].n_alts && found < 0; a++) {
                size_t e = g->rules[r].alts[a];
                for (; g->el[e].type == GE_REF; e++) {
                    if (idx++ == k) {
                        found = (int)g->el[e].v;
                        break;
                    }
                    if (!nullable[g->el[e].v])
                        break;
                }
            }
            if (found < 0) {
                color[r] = 2;
                sp -= 2;
                continue;
            }
            if (color[found] == 1) {
                /* name the user's rule, not a helper made from it */
                fail(p, g->rules[found].ref_at, TP_EFORMAT, "left recursion through rule %s", g->rules[found].name);
            } else if (color[found] == 0) {
                color[found] = 1;
                stack[sp++] = found;
                stack[sp++] = 0;
            }
        }
    }
    free(nullable), free(color), free(stack);
    return p->rc;
}

int tp_grammar_compile(const char *gbnf, size_t len, const tp_grammar_limits *limits, tp_grammar **out,
                       tp_err *err)
{
    *out = NULL;
    parser p = {.s = gbnf, .len = len, .err = err, .cur_rule = -1, .any_rule = -1};
    if (limits)
        p.lim = *limits;
    else
        tp_grammar_limits_default(&p.lim);
    if (len > p.lim.max_bytes)
        return tp_err_set(err, TP_ERANGE, "grammar: %zu bytes, more than the limit %zu (grammar.max_bytes)", len,
                          p.lim.max_bytes);
    memset(p.single, -1, sizeof p.single);
    clock_gettime(CLOCK_MONOTONIC, &p.t0);
    p.g = calloc(1, sizeof *p.g);
    if (!p.g)
        return tp_err_set(err, TP_ENOMEM, "grammar: out of memory");
    for (;;) {
        skip_space(&p, 1);
        if (at_end(&p) || parse_rule(&p))
            break;
    }
    for (int r = 0; !p.rc && r < p.g->n_rules; r++)
        if (!p.g->rules[r].defined)
            fail(&p, p.g->rules[r].ref_at, TP_EFORMAT, "undefined rule %s", p.g->rules[r].name);
    if (!p.rc) {
        p.g->root = find_rule(&p, "root", 4);
        if (p.g->root < 0)
            fail(&p, len, TP_EFORMAT, "no rule named root%s", NULL);
    }
    if (!p.rc)
        check_left_recursion(&p);
    if (!p.rc)
        check_time(&p);
    if (p.rc) {
        tp_grammar_free(p.g);
        return p.rc;
    }
    *out = p.g;
    return 0;
}

void tp_grammar_free(tp_grammar *g)
{
    if (!g)
        return;
    for (int i = 0; i < g->n_rules; i++) {
        free(g->rules[i].name);
        free(g->rules[i].alts);
    }
    free(g->rules);
    for (size_t i = 0; i < g->n_toks; i++)
        free(g->toks[i].text);
    free(g->toks);
    free(g->el);
    free(g->sets);
    free(g);
}

int tp_grammar_n_rules(const tp_grammar *g) { return g->n_rules; }

size_t tp_grammar_n_token_refs(const tp_grammar *g) { return g->n_toks; }


/* ---- printing ---- */

static void print_byte(tp_buf *b, unsigned c)
{
    if (c >= 0x21 && c < 0x7F && c != '\\' && c != ']' && c != '[' && c != '-' && c != '^' && c != '"')
        tp_buf_printf(b, "%c", (char)c);
    else
        tp_buf_printf(b, "\\x%02X", c);
}

static void print_set(tp_buf *b, const uint64_t *s)
{
    int n = 0;
    for (unsigned c = 0; c < 256; c++)
        n += gset_has(s, c);
    if (n == 1) {
        for (unsigned c = 0; c < 256; c++)
            if (gset_has(s, c)) {
                if (c >= 0x20 && c < 0x7F && c != '"' && c != '\\')
                    tp_buf_printf(b, "\"%c\"", (char)c);
                else
                    tp_buf_printf(b, "[\\x%02X]", c);
            }
        return;
    }
    tp_buf_printf(b, "[");
    for (unsigned c = 0; c < 256;) {
        if (!gset_has(s, c)) {
            c++;
            continue;
        }
        unsigned e = c;
        while (e + 1 < 256 && gset_has(s, e + 1))
            e++;
        print_byte(b, c);
        if (e > c) {
            tp_buf_printf(b, "-");
            print_byte(b, e);
        }
        c = e + 1;
    }
    tp_buf_printf(b, "]");
}

static void set_bounds(const uint64_t *s, unsigned *lo, unsigned *hi, int *contiguous)
{
    *lo = 256, *hi = 0;
    for (unsigned c = 0; c < 256; c++)
        if (gset_has(s, c)) {
            if (*lo == 256)
                *lo = c;
            *hi = c;
        }
    *contiguous = 1;
    for (unsigned c = *lo; c <= *hi && c < 256; c++)
        if (!gset_has(s, c))
            *contiguous = 0;
}

/* Elements el[e..] that spell one UTF-8 sequence of contiguous byte ranges
 * (what the lowering makes of a literal character or a class range): the
 * code point range they cover, and how many elements. 0 if not such a run. */
static int utf8_run(const tp_grammar *g, size_t e, uint32_t *lo, uint32_t *hi)
{
    unsigned a, b;
    int c;
    set_bounds(g->sets[g->el[e].v], &a, &b, &c);
    int n = a >= 0xC2 && b <= 0xDF ? 2 : a >= 0xE0 && b <= 0xEF ? 3 : a >= 0xF0 && b <= 0xF4 ? 4 : 0;
    if (!n || !c)
        return 0;
    *lo = a & (0x7Fu >> n), *hi = b & (0x7Fu >> n);
    for (int k = 1; k < n; k++) {
        if (g->el[e + (size_t)k].type != GE_BYTES)
            return 0;
        set_bounds(g->sets[g->el[e + (size_t)k].v], &a, &b, &c);
        if (!c || a < 0x80 || b > 0xBF)
            return 0;
        *lo = *lo << 6 | (a & 0x3F), *hi = *hi << 6 | (b & 0x3F);
    }
    return n;
}

/* A token reference as the compiler reads it back: <[id]>; <text> when the
 * text is llama.cpp's shape (starts with <, ends with its only >, one
 * line); else <"text"> with a literal's escapes. */
static void print_token(tp_buf *b, const char *text, size_t len, int32_t id, int neg)
{
    if (neg)
        tp_buf_printf(b, "!");
    if (!text) {
        tp_buf_printf(b, "<[%d]>", (int)id);
        return;
    }
    bool plain = len >= 2 && text[0] == '<' && text[len - 1] == '>' && !memchr(text, '>', len - 1);
    for (size_t i = 0; plain && i < len; i++)
        plain = (unsigned char)text[i] >= 0x20;
    if (plain) {
        tp_buf_printf(b, "%.*s", (int)len, text);
        return;
    }
    tp_buf_printf(b, "<\"");
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c == '"' || c == '\\')
            tp_buf_printf(b, "\\%c", c);
        else if (c < 0x20 || c == 0x7F)
            tp_buf_printf(b, "\\x%02X", c);
        else
            tp_buf_printf(b, "%c", c);
    }
    tp_buf_printf(b, "\">");
}

char *tp_grammar_token_ref(const char *text, size_t len, bool negated)
{
    tp_buf b = {0};
    print_token(&b, text, len, -1, negated);
    if (b.err)
        free(b.data);
    return b.err ? NULL : b.data;
}

char *tp_grammar_print(const tp_grammar *g)
{
    tp_buf b = {0};
    for (int r = 0; r < g->n_rules; r++) {
        tp_buf_printf(&b, "%s ::=", g->rules[r].name);
        for (int a = 0; a < g->rules[r].n_alts; a++) {
            if (a)
                tp_buf_printf(&b, " |");
            size_t e = g->rules[r].alts[a];
            if (g->el[e].type == GE_END)
                tp_buf_printf(&b, " \"\"");
            while (g->el[e].type != GE_END) {
                tp_buf_printf(&b, " ");
                uint32_t lo, hi;
                int n;
                if (g->el[e].type == GE_REF) {
                    tp_buf_printf(&b, "%s", g->rules[g->el[e].v].name);
                    e++;
                } else if (g->el[e].type == GE_TOKEN) {
                    const gtokref *t = &g->toks[g->el[e].v];
                    print_token(&b, t->text, t->len, t->id, t->neg);
                    e++;
                } else if ((n = utf8_run(g, e, &lo, &hi)) > 0) {
                    if (lo == hi)
                        tp_buf_printf(&b, "\"\\U%08X\"", (unsigned)lo);
                    else
                        tp_buf_printf(&b, "[\\U%08X-\\U%08X]", (unsigned)lo, (unsigned)hi);
                    e += (size_t)n;
                } else {
                    /* bytes that are not a whole character cannot be spelt
                     * in GBNF (it speaks code points): printed as \x, the
                     * debug view only */
                    print_set(&b, g->sets[g->el[e].v]);
                    e++;
                }
            }
        }
        tp_buf_printf(&b, "\n");
    }
    if (b.err || !b.data) {
        free(b.data);
        return b.err ? NULL : strdup("");
    }
    return b.data;
}

int tp_grammar_check_tokens(const tp_grammar *g, const tp_gnames *names, int32_t *ids, tp_err *err)
{
    for (size_t i = 0; i < g->n_toks; i++) {
        const gtokref *t = &g->toks[i];
        int32_t id = t->id;
        if (!t->text) {
            if (id >= names->n_vocab)
                return tp_err_set(err, TP_EINVAL,
                                  "grammar: line %d col %d: token <[%d]> is outside the vocabulary (%d tokens)",
                                  t->line, t->col, (int)id, names->n_vocab);
        } else {
            id = names->find ? names->find(names->ctx, t->text, t->len) : -1;
            if (id < 0 || id >= names->n_vocab) {
                tp_buf b = {0};
                print_token(&b, t->text, t->len, -1, 0);
                int rc = tp_err_set(err, TP_EINVAL,
                                    "grammar: line %d col %d: token %.200s is not a special token of the model's "
                                    "vocabulary",
                                    t->line, t->col, b.data && !b.err ? b.data : "reference");
                free(b.data);
                return rc;
            }
        }
        if (ids)
            ids[i] = id;
    }
    return 0;
}
