/* JSON Schema / JSON mode / regex -> GBNF: for each keyword the grammar
 * accepts valid instances and rejects invalid ones (checked with the
 * brute-force recognizer in tests/support/gbnf_bt.c), refusals name the
 * keyword, and hostile input stays bounded. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/gbnf_bt.h"
#include "tokpipe/grammar.h"
#include "tokpipe/jschema.h"

static gbt *compile_schema(const char *schema)
{
    char *g;
    tp_err err = {0};
    if (tp_jschema_to_gbnf(schema, strlen(schema), NULL, &g, &err))
        fail_msg("schema %s refused: %s", schema, err.msg);
    const char *why = "?";
    gbt *o = gbt_new(g, &why);
    if (!o) fail_msg("schema %s gave GBNF the recognizer cannot read (%s):\n%s", schema, why, g);
    /* and the grammar engine takes it within its default limits (the
     * wall-clock one aside: sanitizers and a loaded machine are slow) */
    tp_grammar *gr;
    tp_grammar_limits gl;
    tp_grammar_limits_default(&gl);
    gl.max_compile_ms = 600000;
    if (tp_grammar_compile(g, strlen(g), &gl, &gr, &err)) fail_msg("schema %s: the engine refuses its GBNF: %s\n%s", schema, err.msg, g);
    tp_grammar_free(gr);
    free(g);
    return o;
}

typedef struct kcase {
    const char *schema;
    const char *good[12];
    const char *bad[16];
} kcase;

static void check_cases(const kcase *cs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        gbt *o = compile_schema(cs[i].schema);
        for (const char *const *g = cs[i].good; *g; g++) {
            int r = gbt_match(o, *g, strlen(*g));
            if (r != 1) fail_msg("schema %s: valid instance %s %s", cs[i].schema, *g, r < 0 ? "undecided" : "rejected");
        }
        for (const char *const *b = cs[i].bad; *b; b++) {
            int r = gbt_match(o, *b, strlen(*b));
            if (r != 0) fail_msg("schema %s: invalid instance %s %s", cs[i].schema, *b, r < 0 ? "undecided" : "accepted");
        }
        gbt_free(o);
    }
}

#define CHECK(cs) check_cases(cs, sizeof cs / sizeof cs[0])

static void jschema_types_and_type_lists(void **state)
{
    (void)state;
    static const kcase cs[] = {
        {"{\"type\":\"string\"}", {"\"\"", "\"a b\"", "\"\\u00e9\\n\"", "\"é\"", NULL}, {"1", "\"a", "\"\x01\"", "\"\\x\"", "\"a\" ", " \"a\"", NULL}},
        {"{\"type\":\"integer\"}", {"0", "-7", "1234567890123456", NULL}, {"1.5", "01", "-", "12345678901234567", "1e3", "\"1\"", NULL}},
        {"{\"type\":\"number\"}", {"0", "-0.5", "1e10", "2.25E-3", "1.0", NULL}, {".5", "1.", "01", "+1", "1e", "NaN", NULL}},
        {"{\"type\":\"boolean\"}", {"true", "false", NULL}, {"True", "1", "null", NULL}},
        {"{\"type\":\"null\"}", {"null", NULL}, {"nul", "0", NULL}},
        {"{\"type\":[\"string\",\"null\"]}", {"\"x\"", "null", NULL}, {"1", "true", NULL}},
        {"{\"type\":\"array\"}", {"[]", "[1, \"a\", [null], {}]", "[\n  1,\n  2\n]", NULL}, {"[1,]", "[,1]", "{}", NULL}},
        {"{\"type\":\"object\"}", {"{}", "{\"a\": 1, \"b\": [true]}", NULL}, {"{\"a\"}", "{1: 2}", "[]", "{\"a\": 1,}", NULL}},
        {"true", {"1", "\"s\"", "{\"a\": [1, {\"b\": null}]}", NULL}, {"", "tru", "{", NULL}},
        {"{}", {"null", "[]", NULL}, {"nope", NULL}},
    };
    CHECK(cs);
}

static void jschema_whitespace_is_bounded_and_nothing_follows_the_value(void **state)
{
    (void)state;
    static const kcase cs[] = {
        {"{\"type\":\"object\"}",
         {"{\"a\":1}", "{ \"a\" : 1 }", "{\n  \"a\": 1\n}", "{\n\t\"a\": 1\n}", NULL},
         {"{  \"a\": 1}", "{\"a\": 1}\n", "{\"a\": 1} ", "\n{\"a\": 1}", "{\n                      \"a\": 1}", "{\r\n\"a\":1}", NULL}},
    };
    CHECK(cs);
}

static void jschema_properties_come_in_schema_order_with_optional_keys_in_place(void **state)
{
    (void)state;
    static const kcase cs[] = {
        {"{\"type\":\"object\",\"properties\":{\"b\":{\"type\":\"integer\"},\"a\":{\"type\":\"string\"},\"c\":{\"type\":\"boolean\"}},"
         "\"required\":[\"c\",\"b\"],\"additionalProperties\":false}",
         {"{\"b\": 1, \"c\": true}", "{\"b\": 1, \"a\": \"x\", \"c\": false}", NULL},
         {"{\"c\": true, \"b\": 1}", "{\"a\": \"x\", \"b\": 1, \"c\": true}", "{\"b\": 1}", "{\"b\": 1, \"a\": 2, \"c\": true}",
          "{\"b\": 1, \"c\": true, \"d\": 0}", "{\"b\": 1, \"c\": true, \"c\": true}", "{}", NULL}},
        /* additionalProperties default true: extra keys after the declared ones, never a declared name */
        {"{\"properties\":{\"name\":{\"type\":\"string\"}},\"type\":\"object\"}",
         {"{}", "{\"name\": \"x\"}", "{\"name\": \"x\", \"other\": [1]}", "{\"nam\": 1}", "{\"names\": 1}", "{\"\": 1}", NULL},
         {"{\"name\": 1}", "{\"other\": 1, \"name\": 1}", "{\"x\": 1, \"name\": \"y\"}", NULL}},
        /* extra keys next to non-ASCII and escaped declared names */
        {"{\"type\":\"object\",\"properties\":{\"\u00e9\":{\"type\":\"integer\"},\"a\\nb\":{\"type\":\"null\"}}}",
         {"{\"é\": 1}", "{\"ée\": \"x\"}", "{\"日\": 2}", "{\"a\\nb\": null}", "{\"a\\n\": 1}", "{\"a\": 1}", "{\"é\": 1, \"e\": 2}", NULL},
         {"{\"é\": \"x\"}", "{\"a\\nb\": 1}", "{\"x\": 1, \"é\": 1}", "{\"a\\u000ab\": 1}", NULL}},
        {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"},\"properties\":{\"a\":{\"type\":\"string\"}}}",
         {"{\"a\": \"s\", \"b\": 2}", "{\"z\": 1, \"y\": 2}", NULL}, {"{\"b\": \"s\"}", "{\"a\": 1}", NULL}},
        {"{\"type\":\"object\",\"required\":[\"id\"]}", {"{\"id\": 1}", "{\"id\": 1, \"x\": 2}", NULL}, {"{}", "{\"x\": 2}", NULL}},
        {"{\"type\":\"object\",\"properties\":{\"a\":false,\"b\":{}}}", {"{}", "{\"b\": 1}", NULL}, {"{\"a\": 1}", NULL}},
    };
    /* an object nobody can satisfy is refused as a whole */
    char *g;
    tp_err err = {0};
    const char *never = "{\"type\":\"object\",\"required\":[\"id\"],\"additionalProperties\":false}";
    assert_int_not_equal(tp_jschema_to_gbnf(never, strlen(never), NULL, &g, &err), 0);
    assert_non_null(strstr(err.msg, "no value"));
    CHECK(cs);
}

static void jschema_arrays_items_prefix_items_and_counts(void **state)
{
    (void)state;
    static const kcase cs[] = {
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":3}",
         {"[1, 2]", "[1,2,3]", NULL}, {"[]", "[1]", "[1, 2, 3, 4]", "[1, \"a\"]", NULL}},
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],\"items\":false}",
         {"[]", "[\"a\"]", "[\"a\", 1]", NULL}, {"[1]", "[\"a\", \"b\"]", "[\"a\", 1, 2]", NULL}},
        {"{\"type\":\"array\",\"prefixItems\":[{\"const\":1}],\"items\":{\"type\":\"string\"},\"minItems\":2}",
         {"[1, \"a\"]", "[1, \"a\", \"b\"]", NULL}, {"[1]", "[2, \"a\"]", "[1, 2]", NULL}},
        {"{\"type\":\"array\",\"maxItems\":0}", {"[]", NULL}, {"[1]", NULL}},
        {"{\"type\":\"array\",\"uniqueItems\":false,\"minItems\":1}", {"[1, 1]", NULL}, {"[]", NULL}},
    };
    CHECK(cs);
}

static void jschema_enum_const_and_compositions(void **state)
{
    (void)state;
    static const kcase cs[] = {
        {"{\"enum\":[\"red\",\"green\",1,null,[1,2],{\"k\":\"v\"}]}",
         {"\"red\"", "\"green\"", "1", "null", "[1, 2]", "{\"k\": \"v\"}", NULL}, {"\"blue\"", "2", "[1]", "\"Red\"", NULL}},
        {"{\"type\":\"string\",\"enum\":[\"a\",1,\"b\"]}", {"\"a\"", "\"b\"", NULL}, {"1", NULL}},
        {"{\"const\":\"q\\\"uote\"}", {"\"q\\\"uote\"", NULL}, {"\"q\"", NULL}},
        {"{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":1}]}", {"1", "\"a\"", NULL}, {"\"ab\"", "1.5", NULL}},
        {"{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"string\"}]}", {"1", "\"a\"", NULL}, {"true", NULL}},
        {"{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"a\"},\"x\":{\"type\":\"integer\"}},\"required\":[\"kind\"]},"
         "{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"b\"}},\"required\":[\"kind\"]}]}",
         {"{\"kind\": \"a\", \"x\": 1}", "{\"kind\": \"b\"}", NULL}, {"{\"kind\": \"c\"}", "{\"kind\": \"a\", \"x\": \"s\"}", NULL}},
        {"{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},"
         "{\"properties\":{\"b\":{\"type\":\"string\"}},\"required\":[\"b\"]}]}",
         {"{\"a\": 1, \"b\": \"x\"}", NULL}, {"{\"a\": 1}", "{\"b\": \"x\", \"a\": 1}", "{\"a\": \"1\", \"b\": \"x\"}", NULL}},
        /* oneOf over $refs: the tags behind the references tell the branches apart */
        {"{\"$defs\":{\"cat\":{\"type\":\"object\",\"properties\":{\"pet\":{\"const\":\"cat\"},\"lives\":{\"type\":\"integer\"}},"
         "\"required\":[\"pet\"]},\"dog\":{\"type\":\"object\",\"properties\":{\"pet\":{\"const\":\"dog\"}},\"required\":[\"pet\"]}},"
         "\"oneOf\":[{\"$ref\":\"#/$defs/cat\"},{\"$ref\":\"#/$defs/dog\"}]}",
         {"{\"pet\": \"cat\", \"lives\": 9}", "{\"pet\": \"dog\"}", NULL}, {"{\"pet\": \"cow\"}", "{\"pet\": \"cat\", \"lives\": \"9\"}", NULL}},
        /* additionalProperties:false in one allOf member forbids the other's keys */
        {"{\"allOf\":[{\"properties\":{\"a\":{}},\"additionalProperties\":false},{\"properties\":{\"b\":{}}}],\"type\":\"object\"}",
         {"{}", "{\"a\": 1}", NULL}, {"{\"a\": 1, \"b\": 2}", "{\"b\": 2}", NULL}},
        /* siblings of anyOf apply to each branch */
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"}},\"additionalProperties\":false,"
         "\"anyOf\":[{\"required\":[\"a\"]},{\"required\":[\"b\"]}]}",
         {"{\"a\": 1}", "{\"b\": 2}", "{\"a\": 1, \"b\": 2}", NULL}, {"{}", "{\"c\": 1}", NULL}},
    };
    CHECK(cs);
}

static void jschema_refs_defs_and_recursion(void **state)
{
    (void)state;
    static const kcase cs[] = {
        {"{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
         "\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"],"
         "\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}",
         {"{\"v\": 1, \"next\": null}", "{\"v\": 1, \"next\": {\"v\": 2, \"next\": {\"v\": 3, \"next\": null}}}", NULL},
         {"{\"v\": 1}", "{\"v\": 1, \"next\": {\"v\": 2}}", "{\"v\": 1, \"next\": 3}", NULL}},
        {"{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}}", {"[]", "[[], [[]]]", NULL}, {"[1]", "[[1]]", NULL}},
        {"{\"definitions\":{\"a~b\":{\"type\":\"integer\"},\"c/d\":{\"type\":\"string\"}},\"type\":\"array\","
         "\"prefixItems\":[{\"$ref\":\"#/definitions/a~0b\"},{\"$ref\":\"#/definitions/c~1d\"}]}",
         {"[1, \"x\"]", NULL}, {"[\"x\", 1]", NULL}},
        /* $ref with siblings (2020-12): both apply */
        {"{\"$defs\":{\"s\":{\"type\":\"string\"}},\"$ref\":\"#/$defs/s\",\"maxLength\":2}", {"\"ab\"", NULL}, {"\"abc\"", "1", NULL}},
    };
    CHECK(cs);
}

static void jschema_string_lengths_count_characters(void **state)
{
    (void)state;
    static const kcase cs[] = {
        {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", {"\"ab\"", "\"abc\"", "\"éé\"", "\"\\n\\t\"", "\"日本語\"", NULL},
         {"\"a\"", "\"abcd\"", "\"日\"", NULL}},
        {"{\"type\":\"string\",\"minLength\":1}", {"\"a\"", NULL}, {"\"\"", NULL}},
    };
    CHECK(cs);
}

static char *repeat_text(const char *open, const char *unit, const char *sep, int n, const char *close)
{
    size_t cap = strlen(open) + strlen(close) + (size_t)n * (strlen(unit) + strlen(sep)) + 1;
    char *t = malloc(cap), *p = t;
    p += sprintf(p, "%s", open);
    for (int i = 0; i < n; i++) p += sprintf(p, "%s%s", i ? sep : "", unit);
    sprintf(p, "%s", close);
    return t;
}

/* counts past the engine's {m,n} cap are written as blocks: every count in
 * range still reachable, none outside */
static void jschema_large_counts_stay_exact(void **state)
{
    (void)state;
    static const struct {
        const char *schema, *open, *unit, *sep, *close;
        int good[4], bad[4];
    } cs[] = {
        {"{\"type\":\"string\",\"minLength\":1001,\"maxLength\":1203}", "\"", "a", "", "\"", {1001, 1100, 1199, 1203}, {1000, 1204, 0, -1}},
        {"{\"type\":\"string\",\"maxLength\":1250}", "\"", "é", "", "\"", {0, 1, 1200, 1250}, {1251, 1300, -1, -1}},
        {"{\"type\":\"array\",\"minItems\":1002,\"maxItems\":1104}", "[", "1", ",", "]", {1002, 1050, 1104, -1}, {1001, 1105, 0, -1}},
        {"{\"type\":\"string\",\"pattern\":\"^(ab){2,1010}$\"}", "\"", "ab", "", "\"", {2, 1000, 1010, -1}, {1, 1011, -1, -1}},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        gbt *o = compile_schema(cs[i].schema);
        for (int w = 0; w < 2; w++)
            for (int k = 0; k < 4; k++) {
                int n = w ? cs[i].bad[k] : cs[i].good[k];
                if (n < 0) continue;
                char *t = repeat_text(cs[i].open, cs[i].unit, cs[i].sep, n, cs[i].close);
                int r = gbt_match(o, t, strlen(t));
                if (r != !w) fail_msg("schema %s: %d repetitions %s", cs[i].schema, n, w ? "accepted" : "rejected");
                free(t);
            }
        gbt_free(o);
    }
}

static void jschema_integer_ranges_are_exact(void **state)
{
    (void)state;
    static const kcase cs[] = {
        {"{\"type\":\"integer\",\"minimum\":-15,\"maximum\":123}", {"-15", "-9", "0", "-0", "99", "100", "123", NULL},
         {"-16", "124", "200", "1000", "-100", NULL}},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":0}", {"1", "9999999999999999", NULL}, {"0", "-1", "-0", NULL}},
        {"{\"type\":\"integer\",\"exclusiveMaximum\":-3}", {"-4", "-1000", NULL}, {"-3", "0", "5", NULL}},
        {"{\"type\":\"integer\",\"minimum\":1.5,\"maximum\":3.9}", {"2", "3", NULL}, {"1", "4", NULL}},
        {"{\"type\":\"integer\",\"minimum\":1000,\"maximum\":1000}", {"1000", NULL}, {"999", "1001", NULL}},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", {"0", "0.5", "1", "1.0", "1.00", NULL}, {"-0.5", "1.5", "1.01", "2", NULL}},
        {"{\"type\":\"number\",\"exclusiveMinimum\":0}", {"0.001", "3", "3.5", NULL}, {"0", "0.0", "-1", "-0.5", NULL}},
        {"{\"type\":\"number\",\"exclusiveMaximum\":10,\"minimum\":-2}", {"9.99", "-2", "-1.5", NULL}, {"10", "10.0", "-2.5", "-3", NULL}},
    };
    CHECK(cs);
}

static void jschema_formats_are_exact(void **state)
{
    (void)state;
    static const kcase cs[] = {
        {"{\"type\":\"string\",\"format\":\"date\"}", {"\"2024-02-29\"", "\"2000-02-29\"", "\"2023-12-31\"", "\"1999-04-30\"", NULL},
         {"\"2023-02-29\"", "\"1900-02-29\"", "\"2024-02-30\"", "\"2024-04-31\"", "\"2024-13-01\"", "\"2024-1-01\"", "\"0000-01-01\"", NULL}},
        {"{\"type\":\"string\",\"format\":\"time\"}", {"\"08:30:06Z\"", "\"23:59:60Z\"", "\"12:00:00.123+05:30\"", "\"00:00:00z\"", NULL},
         {"\"24:00:00Z\"", "\"08:60:00Z\"", "\"08:30:06\"", "\"12:00:60Z\"", "\"08:30:06+24:00\"", NULL}},
        {"{\"type\":\"string\",\"format\":\"date-time\"}", {"\"1963-06-19T08:30:06.283185Z\"", "\"1963-06-19t08:30:06z\"", NULL},
         {"\"1963-06-19 08:30:06Z\"", "\"1963-02-30T08:30:06Z\"", NULL}},
        {"{\"type\":\"string\",\"format\":\"uuid\"}", {"\"2EB8AA08-AA98-11EA-B4AA-73B441D16380\"", "\"2eb8aa08-aa98-11ea-b4aa-73b441d16380\"", NULL},
         {"\"2eb8aa08aa9811eab4aa73b441d16380\"", "\"2eb8aa08-aa98-11ea-b4aa-73b441d1638\"", NULL}},
        {"{\"type\":\"string\",\"format\":\"ipv4\"}", {"\"192.168.0.1\"", "\"0.0.0.0\"", "\"255.255.255.255\"", NULL},
         {"\"256.0.0.1\"", "\"01.2.3.4\"", "\"1.2.3\"", NULL}},
        {"{\"type\":\"string\",\"format\":\"email\"}", {"\"joe.bloggs@example.com\"", "\"\\\"joe bloggs\\\"@example.com\"", "\"a@[127.0.0.1]\"", NULL},
         {"\"2962\"", "\".test@example.com\"", "\"test.@example.com\"", "\"te..st@example.com\"", NULL}},
        /* a format together with lengths it always satisfies */
        {"{\"type\":\"string\",\"format\":\"date\",\"maxLength\":10}", {"\"2024-01-01\"", NULL}, {NULL}},
    };
    CHECK(cs);
}

/* ---- formats and patterns that must hold with lengths or each other ---- */

static unsigned long long rng_state = 88172645463325252ull;
static unsigned rnd(unsigned n)
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (unsigned)(rng_state % n);
}

static size_t cp_count(const char *s)
{
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* the JSON string of UTF-8 text s (canonical escapes) */
static void json_quote(const char *s, char *out, size_t cap)
{
    size_t o = 0;
    out[o++] = '"';
    for (; *s && o + 8 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') out[o++] = '\\', out[o++] = (char)c;
        else if (c == '\n') out[o++] = '\\', out[o++] = 'n';
        else if (c < 0x20) o += (size_t)snprintf(out + o, cap - o, "\\u%04x", c);
        else out[o++] = (char)c;
    }
    out[o++] = '"';
    out[o] = 0;
}

/* a random edit of s: delete, insert or replace a character, or repeat a
 * stretch (so lengths reach the bounds) */
static void mutate(char *s, size_t cap)
{
    static const char *const pieces[] = {"0", "1", "2", "5", "9", ":", "-", ".", "T", "Z", "z", "+", "@", "a",
                                         "b", "[", "]", "\"", "\\", " ", "\xc3\xa9", "x-y", "aa.", "00"};
    size_t n = strlen(s);
    unsigned op = rnd(4);
    size_t at = n ? rnd((unsigned)n + 1) : 0;
    while (at < n && ((unsigned char)s[at] & 0xC0) == 0x80) at++;
    if (op == 0 && at < n) {
        size_t k = 1;
        while (at + k < n && ((unsigned char)s[at + k] & 0xC0) == 0x80) k++;
        memmove(s + at, s + at + k, n - at - k + 1);
        return;
    }
    const char *ins = pieces[rnd(sizeof pieces / sizeof pieces[0])];
    char rep[64];
    if (op == 3 && at < n) {
        size_t k = 1 + rnd(8);
        if (at + k > n) k = n - at;
        while (at + k < n && ((unsigned char)s[at + k] & 0xC0) == 0x80) k++;
        memcpy(rep, s + at, k < sizeof rep ? k : sizeof rep - 1);
        rep[k < sizeof rep ? k : sizeof rep - 1] = 0;
        ins = rep;
    }
    size_t k = strlen(ins);
    if (n + k + 1 >= cap) return;
    if (op == 2 && at < n && (unsigned char)s[at] < 0x80 && (unsigned char)*ins < 0x80) s[at] = *ins;
    else {
        memmove(s + at + k, s + at, n - at + 1);
        memcpy(s + at, ins, k);
    }
}

/* The oracle: a string is in {format, pattern, minLength, maxLength} iff
 * the format alone accepts it, the pattern alone accepts it, and its
 * length in characters is within the bounds: each alone is compiled by the
 * plain path (checked above), counted here. */
static void jschema_formats_and_patterns_hold_with_lengths_and_each_other(void **state)
{
    (void)state;
    static const struct {
        const char *fmt, *pat;
        long mn, mx; /* -1: absent */
        const char *seeds[4];
    } cs[] = {
        {"email", NULL, -1, 20, {"joe.bloggs@example.com", "a@b", "\"a b\"@x-y.z", "a@[1.2.3.4]"}},
        {"email", NULL, 8, 30, {"joe.bloggs@example.com", "a@b.c", "\"a b\"@x-y.z", "ab@[10.20.30.40]"}},
        {"email", NULL, 12, -1, {"joe@example.com", "a@b", "a.b@c", "x@[1.2.3.4]"}},
        {"email", "^[a-z.]+@example\\\\.com$", -1, 24, {"joe.bloggs@example.com", "a@example.com", "a..b@example.com", NULL}},
        {"time", NULL, 16, -1, {"08:30:06Z", "12:00:00.123+05:30", "23:59:60.1z", NULL}},
        {"date", "^20", -1, -1, {"2024-02-29", "1999-01-01", "2000-02-29", NULL}},
        {"date", "[13579]$", -1, -1, {"2024-02-29", "2023-12-31", "2023-12-01", NULL}},
        {"time", NULL, 10, 14, {"08:30:06Z", "12:00:00.123+05:30", "23:59:60z", "08:30:06.5Z"}},
        {"date-time", NULL, -1, 25, {"1963-06-19T08:30:06.283185Z", "2024-02-29t23:59:60+00:00", "2000-01-01T00:00:00Z", NULL}},
        {"ipv4", NULL, 9, 11, {"192.168.0.1", "10.0.0.1", "1.2.3.4", "255.255.255.255"}},
        {"ipv4", "^10\\\\.", 8, -1, {"10.0.0.1", "10.200.3.4", "1.2.3.4", NULL}},
        {"uuid", "^[0-9a-f-]*$", -1, -1, {"2eb8aa08-aa98-11ea-b4aa-73b441d16380", "2EB8AA08-AA98-11EA-B4AA-73B441D16380", NULL, NULL}},
        {NULL, "^[a-z]+(-[a-z]+)*$", 3, 9, {"abc", "a-b-c", "abcdefghij", "x-yz"}},
        {NULL, "\\\"", 2, 4, {"a\"b", "\"\"", "\\\"", "abc"}},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        char schema[512], one[512];
        int n = snprintf(schema, sizeof schema, "{\"type\":\"string\"");
        if (cs[i].fmt) n += snprintf(schema + n, sizeof schema - (size_t)n, ",\"format\":\"%s\"", cs[i].fmt);
        if (cs[i].pat) n += snprintf(schema + n, sizeof schema - (size_t)n, ",\"pattern\":\"%s\"", cs[i].pat);
        if (cs[i].mn >= 0) n += snprintf(schema + n, sizeof schema - (size_t)n, ",\"minLength\":%ld", cs[i].mn);
        if (cs[i].mx >= 0) n += snprintf(schema + n, sizeof schema - (size_t)n, ",\"maxLength\":%ld", cs[i].mx);
        snprintf(schema + n, sizeof schema - (size_t)n, "}");
        gbt *all = compile_schema(schema), *f = NULL, *p = NULL;
        if (cs[i].fmt) {
            snprintf(one, sizeof one, "{\"type\":\"string\",\"format\":\"%s\"}", cs[i].fmt);
            f = compile_schema(one);
        }
        if (cs[i].pat) {
            snprintf(one, sizeof one, "{\"type\":\"string\",\"pattern\":\"%s\"}", cs[i].pat);
            p = compile_schema(one);
        }
        int yes = 0, no = 0;
        for (int k = 0; k < 3000; k++) {
            char s[256], q[1600];
            const char *seed = cs[i].seeds[rnd(4)];
            snprintf(s, sizeof s, "%s", seed ? seed : cs[i].seeds[0]);
            for (unsigned m = rnd(6); m; m--) mutate(s, 80);
            json_quote(s, q, sizeof q);
            size_t len = cp_count(s);
            int want = (!f || gbt_match(f, q, strlen(q)) == 1) && (!p || gbt_match(p, q, strlen(q)) == 1) &&
                       (cs[i].mn < 0 || len >= (size_t)cs[i].mn) && (cs[i].mx < 0 || len <= (size_t)cs[i].mx);
            int got = gbt_match(all, q, strlen(q));
            if (got != want) fail_msg("schema %s: %s %s, the format/pattern alone and the length say %s", schema, q,
                                      got == 1 ? "accepted" : got ? "undecided" : "rejected", want ? "valid" : "invalid");
            want ? yes++ : no++;
        }
        if (yes < 50 || no < 50) fail_msg("schema %s: only %d valid and %d invalid strings tried", schema, yes, no);
        gbt_free(all);
        gbt_free(f);
        gbt_free(p);
    }
}

/* Pydantic's EmailStr with max_length 254: the longest address fits, one
 * character more does not, and the engine takes the grammar within its
 * default limits (compile_schema) */
static void jschema_email_at_its_longest(void **state)
{
    (void)state;
    gbt *o = compile_schema("{\"type\":\"string\",\"format\":\"email\",\"maxLength\":254,\"title\":\"Email\"}");
    char s[300];
    for (int len = 253; len <= 255; len++) {
        /* 64 characters, "@", and labels "a." ending in "b" or "bc" */
        int n = snprintf(s, sizeof s, "\"%.64s@", "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz");
        int d = len - 65;
        for (int k = 0; k < (d - 1) / 2; k++) n += snprintf(s + n, sizeof s - (size_t)n, "a.");
        n += snprintf(s + n, sizeof s - (size_t)n, "%s\"", d % 2 ? "b" : "bc");
        if (n - 2 != len) fail_msg("the test built %d characters, not %d", n - 2, len);
        int r = gbt_match(o, s, (size_t)n);
        if (r != (len <= 254)) fail_msg("an address of %d characters %s", len, r == 1 ? "accepted" : "rejected");
    }
    gbt_free(o);
}

static void jschema_patterns(void **state)
{
    (void)state;
    static const kcase cs[] = {
        {"{\"type\":\"string\",\"pattern\":\"^[a-z]+-\\\\d{2,3}$\"}", {"\"ab-12\"", "\"x-123\"", NULL}, {"\"ab-1\"", "\"AB-12\"", "\"ab-1234\"", NULL}},
        {"{\"type\":\"string\",\"pattern\":\"^(foo|ba[rz])?$\"}", {"\"\"", "\"foo\"", "\"baz\"", NULL}, {"\"fo\"", "\"foobar\"", NULL}},
        {"{\"type\":\"string\",\"pattern\":\"a+\"}", {"\"a\"", "\"xaay\"", NULL}, {"\"\"", "\"bcd\"", NULL}},
        {"{\"type\":\"string\",\"pattern\":\"^\\\"[^\\\"]*\\\"$\"}", {"\"\\\"hi\\\"\"", NULL}, {"\"hi\"", "\"\\\"a\\\"b\\\"\"", NULL}},
        /* quantified characters that JSON escapes */
        {"{\"type\":\"string\",\"pattern\":\"^\\\"?a\\\\n?[\\\\t\\\"]*$\"}",
         {"\"a\"", "\"\\\"a\"", "\"a\\n\"", "\"a\\t\\\"\\t\"", NULL},
         {"\"\\\\a\"", "\"\\\"\"", "\"a\\n\\n\"", "\"a\\u0009\"", NULL}},
        {"{\"type\":\"string\",\"pattern\":\"^.$\"}", {"\"a\"", "\"é\"", "\"\\t\"", NULL}, {"\"\\n\"", "\"ab\"", NULL}},
        {"{\"type\":\"string\",\"pattern\":\"^\\\\w\\\\s\\\\S$\",\"maxLength\":3}", {"\"a b\"", "\"_\\tx\"", NULL}, {"\"a  \"", "\"-  \"", NULL}},
    };
    CHECK(cs);
}

static void expect_refused(const char *schema, const char *needle)
{
    char *g = NULL;
    tp_err err = {0};
    int rc = tp_jschema_to_gbnf(schema, strlen(schema), NULL, &g, &err);
    if (!rc) fail_msg("schema %s accepted, expected a refusal naming '%s':\n%s", schema, needle, g);
    assert_null(g);
    if (!strstr(err.msg, needle)) fail_msg("schema %s: error '%s' does not name '%s'", schema, err.msg, needle);
}

static void jschema_refuses_what_it_cannot_enforce_naming_it(void **state)
{
    (void)state;
    static const char *const kws[][2] = {
        {"{\"not\":{\"type\":\"string\"}}", "'not'"},
        {"{\"if\":{},\"then\":{}}", "'if'"},
        {"{\"type\":\"object\",\"patternProperties\":{\"^a\":{}}}", "'patternProperties'"},
        {"{\"type\":\"object\",\"propertyNames\":{\"maxLength\":3}}", "'propertyNames'"},
        {"{\"type\":\"object\",\"minProperties\":1}", "'minProperties'"},
        {"{\"type\":\"object\",\"dependentRequired\":{\"a\":[\"b\"]}}", "'dependentRequired'"},
        {"{\"type\":\"array\",\"contains\":{\"type\":\"integer\"}}", "'contains'"},
        {"{\"type\":\"array\",\"uniqueItems\":true}", "uniqueItems"},
        {"{\"type\":\"number\",\"multipleOf\":2}", "'multipleOf'"},
        {"{\"unevaluatedProperties\":false}", "'unevaluatedProperties'"},
        {"{\"type\":\"string\",\"format\":\"uri\"}", "format 'uri'"},
        {"{\"type\":\"string\",\"format\":\"email\",\"maxLength\":100000}", "format with minLength/maxLength: the lengths need"},
        {"{\"type\":\"string\",\"pattern\":\"^.*a.{15}$\",\"maxLength\":40}", "pattern with minLength/maxLength: more than"},
        {"{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "backreference"},
        {"{\"type\":\"string\",\"pattern\":\"a(?=b)\"}", "lookaround"},
        {"{\"type\":\"string\",\"pattern\":\"\\\\bx\"}", "word boundary"},
        {"{\"type\":\"string\",\"pattern\":\"\\\\p{L}\"}", "\\p"},
        {"{\"type\":\"string\",\"pattern\":\"^(a?)*$\"}", "can be empty"},
        {"{\"type\":\"string\",\"pattern\":\"a^b\"}", "anchor"},
        {"{\"type\":\"number\",\"minimum\":0.5}", "minimum: a non-integer bound"},
        {"{\"type\":\"integer\",\"maximum\":9007199254740993}", "maximum"},
        {"{\"$ref\":\"http://example.com/s.json\"}", "only local references"},
        {"{\"$ref\":\"#/$defs/missing\"}", "no such location"},
        {"{\"oneOf\":[{\"type\":\"integer\"},{\"minimum\":2}]}", "oneOf: branches 0 and 1 may both match"},
        {"{\"allOf\":[{\"pattern\":\"a\"},{\"pattern\":\"b\"}]}", "two different 'pattern'"},
        {"{\"type\":\"strin\"}", "type: expected one of"},
        {"{\"type\":\"object\",\"nullable\":true}", "'nullable'"},
        {"{\"$ref\":\"#\"}", "left recursion"},
        {"{\"anyOf\":[{\"type\":\"null\"},{\"$ref\":\"#\"}]}", "left recursion"},
        {"[1]", "a schema must be an object or a boolean"},
        {"{\"type\":", "not valid JSON"},
        {"{} x", "text after the JSON value"},
    };
    for (size_t i = 0; i < sizeof kws / sizeof kws[0]; i++) {
        expect_refused(kws[i][0], kws[i][1]);
        /* every refusal of a schema that parses says where, and what is there */
        char *g = NULL;
        tp_err err = {0};
        tp_jschema_to_gbnf(kws[i][0], strlen(kws[i][0]), NULL, &g, &err);
        if (!strstr(kws[i][1], "JSON") && !strstr(err.msg, " (at \""))
            fail_msg("schema %s: refusal '%s' names no JSON pointer", kws[i][0], err.msg);
    }
}

/* the pointer (RFC 6901: ~0 for ~, ~1 for /) and the value, nested and
 * behind merging too */
static void jschema_refusals_name_the_pointer_and_the_value(void **state)
{
    (void)state;
    static const char *const cs[][2] = {
        {"{\"type\":\"strnig\"}", "(at \"/type\": \"strnig\")"},
        {"{\"properties\":{\"a\":{\"items\":{\"type\":\"strnig\"}}}}", "(at \"/properties/a/items/type\": \"strnig\")"},
        {"{\"properties\":{\"a/b~c\":{\"type\":[\"string\",7]}}}", "(at \"/properties/a~1b~0c/type/1\": 7)"},
        {"{\"allOf\":[{\"properties\":{\"a\":{\"items\":{\"type\":\"x\"}}}}]}", "(at \"/allOf/0/properties/a/items/type\": \"x\")"},
        {"{\"$defs\":{\"p\":{\"properties\":{\"n\":{\"minimum\":\"1\"}}}},\"$ref\":\"#/$defs/p\"}",
         "(at \"/$defs/p/properties/n/minimum\": \"1\")"},
        {"{\"anyOf\":[{\"type\":\"string\"},{\"minLength\":-1}]}", "(at \"/anyOf/1/minLength\": -1)"},
        {"{\"prefixItems\":[{},{\"multipleOf\":3}]}", "(at \"/prefixItems/1/multipleOf\": 3)"},
        {"{\"type\":\"string\",\"format\":\"uri\"}", "(at \"/format\": \"uri\")"},
        {"{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "(at \"/pattern\": \"(a)\\\\1\")"},
        {"{\"oneOf\":[{\"type\":\"integer\"},{\"minimum\":2}]}", "(at \"/oneOf/1\": {\"minimum\":2})"},
        {"{\"properties\":{\"x\":{\"type\":\"integer\",\"minimum\":5,\"maximum\":1}},\"required\":[\"x\"]}",
         "(at \"/properties/x\": {\"type\":\"integer\",\"minimum\":5,\"maximum\":1})"},
        {"[1]", "(at \"\": [1])"},
        /* a long value is cut, with an ellipsis */
        {"{\"properties\":{\"d\":{\"not\":{\"description\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}}}}",
         "(at \"/properties/d/not\": {\"description\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\u2026)"},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) expect_refused(cs[i][0], cs[i][1]);
}

static void jschema_annotations_are_fine(void **state)
{
    (void)state;
    static const kcase cs[] = {
        {"{\"$schema\":\"https://json-schema.org/draft/2020-12/schema\",\"$id\":\"https://x/y\",\"title\":\"T\","
         "\"description\":\"d\",\"examples\":[1],\"default\":1,\"$comment\":\"c\",\"deprecated\":false,\"readOnly\":true,"
         "\"writeOnly\":false,\"x-vendor\":{\"any\":1},\"type\":\"integer\"}",
         {"1", NULL}, {"\"1\"", NULL}},
    };
    CHECK(cs);
}

static void jschema_hostile_input_is_bounded(void **state)
{
    (void)state;
    /* deep nesting: refused before parsing */
    size_t n = 100000;
    char *deep = malloc(n * 2 + 64);
    size_t k = 0;
    for (size_t i = 0; i < n / 8; i++) k += (size_t)sprintf(deep + k, "{\"items\":");
    k += (size_t)sprintf(deep + k, "{}");
    for (size_t i = 0; i < n / 8; i++) deep[k++] = '}';
    deep[k] = 0;
    char *g = NULL;
    tp_err err = {0};
    assert_int_equal(tp_jschema_to_gbnf(deep, k, NULL, &g, &err), TP_ERANGE);
    assert_non_null(strstr(err.msg, "deeper"));
    free(deep);
    /* automata for a format/pattern with lengths: bounded in steps, not only states */
    expect_refused("{\"type\":\"string\",\"format\":\"date\",\"pattern\":\"^(.|..){0,2000}$\"}", "steps to build");
    expect_refused("{\"type\":\"string\",\"pattern\":\"^[ab]{0,4000}$\",\"minLength\":1}", "grammar rules");
    /* a schema past the byte limit */
    tp_jschema_opts o;
    tp_jschema_opts_default(&o);
    o.max_schema_bytes = 10;
    const char *s = "{\"type\":\"string\"}";
    assert_int_equal(tp_jschema_to_gbnf(s, strlen(s), &o, &g, &err), TP_ERANGE);
    assert_non_null(strstr(err.msg, "limit"));
    /* a grammar past the output limit */
    tp_jschema_opts_default(&o);
    o.max_gbnf_bytes = 2000;
    char big[8192];
    k = (size_t)sprintf(big, "{\"enum\":[");
    for (int i = 0; i < 100; i++) k += (size_t)sprintf(big + k, "%s\"value-%03d-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"", i ? "," : "", i);
    sprintf(big + k, "]}");
    s = big;
    assert_int_equal(tp_jschema_to_gbnf(s, strlen(s), &o, &g, &err), TP_ERANGE);
    assert_non_null(strstr(err.msg, "2000 bytes"));
    /* exploding repetitions in a pattern */
    s = "{\"type\":\"string\",\"pattern\":\"^(a{1000}){1000}$\"}";
    assert_int_not_equal(tp_jschema_to_gbnf(s, strlen(s), NULL, &g, &err), 0);
    assert_non_null(strstr(err.msg, "expands"));
    s = "{\"type\":\"string\",\"pattern\":\"a{99999999999}\"}";
    assert_int_not_equal(tp_jschema_to_gbnf(s, strlen(s), NULL, &g, &err), 0);
    assert_non_null(strstr(err.msg, "repetition count"));
    /* a oneOf too big to compare in pairs: fine when all constants differ */
    char *one = malloc(20000);
    k = (size_t)sprintf(one, "{\"oneOf\":[");
    for (int i = 0; i < 1000; i++) k += (size_t)sprintf(one + k, "%s{\"const\":%d}", i ? "," : "", i);
    sprintf(one + k, "]}");
    gbt *o1 = compile_schema(one);
    assert_int_equal(gbt_match(o1, "999", 3), 1);
    assert_int_equal(gbt_match(o1, "1000", 4), 0);
    gbt_free(o1);
    sprintf(one + k, ",{\"const\":5}]}");
    assert_int_not_equal(tp_jschema_to_gbnf(one, strlen(one), NULL, &g, &err), 0);
    assert_non_null(strstr(err.msg, "same value"));
    sprintf(one + k, ",{\"type\":\"string\"}]}");
    assert_int_not_equal(tp_jschema_to_gbnf(one, strlen(one), NULL, &g, &err), 0);
    assert_non_null(strstr(err.msg, "too many to prove"));
    free(one);
    /* a $ref cycle with no content */
    s = "{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\",\"type\":\"object\"},\"b\":{\"$ref\":\"#/$defs/a\",\"minProperties\":0}},\"$ref\":\"#/$defs/a\"}";
    assert_int_not_equal(tp_jschema_to_gbnf(s, strlen(s), NULL, &g, &err), 0);
    assert_null(g);
}

static void regex_to_gbnf_matches_in_full(void **state)
{
    (void)state;
    static const struct {
        const char *re;
        const char *good[6], *bad[6];
    } cs[] = {
        {"^ab?c{2,}$", {"acc", "abccc", NULL}, {"ac", "abbcc", NULL}},
        {"^[^a-c\\]]x$", {"dx", "\"x", NULL}, {"ax", "]x", NULL}},
        {"^(?:\\d{3}-){2}\\d{4}$", {"555-123-4567", NULL}, {"555-1234567", NULL}},
        {"cat|dog", {"a cat", "dogs", NULL}, {"cow", NULL}},
        {"^\\u00e9\\x41\\.$", {"éA.", NULL}, {"éAx", NULL}},
        {"^a*?b+?$", {"aab", "b", NULL}, {"a", NULL}},
        /* a brace that does not make a whole quantifier is a literal */
        {"^a{2,x}b{5,4V}$", {"a{2,x}b{5,4V}", NULL}, {"aab", "aabbbbb", NULL}},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        char *g;
        tp_err err = {0};
        if (tp_regex_to_gbnf(cs[i].re, strlen(cs[i].re), NULL, &g, &err)) fail_msg("regex %s: %s", cs[i].re, err.msg);
        gbt *o = gbt_new(g, NULL);
        if (!o) fail_msg("regex %s: unreadable GBNF:\n%s", cs[i].re, g);
        for (const char *const *x = cs[i].good; *x; x++)
            if (gbt_match(o, *x, strlen(*x)) != 1) fail_msg("regex %s rejects %s:\n%s", cs[i].re, *x, g);
        for (const char *const *x = cs[i].bad; *x; x++)
            if (gbt_match(o, *x, strlen(*x)) != 0) fail_msg("regex %s accepts %s:\n%s", cs[i].re, *x, g);
        gbt_free(o);
        free(g);
    }
}

static void json_mode_is_any_object(void **state)
{
    (void)state;
    char *g;
    tp_err err = {0};
    assert_int_equal(tp_jschema_json_mode_gbnf(&g, &err), 0);
    gbt *o = gbt_new(g, NULL);
    assert_non_null(o);
    free(g);
    static const char *const good[] = {"{}", "{\"a\": [1, 2.5e3, \"x\", null, true, {\"b\": {}}]}", NULL};
    static const char *const bad[] = {"[]", "1", "\"s\"", "{} {}", "{\"a\": 01}", "{\"a\": 1.}", NULL};
    for (const char *const *x = good; *x; x++) assert_int_equal(gbt_match(o, *x, strlen(*x)), 1);
    for (const char *const *x = bad; *x; x++) assert_int_equal(gbt_match(o, *x, strlen(*x)), 0);
    gbt_free(o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(jschema_types_and_type_lists),
        cmocka_unit_test(jschema_whitespace_is_bounded_and_nothing_follows_the_value),
        cmocka_unit_test(jschema_properties_come_in_schema_order_with_optional_keys_in_place),
        cmocka_unit_test(jschema_arrays_items_prefix_items_and_counts),
        cmocka_unit_test(jschema_enum_const_and_compositions),
        cmocka_unit_test(jschema_refs_defs_and_recursion),
        cmocka_unit_test(jschema_string_lengths_count_characters),
        cmocka_unit_test(jschema_integer_ranges_are_exact),
        cmocka_unit_test(jschema_large_counts_stay_exact),
        cmocka_unit_test(jschema_formats_are_exact),
        cmocka_unit_test(jschema_patterns),
        cmocka_unit_test(jschema_formats_and_patterns_hold_with_lengths_and_each_other),
        cmocka_unit_test(jschema_email_at_its_longest),
        cmocka_unit_test(jschema_refuses_what_it_cannot_enforce_naming_it),
        cmocka_unit_test(jschema_refusals_name_the_pointer_and_the_value),
        cmocka_unit_test(jschema_annotations_are_fine),
        cmocka_unit_test(jschema_hostile_input_is_bounded),
        cmocka_unit_test(regex_to_gbnf_matches_in_full),
        cmocka_unit_test(json_mode_is_any_object),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
