/* GGUF v3 parser: header, metadata, tensor directory; all reads bounded. */
#include "tokpipe/gguf.h"

#include <stdlib.h>
#include <string.h>

#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32
/* Smallest encodings, used to bound counts before allocating for them. */
#define MIN_KV_BYTES 13      /* key len u64 + type u32 + 1-byte value */
#define MIN_TENSOR_BYTES 24  /* name len u64 + n_dims u32 + type u32 + offset u64 */

typedef struct gguf_kv {
    tp_gguf_str key;
    uint32_t type;
    uint32_t elem_type;  /* arrays only */
    uint64_t count;      /* arrays only */
    size_t value_off;    /* value, or first array element */
    size_t value_end;
} gguf_kv;

struct tp_gguf {
    const uint8_t *data;
    size_t size;
    uint64_t n_kv;
    gguf_kv *kv;
    uint64_t n_tensors;
    tp_gguf_tensor *tensors;
    size_t data_start;
};

typedef struct cursor {
    const uint8_t *p;
    size_t size;
    size_t off;
} cursor;

static size_t remaining(const cursor *c) { return c->size - c->off; }

static int rd_bytes(cursor *c, void *dst, size_t n, const char *what, tp_err *err)
{
    if (remaining(c) < n)
        return tp_err_set(err, TP_EFORMAT, "gguf: truncated reading %s at offset %zu (file is %zu bytes)",
                          what, c->off, c->size);
    memcpy(dst, c->p + c->off, n);
    c->off += n;
    return 0;
}

static int rd_u32(cursor *c, uint32_t *v, const char *what, tp_err *err)
{
    return rd_bytes(c, v, 4, what, err);
}

static int rd_u64(cursor *c, uint64_t *v, const char *what, tp_err *err)
{
    return rd_bytes(c, v, 8, what, err);
}

static int rd_str(cursor *c, tp_gguf_str *s, const char *what, tp_err *err)
{
    uint64_t len = 0;
    int rc = rd_u64(c, &len, what, err);
    if (rc)
        return rc;
    if (len > remaining(c))
        return tp_err_set(err, TP_EFORMAT, "gguf: %s length %llu at offset %zu exceeds the %zu bytes left",
                          what, (unsigned long long)len, c->off - 8, remaining(c));
    s->ptr = (const char *)c->p + c->off;
    s->len = len;
    c->off += (size_t)len;
    return 0;
}

/* Size in bytes of a scalar metadata type, 0 for string/array/unknown. */
static size_t scalar_size(uint32_t type)
{
    switch (type) {
    case TP_GGUF_U8: case TP_GGUF_I8: case TP_GGUF_BOOL: return 1;
    case TP_GGUF_U16: case TP_GGUF_I16: return 2;
    case TP_GGUF_U32: case TP_GGUF_I32: case TP_GGUF_F32: return 4;
    case TP_GGUF_U64: case TP_GGUF_I64: case TP_GGUF_F64: return 8;
    default: return 0;
    }
}

static int skip_array(cursor *c, gguf_kv *kv, tp_err *err)
{
    int rc = rd_u32(c, &kv->elem_type, "array element type", err);
    if (!rc)
        rc = rd_u64(c, &kv->count, "array length", err);
    if (rc)
        return rc;
    kv->value_off = c->off;
    size_t es = scalar_size(kv->elem_type);
    if (es) {
        if (kv->count > remaining(c) / es)
            return tp_err_set(err, TP_EFORMAT, "gguf: array '%.*s' of %llu elements exceeds the file",
                              (int)kv->key.len, kv->key.ptr, (unsigned long long)kv->count);
        c->off += (size_t)kv->count * es;
        return 0;
    }
    if (kv->elem_type != TP_GGUF_STRING)
        return tp_err_set(err, TP_EFORMAT, "gguf: array '%.*s' has unsupported element type %u",
                          (int)kv->key.len, kv->key.ptr, kv->elem_type);
    if (kv->count > remaining(c) / 8)
        return tp_err_set(err, TP_EFORMAT, "gguf: string array '%.*s' of %llu elements exceeds the file",
                          (int)kv->key.len, kv->key.ptr, (unsigned long long)kv->count);
    for (uint64_t i = 0; i < kv->count; i++) {
        tp_gguf_str s;
        if ((rc = rd_str(c, &s, "array string", err)))
            return rc;
    }
    return 0;
}

static int parse_kv(cursor *c, gguf_kv *kv, tp_err *err)
{
    int rc = rd_str(c, &kv->key, "metadata key", err);
    if (!rc)
        rc = rd_u32(c, &kv->type, "metadata value type", err);
    if (rc)
        return rc;
    kv->value_off = c->off;
    if (kv->type == TP_GGUF_ARRAY)
        return skip_array(c, kv, err);
    if (kv->type == TP_GGUF_STRING) {
        tp_gguf_str s;
        return rd_str(c, &s, "metadata string", err);
    }
    size_t n = scalar_size(kv->type);
    if (!n)
        return tp_err_set(err, TP_EFORMAT, "gguf: key '%.*s' has unknown value type %u",
                          (int)kv->key.len, kv->key.ptr, kv->type);
    if (remaining(c) < n)
        return tp_err_set(err, TP_EFORMAT, "gguf: truncated value of key '%.*s'", (int)kv->key.len,
                          kv->key.ptr);
    c->off += n;
    return 0;
}

static int str_eq(tp_gguf_str s, const char *z)
{
    size_t n = strlen(z);
    return s.len == n && !memcmp(s.ptr, z, n);
}

static const gguf_kv *find_kv(const tp_gguf *g, const char *key)
{
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (str_eq(g->kv[i].key, key))
            return &g->kv[i];
    return NULL;
}

static int parse_kvs(tp_gguf *g, cursor *c, tp_err *err)
{
    if (g->n_kv > remaining(c) / MIN_KV_BYTES)
        return tp_err_set(err, TP_EFORMAT, "gguf: metadata count %llu cannot fit in a %zu-byte file",
                          (unsigned long long)g->n_kv, c->size);
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv);
    if (!g->kv)
        return tp_err_set(err, TP_ENOMEM, "gguf: out of memory for %llu metadata entries",
                          (unsigned long long)g->n_kv);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        int rc = parse_kv(c, &g->kv[i], err);
        if (rc)
            return rc;
        g->kv[i].value_end = c->off;
        for (uint64_t j = 0; j < i; j++)
            if (g->kv[j].key.len == g->kv[i].key.len &&
                !memcmp(g->kv[j].key.ptr, g->kv[i].key.ptr, g->kv[i].key.len))
                return tp_err_set(err, TP_EFORMAT, "gguf: duplicate metadata key '%.*s'",
                                  (int)g->kv[i].key.len, g->kv[i].key.ptr);
    }
    return 0;
}

static int parse_tensor_info(cursor *c, tp_gguf_tensor *t, tp_err *err)
{
    int rc = rd_str(c, &t->name, "tensor name", err);
    if (!rc)
        rc = rd_u32(c, &t->n_dims, "tensor n_dims", err);
    if (rc)
        return rc;
    if (t->n_dims < 1 || t->n_dims > TP_GGUF_MAX_DIMS)
        return tp_err_set(err, TP_EFORMAT, "gguf: tensor '%.*s' has %u dimensions (1..%d allowed)",
                          (int)t->name.len, t->name.ptr, t->n_dims, TP_GGUF_MAX_DIMS);
    for (uint32_t d = 0; d < t->n_dims; d++)
        if ((rc = rd_u64(c, &t->dims[d], "tensor dimension", err)))
            return rc;
    for (uint32_t d = t->n_dims; d < TP_GGUF_MAX_DIMS; d++)
        t->dims[d] = 1;
    rc = rd_u32(c, &t->type, "tensor type", err);
    if (!rc)
        rc = rd_u64(c, &t->offset, "tensor offset", err);
    return rc;
}

/* Element count, or an error if any dimension is 0 or the product overflows. */
static int tensor_elems(const tp_gguf_tensor *t, uint64_t *n, tp_err *err)
{
    uint64_t e = 1;
    for (uint32_t d = 0; d < TP_GGUF_MAX_DIMS; d++) {
        if (t->dims[d] == 0 || e > UINT64_MAX / 8 / t->dims[d])
            return tp_err_set(err, TP_EFORMAT, "gguf: tensor '%.*s' dimension %u (%llu) is zero or too large",
                              (int)t->name.len, t->name.ptr, d, (unsigned long long)t->dims[d]);
        e *= t->dims[d];
    }
    *n = e;
    return 0;
}

static int place_tensor(tp_gguf *g, tp_gguf_tensor *t, uint64_t alignment, tp_err *err)
{
    uint64_t n = 0;
    int rc = tensor_elems(t, &n, err);
    if (rc)
        return rc;
    if (t->offset % alignment)
        return tp_err_set(err, TP_EFORMAT, "gguf: tensor '%.*s' offset %llu is not a multiple of the alignment %llu",
                          (int)t->name.len, t->name.ptr, (unsigned long long)t->offset,
                          (unsigned long long)alignment);
    if (!tp_ggml_type(t->type))
        return 0;
    tp_err why;
    if (tp_ggml_nbytes(t->type, (int)t->n_dims, t->dims, &t->nbytes, &why))
        return tp_err_set(err, TP_EFORMAT, "gguf: tensor '%.*s': %s", (int)t->name.len, t->name.ptr, why.msg);
    uint64_t avail = g->size - g->data_start;
    if (t->offset > avail || t->nbytes > avail - t->offset)
        return tp_err_set(err, TP_EFORMAT, "gguf: tensor '%.*s' (offset %llu, %llu bytes) extends past the end of the file",
                          (int)t->name.len, t->name.ptr, (unsigned long long)t->offset,
                          (unsigned long long)t->nbytes);
    t->data = g->data + g->data_start + t->offset;
    return 0;
}

static int get_alignment(const tp_gguf *g, uint64_t *alignment, tp_err *err)
{
    *alignment = GGUF_DEFAULT_ALIGNMENT;
    if (!find_kv(g, "general.alignment"))
        return 0;
    int64_t a;
    int rc = tp_gguf_get_int(g, "general.alignment", &a, err);
    if (rc)
        return rc;
    if (a <= 0 || a > (1 << 20) || (a & (a - 1)))
        return tp_err_set(err, TP_EFORMAT, "gguf: general.alignment %lld is not a power of two in 1..2^20",
                          (long long)a);
    *alignment = (uint64_t)a;
    return 0;
}

static int parse_tensors(tp_gguf *g, cursor *c, tp_err *err)
{
    if (g->n_tensors > remaining(c) / MIN_TENSOR_BYTES)
        return tp_err_set(err, TP_EFORMAT, "gguf: tensor count %llu cannot fit in a %zu-byte file",
                          (unsigned long long)g->n_tensors, c->size);
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    if (!g->tensors)
        return tp_err_set(err, TP_ENOMEM, "gguf: out of memory for %llu tensors",
                          (unsigned long long)g->n_tensors);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        int rc = parse_tensor_info(c, &g->tensors[i], err);
        if (rc)
            return rc;
    }
    uint64_t alignment = 0;
    int rc = get_alignment(g, &alignment, err);
    if (rc)
        return rc;
    uint64_t start = (c->off + alignment - 1) / alignment * alignment;
    if (g->n_tensors && start > c->size)
        return tp_err_set(err, TP_EFORMAT, "gguf: tensor data section (offset %llu) starts past the end of the file",
                          (unsigned long long)start);
    g->data_start = start > c->size ? c->size : (size_t)start;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        if ((rc = place_tensor(g, &g->tensors[i], alignment, err)))
            return rc;
        for (uint64_t j = 0; j < i; j++)
            if (g->tensors[j].name.len == g->tensors[i].name.len &&
                !memcmp(g->tensors[j].name.ptr, g->tensors[i].name.ptr, g->tensors[i].name.len))
                return tp_err_set(err, TP_EFORMAT, "gguf: duplicate tensor name '%.*s'",
                                  (int)g->tensors[i].name.len, g->tensors[i].name.ptr);
    }
    return 0;
}

static int parse_header(tp_gguf *g, cursor *c, tp_err *err)
{
    char magic[4] = {0};
    uint32_t version = 0;
    int rc = rd_bytes(c, magic, 4, "magic", err);
    if (rc)
        return rc;
    if (memcmp(magic, GGUF_MAGIC, 4))
        return tp_err_set(err, TP_EFORMAT, "gguf: bad magic (not a GGUF file)");
    if ((rc = rd_u32(c, &version, "version", err)))
        return rc;
    if (version != 3)
        return tp_err_set(err, TP_EFORMAT, "gguf: version %u is not supported (only 3)", version);
    rc = rd_u64(c, &g->n_tensors, "tensor count", err);
    if (!rc)
        rc = rd_u64(c, &g->n_kv, "metadata count", err);
    return rc;
}

int tp_gguf_parse(const void *data, size_t size, tp_gguf **out, tp_err *err)
{
    *out = NULL;
    tp_gguf *g = calloc(1, sizeof *g);
    if (!g)
        return tp_err_set(err, TP_ENOMEM, "gguf: out of memory");
    g->data = data;
    g->size = size;
    cursor c = {data, size, 0};
    int rc = parse_header(g, &c, err);
    if (!rc) {
        uint64_t n_tensors = g->n_tensors;
        g->n_tensors = 0;  /* so tp_gguf_free is safe before the array exists */
        rc = parse_kvs(g, &c, err);
        g->n_tensors = n_tensors;
    }
    if (!rc)
        rc = parse_tensors(g, &c, err);
    if (rc) {
        tp_gguf_free(g);
        return rc;
    }
    *out = g;
    return 0;
}

void tp_gguf_free(tp_gguf *g)
{
    if (!g)
        return;
    free(g->kv);
    free(g->tensors);
    free(g);
}

uint64_t tp_gguf_n_tensors(const tp_gguf *g) { return g->n_tensors; }

const tp_gguf_tensor *tp_gguf_tensor_at(const tp_gguf *g, uint64_t i)
{
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const tp_gguf_tensor *tp_gguf_tensor_find(const tp_gguf *g, const char *name)
{
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (str_eq(g->tensors[i].name, name))
            return &g->tensors[i];
    return NULL;
}

static int lookup(const tp_gguf *g, const char *key, const gguf_kv **kv, tp_err *err)
{
    *kv = find_kv(g, key);
    if (!*kv)
        return tp_err_set(err, TP_ENOTFOUND, "gguf: metadata key '%s' is missing", key);
    return 0;
}

static int bad_type(const char *key, uint32_t type, const char *want, tp_err *err)
{
    return tp_err_set(err, TP_EFORMAT, "gguf: metadata key '%s' has type %u, expected %s", key, type, want);
}

int tp_gguf_get_int(const tp_gguf *g, const char *key, int64_t *out, tp_err *err)
{
    const gguf_kv *kv;
    int rc = lookup(g, key, &kv, err);
    if (rc)
        return rc;
    const uint8_t *p = g->data + kv->value_off;
    union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32;
            uint64_t u64; int64_t i64; } v;
    size_t n = kv->type == TP_GGUF_F32 || kv->type == TP_GGUF_F64 ? 0 : scalar_size(kv->type);
    if (!n)
        return bad_type(key, kv->type, "an integer", err);
    memcpy(&v, p, n);
    switch (kv->type) {
    case TP_GGUF_U8: case TP_GGUF_BOOL: *out = v.u8; break;
    case TP_GGUF_I8: *out = v.i8; break;
    case TP_GGUF_U16: *out = v.u16; break;
    case TP_GGUF_I16: *out = v.i16; break;
    case TP_GGUF_U32: *out = v.u32; break;
    case TP_GGUF_I32: *out = v.i32; break;
    case TP_GGUF_I64: *out = v.i64; break;
    default:
        if (v.u64 > INT64_MAX)
            return tp_err_set(err, TP_ERANGE, "gguf: metadata key '%s' value %llu is too large", key,
                              (unsigned long long)v.u64);
        *out = (int64_t)v.u64;
    }
    return 0;
}

int tp_gguf_get_float(const tp_gguf *g, const char *key, double *out, tp_err *err)
{
    const gguf_kv *kv;
    int rc = lookup(g, key, &kv, err);
    if (rc)
        return rc;
    const uint8_t *p = g->data + kv->value_off;
    if (kv->type == TP_GGUF_F32) {
        float f;
        memcpy(&f, p, 4);
        *out = f;
    } else if (kv->type == TP_GGUF_F64) {
        memcpy(out, p, 8);
    } else {
        return bad_type(key, kv->type, "a float", err);
    }
    return 0;
}

int tp_gguf_get_str(const tp_gguf *g, const char *key, tp_gguf_str *out, tp_err *err)
{
    const gguf_kv *kv;
    int rc = lookup(g, key, &kv, err);
    if (rc)
        return rc;
    if (kv->type != TP_GGUF_STRING)
        return bad_type(key, kv->type, "a string", err);
    cursor c = {g->data, g->size, kv->value_off};
    return rd_str(&c, out, key, err);
}

int tp_gguf_get_str_array(const tp_gguf *g, const char *key, tp_gguf_str **out, uint64_t *n,
                          tp_err *err)
{
    *out = NULL;
    const gguf_kv *kv;
    int rc = lookup(g, key, &kv, err);
    if (rc)
        return rc;
    if (kv->type != TP_GGUF_ARRAY || kv->elem_type != TP_GGUF_STRING)
        return bad_type(key, kv->type, "an array of strings", err);
    tp_gguf_str *s = malloc((kv->count ? kv->count : 1) * sizeof *s);
    if (!s)
        return tp_err_set(err, TP_ENOMEM, "gguf: out of memory for %llu strings of '%s'",
                          (unsigned long long)kv->count, key);
    cursor c = {g->data, g->size, kv->value_off};
    for (uint64_t i = 0; i < kv->count; i++)
        if ((rc = rd_str(&c, &s[i], key, err))) {  /* validated at parse; defensive */
            free(s);
            return rc;
        }
    *out = s;
    *n = kv->count;
    return 0;
}

int tp_gguf_get_array(const tp_gguf *g, const char *key, uint32_t *elem_type, uint64_t *n,
                      const uint8_t **raw, tp_err *err)
{
    const gguf_kv *kv;
    int rc = lookup(g, key, &kv, err);
    if (rc)
        return rc;
    if (kv->type != TP_GGUF_ARRAY || !scalar_size(kv->elem_type))
        return bad_type(key, kv->type, "an array of numbers", err);
    *elem_type = kv->elem_type;
    *n = kv->count;
    *raw = g->data + kv->value_off;
    return 0;
}

uint64_t tp_gguf_n_kv(const tp_gguf *g) { return g->n_kv; }

int tp_gguf_kv_at(const tp_gguf *g, uint64_t i, tp_gguf_kv_view *out, tp_err *err)
{
    if (i >= g->n_kv)
        return tp_err_set(err, TP_ERANGE, "gguf: metadata index %llu is past the %llu entries",
                          (unsigned long long)i, (unsigned long long)g->n_kv);
    const gguf_kv *kv = &g->kv[i];
    out->key = kv->key;
    out->type = kv->type;
    out->elem_type = kv->type == TP_GGUF_ARRAY ? kv->elem_type : 0;
    out->count = kv->type == TP_GGUF_ARRAY ? kv->count : 0;
    out->raw = g->data + kv->value_off;
    out->raw_len = kv->value_end - kv->value_off;
    return 0;
}
