/* GGUF v3 writer: metadata kept encoded, tensors borrowed, one pass out. */
#include "tokpipe/gguf_write.h"
#include "tokpipe/ggml_types.h"
#include "tokpipe/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF writer stores numbers in host order, which GGUF requires to be little endian"
#endif

#define DEFAULT_ALIGNMENT 32
#define MAX_ALIGNMENT (1u << 20) /* the reader's limit */
#define MAX_KEY_LEN 65535
#define MAX_TENSOR_NAME 64       /* GGML_MAX_NAME, including the NUL */
#define ALIGNMENT_KEY "general.alignment"

typedef struct wkv {
    char *key;
    size_t key_len;
    uint32_t type;
    uint8_t *val;   /* the value as encoded after the type field */
    size_t val_len;
} wkv;

typedef struct wtensor {
    char *name;
    uint32_t type;
    int n_dims;
    uint64_t ne[4];
    const void *data;
    size_t nbytes;
} wtensor;

struct tp_gguf_writer {
    wkv *kv;
    size_t n_kv, cap_kv;
    wtensor *t;
    size_t n_t, cap_t;
};

int tp_gguf_writer_new(tp_gguf_writer **out, tp_err *err)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return tp_err_set(err, TP_ENOMEM, "gguf writer: out of memory");
    return 0;
}

void tp_gguf_writer_free(tp_gguf_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].val);
    }
    for (size_t i = 0; i < w->n_t; i++)
        free(w->t[i].name);
    free(w->kv);
    free(w->t);
    free(w);
}

/* Store key = (type, val) taking ownership of val (freed on failure too). */
static int put_kv(tp_gguf_writer *w, const char *key, size_t key_len, uint32_t type, uint8_t *val,
                  size_t val_len, tp_err *err)
{
    if (key_len == 0 || key_len > MAX_KEY_LEN) {
        free(val);
        return tp_err_set(err, TP_EINVAL, "gguf writer: metadata key of %zu bytes (1..%d allowed)", key_len,
                          MAX_KEY_LEN);
    }
    for (size_t i = 0; i < w->n_kv; i++)
        if (w->kv[i].key_len == key_len && !memcmp(w->kv[i].key, key, key_len)) {
            free(w->kv[i].val);
            w->kv[i].type = type;
            w->kv[i].val = val;
            w->kv[i].val_len = val_len;
            return 0;
        }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? 2 * w->cap_kv : 16;
        wkv *kv = realloc(w->kv, cap * sizeof *kv);
        if (!kv) {
            free(val);
            return tp_err_set(err, TP_ENOMEM, "gguf writer: out of memory for metadata");
        }
        w->kv = kv;
        w->cap_kv = cap;
    }
    char *k = malloc(key_len + 1);
    if (!k) {
        free(val);
        return tp_err_set(err, TP_ENOMEM, "gguf writer: out of memory for key '%.*s'", (int)key_len, key);
    }
    memcpy(k, key, key_len);
    k[key_len] = 0;
    w->kv[w->n_kv++] = (wkv){k, key_len, type, val, val_len};
    return 0;
}

static int set_bytes(tp_gguf_writer *w, const char *key, uint32_t type, const void *v, size_t n, tp_err *err)
{
    uint8_t *val = malloc(n);
    if (!val)
        return tp_err_set(err, TP_ENOMEM, "gguf writer: out of memory for '%s'", key);
    memcpy(val, v, n);
    return put_kv(w, key, strlen(key), type, val, n, err);
}

int tp_gguf_set_u32(tp_gguf_writer *w, const char *key, uint32_t v, tp_err *err)
{
    return set_bytes(w, key, TP_GGUF_U32, &v, 4, err);
}

int tp_gguf_set_i32(tp_gguf_writer *w, const char *key, int32_t v, tp_err *err)
{
    return set_bytes(w, key, TP_GGUF_I32, &v, 4, err);
}

int tp_gguf_set_u64(tp_gguf_writer *w, const char *key, uint64_t v, tp_err *err)
{
    return set_bytes(w, key, TP_GGUF_U64, &v, 8, err);
}

int tp_gguf_set_f32(tp_gguf_writer *w, const char *key, float v, tp_err *err)
{
    return set_bytes(w, key, TP_GGUF_F32, &v, 4, err);
}

int tp_gguf_set_bool(tp_gguf_writer *w, const char *key, bool v, tp_err *err)
{
    uint8_t b = v ? 1 : 0;
    return set_bytes(w, key, TP_GGUF_BOOL, &b, 1, err);
}

int tp_gguf_set_str(tp_gguf_writer *w, const char *key, const char *v, tp_err *err)
{
    uint64_t n = strlen(v);
    uint8_t *val = malloc(8 + n);
    if (!val)
        return tp_err_set(err, TP_ENOMEM, "gguf writer: out of memory for '%s'", key);
    memcpy(val, &n, 8);
    memcpy(val + 8, v, n);
    return put_kv(w, key, strlen(key), TP_GGUF_STRING, val, 8 + n, err);
}

/* An array of fixed-size elements: elem_type u32, count u64, elements. */
static int set_arr(tp_gguf_writer *w, const char *key, uint32_t elem_type, const void *v, size_t n,
                   size_t es, tp_err *err)
{
    if (n > (SIZE_MAX - 12) / es)
        return tp_err_set(err, TP_ERANGE, "gguf writer: array '%s' of %zu elements is too large", key, n);
    uint8_t *val = malloc(12 + n * es);
    if (!val)
        return tp_err_set(err, TP_ENOMEM, "gguf writer: out of memory for array '%s'", key);
    uint64_t count = n;
    memcpy(val, &elem_type, 4);
    memcpy(val + 4, &count, 8);
    if (n)
        memcpy(val + 12, v, n * es);
    return put_kv(w, key, strlen(key), TP_GGUF_ARRAY, val, 12 + n * es, err);
}

int tp_gguf_set_arr_i32(tp_gguf_writer *w, const char *key, const int32_t *v, size_t n, tp_err *err)
{
    return set_arr(w, key, TP_GGUF_I32, v, n, 4, err);
}

int tp_gguf_set_arr_f32(tp_gguf_writer *w, const char *key, const float *v, size_t n, tp_err *err)
{
    return set_arr(w, key, TP_GGUF_F32, v, n, 4, err);
}

int tp_gguf_set_arr_str(tp_gguf_writer *w, const char *key, const char *const *v, size_t n, tp_err *err)
{
    size_t total = 12;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(v[i]);
        if (len > SIZE_MAX - 8 - total)
            return tp_err_set(err, TP_ERANGE, "gguf writer: string array '%s' is too large", key);
        total += 8 + len;
    }
    uint8_t *val = malloc(total);
    if (!val)
        return tp_err_set(err, TP_ENOMEM, "gguf writer: out of memory for array '%s'", key);
    uint32_t et = TP_GGUF_STRING;
    uint64_t count = n;
    memcpy(val, &et, 4);
    memcpy(val + 4, &count, 8);
    size_t off = 12;
    for (size_t i = 0; i < n; i++) {
        uint64_t len = strlen(v[i]);
        memcpy(val + off, &len, 8);
        memcpy(val + off + 8, v[i], len);
        off += 8 + len;
    }
    return put_kv(w, key, strlen(key), TP_GGUF_ARRAY, val, total, err);
}

static int copy_kvs(tp_gguf_writer *w, const tp_gguf *g, const char *prefix, tp_err *err)
{
    size_t plen = prefix ? strlen(prefix) : 0;
    for (uint64_t i = 0; i < tp_gguf_n_kv(g); i++) {
        tp_gguf_kv_view kv;
        int rc = tp_gguf_kv_at(g, i, &kv, err);
        if (rc)
            return rc;
        if (prefix && (kv.key.len < plen || memcmp(kv.key.ptr, prefix, plen)))
            continue;
        size_t head = kv.type == TP_GGUF_ARRAY ? 12 : 0;
        uint8_t *val = malloc(head + kv.raw_len + 1);
        if (!val)
            return tp_err_set(err, TP_ENOMEM, "gguf writer: out of memory copying '%.*s'", (int)kv.key.len,
                              kv.key.ptr);
        if (head) {
            memcpy(val, &kv.elem_type, 4);
            memcpy(val + 4, &kv.count, 8);
        }
        memcpy(val + head, kv.raw, kv.raw_len);
        if ((rc = put_kv(w, kv.key.ptr, kv.key.len, kv.type, val, head + kv.raw_len, err)))
            return rc;
    }
    return 0;
}

int tp_gguf_copy_kv_from_file(tp_gguf_writer *w, const char *gguf_path, const char *prefix, tp_err *err)
{
    int fd = open(gguf_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return tp_err_set(err, TP_EIO, "gguf writer: cannot open %s: %s", gguf_path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size <= 0) {
        close(fd);
        return tp_err_set(err, TP_EIO, "gguf writer: %s is not a non-empty regular file", gguf_path);
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return tp_err_set(err, TP_EIO, "gguf writer: cannot mmap %s: %s", gguf_path, strerror(errno));
    tp_gguf *g = NULL;
    int rc = tp_gguf_parse(map, size, &g, err);
    if (!rc)
        rc = copy_kvs(w, g, prefix, err);
    tp_gguf_free(g);
    munmap(map, size);
    if (rc && err) {
        char msg[TP_ERR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", err->msg);
        tp_err_set(err, rc, "%s: %s", gguf_path, msg);
    }
    return rc;
}

int tp_gguf_add_tensor(tp_gguf_writer *w, const char *name, uint32_t ggml_type, int n_dims,
                       const uint64_t *ne, const void *data, size_t nbytes, tp_err *err)
{
    size_t len = strlen(name);
    if (len == 0 || len >= MAX_TENSOR_NAME)
        return tp_err_set(err, TP_EINVAL, "gguf writer: tensor name '%s' has %zu bytes (1..%d allowed)", name,
                          len, MAX_TENSOR_NAME - 1);
    for (size_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name))
            return tp_err_set(err, TP_EINVAL, "gguf writer: tensor '%s' was already added", name);
    uint64_t want = 0;
    tp_err why;
    if (tp_ggml_nbytes(ggml_type, n_dims, ne, &want, &why))
        return tp_err_set(err, TP_EINVAL, "gguf writer: tensor '%s': %s", name, why.msg);
    if (want != nbytes)
        return tp_err_set(err, TP_EINVAL, "gguf writer: tensor '%s' of type %s has %zu bytes of data, its shape "
                          "needs %llu", name, tp_ggml_type(ggml_type)->name, nbytes, (unsigned long long)want);
    if (!data)
        return tp_err_set(err, TP_EINVAL, "gguf writer: tensor '%s' has no data", name);
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? 2 * w->cap_t : 16;
        wtensor *t = realloc(w->t, cap * sizeof *t);
        if (!t)
            return tp_err_set(err, TP_ENOMEM, "gguf writer: out of memory for tensors");
        w->t = t;
        w->cap_t = cap;
    }
    char *nm = strdup(name);
    if (!nm)
        return tp_err_set(err, TP_ENOMEM, "gguf writer: out of memory for tensor '%s'", name);
    wtensor *t = &w->t[w->n_t++];
    memset(t, 0, sizeof *t);
    t->name = nm;
    t->type = ggml_type;
    t->n_dims = n_dims;
    for (int d = 0; d < n_dims; d++)
        t->ne[d] = ne[d];
    t->data = data;
    t->nbytes = nbytes;
    return 0;
}

static int alignment_of(const tp_gguf_writer *w, uint64_t *out, tp_err *err)
{
    *out = DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < w->n_kv; i++) {
        const wkv *kv = &w->kv[i];
        if (strcmp(kv->key, ALIGNMENT_KEY) || kv->key_len != strlen(ALIGNMENT_KEY))
            continue;
        uint64_t a = 0;
        if (kv->type == TP_GGUF_U32 || kv->type == TP_GGUF_I32) {
            uint32_t v;
            memcpy(&v, kv->val, 4);
            a = kv->type == TP_GGUF_I32 && (int32_t)v < 0 ? 0 : v;
        } else if (kv->type == TP_GGUF_U64) {
            memcpy(&a, kv->val, 8);
        } else {
            return tp_err_set(err, TP_EINVAL, "gguf writer: %s has value type %u, expected an integer (u32)",
                              ALIGNMENT_KEY, kv->type);
        }
        if (a == 0 || a > MAX_ALIGNMENT || (a & (a - 1)))
            return tp_err_set(err, TP_EINVAL, "gguf writer: %s = %llu is not a power of two in 1..%u",
                              ALIGNMENT_KEY, (unsigned long long)a, MAX_ALIGNMENT);
        *out = a;
    }
    return 0;
}

static uint64_t pad_to(uint64_t off, uint64_t a) { return (off + a - 1) / a * a; }

typedef struct out_file {
    FILE *f;
    uint64_t off;
    int failed;
} out_file;

static void put(out_file *o, const void *p, size_t n)
{
    if (!o->failed && n && fwrite(p, 1, n, o->f) != n)
        o->failed = errno ? errno : EIO;
    o->off += n;
}

static void put_u32(out_file *o, uint32_t v) { put(o, &v, 4); }
static void put_u64(out_file *o, uint64_t v) { put(o, &v, 8); }

static void put_zeros(out_file *o, uint64_t to)
{
    static const uint8_t zeros[64];
    while (o->off < to) {
        uint64_t n = to - o->off < sizeof zeros ? to - o->off : sizeof zeros;
        put(o, zeros, (size_t)n);
    }
}

static void emit(const tp_gguf_writer *w, out_file *o, uint64_t align)
{
    put(o, "GGUF", 4);
    put_u32(o, 3);
    put_u64(o, w->n_t);
    put_u64(o, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        put_u64(o, w->kv[i].key_len);
        put(o, w->kv[i].key, w->kv[i].key_len);
        put_u32(o, w->kv[i].type);
        put(o, w->kv[i].val, w->kv[i].val_len);
    }
    uint64_t data_off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        put_u64(o, strlen(t->name));
        put(o, t->name, strlen(t->name));
        put_u32(o, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++)
            put_u64(o, t->ne[d]);
        put_u32(o, t->type);
        put_u64(o, data_off);
        data_off = pad_to(data_off + t->nbytes, align);
    }
    if (!w->n_t)
        return;
    put_zeros(o, pad_to(o->off, align));
    uint64_t start = o->off;
    for (size_t i = 0; i < w->n_t; i++) {
        put(o, w->t[i].data, w->t[i].nbytes);
        put_zeros(o, start + pad_to(o->off - start, align));
    }
}

int tp_gguf_write(tp_gguf_writer *w, const char *path, tp_err *err)
{
    uint64_t align;
    int rc = alignment_of(w, &align, err);
    if (rc)
        return rc;
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp)
        return tp_err_set(err, TP_ENOMEM, "gguf writer: out of memory");
    snprintf(tmp, plen + 16, "%s.tmp.XXXXXX", path);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        rc = tp_err_set(err, TP_EIO, "gguf writer: cannot create a temporary file beside %s: %s", path,
                        strerror(errno));
        free(tmp);
        return rc;
    }
    (void)fchmod(fd, 0644); /* mkstemp makes 0600; model files are for other users too */
    out_file o = {fdopen(fd, "wb"), 0, 0};
    if (!o.f) {
        rc = tp_err_set(err, TP_EIO, "gguf writer: cannot open %s: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        free(tmp);
        return rc;
    }
    errno = 0;
    emit(w, &o, align);
    if (fflush(o.f) && !o.failed)
        o.failed = errno ? errno : EIO;
    if (fclose(o.f) && !o.failed)
        o.failed = errno ? errno : EIO;
    if (!o.failed && rename(tmp, path))
        o.failed = errno ? errno : EIO;
    if (o.failed) {
        rc = tp_err_set(err, TP_EIO, "gguf writer: writing %s failed: %s", path, strerror(o.failed));
        unlink(tmp);
    }
    free(tmp);
    return rc;
}
