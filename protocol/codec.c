/* The generic codec: walks a message's schema table to decode a msgpack
 * header into a tp_msg (strict types, ranges, counts) and to encode one. */
#include "schema.h"

#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- decoder-owned allocations ---- */

struct alloc {
    struct alloc *next;
    max_align_t data[];
};

static void *msg_alloc(tp_msg *m, size_t size)
{
    struct alloc *a = malloc(sizeof *a + (size ? size : 1));
    if (!a)
        return NULL;
    a->next = m->owned_;
    m->owned_ = a;
    return a->data;
}

void tp_msg_init(tp_msg *m, tp_family family, uint8_t cmd)
{
    memset(m, 0, sizeof *m);
    m->family = family;
    m->cmd = cmd;
}

void tp_msg_init_reply(tp_msg *r, const tp_msg *req, uint8_t cmd, uint32_t status, const char *error)
{
    tp_msg_init(r, req->family, cmd);
    r->task = req->task;
    r->status = status;
    r->error = tp_str_of(error);
}

void tp_msg_clear(tp_msg *m)
{
    if (!m)
        return;
    for (struct alloc *a = m->owned_, *next; a; a = next) {
        next = a->next;
        free(a);
    }
    memset(m, 0, sizeof *m);
}

/* ---- decode ---- */

typedef struct dctx {
    tp_msg *m;
    tp_err *err;
    bool lenient;
} dctx;

/* Where a value sits ("params.stop[2]"), as a chain of links on the stack:
 * rendered to text only when an error is reported, never on the good path. */
typedef struct pathref {
    const struct pathref *up;
    const char *key;   /* NULL for an array element */
    size_t klen;
    size_t idx;
} pathref;

/* Append the path to out (printable ASCII only, cut to fit). */
static void render(const pathref *p, char *out, size_t cap, size_t *len)
{
    if (!p)
        return;
    render(p->up, out, cap, len);
    char piece[64];
    size_t n = 0;
    if (!p->key) {
        n = (size_t)snprintf(piece, sizeof piece, "[%zu]", p->idx);
    } else {
        if (*len)
            piece[n++] = '.';
        for (size_t i = 0; i < p->klen && i < 40; i++)
            piece[n++] = (p->key[i] >= 0x20 && p->key[i] < 0x7f) ? p->key[i] : '?';
    }
    for (size_t i = 0; i < n && *len + 1 < cap; i++)
        out[(*len)++] = piece[i];
    out[*len] = '\0';
}

/* Fail with "path: message", remembering path as the offending field. */
static int ferr(dctx *c, const pathref *path, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int ferr(dctx *c, const pathref *path, int code, const char *fmt, ...)
{
    char msg[TP_ERR_MSG_MAX], where[160] = "";
    size_t len = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    render(path, where, sizeof where, &len);
    if (!len)
        len = (size_t)snprintf(where, sizeof where, "header");
    size_t keep = len < sizeof c->m->bad_field ? len : sizeof c->m->bad_field - 1;
    memcpy(c->m->bad_field, where, keep);
    c->m->bad_field[keep] = '\0';
    return tp_err_set(c->err, code, "%s: %s", where, msg);
}

/* ferr for a place that is not a header key (a frame, "header"). */
static int ferr_at(dctx *c, const char *name, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int ferr_at(dctx *c, const char *name, int code, const char *fmt, ...)
{
    char msg[TP_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(c->m->bad_field, sizeof c->m->bad_field, "%s", name);
    return tp_err_set(c->err, code, "%s: %s", name, msg);
}

static const char *type_name(msgpack_object_type t)
{
    switch (t) {
    case MSGPACK_OBJECT_NIL: return "nil";
    case MSGPACK_OBJECT_BOOLEAN: return "bool";
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "integer";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return "float";
    case MSGPACK_OBJECT_STR: return "str";
    case MSGPACK_OBJECT_ARRAY: return "array";
    case MSGPACK_OBJECT_MAP: return "map";
    case MSGPACK_OBJECT_BIN: return "bin";
    case MSGPACK_OBJECT_EXT: return "ext";
    default: return "?";
    }
}

static int want_type(dctx *c, const pathref *path, const msgpack_object *o, msgpack_object_type t, const char *what)
{
    if (o->type != t)
        return ferr(c, path, TP_EFORMAT, "expected %s, got %s", what, type_name(o->type));
    return 0;
}

/* An integer within [lo, hi] (as int64), or any u64 when is_u64. */
static int get_int(dctx *c, const pathref *path, const msgpack_object *o, int64_t lo, int64_t hi, bool is_u64,
                   uint64_t *u_out, int64_t *i_out)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        uint64_t u = o->via.u64;
        if (is_u64) {
            *u_out = u;
            return 0;
        }
        if (u > (uint64_t)hi || (lo > 0 && u < (uint64_t)lo))
            return ferr(c, path, TP_EINVAL, "%llu is outside [%lld, %lld]", (unsigned long long)u, (long long)lo,
                        (long long)hi);
        *i_out = (int64_t)u;
        return 0;
    }
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        int64_t v = o->via.i64;
        if (is_u64)   /* a u64 takes all of [0, 2^64) (PROTOCOL.md's seed range) */
            return ferr(c, path, TP_EINVAL, "%lld is outside [0, %llu]", (long long)v, (unsigned long long)UINT64_MAX);
        if (v < lo || v > hi)
            return ferr(c, path, TP_EINVAL, "%lld is outside [%lld, %lld]", (long long)v, (long long)lo, (long long)hi);
        *i_out = v;
        return 0;
    }
    return ferr(c, path, TP_EFORMAT, "expected an integer, got %s", type_name(o->type));
}

static int get_str(dctx *c, const pathref *path, const msgpack_object *o, size_t max, unsigned flags, tp_str *out)
{
    int rc = want_type(c, path, o, MSGPACK_OBJECT_STR, "str");
    if (rc)
        return rc;
    const char *p = o->via.str.size ? o->via.str.ptr : "";
    size_t n = o->via.str.size;
    if (n > max)
        return ferr(c, path, TP_ERANGE, "%zu bytes, at most %zu", n, max);
    if ((flags & FF_NONEMPTY) && n == 0)
        return ferr(c, path, TP_EINVAL, "empty string");
    if ((flags & FF_JOBID) && n > 0 && !tp_job_id_valid(p, n))
        return ferr(c, path, TP_EINVAL, "not a job id (1-%d bytes of A-Z a-z 0-9 . _ : -)", TP_PROTO_MAX_JOB_ID);
    if (!tp_proto_utf8_valid(p, n))
        return ferr(c, path, TP_EINVAL, "invalid UTF-8");
    out->ptr = p;
    out->len = n;
    return 0;
}

static int want_array(dctx *c, const pathref *path, const msgpack_object *o, size_t max)
{
    int rc = want_type(c, path, o, MSGPACK_OBJECT_ARRAY, "array");
    if (rc)
        return rc;
    if (o->via.array.size > max)
        return ferr(c, path, TP_ERANGE, "%u elements, at most %zu", o->via.array.size, max);
    return 0;
}

static int get_matched(dctx *c, const pathref *path, const msgpack_object *o, tp_matched *out)
{
    memset(out, 0, sizeof *out);
    out->id = -1;
    if (o->type == MSGPACK_OBJECT_NIL)
        return 0;
    if (o->type == MSGPACK_OBJECT_STR) {
        out->kind = TP_MATCHED_STR;
        return get_str(c, path, o, TP_PROTO_MAX_STOP_LEN, 0, &out->str);
    }
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER || o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        int64_t v = 0;
        int rc = get_int(c, path, o, 0, INT32_MAX, false, NULL, &v);
        out->kind = TP_MATCHED_ID;
        out->id = (int32_t)v;
        return rc;
    }
    return ferr(c, path, TP_EFORMAT, "expected str, integer or nil, got %s", type_name(o->type));
}

static int decode_map(dctx *c, const table *t, char *base, const msgpack_object *o, const pathref *prefix);
static int decode_f64(dctx *c, const field *f, char *dst, const msgpack_object *o, const pathref *path);


static int decode_strs(dctx *c, const field *f, char *dst, const msgpack_object *o, const pathref *path)
{
    int rc = want_array(c, path, o, f->max);
    if (rc)
        return rc;
    size_t n = o->via.array.size;
    tp_str *v = msg_alloc(c->m, n * sizeof *v);
    if (!v)
        return ferr(c, path, TP_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        pathref p = {path, NULL, 0, i};
        if ((rc = get_str(c, &p, &o->via.array.ptr[i], f->max_elem, f->flags, &v[i])))
            return rc;
    }
    *(tp_str **)dst = v;
    *(size_t *)(dst + sizeof(tp_str *)) = n;
    return 0;
}

static bool key_is(const msgpack_object_kv *kv, const char *k)
{
    size_t n = strlen(k);
    return kv->key.via.str.size == n && !memcmp(kv->key.via.str.ptr, k, n);
}

/* tool calls: [{id: str, name: str, arguments: str}, ...] (id and
 * arguments may be left out: empty). */
static int get_calls(dctx *c, const pathref *path, const msgpack_object *o, tp_tool_call **out, size_t *n_out)
{
    int rc = want_array(c, path, o, TP_PROTO_MAX_TOOL_CALLS);
    if (rc)
        return rc;
    size_t n = o->via.array.size;
    tp_tool_call *v = msg_alloc(c->m, (n ? n : 1) * sizeof *v);
    if (!v)
        return ferr(c, path, TP_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        pathref p = {path, NULL, 0, i};
        const msgpack_object *m = &o->via.array.ptr[i];
        if (m->type != MSGPACK_OBJECT_MAP)
            return ferr(c, &p, TP_EFORMAT, "expected a map {id, name, arguments}, got %s", type_name(m->type));
        v[i].id = v[i].arguments = (tp_str){"", 0};
        bool has_name = false;
        for (uint32_t k = 0; k < m->via.map.size; k++) {
            const msgpack_object_kv *kv = &m->via.map.ptr[k];
            if (kv->key.type != MSGPACK_OBJECT_STR)
                return ferr(c, &p, TP_EFORMAT, "key #%u is %s, keys must be str", k, type_name(kv->key.type));
            pathref q = {&p, kv->key.via.str.ptr, kv->key.via.str.size, 0};
            if (key_is(kv, "id"))
                rc = get_str(c, &q, &kv->val, TP_PROTO_MAX_NAME * 4, 0, &v[i].id);
            else if (key_is(kv, "name"))
                rc = get_str(c, &q, &kv->val, TP_PROTO_MAX_NAME * 4, FF_NONEMPTY, &v[i].name), has_name = true;
            else if (key_is(kv, "arguments"))
                rc = get_str(c, &q, &kv->val, TP_PROTO_MAX_PROMPT, 0, &v[i].arguments);
            else
                rc = ferr(c, &q, TP_EINVAL, "unknown key: a tool call has id, name and arguments");
            if (rc)
                return rc;
        }
        if (!has_name) {
            pathref q = {&p, "name", 4, 0};
            return ferr(c, &q, TP_EFORMAT, "missing");
        }
    }
    *out = v;
    *n_out = n;
    return 0;
}

static int decode_calls(dctx *c, char *dst, const msgpack_object *o, const pathref *path)
{
    return get_calls(c, path, o, (tp_tool_call **)dst, (size_t *)(dst + sizeof(tp_tool_call *)));
}

/* messages: [{role, content, name, tool_call_id, tool_calls}, ...]; a turn
 * with other keys is refused by name, so nothing a template could use is
 * dropped silently. content nil or absent reads as empty (OpenAI sends
 * null with tool_calls; templates such as Qwen3's fail on none). */
static int decode_msgs(dctx *c, const field *f, char *dst, const msgpack_object *o, const pathref *path)
{
    int rc = want_array(c, path, o, f->max);
    if (rc)
        return rc;
    size_t n = o->via.array.size;
    if (n == 0 && (f->flags & FF_NONEMPTY))
        return ferr(c, path, TP_EINVAL, "empty conversation, need at least one message");
    tp_chat_msg *v = msg_alloc(c->m, (n ? n : 1) * sizeof *v);
    if (!v)
        return ferr(c, path, TP_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        pathref p = {path, NULL, 0, i};
        const msgpack_object *m = &o->via.array.ptr[i];
        if (m->type != MSGPACK_OBJECT_MAP)
            return ferr(c, &p, TP_EFORMAT, "expected a map {role, content}, got %s", type_name(m->type));
        memset(&v[i], 0, sizeof v[i]);
        v[i].content = (tp_str){"", 0};
        bool has_role = false, has_content = false;
        for (uint32_t k = 0; k < m->via.map.size; k++) {
            const msgpack_object_kv *kv = &m->via.map.ptr[k];
            if (kv->key.type != MSGPACK_OBJECT_STR)
                return ferr(c, &p, TP_EFORMAT, "key #%u is %s, keys must be str", k, type_name(kv->key.type));
            pathref q = {&p, kv->key.via.str.ptr, kv->key.via.str.size, 0};
            if (key_is(kv, "role")) {
                rc = get_str(c, &q, &kv->val, TP_PROTO_MAX_ROLE, FF_NONEMPTY, &v[i].role);
                has_role = true;
            } else if (key_is(kv, "content")) {
                if (kv->val.type != MSGPACK_OBJECT_NIL)
                    rc = get_str(c, &q, &kv->val, f->max_elem, 0, &v[i].content);
                has_content = true;
            } else if (key_is(kv, "name")) {
                rc = get_str(c, &q, &kv->val, TP_PROTO_MAX_NAME * 4, 0, &v[i].name);
            } else if (key_is(kv, "tool_call_id")) {
                rc = get_str(c, &q, &kv->val, TP_PROTO_MAX_NAME * 4, 0, &v[i].tool_call_id);
            } else if (key_is(kv, "tool_calls")) {
                rc = get_calls(c, &q, &kv->val, &v[i].tool_calls, &v[i].n_tool_calls);
            } else {
                rc = ferr(c, &q, TP_EINVAL,
                          "unknown key: a message has role, content, name, tool_call_id and tool_calls");
            }
            if (rc)
                return rc;
        }
        if (!has_role || (!has_content && !v[i].n_tool_calls)) {
            pathref q = {&p, has_role ? "content" : "role", has_role ? 7 : 4, 0};
            return ferr(c, &q, TP_EFORMAT, "missing");
        }
        if (!v[i].tool_calls)
            v[i].tool_calls = msg_alloc(c->m, sizeof *v[i].tool_calls);   /* never NULL, as decoded arrays */
        if (!v[i].tool_calls)
            return ferr(c, &p, TP_ENOMEM, "out of memory");
    }
    *(tp_chat_msg **)dst = v;
    *(size_t *)(dst + sizeof(tp_chat_msg *)) = n;
    return 0;
}

static int decode_i32s(dctx *c, const field *f, char *dst, const msgpack_object *o, const pathref *path)
{
    int rc = want_array(c, path, o, f->max);
    if (rc)
        return rc;
    size_t n = o->via.array.size;
    int32_t *v = msg_alloc(c->m, n * sizeof *v);
    if (!v)
        return ferr(c, path, TP_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        pathref p = {path, NULL, 0, i};
        int64_t x = 0;
        if ((rc = get_int(c, &p, &o->via.array.ptr[i], f->ilo, f->ihi, false, NULL, &x)))
            return rc;
        v[i] = (int32_t)x;
    }
    *(int32_t **)dst = v;
    *(size_t *)(dst + sizeof(int32_t *)) = n;
    return 0;
}

static int decode_u64s(dctx *c, const field *f, char *dst, const msgpack_object *o, const pathref *path)
{
    int rc = want_array(c, path, o, f->max);
    if (rc)
        return rc;
    size_t n = o->via.array.size;
    uint64_t *v = msg_alloc(c->m, n * sizeof *v);
    if (!v)
        return ferr(c, path, TP_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        pathref p = {path, NULL, 0, i};
        if ((rc = get_int(c, &p, &o->via.array.ptr[i], 0, 0, true, &v[i], NULL)))
            return rc;
    }
    *(uint64_t **)dst = v;
    *(size_t *)(dst + sizeof(uint64_t *)) = n;
    return 0;
}

static int decode_stages(dctx *c, char *dst, const msgpack_object *o, const pathref *path)
{
    int rc = want_array(c, path, o, 5);
    if (rc)
        return rc;
    unsigned bits = 0;
    for (size_t i = 0; i < o->via.array.size; i++) {
        pathref p = {path, NULL, 0, i};
        tp_str s;
        if ((rc = get_str(c, &p, &o->via.array.ptr[i], TP_PROTO_MAX_NAME, 0, &s)))
            return rc;
        int bit = tp_stage_parse(s.ptr, s.len);
        if (bit < 0)
            return ferr(c, &p, TP_EINVAL, "'%.*s' is not one of tokenize, forward, sample, stop, draft", (int)s.len, s.ptr);
        if (bits & (unsigned)bit)
            return ferr(c, &p, TP_EINVAL, "stage '%.*s' given twice", (int)s.len, s.ptr);
        bits |= (unsigned)bit;
    }
    *(unsigned *)dst = bits;
    return 0;
}

static int decode_triggers(dctx *c, const field *f, char *dst, const msgpack_object *o, const pathref *path)
{
    int rc = want_array(c, path, o, f->max);
    if (rc)
        return rc;
    size_t n = o->via.array.size;
    tp_trigger *v = msg_alloc(c->m, n * sizeof *v);
    if (!v)
        return ferr(c, path, TP_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        pathref p = {path, NULL, 0, i};
        const msgpack_object *e = &o->via.array.ptr[i];
        if ((rc = want_array(c, &p, e, 16)))
            return rc;
        if (e->via.array.size < 3)
            return ferr(c, &p, TP_EFORMAT, "expected [matched, count, truncated]");
        const msgpack_object *x = e->via.array.ptr;
        if ((rc = get_matched(c, &p, &x[0], &v[i].key)) ||
            (rc = get_int(c, &p, &x[1], 0, 0, true, &v[i].count, NULL)) ||
            (rc = want_type(c, &p, &x[2], MSGPACK_OBJECT_BOOLEAN, "bool")))
            return rc;
        v[i].truncated = x[2].via.boolean;
    }
    *(tp_trigger **)dst = v;
    *(size_t *)(dst + sizeof(tp_trigger *)) = n;
    return 0;
}

/* logit_bias: {id: bias}. Keys are the decimal id as str (OpenAI's JSON
 * spelling) or an int; a key naming an id twice ("7" and "07") is an error. */
static int decode_bias(dctx *c, const field *f, char *dst, const msgpack_object *o, const pathref *path)
{
    if (o->type != MSGPACK_OBJECT_MAP)
        return ferr(c, path, TP_EFORMAT, "expected a map of token id -> bias, got %s", type_name(o->type));
    size_t n = o->via.map.size;
    if (n > f->max)
        return ferr(c, path, TP_ERANGE, "%zu entries, at most %zu", n, f->max);
    tp_logit_bias *b = (tp_logit_bias *)dst;
    b->ids = msg_alloc(c->m, n * sizeof *b->ids);
    b->values = msg_alloc(c->m, n * sizeof *b->values);
    if (!b->ids || !b->values)
        return ferr(c, path, TP_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const msgpack_object_kv *kv = &o->via.map.ptr[i];
        int64_t id = -1;
        pathref p = {path, NULL, 0, i};
        if (kv->key.type == MSGPACK_OBJECT_STR) {
            const char *k = kv->key.via.str.ptr;
            size_t kl = kv->key.via.str.size;
            p = (pathref){path, k, kl, 0};
            id = 0;
            for (size_t d = 0; d < kl && id >= 0; d++)
                id = k[d] >= '0' && k[d] <= '9' && id <= INT32_MAX ? id * 10 + (k[d] - '0') : -1;
            if (kl == 0 || kl > 10 || id < 0 || id > INT32_MAX)
                return ferr(c, &p, TP_EINVAL, "the key must be a token id (decimal digits, at most %d)", INT32_MAX);
        } else {
            int rc = get_int(c, &p, &kv->key, 0, INT32_MAX, false, NULL, &id);
            if (rc)
                return rc;
        }
        field vf = {.type = FT_F64, .flo = f->flo, .fhi = f->fhi};
        double v = 0.0;
        int rc = decode_f64(c, &vf, (char *)&v, &kv->val, &p);
        if (rc)
            return rc;
        for (size_t k = 0; k < i; k++)
            if (b->ids[k] == id)
                return ferr(c, &p, TP_EINVAL, "token id %lld given twice", (long long)id);
        b->ids[i] = (int32_t)id;
        b->values[i] = (float)v;
    }
    b->n = n;
    return 0;
}

static int decode_named(dctx *c, char *dst, const msgpack_object *o, const pathref *path, bool reason)
{
    tp_str s;
    int rc = get_str(c, path, o, TP_PROTO_MAX_NAME, 0, &s);
    if (rc)
        return rc;
    int v = reason ? tp_reason_parse(s.ptr, s.len) : tp_state_parse(s.ptr, s.len);
    if (v < 0)
        return ferr(c, path, TP_EINVAL, "unknown %s '%.*s'", reason ? "finish reason" : "state", (int)s.len, s.ptr);
    *(int *)dst = v;
    return 0;
}

static int decode_f64(dctx *c, const field *f, char *dst, const msgpack_object *o, const pathref *path)
{
    double v;
    if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64)
        v = o->via.f64;
    else if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        v = (double)o->via.u64;
    else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        v = (double)o->via.i64;
    else
        return ferr(c, path, TP_EFORMAT, "expected a number, got %s", type_name(o->type));
    char msg[TP_ERR_MSG_MAX];
    if (schema_float_check(f, v, msg, sizeof msg))
        return ferr(c, path, TP_EINVAL, "%s", msg);
    *(double *)dst = v;
    return 0;
}

static int decode_value(dctx *c, const field *f, char *base, const msgpack_object *o, const pathref *path)
{
    char *dst = base + f->off;
    uint64_t u = 0;
    int64_t i = 0;
    int rc;
    switch (f->type) {
    case FT_U64:
        if ((rc = get_int(c, path, o, 0, 0, true, &u, NULL)))
            return rc;
        *(uint64_t *)dst = u;
        return 0;
    case FT_U32:
    case FT_I32:
    case FT_I64:
        if ((rc = get_int(c, path, o, f->ilo, f->ihi, false, NULL, &i)))
            return rc;
        if (f->type == FT_U32)
            *(uint32_t *)dst = (uint32_t)i;
        else if (f->type == FT_I32)
            *(int32_t *)dst = (int32_t)i;
        else
            *(int64_t *)dst = i;
        return 0;
    case FT_F64: return decode_f64(c, f, dst, o, path);
    case FT_BOOL:
        if ((rc = want_type(c, path, o, MSGPACK_OBJECT_BOOLEAN, "bool")))
            return rc;
        *(bool *)dst = o->via.boolean;
        return 0;
    case FT_STR: return get_str(c, path, o, f->max, f->flags, (tp_str *)dst);
    case FT_STRS: return decode_strs(c, f, dst, o, path);
    case FT_I32S: return decode_i32s(c, f, dst, o, path);
    case FT_MATCHED: return get_matched(c, path, o, (tp_matched *)dst);
    case FT_REASON: return decode_named(c, dst, o, path, true);
    case FT_STATE: return decode_named(c, dst, o, path, false);
    case FT_STAGES: return decode_stages(c, dst, o, path);
    case FT_MAP: return decode_map(c, f->sub, dst, o, path);
    case FT_TRIGGERS: return decode_triggers(c, f, dst, o, path);
    case FT_BIAS: return decode_bias(c, f, dst, o, path);
    case FT_U64S: return decode_u64s(c, f, dst, o, path);
    case FT_MSGS: return decode_msgs(c, f, dst, o, path);
    case FT_CALLS: return decode_calls(c, dst, o, path);
    }
    return ferr(c, path, TP_EINVAL, "internal: unknown field type");
}

static int decode_map(dctx *c, const table *t, char *base, const msgpack_object *o, const pathref *prefix)
{
    if (o->type != MSGPACK_OBJECT_MAP)
        return ferr(c, prefix, TP_EFORMAT, "expected a map, got %s", type_name(o->type));
    uint64_t seen = 0;
    for (uint32_t k = 0; k < o->via.map.size; k++) {
        const msgpack_object_kv *kv = &o->via.map.ptr[k];
        if (kv->key.type != MSGPACK_OBJECT_STR)
            return ferr(c, prefix, TP_EFORMAT, "key #%u is %s, keys must be str", k, type_name(kv->key.type));
        pathref path = {prefix, kv->key.via.str.ptr, kv->key.via.str.size, 0};
        size_t fi = 0;
        while (t->fields[fi].key && !(strlen(t->fields[fi].key) == path.klen &&
                                      !memcmp(t->fields[fi].key, path.key, path.klen)))
            fi++;
        if (!t->fields[fi].key) {
            if (c->lenient)
                continue;
            return ferr(c, &path, TP_EINVAL, "unknown key");
        }
        if (seen & (1ull << fi))
            return ferr(c, &path, TP_EFORMAT, "key given twice");
        seen |= 1ull << fi;
        const field *f = &t->fields[fi];
        int rc = decode_value(c, f, base, &kv->val, &path);
        if (rc)
            return rc;
        if (f->setbit && t->set_off >= 0)
            *(uint32_t *)(base + t->set_off) |= f->setbit;
    }
    for (size_t fi = 0; t->fields[fi].key; fi++)
        if ((t->fields[fi].flags & FF_REQUIRED) && !(seen & (1ull << fi))) {
            pathref path = {prefix, t->fields[fi].key, strlen(t->fields[fi].key), 0};
            return ferr(c, &path, TP_EFORMAT, "missing key");
        }
    return 0;
}

/* After a failure: read req / task if the header has them, so the error
 * reply can still be matched to its request. */
static void salvage_ids(tp_msg *m, const msgpack_object *o)
{
    if (o->type != MSGPACK_OBJECT_MAP)
        return;
    for (uint32_t k = 0; k < o->via.map.size; k++) {
        const msgpack_object_kv *kv = &o->via.map.ptr[k];
        if (kv->key.type != MSGPACK_OBJECT_STR || kv->val.type != MSGPACK_OBJECT_POSITIVE_INTEGER)
            continue;
        if (kv->key.via.str.size == 3 && !memcmp(kv->key.via.str.ptr, "req", 3))
            m->req = kv->val.via.u64;
        if (kv->key.via.str.size == 4 && !memcmp(kv->key.via.str.ptr, "task", 4))
            m->task = kv->val.via.u64;
    }
}

static int decode_header(dctx *c, const mdesc *d, const tp_frame *h)
{
    if (h->len > TP_PROTO_MAX_HEADER)
        return ferr_at(c, "header", TP_ERANGE, "%zu bytes, at most %u", h->len, TP_PROTO_MAX_HEADER);
    int rc = mp_prescan(h->data, h->len, c->err);
    if (rc) {
        snprintf(c->m->bad_field, sizeof c->m->bad_field, "header");
        return rc;
    }
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    msgpack_unpack_return r = msgpack_unpack_next(&u, h->data, h->len, &off);
    if (r != MSGPACK_UNPACK_SUCCESS || off != h->len) {
        msgpack_unpacked_destroy(&u);
        return ferr_at(c, "header", r == MSGPACK_UNPACK_NOMEM_ERROR ? TP_ENOMEM : TP_EFORMAT, "not valid msgpack");
    }
    rc = decode_map(c, d->hdr, (char *)c->m, &u.data, NULL);
    if (rc)
        salvage_ids(c->m, &u.data);
    msgpack_unpacked_destroy(&u);
    return rc;
}

static int decode_payload(dctx *c, const mdesc *d, const tp_frame *f, size_t n)
{
    static const char empty[1];
    size_t k = 0;
    for (; d->frames[k].name; k++) {
        const pframe *p = &d->frames[k];
        if (k >= n) {
            if (p->optional)
                continue;
            return ferr_at(c, p->name, TP_EFORMAT, "payload frame missing");
        }
        if (f[k].len > TP_PROTO_MAX_PAYLOAD)
            return ferr_at(c, p->name, TP_ERANGE, "frame of %zu bytes, at most %u", f[k].len, TP_PROTO_MAX_PAYLOAD);
        if (f[k].len % p->esize)
            return ferr_at(c, p->name, TP_EFORMAT, "frame length %zu is not a multiple of %u", f[k].len, p->esize);
        tp_raw *r = (tp_raw *)((char *)c->m + p->off);
        r->data = f[k].data ? f[k].data : empty;
        r->n = f[k].len / p->esize;
    }
    if (n > k)
        return ferr_at(c, "payload", TP_EFORMAT, "%zu frames after the header, at most %zu", n, k);
    return 0;
}

/* Absent array keys decode to a valid empty array rather than NULL, so a
 * consumer may memcpy(dst, arr, n * size) without a NULL check (memcpy
 * from NULL is undefined even for 0 bytes). Never written: n is 0. */
static const max_align_t empty_array[1];

static void fill_empty_arrays(const table *t, char *base)
{
    for (const field *f = t->fields; f->key; f++) {
        void **arr = (void **)(base + f->off);
        if ((f->type == FT_STRS || f->type == FT_I32S || f->type == FT_TRIGGERS || f->type == FT_U64S ||
             f->type == FT_MSGS || f->type == FT_CALLS) &&
            !*arr)
            *arr = (void *)(uintptr_t)empty_array;
        else if (f->type == FT_BIAS && !*arr) {
            tp_logit_bias *b = (tp_logit_bias *)arr;
            b->ids = (int32_t *)(uintptr_t)empty_array;
            b->values = (float *)(uintptr_t)empty_array;
        }
        else if (f->type == FT_MAP)
            fill_empty_arrays(f->sub, base + f->off);
    }
}

static uint32_t status_for(int rc)
{
    switch (rc) {
    case TP_ERANGE: return TP_ST_TOO_LARGE;
    case TP_ENOMEM: return TP_ST_INTERNAL;
    default: return TP_ST_BAD_REQUEST;
    }
}

static int decode_frames(dctx *c, tp_family family, const tp_frame *frames, size_t n)
{
    tp_msg *m = c->m;
    size_t at = family == TP_FAM_EVT ? 1 : 0;
    const char *magic = schema_magic(family);
    if (!magic)
        return tp_err_set(c->err, TP_EINVAL, "unknown protocol family %d", (int)family);
    if (n < at + 1 || frames[at].len != TP_MAGIC_LEN || memcmp(frames[at].data, magic, TP_MAGIC_LEN)) {
        m->status = TP_ST_BAD_VERSION;
        return ferr_at(c, "F0", TP_EFORMAT, "expected magic+version '%s'", magic);
    }
    if (n < at + 3)
        return ferr_at(c, "frames", TP_EFORMAT, "%zu frames, need at least %zu (magic, command, header)", n, at + 3);
    if (n > at + TP_PROTO_MAX_FRAMES)
        return ferr_at(c, "frames", TP_ERANGE, "%zu frames, at most %zu", n, at + (size_t)TP_PROTO_MAX_FRAMES);
    if (frames[at + 1].len != 1) {
        m->status = TP_ST_UNKNOWN_COMMAND;   /* PROTOCOL.md: F1 is one byte naming a command, else 501 */
        return ferr_at(c, "F1", TP_EFORMAT, "command frame of %zu bytes, must be 1", frames[at + 1].len);
    }
    uint8_t cmd = *(const uint8_t *)frames[at + 1].data;
    const mdesc *d = schema_find(family, cmd);
    if (!d) {
        m->status = TP_ST_UNKNOWN_COMMAND;
        return ferr_at(c, "F1", TP_ENOTFOUND, "unknown %s command 0x%02x", magic, cmd);
    }
    m->cmd = cmd;
    c->lenient = d->lenient;
    if (at) {
        m->topic.ptr = frames[0].len ? frames[0].data : "";
        m->topic.len = frames[0].len;
    }
    int rc = decode_header(c, d, &frames[at + 2]);
    if (!rc)
        rc = decode_payload(c, d, frames + at + 3, n - at - 3);
    if (!rc && d->check && (rc = d->check(m, c->err)))
        snprintf(m->bad_field, sizeof m->bad_field, "%.*s", (int)strcspn(c->err->msg, ":"), c->err->msg);
    if (!rc)
        fill_empty_arrays(d->hdr, (char *)m);
    return rc;
}

int tp_proto_decode(tp_family family, const tp_frame *frames, size_t n_frames, tp_msg *out, tp_err *err)
{
    tp_err local;
    memset(out, 0, sizeof *out);
    out->family = family;
    dctx c = {out, err ? err : &local, false};
    int rc = decode_frames(&c, family, frames, n_frames);
    if (rc && out->status == 0)
        out->status = status_for(rc);
    return rc;
}
