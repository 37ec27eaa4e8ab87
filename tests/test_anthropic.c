/* The gateway's Anthropic Messages translator (http/anthropic.c): a
 * request decodes into the chat request of the same conversation (what
 * oai.c makes of the OpenAI body a client would write for it), refusals
 * name Anthropic's fields, and results render as content blocks, stop
 * reasons, usage and the named SSE events. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../http/gw.h"

static void decode_ok(bool count, const char *body, oai_request *r)
{
    oai_error e;
    if (gw_anthropic_decode(count, body, strlen(body), r, &e))
        fail_msg("%s: refused: %s (param %s)", body, e.message, e.param);
}

static void refused(bool count, const char *body, const char *param, const char *message_start)
{
    oai_request r;
    oai_error e;
    if (!gw_anthropic_decode(count, body, strlen(body), &r, &e)) {
        oai_request_free(&r);
        fail_msg("%s: accepted, want 400 naming '%s'", body, param);
    }
    if (e.status != 400 || strcmp(e.param, param) || strncmp(e.message, message_start, strlen(message_start)))
        fail_msg("%s: got %d param '%s' message '%s'; want 400 '%s', message starting '%s'", body, e.status,
                 e.param, e.message, param, message_start);
}

static bool str_eq(tp_str s, const char *want)
{
    return s.ptr && s.len == strlen(want) && !memcmp(s.ptr, want, s.len);
}

static void a_message_is_the_chat_request_of_the_same_conversation(void **state)
{
    (void)state;
    const char *ant =
        "{\"model\":\"m\",\"max_tokens\":40,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":7,"
        "\"stop_sequences\":[\" girl\"],\"stream\":true,\"metadata\":{\"user_id\":\"u\"},"
        "\"system\":[{\"type\":\"text\",\"text\":\"Be brief.\"}],"
        "\"tools\":[{\"name\":\"get_weather\",\"description\":\"Weather\",\"input_schema\":{\"type\":\"object\"}}],"
        "\"tool_choice\":{\"type\":\"any\",\"disable_parallel_tool_use\":true},"
        "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Weather \"},"
        "{\"type\":\"text\",\"text\":\"in Paris?\"}]},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hm\",\"signature\":\"\"},"
        "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get_weather\",\"input\":{\"city\":\"Paris\"}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":\"21\"},"
        "{\"type\":\"text\",\"text\":\"And?\"}]}]}";
    const char *chat =
        "{\"model\":\"m\",\"max_tokens\":40,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":7,\"stop\":[\" girl\"],"
        "\"stream\":true,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"description\":\"Weather\",\"parameters\":{\"type\":\"object\"}}}],\"tool_choice\":\"required\","
        "\"parallel_tool_calls\":false,\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
        "{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"toolu_1\",\"type\":\"function\","
        "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"toolu_1\",\"name\":\"get_weather\",\"content\":\"21\"},"
        "{\"role\":\"user\",\"content\":\"And?\"}]}";
    oai_request a, c;
    oai_error e;
    decode_ok(false, ant, &a);
    if (oai_decode(OAI_CHAT, chat, strlen(chat), &c, &e))
        fail_msg("chat body refused: %s", e.message);
    assert_int_equal(a.kind, OAI_CHAT);
    assert_int_equal(a.n_messages, c.n_messages);
    for (size_t i = 0; i < a.n_messages; i++) {
        const tp_chat_msg *x = &a.messages[i], *y = &c.messages[i];
        assert_int_equal(x->role.len, y->role.len);
        assert_memory_equal(x->role.ptr, y->role.ptr, x->role.len);
        assert_int_equal(x->content.len, y->content.len);
        assert_memory_equal(x->content.ptr, y->content.ptr, x->content.len);
        assert_true(x->name.len == y->name.len && x->tool_call_id.len == y->tool_call_id.len);
        assert_int_equal(x->n_tool_calls, y->n_tool_calls);
        for (size_t k = 0; k < x->n_tool_calls; k++) {
            assert_true(x->tool_calls[k].arguments.len == y->tool_calls[k].arguments.len);
            assert_memory_equal(x->tool_calls[k].arguments.ptr, y->tool_calls[k].arguments.ptr,
                                x->tool_calls[k].arguments.len);
        }
    }
    assert_true(str_eq(a.messages[3].tool_call_id, "toolu_1") && str_eq(a.messages[3].name, "get_weather"));
    cJSON *ta = cJSON_ParseWithLength(a.tools.ptr, a.tools.len), *tc = cJSON_ParseWithLength(c.tools.ptr, c.tools.len);
    assert_true(cJSON_Compare(ta, tc, true));
    cJSON_Delete(ta);
    cJSON_Delete(tc);
    assert_string_equal(a.tool_choice, "required");
    assert_int_equal(a.params.set, c.params.set);
    assert_true(a.params.max_tokens == 40 && a.params.top_k == 7 && a.params.temperature == 0.5);
    assert_false(a.params.parallel_tool_calls);
    assert_int_equal(a.params.n_stop, 1);
    assert_true(str_eq(a.params.stop[0], " girl"));
    assert_true(a.stream && a.n == 1);
    oai_request_free(&a);
    oai_request_free(&c);

    decode_ok(false, "{\"max_tokens\":5,\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],"
                     "\"tool_choice\":{\"type\":\"tool\",\"name\":\"f\"},\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
              &a);
    assert_string_equal(a.tool_choice, "function");
    assert_string_equal(a.tool_choice_name, "f");
    oai_request_free(&a);
}

static void count_tokens_is_a_one_token_job_of_the_conversation(void **state)
{
    (void)state;
    oai_request r;
    decode_ok(true, "{\"model\":\"m\",\"system\":\"s\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                    "\"thinking\":{\"type\":\"disabled\"}}", &r);
    assert_int_equal(r.n_messages, 2);
    assert_true((r.params.set & TP_P_MAX_TOKENS) && r.params.max_tokens == 1);
    assert_false(r.stream);
    oai_request_free(&r);
    refused(true, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":5}", "max_tokens",
            "max_tokens: unknown field");
    refused(true, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":true}", "stream",
            "stream: unknown field");
}

static void refusals_name_the_field_as_anthropic_spells_it(void **state)
{
    (void)state;
    const char *m = "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]";
    char b[512];
#define REFUSED(extra, param, start)                                      \
    do {                                                                  \
        snprintf(b, sizeof b, "{%s%s}", m, extra);                        \
        refused(false, b, param, start);                                  \
    } while (0)
    REFUSED("", "max_tokens", "max_tokens: required");
    REFUSED(",\"max_tokens\":0", "max_tokens", "max_tokens: 0 is outside");
    REFUSED(",\"max_tokens\":1e999", "max_tokens", "max_tokens: ");
    REFUSED(",\"max_tokens\":5,\"top_k\":\"x\"", "top_k", "top_k: expected an integer");
    REFUSED(",\"max_tokens\":5,\"stop_sequences\":[\"a\",1]", "stop_sequences[1]", "stop_sequences[1]: expected a string");
    REFUSED(",\"max_tokens\":5,\"stop_sequences\":\"a\"", "stop_sequences", "stop_sequences");
    REFUSED(",\"max_tokens\":5,\"n\":2", "n", "n: unknown field");
    REFUSED(",\"max_tokens\":5,\"max_tokens\":6", "max_tokens", "max_tokens: given twice");
    REFUSED(",\"max_tokens\":5,\"tools\":[{\"name\":\"a b\",\"input_schema\":{}}]", "tools", "tools[0].name");
    REFUSED(",\"max_tokens\":5,\"tools\":[{\"name\":\"f\"}]", "tools[0]", "tools[0].input_schema: required");
    REFUSED(",\"max_tokens\":5,\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"w\"}]", "tools[0]",
            "tools[0].type");
    REFUSED(",\"max_tokens\":5,\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],\"tool_choice\":{\"type\":\"tool\"}",
            "tool_choice", "tool_choice.name: required");
    REFUSED(",\"max_tokens\":5,\"tool_choice\":\"auto\"", "tool_choice", "tool_choice: expected");
    REFUSED(",\"max_tokens\":5,\"tool_choice\":{\"type\":\"auto\"}", "tool_choice", "tool_choice: only with tools");
    REFUSED(",\"max_tokens\":2000,\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":2000}", "thinking",
            "thinking.budget_tokens: must be less than max_tokens");
    REFUSED(",\"max_tokens\":5,\"metadata\":{\"user\":\"u\"}", "metadata", "metadata.user: unknown field");
#undef REFUSED
    refused(false, "{\"max_tokens\":5,\"messages\":[]}", "messages", "messages: expected a non-empty list");
    refused(false, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_use\","
                   "\"id\":\"a\",\"name\":\"f\",\"input\":{}}]}]}", "messages[0].content[0]",
            "messages[0].content[0].type: expected text or tool_result");
    refused(false, "{\"max_tokens\":5,\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\","
                   "\"id\":\"a\",\"name\":\"f\",\"input\":[]}]}]}", "messages[0].content[0]",
            "messages[0].content[0].input: expected an object");
    refused(false, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\"}]}]}",
            "messages[0].content[0]", "messages[0].content[0].tool_use_id: required");
    refused(false, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"name\":\"n\"}]}",
            "messages[0]", "messages[0].name: unknown field");
}

/* A finished one-choice call as the bridge leaves it. */
static void finished(gw_call *c, gw_choice *ch, int reason, const char *text, const char *thinking, cJSON *calls)
{
    memset(c, 0, sizeof *c);
    memset(ch, 0, sizeof *ch);
    c->ch = ch;
    c->n_ch = 1;
    c->oreq.n = 1;
    c->api = &gw_api_messages;
    snprintf(c->id, sizeof c->id, "msg_1");
    ch->reason = reason;
    ch->prompt_tokens = 40;
    ch->cached_tokens = 32;
    ch->completion_tokens = 9;
    tp_buf_puts(&ch->text, text);
    tp_buf_puts(&ch->reasoning, thinking);
    ch->tool_calls = calls;
}

static void release(gw_choice *ch)
{
    tp_buf_free(&ch->text);
    tp_buf_free(&ch->reasoning);
    cJSON_Delete(ch->tool_calls);
    free(ch->scalls);
}

static cJSON *body_of(const gw_call *c)
{
    char *s = c->api->body(c, "m");
    cJSON *j = cJSON_Parse(s);
    free(s);
    assert_non_null(j);
    return j;
}

static const char *str_at(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static double num_at(const cJSON *o, const char *k)
{
    return cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, k));
}

static void results_are_content_blocks_with_a_stop_reason_and_usage(void **state)
{
    (void)state;
    gw_call c;
    gw_choice ch;
    cJSON *calls = cJSON_Parse("[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                               "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}},{\"id\":\"call_2\",\"type\":"
                               "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"cut\"}}]");
    finished(&c, &ch, TP_REASON_EOS, "Let me see.", "Look it up.", calls);
    cJSON *j = body_of(&c);
    assert_string_equal(str_at(j, "type"), "message");
    assert_string_equal(str_at(j, "id"), "msg_1");
    assert_string_equal(str_at(j, "stop_reason"), "tool_use");
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "stop_sequence")));
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(j, "content");
    assert_int_equal(cJSON_GetArraySize(content), 4);
    assert_string_equal(str_at(cJSON_GetArrayItem(content, 0), "thinking"), "Look it up.");
    assert_string_equal(str_at(cJSON_GetArrayItem(content, 1), "text"), "Let me see.");
    const cJSON *use = cJSON_GetArrayItem(content, 2);
    assert_string_equal(str_at(use, "type"), "tool_use");
    assert_string_equal(str_at(use, "id"), "call_1");
    assert_string_equal(str_at(cJSON_GetObjectItemCaseSensitive(use, "input"), "city"), "Paris");
    /* arguments that are no JSON object: input {} */
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(content, 3), "input")), 0);
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(j, "usage");
    assert_true(num_at(u, "input_tokens") == 8 && num_at(u, "cache_read_input_tokens") == 32 &&
                num_at(u, "output_tokens") == 9);
    cJSON_Delete(j);
    release(&ch);

    finished(&c, &ch, TP_REASON_STOP_STRING, "Once", "", NULL);
    ch.matched.kind = TP_MATCHED_STR;
    ch.matched_buf = (char *)" girl";
    j = body_of(&c);
    assert_string_equal(str_at(j, "stop_reason"), "stop_sequence");
    assert_string_equal(str_at(j, "stop_sequence"), " girl");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "content")), 1);
    cJSON_Delete(j);
    release(&ch);
    /* a call a stop string cut is no finished call: the stop says why it ended */
    finished(&c, &ch, TP_REASON_STOP_STRING, "", "", cJSON_Parse("[{\"id\":\"c\",\"function\":{\"name\":\"f\","
                                                                 "\"arguments\":\"{\\\"a\"}}]"));
    ch.tool_calls_cut = true;
    ch.matched.kind = TP_MATCHED_STR;
    ch.matched_buf = (char *)"\"";
    j = body_of(&c);
    assert_string_equal(str_at(j, "stop_reason"), "stop_sequence");
    cJSON_Delete(j);
    release(&ch);
    /* cut by max_tokens: max_tokens, calls or not */
    finished(&c, &ch, TP_REASON_LENGTH, "", "", cJSON_Parse("[{\"id\":\"c\",\"function\":{\"name\":\"f\","
                                                           "\"arguments\":\"{}\"}}]"));
    j = body_of(&c);
    assert_string_equal(str_at(j, "stop_reason"), "max_tokens");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "content")), 1);
    cJSON_Delete(j);
    release(&ch);

    char *err = gw_api_messages.error(400, "2 is outside (0, 1]", "params.top_p", NULL);
    j = cJSON_Parse(err);
    assert_string_equal(str_at(j, "type"), "error");
    assert_string_equal(str_at(cJSON_GetObjectItemCaseSensitive(j, "error"), "type"), "invalid_request_error");
    assert_string_equal(str_at(cJSON_GetObjectItemCaseSensitive(j, "error"), "message"), "params.top_p: 2 is outside (0, 1]");
    cJSON_Delete(j);
    free(err);
    char param[64];
    gw_api_messages.param("params.stop[3]", param, sizeof param);
    assert_string_equal(param, "stop_sequences[3]");
}

/* Appends s (taken) to the stream so far. */
static void out(char **all, char *s)
{
    assert_non_null(s);
    size_t a = *all ? strlen(*all) : 0;
    *all = realloc(*all, a + strlen(s) + 1);
    strcpy(*all + a, s);
    free(s);
}

static void a_stream_is_the_named_events_block_by_block(void **state)
{
    (void)state;
    gw_call c;
    gw_choice ch;
    finished(&c, &ch, TP_REASON_EOS, "", "", NULL);
    ch.scalls = calloc(1, sizeof *ch.scalls);
    ch.n_scalls = 1;
    const gw_api *api = &gw_api_messages;
    char *s = NULL;
    out(&s, api->open(&c, "m"));
    out(&s, api->reasoning(&c, "m", 0, "Look", 4));
    out(&s, api->reasoning(&c, "m", 0, " it up.", 7));
    out(&s, api->text(&c, "m", 0, "Hi", 2, 0, 0));
    out(&s, api->call(&c, "m", 0, 0, "call_1", 6, "f", 1, "", 0));
    out(&s, api->call(&c, "m", 0, 0, NULL, 0, NULL, 0, "{\"a\":", 5));
    out(&s, api->call(&c, "m", 0, 0, NULL, 0, NULL, 0, "1}", 2));
    ch.tool_calls = cJSON_Parse("[{\"id\":\"call_1\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]");
    out(&s, api->finish(&c, "m", 0));
    out(&s, api->close(&c, "m"));
    const char *want[] = {"message_start", "ping", "content_block_start", "content_block_delta",
                          "content_block_delta", "content_block_stop", "content_block_start", "content_block_delta",
                          "content_block_stop", "content_block_start", "content_block_delta", "content_block_delta",
                          "content_block_stop", "message_delta", "message_stop"};
    size_t n = 0;
    int last_index = -1;
    for (char *p = s; *p; n++) {
        assert_true(n < sizeof want / sizeof want[0]);
        char name[64];
        assert_int_equal(sscanf(p, "event: %63s\n", name), 1);
        assert_string_equal(name, want[n]);
        char *data = strstr(p, "\ndata: ") + 7, *end = strstr(data, "\n\n");
        *end = '\0';
        cJSON *j = cJSON_Parse(data);
        assert_string_equal(str_at(j, "type"), name);   /* the data says its event's name too */
        if (!strcmp(name, "content_block_start")) {
            int index = (int)num_at(j, "index");
            assert_int_equal(index, last_index + 1);
            last_index = index;
        }
        if (!strcmp(name, "message_delta")) {
            assert_string_equal(str_at(cJSON_GetObjectItemCaseSensitive(j, "delta"), "stop_reason"), "tool_use");
            assert_true(num_at(cJSON_GetObjectItemCaseSensitive(j, "usage"), "output_tokens") == 9);
        }
        cJSON_Delete(j);
        p = end + 2;
    }
    assert_int_equal(n, sizeof want / sizeof want[0]);
    assert_int_equal(last_index, 2);
    free(s);
    release(&ch);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_message_is_the_chat_request_of_the_same_conversation),
        cmocka_unit_test(count_tokens_is_a_one_token_job_of_the_conversation),
        cmocka_unit_test(refusals_name_the_field_as_anthropic_spells_it),
        cmocka_unit_test(results_are_content_blocks_with_a_stop_reason_and_usage),
        cmocka_unit_test(a_stream_is_the_named_events_block_by_block),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
