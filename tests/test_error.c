/* tp_err: the message buffer every fallible call fills. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "tokpipe/error.h"

static void error_set_returns_code_and_formats_message(void **state)
{
    (void)state;
    tp_err e;
    tp_err_clear(&e);
    assert_int_equal(tp_err_set(&e, TP_ERANGE, "field '%s' is %d", "top_k", -3), TP_ERANGE);
    assert_int_equal(e.code, TP_ERANGE);
    assert_string_equal(e.msg, "field 'top_k' is -3");
}

static void error_set_accepts_null_and_truncates_long_messages(void **state)
{
    (void)state;
    assert_int_equal(tp_err_set(NULL, TP_EINVAL, "x"), TP_EINVAL);
    tp_err e;
    char big[2 * TP_ERR_MSG_MAX];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    tp_err_set(&e, TP_EIO, "%s", big);
    assert_int_equal(strlen(e.msg), TP_ERR_MSG_MAX - 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(error_set_returns_code_and_formats_message),
        cmocka_unit_test(error_set_accepts_null_and_truncates_long_messages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
