/* make bench: tokenizer encode speed and sampler cost per token.
 *
 * Encode: tokenizer.bin (32000 pieces) on English text of growing length,
 * against llama2.c's encode() approach measured in the same run (sorted
 * vocabulary + bsearch, rescan every adjacent pair after each merge:
 * O(n^2)); both must give the same ids.
 *
 * BPE encode: the GPT-2 vocabulary (byte-level BPE, 50000 merges) on
 * English and mixed-script text, against the reference GPT-2 merge loop
 * measured in the same run (per pre-tokenizer word, rescan every adjacent
 * pair for the lowest merge rank after each merge: O(n^2) per word, merge
 * ranks in a sorted array); both must give the same ids.
 *
 * Sampler: microseconds per call on 32000 random logits for greedy,
 * temperature 1, top-k 40 and top-p 0.9, against llama2.c's sample_topp()
 * (softmax, keep probabilities >= (1-p)/(n-1), qsort, walk). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokpipe/bpe.h"
#include "tokpipe/gguf.h"
#include "tokpipe/sampler.h"
#include "tokpipe/tokenizer.h"
#include "support/timing.h"

static const char STORY[] =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
    "park. One day, she saw a big, red ball. She wanted to play with it, but it was too high.\n"
    "Lily's mom said, \"Lily, let's go to the park.\" Lily was sad and didn't know what to do. "
    "She said, \"I want to play with your ball, but I can't find it.\"\n";

/* ---- baseline: llama2.c encode ------------------------------------------ */

struct entry {
    const char *s;
    size_t n;
    int id;
};

struct naive {
    const tp_tokenizer *t;
    struct entry *sorted;
    int n;
};

static int cmp_entry(const void *a, const void *b)
{
    const struct entry *x = a, *y = b;
    size_t m = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->s, y->s, m);
    return c ? c : (x->n > y->n) - (x->n < y->n);
}

static int naive_lookup(const struct naive *v, const char *s, size_t n)
{
    struct entry key = {s, n, 0};
    const struct entry *e = bsearch(&key, v->sorted, v->n, sizeof key, cmp_entry);
    return e ? e->id : -1;
}

static size_t naive_encode(const struct naive *v, const char *text, size_t len, int *tok)
{
    size_t n = 0;
    char buf[128];
    tok[n++] = naive_lookup(v, " ", 1);
    for (size_t i = 0; i < len;) {
        size_t j = i + 1;
        while (j < len && j - i < 4 && ((unsigned char)text[j] & 0xC0) == 0x80)
            j++;
        int id = naive_lookup(v, text + i, j - i);
        if (id >= 0)
            tok[n++] = id;
        else
            for (size_t k = i; k < j; k++)
                tok[n++] = (unsigned char)text[k] + 3;
        i = j;
    }
    for (;;) {
        float best = -1e10f;
        int best_id = -1;
        size_t best_i = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            size_t a, b;
            const char *pa = tp_tokenizer_piece(v->t, tok[i], &a);
            const char *pb = tp_tokenizer_piece(v->t, tok[i + 1], &b);
            if (a + b > sizeof buf)
                continue;
            memcpy(buf, pa, a);
            memcpy(buf + a, pb, b);
            int id = naive_lookup(v, buf, a + b);
            if (id >= 0 && tp_tokenizer_score(v->t, id) > best) {
                best = tp_tokenizer_score(v->t, id);
                best_id = id;
                best_i = i;
            }
        }
        if (best_id < 0)
            break;
        tok[best_i] = best_id;
        memmove(tok + best_i + 1, tok + best_i + 2, sizeof *tok * (n - best_i - 2));
        n--;
    }
    return n;
}

static void bench_encode(const char *models)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.bin", models);
    tp_tokenizer *t = NULL;
    tp_err err;
    if (tp_tokenizer_load(path, 0, &t, &err)) {
        printf("encode: skipped (%s)\n", err.msg);
        return;
    }
    struct naive v = {t, NULL, 0};
    int vocab = tp_tokenizer_vocab_size(t);
    v.sorted = malloc(sizeof *v.sorted * vocab);
    for (int i = 0; i < vocab; i++) {
        int type = tp_tokenizer_token_type(t, i);
        if (type != TP_TOKEN_NORMAL && type != TP_TOKEN_USER_DEFINED)
            continue;
        v.sorted[v.n].s = tp_tokenizer_piece(t, i, &v.sorted[v.n].n);
        v.sorted[v.n].id = i;
        v.n++;
    }
    qsort(v.sorted, v.n, sizeof *v.sorted, cmp_entry);
    const size_t sizes[] = {1000, 4000, 100000};
    for (size_t k = 0; k < 3; k++) {
        size_t len = sizes[k];
        char *text = malloc(len);
        for (size_t i = 0; i < len; i++)
            text[i] = STORY[i % (sizeof STORY - 1)];
        int *ids = malloc(sizeof *ids * (len + 2)), *ref = malloc(sizeof *ref * (len + 2));
        size_t n = 0;
        int reps = len > 10000 ? 3 : 20;
        double t0 = bench_now();
        for (int r = 0; r < reps; r++)
            tp_tokenizer_encode(t, text, len, false, ids, len + 2, &n, NULL);
        double ours = (bench_now() - t0) / reps;
        printf("encode %6zu bytes -> %5zu tokens: %8.3f ms (%.1f MB/s)", len, n, ours * 1e3,
               len / ours / 1e6);
        if (len <= 4000) {
            t0 = bench_now();
            size_t nn = 0;
            for (int r = 0; r < 3; r++)
                nn = naive_encode(&v, text, len, ref);
            double base = (bench_now() - t0) / 3;
            int same = nn == n && !memcmp(ids, ref, sizeof *ids * n);
            printf("   llama2.c O(n^2) baseline %8.3f ms: %.1fx faster%s", base * 1e3,
                   base / ours, same ? "" : "  (IDS DIFFER!)");
        }
        printf("\n");
        free(text);
        free(ids);
        free(ref);
    }
    free(v.sorted);
    tp_tokenizer_free(t);
}

/* ---- byte-level BPE: reference GPT-2 merge loop -------------------------- */

struct sv {
    const char *s;
    size_t n;
    int v;
};

static int cmp_sv(const void *a, const void *b)
{
    const struct sv *x = a, *y = b;
    size_t m = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->s, y->s, m);
    return c ? c : (x->n > y->n) - (x->n < y->n);
}

static int sv_find(const struct sv *t, size_t n, const char *s, size_t len)
{
    struct sv key = {s, len, 0};
    const struct sv *e = bsearch(&key, t, n, sizeof key, cmp_sv);
    return e ? e->v : -1;
}

struct ref_bpe {
    struct sv *toks, *merges;
    size_t nt, nm;
    const tp_pretok *pre;
};

/* GPT-2's printable stand-in for byte b, as UTF-8 into out; returns its length. */
static size_t byte_char(int b, char *out)
{
    int cp = b, k = 0;
    bool self = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (!self) {
        for (int c = 0; c < b; c++)
            k += !((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF));
        cp = 256 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

static size_t ref_encode(const struct ref_bpe *r, const char *text, size_t len, int *out)
{
    size_t *ends, nw, n = 0, from = 0;
    if (tp_pretok_split(r->pre, text, len, &ends, &nw, NULL))
        return 0;
    char *w = malloc(2 * len + 1), key[1024];
    size_t *st = malloc(sizeof *st * (2 * len + 2)), *sl = malloc(sizeof *sl * (2 * len + 2));
    for (size_t i = 0; i < nw; i++) {
        size_t wl = 0, ns = 0;
        for (size_t j = from; j < ends[i]; j++) {
            size_t k = byte_char((unsigned char)text[j], w + wl);
            st[ns] = wl, sl[ns++] = k;
            wl += k;
        }
        from = ends[i];
        for (;;) {
            int best = -1;
            size_t at = 0;
            for (size_t j = 0; j + 1 < ns; j++) {
                if (sl[j] + sl[j + 1] + 1 > sizeof key)
                    continue;
                memcpy(key, w + st[j], sl[j]);
                key[sl[j]] = ' ';
                memcpy(key + sl[j] + 1, w + st[j + 1], sl[j + 1]);
                int rank = sv_find(r->merges, r->nm, key, sl[j] + sl[j + 1] + 1);
                if (rank >= 0 && (best < 0 || rank < best))
                    best = rank, at = j;
            }
            if (best < 0)
                break;
            sl[at] += sl[at + 1];
            memmove(st + at + 1, st + at + 2, sizeof *st * (ns - at - 2));
            memmove(sl + at + 1, sl + at + 2, sizeof *sl * (ns - at - 2));
            ns--;
        }
        for (size_t j = 0; j < ns; j++)
            out[n++] = sv_find(r->toks, r->nt, w + st[j], sl[j]);
    }
    free(w);
    free(st);
    free(sl);
    free(ends);
    return n;
}

static int load_strs(const tp_gguf *g, const char *key, struct sv **out, size_t *n)
{
    tp_gguf_str *a;
    uint64_t k;
    if (tp_gguf_get_str_array(g, key, &a, &k, NULL))
        return -1;
    *out = malloc(sizeof **out * k);
    for (uint64_t i = 0; i < k; i++)
        (*out)[i] = (struct sv){a[i].ptr, (size_t)a[i].len, (int)i};
    qsort(*out, k, sizeof **out, cmp_sv);
    *n = (size_t)k;
    free(a);
    return 0;
}

static const char MIXED[] =
    "The caf\xc3\xa9 opened at 09:30, and 1234567 people came! \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e "
    "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 \xf0\x9f\xa6\x99 y'all's code:\n\tx = f(y) + 42;\n";

static void bench_bpe(const char *models)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/llama.cpp-vocab/ggml-vocab-gpt-2.gguf", models);
    tp_tokenizer *t = NULL;
    tp_err err;
    FILE *f = fopen(path, "rb");
    uint8_t *img = NULL;
    long size = 0;
    if (f && !fseek(f, 0, SEEK_END) && (size = ftell(f)) > 0 && !fseek(f, 0, SEEK_SET)) {
        img = malloc((size_t)size);
        if (img && fread(img, 1, (size_t)size, f) != (size_t)size)
            size = 0;
    }
    if (f)
        fclose(f);
    tp_gguf *g = NULL;
    struct ref_bpe r = {0};
    tp_pretok *pre = NULL;
    if (!img || size <= 0 || tp_gguf_parse(img, (size_t)size, &g, &err) ||
        tp_tokenizer_from_gguf(g, &t, &err) || load_strs(g, "tokenizer.ggml.tokens", &r.toks, &r.nt) ||
        load_strs(g, "tokenizer.ggml.merges", &r.merges, &r.nm) ||
        tp_pretok_new("gpt-2", 5, &pre, NULL, &err)) {
        printf("bpe encode: skipped (%s)\n", err.msg);
    } else {
        r.pre = pre;
        const char *texts[] = {STORY, MIXED};
        const char *names[] = {"English", "mixed"};
        for (int which = 0; which < 2; which++) {
            size_t unit = strlen(texts[which]);
            const size_t sizes[] = {4000, 100000};
            for (size_t k = 0; k < 2; k++) {
                size_t len = sizes[k] / unit * unit;
                char *text = malloc(len);
                for (size_t i = 0; i < len; i += unit)
                    memcpy(text + i, texts[which], unit);
                int *ids = malloc(sizeof *ids * (len + 2)), *ref = malloc(sizeof *ref * (len + 2));
                size_t n = 0;
                double tb[5], tr[3];
                for (int rep = 0; rep < 5; rep++) {
                    double t0 = bench_now();
                    tp_tokenizer_encode_ex(t, text, len, 0, ids, len + 2, &n, NULL);
                    tb[rep] = bench_now() - t0;
                }
                size_t nn = 0;
                for (int rep = 0; rep < 3; rep++) {
                    double t0 = bench_now();
                    nn = ref_encode(&r, text, len, ref);
                    tr[rep] = bench_now() - t0;
                }
                double ours = bench_median(tb, 5), base = bench_median(tr, 3);
                int same = nn == n && !memcmp(ids, ref, sizeof *ids * n);
                printf("bpe encode (gpt-2) %-7s %6zu bytes -> %5zu tokens: %8.3f ms (%.1f MB/s)"
                       "   GPT-2 reference merge loop %8.3f ms: %.1fx faster%s\n",
                       names[which], len, n, ours * 1e3, len / ours / 1e6, base * 1e3, base / ours,
                       same ? "" : "  (IDS DIFFER!)");
                free(text);
                free(ids);
                free(ref);
            }
        }
    }
    tp_pretok_free(pre);
    free(r.toks);
    free(r.merges);
    tp_tokenizer_free(t);
    tp_gguf_free(g);
    free(img);
}

/* ---- sampler ------------------------------------------------------------ */

struct pi {
    float p;
    int i;
};

static int cmp_pi(const void *a, const void *b)
{
    const struct pi *x = a, *y = b;
    return (x->p < y->p) - (x->p > y->p);
}

/* llama2.c sample_topp(), with its softmax. */
static int llama2c_topp(const float *logits, float *p, struct pi *idx, int n, float topp,
                        float coin)
{
    float m = logits[0], sum = 0;
    for (int i = 1; i < n; i++)
        m = logits[i] > m ? logits[i] : m;
    for (int i = 0; i < n; i++)
        sum += p[i] = expf(logits[i] - m);
    for (int i = 0; i < n; i++)
        p[i] /= sum;
    float cutoff = (1.0f - topp) / (n - 1);
    int n0 = 0;
    for (int i = 0; i < n; i++)
        if (p[i] >= cutoff)
            idx[n0++] = (struct pi){p[i], i};
    qsort(idx, n0, sizeof *idx, cmp_pi);
    float cum = 0;
    int last = n0 - 1;
    for (int i = 0; i < n0; i++) {
        cum += idx[i].p;
        if (cum > topp) {
            last = i;
            break;
        }
    }
    float r = coin * cum, cdf = 0;
    for (int i = 0; i <= last; i++) {
        cdf += idx[i].p;
        if (r < cdf)
            return idx[i].i;
    }
    return idx[last].i;
}

static void bench_sampler(void)
{
    enum { V = 32000, CALLS = 2000 };
    float *logits = malloc(sizeof *logits * V), *p = malloc(sizeof *p * V);
    struct pi *idx = malloc(sizeof *idx * V);
    uint64_t x = 1;
    for (int i = 0; i < V; i++) { /* roughly the spread of a small LM's logits */
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        double u1 = ((x >> 11) + 1) * 0x1.0p-53;
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        double u2 = (x >> 11) * 0x1.0p-53;
        logits[i] = (float)(3.0 * sqrt(-2 * log(u1)) * cos(2 * M_PI * u2));
    }
    struct {
        const char *name;
        float temp, top_p;
        int top_k;
    } cases[] = {{"greedy", 0, 1, 0}, {"temperature 1", 1, 1, 0}, {"top-k 40", 1, 1, 40},
                 {"top-p 0.9", 1, 0.9f, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        tp_sampler_params prm = tp_sampler_params_default();
        prm.temperature = cases[c].temp;
        prm.top_p = cases[c].top_p;
        prm.top_k = cases[c].top_k;
        prm.repetition_penalty = 1.1f; /* the window is part of the per-call cost */
        tp_sampler *s = NULL;
        tp_sampler_new(&prm, V, NULL, 0, &s, NULL);
        double t0 = bench_now();
        for (int i = 0; i < CALLS; i++) {
            int32_t tok;
            tp_sampler_sample(s, logits, &tok, NULL);
            tp_sampler_accept(s, tok, NULL);
        }
        printf("sample V=%d %-14s %7.1f us/token\n", V, cases[c].name,
               (bench_now() - t0) / CALLS * 1e6);
        tp_sampler_free(s);
    }
    double t0 = bench_now();
    volatile int sink = 0;
    for (int i = 0; i < CALLS; i++)
        sink += llama2c_topp(logits, p, idx, V, 0.9f, (float)((i * 0.618034) - (int)(i * 0.618034)));
    printf("sample V=%d llama2.c top-p 0.9 baseline %7.1f us/token\n", V,
           (bench_now() - t0) / CALLS * 1e6);
    free(logits);
    free(p);
    free(idx);
}

int main(void)
{
    const char *models = getenv("TP_MODELS");
    bench_encode(models ? models : "../shared/models");
    bench_bpe(models ? models : "../shared/models");
    bench_sampler();
    return 0;
}
