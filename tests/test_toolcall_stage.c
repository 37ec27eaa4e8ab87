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
    memcpy(dst + l, s, n);
    dst[l + n] = 0;
}

static int on_publish(void *ctx, const tp_msg *m)
{
    seen *w = ctx;
    if (m->cmd == TP_CMD_TOKEN) {
        cat(w->content, sizeof w->content, m->token.text.ptr, m->token.text.len);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_marker_after_held_text_comes_after_it),
        cmocka_unit_test(a_stop_string_across_the_marker_cuts_it_off),
        cmocka_unit_test(a_marker_with_nothing_held),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
