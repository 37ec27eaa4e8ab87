/* The generation API's wire keys: logprobs / top_logprobs / logprobs_mode,
 * typical_p, logit_bias, truncate_prompt_tokens in SUBMIT params; seeds and
 * context counts in ACK and FINISH; the logprob frames of TOKEN, SAMPLED,
 * STEP_RESULT and STOP_STEP; INFO / INFO_REPLY and READY's model keys. Every
 * rejection names its field. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <msgpack.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "tokpipe/protocol.h"
#include "support/proto_check.h"

static void pk_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str_with_body(pk, s, strlen(s));
}

/* Decode SUBMIT {req: 9, prompt: "hi", params: {key: <pack>}}; expect
 * failure with status and needle, bad_field = field. */
static void expect_param_error(const char *key, void (*pack)(msgpack_packer *), uint32_t status, const char *needle,
                               const char *field)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    pk_str(&pk, "req"), msgpack_pack_uint64(&pk, 9);
    pk_str(&pk, "prompt"), pk_str(&pk, "hi");
    pk_str(&pk, "params"), msgpack_pack_map(&pk, 1), pk_str(&pk, key), pack(&pk);
    uint8_t cmd = TP_CMD_SUBMIT;
    tp_frame f[3] = {{TP_MAGIC_JOB, 4}, {&cmd, 1}, {sb.data, sb.size}};
    tp_msg m;
    tp_err e = {0};
    if (tp_proto_decode(TP_FAM_JOB, f, 3, &m, &e) == 0)
        fail_msg("params.%s: accepted, expected '%s'", key, needle);
    if (m.status != status || !strstr(e.msg, needle))
        fail_msg("params.%s: status %u '%s', expected %u '%s'", key, m.status, e.msg, status, needle);
    if (strcmp(m.bad_field, field))
        fail_msg("params.%s: bad_field '%s', expected '%s'", key, m.bad_field, field);
    tp_msg_clear(&m);
    msgpack_sbuffer_destroy(&sb);
}

static void pk_21(msgpack_packer *pk) { msgpack_pack_int(pk, 21); }
static void pk_neg(msgpack_packer *pk) { msgpack_pack_int(pk, -1); }
static void pk_zero(msgpack_packer *pk) { msgpack_pack_int(pk, 0); }
static void pk_1_5(msgpack_packer *pk) { msgpack_pack_double(pk, 1.5); }
static void pk_five(msgpack_packer *pk) { msgpack_pack_int(pk, 5); }
static void pk_mode_bad(msgpack_packer *pk) { pk_str(pk, "logits"); }
static void pk_bias_list(msgpack_packer *pk) { msgpack_pack_array(pk, 1), msgpack_pack_int(pk, 3); }
static void pk_bias_big(msgpack_packer *pk) { msgpack_pack_map(pk, 1), pk_str(pk, "12"), msgpack_pack_double(pk, 100.5); }
static void pk_bias_key(msgpack_packer *pk) { msgpack_pack_map(pk, 1), pk_str(pk, "x7"), msgpack_pack_int(pk, 1); }
static void pk_bias_neg_key(msgpack_packer *pk) { msgpack_pack_map(pk, 1), msgpack_pack_int(pk, -3), msgpack_pack_int(pk, 1); }
static void pk_bias_nan(msgpack_packer *pk) { msgpack_pack_map(pk, 1), pk_str(pk, "4"), msgpack_pack_double(pk, NAN); }
static void pk_bias_twice(msgpack_packer *pk)
{
    msgpack_pack_map(pk, 2), pk_str(pk, "7"), msgpack_pack_int(pk, 1), pk_str(pk, "07"), msgpack_pack_int(pk, 2);
}
static void pk_bias_many(msgpack_packer *pk)
{
    msgpack_pack_map(pk, TP_PROTO_MAX_LOGIT_BIAS + 1);
    for (int i = 0; i <= TP_PROTO_MAX_LOGIT_BIAS; i++)
        msgpack_pack_int(pk, i), msgpack_pack_int(pk, 1);
}

static void new_params_out_of_range_name_the_field(void **state)
{
    (void)state;
    expect_param_error("top_logprobs", pk_21, 400, "params.top_logprobs: 21 is outside [0, 20]", "params.top_logprobs");
    expect_param_error("top_logprobs", pk_neg, 400, "params.top_logprobs: -1", "params.top_logprobs");
    expect_param_error("top_logprobs", pk_five, 400, "params.top_logprobs: 5 alternatives need logprobs: true",
                       "params.top_logprobs");
    expect_param_error("logprobs", pk_zero, 400, "params.logprobs: expected bool", "params.logprobs");
    expect_param_error("logprobs_mode", pk_mode_bad, 400, "params.logprobs_mode: 'logits' is not raw or processed",
                       "params.logprobs_mode");
    expect_param_error("typical_p", pk_zero, 400, "params.typical_p: 0 is outside (0, 1]", "params.typical_p");
    expect_param_error("typical_p", pk_1_5, 400, "params.typical_p: 1.5 is outside (0, 1]", "params.typical_p");
    expect_param_error("truncate_prompt_tokens", pk_zero, 400, "params.truncate_prompt_tokens: 0 is outside",
                       "params.truncate_prompt_tokens");
    expect_param_error("logit_bias", pk_bias_list, 400, "params.logit_bias: expected a map", "params.logit_bias");
    expect_param_error("logit_bias", pk_bias_big, 400, "params.logit_bias.12: 100.5 is outside [-100, 100]",
                       "params.logit_bias.12");
    expect_param_error("logit_bias", pk_bias_nan, 400, "params.logit_bias.4: nan is outside", "params.logit_bias.4");
    expect_param_error("logit_bias", pk_bias_key, 400, "params.logit_bias.x7: the key must be a token id",
                       "params.logit_bias.x7");
    expect_param_error("logit_bias", pk_bias_neg_key, 400, "params.logit_bias[0]: -3 is outside",
                       "params.logit_bias[0]");
    expect_param_error("logit_bias", pk_bias_twice, 400, "params.logit_bias.07: token id 7 given twice",
                       "params.logit_bias.07");
    expect_param_error("logit_bias", pk_bias_many, 413, "params.logit_bias: 1025 entries, at most 1024",
                       "params.logit_bias");
}

static void submit_round_trips_logprobs_bias_typical_and_truncation(void **state)
{
    (void)state;
    int32_t ids[] = {13, 0, 400};
    float vals[] = {-100.0f, 2.5f, 100.0f};
    tp_msg m, d;
    tp_wire w;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_SUBMIT);
    m.submit.prompt = tp_str_of("Once");
    tp_params *p = &m.submit.params;
    p->set = TP_P_LOGPROBS | TP_P_TOP_LOGPROBS | TP_P_LOGPROBS_MODE | TP_P_TYPICAL_P | TP_P_LOGIT_BIAS |
             TP_P_TRUNCATE_PROMPT;
    p->logprobs = true, p->top_logprobs = 20, p->logprobs_mode = tp_str_of("processed");
    p->typical_p = 0.25, p->truncate_prompt_tokens = 7;
    p->logit_bias = (tp_logit_bias){ids, vals, 3};
    round_trip(&m, &w, &d);
    const tp_params *q = &d.submit.params;
    assert_true(q->logprobs);
    assert_int_equal(q->top_logprobs, 20);
    assert_int_equal(tp_params_lpmode(q), TP_LPMODE_PROCESSED);
    assert_true(q->typical_p == 0.25);
    assert_int_equal(q->truncate_prompt_tokens, 7);
    assert_int_equal(q->logit_bias.n, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(q->logit_bias.ids[i], ids[i]);
        assert_true(q->logit_bias.values[i] == vals[i]);
    }
    tp_msg_clear(&d);
    tp_wire_free(&w);
    /* absent: raw mode, an empty bias map that is never NULL */
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_SUBMIT);
    m.submit.prompt = tp_str_of("Once");
    round_trip(&m, &w, &d);
    assert_int_equal(tp_params_lpmode(&d.submit.params), TP_LPMODE_RAW);
    assert_int_equal(d.submit.params.logit_bias.n, 0);
    assert_non_null(d.submit.params.logit_bias.ids);
    tp_msg_clear(&d);
    tp_wire_free(&w);
}

static void ack_and_finish_carry_a_seed_of_zero_and_the_context_counts(void **state)
{
    (void)state;
    tp_msg m, d;
    tp_wire w;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_ACK);
    m.status = 200, m.ack.job_id = tp_str_of("j1"), m.ack.set = TP_ACK_SEED, m.ack.seed = 0;
    round_trip(&m, &w, &d);
    assert_true(d.ack.set & TP_ACK_SEED);
    assert_int_equal(d.ack.seed, 0);
    tp_msg_clear(&d);
    tp_wire_free(&w);

    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_ACK);
    m.status = 400, m.error = tp_str_of("prompt: 802 tokens, the model's context holds 512");
    m.ack.job_id = tp_str_of("j1"), m.ack.field = tp_str_of("prompt");
    m.ack.error_code = tp_str_of(TP_CODE_CONTEXT), m.ack.prompt_tokens = 802, m.ack.context_length = 512;
    round_trip(&m, &w, &d);
    assert_false(d.ack.set & TP_ACK_SEED);
    assert_true(str_is(d.ack.error_code, "context_length_exceeded"));
    assert_int_equal(d.ack.prompt_tokens, 802);
    assert_int_equal(d.ack.context_length, 512);
    tp_msg_clear(&d);
    tp_wire_free(&w);

    tp_msg_init(&m, TP_FAM_EVT, TP_CMD_FINISH);
    tp_m_finish *f = &m.finish;
    f->job_id = tp_str_of("j1"), f->reason = TP_REASON_LENGTH, f->text = tp_str_of("");
    f->set = TP_ACK_SEED, f->seed = 18446744073709551615ull, f->detail = tp_str_of("context");
    f->context_length = 512, f->prompt_tokens = 500, f->completion_tokens = 12;
    round_trip(&m, &w, &d);
    assert_true(d.finish.set & TP_ACK_SEED);
    assert_true(d.finish.seed == 18446744073709551615ull);
    assert_true(str_is(d.finish.detail, "context"));
    assert_int_equal(d.finish.context_length, 512);
    tp_msg_clear(&d);
    tp_wire_free(&w);
}

static void token_event_carries_logprob_frames_checked_against_top_n(void **state)
{
    (void)state;
    int32_t ids[] = {345}, top[] = {345, 12, -1};
    float lp[] = {-0.25f}, tlp[] = {-0.25f, -2.0f, -INFINITY};
    tp_msg m, d;
    tp_wire w;
    tp_msg_init(&m, TP_FAM_EVT, TP_CMD_TOKEN);
    m.token = (tp_m_token){.job_id = tp_str_of("j7"), .text = tp_str_of(" dog"), .ids = {ids, 1},
                           .lp = {3, {lp, 1}, {top, 3}, {tlp, 3}}};
    round_trip(&m, &w, &d);
    assert_int_equal(w.n, 8);
    assert_int_equal(d.token.lp.top_n, 3);
    assert_true(tp_raw_f32(d.token.lp.logprobs, 0) == -0.25f);
    assert_int_equal(tp_raw_i32(d.token.lp.top_ids, 1), 12);
    assert_int_equal(tp_raw_i32(d.token.lp.top_ids, 2), -1);
    assert_true(isinf(tp_raw_f32(d.token.lp.top_logprobs, 2)));
    tp_msg_clear(&d);
    tp_wire_free(&w);
    /* top_n says 3, frames hold 2: refused naming the frame */
    m.token.lp.top_ids.n = 2, m.token.lp.top_logprobs.n = 2;
    tp_err e;
    assert_int_not_equal(tp_proto_encode(&m, &w, &e), 0);
    assert_non_null(strstr(e.msg, "top_ids"));
    /* top_n without frames */
    m.token.lp = (tp_lp_cols){.top_n = 2};
    assert_int_not_equal(tp_proto_encode(&m, &w, &e), 0);
    assert_non_null(strstr(e.msg, "logprobs: frame missing"));
    /* no logprobs: no frames, as before */
    m.token.lp = (tp_lp_cols){0};
    round_trip(&m, &w, &d);
    assert_int_equal(w.n, 5);
    assert_null(d.token.lp.logprobs.data);
    tp_msg_clear(&d);
    tp_wire_free(&w);
}

static void sampled_step_result_and_stop_step_carry_the_logprob_columns(void **state)
{
    (void)state;
    uint32_t slots[] = {4, 9};
    int32_t cand[] = {7, 8}, top[] = {7, 1, -1, -1};
    float lp[] = {-0.5f, NAN}, tlp[] = {-0.5f, -1.5f, -INFINITY, -INFINITY};
    tp_lp_cols cols = {2, {lp, 2}, {top, 4}, {tlp, 4}};
    tp_msg m, d;
    tp_wire w;
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_SAMPLED);
    m.task = 1, m.status = 200;
    m.sampled = (tp_m_sampled){.step = 3, .n = 2, .slots = {slots, 2}, .candidates = {cand, 2}, .lp = cols};
    round_trip(&m, &w, &d);
    assert_int_equal(d.sampled.lp.top_n, 2);
    assert_true(isnan(tp_raw_f32(d.sampled.lp.logprobs, 1)));
    tp_msg_clear(&d);
    tp_wire_free(&w);

    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_STEP_RESULT);
    m.task = 1, m.status = 200;
    m.step_result = (tp_m_step_result){.step = 3, .n = 2, .sampled = true, .slots = {slots, 2}, .out = {cand, 2},
                                       .lp = cols};
    round_trip(&m, &w, &d);
    assert_int_equal(tp_raw_i32(d.step_result.lp.top_ids, 1), 1);
    tp_msg_clear(&d);
    tp_wire_free(&w);

    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_STOP_STEP);
    m.task = 2;
    m.stop_step = (tp_m_stop_step){.step = 3, .n = 2, .slots = {slots, 2}, .candidates = {cand, 2}, .lp = cols};
    round_trip(&m, &w, &d);
    assert_true(tp_raw_f32(d.stop_step.lp.top_logprobs, 1) == -1.5f);
    tp_msg_clear(&d);
    tp_wire_free(&w);

    /* logits (not sampled) never carry logprob frames */
    float logits[4] = {0};
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_STEP_RESULT);
    m.task = 1, m.status = 200;
    m.step_result = (tp_m_step_result){.step = 3, .n = 2, .vocab = 2, .slots = {slots, 2}, .out = {logits, 4},
                                       .lp = cols};
    tp_err e;
    assert_int_not_equal(tp_proto_encode(&m, &w, &e), 0);
    assert_non_null(strstr(e.msg, "only a sampled STEP_RESULT"));
}

static void status_reply_carries_logprob_rows_of_its_tokens(void **state)
{
    (void)state;
    int32_t ids[] = {5, 6}, top[] = {5, 6};
    float lp[] = {-0.1f, -0.2f}, tlp[] = {-0.1f, -0.2f};
    tp_msg m, d;
    tp_wire w;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_STATUS_REPLY);
    m.status = 200;
    tp_m_status_reply *r = &m.status_reply;
    r->job_id = tp_str_of("j1"), r->state = TP_STATE_RUNNING, r->last_seq = 1, r->text = tp_str_of("ab");
    r->tokens = (tp_raw){ids, 2}, r->completion_tokens = 2;
    r->lp = (tp_lp_cols){1, {lp, 2}, {top, 2}, {tlp, 2}};
    round_trip(&m, &w, &d);
    assert_int_equal(d.status_reply.lp.top_n, 1);
    assert_true(tp_raw_f32(d.status_reply.lp.logprobs, 1) == -0.2f);
    tp_msg_clear(&d);
    tp_wire_free(&w);
    r->lp.logprobs.n = 1;   /* a row per token id, or the reply is refused */
    tp_err e;
    assert_int_not_equal(tp_proto_encode(&m, &w, &e), 0);
    assert_non_null(strstr(e.msg, "logprobs: 1 elements"));
}

static void info_and_its_reply_round_trip_with_model_and_limits(void **state)
{
    (void)state;
    tp_msg m, d;
    tp_wire w;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_INFO);
    m.req = 5;
    round_trip(&m, &w, &d);
    assert_int_equal(d.req, 5);
    tp_msg_clear(&d);
    tp_wire_free(&w);

    int32_t eog[] = {1, 2}, sp[] = {0, 1, 2};
    static const char text[] = "\5<unk>\3<s>\4</s>";
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_INFO_REPLY);
    m.req = 5, m.status = 200;
    tp_m_info_reply *r = &m.info_reply;
    r->model_id = tp_str_of("llama2c dim=64"), r->vocab_size = 512, r->context_length = 512;
    r->bos_id = 1, r->eos_id = 2, r->eog_ids = eog, r->n_eog_ids = 2;
    r->special_ids = (tp_raw){sp, 3}, r->special_text = (tp_raw){text, sizeof text - 1};
    r->weight_type = tp_str_of("f32");
    r->limits = (tp_m_info_limits){.max_tokens = 4096, .max_stop_strings = 1024, .max_logit_bias = 1024,
                                   .max_top_logprobs = 20};
    round_trip(&m, &w, &d);
    assert_true(str_is(d.info_reply.model_id, "llama2c dim=64"));
    assert_int_equal(d.info_reply.context_length, 512);
    assert_int_equal(d.info_reply.n_eog_ids, 2);
    tp_str got[3];
    assert_int_equal(tp_proto_special_split(d.info_reply.special_ids, d.info_reply.special_text, got, NULL), 0);
    assert_true(str_is(got[2], "</s>"));
    assert_int_equal(tp_raw_i32(d.info_reply.special_ids, 2), 2);
    assert_false(d.info_reply.chat_template);
    assert_int_equal(d.info_reply.limits.max_tokens, 4096);
    assert_int_equal(d.info_reply.limits.max_top_logprobs, 20);
    tp_msg_clear(&d);
    tp_wire_free(&w);
    r->special_text.n = 10;   /* two pieces */
    tp_err e;
    assert_int_not_equal(tp_proto_encode(&m, &w, &e), 0);
    assert_non_null(strstr(e.msg, "special_text: 2 pieces for 3 special_ids"));
    r->special_text.n = sizeof text - 1;
    sp[2] = 1;   /* ids ascend */
    assert_int_not_equal(tp_proto_encode(&m, &w, &e), 0);
    assert_non_null(strstr(e.msg, "special_ids[2]: 1 after 1"));
}

/* A vocabulary's special tokens are bounded by the vocabulary, not by a
 * header: 6000 of them (Gemma 3 has about as many) round trip in READY. */
static void ready_carries_thousands_of_special_tokens(void **state)
{
    (void)state;
    enum { N = 6000 };
    static int32_t ids[N];
    static char text[N * 16];
    size_t len = 0;
    for (int i = 0; i < N; i++) {
        ids[i] = 32000 + i;
        int n = snprintf(text + len + 1, sizeof text - len - 1, "<unused%d>", i);
        text[len] = (char)n;
        len += 1 + (size_t)n;
    }
    tp_msg m, d;
    tp_wire w;
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_READY);
    tp_m_ready *r = &m.ready;
    r->stages = TP_STAGE_TOKENIZE, r->instance = tp_str_of("tokenize.0"), r->capacity = 4;
    r->model_id = tp_str_of("m"), r->vocab_size = 32000 + N, r->bos_id = 1, r->eos_id = 2;
    r->special_ids = (tp_raw){ids, N}, r->special_text = (tp_raw){text, len};
    round_trip(&m, &w, &d);
    static tp_str got[N];
    assert_int_equal(d.ready.special_ids.n, N);
    assert_int_equal(tp_proto_special_split(d.ready.special_ids, d.ready.special_text, got, NULL), 0);
    assert_true(str_is(got[N - 1], "<unused5999>"));
    assert_int_equal(tp_raw_i32(d.ready.special_ids, N - 1), 32000 + N - 1);
    tp_msg_clear(&d);
    tp_wire_free(&w);
}

static void ready_carries_eog_ids_special_tokens_template_and_weight_type(void **state)
{
    (void)state;
    int32_t eog[] = {2};
    int32_t sp[] = {1};
    tp_msg m, d;
    tp_wire w;
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_READY);
    tp_m_ready *r = &m.ready;
    r->stages = TP_STAGE_FORWARD, r->instance = tp_str_of("forward.0"), r->capacity = 4;
    r->model_id = tp_str_of("m"), r->bos_id = 1, r->eos_id = 2;
    r->eog_ids = eog, r->n_eog_ids = 1, r->special_ids = (tp_raw){sp, 1}, r->special_text = (tp_raw){"\3<s>", 4};
    r->chat_template = true, r->weight_type = tp_str_of("q8_0");
    round_trip(&m, &w, &d);
    assert_int_equal(d.ready.eog_ids[0], 2);
    assert_true(d.ready.chat_template);
    assert_true(str_is(d.ready.weight_type, "q8_0"));
    tp_msg_clear(&d);
    tp_wire_free(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(new_params_out_of_range_name_the_field),
        cmocka_unit_test(submit_round_trips_logprobs_bias_typical_and_truncation),
        cmocka_unit_test(ack_and_finish_carry_a_seed_of_zero_and_the_context_counts),
        cmocka_unit_test(token_event_carries_logprob_frames_checked_against_top_n),
        cmocka_unit_test(sampled_step_result_and_stop_step_carry_the_logprob_columns),
        cmocka_unit_test(status_reply_carries_logprob_rows_of_its_tokens),
        cmocka_unit_test(info_and_its_reply_round_trip_with_model_and_limits),
        cmocka_unit_test(ready_carries_eog_ids_special_tokens_template_and_weight_type),
        cmocka_unit_test(ready_carries_thousands_of_special_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
