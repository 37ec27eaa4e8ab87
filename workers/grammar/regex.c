/* Regular expressions (the subset JSON Schema's `pattern` needs, ECMA-262
 * syntax) -> GBNF. A pattern is parsed to a small tree, checked against the
 * expansion bounds, then written as one GBNF expression: classes become
 * [..], groups (..), quantifiers stay {m,n}. Matching is ECMA's search: an
 * unanchored side may hold any characters. Greedy and lazy quantifiers match
 * the same set of strings, so lazy ones are accepted; everything whose
 * language is not regular or not known here (backreferences, lookaround,
 * \b, \p{..}, flags) is refused naming it. */
#include "tokpipe/utf8.h"
#include "jschema_int.h"
#include "tokpipe/jschema.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { RX_SET, RX_SEQ, RX_ALT, RX_REP, RX_BOL, RX_EOL };

typedef struct rxn {
    int kind;
    cset set;
    int *kid;
    int nk, ck;
    long min, max; /* RX_REP; max -1 = unbounded */
} rxn;

typedef struct rxp {
    const char *s;
    size_t n, i;
    rxn *node;
    int nn, cn;
    int depth, max_depth;
    tp_err *err;
    int rc;
} rxp;

#define RX_MAX_NODES 20000

static int rx_fail(rxp *p, int code, const char *fmt, const char *what)
{
    if (!p->rc) {
        p->rc = code;
        tp_err_set(p->err, code, fmt, what, (unsigned)p->i);
    }
    return -1;
}

static int rx_new(rxp *p, int kind)
{
    if (p->rc) return -1;
    if (p->nn >= RX_MAX_NODES) return rx_fail(p, TP_ERANGE, "pattern: %s (at offset %u)", "too many parts");
    if (p->nn == p->cn) {
        int cn = p->cn ? p->cn * 2 : 32;
        rxn *nn = realloc(p->node, (size_t)cn * sizeof *nn);
        if (!nn) return rx_fail(p, TP_ENOMEM, "pattern: %s (at offset %u)", "out of memory");
        p->node = nn;
        p->cn = cn;
    }
    rxn *x = &p->node[p->nn];
    memset(x, 0, sizeof *x);
    x->kind = kind;
    return p->nn++;
}

static void rx_kid(rxp *p, int parent, int kid)
{
    rxn *x = &p->node[parent];
    if (x->nk == x->ck) {
        int ck = x->ck ? x->ck * 2 : 4;
        int *k = realloc(x->kid, (size_t)ck * sizeof *k);
        if (!k) {
            rx_fail(p, TP_ENOMEM, "pattern: %s (at offset %u)", "out of memory");
            return;
        }
        x->kid = k;
        x->ck = ck;
    }
    x->kid[x->nk++] = kid;
}

static bool at(const rxp *p, char c)
{
    return p->i < p->n && p->s[p->i] == c;
}

static void set_digit(cset *s) { jcs_add(s, '0', '9'); }
static void set_word(cset *s)
{
    jcs_add(s, '0', '9');
    jcs_add(s, 'A', 'Z');
    jcs_add(s, '_', '_');
    jcs_add(s, 'a', 'z');
}
/* ECMA-262 WhiteSpace + LineTerminator */
static void set_space(cset *s)
{
    jcs_add(s, 0x09, 0x0D);
    jcs_add(s, 0x20, 0x20);
    jcs_add(s, 0xA0, 0xA0);
    jcs_add(s, 0x1680, 0x1680);
    jcs_add(s, 0x2000, 0x200A);
    jcs_add(s, 0x2028, 0x2029);
    jcs_add(s, 0x202F, 0x202F);
    jcs_add(s, 0x205F, 0x205F);
    jcs_add(s, 0x3000, 0x3000);
    jcs_add(s, 0xFEFF, 0xFEFF);
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool rx_hex(rxp *p, int digits, uint32_t *v)
{
    uint32_t x = 0;
    for (int k = 0; k < digits; k++) {
        if (p->i >= p->n || hexval(p->s[p->i]) < 0) return false;
        x = x * 16 + (uint32_t)hexval(p->s[p->i++]);
    }
    *v = x;
    return true;
}

/* After a backslash: either a class escape (fills set, returns 1) or one
 * code point (fills *cp, returns 0); -1 on error. in_class: inside [..]. */
static int rx_escape(rxp *p, bool in_class, cset *set, uint32_t *cp)
{
    if (p->i >= p->n) return rx_fail(p, TP_EINVAL, "pattern: %s (at offset %u)", "trailing backslash");
    char c = p->s[p->i++];
    switch (c) {
    case 'd': set_digit(set); return 1;
    case 'w': set_word(set); return 1;
    case 's': set_space(set); return 1;
    case 'D': set_digit(set); jcs_negate(set); return 1;
    case 'W': set_word(set); jcs_negate(set); return 1;
    case 'S': set_space(set); jcs_negate(set); return 1;
    case 't': *cp = '\t'; return 0;
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 'v': *cp = '\v'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'b':
        if (in_class) {
            *cp = '\b';
            return 0;
        }
        return rx_fail(p, TP_EINVAL, "pattern: %s not supported (at offset %u)", "word boundary \\b");
    case 'B': return rx_fail(p, TP_EINVAL, "pattern: %s not supported (at offset %u)", "\\B");
    case '0':
        if (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
            return rx_fail(p, TP_EINVAL, "pattern: %s not supported (at offset %u)", "octal escape");
        *cp = 0;
        return 0;
    case 'x':
        if (!rx_hex(p, 2, cp)) return rx_fail(p, TP_EINVAL, "pattern: %s (at offset %u)", "bad \\x escape");
        return 0;
    case 'u':
        if (at(p, '{')) {
            p->i++;
            uint32_t v = 0;
            int k = 0;
            while (p->i < p->n && hexval(p->s[p->i]) >= 0 && k < 7) v = v * 16 + (uint32_t)hexval(p->s[p->i++]), k++;
            if (!k || !at(p, '}') || v > JS_MAX_CP)
                return rx_fail(p, TP_EINVAL, "pattern: %s (at offset %u)", "bad \\u{...} escape");
            p->i++;
            *cp = v;
        } else if (!rx_hex(p, 4, cp)) {
            return rx_fail(p, TP_EINVAL, "pattern: %s (at offset %u)", "bad \\u escape");
        }
        if (*cp >= 0xD800 && *cp <= 0xDBFF && p->i + 6 <= p->n && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
            size_t save = p->i;
            uint32_t lo;
            p->i += 2;
            if (rx_hex(p, 4, &lo) && lo >= 0xDC00 && lo <= 0xDFFF) {
                *cp = 0x10000 + ((*cp - 0xD800) << 10) + (lo - 0xDC00);
                return 0;
            }
            p->i = save;
        }
        if (*cp >= 0xD800 && *cp <= 0xDFFF)
            return rx_fail(p, TP_EINVAL, "pattern: %s not supported (at offset %u)", "lone surrogate escape");
        return 0;
    case 'c':
        if (p->i < p->n && ((p->s[p->i] >= 'a' && p->s[p->i] <= 'z') || (p->s[p->i] >= 'A' && p->s[p->i] <= 'Z'))) {
            *cp = (uint32_t)(p->s[p->i++] % 32);
            return 0;
        }
        return rx_fail(p, TP_EINVAL, "pattern: %s (at offset %u)", "bad \\c escape");
    case 'p':
    case 'P': return rx_fail(p, TP_EINVAL, "pattern: %s not supported (at offset %u)", "Unicode property escape \\p");
    case 'k': return rx_fail(p, TP_EINVAL, "pattern: %s not supported (at offset %u)", "named backreference \\k");
    default: break;
    }
    if (c >= '1' && c <= '9') return rx_fail(p, TP_EINVAL, "pattern: %s not supported (at offset %u)", "backreference");
    /* identity escapes: the syntax characters, '/', and '-' in a class */
    if (strchr("^$\\.*+?()[]{}|/", c) || (in_class && c == '-')) {
        *cp = (unsigned char)c;
        return 0;
    }
    p->i--;
    return rx_fail(p, TP_EINVAL, "pattern: %s not supported (at offset %u)", "this escape");
}

/* one literal code point of the pattern text (UTF-8) */
static bool rx_char(rxp *p, uint32_t *cp)
{
    int k = js_utf8_next((const unsigned char *)p->s + p->i, p->n - p->i, cp);
    if (!k) {
        rx_fail(p, TP_EINVAL, "pattern: %s (at offset %u)", "invalid UTF-8");
        return false;
    }
    p->i += (size_t)k;
    return true;
}

static int rx_class(rxp *p)
{
    int x = rx_new(p, RX_SET);
    if (x < 0) return -1;
    bool neg = at(p, '^');
    if (neg) p->i++;
    cset s = {0};
    bool first = true;
    while (!p->rc) {
        if (p->i >= p->n) {
            rx_fail(p, TP_EINVAL, "pattern: %s (at offset %u)", "unterminated [");
            break;
        }
        if (p->s[p->i] == ']' && !first) {
            p->i++;
            break;
        }
        first = false;
        uint32_t lo, hi;
        cset sub = {0};
        int r;
        if (p->s[p->i] == '\\') {
            p->i++;
            r = rx_escape(p, true, &sub, &lo);
        } else {
            r = rx_char(p, &lo) ? 0 : -1;
        }
        if (r < 0) {
            jcs_free(&sub);
            break;
        }
        if (r == 1) {
            jcs_add_set(&s, &sub);
            jcs_free(&sub);
            continue;
        }
        if (at(p, '-') && p->i + 1 < p->n && p->s[p->i + 1] != ']') {
            p->i++;
            if (p->s[p->i] == '\\') {
                p->i++;
                r = rx_escape(p, true, &sub, &hi);
            } else {
                r = rx_char(p, &hi) ? 0 : -1;
            }
            if (r != 0 || hi < lo) {
                jcs_free(&sub);
                if (!p->rc) rx_fail(p, TP_EINVAL, "pattern: %s (at offset %u)", "bad range in [...]");
                break;
            }
        } else {
            hi = lo;
        }
        jcs_add(&s, lo, hi);
    }
    if (neg) jcs_negate(&s);
    if (s.oom) rx_fail(p, TP_ENOMEM, "pattern: %s (at offset %u)", "out of memory");
    p->node[x].set = s;
    return p->rc ? -1 : x;
}

static int rx_alt(rxp *p);
static void rx_measure(const rxp *p, int x, size_t *lo, size_t *hi, size_t *w);

static bool rx_number(rxp *p, long *v)
{
    if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return false;
    long x = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        x = x * 10 + (p->s[p->i++] - '0');
        if (x > RX_MAX_REPEAT) x = RX_MAX_REPEAT + 1; /* refused by the caller */
    }
    *v = x;
    return true;
}

/* {m} {m,} {m,n} at p->i; false (position unchanged) when it is not one,
 * in which case ECMA (Annex B) reads the '{' as a literal */
static bool rx_braces(rxp *p, long *min, long *max)
{
    size_t save = p->i;
    long lo, hi;
    p->i++;
    if (!rx_number(p, &lo)) goto no;
    hi = lo;
    if (at(p, ',')) {
        p->i++;
        hi = -1;
        if (!at(p, '}') && !rx_number(p, &hi)) goto no;
    }
    if (!at(p, '}')) goto no;
    p->i++;
    /* only a whole quantifier is one (min/max untouched otherwise) */
    *min = lo;
    *max = hi;
    return true;
no:
    p->i = save;
    return false;
}

static int rx_atom(rxp *p)
{
    char c = p->s[p->i];
    int x;
    uint32_t cp;
    switch (c) {
    case '(':
        p->i++;
        if (at(p, '?')) {
            if (p->i + 1 < p->n && p->s[p->i + 1] == ':') {
                p->i += 2;
            } else if (p->i + 1 < p->n && p->s[p->i + 1] == '<' && p->i + 2 < p->n && p->s[p->i + 2] != '=' &&
                       p->s[p->i + 2] != '!') {
                const char *e = memchr(p->s + p->i, '>', p->n - p->i);
                if (!e) return rx_fail(p, TP_EINVAL, "pattern: %s (at offset %u)", "bad group name");
                p->i = (size_t)(e - p->s) + 1;
            } else {
                return rx_fail(p, TP_EINVAL, "pattern: %s not supported (at offset %u)",
                               "lookaround or inline flag (?...)");
            }
        }
        if (++p->depth > p->max_depth) return rx_fail(p, TP_ERANGE, "pattern: %s (at offset %u)", "groups nested too deep");
        x = rx_alt(p);
        p->depth--;
        if (x < 0) return -1;
        if (!at(p, ')')) return rx_fail(p, TP_EINVAL, "pattern: %s (at offset %u)", "missing )");
        p->i++;
        return x;
    case ')': return rx_fail(p, TP_EINVAL, "pattern: %s (at offset %u)", "unmatched )");
    case '^':
    case '$':
        p->i++;
        return rx_new(p, c == '^' ? RX_BOL : RX_EOL);
    case '*':
    case '+':
    case '?': return rx_fail(p, TP_EINVAL, "pattern: %s (at offset %u)", "nothing to repeat");
    case '[':
        p->i++;
        return rx_class(p);
    case '.':
        p->i++;
        x = rx_new(p, RX_SET);
        if (x < 0) return -1;
        jcs_add(&p->node[x].set, '\n', '\n');
        jcs_add(&p->node[x].set, '\r', '\r');
        jcs_add(&p->node[x].set, 0x2028, 0x2029);
        jcs_negate(&p->node[x].set);
        return x;
    case '\\': {
        p->i++;
        cset s = {0};
        int r = rx_escape(p, false, &s, &cp);
        if (r < 0) {
            jcs_free(&s);
            return -1;
        }
        x = rx_new(p, RX_SET);
        if (x < 0) {
            jcs_free(&s);
            return -1;
        }
        if (r == 0) jcs_add(&s, cp, cp);
        p->node[x].set = s;
        return x;
    }
    default:
        if (!rx_char(p, &cp)) return -1;
        x = rx_new(p, RX_SET);
        if (x < 0) return -1;
        jcs_add(&p->node[x].set, cp, cp);
        return x;
    }
}

static int rx_seq(rxp *p)
{
    int seq = rx_new(p, RX_SEQ);
    while (seq >= 0 && !p->rc && p->i < p->n && p->s[p->i] != '|' && p->s[p->i] != ')') {
        int a = rx_atom(p);
        if (a < 0) return -1;
        long min = -2, max = -2;
        if (at(p, '*')) min = 0, max = -1, p->i++;
        else if (at(p, '+')) min = 1, max = -1, p->i++;
        else if (at(p, '?')) min = 0, max = 1, p->i++;
        else if (at(p, '{') && rx_braces(p, &min, &max)) {
            if (min > RX_MAX_REPEAT || max > RX_MAX_REPEAT)
                return rx_fail(p, TP_ERANGE, "pattern: %s (at offset %u)", "repetition count above 100000");
            if (max >= 0 && max < min) return rx_fail(p, TP_EINVAL, "pattern: %s (at offset %u)", "{m,n} with n < m");
        }
        if (min != -2) {
            if (p->node[a].kind == RX_BOL || p->node[a].kind == RX_EOL)
                return rx_fail(p, TP_EINVAL, "pattern: %s (at offset %u)", "quantified anchor");
            if (at(p, '?')) p->i++; /* lazy: same language */
            if (at(p, '*') || at(p, '+') || at(p, '?') || at(p, '{'))
                if (!at(p, '{') || rx_braces(p, &(long){0}, &(long){0}))
                    return rx_fail(p, TP_EINVAL, "pattern: %s (at offset %u)", "nothing to repeat");
            if (max < 0) {
                /* an unbounded repetition of something that can be empty
                 * would be a left-recursive rule for the engine */
                size_t lo, hi, w;
                rx_measure(p, a, &lo, &hi, &w);
                if (!lo)
                    return rx_fail(p, TP_EINVAL, "pattern: %s not supported (at offset %u)",
                                   "an unbounded repetition of something that can be empty, like (a?)*,");
            }
            int r = rx_new(p, RX_REP);
            if (r < 0) return -1;
            p->node[r].min = min;
            p->node[r].max = max;
            rx_kid(p, r, a);
            a = r;
        }
        rx_kid(p, seq, a);
    }
    return p->rc ? -1 : seq;
}

static int rx_alt(rxp *p)
{
    int first = rx_seq(p);
    if (first < 0 || !at(p, '|')) return first;
    int alt = rx_new(p, RX_ALT);
    if (alt < 0) return -1;
    rx_kid(p, alt, first);
    while (!p->rc && at(p, '|')) {
        p->i++;
        int s = rx_seq(p);
        if (s < 0) return -1;
        rx_kid(p, alt, s);
    }
    return p->rc ? -1 : alt;
}

static bool has_anchor(const rxp *p, int x)
{
    const rxn *n = &p->node[x];
    if (n->kind == RX_BOL || n->kind == RX_EOL) return true;
    for (int k = 0; k < n->nk; k++)
        if (has_anchor(p, n->kid[k])) return true;
    return false;
}

static size_t sat_add(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }
static size_t sat_mul(size_t a, size_t b) { return b && a > SIZE_MAX / b ? SIZE_MAX : a * b; }

/* lengths in code points and the unrolled size (bounded, saturating) */
static void rx_measure(const rxp *p, int x, size_t *lo, size_t *hi, size_t *w)
{
    const rxn *n = &p->node[x];
    size_t a, b, c;
    switch (n->kind) {
    case RX_SET: *lo = *hi = *w = 1; return;
    case RX_BOL:
    case RX_EOL: *lo = *hi = 0, *w = 1; return;
    case RX_REP:
        rx_measure(p, n->kid[0], &a, &b, &c);
        *lo = sat_mul(a, (size_t)n->min);
        *hi = n->max < 0 ? (b ? SIZE_MAX : 0) : sat_mul(b, (size_t)n->max);
        *w = sat_mul(c, (size_t)(n->max < 0 ? n->min + 1 : (n->max ? n->max : 1)));
        return;
    case RX_SEQ:
        *lo = *hi = 0, *w = 1;
        for (int k = 0; k < n->nk; k++) {
            rx_measure(p, n->kid[k], &a, &b, &c);
            *lo = sat_add(*lo, a), *hi = sat_add(*hi, b), *w = sat_add(*w, c);
        }
        return;
    default: /* RX_ALT */
        *lo = SIZE_MAX, *hi = 0, *w = 1;
        for (int k = 0; k < n->nk; k++) {
            rx_measure(p, n->kid[k], &a, &b, &c);
            if (a < *lo) *lo = a;
            if (b > *hi) *hi = b;
            *w = sat_add(*w, c);
        }
    }
}

typedef struct rxe {
    tp_buf *out;
    bool json;
} rxe;

static bool single(const rxn *n)
{
    return n->kind == RX_SET && n->set.n == 1 && n->set.r[0][0] == n->set.r[0][1];
}

static bool rx_emit(const rxp *p, const rxe *e, int x);

static bool rx_emit_set(const rxe *e, const cset *s)
{
    if (e->json) return jgb_json_class(e->out, s);
    if (!s->n) return false;
    if (s->n == 1 && s->r[0][0] == s->r[0][1]) jgb_lit_cp(e->out, s->r[0][0]);
    else jgb_class(e->out, s);
    return true;
}

static bool rx_emit_seq(const rxp *p, const rxe *e, const rxn *n, int from, int to)
{
    bool any = false;
    for (int k = from; k < to;) {
        if (any) tp_buf_puts(e->out, " ");
        any = true;
        if (single(&p->node[n->kid[k]])) {
            /* a run of plain characters is one literal */
            tp_buf t;
            tp_buf_init(&t, 1u << 20);
            while (k < to && single(&p->node[n->kid[k]])) {
                char c[8];
                uint32_t cp = p->node[n->kid[k]].set.r[0][0];
                size_t len = e->json ? js_escape_cp(cp, c) : tp_utf8_put(cp, c);
                tp_buf_add(&t, c, len);
                k++;
            }
            bool ok = !t.err && jgb_lit(e->out, t.data, t.len);
            tp_buf_free(&t);
            if (!ok) return false;
            continue;
        }
        if (!rx_emit(p, e, n->kid[k])) return false;
        k++;
    }
    if (!any) tp_buf_puts(e->out, "\"\"");
    return true;
}

static bool rx_emit(const rxp *p, const rxe *e, int x)
{
    const rxn *n = &p->node[x];
    switch (n->kind) {
    case RX_SET: return rx_emit_set(e, &n->set);
    case RX_SEQ:
        if (n->nk > 1) tp_buf_puts(e->out, "(");
        if (!rx_emit_seq(p, e, n, 0, n->nk)) return false;
        if (n->nk > 1) tp_buf_puts(e->out, ")");
        return true;
    case RX_ALT:
        tp_buf_puts(e->out, "(");
        for (int k = 0; k < n->nk; k++) {
            if (k) tp_buf_puts(e->out, " | ");
            if (!rx_emit(p, e, n->kid[k])) return false;
        }
        tp_buf_puts(e->out, ")");
        return true;
    case RX_REP: {
        /* the repeated part as one element: a set is one already */
        tp_buf el;
        tp_buf_init(&el, e->out->max);
        rxe sub = {.out = &el, .json = e->json};
        bool bare = p->node[n->kid[0]].kind == RX_SET;
        if (!bare) tp_buf_puts(&el, "(");
        bool ok = rx_emit(p, &sub, n->kid[0]);
        if (!bare) tp_buf_puts(&el, ")");
        if (ok && !el.err) {
            if (n->min == 0 && n->max == 1) tp_buf_printf(e->out, "%s?", el.data);
            else if (n->min == 1 && n->max == -1) tp_buf_printf(e->out, "%s+", el.data);
            else jgb_repeat(e->out, el.data, n->min, n->max);
        }
        if (el.err) tp_buf_fail(e->out, TP_ERANGE);
        tp_buf_free(&el);
        return ok;
    }
    default: return true; /* anchors: handled at the top */
    }
}

static void rx_free(rxp *p)
{
    for (int k = 0; k < p->nn; k++) {
        jcs_free(&p->node[k].set);
        free(p->node[k].kid);
    }
    free(p->node);
}

/* parse and check a pattern: the tree's top node, or the error code */
static int rx_parse(rxp *p, int *top)
{
    *top = rx_alt(p);
    if (*top >= 0 && p->i < p->n) rx_fail(p, TP_EINVAL, "pattern: %s (at offset %u)", "unmatched )");
    if (p->rc) return p->rc;
    for (int k = 0; k < p->nn; k++)
        if (p->node[k].set.oom) return tp_err_set(p->err, TP_ENOMEM, "pattern: out of memory");
    size_t lo, hi, w;
    rx_measure(p, *top, &lo, &hi, &w);
    if (w > RX_MAX_EXPANSION)
        return tp_err_set(p->err, TP_ERANGE, "pattern: expands to more than %d parts with its repetitions unrolled",
                          RX_MAX_EXPANSION);
    return 0;
}

/* ---- regex -> NFA ------------------------------------------------------ */

/* the NFA of node x from state `from`; returns its end state */
static int rx_nfa(const rxp *p, jnfa *a, int x, int from)
{
    const rxn *n = &p->node[x];
    int end;
    switch (n->kind) {
    case RX_SET:
        end = jnfa_state(a);
        jnfa_edge(a, from, end, &n->set);
        return end;
    case RX_SEQ:
        for (int k = 0; k < n->nk; k++) from = rx_nfa(p, a, n->kid[k], from);
        return from;
    case RX_ALT:
        end = jnfa_state(a);
        for (int k = 0; k < n->nk; k++) jnfa_edge(a, rx_nfa(p, a, n->kid[k], from), end, NULL);
        return end;
    case RX_REP: {
        int cur = from;
        for (long k = 0; k < n->min; k++) cur = rx_nfa(p, a, n->kid[0], cur);
        if (n->max < 0) {
            /* a fresh loop state: nothing before it can re-enter */
            int loop = jnfa_state(a);
            jnfa_edge(a, cur, loop, NULL);
            jnfa_edge(a, rx_nfa(p, a, n->kid[0], loop), loop, NULL);
            return loop;
        }
        /* the optional copies each may stop at one end state: closures
         * stay small (a chain of x? would hold every later copy in each) */
        end = jnfa_state(a);
        for (long k = n->min; k < n->max; k++) {
            jnfa_edge(a, cur, end, NULL);
            cur = rx_nfa(p, a, n->kid[0], cur);
        }
        jnfa_edge(a, cur, end, NULL);
        return end;
    }
    default: return from; /* anchors: at the ends, handled by the caller */
    }
}

int rx_compile_dfa(const char *re, size_t len, int max_depth, int max_states, jdfa **out, tp_err *err)
{
    rxp p = {.s = re, .n = len, .max_depth = max_depth, .err = err};
    int top;
    *out = NULL;
    int rc = rx_parse(&p, &top);
    if (rc) {
        rx_free(&p);
        return rc;
    }
    jnfa a = {0};
    cset any = {0};
    jcs_negate(&any);
    int start = jnfa_state(&a), accept = jnfa_state(&a);
    /* the top alternatives (sequences), each with its anchors at its ends only */
    int one[1] = {top};
    const int *alts = one;
    int nalt = 1;
    if (p.node[top].kind == RX_ALT) alts = p.node[top].kid, nalt = p.node[top].nk;
    for (int i = 0; i < nalt && !rc; i++) {
        const rxn *s = &p.node[alts[i]];
        int from = 0, to = s->nk;
        bool bol = to > 0 && p.node[s->kid[0]].kind == RX_BOL;
        if (bol) from++;
        bool eol = to > from && p.node[s->kid[to - 1]].kind == RX_EOL;
        if (eol) to--;
        int cur = start;
        if (!bol) { /* ECMA's search: anything before */
            int l = jnfa_state(&a);
            jnfa_edge(&a, cur, l, NULL);
            jnfa_edge(&a, l, l, &any);
            cur = l;
        }
        for (int k = from; k < to; k++) {
            int kid = s->kid[k];
            if (has_anchor(&p, kid)) {
                rc = tp_err_set(err, TP_EINVAL, "pattern: an anchor ^ or $ inside the pattern is not supported (only at its ends)");
                break;
            }
            cur = rx_nfa(&p, &a, kid, cur);
        }
        if (!eol) {
            int l = jnfa_state(&a);
            jnfa_edge(&a, cur, l, NULL);
            jnfa_edge(&a, l, l, &any);
            cur = l;
        }
        jnfa_edge(&a, cur, accept, NULL);
    }
    if (!rc && (a.oom || any.oom)) rc = tp_err_set(err, TP_ENOMEM, "pattern: out of memory");
    if (!rc) {
        *out = jdfa_from_nfa(&a, start, accept, max_states, err);
        if (!*out) rc = err && err->code ? err->code : TP_ENOMEM;
    }
    jcs_free(&any);
    jnfa_free(&a);
    rx_free(&p);
    return rc;
}

int rx_compile_expr(const char *re, size_t len, bool json, const char *anychar, int max_depth,
                    tp_buf *out, size_t *minlen, size_t *maxlen, tp_err *err)
{
    rxp p = {.s = re, .n = len, .max_depth = max_depth, .err = err};
    int top;
    int rc0 = rx_parse(&p, &top);
    if (rc0) {
        rx_free(&p);
        return rc0;
    }
    /* the top alternatives, each with its anchors at its ends only */
    int one[1] = {top};
    const int *alts = one;
    int nalt = 1;
    if (p.node[top].kind == RX_ALT) alts = p.node[top].kid, nalt = p.node[top].nk;
    rxe e = {.out = out, .json = json};
    *minlen = SIZE_MAX, *maxlen = 0;
    if (nalt > 1) tp_buf_puts(out, "(");
    for (int a = 0; a < nalt; a++) {
        rxn *s = &p.node[alts[a]];
        int from = 0, to = s->nk;
        bool bol = to > 0 && p.node[s->kid[0]].kind == RX_BOL;
        if (bol) from++;
        bool eol = to > from && p.node[s->kid[to - 1]].kind == RX_EOL;
        if (eol) to--;
        for (int k = from; k < to; k++)
            if (has_anchor(&p, s->kid[k])) {
                rx_free(&p);
                return tp_err_set(err, TP_EINVAL,
                                  "pattern: an anchor ^ or $ inside the pattern is not supported (only at its ends)");
            }
        size_t alo = 0, ahi = 0, aw;
        for (int k = from; k < to; k++) {
            size_t l, h;
            rx_measure(&p, s->kid[k], &l, &h, &aw);
            alo = sat_add(alo, l), ahi = sat_add(ahi, h);
        }
        if (!bol || !eol) ahi = SIZE_MAX;
        if (alo < *minlen) *minlen = alo;
        if (ahi > *maxlen) *maxlen = ahi;
        if (a) tp_buf_puts(out, " | ");
        if (!bol) tp_buf_printf(out, "%s* ", anychar);
        bool ok = rx_emit_seq(&p, &e, s, from, to);
        if (!eol) tp_buf_printf(out, " %s*", anychar);
        if (!ok) {
            rx_free(&p);
            return tp_err_set(err, TP_EINVAL, "pattern: a character class that matches nothing");
        }
    }
    if (nalt > 1) tp_buf_puts(out, ")");
    rx_free(&p);
    if (out->err == TP_ENOMEM) return tp_err_set(err, TP_ENOMEM, "pattern: out of memory");
    if (out->err) return tp_err_set(err, TP_ERANGE, "pattern: the grammar exceeds the size limit");
    return 0;
}

int tp_regex_to_gbnf(const char *re, size_t len, const tp_jschema_opts *o, char **gbnf,
                     tp_err *err)
{
    tp_jschema_opts def;
    int rc0 = js_begin("regex", re, len, &o, &def, gbnf, err);
    if (rc0) return rc0;
    tp_buf b;
    tp_buf_init(&b, o->max_gbnf_bytes);
    tp_buf_puts(&b, "root ::= ");
    size_t lo, hi;
    int rc = rx_compile_expr(re, len, false, "any", o->max_depth, &b, &lo, &hi, err);
    tp_buf_puts(&b, "\nany ::= [\\x00-\\U0010FFFF]\n");
    if (!rc && b.err)
        rc = tp_err_set(err, b.err == TP_ENOMEM ? TP_ENOMEM : TP_ERANGE, "regex: the grammar exceeds %zu bytes", o->max_gbnf_bytes);
    if (rc) {
        tp_buf_free(&b);
        return rc;
    }
    *gbnf = tp_buf_take(&b);
    return 0;
}
