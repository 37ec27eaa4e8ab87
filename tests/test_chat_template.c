/* The chat-template renderer's pieces: whitespace control, scoping, values,
 * refusals and limits. The expected texts are what python3-jinja2 gives for
 * the same source (checked when written; tests/chat_template_test.py runs
 * jinja2 itself on the real templates). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/chat_template.h"

static const char CONV[] = "[{\"role\":\"system\",\"content\":\"  Sys  \"},{\"role\":\"user\",\"content\":\"Hi\"},"
                           "{\"role\":\"assistant\",\"content\":\"Yo\"}]";

/* Render src with CONV; returns the text (caller frees) or NULL with *e set. */
static char *render(const char *src, int gen, tp_err *e)
{
    tp_chat_template *t = NULL;
    if (tp_chat_template_new(src, strlen(src), &t, e))
        return NULL;
    cJSON *m = cJSON_Parse(CONV);
    assert_non_null(m);
    tp_chat_vars v = {.messages = m, .bos_token = "<s>", .eos_token = "</s>", .add_generation_prompt = gen};
    char *out = NULL;
    size_t len = 0;
    int rc = tp_chat_template_render(t, &v, &out, &len, e);
    cJSON_Delete(m);
    tp_chat_template_free(t);
    if (rc)
        return NULL;
    assert_int_equal(strlen(out), len);
    return out;
}

static void expect(const char *src, const char *want)
{
    tp_err e;
    tp_err_clear(&e);
    char *got = render(src, 1, &e);
    if (!got)
        fail_msg("render failed: %s\nsource: %s", e.msg, src);
    if (strcmp(got, want))
        fail_msg("source: %s\nwant: [%s]\ngot:  [%s]", src, want, got);
    free(got);
}

static void expect_error(const char *src, int code, const char *needle)
{
    tp_err e;
    tp_err_clear(&e);
    char *got = render(src, 1, &e);
    if (got)
        fail_msg("rendered [%s], wanted an error containing '%s'", got, needle);
    assert_int_equal(e.code, code);
    if (!strstr(e.msg, needle))
        fail_msg("error [%s] does not contain '%s'", e.msg, needle);
}

static void whitespace_control_follows_trim_and_lstrip_blocks(void **state)
{
    (void)state;
    expect("a\n  {# c #}\n  b\n", "a\n  b");
    expect("a\n  {{ 1 }}  \n  {% if 1 %}\nb{% endif %}\n", "a\n  1  \nb");
    expect("x  {%- if true -%}  \n y {%- endif %}", "xy");
    expect("{% for m in messages %}\n  {{ m.role }}\n{% endfor %}", "  system\n  user\n  assistant\n");
    expect("a\r\nb\r\n", "a\nb");
    expect("  {%+ if true %}x{% endif +%}\ny", "  x\ny");
}

static void loops_give_loop_variables_and_scope_sets_per_iteration(void **state)
{
    (void)state;
    expect("{% for m in messages %}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}",
           "0TrueFalse3|1FalseFalse3|2FalseTrue3|");
    expect("{% for x in [1,2] %}{% if loop.first %}{% set y = 5 %}{% endif %}[{{ y }}]{% endfor %}[{{ y }}]",
           "[5][][]");
    expect("{% set ns = namespace(n=0) %}{% for m in messages if m.role != 'system' %}{% set ns.n = ns.n + 1 %}"
           "{% endfor %}{{ ns.n }}",
           "2");
    expect("{% for x in [] %}a{% else %}empty{% endfor %}", "empty");
    expect("{% for x in [1,2,3,4] %}{% if x == 3 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}{% endif %}"
           "{{ x }}{% endfor %}",
           "2");
    expect("{% for k, v in {'a': 1, 'b': [2]}|items %}{{ k }}={{ v }};{% endfor %}", "a=1;b=[2];");
    expect("{% for m in messages %}{{ loop.previtem.role if loop.previtem is defined else '-' }}{% endfor %}",
           "-systemuser");
}

static void expressions_follow_python(void **state)
{
    (void)state;
    expect("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 10 / 4 }} {{ 10 / 2 }}", "3 -4 2 1024 2.5 5.0");
    expect("{{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-5 }} {{ 1/3 }}", "0.30000000000000004 1e+20 1e-05 0.3333333333333333");
    expect("{{ [1, 'a', none, true, {'k': 1.5}] }}", "[1, 'a', None, True, {'k': 1.5}]");
    expect("{{ 'abc'[::-1] }}{{ messages[1:]|length }}{{ messages[-1].content }}{{ 'héllo'[1:3] }}", "cba2Yoél");
    expect("{{ 'x' if false }}|{{ 'a' ~ 1 ~ none }}|{{ 'ab' * 3 }}", "|a1None|ababab");
    expect("{{ 'b' in 'abc' }}{{ 'role' in messages[0] }}{{ 3 not in [1, 2] }}{{ 1 < 2 < 3 }}", "TrueTrueTrueTrue");
    expect("{{ messages[0].content.strip() }}|{{ ' a b  c '.split() }}|{{ 'a</t>b'.split('</t>')[-1] }}",
           "Sys|['a', 'b', 'c']|b");
    expect("{{ 'Hello'.startswith('He') }}{{ 'Hello'.endswith(('x', 'lo')) }}{{ 'x'.upper() }}", "TrueTrueX");
    expect("{{ {'a': 1}.get('b', 'd') }}{{ undefined_name is defined }}{{ none is none }}{{ 'x' is string }}",
           "dFalseTrueTrue");
}

static void filters_cover_what_templates_use(void **state)
{
    (void)state;
    expect("{{ messages[0].content|trim }}|{{ messages|length }}|{{ 'aXb'|lower }}|{{ x|default('d') }}",
           "Sys|3|axb|d");
    expect("{{ {'b': 'é', 'a': [1, 2.0, none]}|tojson }}", "{\"b\": \"é\", \"a\": [1, 2.0, null]}");
    expect("{{ {'a': [1]}|tojson(indent=2) }}", "{\n  \"a\": [\n    1\n  ]\n}");
    expect("{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|join(',') }}", "Hi");
    expect("{{ messages|map(attribute='role')|list|first }}{{ [3,1]|last }}{{ ['a','A','b']|unique|list }}",
           "system1['a', 'b']");
    expect("{{ 'a\nb'|indent(2) }}|{{ 'a\nb'|indent(2, first=true) }}", "a\n  b|  a\n  b");
    expect("{{ \"it's\"|replace(\"'\", '\"') }}{{ ('<'|safe) + '<' }}", "it\"s<&lt;");
    expect_error("{{ messages|map(attribute='role')|tojson }}", TP_EFORMAT, "not JSON serializable");
    expect_error("{{ (messages|select)|length }}", TP_EFORMAT, "generator");
}

static void macros_and_set_blocks_render_to_strings(void **state)
{
    (void)state;
    expect("{% macro m(a, b=2) %}{{ a }}{{ b }}{{ c }}{% endmacro %}{% set c = 3 %}{{ m(1) }}{{ m(4, b=5) }}",
           "123453");
    expect("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}", "321");
    expect("{% set x %}  inner {{ 1 }} {% endset %}[{{ x }}]{% filter trim %}  t  {% endfilter %}",
           "[  inner 1 ]t");
}

static void raise_exception_fails_the_render_with_its_message(void **state)
{
    (void)state;
    expect_error("\n{{ raise_exception('Roles must alternate') }}", TP_EINVAL, "line 2: raise_exception: Roles must "
                                                                              "alternate");
    expect_error("{{ x.y }}", TP_EFORMAT, "'x' is undefined");
    expect_error("{{ 'a' + 1 }}", TP_EFORMAT, "unsupported operand");
}

static void unsupported_constructs_are_refused_by_name_and_line(void **state)
{
    (void)state;
    expect_error("a\n{% include 'x' %}", TP_EINVAL, "line 2: unsupported construct: statement 'include'");
    expect_error("{{ x|wordwrap }}", TP_EINVAL, "unsupported construct: filter 'wordwrap'");
    expect_error("{% if x is divisible %}{% endif %}", TP_EINVAL, "unsupported construct: test 'divisible'");
    expect_error("{{ 'x'.format(1) }}", TP_EINVAL, "unsupported construct: method str.format()");
    expect_error("{{ 'É'|lower }}", TP_EINVAL, "unsupported construct: |lower of non-ASCII text");
    expect_error("{% if true %}", TP_EFORMAT, "missing '{% endif %}'");
    expect_error("{{ 'abc }}", TP_EFORMAT, "unterminated string literal");
    expect_error("{{ namespace() }}", TP_EINVAL, "printing a Namespace");
}

static void hostile_templates_hit_limits_not_the_machine(void **state)
{
    (void)state;
    expect_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", TP_ERANGE,
                 "more than");
    expect_error("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", TP_ERANGE, "nested deeper");
    expect_error("{{ 'x' * 100000000 }}", TP_ERANGE, "limit");
    expect_error("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
                 TP_ERANGE, "limit");
    char deep[4096] = "{{ ";
    for (int i = 0; i < 500; i++)
        strcat(deep, "(");
    strcat(deep, "1");
    for (int i = 0; i < 500; i++)
        strcat(deep, ")");
    strcat(deep, " }}");
    expect_error(deep, TP_ERANGE, "nested deeper");
}

static void turn_end_is_the_text_after_an_assistant_turn(void **state)
{
    (void)state;
    const char *src = "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n{% endfor %}"
                      "{% if add_generation_prompt %}<|assistant|>\n{% else %}{{ eos_token }}{% endif %}";
    tp_chat_template *t = NULL;
    tp_err e;
    assert_int_equal(tp_chat_template_new(src, strlen(src), &t, &e), 0);
    char *end = NULL;
    assert_int_equal(tp_chat_template_turn_end(t, "<s>", "</s>", &end, &e), 0);
    assert_string_equal(end, "<|end|>\n</s>");
    free(end);
    tp_chat_template_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(whitespace_control_follows_trim_and_lstrip_blocks),
        cmocka_unit_test(loops_give_loop_variables_and_scope_sets_per_iteration),
        cmocka_unit_test(expressions_follow_python),
        cmocka_unit_test(filters_cover_what_templates_use),
        cmocka_unit_test(macros_and_set_blocks_render_to_strings),
        cmocka_unit_test(raise_exception_fails_the_render_with_its_message),
        cmocka_unit_test(unsupported_constructs_are_refused_by_name_and_line),
        cmocka_unit_test(hostile_templates_hit_limits_not_the_machine),
        cmocka_unit_test(turn_end_is_the_text_after_an_assistant_turn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
