/* The stop stage with the tool-call splitter, through STOP_OPEN / STOP_STEP
 * as the broker sends them: a control-token marker (Mistral's [TOOL_CALLS],
 * no text of its own) reaches the splitter where it was generated, even
 * when the stop check still holds back text generated before it, and text
 * a stop string cuts is never streamed. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/stage.h"
#include "tokpipe/tokenizer.h"
#include "tokpipe/toolcall.h"

enum { TOK_CALLS = 256, TOK_EOS = 257, TOK_BOS = 258, N_VOCAB = 259 };

/* What the stage published for the job: TOKEN texts and call deltas
 * joined, FINISH's text and calls. */
typedef struct seen {
    char content[1024];      /* TOKEN texts, then FINISH's */
    char reasoning[1024];    /* TOKEN reasoning deltas */
    char finish_reasoning[1024];
    char streamed_args[1024];
    char streamed_names[256];
    int finished;
    char finish_text[256];
    size_t n_calls;
    char names[4][64];
    char args[4][256];
} seen;

static void cat(char *dst, size_t cap, const char *s, size_t n)
{
    size_t l = strlen(dst);
    assert_true(l + n < cap);
    if (n)   /* an event's absent text is (NULL, 0) */
        memcpy(dst + l, s, n);
    dst[l + n] = 0;
}

static int on_publish(void *ctx, const tp_msg *m)
{
    seen *w = ctx;
    if (m->cmd == TP_CMD_TOKEN) {
        cat(w->content, sizeof w->content, m->token.text.ptr, m->token.text.len);
        cat(w->reasoning, sizeof w->reasoning, m->token.reasoning.ptr, m->token.reasoning.len);
        for (size_t i = 0; i < m->token.n_tool_calls; i++) {
            const tp_tool_call *c = &m->token.tool_calls[i];
            cat(w->streamed_args, sizeof w->streamed_args, c->arguments.ptr, c->arguments.len);
            if (!strstr(w->streamed_names, c->name.ptr)) {
                cat(w->streamed_names, sizeof w->streamed_names, c->name.ptr, c->name.len);
                cat(w->streamed_names, sizeof w->streamed_names, ";", 1);
            }
        }
    } else if (m->cmd == TP_CMD_FINISH) {
        w->finished++;
        cat(w->content, sizeof w->content, m->finish.text.ptr, m->finish.text.len);
        cat(w->finish_text, sizeof w->finish_text, m->finish.text.ptr, m->finish.text.len);
        cat(w->finish_reasoning, sizeof w->finish_reasoning, m->finish.reasoning_content.ptr,
            m->finish.reasoning_content.len);
        w->n_calls = m->finish.n_tool_calls;
        for (size_t i = 0; i < w->n_calls && i < 4; i++) {
            cat(w->names[i], sizeof w->names[i], m->finish.tool_calls[i].name.ptr, m->finish.tool_calls[i].name.len);
            cat(w->args[i], sizeof w->args[i], m->finish.tool_calls[i].arguments.ptr,
                m->finish.tool_calls[i].arguments.len);
        }
    }
    return 0;
}

static int on_reply(void *ctx, const tp_msg *m)
{
    (void)ctx;
    if (m->status != TP_ST_OK)
        fail_msg("stop stage: %.*s", (int)m->error.len, m->error.ptr);
    return 0;
}

/* The 256 bytes as byte tokens, then [TOOL_CALLS], </s> and <s> (control). */
static tp_tokenizer *byte_vocab(void)
{
    static char names[256][8];
    const char *pieces[N_VOCAB];
    size_t lens[N_VOCAB];
    int32_t types[N_VOCAB];
    for (int i = 0; i < 256; i++) {
        snprintf(names[i], sizeof names[i], "<0x%02X>", i);
        pieces[i] = names[i];
        lens[i] = strlen(names[i]);
        types[i] = TP_TOKEN_BYTE;
    }
    pieces[TOK_CALLS] = "[TOOL_CALLS]";
    pieces[TOK_EOS] = "</s>";
    pieces[TOK_BOS] = "<s>";
    for (int i = TOK_CALLS; i < N_VOCAB; i++) {
        lens[i] = strlen(pieces[i]);
        types[i] = TP_TOKEN_CONTROL;
    }
    tp_tokenizer *tok = NULL;
    tp_err e;
    if (tp_tokenizer_from_vocab(pieces, lens, NULL, types, N_VOCAB, TOK_BOS, TOK_EOS, &tok, &e))
        fail_msg("%s", e.msg);
    return tok;
}

/* Run one Mistral job under stop string stop: the bytes of before, the
 * [TOOL_CALLS] token, then the bytes of after, one token a step. */
static void run_job(const char *stop, const char *before, const char *after, seen *w)
{
    tp_tokenizer *tok = byte_vocab();
    int eos[] = {TOK_EOS};
    tp_stop_stage_limits lim = {.capacity = 2, .max_stop_strings = 8, .max_stop_len = 64};
    tp_stop_stage *st = NULL;
    tp_err e;
    assert_int_equal(tp_stop_stage_new(tok, eos, 1, &lim, &st, &e), 0);
    tp_tc_syntax syn = {.family = TP_TC_MISTRAL};
    tp_stop_stage_set_syntax(st, &syn);
    tp_stage_io io = {on_reply, on_publish, w};

    tp_msg m;
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_STOP_OPEN);
    tp_str stops[] = {tp_str_of(stop)};
    m.stop_open.slot = 1;
    m.stop_open.job_id = tp_str_of("j1");
    m.stop_open.prev_token = -1;
    m.stop_open.pin = 7;
    m.stop_open.params.stop = stops;
    m.stop_open.params.n_stop = 1;
    m.stop_open.params.parse_tool_calls = true;
    assert_int_equal(tp_stop_stage_handle(st, &m, &io), 0);

    int32_t ids[256];
    size_t n = 0;
    for (const char *p = before; *p; p++)
        ids[n++] = (unsigned char)*p;
    ids[n++] = TOK_CALLS;
    for (const char *p = after; *p; p++)
        ids[n++] = (unsigned char)*p;
    ids[n++] = TOK_EOS;
    uint32_t slot = 1;
    for (size_t i = 0; i < n && !w->finished; i++) {
        tp_msg s;
        tp_msg_init(&s, TP_FAM_WRK, TP_CMD_STOP_STEP);
        s.stop_step.step = i;
        s.stop_step.n = 1;
        s.stop_step.slots = (tp_raw){&slot, 1};
        s.stop_step.candidates = (tp_raw){&ids[i], 1};
        assert_int_equal(tp_stop_stage_handle(st, &s, &io), 0);
    }
    assert_int_equal(w->finished, 1);
    tp_stop_stage_free(st);
    tp_tokenizer_free(tok);
}

/* "a" may start the stop string "aZ" and is held back when [TOOL_CALLS]
 * comes: it is content before the call, not text inside it. */
static void a_marker_after_held_text_comes_after_it(void **state)
{
    (void)state;
    seen w = {0};
    run_job("aZ", "Let me check a", "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]", &w);
    assert_string_equal(w.content, "Let me check a");
    assert_int_equal(w.n_calls, 1);
    assert_string_equal(w.names[0], "get_weather");
    assert_string_equal(w.args[0], "{\"city\": \"Oslo\"}");
    assert_string_equal(w.streamed_names, "get_weather;");
    assert_string_equal(w.streamed_args, w.args[0]);
}

/* The held "a" and the "Z" after the marker make the stop string: the
 * text is cut before "a", which is never streamed, and the marker, after
 * the cut, opens no call. */
static void a_stop_string_across_the_marker_cuts_it_off(void **state)
{
    (void)state;
    seen w = {0};
    run_job("aZ", "Fine a", "Z[{\"name\": \"f\", \"arguments\": {}}]", &w);
    assert_string_equal(w.content, "Fine ");
    assert_int_equal(w.n_calls, 0);
    assert_string_equal(w.streamed_names, "");
}

/* With nothing held the marker goes in at once and the call streams. */
static void a_marker_with_nothing_held(void **state)
{
    (void)state;
    seen w = {0};
    run_job("STOP", "Sure.", "[{\"name\": \"f\", \"arguments\": {\"x\": 1}}]", &w);
    assert_string_equal(w.content, "Sure.");
    assert_int_equal(w.n_calls, 1);
    assert_string_equal(w.args[0], "{\"x\": 1}");
    assert_string_equal(w.streamed_args, "{\"x\": 1}");
}

/* ---- gpt-oss's harmony through the stop stage ---- */

/* The byte tokens, then harmony's frame tokens (control in the file, as
 * o200k_harmony has them): the tokenizer makes <|end|>, <|channel|>,
 * <|message|>, <|start|>, <|constrain|> render as their text, <|return|>
 * and <|call|> the end of generation. */
static const char *const HARMONY[] = {"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>",
                                      "<|return|>", "<|call|>"};
enum { H_N = 256 + 7, H_RETURN = 256 + 5, H_CALL = 256 + 6 };

static tp_tokenizer *harmony_vocab(void)
{
    static char names[256][8];
    const char *pieces[H_N];
    size_t lens[H_N];
    int32_t types[H_N];
    for (int i = 0; i < 256; i++) {
        snprintf(names[i], sizeof names[i], "<0x%02X>", i);
        pieces[i] = names[i];
        lens[i] = strlen(names[i]);
        types[i] = TP_TOKEN_BYTE;
    }
    for (int i = 0; i < 7; i++) {
        pieces[256 + i] = HARMONY[i];
        lens[256 + i] = strlen(HARMONY[i]);
        types[256 + i] = TP_TOKEN_CONTROL;
    }
    tp_tokenizer *tok = NULL;
    tp_err e;
    tp_vocab_spec v = {.kind = TP_TOKENIZER_SPM, .n = H_N, .pieces = pieces, .lens = lens, .types = types,
                       .bos_id = -1, .eos_id = H_RETURN, .unk_id = -1, .eot_id = -1, .eom_id = -1, .add_bos = 0,
                       .add_eos = 0, .add_space_prefix = 0};
    if (tp_tokenizer_new(&v, &tok, &e))
        fail_msg("%s", e.msg);
    return tok;
}

/* text as token ids: each frame token where its text is, bytes elsewhere */
static size_t harmony_ids(const char *text, int32_t *ids, size_t cap)
{
    size_t n = 0;
    for (const char *p = text; *p && n < cap;) {
        int t = -1;
        for (int i = 0; i < 7 && t < 0; i++)
            if (!strncmp(p, HARMONY[i], strlen(HARMONY[i])))
                t = i;
        if (t >= 0) {
            ids[n++] = 256 + t;
            p += strlen(HARMONY[t]);
        } else {
            ids[n++] = (unsigned char)*p++;
        }
    }
    return n;
}

/* One harmony job: output (then end, a <|return|> or <|call|>), tools on
 * or off, under stop string stop (NULL: none) and max_tokens (0: none). */
static void run_harmony(const char *output, int end, bool tools, const char *stop, int max_tokens, seen *w)
{
    tp_tokenizer *tok = harmony_vocab();
    const int32_t *eog;
    int n_eog = tp_tokenizer_eog_ids(tok, &eog);
    int eos[8];
    for (int i = 0; i < n_eog && i < 8; i++)
        eos[i] = eog[i];
    tp_stop_stage_limits lim = {.capacity = 2, .max_stop_strings = 8, .max_stop_len = 64};
    tp_stop_stage *st = NULL;
    tp_err e;
    assert_int_equal(tp_stop_stage_new(tok, eos, n_eog, &lim, &st, &e), 0);
    tp_tc_syntax syn = {.family = TP_TC_HARMONY, .thinks = true, .object_args = true};
    tp_stop_stage_set_syntax(st, &syn);
    tp_stage_io io = {on_reply, on_publish, w};
    tp_msg m;
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_STOP_OPEN);
    tp_str stops[] = {tp_str_of(stop ? stop : "")};
    m.stop_open.slot = 1;
    m.stop_open.job_id = tp_str_of("j1");
    m.stop_open.prev_token = 't'; /* the prompt ends <|start|>assistant */
    m.stop_open.pin = 7;
    m.stop_open.params.stop = stops;
    m.stop_open.params.n_stop = stop ? 1 : 0;
    if (max_tokens) {
        m.stop_open.params.max_tokens = max_tokens;
        m.stop_open.params.set |= TP_P_MAX_TOKENS;
    }
    m.stop_open.params.parse_tool_calls = tools;
    m.stop_open.params.parse_reasoning = true;
    assert_int_equal(tp_stop_stage_handle(st, &m, &io), 0);
    int32_t ids[512];
    size_t n = harmony_ids(output, ids, 511);
    ids[n++] = end;
    uint32_t slot = 1;
    for (size_t i = 0; i < n && !w->finished; i++) {
        tp_msg s;
        tp_msg_init(&s, TP_FAM_WRK, TP_CMD_STOP_STEP);
        s.stop_step.step = i;
        s.stop_step.n = 1;
        s.stop_step.slots = (tp_raw){&slot, 1};
        s.stop_step.candidates = (tp_raw){&ids[i], 1};
        assert_int_equal(tp_stop_stage_handle(st, &s, &io), 0);
    }
    assert_int_equal(w->finished, 1);
    tp_stop_stage_free(st);
    tp_tokenizer_free(tok);
}

/* As OpenAI's API returns gpt-oss's turns: the analysis channel in
 * reasoning_content, the final channel in content, a commentary call in
 * tool_calls (streamed), no frame text in any of them. */
static void harmony_turns_split_as_openai_returns_them(void **state)
{
    (void)state;
    seen w = {0};
    run_harmony("<|channel|>analysis<|message|>Simple sum.<|end|><|start|>assistant<|channel|>final<|message|>"
                "2 + 2 = 4.", H_RETURN, false, NULL, 0, &w);
    assert_string_equal(w.content, "2 + 2 = 4.");
    assert_string_equal(w.reasoning, "Simple sum.");
    assert_string_equal(w.finish_reasoning, "Simple sum.");
    assert_int_equal(w.n_calls, 0);
    memset(&w, 0, sizeof w);
    run_harmony("<|channel|>analysis<|message|>Need the weather tool.<|end|><|start|>assistant<|channel|>"
                "commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}",
                H_CALL, true, NULL, 0, &w);
    assert_string_equal(w.content, "");
    assert_string_equal(w.reasoning, "Need the weather tool.");
    assert_int_equal(w.n_calls, 1);
    assert_string_equal(w.names[0], "get_weather");
    assert_string_equal(w.args[0], "{\"city\":\"Paris\"}");
    assert_string_equal(w.streamed_names, "get_weather;");
    assert_string_equal(w.streamed_args, w.args[0]);
}

/* Stop strings and max_tokens act on the generated text, as for the other
 * families: a stop string in the answer cuts it there (the frame is not
 * content either way); max_tokens counts every generated token, and a cut
 * inside a header leaves no header text in the content. (The frame's
 * tokens render as text, as llama.cpp renders them, so a stop string that
 * a header spells, "final" or "<|end|>", matches there too.) */
static void harmony_stop_strings_see_the_answer(void **state)
{
    (void)state;
    seen w = {0};
    run_harmony("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>"
                "Paris is nice. STOP here.", H_RETURN, false, " STOP", 0, &w);
    assert_string_equal(w.content, "Paris is nice.");
    assert_string_equal(w.reasoning, "Think.");
    memset(&w, 0, sizeof w);

    run_harmony("<|channel|>analysis<|message|>ab<|end|><|start|>assistant<|channel|>final<|message|>xyz",
                H_RETURN, false, NULL, 14, &w);
    /* 14 tokens: <|channel|>, "analysis" (8 bytes), <|message|>, "ab", <|end|>, <|start|>: the cut
     * header's start is not content */
    assert_string_equal(w.reasoning, "ab");
    assert_string_equal(w.content, "");
    memset(&w, 0, sizeof w);
    /* <|channel|>, "final" (5), <|message|>, then 2 of the answer's 6 */
    run_harmony("<|channel|>final<|message|>abcdef", H_RETURN, false, NULL, 9, &w);
    assert_string_equal(w.content, "ab");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_marker_after_held_text_comes_after_it),
        cmocka_unit_test(a_stop_string_across_the_marker_cuts_it_off),
        cmocka_unit_test(a_marker_with_nothing_held),
        cmocka_unit_test(harmony_turns_split_as_openai_returns_them),
        cmocka_unit_test(harmony_stop_strings_see_the_answer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
