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

int32_t tp_detok_control_id(const tp_tokenizer *tok, const char *text, size_t len)
{
    return tp_tokenizer_control_id(tok, text, len);
}

size_t tp_detok_control_stops(const tp_tokenizer *tok, const char *const *stop, const size_t *stop_len,
                              size_t n_stop, int32_t *ids)
{
    size_t k = 0;
    for (size_t i = 0; i < n_stop; i++) {
        int32_t id = tp_tokenizer_control_id(tok, stop[i], stop_len[i]);
        bool seen = false;
        for (size_t j = 0; j < k; j++)
            seen |= ids[j] == id;
        if (id >= 0 && !seen)
            ids[k++] = id;
    }
    return k;
}
