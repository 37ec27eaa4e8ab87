/* The grammar engine: every GBNF construct and error; token masks checked
 * token by token against a naive recognizer (tests/support/gbnf_oracle.c)
 * on real vocabularies (SentencePiece with byte fallback, byte-level BPE);
 * partial UTF-8, control tokens, end of generation only when accepting,
 * done, replay. */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/gbnf_oracle.h"
#include "tokpipe/grammar.h"
#include "tokpipe/tokenizer.h"

static char *model_path(const char *name, char *buf, size_t cap)
{
    const char *dir = getenv("TP_MODELS");
    snprintf(buf, cap, "%s/%s", dir ? dir : "../shared/models", name);
    return buf;
}

/* A vocabulary of the 256 single bytes (token b = byte b) and an EOS 256. */
static tp_gvocab *byte_vocab(void)
{
    static uint8_t bytes[256];
    const uint8_t *b[257];
    size_t l[257];
    for (int i = 0; i < 256; i++) {
        bytes[i] = (uint8_t)i;
        b[i] = &bytes[i];
        l[i] = 1;
    }
    b[256] = NULL;
    l[256] = 0;
    int eos = 256;
    tp_gvocab *v;
    tp_err err;
    if (tp_gvocab_new(257, b, l, &eos, 1, &v, &err))
        fail_msg("byte vocab: %s", err.msg);
    return v;
}

static tp_grammar *compile_ok(const char *gbnf)
{
    tp_grammar *g;
    tp_err err;
    if (tp_grammar_compile(gbnf, strlen(gbnf), NULL, &g, &err))
        fail_msg("compiling %s: %s", gbnf, err.msg);
    return g;
}

/* 1 if text is a whole sentence, 0 if a prefix only, -1 if refused. */
static int engine_match(const char *gbnf, const char *text, size_t n)
{
    tp_grammar *g = compile_ok(gbnf);
    tp_gvocab *v = byte_vocab();
    tp_gengine *e;
    tp_gmatch *m;
    tp_err err;
    assert_int_equal(tp_gengine_new(g, v, NULL, &e, &err), 0);
    assert_int_equal(tp_gmatch_new(e, &m, &err), 0);
    int r = tp_gmatch_accept_bytes(m, (const uint8_t *)text, n, &err) ? -1 : tp_gmatch_accepting(m) ? 1 : 0;
    tp_gmatch_free(m);
    tp_gengine_free(e);
    tp_gvocab_free(v);
    tp_grammar_free(g);
    return r;
}

static int oracle_match(const char *gbnf, const char *text, size_t n)
{
    gbnf_oracle *o = gbnf_oracle_new(gbnf);
    if (!o)
        fail_msg("oracle cannot parse %s", gbnf);
    int r = gbnf_oracle_complete(o, (const uint8_t *)text, n) ? 1
            : gbnf_oracle_prefix(o, (const uint8_t *)text, n) ? 0 : -1;
    gbnf_oracle_free(o);
    return r;
}

typedef struct gcase {
    const char *gbnf;
    const char *yes[6];   /* whole sentences */
    const char *pre[4];   /* prefixes that are not sentences */
    const char *no[6];    /* refused */
} gcase;

static const gcase constructs[] = {
    {"root ::= \"ab\" \"c\"", {"abc"}, {"", "a", "ab"}, {"b", "abcd", "x"}},
    {"root ::= \"a\" | \"b\" | \"cd\"", {"a", "b", "cd"}, {"c"}, {"ab", "d"}},
    {"root ::= (\"a\" | \"b\") \"c\"", {"ac", "bc"}, {"a"}, {"c", "abc"}},
    {"root ::= \"a\"*", {"", "a", "aaaa"}, {0}, {"b", "aab"}},
    {"root ::= \"a\"+ \"b\"", {"ab", "aaab"}, {"a", "aa"}, {"b", "abb"}},
    {"root ::= \"a\"? \"b\"", {"ab", "b"}, {"a"}, {"aab"}},
    {"root ::= \"a\"{3}", {"aaa"}, {"aa"}, {"aaaa", "b"}},
    {"root ::= \"a\"{2,}", {"aa", "aaaaa"}, {"a"}, {"b"}},
    {"root ::= \"a\"{1,3} \"b\"", {"ab", "aab", "aaab"}, {"aaa"}, {"aaaab", "b"}},
    {"root ::= \"a\"{,2} \"b\"", {"b", "ab", "aab"}, {"aa"}, {"aaab"}},
    {"root ::= (\"ab\" | \"c\"){2,3}", {"abab", "abcc", "ccc"}, {"c", "ab", "aba"}, {"abababx", "cccc"}},
    {"root ::= [a-c] [^a-c] [xyz]", {"a1x", "cdz"}, {"b", "bq"}, {"d", "aa", "a1a"}},
    {"root ::= [^\"\\\\]*", {"", "abc", "\xc3\xa9t\xc3\xa9"}, {"\xc3"}, {"\"", "a\\"}},
    {"root ::= . .", {"ab", "\xe2\x82\xac!"}, {"a", "\xe2\x82"}, {"abc", "\xff"}},
    {"root ::= \"\\x41\\u00e9\\U0001F600\\n\\t\\\\\\\"\"", {"A\xc3\xa9\xf0\x9f\x98\x80\n\t\\\""}, {"A\xc3", "A\xc3\xa9\xf0\x9f"}, {"B"}},
    {"root ::= [\\u0391-\\u03a9]+", {"\xce\x91", "\xce\xa9\xce\x92"}, {"\xce"}, {"a", "\xce\x80"}},
    {"root ::= [\\x00-\\x7f\\U00010000-\\U0010ffff]", {"a", "\xf4\x8f\xbf\xbf"}, {"\xf0"}, {"\xc3\xa9", "\xf4\x90"}},
    {"# a comment\nroot ::= a b # trailing\na ::= \"x\"\nb ::= \"y\" | a\n", {"xy", "xx"}, {"x"}, {"y"}},
    {"root ::= (\n  \"a\"\n  | \"b\"\n)\n  \"c\"", {0}, {0}, {0}},   /* newline ends the rule: placeholder replaced below */
    {"root ::= item (\",\" item)*\nitem ::= [0-9]+", {"1", "12,3,456"}, {"1,"}, {",", "1,,2"}},
    {"root ::= \"(\" root \")\" | \"\"", {"", "()", "((()))"}, {"((", "(()"}, {")", "())"}},
    {"root ::= x\nx ::= \"a\" x | \"b\"", {"b", "aab"}, {"aa"}, {"ba"}},
    {"root ::= \"\xc3\xa9t\xc3\xa9\" [\xce\xb1-\xcf\x89]", {"\xc3\xa9t\xc3\xa9\xce\xb2"}, {"\xc3\xa9t\xc3"}, {"ete"}},
};

static void constructs_match_the_oracle(void **state)
{
    (void)state;
    for (size_t c = 0; c < sizeof constructs / sizeof *constructs; c++) {
        const gcase *k = &constructs[c];
        if (!k->yes[0] && !k->pre[0])
            continue;
        for (int i = 0; i < 6 && k->yes[i]; i++) {
            int e = engine_match(k->gbnf, k->yes[i], strlen(k->yes[i]));
            if (e != 1 || oracle_match(k->gbnf, k->yes[i], strlen(k->yes[i])) != 1)
                fail_msg("%s: '%s' should be a sentence (engine %d)", k->gbnf, k->yes[i], e);
        }
        for (int i = 0; i < 4 && k->pre[i]; i++) {
            int e = engine_match(k->gbnf, k->pre[i], strlen(k->pre[i]));
            if (e != 0 || oracle_match(k->gbnf, k->pre[i], strlen(k->pre[i])) != 0)
                fail_msg("%s: '%s' should be a prefix only (engine %d)", k->gbnf, k->pre[i], e);
        }
        for (int i = 0; i < 6 && k->no[i]; i++) {
            int e = engine_match(k->gbnf, k->no[i], strlen(k->no[i]));
            if (e != -1 || oracle_match(k->gbnf, k->no[i], strlen(k->no[i])) != -1)
                fail_msg("%s: '%s' should be refused (engine %d)", k->gbnf, k->no[i], e);
        }
    }
}

static void groups_span_lines_and_alternatives_continue_after_a_bar(void **state)
{
    (void)state;
    const char *g = "root ::= (\n  \"a\"\n  | \"b\"\n) \"c\" |\n  \"d\"\n";
    assert_int_equal(engine_match(g, "ac", 2), 1);
    assert_int_equal(engine_match(g, "bc", 2), 1);
    assert_int_equal(engine_match(g, "d", 1), 1);
    assert_int_equal(engine_match(g, "a", 1), 0);
}

typedef struct ecase {
    const char *gbnf;
    const char *want;
} ecase;

static void malformed_grammars_are_refused_naming_the_problem(void **state)
{
    (void)state;
    static const ecase cases[] = {
        {"root ::= foo", "undefined rule foo"},
        {"a ::= \"x\"", "no rule named root"},
        {"root ::= root \"a\" | \"b\"", "left recursion through rule root"},
        {"root ::= a\na ::= b? a \"x\"\nb ::= \"y\"", "left recursion"},
        {"root ::= \"abc", "line 1 col 10: unterminated string literal"},
        {"root ::= [abc", "unterminated character class"},
        {"root ::= \"\\q\"", "unknown escape \\q"},
        {"root ::= \"\\x4\"", "2 hex digits"},
        {"root ::= \"\\uD800\"", "surrogate"},
        {"root ::= \"a\"{3,1}", "n < m"},
        {"root ::= \"a\"{2", "expected }"},
        {"root ::= (\"a\"", "missing )"},
        {"root ::= \"a\" )", "line 1 col 14: unexpected character"},
        {"root ::= \"a\"\nroot ::= \"b\"", "line 2 col 1: rule root is defined twice"},
        {"root \"a\"", "expected ::="},
        {"::= \"a\"", "expected a rule name"},
        {"root ::= [z-a]", "out of order"},
        {"root ::= []", "empty character class"},
        {"root ::= <[x]>", "expected a token id in <[id]>"},
        {"root ::= <[12>", "expected ]> after the token id"},
        {"root ::= <|im_end|", "line 1 col 10: unterminated token reference"},
        {"root ::= <\"\">", "empty token text"},
        {"root ::= <\"ab>", "unterminated token text"},
        {"root ::= ! <|x|>", "unexpected character"},
        {"root ::= <a\tb>", "control character in a token reference"},
        {"root ::= <\xff>", "invalid UTF-8 in a token reference"},
        {"root ::= \"a\"\n\n  x ::= y", "line 3 col 9: undefined rule y"},
        {"root ::= \"\xff\"", "invalid UTF-8"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tp_grammar *g = NULL;
        tp_err err;
        tp_err_clear(&err);
        int rc = tp_grammar_compile(cases[i].gbnf, strlen(cases[i].gbnf), NULL, &g, &err);
        if (rc == 0 || g)
            fail_msg("%s: compiled, want an error with '%s'", cases[i].gbnf, cases[i].want);
        if (!strstr(err.msg, cases[i].want))
            fail_msg("%s: error '%s' does not say '%s'", cases[i].gbnf, err.msg, cases[i].want);
    }
}

static void limits_bound_size_rules_nesting_and_repeats(void **state)
{
    (void)state;
    tp_grammar_limits l;
    tp_grammar_limits_default(&l);
    tp_grammar *g = NULL;
    tp_err err;
    l.max_bytes = 10;
    assert_int_equal(tp_grammar_compile("root ::= \"abcdef\"", 17, &l, &g, &err), TP_ERANGE);
    assert_non_null(strstr(err.msg, "grammar.max_bytes"));
    tp_grammar_limits_default(&l);
    l.max_nesting = 3;
    const char *deep = "root ::= ((((\"a\"))))";
    assert_int_equal(tp_grammar_compile(deep, strlen(deep), &l, &g, &err), TP_ERANGE);
    assert_non_null(strstr(err.msg, "grammar.max_nesting"));
    tp_grammar_limits_default(&l);
    l.max_rules = 3;
    const char *many = "root ::= a b c d\na ::= \"a\"\nb ::= \"b\"\nc ::= \"c\"\nd ::= \"d\"";
    assert_int_equal(tp_grammar_compile(many, strlen(many), &l, &g, &err), TP_ERANGE);
    assert_non_null(strstr(err.msg, "grammar.max_rules"));
    tp_grammar_limits_default(&l);
    const char *rep = "root ::= \"a\"{1,100000}";
    assert_int_equal(tp_grammar_compile(rep, strlen(rep), &l, &g, &err), TP_ERANGE);
    assert_non_null(strstr(err.msg, "grammar.max_repeat"));
    l.max_elements = 1000;
    const char *big = "root ::= (\"abcdefgh\"{100}){100}";
    assert_int_equal(tp_grammar_compile(big, strlen(big), &l, &g, &err), TP_ERANGE);
    assert_non_null(strstr(err.msg, "grammar.max_elements"));
    assert_null(g);
}

static void print_gives_normalized_gbnf_that_compiles_to_the_same_language(void **state)
{
    (void)state;
    const char *src = "root ::= (\"ab\" | [0-9]+) \"\xc3\xa9\"? x\nx ::= [^a]";
    tp_grammar *g = compile_ok(src);
    char *txt = tp_grammar_print(g);
    assert_non_null(txt);
    assert_non_null(strstr(txt, "root ::="));
    tp_grammar *g2 = compile_ok(txt);
    const char *texts[] = {"ab\xc3\xa9z", "12b", "ab", "abx", "a", "\xc3\xa9", "9\xc3\xa9\xe2\x82\xac"};
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
        assert_int_equal(engine_match(src, texts[i], strlen(texts[i])), engine_match(txt, texts[i], strlen(texts[i])));
    free(txt);
    tp_grammar_free(g);
    tp_grammar_free(g2);
}

/* ---- masks against the oracle on real vocabularies ---- */

typedef struct vcase {
    const char *gbnf;
    const char *doc;      /* a sentence the walk follows */
} vcase;

static const char *const json_gbnf =
    "root ::= object\n"
    "value ::= object | array | string | number | (\"true\" | \"false\" | \"null\")\n"
    "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? ws \"}\"\n"
    "array ::= \"[\" ws ( value (\",\" ws value)* )? ws \"]\"\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\"\n"
    "number ::= \"-\"? ([0-9] | [1-9] [0-9]{1,15}) (\".\" [0-9]{1,16})?\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static const vcase vcases[] = {
    {NULL, "{\"name\": \"Ada\", \"tags\": [\"x\", 12, -3.5], \"ok\": true, \"s\": \"\xc3\xa9\\u00e9 \xe2\x82\xac\"}"},
    {"root ::= \"yes\" | \"no\" | \"maybe so\"", "maybe so"},
    {"root ::= [a-z]+ (\" \" [a-z]+){0,5} \".\"", "once upon a time."},
    {"root ::= \"Answer: \" [0-9]{1,4} \"\\n\"", "Answer: 1234\n"},
    {"root ::= \"\xce\xb1\xce\xb2\" [\xce\xb3-\xcf\x89]* \"!\"", "\xce\xb1\xce\xb2\xce\xb3\xce\xb4!"},
    {"root ::= (\"<\" [^<>]* \">\")+", "<a b><\xe4\xb8\xad\xe6\x96\x87>"},
    /* counted repetitions (chains of states): over all characters but one,
     * a JSON string's maxLength, a class whose count ends where another
     * repetition of part of it goes on */
    {"root ::= (\"- \" [^\\n]{1,12} \"\\n\"){1,3}", "- h\xc3\xa9llo w\xe2\x82\xacr!\n- \xe4\xb8\xad \xf0\x9f\x98\x80\n"},
    {"root ::= \"\\\"\" ([^\"\\\\\\x00-\\x1F] | \"\\\\\" [\"\\\\/bfnrt]){0,10} \"\\\"\"", "\"ab\xc3\xa9\\n\xe4\xb8\xad x\""},
    {"root ::= [a-zA-Z0-9 ]{0,6} (\",\" [a-z]{2,5}){1,3}", "ab 1,xyz,qq"},
    {"root ::= [a-z]{0,3} [a-z0-9]+ \".\"", "abcde1."},
};

/* Token ids in byte order, so that every token's extensions follow it. */
static const tp_gvocab *sort_vocab;

static int by_bytes(const void *a, const void *b)
{
    size_t la, lb;
    const uint8_t *x = tp_gvocab_bytes(sort_vocab, *(const int *)a, &la);
    const uint8_t *y = tp_gvocab_bytes(sort_vocab, *(const int *)b, &lb);
    int c = memcmp(x, y, la < lb ? la : lb);
    return c ? c : (la > lb) - (la < lb);
}

static int *byte_order(const tp_gvocab *v)
{
    int n = tp_gvocab_size(v);
    int *order = malloc((size_t)n * sizeof *order);
    for (int t = 0; t < n; t++)
        order[t] = t;
    sort_vocab = v;
    qsort(order, (size_t)n, sizeof *order, by_bytes);
    return order;
}

/* Check every token's mask bit and the end-of-generation bits against the
 * oracle at the matcher's position (text so far: done[0, nd)). The oracle
 * re-matches the whole text for every token, too slow for 152k tokens per
 * step under ASan; but a text the oracle refuses stays refused however it
 * goes on, so a token that extends a refused one is refused without asking
 * (tokens visited in byte order; `refused` holds the refused tokens that
 * are prefixes of the current one). */
static void check_mask(tp_gmatch *m, const tp_gvocab *v, const int *order, const int *eog, int n_eog,
                       gbnf_oracle *o, const uint8_t *done, size_t nd, uint64_t *mask, const char *what)
{
    tp_err err;
    if (tp_gmatch_mask(m, mask, &err))
        fail_msg("%s: mask: %s", what, err.msg);
    int n = tp_gvocab_size(v);
    uint8_t buf[1024];
    memcpy(buf, done, nd);
    bool complete = gbnf_oracle_complete(o, done, nd);
    assert_int_equal(complete, tp_gmatch_accepting(m));
    struct { const uint8_t *b; size_t l; } refused[64];
    int n_refused = 0;
    for (int i = 0; i < n; i++) {
        int t = order[i];
        bool got = (mask[t / 64] >> (t % 64)) & 1;
        bool is_eog = false;
        for (int k = 0; k < n_eog; k++)
            is_eog |= eog[k] == t;
        bool want;
        if (is_eog)
            want = complete;
        else {
            size_t l;
            const uint8_t *b = tp_gvocab_bytes(v, t, &l);
            while (n_refused && (refused[n_refused - 1].l > l ||
                                 memcmp(refused[n_refused - 1].b, b, refused[n_refused - 1].l)))
                n_refused--;
            if (l == 0 || nd + l > sizeof buf)
                want = false;
            else if (n_refused)
                want = false;
            else {
                memcpy(buf + nd, b, l);
                want = gbnf_oracle_prefix(o, buf, nd + l);
                if (!want && n_refused < 64)
                    refused[n_refused].b = b, refused[n_refused++].l = l;
            }
        }
        if (got != want)
            fail_msg("%s: after %zu bytes '%.*s': token %d is %s by the engine, %s by the oracle", what, nd,
                     (int)nd, (const char *)done, t, got ? "allowed" : "refused", want ? "allowed" : "refused");
        if (got != tp_gmatch_allows(m, t))
            fail_msg("%s: token %d: mask and tp_gmatch_allows disagree", what, t);
    }
}

static void walk_doc(const char *vocab_file, const vcase *c, int random_steps, uint64_t seed)
{
    char path[4096];
    tp_tokenizer *tok;
    tp_err err;
    if (tp_tokenizer_open(model_path(vocab_file, path, sizeof path), 0, &tok, &err))
        fail_msg("%s: %s", vocab_file, err.msg);
    const int32_t *eog32;
    int n_eog = tp_tokenizer_eog_ids(tok, &eog32);
    int eog[16];
    for (int i = 0; i < n_eog && i < 16; i++)
        eog[i] = eog32[i];
    tp_gvocab *v;
    if (tp_gvocab_from_tokenizer(tok, eog, n_eog, &v, &err))
        fail_msg("vocab: %s", err.msg);
    const char *gbnf = c->gbnf ? c->gbnf : json_gbnf;
    tp_grammar *g = compile_ok(gbnf);
    gbnf_oracle *o = gbnf_oracle_new(gbnf);
    assert_non_null(o);
    tp_gengine *e;
    tp_gmatch *m;
    assert_int_equal(tp_gengine_new(g, v, NULL, &e, &err), 0);
    assert_int_equal(tp_gmatch_new(e, &m, &err), 0);
    uint64_t *mask = malloc(tp_gmask_words(tp_gvocab_size(v)) * 8);
    int *order = byte_order(v);
    uint8_t done[1024];
    size_t nd = 0, dl = strlen(c->doc);
    char what[256];
    snprintf(what, sizeof what, "%s / %.40s", vocab_file, c->doc);
    /* follow the document with the longest allowed token each time */
    while (nd < dl) {
        check_mask(m, v, order, eog, n_eog, o, done, nd, mask, what);
        int best = -1;
        size_t bl = 0;
        for (int t = 0; t < tp_gvocab_size(v); t++) {
            size_t l;
            const uint8_t *b = tp_gvocab_bytes(v, t, &l);
            if (((mask[t / 64] >> (t % 64)) & 1) && l > bl && nd + l <= dl && !memcmp(b, c->doc + nd, l))
                best = t, bl = l;
        }
        if (best < 0)
            fail_msg("%s: no allowed token continues the document at byte %zu", what, nd);
        assert_int_equal(tp_gmatch_accept(m, best, &err), 0);
        memcpy(done + nd, c->doc + nd, bl);
        nd += bl;
    }
    check_mask(m, v, order, eog, n_eog, o, done, nd, mask, what);
    assert_true(tp_gmatch_accepting(m));
    /* then random allowed tokens from the start (odd partial tokens too) */
    tp_gmatch_free(m);
    assert_int_equal(tp_gmatch_new(e, &m, &err), 0);
    nd = 0;
    for (int s = 0; s < random_steps && !tp_gmatch_done(m); s++) {
        check_mask(m, v, order, eog, n_eog, o, done, nd, mask, what);
        int n_allowed = 0;
        for (int t = 0; t < tp_gvocab_size(v); t++)
            n_allowed += (mask[t / 64] >> (t % 64)) & 1;
        if (!n_allowed)
            fail_msg("%s: nothing allowed after '%.*s'", what, (int)nd, (const char *)done);
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int pick = (int)((seed >> 33) % (uint64_t)n_allowed), t = 0;
        for (;; t++)
            if (((mask[t / 64] >> (t % 64)) & 1) && pick-- == 0)
                break;
        size_t l;
        const uint8_t *b = tp_gvocab_bytes(v, t, &l);
        bool is_eog = tp_gvocab_is_eog(v, t);
        if (!is_eog && nd + l > 200)
            break;
        assert_int_equal(tp_gmatch_accept(m, t, &err), 0);
        if (is_eog) {
            assert_true(tp_gmatch_done(m));
            break;
        }
        memcpy(done + nd, b, l);
        nd += l;
    }
    free(mask);
    free(order);
    tp_gmatch_free(m);
    tp_gengine_free(e);
    gbnf_oracle_free(o);
    tp_grammar_free(g);
    tp_gvocab_free(v);
    tp_tokenizer_free(tok);
}

static void masks_match_the_oracle_on_the_spm_vocabulary(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof vcases / sizeof *vcases; i++)
        walk_doc("llama.cpp-vocab/ggml-vocab-llama-spm.gguf", &vcases[i], 6, 1234 + i);
}

static void masks_match_the_oracle_on_the_qwen3_vocabulary(void **state)
{
    (void)state;
    walk_doc("hf-vocab/qwen3-vocab.gguf", &vcases[0], 4, 99);
    walk_doc("hf-vocab/qwen3-vocab.gguf", &vcases[5], 4, 7);
    walk_doc("hf-vocab/qwen3-vocab.gguf", &vcases[6], 4, 8);
}

static void masks_match_the_oracle_on_the_llama3_vocabulary(void **state)
{
    (void)state;
    for (size_t i = 6; i < sizeof vcases / sizeof *vcases; i++)
        walk_doc("hf-vocab/llama3-vocab.gguf", &vcases[i], 4, 500 + i);
}

static void masks_match_the_oracle_on_stories260k(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof vcases / sizeof *vcases; i++)
        walk_doc("tok512.bin", &vcases[i], 30, 42 + i);
}

/* ---- small vocabularies: partial UTF-8, control tokens, EOS, done ---- */

static tp_gvocab *vocab_of(const char *const *toks, int n, int eos)
{
    const uint8_t *b[64];
    size_t l[64];
    for (int i = 0; i < n; i++) {
        b[i] = (const uint8_t *)toks[i];
        l[i] = toks[i] ? strlen(toks[i]) : 0;
    }
    tp_gvocab *v;
    tp_err err;
    if (tp_gvocab_new(n, b, l, &eos, 1, &v, &err))
        fail_msg("vocab: %s", err.msg);
    return v;
}

static uint64_t mask_of(tp_gmatch *m)
{
    uint64_t w[1];
    tp_err err;
    if (tp_gmatch_mask(m, w, &err))
        fail_msg("mask: %s", err.msg);
    return w[0];
}

static void partial_utf8_control_tokens_and_eos(void **state)
{
    (void)state;
    /* 0 "<s>" control (no bytes), 1 EOS, 2 "\xc3", 3 "\xa9", 4 "\xc3\xa9", 5 "e", 6 "\xa9x", 7 "x" */
    const char *toks[] = {NULL, NULL, "\xc3", "\xa9", "\xc3\xa9", "e", "\xa9x", "x"};
    tp_gvocab *v = vocab_of(toks, 8, 1);
    tp_grammar *g = compile_ok("root ::= \"\xc3\xa9\"+ \"x\"?");
    tp_gengine *e;
    tp_gmatch *m;
    tp_err err;
    assert_int_equal(tp_gengine_new(g, v, NULL, &e, &err), 0);
    assert_int_equal(tp_gmatch_new(e, &m, &err), 0);
    assert_int_equal(mask_of(m), (1u << 2) | (1u << 4));            /* no EOS yet, no control */
    assert_int_equal(tp_gmatch_accept(m, 2, &err), 0);               /* half a character */
    assert_int_equal(mask_of(m), (1u << 3) | (1u << 6));
    assert_int_equal(tp_gmatch_accept(m, 1, &err), TP_EINVAL);       /* EOS inside a character */
    assert_non_null(strstr(err.msg, "end-of-generation"));
    tp_gmatch *c = tp_gmatch_clone(m);
    assert_int_equal(tp_gmatch_accept(m, 3, &err), 0);
    assert_true(tp_gmatch_accepting(m));
    assert_false(tp_gmatch_done(m));
    assert_int_equal(mask_of(m), (1u << 1) | (1u << 2) | (1u << 4) | (1u << 7));
    assert_int_equal(tp_gmatch_accept(c, 6, &err), 0);               /* the clone goes its own way */
    assert_true(tp_gmatch_done(c));                                  /* nothing can follow x */
    assert_int_equal(mask_of(c), 1u << 1);                           /* only EOS */
    assert_int_equal(tp_gmatch_accept(m, 0, &err), TP_EINVAL);       /* control token */
    assert_int_equal(tp_gmatch_accept(m, 5, &err), TP_EINVAL);
    assert_non_null(strstr(err.msg, "token 5 is not allowed"));
    assert_int_equal(tp_gmatch_n_accepted(m), 2);
    assert_int_equal(tp_gmatch_accept(m, 1, &err), 0);               /* EOS when accepting */
    assert_true(tp_gmatch_done(m));
    assert_int_equal(mask_of(m), 0);
    assert_int_equal(tp_gmatch_accept(m, 2, &err), TP_EINVAL);
    tp_gmatch_free(c);
    tp_gmatch_free(m);
    tp_gengine_free(e);
    tp_grammar_free(g);
    tp_gvocab_free(v);
}

/* The masked row keeps exactly the allowed logits and puts -inf elsewhere,
 * whatever the word's pattern (all set, none, mixed) and the tail of a
 * vocabulary that is no multiple of 64. */
static void apply_mask_keeps_exactly_the_allowed_logits(void **state)
{
    (void)state;
    enum { V = 1000 };
    uint64_t mask[(V + 63) / 64];
    float logits[V], out[V];
    uint64_t r = 12345;
    for (size_t w = 0; w < sizeof mask / sizeof *mask; w++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        mask[w] = w % 4 == 0 ? ~0ull : w % 4 == 1 ? 0 : r;
    }
    for (int t = 0; t < V; t++)
        logits[t] = (float)t * 0.5f - 100.0f;
    tp_grammar_apply_mask(mask, logits, out, V);
    for (int t = 0; t < V; t++) {
        bool on = (mask[t / 64] >> (t % 64)) & 1;
        if (on ? out[t] != logits[t] : out[t] != -INFINITY)
            fail_msg("token %d: %g (allowed %d, logit %g)", t, out[t], on, logits[t]);
    }
}

/* ---- token references ---- */

typedef struct vocab_file {
    tp_tokenizer *tok;
    tp_gvocab *v;
    int eog[16];
    int n_eog;
} vocab_file;

static void open_vocab(const char *file, vocab_file *f)
{
    char path[4096];
    tp_err err;
    if (tp_tokenizer_open(model_path(file, path, sizeof path), 0, &f->tok, &err))
        fail_msg("%s: %s", file, err.msg);
    const int32_t *eog32;
    f->n_eog = tp_tokenizer_eog_ids(f->tok, &eog32);
    for (int i = 0; i < f->n_eog && i < 16; i++)
        f->eog[i] = eog32[i];
    if (tp_gvocab_from_tokenizer(f->tok, f->eog, f->n_eog, &f->v, &err))
        fail_msg("vocab: %s", err.msg);
}

static void close_vocab(vocab_file *f)
{
    tp_gvocab_free(f->v);
    tp_tokenizer_free(f->tok);
}

/* The one id text encodes to (specials matched), failing if it is not one. */
static int one_token(const vocab_file *f, const char *text)
{
    int ids[64];
    size_t n;
    tp_err err;
    if (tp_tokenizer_encode_ex(f->tok, text, strlen(text), TP_ENCODE_SPECIAL, ids, 64, &n, &err) || n != 1)
        fail_msg("'%s' is not one token", text);
    return ids[0];
}

/* The allowed ids of m's mask (at most cap), checking every bit against
 * tp_gmatch_allows on the way; returns how many are allowed. */
static int allowed(tp_gmatch *m, const tp_gvocab *v, int *ids, int cap)
{
    int n = tp_gvocab_size(v), k = 0;
    uint64_t *mask = malloc(tp_gmask_words(n) * 8);
    tp_err err;
    if (tp_gmatch_mask(m, mask, &err))
        fail_msg("mask: %s", err.msg);
    for (int t = 0; t < n; t++) {
        bool bit = (mask[t / 64] >> (t % 64)) & 1;
        if (bit != tp_gmatch_allows(m, t))
            fail_msg("token %d: mask %d, tp_gmatch_allows %d", t, bit, !bit);
        if (bit && k < cap)
            ids[k] = t;
        k += bit;
    }
    free(mask);
    return k;
}

static tp_gmatch *matcher_on(const char *gbnf, const tp_gvocab *v, tp_grammar **g, tp_gengine **e)
{
    tp_err err;
    tp_gmatch *m;
    *g = compile_ok(gbnf);
    if (tp_gengine_new(*g, v, NULL, e, &err))
        fail_msg("%s: %s", gbnf, err.msg);
    assert_int_equal(tp_gmatch_new(*e, &m, &err), 0);
    return m;
}

/* Llama 3's header markers are control tokens: the grammar names them, and
 * there only they are allowed — not the same characters spelt by text
 * tokens; elsewhere no control token is. <|eot_id|> ends generation, and
 * named it is allowed before the grammar accepts. */
static void control_tokens_named_by_text_on_llama3(void **state)
{
    (void)state;
    vocab_file f;
    open_vocab("hf-vocab/llama3-vocab.gguf", &f);
    int sh = one_token(&f, "<|start_header_id|>"), eh = one_token(&f, "<|end_header_id|>");
    int eot = one_token(&f, "<|eot_id|>"), lt = one_token(&f, "<");
    assert_int_equal(tp_tokenizer_token_type(f.tok, sh), TP_TOKEN_CONTROL);
    assert_int_equal(tp_tokenizer_token_type(f.tok, eot), TP_TOKEN_CONTROL);
    assert_true(tp_gvocab_is_eog(f.v, eot));
    tp_grammar *g;
    tp_gengine *e;
    tp_gmatch *m = matcher_on("root ::= <|start_header_id|> \"assistant\" <|end_header_id|> \"\\n\\n\" [a-z]+ "
                              "<|eot_id|>", f.v, &g, &e);
    int ids[8];
    tp_err err;
    assert_int_equal(allowed(m, f.v, ids, 8), 1);
    assert_int_equal(ids[0], sh);
    assert_int_equal(tp_gmatch_accept(m, lt, &err), TP_EINVAL);   /* "<" spelt in text does not start the token */
    assert_int_equal(tp_gmatch_accept(m, sh, &err), 0);
    assert_int_equal(tp_gmatch_accept(m, one_token(&f, "assistant"), &err), 0);
    assert_int_equal(allowed(m, f.v, ids, 8), 1);
    assert_int_equal(ids[0], eh);
    assert_int_equal(tp_gmatch_accept(m, eh, &err), 0);
    assert_int_equal(tp_gmatch_accept_bytes(m, (const uint8_t *)"\n\nok", 4, &err), 0);
    int n = allowed(m, f.v, ids, 8);
    assert_true(n > 100);   /* lowercase words and the named end, no other control token */
    assert_true(tp_gmatch_allows(m, eot));
    assert_false(tp_gmatch_allows(m, sh));
    assert_false(tp_gmatch_allows(m, one_token(&f, "<|end_of_text|>")));
    assert_false(tp_gmatch_accepting(m));
    assert_int_equal(tp_gmatch_accept(m, eot, &err), 0);
    assert_true(tp_gmatch_accepting(m));
    assert_true(tp_gmatch_done(m));
    tp_gmatch_free(m);
    tp_gengine_free(e);
    tp_grammar_free(g);
    /* by id, and a name the vocabulary lacks is refused when bound to it */
    m = matcher_on("root ::= <[128006]> \"x\"", f.v, &g, &e);
    assert_int_equal(allowed(m, f.v, ids, 8), 1);
    assert_int_equal(ids[0], sh);
    tp_gmatch_free(m);
    tp_gengine_free(e);
    tp_grammar_free(g);
    g = compile_ok("root ::= \"a\" |\n  <|python_tag|> \"{\"");
    assert_int_equal(tp_gengine_new(g, f.v, NULL, &e, &err), TP_EINVAL);
    assert_non_null(strstr(err.msg, "line 2 col 3: token <|python_tag|> is not a special token"));
    tp_grammar_free(g);
    g = compile_ok("root ::= <[128256]>");
    assert_int_equal(tp_gengine_new(g, f.v, NULL, &e, &err), TP_EINVAL);
    assert_non_null(strstr(err.msg, "token <[128256]> is outside the vocabulary (128256 tokens)"));
    tp_grammar_free(g);
    close_vocab(&f);
}

/* Qwen3's <think> / </think> are user-defined tokens that have text:
 * !</think> takes any one token with text but </think> (a text token or
 * <think> itself), never a control token nor an end of generation; the
 * named </think> then leads on to the JSON. */
static void negated_references_on_qwen3(void **state)
{
    (void)state;
    vocab_file f;
    open_vocab("hf-vocab/qwen3-vocab.gguf", &f);
    int th = one_token(&f, "<think>"), eth = one_token(&f, "</think>");
    int ims = one_token(&f, "<|im_start|>"), ime = one_token(&f, "<|im_end|>");
    assert_int_equal(tp_tokenizer_token_type(f.tok, th), TP_TOKEN_USER_DEFINED);
    assert_int_equal(tp_tokenizer_token_type(f.tok, ims), TP_TOKEN_CONTROL);
    tp_grammar *g;
    tp_gengine *e;
    tp_gmatch *m = matcher_on("root ::= <think> (!</think>)* </think> \"\\n\" \"{\" [a-z]* \"}\"", f.v, &g, &e);
    int ids[4];
    tp_err err;
    assert_int_equal(allowed(m, f.v, ids, 4), 1);
    assert_int_equal(ids[0], th);
    assert_int_equal(tp_gmatch_accept(m, one_token(&f, "<"), &err), TP_EINVAL);
    assert_int_equal(tp_gmatch_accept(m, th, &err), 0);
    int n_text = 0;
    for (int t = 0; t < tp_gvocab_size(f.v); t++) {
        size_t l;
        tp_gvocab_bytes(f.v, t, &l);
        n_text += l > 0 && !tp_gvocab_is_eog(f.v, t);
    }
    assert_int_equal(allowed(m, f.v, ids, 4), n_text);   /* every token with text, </think> by its name */
    assert_false(tp_gmatch_allows(m, ims));
    assert_false(tp_gmatch_allows(m, ime));
    const char *words[] = {"Let", " me", " think", "<think>", "\xe2\x80\x94", "}"};
    for (size_t i = 0; i < sizeof words / sizeof *words; i++)
        assert_int_equal(tp_gmatch_accept(m, one_token(&f, words[i]), &err), 0);
    assert_int_equal(tp_gmatch_accept(m, eth, &err), 0);
    assert_int_equal(allowed(m, f.v, ids, 4), 1);   /* the newline, as one token */
    assert_int_equal(tp_gmatch_accept_bytes(m, (const uint8_t *)"\n{ab", 4, &err), 0);
    assert_false(tp_gmatch_allows(m, eth));
    assert_int_equal(tp_gmatch_accept(m, one_token(&f, "}"), &err), 0);
    assert_true(tp_gmatch_done(m));
    tp_gmatch_free(m);
    tp_gengine_free(e);
    tp_grammar_free(g);
    /* the same text spelt as a literal is bytes, so a text token may spell it */
    m = matcher_on("root ::= \"<think>\"", f.v, &g, &e);
    assert_true(tp_gmatch_allows(m, one_token(&f, "<")));
    assert_true(tp_gmatch_allows(m, th));
    tp_gmatch_free(m);
    tp_gengine_free(e);
    tp_grammar_free(g);
    close_vocab(&f);
}

/* tokpipe's <"text"> names a special token of another shape (Mistral's
 * [TOOL_CALLS]); tp_grammar_token_ref writes each form and the compiler
 * reads it back; printing keeps the references. */
static void quoted_references_and_the_writer(void **state)
{
    (void)state;
    /* 0 control "[TOOL_CALLS]", 1 EOS, 2 "[", 3 "TOOL", 4 "x", 5 "{" */
    const char *toks[] = {NULL, NULL, "[", "TOOL", "x", "{"};
    tp_gvocab *v = vocab_of(toks, 6, 1);
    tp_err err;
    const int id0 = 0;
    const char *name = "[TOOL_CALLS]";
    size_t nl = strlen(name);
    assert_int_equal(tp_gvocab_name_tokens(v, 1, &id0, &name, &nl, &err), 0);
    char *ref = tp_grammar_token_ref(name, nl, false);
    assert_string_equal(ref, "<\"[TOOL_CALLS]\">");
    char gbnf[256];
    snprintf(gbnf, sizeof gbnf, "root ::= %s \"{\" | \"x\" !%s", ref, ref);
    free(ref);
    tp_grammar *g;
    tp_gengine *e;
    tp_gmatch *m = matcher_on(gbnf, v, &g, &e);
    assert_int_equal(mask_of(m), (1u << 0) | (1u << 4));
    tp_gmatch *c = tp_gmatch_clone(m);
    assert_int_equal(tp_gmatch_accept(m, 0, &err), 0);
    assert_int_equal(mask_of(m), 1u << 5);
    assert_int_equal(tp_gmatch_accept(c, 4, &err), 0);
    assert_int_equal(mask_of(c), (1u << 2) | (1u << 3) | (1u << 4) | (1u << 5));   /* text, not [TOOL_CALLS] */
    assert_int_equal(tp_gmatch_accept(c, 0, &err), TP_EINVAL);
    assert_int_equal(tp_gmatch_accept(c, 2, &err), 0);
    assert_true(tp_gmatch_done(c));
    char *printed = tp_grammar_print(g);
    assert_non_null(strstr(printed, "<\"[TOOL_CALLS]\">"));
    assert_non_null(strstr(printed, "!<\"[TOOL_CALLS]\">"));
    tp_grammar *g2 = compile_ok(printed);
    assert_int_equal(tp_grammar_n_token_refs(g2), 2);
    free(printed);
    tp_grammar_free(g2);
    tp_gmatch_free(c);
    tp_gmatch_free(m);
    tp_gengine_free(e);
    tp_grammar_free(g);
    tp_gvocab_free(v);
    const struct {
        const char *text;
        bool neg;
        const char *want;
    } w[] = {
        {"<|python_tag|>", false, "<|python_tag|>"},
        {"<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>", true,
         "!<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"},
        {"<a>b>", false, "<\"<a>b>\">"},
        {"say \"hi\"\\\n", false, "<\"say \\\"hi\\\"\\\\\\x0A\">"},
    };
    for (size_t i = 0; i < sizeof w / sizeof *w; i++) {
        char *r = tp_grammar_token_ref(w[i].text, strlen(w[i].text), w[i].neg);
        assert_string_equal(r, w[i].want);
        snprintf(gbnf, sizeof gbnf, "root ::= %s", r);
        tp_grammar *gg = compile_ok(gbnf);
        char *p = tp_grammar_print(gg);
        assert_non_null(strstr(p, r));
        free(p);
        tp_grammar_free(gg);
        free(r);
    }
}

/* What the broker does at admission: resolve names against the special
 * tokens INFO lists, ids against the vocabulary's size. */
static int find_in_list(void *ctx, const char *text, size_t len)
{
    const char *const *names = ctx;
    for (int i = 0; names[i]; i++)
        if (strlen(names[i]) == len && !memcmp(names[i], text, len))
            return 100 + i;
    return -1;
}

static void references_resolve_against_a_name_list(void **state)
{
    (void)state;
    const char *names[] = {"<|a|>", "[B]", NULL};
    tp_gnames nm = {200, find_in_list, (void *)names};
    tp_grammar *g = compile_ok("root ::= <|a|> <\"[B]\"> !<[7]> <[199]>");
    int32_t ids[4];
    tp_err err;
    assert_int_equal(tp_grammar_n_token_refs(g), 4);
    assert_int_equal(tp_grammar_check_tokens(g, &nm, ids, &err), 0);
    assert_int_equal(ids[0], 100);
    assert_int_equal(ids[1], 101);
    assert_int_equal(ids[2], 7);
    assert_int_equal(ids[3], 199);
    nm.n_vocab = 150;
    assert_int_equal(tp_grammar_check_tokens(g, &nm, NULL, &err), TP_EINVAL);
    assert_non_null(strstr(err.msg, "col 31: token <[199]> is outside the vocabulary (150 tokens)"));
    tp_grammar_free(g);
    g = compile_ok("root ::= \"x\" <|c|>");
    assert_int_equal(tp_grammar_check_tokens(g, &nm, NULL, &err), TP_EINVAL);
    assert_non_null(strstr(err.msg, "token <|c|> is not a special token"));
    tp_grammar_free(g);
}

static void replaying_accepted_tokens_rebuilds_the_same_state(void **state)
{
    (void)state;
    tp_gvocab *v = byte_vocab();
    tp_grammar *g = compile_ok(json_gbnf);
    tp_gengine *e;
    tp_err err;
    assert_int_equal(tp_gengine_new(g, v, NULL, &e, &err), 0);
    const char *doc = "{\"a\": [1, {\"b\": \"c\"}], \"d\": -2.5}";
    tp_gmatch *m, *r;
    assert_int_equal(tp_gmatch_new(e, &m, &err), 0);
    uint64_t a[5], b[5];
    for (size_t i = 0; doc[i]; i++) {
        assert_int_equal(tp_gmatch_accept(m, (unsigned char)doc[i], &err), 0);
        /* a matcher rebuilt from the tokens so far has the same mask */
        assert_int_equal(tp_gmatch_new(e, &r, &err), 0);
        for (size_t k = 0; k <= i; k++)
            assert_int_equal(tp_gmatch_accept(r, (unsigned char)doc[k], &err), 0);
        assert_int_equal(tp_gmatch_mask(m, a, &err), 0);
        assert_int_equal(tp_gmatch_mask(r, b, &err), 0);
        assert_memory_equal(a, b, sizeof a);
        tp_gmatch_free(r);
    }
    assert_true(tp_gmatch_done(m));   /* nothing after the root value */
    tp_gmatch_free(m);
    tp_gengine_free(e);
    tp_grammar_free(g);
    tp_gvocab_free(v);
}

static void state_limit_is_an_error_not_a_hang(void **state)
{
    (void)state;
    tp_gvocab *v = byte_vocab();
    /* ambiguous: every prefix of a's has many parses */
    tp_grammar *g = compile_ok("root ::= x*\nx ::= \"a\" | \"aa\" | \"a\" x \"b\"");
    tp_gengine_limits l = {.max_states = 8, .mask_bytes = 1 << 20};
    tp_gengine *e;
    tp_gmatch *m;
    tp_err err;
    assert_int_equal(tp_gengine_new(g, v, &l, &e, &err), 0);
    assert_int_equal(tp_gmatch_new(e, &m, &err), 0);
    int rc = 0;
    for (int i = 0; i < 100 && !rc; i++)
        rc = tp_gmatch_accept(m, 'a', &err);
    assert_int_equal(rc, TP_ERANGE);
    assert_non_null(strstr(err.msg, "limit"));
    tp_gmatch_free(m);
    tp_gengine_free(e);
    tp_grammar_free(g);
    tp_gvocab_free(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(constructs_match_the_oracle),
        cmocka_unit_test(groups_span_lines_and_alternatives_continue_after_a_bar),
        cmocka_unit_test(malformed_grammars_are_refused_naming_the_problem),
        cmocka_unit_test(limits_bound_size_rules_nesting_and_repeats),
        cmocka_unit_test(print_gives_normalized_gbnf_that_compiles_to_the_same_language),
        cmocka_unit_test(partial_utf8_control_tokens_and_eos),
        cmocka_unit_test(replaying_accepted_tokens_rebuilds_the_same_state),
        cmocka_unit_test(apply_mask_keeps_exactly_the_allowed_logits),
        cmocka_unit_test(control_tokens_named_by_text_on_llama3),
        cmocka_unit_test(negated_references_on_qwen3),
        cmocka_unit_test(quoted_references_and_the_writer),
        cmocka_unit_test(references_resolve_against_a_name_list),
        cmocka_unit_test(state_limit_is_an_error_not_a_hang),
        cmocka_unit_test(masks_match_the_oracle_on_stories260k),
        cmocka_unit_test(masks_match_the_oracle_on_the_spm_vocabulary),
        cmocka_unit_test(masks_match_the_oracle_on_the_qwen3_vocabulary),
        cmocka_unit_test(masks_match_the_oracle_on_the_llama3_vocabulary),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
