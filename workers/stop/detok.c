#include "tokpipe/detok.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct tp_detok {
    const tp_tokenizer *tok;
    int32_t vocab;
    int32_t prev;     /* the only context a token's bytes depend on */
};

static int check_id(const tp_detok *d, const char *what, int32_t id, tp_err *err)
{
    if (id < 0 || id >= d->vocab)
        return tp_err_set(err, TP_ERANGE, "%s: id %d outside the vocabulary [0, %d)", what, id,
                          d->vocab);
    return 0;
}

int tp_detok_new(const tp_tokenizer *tok, int32_t last_prompt_id, tp_detok **out, tp_err *err)
{
    *out = NULL;
    if (!tok) return tp_err_set(err, TP_EINVAL, "detok: NULL tokenizer");
    tp_detok probe = {.tok = tok, .vocab = tp_tokenizer_vocab_size(tok)};
    int rc = check_id(&probe, "last prompt token", last_prompt_id, err);
    if (rc) return rc;
    tp_detok *d = malloc(sizeof *d);
    if (!d) return tp_err_set(err, TP_ENOMEM, "detok: out of memory");
    *d = probe;
    d->prev = last_prompt_id;
    *out = d;
    return 0;
}

void tp_detok_free(tp_detok *d)
{
    free(d);
}

const uint8_t *tp_detok_bytes(const tp_detok *d, int32_t id, size_t *len, tp_err *err)
{
    *len = 0;
    if (check_id(d, "token", id, err)) return NULL;
    return tp_tokenizer_token_bytes(d->tok, d->prev, id, len);
}

int tp_detok_accept(tp_detok *d, int32_t id, tp_err *err)
{
    int rc = check_id(d, "token", id, err);
    if (!rc) d->prev = id;
    return rc;
}

static bool is_space(char c)
{
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

int32_t tp_detok_control_id(const tp_tokenizer *tok, const char *text, size_t len)
{
    int vocab = tp_tokenizer_vocab_size(tok);
    for (int id = 0; id < vocab; id++) {
        int type = tp_tokenizer_token_type(tok, id);
        if (type != TP_TOKEN_CONTROL && type != TP_TOKEN_UNKNOWN) continue;
        size_t n;
        const char *p = tp_tokenizer_piece(tok, id, &n);
        while (n && is_space(*p)) p++, n--;
        while (n && is_space(p[n - 1])) n--;
        if (n && n == len && !memcmp(p, text, n)) return id;
    }
    return -1;
}
