/* protocol: every message round-trips; every kind of malformed input is
 * rejected with the right status and a message naming the field. Malformed
 * headers are built with msgpack-c's packer directly, independent of the
 * codec under test. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <math.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/protocol.h"
#include "support/proto_check.h"

/* ---- helpers ---- */

#define assert_str(s, want)                                                                       \
    do {                                                                                          \
        if (!str_is((s), (want)))                                                                 \
            fail_msg("%s is '%.*s', expected '%s'", #s, (int)(s).len, (s).ptr ? (s).ptr : "", want); \
    } while (0)

/* A hand-built message: magic, command, header, payload frames. */
typedef struct raw_msg {
    tp_frame f[20];
    size_t n;
    msgpack_sbuffer sb;
    msgpack_packer pk;
} raw_msg;

static void raw_begin(raw_msg *r, const char *magic, uint8_t cmd)
{
    static uint8_t cmds[256];
    for (int i = 0; i < 256; i++)
        cmds[i] = (uint8_t)i;
    memset(r, 0, sizeof *r);
    msgpack_sbuffer_init(&r->sb);
    msgpack_packer_init(&r->pk, &r->sb, msgpack_sbuffer_write);
    r->f[r->n++] = (tp_frame){magic, strlen(magic)};
    r->f[r->n++] = (tp_frame){&cmds[cmd], 1};
}

/* Close the header (whatever was packed into r->pk) and append payloads. */
static void raw_header_done(raw_msg *r)
{
    r->f[r->n++] = (tp_frame){r->sb.data, r->sb.size};
}

static void raw_free(raw_msg *r)
{
    msgpack_sbuffer_destroy(&r->sb);
}

static void pk_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str_with_body(pk, s, strlen(s));
}

/* Decode and expect failure with status and a message containing needle. */
static void expect_reject(tp_family fam, const tp_frame *f, size_t n, uint32_t status, const char *needle)
{
    tp_msg m;
    tp_err e = {0};
    int rc = tp_proto_decode(fam, f, n, &m, &e);
    if (rc == 0)
        fail_msg("decode accepted a message that should fail with '%s'", needle);
    if (m.status != status)
        fail_msg("status %u, expected %u (error: %s)", m.status, status, e.msg);
    if (!strstr(e.msg, needle))
        fail_msg("error '%s' does not mention '%s'", e.msg, needle);
    tp_msg_clear(&m);
}

/* A SUBMIT header {job_id, prompt, params: {key: <packed by fn>}}. */
static void submit_with_param(raw_msg *r, const char *key, void (*pack_val)(msgpack_packer *))
{
    raw_begin(r, TP_MAGIC_JOB, TP_CMD_SUBMIT);
    msgpack_pack_map(&r->pk, 4);
    pk_str(&r->pk, "req");
    msgpack_pack_uint64(&r->pk, 77);
    pk_str(&r->pk, "job_id");
    pk_str(&r->pk, "j1");
    pk_str(&r->pk, "prompt");
    pk_str(&r->pk, "hi");
    pk_str(&r->pk, "params");
    msgpack_pack_map(&r->pk, 1);
    pk_str(&r->pk, key);
    pack_val(&r->pk);
    raw_header_done(r);
}

/* ---- JOB1 round trips ---- */

static void submit_text_round_trips_every_param(void **state)
{
    (void)state;
    tp_str stops[] = {tp_str_of("\n\n"), tp_str_of("The end"), tp_str_of("é")};
    int32_t ids[] = {2, 13, 31999};
    tp_msg m;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_SUBMIT);
    m.req = 9;
    m.submit.job_id = tp_str_of("job-1.a:b_c");
    m.submit.prompt = tp_str_of("Once upon a time");
    tp_params *p = &m.submit.params;
    p->set = TP_P_MAX_TOKENS | TP_P_MIN_TOKENS | TP_P_TEMPERATURE | TP_P_TOP_P | TP_P_TOP_K | TP_P_MIN_P |
             TP_P_REPETITION_PENALTY | TP_P_PRESENCE_PENALTY | TP_P_FREQUENCY_PENALTY | TP_P_SEED | TP_P_STOP |
             TP_P_STOP_TOKEN_IDS | TP_P_IGNORE_EOS | TP_P_INCLUDE_STOP;
    p->max_tokens = 100, p->min_tokens = 3, p->temperature = 0.7, p->top_p = 0.9, p->top_k = 40;
    p->min_p = 0.05, p->repetition_penalty = 1.1, p->presence_penalty = -0.5, p->frequency_penalty = 2;
    p->seed = UINT64_MAX, p->stop = stops, p->n_stop = 3, p->stop_token_ids = ids, p->n_stop_token_ids = 3;
    p->ignore_eos = true, p->include_stop_str_in_output = true;
    tp_wire w;
    tp_msg d;
    round_trip(&m, &w, &d);
    assert_int_equal(w.n, 3);
    assert_int_equal(d.req, 9);
    assert_str(d.submit.job_id, "job-1.a:b_c");
    assert_str(d.submit.prompt, "Once upon a time");
    assert_null(d.submit.prompt_ids.data);
    const tp_params *q = &d.submit.params;
    assert_int_equal(q->set, p->set);
    assert_int_equal(q->max_tokens, 100);
    assert_int_equal(q->min_tokens, 3);
    assert_true(q->temperature == 0.7 && q->top_p == 0.9 && q->min_p == 0.05);
    assert_true(q->repetition_penalty == 1.1 && q->presence_penalty == -0.5 && q->frequency_penalty == 2);
    assert_int_equal(q->top_k, 40);
    assert_true(q->seed == UINT64_MAX);
    assert_int_equal(q->n_stop, 3);
    assert_str(q->stop[0], "\n\n");
    assert_str(q->stop[1], "The end");
    assert_str(q->stop[2], "é");
    assert_int_equal(q->n_stop_token_ids, 3);
    assert_int_equal(q->stop_token_ids[2], 31999);
    assert_true(q->ignore_eos && q->include_stop_str_in_output);
    tp_msg_clear(&d);
    tp_wire_free(&w);
}

static void submit_unset_params_are_not_sent(void **state)
{
    (void)state;
    tp_msg m;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_SUBMIT);
    m.submit.prompt = tp_str_of("x");
    m.submit.params.set = TP_P_TOP_K;
    m.submit.params.top_k = 5;
    m.submit.params.max_tokens = 0; /* invalid, but not set: must not be sent */
    tp_wire w;
    tp_msg d;
    round_trip(&m, &w, &d);
    assert_int_equal(d.submit.params.set, TP_P_TOP_K);
    assert_null(d.submit.job_id.ptr); /* absent job id => broker assigns */
    /* Independent check with msgpack-c: the header has exactly the keys prompt and params. */
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(&u, w.f[2].data, w.f[2].len, &off), MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(u.data.type, MSGPACK_OBJECT_MAP);
    assert_int_equal(u.data.via.map.size, 2);
    assert_int_equal(u.data.via.map.ptr[1].val.via.map.size, 1);
    msgpack_unpacked_destroy(&u);
    tp_msg_clear(&d);
    tp_wire_free(&w);
}

static void absent_array_keys_decode_to_empty_arrays_not_null(void **state)
{
    (void)state;
    tp_msg m;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_SUBMIT);
    m.submit.prompt = tp_str_of("x");
    tp_wire w;
    tp_msg d;
    round_trip(&m, &w, &d);
    assert_non_null(d.submit.params.stop);
    assert_int_equal(d.submit.params.n_stop, 0);
    assert_non_null(d.submit.params.stop_token_ids);
    assert_int_equal(d.submit.params.n_stop_token_ids, 0);
    tp_msg_clear(&d);
    tp_wire_free(&w);
}

static void submit_token_ids_travel_as_raw_little_endian_frame(void **state)
{
    (void)state;
    int32_t ids[] = {1, 0x01020304, 7};
    tp_msg m;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_SUBMIT);
    m.submit.job_id = tp_str_of("ids");
    m.submit.prompt_ids = (tp_raw){ids, 3};
    tp_wire w;
    tp_msg d;
    round_trip(&m, &w, &d);
    assert_int_equal(w.n, 4);
    assert_int_equal(w.f[3].len, 12);
    const uint8_t *b = w.f[3].data;
    const uint8_t want[12] = {1, 0, 0, 0, 4, 3, 2, 1, 7, 0, 0, 0};
    assert_memory_equal(b, want, 12);
    assert_null(d.submit.prompt.ptr);
    assert_int_equal(d.submit.prompt_ids.n, 3);
    assert_int_equal(tp_raw_i32(d.submit.prompt_ids, 1), 0x01020304);
    tp_msg_clear(&d);
    tp_wire_free(&w);
}

static void decoded_strings_borrow_the_frame(void **state)
{
    (void)state;
    tp_msg m;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_CANCEL);
    m.jobref.job_id = tp_str_of("abc");
    tp_wire w;
    tp_msg d;
    round_trip(&m, &w, &d);
    const char *h = w.f[2].data;
    assert_true(d.jobref.job_id.ptr >= h && d.jobref.job_id.ptr + 3 <= h + w.f[2].len);
    tp_msg_clear(&d);
    tp_wire_free(&w);
}

static void ack_cancel_status_and_error_round_trip(void **state)
{
    (void)state;
    tp_msg m;
    tp_wire w;
    tp_msg d;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_ACK);
    m.req = 5, m.status = TP_ST_BAD_REQUEST, m.error = tp_str_of("params.top_p: 2 is outside (0, 1]");
    m.ack.job_id = tp_str_of("j"), m.ack.field = tp_str_of("params.top_p");
    round_trip(&m, &w, &d);
    assert_int_equal(d.req, 5);
    assert_int_equal(d.status, 400);
    assert_str(d.error, "params.top_p: 2 is outside (0, 1]");
    assert_str(d.ack.field, "params.top_p");
    tp_msg_clear(&d);
    tp_wire_free(&w);

    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_STATUS);
    m.jobref.job_id = tp_str_of("j-2");
    round_trip(&m, &w, &d);
    assert_str(d.jobref.job_id, "j-2");
    tp_msg_clear(&d);
    tp_wire_free(&w);

    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_ERROR);
    m.status = TP_ST_UNKNOWN_COMMAND, m.error = tp_str_of("F1: unknown command");
    round_trip(&m, &w, &d);
    assert_int_equal(d.status, 501);
    assert_null(d.ack.field.ptr);
    tp_msg_clear(&d);
    tp_wire_free(&w);
}

static void status_reply_of_finished_job_carries_result_and_tokens(void **state)
{
    (void)state;
    int32_t toks[] = {10, 20};
    tp_msg m;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_STATUS_REPLY);
    m.req = 1, m.status = 200;
    tp_m_status_reply *s = &m.status_reply;
    s->job_id = tp_str_of("j"), s->state = TP_STATE_FINISHED, s->prompt_tokens = 4, s->completion_tokens = 2;
    s->last_seq = 2, s->reason = TP_REASON_STOP_STRING;
    s->matched = (tp_matched){.kind = TP_MATCHED_STR, .str = tp_str_of("\n")};
    s->text = tp_str_of("ab"), s->timings = (tp_timings){1, 2, 3}, s->tokens = (tp_raw){toks, 2};
    tp_wire w;
    tp_msg d;
    round_trip(&m, &w, &d);
    const tp_m_status_reply *r = &d.status_reply;
    assert_int_equal(r->state, TP_STATE_FINISHED);
    assert_int_equal(r->reason, TP_REASON_STOP_STRING);
    assert_int_equal(r->matched.kind, TP_MATCHED_STR);
    assert_str(r->matched.str, "\n");
    assert_str(r->text, "ab");
    assert_int_equal(r->last_seq, 2);
    assert_int_equal(r->timings.ttft_us, 2);
    assert_int_equal(r->tokens.n, 2);
    assert_int_equal(tp_raw_i32(r->tokens, 1), 20);
    tp_msg_clear(&d);
    tp_wire_free(&w);

    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_STATUS_REPLY);
    m.status = 404, m.status_reply.job_id = tp_str_of("gone"), m.status_reply.last_seq = -1;
    round_trip(&m, &w, &d);
    assert_int_equal(d.status_reply.state, TP_STATE_UNKNOWN);
    assert_int_equal(d.status_reply.last_seq, -1);
    assert_null(d.status_reply.tokens.data);
    tp_msg_clear(&d);
    tp_wire_free(&w);
}

static void status_reply_of_running_job_carries_text_and_tokens_so_far(void **state)
{
    (void)state;
    int32_t toks[] = {7, 8, 9};
    tp_msg m;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_STATUS_REPLY);
    m.status = 200;
    tp_m_status_reply *s = &m.status_reply;
    s->job_id = tp_str_of("r"), s->state = TP_STATE_RUNNING, s->completion_tokens = 3, s->last_seq = 2;
    s->text = tp_str_of("abc"), s->text_len = 3, s->tokens = (tp_raw){toks, 3};
    tp_wire w;
    tp_msg d;
    round_trip(&m, &w, &d);
    assert_int_equal(d.status_reply.state, TP_STATE_RUNNING);
    assert_str(d.status_reply.text, "abc");
    assert_int_equal(d.status_reply.text_len, 3);
    assert_int_equal(d.status_reply.tokens.n, 3);
    assert_int_equal(tp_raw_i32(d.status_reply.tokens, 2), 9);
    assert_int_equal(d.status_reply.reason, TP_REASON_NONE);
    tp_msg_clear(&d);
    tp_wire_free(&w);

    /* a queued job: empty text, an empty tokens frame */
    s->state = TP_STATE_QUEUED, s->completion_tokens = 0, s->last_seq = -1;
    s->text = tp_str_of(""), s->text_len = 0, s->tokens = (tp_raw){toks, 0};
    round_trip(&m, &w, &d);
    assert_non_null(d.status_reply.tokens.data);
    assert_int_equal(d.status_reply.tokens.n, 0);
    tp_msg_clear(&d);
    tp_wire_free(&w);

    /* an unknown job has no result to carry */
    m.status = 404, s->state = TP_STATE_UNKNOWN;
    tp_err e;
    assert_int_not_equal(tp_proto_encode(&m, &w, &e), 0);
    if (!strstr(e.msg, "tokens"))
        fail_msg("error does not name the tokens frame: %s", e.msg);
}

static void heartbeat_event_travels_on_its_own_topic(void **state)
{
    (void)state;
    tp_msg m, d;
    tp_msg_init(&m, TP_FAM_EVT, TP_CMD_HEARTBEAT);
    m.beat = (tp_m_beat){.incarnation = 0xfeedfacecafebeefull, .uptime_ms = 1234, .interval_ms = 1000, .liveness = 3};
    tp_wire w;
    round_trip(&m, &w, &d);
    assert_int_equal(w.f[0].len, strlen(TP_EVT_HEARTBEAT_TOPIC));
    assert_memory_equal(w.f[0].data, TP_EVT_HEARTBEAT_TOPIC, w.f[0].len);
    assert_true(d.beat.incarnation == 0xfeedfacecafebeefull);
    assert_int_equal(d.beat.uptime_ms, 1234);
    assert_int_equal(d.beat.interval_ms, 1000);
    assert_int_equal(d.beat.liveness, 3);
    /* no job id can be the topic, and the topic must be exactly it */
    assert_false(tp_job_id_valid(TP_EVT_HEARTBEAT_TOPIC, strlen(TP_EVT_HEARTBEAT_TOPIC)));
    tp_frame f[4] = {{"job-1", 5}, w.f[1], w.f[2], w.f[3]};
    expect_reject(TP_FAM_EVT, f, 4, TP_ST_BAD_REQUEST, "topic");
    tp_msg_clear(&d);
    tp_wire_free(&w);
}

static void stats_reply_round_trips_counters_and_triggers(void **state)
{
    (void)state;
    tp_trigger trig[] = {
        {.key = {.kind = TP_MATCHED_STR, .str = tp_str_of("The end")}, .count = 4, .truncated = true},
        {.key = {.kind = TP_MATCHED_ID, .id = 2}, .count = 9},
    };
    tp_msg m;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_STATS_REPLY);
    m.status = 200;
    tp_m_stats_reply *s = &m.stats_reply;
    s->jobs_submitted = 12, s->malformed_front = 3, s->workers[1] = 2, s->finish[TP_REASON_EOS] = 9;
    s->finish[TP_REASON_STOP_STRING] = 4, s->triggers = trig, s->n_triggers = 2, s->triggers_other = 1;
    tp_wire w;
    tp_msg d;
    round_trip(&m, &w, &d);
    const tp_m_stats_reply *r = &d.stats_reply;
    assert_int_equal(r->jobs_submitted, 12);
    assert_int_equal(r->malformed_front, 3);
    assert_int_equal(r->workers[1], 2);
    assert_int_equal(r->finish[TP_REASON_EOS], 9);
    assert_int_equal(r->finish[TP_REASON_STOP_STRING], 4);
    assert_int_equal(r->n_triggers, 2);
    assert_str(r->triggers[0].key.str, "The end");
    assert_true(r->triggers[0].truncated);
    assert_int_equal(r->triggers[1].key.kind, TP_MATCHED_ID);
    assert_int_equal(r->triggers[1].key.id, 2);
    assert_int_equal(r->triggers[1].count, 9);
    assert_int_equal(r->triggers_other, 1);
    tp_msg_clear(&d);
    tp_wire_free(&w);
}

static void stats_reply_round_trips_histograms_and_refuses_inconsistent_ones(void **state)
{
    (void)state;
    uint64_t bounds[] = {100, 1000, 10000}, buckets[] = {1, 0, 2, 5};
    tp_msg m;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_STATS_REPLY);
    m.status = 200;
    tp_m_stats_reply *s = &m.stats_reply;
    s->jobs_running = 3, s->jobs_waiting = 1, s->kv_slots_used = 3, s->kv_slots_total = 64;
    s->hist[TP_HIST_ITL] = (tp_hist){.count = 8, .sum_us = 123456, .bounds_us = bounds, .n_bounds = 3,
                                     .buckets = buckets, .n_buckets = 4};
    tp_wire w;
    tp_msg d;
    round_trip(&m, &w, &d);
    const tp_hist *h = &d.stats_reply.hist[TP_HIST_ITL];
    assert_int_equal(d.stats_reply.jobs_running, 3);
    assert_int_equal(d.stats_reply.kv_slots_total, 64);
    assert_int_equal(h->count, 8);
    assert_int_equal(h->sum_us, 123456);
    assert_int_equal(h->n_bounds, 3);
    assert_int_equal(h->n_buckets, 4);
    assert_int_equal(h->bounds_us[2], 10000);
    assert_int_equal(h->buckets[3], 5);
    assert_int_equal(d.stats_reply.hist[TP_HIST_TTFT].n_buckets, 0);
    tp_msg_clear(&d);
    tp_wire_free(&w);
    /* buckets must be bounds + 1 and add up to count: a reader would
     * otherwise render a histogram Prometheus rejects */
    tp_err e;
    s->hist[TP_HIST_ITL].n_buckets = 3;
    assert_int_not_equal(tp_proto_encode(&m, &w, &e), 0);
    assert_non_null(strstr(e.msg, "histograms.itl_us.buckets"));
    s->hist[TP_HIST_ITL].n_buckets = 4;
    s->hist[TP_HIST_ITL].count = 9;
    assert_int_not_equal(tp_proto_encode(&m, &w, &e), 0);
    assert_non_null(strstr(e.msg, "histograms.itl_us.count"));
}

/* ---- EVT1 ---- */

static void token_event_has_job_id_topic_and_raw_ids(void **state)
{
    (void)state;
    int32_t ids[] = {345};
    tp_msg m;
    tp_msg_init(&m, TP_FAM_EVT, TP_CMD_TOKEN);
    m.token = (tp_m_token){.job_id = tp_str_of("j7"), .seq = 3, .index = 2, .text = tp_str_of(" dog"),
                           .ids = {ids, 1}};
    tp_wire w;
    tp_msg d;
    round_trip(&m, &w, &d);
    assert_int_equal(w.n, 5);
    assert_int_equal(w.f[0].len, 2);
    assert_memory_equal(w.f[0].data, "j7", 2);
    assert_memory_equal(w.f[1].data, "EVT1", 4);
    assert_str(d.topic, "j7");
    assert_int_equal(d.token.seq, 3);
    assert_int_equal(d.token.index, 2);
    assert_str(d.token.text, " dog");
    assert_int_equal(tp_raw_i32(d.token.ids, 0), 345);
    tp_msg_clear(&d);
    tp_wire_free(&w);
}

/* Does the header (frame 2 of w, or 3 with a topic) hold key? Read with
 * msgpack-c, not the codec under test. */
static bool header_has_key(const tp_wire *w, size_t frame, const char *key)
{
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    bool have = false;
    if (msgpack_unpack_next(&u, w->f[frame].data, w->f[frame].len, &off) == MSGPACK_UNPACK_SUCCESS &&
        u.data.type == MSGPACK_OBJECT_MAP)
        for (uint32_t i = 0; i < u.data.via.map.size; i++) {
            const msgpack_object *k = &u.data.via.map.ptr[i].key;
            have |= k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(key) &&
                    !memcmp(k->via.str.ptr, key, k->via.str.size);
        }
    msgpack_unpacked_destroy(&u);
    return have;
}

/* PROTOCOL.md: top_n is present (0-20) whenever the job asked for logprobs,
 * top_logprobs 0 included; a job without logprobs has neither. */
static void top_n_is_sent_whenever_logprob_frames_are_even_zero(void **state)
{
    (void)state;
    int32_t ids[] = {345};
    float lp = -0.5f;
    tp_msg m;
    tp_msg_init(&m, TP_FAM_EVT, TP_CMD_TOKEN);
    m.token = (tp_m_token){.job_id = tp_str_of("j7"), .seq = 0, .text = tp_str_of(" dog"), .ids = {ids, 1}};
    m.token.lp = (tp_lp_cols){0, {&lp, 1}, {ids, 0}, {&lp, 0}};
    tp_wire w;
    tp_msg d;
    round_trip(&m, &w, &d);
    if (!header_has_key(&w, 3, "top_n"))
        fail_msg("TOKEN with logprob frames and top_n 0 has no top_n key");
    assert_int_equal(d.token.lp.top_n, 0);
    assert_non_null(d.token.lp.logprobs.data);
    tp_msg_clear(&d);
    tp_wire_free(&w);

    m.token.lp = (tp_lp_cols){0};
    round_trip(&m, &w, &d);
    if (header_has_key(&w, 3, "top_n"))
        fail_msg("TOKEN without logprobs has a top_n key");
    tp_msg_clear(&d);
    tp_wire_free(&w);

    int32_t toks[] = {10};
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_STATUS_REPLY);
    m.req = 1, m.status = 200;
    tp_m_status_reply *s = &m.status_reply;
    s->job_id = tp_str_of("j"), s->state = TP_STATE_RUNNING, s->prompt_tokens = 4, s->completion_tokens = 1;
    s->last_seq = 0, s->tokens = (tp_raw){toks, 1}, s->text = tp_str_of("a");
    s->lp = (tp_lp_cols){0, {&lp, 1}, {toks, 0}, {&lp, 0}};
    round_trip(&m, &w, &d);
    if (!header_has_key(&w, 2, "top_n"))
        fail_msg("STATUS_REPLY with logprob frames and top_n 0 has no top_n key");
    assert_non_null(d.status_reply.lp.logprobs.data);
    tp_msg_clear(&d);
    tp_wire_free(&w);
}

/* PROTOCOL.md: every reply carries req ("copied from the request"; ERROR's
 * "req is 0 if it could not be read"), so a client may read reply["req"]
 * without a default; it is not an "opt" key. */
static void replies_carry_req_even_when_zero(void **state)
{
    (void)state;
    static const int cmds[] = {TP_CMD_ACK, TP_CMD_ERROR, TP_CMD_STATUS_REPLY, TP_CMD_STATS_REPLY,
                               TP_CMD_INFO_REPLY};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        tp_msg m;
        tp_msg_init(&m, TP_FAM_JOB, cmds[i]);
        m.req = 0, m.status = cmds[i] == TP_CMD_ERROR ? 400 : 200;
        m.error = tp_str_of("x: bad");
        m.ack.job_id = tp_str_of("j");
        if (cmds[i] == TP_CMD_STATUS_REPLY)
            m.status_reply = (tp_m_status_reply){.job_id = tp_str_of("j"), .state = TP_STATE_QUEUED, .last_seq = -1};
        if (cmds[i] == TP_CMD_INFO_REPLY)
            m.info_reply = (tp_m_info_reply){.model_id = tp_str_of("m"), .bos_id = -1, .eos_id = -1};
        tp_wire w;
        tp_msg d;
        round_trip(&m, &w, &d);
        if (!header_has_key(&w, 2, "req"))
            fail_msg("reply 0x%02x with req 0 has no req key", cmds[i]);
        assert_int_equal(d.req, 0);
        tp_msg_clear(&d);
        tp_wire_free(&w);
    }
}

/* PROTOCOL.md STATUS_REPLY: reason, matched (nil for length/eos-less
 * finishes) and the three timings are there for a finished job, 0 and nil
 * included, so a client can compare STATUS with FINISH key by key; a running
 * job has none of them. */
static void status_reply_of_a_finished_job_has_matched_nil_and_every_timing(void **state)
{
    (void)state;
    static const char *finished_keys[] = {"reason", "matched", "queue_us", "ttft_us", "total_us"};
    int32_t none[1];
    for (int finished = 0; finished < 2; finished++) {
        tp_msg m;
        tp_msg_init(&m, TP_FAM_JOB, TP_CMD_STATUS_REPLY);
        m.req = 1, m.status = 200;
        m.status_reply = (tp_m_status_reply){.job_id = tp_str_of("j"), .last_seq = 0, .text = tp_str_of(""),
                                             .tokens = {none, 0}, .state = finished ? TP_STATE_FINISHED : TP_STATE_RUNNING};
        if (finished)
            m.status_reply.reason = TP_REASON_STOP_STRING, m.status_reply.timings.total_us = 9;
        tp_wire w;
        tp_msg d;
        round_trip(&m, &w, &d);
        for (size_t k = 0; k < sizeof finished_keys / sizeof finished_keys[0]; k++)
            if (header_has_key(&w, 2, finished_keys[k]) != (finished == 1))
                fail_msg("STATUS_REPLY (%s) %s %s", finished ? "finished" : "running",
                         finished ? "lacks" : "has", finished_keys[k]);
        assert_int_equal(d.status_reply.matched.kind, TP_MATCHED_NONE);
        tp_msg_clear(&d);
        tp_wire_free(&w);
    }
}

static void finish_event_round_trips_reason_matched_counts_timings(void **state)
{
    (void)state;
    tp_msg m;
    tp_msg_init(&m, TP_FAM_EVT, TP_CMD_FINISH);
    m.finish = (tp_m_finish){.job_id = tp_str_of("j7"), .seq = 4, .reason = TP_REASON_EOS,
                             .matched = {.kind = TP_MATCHED_ID, .id = 2}, .text = tp_str_of("!"),
                             .prompt_tokens = 5, .completion_tokens = 3, .text_len = 12,
                             .timings = {100, 200, 300}};
    tp_wire w;
    tp_msg d;
    round_trip(&m, &w, &d);
    assert_int_equal(w.n, 4);
    const tp_m_finish *f = &d.finish;
    assert_int_equal(f->reason, TP_REASON_EOS);
    assert_int_equal(f->matched.id, 2);
    assert_str(f->text, "!");
    assert_int_equal(f->completion_tokens, 3);
    assert_int_equal(f->text_len, 12);
    assert_int_equal(f->timings.total_us, 300);
    assert_null(f->job_error.ptr);
    tp_msg_clear(&d);
    tp_wire_free(&w);

    m.finish.reason = TP_REASON_LENGTH, m.finish.matched.kind = TP_MATCHED_NONE;
    round_trip(&m, &w, &d);
    assert_int_equal(d.finish.matched.kind, TP_MATCHED_NONE);
    tp_msg_clear(&d);
    tp_wire_free(&w);
}

/* ---- WRK1 ---- */

static void worker_control_messages_round_trip(void **state)
{
    (void)state;
    tp_msg m;
    tp_wire w;
    tp_msg d;
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_READY);
    m.ready = (tp_m_ready){.stages = TP_STAGE_SAMPLE | TP_STAGE_STOP, .instance = tp_str_of("stop.0"),
                           .incarnation = 0xdeadbeefcafeull, .capacity = 64, .heartbeat_ms = 1000,
                           .model_id = tp_str_of("stories260K.bin"), .vocab_size = 512, .bos_id = 1, .eos_id = 2,
                           .seq_len = 512, .max_batch_tokens = 256};
    round_trip(&m, &w, &d);
    assert_int_equal(d.ready.stages, TP_STAGE_SAMPLE | TP_STAGE_STOP);
    assert_str(d.ready.instance, "stop.0");
    assert_true(d.ready.incarnation == 0xdeadbeefcafeull);
    assert_int_equal(d.ready.vocab_size, 512);
    assert_int_equal(d.ready.eos_id, 2);
    tp_msg_clear(&d);
    tp_wire_free(&w);

    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_WELCOME);
    m.welcome = (tp_m_welcome){7, 500, 3, 4};
    round_trip(&m, &w, &d);
    assert_int_equal(d.welcome.liveness, 3);
    assert_int_equal(d.welcome.worker_no, 4);
    tp_msg_clear(&d);
    tp_wire_free(&w);

    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_HEARTBEAT);
    round_trip(&m, &w, &d); /* every key optional: an empty map */
    assert_int_equal(w.f[2].len, 1);
    tp_msg_clear(&d);
    tp_wire_free(&w);

    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_DISCONNECT);
    m.disconnect.reason = tp_str_of("bye");
    round_trip(&m, &w, &d);
    assert_str(d.disconnect.reason, "bye");
    tp_msg_clear(&d);
    tp_wire_free(&w);

    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_RESULT);
    m.task = 11, m.status = 404, m.error = tp_str_of("slot 3: not open");
    round_trip(&m, &w, &d);
    assert_int_equal(d.task, 11);
    assert_str(d.error, "slot 3: not open");
    tp_msg_clear(&d);
    tp_wire_free(&w);
}

static void tokenize_and_open_close_round_trip(void **state)
{
    (void)state;
    int32_t ids[] = {1, 403};
    tp_msg m;
    tp_wire w;
    tp_msg d;
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_TOKENIZE);
    m.task = 1, m.tokenize = (tp_m_tokenize){.slot = 3, .text = tp_str_of("Hello"), .add_bos = true};
    round_trip(&m, &w, &d);
    assert_int_equal(d.tokenize.slot, 3);
    assert_true(d.tokenize.add_bos);
    tp_msg_clear(&d);
    tp_wire_free(&w);

    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_TOKENIZED);
    m.task = 1, m.status = 200, m.tokenized = (tp_m_tokenized){.slot = 3, .ids = {ids, 2}};
    round_trip(&m, &w, &d);
    assert_int_equal(tp_raw_i32(d.tokenized.ids, 1), 403);
    tp_msg_clear(&d);
    tp_wire_free(&w);

    uint8_t cmds[] = {TP_CMD_SEQ_OPEN, TP_CMD_SEQ_CLOSE, TP_CMD_SAMPLE_CLOSE};
    for (int i = 0; i < 3; i++) {
        tp_msg_init(&m, TP_FAM_WRK, cmds[i]);
        m.task = 100 + (uint64_t)i, m.slot.slot = 42;
        round_trip(&m, &w, &d);
        assert_int_equal(d.slot.slot, 42);
        assert_int_equal(d.task, 100 + i);
        tp_msg_clear(&d);
        tp_wire_free(&w);
    }
}

static void step_and_step_result_round_trip(void **state)
{
    (void)state;
    uint32_t slots[] = {4, 9}, pos[] = {0, 17}, ntok[] = {3, 1};
    uint8_t flags[] = {TP_ITEM_OUTPUT, TP_ITEM_OUTPUT};
    int32_t tokens[] = {1, 50, 60, 70}, accepted[] = {-1, 70};
    tp_msg m;
    tp_wire w;
    tp_msg d;
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_STEP);
    m.task = 3;
    m.step = (tp_m_step){.step = 99, .n = 2, .n_tokens = 4, .slots = {slots, 2}, .pos = {pos, 2},
                         .ntok = {ntok, 2}, .flags = {flags, 2}, .tokens = {tokens, 4}, .accepted = {accepted, 2}};
    round_trip(&m, &w, &d);
    assert_int_equal(w.n, 9);
    assert_int_equal(d.step.step, 99);
    assert_int_equal(tp_raw_u32(d.step.pos, 1), 17);
    assert_int_equal(tp_raw_i32(d.step.tokens, 3), 70);
    assert_int_equal(tp_raw_i32(d.step.accepted, 0), -1);
    assert_int_equal(tp_raw_u8(d.step.flags, 1), TP_ITEM_OUTPUT);
    tp_msg_clear(&d);
    tp_wire_free(&w);

    float logits[6] = {0.5f, -1, 3, 4, 5, 6e-30f};
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_STEP_RESULT);
    m.task = 3, m.status = 200;
    m.step_result = (tp_m_step_result){.step = 99, .n = 2, .vocab = 3, .slots = {slots, 2}, .out = {logits, 6}};
    round_trip(&m, &w, &d);
    assert_int_equal(w.f[4].len, 24);
    assert_true(tp_raw_f32(d.step_result.out, 5) == 6e-30f);
    tp_msg_clear(&d);
    tp_wire_free(&w);

    int32_t cands[] = {7, 8};
    m.step_result = (tp_m_step_result){.step = 99, .n = 2, .sampled = true, .slots = {slots, 2}, .out = {cands, 2}};
    round_trip(&m, &w, &d);
    assert_true(d.step_result.sampled);
    assert_int_equal(tp_raw_i32(d.step_result.out, 1), 8);
    tp_msg_clear(&d);
    tp_wire_free(&w);

    /* A failed step: no payload. */
    m.status = 500, m.error = tp_str_of("forward: KV pool full");
    m.step_result = (tp_m_step_result){.step = 99};
    round_trip(&m, &w, &d);
    assert_int_equal(w.n, 3);
    assert_null(d.step_result.slots.data);
    tp_msg_clear(&d);
    tp_wire_free(&w);
}

static void sample_messages_round_trip(void **state)
{
    (void)state;
    int32_t ban[] = {2, 13}, ctx[] = {1, 5, 6};
    tp_msg m;
    tp_wire w;
    tp_msg d;
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_SAMPLE_OPEN);
    m.task = 1;
    m.sample_open.slot = 2;
    m.sample_open.params.set = TP_P_TEMPERATURE | TP_P_SEED | TP_P_MIN_TOKENS;
    m.sample_open.params.temperature = 0, m.sample_open.params.seed = 42, m.sample_open.params.min_tokens = 4;
    m.sample_open.ban_ids = ban, m.sample_open.n_ban_ids = 2, m.sample_open.context = (tp_raw){ctx, 3};
    round_trip(&m, &w, &d);
    assert_int_equal(d.sample_open.params.seed, 42);
    assert_int_equal(d.sample_open.params.min_tokens, 4);
    assert_true(d.sample_open.params.set & TP_P_TEMPERATURE);
    assert_int_equal(d.sample_open.n_ban_ids, 2);
    assert_int_equal(d.sample_open.ban_ids[1], 13);
    assert_int_equal(d.sample_open.context.n, 3);
    tp_msg_clear(&d);
    tp_wire_free(&w);

    uint32_t slots[] = {2}, index[] = {0};
    int32_t acc[] = {-1};
    float logits[4] = {1, 2, 3, 4};
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_SAMPLE);
    m.task = 2;
    m.sample = (tp_m_sample){.step = 5, .n = 1, .vocab = 4, .slots = {slots, 1}, .index = {index, 1},
                             .accepted = {acc, 1}, .logits = {logits, 4}};
    round_trip(&m, &w, &d);
    assert_true(tp_raw_f32(d.sample.logits, 3) == 4.0f);
    tp_msg_clear(&d);
    tp_wire_free(&w);

    int32_t cand[] = {3};
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_SAMPLED);
    m.task = 2, m.status = 200;
    m.sampled = (tp_m_sampled){.step = 5, .n = 1, .slots = {slots, 1}, .candidates = {cand, 1}};
    round_trip(&m, &w, &d);
    assert_int_equal(tp_raw_i32(d.sampled.candidates, 0), 3);
    tp_msg_clear(&d);
    tp_wire_free(&w);
}

static void stop_messages_round_trip(void **state)
{
    (void)state;
    tp_str stops[] = {tp_str_of("\n")};
    int32_t replay[] = {5, 6};
    tp_msg m;
    tp_wire w;
    tp_msg d;
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_STOP_OPEN);
    m.task = 1;
    tp_m_stop_open *o = &m.stop_open;
    o->slot = 8, o->job_id = tp_str_of("j8"), o->prompt_tokens = 6, o->prev_token = 1, o->next_seq = 2;
    o->t_submit_us = 1700000000000000ull, o->t_start_us = 1700000000000100ull, o->replay = (tp_raw){replay, 2};
    o->params.set = TP_P_STOP | TP_P_MAX_TOKENS | TP_P_INCLUDE_STOP;
    o->params.stop = stops, o->params.n_stop = 1, o->params.max_tokens = 10;
    o->params.include_stop_str_in_output = true;
    round_trip(&m, &w, &d);
    assert_str(d.stop_open.job_id, "j8");
    assert_int_equal(d.stop_open.prev_token, 1);
    assert_int_equal(d.stop_open.next_seq, 2);
    assert_true(d.stop_open.t_start_us == 1700000000000100ull);
    assert_str(d.stop_open.params.stop[0], "\n");
    assert_int_equal(tp_raw_i32(d.stop_open.replay, 1), 6);
    tp_msg_clear(&d);
    tp_wire_free(&w);

    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_STOP_CLOSE);
    m.task = 2, m.stop_close = (tp_m_stop_close){.slot = 8, .finish = TP_REASON_CANCELLED};
    round_trip(&m, &w, &d);
    assert_int_equal(d.stop_close.finish, TP_REASON_CANCELLED);
    tp_msg_clear(&d);
    tp_wire_free(&w);

    uint32_t slots[] = {8, 9};
    int32_t cands[] = {13, 2};
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_STOP_STEP);
    m.task = 3, m.stop_step = (tp_m_stop_step){.step = 1, .n = 2, .slots = {slots, 2}, .candidates = {cands, 2}};
    round_trip(&m, &w, &d);
    assert_int_equal(tp_raw_u32(d.stop_step.slots, 1), 9);
    tp_msg_clear(&d);
    tp_wire_free(&w);

    uint8_t acc[] = {1, 0}, fin[] = {TP_REASON_NONE, TP_REASON_EOS};
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_VERDICTS);
    m.task = 3, m.status = 200;
    m.verdicts = (tp_m_verdicts){.step = 1, .n = 2, .slots = {slots, 2}, .accepted = {acc, 2}, .finish = {fin, 2}};
    round_trip(&m, &w, &d);
    assert_int_equal(tp_raw_u8(d.verdicts.finish, 1), TP_REASON_EOS);
    assert_int_equal(tp_raw_u8(d.verdicts.accepted, 0), 1);
    tp_msg_clear(&d);
    tp_wire_free(&w);
}

/* ---- malformed: frames ---- */

static void bad_magic_or_version_is_505(void **state)
{
    (void)state;
    raw_msg r;
    raw_begin(&r, "JOB2", TP_CMD_STATS);
    msgpack_pack_map(&r.pk, 0);
    raw_header_done(&r);
    expect_reject(TP_FAM_JOB, r.f, r.n, TP_ST_BAD_VERSION, "F0");
    r.f[0] = (tp_frame){"WRK1", 4};
    expect_reject(TP_FAM_JOB, r.f, r.n, TP_ST_BAD_VERSION, "JOB1");
    r.f[0] = (tp_frame){"JOB", 3};
    expect_reject(TP_FAM_JOB, r.f, r.n, TP_ST_BAD_VERSION, "F0");
    expect_reject(TP_FAM_JOB, r.f, 0, TP_ST_BAD_VERSION, "F0");
    raw_free(&r);
}

/* PROTOCOL.md "Rejection": F1 is one byte naming a known command (-> 501);
 * a command frame of another length names no command either. */
static void unknown_command_and_bad_command_frame_are_501(void **state)
{
    (void)state;
    raw_msg r;
    raw_begin(&r, TP_MAGIC_JOB, 0x55);
    msgpack_pack_map(&r.pk, 0);
    raw_header_done(&r);
    expect_reject(TP_FAM_JOB, r.f, r.n, TP_ST_UNKNOWN_COMMAND, "0x55");
    r.f[1] = (tp_frame){"\x06\x06", 2};
    expect_reject(TP_FAM_JOB, r.f, r.n, TP_ST_UNKNOWN_COMMAND, "F1");
    r.f[1] = (tp_frame){"", 0};
    expect_reject(TP_FAM_JOB, r.f, r.n, TP_ST_UNKNOWN_COMMAND, "F1");
    raw_free(&r);
    /* An EVT1 command byte is not a WRK1 one. */
    raw_begin(&r, TP_MAGIC_WRK, TP_CMD_TOKENIZE + 0x0e);
    msgpack_pack_map(&r.pk, 0);
    raw_header_done(&r);
    expect_reject(TP_FAM_WRK, r.f, r.n, TP_ST_UNKNOWN_COMMAND, "unknown");
    raw_free(&r);
}

/* DRAFT / DRAFTED (speculative decoding's draft stage): round trip, and
 * what validation refuses, encoding as decoding would. */
static void draft_and_drafted_round_trip_and_are_validated(void **state)
{
    (void)state;
    uint32_t slots[] = {4, 9}, pos[] = {0, 17}, ntok[] = {3, 1}, k[] = {4, 16};
    int32_t tokens[] = {1, 50, 60, 70};
    tp_msg m, d;
    tp_wire w;
    tp_err e;
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_DRAFT);
    m.task = 8;
    m.draft = (tp_m_draft){.n = 2, .n_tokens = 4, .slots = {slots, 2}, .pos = {pos, 2}, .ntok = {ntok, 2},
                           .k = {k, 2}, .tokens = {tokens, 4}};
    round_trip(&m, &w, &d);
    assert_int_equal(w.n, 8);
    assert_int_equal(tp_raw_u32(d.draft.pos, 1), 17);
    assert_int_equal(tp_raw_u32(d.draft.k, 1), 16);
    assert_int_equal(tp_raw_i32(d.draft.tokens, 3), 70);
    tp_msg_clear(&d);
    tp_wire_free(&w);
    k[1] = 17;   /* more guesses than TP_PROTO_MAX_DRAFT */
    assert_int_equal(tp_proto_encode(&m, &w, &e), TP_EINVAL);
    assert_non_null(strstr(e.msg, "k[1]"));
    k[1] = 0;
    assert_int_equal(tp_proto_encode(&m, &w, &e), TP_EINVAL);
    k[1] = 2, slots[1] = 4;   /* one job twice */
    assert_int_equal(tp_proto_encode(&m, &w, &e), TP_EINVAL);
    assert_non_null(strstr(e.msg, "twice"));
    slots[1] = 9, ntok[1] = 2;   /* counts that do not add up to the tokens */
    assert_int_equal(tp_proto_encode(&m, &w, &e), TP_EFORMAT);
    ntok[1] = 1, tokens[2] = -3;
    assert_int_equal(tp_proto_encode(&m, &w, &e), TP_EINVAL);
    assert_non_null(strstr(e.msg, "tokens[2]"));

    uint32_t ngot[] = {3, 0};
    int32_t guesses[] = {5, 6, 7};
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_DRAFTED);
    m.task = 8, m.status = 200;
    m.drafted = (tp_m_drafted){.n = 2, .slots = {slots, 2}, .ngot = {ngot, 2}, .guesses = {guesses, 3}};
    round_trip(&m, &w, &d);
    assert_int_equal(tp_raw_u32(d.drafted.ngot, 0), 3);
    assert_int_equal(tp_raw_i32(d.drafted.guesses, 2), 7);
    tp_msg_clear(&d);
    tp_wire_free(&w);
    ngot[1] = 1;   /* four guesses said, three sent */
    assert_int_equal(tp_proto_encode(&m, &w, &e), TP_EFORMAT);
    ngot[1] = 0, guesses[0] = -1;
    assert_int_equal(tp_proto_encode(&m, &w, &e), TP_EINVAL);
    /* a failed draft: no payload */
    m.status = 500, m.error = tp_str_of("draft: out of memory");
    m.drafted = (tp_m_drafted){0};
    round_trip(&m, &w, &d);
    assert_null(d.drafted.slots.data);
    tp_msg_clear(&d);
    tp_wire_free(&w);

    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_READY);   /* the draft stage in READY */
    m.ready = (tp_m_ready){.stages = TP_STAGE_DRAFT, .instance = tp_str_of("draft.0"), .capacity = 8,
                           .model_id = tp_str_of("draft.bin"), .vocab_size = 512, .seq_len = 512};
    round_trip(&m, &w, &d);
    assert_int_equal(d.ready.stages, TP_STAGE_DRAFT);
    tp_msg_clear(&d);
    tp_wire_free(&w);
}

static void missing_header_and_too_many_frames_are_rejected(void **state)
{
    (void)state;
    raw_msg r;
    raw_begin(&r, TP_MAGIC_JOB, TP_CMD_STATS);
    expect_reject(TP_FAM_JOB, r.f, 2, TP_ST_BAD_REQUEST, "frames");
    msgpack_pack_map(&r.pk, 0);
    raw_header_done(&r);
    for (int i = 0; i < 13; i++)
        r.f[r.n++] = (tp_frame){"", 0};
    expect_reject(TP_FAM_JOB, r.f, r.n, TP_ST_TOO_LARGE, "frames");
    /* STATS takes no payload at all. */
    expect_reject(TP_FAM_JOB, r.f, 4, TP_ST_BAD_REQUEST, "payload");
    raw_free(&r);
}

static void oversize_header_frame_is_413_before_parsing(void **state)
{
    (void)state;
    size_t n = TP_PROTO_MAX_HEADER + 1;
    char *big = calloc(1, n);
    assert_non_null(big);
    big[0] = (char)0xc1; /* not even msgpack: the size check must come first */
    tp_frame f[3] = {{"JOB1", 4}, {"\x06", 1}, {big, n}};
    expect_reject(TP_FAM_JOB, f, 3, TP_ST_TOO_LARGE, "header");
    free(big);
}

static void ids_frame_not_a_multiple_of_four_is_rejected(void **state)
{
    (void)state;
    raw_msg r;
    raw_begin(&r, TP_MAGIC_JOB, TP_CMD_SUBMIT);
    msgpack_pack_map(&r.pk, 1);
    pk_str(&r.pk, "job_id");
    pk_str(&r.pk, "x");
    raw_header_done(&r);
    r.f[r.n++] = (tp_frame){"\1\0\0\0\2\0\0", 7};
    expect_reject(TP_FAM_JOB, r.f, r.n, TP_ST_BAD_REQUEST, "prompt_ids: frame length 7 is not a multiple of 4");
    r.f[r.n - 1] = (tp_frame){"", 0};
    expect_reject(TP_FAM_JOB, r.f, r.n, TP_ST_BAD_REQUEST, "prompt_ids");
    r.f[r.n - 1] = (tp_frame){"\xff\xff\xff\xff", 4};
    expect_reject(TP_FAM_JOB, r.f, r.n, TP_ST_BAD_REQUEST, "prompt_ids[0]: negative");
    raw_free(&r);
}

static void submit_needs_exactly_one_prompt(void **state)
{
    (void)state;
    raw_msg r;
    raw_begin(&r, TP_MAGIC_JOB, TP_CMD_SUBMIT);
    msgpack_pack_map(&r.pk, 1);
    pk_str(&r.pk, "prompt");
    pk_str(&r.pk, "x");
    raw_header_done(&r);
    r.f[r.n++] = (tp_frame){"\1\0\0\0", 4};
    expect_reject(TP_FAM_JOB, r.f, r.n, TP_ST_BAD_REQUEST, "not both");
    raw_free(&r);
    raw_begin(&r, TP_MAGIC_JOB, TP_CMD_SUBMIT);
    msgpack_pack_map(&r.pk, 0);
    raw_header_done(&r);
    expect_reject(TP_FAM_JOB, r.f, r.n, TP_ST_BAD_REQUEST, "prompt: missing");
    raw_free(&r);
}

static void submit_messages_round_trip_and_tokenized_carries_stop_ids(void **state)
{
    (void)state;
    tp_tool_call calls[] = {{tp_str_of("call_1"), tp_str_of("get_weather"), tp_str_of("{\"city\": \"Paris\"}")},
                            {tp_str_of(""), tp_str_of("get_time"), tp_str_of("")}};
    tp_chat_msg msgs[] = {{.role = tp_str_of("system"), .content = tp_str_of("Be brief.")},
                          {.role = tp_str_of("user"), .content = tp_str_of("")},
                          {.role = tp_str_of("assistant"), .content = tp_str_of(""), .tool_calls = calls,
                           .n_tool_calls = 2},
                          {.role = tp_str_of("tool"), .content = tp_str_of("21 C"), .name = tp_str_of("get_weather"),
                           .tool_call_id = tp_str_of("call_1")}};
    tp_msg m;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_SUBMIT);
    m.submit.messages = msgs;
    m.submit.n_messages = 4;
    m.submit.tools = tp_str_of("[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}]");
    m.submit.tool_choice = tp_str_of("none");
    tp_wire w;
    tp_msg d;
    round_trip(&m, &w, &d);
    assert_int_equal(d.submit.n_messages, 4);
    assert_int_equal(d.submit.messages[2].n_tool_calls, 2);
    assert_str(d.submit.messages[2].tool_calls[0].id, "call_1");
    assert_str(d.submit.messages[2].tool_calls[0].arguments, "{\"city\": \"Paris\"}");
    assert_str(d.submit.messages[2].tool_calls[1].name, "get_time");
    assert_int_equal(d.submit.messages[2].tool_calls[1].id.len, 0);
    assert_str(d.submit.messages[3].name, "get_weather");
    assert_str(d.submit.messages[3].tool_call_id, "call_1");
    assert_null(d.submit.messages[0].name.ptr);
    assert_int_equal(d.submit.messages[0].n_tool_calls, 0);
    assert_str(d.submit.tools, "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}]");
    assert_str(d.submit.tool_choice, "none");
    assert_null(d.submit.prompt.ptr);
    assert_str(d.submit.messages[0].role, "system");
    assert_str(d.submit.messages[0].content, "Be brief.");
    assert_str(d.submit.messages[1].role, "user");
    assert_int_equal(d.submit.messages[1].content.len, 0);
    tp_msg_clear(&d);
    tp_wire_free(&w);

    int32_t stop[] = {32007};
    int32_t ids[] = {1, 32010};
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_TOKENIZED);
    m.task = 3;
    m.status = TP_ST_OK;
    m.tokenized.slot = 4;
    m.tokenized.ids = (tp_raw){ids, 2};
    m.tokenized.stop_ids = stop;
    m.tokenized.n_stop_ids = 1;
    round_trip(&m, &w, &d);
    assert_int_equal(d.tokenized.n_stop_ids, 1);
    assert_int_equal(d.tokenized.stop_ids[0], 32007);
    tp_msg_clear(&d);
    tp_wire_free(&w);
}

/* One SUBMIT whose header is {messages: <what pack writes>}. */
static void submit_messages_case(void (*pack)(msgpack_packer *), const char *needle)
{
    raw_msg r;
    raw_begin(&r, TP_MAGIC_JOB, TP_CMD_SUBMIT);
    msgpack_pack_map(&r.pk, 1);
    pk_str(&r.pk, "messages");
    pack(&r.pk);
    raw_header_done(&r);
    expect_reject(TP_FAM_JOB, r.f, r.n, TP_ST_BAD_REQUEST, needle);
    raw_free(&r);
}

static void pk_msgs_empty(msgpack_packer *pk) { msgpack_pack_array(pk, 0); }
static void pk_msgs_not_map(msgpack_packer *pk) { msgpack_pack_array(pk, 1), pk_str(pk, "user: hi"); }
static void pk_msgs_no_content(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 2);
    msgpack_pack_map(pk, 2), pk_str(pk, "role"), pk_str(pk, "user"), pk_str(pk, "content"), pk_str(pk, "a");
    msgpack_pack_map(pk, 1), pk_str(pk, "role"), pk_str(pk, "assistant");
}
static void pk_msgs_empty_role(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 2), pk_str(pk, "role"), pk_str(pk, ""), pk_str(pk, "content"), pk_str(pk, "a");
}
static void pk_msgs_extra_key(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 3), pk_str(pk, "role"), pk_str(pk, "user"), pk_str(pk, "content"), pk_str(pk, "a");
    pk_str(pk, "weight"), msgpack_pack_array(pk, 0);
}
static void pk_msgs_call_without_name(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 2), pk_str(pk, "role"), pk_str(pk, "assistant"), pk_str(pk, "tool_calls");
    msgpack_pack_array(pk, 1), msgpack_pack_map(pk, 1), pk_str(pk, "arguments"), pk_str(pk, "{}");
}
static void pk_msgs_int_content(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 2), pk_str(pk, "role"), pk_str(pk, "user"), pk_str(pk, "content"), msgpack_pack_int(pk, 3);
}

static void submit_messages_are_validated_naming_the_field(void **state)
{
    (void)state;
    submit_messages_case(pk_msgs_empty, "messages: empty conversation");
    submit_messages_case(pk_msgs_not_map, "messages[0]: expected a map");
    submit_messages_case(pk_msgs_no_content, "messages[1].content: missing");
    submit_messages_case(pk_msgs_empty_role, "messages[0].role");
    submit_messages_case(pk_msgs_extra_key, "messages[0].weight: unknown key");
    submit_messages_case(pk_msgs_call_without_name, "messages[0].tool_calls[0].name: missing");
    submit_messages_case(pk_msgs_int_content, "messages[0].content");
    /* messages and a prompt together */
    raw_msg r;
    raw_begin(&r, TP_MAGIC_JOB, TP_CMD_SUBMIT);
    msgpack_pack_map(&r.pk, 2);
    pk_str(&r.pk, "prompt");
    pk_str(&r.pk, "x");
    pk_str(&r.pk, "messages");
    msgpack_pack_array(&r.pk, 1);
    msgpack_pack_map(&r.pk, 2), pk_str(&r.pk, "role"), pk_str(&r.pk, "user"), pk_str(&r.pk, "content");
    pk_str(&r.pk, "a");
    raw_header_done(&r);
    expect_reject(TP_FAM_JOB, r.f, r.n, TP_ST_BAD_REQUEST, "messages: give either messages or a prompt");
    raw_free(&r);
}

/* Encode m and decode what came out: 0, or the first refusal (the encoder
 * checks what the decoder checks) with e saying why. */
static int encode_decode(const tp_msg *m, tp_err *e)
{
    tp_wire w;
    int rc = tp_proto_encode(m, &w, e);
    if (rc == 0) {
        tp_msg d;
        rc = tp_proto_decode(m->family, w.f, w.n, &d, e);
        tp_msg_clear(&d);
        tp_wire_free(&w);
    }
    return rc;
}

/* tools with messages only; tool_choice with tools, one of the four modes,
 * a name with "function" only (the broker checks the name and builds the
 * call's grammar). */
static void submit_tool_choice_is_checked(void **state)
{
    (void)state;
    static const struct {
        const char *tools, *choice, *name, *needle;
    } cases[] = {
        {NULL, "auto", NULL, "tool_choice: only with tools"},
        {"[]", "function", NULL, "tool_choice_name: missing"},
        {"[]", "sometimes", NULL, "tool_choice: \"sometimes\" is not one of"},
        {"[]", "auto", "f", "tool_choice_name: only with tool_choice \"function\""},
    };
    tp_chat_msg msg = {.role = tp_str_of("user"), .content = tp_str_of("hi")};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tp_msg m;
        tp_msg_init(&m, TP_FAM_JOB, TP_CMD_SUBMIT);
        m.submit.messages = &msg;
        m.submit.n_messages = 1;
        if (cases[i].tools)
            m.submit.tools = tp_str_of(cases[i].tools);
        m.submit.tool_choice = tp_str_of(cases[i].choice);
        if (cases[i].name)
            m.submit.tool_choice_name = tp_str_of(cases[i].name);
        tp_err e;
        assert_int_not_equal(encode_decode(&m, &e), 0);
        if (!strstr(e.msg, cases[i].needle))
            fail_msg("case %zu: '%s' lacks '%s'", i, e.msg, cases[i].needle);
    }
    tp_msg m;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_SUBMIT);
    m.submit.tools = tp_str_of("[]");
    m.submit.prompt = tp_str_of("hi");
    tp_err e;
    assert_int_not_equal(encode_decode(&m, &e), 0);
    assert_non_null(strstr(e.msg, "tools: only with messages"));
}

static void finish_carries_tool_calls_and_reasoning(void **state)
{
    (void)state;
    tp_tool_call calls[] = {{tp_str_of("call_abc"), tp_str_of("get_weather"), tp_str_of("{\"n\": 9007199254740993}")}};
    tp_msg m;
    tp_msg_init(&m, TP_FAM_EVT, TP_CMD_FINISH);
    m.finish.job_id = tp_str_of("j1");
    m.finish.reason = TP_REASON_EOS;
    m.finish.text = tp_str_of("");
    m.finish.tool_calls = calls;
    m.finish.n_tool_calls = 1;
    m.finish.reasoning_content = tp_str_of("thinking");
    tp_wire w;
    tp_msg d;
    round_trip(&m, &w, &d);
    assert_int_equal(d.finish.n_tool_calls, 1);
    assert_str(d.finish.tool_calls[0].id, "call_abc");
    assert_str(d.finish.tool_calls[0].arguments, "{\"n\": 9007199254740993}");
    assert_str(d.finish.reasoning_content, "thinking");
    assert_false(d.finish.tool_calls_cut);
    tp_msg_clear(&d);
    tp_wire_free(&w);
    /* a call the output stopped inside: FINISH says so */
    m.finish.reason = TP_REASON_LENGTH;
    calls[0].arguments = tp_str_of("{\"n\": 90");
    m.finish.tool_calls_cut = true;
    round_trip(&m, &w, &d);
    assert_true(d.finish.tool_calls_cut);
    assert_str(d.finish.tool_calls[0].arguments, "{\"n\": 90");
    tp_msg_clear(&d);
    tp_wire_free(&w);
    tp_msg_init(&m, TP_FAM_EVT, TP_CMD_TOKEN);
    int32_t id = 5;
    m.token.job_id = tp_str_of("j1");
    m.token.text = tp_str_of("");
    m.token.reasoning = tp_str_of("th");
    m.token.ids = (tp_raw){&id, 1};
    round_trip(&m, &w, &d);
    assert_str(d.token.reasoning, "th");
    tp_msg_clear(&d);
    tp_wire_free(&w);
}

/* ---- malformed: msgpack ---- */

static void bad_msgpack_is_rejected(void **state)
{
    (void)state;
    const struct {
        const char *bytes;
        size_t len;
        const char *needle;
    } cases[] = {
        {"\xc1", 1, "invalid msgpack type byte"},
        {"\x81\xa3req", 5, "truncated"},
        {"\x80\x00", 2, "trailing"},
        {"\xda\xff\xff", 3, "runs past the end"},
        {"", 0, "truncated"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tp_frame f[3] = {{"JOB1", 4}, {"\x06", 1}, {cases[i].bytes, cases[i].len}};
        expect_reject(TP_FAM_JOB, f, 3, TP_ST_BAD_REQUEST, cases[i].needle);
    }
}

static void huge_declared_counts_are_rejected_before_allocation(void **state)
{
    (void)state;
    /* array32 of 10^7 and map32 of 2^32-1 elements in 5 bytes. */
    tp_frame a[3] = {{"JOB1", 4}, {"\x06", 1}, {"\xdd\x00\x98\x96\x80", 5}};
    expect_reject(TP_FAM_JOB, a, 3, TP_ST_BAD_REQUEST, "declares 10000000 elements");
    tp_frame b[3] = {{"JOB1", 4}, {"\x06", 1}, {"\xdf\xff\xff\xff\xff", 5}};
    expect_reject(TP_FAM_JOB, b, 3, TP_ST_BAD_REQUEST, "declares");
}

static void object_budget_and_depth_are_enforced(void **state)
{
    (void)state;
    raw_msg r;
    raw_begin(&r, TP_MAGIC_JOB, TP_CMD_STATS);
    msgpack_pack_array(&r.pk, TP_PROTO_MAX_OBJECTS + 1);
    for (int i = 0; i < TP_PROTO_MAX_OBJECTS + 1; i++)
        msgpack_pack_nil(&r.pk);
    raw_header_done(&r);
    expect_reject(TP_FAM_JOB, r.f, r.n, TP_ST_TOO_LARGE, "objects");
    raw_free(&r);

    raw_begin(&r, TP_MAGIC_JOB, TP_CMD_STATS);
    for (int i = 0; i < TP_PROTO_MAX_DEPTH + 1; i++)
        msgpack_pack_array(&r.pk, 1);
    msgpack_pack_nil(&r.pk);
    raw_header_done(&r);
    expect_reject(TP_FAM_JOB, r.f, r.n, TP_ST_BAD_REQUEST, "nested deeper");
    raw_free(&r);
}

static void header_must_be_a_map_with_string_keys(void **state)
{
    (void)state;
    raw_msg r;
    raw_begin(&r, TP_MAGIC_JOB, TP_CMD_STATS);
    msgpack_pack_array(&r.pk, 0);
    raw_header_done(&r);
    expect_reject(TP_FAM_JOB, r.f, r.n, TP_ST_BAD_REQUEST, "expected a map, got array");
    raw_free(&r);
    raw_begin(&r, TP_MAGIC_JOB, TP_CMD_STATS);
    msgpack_pack_map(&r.pk, 1);
    msgpack_pack_int(&r.pk, 1);
    msgpack_pack_int(&r.pk, 1);
    raw_header_done(&r);
    expect_reject(TP_FAM_JOB, r.f, r.n, TP_ST_BAD_REQUEST, "keys must be str");
    raw_free(&r);
}

/* ---- malformed: fields ---- */

static void pack_str_5(msgpack_packer *pk) { pk_str(pk, "5"); }
static void pack_neg(msgpack_packer *pk) { msgpack_pack_int(pk, -1); }
static void pack_zero(msgpack_packer *pk) { msgpack_pack_int(pk, 0); }
static void pack_1_5(msgpack_packer *pk) { msgpack_pack_double(pk, 1.5); }
static void pack_nan(msgpack_packer *pk) { msgpack_pack_double(pk, NAN); }
static void pack_float(msgpack_packer *pk) { msgpack_pack_double(pk, 3.0); }
static void pack_int_stop(msgpack_packer *pk) { msgpack_pack_array(pk, 1), msgpack_pack_int(pk, 1); }
static void pack_empty_stop(msgpack_packer *pk) { msgpack_pack_array(pk, 2), pk_str(pk, "a"), pk_str(pk, ""); }
static void pack_bad_utf8(msgpack_packer *pk) { msgpack_pack_array(pk, 1), msgpack_pack_str_with_body(pk, "\xc3(", 2); }
static void pack_bin_stop(msgpack_packer *pk) { msgpack_pack_array(pk, 1), msgpack_pack_bin_with_body(pk, "a", 1); }
static void pack_too_many_stops(msgpack_packer *pk)
{
    msgpack_pack_array(pk, TP_PROTO_MAX_STOP + 1);
    for (int i = 0; i < TP_PROTO_MAX_STOP + 1; i++)
        pk_str(pk, "s");
}
static void pack_neg_ids(msgpack_packer *pk) { msgpack_pack_array(pk, 2), msgpack_pack_int(pk, 4), msgpack_pack_int(pk, -4); }
static void pack_true(msgpack_packer *pk) { msgpack_pack_true(pk); }
static void pack_big(msgpack_packer *pk) { msgpack_pack_uint64(pk, 1ull << 40); }

static void wrong_types_and_ranges_name_the_field(void **state)
{
    (void)state;
    const struct {
        const char *key;
        void (*val)(msgpack_packer *);
        uint32_t status;
        const char *needle;
    } cases[] = {
        {"max_tokens", pack_str_5, 400, "params.max_tokens: expected an integer, got str"},
        {"max_tokens", pack_zero, 400, "params.max_tokens: 0 is outside [1,"},
        {"max_tokens", pack_big, 400, "params.max_tokens: 1099511627776 is outside"},
        {"max_tokens", pack_float, 400, "params.max_tokens: expected an integer, got float"},
        {"min_tokens", pack_neg, 400, "params.min_tokens: -1 is outside"},
        {"temperature", pack_neg, 400, "params.temperature: -1 is outside [0,"},
        {"temperature", pack_true, 400, "params.temperature: expected a number, got bool"},
        {"top_p", pack_zero, 400, "params.top_p: 0 is outside (0, 1]"},
        {"top_p", pack_1_5, 400, "params.top_p: 1.5 is outside (0, 1]"},
        {"top_p", pack_nan, 400, "params.top_p: nan is outside"},
        {"min_p", pack_1_5, 400, "params.min_p"},
        {"presence_penalty", pack_float, 400, "params.presence_penalty: 3 is outside [-2, 2]"},
        {"repetition_penalty", pack_zero, 400, "params.repetition_penalty: 0 is outside (0,"},
        {"seed", pack_neg, 400, "params.seed: -1 is outside [0, 18446744073709551615]"},
        {"stop", pack_int_stop, 400, "params.stop[0]: expected str, got integer"},
        {"stop", pack_empty_stop, 400, "params.stop[1]: empty string"},
        {"stop", pack_bad_utf8, 400, "params.stop[0]: invalid UTF-8"},
        {"stop", pack_bin_stop, 400, "params.stop[0]: expected str, got bin"},
        {"stop", pack_too_many_stops, 413, "params.stop: 4097 elements, at most 4096"},
        {"stop_token_ids", pack_neg_ids, 400, "params.stop_token_ids[1]: -4 is outside"},
        {"ignore_eos", pack_zero, 400, "params.ignore_eos: expected bool"},
        {"max_token", pack_zero, 400, "params.max_token: unknown key"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        raw_msg r;
        submit_with_param(&r, cases[i].key, cases[i].val);
        tp_msg m;
        tp_err e = {0};
        if (tp_proto_decode(TP_FAM_JOB, r.f, r.n, &m, &e) == 0)
            fail_msg("case %zu (%s) accepted", i, cases[i].needle);
        if (m.status != cases[i].status || !strstr(e.msg, cases[i].needle))
            fail_msg("case %zu: status %u error '%s', expected %u '%s'", i, m.status, e.msg, cases[i].status,
                     cases[i].needle);
        if (m.req != 77)
            fail_msg("case %zu: req %llu not salvaged for the error reply", i, (unsigned long long)m.req);
        if (strncmp(m.bad_field, "params.", 7))
            fail_msg("case %zu: bad_field '%s' does not name a param", i, m.bad_field);
        tp_msg_clear(&m);
        raw_free(&r);
    }
}

static void min_tokens_above_max_tokens_is_rejected(void **state)
{
    (void)state;
    raw_msg r;
    raw_begin(&r, TP_MAGIC_JOB, TP_CMD_SUBMIT);
    msgpack_pack_map(&r.pk, 2);
    pk_str(&r.pk, "prompt");
    pk_str(&r.pk, "p");
    pk_str(&r.pk, "params");
    msgpack_pack_map(&r.pk, 2);
    pk_str(&r.pk, "max_tokens");
    msgpack_pack_int(&r.pk, 4);
    pk_str(&r.pk, "min_tokens");
    msgpack_pack_int(&r.pk, 5);
    raw_header_done(&r);
    expect_reject(TP_FAM_JOB, r.f, r.n, TP_ST_BAD_REQUEST, "params.min_tokens: 5 is greater than max_tokens 4");
    raw_free(&r);
}

static void missing_duplicate_and_unknown_keys_are_rejected(void **state)
{
    (void)state;
    raw_msg r;
    raw_begin(&r, TP_MAGIC_JOB, TP_CMD_CANCEL);
    msgpack_pack_map(&r.pk, 1);
    pk_str(&r.pk, "req");
    msgpack_pack_int(&r.pk, 3);
    raw_header_done(&r);
    expect_reject(TP_FAM_JOB, r.f, r.n, TP_ST_BAD_REQUEST, "job_id: missing key");
    raw_free(&r);

    raw_begin(&r, TP_MAGIC_JOB, TP_CMD_CANCEL);
    msgpack_pack_map(&r.pk, 2);
    pk_str(&r.pk, "job_id");
    pk_str(&r.pk, "a");
    pk_str(&r.pk, "job_id");
    pk_str(&r.pk, "b");
    raw_header_done(&r);
    expect_reject(TP_FAM_JOB, r.f, r.n, TP_ST_BAD_REQUEST, "job_id: key given twice");
    raw_free(&r);

    raw_begin(&r, TP_MAGIC_JOB, TP_CMD_CANCEL);
    msgpack_pack_map(&r.pk, 2);
    pk_str(&r.pk, "job_id");
    pk_str(&r.pk, "a");
    pk_str(&r.pk, "jobid\x01");
    pk_str(&r.pk, "b");
    raw_header_done(&r);
    expect_reject(TP_FAM_JOB, r.f, r.n, TP_ST_BAD_REQUEST, "jobid?: unknown key");
    raw_free(&r);
}

static void invalid_job_ids_are_rejected(void **state)
{
    (void)state;
    const char *bad[] = {"a b", "a/b", "ü", "x\n", "01234567890123456789012345678901234567890123456789012345678901234"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        raw_msg r;
        raw_begin(&r, TP_MAGIC_JOB, TP_CMD_STATUS);
        msgpack_pack_map(&r.pk, 1);
        pk_str(&r.pk, "job_id");
        pk_str(&r.pk, bad[i]);
        raw_header_done(&r);
        expect_reject(TP_FAM_JOB, r.f, r.n, strlen(bad[i]) > 64 ? TP_ST_TOO_LARGE : TP_ST_BAD_REQUEST, "job_id");
        raw_free(&r);
    }
    assert_true(tp_job_id_valid("A-z_0.9:x", 9));
    assert_false(tp_job_id_valid("", 0));
}

static void replies_ignore_unknown_keys_requests_do_not(void **state)
{
    (void)state;
    raw_msg r;
    raw_begin(&r, TP_MAGIC_JOB, TP_CMD_ACK);
    msgpack_pack_map(&r.pk, 3);
    pk_str(&r.pk, "status");
    msgpack_pack_int(&r.pk, 200);
    pk_str(&r.pk, "job_id");
    pk_str(&r.pk, "j");
    pk_str(&r.pk, "added_later");
    msgpack_pack_array(&r.pk, 0);
    raw_header_done(&r);
    tp_msg m;
    tp_err e = {0};
    if (tp_proto_decode(TP_FAM_JOB, r.f, r.n, &m, &e))
        fail_msg("ACK with an extra key rejected: %s", e.msg);
    assert_int_equal(m.status, 200);
    tp_msg_clear(&m);
    raw_free(&r);
}

static void event_topic_must_equal_job_id(void **state)
{
    (void)state;
    int32_t id = 5;
    tp_msg m;
    tp_msg_init(&m, TP_FAM_EVT, TP_CMD_TOKEN);
    m.token = (tp_m_token){.job_id = tp_str_of("j1"), .text = tp_str_of(""), .ids = {&id, 1}};
    tp_wire w;
    tp_err e;
    assert_int_equal(tp_proto_encode(&m, &w, &e), 0);
    tp_frame f[5];
    memcpy(f, w.f, sizeof f);
    f[0] = (tp_frame){"j10", 3};
    expect_reject(TP_FAM_EVT, f, 5, TP_ST_BAD_REQUEST, "topic");
    expect_reject(TP_FAM_EVT, f, 4, TP_ST_BAD_REQUEST, "ids: payload frame missing");
    tp_wire_free(&w);
}

static void worker_counts_must_agree_with_header(void **state)
{
    (void)state;
    uint32_t slots[] = {1, 2}, pos[] = {0, 0}, ntok[] = {1, 1};
    uint8_t flags[] = {1, 1};
    int32_t tokens[] = {1, 1}, acc[] = {-1, -1};
    tp_msg m;
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_STEP);
    m.step = (tp_m_step){.step = 1, .n = 2, .n_tokens = 2, .slots = {slots, 2}, .pos = {pos, 2},
                         .ntok = {ntok, 2}, .flags = {flags, 2}, .tokens = {tokens, 2}, .accepted = {acc, 2}};
    tp_wire w;
    tp_err e;
    assert_int_equal(tp_proto_encode(&m, &w, &e), 0);
    tp_frame f[9];
    memcpy(f, w.f, sizeof f);
    f[3].len = 4; /* slots frame now holds 1 element, header says 2 */
    expect_reject(TP_FAM_WRK, f, 9, TP_ST_BAD_REQUEST, "slots: 1 elements, header says 2");
    tp_wire_free(&w);

    ntok[1] = 2; /* sum 3 != n_tokens 2 */
    assert_int_not_equal(tp_proto_encode(&m, &w, &e), 0);
    assert_non_null(strstr(e.msg, "ntok: sum 3 differs from n_tokens 2"));
    ntok[1] = 0;
    m.step.n_tokens = 1;
    m.step.tokens.n = 1;
    assert_int_not_equal(tp_proto_encode(&m, &w, &e), 0);
    assert_non_null(strstr(e.msg, "ntok[1]"));

    uint8_t bad_fin[] = {0, 9}, acc8[] = {1, 0};
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_VERDICTS);
    m.status = 200;
    m.verdicts = (tp_m_verdicts){.step = 1, .n = 2, .slots = {slots, 2}, .accepted = {acc8, 2}, .finish = {bad_fin, 2}};
    assert_int_not_equal(tp_proto_encode(&m, &w, &e), 0);
    assert_non_null(strstr(e.msg, "finish[1]: unknown reason code 9"));
}

static void encode_refuses_what_decode_would_reject(void **state)
{
    (void)state;
    tp_msg m;
    tp_wire w;
    tp_err e = {0};
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_SUBMIT);
    m.submit.prompt = tp_str_of("x");
    m.submit.params.set = TP_P_TOP_P;
    m.submit.params.top_p = 2;
    assert_int_equal(tp_proto_encode(&m, &w, &e), TP_EINVAL);
    assert_non_null(strstr(e.msg, "encode SUBMIT: params.top_p: 2 is outside (0, 1]"));
    assert_null(w.buf);

    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_SUBMIT);
    m.submit.job_id = tp_str_of("has space");
    m.submit.prompt = tp_str_of("x");
    assert_int_not_equal(tp_proto_encode(&m, &w, &e), 0);
    assert_non_null(strstr(e.msg, "job_id: not a job id"));

    tp_msg_init(&m, TP_FAM_EVT, TP_CMD_FINISH);
    m.finish.job_id = tp_str_of("j");
    assert_int_not_equal(tp_proto_encode(&m, &w, &e), 0);
    assert_non_null(strstr(e.msg, "'none' is not a finish reason"));

    tp_msg_init(&m, TP_FAM_JOB, 0x42);
    assert_int_equal(tp_proto_encode(&m, &w, &e), TP_EINVAL);
}

static void ready_rejects_unknown_or_repeated_stages(void **state)
{
    (void)state;
    const char *sets[][2] = {{"forward", "decode"}, {"stop", "stop"}};
    const char *needle[] = {"stages[1]: 'decode' is not one of", "stages[1]: stage 'stop' given twice"};
    for (int i = 0; i < 2; i++) {
        raw_msg r;
        raw_begin(&r, TP_MAGIC_WRK, TP_CMD_READY);
        msgpack_pack_map(&r.pk, 1);
        pk_str(&r.pk, "stages");
        msgpack_pack_array(&r.pk, 2);
        pk_str(&r.pk, sets[i][0]);
        pk_str(&r.pk, sets[i][1]);
        raw_header_done(&r);
        expect_reject(TP_FAM_WRK, r.f, r.n, TP_ST_BAD_REQUEST, needle[i]);
        raw_free(&r);
    }
}

static void names_round_trip(void **state)
{
    (void)state;
    for (int r = 0; r < TP_REASON_COUNT; r++) {
        const char *n = tp_reason_name(r);
        assert_int_equal(tp_reason_parse(n, strlen(n)), r);
    }
    assert_int_equal(tp_reason_parse("eos ", 4), -1);
    assert_string_equal(tp_reason_name(99), "unknown");
    assert_string_equal(tp_cmd_name(TP_FAM_WRK, TP_CMD_VERDICTS), "VERDICTS");
    assert_string_equal(tp_cmd_name(TP_FAM_JOB, 0x33), "?");
    assert_string_equal(tp_stage_name(TP_STAGE_SAMPLE), "sample");
}

/* OpenAI's "tool_calls" is for an output the model ended itself after its
 * calls, each whole: a length finish cut it (maybe mid-arguments), a stop
 * string may cut a call, and a job with no call, cancelled or failed
 * ends for that. */
static void only_a_model_ended_job_with_calls_ends_in_calls(void **state)
{
    (void)state;
    const bool want[TP_REASON_COUNT] = {
        [TP_REASON_STOP_STRING] = true, [TP_REASON_STOP_TOKEN] = true, [TP_REASON_EOS] = true};
    for (int r = 0; r < TP_REASON_COUNT; r++) {
        if (tp_reason_ends_in_calls(r, 2, false) != want[r])
            fail_msg("%s with 2 calls: ends in calls should be %d", tp_reason_name(r), want[r]);
        if (tp_reason_ends_in_calls(r, 0, false))
            fail_msg("%s with no call ends in calls", tp_reason_name(r));
        if (tp_reason_ends_in_calls(r, 2, true))
            fail_msg("%s with a call not whole ends in calls", tp_reason_name(r));
    }
    assert_false(tp_reason_ends_in_calls(TP_REASON_LENGTH, 1, false));
}

/* The UTF-8 check against Python's rules, spot-checked on the classic
 * boundary cases (overlong, surrogate, > U+10FFFF, truncated). */
static void utf8_validation_follows_rfc3629(void **state)
{
    (void)state;
    assert_true(tp_proto_utf8_valid("h\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 10));
    assert_false(tp_proto_utf8_valid("\xc0\xaf", 2));         /* overlong '/' */
    assert_false(tp_proto_utf8_valid("\xe0\x80\xaf", 3));     /* overlong */
    assert_false(tp_proto_utf8_valid("\xed\xa0\x80", 3));     /* surrogate D800 */
    assert_false(tp_proto_utf8_valid("\xf4\x90\x80\x80", 4)); /* > U+10FFFF */
    assert_false(tp_proto_utf8_valid("\xe2\x82", 2));         /* truncated */
    assert_false(tp_proto_utf8_valid("\x80", 1));
    assert_true(tp_proto_utf8_valid("\xef\xbf\xbd", 3));      /* U+FFFD */
}

/* The fuzz seeds (scripts/mk-protocol-seeds.py, written with Python's
 * msgpack) are valid messages: they decode, except the one that must not. */
static void fuzz_seeds_written_by_python_decode(void **state)
{
    (void)state;
    const char *dir = "fuzz/corpus/fuzz_protocol";
    DIR *d = opendir(dir);
    if (!d)
        skip();
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        static uint8_t buf[1 << 16];
        size_t len = fread(buf, 1, sizeof buf, f), pos = 1, nf = 0;
        fclose(f);
        tp_frame fr[20];
        while (nf < 20 && len - pos >= 2) {
            size_t l = (size_t)buf[pos] | (size_t)buf[pos + 1] << 8;
            pos += 2;
            fr[nf++] = (tp_frame){buf + pos, l};
            pos += l;
        }
        tp_msg m;
        tp_err err = {0};
        int rc = tp_proto_decode((tp_family)(1 + buf[0] % 3), fr, nf, &m, &err);
        bool want_ok = strcmp(e->d_name, "huge_count") != 0;
        if ((rc == 0) != want_ok)
            fail_msg("seed %s: decode rc %d (%s)", e->d_name, rc, err.msg);
        tp_msg_clear(&m);
        n++;
    }
    closedir(d);
    assert_true(n >= 20);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(submit_text_round_trips_every_param),
        cmocka_unit_test(submit_unset_params_are_not_sent),
        cmocka_unit_test(replies_carry_req_even_when_zero),
        cmocka_unit_test(status_reply_of_a_finished_job_has_matched_nil_and_every_timing),
        cmocka_unit_test(absent_array_keys_decode_to_empty_arrays_not_null),
        cmocka_unit_test(submit_token_ids_travel_as_raw_little_endian_frame),
        cmocka_unit_test(decoded_strings_borrow_the_frame),
        cmocka_unit_test(ack_cancel_status_and_error_round_trip),
        cmocka_unit_test(status_reply_of_finished_job_carries_result_and_tokens),
        cmocka_unit_test(status_reply_of_running_job_carries_text_and_tokens_so_far),
        cmocka_unit_test(heartbeat_event_travels_on_its_own_topic),
        cmocka_unit_test(stats_reply_round_trips_counters_and_triggers),
        cmocka_unit_test(stats_reply_round_trips_histograms_and_refuses_inconsistent_ones),
        cmocka_unit_test(token_event_has_job_id_topic_and_raw_ids),
        cmocka_unit_test(top_n_is_sent_whenever_logprob_frames_are_even_zero),
        cmocka_unit_test(finish_event_round_trips_reason_matched_counts_timings),
        cmocka_unit_test(worker_control_messages_round_trip),
        cmocka_unit_test(tokenize_and_open_close_round_trip),
        cmocka_unit_test(step_and_step_result_round_trip),
        cmocka_unit_test(draft_and_drafted_round_trip_and_are_validated),
        cmocka_unit_test(sample_messages_round_trip),
        cmocka_unit_test(stop_messages_round_trip),
        cmocka_unit_test(bad_magic_or_version_is_505),
        cmocka_unit_test(unknown_command_and_bad_command_frame_are_501),
        cmocka_unit_test(missing_header_and_too_many_frames_are_rejected),
        cmocka_unit_test(oversize_header_frame_is_413_before_parsing),
        cmocka_unit_test(ids_frame_not_a_multiple_of_four_is_rejected),
        cmocka_unit_test(submit_needs_exactly_one_prompt),
        cmocka_unit_test(bad_msgpack_is_rejected),
        cmocka_unit_test(huge_declared_counts_are_rejected_before_allocation),
        cmocka_unit_test(object_budget_and_depth_are_enforced),
        cmocka_unit_test(header_must_be_a_map_with_string_keys),
        cmocka_unit_test(wrong_types_and_ranges_name_the_field),
        cmocka_unit_test(min_tokens_above_max_tokens_is_rejected),
        cmocka_unit_test(missing_duplicate_and_unknown_keys_are_rejected),
        cmocka_unit_test(invalid_job_ids_are_rejected),
        cmocka_unit_test(replies_ignore_unknown_keys_requests_do_not),
        cmocka_unit_test(event_topic_must_equal_job_id),
        cmocka_unit_test(worker_counts_must_agree_with_header),
        cmocka_unit_test(encode_refuses_what_decode_would_reject),
        cmocka_unit_test(ready_rejects_unknown_or_repeated_stages),
        cmocka_unit_test(names_round_trip),
        cmocka_unit_test(only_a_model_ended_job_with_calls_ends_in_calls),
        cmocka_unit_test(utf8_validation_follows_rfc3629),
        cmocka_unit_test(fuzz_seeds_written_by_python_decode),
        cmocka_unit_test(submit_messages_round_trip_and_tokenized_carries_stop_ids),
        cmocka_unit_test(submit_messages_are_validated_naming_the_field),
        cmocka_unit_test(submit_tool_choice_is_checked),
        cmocka_unit_test(finish_carries_tool_calls_and_reasoning),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
