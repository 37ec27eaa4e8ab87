/* SentencePiece BPE tokenizer, the llama2.c way (see tokenizer.h).
 *
 * Pieces live in one blob. Lookups during encode go through an open-addressing
 * hash of the mergeable pieces (normal and user-defined), and merges use a
 * heap of candidate pairs, so encoding is O(n log n) instead of llama2.c's
 * O(n^2) rescans while picking exactly the same merge at every step. */
#include "tokpipe/tokenizer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Limits that keep a hostile file from asking for absurd allocations. */
#define TOK_MAX_VOCAB (1 << 22)
#define TOK_MAX_PIECE 65536
#define TOK_MAX_FILE ((size_t)1 << 30)

/* llama2.c starts its best-score search at -1e10, so a pair whose piece
 * scores at or below that (or NaN) is never merged. */
#define TOK_MERGE_FLOOR -1e10f

struct tp_tokenizer {
    int n;
    int bos, eos, unk;
    size_t max_piece;
    char *blob;
    uint32_t *off, *len;
    float *score;
    uint8_t *type;
    const uint8_t **bytes; /* per id: what the token adds to text */
    uint32_t *nbytes;
    int32_t byte_id[256]; /* raw byte -> its <0xNN> token, -1 if none */
    uint8_t byte_val[256];
    int32_t *slots; /* hash of mergeable pieces -> id, -1 empty */
    uint32_t mask;
};

static uint32_t hash_bytes(const char *s, size_t n)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

static int lookup(const tp_tokenizer *t, const char *s, size_t n)
{
    if (n == 0 || n > t->max_piece)
        return -1;
    for (uint32_t i = hash_bytes(s, n) & t->mask;; i = (i + 1) & t->mask) {
        int32_t id = t->slots[i];
        if (id < 0)
            return -1;
        if (t->len[id] == n && memcmp(t->blob + t->off[id], s, n) == 0)
            return id;
    }
}

static void hash_insert(tp_tokenizer *t, int id)
{
    const char *s = t->blob + t->off[id];
    size_t n = t->len[id];
    if (n == 0 || lookup(t, s, n) >= 0)
        return; /* duplicates: the lowest id wins */
    uint32_t i = hash_bytes(s, n) & t->mask;
    while (t->slots[i] >= 0)
        i = (i + 1) & t->mask;
    t->slots[i] = id;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* "<0xNN>" -> NN, else -1. */
static int parse_byte_piece(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    int hi = hexval(s[3]), lo = hexval(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* Copy a piece into dst, turning U+2581 (E2 96 81) into ' ' if asked;
 * returns the bytes written. */
static size_t copy_piece(char *dst, const char *src, size_t n, bool meta_space)
{
    if (!meta_space) {
        memcpy(dst, src, n);
        return n;
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (i + 2 < n && (uint8_t)src[i] == 0xE2 && (uint8_t)src[i + 1] == 0x96 &&
            (uint8_t)src[i + 2] == 0x81) {
            dst[o++] = ' ';
            i += 2;
        } else {
            dst[o++] = src[i];
        }
    }
    return o;
}

static int infer_type(const char *s, size_t n, int id, int bos, int eos)
{
    if (id == 0)
        return TP_TOKEN_UNKNOWN;
    if (id == bos || id == eos)
        return TP_TOKEN_CONTROL;
    return parse_byte_piece(s, n) >= 0 ? TP_TOKEN_BYTE : TP_TOKEN_NORMAL;
}

void tp_tokenizer_free(tp_tokenizer *t)
{
    if (!t)
        return;
    free(t->blob);
    free(t->off);
    free(t->len);
    free(t->score);
    free(t->type);
    free(t->bytes);
    free(t->nbytes);
    free(t->slots);
    free(t);
}

static int alloc_arrays(tp_tokenizer *t, int n, size_t blob_size, tp_err *err)
{
    uint32_t cap = 16;
    while (cap < 2u * (uint32_t)n)
        cap *= 2;
    t->mask = cap - 1;
    t->blob = malloc(blob_size ? blob_size : 1);
    t->off = malloc(sizeof *t->off * n);
    t->len = malloc(sizeof *t->len * n);
    t->score = malloc(sizeof *t->score * n);
    t->type = malloc(n);
    t->bytes = malloc(sizeof *t->bytes * n);
    t->nbytes = malloc(sizeof *t->nbytes * n);
    t->slots = malloc(sizeof *t->slots * cap);
    if (!t->blob || !t->off || !t->len || !t->score || !t->type || !t->bytes || !t->nbytes ||
        !t->slots)
        return tp_err_set(err, TP_ENOMEM, "tokenizer: out of memory for %d tokens", n);
    memset(t->slots, 0xff, sizeof *t->slots * cap);
    return 0;
}

/* Fill type, byte table and per-id output bytes for token id. */
static int classify(tp_tokenizer *t, int id, int type, tp_err *err)
{
    const char *s = t->blob + t->off[id];
    size_t n = t->len[id];
    t->type[id] = (uint8_t)type;
    t->bytes[id] = (const uint8_t *)s;
    t->nbytes[id] = (uint32_t)n;
    switch (type) {
    case TP_TOKEN_NORMAL:
    case TP_TOKEN_USER_DEFINED:
        hash_insert(t, id);
        return 0;
    case TP_TOKEN_UNKNOWN:
        if (t->unk < 0)
            t->unk = id;
        /* fall through */
    case TP_TOKEN_CONTROL:
    case TP_TOKEN_UNUSED:
        t->nbytes[id] = 0;
        return 0;
    case TP_TOKEN_BYTE: {
        int v = parse_byte_piece(s, n);
        if (v < 0)
            return tp_err_set(err, TP_EFORMAT,
                              "token %d has type byte but its piece '%.*s' is not <0xNN>", id,
                              (int)(n > 16 ? 16 : n), s);
        if (t->byte_id[v] < 0)
            t->byte_id[v] = id;
        t->bytes[id] = &t->byte_val[v];
        t->nbytes[id] = 1;
        return 0;
    }
    default:
        return tp_err_set(err, TP_EFORMAT, "token %d has unknown token type %d", id, type);
    }
}

static int check_vocab_args(const size_t *lens, int n, int bos, int eos, tp_err *err)
{
    if (n < 1 || n > TOK_MAX_VOCAB)
        return tp_err_set(err, TP_ERANGE, "vocab size %d is not in [1, %d]", n, TOK_MAX_VOCAB);
    if (bos < -1 || bos >= n)
        return tp_err_set(err, TP_ERANGE, "bos id %d is not in [-1, %d)", bos, n);
    if (eos < -1 || eos >= n)
        return tp_err_set(err, TP_ERANGE, "eos id %d is not in [-1, %d)", eos, n);
    for (int i = 0; i < n; i++)
        if (lens[i] > TOK_MAX_PIECE)
            return tp_err_set(err, TP_ERANGE, "token %d: piece length %zu exceeds the limit %d",
                              i, lens[i], TOK_MAX_PIECE);
    return 0;
}

static int build(const char *const *pieces, const size_t *lens, const float *scores,
                 const int32_t *types, int n, int bos, int eos, bool meta_space,
                 tp_tokenizer **out, tp_err *err)
{
    *out = NULL;
    int rc = check_vocab_args(lens, n, bos, eos, err);
    if (rc)
        return rc;
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += lens[i];
    tp_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return tp_err_set(err, TP_ENOMEM, "tokenizer: out of memory");
    t->n = n;
    t->bos = bos;
    t->eos = eos;
    t->unk = -1;
    for (int v = 0; v < 256; v++) {
        t->byte_id[v] = -1;
        t->byte_val[v] = (uint8_t)v;
    }
    rc = alloc_arrays(t, n, total, err);
    size_t pos = 0;
    for (int i = 0; !rc && i < n; i++) {
        t->off[i] = (uint32_t)pos;
        t->len[i] = (uint32_t)copy_piece(t->blob + pos, pieces[i], lens[i], meta_space);
        pos += t->len[i];
        if (t->len[i] > t->max_piece)
            t->max_piece = t->len[i];
        t->score[i] = scores ? scores[i] : 0.0f;
    }
    for (int i = 0; !rc && i < n; i++) {
        int type = types ? types[i]
                         : infer_type(t->blob + t->off[i], t->len[i], i, bos, eos);
        rc = classify(t, i, type, err);
    }
    if (rc) {
        tp_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int tp_tokenizer_from_vocab(const char *const *pieces, const size_t *lens, const float *scores,
                            const int32_t *types, int n, int bos_id, int eos_id,
                            tp_tokenizer **out, tp_err *err)
{
    if (!pieces || !lens || !out)
        return tp_err_set(err, TP_EINVAL, "tokenizer: pieces, lens and out must not be NULL");
    return build(pieces, lens, scores, types, n, bos_id, eos_id, true, out, err);
}

static int32_t rd_i32(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4); /* tokenizer.bin is little endian, as is every host we build for */
    return v;
}

/* Walk the token records: count them (vocab_size 0) or check there are
 * exactly vocab_size, and fill pieces/lens/scores if given. */
static int scan_records(const uint8_t *d, size_t size, int max_len, int vocab_size, int *count,
                        const char **pieces, size_t *lens, float *scores, tp_err *err)
{
    size_t off = 4;
    int i = 0;
    for (; vocab_size ? i < vocab_size : off < size; i++) {
        if (i >= TOK_MAX_VOCAB)
            return tp_err_set(err, TP_ERANGE, "more than %d tokens in file", TOK_MAX_VOCAB);
        if (size - off < 8)
            return tp_err_set(err, TP_EFORMAT,
                              "token %d: record at offset %zu truncated (file is %zu bytes; "
                              "vocab_size %d)", i, off, size, vocab_size);
        int32_t n = rd_i32(d + off + 4);
        if (n < 0 || n > max_len)
            return tp_err_set(err, TP_EFORMAT,
                              "token %d: length %d at offset %zu is outside [0, max_token_length "
                              "%d]", i, (int)n, off + 4, max_len);
        if (size - off - 8 < (size_t)n)
            return tp_err_set(err, TP_EFORMAT,
                              "token %d: %d-byte piece at offset %zu runs past the end of the "
                              "file (%zu bytes)", i, (int)n, off + 8, size);
        if (pieces) {
            memcpy(&scores[i], d + off, 4);
            lens[i] = (size_t)n;
            pieces[i] = (const char *)d + off + 8;
        }
        off += 8 + (size_t)n;
    }
    if (off != size)
        return tp_err_set(err, TP_EFORMAT,
                          "%zu trailing bytes at offset %zu after %d tokens (vocab_size mismatch?)",
                          size - off, off, i);
    *count = i;
    return 0;
}

int tp_tokenizer_load_mem(const void *data, size_t size, int vocab_size, tp_tokenizer **out,
                          tp_err *err)
{
    if (!out || (!data && size))
        return tp_err_set(err, TP_EINVAL, "tokenizer: data and out must not be NULL");
    *out = NULL;
    const uint8_t *d = data;
    if (vocab_size < 0 || vocab_size > TOK_MAX_VOCAB)
        return tp_err_set(err, TP_ERANGE, "vocab_size %d is not in [0, %d]", vocab_size,
                          TOK_MAX_VOCAB);
    if (size < 4)
        return tp_err_set(err, TP_EFORMAT,
                          "file is %zu bytes, too short for the max_token_length header", size);
    int32_t max_len = rd_i32(d);
    if (max_len < 1 || max_len > TOK_MAX_PIECE)
        return tp_err_set(err, TP_EFORMAT, "max_token_length %d at offset 0 is not in [1, %d]",
                          (int)max_len, TOK_MAX_PIECE);
    int n = 0;
    int rc = scan_records(d, size, max_len, vocab_size, &n, NULL, NULL, NULL, err);
    if (rc)
        return rc;
    if (n < 3)
        return tp_err_set(err, TP_EFORMAT,
                          "file has %d tokens; need at least 3 (unknown, BOS, EOS)", n);
    const char **pieces = malloc(sizeof *pieces * n);
    size_t *lens = malloc(sizeof *lens * n);
    float *scores = malloc(sizeof *scores * n);
    if (!pieces || !lens || !scores)
        rc = tp_err_set(err, TP_ENOMEM, "tokenizer: out of memory for %d tokens", n);
    if (!rc)
        rc = scan_records(d, size, max_len, n, &n, pieces, lens, scores, err);
    if (!rc)
        rc = build(pieces, lens, scores, NULL, n, 1, 2, false, out, err);
    free(pieces);
    free(lens);
    free(scores);
    return rc;
}

static int read_file(const char *path, uint8_t **data, size_t *size, tp_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return tp_err_set(err, TP_EIO, "%s: %s", path, strerror(errno));
    uint8_t *buf = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? cap * 2 : 65536;
            if (cap > TOK_MAX_FILE) {
                rc = tp_err_set(err, TP_ERANGE, "%s: larger than %zu bytes", path, TOK_MAX_FILE);
                break;
            }
            uint8_t *nb = realloc(buf, cap);
            if (!nb) {
                rc = tp_err_set(err, TP_ENOMEM, "%s: out of memory", path);
                break;
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f))
                rc = tp_err_set(err, TP_EIO, "%s: read error", path);
            break;
        }
    }
    fclose(f);
    if (rc) {
        free(buf);
        return rc;
    }
    *data = buf;
    *size = n;
    return 0;
}

int tp_tokenizer_load(const char *path, int vocab_size, tp_tokenizer **out, tp_err *err)
{
    if (!path || !out)
        return tp_err_set(err, TP_EINVAL, "tokenizer: path and out must not be NULL");
    *out = NULL;
    uint8_t *data = NULL;
    size_t size = 0;
    int rc = read_file(path, &data, &size, err);
    if (rc)
        return rc;
    rc = tp_tokenizer_load_mem(data, size, vocab_size, out, err);
    free(data);
    if (rc && err) {
        char msg[TP_ERR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", err->msg);
        tp_err_set(err, rc, "%s: %s", path, msg);
    }
    return rc;
}

int tp_tokenizer_vocab_size(const tp_tokenizer *t) { return t->n; }
int tp_tokenizer_bos_id(const tp_tokenizer *t) { return t->bos; }
int tp_tokenizer_eos_id(const tp_tokenizer *t) { return t->eos; }
int tp_tokenizer_unk_id(const tp_tokenizer *t) { return t->unk; }

float tp_tokenizer_score(const tp_tokenizer *t, int id)
{
    return id >= 0 && id < t->n ? t->score[id] : 0.0f;
}

int tp_tokenizer_token_type(const tp_tokenizer *t, int id)
{
    return id >= 0 && id < t->n ? t->type[id] : 0;
}

const char *tp_tokenizer_piece(const tp_tokenizer *t, int id, size_t *len)
{
    if (id < 0 || id >= t->n) {
        *len = 0;
        return NULL;
    }
    *len = t->len[id];
    return t->blob + t->off[id];
}

const uint8_t *tp_tokenizer_token_bytes(const tp_tokenizer *t, int prev_id, int id, size_t *len)
{
    if (id < 0 || id >= t->n) {
        *len = 0;
        return NULL;
    }
    const uint8_t *b = t->bytes[id];
    size_t n = t->nbytes[id];
    bool text = t->type[id] == TP_TOKEN_NORMAL || t->type[id] == TP_TOKEN_USER_DEFINED;
    if (text && prev_id == t->bos && prev_id >= 0 && n > 0 && b[0] == ' ') {
        b++;
        n--;
    }
    *len = n;
    return b;
}

/* ---- encode ---------------------------------------------------------------
 * Symbols are contiguous spans of the working text " " + text, kept in a
 * doubly linked list. A candidate pair is valid while its left symbol still
 * links to the same right symbol with the same lengths; stale heap entries
 * are skipped when popped. The heap orders by score, then by leftmost
 * position: llama2.c's choice (first maximum in a left-to-right scan). */

struct sym {
    size_t start, len;
    int prev, next;
    int id; /* -1: not in the vocabulary, emitted as byte-fallback tokens */
};

struct pair {
    float score;
    int left, right, id;
    size_t llen, rlen;
};

struct enc {
    const tp_tokenizer *t;
    const char *w;
    struct sym *sym;
    struct pair *heap;
    size_t nheap;
};

static bool pair_before(const struct pair *a, const struct pair *b, const struct sym *sym)
{
    if (a->score != b->score)
        return a->score > b->score;
    return sym[a->left].start < sym[b->left].start;
}

static void heap_push(struct enc *e, struct pair p)
{
    size_t i = e->nheap++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!pair_before(&p, &e->heap[up], e->sym))
            break;
        e->heap[i] = e->heap[up];
        i = up;
    }
    e->heap[i] = p;
}

static struct pair heap_pop(struct enc *e)
{
    struct pair top = e->heap[0], last = e->heap[--e->nheap];
    size_t i = 0, n = e->nheap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && pair_before(&e->heap[c + 1], &e->heap[c], e->sym))
            c++;
        if (!pair_before(&e->heap[c], &last, e->sym))
            break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n)
        e->heap[i] = last;
    return top;
}

static void try_pair(struct enc *e, int l, int r)
{
    if (l < 0 || r < 0 || e->sym[l].id < 0 || e->sym[r].id < 0)
        return;
    size_t n = e->sym[l].len + e->sym[r].len;
    int id = lookup(e->t, e->w + e->sym[l].start, n);
    if (id < 0 || !(e->t->score[id] > TOK_MERGE_FLOOR))
        return;
    heap_push(e, (struct pair){e->t->score[id], l, r, id, e->sym[l].len, e->sym[r].len});
}

/* Split w into code points the way llama2.c does: a lead byte plus up to
 * three continuation bytes (invalid UTF-8 just groups the same way). */
static int split_symbols(struct enc *e, size_t n)
{
    /* The dummy prefix is a symbol of its own, as llama2.c pushes it as a
     * token before looking at the text. */
    e->sym[0] = (struct sym){0, 1, -1, 1, lookup(e->t, e->w, 1)};
    int ns = 1;
    for (size_t i = 1; i < n;) {
        size_t j = i + 1;
        while (j < n && j - i < 4 && ((uint8_t)e->w[j] & 0xC0) == 0x80)
            j++;
        e->sym[ns] = (struct sym){i, j - i, ns - 1, ns + 1, lookup(e->t, e->w + i, j - i)};
        ns++;
        i = j;
    }
    if (ns)
        e->sym[ns - 1].next = -1;
    return ns;
}

static void merge_all(struct enc *e, int ns)
{
    for (int i = 0; i + 1 < ns; i++)
        try_pair(e, i, i + 1);
    while (e->nheap) {
        struct pair p = heap_pop(e);
        struct sym *l = &e->sym[p.left], *r = &e->sym[p.right];
        if (l->next != p.right || l->len != p.llen || r->len != p.rlen || l->id < 0)
            continue;
        l->len += r->len;
        l->id = p.id;
        l->next = r->next;
        if (r->next >= 0)
            e->sym[r->next].prev = p.left;
        r->len = 0;
        r->id = -1;
        r->prev = r->next = -1;
        try_pair(e, l->prev, p.left);
        try_pair(e, p.left, l->next);
    }
}

static int emit(const struct enc *e, int *out, size_t cap, size_t *n_out, tp_err *err)
{
    const tp_tokenizer *t = e->t;
    for (int s = 0; s >= 0; s = e->sym[s].next) {
        const struct sym *y = &e->sym[s];
        for (size_t k = 0; k < (y->id >= 0 ? 1 : y->len); k++) {
            int id = y->id;
            if (id < 0) {
                id = t->byte_id[(uint8_t)e->w[y->start + k]];
                if (id < 0)
                    id = t->unk;
                if (id < 0)
                    return tp_err_set(err, TP_ENOTFOUND,
                                      "byte 0x%02X at text offset %zu has no token and the "
                                      "vocabulary has no unknown token",
                                      (uint8_t)e->w[y->start + k], y->start + k - 1);
            }
            if (*n_out >= cap)
                return tp_err_set(err, TP_ERANGE, "encode: more than %zu tokens", cap);
            out[(*n_out)++] = id;
        }
    }
    return 0;
}

int tp_tokenizer_encode(const tp_tokenizer *t, const char *text, size_t len, bool add_bos,
                        int *out, size_t cap, size_t *n_out, tp_err *err)
{
    *n_out = 0;
    if (add_bos) {
        if (t->bos < 0)
            return tp_err_set(err, TP_EINVAL, "encode: BOS requested but vocabulary has none");
        if (cap < 1)
            return tp_err_set(err, TP_ERANGE, "encode: more than %zu tokens", cap);
        out[(*n_out)++] = t->bos;
    }
    if (len == 0)
        return 0;
    if (!text || len > TOK_MAX_FILE)
        return tp_err_set(err, TP_EINVAL, "encode: text is NULL or longer than %zu", TOK_MAX_FILE);
    size_t n = len + 1;
    struct enc e = {.t = t};
    char *w = malloc(n);
    e.sym = malloc(sizeof *e.sym * n);
    e.heap = malloc(sizeof *e.heap * 3 * n); /* n-1 initial pairs + 2 per merge */
    int rc = 0;
    if (!w || !e.sym || !e.heap) {
        rc = tp_err_set(err, TP_ENOMEM, "encode: out of memory for %zu bytes", len);
    } else {
        w[0] = ' '; /* SentencePiece's dummy prefix */
        memcpy(w + 1, text, len);
        e.w = w;
        int ns = split_symbols(&e, n);
        merge_all(&e, ns);
        rc = emit(&e, out, cap, n_out, err);
    }
    free(w);
    free(e.sym);
    free(e.heap);
    return rc;
}
