/* A small JSON scanner for model output: spans, members and strings. The
 * arguments of a call are kept as the exact text the model wrote (so
 * integers beyond 2^53 and any escapes survive), after checking it is
 * valid JSON. */
#include "tokpipe/utf8.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tc_internal.h"


bool tc_starts(const char *s, size_t n, const char *lit)
{
    size_t k = strlen(lit);
    return n >= k && !memcmp(s, lit, k);
}

const char *tc_find(const char *s, size_t n, const char *lit)
{
    size_t k = strlen(lit);
    if (!k || n < k)
        return NULL;
    for (size_t i = 0; i + k <= n; i++)
        if (s[i] == lit[0] && !memcmp(s + i, lit, k))
            return s + i;
    return NULL;
}

size_t tc_ws(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
        i++;
    return i;
}

static size_t str_span(const char *s, size_t n)
{
    size_t i = 1;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"')
            return i + 1;
        if (c < 0x20)
            return 0;
        if (c == '\\') {
            if (i + 1 >= n)
                return 0;
            char e = s[i + 1];
            if (e == 'u') {
                if (i + 6 > n)
                    return 0;
                for (int k = 2; k < 6; k++)
                    if (!strchr("0123456789abcdefABCDEF", s[i + k]) || !s[i + k])
                        return 0;
                i += 6;
                continue;
            }
            if (!strchr("\"\\/bfnrt", e) || !e)
                return 0;
            i += 2;
            continue;
        }
        i++;
    }
    return 0;
}

static size_t num_span(const char *s, size_t n)
{
    size_t i = 0;
    if (i < n && s[i] == '-')
        i++;
    if (i < n && s[i] == '0')
        i++;
    else if (i < n && s[i] >= '1' && s[i] <= '9')
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
    else
        return 0;
    if (i < n && s[i] == '.') {
        size_t d = ++i;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
        if (i == d)
            return 0;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        size_t d = i;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
        if (i == d)
            return 0;
    }
    return i;
}

static size_t value_span(const char *s, size_t n, int depth)
{
    if (!n || depth > TC_MAX_JSON_DEPTH)
        return 0;
    switch (s[0]) {
    case '"': return str_span(s, n);
    case 't': return tc_starts(s, n, "true") ? 4 : 0;
    case 'f': return tc_starts(s, n, "false") ? 5 : 0;
    case 'n': return tc_starts(s, n, "null") ? 4 : 0;
    case '[':
    case '{': {
        bool obj = s[0] == '{';
        char close = obj ? '}' : ']';
        size_t i = 1 + tc_ws(s + 1, n - 1);
        if (i < n && s[i] == close)
            return i + 1;
        for (;;) {
            if (obj) {
                size_t k = i < n && s[i] == '"' ? str_span(s + i, n - i) : 0;
                if (!k)
                    return 0;
                i += k;
                i += tc_ws(s + i, n - i);
                if (i >= n || s[i] != ':')
                    return 0;
                i++;
                i += tc_ws(s + i, n - i);
            }
            size_t v = value_span(s + i, n - i, depth + 1);
            if (!v)
                return 0;
            i += v;
            i += tc_ws(s + i, n - i);
            if (i >= n)
                return 0;
            if (s[i] == close)
                return i + 1;
            if (s[i] != ',')
                return 0;
            i++;
            i += tc_ws(s + i, n - i);
        }
    }
    default: return num_span(s, n);
    }
}

size_t tc_json_span(const char *s, size_t n)
{
    return value_span(s, n, 0);
}

bool tc_json_member(const char *s, size_t n, const char *key, const char **v, size_t *vn)
{
    if (!n || s[0] != '{')
        return false;
    size_t klen = strlen(key);
    size_t i = 1 + tc_ws(s + 1, n - 1);
    while (i < n && s[i] == '"') {
        size_t k = str_span(s + i, n - i);
        if (!k)
            return false;
        /* keys are compared as written: a key spelled with escapes is not
         * one a model writes for "name" or "arguments" */
        bool hit = k == klen + 2 && !memcmp(s + i + 1, key, klen);
        i += k;
        i += tc_ws(s + i, n - i);
        i++;   /* ':' (the span was checked) */
        i += tc_ws(s + i, n - i);
        size_t vs = value_span(s + i, n - i, 1);
        if (!vs)
            return false;
        if (hit) {
            *v = s + i;
            *vn = vs;
            return true;
        }
        i += vs;
        i += tc_ws(s + i, n - i);
        if (i < n && s[i] == ',')
            i++;
        i += tc_ws(s + i, n - i);
    }
    return false;
}

static int hexv(char c)
{
    return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10;
}

char *tc_json_string(const char *s, size_t n, size_t *len)
{
    char *out = malloc(n + 1);
    if (!out)
        return NULL;
    size_t o = 0;
    for (size_t i = 1; i + 1 < n; i++) {
        if (s[i] != '\\') {
            out[o++] = s[i];
            continue;
        }
        char e = s[++i];
        if (e == 'u') {
            uint32_t cp = 0;
            for (int k = 1; k <= 4; k++)
                cp = cp * 16 + (uint32_t)hexv(s[i + k]);
            i += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && i + 6 < n && s[i + 1] == '\\' && s[i + 2] == 'u') {
                uint32_t lo = 0;
                for (int k = 3; k <= 6; k++)
                    lo = lo * 16 + (uint32_t)hexv(s[i + k]);
                if (lo >= 0xDC00 && lo < 0xE000) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    i += 6;
                }
            }
            if (cp >= 0xD800 && cp < 0xE000)
                cp = 0xFFFD;   /* a lone surrogate has no UTF-8 form */
            o += tp_utf8_put(cp, out + o);
            continue;
        }
        const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
        out[o++] = to[strchr(from, e) - from];
    }
    out[o] = 0;
    *len = o;
    return out;
}

/* A function name as models write them: no space, control byte, quote or
 * backslash (what would break the name out of its JSON string). */
bool tc_valid_name(const char *s, size_t n)
{
    if (!n || n > 256)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x21 || s[i] == '"' || s[i] == '\\')
            return false;
    return true;
}

void tc_call_release(tp_tc_call *c)
{
    free(c->id);
    free(c->name);
    free(c->arguments);
    memset(c, 0, sizeof *c);
}

int tc_add_call(tc_out *o, const char *name, size_t name_len, const char *args, size_t args_len)
{
    if (!tc_valid_name(name, name_len))
        return -1;
    if (o->n_calls == o->cap_calls) {
        size_t cap = o->cap_calls ? o->cap_calls * 2 : 4;
        tp_tc_call *c = realloc(o->calls, cap * sizeof *c);
        if (!c)
            return o->oom = true, -1;
        o->calls = c;
        o->cap_calls = cap;
    }
    if (!args) {
        args = "{}";
        args_len = 2;
    }
    tp_tc_call *c = &o->calls[o->n_calls];
    c->id = NULL;
    c->name = strndup(name, name_len);
    c->arguments = malloc(args_len + 1);
    if (!c->name || !c->arguments) {
        free(c->name);
        free(c->arguments);
        return o->oom = true, -1;
    }
    memcpy(c->arguments, args, args_len);
    c->arguments[args_len] = 0;
    c->arguments_len = args_len;
    o->n_calls++;
    return 0;
}

bool tc_call_object(tc_out *o, const char *s, size_t n, const char *const *name_keys, const char *const *args_keys)
{
    const char *nv = NULL, *av = NULL;
    size_t nn = 0, an = 0;
    for (; *name_keys && !nv; name_keys++)
        tc_json_member(s, n, *name_keys, &nv, &nn);
    for (; *args_keys && !av; args_keys++)
        tc_json_member(s, n, *args_keys, &av, &an);
    if (!nv || nv[0] != '"' || (av && av[0] != '{'))
        return false;
    size_t len = 0;
    char *name = tc_json_string(nv, nn, &len);
    if (!name)
        return o->oom = true, false;
    bool ok = !tc_add_call(o, name, len, av, an);
    free(name);
    return ok;
}

size_t tc_call_array(tc_out *o, const char *s, size_t n, const char *const *name_keys, const char *const *args_keys)
{
    size_t span = tc_json_span(s, n);
    if (!span || s[0] != '[')
        return 0;
    size_t i = 1 + tc_ws(s + 1, span - 1), before = o->n_calls;
    while (i < span - 1) {
        size_t v = tc_json_span(s + i, span - i);
        if (!v || !tc_call_object(o, s + i, v, name_keys, args_keys))
            return 0;
        i += v;
        i += tc_ws(s + i, span - i);
        if (s[i] == ',')
            i++;
        i += tc_ws(s + i, span - i);
    }
    return o->n_calls > before ? span : 0;
}

bool tp_json_member_span(const char *obj, size_t n, const char *key, const char **v, size_t *vn)
{
    size_t w = tc_ws(obj, n);
    size_t span = tc_json_span(obj + w, n - w);
    return span && obj[w] == '{' && tc_json_member(obj + w, span, key, v, vn);
}

int tc_marker_array(const char *s, size_t n, size_t skip, const char *close, tc_out *o,
                    const char *const *name_keys, const char *const *args_keys)
{
    size_t i = skip + tc_ws(s + skip, n - skip);
    size_t v = tc_call_array(o, s + i, n - i, name_keys, args_keys);
    if (!v)
        return -1;
    i += v;
    i += tc_ws(s + i, n - i);
    if (close && tc_starts(s + i, n - i, close))
        i += strlen(close);
    else if (close && i < n)
        return -1;
    tp_buf_add(&o->content, s + i, n - i);
    return 0;
}
