/* A GGUF file's vocabulary (tokenizer.ggml.*) and the tokenizer built from
 * it (see vocab.h).
 *
 * The one reader of those keys: the model loader keeps what it reads for
 * its end ids and its tokenizer, the tools, the worker and the gateway open
 * vocabulary files here, so a new key is read in one place. */
#include "tokpipe/gguf.h"
#include "tokpipe/tokenizer.h"
#include "tokpipe/vocab.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define TOK_GGUF_MAX_VOCAB (1 << 22)

/* Optional fixed-type array of n elements: *raw NULL if the key is absent. */
static int opt_array(const tp_gguf *g, const char *key, uint32_t want_type, uint64_t n,
                     const uint8_t **raw, tp_err *err)
{
    uint32_t type;
    uint64_t count;
    *raw = NULL;
    int rc = tp_gguf_get_array(g, key, &type, &count, raw, err);
    if (rc == TP_ENOTFOUND) {
        tp_err_clear(err);
        *raw = NULL;
        return 0;
    }
    if (rc)
        return rc;
    if (type != want_type || count != n)
        return tp_err_set(err, TP_EFORMAT, "%s: %llu elements of type %u, want %llu of type %u",
                          key, (unsigned long long)count, type, (unsigned long long)n,
                          want_type);
    return 0;
}

/* An optional integer key: *present false (and no error) when absent. */
static int opt_int(const tp_gguf *g, const char *key, int64_t *v, bool *present, tp_err *err)
{
    int rc = tp_gguf_get_int(g, key, v, err);
    *present = rc == 0;
    if (rc == TP_ENOTFOUND) {
        tp_err_clear(err);
        return 0;
    }
    return rc;
}

/* Optional token id: keeps *id when absent; must be in [0, n). *given
 * (may be NULL): whether the file names it. */
static int opt_id(const tp_gguf *g, const char *key, int n, int *id, bool *given, tp_err *err)
{
    int64_t v;
    bool present;
    int rc = opt_int(g, key, &v, &present, err);
    if (given)
        *given = present;
    if (rc || !present)
        return rc;
    if (v < 0 || v >= n)
        return tp_err_set(err, TP_ERANGE, "%s = %lld is outside [0, %d)", key, (long long)v, n);
    *id = (int)v;
    return 0;
}

/* Optional bool: -1 when absent. */
static int opt_bool(const tp_gguf *g, const char *key, int *out, tp_err *err)
{
    int64_t v;
    bool present;
    int rc = opt_int(g, key, &v, &present, err);
    *out = present ? v != 0 : -1;
    return rc;
}

/* general.name naming a Phi-3 model: llama.cpp strips the spaces after its
 * special tokens (the model was trained that way). */
static bool is_phi3(const tp_gguf *g)
{
    tp_gguf_str name;
    if (tp_gguf_get_str(g, "general.name", &name, NULL))
        return false;
    char low[128];
    size_t n = name.len < sizeof low - 1 ? (size_t)name.len : sizeof low - 1;
    for (size_t i = 0; i < n; i++)
        low[i] = (char)tolower((unsigned char)name.ptr[i]);
    low[n] = '\0';
    return strstr(low, "phi-3") || strstr(low, "phi3");
}

static void arrays_free(tp_gguf_vocab *a)
{
    free(a->toks);
    free(a->merges);
    free(a->pieces);
    free(a->mpieces);
    free(a->lens);
    free(a->mlens);
    free(a->scores);
    free(a->types);
}

/* A tokenizer.ggml.model tokpipe cannot tokenize leaves kind 0: the model
 * still loads (its weights need no tokenizer); tp_gguf_vocab_tokenizer
 * refuses it by name. */
static void read_model(const tp_gguf *g, tp_gguf_vocab *a)
{
    tp_gguf_str name;
    if (tp_gguf_get_str(g, "tokenizer.ggml.model", &name, NULL))
        return;
    snprintf(a->model, sizeof a->model, "%.*s", (int)(name.len < sizeof a->model - 1 ? name.len : sizeof a->model - 1),
             name.ptr);
    if (!strcmp(a->model, "llama"))
        a->spec.kind = TP_TOKENIZER_SPM;
    else if (!strcmp(a->model, "gpt2"))
        a->spec.kind = TP_TOKENIZER_BPE;
}

static int read_merges(const tp_gguf *g, tp_gguf_vocab *a, tp_err *err)
{
    tp_vocab_spec *v = &a->spec;
    uint64_t nm = 0;
    int rc = tp_gguf_get_str_array(g, "tokenizer.ggml.merges", &a->merges, &nm, err);
    if (rc)
        return rc;
    a->mpieces = malloc(sizeof *a->mpieces * (nm ? nm : 1));
    a->mlens = malloc(sizeof *a->mlens * (nm ? nm : 1));
    if (!a->mpieces || !a->mlens)
        return tp_err_set(err, TP_ENOMEM, "out of memory for %llu merges", (unsigned long long)nm);
    for (uint64_t i = 0; i < nm; i++) {
        a->mpieces[i] = a->merges[i].ptr;
        a->mlens[i] = (size_t)a->merges[i].len;
    }
    v->merges = a->mpieces;
    v->merge_lens = a->mlens;
    v->n_merges = (size_t)nm;
    tp_gguf_str pre;
    rc = tp_gguf_get_str(g, "tokenizer.ggml.pre", &pre, err);
    if (rc == TP_ENOTFOUND) {
        tp_err_clear(err);
        return 0; /* llama.cpp's fallback: the "default" rules */
    }
    if (rc)
        return rc;
    v->pre = pre.ptr;
    v->pre_len = (size_t)pre.len;
    return 0;
}

static int read_tokens(const tp_gguf *g, tp_gguf_vocab *a, tp_err *err)
{
    tp_vocab_spec *v = &a->spec;
    uint64_t n = 0;
    int rc = tp_gguf_get_str_array(g, "tokenizer.ggml.tokens", &a->toks, &n, err);
    if (rc)
        return rc;
    if (n == 0 || n > TOK_GGUF_MAX_VOCAB)
        return tp_err_set(err, TP_ERANGE, "tokenizer.ggml.tokens has %llu entries, want 1..%d",
                          (unsigned long long)n, TOK_GGUF_MAX_VOCAB);
    const uint8_t *scores_raw, *types_raw;
    rc = opt_array(g, "tokenizer.ggml.scores", TP_GGUF_F32, n, &scores_raw, err);
    if (!rc)
        rc = opt_array(g, "tokenizer.ggml.token_type", TP_GGUF_I32, n, &types_raw, err);
    if (rc)
        return rc;
    a->pieces = malloc(sizeof *a->pieces * n);
    a->lens = malloc(sizeof *a->lens * n);
    a->scores = scores_raw ? malloc(sizeof *a->scores * n) : NULL;
    a->types = types_raw ? malloc(sizeof *a->types * n) : NULL;
    if (!a->pieces || !a->lens || (scores_raw && !a->scores) || (types_raw && !a->types))
        return tp_err_set(err, TP_ENOMEM, "out of memory for %llu tokens", (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++) {
        a->pieces[i] = a->toks[i].ptr;
        a->lens[i] = (size_t)a->toks[i].len;
    }
    if (scores_raw) /* the raw arrays may be unaligned */
        memcpy(a->scores, scores_raw, sizeof *a->scores * n);
    if (types_raw)
        memcpy(a->types, types_raw, sizeof *a->types * n);
    v->n = (int)n;
    v->pieces = a->pieces;
    v->lens = a->lens;
    v->scores = a->scores;
    v->types = a->types;
    return 0;
}

static int read_ids(const tp_gguf *g, tp_gguf_vocab *a, tp_err *err)
{
    tp_vocab_spec *v = &a->spec;
    bool spm = v->kind == TP_TOKENIZER_SPM;
    /* llama.cpp's defaults for SentencePiece files: BOS 1, EOS 2, UNK 0 */
    v->bos_id = spm && v->n > 1 ? 1 : -1;
    v->eos_id = spm && v->n > 2 ? 2 : -1;
    v->unk_id = spm ? 0 : -1;
    v->eot_id = v->eom_id = -1;
    int rc = opt_id(g, "tokenizer.ggml.bos_token_id", v->n, &v->bos_id, &a->bos_given, err);
    if (!rc)
        rc = opt_id(g, "tokenizer.ggml.eos_token_id", v->n, &v->eos_id, NULL, err);
    if (!rc)
        rc = opt_id(g, "tokenizer.ggml.unknown_token_id", v->n, &v->unk_id, NULL, err);
    if (!rc)
        rc = opt_id(g, "tokenizer.ggml.eot_token_id", v->n, &v->eot_id, NULL, err);
    if (!rc)
        rc = opt_id(g, "tokenizer.ggml.eom_token_id", v->n, &v->eom_id, NULL, err);
    if (!rc)
        rc = opt_bool(g, "tokenizer.ggml.add_bos_token", &v->add_bos, err);
    if (!rc)
        rc = opt_bool(g, "tokenizer.ggml.add_eos_token", &v->add_eos, err);
    if (!rc)
        rc = opt_bool(g, "tokenizer.ggml.add_space_prefix", &v->add_space_prefix, err);
    return rc;
}

int tp_gguf_vocab_read(const tp_gguf *g, tp_gguf_vocab *out, tp_err *err)
{
    memset(out, 0, sizeof *out);
    read_model(g, out);
    int rc = read_tokens(g, out, err);
    if (!rc && out->spec.kind == TP_TOKENIZER_BPE)
        rc = read_merges(g, out, err);
    if (!rc)
        rc = read_ids(g, out, err);
    out->spec.rstrip_specials = is_phi3(g);
    if (rc)
        tp_gguf_vocab_release(out);
    return rc;
}

void tp_gguf_vocab_release(tp_gguf_vocab *v)
{
    arrays_free(v);
    memset(v, 0, sizeof *v);
}

int tp_gguf_vocab_tokenizer(const tp_gguf_vocab *v, tp_tokenizer **out, tp_err *err)
{
    *out = NULL;
    if (!v->spec.kind)
        return tp_err_set(err, TP_EFORMAT,
                          "tokenizer.ggml.model '%s' is not supported (only 'llama', "
                          "SentencePiece, and 'gpt2', byte-level BPE)", v->model);
    return tp_tokenizer_new(&v->spec, out, err);
}

int tp_tokenizer_from_gguf(const tp_gguf *g, tp_tokenizer **out, tp_err *err)
{
    *out = NULL;
    tp_gguf_vocab v;
    int rc = tp_gguf_vocab_read(g, &v, err);
    if (!rc)
        rc = tp_gguf_vocab_tokenizer(&v, out, err);
    tp_gguf_vocab_release(&v);
    return rc;
}

int tp_tokenizer_from_gguf_mem(const void *data, size_t size, tp_tokenizer **out, tp_err *err)
{
    *out = NULL;
    tp_gguf *g = NULL;
    int rc = tp_gguf_parse(data, size, &g, err);
    if (!rc)
        rc = tp_tokenizer_from_gguf(g, out, err);
    tp_gguf_free(g);
    return rc;
}

static int open_gguf(int fd, int vocab_size, tp_tokenizer **out, tp_err *err)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return tp_err_set(err, TP_EIO, "%s", strerror(errno));
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED)
        return tp_err_set(err, TP_EIO, "mmap: %s", strerror(errno));
    int rc = tp_tokenizer_from_gguf_mem(map, (size_t)st.st_size, out, err);
    munmap(map, (size_t)st.st_size);
    if (!rc && vocab_size > 0 && tp_tokenizer_vocab_size(*out) != vocab_size) {
        rc = tp_err_set(err, TP_EFORMAT, "the vocabulary has %d tokens, the model %d",
                        tp_tokenizer_vocab_size(*out), vocab_size);
        tp_tokenizer_free(*out);
        *out = NULL;
    }
    return rc;
}

int tp_tokenizer_open(const char *path, int vocab_size, tp_tokenizer **out, tp_err *err)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return tp_err_set(err, TP_EIO, "%s: %s", path, strerror(errno));
    char magic[4] = {0};
    ssize_t got = read(fd, magic, 4);
    int rc;
    if (got == 4 && !memcmp(magic, "GGUF", 4)) {
        rc = open_gguf(fd, vocab_size, out, err);
        if (rc && err && !strstr(err->msg, path)) {
            char msg[TP_ERR_MSG_MAX];
            snprintf(msg, sizeof msg, "%s", err->msg);
            tp_err_set(err, rc, "%s: %s", path, msg);
        }
    } else {
        rc = tp_tokenizer_load(path, vocab_size, out, err);
    }
    close(fd);
    return rc;
}
