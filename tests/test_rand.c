/* tp_random_u64: fresh 64-bit values for incarnations and unseeded jobs. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "tokpipe/rand.h"

static void random_values_are_never_zero_and_do_not_repeat(void **state)
{
    (void)state;
    uint64_t seen[64];
    for (int i = 0; i < 64; i++) {
        seen[i] = tp_random_u64();
        assert_true(seen[i] != 0);
        for (int j = 0; j < i; j++)
            if (seen[j] == seen[i])
                fail_msg("value %d repeats value %d: %llu", i, j, (unsigned long long)seen[i]);
    }
}

static void random_values_use_all_64_bits(void **state)
{
    (void)state;
    uint64_t any = 0, all = ~UINT64_C(0);
    for (int i = 0; i < 64; i++) {
        uint64_t v = tp_random_u64();
        any |= v;
        all &= v;
    }
    assert_true(any == ~UINT64_C(0));  /* every bit was 1 at least once */
    assert_true(all == 0);             /* and 0 at least once */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(random_values_are_never_zero_and_do_not_repeat),
        cmocka_unit_test(random_values_use_all_64_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
