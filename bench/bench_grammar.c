/* make bench: the grammar engine's cost per token mask and per compile, on
 * a corpus of 60 grammars of the shapes structured output produces: 7
 * compiled by the JSON Schema compiler (formats, maxLength, bounds,
 * pattern, $ref recursion, anyOf, JSON mode), the others generated as a
 * schema compiler writes them (typed, optional, enum, bounded, nested and
 * array fields) and a few text formats, over
 * the real vocabularies: SPM 32k, Llama 3 128k, Qwen3 152k.
 *
 * Each grammar drives documents of random allowed tokens (a short token is
 * preferred a quarter of the time, so strings and arrays end as they do in
 * real outputs); every mask asked is timed, cold states (first visit:
 * the trie walk) and warm ones (cache hit) together, one engine per grammar
 * as the sample stage keeps it. The baseline, measured in the same run, is
 * the approach that walks the whole vocabulary per token (each token's
 * bytes through the same DFA, tp_gmatch_allows), on a sample of positions.
 * Times are thread CPU time (the machine is shared; time descheduled is
 * not the engine's).
 *
 * BENCH_SLOW=US prints every mask slower than US microseconds (which
 * grammar, step, how many tokens it allowed, cold or not); an argument runs
 * one vocabulary only (a path under TP_MODELS), e.g. under a profiler.
 *
 * Targets (issue 17): p50 <= 20 us, p99 <= 300 us on 32k; p50 <= 50 us,
 * p99 <= 600 us on 128k-152k; compile p95 <= 5 ms. */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokpipe/grammar.h"
#include "tokpipe/jschema.h"
#include "tokpipe/tokenizer.h"
#include "support/gvocab.h"
#include "support/rand.h"
#include "support/timing.h"

#define N_GRAMMARS 60
#define DOCS_PER_GRAMMAR 3
#define MAX_DOC_TOKENS 256

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint32_t rnd(uint32_t n)
{
    return bench_rand_below(&rng, n);
}

typedef struct buf {
    char *s;
    size_t n, cap;
} buf;

static void add(buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (b->n + (size_t)n + 1 > b->cap) {
        b->cap = (b->n + (size_t)n + 1) * 2;
        b->s = realloc(b->s, b->cap);
    }
    va_start(ap, fmt);
    vsnprintf(b->s + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
}

static const char *const common_rules =
    "ws ::= | \" \" | \"\\n\" [ ]{0,8}\n"
    "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "integer ::= \"-\"? ([0-9] | [1-9] [0-9]{1,15})\n"
    "number ::= integer (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?\n"
    "boolean ::= \"true\" | \"false\"\n"
    "date ::= \"\\\"\" [0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01]) \"\\\"\"\n"
    "uuid ::= \"\\\"\" [0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{12} \"\\\"\"\n"
    "value ::= object | array | string | number | boolean | \"null\"\n"
    "object ::= \"{\" ws (string \":\" ws value (\",\" ws string \":\" ws value)*)? ws \"}\"\n"
    "array ::= \"[\" ws (value (\",\" ws value)*)? ws \"]\"\n";

static const char *const words[] = {"id", "name", "email", "age", "tags", "items", "price", "created", "owner",
                                    "status", "title", "description", "score", "count", "enabled", "address",
                                    "city", "zip", "country", "notes"};

/* A type expression; new rules it needs go to rules. */
static void gen_type(buf *out, buf *rules, int *n_rules, int depth)
{
    int k = rnd(depth < 2 ? 12 : 9);
    switch (k) {
    case 0: case 1: add(out, "string"); break;
    case 2: add(out, "integer"); break;
    case 3: add(out, "number"); break;
    case 4: add(out, "boolean"); break;
    case 5: add(out, "(\"\\\"red\\\"\" | \"\\\"green\\\"\" | \"\\\"blue\\\"\" | \"\\\"dark %s\\\"\")", words[rnd(20)]); break;
    case 6: add(out, "\"\\\"\" char{0,%u} \"\\\"\"", 8 + rnd(40)); break;
    case 7: add(out, rnd(2) ? "date" : "uuid"); break;
    case 8: add(out, "\"[\" ws (string (\",\" ws string){0,%u})? ws \"]\"", 2 + rnd(6)); break;
    case 9: case 10: {
        int r = (*n_rules)++;
        add(out, "obj%d", r);
        buf body = {0};
        int nk = 1 + (int)rnd(5);
        add(&body, "obj%d ::= \"{\" ws ", r);
        for (int i = 0; i < nk; i++) {
            buf t = {0};
            gen_type(&t, rules, n_rules, depth + 1);
            bool opt = i > 0 && rnd(3) == 0;
            add(&body, "%s%s\"\\\"%s\\\"\" ws \":\" ws %s%s ", opt ? "(" : "", i ? "\",\" ws " : "", words[rnd(20)],
                t.s, opt ? ")?" : "");
            free(t.s);
        }
        add(&body, "ws \"}\"\n");
        add(rules, "%s", body.s);
        free(body.s);
        break;
    }
    default: {
        buf t = {0};
        gen_type(&t, rules, n_rules, depth + 1);
        add(out, "\"[\" ws (%s (\",\" ws %s){0,%u})? ws \"]\"", t.s, t.s, 3 + rnd(10));
        free(t.s);
    }
    }
}

/* Schemas of the shapes applications send, compiled by the JSON Schema
 * compiler (jschema.h) as the broker does. */
static const char *const schemas[] = {
    "{}",   /* JSON mode below; this slot: any JSON value */
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":40},\"age\":"
    "{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},\"email\":{\"type\":\"string\",\"format\":"
    "\"email\"}},\"required\":[\"name\",\"age\"],\"additionalProperties\":false}",
    "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\","
    "\"format\":\"uuid\"},\"when\":{\"type\":\"string\",\"format\":\"date-time\"},\"tags\":{\"type\":"
    "\"array\",\"items\":{\"enum\":[\"red\",\"green\",\"blue\"]},\"maxItems\":3}},\"required\":[\"id\"]},"
    "\"maxItems\":5}",
    "{\"type\":\"object\",\"properties\":{\"answer\":{\"type\":\"string\"},\"confidence\":{\"type\":"
    "\"number\"},\"sources\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"pattern\":"
    "\"^https?://[a-z0-9.]+/[a-z0-9/]*$\"}}},\"required\":[\"answer\",\"confidence\"]}",
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"value\":{\"type\":\"integer\"},"
    "\"children\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":3}},"
    "\"required\":[\"value\"]}},\"$ref\":\"#/$defs/node\"}",
    "{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"circle\"},\"r\":{\"type\":"
    "\"number\"}},\"required\":[\"kind\",\"r\"]},{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":"
    "\"rect\"},\"w\":{\"type\":\"number\"},\"h\":{\"type\":\"number\"}},\"required\":[\"kind\",\"w\",\"h\"]}]}",
};
#define N_SCHEMAS (sizeof schemas / sizeof *schemas)

static char *gen_grammar(int i)
{
    buf g = {0}, rules = {0};
    int n_rules = 0;
    if (i >= 5 && i < 5 + (int)N_SCHEMAS + 1) {
        char *out = NULL;
        tp_err err;
        int rc = i == 5 + (int)N_SCHEMAS ? tp_jschema_json_mode_gbnf(&out, &err)
                                          : tp_jschema_to_gbnf(schemas[i - 5], strlen(schemas[i - 5]), NULL, &out, &err);
        if (rc) {
            fprintf(stderr, "schema %d: %s\n", i - 5, err.msg);
            exit(1);
        }
        return out;
    }
    if (i == 0)
        add(&g, "root ::= object\n");
    else if (i == 1)
        add(&g, "root ::= value\n");
    else if (i == 2)
        add(&g, "root ::= line{1,20}\nline ::= field (\",\" field){2,6} \"\\n\"\nfield ::= [a-zA-Z0-9 ]{0,12} | string\n");
    else if (i == 3)
        add(&g, "root ::= (\"- \" [^\\n]{1,80} \"\\n\"){1,10}\n");
    else if (i == 4)
        add(&g, "root ::= \"Answer: \" (\"yes\" | \"no\") \"\\nReason: \" [^\\n]{0,200}\n");
    else {
        buf t = {0};
        /* a schema's root object */
        do {
            free(t.s);
            t = (buf){0};
            free(rules.s);
            rules = (buf){0};
            n_rules = 0;
            gen_type(&t, &rules, &n_rules, 0);
        } while (!n_rules);
        add(&g, "root ::= %s ws\n%s", t.s, rules.s);
        free(t.s);
    }
    add(&g, "%s", common_rules);
    free(rules.s);
    return g.s;
}

static int cmp_d(const void *a, const void *b) { return bench_cmp_double(a, b); }

static double pct(double *v, size_t n, double p)
{
    if (!n)
        return 0;
    size_t k = (size_t)(p * (double)(n - 1) + 0.5);
    return v[k];
}

static void bench_vocab(const char *models, const char *file, char **grammars)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", models, file);
    double t_vocab;
    tp_gvocab *v = bench_gvocab_open(file, path, &t_vocab);
    if (!v)
        return;
    tp_err err;
    int n = tp_gvocab_size(v);
    size_t words = tp_gmask_words(n);
    uint64_t *mask = malloc(words * 8);
    size_t cap = (size_t)N_GRAMMARS * DOCS_PER_GRAMMAR * MAX_DOC_TOKENS;
    double *lat = malloc(cap * sizeof *lat);
    double *cold = malloc(cap * sizeof *cold);
    double compile[N_GRAMMARS];
    size_t n_lat = 0, n_cold = 0, max_engine = 0, n_tokens_total = 0, matcher_bytes = 0;
    double base_sum = 0, base_mask_sum = 0;
    int base_n = 0;
    int *allowed = malloc((size_t)n * sizeof *allowed);
    for (int gi = 0; gi < N_GRAMMARS; gi++) {
        tp_grammar *g;
        tp_gengine *e;
        double t0 = bench_cpu_now();
        if (tp_grammar_compile(grammars[gi], strlen(grammars[gi]), NULL, &g, &err) ||
            tp_gengine_new(g, v, NULL, &e, &err)) {
            printf("grammar %d: %s\n%s\n", gi, err.msg, grammars[gi]);
            exit(1);
        }
        compile[gi] = bench_cpu_now() - t0;
        for (int d = 0; d < DOCS_PER_GRAMMAR; d++) {
            tp_gmatch *m;
            tp_gmatch_new(e, &m, &err);
            matcher_bytes = tp_gmatch_memory(m);
            for (int s = 0; s < MAX_DOC_TOKENS && !tp_gmatch_done(m); s++) {
                size_t before = tp_gengine_memory(e);
                double a = bench_cpu_now();
                if (tp_gmatch_mask(m, mask, &err)) {
                    printf("grammar %d: %s\n", gi, err.msg);
                    exit(1);
                }
                double dt = bench_cpu_now() - a;
                lat[n_lat++] = dt;
                if (getenv("BENCH_SLOW") && dt > atof(getenv("BENCH_SLOW")) * 1e-6) {
                    int c = 0;
                    for (int t = 0; t < n; t++)
                        c += (mask[t / 64] >> (t % 64)) & 1;
                    fprintf(stderr, "slow %.0f us grammar %d doc %d step %d allowed %d cold %d\n", dt * 1e6, gi, d, s, c,
                            tp_gengine_memory(e) != before);
                }
                if (tp_gengine_memory(e) != before)
                    cold[n_cold++] = dt;
                /* the baseline: every token checked on its own, sometimes */
                if ((n_lat % 97) == 0 && base_n < 40) {
                    a = bench_cpu_now();
                    int cnt = 0;
                    for (int t = 0; t < n; t++)
                        cnt += tp_gmatch_allows(m, t);
                    base_sum += bench_cpu_now() - a;
                    base_mask_sum += dt;
                    base_n++;
                    (void)cnt;
                }
                int na = 0, ns = 0;
                for (int t = 0; t < n; t++)
                    if ((mask[t / 64] >> (t % 64)) & 1)
                        allowed[na++] = t;
                if (!na)
                    break;
                /* prefer a one-byte token now and then: strings and arrays end */
                int pick = allowed[rnd((uint32_t)na)];
                if (rnd(4) == 0) {
                    for (int k = 0; k < na; k++) {
                        size_t l;
                        tp_gvocab_bytes(v, allowed[k], &l);
                        if (l <= 1)
                            allowed[ns++] = allowed[k];
                    }
                    if (ns)
                        pick = allowed[rnd((uint32_t)ns)];
                }
                if (tp_gmatch_accept(m, pick, &err)) {
                    printf("grammar %d: accept: %s\n", gi, err.msg);
                    exit(1);
                }
                n_tokens_total++;
                if (tp_gvocab_is_eog(v, pick))
                    break;
            }
            tp_gmatch_free(m);
        }
        if (tp_gengine_memory(e) > max_engine)
            max_engine = tp_gengine_memory(e);
        tp_gengine_free(e);
        tp_grammar_free(g);
    }
    qsort(lat, n_lat, sizeof *lat, cmp_d);
    qsort(cold, n_cold, sizeof *cold, cmp_d);
    qsort(compile, N_GRAMMARS, sizeof *compile, cmp_d);
    printf("%s: %d tokens, vocabulary index %.1f MB built in %.1f ms\n", file, n, tp_gvocab_memory(v) / 1e6,
           t_vocab * 1e3);
    printf("  mask per token (%zu masks, %d grammars): p50 %.1f us  p90 %.1f us  p99 %.1f us  max %.1f us\n", n_lat,
           N_GRAMMARS, pct(lat, n_lat, 0.5) * 1e6, pct(lat, n_lat, 0.9) * 1e6, pct(lat, n_lat, 0.99) * 1e6,
           lat[n_lat - 1] * 1e6);
    printf("  cold masks (first visit of a state, %zu = %.1f%%): p50 %.1f us  p99 %.1f us\n", n_cold,
           100.0 * (double)n_cold / (double)n_lat, pct(cold, n_cold, 0.5) * 1e6, pct(cold, n_cold, 0.99) * 1e6);
    printf("  compile GBNF -> engine: p50 %.3f ms  p95 %.3f ms  max %.3f ms\n", pct(compile, N_GRAMMARS, 0.5) * 1e3,
           pct(compile, N_GRAMMARS, 0.95) * 1e3, compile[N_GRAMMARS - 1] * 1e3);
    printf("  memory: matcher %zu bytes; largest engine (DFA + mask cache, shared by a grammar's jobs) %.1f MB\n",
           matcher_bytes, max_engine / 1e6);
    if (base_n)
        printf("  baseline (every token's bytes walked per step): %.1f us per mask vs %.1f us here on the same "
               "%d positions: %.0fx\n",
               base_sum / base_n * 1e6, base_mask_sum / base_n * 1e6, base_n, base_sum / base_mask_sum);
    /* schema -> ready engine, as the broker and a sample worker do it */
    double sc[N_SCHEMAS * 20];
    size_t n_sc = 0;
    for (int r = 0; r < 20; r++)
        for (size_t k = 0; k < N_SCHEMAS; k++) {
            double a = bench_cpu_now();
            char *gb = NULL;
            tp_grammar *g = NULL;
            tp_gengine *e = NULL;
            if (!tp_jschema_to_gbnf(schemas[k], strlen(schemas[k]), NULL, &gb, &err) &&
                !tp_grammar_compile(gb, strlen(gb), NULL, &g, &err))
                tp_gengine_new(g, v, NULL, &e, &err);
            sc[n_sc++] = bench_cpu_now() - a;
            tp_gengine_free(e);
            tp_grammar_free(g);
            free(gb);
        }
    qsort(sc, n_sc, sizeof *sc, cmp_d);
    printf("  compile schema -> engine (%zu schemas x 20): p50 %.3f ms  p95 %.3f ms\n", N_SCHEMAS,
           pct(sc, n_sc, 0.5) * 1e3, pct(sc, n_sc, 0.95) * 1e3);
    free(allowed);
    free(lat);
    free(cold);
    free(mask);
    tp_gvocab_free(v);
}

int main(int argc, char **argv)
{
    const char *models = getenv("TP_MODELS") ? getenv("TP_MODELS") : "../shared/models";
    char *grammars[N_GRAMMARS];
    for (int i = 0; i < N_GRAMMARS; i++)
        grammars[i] = gen_grammar(i);
    if (argc > 1 && !strcmp(argv[1], "--print")) {
        for (int i = 0; i < N_GRAMMARS; i++)
            printf("# grammar %d\n%s\n", i, grammars[i]);
        return 0;
    }
    if (argc > 1) {   /* one vocabulary (a path under TP_MODELS), e.g. for a profiler */
        bench_vocab(models, argv[1], grammars);
        argc = -1;
    }
    if (argc >= 0)
        bench_vocab(models, "llama.cpp-vocab/ggml-vocab-llama-spm.gguf", grammars);
    if (argc >= 0) {
        bench_vocab(models, "hf-vocab/llama3-vocab.gguf", grammars);
        bench_vocab(models, "hf-vocab/qwen3-vocab.gguf", grammars);
    }
    for (int i = 0; i < N_GRAMMARS; i++)
        free(grammars[i]);
    return 0;
}
