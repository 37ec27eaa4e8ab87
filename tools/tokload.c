/* tokenizer.bin or GGUF vocabulary -> tp_tokenizer (see tokload.h). */
#include "tokload.h"

#include "tokpipe/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Optional fixed-type array of n elements: NULL if the key is absent. */
static int opt_array(const tp_gguf *g, const char *key, uint32_t want_type, uint64_t n,
                     const uint8_t **raw, tp_err *err)
{
    uint32_t type;
    uint64_t count;
    *raw = NULL;
    int rc = tp_gguf_get_array(g, key, &type, &count, raw, err);
    if (rc == TP_ENOTFOUND) {
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

static int opt_id(const tp_gguf *g, const char *key, int n, int *id, tp_err *err)
{
    int64_t v;
    int rc = tp_gguf_get_int(g, key, &v, err);
    if (rc == TP_ENOTFOUND)
        return 0; /* keep the default */
    if (rc)
        return rc;
    if (v < -1 || v >= n)
        return tp_err_set(err, TP_ERANGE, "%s = %lld is outside [0, %d)", key, (long long)v, n);
    *id = (int)v;
    return 0;
}

static int check_model_name(const tp_gguf *g, tp_err *err)
{
    tp_gguf_str name;
    int rc = tp_gguf_get_str(g, "tokenizer.ggml.model", &name, err);
    if (rc)
        return rc;
    if (name.len != 5 || memcmp(name.ptr, "llama", 5))
        return tp_err_set(err, TP_EFORMAT,
                          "tokenizer.ggml.model '%.*s' is not supported (only 'llama', "
                          "SentencePiece)", (int)(name.len > 32 ? 32 : name.len), name.ptr);
    return 0;
}

static int from_gguf(const tp_gguf *g, tp_tokenizer **out, tp_err *err)
{
    int rc = check_model_name(g, err);
    tp_gguf_str *toks = NULL;
    uint64_t n = 0;
    if (!rc)
        rc = tp_gguf_get_str_array(g, "tokenizer.ggml.tokens", &toks, &n, err);
    if (!rc && (n == 0 || n > (1u << 22)))
        rc = tp_err_set(err, TP_ERANGE, "tokenizer.ggml.tokens has %llu entries",
                        (unsigned long long)n);
    const uint8_t *scores_raw = NULL, *types_raw = NULL;
    if (!rc)
        rc = opt_array(g, "tokenizer.ggml.scores", TP_GGUF_F32, n, &scores_raw, err);
    if (!rc)
        rc = opt_array(g, "tokenizer.ggml.token_type", TP_GGUF_I32, n, &types_raw, err);
    int bos = 1, eos = 2;
    if (!rc)
        rc = opt_id(g, "tokenizer.ggml.bos_token_id", (int)n, &bos, err);
    if (!rc)
        rc = opt_id(g, "tokenizer.ggml.eos_token_id", (int)n, &eos, err);
    if (!rc && (bos >= (int)n || eos >= (int)n))
        rc = tp_err_set(err, TP_ERANGE, "default bos/eos ids 1/2 do not fit %llu tokens",
                        (unsigned long long)n);
    const char **pieces = rc ? NULL : malloc(sizeof *pieces * n);
    size_t *lens = rc ? NULL : malloc(sizeof *lens * n);
    float *scores = rc || !scores_raw ? NULL : malloc(sizeof *scores * n);
    int32_t *types = rc || !types_raw ? NULL : malloc(sizeof *types * n);
    if (!rc && (!pieces || !lens || (scores_raw && !scores) || (types_raw && !types)))
        rc = tp_err_set(err, TP_ENOMEM, "out of memory for %llu tokens", (unsigned long long)n);
    for (uint64_t i = 0; !rc && i < n; i++) {
        pieces[i] = toks[i].ptr;
        lens[i] = (size_t)toks[i].len;
    }
    if (!rc && scores) /* the raw arrays may be unaligned */
        memcpy(scores, scores_raw, sizeof *scores * n);
    if (!rc && types)
        memcpy(types, types_raw, sizeof *types * n);
    if (!rc)
        rc = tp_tokenizer_from_vocab(pieces, lens, scores, types, (int)n, bos, eos, out, err);
    free(toks);
    free(pieces);
    free(lens);
    free(scores);
    free(types);
    return rc;
}

static int open_gguf(const char *path, int fd, tp_tokenizer **out, tp_err *err)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return tp_err_set(err, TP_EIO, "%s: %s", path, strerror(errno));
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED)
        return tp_err_set(err, TP_EIO, "%s: mmap: %s", path, strerror(errno));
    tp_gguf *g = NULL;
    int rc = tp_gguf_parse(map, (size_t)st.st_size, &g, err);
    if (!rc)
        rc = from_gguf(g, out, err);
    tp_gguf_free(g);
    munmap(map, (size_t)st.st_size);
    return rc;
}

int tools_tokenizer_open(const char *path, tp_tokenizer **out, tp_err *err)
{
    *out = NULL;
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return tp_err_set(err, TP_EIO, "%s: %s", path, strerror(errno));
    char magic[4] = {0};
    ssize_t got = read(fd, magic, 4);
    int rc;
    if (got == 4 && !memcmp(magic, "GGUF", 4)) {
        rc = open_gguf(path, fd, out, err);
        if (rc && err && !strstr(err->msg, path)) {
            char msg[TP_ERR_MSG_MAX];
            snprintf(msg, sizeof msg, "%s", err->msg);
            tp_err_set(err, rc, "%s: %s", path, msg);
        }
    } else {
        rc = tp_tokenizer_load(path, 0, out, err);
    }
    close(fd);
    return rc;
}
