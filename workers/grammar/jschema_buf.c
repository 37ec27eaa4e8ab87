/* Buffers, code point sets and GBNF writers for the schema and regex
 * compilers (jschema_int.h). */
#include "tokpipe/utf8.h"
#include "jschema_int.h"
#include "tokpipe/jschema.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void jcs_free(cset *s)
{
    free(s->r);
    memset(s, 0, sizeof *s);
}

void jcs_add(cset *s, uint32_t lo, uint32_t hi)
{
    if (lo > hi || s->oom) return;
    /* insert then merge: sets stay small (a class of a pattern) */
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 8;
        void *r = realloc(s->r, (size_t)cap * sizeof *s->r);
        if (!r) {
            s->oom = true;
            return;
        }
        s->r = r;
        s->cap = cap;
    }
    int i = s->n;
    while (i > 0 && s->r[i - 1][0] > lo) {
        s->r[i][0] = s->r[i - 1][0];
        s->r[i][1] = s->r[i - 1][1];
        i--;
    }
    s->r[i][0] = lo;
    s->r[i][1] = hi;
    s->n++;
    int w = 0;
    for (int k = 1; k < s->n; k++) {
        if (s->r[k][0] <= s->r[w][1] + 1) {
            if (s->r[k][1] > s->r[w][1]) s->r[w][1] = s->r[k][1];
        } else {
            w++;
            s->r[w][0] = s->r[k][0];
            s->r[w][1] = s->r[k][1];
        }
    }
    s->n = w + 1;
}

void jcs_add_set(cset *s, const cset *t)
{
    for (int i = 0; i < t->n; i++) jcs_add(s, t->r[i][0], t->r[i][1]);
    if (t->oom) s->oom = true;
}

void jcs_negate(cset *s)
{
    cset o = {0};
    uint32_t next = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->r[i][0] > next) jcs_add(&o, next, s->r[i][0] - 1);
        next = s->r[i][1] + 1;
    }
    if (next <= JS_MAX_CP) jcs_add(&o, next, JS_MAX_CP);
    /* remove the surrogates */
    cset t = {0};
    for (int i = 0; i < o.n; i++) {
        uint32_t lo = o.r[i][0], hi = o.r[i][1];
        if (hi < 0xD800 || lo > 0xDFFF) {
            jcs_add(&t, lo, hi);
            continue;
        }
        if (lo < 0xD800) jcs_add(&t, lo, 0xD7FF);
        if (hi > 0xDFFF) jcs_add(&t, 0xE000, hi);
    }
    bool oom = s->oom || o.oom || t.oom;
    jcs_free(&o);
    jcs_free(s);
    *s = t;
    s->oom = oom;
}

bool jcs_has(const cset *s, uint32_t c)
{
    for (int i = 0; i < s->n; i++)
        if (c >= s->r[i][0] && c <= s->r[i][1]) return true;
    return false;
}

uint64_t jcs_count(const cset *s)
{
    uint64_t k = 0;
    for (int i = 0; i < s->n; i++) k += (uint64_t)s->r[i][1] - s->r[i][0] + 1;
    return k;
}

int js_utf8_next(const unsigned char *s, size_t n, uint32_t *cp)
{
    if (!n) return 0;
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int len;
    uint32_t v, min;
    if ((c & 0xE0) == 0xC0) len = 2, v = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, v = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, v = c & 0x07, min = 0x10000;
    else return 0;
    if ((size_t)len > n) return 0;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v < min || v > JS_MAX_CP || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return len;
}

/* one code point inside "..." or [...]: printable ASCII raw unless special
 * to GBNF, everything else as an escape so the GBNF text stays ASCII */
static void jgb_cp(tp_buf *b, uint32_t c, bool in_class)
{
    /* only \\ \" \[ \] are escapes in llama.cpp's GBNF; '^' and '-' in a
     * class are written as \x escapes */
    bool special = c == '\\' || c == '"' || (in_class && (c == ']' || c == '[' || c == '^' || c == '-'));
    if (c >= 0x20 && c < 0x7F && !special) {
        char t = (char)c;
        tp_buf_add(b, &t, 1);
        return;
    }
    if (c == '\\' || c == '"') {
        tp_buf_puts(b, c == '"' ? "\\\"" : "\\\\");
        return;
    }
    if (c < 0x100) tp_buf_printf(b, "\\x%02X", c);
    else if (c < 0x10000) tp_buf_printf(b, "\\u%04X", c);
    else tp_buf_printf(b, "\\U%08X", c);
}

void jgb_lit_cp(tp_buf *b, uint32_t c)
{
    tp_buf_add(b, "\"", 1);
    jgb_cp(b, c, false);
    tp_buf_add(b, "\"", 1);
}

bool jgb_lit(tp_buf *b, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        uint32_t c;
        int k = js_utf8_next(u + i, n - i, &c);
        if (!k) return false;
        i += (size_t)k;
    }
    tp_buf_add(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        uint32_t c;
        i += (size_t)js_utf8_next(u + i, n - i, &c);
        jgb_cp(b, c, false);
    }
    tp_buf_add(b, "\"", 1);
    return true;
}

void jgb_class(tp_buf *b, const cset *s)
{
    tp_buf_add(b, "[", 1);
    for (int i = 0; i < s->n; i++) {
        jgb_cp(b, s->r[i][0], true);
        if (s->r[i][1] != s->r[i][0]) {
            if (s->r[i][1] > s->r[i][0] + 1) tp_buf_add(b, "-", 1);
            jgb_cp(b, s->r[i][1], true);
        }
    }
    tp_buf_add(b, "]", 1);
}

size_t js_escape_cp(uint32_t c, char out[8])
{
    size_t k = c < 0x80 ? tp_json_escape((uint8_t)c, out) : 0;
    return k ? k : tp_utf8_put(c, out);
}


static bool json_special(uint32_t c)
{
    return c < 0x20 || c == '"' || c == '\\';
}

bool jgb_json_class(tp_buf *b, const cset *s)
{
    cset raw = {0};
    for (int i = 0; i < s->n; i++) {
        uint32_t lo = s->r[i][0], hi = s->r[i][1];
        /* the raw part: the range without controls, '"' and '\\' */
        uint32_t cut[3] = {'"', '\\', JS_MAX_CP + 1};
        uint32_t a = lo < 0x20 ? 0x20 : lo;
        for (int k = 0; k < 3 && a <= hi; k++) {
            if (cut[k] < a) continue;
            uint32_t e = cut[k] > hi ? hi : cut[k] - 1;
            if (a <= e) jcs_add(&raw, a, e);
            a = cut[k] + 1;
        }
    }
    /* the escaped ones, grouped: \\ + one of "\\bfnrt, and \\u000x / \\u001x */
    char shorts[16];
    int ns = 0;
    char nib[2][17];
    int nn[2] = {0, 0};
    for (uint32_t c = 0; c < 0x60; c++) {
        if (!json_special(c) || !jcs_has(s, c)) continue;
        char e[8];
        size_t k = js_escape_cp(c, e);
        if (k == 2) shorts[ns++] = e[1];
        else nib[c >> 4][nn[c >> 4]++] = e[5];
    }
    int parts = (raw.n > 0) + (ns > 0) + (nn[0] > 0) + (nn[1] > 0);
    if (!parts || raw.oom) {
        jcs_free(&raw);
        return false;
    }
    /* one element for the caller (who may quantify it): a lone class, or a group */
    bool group = parts > 1 || !raw.n;
    if (group) tp_buf_puts(b, "(");
    const char *sep = "";
    if (raw.n) {
        jgb_class(b, &raw);
        sep = " | ";
    }
    if (ns) {
        tp_buf_printf(b, "%s\"\\\\\" [", sep);
        for (int i = 0; i < ns; i++) tp_buf_puts(b, shorts[i] == '"' ? "\\\"" : shorts[i] == '\\' ? "\\\\" : (char[2]){shorts[i], 0});
        tp_buf_puts(b, "]");
        sep = " | ";
    }
    for (int h = 0; h < 2; h++) {
        if (!nn[h]) continue;
        tp_buf_printf(b, "%s\"\\\\u00%d\" [%.*s]", sep, h, nn[h], nib[h]);
        sep = " | ";
    }
    if (group) tp_buf_puts(b, ")");
    jcs_free(&raw);
    return true;
}

bool jgb_json_lit(tp_buf *b, const char *s, size_t n)
{
    return jgb_json_str(b, s, n, false);
}

bool jgb_json_str(tp_buf *b, const char *s, size_t n, bool quotes)
{
    const unsigned char *u = (const unsigned char *)s;
    tp_buf t;
    tp_buf_init(&t, n * 6 + 16);
    if (quotes) tp_buf_add(&t, "\"", 1);
    for (size_t i = 0; i < n;) {
        uint32_t c;
        int k = js_utf8_next(u + i, n - i, &c);
        if (!k) {
            tp_buf_free(&t);
            return false;
        }
        i += (size_t)k;
        char e[8];
        tp_buf_add(&t, e, js_escape_cp(c, e));
    }
    if (quotes) tp_buf_add(&t, "\"", 1);
    if (t.err == TP_ENOMEM) tp_buf_fail(b, TP_ENOMEM);
    jgb_lit(b, t.data ? t.data : "", t.len);
    tp_buf_free(&t);
    return true;
}

/* counts past JS_REPEAT_SPLIT become blocks of JS_REPEAT_BLOCK: the engine
 * caps {m,n} (grammar.max_repeat) and unrolls each count into elements */
#define JS_REPEAT_SPLIT 1000
#define JS_REPEAT_BLOCK 100

static void rep_exact(tp_buf *b, const char *elem, long long m)
{
    if (m <= JS_REPEAT_SPLIT) {
        tp_buf_printf(b, "%s{%lld}", elem, m);
        return;
    }
    tp_buf_printf(b, "(%s{%d}){%lld}", elem, JS_REPEAT_BLOCK, m / JS_REPEAT_BLOCK);
    if (m % JS_REPEAT_BLOCK) tp_buf_printf(b, " %s{%lld}", elem, m % JS_REPEAT_BLOCK);
}

/* 0..d more, every count reachable exactly once: q whole blocks then up to
 * r, or fewer blocks then up to a block less one */
static void rep_upto(tp_buf *b, const char *elem, long long d)
{
    if (d <= JS_REPEAT_SPLIT) {
        tp_buf_printf(b, "%s{0,%lld}", elem, d);
        return;
    }
    long long q = d / JS_REPEAT_BLOCK, r = d % JS_REPEAT_BLOCK;
    tp_buf_printf(b, "((%s{%d}){0,%lld} %s{0,%d} | (%s{%d}){%lld} %s{0,%lld})", elem, JS_REPEAT_BLOCK, q - 1, elem,
               JS_REPEAT_BLOCK - 1, elem, JS_REPEAT_BLOCK, q, elem, r);
}

void jgb_repeat(tp_buf *b, const char *elem, long long m, long long M)
{
    if (M >= 0 && M <= JS_REPEAT_SPLIT) {
        if (m == M) tp_buf_printf(b, "%s{%lld}", elem, m);
        else tp_buf_printf(b, "%s{%lld,%lld}", elem, m, M);
        return;
    }
    if (M < 0 && m <= JS_REPEAT_SPLIT) {
        if (m == 0) tp_buf_printf(b, "%s*", elem);
        else tp_buf_printf(b, "%s{%lld,}", elem, m);
        return;
    }
    tp_buf_puts(b, "(");
    if (m) {
        rep_exact(b, elem, m);
        tp_buf_puts(b, " ");
    }
    if (M < 0) tp_buf_printf(b, "%s*", elem);
    else rep_upto(b, elem, M - m);
    tp_buf_puts(b, ")");
}

int js_begin(const char *what, const char *text, size_t len, const tp_jschema_opts **o, tp_jschema_opts *def,
             char **gbnf, tp_err *err)
{
    if (!*o) {
        tp_jschema_opts_default(def);
        *o = def;
    }
    *gbnf = NULL;
    if (!text) return tp_err_set(err, TP_EINVAL, "%s: NULL", what);
    if (len > (*o)->max_schema_bytes)
        return tp_err_set(err, TP_ERANGE, "%s: %zu bytes, above the limit of %zu", what, len, (*o)->max_schema_bytes);
    return 0;
}
