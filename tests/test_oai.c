/* The gateway's request decoder (http/oai.c): OpenAI bodies into SUBMIT
 * parameters, and refusals that name the field in OpenAI's terms. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <math.h>
#include <string.h>

#include "../http/lp.h"
#include "../http/oai.h"
#include "tokpipe/error.h"
#include "tokpipe/tokenizer.h"
#include <stdlib.h>

static void decode_ok(oai_kind kind, const char *body, oai_request *r)
{
    oai_error e;
    if (oai_decode(kind, body, strlen(body), r, &e))
        fail_msg("%s: refused: %s (param %s)", body, e.message, e.param);
}

static void refused(oai_kind kind, const char *body, int status, const char *param, const char *in_message)
{
    oai_request r;
    oai_error e;
    if (!oai_decode(kind, body, strlen(body), &r, &e)) {
        oai_request_free(&r);
        fail_msg("%s: accepted, want %d naming '%s'", body, status, param);
    }
    if (e.status != status || strcmp(e.param, param) || !strstr(e.message, in_message))
        fail_msg("%s: got %d param '%s' message '%s'; want %d '%s' containing '%s'", body, e.status, e.param,
                 e.message, status, param, in_message);
}

static void every_completion_field_maps_onto_submit_params(void **state)
{
    (void)state;
    oai_request r;
    decode_ok(OAI_COMPLETIONS,
              "{\"model\":\"m\",\"prompt\":\"Once\",\"max_tokens\":12,\"temperature\":0.5,\"top_p\":0.9,"
              "\"top_k\":40,\"min_p\":0.05,\"repetition_penalty\":1.1,\"presence_penalty\":0.5,"
              "\"frequency_penalty\":-0.5,\"stop\":[\" girl\",\".\"],\"stop_token_ids\":[13,2],\"seed\":7,"
              "\"n\":3,\"ignore_eos\":true,\"min_tokens\":2,\"include_stop_str_in_output\":true,"
              "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"user\":\"u\"}",
              &r);
    const tp_params *p = &r.params;
    assert_string_equal(r.model, "m");
    assert_int_equal(r.n_prompts, 1);
    assert_string_equal(r.prompts[0].text, "Once");
    assert_int_equal(p->max_tokens, 12);
    assert_true(p->temperature == 0.5 && p->top_p == 0.9 && p->min_p == 0.05);
    assert_true(p->repetition_penalty == 1.1 && p->presence_penalty == 0.5 && p->frequency_penalty == -0.5);
    assert_int_equal(p->top_k, 40);
    assert_int_equal(p->n_stop, 2);
    assert_memory_equal(p->stop[0].ptr, " girl", 5);
    assert_int_equal(p->stop[0].len, 5);
    assert_int_equal(p->n_stop_token_ids, 2);
    assert_int_equal(p->stop_token_ids[1], 2);
    assert_true(r.has_seed);
    assert_int_equal(p->seed, 7);
    assert_int_equal(r.n, 3);
    assert_true(p->ignore_eos && p->include_stop_str_in_output);
    assert_int_equal(p->min_tokens, 2);
    assert_true(r.stream && r.include_usage);
    uint32_t want = TP_P_MAX_TOKENS | TP_P_TEMPERATURE | TP_P_TOP_P | TP_P_TOP_K | TP_P_MIN_P |
                    TP_P_REPETITION_PENALTY | TP_P_PRESENCE_PENALTY | TP_P_FREQUENCY_PENALTY | TP_P_STOP |
                    TP_P_STOP_TOKEN_IDS | TP_P_SEED | TP_P_IGNORE_EOS | TP_P_MIN_TOKENS | TP_P_INCLUDE_STOP;
    assert_int_equal(p->set, want);
    oai_request_free(&r);
    decode_ok(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"logit_bias\":{\"13\":-100,\"7\":2.5},\"typical_p\":0.9,"
              "\"truncate_prompt_tokens\":8}", &r);
    assert_int_equal(r.params.logit_bias.n, 2);
    assert_int_equal(r.params.logit_bias.ids[0], 13);
    assert_true(r.params.logit_bias.values[0] == -100.0f && r.params.logit_bias.values[1] == 2.5f);
    assert_true(r.params.typical_p == 0.9);
    assert_int_equal(r.params.truncate_prompt_tokens, 8);
    assert_int_equal(r.params.set, TP_P_LOGIT_BIAS | TP_P_TYPICAL_P | TP_P_TRUNCATE_PROMPT);
    oai_request_free(&r);
}

static void absent_and_null_fields_leave_the_broker_defaults(void **state)
{
    (void)state;
    oai_request r;
    decode_ok(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"temperature\":null,\"stop\":null,\"seed\":null,\"n\":null}", &r);
    assert_int_equal(r.params.set, 0);
    assert_int_equal(r.n, 1);
    assert_false(r.has_seed);
    oai_request_free(&r);
    decode_ok(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"max_completion_tokens\":5,\"top_k\":-1,\"stop\":\"END\"}", &r);
    assert_int_equal(r.params.max_tokens, 5);
    assert_int_equal(r.params.top_k, 0);   /* vLLM's -1 = tokpipe's 0 = off */
    assert_int_equal(r.params.n_stop, 1);
    oai_request_free(&r);
}

static void prompts_come_as_text_lists_and_token_ids(void **state)
{
    (void)state;
    oai_request r;
    decode_ok(OAI_COMPLETIONS, "{\"prompt\":[1,403,407]}", &r);
    assert_int_equal(r.n_prompts, 1);
    assert_null(r.prompts[0].text);
    assert_int_equal(r.prompts[0].n_ids, 3);
    assert_int_equal(r.prompts[0].ids[2], 407);
    oai_request_free(&r);
    decode_ok(OAI_COMPLETIONS, "{\"prompt\":[\"a\",[5,6],\"b\\u00e9\"]}", &r);
    assert_int_equal(r.n_prompts, 3);
    assert_string_equal(r.prompts[0].text, "a");
    assert_int_equal(r.prompts[1].n_ids, 2);
    assert_string_equal(r.prompts[2].text, "b\xc3\xa9");
    oai_request_free(&r);
}

static void bad_fields_are_refused_by_name(void **state)
{
    (void)state;
    refused(OAI_COMPLETIONS, "{bad", 400, "", "not valid JSON");
    refused(OAI_COMPLETIONS, "[1]", 400, "", "JSON object");
    refused(OAI_COMPLETIONS, "{\"max_tokens\":3}", 400, "prompt", "required");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"max_token\":3}", 400, "max_token", "unknown field");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"temperature\":\"hot\"}", 400, "temperature", "number");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":1.5}", 400, "max_tokens", "integer");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":0}", 400, "max_tokens", "outside");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"n\":0}", 400, "n", "outside");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"seed\":-1}", 400, "seed", "outside");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"stop\":[\"a\",3]}", 400, "stop[1]", "string");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"stop_token_ids\":[1,-2]}", 400, "stop_token_ids[1]", "outside");
    refused(OAI_COMPLETIONS, "{\"prompt\":[1,\"a\"]}", 400, "prompt[1]", "");
    refused(OAI_COMPLETIONS, "{\"prompt\":[]}", 400, "prompt", "");
    refused(OAI_COMPLETIONS, "{\"prompt\":[[]]}", 400, "prompt[0]", "empty");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"prompt\":\"y\"}", 400, "prompt", "twice");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"a\\u0000b\"}", 400, "", "NUL");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"stream_options\":{\"include_usage\":true}}", 400,
            "stream_options", "stream: true");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"logprobs\":6}", 400, "logprobs", "outside [0, 5]");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"logprobs\":-1}", 400, "logprobs", "outside [0, 5]");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"logprobs\":true}", 400, "logprobs", "integer");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"top_logprobs\":2}", 400, "top_logprobs", "chat");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"logit_bias\":{\"a\":1}}", 400, "logit_bias", "token id");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"logit_bias\":{\"5\":\"x\"}}", 400, "logit_bias.5", "number");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"messages\":[]}", 400, "messages", "chat");
    refused(OAI_CHAT, "{\"prompt\":\"x\"}", 400, "prompt", "messages");
    refused(OAI_CHAT, "{\"model\":\"m\"}", 400, "messages", "required");
}

/* reasoning_effort (OpenAI's field for reasoning models; gpt-oss's
 * template reads it): low, medium or high, chat only, null absent. */
static void reasoning_effort_is_one_of_three_words_for_chat(void **state)
{
    (void)state;
    oai_request r;
    decode_ok(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"reasoning_effort\":\"high\"}", &r);
    assert_string_equal(r.reasoning_effort, "high");
    oai_request_free(&r);
    decode_ok(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"reasoning_effort\":null}", &r);
    assert_null(r.reasoning_effort);
    oai_request_free(&r);
    refused(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"reasoning_effort\":\"max\"}", 400,
            "reasoning_effort", "low");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"reasoning_effort\":\"low\"}", 400, "reasoning_effort",
            "chat/completions");
}

static void neutral_openai_fields_are_accepted(void **state)
{
    (void)state;
    oai_request r;
    decode_ok(OAI_COMPLETIONS,
              "{\"prompt\":\"x\",\"n\":2,\"best_of\":2,\"echo\":false,\"logprobs\":null,\"logit_bias\":{},"
              "\"suffix\":null}",
              &r);
    assert_int_equal(r.n, 2);
    oai_request_free(&r);
    /* an escaped backslash before u0000 is text, not a NUL */
    decode_ok(OAI_COMPLETIONS, "{\"prompt\":\"a\\\\u0000\"}", &r);
    assert_string_equal(r.prompts[0].text, "a\\u0000");
    oai_request_free(&r);
}

static void response_format_and_llama_cpp_constraints_decode(void **state)
{
    (void)state;
    oai_request r;
    for (int kind = OAI_COMPLETIONS; kind <= OAI_CHAT; kind++) {
        const char *base = kind == OAI_CHAT ? "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]," : "{\"prompt\":\"x\",";
        char body[1024];
        /* text: no constraint */
        snprintf(body, sizeof body, "%s\"response_format\":{\"type\":\"text\"}}", base);
        decode_ok((oai_kind)kind, body, &r);
        assert_true(!r.grammar && !r.json_schema && !r.json_mode && !r.constraint_param[0]);
        assert_false(r.params.set & (TP_P_GRAMMAR | TP_P_JSON_SCHEMA | TP_P_JSON_MODE));
        oai_request_free(&r);
        snprintf(body, sizeof body, "%s\"response_format\":{\"type\":\"json_object\"}}", base);
        decode_ok((oai_kind)kind, body, &r);
        assert_true(r.json_mode && !r.json_schema && !r.grammar);
        assert_string_equal(r.constraint_param, "response_format");
        assert_true(r.params.json_mode && (r.params.set & TP_P_JSON_MODE));
        oai_request_free(&r);
        /* json_schema: the schema travels as JSON text; strict changes nothing */
        snprintf(body, sizeof body,
                 "%s\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\",\"strict\":true,"
                 "\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}}}}",
                 base);
        decode_ok((oai_kind)kind, body, &r);
        assert_string_equal(r.json_schema, "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}");
        assert_false(r.json_mode);
        /* on the SUBMIT params */
        assert_true(r.params.set & TP_P_JSON_SCHEMA);
        assert_false(r.params.set & (TP_P_GRAMMAR | TP_P_JSON_MODE));
        assert_memory_equal(r.params.json_schema.ptr, r.json_schema, strlen(r.json_schema));
        assert_int_equal(r.params.json_schema.len, strlen(r.json_schema));
        oai_request_free(&r);
        snprintf(body, sizeof body,
                 "%s\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\",\"strict\":false,"
                 "\"schema\":{\"type\":\"string\"}}}}",
                 base);
        decode_ok((oai_kind)kind, body, &r);
        assert_string_equal(r.json_schema, "{\"type\":\"string\"}");
        oai_request_free(&r);
        /* llama.cpp server fields */
        snprintf(body, sizeof body, "%s\"grammar\":\"root ::= \\\"yes\\\" | \\\"no\\\"\"}", base);
        decode_ok((oai_kind)kind, body, &r);
        assert_string_equal(r.grammar, "root ::= \"yes\" | \"no\"");
        assert_string_equal(r.constraint_param, "grammar");
        assert_true((r.params.set & TP_P_GRAMMAR) && r.params.grammar.len == strlen(r.grammar));
        oai_request_free(&r);
        snprintf(body, sizeof body, "%s\"json_schema\":{}}", base);
        decode_ok((oai_kind)kind, body, &r);
        assert_string_equal(r.json_schema, "{}");
        oai_request_free(&r);
        snprintf(body, sizeof body, "%s\"json_schema\":null,\"grammar\":null,\"response_format\":null}", base);
        decode_ok((oai_kind)kind, body, &r);
        assert_true(!r.grammar && !r.json_schema && !r.json_mode);
        oai_request_free(&r);
    }
    /* two constraints at once, each pair named */
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"grammar\":\"root ::= \\\"a\\\"\",\"json_schema\":{}}", 400, "json_schema",
            "grammar and json_schema");
    refused(OAI_CHAT,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"response_format\":{\"type\":\"json_object\"},"
            "\"grammar\":\"root ::= \\\"a\\\"\"}",
            400, "grammar", "response_format and grammar");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"json_schema\":{},\"response_format\":{\"type\":\"json_object\"}}", 400,
            "response_format", "json_schema and response_format");
    /* malformed */
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"response_format\":{\"type\":\"xml\"}}", 400, "response_format",
            "'xml' is not text, json_object or json_schema");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"response_format\":{}}", 400, "response_format", "type: required");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"response_format\":\"json\"}", 400, "response_format", "expected an object");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\"}}", 400, "response_format",
            "json_schema: required");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\"}}}",
            400, "response_format", "schema: required");
    refused(OAI_COMPLETIONS,
            "{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{},\"strict\":1}}}", 400,
            "response_format", "strict: expected a boolean");
    refused(OAI_COMPLETIONS,
            "{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":[1]}}}", 400,
            "response_format", "expected a JSON Schema");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"response_format\":{\"type\":\"text\",\"schema\":{}}}", 400,
            "response_format", "unknown field");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"grammar\":\"\"}", 400, "grammar", "non-empty");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"grammar\":{}}", 400, "grammar", "GBNF");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"json_schema\":\"{}\"}", 400, "json_schema", "expected a JSON Schema");
}

static void logprobs_map_onto_submit_params(void **state)
{
    (void)state;
    oai_request r;
    decode_ok(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"logprobs\":3}", &r);
    assert_true(r.logprobs && r.params.logprobs);
    assert_int_equal(r.params.top_logprobs, 3);
    assert_true((r.params.set & (TP_P_LOGPROBS | TP_P_TOP_LOGPROBS)) == (TP_P_LOGPROBS | TP_P_TOP_LOGPROBS));
    oai_request_free(&r);
    decode_ok(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"logprobs\":0}", &r);
    assert_true(r.params.logprobs);
    assert_int_equal(r.params.top_logprobs, 0);
    oai_request_free(&r);
    decode_ok(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"logprobs\":false}", &r);
    assert_false(r.params.logprobs || (r.params.set & TP_P_LOGPROBS));
    oai_request_free(&r);
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"logprobs\":true,\"top_logprobs\":20}";
    decode_ok(OAI_CHAT, chat, &r);
    assert_true(r.params.logprobs);
    assert_int_equal(r.params.top_logprobs, 20);
    oai_request_free(&r);
    decode_ok(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"logprobs\":true}", &r);
    assert_true(r.params.logprobs);
    assert_int_equal(r.params.top_logprobs, 0);
    oai_request_free(&r);
    decode_ok(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"top_logprobs\":0}", &r);
    assert_false(r.params.logprobs);
    oai_request_free(&r);
    refused(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"top_logprobs\":2}", 400,
            "top_logprobs", "logprobs: true");
    refused(OAI_CHAT,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"logprobs\":false,\"top_logprobs\":2}",
            400, "top_logprobs", "logprobs: true");
    refused(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"logprobs\":true,\"top_logprobs\":21}",
            400, "top_logprobs", "outside [0, 20]");
    refused(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"logprobs\":3}", 400, "logprobs",
            "true or false");
}

/* tok512's byte-fallback token for byte b (<0x00> is id 3). */
#define BYTE_ID(b) (3 + (b))

static tp_tokenizer *tok512(void)
{
    const char *dir = getenv("TP_MODELS");
    char path[512];
    snprintf(path, sizeof path, "%s/tok512.bin", dir ? dir : "../shared/models");
    tp_tokenizer *tok = NULL;
    tp_err e;
    if (tp_tokenizer_open(path, 0, &tok, &e))
        fail_msg("%s: %s", path, e.msg);
    return tok;
}

static void feed(gw_lp *l, const tp_tokenizer *tok, int32_t id)
{
    tp_raw r = {&id, 1};
    assert_int_equal(gw_lp_add(l, tok, r, NULL), 0);
}

static void logprobs_entries_wait_for_the_text_carrying_their_last_byte(void **state)
{
    (void)state;
    tp_tokenizer *tok = tok512();
    gw_lp l;
    gw_lp_init(&l, 0, -1);
    feed(&l, tok, BYTE_ID('A'));
    assert_int_equal(gw_lp_release(&l, 1, false, false), 1);   /* "A" */
    feed(&l, tok, BYTE_ID(0xC3));
    assert_int_equal(gw_lp_release(&l, 0, false, false), 1);   /* half of e-acute: held */
    feed(&l, tok, BYTE_ID(0xA9));
    assert_int_equal(gw_lp_release(&l, 2, false, false), 3);   /* "\u00e9" completes both */
    feed(&l, tok, BYTE_ID('B'));
    assert_int_equal(gw_lp_release(&l, 1, false, false), 4);
    /* offsets count characters; a token starting inside one starts with it */
    assert_int_equal(l.off[0], 0);
    assert_int_equal(l.off[1], 1);
    assert_int_equal(l.off[2], 1);
    assert_int_equal(l.off[3], 2);
    size_t len;
    const uint8_t *b = gw_lp_bytes(&l, tok, 1, -1, &len);
    assert_int_equal(len, 1);
    assert_int_equal(b[0], 0xC3);
    gw_lp_free(&l);
    tp_tokenizer_free(tok);
}

static void logprobs_of_tokens_a_stop_string_cuts_never_go_out(void **state)
{
    (void)state;
    tp_tokenizer *tok = tok512();
    gw_lp l;
    /* "a", "b" held as a possible prefix of stop "bc"; the stopping
     * candidate "c" is never accepted; FINISH publishes "a" */
    gw_lp_init(&l, 0, -1);
    feed(&l, tok, BYTE_ID('a'));
    assert_int_equal(gw_lp_release(&l, 0, false, false), 0);
    feed(&l, tok, BYTE_ID('b'));
    assert_int_equal(gw_lp_release(&l, 0, false, false), 0);
    assert_int_equal(gw_lp_release(&l, 1, true, false), 1);
    gw_lp_free(&l);
    /* any other finish releases every accepted token, even an unfinished
     * character published as U+FFFD */
    gw_lp_init(&l, 0, -1);
    feed(&l, tok, BYTE_ID(0xE2));
    feed(&l, tok, BYTE_ID(0x82));
    assert_int_equal(gw_lp_release(&l, 0, false, false), 0);
    assert_int_equal(gw_lp_release(&l, 3, true, true), 2);
    gw_lp_free(&l);
    /* an invalid byte is one U+FFFD (3 text bytes) and releases its token */
    gw_lp_init(&l, 0, -1);
    feed(&l, tok, BYTE_ID(0xFF));
    assert_int_equal(gw_lp_release(&l, 3, false, false), 1);
    gw_lp_free(&l);
    tp_tokenizer_free(tok);
}

static void logprobs_columns_of_an_event_fill_the_entries(void **state)
{
    (void)state;
    tp_tokenizer *tok = tok512();
    gw_lp l;
    gw_lp_init(&l, 2, -1);
    int32_t ids[2] = {BYTE_ID('x'), BYTE_ID('y')};
    float lps[2] = {-0.5f, NAN};
    int32_t top[3] = {BYTE_ID('x'), BYTE_ID('z'), BYTE_ID('q')};   /* one row short: a truncated frame */
    float tlp[3] = {-0.5f, -1.5f, -2.0f};
    tp_lp_cols lp = {.top_n = 2, .logprobs = {lps, 2}, .top_ids = {top, 3}, .top_logprobs = {tlp, 3}};
    assert_int_equal(gw_lp_add(&l, tok, (tp_raw){ids, 2}, &lp), 0);
    assert_int_equal(l.n, 2);
    assert_true(l.lps[0] == -0.5f && isnan(l.lps[1]));
    assert_int_equal(l.top_ids[1], BYTE_ID('z'));
    assert_int_equal(l.top_ids[2], BYTE_ID('q'));
    assert_int_equal(l.top_ids[3], -1);   /* padded, not read past the frame */
    int32_t bad = 99999;   /* outside the vocabulary: no bytes */
    assert_int_equal(gw_lp_add(&l, tok, (tp_raw){&bad, 1}, NULL), 0);
    assert_int_equal(gw_lp_release(&l, 2, true, true), 3);
    gw_lp_free(&l);
    tp_tokenizer_free(tok);
}

static void choices_are_capped(void **state)
{
    (void)state;
    char body[4096] = "{\"n\":128,\"prompt\":[";
    for (int i = 0; i < 9; i++)
        strcat(body, i ? ",\"p\"" : "\"p\"");
    strcat(body, "]}");
    refused(OAI_COMPLETIONS, body, 400, "n", "jobs");
}

static void chat_turns_become_submit_messages(void **state)
{
    (void)state;
    oai_request r;
    decode_ok(OAI_CHAT,
              "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\","
              "\"content\":[{\"type\":\"text\",\"text\":\"Hi \"},{\"type\":\"text\",\"text\":\"there\"}]},"
              "{\"role\":\"assistant\",\"content\":null}],\"max_completion_tokens\":9}",
              &r);
    assert_int_equal(r.n_messages, 3);
    assert_int_equal(r.n_prompts, 0);
    assert_memory_equal(r.messages[1].content.ptr, "Hi there", 8);
    assert_int_equal(r.messages[1].content.len, 8);
    assert_int_equal(r.messages[2].content.len, 0);
    assert_memory_equal(r.messages[0].role.ptr, "system", 6);
    oai_request_free(&r);
    refused(OAI_CHAT, "{\"messages\":[{\"content\":\"x\"}]}", 400, "messages[0]", "role: required");
    /* PROTOCOL.md: a turn's content is required unless it carries tool_calls (null is content) */
    refused(OAI_CHAT, "{\"messages\":[{\"role\":\"user\"}]}", 400, "messages[0].content", "content: required");
    refused(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"weight\":\"bob\"}]}", 400,
            "messages[0].weight", "not supported");
    refused(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400,
            "messages[0].content", "text parts");
}

static void tools_and_tool_turns_become_submit_fields(void **state)
{
    (void)state;
    oai_request r;
    const char *tools = "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
                        "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\","
                        "\"maximum\":9007199254740993}}}}}]";
    char body[2048];
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"},"
             "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","
             "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"n\\\": 1}\"}}]},"
             "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"name\":\"get_weather\",\"content\":\"21\"}],"
             "\"tools\": %s,\"tool_choice\":\"auto\",\"parallel_tool_calls\":false}",
             tools);
    decode_ok(OAI_CHAT, body, &r);
    assert_int_equal(r.n_messages, 3);
    assert_int_equal(r.messages[1].n_tool_calls, 1);
    assert_memory_equal(r.messages[1].tool_calls[0].id.ptr, "call_1", 6);
    assert_memory_equal(r.messages[1].tool_calls[0].arguments.ptr, "{\"n\": 1}", 8);
    assert_memory_equal(r.messages[2].tool_call_id.ptr, "call_1", 6);
    assert_memory_equal(r.messages[2].name.ptr, "get_weather", 11);
    /* the tools as sent: the big integer is not rounded */
    assert_int_equal(r.tools.len, strlen(tools));
    assert_memory_equal(r.tools.ptr, tools, r.tools.len);
    assert_string_equal(r.tool_choice, "auto");
    assert_true(r.params.set & TP_P_PARALLEL_TOOL_CALLS);
    assert_false(r.params.parallel_tool_calls);
    oai_request_free(&r);
    refused(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[],"
            "\"tool_choice\":\"auto\"}", 400, "tool_choice", "tool_choice: only with tools");
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":%s,"
             "\"tool_choice\":\"required\"}", tools);
    decode_ok(OAI_CHAT, body, &r);
    assert_string_equal(r.tool_choice, "required");
    assert_null(r.tool_choice_name);
    oai_request_free(&r);
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":%s,"
             "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}}", tools);
    decode_ok(OAI_CHAT, body, &r);
    assert_string_equal(r.tool_choice, "function");
    assert_string_equal(r.tool_choice_name, "get_weather");
    oai_request_free(&r);
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":%s,"
             "\"tool_choice\":{\"type\":\"tool\",\"function\":{\"name\":\"get_weather\"}}}", tools);
    refused(OAI_CHAT, body, 400, "tool_choice", "tool_choice: expected");
    refused(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
            "\"function\":{\"name\":\"a b\"}}]}", 400, "tools", "tools[0].function.name");
    refused(OAI_CHAT, "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"type\":\"function\","
            "\"function\":{\"arguments\":\"{}\"}}]}]}", 400, "messages[0].tool_calls[0]", "function.name");
    refused(OAI_COMPLETIONS, "{\"prompt\":\"x\",\"tools\":[]}", 400, "tools", "only for /v1/chat/completions");
}

static void broker_field_paths_become_openai_params(void **state)
{
    (void)state;
    char out[64];
    oai_param_of_field("params.top_p", out, sizeof out);
    assert_string_equal(out, "top_p");
    oai_param_of_field("params.stop[2]", out, sizeof out);
    assert_string_equal(out, "stop[2]");
    oai_param_of_field("prompt_ids", out, sizeof out);
    assert_string_equal(out, "prompt");
    oai_param_of_field("", out, sizeof out);
    assert_string_equal(out, "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_completion_field_maps_onto_submit_params),
        cmocka_unit_test(absent_and_null_fields_leave_the_broker_defaults),
        cmocka_unit_test(prompts_come_as_text_lists_and_token_ids),
        cmocka_unit_test(bad_fields_are_refused_by_name),
        cmocka_unit_test(neutral_openai_fields_are_accepted),
        cmocka_unit_test(reasoning_effort_is_one_of_three_words_for_chat),
        cmocka_unit_test(response_format_and_llama_cpp_constraints_decode),
        cmocka_unit_test(choices_are_capped),
        cmocka_unit_test(logprobs_map_onto_submit_params),
        cmocka_unit_test(logprobs_entries_wait_for_the_text_carrying_their_last_byte),
        cmocka_unit_test(logprobs_of_tokens_a_stop_string_cuts_never_go_out),
        cmocka_unit_test(logprobs_columns_of_an_event_fill_the_entries),
        cmocka_unit_test(chat_turns_become_submit_messages),
        cmocka_unit_test(tools_and_tool_turns_become_submit_fields),
        cmocka_unit_test(broker_field_paths_become_openai_params),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
