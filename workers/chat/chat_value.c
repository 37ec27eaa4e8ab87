/* Chat templates, part 3: the arena and Python's value semantics the
 * renderer needs (str(), repr(), json.dumps, equality, ordering, truth). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_value.h"

struct arena_chunk {
    struct arena_chunk *next;
    size_t used, size;
    max_align_t data[];
};

void *tp_chat_alloc(tp_chat_arena *a, size_t n)
{
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (n == 0)
        n = sizeof(max_align_t);
    struct arena_chunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t sz = n > 65536 ? n : 65536;
        if (a->cap && a->used + sz > a->cap)
            return NULL;
        c = malloc(sizeof *c + sz);
        if (!c)
            return NULL;
        c->next = a->head;
        c->used = 0;
        c->size = sz;
        a->head = c;
        a->used += sz;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

void tp_chat_arena_free(tp_chat_arena *a)
{
    struct arena_chunk *c = a->head;
    while (c) {
        struct arena_chunk *n = c->next;
        free(c);
        c = n;
    }
    a->head = NULL;
    a->used = 0;
}

/* ---- numbers --------------------------------------------------------------- */

/* Python's repr(float): the shortest digits that read back to x, in fixed
 * notation for decimal exponents -4..15, else d.ddde+XX. */
void cv_fmt_float(double x, char *out, size_t cap)
{
    if (isnan(x)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(x)) {
        snprintf(out, cap, x < 0 ? "-inf" : "inf");
        return;
    }
    char e[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, x);
        if (strtod(e, NULL) == x)
            break;
    }
    /* e = [-]d[.ddd]e[+-]XX */
    char digits[24];
    int nd = 0, neg = 0;
    const char *q = e;
    if (*q == '-') {
        neg = 1;
        q++;
    }
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9')
            digits[nd++] = *q;
    int exp10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = 0;
    char *o = out;
    size_t left = cap;
#define OUT(...) do { int w_ = snprintf(o, left, __VA_ARGS__); if (w_ < 0 || (size_t)w_ >= left) return; o += w_; left -= (size_t)w_; } while (0)
    if (neg)
        OUT("-");
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            OUT("0.");
            for (int k = 0; k < -exp10 - 1; k++)
                OUT("0");
            OUT("%s", digits);
        } else {
            for (int k = 0; k <= exp10; k++)
                OUT("%c", k < nd ? digits[k] : '0');
            OUT(".");
            if (nd > exp10 + 1)
                OUT("%s", digits + exp10 + 1);
            else
                OUT("0");
        }
    } else {
        OUT("%c", digits[0]);
        if (nd > 1)
            OUT(".%s", digits + 1);
        OUT("e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
#undef OUT
}

/* ---- UTF-8 ---------------------------------------------------------------- */

static unsigned u8_decode(const char *s, size_t n, size_t i)
{
    uint32_t cp;
    return tp_utf8_get((const uint8_t *)s + i, n - i, &cp) ? cp : (unsigned char)s[i];
}

/* ---- Python str(), repr(), json.dumps ------------------------------------------ */

static int printable(unsigned cp)
{
    /* str.isprintable() is false for controls, separators other than ' '
     * and format characters; the common ones are listed. */
    if (cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp <= 0xa0) || cp == 0xad)
        return 0;
    if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202f) ||
        (cp >= 0x205f && cp <= 0x206f) || cp == 0x3000 || cp == 0xfeff || (cp >= 0xd800 && cp <= 0xf8ff) ||
        (cp >= 0xfff9 && cp <= 0xfffb) || cp >= 0xf0000)
        return 0;
    return 1;
}

static int repr_str(tp_buf *b, const char *s, size_t n)
{
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    tp_buf_add(b, &q, 1);
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t l = tp_utf8_char_len(c);
        unsigned cp = u8_decode(s, n, i);
        char tmp[16];
        if (c == (unsigned char)q || c == '\\') {
            tmp[0] = '\\';
            tmp[1] = (char)c;
            tp_buf_add(b, tmp, 2);
        } else if (c == '\n') {
            tp_buf_puts(b, "\\n");
        } else if (c == '\r') {
            tp_buf_puts(b, "\\r");
        } else if (c == '\t') {
            tp_buf_puts(b, "\\t");
        } else if (!printable(cp)) {
            if (cp < 0x100)
                snprintf(tmp, sizeof tmp, "\\x%02x", cp);
            else if (cp < 0x10000)
                snprintf(tmp, sizeof tmp, "\\u%04x", cp);
            else
                snprintf(tmp, sizeof tmp, "\\U%08x", cp);
            tp_buf_puts(b, tmp);
        } else {
            tp_buf_add(b, s + i, l);
        }
        i += l;
    }
    return tp_buf_add(b, &q, 1);
}

int cv_repr(tp_buf *b, const tp_chat_val *v);

int cv_str(tp_buf *b, const tp_chat_val *v)
{
    char tmp[48];
    if (v->type == V_LIST && v->list.lazy)
        return 1;
    switch (v->type) {
    case V_UNDEF:
        return 0;
    case V_NONE:
        return tp_buf_puts(b, "None");
    case V_BOOL:
        return tp_buf_puts(b, v->b ? "True" : "False");
    case V_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)v->i);
        return tp_buf_puts(b, tmp);
    case V_FLOAT:
        cv_fmt_float(v->f, tmp, sizeof tmp);
        return tp_buf_puts(b, tmp);
    case V_STR:
        return tp_buf_add(b, v->str.s, v->str.n);
    case V_LIST:
    case V_DICT:
        return cv_repr(b, v);
    default:
        return 1;   /* not printable in the subset */
    }
}

int cv_repr(tp_buf *b, const tp_chat_val *v)
{
    if (v->type == V_LIST && v->list.lazy)
        return 1;
    switch (v->type) {
    case V_STR:
        return repr_str(b, v->str.s, v->str.n);
    case V_LIST: {
        tp_buf_puts(b, v->list.tuple ? "(" : "[");
        for (size_t k = 0; k < v->list.n; k++) {
            if (k)
                tp_buf_puts(b, ", ");
            int rc = cv_repr(b, v->list.v[k]);
            if (rc)
                return rc;
        }
        if (v->list.tuple && v->list.n == 1)
            tp_buf_puts(b, ",");
        return tp_buf_puts(b, v->list.tuple ? ")" : "]");
    }
    case V_DICT: {
        tp_buf_puts(b, "{");
        for (size_t k = 0; k < v->dict.n; k++) {
            if (k)
                tp_buf_puts(b, ", ");
            int rc = cv_repr(b, v->dict.k[k]);
            if (!rc) {
                tp_buf_puts(b, ": ");
                rc = cv_repr(b, v->dict.v[k]);
            }
            if (rc)
                return rc;
        }
        return tp_buf_puts(b, "}");
    }
    case V_UNDEF:
        return 1;
    default:
        return cv_str(b, v);
    }
}

static void json_nl(tp_buf *b, int indent, int level)
{
    tp_buf_add(b, "\n", 1);
    for (int k = 0; k < indent * level; k++)
        tp_buf_add(b, " ", 1);
}

/* json.dumps(v, ensure_ascii=False, indent=indent or None); 1 = a value
 * JSON cannot hold (undefined, a macro, ...), 2 = too deep. */
int cv_json(tp_buf *b, const tp_chat_val *v, int indent, int level)
{
    char tmp[48];
    if (level > TP_CHAT_MAX_DEPTH)
        return 2;
    switch (v->type) {
    case V_NONE:
        return tp_buf_puts(b, "null");
    case V_BOOL:
        return tp_buf_puts(b, v->b ? "true" : "false");
    case V_INT:
    case V_STR:
        if (v->type == V_STR)
            return tp_buf_json_str(b, v->str.s, v->str.n);
        snprintf(tmp, sizeof tmp, "%lld", (long long)v->i);
        return tp_buf_puts(b, tmp);
    case V_FLOAT:
        if (isnan(v->f))
            return tp_buf_puts(b, "NaN");
        if (isinf(v->f))
            return tp_buf_puts(b, v->f < 0 ? "-Infinity" : "Infinity");
        cv_fmt_float(v->f, tmp, sizeof tmp);
        return tp_buf_puts(b, tmp);
    case V_LIST:
        if (v->list.lazy)
            return 1;
        if (!v->list.n)
            return tp_buf_puts(b, "[]");
        tp_buf_puts(b, "[");
        for (size_t k = 0; k < v->list.n; k++) {
            if (k)
                tp_buf_puts(b, indent >= 0 ? "," : ", ");
            if (indent >= 0)
                json_nl(b, indent, level + 1);
            int rc = cv_json(b, v->list.v[k], indent, level + 1);
            if (rc)
                return rc;
        }
        if (indent >= 0)
            json_nl(b, indent, level);
        return tp_buf_puts(b, "]");
    case V_DICT:
        if (!v->dict.n)
            return tp_buf_puts(b, "{}");
        tp_buf_puts(b, "{");
        for (size_t k = 0; k < v->dict.n; k++) {
            if (k)
                tp_buf_puts(b, indent >= 0 ? "," : ", ");
            if (indent >= 0)
                json_nl(b, indent, level + 1);
            const tp_chat_val *key = v->dict.k[k];
            int rc;
            if (key->type == V_STR) {
                rc = tp_buf_json_str(b, key->str.s, key->str.n);
            } else if (key->type == V_INT || key->type == V_FLOAT || key->type == V_BOOL || key->type == V_NONE) {
                tp_buf kb;
                tp_buf_init(&kb, 64);
                if (key->type == V_BOOL || key->type == V_NONE)
                    cv_json(&kb, key, -1, 0);
                else
                    cv_str(&kb, key);
                rc = tp_buf_json_str(b, tp_buf_str(&kb), kb.len);
                tp_buf_free(&kb);
            } else {
                return 1;
            }
            if (!rc) {
                tp_buf_puts(b, ": ");
                rc = cv_json(b, v->dict.v[k], indent, level + 1);
            }
            if (rc)
                return rc;
        }
        if (indent >= 0)
            json_nl(b, indent, level);
        return tp_buf_puts(b, "}");
    default:
        return 1;
    }
}

/* ---- comparisons ----------------------------------------------------------- */

int cv_is_num(const tp_chat_val *v)
{
    return v->type == V_INT || v->type == V_FLOAT || v->type == V_BOOL;
}

double cv_num_d(const tp_chat_val *v)
{
    return v->type == V_FLOAT ? v->f : v->type == V_INT ? (double)v->i : (double)v->b;
}

int64_t cv_num_i(const tp_chat_val *v)
{
    return v->type == V_INT ? v->i : (int64_t)v->b;
}

const tp_chat_val *cv_dict_get(const tp_chat_val *d, const tp_chat_val *key)
{
    for (size_t k = 0; k < d->dict.n; k++)
        if (cv_eq(d->dict.k[k], key))
            return d->dict.v[k];
    return NULL;
}

const tp_chat_val *cv_dict_gets(const tp_chat_val *d, const char *key, size_t n)
{
    for (size_t k = 0; k < d->dict.n; k++) {
        const tp_chat_val *kk = d->dict.k[k];
        if (kk->type == V_STR && kk->str.n == n && !memcmp(kk->str.s, key, n))
            return d->dict.v[k];
    }
    return NULL;
}

int cv_eq(const tp_chat_val *a, const tp_chat_val *b)
{
    if (cv_is_num(a) && cv_is_num(b)) {
        if (a->type == V_FLOAT || b->type == V_FLOAT)
            return cv_num_d(a) == cv_num_d(b);
        return cv_num_i(a) == cv_num_i(b);
    }
    if (a->type != b->type) {
        return 0;
    }
    switch (a->type) {
    case V_UNDEF:
    case V_NONE:
        return 1;
    case V_STR:
        return a->str.n == b->str.n && !memcmp(a->str.s, b->str.s, a->str.n);
    case V_LIST:
        if (a->list.lazy || b->list.lazy)
            return a == b;
        if (a->list.n != b->list.n || a->list.tuple != b->list.tuple)
            return 0;
        for (size_t k = 0; k < a->list.n; k++)
            if (!cv_eq(a->list.v[k], b->list.v[k]))
                return 0;
        return 1;
    case V_DICT:
        if (a->dict.n != b->dict.n)
            return 0;
        for (size_t k = 0; k < a->dict.n; k++) {
            const tp_chat_val *o = cv_dict_get(b, a->dict.k[k]);
            if (!o || !cv_eq(a->dict.v[k], o))
                return 0;
        }
        return 1;
    default:
        return a == b;
    }
}

/* Python ordering: numbers with numbers, strings with strings (by code
 * point, which UTF-8 byte order preserves), lists element-wise. 0 ok with
 * *res <0/0/>0; 1 = not comparable (a TypeError in Python). */
int cv_order(const tp_chat_val *a, const tp_chat_val *b, int *res)
{
    if (cv_is_num(a) && cv_is_num(b)) {
        double x = cv_num_d(a), y = cv_num_d(b);
        if (a->type != V_FLOAT && b->type != V_FLOAT) {
            int64_t p = cv_num_i(a), q = cv_num_i(b);
            *res = p < q ? -1 : p > q;
        } else {
            *res = x < y ? -1 : x > y;
        }
        return 0;
    }
    if (a->type == V_STR && b->type == V_STR) {
        size_t m = a->str.n < b->str.n ? a->str.n : b->str.n;
        int c = memcmp(a->str.s, b->str.s, m);
        *res = c ? c : a->str.n < b->str.n ? -1 : a->str.n > b->str.n;
        return 0;
    }
    if (a->type == V_LIST && b->type == V_LIST && a->list.tuple == b->list.tuple && !a->list.lazy &&
        !b->list.lazy) {
        for (size_t k = 0; k < a->list.n && k < b->list.n; k++) {
            if (cv_eq(a->list.v[k], b->list.v[k]))
                continue;
            return cv_order(a->list.v[k], b->list.v[k], res);
        }
        *res = a->list.n < b->list.n ? -1 : a->list.n > b->list.n;
        return 0;
    }
    return 1;
}

int cv_truthy(const tp_chat_val *v)
{
    switch (v->type) {
    case V_UNDEF:
    case V_NONE:
        return 0;
    case V_BOOL:
        return v->b;
    case V_INT:
        return v->i != 0;
    case V_FLOAT:
        return v->f != 0;
    case V_STR:
        return v->str.n > 0;
    case V_LIST:
        return v->list.lazy || v->list.n > 0;
    case V_DICT:
        return v->dict.n > 0;
    default:
        return 1;
    }
}

const char *cv_type_name(const tp_chat_val *v)
{
    static const char *const N[] = {"undefined", "NoneType", "bool", "int", "float", "str", "list",
                                    "dict", "Namespace", "macro", "method", "function", "LoopContext"};
    if (v->type == V_LIST && v->list.tuple)
        return "tuple";
    if (v->type == V_LIST && v->list.lazy)
        return "generator";
    return N[v->type];
}
