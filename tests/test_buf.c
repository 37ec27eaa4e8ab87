/* tp_buf: growth, the byte limit, sticky and lenient failure, printf
 * appends, taking the text, NULL and empty inputs. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "tokpipe/buf.h"

/* byte i of the reference text the growth tests build */
static char ref_byte(size_t i)
{
    return (char)('a' + (i * 7 + i / 13) % 26);
}

static void appends_of_every_size_keep_every_byte(void **state)
{
    (void)state;
    /* piece sizes 0..300 cross the first allocation and many doublings */
    tp_buf b = {0};
    size_t total = 0;
    char piece[300];
    for (size_t n = 0; n < sizeof piece; n++) {
        for (size_t i = 0; i < n; i++)
            piece[i] = ref_byte(total + i);
        assert_int_equal(tp_buf_add(&b, piece, n), 0);
        total += n;
        assert_int_equal(b.len, total);
        assert_true(b.cap > b.len);
        assert_int_equal(b.data[b.len], '\0');
    }
    for (size_t i = 0; i < total; i++)
        if (b.data[i] != ref_byte(i))
            fail_msg("byte %zu of %zu is '%c', appended '%c'", i, total, b.data[i], ref_byte(i));
    assert_int_equal(b.err, 0);
    tp_buf_free(&b);
    assert_null(b.data);
    assert_int_equal(b.len, 0);
}

static void one_large_append_and_single_bytes_agree(void **state)
{
    (void)state;
    size_t n = 1u << 20;
    char *big = malloc(n);
    assert_non_null(big);
    for (size_t i = 0; i < n; i++)
        big[i] = ref_byte(i);
    tp_buf one = {0}, bytes = {0};
    assert_int_equal(tp_buf_add(&one, big, n), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(tp_buf_add(&bytes, big + i, 1), 0);
    assert_int_equal(one.len, n);
    assert_int_equal(bytes.len, n);
    assert_memory_equal(one.data, big, n);
    assert_memory_equal(bytes.data, big, n);
    free(big);
    tp_buf_free(&one);
    tp_buf_free(&bytes);
}

static void exactly_the_limit_fits_and_one_more_byte_is_refused(void **state)
{
    (void)state;
    tp_buf b;
    tp_buf_init(&b, 10);
    assert_int_equal(tp_buf_puts(&b, "0123456"), 0);
    assert_int_equal(tp_buf_puts(&b, "789"), 0);   /* 10 bytes: at the limit */
    assert_int_equal(b.len, 10);
    assert_int_equal(b.err, 0);
    assert_int_equal(tp_buf_add(&b, "x", 1), TP_ERANGE);
    assert_int_equal(b.err, TP_ERANGE);
    assert_int_equal(b.len, 10);
    assert_string_equal(b.data, "0123456789");
    tp_buf_free(&b);
}

static void a_refused_piece_is_refused_whole(void **state)
{
    (void)state;
    tp_buf b;
    tp_buf_init(&b, 8);
    assert_int_equal(tp_buf_puts(&b, "abcde"), 0);
    assert_int_equal(tp_buf_puts(&b, "fghi"), TP_ERANGE);   /* 9 > 8: none of it */
    assert_string_equal(b.data, "abcde");
    assert_int_equal(b.len, 5);
    tp_buf_free(&b);
}

static void a_sticky_failure_refuses_every_later_append(void **state)
{
    (void)state;
    tp_buf b;
    tp_buf_init(&b, 4);
    assert_int_equal(tp_buf_puts(&b, "abcdef"), TP_ERANGE);
    /* would fit on its own, but the text already lost a piece */
    assert_int_equal(tp_buf_puts(&b, "ab"), TP_ERANGE);
    assert_int_equal(tp_buf_printf(&b, "%d", 1), TP_ERANGE);
    assert_int_equal(tp_buf_reserve(&b, 1), TP_ERANGE);
    assert_int_equal(b.len, 0);
    assert_int_equal(b.err, TP_ERANGE);
    tp_buf_reset(&b);   /* emptying the text does not forget it */
    assert_int_equal(b.err, TP_ERANGE);
    assert_int_equal(tp_buf_puts(&b, "ab"), TP_ERANGE);
    tp_buf_free(&b);    /* freeing does */
    assert_int_equal(b.err, 0);
    assert_int_equal(tp_buf_puts(&b, "ab"), 0);
    assert_string_equal(b.data, "ab");
    tp_buf_free(&b);
}

static void a_lenient_buffer_tries_each_append_on_its_own(void **state)
{
    (void)state;
    tp_buf b;
    tp_buf_init(&b, 6);
    b.lenient = true;
    assert_int_equal(tp_buf_puts(&b, "abc"), 0);
    assert_int_equal(tp_buf_puts(&b, "defgh"), TP_ERANGE);
    assert_int_equal(b.err, 0);
    assert_int_equal(tp_buf_puts(&b, "def"), 0);   /* exactly the limit */
    assert_string_equal(b.data, "abcdef");
    tp_buf_free(&b);
}

static void a_limit_of_zero_allows_only_empty_text(void **state)
{
    (void)state;
    tp_buf b;
    tp_buf_init(&b, 0);
    assert_int_equal(tp_buf_add(&b, "", 0), 0);
    assert_string_equal(b.data, "");
    assert_int_equal(tp_buf_puts(&b, "a"), TP_ERANGE);
    assert_string_equal(b.data, "");
    tp_buf_free(&b);
}

static void free_keeps_the_limit_and_forgets_the_failure(void **state)
{
    (void)state;
    tp_buf b;
    tp_buf_init(&b, 3);
    assert_int_equal(tp_buf_puts(&b, "abcd"), TP_ERANGE);
    tp_buf_free(&b);   /* keeps the limit, forgets the failure */
    assert_int_equal(b.err, 0);
    assert_int_equal(tp_buf_puts(&b, "abc"), 0);
    assert_int_equal(tp_buf_puts(&b, "d"), TP_ERANGE);
    tp_buf_free(&b);
    tp_buf u = {0};
    assert_false(u.capped);
    assert_int_equal(tp_buf_puts(&u, "abcd"), 0);
    tp_buf_free(&u);
}

static void printf_appends_output_longer_than_any_first_guess(void **state)
{
    (void)state;
    tp_buf b = {0};
    assert_int_equal(tp_buf_printf(&b, "%s=%d;", "k", 42), 0);
    char want[5000];
    memset(want, 'z', 4000);
    want[4000] = '\0';
    assert_int_equal(tp_buf_printf(&b, "[%s|%05d]", want, 7), 0);
    char ref[5100];
    snprintf(ref, sizeof ref, "k=42;[%s|00007]", want);
    assert_int_equal(b.len, strlen(ref));
    assert_string_equal(b.data, ref);
    /* many short prints after one another, each landing in spare room */
    tp_buf_reset(&b);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(tp_buf_printf(&b, "%d,", i), 0);
    size_t at = 0;
    for (int i = 0; i < 1000; i++) {
        char one[16];
        int k = snprintf(one, sizeof one, "%d,", i);
        if (memcmp(b.data + at, one, (size_t)k))
            fail_msg("print %d is not at offset %zu", i, at);
        at += (size_t)k;
    }
    assert_int_equal(b.len, at);
    tp_buf_free(&b);
}

static void printf_past_the_limit_leaves_the_text_unchanged(void **state)
{
    (void)state;
    tp_buf b;
    tp_buf_init(&b, 12);
    assert_int_equal(tp_buf_puts(&b, "head"), 0);
    /* 9 bytes: fits the allocation but not the limit (4 + 9 > 12) */
    assert_int_equal(tp_buf_printf(&b, "%s", "123456789"), TP_ERANGE);
    assert_int_equal(b.len, 4);
    assert_string_equal(b.data, "head");
    tp_buf_free(&b);   /* forgets the failure, keeps the limit */
    assert_int_equal(tp_buf_puts(&b, "head"), 0);
    assert_int_equal(tp_buf_printf(&b, "%s", "12345678"), 0);   /* exactly 12 */
    assert_string_equal(b.data, "head12345678");
    tp_buf_free(&b);

    /* the same with room to spare in the allocation, where the text is
     * printed in place before the limit is known to be passed */
    char text[400];
    memset(text, 'p', sizeof text - 1);
    text[sizeof text - 1] = '\0';
    tp_buf_init(&b, 300);
    assert_int_equal(tp_buf_puts(&b, "head"), 0);
    assert_int_equal(tp_buf_reserve(&b, 290), 0);
    assert_true(b.cap - b.len > 297);
    assert_int_equal(tp_buf_printf(&b, "%.297s", text), TP_ERANGE);   /* 301 bytes */
    assert_int_equal(b.len, 4);
    assert_string_equal(b.data, "head");
    tp_buf_free(&b);
    assert_int_equal(tp_buf_puts(&b, "head"), 0);
    assert_int_equal(tp_buf_reserve(&b, 290), 0);
    assert_int_equal(tp_buf_printf(&b, "%.296s", text), 0);   /* exactly 300 */
    assert_int_equal(b.len, 300);
    assert_memory_equal(b.data + 4, text, 296);
    assert_int_equal(b.data[300], '\0');
    tp_buf_free(&b);
}

static void take_hands_over_the_text_and_empties_the_buffer(void **state)
{
    (void)state;
    tp_buf b;
    tp_buf_init(&b, 100);
    assert_int_equal(tp_buf_puts(&b, "hello"), 0);
    char *s = tp_buf_take(&b);
    assert_string_equal(s, "hello");
    assert_null(b.data);
    assert_int_equal(b.len, 0);
    assert_int_equal(b.cap, 0);
    assert_true(b.capped);
    assert_int_equal(b.max, 100);
    free(s);
    /* nothing appended: still a string the caller frees */
    char *e = tp_buf_take(&b);
    assert_non_null(e);
    assert_string_equal(e, "");
    free(e);
    /* the buffer is usable again */
    assert_int_equal(tp_buf_puts(&b, "again"), 0);
    assert_string_equal(b.data, "again");
    tp_buf_free(&b);
}

static void null_and_empty_inputs_make_an_empty_string(void **state)
{
    (void)state;
    tp_buf b = {0};
    assert_string_equal(tp_buf_str(&b), "");
    assert_int_equal(tp_buf_add(&b, NULL, 0), 0);
    assert_non_null(b.data);
    assert_string_equal(b.data, "");
    assert_int_equal(tp_buf_puts(&b, NULL), 0);
    assert_int_equal(tp_buf_puts(&b, ""), 0);
    assert_int_equal(tp_buf_printf(&b, "%s", ""), 0);
    assert_int_equal(b.len, 0);
    assert_string_equal(tp_buf_str(&b), "");
    tp_buf_free(&b);
    tp_buf_free(&b);   /* twice is fine */
    tp_buf_free(NULL);
    tp_buf_reset(&b);  /* on a buffer without memory */
    assert_null(b.data);
}

static void reserve_gives_room_that_a_writer_fills(void **state)
{
    (void)state;
    tp_buf b;
    tp_buf_init(&b, 1000);
    assert_int_equal(tp_buf_puts(&b, "ab"), 0);
    assert_int_equal(tp_buf_reserve(&b, 500), 0);
    assert_true(b.cap >= 503);
    assert_int_equal(b.len, 2);
    memset(b.data + b.len, 'c', 500);
    b.len += 500;
    b.data[b.len] = '\0';
    assert_int_equal(strlen(b.data), 502);
    assert_int_equal(tp_buf_reserve(&b, 499), TP_ERANGE);   /* 502 + 499 > 1000 */
    assert_int_equal(b.len, 502);
    tp_buf_free(&b);
}

static void an_append_of_absurd_size_is_refused_not_wrapped(void **state)
{
    (void)state;
    tp_buf b = {0};
    assert_int_equal(tp_buf_puts(&b, "x"), 0);
    assert_int_equal(tp_buf_reserve(&b, SIZE_MAX), TP_ENOMEM);
    assert_int_equal(b.err, TP_ENOMEM);
    assert_string_equal(b.data, "x");
    tp_buf_free(&b);
}

static void fail_keeps_the_first_failure(void **state)
{
    (void)state;
    tp_buf b = {0};
    assert_int_equal(tp_buf_fail(&b, TP_ENOMEM), TP_ENOMEM);
    assert_int_equal(tp_buf_fail(&b, TP_ERANGE), TP_ENOMEM);
    assert_int_equal(tp_buf_puts(&b, "a"), TP_ENOMEM);
    assert_null(b.data);
    tp_buf_free(&b);
}

/* Every byte through tp_buf_json_str, checked against JSON's grammar
 * (RFC 8259 section 7) by decoding the result back: short escapes where
 * JSON has one, \u00xx for the other controls, the rest as it came. */
static void json_strings_escape_exactly_what_json_must_and_decode_back(void **state)
{
    (void)state;
    char in[256];
    for (int c = 0; c < 256; c++)
        in[c] = (char)c;
    tp_buf b;
    tp_buf_init(&b, 4096);
    assert_int_equal(tp_buf_json_str(&b, in, sizeof in), 0);
    const char *o = b.data;
    assert_int_equal(o[0], '"');
    char back[256];
    size_t k = 0, i = 1;
    for (; i + 1 < b.len; k++) {
        unsigned char c = (unsigned char)o[i];
        assert_true(c >= 0x20 && c != '"');   /* nothing raw that JSON forbids */
        if (c != '\\') {
            back[k] = o[i++];
            continue;
        }
        const char *named = strchr("\"\\/bfnrt", o[i + 1]);
        if (o[i + 1] == 'u') {
            unsigned v;
            assert_int_equal(sscanf(o + i + 2, "%4x", &v), 1);
            assert_true(v < 0x20 && v != '\b' && v != '\f' && v != '\n' && v != '\r' && v != '\t');
            back[k] = (char)v;
            i += 6;
        } else {
            assert_non_null(named);
            back[k] = "\"\\/\b\f\n\r\t"[named - "\"\\/bfnrt"];
            i += 2;
        }
    }
    assert_int_equal(o[b.len - 1], '"');
    assert_int_equal(k, 256);
    assert_memory_equal(back, in, 256);
    tp_buf_reset(&b);
    tp_buf_json_str(&b, "\xc3\xa9\n", 3);   /* UTF-8 stays as it is */
    assert_int_equal(b.len, 6);
    assert_memory_equal(b.data, "\"\xc3\xa9\\n\"", 6);
    tp_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(json_strings_escape_exactly_what_json_must_and_decode_back),
        cmocka_unit_test(appends_of_every_size_keep_every_byte),
        cmocka_unit_test(one_large_append_and_single_bytes_agree),
        cmocka_unit_test(exactly_the_limit_fits_and_one_more_byte_is_refused),
        cmocka_unit_test(a_refused_piece_is_refused_whole),
        cmocka_unit_test(a_sticky_failure_refuses_every_later_append),
        cmocka_unit_test(a_lenient_buffer_tries_each_append_on_its_own),
        cmocka_unit_test(a_limit_of_zero_allows_only_empty_text),
        cmocka_unit_test(free_keeps_the_limit_and_forgets_the_failure),
        cmocka_unit_test(printf_appends_output_longer_than_any_first_guess),
        cmocka_unit_test(printf_past_the_limit_leaves_the_text_unchanged),
        cmocka_unit_test(take_hands_over_the_text_and_empties_the_buffer),
        cmocka_unit_test(null_and_empty_inputs_make_an_empty_string),
        cmocka_unit_test(reserve_gives_room_that_a_writer_fills),
        cmocka_unit_test(an_append_of_absurd_size_is_refused_not_wrapped),
        cmocka_unit_test(fail_keeps_the_first_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
