/* Admission's grammars: each distinct GBNF text is compiled once by the
 * broker (grammar_memo), a refused one every time, and the compiled text
 * is what any of the three constraints asked for. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../daemon/grammar_admit.h"

static tp_params schema(const char *json)
{
    tp_params p = {0};
    p.json_schema = tp_str_of(json);
    p.set = TP_P_JSON_SCHEMA;
    return p;
}

static int admit(const tp_config *c, grammar_memo *m, const tp_params *p, char **gbnf, char *field)
{
    tp_gnames names = {.n_vocab = 32000};
    tp_err e;
    return grammar_admit(c, &names, m, p, gbnf, field, 64, &e);
}

static void each_distinct_grammar_is_compiled_once_and_a_refused_one_every_time(void **state)
{
    (void)state;
    tp_config c;
    tp_err e;
    assert_int_equal(tp_config_defaults(&c, &e), 0);
    grammar_memo m = {0};
    char field[64], *g1 = NULL, *g2 = NULL;
    tp_params a = schema("{\"type\": \"object\", \"properties\": {\"n\": {\"type\": \"integer\"}}}");
    assert_int_equal(admit(&c, &m, &a, &g1, field), 0);
    assert_int_equal(admit(&c, &m, &a, &g2, field), 0);
    assert_string_equal(g1, g2);  /* the same GBNF each time */
    assert_int_equal(m.compiles, 1);
    assert_int_equal(m.hits, 1);
    free(g1), free(g2);
    /* the same text as a grammar of its own: the same entry */
    tp_params b = {0};
    assert_int_equal(admit(&c, &m, &a, &g1, field), 0);
    b.grammar = tp_str_of(g1);
    b.set = TP_P_GRAMMAR;
    assert_int_equal(admit(&c, &m, &b, &g2, field), 0);
    assert_int_equal(m.compiles, 1);
    free(g1), free(g2);
    /* another schema: compiled */
    tp_params d = schema("{\"type\": \"string\", \"maxLength\": 5}");
    assert_int_equal(admit(&c, &m, &d, &g1, field), 0);
    assert_int_equal(m.compiles, 2);
    free(g1);
    /* a grammar the compiler refuses is refused each time, never remembered */
    tp_params bad = {0};
    bad.grammar = tp_str_of("root ::= undefined_rule");
    bad.set = TP_P_GRAMMAR;
    for (int i = 0; i < 2; i++) {
        g1 = NULL;
        assert_int_not_equal(admit(&c, &m, &bad, &g1, field), 0);
        assert_null(g1);
        assert_string_equal(field, "params.grammar");
    }
    assert_int_equal(m.compiles, 4);
    tp_config_free(&c);
}

/* More distinct grammars than the memo holds: the oldest are compiled
 * again, the newest are not. */
static void the_memo_forgets_the_oldest_past_its_size(void **state)
{
    (void)state;
    tp_config c;
    tp_err e;
    assert_int_equal(tp_config_defaults(&c, &e), 0);
    grammar_memo m = {0};
    char field[64], text[64];
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < GRAMMAR_MEMO_SIZE + 8; i++) {
            snprintf(text, sizeof text, "root ::= \"%d\"", i);
            tp_params p = {0};
            p.grammar = tp_str_of(text);
            p.set = TP_P_GRAMMAR;
            char *g = NULL;
            assert_int_equal(admit(&c, &m, &p, &g, field), 0);
            free(g);
        }
    /* the second round met only forgotten texts: each pass evicts the ones it needs next */
    assert_int_equal(m.compiles, 2 * (GRAMMAR_MEMO_SIZE + 8));
    char *g = NULL;
    tp_params last = {0};
    snprintf(text, sizeof text, "root ::= \"%d\"", GRAMMAR_MEMO_SIZE + 7);
    last.grammar = tp_str_of(text);
    last.set = TP_P_GRAMMAR;
    assert_int_equal(admit(&c, &m, &last, &g, field), 0);
    free(g);
    assert_int_equal(m.compiles, 2 * (GRAMMAR_MEMO_SIZE + 8));
    tp_config_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(each_distinct_grammar_is_compiled_once_and_a_refused_one_every_time),
        cmocka_unit_test(the_memo_forgets_the_oldest_past_its_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
