/* tp_stop: the per-job stop state (DESIGN.md §3). The seed's own test list
 * and one test per pitfall of research/stop-anchors.md (§B numbers in the
 * comments). Every run also checks concatenated chunks == final text. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/stop.h"

/* Pieces are written {"text"} or {"raw", len, id}: the omitted fields are
 * meant to be zero. */
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#define MAX_STEPS 512

/* A piece: text (NUL-terminated, or raw with explicit len) and an id. */
typedef struct piece {
    const char *b;
    size_t len;   /* 0 = strlen(b) */
    int32_t id;   /* 0 = 1000 + index */
} piece;

typedef struct run {
    tp_stop *s;
    char chunk[MAX_STEPS + 1][256];
    bool accepted[MAX_STEPS];
    size_t steps;            /* candidates consumed */
    tp_stop_step last;
    char text[4096];
    tp_finish_reason finish;
    int32_t tokens;
} run;

static tp_stop_config cfg_stops(const char *const *stops, size_t n)
{
    tp_stop_config c = {.stop = stops, .n_stop = n, .max_tokens = TP_STOP_NO_LIMIT};
    return c;
}

static void check_chunks_concat(run *r)
{
    char cat[4096] = "";
    for (size_t k = 0; k <= r->steps; k++) strcat(cat, r->chunk[k]);
    assert_string_equal(cat, r->text);
}

/* Feed the pieces until the job finishes; cancel if they run out. The
 * caller frees r->s. */
static void run_pieces(run *r, const tp_stop_config *c, const piece *p, size_t n)
{
    memset(r, 0, sizeof *r);
    tp_err err;
    if (tp_stop_new(c, &r->s, &err)) fail_msg("tp_stop_new: %s", err.msg);
    size_t k = 0;
    for (; k < n && tp_stop_finish_reason(r->s) == TP_FINISH_NONE; k++) {
        size_t len = p[k].len ? p[k].len : strlen(p[k].b);
        int32_t id = p[k].id ? p[k].id : (int32_t)(1000 + k);
        assert_int_equal(tp_stop_feed(r->s, id, (const uint8_t *)p[k].b, len, &r->last), 0);
        snprintf(r->chunk[k], sizeof r->chunk[k], "%.*s", (int)r->last.chunk_len, r->last.chunk);
        r->accepted[k] = r->last.accepted;
    }
    r->steps = k;
    if (tp_stop_finish_reason(r->s) == TP_FINISH_NONE) {
        assert_int_equal(tp_stop_cancel(r->s, &r->last), 0);
        snprintf(r->chunk[k], sizeof r->chunk[k], "%.*s", (int)r->last.chunk_len, r->last.chunk);
    }
    size_t len;
    snprintf(r->text, sizeof r->text, "%s", tp_stop_text(r->s, &len));
    r->finish = tp_stop_finish_reason(r->s);
    r->tokens = tp_stop_completion_tokens(r->s);
    check_chunks_concat(r);
}

#define PIECES(...) ((const piece[]){__VA_ARGS__}), (sizeof((const piece[]){__VA_ARGS__}) / sizeof(piece))
#define STOPS(...) ((const char *const[]){__VA_ARGS__}), (sizeof((const char *const[]){__VA_ARGS__}) / sizeof(char *))

static void expect(run *r, const char *text, tp_finish_reason why, const char *matched, int32_t tokens)
{
    assert_string_equal(r->text, text);
    if (r->finish != why)
        fail_msg("finish %s, expected %s", tp_finish_reason_name(r->finish), tp_finish_reason_name(why));
    if (matched) {
        assert_non_null(r->last.matched_str);
        assert_int_equal(r->last.matched_len, strlen(matched));
        assert_memory_equal(r->last.matched_str, matched, strlen(matched));
    } else {
        assert_null(r->last.matched_str);
    }
    assert_int_equal(r->tokens, tokens);
}

/* ---- exact match, candidate-aware ---- */

static void stop_exact_match_cuts_before_the_stop(void **state)
{
    (void)state;
    run r;
    tp_stop_config c = cfg_stops(STOPS(" world"));
    run_pieces(&r, &c, PIECES({"Hello"}, {" world"}, {"!"}));
    expect(&r, "Hello", TP_FINISH_STOP_STRING, " world", 1);
    assert_false(r.accepted[1]);
    assert_int_equal(r.steps, 2);
    tp_stop_free(r.s);
}

/* §B25: the seed noticed DEFGHIJ one token late, kept it and had streamed it. */
static void stop_is_not_one_token_late(void **state)
{
    (void)state;
    run r;
    tp_stop_config c = cfg_stops(STOPS("DEFGHIJ"));
    run_pieces(&r, &c, PIECES({"ABC"}, {"DEF"}, {"G"}, {"HI"}, {"J"}, {"KL"}));
    expect(&r, "ABC", TP_FINISH_STOP_STRING, "DEFGHIJ", 4);
    assert_int_equal(r.steps, 5);   /* KL never reached the stage */
    for (size_t k = 0; k < r.steps; k++) assert_null(strstr(r.chunk[k], "DEF"));
    tp_stop_step st;
    assert_int_equal(tp_stop_feed(r.s, 7, (const uint8_t *)"KL", 2, &st), TP_ESTATE);
    assert_int_equal(tp_stop_cancel(r.s, &st), TP_ESTATE);
    tp_stop_free(r.s);
}

/* §B1: stop ends inside a token (ends_with never sees it). */
static void stop_cut_inside_token(void **state)
{
    (void)state;
    run r;
    tp_stop_config c = cfg_stops(STOPS("Pari"));
    run_pieces(&r, &c, PIECES({"The capital is"}, {" Paris"}, {"."}));
    expect(&r, "The capital is ", TP_FINISH_STOP_STRING, "Pari", 1);
    tp_stop_free(r.s);
    c = cfg_stops(STOPS("\","));
    run_pieces(&r, &c, PIECES({"[\"a"}, {"\",\""}, {"b\"]"}));
    expect(&r, "[\"a", TP_FINISH_STOP_STRING, "\",", 1);
    tp_stop_free(r.s);
}

/* §B23: stop ".." inside the single token "..." keeps no dot. */
static void stop_cut_at_exact_byte_not_whole_token(void **state)
{
    (void)state;
    run r;
    tp_stop_config c = cfg_stops(STOPS(".."));
    run_pieces(&r, &c, PIECES({"Wait"}, {"..."}));
    expect(&r, "Wait", TP_FINISH_STOP_STRING, "..", 1);
    tp_stop_free(r.s);
}

/* §B10: earliest end wins, not list order. */
static void stop_earliest_end_wins_over_list_order(void **state)
{
    (void)state;
    run r;
    tp_stop_config c = cfg_stops(STOPS("lo", "ell"));
    run_pieces(&r, &c, PIECES({"hello"}));
    expect(&r, "h", TP_FINISH_STOP_STRING, "ell", 0);
    tp_stop_free(r.s);
    c = cfg_stops(STOPS("re", "he"));
    run_pieces(&r, &c, PIECES({"there"}));
    expect(&r, "t", TP_FINISH_STOP_STRING, "he", 0);
    tp_stop_free(r.s);
    c = cfg_stops(STOPS("a", "is", ","));
    run_pieces(&r, &c, PIECES({" The user"}, {" is a"}));
    expect(&r, " The user ", TP_FINISH_STOP_STRING, "is", 1);
    tp_stop_free(r.s);
}

static void stop_tie_at_same_end_takes_longest(void **state)
{
    (void)state;
    run r;
    tp_stop_config c = cfg_stops(STOPS("b", "ab", "xab"));
    run_pieces(&r, &c, PIECES({"zz"}, {"xa"}, {"b!"}));
    expect(&r, "zz", TP_FINISH_STOP_STRING, "xab", 2);
    tp_stop_free(r.s);
}

/* Seed list: END / ENDING / ENDING: overlap; §B22: a stop that is a prefix of
 * another completes first. */
static void stop_overlapping_prefix_stops_shorter_completes_first(void **state)
{
    (void)state;
    run r;
    tp_stop_config c = cfg_stops(STOPS("ENDING:", "ENDING", "END"));
    run_pieces(&r, &c, PIECES({"THE "}, {"ENDING:"}, {" now"}));
    expect(&r, "THE ", TP_FINISH_STOP_STRING, "END", 1);
    tp_stop_free(r.s);
    c = cfg_stops(STOPS(">>>>>>> UPDATED", ">>>>>>> UPDATED\n"));
    run_pieces(&r, &c, PIECES({"code\n"}, {">>>>>>>"}, {" UPD"}, {"ATED\n"}));
    expect(&r, "code\n", TP_FINISH_STOP_STRING, ">>>>>>> UPDATED", 3);
    tp_stop_free(r.s);
}

/* §B11: a stop produced as many tokens, longer than any token window. */
static void stop_spanning_more_tokens_than_any_window(void **state)
{
    (void)state;
    char stop[201];
    memset(stop, 'x', 199);
    stop[199] = '!';
    stop[200] = '\0';
    tp_stop_config c = cfg_stops(STOPS(stop));
    run r;
    piece p[260];
    p[0] = (piece){"start ", 0, 0};
    for (size_t k = 1; k < 250; k++) p[k] = (piece){"x", 0, 0};
    p[250] = (piece){"!end", 0, 0};
    run_pieces(&r, &c, p, 251);
    /* 249 x's then "!": the stop covers the last 199 x's. */
    char expect_text[300] = "start ";
    memset(expect_text + 6, 'x', 50);
    expect_text[56] = '\0';
    expect(&r, expect_text, TP_FINISH_STOP_STRING, stop, 250);
    tp_stop_free(r.s);
}

/* ---- ids ---- */

/* Rule order: a stop id wins over the stop string its own text would
 * complete, and its text is not emitted. */
static void stop_id_beats_stop_string_and_eos(void **state)
{
    (void)state;
    int32_t ids[] = {7}, eos[] = {7, 2};
    tp_stop_config c = cfg_stops(STOPS("end"));
    c.stop_ids = ids;
    c.n_stop_ids = 1;
    c.eos_ids = eos;
    c.n_eos_ids = 2;
    run r;
    run_pieces(&r, &c, PIECES({"the "}, {"end", 0, 7}));
    expect(&r, "the ", TP_FINISH_STOP_TOKEN, NULL, 1);
    assert_int_equal(r.last.matched_id, 7);
    tp_stop_free(r.s);
    run_pieces(&r, &c, PIECES({"the "}, {"en", 0, 2}));
    expect(&r, "the ", TP_FINISH_EOS, NULL, 1);
    assert_int_equal(r.last.matched_id, 2);
    tp_stop_free(r.s);
}

static void stop_ignore_eos_accepts_eos_as_text(void **state)
{
    (void)state;
    int32_t eos[] = {2};
    tp_stop_config c = cfg_stops(NULL, 0);
    c.eos_ids = eos;
    c.n_eos_ids = 1;
    c.ignore_eos = true;
    run r;
    run_pieces(&r, &c, PIECES({"a"}, {"", 0, 2}, {"b"}));
    expect(&r, "ab", TP_FINISH_CANCELLED, NULL, 3);
    tp_stop_free(r.s);
}

/* ---- limits ---- */

/* §B13: a stop in the candidate that would reach max_tokens wins. */
static void stop_beats_length_on_the_same_token(void **state)
{
    (void)state;
    tp_stop_config c = cfg_stops(STOPS("STOP"));
    c.max_tokens = 3;
    run r;
    run_pieces(&r, &c, PIECES({"a"}, {"b"}, {"cSTOPd"}));
    expect(&r, "abc", TP_FINISH_STOP_STRING, "STOP", 2);
    tp_stop_free(r.s);
    run_pieces(&r, &c, PIECES({"a"}, {"b"}, {"cST"}, {"OP"}));
    expect(&r, "abcST", TP_FINISH_LENGTH, NULL, 3);   /* held "ST" released */
    assert_string_equal(r.chunk[2], "cST");
    tp_stop_free(r.s);
}

/* §B14: stop strings ending in the text of the first min_tokens tokens
 * don't count; one that ends later counts even if it started inside. */
static void stop_min_tokens_ignores_early_stop_strings(void **state)
{
    (void)state;
    tp_stop_config c = cfg_stops(STOPS("\n", "ab"));
    c.min_tokens = 2;
    run r;
    run_pieces(&r, &c, PIECES({"x\n"}, {"y\na"}, {"b"}));
    expect(&r, "x\ny\n", TP_FINISH_STOP_STRING, "ab", 2);
    tp_stop_free(r.s);
}

/* Decision (stop.h): EOS / stop id below min_tokens is an ordinary token. */
static void stop_min_tokens_accepts_eos_that_arrives_early(void **state)
{
    (void)state;
    int32_t eos[] = {2};
    tp_stop_config c = cfg_stops(NULL, 0);
    c.eos_ids = eos;
    c.n_eos_ids = 1;
    c.min_tokens = 2;
    run r;
    run_pieces(&r, &c, PIECES({"a", 0, 2}, {"b"}, {"c", 0, 2}));
    expect(&r, "ab", TP_FINISH_EOS, NULL, 2);
    assert_true(r.accepted[0]);
    assert_int_equal(tp_stop_get_stats(r.s)->min_tokens_overrides, 1);
    tp_stop_free(r.s);
}

static void stop_max_tokens_one_finishes_after_first_token(void **state)
{
    (void)state;
    tp_stop_config c = cfg_stops(STOPS("zz"));
    c.max_tokens = 1;
    run r;
    run_pieces(&r, &c, PIECES({"hiz"}, {"z"}));
    expect(&r, "hiz", TP_FINISH_LENGTH, NULL, 1);
    tp_stop_free(r.s);
}

/* ---- streaming hold-back ---- */

/* §B2: nothing of a partial stop is streamed before the match completes. */
static void stop_partial_prefix_is_never_streamed(void **state)
{
    (void)state;
    tp_stop_config c = cfg_stops(STOPS("\nUser:"));
    run r;
    run_pieces(&r, &c, PIECES({"Sure."}, {"\nUser"}, {":"}, {" hi"}));
    expect(&r, "Sure.", TP_FINISH_STOP_STRING, "\nUser:", 2);
    assert_string_equal(r.chunk[0], "Sure.");
    assert_string_equal(r.chunk[1], "");
    assert_string_equal(r.chunk[2], "");
    tp_stop_free(r.s);
}

/* §B3: only a stop prefix is held, so early chunks are not empty. */
static void stop_holds_back_only_a_stop_prefix(void **state)
{
    (void)state;
    tp_stop_config c = cfg_stops(STOPS("#####"));
    run r;
    run_pieces(&r, &c, PIECES({"Hello"}, {" wor"}, {"ld#"}, {"#x"}));
    assert_string_equal(r.chunk[0], "Hello");
    assert_string_equal(r.chunk[1], " wor");
    assert_string_equal(r.chunk[2], "ld");
    assert_string_equal(r.chunk[3], "##x");   /* released once it stopped being a prefix */
    expect(&r, "Hello world##x", TP_FINISH_CANCELLED, NULL, 4);
    tp_stop_free(r.s);
}

/* §B6: streamed text is never repeated; §B8: never retracted. */
static void stop_never_repeats_streamed_text(void **state)
{
    (void)state;
    tp_stop_config c = cfg_stops(STOPS("\n", "Alice:"));
    run r;
    run_pieces(&r, &c, PIECES({" Alice"}, {"!"}, {" Bob"}));
    assert_string_equal(r.chunk[0], " ");
    assert_string_equal(r.chunk[1], "Alice!");
    assert_string_equal(r.chunk[2], " Bob");
    expect(&r, " Alice! Bob", TP_FINISH_CANCELLED, NULL, 3);
    tp_stop_free(r.s);
}

/* §B5: held text is released at every finish other than a stop string. */
static void stop_releases_held_text_at_every_other_finish(void **state)
{
    (void)state;
    int32_t ids[] = {9}, eos[] = {2};
    tp_stop_config c = cfg_stops(STOPS("?!"));
    c.stop_ids = ids;
    c.n_stop_ids = 1;
    c.eos_ids = eos;
    c.n_eos_ids = 1;
    run r;
    run_pieces(&r, &c, PIECES({"Mars?"}, {"", 0, 9}));
    assert_string_equal(r.chunk[0], "Mars");
    assert_string_equal(r.chunk[1], "?");
    expect(&r, "Mars?", TP_FINISH_STOP_TOKEN, NULL, 1);
    tp_stop_free(r.s);
    run_pieces(&r, &c, PIECES({"Mars?"}, {"", 0, 2}));
    expect(&r, "Mars?", TP_FINISH_EOS, NULL, 1);
    tp_stop_free(r.s);
    run_pieces(&r, &c, PIECES({"Mars?"}));
    expect(&r, "Mars?", TP_FINISH_CANCELLED, NULL, 1);
    assert_string_equal(r.chunk[1], "?");
    tp_stop_free(r.s);
}

static void stop_include_stop_str_keeps_stop_and_holds_nothing(void **state)
{
    (void)state;
    tp_stop_config c = cfg_stops(STOPS("</a>"));
    c.include_stop_str_in_output = true;
    run r;
    run_pieces(&r, &c, PIECES({"x</"}, {"a>tail"}));
    assert_string_equal(r.chunk[0], "x</");
    expect(&r, "x</a>", TP_FINISH_STOP_STRING, "</a>", 1);
    tp_stop_free(r.s);
}

/* ---- UTF-8 ---- */

/* §B18: byte-fallback pieces of one character are published together. */
static void stop_holds_unfinished_utf8(void **state)
{
    (void)state;
    tp_stop_config c = cfg_stops(NULL, 0);
    run r;
    run_pieces(&r, &c, PIECES({"\xE4", 1, 0}, {"\xB8", 1, 0}, {"\xAD", 1, 0}, {"\xF0\x9F", 2, 0},
                              {"\x98\x80", 2, 0}));
    assert_string_equal(r.chunk[0], "");
    assert_string_equal(r.chunk[1], "");
    assert_string_equal(r.chunk[2], "中");
    assert_string_equal(r.chunk[3], "");
    assert_string_equal(r.chunk[4], "😀");
    expect(&r, "中😀", TP_FINISH_CANCELLED, NULL, 5);
    tp_stop_free(r.s);
}

static void stop_invalid_utf8_becomes_replacement_by_maximal_subpart(void **state)
{
    (void)state;
    tp_stop_config c = cfg_stops(NULL, 0);
    run r;
    /* E4 B8 then 'a': one U+FFFD for the truncated sequence; ED A0 80 (a
     * surrogate): three; FF: one; F0 9F at the end (cancel): one. */
    run_pieces(&r, &c, PIECES({"\xE4\xB8", 2, 0}, {"a\xED\xA0\x80\xFF", 5, 0}, {"\xF0\x9F", 2, 0}));
    expect(&r, "\xEF\xBF\xBD" "a" "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" "\xEF\xBF\xBD" "\xEF\xBF\xBD",
           TP_FINISH_CANCELLED, NULL, 3);
    tp_stop_free(r.s);
}

/* Seed list: CJK, emoji, Hebrew, Arabic, combining marks (bytes, no
 * normalization: a precomposed stop does not match a decomposed text). */
static void stop_unicode_scripts_cut_exactly(void **state)
{
    (void)state;
    run r;
    tp_stop_config c = cfg_stops(STOPS("世界"));
    run_pieces(&r, &c, PIECES({"你好"}, {"\xE4\xB8", 2, 0}, {"\x96\xE7\x95\x8C!", 5, 0}));
    expect(&r, "你好", TP_FINISH_STOP_STRING, "世界", 2);
    tp_stop_free(r.s);
    c = cfg_stops(STOPS("🛑"));
    run_pieces(&r, &c, PIECES({"go 🚀 "}, {"\xF0\x9F\x9B", 3, 0}, {"\x91", 1, 0}));
    expect(&r, "go 🚀 ", TP_FINISH_STOP_STRING, "🛑", 2);
    tp_stop_free(r.s);
    c = cfg_stops(STOPS("לום"));
    run_pieces(&r, &c, PIECES({"שָׁ"}, {"ש"}, {"לו"}, {"ם"}));
    expect(&r, "שָׁש", TP_FINISH_STOP_STRING, "לום", 3);
    tp_stop_free(r.s);
    c = cfg_stops(STOPS("مرحبا"));
    run_pieces(&r, &c, PIECES({"قال: "}, {"مر"}, {"حبا بك"}));
    expect(&r, "قال: ", TP_FINISH_STOP_STRING, "مرحبا", 2);
    tp_stop_free(r.s);
    c = cfg_stops(STOPS("\xC3\xA9"));
    run_pieces(&r, &c, PIECES({"cafe\xCC\x81"}));
    expect(&r, "cafe\xCC\x81", TP_FINISH_CANCELLED, NULL, 1);
    tp_stop_free(r.s);
}

/* ---- config ---- */

static void stop_empty_config_streams_everything(void **state)
{
    (void)state;
    tp_stop_config c = cfg_stops(NULL, 0);
    run r;
    run_pieces(&r, &c, PIECES({"one"}, {" two"}));
    assert_string_equal(r.chunk[0], "one");
    assert_string_equal(r.chunk[1], " two");
    expect(&r, "one two", TP_FINISH_CANCELLED, NULL, 2);
    assert_int_equal(tp_stop_held_bytes(r.s), 0);
    tp_stop_free(r.s);
}

static void expect_invalid(const tp_stop_config *c, const char *needle)
{
    tp_stop *s = (tp_stop *)1;
    tp_err err;
    tp_err_clear(&err);
    assert_int_not_equal(tp_stop_new(c, &s, &err), 0);
    assert_null(s);
    if (!strstr(err.msg, needle)) fail_msg("error '%s' does not mention '%s'", err.msg, needle);
}

/* 2000 copies of one stop string are one string to max_stop_strings, and
 * match as that one string. */
static void stop_limit_counts_distinct_strings(void **state)
{
    (void)state;
    const char *copies[2000];
    char distinct[40][4];
    for (int i = 0; i < 2000; i++)
        copies[i] = i % 2 ? "wor" : "o w";
    tp_stop_config c = cfg_stops(copies, 2000);
    c.max_stop_strings = 2;
    run r;
    run_pieces(&r, &c, PIECES({"Hel"}, {"lo wor"}, {"ld"}));
    expect(&r, "Hell", TP_FINISH_STOP_STRING, "o w", 1);
    tp_stop_free(r.s);
    const char *three[40];
    for (int i = 0; i < 40; i++) {
        snprintf(distinct[i], sizeof distinct[i], "%c%c", 'a' + i % 26, 'a' + i / 26);
        three[i] = distinct[i];
    }
    c = cfg_stops(three, 40);
    c.max_stop_strings = 39;
    expect_invalid(&c, "stop: 40 distinct strings, more than the limit of 39");
    assert_int_equal(tp_stop_count_distinct(copies, NULL, 2000), 2);
    size_t lens[3] = {1, 2, 1};
    const char *pre[3] = {"ab", "ab", "a"};   /* "a", "ab", "a": lengths decide */
    assert_int_equal(tp_stop_count_distinct(pre, lens, 3), 2);
}

static void stop_config_errors_name_the_field(void **state)
{
    (void)state;
    tp_stop_config c = cfg_stops(STOPS("ok", ""));
    expect_invalid(&c, "stop[1]: empty");
    c = cfg_stops(STOPS("ok", "\xC3("));
    expect_invalid(&c, "stop[1]: invalid UTF-8 at byte 0");
    c = cfg_stops(STOPS("a", "b", "c"));
    c.max_stop_strings = 2;
    expect_invalid(&c, "max_stop_strings");
    c = cfg_stops(STOPS("abcd"));
    c.max_stop_len = 3;
    expect_invalid(&c, "stop[0]: 4 bytes");
    c = cfg_stops(NULL, 0);
    c.max_tokens = 0;
    expect_invalid(&c, "max_tokens");
    c.max_tokens = 3;
    c.min_tokens = 4;
    expect_invalid(&c, "min_tokens");
    c.min_tokens = -1;
    expect_invalid(&c, "min_tokens");
    c.min_tokens = 0;
    int32_t ids[] = {5, 32000};
    c.stop_ids = ids;
    c.n_stop_ids = 2;
    c.vocab_size = 32000;
    expect_invalid(&c, "stop_token_ids[1]: id 32000 outside the vocabulary");
    c.n_stop_ids = 0;
    int32_t eos[] = {-1};
    c.eos_ids = eos;
    c.n_eos_ids = 1;
    expect_invalid(&c, "eos_token_ids[0]");
}

static void stop_default_limits_are_1024_strings_of_1024_bytes(void **state)
{
    (void)state;
    static char big[1026];
    memset(big, 'a', 1025);
    tp_stop_config c = cfg_stops(STOPS(big));
    expect_invalid(&c, "1025 bytes");
    big[1024] = '\0';
    tp_stop *s;
    assert_int_equal(tp_stop_new(&c, &s, NULL), 0);
    tp_stop_free(s);
    const char **many = calloc(1025, sizeof *many);
    static char names[1025][8];
    for (size_t i = 0; i < 1025; i++) many[i] = "x";
    c = cfg_stops(many, 1025);
    assert_int_equal(tp_stop_new(&c, &s, NULL), 0);   /* 1025 copies are one string */
    assert_int_equal(tp_stop_n_strings(s), 1);   /* duplicates merged */
    tp_stop_free(s);
    for (size_t i = 0; i < 1025; i++) {
        snprintf(names[i], sizeof names[i], "s%zu", i);
        many[i] = names[i];
    }
    expect_invalid(&c, "1025 distinct strings");
    c.n_stop = 1024;
    assert_int_equal(tp_stop_new(&c, &s, NULL), 0);
    tp_stop_free(s);
    free(many);
}

static void stop_duplicate_strings_are_merged(void **state)
{
    (void)state;
    tp_stop_config c = cfg_stops(STOPS("b", "a", "b", "a"));
    tp_stop *s;
    assert_int_equal(tp_stop_new(&c, &s, NULL), 0);
    assert_int_equal(tp_stop_n_strings(s), 2);
    size_t len;
    assert_memory_equal(tp_stop_string(s, 0, &len), "b", 1);
    assert_memory_equal(tp_stop_string(s, 1, &len), "a", 1);
    tp_stop_free(s);
    tp_stop_free(NULL);
}

/* ---- counters ---- */

static void stop_stats_count_reasons_triggers_and_held_bytes(void **state)
{
    (void)state;
    tp_stop_config c = cfg_stops(STOPS("END"));
    run r;
    tp_stop_stats total = {0};
    run_pieces(&r, &c, PIECES({"abE"}, {"N"}, {"x"}));   /* "EN" held, then released */
    const tp_stop_stats *st = tp_stop_get_stats(r.s);
    assert_int_equal(st->bytes_held, 2);
    assert_int_equal(st->bytes_released, 2);
    assert_int_equal(st->finish[TP_FINISH_CANCELLED], 1);
    tp_stop_stats_merge(&total, st);
    tp_stop_free(r.s);
    for (int i = 0; i < 2; i++) {
        run_pieces(&r, &c, PIECES({"aE"}, {"ND"}));
        st = tp_stop_get_stats(r.s);
        assert_int_equal(st->bytes_dropped, 3);
        tp_stop_stats_merge(&total, st);
        tp_stop_free(r.s);
    }
    assert_int_equal(total.jobs, 3);
    assert_int_equal(total.finish[TP_FINISH_STOP_STRING], 2);
    assert_int_equal(total.n_triggers, 1);
    assert_int_equal(total.trigger[0].id, -1);
    assert_int_equal(total.trigger[0].count, 2);
    assert_memory_equal(total.trigger[0].key, "END", 3);
    assert_int_equal(total.tokens_accepted, 3 + 1 + 1);
    assert_string_equal(tp_finish_reason_name(TP_FINISH_STOP_TOKEN), "stop_token");
    tp_finish_reason fr;
    assert_int_equal(tp_finish_reason_parse("cancelled", &fr), 0);
    assert_int_equal(fr, TP_FINISH_CANCELLED);
}

static void stop_cancel_and_fail_finish_with_their_reason(void **state)
{
    (void)state;
    tp_stop_config c = cfg_stops(STOPS("xyz"));
    tp_stop *s;
    tp_stop_step st;
    assert_int_equal(tp_stop_new(&c, &s, NULL), 0);
    assert_int_equal(tp_stop_feed(s, 1, (const uint8_t *)"abxy", 4, &st), 0);
    assert_int_equal(st.chunk_len, 2);
    assert_int_equal(tp_stop_held_bytes(s), 2);
    assert_int_equal(tp_stop_fail(s, &st), 0);
    assert_int_equal(st.finish, TP_FINISH_ERROR);
    assert_int_equal(st.chunk_len, 2);
    assert_memory_equal(st.chunk, "xy", 2);
    tp_stop_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stop_exact_match_cuts_before_the_stop),
        cmocka_unit_test(stop_limit_counts_distinct_strings),
        cmocka_unit_test(stop_is_not_one_token_late),
        cmocka_unit_test(stop_cut_inside_token),
        cmocka_unit_test(stop_cut_at_exact_byte_not_whole_token),
        cmocka_unit_test(stop_earliest_end_wins_over_list_order),
        cmocka_unit_test(stop_tie_at_same_end_takes_longest),
        cmocka_unit_test(stop_overlapping_prefix_stops_shorter_completes_first),
        cmocka_unit_test(stop_spanning_more_tokens_than_any_window),
        cmocka_unit_test(stop_id_beats_stop_string_and_eos),
        cmocka_unit_test(stop_ignore_eos_accepts_eos_as_text),
        cmocka_unit_test(stop_beats_length_on_the_same_token),
        cmocka_unit_test(stop_min_tokens_ignores_early_stop_strings),
        cmocka_unit_test(stop_min_tokens_accepts_eos_that_arrives_early),
        cmocka_unit_test(stop_max_tokens_one_finishes_after_first_token),
        cmocka_unit_test(stop_partial_prefix_is_never_streamed),
        cmocka_unit_test(stop_holds_back_only_a_stop_prefix),
        cmocka_unit_test(stop_never_repeats_streamed_text),
        cmocka_unit_test(stop_releases_held_text_at_every_other_finish),
        cmocka_unit_test(stop_include_stop_str_keeps_stop_and_holds_nothing),
        cmocka_unit_test(stop_holds_unfinished_utf8),
        cmocka_unit_test(stop_invalid_utf8_becomes_replacement_by_maximal_subpart),
        cmocka_unit_test(stop_unicode_scripts_cut_exactly),
        cmocka_unit_test(stop_empty_config_streams_everything),
        cmocka_unit_test(stop_config_errors_name_the_field),
        cmocka_unit_test(stop_default_limits_are_1024_strings_of_1024_bytes),
        cmocka_unit_test(stop_duplicate_strings_are_merged),
        cmocka_unit_test(stop_stats_count_reasons_triggers_and_held_bytes),
        cmocka_unit_test(stop_cancel_and_fail_finish_with_their_reason),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
