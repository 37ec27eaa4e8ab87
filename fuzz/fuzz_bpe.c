/* libFuzzer target for byte-level BPE. The first input byte picks the mode:
 *   0: the rest is a GGUF image; its tokenizer.ggml.* metadata goes through
 *      the vocabulary reader (tp_tokenizer_from_gguf_mem) and, if it loads,
 *      a slice of the input is encoded with and without special tokens;
 *   1: the rest is a BPE vocabulary built by hand: a pre-tokenizer picked by
 *      the next byte, then NUL-separated pieces, a 0xFF byte, then NUL-
 *      separated merge lines (tp_tokenizer_new); if it builds, encode text;
 *   2: the rest is text for the real GPT-2 vocabulary ($TP_MODELS): when it
 *      encodes (valid UTF-8), decoding the ids must give the text back
 *      exactly, and every pre-tokenizer's words must tile the text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/bpe.h"
#include "tokpipe/tokenizer.h"

static tp_tokenizer *gpt2; /* loaded once; read-only afterwards */

static const char *const PRE[] = {"gpt-2", "llama-bpe", "qwen2", "deepseek-llm", "falcon",
                                  "starcoder", "default", "deepseek-coder", "deepseek-v3", "nonsense"};
#define N_PRE (sizeof PRE / sizeof PRE[0])

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *dir = getenv("TP_MODELS");
    char path[4096];
    snprintf(path, sizeof path, "%s/llama.cpp-vocab/ggml-vocab-gpt-2.gguf",
             dir ? dir : "../shared/models");
    tp_tokenizer_open(path, 0, &gpt2, NULL);
    return 0;
}

static void encode_some(const tp_tokenizer *t, const uint8_t *text, size_t len)
{
    size_t cap = tp_tokenizer_max_ids(len), n;
    int *ids = malloc(sizeof *ids * cap);
    if (!ids)
        return;
    volatile size_t sink = 0;
    for (unsigned flags = 0; flags < 8; flags += 4) {
        if (tp_tokenizer_encode_ex(t, (const char *)text, len, flags | TP_ENCODE_ADD_SPECIAL, ids,
                                   cap, &n, NULL))
            continue;
        for (size_t i = 0; i < n; i++) {
            size_t k;
            const uint8_t *b = tp_tokenizer_token_bytes(t, i ? ids[i - 1] : -1, ids[i], &k);
            if (k)
                sink += b[0] + b[k - 1];
        }
    }
    (void)sink;
    free(ids);
}

static void from_gguf(const uint8_t *d, size_t n)
{
    /* the GGUF parser wants its buffer aligned like an mmap */
    uint8_t *copy = malloc(n ? n : 1);
    if (!copy)
        return;
    memcpy(copy, d, n);
    tp_tokenizer *t = NULL;
    if (tp_tokenizer_from_gguf_mem(copy, n, &t, NULL) == 0)
        encode_some(t, d, n > 96 ? 96 : n);
    tp_tokenizer_free(t);
    free(copy);
}

/* Split [d, d+n) at NUL into at most cap strings. */
static size_t split_nul(const uint8_t *d, size_t n, const char **s, size_t *l, size_t cap)
{
    size_t k = 0, start = 0;
    for (size_t i = 0; i <= n && k < cap; i++)
        if (i == n || d[i] == 0) {
            s[k] = (const char *)d + start;
            l[k++] = i - start;
            start = i + 1;
        }
    return k;
}

static void from_parts(const uint8_t *d, size_t n)
{
    if (n < 1)
        return;
    const char *pre = PRE[d[0] % N_PRE];
    d++, n--;
    const uint8_t *sep = memchr(d, 0xFF, n);
    size_t nt = sep ? (size_t)(sep - d) : n;
    enum { CAP = 512 };
    const char *pieces[CAP], *merges[CAP];
    size_t lens[CAP], mlens[CAP];
    int32_t types[CAP];
    size_t np = split_nul(d, nt, pieces, lens, CAP);
    size_t nm = sep ? split_nul(sep + 1, n - nt - 1, merges, mlens, CAP) : 0;
    for (size_t i = 0; i < np; i++) /* a type from each piece's length */
        types[i] = 1 + (int32_t)(lens[i] % 7 == 3 ? 2 : lens[i] % 11 == 4 ? 3 : 0);
    tp_vocab_spec v = {.kind = TP_TOKENIZER_BPE, .n = (int)np, .pieces = pieces, .lens = lens,
                       .types = types, .merges = merges, .merge_lens = mlens, .n_merges = nm,
                       .pre = pre, .pre_len = strlen(pre), .bos_id = np > 1 ? 1 : -1,
                       .eos_id = -1, .unk_id = -1, .eot_id = -1, .eom_id = -1, .add_bos = -1,
                       .add_eos = -1, .add_space_prefix = -1};
    tp_tokenizer *t = NULL;
    if (tp_tokenizer_new(&v, &t, NULL) == 0)
        encode_some(t, d, nt > 64 ? 64 : nt);
    tp_tokenizer_free(t);
}

static void round_trip(const uint8_t *text, size_t len)
{
    for (size_t k = 0; k < N_PRE - 1; k++) { /* the words tile the text */
        tp_pretok *p = NULL;
        size_t *ends = NULL, nw = 0;
        if (tp_pretok_new(PRE[k], strlen(PRE[k]), &p, NULL, NULL))
            abort();
        if (tp_pretok_split(p, (const char *)text, len, &ends, &nw, NULL) == 0) {
            for (size_t i = 0; i < nw; i++)
                if (ends[i] <= (i ? ends[i - 1] : 0) || ends[i] > len)
                    abort();
            if (len && (!nw || ends[nw - 1] != len))
                abort();
        }
        free(ends);
        tp_pretok_free(p);
    }
    if (!gpt2)
        return;
    size_t cap = tp_tokenizer_max_ids(len), n;
    int *ids = malloc(sizeof *ids * cap);
    uint8_t *back = malloc(len + 1);
    if (ids && back && tp_tokenizer_encode_ex(gpt2, (const char *)text, len, 0, ids, cap, &n, NULL) == 0) {
        size_t o = 0;
        for (size_t i = 0; i < n; i++) {
            size_t k;
            const uint8_t *b = tp_tokenizer_token_bytes(gpt2, i ? ids[i - 1] : -1, ids[i], &k);
            if (o + k > len)
                abort();
            memcpy(back + o, b, k);
            o += k;
        }
        if (o != len || memcmp(back, text, len))
            abort(); /* GPT-2 has a token for every byte: decoding is exact */
    }
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
    case 0:
        from_gguf(d, n);
        break;
    case 1:
        from_parts(d, n);
        break;
    default:
        round_trip(d, n);
    }
    return 0;
}
