/* Tool calls: each family's parser on the strings its documentation shows
 * (parallel calls, markers inside JSON strings, text before a call), the
 * splitter fed whole and byte by byte (the same message; call text never
 * in a content delta), thinking apart, and detection from the templates. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/chat_template.h"
#include "tokpipe/glazy.h"
#include "tokpipe/grammar.h"
#include "tokpipe/toolcall.h"

typedef struct result {
    char content[4096];
    char reasoning[4096];
    size_t n_calls;
    char names[8][64];
    char args[8][512];
    char ids[8][64];
    size_t n_early;          /* calls whose first delta came before finish */
    size_t args_early;       /* argument bytes released before finish */
    bool whole;              /* tp_tcsplit_calls_whole */
} result;

static void cat(char *dst, const char *s, size_t n)
{
    size_t l = strlen(dst);
    assert_true(l + n < 4096);
    memcpy(dst + l, s, n);
    dst[l + n] = 0;
}

/* The calls as the deltas build them: a first delta (id, name) per call,
 * in order, then argument fragments. */
typedef struct streamed {
    size_t n;
    char names[8][64], ids[8][64];
    char args[8][512];
} streamed;

static void take_deltas(const tp_tcsplit *s, streamed *t)
{
    const tp_tc_delta *d;
    size_t n = tp_tcsplit_deltas(s, &d);
    for (size_t i = 0; i < n; i++) {
        assert_true(d[i].index < 8);
        assert_non_null(d[i].id);
        assert_non_null(d[i].name);
        if (d[i].first) {
            assert_int_equal(d[i].index, t->n);   /* a call opens once, in order */
            snprintf(t->ids[t->n], 64, "%s", d[i].id);
            snprintf(t->names[t->n], 64, "%s", d[i].name);
            t->n++;
        } else {
            assert_true(d[i].index < t->n);
            assert_string_equal(d[i].id, t->ids[d[i].index]);
        }
        size_t l = strlen(t->args[d[i].index]);
        assert_true(l + d[i].arguments_len < 512);
        memcpy(t->args[d[i].index] + l, d[i].arguments, d[i].arguments_len);
        t->args[d[i].index][l + d[i].arguments_len] = 0;
    }
}

/* Feed text in chunks of `chunk` bytes (0: whole). */
static void split(tp_tc_family f, bool thinks, bool think_open, const char *text, size_t chunk, result *r)
{
    memset(r, 0, sizeof *r);
    tp_tc_syntax syn = {.family = f, .thinks = thinks, .think_open = think_open};
    tp_tcsplit_opts o = {.tools = true, .reasoning = true, .parallel = true, .id_seed = 42};
    tp_tcsplit *s;
    tp_err e;
    assert_int_equal(tp_tcsplit_new(&syn, &o, &s, &e), 0);
    size_t n = strlen(text), step = chunk ? chunk : (n ? n : 1);
    const char *c, *rs;
    size_t cn, rn;
    streamed t;
    memset(&t, 0, sizeof t);
    for (size_t i = 0; i < n; i += step) {
        size_t k = n - i < step ? n - i : step;
        assert_int_equal(tp_tcsplit_feed(s, text + i, k, &c, &cn, &rs, &rn), 0);
        cat(r->content, c, cn);
        cat(r->reasoning, rs, rn);
        take_deltas(s, &t);
    }
    r->n_early = t.n;
    r->args_early = 0;
    for (size_t i = 0; i < t.n; i++)
        r->args_early += strlen(t.args[i]);
    assert_int_equal(tp_tcsplit_finish(s, NULL, 0, &c, &cn, &rs, &rn), 0);
    cat(r->content, c, cn);
    cat(r->reasoning, rs, rn);
    take_deltas(s, &t);
    const tp_tc_call *calls;
    r->n_calls = tp_tcsplit_calls(s, &calls);
    r->whole = tp_tcsplit_calls_whole(s);
    /* the deltas joined are the message's calls */
    assert_int_equal(t.n, r->n_calls);
    for (size_t i = 0; i < r->n_calls && i < 8; i++) {
        snprintf(r->names[i], sizeof r->names[i], "%s", calls[i].name);
        snprintf(r->args[i], sizeof r->args[i], "%s", calls[i].arguments);
        snprintf(r->ids[i], sizeof r->ids[i], "%s", calls[i].id);
        assert_string_equal(t.names[i], r->names[i]);
        assert_string_equal(t.ids[i], r->ids[i]);
        assert_string_equal(t.args[i], r->args[i]);
    }

    size_t rl;
    const char *all = tp_tcsplit_reasoning(s, &rl);
    assert_int_equal(rl, strlen(r->reasoning));
    assert_memory_equal(all, r->reasoning, rl);
    tp_tcsplit_free(s);
}

/* Whole and byte by byte give the same message. */
static void check(tp_tc_family f, bool thinks, bool think_open, const char *text, result *r)
{
    result b;
    split(f, thinks, think_open, text, 0, r);
    split(f, thinks, think_open, text, 1, &b);
    assert_string_equal(r->content, b.content);
    assert_string_equal(r->reasoning, b.reasoning);
    assert_int_equal(r->n_calls, b.n_calls);
    assert_int_equal(r->whole, b.whole);
    for (size_t i = 0; i < r->n_calls; i++) {
        assert_string_equal(r->names[i], b.names[i]);
        assert_string_equal(r->args[i], b.args[i]);
    }
    r->n_early = b.n_early;
    r->args_early = b.args_early;
}

static void hermes_parses_parallel_calls_as_qwen_documents_them(void **state)
{
    (void)state;
    result r;
    check(TP_TC_HERMES, false, false,
          "<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"San Francisco, CA, "
          "USA\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_temperature_date\", \"arguments\": {\"location\": "
          "\"San Francisco, CA, USA\", \"date\": \"2024-10-01\"}}\n</tool_call>",
          &r);
    assert_int_equal(r.n_calls, 2);
    assert_string_equal(r.names[0], "get_current_temperature");
    assert_string_equal(r.args[0], "{\"location\": \"San Francisco, CA, USA\"}");
    assert_string_equal(r.names[1], "get_temperature_date");
    assert_string_equal(r.args[1], "{\"location\": \"San Francisco, CA, USA\", \"date\": \"2024-10-01\"}");
    assert_string_equal(r.content, "");
    assert_true(r.whole);
    assert_string_not_equal(r.ids[0], r.ids[1]);
    assert_true(!strncmp(r.ids[0], "call_", 5) && strlen(r.ids[0]) == 29);
}

static void hermes_keeps_text_before_and_markers_inside_strings(void **state)
{
    (void)state;
    result r;
    check(TP_TC_HERMES, false, false,
          "Let me run that.\n<tool_call>\n{\"arguments\": {\"code\": \"print('<tool_call></tool_call>')\"}, \"name\": "
          "\"python\"}\n</tool_call>",
          &r);
    assert_string_equal(r.content, "Let me run that.\n");
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.names[0], "python");
    assert_string_equal(r.args[0], "{\"code\": \"print('<tool_call></tool_call>')\"}");
}

static void hermes_malformed_call_stays_content(void **state)
{
    (void)state;
    result r;
    const char *t = "Here: <tool_call>{\"name\": 5, \"arguments\": {\"a\": 1}}</tool_call> and more";
    check(TP_TC_HERMES, false, false, t, &r);
    assert_int_equal(r.n_calls, 0);
    assert_string_equal(r.content, t);
}

/* A call whose name went out stays a call (as OpenAI streams it): when the
 * text then breaks the syntax, its arguments are what came up to there,
 * streamed or not. */
static void a_call_broken_after_its_name_keeps_what_was_generated(void **state)
{
    (void)state;
    result r;
    check(TP_TC_HERMES, false, false,
          "Here: <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": </tool_call> and more", &r);
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.names[0], "f");
    assert_string_equal(r.args[0], "{\"a\": ");
    assert_string_equal(r.content, "Here: ");
    assert_false(r.whole);
    /* cut short (max_tokens): the arguments so far */
    check(TP_TC_MISTRAL, false, false, "[TOOL_CALLS][{\"name\": \"g\", \"arguments\": {\"q\": \"Par", &r);
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.args[0], "{\"q\": \"Par");
    assert_false(r.whole);
    /* the calls before the cut stay whole; the splitter says one is not */
    check(TP_TC_HERMES, false, false,
          "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call><tool_call>{\"name\": \"f\", "
          "\"arguments\": {\"a\": 2}}</tool_call><tool_call>{\"name\": \"f\", \"arguments\": {\"a\":",
          &r);
    assert_int_equal(r.n_calls, 3);
    assert_string_equal(r.args[0], "{\"a\": 1}");
    assert_string_equal(r.args[1], "{\"a\": 2}");
    assert_string_equal(r.args[2], "{\"a\":");
    assert_false(r.whole);
}

/* Byte by byte, each call's first delta comes as soon as its name is whole
 * and every byte of its arguments before finish, for every family's
 * documented shape. */
static void calls_stream_as_they_are_generated(void **state)
{
    (void)state;
    static const struct {
        tp_tc_family f;
        bool thinks;
        const char *text;
        size_t n;
    } cases[] = {
        {TP_TC_HERMES, false, "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": [1, {\"y\": \"}\"}]}}\n</tool_call>\n"
                             "<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>", 2},
        {TP_TC_LLAMA3, false, "{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {\"y\": -2.5e3}}", 2},
        {TP_TC_MISTRAL, false, "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": true}}, {\"name\": \"b\", \"arguments\": {\"n\": null}}]", 2},
        {TP_TC_FUNCTIONARY_V31, false, "<function=a>{\"x\": \"\\u00e9\"}</function><function=b>{}</function>", 2},
        {TP_TC_FUNCTIONARY_V32, false, "a\n{\"x\": 1}>>>b\n{\"y\": 2}", 2},
        {TP_TC_COMMAND_R7B, true, "<|START_ACTION|>[{\"tool_call_id\": \"0\", \"tool_name\": \"a\", \"parameters\": {\"x\": 1}}]<|END_ACTION|>", 1},
        {TP_TC_COMMAND_R_PLUS, false, "Action: ```json\n[{\"tool_name\": \"a\", \"parameters\": {\"x\": 1}}]\n```", 1},
        {TP_TC_DEEPSEEK_R1, true, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>a\n```json\n{\"x\": 1}\n```<｜tool▁call▁end｜>"
                                 "\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>b\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>", 2},
        {TP_TC_FIREFUNCTION_V2, false, " functools[{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": {}}]", 2},
        {TP_TC_GENERIC, false, "{\"tool_calls\": [{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": {}}]}", 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        result r;
        check(cases[i].f, cases[i].thinks, false, cases[i].text, &r);
        assert_int_equal(r.n_calls, cases[i].n);
        assert_string_equal(r.names[0], "a");
        assert_int_equal(r.n_early, cases[i].n);
        size_t all = 0;
        for (size_t k = 0; k < r.n_calls; k++)
            all += strlen(r.args[k]);
        assert_int_equal(r.args_early, all);
    }
    /* the directly_answer tool of Command R+ is no call: nothing streams */
    result r;
    check(TP_TC_COMMAND_R_PLUS, false, false, "Action: ```json\n[{\"tool_name\": \"directly_answer\", \"parameters\": {}}]\n```", &r);
    assert_int_equal(r.n_calls, 0);
}

static void content_holds_back_a_marker_prefix_only_until_it_is_not_one(void **state)
{
    (void)state;
    tp_tc_syntax syn = {.family = TP_TC_HERMES};
    tp_tcsplit_opts o = {.tools = true, .parallel = true};
    tp_tcsplit *s;
    tp_err e;
    const char *c, *rs;
    size_t cn, rn;
    assert_int_equal(tp_tcsplit_new(&syn, &o, &s, &e), 0);
    assert_int_equal(tp_tcsplit_feed(s, "a <tool", 7, &c, &cn, &rs, &rn), 0);
    assert_int_equal(cn, 2);   /* "<tool" may open a call */
    assert_memory_equal(c, "a ", 2);
    assert_int_equal(tp_tcsplit_feed(s, "s>", 2, &c, &cn, &rs, &rn), 0);
    assert_int_equal(cn, 7);
    assert_memory_equal(c, "<tools>", 7);
    tp_tcsplit_free(s);
}

static void llama3_json_and_builtin_python_tag(void **state)
{
    (void)state;
    result r;
    check(TP_TC_LLAMA3, false, false,
          "{\"name\": \"get_current_conditions\", \"parameters\": {\"location\": \"San Francisco, CA\", \"unit\": "
          "\"Fahrenheit\"}}",
          &r);
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.names[0], "get_current_conditions");
    assert_string_equal(r.args[0], "{\"location\": \"San Francisco, CA\", \"unit\": \"Fahrenheit\"}");
    check(TP_TC_LLAMA3, false, false, "<|python_tag|>brave_search.call(query=\"current weather in Menlo Park, California\")",
          &r);
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.names[0], "brave_search");
    assert_string_equal(r.args[0], "{\"query\": \"current weather in Menlo Park, California\"}");
    check(TP_TC_LLAMA3, false, false, "<|python_tag|>import math\nprint(math.pi)", &r);
    assert_string_equal(r.names[0], "python");
    assert_string_equal(r.args[0], "{\"code\": \"import math\\nprint(math.pi)\"}");
    check(TP_TC_LLAMA3, false, false,
          "{\"type\": \"function\", \"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": 1}}",
          &r);
    assert_int_equal(r.n_calls, 2);
    assert_string_equal(r.names[1], "b");
    /* plain JSON that is no call is the answer */
    check(TP_TC_LLAMA3, false, false, "{\"answer\": 42}", &r);
    assert_int_equal(r.n_calls, 0);
    assert_string_equal(r.content, "{\"answer\": 42}");
}

static void mistral_calls_get_nine_character_ids(void **state)
{
    (void)state;
    result r;
    check(TP_TC_MISTRAL, false, false,
          "[TOOL_CALLS][{\"name\": \"get_current_weather\", \"arguments\": {\"location\": \"Paris, France\", "
          "\"format\": \"celsius\"}}, {\"name\": \"get_current_weather\", \"arguments\": {\"location\": \"[TOOL_CALLS]\"}}]",
          &r);
    assert_int_equal(r.n_calls, 2);
    assert_string_equal(r.args[0], "{\"location\": \"Paris, France\", \"format\": \"celsius\"}");
    assert_string_equal(r.args[1], "{\"location\": \"[TOOL_CALLS]\"}");
    assert_int_equal(strlen(r.ids[0]), 9);
    assert_string_not_equal(r.ids[0], r.ids[1]);
}

static void functionary_v31_and_v32(void **state)
{
    (void)state;
    result r;
    check(TP_TC_FUNCTIONARY_V31, false, false,
          "Checking.<function=get_weather>{\"location\": \"Istanbul\"}</function><function=get_time>{\"tz\": "
          "\"</function>\"}</function>",
          &r);
    assert_string_equal(r.content, "Checking.");
    assert_int_equal(r.n_calls, 2);
    assert_string_equal(r.names[1], "get_time");
    assert_string_equal(r.args[1], "{\"tz\": \"</function>\"}");
    check(TP_TC_FUNCTIONARY_V32, false, false, "get_weather\n{\"location\": \"Istanbul\"}>>>get_time\n{}", &r);
    assert_int_equal(r.n_calls, 2);
    assert_string_equal(r.names[0], "get_weather");
    assert_string_equal(r.content, "");
    check(TP_TC_FUNCTIONARY_V32, false, false, "all\nLet me look.>>>get_weather\n{\"location\": \"Istanbul\"}", &r);
    assert_string_equal(r.content, "Let me look.");
    assert_int_equal(r.n_calls, 1);
    check(TP_TC_FUNCTIONARY_V32, false, false, "all\nJust text.", &r);
    assert_string_equal(r.content, "Just text.");
    assert_int_equal(r.n_calls, 0);
}

static void command_r7b_thinking_action_and_response(void **state)
{
    (void)state;
    result r;
    check(TP_TC_COMMAND_R7B, true, false,
          "<|START_THINKING|>I will look up the weather.<|END_THINKING|><|START_ACTION|>[\n    {\"tool_call_id\": "
          "\"0\", \"tool_name\": \"get_weather\", \"parameters\": {\"location\": \"Paris\"}}\n]<|END_ACTION|>",
          &r);
    assert_string_equal(r.reasoning, "I will look up the weather.");
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.names[0], "get_weather");
    assert_string_equal(r.args[0], "{\"location\": \"Paris\"}");
    check(TP_TC_COMMAND_R7B, true, false, "<|START_RESPONSE|>It is sunny.<|END_RESPONSE|>", &r);
    assert_string_equal(r.content, "It is sunny.");
}

static void deepseek_r1_thinks_then_calls(void **state)
{
    (void)state;
    result r;
    check(TP_TC_DEEPSEEK_R1, true, false,
          "<think>\nI need the weather.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
          "get_weather\n```json\n{\"location\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>"
          "get_time\n```json\n{\"tz\": \"```<｜tool▁call▁end｜>\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
          &r);
    assert_string_equal(r.reasoning, "\nI need the weather.\n");
    assert_string_equal(r.content, "");
    assert_int_equal(r.n_calls, 2);
    assert_string_equal(r.args[1], "{\"tz\": \"```<｜tool▁call▁end｜>\"}");
    /* the generation prompt opened the thinking: no <think> in the output */
    check(TP_TC_DEEPSEEK_R1, true, true, "Hmm.</think>The answer is 4.", &r);
    assert_string_equal(r.reasoning, "Hmm.");
    assert_string_equal(r.content, "The answer is 4.");
}

static void firefunction_and_generic(void **state)
{
    (void)state;
    result r;
    check(TP_TC_FIREFUNCTION_V2, false, false,
          " functools[{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}, {\"name\": \"get_time\", "
          "\"arguments\": {}}]",
          &r);
    assert_int_equal(r.n_calls, 2);
    assert_string_equal(r.content, " ");
    check(TP_TC_GENERIC, false, false,
          "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}]}", &r);
    assert_int_equal(r.n_calls, 1);
    check(TP_TC_GENERIC, false, false, "{\"response\": \"Hello \\\"you\\\"\"}", &r);
    assert_int_equal(r.n_calls, 0);
    assert_string_equal(r.content, "Hello \"you\"");
}

static void big_integers_in_arguments_are_kept_as_written(void **state)
{
    (void)state;
    result r;
    check(TP_TC_HERMES, false, false,
          "<tool_call>{\"name\": \"f\", \"arguments\": {\"n\": 9007199254740993, \"m\": -9223372036854775807}}</tool_call>",
          &r);
    assert_string_equal(r.args[0], "{\"n\": 9007199254740993, \"m\": -9223372036854775807}");
}

static void without_tools_the_call_text_is_content(void **state)
{
    (void)state;
    tp_tc_syntax syn = {.family = TP_TC_HERMES, .thinks = true};
    tp_tcsplit_opts o = {.tools = false, .reasoning = false};
    tp_tcsplit *s;
    tp_err e;
    const char *c, *rs;
    size_t cn, rn;
    const char *t = "<think>x</think><tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
    assert_int_equal(tp_tcsplit_new(&syn, &o, &s, &e), 0);
    assert_int_equal(tp_tcsplit_feed(s, t, strlen(t), &c, &cn, &rs, &rn), 0);
    assert_int_equal(cn, strlen(t));
    assert_int_equal(tp_tcsplit_finish(s, NULL, 0, &c, &cn, &rs, &rn), 0);
    const tp_tc_call *calls;
    assert_int_equal(tp_tcsplit_calls(s, &calls), 0);
    tp_tcsplit_free(s);
}

/* gpt-oss's harmony (OpenAI's harmony docs): the analysis channel is the
 * reasoning, the final channel the content, a commentary message with a
 * recipient a call (as the model writes it, the recipient after the
 * channel, and as the template renders past calls, before it); a
 * commentary message without one is a preamble: content. */
static void harmony_channels_split_into_reasoning_content_and_calls(void **state)
{
    (void)state;
    result r;
    check(TP_TC_HARMONY, true, false,
          "<|channel|>analysis<|message|>User says hi. Respond.<|end|><|start|>assistant<|channel|>final<|message|>"
          "Hello! How can I help?",
          &r);
    assert_string_equal(r.reasoning, "User says hi. Respond.");
    assert_string_equal(r.content, "Hello! How can I help?");
    assert_int_equal(r.n_calls, 0);
    check(TP_TC_HARMONY, true, false,
          "<|channel|>analysis<|message|>Need to use function get_weather.<|end|><|start|>assistant<|channel|>"
          "commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"San Francisco\"}",
          &r);
    assert_string_equal(r.reasoning, "Need to use function get_weather.");
    assert_string_equal(r.content, "");
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.names[0], "get_weather");
    assert_string_equal(r.args[0], "{\"location\":\"San Francisco\"}");
    assert_true(r.whole);
    assert_int_equal(r.n_early, 1); /* the model's form streams */
    /* the template's form: the recipient in the role header */
    check(TP_TC_HARMONY, true, false,
          " to=functions.get_weather<|channel|>commentary json<|message|>{\"location\": \"Paris\"}", &r);
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.names[0], "get_weather");
    assert_string_equal(r.args[0], "{\"location\": \"Paris\"}");
    assert_string_equal(r.content, "");
    /* a preamble on the commentary channel, then the call */
    check(TP_TC_HARMONY, true, false,
          "<|channel|>analysis<|message|>Tell the user first.<|end|><|start|>assistant<|channel|>commentary<|message|>"
          "Checking the weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
          "<|constrain|>json<|message|>{}",
          &r);
    assert_string_equal(r.reasoning, "Tell the user first.");
    assert_string_equal(r.content, "Checking the weather.");
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.args[0], "{}");
    /* the recipient in a later role header: whole and byte by byte alike
     * (in pieces "<|start|>assistant" must not be dropped as frame before
     * " to=" shows it opens a call) */
    check(TP_TC_HARMONY, true, false,
          "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant to=functions.get_weather"
          "<|channel|>commentary json<|message|>{\"location\": \"Oslo\"}",
          &r);
    assert_string_equal(r.content, "Checking.");
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.names[0], "get_weather");
    assert_string_equal(r.args[0], "{\"location\": \"Oslo\"}");
    /* a header that opens no call is text, whole or in pieces */
    check(TP_TC_HARMONY, true, false, "Hi<|start|>assistant to=functib\"}", &r);
    assert_int_equal(r.n_calls, 0);
    /* no analysis (low effort can skip it): the final channel alone */
    check(TP_TC_HARMONY, true, false, "<|channel|>final<|message|>4", &r);
    assert_string_equal(r.content, "4");
    assert_string_equal(r.reasoning, "");
}

/* Without tools the harmony frame still goes: reasoning and content as
 * with them, a call's text is content. */
static void harmony_frame_is_dropped_without_tools(void **state)
{
    (void)state;
    tp_tc_syntax syn = {.family = TP_TC_HARMONY, .thinks = true};
    tp_tcsplit_opts o = {.tools = false, .reasoning = true};
    tp_tcsplit *s;
    tp_err e;
    const char *c, *rs;
    size_t cn, rn;
    const char *t = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Done.";
    char content[256] = "", reasoning[256] = "";
    assert_int_equal(tp_tcsplit_new(&syn, &o, &s, &e), 0);
    for (size_t i = 0; t[i]; i++) {
        assert_int_equal(tp_tcsplit_feed(s, t + i, 1, &c, &cn, &rs, &rn), 0);
        strncat(content, c, cn);
        strncat(reasoning, rs, rn);
    }
    assert_int_equal(tp_tcsplit_finish(s, NULL, 0, &c, &cn, &rs, &rn), 0);
    strncat(content, c, cn);
    strncat(reasoning, rs, rn);
    assert_string_equal(content, "Done.");
    assert_string_equal(reasoning, "Think.");
    tp_tcsplit_free(s);
}

static void one_call_when_parallel_calls_are_off(void **state)
{
    (void)state;
    tp_tc_syntax syn = {.family = TP_TC_HERMES};
    tp_tcsplit_opts o = {.tools = true, .parallel = false};
    tp_tcsplit *s;
    tp_err e;
    const char *c, *rs;
    size_t cn, rn;
    const char *t = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\", "
                    "\"arguments\": {}}</tool_call>";
    assert_int_equal(tp_tcsplit_new(&syn, &o, &s, &e), 0);
    assert_int_equal(tp_tcsplit_feed(s, t, strlen(t), &c, &cn, &rs, &rn), 0);
    assert_int_equal(tp_tcsplit_finish(s, NULL, 0, &c, &cn, &rs, &rn), 0);
    const tp_tc_call *calls;
    assert_int_equal(tp_tcsplit_calls(s, &calls), 1);
    assert_string_equal(calls[0].name, "a");
    tp_tcsplit_free(s);
}

static const char *models_dir(void)
{
    const char *m = getenv("TP_MODELS");
    return m && *m ? m : "../shared/models";
}

static void templates_are_detected_as_their_family(void **state)
{
    (void)state;
    static const struct {
        const char *file;
        tp_tc_family f;
        bool thinks, think_open, object_args;
    } cases[] = {
        {"Qwen-Qwen2.5-7B-Instruct.jinja", TP_TC_HERMES, false, false, true},
        {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", TP_TC_HERMES, false, false, false},   /* is string */
        {"meta-llama-Llama-3.1-8B-Instruct.jinja", TP_TC_LLAMA3, false, false, true},
        {"meta-llama-Llama-3.3-70B-Instruct.jinja", TP_TC_LLAMA3, false, false, true},
        {"mistralai-Mistral-Nemo-Instruct-2407.jinja", TP_TC_MISTRAL, false, false, true},
        {"meetkai-functionary-medium-v3.1.jinja", TP_TC_FUNCTIONARY_V31, false, false, false},
        {"meetkai-functionary-medium-v3.2.jinja", TP_TC_FUNCTIONARY_V32, false, false, false},
        {"CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", TP_TC_COMMAND_R7B, true, false, true},
        {"CohereForAI-c4ai-command-r-plus-tool_use.jinja", TP_TC_COMMAND_R_PLUS, false, false, true},
        {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", TP_TC_DEEPSEEK_R1, true, true, false},
        {"fireworks-ai-llama-3-firefunction-v2.jinja", TP_TC_FIREFUNCTION_V2, false, false, false},
        {"google-gemma-2-2b-it.jinja", TP_TC_NONE, false, false, false},
        {"microsoft-Phi-3.5-mini-instruct.jinja", TP_TC_NONE, false, false, false},
        {"openai-gpt-oss-120b.jinja", TP_TC_HARMONY, true, false, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/chat-templates/%s", models_dir(), cases[i].file);
        tp_chat_template *t;
        tp_err e;
        if (tp_chat_template_load(path, false, &t, &e))
            fail_msg("%s: %s", path, e.msg);
        tp_tc_syntax syn;
        tp_toolcall_syntax(t, "<s>", "</s>", &syn);
        if (syn.family != cases[i].f || syn.thinks != cases[i].thinks || syn.think_open != cases[i].think_open ||
            syn.object_args != cases[i].object_args)
            fail_msg("%s: family %s thinks %d open %d object_args %d", cases[i].file, tp_tc_family_name(syn.family),
                     syn.thinks, syn.think_open, syn.object_args);
        tp_chat_template_free(t);
    }
}

static void tools_are_checked_by_element(void **state)
{
    (void)state;
    tp_err e;
    const char *ok = "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": "
                     "\"object\"}}}]";
    assert_int_equal(tp_tools_check(ok, strlen(ok), &e), 0);
    const char *bad = "[{\"type\": \"function\", \"function\": {\"name\": \"a\"}}, {\"type\": \"function\", "
                      "\"function\": {\"name\": \"bad name\"}}]";
    assert_int_equal(tp_tools_check(bad, strlen(bad), &e), TP_EINVAL);
    assert_non_null(strstr(e.msg, "tools[1].function.name"));
    const char *dup = "[{\"type\": \"function\", \"function\": {\"name\": \"a\"}}, {\"type\": \"function\", "
                      "\"function\": {\"name\": \"a\"}}]";
    assert_int_equal(tp_tools_check(dup, strlen(dup), &e), TP_EINVAL);
    assert_non_null(strstr(e.msg, "twice"));
    assert_int_equal(tp_tools_check("{}", 2, &e), TP_EINVAL);
}

/* a vocabulary of the 256 bytes, then tokens with the given texts: the
 * first (if named) a control token without bytes */
static tp_gvocab *vocab_with(const char *const *extra, size_t n_extra, bool named_first)
{
    static uint8_t bytes[256];
    const uint8_t *b[300];
    size_t lens[300];
    for (int i = 0; i < 256; i++) {
        bytes[i] = (uint8_t)i;
        b[i] = &bytes[i];
        lens[i] = 1;
    }
    for (size_t k = 0; k < n_extra; k++) {
        b[256 + k] = (const uint8_t *)extra[k];
        lens[256 + k] = named_first && !k ? 0 : strlen(extra[k]);
    }
    tp_gvocab *v = NULL;
    tp_err e;
    int eog = 255;
    assert_int_equal(tp_gvocab_new(256 + (int)n_extra, b, lens, &eog, 1, &v, &e), 0);
    if (named_first) {
        int id = 256;
        const char *t = extra[0];
        size_t l = strlen(t);
        assert_int_equal(tp_gvocab_name_tokens(v, 1, &id, &t, &l, &e), 0);
    }
    return v;
}

/* Whether the grammar gbnf takes text whole (a vocabulary of the 256 bytes). */
static bool grammar_takes(const char *gbnf, const char *text)
{
    tp_err e;
    tp_grammar *g = NULL;
    tp_gengine *en = NULL;
    tp_gmatch *m = NULL;
    if (tp_grammar_compile(gbnf, strlen(gbnf), NULL, &g, &e))
        fail_msg("grammar: %s\n%s", e.msg, gbnf);
    tp_gvocab *v = vocab_with(NULL, 0, false);
    assert_int_equal(tp_gengine_new(g, v, NULL, &en, &e), 0);
    assert_int_equal(tp_gmatch_new(en, &m, &e), 0);
    bool ok = !tp_gmatch_accept_bytes(m, (const uint8_t *)text, strlen(text), &e) && tp_gmatch_accepting(m);
    tp_gmatch_free(m);
    tp_gengine_free(en);
    tp_gvocab_free(v);
    tp_grammar_free(g);
    return ok;
}

static const char *const two_tools =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"], \"additionalProperties\": false}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"now\"}}]";

static void a_constrained_call_is_one_of_the_offered_functions(void **state)
{
    (void)state;
    tp_err e;
    char *g = NULL;
    const char *w = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    const char *n = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
    char two[512];
    snprintf(two, sizeof two, "%s\n%s", w, n);
    assert_int_equal(tp_toolcall_grammar(TP_TC_HERMES, two_tools, strlen(two_tools), NULL, true, TP_TCG_FIRST, NULL, NULL, &g, &e), 0);
    assert_true(grammar_takes(g, w));
    assert_true(grammar_takes(g, n));
    assert_true(grammar_takes(g, two));
    assert_false(grammar_takes(g, "Sure.")); /* no content first */
    assert_false(grammar_takes(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"));
    assert_false(grammar_takes(g, "<tool_call>\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>"));
    assert_false(grammar_takes(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": 3}}\n</tool_call>"));
    free(g);
    /* one call only, and only the named function */
    assert_int_equal(tp_toolcall_grammar(TP_TC_HERMES, two_tools, strlen(two_tools), "now", false, TP_TCG_FIRST, NULL, NULL, &g, &e), 0);
    assert_true(grammar_takes(g, n));
    assert_false(grammar_takes(g, w));
    assert_false(grammar_takes(g, two));
    char nn[512];
    snprintf(nn, sizeof nn, "%s\n%s", n, n);
    assert_false(grammar_takes(g, nn));
    free(g);
    /* Llama 3.x writes "parameters"; generic wraps the calls */
    assert_int_equal(tp_toolcall_grammar(TP_TC_LLAMA3, two_tools, strlen(two_tools), NULL, false, TP_TCG_FIRST, NULL, NULL, &g, &e), 0);
    assert_true(grammar_takes(g, "{\"name\": \"now\", \"parameters\": {}}"));
    free(g);
    assert_int_equal(tp_toolcall_grammar(TP_TC_GENERIC, two_tools, strlen(two_tools), NULL, true, TP_TCG_FIRST, NULL, NULL, &g, &e), 0);
    assert_true(grammar_takes(g, "{\"tool_calls\": [{\"name\": \"now\", \"arguments\": {}}, {\"name\": \"now\", "
                                 "\"arguments\": {}}]}"));
    free(g);
}

static void what_cannot_be_held_is_refused_by_name(void **state)
{
    (void)state;
    tp_err e;
    char *g = NULL;
    assert_int_equal(tp_toolcall_grammar(TP_TC_HERMES, two_tools, strlen(two_tools), "later", false, TP_TCG_FIRST, NULL, NULL, &g, &e),
                     TP_EINVAL);
    assert_non_null(strstr(e.msg, "'later' is not one of the offered tools"));
    assert_null(g);
    const char *loose = "[{\"type\": \"function\", \"function\": {\"name\": \"scale\", \"parameters\": {\"type\": "
                        "\"number\", \"minimum\": 0.5}}}]";
    assert_int_equal(tp_toolcall_grammar(TP_TC_HERMES, loose, strlen(loose), NULL, false, TP_TCG_FIRST, NULL, NULL, &g, &e), TP_EINVAL);
    assert_non_null(strstr(e.msg, "tools[0].function.parameters (scale)"));
    assert_non_null(strstr(e.msg, "minimum"));
    assert_int_equal(tp_toolcall_grammar(TP_TC_NONE, two_tools, strlen(two_tools), NULL, false, TP_TCG_FIRST, NULL, NULL, &g, &e), TP_EINVAL);
}

/* Where trigger t first matches in s: its bytes, a space in it any
 * whitespace (as tp_glazy reads a trigger). */
static const char *trigger_in(const char *s, const char *t)
{
    for (; *s; s++) {
        const char *p = s, *q = t;
        for (; *q; q++) {
            if (*q == ' ')
                p += strspn(p, " \t\n");
            else if (*p == *q)
                p++;
            else
                break;
        }
        if (!*q)
            return s;
    }
    return NULL;
}

/* The canonical call of each family (the shape its grammar writes) */
static const struct {
    tp_tc_family f;
    const char *call;   /* now() then get_weather(city: Paris), parallel */
} canonical[] = {
    {TP_TC_HERMES, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": "
                   "\"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"},
    {TP_TC_LLAMA3, "{\"name\": \"now\", \"parameters\": {}}; {\"name\": \"get_weather\", \"parameters\": {\"city\": "
                   "\"Paris\"}}"},
    {TP_TC_MISTRAL, "[TOOL_CALLS][{\"name\": \"now\", \"arguments\": {}}, {\"name\": \"get_weather\", \"arguments\": "
                    "{\"city\": \"Paris\"}}]"},
    {TP_TC_FUNCTIONARY_V31, "<function=now>{}</function><function=get_weather>{\"city\": \"Paris\"}</function>"},
    {TP_TC_FUNCTIONARY_V32, "now\n{}>>>get_weather\n{\"city\": \"Paris\"}"},
    {TP_TC_COMMAND_R7B, "<|START_ACTION|>[{\"tool_name\": \"now\", \"parameters\": {}}, {\"tool_name\": \"get_weather\", "
                        "\"parameters\": {\"city\": \"Paris\"}}]<|END_ACTION|>"},
    {TP_TC_COMMAND_R_PLUS, "Action: ```json\n[{\"tool_name\": \"now\", \"parameters\": {}}, {\"tool_name\": "
                           "\"get_weather\", \"parameters\": {\"city\": \"Paris\"}}]\n```"},
    {TP_TC_DEEPSEEK_R1, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>now\n```json\n{}\n```<｜tool▁call▁end｜>"
                        "\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```"
                        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
    {TP_TC_FIREFUNCTION_V2, " functools[{\"name\": \"now\", \"arguments\": {}}, {\"name\": \"get_weather\", "
                            "\"arguments\": {\"city\": \"Paris\"}}]"},
    {TP_TC_GENERIC, "{\"tool_calls\": [{\"name\": \"now\", \"arguments\": {}}, {\"name\": \"get_weather\", "
                    "\"arguments\": {\"city\": \"Paris\"}}]}"},
    {TP_TC_HARMONY, "<|channel|>commentary to=functions.now <|constrain|>json<|message|>{}<|start|>assistant<|channel|>"
                    "commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}"},
};

/* Required, named and lazy grammars of every family take its canonical
 * calls, and the family's parser reads them back as those calls: what a
 * constrained model writes is what the splitter returns. */
static void every_family_is_held_to_a_call_its_parser_reads(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof canonical / sizeof canonical[0]; i++) {
        tp_tc_family f = canonical[i].f;
        tp_err e;
        char *g = NULL;
        assert_int_equal(tp_toolcall_grammar(f, two_tools, strlen(two_tools), NULL, true, TP_TCG_FIRST, NULL, NULL, &g, &e), 0);
        if (!grammar_takes(g, canonical[i].call))
            fail_msg("%s: the grammar refuses its own shape\n%s", tp_tc_family_name(f), g);
        free(g);
        /* named: only that function, one call */
        assert_int_equal(tp_toolcall_grammar(f, two_tools, strlen(two_tools), "get_weather", false, TP_TCG_FIRST, NULL, NULL,
                                             &g, &e), 0);
        assert_false(grammar_takes(g, canonical[i].call));
        free(g);
        result r;
        check(f, false, false, canonical[i].call, &r);
        assert_int_equal(r.n_calls, 2);
        assert_string_equal(r.names[0], "now");
        assert_string_equal(r.names[1], "get_weather");
        assert_string_equal(r.args[1], "{\"city\": \"Paris\"}");
        /* after a thinking the prompt opened: its end, then the calls */
        assert_int_equal(tp_toolcall_grammar(f, two_tools, strlen(two_tools), NULL, true, TP_TCG_AFTER_THINK, NULL, NULL,
                                             &g, &e), 0);
        char after[1024];
        snprintf(after, sizeof after, "%s\n\n%s", tp_toolcall_grammar_trigger(f, TP_TCG_AFTER_THINK),
                 canonical[i].call + (canonical[i].call[0] == ' '));
        if (!grammar_takes(g, after))
            fail_msg("%s: the grammar after thinking refuses\n%s", tp_tc_family_name(f), g);
        assert_false(grammar_takes(g, canonical[i].call));
        free(g);
        /* lazy: from the trigger on (the text before it is the model's) */
        const char *t = tp_toolcall_trigger(f);
        if (!t)
            continue;
        const char *at = trigger_in(canonical[i].call, t);
        assert_non_null(at);
        assert_int_equal(tp_toolcall_grammar(f, two_tools, strlen(two_tools), NULL, true, TP_TCG_LAZY, NULL, NULL, &g, &e), 0);
        if (!grammar_takes(g, at))
            fail_msg("%s: the lazy grammar refuses the calls from its trigger\n%s", tp_tc_family_name(f), g);
        free(g);
    }
}

/* names as a tp_gnames: the one special token "[TOOL_CALLS]", id 256 */
static int find_tool_calls(void *ctx, const char *text, size_t len)
{
    (void)ctx;
    return len == 12 && !memcmp(text, "[TOOL_CALLS]", 12) ? 256 : -1;
}

/* Mistral's [TOOL_CALLS] is a control token (no bytes): where the
 * vocabulary names it, the grammar asks for that token, not for its
 * letters */
static void a_marker_the_vocabulary_names_is_a_token_reference(void **state)
{
    (void)state;
    tp_err e;
    char *g = NULL;
    tp_gnames names = {257, find_tool_calls, NULL};
    assert_int_equal(tp_toolcall_grammar(TP_TC_MISTRAL, two_tools, strlen(two_tools), "now", false, TP_TCG_FIRST, &names, NULL,
                                         &g, &e), 0);
    char *ref = tp_grammar_token_ref("[TOOL_CALLS]", 12, false);
    assert_non_null(strstr(g, ref));
    free(ref);
    const char *extra[] = {"[TOOL_CALLS]"};
    tp_gvocab *v = vocab_with(extra, 1, true);
    tp_grammar *gr = NULL;
    tp_gengine *en = NULL;
    tp_gmatch *m = NULL;
    assert_int_equal(tp_grammar_compile(g, strlen(g), NULL, &gr, &e), 0);
    assert_int_equal(tp_gengine_new(gr, v, NULL, &en, &e), 0);
    assert_int_equal(tp_gmatch_new(en, &m, &e), 0);
    assert_false(tp_gmatch_allows(m, '['));   /* not spelt out */
    assert_true(tp_gmatch_allows(m, 256));
    assert_int_equal(tp_gmatch_accept(m, 256, &e), 0);
    const char *rest = "[{\"name\": \"now\", \"arguments\": {}}]";
    assert_int_equal(tp_gmatch_accept_bytes(m, (const uint8_t *)rest, strlen(rest), &e), 0);
    assert_true(tp_gmatch_accepting(m));
    tp_gmatch_free(m);
    tp_gengine_free(en);
    tp_grammar_free(gr);
    tp_gvocab_free(v);
    free(g);
}

static tp_gmatch *matcher_of(const char *gbnf, tp_gvocab *v, tp_grammar **gr, tp_gengine **en)
{
    tp_err e;
    tp_gmatch *m = NULL;
    if (tp_grammar_compile(gbnf, strlen(gbnf), NULL, gr, &e))
        fail_msg("%s\n%s", e.msg, gbnf);
    assert_int_equal(tp_gengine_new(*gr, v, NULL, en, &e), 0);
    assert_int_equal(tp_gmatch_new(*en, &m, &e), 0);
    return m;
}

/* A lazy matcher of gbnf over v: the byte token `before` leaves the
 * output free, token 256 (holding the trigger) holds it: `next` may
 * follow, 'x' may not. */
static void held_after_token(const char *gbnf, tp_gvocab *v, const char *trigger, char before, char next)
{
    tp_err e;
    tp_grammar *gr = NULL;
    tp_gengine *en = NULL;
    tp_gmatch *m = matcher_of(gbnf, v, &gr, &en);
    tp_glazy *z = NULL;
    assert_int_equal(tp_glazy_new(m, trigger, strlen(trigger), &z, &e), 0);
    assert_int_equal(tp_glazy_accept(z, (unsigned char)before, &e), 0);
    assert_null(tp_glazy_active(z));
    assert_int_equal(tp_glazy_accept(z, 256, &e), 0);
    assert_non_null(tp_glazy_active(z));
    assert_true(tp_gmatch_allows(m, (unsigned char)next));
    assert_false(tp_gmatch_allows(m, 'x'));
    tp_glazy_free(z);
    tp_gmatch_free(m);
    tp_gengine_free(en);
    tp_grammar_free(gr);
}

/* tool_choice auto: free text until the trigger, then a call; the token
 * that completes the trigger may run past it; a control-token trigger
 * works by its id */
static void a_lazy_grammar_holds_the_output_from_its_trigger_on(void **state)
{
    (void)state;
    tp_err e;
    char *g = NULL;
    assert_int_equal(tp_toolcall_grammar(TP_TC_HERMES, two_tools, strlen(two_tools), NULL, false, TP_TCG_LAZY, NULL, NULL, &g,
                                         &e), 0);
    const char *extra[] = {"ll<tool_call>\n{\""};
    tp_gvocab *v = vocab_with(extra, 1, false);
    tp_grammar *gr = NULL;
    tp_gengine *en = NULL;
    tp_gmatch *m = matcher_of(g, v, &gr, &en);
    tp_glazy *z = NULL;
    assert_int_equal(tp_glazy_new(m, "<tool_call>", 11, &z, &e), 0);
    const char *free_text = "Let me check: <tool";
    for (const char *c = free_text; *c; c++) {
        assert_null(tp_glazy_active(z));
        assert_int_equal(tp_glazy_accept(z, (unsigned char)*c, &e), 0);
    }
    assert_null(tp_glazy_active(z));
    const char *rest = "_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    for (const char *c = rest; *c; c++) {
        assert_int_equal(tp_glazy_accept(z, (unsigned char)*c, &e), 0);
        assert_true((tp_glazy_active(z) != NULL) == (c >= rest + 5));   /* from the trigger's '>' */
        if (c[1] == '"' && c[2] == 'g')
            assert_false(tp_gmatch_allows(m, 'x'));   /* held: a name of the offered functions */
    }
    assert_true(tp_gmatch_accepting(m));
    tp_glazy_free(z);
    tp_gmatch_free(m);
    tp_gengine_free(en);
    tp_grammar_free(gr);
    /* one token completes the trigger and runs past it */
    held_after_token(g, v, "<tool_call>", 'A', 'n');
    tp_gvocab_free(v);
    free(g);
    /* Mistral: the trigger is the control token itself */
    tp_gnames names = {257, find_tool_calls, NULL};
    assert_int_equal(tp_toolcall_grammar(TP_TC_MISTRAL, two_tools, strlen(two_tools), NULL, false, TP_TCG_LAZY, &names, NULL,
                                         &g, &e), 0);
    const char *ctl[] = {"[TOOL_CALLS]"};
    v = vocab_with(ctl, 1, true);
    held_after_token(g, v, "[TOOL_CALLS]", 'O', '[');
    tp_gvocab_free(v);
    free(g);
}

/* Family f's lazy grammar (its own trigger) over the byte vocabulary,
 * fed text byte by byte: held from byte active_from on (SIZE_MAX: never),
 * and then a whole sentence at the end. */
static void lazy_feed(tp_tc_family f, const char *text, size_t active_from)
{
    tp_err e;
    char *g = NULL;
    assert_int_equal(tp_toolcall_grammar(f, two_tools, strlen(two_tools), NULL, true, TP_TCG_LAZY, NULL, NULL, &g, &e), 0);
    const char *t = tp_toolcall_trigger(f);
    assert_non_null(t);
    tp_gvocab *v = vocab_with(NULL, 0, false);
    tp_grammar *gr = NULL;
    tp_gengine *en = NULL;
    tp_gmatch *m = matcher_of(g, v, &gr, &en);
    tp_glazy *z = NULL;
    assert_int_equal(tp_glazy_new(m, t, strlen(t), &z, &e), 0);
    for (size_t i = 0; text[i]; i++) {
        assert_int_equal(tp_glazy_accept(z, (unsigned char)text[i], &e), 0);
        if ((tp_glazy_active(z) != NULL) != (i >= active_from))
            fail_msg("%s: %.*s|: held %d", tp_tc_family_name(f), (int)i + 1, text, tp_glazy_active(z) != NULL);
    }
    if (active_from != SIZE_MAX)
        assert_true(tp_gmatch_accepting(m));
    tp_glazy_free(z);
    tp_gmatch_free(m);
    tp_gengine_free(en);
    tp_grammar_free(gr);
    tp_gvocab_free(v);
    free(g);
}

/* Llama 3's call grammar lets whitespace in after its "{": so does its
 * trigger, else a call spaced that way would go unheld; JSON that is no
 * call stays free. */
static void llama3_auto_holds_a_call_however_it_is_spaced(void **state)
{
    (void)state;
    const char *open[] = {"{\"name\"", "{ \"name\"", "{\n\"name\"", "{ \n\t\"name\""};
    for (size_t k = 0; k < sizeof open / sizeof *open; k++) {
        char text[256];
        snprintf(text, sizeof text, "%s: \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}", open[k]);
        lazy_feed(TP_TC_LLAMA3, text, strlen(open[k]) - 1);
        result r;
        check(TP_TC_LLAMA3, false, false, text, &r);
        assert_int_equal(r.n_calls, 1);
        assert_string_equal(r.args[0], "{\"city\": \"Oslo\"}");
    }
    lazy_feed(TP_TC_LLAMA3, "Use {\"x\": 1} or { \"y\": 2}.", SIZE_MAX);
}

/* Functionary v3.2: a segment after text opens with >>> and a function
 * name; from there the call is held. */
static void functionary_v32_auto_holds_a_call_after_text(void **state)
{
    (void)state;
    const char *text = "all\nLet me look.>>>get_weather\n{\"city\": \"Paris\"}";
    lazy_feed(TP_TC_FUNCTIONARY_V32, text, (size_t)(strstr(text, ">>>") - text) + 2);
    lazy_feed(TP_TC_FUNCTIONARY_V32, "all\nNo call: a > b >> c.", SIZE_MAX);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hermes_parses_parallel_calls_as_qwen_documents_them),
        cmocka_unit_test(harmony_channels_split_into_reasoning_content_and_calls),
        cmocka_unit_test(harmony_frame_is_dropped_without_tools),
        cmocka_unit_test(hermes_keeps_text_before_and_markers_inside_strings),
        cmocka_unit_test(hermes_malformed_call_stays_content),
        cmocka_unit_test(a_call_broken_after_its_name_keeps_what_was_generated),
        cmocka_unit_test(calls_stream_as_they_are_generated),
        cmocka_unit_test(content_holds_back_a_marker_prefix_only_until_it_is_not_one),
        cmocka_unit_test(llama3_json_and_builtin_python_tag),
        cmocka_unit_test(mistral_calls_get_nine_character_ids),
        cmocka_unit_test(functionary_v31_and_v32),
        cmocka_unit_test(command_r7b_thinking_action_and_response),
        cmocka_unit_test(deepseek_r1_thinks_then_calls),
        cmocka_unit_test(firefunction_and_generic),
        cmocka_unit_test(big_integers_in_arguments_are_kept_as_written),
        cmocka_unit_test(without_tools_the_call_text_is_content),
        cmocka_unit_test(one_call_when_parallel_calls_are_off),
        cmocka_unit_test(templates_are_detected_as_their_family),
        cmocka_unit_test(tools_are_checked_by_element),
        cmocka_unit_test(a_constrained_call_is_one_of_the_offered_functions),
        cmocka_unit_test(what_cannot_be_held_is_refused_by_name),
        cmocka_unit_test(every_family_is_held_to_a_call_its_parser_reads),
        cmocka_unit_test(a_marker_the_vocabulary_names_is_a_token_reference),
        cmocka_unit_test(a_lazy_grammar_holds_the_output_from_its_trigger_on),
        cmocka_unit_test(llama3_auto_holds_a_call_however_it_is_spaced),
        cmocka_unit_test(functionary_v32_auto_holds_a_call_after_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
