/* Chat templates: what a GGUF file says about chatting with its model
 * (tokenizer.chat_template and the texts of its BOS and EOS tokens). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "tokpipe/chat_template.h"
#include "tokpipe/gguf.h"

static char *dup_view(const char *p, uint64_t n)
{
    char *s = malloc((size_t)n + 1);
    if (s) {
        memcpy(s, p, (size_t)n);
        s[n] = 0;
    }
    return s;
}

static int token_text(const tp_gguf *g, const tp_gguf_str *toks, uint64_t n, const char *key, char **out,
                      tp_err *err)
{
    int64_t id;
    tp_err e;
    *out = NULL;
    if (tp_gguf_get_int(g, key, &id, &e))
        return 0;   /* no such token: the template variable stays undefined */
    if (id < 0 || (uint64_t)id >= n)
        return tp_err_set(err, TP_EFORMAT, "%s = %lld is outside the vocabulary of %llu tokens", key, (long long)id,
                          (unsigned long long)n);
    if (!(*out = dup_view(toks[id].ptr, toks[id].len)))
        return tp_err_set(err, TP_ENOMEM, "out of memory");
    return 0;
}

int tp_chat_gguf_info(const tp_gguf *g, char **tmpl, char **bos, char **eos, tp_err *err)
{
    *tmpl = *bos = *eos = NULL;
    tp_gguf_str s;
    tp_err e;
    int rc = tp_gguf_get_str(g, "tokenizer.chat_template", &s, &e);
    if (rc == TP_ENOTFOUND)
        return tp_err_set(err, TP_ENOTFOUND, "the model has no tokenizer.chat_template");
    if (rc)
        return tp_err_set(err, rc, "%s", e.msg);
    if (!(*tmpl = dup_view(s.ptr, s.len)))
        return tp_err_set(err, TP_ENOMEM, "out of memory");
    tp_gguf_str *toks = NULL;
    uint64_t n = 0;
    if (tp_gguf_get_str_array(g, "tokenizer.ggml.tokens", &toks, &n, &e) == 0) {
        rc = token_text(g, toks, n, "tokenizer.ggml.bos_token_id", bos, err);
        if (!rc)
            rc = token_text(g, toks, n, "tokenizer.ggml.eos_token_id", eos, err);
        free(toks);
        if (rc) {
            free(*tmpl);
            free(*bos);
            free(*eos);
            *tmpl = *bos = *eos = NULL;
            return rc;
        }
    }
    return 0;
}

/* A GGUF file's template: the file mapped, not read (a model file may be
 * many gigabytes; only its metadata is looked at, and its pages are shared
 * with the forward worker's mapping of the same file). */
static int gguf_template(FILE *f, const char *path, tp_chat_template **out, tp_err *err)
{
    struct stat st;
    if (fstat(fileno(f), &st) != 0)
        return tp_err_set(err, TP_EIO, "%s: %s", path, strerror(errno));
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fileno(f), 0);
    if (map == MAP_FAILED)
        return tp_err_set(err, TP_EIO, "%s: mmap: %s", path, strerror(errno));
    tp_gguf *g = NULL;
    char *text = NULL, *bos = NULL, *eos = NULL;
    tp_err e;
    int rc = tp_gguf_parse(map, (size_t)st.st_size, &g, &e);
    if (!rc)
        rc = tp_chat_gguf_info(g, &text, &bos, &eos, &e);
    tp_gguf_free(g);
    munmap(map, (size_t)st.st_size);
    free(bos);
    free(eos);
    if (rc) {
        free(text);
        return tp_err_set(err, rc, "%s: %s", path, e.msg);
    }
    rc = tp_chat_template_new(text, strlen(text), out, &e);
    free(text);
    return rc ? tp_err_set(err, rc, "%s: tokenizer.chat_template: %s", path, e.msg) : 0;
}

int tp_chat_template_load(const char *path, bool gguf_only, tp_chat_template **out, tp_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return tp_err_set(err, TP_EIO, "%s: %s", path, strerror(errno));
    char magic[4];
    bool gguf = fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
    if (gguf || gguf_only) {
        int rc = gguf ? gguf_template(f, path, out, err)
                      : tp_err_set(err, TP_ENOTFOUND, "%s is not a GGUF file, so it has no tokenizer.chat_template",
                                   path);
        fclose(f);
        return rc;
    }
    rewind(f);
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (len == cap) {
            size_t nc = cap ? cap * 2 : 1u << 16;
            char *nb = realloc(buf, nc + 1);
            if (!nb) {
                rc = tp_err_set(err, TP_ENOMEM, "%s: out of memory", path);
                break;
            }
            buf = nb;
            cap = nc;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0)
            break;
        if (len > TP_CHAT_MAX_TEMPLATE) {
            rc = tp_err_set(err, TP_ERANGE, "%s: a template of more than %u bytes", path, TP_CHAT_MAX_TEMPLATE);
            break;
        }
    }
    if (!rc && ferror(f))
        rc = tp_err_set(err, TP_EIO, "%s: read error", path);
    fclose(f);
    if (rc) {
        free(buf);
        return rc;
    }
    tp_err e;
    rc = tp_chat_template_new(buf, len, out, &e);
    free(buf);
    if (rc)
        return tp_err_set(err, rc, "%s: %s", path, e.msg);
    return 0;
}
