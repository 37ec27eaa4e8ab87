/* libFuzzer target for the tokenizer. The first input byte picks the mode:
 *   0: the rest is a tokenizer.bin image; if it loads, encode a slice of it
 *      and read every token's bytes;
 *   1: the rest is a GGUF-style vocabulary (pieces split at NUL, a type per
 *      piece from its first byte) for tp_tokenizer_from_vocab;
 *   2: the rest is text encoded with the real tok512.bin ($TP_MODELS), and
 *      decoding the ids must give the text back exactly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/tokenizer.h"

static tp_tokenizer *real_tok; /* loaded once; read-only afterwards */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *dir = getenv("TP_MODELS");
    char path[4096];
    snprintf(path, sizeof path, "%s/tok512.bin", dir ? dir : "../shared/models");
    tp_tokenizer_load(path, 0, &real_tok, NULL);
    return 0;
}

static void exercise(const tp_tokenizer *t, const uint8_t *text, size_t len)
{
    volatile uint8_t sink = 0;
    for (int id = 0; id < tp_tokenizer_vocab_size(t); id++) {
        size_t n;
        const uint8_t *b = tp_tokenizer_token_bytes(t, tp_tokenizer_bos_id(t), id, &n);
        if (n)
            sink ^= b[n - 1];
        const char *p = tp_tokenizer_piece(t, id, &n);
        if (n)
            sink ^= (uint8_t)p[n - 1];
    }
    (void)sink;
    int *ids = malloc(sizeof *ids * (len + 2));
    size_t n;
    if (ids)
        tp_tokenizer_encode(t, (const char *)text, len, true, ids, len + 2, &n, NULL);
    free(ids);
}

static void from_vocab(const uint8_t *d, size_t size)
{
    enum { MAXP = 512 };
    const char *pieces[MAXP];
    size_t lens[MAXP];
    int32_t types[MAXP];
    float scores[MAXP];
    int n = 0;
    for (size_t i = 0; i < size && n < MAXP; n++) {
        types[n] = d[i] % 8;
        scores[n] = (float)(d[i] % 5) - (float)n;
        size_t j = ++i;
        while (j < size && d[j])
            j++;
        pieces[n] = (const char *)d + i;
        lens[n] = j - i;
        i = j + 1;
    }
    tp_tokenizer *t = NULL;
    if (tp_tokenizer_from_vocab(pieces, lens, scores, types, n, n > 1 ? 1 : -1, -1, &t, NULL) == 0)
        exercise(t, d, size);
    tp_tokenizer_free(t);
}

static void round_trip(const uint8_t *text, size_t len)
{
    if (!real_tok)
        return;
    int *ids = malloc(sizeof *ids * (len + 2));
    uint8_t *back = malloc(len + 1);
    size_t n = 0, got = 0;
    if (ids && back && tp_tokenizer_encode(real_tok, (const char *)text, len, true, ids, len + 2,
                                           &n, NULL) != 0)
        abort();
    for (size_t i = 1; ids && back && i < n; i++) {
        size_t bl;
        const uint8_t *b = tp_tokenizer_token_bytes(real_tok, ids[i - 1], ids[i], &bl);
        if (got + bl > len)
            abort();
        memcpy(back + got, b, bl);
        got += bl;
    }
    if (ids && back && (got != len || memcmp(back, text, len)))
        abort();
    free(ids);
    free(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const uint8_t *d = data + 1;
    size_t n = size - 1;
    switch (data[0] % 3) {
    case 0: {
        tp_tokenizer *t = NULL;
        if (tp_tokenizer_load_mem(d, n, 0, &t, NULL) == 0)
            exercise(t, d, n > 64 ? 64 : n);
        tp_tokenizer_free(t);
        break;
    }
    case 1:
        from_vocab(d, n);
        break;
    default:
        round_trip(d, n);
    }
    return 0;
}
