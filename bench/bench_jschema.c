/* make bench: JSON Schemas of real shapes through the whole structured
 * output path: schema -> GBNF (tp_jschema_to_gbnf), GBNF -> grammar, grammar
 * x vocabulary -> engine, then token masks while documents are written.
 *
 * Corpus: every schema of the JSON-Schema-Test-Suite (draft 7, Debian
 * json-schema-test-suite) and of tests/support/jschema_2020_12.json that
 * compiles (the others are refused naming a keyword and skipped), on the
 * Llama 3 (128,256) and Qwen3 (151,669) vocabularies. Documents: random
 * allowed tokens (a short one preferred half the time) until the grammar is
 * done or 200 tokens.
 *
 * Baseline, same run: a whole-vocabulary walk per position (every token's
 * bytes through the same DFA, tp_gmatch_allows) on every 8th position.
 * Targets (issue 17): mask p50 <= 50 us, p99 <= 600 us on these
 * vocabularies; schema -> ready engine p95 <= 5 ms. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/gvocab.h"
#include "support/rand.h"
#include "support/timing.h"
#include "tokpipe/grammar.h"
#include "tokpipe/jschema.h"
#include "tokpipe/tokenizer.h"

#define SUITE "/usr/share/json-schema-test-suite/tests/draft7"
#define MAX_SCHEMAS 512
#define DOC_TOKENS 200

static uint64_t rng = 0x2545F4914F6CDD1Dull;

static uint32_t rnd(uint32_t n)
{
    return bench_rand_below(&rng, n);
}

static char *schemas[MAX_SCHEMAS];
static int n_schemas;

static void add_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *t = malloc((size_t)n + 1);
    size_t got = fread(t, 1, (size_t)n, f);
    fclose(f);
    t[got] = 0;
    cJSON *doc = cJSON_Parse(t);
    free(t);
    for (cJSON *c = doc ? doc->child : NULL; c && n_schemas < MAX_SCHEMAS; c = c->next) {
        char *s = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "schema"));
        char *g;
        tp_err e;
        if (s && !tp_jschema_to_gbnf(s, strlen(s), NULL, &g, &e)) {
            schemas[n_schemas++] = s;
            free(g);
        } else {
            free(s);
        }
    }
    cJSON_Delete(doc);
}

static void load_corpus(void)
{
    DIR *d = opendir(SUITE);
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        if (l > 5 && !strcmp(e->d_name + l - 5, ".json")) {
            char p[1024];
            snprintf(p, sizeof p, "%s/%s", SUITE, e->d_name);
            add_file(p);
        }
    }
    if (d) closedir(d);
    add_file("tests/support/jschema_2020_12.json");
}

static double pct(double *v, int n, double p)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

static void run_vocab(const char *name, const char *path)
{
    tp_gvocab *v = bench_gvocab_open(name, path, NULL);
    if (!v)
        return;
    tp_err e;
    int vocab = tp_gvocab_size(v);
    uint64_t *mask = calloc(tp_gmask_words(vocab), sizeof *mask);
    int *allowed = malloc((size_t)vocab * sizeof *allowed);
    double *compile = malloc(MAX_SCHEMAS * sizeof *compile), *to_gbnf = malloc(MAX_SCHEMAS * sizeof *to_gbnf);
    size_t cap = (size_t)n_schemas * DOC_TOKENS * 2 + 16;
    double *masks = malloc(cap * sizeof *masks), *walks = malloc(cap * sizeof *walks);
    int nm = 0, nw = 0, nc = 0;
    size_t mem_max = 0;
    for (int s = 0; s < n_schemas; s++) {
        double t0 = bench_now();
        char *g;
        tp_gengine *eng = NULL;
        tp_grammar *gr = NULL;
        if (tp_jschema_to_gbnf(schemas[s], strlen(schemas[s]), NULL, &g, &e)) continue;
        double t1 = bench_now();
        int rc = tp_grammar_compile(g, strlen(g), NULL, &gr, &e);
        if (!rc) rc = tp_gengine_new(gr, v, NULL, &eng, &e);
        double t2 = bench_now();
        free(g);
        if (rc) {
            printf("  %s: refused by the engine: %s\n", schemas[s], e.msg);
            tp_grammar_free(gr);
            continue;
        }
        to_gbnf[nc] = (t1 - t0) * 1e3;
        compile[nc++] = (t2 - t0) * 1e3;
        for (int doc = 0; doc < 2; doc++) {
            tp_gmatch *m;
            if (tp_gmatch_new(eng, &m, &e)) break;
            for (int step = 0; step < DOC_TOKENS && !tp_gmatch_done(m); step++) {
                double a = bench_now();
                if (tp_gmatch_mask(m, mask, &e)) break;
                masks[nm++] = (bench_now() - a) * 1e6;
                if (step % 8 == 0) {
                    a = bench_now();
                    volatile int k = 0;
                    for (int t = 0; t < vocab; t++) k += tp_gmatch_allows(m, t);
                    walks[nw++] = (bench_now() - a) * 1e6;
                }
                int na = 0;
                for (int t = 0; t < vocab; t++)
                    if (mask[t / 64] >> (t % 64) & 1) allowed[na++] = t;
                if (!na) break;
                int pick = allowed[rnd((uint32_t)na)];
                if (rnd(2)) { /* a short token, as strings and numbers end in real outputs */
                    size_t best = 99, len;
                    for (int tries = 0; tries < 16; tries++) {
                        int t = allowed[rnd((uint32_t)na)];
                        tp_gvocab_bytes(v, t, &len);
                        if (len && len < best) best = len, pick = t;
                    }
                }
                if (tp_gvocab_is_eog(v, pick)) break;
                if (tp_gmatch_accept(m, pick, &e)) break;
            }
            tp_gmatch_free(m);
        }
        size_t mem = tp_gengine_memory(eng);
        if (mem > mem_max) mem_max = mem;
        tp_gengine_free(eng);
        tp_grammar_free(gr);
    }
    if (nm && nw && nc) {
        double p50 = pct(masks, nm, 0.5), p99 = pct(masks, nm, 0.99), w50 = pct(walks, nw, 0.5);
        printf("%s (%d tokens): %d schemas, %d masks: p50 %.1f us, p99 %.1f us (targets 50 / 600)\n", name, vocab, nc,
               nm, p50, p99);
        printf("  baseline whole-vocabulary walk p50 %.1f us: %.0fx the mask p50, %.1fx its p99\n", w50, w50 / p50,
               w50 / p99);
        printf("  schema -> GBNF p50 %.3f ms p95 %.3f ms; schema -> ready engine p50 %.3f ms p95 %.3f ms (target 5)\n",
               pct(to_gbnf, nc, 0.5), pct(to_gbnf, nc, 0.95), pct(compile, nc, 0.5), pct(compile, nc, 0.95));
        printf("  largest engine after its documents: %.1f KiB\n", mem_max / 1024.0);
    }
    free(mask);
    free(allowed);
    free(compile);
    free(to_gbnf);
    free(masks);
    free(walks);
    tp_gvocab_free(v);
}

int main(void)
{
    load_corpus();
    printf("bench_jschema: %d schemas that compile (test suite + 2020-12 cases)\n", n_schemas);
    const char *models = getenv("TP_MODELS");
    char p[1024];
    snprintf(p, sizeof p, "%s/hf-vocab/llama3-vocab.gguf", models && *models ? models : "../shared/models");
    run_vocab("llama3", p);
    snprintf(p, sizeof p, "%s/hf-vocab/qwen3-vocab.gguf", models && *models ? models : "../shared/models");
    run_vocab("qwen3", p);
    for (int i = 0; i < n_schemas; i++) free(schemas[i]);
    return 0;
}
