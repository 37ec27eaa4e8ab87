/* tp_stopmatch: the multi-pattern byte automaton behind tp_stop. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/stopmatch.h"

static tp_stopmatch *build(const char *const *pat, size_t n, size_t dense)
{
    size_t len[64];
    for (size_t i = 0; i < n; i++) len[i] = strlen(pat[i]);
    tp_stopmatch *m;
    tp_err err;
    if (tp_stopmatch_new(pat, len, n, dense, &m, &err)) fail_msg("build: %s", err.msg);
    return m;
}

/* Feed text; return the end offset of the first match (0 if none) and the
 * pattern text in *which. */
static size_t first_match(const tp_stopmatch *m, const char *text, const char **which)
{
    uint32_t st = 0, pat;
    size_t n = strlen(text), used = tp_stopmatch_find(m, &st, (const uint8_t *)text, n, &pat);
    if (pat == TP_STOPMATCH_NONE) return 0;
    size_t len;
    static char buf[64];
    const char *p = tp_stopmatch_pattern(m, pat, &len);
    memcpy(buf, p, len);
    buf[len] = '\0';
    *which = buf;
    return used;
}

static void stopmatch_reports_earliest_end_then_longest(void **state)
{
    (void)state;
    const char *pats[] = {"lo", "ell", "b", "ab", "xab"};
    for (size_t dense = 0; dense <= 1; dense++) {
        tp_stopmatch *m = build(pats, 5, dense);
        const char *w = NULL;
        assert_int_equal(first_match(m, "hello", &w), 4);
        assert_string_equal(w, "ell");
        assert_int_equal(first_match(m, "zzxab", &w), 5);
        assert_string_equal(w, "xab");
        assert_int_equal(first_match(m, "zzz", &w), 0);
        tp_stopmatch_free(m);
    }
}

static void stopmatch_continues_after_a_match(void **state)
{
    (void)state;
    const char *pats[] = {"aa"};
    tp_stopmatch *m = build(pats, 1, 0);
    uint32_t st = 0, pat;
    const uint8_t *t = (const uint8_t *)"aaaa";
    assert_int_equal(tp_stopmatch_find(m, &st, t, 4, &pat), 2);
    assert_int_equal(pat, 0);
    assert_int_equal(tp_stopmatch_find(m, &st, t + 2, 2, &pat), 1);   /* overlapping "aa" */
    assert_int_equal(pat, 0);
    tp_stopmatch_free(m);
}

static void stopmatch_partial_is_longest_suffix_that_is_a_proper_prefix(void **state)
{
    (void)state;
    const char *pats[] = {"abc", "bcd", "END", "ENDING"};
    tp_stopmatch *m = build(pats, 4, 0);
    struct { const char *text; size_t partial; } cases[] = {
        {"xab", 2}, {"xabc", 2 /* "bc" of "bcd" */}, {"xy", 0}, {"EN", 2},
        {"END", 3 /* proper prefix of ENDING */}, {"ENDI", 4}, {"ENDINx", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint32_t st = 0, pat;
        const char *t = cases[i].text;
        size_t pos = 0, n = strlen(t);
        while (pos < n) pos += tp_stopmatch_find(m, &st, (const uint8_t *)t + pos, n - pos, &pat);
        if (tp_stopmatch_partial(m, st) != cases[i].partial)
            fail_msg("partial after '%s' is %zu, expected %zu", t, tp_stopmatch_partial(m, st),
                     cases[i].partial);
    }
    tp_stopmatch_free(m);
}

static void stopmatch_merges_duplicates_in_first_appearance_order(void **state)
{
    (void)state;
    const char *pats[] = {"zeta", "alpha", "zeta", "alpha", "beta"};
    tp_stopmatch *m = build(pats, 5, 0);
    assert_int_equal(tp_stopmatch_count(m), 3);
    uint32_t want[] = {0, 1, 0, 1, 2};
    for (size_t i = 0; i < 5; i++) assert_int_equal(tp_stopmatch_merged_index(m, i), want[i]);
    size_t len;
    assert_memory_equal(tp_stopmatch_pattern(m, 1, &len), "alpha", 5);
    assert_int_equal(len, 5);
    tp_stopmatch_free(m);
}

/* Every byte value occurs in a pattern: 256 classes plus none left over. */
static void stopmatch_handles_all_256_byte_values(void **state)
{
    (void)state;
    static char bytes[256][3];
    const char *pats[256];
    size_t len[256];
    for (int b = 0; b < 256; b++) {
        bytes[b][0] = 'x';
        bytes[b][1] = (char)b;
        pats[b] = bytes[b];
        len[b] = 2;
    }
    tp_stopmatch *m;
    assert_int_equal(tp_stopmatch_new(pats, len, 256, 0, &m, NULL), 0);
    for (int b = 0; b < 256; b++) {
        uint8_t t[3] = {(uint8_t)b, 'x', (uint8_t)b};
        uint32_t st = 0, pat;
        /* "xx" already ends at the second byte when b is 'x' */
        assert_int_equal(tp_stopmatch_find(m, &st, t, 3, &pat), b == 'x' ? 2 : 3);
        assert_int_equal(pat, (uint32_t)b);
    }
    tp_stopmatch_free(m);
}

static void stopmatch_without_patterns_never_matches(void **state)
{
    (void)state;
    tp_stopmatch *m;
    assert_int_equal(tp_stopmatch_new(NULL, NULL, 0, 0, &m, NULL), 0);
    uint32_t st = 0, pat;
    assert_int_equal(tp_stopmatch_find(m, &st, (const uint8_t *)"abc", 3, &pat), 3);
    assert_int_equal(pat, TP_STOPMATCH_NONE);
    assert_int_equal(tp_stopmatch_partial(m, st), 0);
    tp_stopmatch_free(m);
    tp_stopmatch_free(NULL);
}

static void stopmatch_rejects_empty_pattern(void **state)
{
    (void)state;
    const char *pats[] = {"a", ""};
    size_t len[] = {1, 0};
    tp_stopmatch *m;
    tp_err err;
    assert_int_equal(tp_stopmatch_new(pats, len, 2, 0, &m, &err), TP_EINVAL);
    assert_non_null(strstr(err.msg, "pattern[1]"));
}

/* The dense rows and the failure-link fallback are two paths to the same
 * automaton: on random text they must agree byte for byte. */
static void stopmatch_dense_and_sparse_paths_agree(void **state)
{
    (void)state;
    uint64_t x = 88172645463325252ull;
    for (int round = 0; round < 200; round++) {
        char store[40][8];
        const char *pats[40];
        size_t len[40], n = 1 + round % 40;
        for (size_t i = 0; i < n; i++) {
            len[i] = 1 + (x >> 7) % 7;
            for (size_t k = 0; k < len[i]; k++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                store[i][k] = (char)('a' + x % 3);
            }
            pats[i] = store[i];
        }
        tp_stopmatch *a, *b;
        assert_int_equal(tp_stopmatch_new(pats, len, n, 0, &a, NULL), 0);
        assert_int_equal(tp_stopmatch_new(pats, len, n, 1, &b, NULL), 0);
        uint32_t sa = 0, sb = 0;
        for (int i = 0; i < 300; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            uint8_t c = (uint8_t)('a' + x % 4);
            uint32_t pa, pb;
            tp_stopmatch_find(a, &sa, &c, 1, &pa);
            tp_stopmatch_find(b, &sb, &c, 1, &pb);
            assert_int_equal(pa, pb);
            assert_int_equal(tp_stopmatch_partial(a, sa), tp_stopmatch_partial(b, sb));
        }
        tp_stopmatch_free(a);
        tp_stopmatch_free(b);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stopmatch_reports_earliest_end_then_longest),
        cmocka_unit_test(stopmatch_continues_after_a_match),
        cmocka_unit_test(stopmatch_partial_is_longest_suffix_that_is_a_proper_prefix),
        cmocka_unit_test(stopmatch_merges_duplicates_in_first_appearance_order),
        cmocka_unit_test(stopmatch_handles_all_256_byte_values),
        cmocka_unit_test(stopmatch_without_patterns_never_matches),
        cmocka_unit_test(stopmatch_rejects_empty_pattern),
        cmocka_unit_test(stopmatch_dense_and_sparse_paths_agree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
