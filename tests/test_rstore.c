/* The gateway's stored responses (http/rstore.c): bounded in count and in
 * bytes, the least recently used (stored or read) going first. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "../http/gw.h"

static bool has(gw_rstore *s, const char *id)
{
    return gw_rstore_get(s, id, NULL, NULL);
}

static void a_stored_response_reads_back_until_deleted(void **state)
{
    (void)state;
    gw_rstore *s = gw_rstore_new(4, 1 << 20);
    assert_non_null(s);
    assert_int_equal(gw_rstore_put(s, "resp_a", "{\"id\":\"resp_a\"}", "[{\"role\":\"user\"}]"), 0);
    char *r, *c;
    assert_true(gw_rstore_get(s, "resp_a", &r, &c));
    assert_string_equal(r, "{\"id\":\"resp_a\"}");
    assert_string_equal(c, "[{\"role\":\"user\"}]");
    free(r);
    free(c);
    assert_false(gw_rstore_get(s, "resp_b", &r, &c));
    assert_null(r);
    assert_true(gw_rstore_delete(s, "resp_a"));
    assert_false(gw_rstore_delete(s, "resp_a"));
    assert_false(has(s, "resp_a"));
    gw_rstore_free(s);
}

static void past_the_count_the_least_recently_used_goes(void **state)
{
    (void)state;
    gw_rstore *s = gw_rstore_new(3, 1 << 20);
    gw_rstore_put(s, "a", "{}", "[]");
    gw_rstore_put(s, "b", "{}", "[]");
    gw_rstore_put(s, "c", "{}", "[]");
    assert_true(has(s, "a"));   /* read: now the most recent */
    gw_rstore_put(s, "d", "{}", "[]");
    assert_false(has(s, "b"));
    assert_true(has(s, "a") && has(s, "c") && has(s, "d"));
    size_t n, bytes;
    gw_rstore_usage(s, &n, &bytes);
    assert_int_equal(n, 3);
    /* the same id again replaces it, counted once */
    gw_rstore_put(s, "c", "{\"x\":1}", "[]");
    gw_rstore_usage(s, &n, &bytes);
    assert_int_equal(n, 3);
    gw_rstore_free(s);
}

static void past_the_bytes_the_oldest_go_and_one_too_large_is_not_kept(void **state)
{
    (void)state;
    char big[600];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    size_t limit = 2 * (sizeof big + 128);   /* two entries (text + bookkeeping), not three */
    gw_rstore *s = gw_rstore_new(100, limit);
    gw_rstore_put(s, "a", big, "[]");
    gw_rstore_put(s, "b", big, "[]");
    gw_rstore_put(s, "c", big, "[]");
    size_t n, bytes;
    gw_rstore_usage(s, &n, &bytes);
    assert_true(bytes <= limit);
    assert_false(has(s, "a"));
    assert_true(has(s, "c"));
    char huge[4096];
    memset(huge, 'y', sizeof huge - 1);
    huge[sizeof huge - 1] = '\0';
    assert_int_equal(gw_rstore_put(s, "h", huge, "[]"), 0);
    assert_false(has(s, "h"));
    assert_true(has(s, "c"));   /* nothing was evicted for it */
    gw_rstore_free(s);
    /* a bound of 0 keeps none */
    s = gw_rstore_new(0, limit);
    gw_rstore_put(s, "a", "{}", "[]");
    assert_false(has(s, "a"));
    gw_rstore_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_stored_response_reads_back_until_deleted),
        cmocka_unit_test(past_the_count_the_least_recently_used_goes),
        cmocka_unit_test(past_the_bytes_the_oldest_go_and_one_too_large_is_not_kept),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
