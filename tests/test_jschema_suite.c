/* The official JSON-Schema-Test-Suite (Debian json-schema-test-suite, its
 * draft 7 cases read as 2020-12: $ref siblings dropped, `items: [..]` ->
 * prefixItems, `additionalItems` -> items) run the way MaskBench does:
 * every case whose schema compiles is kept; each valid instance must be a
 * sentence of the grammar (no wrong rejection) and each invalid one must
 * not (no wrong acceptance). Schemas refused for a keyword are counted as
 * skipped, by keyword. Instances are written in the grammar's canonical
 * form (tokpipe/jschema.h): no spaces, keys in the order the schema names
 * them; a valid instance outside the documented bounds (numbers past 16
 * digits or with an exponent) is counted apart, never as a pass.
 *
 * Each instance is checked twice: by the brute-force recognizer over its
 * characters, and MaskBench's way through the grammar engine: the
 * instance tokenized with the real Llama 3 vocabulary (128,256 tokens), each
 * token must be allowed by the mask at its step, and the end-of-generation
 * id must be allowed at the end exactly when the instance is valid.
 *
 * TP_JSCHEMA_SUITE overrides the suite's folder (…/tests/draft7). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/gbnf_bt.h"
#include "tokpipe/grammar.h"
#include "tokpipe/jschema.h"
#include "tokpipe/tokenizer.h"

#define SUITE_DIR "/usr/share/json-schema-test-suite/tests/draft7"

typedef struct masker {
    tp_tokenizer *tok;
    tp_gvocab *v;
    int eog;
    uint64_t *mask;
    int vocab;
} masker;

typedef struct tally {
    masker *mk;
    int mask_wrong_reject, mask_wrong_accept, mask_steps;
    int cases, compiled, skipped;
    int valid, invalid, wrong_reject, wrong_accept, out_of_bounds, undecided;
    char skip_kw[64][48];
    int skip_n[64], nkw;
} tally;

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    if (b) b[n] = 0;
    fclose(f);
    return b;
}

/* draft 7 -> 2020-12, in place */
static void to_2020(cJSON *s, bool root)
{
    if (!cJSON_IsObject(s)) {
        if (cJSON_IsArray(s))
            for (cJSON *e = s->child; e; e = e->next) to_2020(e, false);
        return;
    }
    if (cJSON_GetObjectItemCaseSensitive(s, "$ref")) {
        /* draft 7: everything beside $ref is ignored (definitions stay to be found) */
        for (cJSON *k = s->child, *next; k; k = next) {
            next = k->next;
            if (strcmp(k->string, "$ref") && strcmp(k->string, "definitions") && !(root && !strcmp(k->string, "$schema")))
                cJSON_Delete(cJSON_DetachItemViaPointer(s, k));
        }
    }
    cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    cJSON *add = cJSON_DetachItemFromObjectCaseSensitive(s, "additionalItems");
    if (cJSON_IsArray(items)) {
        cJSON *pre = cJSON_DetachItemFromObjectCaseSensitive(s, "items");
        cJSON_AddItemToObject(s, "prefixItems", pre);
        if (add) cJSON_AddItemToObject(s, "items", add), add = NULL;
    }
    cJSON_Delete(add);
    cJSON_Delete(cJSON_DetachItemFromObjectCaseSensitive(s, "$schema"));
    for (cJSON *k = s->child; k; k = k->next)
        if (strcmp(k->string, "enum") && strcmp(k->string, "const") && strcmp(k->string, "default") &&
            strcmp(k->string, "examples"))
            to_2020(k, false);
}

/* property names in the order the schema first names them */
static void name_order(const cJSON *s, const char **names, int *n, int max)
{
    if (!s) return;
    if (cJSON_IsObject(s)) {
        for (const cJSON *k = s->child; k; k = k->next) {
            if (!strcmp(k->string, "enum") || !strcmp(k->string, "const")) {
                /* objects in enum/const are written with their keys in the given order */
                for (const cJSON *v = cJSON_IsArray(k) ? k->child : k; v; v = cJSON_IsArray(k) ? v->next : NULL)
                    for (const cJSON *p = cJSON_IsObject(v) ? v->child : NULL; p; p = p->next) {
                        bool seen = false;
                        for (int i = 0; i < *n && !seen; i++) seen = !strcmp(names[i], p->string);
                        if (!seen && *n < max) names[(*n)++] = p->string;
                    }
                continue;
            }
            if ((!strcmp(k->string, "properties") && cJSON_IsObject(k)) || (!strcmp(k->string, "required") && cJSON_IsArray(k)))
                for (const cJSON *p = k->child; p; p = p->next) {
                    const char *nm = cJSON_IsObject(k) ? p->string : cJSON_IsString(p) ? p->valuestring : NULL;
                    bool seen = !nm;
                    for (int i = 0; i < *n && !seen; i++) seen = !strcmp(names[i], nm);
                    if (!seen && *n < max) names[(*n)++] = nm;
                }
            name_order(k, names, n, max);
        }
    } else if (cJSON_IsArray(s)) {
        for (const cJSON *e = s->child; e; e = e->next) name_order(e, names, n, max);
    }
}

static void reorder(cJSON *v, const char **names, int n)
{
    if (cJSON_IsObject(v)) {
        cJSON *sorted = NULL, *tail = NULL;
        for (int i = 0; i <= n; i++)
            for (cJSON *k = v->child, *next; k; k = next) {
                next = k->next;
                if (i < n && strcmp(k->string, names[i])) continue;
                cJSON_DetachItemViaPointer(v, k);
                k->prev = tail;
                k->next = NULL;
                if (tail) tail->next = k;
                else sorted = k;
                tail = k;
                if (i < n) break;
            }
        v->child = sorted;
        if (sorted) sorted->prev = tail;
    }
    if (cJSON_IsObject(v) || cJSON_IsArray(v))
        for (cJSON *e = v->child; e; e = e->next) reorder(e, names, n);
}

/* numbers the grammar's digit bounds cannot write */
static bool out_of_bounds(const cJSON *v)
{
    if (cJSON_IsNumber(v)) {
        char *t = cJSON_PrintUnformatted(v);
        bool bad = strpbrk(t, "eE") || strcspn(t, ".") > 17 || (strchr(t, '.') && strlen(strchr(t, '.')) > 17);
        free(t);
        return bad;
    }
    for (const cJSON *e = v->child; e && (cJSON_IsArray(v) || cJSON_IsObject(v)); e = e->next)
        if (out_of_bounds(e)) return true;
    return false;
}

/* 1 when the engine lets the instance through token by token and then
 * allows end-of-generation, 0 when it blocks it somewhere */
static int mask_walk(tally *t, tp_gengine *eng, const char *inst)
{
    masker *k = t->mk;
    size_t len = strlen(inst), n;
    int *ids = malloc((len + 2) * sizeof *ids);
    tp_err err;
    if (tp_tokenizer_encode(k->tok, inst, len, false, ids, len + 2, &n, &err)) fail_msg("encode: %s", err.msg);
    tp_gmatch *m;
    if (tp_gmatch_new(eng, &m, &err)) fail_msg("matcher: %s", err.msg);
    int ok = 1;
    for (size_t i = 0; i <= n && ok; i++) {
        if (tp_gmatch_mask(m, k->mask, &err)) fail_msg("mask: %s", err.msg);
        t->mask_steps++;
        int id = i < n ? ids[i] : k->eog;
        if (!(k->mask[id / 64] >> (id % 64) & 1)) {
            ok = 0;
            break;
        }
        if (i < n && tp_gmatch_accept(m, id, &err)) fail_msg("accept of an allowed token failed: %s", err.msg);
    }
    tp_gmatch_free(m);
    free(ids);
    return ok;
}

static void skip_kw(tally *t, const char *full)
{
    char kw[48], msg[TP_ERR_MSG_MAX];
    /* the keyword, not where the refusal points: " (at \"/ptr\": value)" */
    const char *at = strstr(full, " (at \"");
    snprintf(msg, sizeof msg, "%.*s", at ? (int)(at - full) : (int)strlen(full), full);
    const char *q = strchr(msg, '\'');
    const char *p = strstr(msg, "json schema: ");
    if (q && strchr(q + 1, '\'') && strchr(q + 1, '\'') - q < 40) {
        snprintf(kw, sizeof kw, "%.*s", (int)(strchr(q + 1, '\'') - q - 1), q + 1);
    } else {
        p = p ? p + 13 : msg;
        snprintf(kw, sizeof kw, "%.*s", (int)strcspn(p, ":"), p);
    }
    for (int i = 0; i < t->nkw; i++)
        if (!strcmp(t->skip_kw[i], kw)) {
            t->skip_n[i]++;
            return;
        }
    if (t->nkw < 64) {
        snprintf(t->skip_kw[t->nkw], sizeof t->skip_kw[0], "%s", kw);
        t->skip_n[t->nkw++] = 1;
    }
}

static void run_file(const char *path, bool draft7, tally *t)
{
    char *text = slurp(path);
    if (!text) fail_msg("cannot read %s", path);
    cJSON *doc = cJSON_Parse(text);
    free(text);
    if (!doc) fail_msg("%s: not JSON", path);
    for (cJSON *c = doc->child; c; c = c->next) {
        t->cases++;
        cJSON *schema = cJSON_Duplicate(cJSON_GetObjectItem(c, "schema"), true);
        if (draft7) to_2020(schema, true);
        char *st = cJSON_PrintUnformatted(schema);
        char *g = NULL;
        tp_err err = {0};
        int rc = tp_jschema_to_gbnf(st, strlen(st), NULL, &g, &err);
        gbt *o = NULL;
        if (rc) {
            t->skipped++;
            skip_kw(t, err.msg);
        } else {
            const char *why = "?";
            o = gbt_new(g, &why);
            if (!o) fail_msg("%s: %s: unreadable GBNF (%s)", path, st, why);
            t->compiled++;
        }
        tp_grammar *gr = NULL;
        tp_gengine *eng = NULL;
        if (o && t->mk) {
            tp_grammar_limits gl;
            tp_grammar_limits_default(&gl);
            gl.max_compile_ms = 600000; /* no wall clock in a test */
            if (tp_grammar_compile(g, strlen(g), &gl, &gr, &err)) fail_msg("%s: the engine refuses the GBNF of %s: %s", path, st, err.msg);
            if (tp_gengine_new(gr, t->mk->v, NULL, &eng, &err)) fail_msg("engine: %s", err.msg);
        }
        const char *names[256];
        int nn = 0;
        name_order(schema, names, &nn, 256);
        for (cJSON *x = o ? cJSON_GetObjectItem(c, "tests")->child : NULL; x; x = x->next) {
            cJSON *data = cJSON_GetObjectItem(x, "data");
            bool valid = cJSON_IsTrue(cJSON_GetObjectItem(x, "valid"));
            if (valid && out_of_bounds(data)) {
                t->out_of_bounds++;
                continue;
            }
            reorder(data, names, nn);
            char *inst = cJSON_PrintUnformatted(data);
            int m = gbt_match(o, inst, strlen(inst));
            if (eng) {
                int mm = mask_walk(t, eng, inst);
                if (valid && !mm) {
                    t->mask_wrong_reject++;
                    printf("  MASK WRONG REJECTION %s: %s | %s\n", strrchr(path, '/') + 1, st, inst);
                } else if (!valid && mm) {
                    t->mask_wrong_accept++;
                    printf("  MASK WRONG ACCEPTANCE %s: %s | %s\n", strrchr(path, '/') + 1, st, inst);
                }
            }
            valid ? t->valid++ : t->invalid++;
            if (m < 0) {
                t->undecided++;
                printf("  undecided: %s | %s | %s\n", path + strlen(path) - strcspn(path, "/") * 0, st, inst);
            } else if (valid && !m) {
                t->wrong_reject++;
                printf("  WRONG REJECTION %s\n    schema %s\n    instance %s (%s)\n", strrchr(path, '/') + 1, st, inst,
                       cJSON_GetObjectItem(x, "description")->valuestring);
            } else if (!valid && m) {
                t->wrong_accept++;
                printf("  WRONG ACCEPTANCE %s\n    schema %s\n    instance %s (%s)\n", strrchr(path, '/') + 1, st, inst,
                       cJSON_GetObjectItem(x, "description")->valuestring);
            }
            free(inst);
        }
        tp_gengine_free(eng);
        tp_grammar_free(gr);
        gbt_free(o);
        free(g);
        free(st);
        cJSON_Delete(schema);
    }
    cJSON_Delete(doc);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void run_dir(const char *dir, tally *t)
{
    DIR *d = opendir(dir);
    if (!d) fail_msg("cannot open %s (scripts/install-deps.sh installs json-schema-test-suite)", dir);
    char *files[256];
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) && n < 256;) {
        size_t l = strlen(e->d_name);
        if (l > 5 && !strcmp(e->d_name + l - 5, ".json")) files[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(files, (size_t)n, sizeof *files, cmp_str);
    for (int i = 0; i < n; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        /* remote refs need a server; they would only be skipped */
        if (strcmp(files[i], "refRemote.json")) run_file(path, true, t);
        free(files[i]);
    }
}

static void jschema_passes_the_json_schema_test_suite(void **state)
{
    (void)state;
    const char *base = getenv("TP_JSCHEMA_SUITE");
    if (!base || !*base) base = SUITE_DIR;
    tally t = {0};
    char dir[1024];
    masker mk = {0};
    tp_err err;
    const char *models = getenv("TP_MODELS");
    snprintf(dir, sizeof dir, "%s/hf-vocab/llama3-vocab.gguf", models && *models ? models : "../shared/models");
    if (tp_tokenizer_open(dir, 0, &mk.tok, &err)) fail_msg("%s: %s", dir, err.msg);
    const int32_t *eog32;
    int n_eog = tp_tokenizer_eog_ids(mk.tok, &eog32);
    int eog[16];
    for (int i = 0; i < n_eog && i < 16; i++) eog[i] = eog32[i];
    if (n_eog < 1) fail_msg("%s: no end-of-generation id", dir);
    if (tp_gvocab_from_tokenizer(mk.tok, eog, n_eog < 16 ? n_eog : 16, &mk.v, &err)) fail_msg("vocab: %s", err.msg);
    mk.eog = eog[0];
    mk.vocab = tp_gvocab_size(mk.v);
    mk.mask = calloc(tp_gmask_words(mk.vocab), sizeof *mk.mask);
    t.mk = &mk;
    run_dir(base, &t);
    snprintf(dir, sizeof dir, "%s/optional", base);
    run_dir(dir, &t);
    snprintf(dir, sizeof dir, "%s/optional/format", base);
    run_dir(dir, &t);
    /* cases written for 2020-12 (prefixItems, $defs, $ref siblings, uuid, ...),
     * their expectations checked by python3-jsonschema in jschema_jsonschema_test.py */
    const char *own = getenv("TP_JSCHEMA_CASES");
    run_file(own && *own ? own : "tests/support/jschema_2020_12.json", false, &t);
    printf("json-schema-test-suite (%s) + 2020-12 cases: %d cases, %d compiled, %d skipped as refused\n", base, t.cases, t.compiled,
           t.skipped);
    printf("  valid instances %d: wrong rejections %d; invalid instances %d: wrong acceptances %d\n", t.valid,
           t.wrong_reject, t.invalid, t.wrong_accept);
    printf("  valid instances outside the digit bounds (not tested): %d; undecided: %d\n", t.out_of_bounds, t.undecided);
    printf("  token masks (Llama 3 vocabulary, %d mask steps): wrong rejections %d, wrong acceptances %d\n", t.mask_steps,
           t.mask_wrong_reject, t.mask_wrong_accept);
    printf("  refused keywords:");
    for (int i = 0; i < t.nkw; i++) printf(" %s=%d", t.skip_kw[i], t.skip_n[i]);
    printf("\n");
    assert_true(t.compiled >= 80);
    assert_int_equal(t.undecided, 0);
    assert_int_equal(t.wrong_reject, 0);
    assert_int_equal(t.wrong_accept, 0);
    assert_int_equal(t.mask_wrong_reject, 0);
    assert_int_equal(t.mask_wrong_accept, 0);
    assert_true(t.mask_steps > 1000);
    free(mk.mask);
    tp_gvocab_free(mk.v);
    tp_tokenizer_free(mk.tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(jschema_passes_the_json_schema_test_suite),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
