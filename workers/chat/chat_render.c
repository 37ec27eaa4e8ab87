/* Chat templates, part 4: rendering a parse tree with a conversation, and
 * the module's public API. Values live in a per-render arena freed whole at
 * the end; scopes follow Jinja (a for loop body is a fresh scope per
 * iteration, `if` is none, a macro sees its arguments and the top level). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat_value.h"

struct tp_chat_template {
    char *src;                 /* normalised text; DATA nodes point into it */
    tp_chat_arena arena;       /* parse tree */
    tp_chat_node **body;
    size_t n_body;
};

typedef struct frame {
    struct frame *parent;
    const char **names;
    tp_chat_val **vals;
    size_t n, cap;
} frame;

typedef struct rctx {
    tp_chat_arena *ar;
    tp_err *err;
    int failed;
    tp_buf *out;
    size_t max_output;
    long steps;
    int depth;
    frame *globals;
    int ctl;   /* 1 break, 2 continue */
    tp_chat_val *none, *t, *f;
} rctx;

typedef tp_chat_val val;
typedef tp_chat_node node;

static val *rfail(rctx *c, int code, int line, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static val *rfail(rctx *c, int code, int line, const char *fmt, ...)
{
    if (!c->failed) {
        char msg[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        tp_err_set(c->err, code, "chat template line %d: %s", line, msg);
        c->failed = 1;
    }
    return NULL;
}

static val *oom(rctx *c, int line)
{
    return rfail(c, TP_ERANGE, line, "rendering needs more than %u bytes of memory", TP_CHAT_MAX_MEMORY);
}

static val *mk(rctx *c, int type, int line)
{
    val *v = tp_chat_alloc(c->ar, sizeof *v);
    if (!v)
        return oom(c, line);
    v->type = type;
    return v;
}

static val *mk_int(rctx *c, int64_t i, int line)
{
    val *v = mk(c, V_INT, line);
    if (v)
        v->i = i;
    return v;
}

static val *mk_float(rctx *c, double f, int line)
{
    val *v = mk(c, V_FLOAT, line);
    if (v)
        v->f = f;
    return v;
}

static val *mk_bool(rctx *c, int b)
{
    return b ? c->t : c->f;
}

static val *mk_str(rctx *c, const char *s, size_t n, int line)
{
    val *v = mk(c, V_STR, line);
    if (!v)
        return NULL;
    char *d = tp_chat_alloc(c->ar, n + 1);
    if (!d)
        return oom(c, line);
    memcpy(d, s, n);
    v->str.s = d;
    v->str.n = n;
    return v;
}

static val *mk_undef(rctx *c, const char *name, int line)
{
    val *v = mk(c, V_UNDEF, line);
    if (v)
        v->undef.name = name;
    return v;
}

static val *mk_list(rctx *c, size_t n, int line)
{
    val *v = mk(c, V_LIST, line);
    if (!v)
        return NULL;
    if (n && !(v->list.v = tp_chat_alloc(c->ar, n * sizeof *v->list.v)))
        return oom(c, line);
    v->list.n = n;
    return v;
}

static int dict_set(rctx *c, val *d, val *k, val *v, int line)
{
    for (size_t i = 0; i < d->dict.n; i++)
        if (cv_eq(d->dict.k[i], k)) {
            d->dict.v[i] = v;
            return 0;
        }
    if (d->dict.n == d->dict.cap) {
        size_t nc = d->dict.cap ? d->dict.cap * 2 : 4;
        val **nk = tp_chat_alloc(c->ar, nc * sizeof *nk), **nv = tp_chat_alloc(c->ar, nc * sizeof *nv);
        if (!nk || !nv) {
            oom(c, line);
            return -1;
        }
        if (d->dict.n) {
            memcpy(nk, d->dict.k, d->dict.n * sizeof *nk);
            memcpy(nv, d->dict.v, d->dict.n * sizeof *nv);
        }
        d->dict.k = nk;
        d->dict.v = nv;
        d->dict.cap = nc;
    }
    d->dict.k[d->dict.n] = k;
    d->dict.v[d->dict.n] = v;
    d->dict.n++;
    return 0;
}

/* A string built in a tp_buf, copied into the arena. */
static val *sb_val(rctx *c, tp_buf *b, int line)
{
    if (b->err == TP_ERANGE) {
        tp_buf_free(b);
        return rfail(c, TP_ERANGE, line, "a string longer than the %zu-byte output limit", c->max_output);
    }
    if (b->err) {
        tp_buf_free(b);
        return oom(c, line);
    }
    val *v = mk_str(c, tp_buf_str(b), b->len, line);
    tp_buf_free(b);
    return v;
}

static tp_buf new_sb(rctx *c)
{
    tp_buf b;
    tp_buf_init(&b, c->max_output);
    return b;
}

static int step(rctx *c, int line)
{
    if (++c->steps > TP_CHAT_MAX_STEPS) {
        rfail(c, TP_ERANGE, line, "rendering takes more than %d steps", TP_CHAT_MAX_STEPS);
        return -1;
    }
    return 0;
}

/* ---- scopes ---------------------------------------------------------------- */

static int frame_set(rctx *c, frame *f, const char *name, val *v, int line)
{
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) {
            f->vals[i] = v;
            return 0;
        }
    if (f->n == f->cap) {
        size_t nc = f->cap ? f->cap * 2 : 8;
        const char **nn = tp_chat_alloc(c->ar, nc * sizeof *nn);
        val **nv = tp_chat_alloc(c->ar, nc * sizeof *nv);
        if (!nn || !nv) {
            oom(c, line);
            return -1;
        }
        if (f->n) {
            memcpy(nn, f->names, f->n * sizeof *nn);
            memcpy(nv, f->vals, f->n * sizeof *nv);
        }
        f->names = nn;
        f->vals = nv;
        f->cap = nc;
    }
    f->names[f->n] = name;
    f->vals[f->n] = v;
    f->n++;
    return 0;
}

static const char *const BUILTINS[] = {"namespace", "range", "raise_exception", "strftime_now", "dict", NULL};

static val *lookup(rctx *c, frame *f, const char *name, int line)
{
    for (; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (!strcmp(f->names[i], name))
                return f->vals[i];
    for (int k = 0; BUILTINS[k]; k++)
        if (!strcmp(BUILTINS[k], name)) {
            val *v = mk(c, V_FUNC, line);
            if (v)
                v->func.name = BUILTINS[k];
            return v;
        }
    return mk_undef(c, name, line);
}

/* ---- attribute and item access --------------------------------------------- */

static const char *const STR_METHODS[] = {
    "capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find", "format",
    "format_map", "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier",
    "islower", "isnumeric", "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower",
    "lstrip", "maketrans", "partition", "removeprefix", "removesuffix", "replace", "rfind", "rindex",
    "rjust", "rpartition", "rsplit", "rstrip", "split", "splitlines", "startswith", "strip", "swapcase",
    "title", "translate", "upper", "zfill", NULL,
};
static const char *const DICT_METHODS[] = {"clear", "copy", "fromkeys", "get", "items", "keys", "pop",
                                           "popitem", "setdefault", "update", "values", NULL};
static const char *const LIST_METHODS[] = {"append", "clear", "copy", "count", "extend", "index", "insert",
                                           "pop", "remove", "reverse", "sort", NULL};

static const char *in_list(const char *const *l, const char *name)
{
    for (int k = 0; l[k]; k++)
        if (!strcmp(l[k], name))
            return l[k];
    return NULL;
}

static val *method(rctx *c, val *self, const char *name, int line)
{
    val *m = mk(c, V_METHOD, line);
    if (m) {
        m->method.self = self;
        m->method.name = name;
    }
    return m;
}

static val *undef_use(rctx *c, const val *u, int line)
{
    if (u->undef.name)
        return rfail(c, TP_EFORMAT, line, "'%s' is undefined", u->undef.name);
    return rfail(c, TP_EFORMAT, line, "an undefined value is used");
}

static val *get_attr(rctx *c, val *v, const char *name, int line)
{
    const char *m;
    switch (v->type) {
    case V_UNDEF:
        return undef_use(c, v, line);
    case V_DICT:
        if ((m = in_list(DICT_METHODS, name)))
            return method(c, v, m, line);
        /* fall through */
    case V_NS: {
        const val *x = cv_dict_gets(v, name, strlen(name));
        return x ? (val *)x : mk_undef(c, NULL, line);
    }
    case V_STR:
        if ((m = in_list(STR_METHODS, name)))
            return method(c, v, m, line);
        return mk_undef(c, NULL, line);
    case V_LIST:
        if ((m = in_list(LIST_METHODS, name)))
            return method(c, v, m, line);
        return mk_undef(c, NULL, line);
    case V_LOOP: {
        size_t i = v->loop.index0, n = v->loop.length;
        if (!strcmp(name, "index0"))
            return mk_int(c, (int64_t)i, line);
        if (!strcmp(name, "index"))
            return mk_int(c, (int64_t)i + 1, line);
        if (!strcmp(name, "revindex"))
            return mk_int(c, (int64_t)(n - i), line);
        if (!strcmp(name, "revindex0"))
            return mk_int(c, (int64_t)(n - i - 1), line);
        if (!strcmp(name, "first"))
            return mk_bool(c, i == 0);
        if (!strcmp(name, "last"))
            return mk_bool(c, i + 1 == n);
        if (!strcmp(name, "length"))
            return mk_int(c, (int64_t)n, line);
        if (!strcmp(name, "depth"))
            return mk_int(c, 1, line);
        if (!strcmp(name, "depth0"))
            return mk_int(c, 0, line);
        if (!strcmp(name, "previtem"))
            return i > 0 ? v->loop.items[i - 1] : mk_undef(c, "loop.previtem", line);
        if (!strcmp(name, "nextitem"))
            return i + 1 < n ? v->loop.items[i + 1] : mk_undef(c, "loop.nextitem", line);
        if (!strcmp(name, "cycle") || !strcmp(name, "changed"))
            return rfail(c, TP_EINVAL, line, "unsupported construct: loop.%s", name);
        return mk_undef(c, NULL, line);
    }
    default:
        return mk_undef(c, NULL, line);
    }
}

/* Python index semantics: negative counts from the end; out of range gives
 * -1 (Jinja then yields undefined). */
static long norm_index(int64_t i, size_t n)
{
    if (i < 0)
        i += (int64_t)n;
    return i < 0 || i >= (int64_t)n ? -1 : (long)i;
}

/* A string's bytes as a C name in the arena (NULL: out of memory, said). */
static char *arena_name(rctx *c, const val *str, int line)
{
    char *nm = tp_chat_alloc(c->ar, str->str.n + 1);
    if (!nm)
        return oom(c, line), NULL;
    memcpy(nm, str->str.s, str->str.n);
    return nm;
}

/* v[key] for a string key no item answers: Jinja falls back to v.key. */
static val *attr_of_key(rctx *c, val *v, val *key, int line)
{
    char *nm = arena_name(c, key, line);
    return nm ? get_attr(c, v, nm, line) : NULL;
}

static val *get_item(rctx *c, val *v, val *key, int line)
{
    if (v->type == V_UNDEF)
        return undef_use(c, v, line);
    if (v->type == V_DICT || v->type == V_NS) {
        const val *x = cv_dict_get(v, key);
        if (x)
            return (val *)x;
        if (key->type == V_STR && v->type == V_DICT)
            return attr_of_key(c, v, key, line);
        return mk_undef(c, NULL, line);
    }
    if (v->type == V_LIST && v->list.lazy)
        return mk_undef(c, NULL, line);
    if ((v->type == V_LIST || v->type == V_STR) && (key->type == V_INT || key->type == V_BOOL)) {
        if (v->type == V_LIST) {
            long i = norm_index(cv_num_i(key), v->list.n);
            return i < 0 ? mk_undef(c, NULL, line) : v->list.v[i];
        }
        size_t nc = tp_utf8_count(v->str.s, v->str.n);
        long i = norm_index(cv_num_i(key), nc);
        if (i < 0)
            return mk_undef(c, NULL, line);
        size_t a = tp_utf8_offset(v->str.s, v->str.n, (size_t)i);
        return mk_str(c, v->str.s + a, tp_utf8_char_len((unsigned char)v->str.s[a]), line);
    }
    if (key->type == V_STR)
        return attr_of_key(c, v, key, line);
    return mk_undef(c, NULL, line);
}

static int slice_bound(rctx *c, val *b, int64_t *out, int line)
{
    if (!b || b->type == V_NONE)
        return 1;
    if (b->type != V_INT && b->type != V_BOOL) {
        rfail(c, TP_EFORMAT, line, "slice indices must be integers, not %s", cv_type_name(b));
        return -1;
    }
    *out = cv_num_i(b);
    return 0;
}

static val *do_slice(rctx *c, val *v, val *a, val *b, val *s, int line)
{
    if (v->type == V_UNDEF)
        return undef_use(c, v, line);
    if ((v->type != V_LIST && v->type != V_STR) || (v->type == V_LIST && v->list.lazy))
        return rfail(c, TP_EFORMAT, line, "cannot slice a %s", cv_type_name(v));
    int64_t n = v->type == V_LIST ? (int64_t)v->list.n : (int64_t)tp_utf8_count(v->str.s, v->str.n);
    int64_t start = 0, stop = 0, stp = 1;
    int r;
    if ((r = slice_bound(c, s, &stp, line)) < 0)
        return NULL;
    if (stp == 0)
        return rfail(c, TP_EFORMAT, line, "slice step cannot be zero");
    int ra = slice_bound(c, a, &start, line), rb = slice_bound(c, b, &stop, line);
    if (ra < 0 || rb < 0)
        return NULL;
    /* CPython's PySlice_AdjustIndices */
    if (ra)
        start = stp < 0 ? n - 1 : 0;
    else if (start < 0) {
        start += n;
        if (start < 0)
            start = stp < 0 ? -1 : 0;
    } else if (start >= n)
        start = stp < 0 ? n - 1 : n;
    if (rb)
        stop = stp < 0 ? -1 : n;
    else if (stop < 0) {
        stop += n;
        if (stop < 0)
            stop = stp < 0 ? -1 : 0;
    } else if (stop >= n)
        stop = stp < 0 ? n - 1 : n;
    int64_t cnt = 0;
    if (stp < 0 ? stop < start : start < stop)
        cnt = stp < 0 ? (start - stop - 1) / (-stp) + 1 : (stop - start - 1) / stp + 1;
    if (v->type == V_LIST) {
        val *o = mk_list(c, (size_t)cnt, line);
        if (!o)
            return NULL;
        o->list.tuple = v->list.tuple;
        for (int64_t k = 0; k < cnt; k++)
            o->list.v[k] = v->list.v[start + k * stp];
        return o;
    }
    if (stp == 1) {
        size_t x = tp_utf8_offset(v->str.s, v->str.n, (size_t)start);
        size_t y = cnt ? tp_utf8_offset(v->str.s, v->str.n, (size_t)(start + cnt)) : x;
        return mk_str(c, v->str.s + x, y - x, line);
    }
    /* general step: index the code points once */
    size_t *offs = malloc(((size_t)n + 1) * sizeof *offs);
    if (!offs)
        return oom(c, line);
    size_t i = 0;
    for (int64_t k = 0; k < n; k++) {
        offs[k] = i;
        i += tp_utf8_char_len((unsigned char)v->str.s[i]);
    }
    offs[n] = v->str.n;
    tp_buf sb = new_sb(c);
    for (int64_t k = 0; k < cnt; k++) {
        int64_t ci = start + k * stp;
        tp_buf_add(&sb, v->str.s + offs[ci], offs[ci + 1] - offs[ci]);
    }
    free(offs);
    return sb_val(c, &sb, line);
}

/* ---- helpers for strings --------------------------------------------------- */

static val *to_strv(rctx *c, val *v, int line)
{
    if (v->type == V_STR)
        return v;
    tp_buf sb = new_sb(c);
    if (cv_str(&sb, v)) {
        tp_buf_free(&sb);
        return rfail(c, TP_EINVAL, line, "unsupported construct: converting a %s to text", cv_type_name(v));
    }
    return sb_val(c, &sb, line);
}

static int is_ascii(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80)
            return 0;
    return 1;
}

/* HTML escaping as markupsafe.escape does it (for |safe strings mixed with plain ones). */
static val *html_escape(rctx *c, val *v, int line)
{
    if (v->type == V_STR && v->str.safe)
        return v;
    val *s = to_strv(c, v, line);
    if (!s)
        return NULL;
    tp_buf sb = new_sb(c);
    for (size_t i = 0; i < s->str.n; i++) {
        char ch = s->str.s[i];
        switch (ch) {
        case '&': tp_buf_puts(&sb, "&amp;"); break;
        case '<': tp_buf_puts(&sb, "&lt;"); break;
        case '>': tp_buf_puts(&sb, "&gt;"); break;
        case '"': tp_buf_puts(&sb, "&#34;"); break;
        case '\'': tp_buf_puts(&sb, "&#39;"); break;
        default: tp_buf_add(&sb, &ch, 1);
        }
    }
    val *r = sb_val(c, &sb, line);
    if (r)
        r->str.safe = 1;
    return r;
}

static int has_ws_char(const char *chars, size_t nc, const char *s, size_t n, size_t i, size_t *len)
{
    if (!chars) {
        *len = tp_chat_ws_at(s, n, i);
        return *len > 0;
    }
    size_t l = tp_utf8_char_len((unsigned char)s[i]);
    for (size_t k = 0; k < nc;) {
        size_t lk = tp_utf8_char_len((unsigned char)chars[k]);
        if (lk == l && !memcmp(chars + k, s + i, l)) {
            *len = l;
            return 1;
        }
        k += lk;
    }
    return 0;
}

/* str.strip/lstrip/rstrip([chars]); which: 1 left, 2 right, 3 both. */
static val *do_strip(rctx *c, val *v, val *chars, int which, int line)
{
    const char *cs = NULL;
    size_t cn = 0;
    if (chars && chars->type == V_STR) {
        cs = chars->str.s;
        cn = chars->str.n;
    } else if (chars && chars->type != V_NONE) {
        return rfail(c, TP_EFORMAT, line, "strip arg must be None or str");
    }
    size_t a = 0, b = v->str.n, l;
    if (which & 1)
        while (a < b && has_ws_char(cs, cn, v->str.s, b, a, &l))
            a += l;
    if (which & 2)
        while (b > a) {
            size_t k = b - 1;
            while (k > a && ((unsigned char)v->str.s[k] & 0xc0) == 0x80)
                k--;
            if (!has_ws_char(cs, cn, v->str.s, b, k, &l) || k + l != b)
                break;
            b = k;
        }
    val *r = mk_str(c, v->str.s + a, b - a, line);
    if (r)
        r->str.safe = v->str.safe;
    return r;
}

static val *do_split(rctx *c, val *v, val *sep, val *maxsplit, int line)
{
    int64_t maxs = -1;
    if (maxsplit) {
        if (maxsplit->type != V_INT)
            return rfail(c, TP_EFORMAT, line, "split maxsplit must be an int");
        maxs = maxsplit->i;
    }
    val *out = mk_list(c, 0, line);
    if (!out)
        return NULL;
    size_t cap = 0;
    const char *s = v->str.s;
    size_t n = v->str.n;
#define ADD(p, len) do { \
        val *piece_ = mk_str(c, (p), (len), line); \
        if (!piece_) return NULL; \
        if (out->list.n == cap) { \
            size_t nc_ = cap ? cap * 2 : 8; \
            val **nv_ = tp_chat_alloc(c->ar, nc_ * sizeof *nv_); \
            if (!nv_) return oom(c, line); \
            if (out->list.n) memcpy(nv_, out->list.v, out->list.n * sizeof *nv_); \
            out->list.v = nv_; cap = nc_; \
        } \
        out->list.v[out->list.n++] = piece_; \
    } while (0)
    if (!sep || sep->type == V_NONE) {
        size_t i = 0, l;
        int64_t done = 0;
        for (;;) {
            while (i < n && (l = tp_chat_ws_at(s, n, i)))
                i += l;
            if (i >= n)
                break;
            if (maxs >= 0 && done >= maxs) {
                size_t e = n;
                while (e > i && (l = tp_chat_ws_before(s, e)))
                    e -= l;
                ADD(s + i, e - i);
                break;
            }
            size_t j = i;
            while (j < n && !tp_chat_ws_at(s, n, j))
                j += tp_utf8_char_len((unsigned char)s[j]);
            ADD(s + i, j - i);
            done++;
            i = j;
        }
        return out;
    }
    if (sep->type != V_STR)
        return rfail(c, TP_EFORMAT, line, "split separator must be str or None");
    if (sep->str.n == 0)
        return rfail(c, TP_EFORMAT, line, "empty separator");
    size_t i = 0;
    int64_t done = 0;
    for (;;) {
        const char *hit = NULL;
        if (maxs < 0 || done < maxs)
            hit = memmem(s + i, n - i, sep->str.s, sep->str.n);
        if (!hit) {
            ADD(s + i, n - i);
            break;
        }
        ADD(s + i, (size_t)(hit - (s + i)));
        i = (size_t)(hit - s) + sep->str.n;
        done++;
        if (step(c, line))
            return NULL;
    }
#undef ADD
    return out;
}

static val *do_replace(rctx *c, val *v, val *old, val *new, val *count, int line)
{
    if (old->type != V_STR || new->type != V_STR)
        return rfail(c, TP_EFORMAT, line, "replace() arguments must be str");
    int64_t max = count && count->type == V_INT ? count->i : -1;
    tp_buf sb = new_sb(c);
    const char *s = v->str.s;
    size_t n = v->str.n, i = 0;
    int64_t done = 0;
    if (old->str.n == 0) {
        /* Python inserts new between every character and at both ends */
        while (i <= n) {
            if (max < 0 || done < max) {
                tp_buf_add(&sb, new->str.s, new->str.n);
                done++;
            }
            if (i == n)
                break;
            size_t l = tp_utf8_char_len((unsigned char)s[i]);
            tp_buf_add(&sb, s + i, l);
            i += l;
        }
        return sb_val(c, &sb, line);
    }
    while (i <= n) {
        const char *hit = (max < 0 || done < max) ? memmem(s + i, n - i, old->str.s, old->str.n) : NULL;
        if (!hit) {
            tp_buf_add(&sb, s + i, n - i);
            break;
        }
        tp_buf_add(&sb, s + i, (size_t)(hit - (s + i)));
        tp_buf_add(&sb, new->str.s, new->str.n);
        i = (size_t)(hit - s) + old->str.n;
        done++;
    }
    return sb_val(c, &sb, line);
}

static val *ascii_case(rctx *c, val *v, int mode, int line, const char *what)
{
    if (!is_ascii(v->str.s, v->str.n))
        return rfail(c, TP_EINVAL, line, "unsupported construct: %s of non-ASCII text", what);
    val *r = mk_str(c, v->str.s, v->str.n, line);
    if (!r)
        return NULL;
    char *d = (char *)r->str.s;
    for (size_t i = 0; i < r->str.n; i++) {
        char ch = d[i];
        int up = mode == 1 || (mode == 3 && i == 0);
        if (up && ch >= 'a' && ch <= 'z')
            d[i] = (char)(ch - 32);
        else if (!up && ch >= 'A' && ch <= 'Z')
            d[i] = (char)(ch + 32);
    }
    return r;
}

static val *items_of(rctx *c, val *d, int line);

/* Python's str.lower() for dictsort's case-insensitive keys: ASCII and
 * Latin-1 letters folded here; text with another code point that has a case
 * (Latin Extended, Greek, Cyrillic, ...) is refused rather than ordered
 * differently from Python. Other values are returned as they are. */
static val *fold_key(rctx *c, val *v, int line)
{
    if (v->type != V_STR)
        return v;
    val *r = mk_str(c, v->str.s, v->str.n, line);
    if (!r)
        return NULL;
    unsigned char *d = (unsigned char *)r->str.s;
    for (size_t i = 0; i < r->str.n;) {
        size_t l = tp_utf8_char_len(d[i]);
        if (l == 1) {
            if (d[i] >= 'A' && d[i] <= 'Z')
                d[i] = (unsigned char)(d[i] + 32);
        } else if (l == 2 && i + 1 < r->str.n) {
            uint32_t cp = ((uint32_t)(d[i] & 0x1f) << 6) | (d[i + 1] & 0x3f);
            if (cp >= 0xc0 && cp <= 0xde && cp != 0xd7) {   /* À..Þ -> à..þ, not × */
                cp += 0x20;
                d[i + 1] = (unsigned char)(0x80 | (cp & 0x3f));
            } else if (cp >= 0x100) {
                return rfail(c, TP_EINVAL, line, "unsupported construct: dictsort of keys with cased letters past Latin-1");
            }
        } else if (l == 3 && i + 2 < r->str.n) {
            uint32_t cp = ((uint32_t)(d[i] & 0x0f) << 12) | ((uint32_t)(d[i + 1] & 0x3f) << 6) | (d[i + 2] & 0x3f);
            if ((cp >= 0x10a0 && cp <= 0x10ff) || (cp >= 0x13a0 && cp <= 0x13ff) || (cp >= 0x1c80 && cp <= 0x1cbf) ||
                (cp >= 0x1e00 && cp <= 0x1fff) || (cp >= 0x2100 && cp <= 0x218f) || (cp >= 0x24b6 && cp <= 0x24cf) ||
                (cp >= 0x2c00 && cp <= 0x2d2f) || (cp >= 0xa640 && cp <= 0xa7ff) || (cp >= 0xff21 && cp <= 0xff3a))
                return rfail(c, TP_EINVAL, line, "unsupported construct: dictsort of keys with cased letters past Latin-1");
        } else if (l == 4) {
            return rfail(c, TP_EINVAL, line, "unsupported construct: dictsort of keys with cased letters past Latin-1");
        }
        i += l;
    }
    return r;
}

/* Jinja's dictsort: sorted(d.items(), key=item[pos] (lowered unless
 * case_sensitive), reverse=reverse). A stable merge sort, so equal keys keep
 * the dict's order either way, as Python's sorted(reverse=True) does. */
static val *do_dictsort(rctx *c, val *v, val *case_sensitive, val *by, val *reverse, int line)
{
    size_t pos;
    if (!by || (by->type == V_STR && by->str.n == 3 && !memcmp(by->str.s, "key", 3)))
        pos = 0;
    else if (by->type == V_STR && by->str.n == 5 && !memcmp(by->str.s, "value", 5))
        pos = 1;
    else
        return rfail(c, TP_EFORMAT, line, "You can only sort by either \"key\" or \"value\"");
    if (v->type == V_UNDEF)
        return rfail(c, TP_EFORMAT, line, "dictsort of an undefined value");
    if (v->type != V_DICT)
        return rfail(c, TP_EFORMAT, line, "'%s' object has no attribute 'items'", cv_type_name(v));
    val *l = items_of(c, v, line);
    size_t n = v->dict.n;
    if (!l || n < 2)
        return l;
    int cs = case_sensitive && cv_truthy(case_sensitive), rev = reverse && cv_truthy(reverse);
    val **key = tp_chat_alloc(c->ar, n * sizeof *key), **tmp = tp_chat_alloc(c->ar, n * sizeof *tmp);
    val **ktmp = tp_chat_alloc(c->ar, n * sizeof *ktmp);
    if (!key || !tmp || !ktmp)
        return oom(c, line);
    for (size_t k = 0; k < n; k++) {
        key[k] = l->list.v[k]->list.v[pos];
        if (!cs && !(key[k] = fold_key(c, key[k], line)))
            return NULL;
    }
    val **it = l->list.v;
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t i = lo, j = mid, o = lo;
            while (i < mid && j < hi) {
                int res;
                if (step(c, line))
                    return NULL;
                if (rev ? cv_order(key[i], key[j], &res) : cv_order(key[j], key[i], &res))
                    return rfail(c, TP_EFORMAT, line, "'<' not supported between instances of '%s' and '%s'",
                                 cv_type_name(key[j]), cv_type_name(key[i]));
                /* take the right one only when it sorts strictly first */
                if (res < 0) {
                    ktmp[o] = key[j];
                    tmp[o++] = it[j++];
                } else {
                    ktmp[o] = key[i];
                    tmp[o++] = it[i++];
                }
            }
            while (i < mid) {
                ktmp[o] = key[i];
                tmp[o++] = it[i++];
            }
            while (j < hi) {
                ktmp[o] = key[j];
                tmp[o++] = it[j++];
            }
        }
        memcpy(it, tmp, n * sizeof *it);
        memcpy(key, ktmp, n * sizeof *key);
    }
    return l;
}

/* Items of an iterable: list items, dict keys, string characters. */
static int iter_items(rctx *c, val *v, val ***items, size_t *n, int line)
{
    switch (v->type) {
    case V_UNDEF:
        *items = NULL;
        *n = 0;
        return 0;
    case V_LIST:
        if (v->list.lazy) {
            if (v->list.consumed == 2) {
                rfail(c, TP_EINVAL, line, "unsupported construct: iterating a partly used generator");
                return -1;
            }
            *items = v->list.v;
            *n = v->list.consumed ? 0 : v->list.n;
            v->list.consumed = 1;
            return 0;
        }
        *items = v->list.v;
        *n = v->list.n;
        return 0;
    case V_DICT:
        *items = v->dict.k;
        *n = v->dict.n;
        return 0;
    case V_STR: {
        size_t nc = tp_utf8_count(v->str.s, v->str.n);
        val **o = nc ? tp_chat_alloc(c->ar, nc * sizeof *o) : NULL;
        if (nc && !o) {
            oom(c, line);
            return -1;
        }
        size_t i = 0;
        for (size_t k = 0; k < nc; k++) {
            size_t l = tp_utf8_char_len((unsigned char)v->str.s[i]);
            if (!(o[k] = mk_str(c, v->str.s + i, l, line)))
                return -1;
            i += l;
        }
        *items = o;
        *n = nc;
        return 0;
    }
    default:
        rfail(c, TP_EFORMAT, line, "'%s' object is not iterable", cv_type_name(v));
        return -1;
    }
}

static int contains(rctx *c, val *hay, val *needle, int line)
{
    if (hay->type == V_STR) {
        if (needle->type != V_STR) {
            rfail(c, TP_EFORMAT, line, "'in <string>' requires string as left operand, not %s", cv_type_name(needle));
            return -1;
        }
        return needle->str.n == 0 || memmem(hay->str.s, hay->str.n, needle->str.s, needle->str.n) != NULL;
    }
    if (hay->type == V_DICT)
        return cv_dict_get(hay, needle) != NULL;
    if (hay->type == V_LIST && hay->list.lazy) {
        rfail(c, TP_EINVAL, line, "unsupported construct: 'in' on a generator");
        return -1;
    }
    if (hay->type == V_LIST) {
        for (size_t k = 0; k < hay->list.n; k++)
            if (cv_eq(hay->list.v[k], needle))
                return 1;
        return 0;
    }
    if (hay->type == V_UNDEF)
        return 0;
    rfail(c, TP_EFORMAT, line, "argument of type '%s' is not iterable", cv_type_name(hay));
    return -1;
}

/* ---- evaluation ------------------------------------------------------------ */

static val *eval(rctx *c, frame *f, const node *x);
static int exec_body(rctx *c, frame *f, node *const *b, size_t n);
static val *apply_filter(rctx *c, frame *f, const char *name, val *v, val **args, size_t npos, const char **kw,
                         val **kwv, size_t nkw, int line);
static int apply_test(rctx *c, const char *name, val *v, val **args, size_t n, int line);

static val *arith(rctx *c, const char *op, val *a, val *b, int line)
{
    if (a->type == V_UNDEF)
        return undef_use(c, a, line);
    if (b->type == V_UNDEF)
        return undef_use(c, b, line);
    if (!strcmp(op, "+")) {
        if (a->type == V_STR && b->type == V_STR) {
            if (a->str.safe != b->str.safe) {
                /* markupsafe: Markup + str escapes the plain side */
                if (!(a = html_escape(c, a, line)) || !(b = html_escape(c, b, line)))
                    return NULL;
            }
            tp_buf sb = new_sb(c);
            tp_buf_add(&sb, a->str.s, a->str.n);
            tp_buf_add(&sb, b->str.s, b->str.n);
            val *r = sb_val(c, &sb, line);
            if (r)
                r->str.safe = a->str.safe;
            return r;
        }
        if (a->type == V_LIST && b->type == V_LIST && a->list.tuple == b->list.tuple && !a->list.lazy &&
            !b->list.lazy) {
            val *r = mk_list(c, a->list.n + b->list.n, line);
            if (!r)
                return NULL;
            r->list.tuple = a->list.tuple;
            if (a->list.n)
                memcpy(r->list.v, a->list.v, a->list.n * sizeof *r->list.v);
            if (b->list.n)
                memcpy(r->list.v + a->list.n, b->list.v, b->list.n * sizeof *r->list.v);
            return r;
        }
    }
    if (!strcmp(op, "*") && ((a->type == V_STR || (a->type == V_LIST && !a->list.lazy)) &&
                             (b->type == V_INT || b->type == V_BOOL))) {
        int64_t k = cv_num_i(b);
        if (k < 0)
            k = 0;
        size_t unit = a->type == V_STR ? a->str.n : a->list.n;
        if (unit && (uint64_t)k > c->max_output / unit + 1)
            return rfail(c, TP_ERANGE, line, "repetition longer than the %zu-byte output limit", c->max_output);
        if (a->type == V_STR) {
            tp_buf sb = new_sb(c);
            for (int64_t i = 0; i < k; i++)
                tp_buf_add(&sb, a->str.s, a->str.n);
            val *r = sb_val(c, &sb, line);
            if (r)
                r->str.safe = a->str.safe;
            return r;
        }
        val *r = mk_list(c, unit * (size_t)k, line);
        for (int64_t i = 0; r && unit && i < k; i++)
            memcpy(r->list.v + (size_t)i * unit, a->list.v, unit * sizeof *r->list.v);
        return r;
    }
    if (!strcmp(op, "*") && (b->type == V_STR || b->type == V_LIST) && (a->type == V_INT || a->type == V_BOOL))
        return arith(c, op, b, a, line);
    if (!cv_is_num(a) || !cv_is_num(b))
        return rfail(c, TP_EFORMAT, line, "unsupported operand type(s) for %s: '%s' and '%s'", op, cv_type_name(a),
                     cv_type_name(b));
    int fl = a->type == V_FLOAT || b->type == V_FLOAT;
    if (!strcmp(op, "/")) {
        if (cv_num_d(b) == 0)
            return rfail(c, TP_EFORMAT, line, "division by zero");
        return mk_float(c, cv_num_d(a) / cv_num_d(b), line);
    }
    if (fl) {
        double x = cv_num_d(a), y = cv_num_d(b), r;
        if (!strcmp(op, "+"))
            r = x + y;
        else if (!strcmp(op, "-"))
            r = x - y;
        else if (!strcmp(op, "*"))
            r = x * y;
        else if (!strcmp(op, "//") || !strcmp(op, "%")) {
            if (y == 0)
                return rfail(c, TP_EFORMAT, line, "float division by zero");
            double q = __builtin_floor(x / y);
            r = !strcmp(op, "//") ? q : x - q * y;
        } else
            return rfail(c, TP_EINVAL, line, "unsupported construct: float '%s'", op);
        return mk_float(c, r, line);
    }
    int64_t x = cv_num_i(a), y = cv_num_i(b), r;
    if (!strcmp(op, "+")) {
        if (__builtin_add_overflow(x, y, &r))
            return rfail(c, TP_ERANGE, line, "integer overflow");
    } else if (!strcmp(op, "-")) {
        if (__builtin_sub_overflow(x, y, &r))
            return rfail(c, TP_ERANGE, line, "integer overflow");
    } else if (!strcmp(op, "*")) {
        if (__builtin_mul_overflow(x, y, &r))
            return rfail(c, TP_ERANGE, line, "integer overflow");
    } else if (!strcmp(op, "//") || !strcmp(op, "%")) {
        if (y == 0)
            return rfail(c, TP_EFORMAT, line, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1)
            return rfail(c, TP_ERANGE, line, "integer overflow");
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
            q--;
            m += y;
        }
        r = !strcmp(op, "//") ? q : m;
    } else if (!strcmp(op, "**")) {
        if (y < 0)
            return mk_float(c, __builtin_pow((double)x, (double)y), line);
        r = 1;
        for (int64_t i = 0; i < y; i++)
            if (__builtin_mul_overflow(r, x, &r))
                return rfail(c, TP_ERANGE, line, "integer overflow");
    } else {
        return rfail(c, TP_EINVAL, line, "unsupported construct: operator '%s'", op);
    }
    return mk_int(c, r, line);
}

static val *call_macro(rctx *c, val *m, val **args, size_t npos, const char **kw, val **kwv, size_t nkw, int line);
static val *call_method(rctx *c, val *m, val **args, size_t npos, const char **kw, val **kwv, size_t nkw, int line);

static val *call_func(rctx *c, val *fn, val **args, size_t npos, const char **kw, val **kwv, size_t nkw, int line)
{
    const char *nm = fn->func.name;
    if (!strcmp(nm, "raise_exception")) {
        val *msg = npos ? to_strv(c, args[0], line) : NULL;
        if (npos && !msg)
            return NULL;
        return rfail(c, TP_EINVAL, line, "raise_exception: %.*s", msg ? (int)msg->str.n : 0, msg ? msg->str.s : "");
    }
    if (!strcmp(nm, "namespace") || !strcmp(nm, "dict")) {
        val *d = mk(c, !strcmp(nm, "namespace") ? V_NS : V_DICT, line);
        if (!d)
            return NULL;
        if (npos > 1 || (npos == 1 && args[0]->type != V_DICT))
            return rfail(c, TP_EINVAL, line, "unsupported construct: %s() with positional arguments", nm);
        if (npos)
            for (size_t k = 0; k < args[0]->dict.n; k++)
                if (dict_set(c, d, args[0]->dict.k[k], args[0]->dict.v[k], line))
                    return NULL;
        for (size_t k = 0; k < nkw; k++) {
            val *key = mk_str(c, kw[k], strlen(kw[k]), line);
            if (!key || dict_set(c, d, key, kwv[k], line))
                return NULL;
        }
        return d;
    }
    if (!strcmp(nm, "range")) {
        int64_t a = 0, b, s = 1;
        if (nkw || npos < 1 || npos > 3)
            return rfail(c, TP_EFORMAT, line, "range() takes 1 to 3 integer arguments");
        for (size_t k = 0; k < npos; k++)
            if (args[k]->type != V_INT)
                return rfail(c, TP_EFORMAT, line, "range() arguments must be integers");
        if (npos == 1)
            b = args[0]->i;
        else {
            a = args[0]->i;
            b = args[1]->i;
            if (npos == 3)
                s = args[2]->i;
        }
        if (s == 0)
            return rfail(c, TP_EFORMAT, line, "range() arg 3 must not be zero");
        int64_t cnt = 0;
        if (s > 0 && a < b)
            cnt = (b - a - 1) / s + 1;
        else if (s < 0 && a > b)
            cnt = (a - b - 1) / (-s) + 1;
        if (cnt > TP_CHAT_MAX_STEPS)
            return rfail(c, TP_ERANGE, line, "range of more than %d items", TP_CHAT_MAX_STEPS);
        val *l = mk_list(c, (size_t)cnt, line);
        for (int64_t k = 0; l && k < cnt; k++)
            if (!(l->list.v[k] = mk_int(c, a + k * s, line)))
                return NULL;
        return l;
    }
    if (!strcmp(nm, "strftime_now")) {
        if (npos != 1 || args[0]->type != V_STR || nkw)
            return rfail(c, TP_EFORMAT, line, "strftime_now() takes one format string");
        char fmt[128], buf[256];
        if (args[0]->str.n >= sizeof fmt)
            return rfail(c, TP_ERANGE, line, "strftime_now format too long");
        memcpy(fmt, args[0]->str.s, args[0]->str.n);
        fmt[args[0]->str.n] = 0;
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t n = strftime(buf, sizeof buf, fmt, &tm);
        return mk_str(c, buf, n, line);
    }
    return rfail(c, TP_EINVAL, line, "unsupported construct: function '%s'", nm);
}

static val *call_val(rctx *c, val *callee, val **args, size_t npos, const char **kw, val **kwv, size_t nkw, int line)
{
    switch (callee->type) {
    case V_FUNC:
        return call_func(c, callee, args, npos, kw, kwv, nkw, line);
    case V_MACRO:
        return call_macro(c, callee, args, npos, kw, kwv, nkw, line);
    case V_METHOD:
        return call_method(c, callee, args, npos, kw, kwv, nkw, line);
    case V_UNDEF:
        if (callee->undef.name)
            return rfail(c, TP_EFORMAT, line, "'%s' is undefined", callee->undef.name);
        return rfail(c, TP_EINVAL, line, "unsupported construct: calling an undefined method or value");
    default:
        return rfail(c, TP_EFORMAT, line, "'%s' object is not callable", cv_type_name(callee));
    }
}

/* Evaluate a call's argument list: positionals then keywords. */
static int eval_args(rctx *c, frame *f, const node *x, val ***pos, size_t *npos, val ***kwv)
{
    size_t n = x->n_args;
    val **a = n ? tp_chat_alloc(c->ar, n * sizeof *a) : NULL;
    if (n && !a) {
        oom(c, x->line);
        return -1;
    }
    for (size_t k = 0; k < n; k++)
        if (!(a[k] = eval(c, f, x->args[k])))
            return -1;
    *pos = a;
    *npos = n - x->n_kw;
    *kwv = a ? a + (n - x->n_kw) : NULL;
    return 0;
}

static val *eval_cmp(rctx *c, frame *f, const node *x)
{
    val *l = eval(c, f, x->a);
    if (!l)
        return NULL;
    for (size_t k = 0; k < x->n_args; k++) {
        val *r = eval(c, f, x->vals[k]);
        if (!r)
            return NULL;
        const char *op = x->ops[k];
        int ok;
        if (!strcmp(op, "==") || !strcmp(op, "!=")) {
            ok = cv_eq(l, r) == (op[0] == '=');
        } else if (!strcmp(op, "in") || !strcmp(op, "not in")) {
            int in = contains(c, r, l, x->line);
            if (in < 0)
                return NULL;
            ok = in == (op[0] == 'i');
        } else {
            if (l->type == V_UNDEF)
                return undef_use(c, l, x->line);
            if (r->type == V_UNDEF)
                return undef_use(c, r, x->line);
            int res;
            if (cv_order(l, r, &res))
                return rfail(c, TP_EFORMAT, x->line, "'%s' not supported between instances of '%s' and '%s'", op,
                             cv_type_name(l), cv_type_name(r));
            ok = !strcmp(op, "<") ? res < 0 : !strcmp(op, "<=") ? res <= 0 : !strcmp(op, ">") ? res > 0 : res >= 0;
        }
        if (!ok)
            return c->f;
        l = r;
    }
    return c->t;
}

static val *eval(rctx *c, frame *f, const node *x)
{
    if (c->failed)
        return NULL;
    switch (x->kind) {
    case N_LIT:
        return x->lit;
    case N_NAME:
        return lookup(c, f, x->name, x->line);
    case N_ATTR: {
        val *v = eval(c, f, x->a);
        return v ? get_attr(c, v, x->name, x->line) : NULL;
    }
    case N_ITEM: {
        val *v = eval(c, f, x->a), *k = v ? eval(c, f, x->b) : NULL;
        return k ? get_item(c, v, k, x->line) : NULL;
    }
    case N_SLICE: {
        val *v = eval(c, f, x->a);
        if (!v)
            return NULL;
        val *a = NULL, *b = NULL, *s = NULL;
        if ((x->b && !(a = eval(c, f, x->b))) || (x->c && !(b = eval(c, f, x->c))) ||
            (x->d && !(s = eval(c, f, x->d))))
            return NULL;
        return do_slice(c, v, a, b, s, x->line);
    }
    case N_CALL: {
        val *callee = eval(c, f, x->a);
        val **pos, **kwv;
        size_t npos;
        if (!callee || eval_args(c, f, x, &pos, &npos, &kwv))
            return NULL;
        return call_val(c, callee, pos, npos, x->kw_names, kwv, x->n_kw, x->line);
    }
    case N_FILTER: {
        val *v = eval(c, f, x->a);
        val **pos, **kwv;
        size_t npos;
        if (!v || eval_args(c, f, x, &pos, &npos, &kwv))
            return NULL;
        return apply_filter(c, f, x->name, v, pos, npos, x->kw_names, kwv, x->n_kw, x->line);
    }
    case N_TEST: {
        val *v = eval(c, f, x->a);
        val **pos, **kwv;
        size_t npos;
        if (!v || eval_args(c, f, x, &pos, &npos, &kwv))
            return NULL;
        int r = apply_test(c, x->name, v, pos, npos, x->line);
        if (r < 0)
            return NULL;
        return mk_bool(c, r != x->negate);
    }
    case N_NEG:
    case N_POS: {
        val *v = eval(c, f, x->a);
        if (!v)
            return NULL;
        if (v->type == V_UNDEF)
            return undef_use(c, v, x->line);
        if (!cv_is_num(v))
            return rfail(c, TP_EFORMAT, x->line, "bad operand type for unary %c: '%s'", x->kind == N_NEG ? '-' : '+',
                         cv_type_name(v));
        if (x->kind == N_POS)
            return v->type == V_BOOL ? mk_int(c, v->b, x->line) : v;
        if (v->type == V_FLOAT)
            return mk_float(c, -v->f, x->line);
        if (cv_num_i(v) == INT64_MIN)
            return rfail(c, TP_ERANGE, x->line, "integer overflow");
        return mk_int(c, -cv_num_i(v), x->line);
    }
    case N_BIN: {
        val *a = eval(c, f, x->a), *b = a ? eval(c, f, x->b) : NULL;
        if (!b)
            return NULL;
        if (!strcmp(x->name, "~")) {
            tp_buf sb = new_sb(c);
            if (cv_str(&sb, a) || cv_str(&sb, b)) {
                tp_buf_free(&sb);
                /* names a unless its text is empty: a limit of 0 fits only that */
                tp_buf probe;
                tp_buf_init(&probe, 0);
                const char *bad = cv_str(&probe, a) ? cv_type_name(a) : cv_type_name(b);
                tp_buf_free(&probe);
                return rfail(c, TP_EINVAL, x->line, "unsupported construct: '~' with a %s", bad);
            }
            return sb_val(c, &sb, x->line);
        }
        return arith(c, x->name, a, b, x->line);
    }
    case N_AND: {
        val *a = eval(c, f, x->a);
        if (!a || !cv_truthy(a))
            return a;
        return eval(c, f, x->b);
    }
    case N_OR: {
        val *a = eval(c, f, x->a);
        if (!a || cv_truthy(a))
            return a;
        return eval(c, f, x->b);
    }
    case N_NOT: {
        val *a = eval(c, f, x->a);
        return a ? mk_bool(c, !cv_truthy(a)) : NULL;
    }
    case N_CMP:
        return eval_cmp(c, f, x);
    case N_COND: {
        val *t = eval(c, f, x->b);
        if (!t)
            return NULL;
        if (cv_truthy(t))
            return eval(c, f, x->a);
        return x->c ? eval(c, f, x->c) : mk_undef(c, NULL, x->line);
    }
    case N_LIST:
    case N_TUPLE: {
        val *l = mk_list(c, x->n_args, x->line);
        if (!l)
            return NULL;
        l->list.tuple = x->kind == N_TUPLE;
        for (size_t k = 0; k < x->n_args; k++)
            if (!(l->list.v[k] = eval(c, f, x->args[k])))
                return NULL;
        return l;
    }
    case N_DICT: {
        val *d = mk(c, V_DICT, x->line);
        if (!d)
            return NULL;
        for (size_t k = 0; k < x->n_args; k++) {
            val *kk = eval(c, f, x->args[k]), *vv = kk ? eval(c, f, x->vals[k]) : NULL;
            if (!vv || dict_set(c, d, kk, vv, x->line))
                return NULL;
        }
        return d;
    }
    default:
        return rfail(c, TP_EINVAL, x->line, "unsupported construct: expression kind %d", x->kind);
    }
}

/* ---- macros and methods ------------------------------------------------------ */

static val *render_to_string(rctx *c, frame *f, node *const *body, size_t n, int line)
{
    tp_buf *saved = c->out;
    tp_buf sb = new_sb(c);
    c->out = &sb;
    int rc = exec_body(c, f, body, n);
    c->out = saved;
    if (rc) {
        tp_buf_free(&sb);
        return NULL;
    }
    return sb_val(c, &sb, line);
}

static val *call_macro(rctx *c, val *m, val **args, size_t npos, const char **kw, val **kwv, size_t nkw, int line)
{
    const node *def = m->macro.def;
    if (npos > def->n_targets)
        return rfail(c, TP_EFORMAT, line, "macro '%s' takes not more than %zu argument(s)", def->name, def->n_targets);
    if (++c->depth > TP_CHAT_MAX_DEPTH)
        return rfail(c, TP_ERANGE, line, "macro calls nested deeper than %d", TP_CHAT_MAX_DEPTH);
    frame fr = {.parent = c->globals};
    for (size_t k = 0; k < nkw; k++) {
        size_t j = 0;
        while (j < def->n_targets && strcmp(def->targets[j], kw[k]))
            j++;
        if (j == def->n_targets)
            return rfail(c, TP_EFORMAT, line, "macro '%s' takes no keyword argument '%s'", def->name, kw[k]);
        if (j < npos)
            return rfail(c, TP_EFORMAT, line, "macro '%s' got multiple values for argument '%s'", def->name, kw[k]);
    }
    for (size_t j = 0; j < def->n_targets; j++) {
        val *v = NULL;
        if (j < npos)
            v = args[j];
        for (size_t k = 0; !v && k < nkw; k++)
            if (!strcmp(def->targets[j], kw[k]))
                v = kwv[k];
        if (!v && def->defaults[j] && !(v = eval(c, &fr, def->defaults[j])))
            return NULL;
        if (!v && !(v = mk_undef(c, def->targets[j], line)))
            return NULL;
        if (frame_set(c, &fr, def->targets[j], v, line))
            return NULL;
    }
    val *r = render_to_string(c, &fr, def->body, def->n_body, line);
    c->depth--;
    return r;
}

static val *kwarg(val **pos, size_t npos, const char **kw, val **kwv, size_t nkw, size_t i, const char *name)
{
    if (i < npos)
        return pos[i];
    for (size_t k = 0; k < nkw; k++)
        if (!strcmp(kw[k], name))
            return kwv[k];
    return NULL;
}

static val *items_of(rctx *c, val *d, int line)
{
    val *l = mk_list(c, d->dict.n, line);
    for (size_t k = 0; l && k < d->dict.n; k++) {
        val *t = mk_list(c, 2, line);
        if (!t)
            return NULL;
        t->list.tuple = 1;
        t->list.v[0] = d->dict.k[k];
        t->list.v[1] = d->dict.v[k];
        l->list.v[k] = t;
    }
    return l;
}

static val *call_method(rctx *c, val *m, val **args, size_t npos, const char **kw, val **kwv, size_t nkw, int line)
{
    val *self = m->method.self;
    const char *nm = m->method.name;
#define A(i, name) kwarg(args, npos, kw, kwv, nkw, (i), (name))
    if (self->type == V_DICT) {
        if (!strcmp(nm, "items") && !npos)
            return items_of(c, self, line);
        if ((!strcmp(nm, "keys") || !strcmp(nm, "values")) && !npos) {
            val *l = mk_list(c, self->dict.n, line);
            for (size_t k = 0; l && k < self->dict.n; k++)
                l->list.v[k] = nm[0] == 'k' ? self->dict.k[k] : self->dict.v[k];
            return l;
        }
        if (!strcmp(nm, "get") && npos >= 1 && npos <= 2 && !nkw) {
            const val *v = cv_dict_get(self, args[0]);
            return v ? (val *)v : npos == 2 ? args[1] : c->none;
        }
    } else if (self->type == V_STR) {
        if (!strcmp(nm, "strip") || !strcmp(nm, "lstrip") || !strcmp(nm, "rstrip"))
            return do_strip(c, self, npos ? args[0] : NULL, nm[0] == 's' ? 3 : nm[0] == 'l' ? 1 : 2, line);
        if (!strcmp(nm, "split"))
            return do_split(c, self, A(0, "sep"), A(1, "maxsplit"), line);
        if ((!strcmp(nm, "startswith") || !strcmp(nm, "endswith")) && npos == 1) {
            val *p = args[0];
            val **alts = &p;
            size_t na = 1;
            if (p->type == V_LIST && p->list.tuple) {
                alts = p->list.v;
                na = p->list.n;
            }
            for (size_t k = 0; k < na; k++) {
                if (alts[k]->type != V_STR)
                    return rfail(c, TP_EFORMAT, line, "%s first arg must be str or a tuple of str", nm);
                size_t l = alts[k]->str.n;
                if (l <= self->str.n &&
                    !memcmp(nm[0] == 's' ? self->str.s : self->str.s + self->str.n - l, alts[k]->str.s, l))
                    return c->t;
            }
            return c->f;
        }
        if (!strcmp(nm, "upper") && !npos)
            return ascii_case(c, self, 1, line, "upper()");
        if (!strcmp(nm, "lower") && !npos)
            return ascii_case(c, self, 0, line, "lower()");
        if (!strcmp(nm, "capitalize") && !npos)
            return ascii_case(c, self, 3, line, "capitalize()");
        if (!strcmp(nm, "replace") && (npos == 2 || npos == 3))
            return do_replace(c, self, args[0], args[1], npos == 3 ? args[2] : NULL, line);
        if (!strcmp(nm, "join") && npos == 1)
            return apply_filter(c, NULL, "join", args[0], &self, 1, NULL, NULL, 0, line);
    }
#undef A
    return rfail(c, TP_EINVAL, line, "unsupported construct: method %s.%s() with these arguments", cv_type_name(self), nm);
}

/* ---- tests ----------------------------------------------------------------- */

static int apply_test(rctx *c, const char *name, val *v, val **args, size_t n, int line)
{
#define IS(s) (!strcmp(name, s))
    if (IS("defined"))
        return v->type != V_UNDEF;
    if (IS("undefined"))
        return v->type == V_UNDEF;
    if (IS("none"))
        return v->type == V_NONE;
    if (IS("true") || IS("false"))
        return v->type == V_BOOL && v->b == IS("true");
    if (IS("boolean"))
        return v->type == V_BOOL;
    if (IS("string"))
        return v->type == V_STR;
    if (IS("number"))
        return cv_is_num(v);
    if (IS("integer"))
        return v->type == V_INT;
    if (IS("float"))
        return v->type == V_FLOAT;
    if (IS("mapping"))
        return v->type == V_DICT;
    if (IS("iterable"))
        return v->type == V_STR || v->type == V_LIST || v->type == V_DICT || v->type == V_UNDEF;
    if (IS("sequence"))
        return v->type == V_STR || v->type == V_LIST || v->type == V_DICT || v->type == V_UNDEF;
    if (IS("callable"))
        return v->type == V_MACRO || v->type == V_FUNC || v->type == V_METHOD;
    if (IS("lower") || IS("upper")) {
        val *s = to_strv(c, v, line);
        if (!s)
            return -1;
        if (!is_ascii(s->str.s, s->str.n)) {
            rfail(c, TP_EINVAL, line, "unsupported construct: test '%s' on non-ASCII text", name);
            return -1;
        }
        int cased = 0;
        for (size_t i = 0; i < s->str.n; i++) {
            char ch = s->str.s[i];
            if (ch >= 'a' && ch <= 'z') {
                if (IS("upper"))
                    return 0;
                cased = 1;
            } else if (ch >= 'A' && ch <= 'Z') {
                if (IS("lower"))
                    return 0;
                cased = 1;
            }
        }
        return cased;
    }
    if (n < 1) {
        rfail(c, TP_EFORMAT, line, "test '%s' needs an argument", name);
        return -1;
    }
    val *a = args[0];
    if (IS("eq") || IS("equalto") || IS("=="))
        return cv_eq(v, a);
    if (IS("ne") || IS("!="))
        return !cv_eq(v, a);
    if (IS("in"))
        return contains(c, a, v, line);
    if (IS("sameas"))
        return v == a || (v->type == V_NONE && a->type == V_NONE) ||
               (v->type == V_BOOL && a->type == V_BOOL && v->b == a->b);
    if (IS("divisibleby")) {
        if (!cv_is_num(v) || !cv_is_num(a) || a->type == V_FLOAT || v->type == V_FLOAT || cv_num_i(a) == 0) {
            rfail(c, TP_EFORMAT, line, "test 'divisibleby' needs non-zero integers");
            return -1;
        }
        return cv_num_i(v) % cv_num_i(a) == 0;
    }
    int res;
    if (v->type == V_UNDEF || a->type == V_UNDEF || cv_order(v, a, &res)) {
        rfail(c, TP_EFORMAT, line, "test '%s' compares a %s with a %s", name, cv_type_name(v), cv_type_name(a));
        return -1;
    }
    if (IS("lt") || IS("lessthan") || IS("<"))
        return res < 0;
    if (IS("le") || IS("<="))
        return res <= 0;
    if (IS("gt") || IS("greaterthan") || IS(">"))
        return res > 0;
    if (IS("ge") || IS(">="))
        return res >= 0;
#undef IS
    rfail(c, TP_EINVAL, line, "unsupported construct: test '%s'", name);
    return -1;
}

/* ---- filters ---------------------------------------------------------------- */

static val *attr_path(rctx *c, val *v, val *attr, int line)
{
    /* Jinja's make_attrgetter: "a.b" walks attributes, an int indexes */
    if (attr->type == V_INT)
        return get_item(c, v, attr, line);
    if (attr->type != V_STR)
        return rfail(c, TP_EFORMAT, line, "attribute name must be a string");
    const char *s = attr->str.s;
    size_t n = attr->str.n, i = 0;
    while (v && i <= n) {
        const char *dot = memchr(s + i, '.', n - i);
        size_t e = dot ? (size_t)(dot - s) : n;
        val *key = mk_str(c, s + i, e - i, line);
        if (!key)
            return NULL;
        v = get_item(c, v, key, line);
        i = e + 1;
        if (!dot)
            break;
    }
    return v;
}

/* What Jinja's map / select / reject / unique give: a generator (no len(),
 * iterated once) of up to n items of v, to fill in. falsy_empty: a false v
 * (none, undefined, "") gives an empty one, as those filters treat it. */
static val *generator(rctx *c, val *v, int falsy_empty, val ***items, size_t *n, int line)
{
    *items = NULL;
    *n = 0;
    if ((!falsy_empty || cv_truthy(v)) && iter_items(c, v, items, n, line))
        return NULL;
    val *l = mk_list(c, *n, line);
    if (l)
        l->list.lazy = 1;
    return l;
}

static val *apply_filter(rctx *c, frame *f, const char *name, val *v, val **args, size_t npos, const char **kw,
                         val **kwv, size_t nkw, int line)
{
    (void)f;
#define IS(s) (!strcmp(name, s))
#define A(i, nm) kwarg(args, npos, kw, kwv, nkw, (i), (nm))
    if (IS("safe")) {
        val *s = to_strv(c, v, line);
        if (!s)
            return NULL;
        val *r = mk_str(c, s->str.s, s->str.n, line);
        if (r)
            r->str.safe = 1;
        return r;
    }
    if (IS("default") || IS("d")) {
        val *dv = A(0, "default_value"), *boolean = A(1, "boolean");
        int use = v->type == V_UNDEF || (boolean && cv_truthy(boolean) && !cv_truthy(v));
        if (use)
            return dv ? dv : mk_str(c, "", 0, line);
        return v;
    }
    if (IS("tojson")) {
        val *ind = A(0, "indent");
        int indent = -1;
        if (ind && ind->type == V_INT)
            indent = (int)(ind->i < 0 ? 0 : ind->i > 64 ? 64 : ind->i);
        else if (ind && ind->type != V_NONE)
            return rfail(c, TP_EINVAL, line, "unsupported construct: tojson indent of type %s", cv_type_name(ind));
        for (size_t k = 0; k < nkw; k++)
            if (strcmp(kw[k], "indent"))
                return rfail(c, TP_EINVAL, line, "unsupported construct: tojson(%s=...)", kw[k]);
        tp_buf sb = new_sb(c);
        int rc = cv_json(&sb, v, indent, 0);
        if (rc) {
            tp_buf_free(&sb);
            if (v->type == V_UNDEF)
                return rfail(c, TP_EFORMAT, line, "tojson of an undefined value");
            return rfail(c, TP_EFORMAT, line, "tojson: a %s is not JSON serializable",
                         rc == 2 ? "value nested this deep" : "value in it");
        }
        return sb_val(c, &sb, line);
    }
    if (IS("items")) {
        if (v->type == V_UNDEF)
            return mk_list(c, 0, line);
        if (v->type != V_DICT)
            return rfail(c, TP_EFORMAT, line, "|items expects a mapping, got %s", cv_type_name(v));
        return items_of(c, v, line);
    }
    if (IS("dictsort"))
        return do_dictsort(c, v, A(0, "case_sensitive"), A(1, "by"), A(2, "reverse"), line);
    if (IS("length") || IS("count")) {
        switch (v->type) {
        case V_UNDEF: return mk_int(c, 0, line);
        case V_STR: return mk_int(c, (int64_t)tp_utf8_count(v->str.s, v->str.n), line);
        case V_LIST:
            if (v->list.lazy)
                return rfail(c, TP_EFORMAT, line, "object of type 'generator' has no len()");
            return mk_int(c, (int64_t)v->list.n, line);
        case V_DICT: return mk_int(c, (int64_t)v->dict.n, line);
        default: return rfail(c, TP_EFORMAT, line, "object of type '%s' has no len()", cv_type_name(v));
        }
    }
    if (IS("list")) {
        val **items;
        size_t n;
        if (iter_items(c, v, &items, &n, line))
            return NULL;
        val *l = mk_list(c, n, line);
        if (l && n)
            memcpy(l->list.v, items, n * sizeof *items);
        return l;
    }
    if (IS("first") || IS("last")) {
        val **items;
        size_t n;
        if (IS("last") && v->type == V_LIST && v->list.lazy)
            return rfail(c, TP_EFORMAT, line, "'generator' object is not reversible");
        int lazy = v->type == V_LIST && v->list.lazy && !v->list.consumed;
        if (iter_items(c, v, &items, &n, line))
            return NULL;
        if (lazy && n > 1)
            v->list.consumed = 2;
        if (!n)
            return mk_undef(c, NULL, line);
        return IS("first") ? items[0] : items[n - 1];
    }
    if (IS("reverse")) {
        if (v->type == V_STR)
            return do_slice(c, v, NULL, NULL, mk_int(c, -1, line), line);
        val **items;
        size_t n;
        if (iter_items(c, v, &items, &n, line))
            return NULL;
        val *l = mk_list(c, n, line);
        for (size_t k = 0; l && k < n; k++)
            l->list.v[k] = items[n - 1 - k];
        return l;
    }
    if (IS("join")) {
        val *sep = A(0, "d"), *attr = A(1, "attribute");
        if (sep && sep->type != V_STR)
            return rfail(c, TP_EFORMAT, line, "join separator must be a string");
        val **items;
        size_t n;
        if (iter_items(c, v, &items, &n, line))
            return NULL;
        int safe = 0;
        for (size_t k = 0; k < n; k++)
            safe |= items[k]->type == V_STR && items[k]->str.safe;
        if (sep && sep->str.safe)
            safe = 1;
        tp_buf sb = new_sb(c);
        for (size_t k = 0; k < n; k++) {
            val *it = items[k];
            if (attr && !(it = attr_path(c, it, attr, line))) {
                tp_buf_free(&sb);
                return NULL;
            }
            if (safe && !(it = html_escape(c, it, line))) {
                tp_buf_free(&sb);
                return NULL;
            }
            if (k && sep)
                tp_buf_add(&sb, sep->str.s, sep->str.n);
            if (cv_str(&sb, it)) {
                tp_buf_free(&sb);
                return rfail(c, TP_EINVAL, line, "unsupported construct: join of a %s", cv_type_name(it));
            }
        }
        val *r = sb_val(c, &sb, line);
        if (r)
            r->str.safe = safe;
        return r;
    }
    if (IS("map")) {
        val *attr = A(99, "attribute");
        val **items = NULL;
        size_t n = 0;
        val *l = generator(c, v, 1, &items, &n, line);
        if (!l)
            return NULL;
        for (size_t k = 0; k < n; k++) {
            val *r;
            if (attr) {
                r = attr_path(c, items[k], attr, line);
                if (r && r->type == V_UNDEF) {
                    val *dflt = A(99, "default");
                    if (dflt)
                        r = dflt;
                }
            } else if (npos >= 1 && args[0]->type == V_STR) {
                char fname[32];
                snprintf(fname, sizeof fname, "%.*s", (int)(args[0]->str.n < 31 ? args[0]->str.n : 31),
                         args[0]->str.s);
                if (!tp_chat_known_filter(fname) || !strcmp(fname, "map"))
                    return rfail(c, TP_EINVAL, line, "unsupported construct: map('%s')", fname);
                r = apply_filter(c, f, fname, items[k], args + 1, npos - 1, kw, kwv, nkw, line);
            } else {
                return rfail(c, TP_EINVAL, line, "unsupported construct: map() without a filter or attribute");
            }
            if (!r)
                return NULL;
            l->list.v[k] = r;
        }
        return l;
    }
    if (IS("select") || IS("reject") || IS("selectattr") || IS("rejectattr")) {
        int by_attr = IS("selectattr") || IS("rejectattr");
        int want = IS("select") || IS("selectattr");
        size_t t0 = by_attr ? 1 : 0;
        if (by_attr && npos < 1)
            return rfail(c, TP_EFORMAT, line, "%s needs an attribute name", name);
        if (nkw)
            return rfail(c, TP_EINVAL, line, "unsupported construct: keyword arguments to %s", name);
        char tname[32] = "";
        if (npos > t0) {
            if (args[t0]->type != V_STR)
                return rfail(c, TP_EFORMAT, line, "%s: test name must be a string", name);
            snprintf(tname, sizeof tname, "%.*s", (int)(args[t0]->str.n < 31 ? args[t0]->str.n : 31), args[t0]->str.s);
            if (!tp_chat_known_test(tname))
                return rfail(c, TP_EINVAL, line, "unsupported construct: test '%s'", tname);
        }
        val **items = NULL;
        size_t n = 0;
        val *l = generator(c, v, 1, &items, &n, line);
        if (!l)
            return NULL;
        size_t m = 0;
        for (size_t k = 0; k < n; k++) {
            val *x = by_attr ? attr_path(c, items[k], args[0], line) : items[k];
            if (!x)
                return NULL;
            int r = tname[0] ? apply_test(c, tname, x, args + t0 + 1, npos - t0 - 1, line) : cv_truthy(x);
            if (r < 0)
                return NULL;
            if (r == want)
                l->list.v[m++] = items[k];
        }
        l->list.n = m;
        return l;
    }
    if (IS("unique")) {
        val *cs = A(0, "case_sensitive"), *attr = A(1, "attribute");
        if (attr)
            return rfail(c, TP_EINVAL, line, "unsupported construct: unique(attribute=...)");
        val **items;
        size_t n;
        val *l = generator(c, v, 0, &items, &n, line);
        if (!l)
            return NULL;
        size_t m = 0;
        for (size_t k = 0; k < n; k++) {
            val *key = items[k];
            if (!(cs && cv_truthy(cs)) && key->type == V_STR && !(key = ascii_case(c, key, 0, line, "unique")))
                return NULL;
            int seen = 0;
            for (size_t j = 0; j < k && !seen; j++) {
                val *o = items[j];
                if (!(cs && cv_truthy(cs)) && o->type == V_STR && !(o = ascii_case(c, o, 0, line, "unique")))
                    return NULL;
                seen = cv_eq(o, key);
            }
            if (!seen)
                l->list.v[m++] = items[k];
        }
        l->list.n = m;
        return l;
    }
    if (IS("int") || IS("float") || IS("abs")) {
        if (IS("abs")) {
            if (!cv_is_num(v))
                return rfail(c, TP_EFORMAT, line, "bad operand type for abs(): '%s'", cv_type_name(v));
            if (v->type == V_FLOAT)
                return mk_float(c, v->f < 0 ? -v->f : v->f, line);
            int64_t i = cv_num_i(v);
            return i == INT64_MIN ? rfail(c, TP_ERANGE, line, "integer overflow") : mk_int(c, i < 0 ? -i : i, line);
        }
        if (IS("float"))
            return cv_is_num(v) ? mk_float(c, cv_num_d(v), line)
                             : rfail(c, TP_EINVAL, line, "unsupported construct: |float of a %s", cv_type_name(v));
        if (v->type == V_FLOAT)
            return mk_int(c, (int64_t)v->f, line);
        return cv_is_num(v) ? mk_int(c, cv_num_i(v), line)
                         : rfail(c, TP_EINVAL, line, "unsupported construct: |int of a %s", cv_type_name(v));
    }
    /* string filters: the value as text first (Jinja's soft_str) */
    if (IS("string")) {
        if (v->type == V_UNDEF)
            return mk_str(c, "", 0, line);
        return to_strv(c, v, line);
    }
    if (IS("e") || IS("escape"))
        return html_escape(c, v, line);
    val *s = v->type == V_UNDEF ? mk_str(c, "", 0, line) : to_strv(c, v, line);
    if (!s)
        return NULL;
    if (IS("trim")) {
        val *chars = A(0, "chars");
        return do_strip(c, s, chars, 3, line);
    }
    if (IS("upper"))
        return ascii_case(c, s, 1, line, "|upper");
    if (IS("lower"))
        return ascii_case(c, s, 0, line, "|lower");
    if (IS("capitalize"))
        return ascii_case(c, s, 3, line, "|capitalize");
    if (IS("replace")) {
        val *old = A(0, "old"), *new = A(1, "new"), *count = A(2, "count");
        if (!old || !new)
            return rfail(c, TP_EFORMAT, line, "replace needs old and new");
        if (s->str.safe)
            return rfail(c, TP_EINVAL, line, "unsupported construct: |replace on a safe string");
        val *o2 = to_strv(c, old, line), *n2 = o2 ? to_strv(c, new, line) : NULL;
        return n2 ? do_replace(c, s, o2, n2, count, line) : NULL;
    }
    if (IS("indent")) {
        val *width = A(0, "width"), *first = A(1, "first"), *blank = A(2, "blank");
        tp_buf ind = new_sb(c);
        if (!width || width->type == V_INT) {
            int64_t w = width ? width->i : 4;
            for (int64_t k = 0; k < w && k < 1024; k++)
                tp_buf_add(&ind, " ", 1);
        } else if (width->type == V_STR) {
            tp_buf_add(&ind, width->str.s, width->str.n);
        } else {
            return rfail(c, TP_EFORMAT, line, "indent width must be an int or a string");
        }
        if (s->str.safe) {
            tp_buf_free(&ind);
            return rfail(c, TP_EINVAL, line, "unsupported construct: |indent on a safe string");
        }
        /* Jinja: s += "\n"; lines = s.splitlines(); ... */
        tp_buf out = new_sb(c);
        const char *p = s->str.s;
        size_t n = s->str.n, i = 0;
        int lineno = 0;
        tp_buf all = new_sb(c);
        tp_buf_add(&all, p, n);
        tp_buf_add(&all, "\n", 1);
        p = all.data;
        n = all.len;
        while (i < n) {
            size_t j = i, brk = 0;
            while (j < n) {
                unsigned char ch = (unsigned char)p[j];
                if (ch == '\n' || ch == '\r' || ch == 0x0b || ch == 0x0c || (ch >= 0x1c && ch <= 0x1e)) {
                    brk = (ch == '\r' && j + 1 < n && p[j + 1] == '\n') ? 2 : 1;
                    break;
                }
                if (ch == 0xc2 && j + 1 < n && (unsigned char)p[j + 1] == 0x85) {
                    brk = 2;
                    break;
                }
                if (ch == 0xe2 && j + 2 < n && (unsigned char)p[j + 1] == 0x80 &&
                    ((unsigned char)p[j + 2] == 0xa8 || (unsigned char)p[j + 2] == 0xa9)) {
                    brk = 3;
                    break;
                }
                j++;
            }
            int empty = j == i;
            if (lineno > 0)
                tp_buf_add(&out, "\n", 1);
            if ((lineno > 0 || (first && cv_truthy(first))) && (!empty || (blank && cv_truthy(blank))))
                tp_buf_add(&out, tp_buf_str(&ind), ind.len);
            tp_buf_add(&out, p + i, j - i);
            lineno++;
            i = j + brk;
        }
        tp_buf_free(&all);
        tp_buf_free(&ind);
        return sb_val(c, &out, line);
    }
#undef A
#undef IS
    return rfail(c, TP_EINVAL, line, "unsupported construct: filter '%s'", name);
}

/* ---- statements ---------------------------------------------------------------- */

static int emit(rctx *c, const char *s, size_t n, int line)
{
    if (tp_buf_add(c->out, s, n)) {
        if (c->out->err == TP_ERANGE)
            rfail(c, TP_ERANGE, line, "rendered text longer than %zu bytes", c->max_output);
        else
            oom(c, line);
        return -1;
    }
    return 0;
}

/* A for loop's names for one item: `for x in` binds it, `for a, b in`
 * unpacks it (as Python: a list of exactly that many). */
static int bind_targets(rctx *c, frame *fr, const node *x, val *it)
{
    if (x->n_targets == 1)
        return frame_set(c, fr, x->targets[0], it, x->line);
    if (it->type != V_LIST || it->list.n != x->n_targets) {
        rfail(c, TP_EFORMAT, x->line, "cannot unpack a %s into %zu loop variables", cv_type_name(it), x->n_targets);
        return -1;
    }
    for (size_t t = 0; t < x->n_targets; t++)
        if (frame_set(c, fr, x->targets[t], it->list.v[t], x->line))
            return -1;
    return 0;
}

static int exec_for(rctx *c, frame *f, const node *x)
{
    val *seq = eval(c, f, x->a);
    if (!seq)
        return -1;
    val **items;
    size_t n;
    if (x->n_targets > 1 && seq->type == V_DICT) {
        /* for k, v in dict: unpacks keys; almost always a template bug, but Python's */
    }
    if (iter_items(c, seq, &items, &n, x->line))
        return -1;
    /* the loop's `if` filters before loop.length etc. are known */
    val **kept = items;
    size_t nk = n;
    if (x->b) {
        kept = n ? tp_chat_alloc(c->ar, n * sizeof *kept) : NULL;
        if (n && !kept) {
            oom(c, x->line);
            return -1;
        }
        nk = 0;
        for (size_t k = 0; k < n; k++) {
            if (step(c, x->line))
                return -1;
            frame fr = {.parent = f};
            if (bind_targets(c, &fr, x, items[k]))
                return -1;
            val *ok = eval(c, &fr, x->b);
            if (!ok)
                return -1;
            if (cv_truthy(ok))
                kept[nk++] = items[k];
        }
    }
    if (nk == 0)
        return exec_body(c, f, x->body2, x->n_body2);
    val *loop = mk(c, V_LOOP, x->line);
    if (!loop)
        return -1;
    for (size_t k = 0; k < nk; k++) {
        if (step(c, x->line))
            return -1;
        frame fr = {.parent = f};
        val *lp = mk(c, V_LOOP, x->line);
        if (!lp)
            return -1;
        lp->loop.items = kept;
        lp->loop.index0 = k;
        lp->loop.length = nk;
        if (frame_set(c, &fr, "loop", lp, x->line) || bind_targets(c, &fr, x, kept[k]))
            return -1;
        if (exec_body(c, &fr, x->body, x->n_body))
            return -1;
        if (c->ctl == 1) {
            c->ctl = 0;
            break;
        }
        c->ctl = 0;
    }
    return 0;
}

static int exec_stmt(rctx *c, frame *f, const node *x)
{
    if (step(c, x->line))
        return -1;
    switch (x->kind) {
    case N_TEXT:
        return emit(c, x->name, x->name_len, x->line);
    case N_OUT: {
        val *v = eval(c, f, x->a);
        if (!v)
            return -1;
        if (v->type == V_STR)
            return emit(c, v->str.s, v->str.n, x->line);
        size_t before = c->out->len;
        if (cv_str(c->out, v)) {
            c->out->len = before;   /* what a half-printed value wrote is dropped */
            if (c->out->data)
                c->out->data[before] = '\0';
            rfail(c, TP_EINVAL, x->line, "unsupported construct: printing a %s", cv_type_name(v));
            return -1;
        }
        if (c->out->err) {
            emit(c, "", 0, x->line);
            rfail(c, TP_ERANGE, x->line, "rendered text longer than %zu bytes", c->max_output);
            return -1;
        }
        return 0;
    }
    case N_IF: {
        val *t = eval(c, f, x->a);
        if (!t)
            return -1;
        if (cv_truthy(t))
            return exec_body(c, f, x->body, x->n_body);
        return exec_body(c, f, x->body2, x->n_body2);
    }
    case N_FOR:
        return exec_for(c, f, x);
    case N_SET: {
        val *v = eval(c, f, x->a);
        if (!v)
            return -1;
        if (!x->attr)
            return frame_set(c, f, x->name, v, x->line);
        val *ns = lookup(c, f, x->name, x->line);
        if (!ns)
            return -1;
        if (ns->type != V_NS) {
            rfail(c, TP_EFORMAT, x->line, "cannot assign attribute on non-namespace object");
            return -1;
        }
        val *key = mk_str(c, x->attr, strlen(x->attr), x->line);
        return key ? dict_set(c, ns, key, v, x->line) : -1;
    }
    case N_SETBLOCK: {
        val *v = render_to_string(c, f, x->body, x->n_body, x->line);
        return v ? frame_set(c, f, x->name, v, x->line) : -1;
    }
    case N_MACRO: {
        val *m = mk(c, V_MACRO, x->line);
        if (!m)
            return -1;
        m->macro.def = x;
        return frame_set(c, f, x->name, m, x->line);
    }
    case N_FILTERBLOCK: {
        val *v = render_to_string(c, f, x->body, x->n_body, x->line);
        for (size_t k = 0; v && k < x->n_args; k++) {
            const node *fl = x->args[k];
            val **pos, **kwv;
            size_t npos;
            if (eval_args(c, f, fl, &pos, &npos, &kwv))
                return -1;
            v = apply_filter(c, f, fl->name, v, pos, npos, fl->kw_names, kwv, fl->n_kw, fl->line);
        }
        if (!v)
            return -1;
        val *s = to_strv(c, v, x->line);
        return s ? emit(c, s->str.s, s->str.n, x->line) : -1;
    }
    case N_BREAK:
        c->ctl = 1;
        return 0;
    case N_CONTINUE:
        c->ctl = 2;
        return 0;
    default:
        rfail(c, TP_EINVAL, x->line, "unsupported construct: statement kind %d", x->kind);
        return -1;
    }
}

static int exec_body(rctx *c, frame *f, node *const *b, size_t n)
{
    if (++c->depth > TP_CHAT_MAX_DEPTH * 2) {
        rfail(c, TP_ERANGE, n ? b[0]->line : 0, "blocks nested too deep");
        return -1;
    }
    for (size_t k = 0; k < n; k++) {
        if (exec_stmt(c, f, b[k])) {
            c->depth--;
            return -1;
        }
        if (c->ctl)
            break;
    }
    c->depth--;
    return 0;
}

/* ---- JSON input ------------------------------------------------------------ */

static val *from_json(rctx *c, const cJSON *j, int depth)
{
    if (depth > TP_CHAT_MAX_DEPTH)
        return rfail(c, TP_ERANGE, 0, "conversation JSON nested deeper than %d", TP_CHAT_MAX_DEPTH);
    if (cJSON_IsNull(j))
        return c->none;
    if (cJSON_IsBool(j))
        return mk_bool(c, cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        /* JSON does not say int or float: an integral value within 2^53 is
         * an int (what json.loads gives for "1"; "1.0" also lands here). */
        if (d == (double)(int64_t)d && d > -9007199254740992.0 && d < 9007199254740992.0)
            return mk_int(c, (int64_t)d, 0);
        return mk_float(c, d, 0);
    }
    if (cJSON_IsString(j))
        return mk_str(c, j->valuestring, strlen(j->valuestring), 0);
    if (cJSON_IsArray(j)) {
        size_t n = (size_t)cJSON_GetArraySize(j);
        val *l = mk_list(c, n, 0);
        size_t k = 0;
        for (const cJSON *e = j->child; l && e; e = e->next)
            if (!(l->list.v[k++] = from_json(c, e, depth + 1)))
                return NULL;
        return l;
    }
    if (cJSON_IsObject(j)) {
        val *d = mk(c, V_DICT, 0);
        for (const cJSON *e = j->child; d && e; e = e->next) {
            val *k = mk_str(c, e->string, strlen(e->string), 0), *v = k ? from_json(c, e, depth + 1) : NULL;
            if (!v || dict_set(c, d, k, v, 0))
                return NULL;
        }
        return d;
    }
    return rfail(c, TP_EINVAL, 0, "unsupported JSON value in the conversation");
}

/* JSON text straight into values, so nothing passes through a C string
 * (cJSON ends strings at U+0000) or a double (cJSON rounds integers past
 * 2^53): jinja2 sees what json.loads gives. */
typedef struct jtext {
    rctx *c;
    const char *s;
    size_t n, i;
} jtext;

static val *jfail(jtext *j, const char *what)
{
    return rfail(j->c, TP_EFORMAT, 0, "variables JSON: %s at byte %zu", what, j->i);
}

static void jws(jtext *j)
{
    while (j->i < j->n && (j->s[j->i] == ' ' || j->s[j->i] == '\t' || j->s[j->i] == '\n' || j->s[j->i] == '\r'))
        j->i++;
}

/* After an array element / object member: 1 another follows (',' read),
 * 0 the container ends (close read), -1 neither. */
static int jnext(jtext *j, char close)
{
    jws(j);
    if (j->i < j->n && (j->s[j->i] == ',' || j->s[j->i] == close))
        return j->s[j->i++] == ',';
    rfail(j->c, TP_EFORMAT, 0, "variables JSON: expected , or %c at byte %zu", close, j->i);
    return -1;
}

static int jhex4(jtext *j, uint32_t *cp)
{
    if (j->i + 4 > j->n)
        return -1;
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        char ch = j->s[j->i + (size_t)k];
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
              : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        v = v * 16 + (uint32_t)d;
    }
    j->i += 4;
    *cp = v;
    return 0;
}

/* A string at j->i (the opening quote): its bytes in the arena. */
static const char *jstring(jtext *j, size_t *len)
{
    size_t start = ++j->i, cap = 0;
    for (size_t k = start; k < j->n && j->s[k] != '"'; k++)
        cap += j->s[k] == '\\' ? (k++, 4) : 1;   /* an escape writes at most 4 bytes */
    char *o = tp_chat_alloc(j->c->ar, cap + 1);
    if (!o)
        return oom(j->c, 0), NULL;
    size_t w = 0;
    while (j->i < j->n && j->s[j->i] != '"') {
        unsigned char ch = (unsigned char)j->s[j->i];
        if (ch < 0x20)
            return jfail(j, "control character in a string"), NULL;
        if (ch != '\\') {
            o[w++] = (char)ch;
            j->i++;
            continue;
        }
        if (++j->i >= j->n)
            break;
        char e = j->s[j->i++];
        const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t", *at = strchr(from, e);
        if (e && at) {
            o[w++] = to[at - from];
            continue;
        }
        uint32_t cp, lo;
        if (e != 'u' || jhex4(j, &cp))
            return jfail(j, "bad escape in a string"), NULL;
        if (cp >= 0xD800 && cp < 0xDC00 && j->i + 6 <= j->n && j->s[j->i] == '\\' && j->s[j->i + 1] == 'u') {
            size_t save = j->i;
            j->i += 2;
            if (!jhex4(j, &lo) && lo >= 0xDC00 && lo < 0xE000)
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            else
                j->i = save;
        }
        if (cp >= 0xD800 && cp < 0xE000)
            return jfail(j, "a lone UTF-16 surrogate has no UTF-8 form"), NULL;
        if (cp < 0x80) {
            o[w++] = (char)cp;
        } else if (cp < 0x800) {
            o[w++] = (char)(0xC0 | (cp >> 6));
            o[w++] = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            o[w++] = (char)(0xE0 | (cp >> 12));
            o[w++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            o[w++] = (char)(0x80 | (cp & 0x3F));
        } else {
            o[w++] = (char)(0xF0 | (cp >> 18));
            o[w++] = (char)(0x80 | ((cp >> 12) & 0x3F));
            o[w++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            o[w++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    if (j->i >= j->n)
        return jfail(j, "unterminated string"), NULL;
    j->i++;
    o[w] = 0;
    *len = w;
    return o;
}

static val *jnumber(jtext *j)
{
    size_t s0 = j->i;
    bool is_float = false;
    if (j->i < j->n && j->s[j->i] == '-')
        j->i++;
    size_t d0 = j->i;
    while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9')
        j->i++;
    if (j->i == d0 || (j->s[d0] == '0' && j->i - d0 > 1))
        return jfail(j, "bad number");
    if (j->i < j->n && j->s[j->i] == '.') {
        is_float = true;
        size_t f0 = ++j->i;
        while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9')
            j->i++;
        if (j->i == f0)
            return jfail(j, "bad number");
    }
    if (j->i < j->n && (j->s[j->i] == 'e' || j->s[j->i] == 'E')) {
        is_float = true;
        j->i++;
        if (j->i < j->n && (j->s[j->i] == '+' || j->s[j->i] == '-'))
            j->i++;
        size_t e0 = j->i;
        while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9')
            j->i++;
        if (j->i == e0)
            return jfail(j, "bad number");
    }
    char buf[512];
    size_t len = j->i - s0;
    if (len >= sizeof buf)
        return jfail(j, "number longer than 511 characters");
    memcpy(buf, j->s + s0, len);
    buf[len] = 0;
    errno = 0;
    if (!is_float) {
        long long v = strtoll(buf, NULL, 10);
        if (errno == ERANGE)
            return rfail(j->c, TP_ERANGE, 0, "variables JSON: integer %s does not fit 64 bits", buf);
        return mk_int(j->c, (int64_t)v, 0);
    }
    return mk_float(j->c, strtod(buf, NULL), 0);
}

static val *jvalue(jtext *j, int depth)
{
    if (depth > TP_CHAT_MAX_DEPTH)
        return rfail(j->c, TP_ERANGE, 0, "variables JSON nested deeper than %d", TP_CHAT_MAX_DEPTH);
    jws(j);
    if (j->i >= j->n)
        return jfail(j, "unexpected end");
    const char *p = j->s + j->i;
    size_t left = j->n - j->i;
    if (*p == '"') {
        size_t len;
        const char *s = jstring(j, &len);
        return s ? mk_str(j->c, s, len, 0) : NULL;
    }
    if (left >= 4 && !memcmp(p, "null", 4))
        return j->i += 4, j->c->none;
    if (left >= 4 && !memcmp(p, "true", 4))
        return j->i += 4, mk_bool(j->c, 1);
    if (left >= 5 && !memcmp(p, "false", 5))
        return j->i += 5, mk_bool(j->c, 0);
    if (*p == '[') {
        j->i++;
        size_t cap = 8, n = 0;
        val **items = tp_chat_alloc(j->c->ar, cap * sizeof *items);
        jws(j);
        if (j->i < j->n && j->s[j->i] == ']')
            j->i++;
        else
            for (;;) {
                val *x = items ? jvalue(j, depth + 1) : NULL;
                if (!x)
                    return items ? NULL : oom(j->c, 0);
                if (n == cap) {
                    val **bigger = tp_chat_alloc(j->c->ar, 2 * cap * sizeof *items);
                    if (!bigger)
                        return oom(j->c, 0);
                    memcpy(bigger, items, n * sizeof *items);
                    items = bigger;
                    cap *= 2;
                }
                items[n++] = x;
                int more = jnext(j, ']');
                if (more < 0)
                    return NULL;
                if (!more)
                    break;
            }
        val *l = mk_list(j->c, n, 0);
        if (l && n)
            memcpy(l->list.v, items, n * sizeof *items);
        return l;
    }
    if (*p == '{') {
        j->i++;
        val *d = mk(j->c, V_DICT, 0);
        jws(j);
        if (j->i < j->n && j->s[j->i] == '}') {
            j->i++;
            return d;
        }
        while (d) {
            jws(j);
            if (j->i >= j->n || j->s[j->i] != '"')
                return jfail(j, "expected a string key");
            size_t klen;
            const char *ks = jstring(j, &klen);
            val *k = ks ? mk_str(j->c, ks, klen, 0) : NULL;
            jws(j);
            if (!k)
                return NULL;
            if (j->i >= j->n || j->s[j->i] != ':')
                return jfail(j, "expected : after a key");
            j->i++;
            val *x = jvalue(j, depth + 1);
            if (!x || dict_set(j->c, d, k, x, 0))
                return NULL;
            int more = jnext(j, '}');
            if (more < 0)
                return NULL;
            if (!more)
                break;
        }
        return d;
    }
    return jnumber(j);
}

/* The variables object's members into the globals. */
static int json_vars(rctx *c, frame *globals, const char *s, size_t n)
{
    jtext j = {c, s, n, 0};
    val *d = jvalue(&j, 0);
    if (!d)
        return -1;
    jws(&j);
    if (j.i != n)
        return jfail(&j, "trailing bytes"), -1;
    if (d->type != V_DICT)
        return rfail(c, TP_EINVAL, 0, "chat template: the variables JSON must be an object"), -1;
    for (size_t i = 0; i < d->dict.n; i++) {
        char *nm = arena_name(c, d->dict.k[i], 0);
        if (!nm || frame_set(c, globals, nm, d->dict.v[i], 0))
            return -1;
    }
    return 0;
}

/* ---- API ---------------------------------------------------------------------- */

const char *tp_chat_template_source(const tp_chat_template *t, size_t *len)
{
    *len = strlen(t->src);
    return t->src;
}

int tp_chat_template_new(const char *text, size_t len, tp_chat_template **out, tp_err *err)
{
    if (!text || len > TP_CHAT_MAX_TEMPLATE)
        return tp_err_set(err, TP_ERANGE, "chat template: longer than %u bytes", TP_CHAT_MAX_TEMPLATE);
    if (memchr(text, 0, len))
        return tp_err_set(err, TP_EFORMAT, "chat template: contains a NUL byte");
    tp_chat_template *t = calloc(1, sizeof *t);
    char *src = malloc(len + 1);
    if (!t || !src) {
        free(t);
        free(src);
        return tp_err_set(err, TP_ENOMEM, "chat template: out of memory");
    }
    /* Jinja normalises \r\n and \r to \n and drops one trailing newline */
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == '\r') {
            src[n++] = '\n';
            if (i + 1 < len && text[i + 1] == '\n')
                i++;
        } else {
            src[n++] = text[i];
        }
    }
    if (n && src[n - 1] == '\n')
        n--;
    src[n] = 0;
    t->src = src;
    tp_chat_lexer lx = {.src = src, .len = n, .err = err};
    int rc = tp_chat_lex(&lx);
    if (!rc)
        rc = tp_chat_parse(lx.toks, lx.n, &t->arena, &t->body, &t->n_body, err);
    /* string literals were copied into the arena by the parser */
    tp_chat_lexer_free(&lx);
    if (rc) {
        tp_chat_template_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void tp_chat_template_free(tp_chat_template *t)
{
    if (!t)
        return;
    tp_chat_arena_free(&t->arena);
    free(t->src);
    free(t);
}

int tp_chat_template_render(const tp_chat_template *t, const tp_chat_vars *v, char **out, size_t *out_len,
                            tp_err *err)
{
    if (!t || !v || !out)
        return tp_err_set(err, TP_EINVAL, "chat template: render without template or variables");
    if (!v->json && (!v->messages || !cJSON_IsArray(v->messages)))
        return tp_err_set(err, TP_EINVAL, "chat template: messages must be a JSON array");
    if (v->extra && !cJSON_IsObject(v->extra))
        return tp_err_set(err, TP_EINVAL, "chat template: extra variables must be a JSON object");
    tp_chat_arena ar = {.cap = TP_CHAT_MAX_MEMORY};
    tp_buf outb;
    tp_buf_init(&outb, v->max_output ? v->max_output : TP_CHAT_DEFAULT_OUTPUT);
    frame globals = {0};
    rctx c = {.ar = &ar, .err = err, .out = &outb, .max_output = outb.max, .globals = &globals};
    tp_err_clear(err);
    int rc = -1;
    if (!(c.none = mk(&c, V_NONE, 0)) || !(c.t = mk(&c, V_BOOL, 0)) || !(c.f = mk(&c, V_BOOL, 0)))
        goto done;
    c.t->b = 1;
    if (!v->json) {
        val *msgs = from_json(&c, v->messages, 0);
        if (!msgs || frame_set(&c, &globals, "messages", msgs, 0))
            goto done;
    }
    if (frame_set(&c, &globals, "add_generation_prompt", mk_bool(&c, v->add_generation_prompt), 0))
        goto done;
    if (v->bos_token) {
        val *s = mk_str(&c, v->bos_token, strlen(v->bos_token), 0);
        if (!s || frame_set(&c, &globals, "bos_token", s, 0))
            goto done;
    }
    if (v->eos_token) {
        val *s = mk_str(&c, v->eos_token, strlen(v->eos_token), 0);
        if (!s || frame_set(&c, &globals, "eos_token", s, 0))
            goto done;
    }
    if (v->json && json_vars(&c, &globals, v->json, v->json_len))
        goto done;
    if (v->extra && !v->json)
        for (const cJSON *e = v->extra->child; e; e = e->next) {
            val *x = from_json(&c, e, 0);
            char *nm = tp_chat_alloc(&ar, strlen(e->string) + 1);
            if (!x || !nm) {
                if (!nm)
                    oom(&c, 0);
                goto done;
            }
            strcpy(nm, e->string);
            if (frame_set(&c, &globals, nm, x, 0))
                goto done;
        }
    rc = exec_body(&c, &globals, t->body, t->n_body);
done:
    tp_chat_arena_free(&ar);
    if (rc || c.failed) {
        tp_buf_free(&outb);
        if (!c.failed)
            tp_err_set(err, TP_ENOMEM, "chat template: out of memory");
        return err ? err->code : TP_EFORMAT;
    }
    if (!outb.data && tp_buf_add(&outb, "", 0)) {
        tp_buf_free(&outb);
        return tp_err_set(err, TP_ENOMEM, "chat template: out of memory");
    }
    *out = outb.data;
    if (out_len)
        *out_len = outb.len;
    return 0;
}

int tp_chat_template_turn_end(const tp_chat_template *t, const char *bos_token, const char *eos_token, char **out,
                              tp_err *err)
{
    static const char PROBE[] = "tokpipe-probe-turn-7f3a";
    cJSON *msgs = cJSON_Parse("[{\"role\":\"user\",\"content\":\"hello\"},"
                              "{\"role\":\"assistant\",\"content\":\"tokpipe-probe-turn-7f3a\"}]");
    if (!msgs)
        return tp_err_set(err, TP_ENOMEM, "chat template: out of memory");
    tp_chat_vars v = {.messages = msgs, .bos_token = bos_token, .eos_token = eos_token};
    char *text = NULL;
    size_t len = 0;
    int rc = tp_chat_template_render(t, &v, &text, &len, err);
    cJSON_Delete(msgs);
    if (rc)
        return rc;
    const char *hit = NULL;
    for (const char *p = text; (p = memmem(p, len - (size_t)(p - text), PROBE, sizeof PROBE - 1)); p++)
        hit = p;
    if (!hit) {
        free(text);
        return tp_err_set(err, TP_ENOTFOUND, "chat template: an assistant turn's content does not appear in "
                                             "the rendered text");
    }
    size_t start = (size_t)(hit - text) + sizeof PROBE - 1;
    memmove(text, text + start, len - start + 1);
    *out = text;
    return 0;
}
