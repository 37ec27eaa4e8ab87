/* SentencePiece BPE tokenizer, the llama2.c way (see tokenizer.h).
 *
 * Pieces live in one blob. Lookups during encode go through an open-addressing
 * hash of the mergeable pieces (normal and user-defined), and merges use a
 * heap of candidate pairs, so encoding is O(n log n) instead of llama2.c's
 * O(n^2) rescans while picking exactly the same merge at every step. */
#include "tokpipe/tokenizer.h"
#include "tokpipe/heap.h"

#include "tokpipe/bpe.h"

#include <ctype.h>
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

/* Texts that mark a token as ending generation, and the end-of-turn texts
 * llama.cpp looks for when the file names no eot id (llama-vocab.cpp). */
static const char *const EOG_TEXTS[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>",
    /* fill-in-the-middle padding/repo/file separators end generation too */
    "<|fim_pad|>", "<fim-pad>", "<PAD>", "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>",
    "<|file_sep|>",
    /* gpt-oss's harmony: a final answer, a tool call */
    "<|return|>", "<|call|>",
};
static const char *const EOT_TEXTS[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>",
    "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>", /* DeepSeek */
};

struct tp_tokenizer {
    int n;
    int kind;
    int bos, eos, unk;
    bool add_bos, add_eos, add_space_prefix, rstrip_specials;
    tp_bpe *bpe;           /* byte-level BPE only */
    uint8_t *dec;          /* BPE: the raw bytes of every piece */
    int32_t *eog;          /* end-of-generation ids */
    int n_eog;
    int32_t *special;      /* control, user-defined, unknown ids, longest text first */
    int n_special;
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
    tp_bpe_free(t->bpe);
    free(t->dec);
    free(t->eog);
    free(t->special);
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
    if (type == 0) /* GGUF's "undefined" type: llama.cpp keeps such tokens out of text */
        type = TP_TOKEN_UNUSED;
    const char *s = t->blob + t->off[id];
    size_t n = t->len[id];
    t->type[id] = (uint8_t)type;
    t->bytes[id] = (const uint8_t *)s;
    t->nbytes[id] = (uint32_t)n;
    switch (type) {
    case TP_TOKEN_NORMAL:
    case TP_TOKEN_USER_DEFINED:
        if (t->kind == TP_TOKENIZER_SPM)
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
        if (t->kind == TP_TOKENIZER_BPE) { /* no byte tokens in byte-level BPE: renders as nothing */
            t->nbytes[id] = 0;
            return 0;
        }
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

static bool piece_is(const tp_vocab_spec *v, int id, const char *text)
{
    size_t n = strlen(text);
    return v->lens[id] == n && !memcmp(v->pieces[id], text, n);
}

static bool has_id(const int32_t *ids, int n, int32_t id)
{
    for (int i = 0; i < n; i++)
        if (ids[i] == id)
            return true;
    return false;
}

/* A harmony vocabulary (gpt-oss: <|return|>, <|call|> and <|end|> end a
 * turn): as llama.cpp's load_vocab does, <|end|> ends a message, not the
 * generation (the analysis channel ends with it, then the answer comes),
 * and it and the frame's other tokens (<|channel|>, <|message|>,
 * <|start|>, <|constrain|>) render as their text, user-defined, for the
 * splitter (workers/toolcall/harmony.c) to read. */
static void harmony_frame(tp_tokenizer *t, const tp_vocab_spec *v)
{
    int end = -1, ret = -1, call = -1;
    for (int i = 0; i < t->n_eog; i++) {
        int id = t->eog[i];
        end = piece_is(v, id, "<|end|>") ? id : end;
        ret = piece_is(v, id, "<|return|>") ? id : ret;
        call = piece_is(v, id, "<|call|>") ? id : call;
    }
    if (end < 0 || ret < 0 || call < 0 || end == t->eos)
        return;
    int k = 0;
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] != end)
            t->eog[k++] = t->eog[i];
    t->n_eog = k;
    static const char *const frame[] = {"<|end|>", "<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"};
    for (int id = 0; id < t->n; id++)
        for (size_t f = 0; f < sizeof frame / sizeof frame[0]; f++)
            if (piece_is(v, id, frame[f])) {
                t->type[id] = TP_TOKEN_USER_DEFINED;
                t->bytes[id] = (const uint8_t *)(t->blob + t->off[id]);
                t->nbytes[id] = t->len[id];
            }
}

/* The end-of-generation set, as llama.cpp builds it: eos, eot (named or
 * found by text), eom, and every token whose text marks an end of turn;
 * those text-found tokens become control tokens whatever the file says. */
static int build_eog(tp_tokenizer *t, const tp_vocab_spec *v, tp_err *err)
{
    const size_t n_texts = sizeof EOG_TEXTS / sizeof EOG_TEXTS[0];
    int eot = v->eot_id;
    for (int id = 0; eot < 0 && id < t->n; id++)
        for (size_t k = 0; k < sizeof EOT_TEXTS / sizeof EOT_TEXTS[0]; k++)
            if (piece_is(v, id, EOT_TEXTS[k]))
                eot = id;
    t->eog = malloc(sizeof *t->eog * (3 + n_texts));
    if (!t->eog)
        return tp_err_set(err, TP_ENOMEM, "tokenizer: out of memory");
    int named[3] = {t->eos, eot, v->eom_id};
    for (int i = 0; i < 3; i++)
        if (named[i] >= 0 && named[i] < t->n && !has_id(t->eog, t->n_eog, named[i]))
            t->eog[t->n_eog++] = named[i];
    for (int id = 0; id < t->n && (size_t)t->n_eog < 3 + n_texts; id++) {
        for (size_t k = 0; k < n_texts; k++) {
            if (!piece_is(v, id, EOG_TEXTS[k]))
                continue;
            if (!has_id(t->eog, t->n_eog, id))
                t->eog[t->n_eog++] = id;
            break;
        }
    }
    harmony_frame(t, v);
    for (int i = 0; i < t->n_eog; i++)
        if (t->type[t->eog[i]] == TP_TOKEN_NORMAL || t->type[t->eog[i]] == TP_TOKEN_USER_DEFINED) {
            t->type[t->eog[i]] = TP_TOKEN_CONTROL;
            t->nbytes[t->eog[i]] = 0;
        }
    return 0;
}

static bool is_special_type(int ty)
{
    return ty == TP_TOKEN_CONTROL || ty == TP_TOKEN_USER_DEFINED || ty == TP_TOKEN_UNKNOWN;
}

struct len_id {
    uint32_t len;
    int32_t id;
};

static int longest_first(const void *pa, const void *pb)
{
    const struct len_id *a = pa, *b = pb;
    if (a->len != b->len)
        return a->len > b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

/* Special tokens in the order they are cut out of text: longest first,
 * then by id. */
static int build_specials(tp_tokenizer *t, tp_err *err)
{
    struct len_id *v = malloc(sizeof *v * (size_t)t->n);
    t->special = malloc(sizeof *t->special * (size_t)t->n);
    if (!v || !t->special) {
        free(v);
        return tp_err_set(err, TP_ENOMEM, "tokenizer: out of memory");
    }
    int n = 0;
    for (int id = 0; id < t->n; id++)
        if (is_special_type(t->type[id]) && t->len[id] > 0)
            v[n++] = (struct len_id){t->len[id], id};
    qsort(v, (size_t)n, sizeof *v, longest_first);
    for (int i = 0; i < n; i++)
        t->special[i] = v[i].id;
    t->n_special = n;
    free(v);
    return 0;
}

static int build_bpe(tp_tokenizer *t, const tp_vocab_spec *v, size_t total, tp_err *err)
{
    const char *pre = v->pre ? v->pre : "default";
    size_t pre_len = v->pre ? v->pre_len : strlen("default");
    int rc = tp_bpe_new(v->pieces, v->lens, v->n, v->merges, v->merge_lens, v->n_merges, pre, pre_len,
                        &t->bpe, err);
    if (rc)
        return rc;
    t->dec = malloc(total ? total : 1);
    if (!t->dec)
        return tp_err_set(err, TP_ENOMEM, "tokenizer: out of memory");
    size_t pos = 0;
    for (int i = 0; i < t->n; i++) {
        if (t->type[i] != TP_TOKEN_NORMAL)
            continue;
        /* the alphabet maps each character to one byte: never longer */
        t->nbytes[i] = (uint32_t)tp_bpe_unmap(t->blob + t->off[i], t->len[i], t->dec + pos);
        t->bytes[i] = t->dec + pos;
        pos += t->nbytes[i];
    }
    return 0;
}

static int build(const tp_vocab_spec *v, bool meta_space, tp_tokenizer **out, tp_err *err)
{
    *out = NULL;
    int n = v->n;
    int rc = check_vocab_args(v->lens, n, v->bos_id, v->eos_id, err);
    if (rc)
        return rc;
    if (v->kind != TP_TOKENIZER_SPM && v->kind != TP_TOKENIZER_BPE)
        return tp_err_set(err, TP_EINVAL, "tokenizer: unknown kind %d", v->kind);
    if (v->unk_id < -1 || v->unk_id >= n || v->eot_id < -1 || v->eot_id >= n || v->eom_id < -1 ||
        v->eom_id >= n)
        return tp_err_set(err, TP_ERANGE, "unk/eot/eom ids %d/%d/%d are not in [-1, %d)", v->unk_id,
                          v->eot_id, v->eom_id, n);
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += v->lens[i];
    tp_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return tp_err_set(err, TP_ENOMEM, "tokenizer: out of memory");
    t->n = n;
    t->kind = v->kind;
    t->bos = v->bos_id;
    t->eos = v->eos_id;
    t->unk = -1;
    bool spm = v->kind == TP_TOKENIZER_SPM;
    t->add_bos = v->add_bos >= 0 ? v->add_bos : spm;
    t->add_eos = v->add_eos >= 0 ? v->add_eos : false;
    t->add_space_prefix = spm && v->add_space_prefix != 0;
    t->rstrip_specials = v->rstrip_specials;
    for (int c = 0; c < 256; c++) {
        t->byte_id[c] = -1;
        t->byte_val[c] = (uint8_t)c;
    }
    rc = alloc_arrays(t, n, total, err);
    size_t pos = 0;
    for (int i = 0; !rc && i < n; i++) {
        t->off[i] = (uint32_t)pos;
        t->len[i] = (uint32_t)copy_piece(t->blob + pos, v->pieces[i], v->lens[i], meta_space && spm);
        pos += t->len[i];
        if (t->len[i] > t->max_piece)
            t->max_piece = t->len[i];
        t->score[i] = v->scores ? v->scores[i] : 0.0f;
    }
    for (int i = 0; !rc && i < n; i++) {
        int type = v->types ? v->types[i]
                   : spm    ? infer_type(t->blob + t->off[i], t->len[i], i, t->bos, t->eos)
                            : TP_TOKEN_NORMAL;
        rc = classify(t, i, type, err);
    }
    if (!rc && v->unk_id >= 0 && t->unk < 0)
        t->unk = v->unk_id;
    if (!rc)
        rc = build_eog(t, v, err);
    if (!rc && !spm)
        rc = build_bpe(t, v, total, err);
    if (!rc)
        rc = build_specials(t, err);
    if (!rc && (t->add_bos && t->bos < 0))
        rc = tp_err_set(err, TP_EFORMAT, "tokenizer.ggml.add_bos_token is set but there is no BOS id");
    if (!rc && (t->add_eos && t->eos < 0))
        rc = tp_err_set(err, TP_EFORMAT, "tokenizer.ggml.add_eos_token is set but there is no EOS id");
    if (rc) {
        tp_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int tp_tokenizer_new(const tp_vocab_spec *v, tp_tokenizer **out, tp_err *err)
{
    if (!v || !v->pieces || !v->lens || !out)
        return tp_err_set(err, TP_EINVAL, "tokenizer: spec, pieces, lens and out must not be NULL");
    return build(v, true, out, err);
}

static tp_vocab_spec spm_spec(const char *const *pieces, const size_t *lens, const float *scores,
                              const int32_t *types, int n, int bos_id, int eos_id)
{
    return (tp_vocab_spec){.kind = TP_TOKENIZER_SPM, .n = n, .pieces = pieces, .lens = lens,
                           .scores = scores, .types = types, .bos_id = bos_id, .eos_id = eos_id,
                           .unk_id = -1, .eot_id = -1, .eom_id = -1, .add_bos = -1,
                           .add_eos = -1, .add_space_prefix = -1};
}

int tp_tokenizer_from_vocab(const char *const *pieces, const size_t *lens, const float *scores,
                            const int32_t *types, int n, int bos_id, int eos_id,
                            tp_tokenizer **out, tp_err *err)
{
    if (!pieces || !lens || !out)
        return tp_err_set(err, TP_EINVAL, "tokenizer: pieces, lens and out must not be NULL");
    tp_vocab_spec v = spm_spec(pieces, lens, scores, types, n, bos_id, eos_id);
    return build(&v, true, out, err);
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
    tp_vocab_spec v = spm_spec(pieces, lens, scores, NULL, n, 1, 2);
    if (!rc)
        rc = build(&v, false, out, err);
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
int tp_tokenizer_kind(const tp_tokenizer *t) { return t->kind; }
bool tp_tokenizer_add_bos(const tp_tokenizer *t) { return t->add_bos; }
bool tp_tokenizer_add_eos(const tp_tokenizer *t) { return t->add_eos; }

int tp_tokenizer_eog_ids(const tp_tokenizer *t, const int32_t **ids)
{
    *ids = t->eog;
    return t->n_eog;
}

int tp_tokenizer_merge_eog(const tp_tokenizer *t, const int *ids, int n, int *out, int cap)
{
    int k = 0;
    for (int i = 0; i < n && k < cap; i++)
        if (!has_id((const int32_t *)out, k, ids[i]))
            out[k++] = ids[i];
    for (int i = 0; t && i < t->n_eog && k < cap; i++)
        if (!has_id((const int32_t *)out, k, t->eog[i]))
            out[k++] = t->eog[i];
    return k;
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

int tp_tokenizer_control_id(const tp_tokenizer *t, const char *text, size_t len)
{
    for (int i = 0; len && i < t->n_special; i++) {
        int id = t->special[i];
        if (t->type[id] == TP_TOKEN_USER_DEFINED)
            continue;
        const char *p = t->blob + t->off[id];
        size_t n = t->len[id];
        while (n && is_ws(*p))
            p++, n--;
        while (n && is_ws(p[n - 1]))
            n--;
        if (n == len && !memcmp(p, text, len))
            return id;
    }
    return -1;
}

size_t tp_tokenizer_max_ids(size_t len)
{
    /* SentencePiece: one id per byte plus a dummy-prefix space after each
     * special token (at most one per byte); BOS and EOS */
    return 2 * len + 3;
}

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
    if (text && t->kind == TP_TOKENIZER_SPM && prev_id == t->bos && prev_id >= 0 && n > 0 && b[0] == ' ') {
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

TP_HEAP_DEFINE(static, pairs, struct pair, pair_before, const struct sym *)

static void try_pair(struct enc *e, int l, int r)
{
    if (l < 0 || r < 0 || e->sym[l].id < 0 || e->sym[r].id < 0)
        return;
    size_t n = e->sym[l].len + e->sym[r].len;
    int id = lookup(e->t, e->w + e->sym[l].start, n);
    if (id < 0 || !(e->t->score[id] > TOK_MERGE_FLOOR))
        return;
    pairs_push(e->heap, &e->nheap, (struct pair){e->t->score[id], l, r, id, e->sym[l].len, e->sym[r].len}, e->sym);
}

/* Split w into code points the way llama2.c does: a lead byte plus up to
 * three continuation bytes (invalid UTF-8 just groups the same way). With
 * a dummy prefix, w[0] is that space: a symbol of its own, as llama2.c
 * pushes it as a token before looking at the text. */
static int split_symbols(struct enc *e, size_t n, bool prefix)
{
    int ns = 0;
    size_t i = 0;
    if (prefix) {
        e->sym[0] = (struct sym){0, 1, -1, 1, lookup(e->t, e->w, 1)};
        ns = 1;
        i = 1;
    }
    while (i < n) {
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
        struct pair p = pairs_pop(e->heap, &e->nheap, e->sym);
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

/* SentencePiece on one piece of text (no special tokens in it). */
static int spm_encode(const tp_tokenizer *t, const char *text, size_t len, bool prefix, int *out,
                      size_t cap, size_t *n_out, tp_err *err)
{
    size_t n = len + (prefix ? 1 : 0);
    if (n == 0)
        return 0;
    struct enc e = {.t = t};
    char *w = malloc(n);
    e.sym = malloc(sizeof *e.sym * n);
    e.heap = malloc(sizeof *e.heap * 3 * n); /* n-1 initial pairs + 2 per merge */
    int rc = 0;
    if (!w || !e.sym || !e.heap) {
        rc = tp_err_set(err, TP_ENOMEM, "encode: out of memory for %zu bytes", len);
    } else {
        if (prefix)
            w[0] = ' '; /* SentencePiece's dummy prefix */
        memcpy(w + (prefix ? 1 : 0), text, len);
        e.w = w;
        int ns = split_symbols(&e, n, prefix);
        merge_all(&e, ns);
        rc = emit(&e, out, cap, n_out, err);
    }
    free(w);
    free(e.sym);
    free(e.heap);
    return rc;
}

/* A piece of the text: raw text [off, off+len) or a special token. */
struct frag {
    size_t off, len;
    int id; /* -1: raw text */
};

struct frags {
    struct frag *v;
    size_t n, cap;
};

static int frag_push(struct frags *f, struct frag x, tp_err *err)
{
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 16;
        struct frag *v = realloc(f->v, cap * sizeof *v);
        if (!v)
            return tp_err_set(err, TP_ENOMEM, "encode: out of memory");
        f->v = v;
        f->cap = cap;
    }
    f->v[f->n++] = x;
    return 0;
}

/* Phi-3 (rstrip_specials): llama.cpp strips the whitespace after its
 * special tokens except after these. */
static bool rstrips(const tp_tokenizer *t, int id)
{
    static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
    if (!t->rstrip_specials)
        return false;
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++)
        if (t->len[id] == strlen(keep[i]) && !memcmp(t->blob + t->off[id], keep[i], t->len[id]))
            return false;
    return true;
}

/* Cut every occurrence of special token id out of the raw pieces of *cur
 * (leftmost first), as llama.cpp's tokenizer_st_partition does. */
static int cut_special(const tp_tokenizer *t, const char *text, int id, struct frags *cur,
                       struct frags *next, tp_err *err)
{
    const char *tok = t->blob + t->off[id];
    size_t tl = t->len[id];
    bool rstrip = rstrips(t, id);
    next->n = 0;
    int rc = 0;
    for (size_t i = 0; !rc && i < cur->n; i++) {
        struct frag f = cur->v[i];
        if (f.id >= 0 || f.len < tl) {
            rc = frag_push(next, f, err);
            continue;
        }
        size_t pos = f.off, end = f.off + f.len;
        while (!rc && pos < end) {
            const char *hit = memmem(text + pos, end - pos, tok, tl);
            if (!hit) {
                rc = frag_push(next, (struct frag){pos, end - pos, -1}, err);
                break;
            }
            size_t at = (size_t)(hit - text);
            if (at > pos)
                rc = frag_push(next, (struct frag){pos, at - pos, -1}, err);
            if (!rc)
                rc = frag_push(next, (struct frag){at, tl, id}, err);
            pos = at + tl;
            if (rstrip)
                while (pos < end && isspace((unsigned char)text[pos]))
                    pos++;
        }
    }
    struct frags tmp = *cur;
    *cur = *next;
    *next = tmp;
    return rc;
}

static int partition(const tp_tokenizer *t, const char *text, size_t len, bool parse_special,
                     struct frags *out, tp_err *err)
{
    struct frags spare = {0};
    int rc = frag_push(out, (struct frag){0, len, -1}, err);
    bool present[256] = {false};
    for (size_t i = 0; i < len; i++)
        present[(uint8_t)text[i]] = true;
    for (int i = 0; !rc && i < t->n_special; i++) {
        int id = t->special[i];
        if (!parse_special && t->type[id] != TP_TOKEN_USER_DEFINED)
            continue;
        if (t->len[id] > len || !present[(uint8_t)t->blob[t->off[id]]])
            continue;
        rc = cut_special(t, text, id, out, &spare, err);
    }
    free(spare.v);
    return rc;
}

static int emit_id(int id, int *out, size_t cap, size_t *n_out, tp_err *err)
{
    if (*n_out >= cap)
        return tp_err_set(err, TP_ERANGE, "encode: more than %zu tokens", cap);
    out[(*n_out)++] = id;
    return 0;
}

int tp_tokenizer_encode_ex(const tp_tokenizer *t, const char *text, size_t len, unsigned flags,
                           int *out, size_t cap, size_t *n_out, tp_err *err)
{
    *n_out = 0;
    if (flags & TP_ENCODE_ADD_SPECIAL) {
        if (t->add_bos)
            flags |= TP_ENCODE_BOS;
        if (t->add_eos)
            flags |= TP_ENCODE_EOS;
    }
    if ((flags & TP_ENCODE_BOS) && t->bos < 0)
        return tp_err_set(err, TP_EINVAL, "encode: BOS requested but vocabulary has none");
    if ((flags & TP_ENCODE_EOS) && t->eos < 0)
        return tp_err_set(err, TP_EINVAL, "encode: EOS requested but vocabulary has none");
    if (len && (!text || len > TOK_MAX_FILE))
        return tp_err_set(err, TP_EINVAL, "encode: text is NULL or longer than %zu", TOK_MAX_FILE);
    int rc = 0;
    if (flags & TP_ENCODE_BOS)
        rc = emit_id(t->bos, out, cap, n_out, err);
    struct frags fr = {0};
    if (!rc && len)
        rc = partition(t, text, len, (flags & TP_ENCODE_SPECIAL) != 0, &fr, err);
    bool prev_special = true; /* the first piece gets the dummy prefix */
    for (size_t i = 0; !rc && i < fr.n; i++) {
        const struct frag *f = &fr.v[i];
        if (f->id >= 0) {
            rc = emit_id(f->id, out, cap, n_out, err);
            prev_special = true;
        } else if (t->kind == TP_TOKENIZER_BPE) {
            rc = tp_bpe_encode(t->bpe, text + f->off, f->len, out, cap, n_out, err);
            if (rc == TP_EINVAL && err) { /* make the offset one in the whole text */
                char msg[TP_ERR_MSG_MAX];
                snprintf(msg, sizeof msg, "%.400s (in the piece at byte %zu)", err->msg, f->off);
                tp_err_set(err, rc, "%s", msg);
            }
            prev_special = false;
        } else {
            rc = spm_encode(t, text + f->off, f->len, t->add_space_prefix && prev_special, out, cap,
                            n_out, err);
            prev_special = false;
        }
    }
    free(fr.v);
    if (!rc && (flags & TP_ENCODE_EOS))
        rc = emit_id(t->eos, out, cap, n_out, err);
    return rc;
}

int tp_tokenizer_encode(const tp_tokenizer *t, const char *text, size_t len, bool add_bos,
                        int *out, size_t cap, size_t *n_out, tp_err *err)
{
    return tp_tokenizer_encode_ex(t, text, len, add_bos ? TP_ENCODE_BOS : 0, out, cap, n_out, err);
}
