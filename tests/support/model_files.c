#include "model_files.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

void model_file_path(const char *name, char *buf, size_t cap)
{
    const char *dir = getenv("TP_MODELS");
    snprintf(buf, cap, "%s/%s", dir ? dir : "../shared/models", name);
}

void *model_file_read(const char *name, size_t *size)
{
    char path[4096];
    model_file_path(name, path, sizeof path);
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    void *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf && fread(buf, 1, (size_t)n, fp) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(fp);
    *size = (size_t)n;
    return buf;
}

tp_model *synth_model_load(tp_synth_gguf o, const char *shape, uint64_t seed)
{
    tp_err e, *err = &e;
    char vocab[4096], path[] = "/tmp/tp_test_synth.XXXXXX";
    if (!o.vocab_from) {
        model_file_path("llama.cpp-vocab/ggml-vocab-llama-spm.gguf", vocab, sizeof vocab);
        o.vocab_from = vocab;
    }
    int fd = mkstemp(path);
    if (fd < 0)
        fail_msg("mkstemp %s failed", path);
    close(fd);
    tp_synth_shape sh;
    tp_model *m = NULL;
    if (!tp_synth_parse_shape(shape, &sh, err) && !tp_synth_write_gguf(path, &sh, seed, &o, err))
        tp_model_load(path, &m, err);
    unlink(path);
    if (!m)
        fail_msg("mkmodel %s %s: %s", o.arch, shape, e.msg);
    return m;
}
