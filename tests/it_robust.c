/* Process story: the daemon survives bad input and lost workers. Malformed
 * messages of every kind on every socket get an ERROR reply or are dropped
 * and counted while another job keeps streaming; bad parameters are
 * rejected naming the field; CANCEL and STATUS behave; a killed worker
 * fails only its jobs and is respawned; SIGTERM exits 0. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <msgpack.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "support/daemon_harness.h"

/* hang detectors, not speed limits (ASan on a loaded 2-CPU machine) */
#define WAIT_MS 30000

/* msgpack of a small map built by the caller through the packer */
typedef struct mp {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} mp;

static void mp_init(mp *m)
{
    msgpack_sbuffer_init(&m->sb);
    msgpack_packer_init(&m->pk, &m->sb, msgpack_sbuffer_write);
}

static void mp_str(mp *m, const char *s)
{
    msgpack_pack_str_with_body(&m->pk, s, strlen(s));
}

/* Send frames, expect a JOB1 ERROR/ACK reply whose status is `status`. */
static void expect_reply(harness *h, const tp_frame *f, size_t n, uint8_t cmd, uint32_t status, const char *needle,
                         const char *what)
{
    tp_zmsg z;
    if (harness_raw_call(h, f, n, &z, 3000))
        fail_msg("%s: no reply", what);
    tp_msg r;
    tp_err e;
    if (tp_proto_decode(TP_FAM_JOB, z.f, z.n, &r, &e))
        fail_msg("%s: reply does not decode: %s", what, e.msg);
    if (r.cmd != cmd || (status ? r.status != status : r.status == TP_ST_OK))
        fail_msg("%s: got %s status %u (%.*s), want cmd 0x%x status %u", what, tp_cmd_name(TP_FAM_JOB, r.cmd), r.status,
                 (int)r.error.len, r.error.ptr, cmd, status);
    if (needle && (!r.error.ptr || !memmem(r.error.ptr, r.error.len, needle, strlen(needle))))
        fail_msg("%s: error '%.*s' does not name '%s'", what, (int)r.error.len, r.error.ptr, needle);
    tp_msg_clear(&r);
    tp_zmsg_close(&z);
}

static void malformed_frontend(harness *h)
{
    uint8_t submit = TP_CMD_SUBMIT;
    tp_frame f[20];
    /* bad magic */
    f[0] = (tp_frame){"JOB2", 4};
    f[1] = (tp_frame){&submit, 1};
    f[2] = (tp_frame){"\x80", 1};
    expect_reply(h, f, 3, TP_CMD_ERROR, TP_ST_BAD_VERSION, NULL, "bad magic");
    /* unknown command */
    uint8_t unknown = 0x55;
    f[0] = (tp_frame){"JOB1", 4};
    f[1] = (tp_frame){&unknown, 1};
    expect_reply(h, f, 3, TP_CMD_ERROR, TP_ST_UNKNOWN_COMMAND, NULL, "unknown command");
    /* a command only the broker sends */
    uint8_t ackc = TP_CMD_ACK;
    f[1] = (tp_frame){&ackc, 1};
    static const char ack_hdr[] = "\x82\xa6status\xcc\xc8\xa6job_id\xa1x";
    f[2] = (tp_frame){ack_hdr, sizeof ack_hdr - 1};
    expect_reply(h, f, 3, TP_CMD_ERROR, 0, NULL, "broker-only command");
    /* not msgpack */
    f[1] = (tp_frame){&submit, 1};
    f[2] = (tp_frame){"\xc1\xc1\xc1", 3};
    expect_reply(h, f, 3, TP_CMD_ERROR, TP_ST_BAD_REQUEST, NULL, "bad msgpack");
    /* truncated msgpack, trailing bytes */
    f[2] = (tp_frame){"\x82\xa3req", 5};
    expect_reply(h, f, 3, TP_CMD_ERROR, TP_ST_BAD_REQUEST, NULL, "truncated msgpack");
    f[2] = (tp_frame){"\x80\x80", 2};
    expect_reply(h, f, 3, TP_CMD_ERROR, TP_ST_BAD_REQUEST, NULL, "trailing bytes");
    /* header not a map */
    f[2] = (tp_frame){"\x91\x01", 2};
    expect_reply(h, f, 3, TP_CMD_ERROR, TP_ST_BAD_REQUEST, NULL, "array header");
    /* wrong type: job_id as an integer */
    mp m;
    mp_init(&m);
    msgpack_pack_map(&m.pk, 2);
    mp_str(&m, "job_id");
    msgpack_pack_int(&m.pk, 7);
    mp_str(&m, "prompt");
    mp_str(&m, "hi");
    f[2] = (tp_frame){m.sb.data, m.sb.size};
    expect_reply(h, f, 3, TP_CMD_ERROR, TP_ST_BAD_REQUEST, "job_id", "job_id as int");
    msgpack_sbuffer_destroy(&m.sb);
    /* huge declared count: an array32 of 100 million stop strings in 20 bytes */
    const char huge[] = "\x82\xa6prompt\xa2hi\xa6params\x81\xa4stop\xdd\x05\xf5\xe1\x00";
    f[2] = (tp_frame){huge, sizeof huge - 1};
    tp_zmsg z;
    assert_int_equal(harness_raw_call(h, f, 3, &z, 3000), 0);
    tp_zmsg_close(&z);
    /* unknown key */
    mp_init(&m);
    msgpack_pack_map(&m.pk, 2);
    mp_str(&m, "prompt");
    mp_str(&m, "hi");
    mp_str(&m, "max_token");
    msgpack_pack_int(&m.pk, 3);
    f[2] = (tp_frame){m.sb.data, m.sb.size};
    expect_reply(h, f, 3, TP_CMD_ERROR, TP_ST_BAD_REQUEST, "max_token", "unknown key");
    msgpack_sbuffer_destroy(&m.sb);
    /* prompt ids frame not a multiple of 4 bytes */
    f[2] = (tp_frame){"\x80", 1};
    f[3] = (tp_frame){"\x01\x00\x00", 3};
    expect_reply(h, f, 4, TP_CMD_ERROR, TP_ST_BAD_REQUEST, NULL, "ragged ids frame");
    /* too many frames */
    for (int i = 3; i < 20; i++)
        f[i] = (tp_frame){"x", 1};
    expect_reply(h, f, 20, TP_CMD_ERROR, 0, NULL, "20 frames");
    expect_reply(h, f, 14, TP_CMD_ERROR, 0, NULL, "14 frames");
    /* magic alone */
    expect_reply(h, f, 1, TP_CMD_ERROR, TP_ST_BAD_REQUEST, NULL, "magic only");
    /* oversize frame: ZeroMQ drops the connection, no reply (documented) */
    static char big[200000];
    f[2] = (tp_frame){big, sizeof big};
    assert_int_not_equal(harness_raw_call(h, f, 3, &z, 500), 0);
    /* the DEALER reconnects (a request sent before may be dropped with
     * the old connection): the daemon answers again */
    tp_m_stats_reply s;
    for (int64_t end = tp_now_ms() + WAIT_MS; harness_stats(h, &s); harness_sleep_ms(20))
        if (tp_now_ms() > end)
            fail_msg("no STATS answer %d ms after the oversize frame", WAIT_MS);
}

static void malformed_backend_and_events(harness *h)
{
    void *d = zmq_socket(h->zctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger);
    zmq_connect(d, h->back);
    zmq_send(d, "garbage", 7, 0);
    zmq_send(d, "WRK1", 4, ZMQ_SNDMORE);
    zmq_send(d, "\x22", 1, ZMQ_SNDMORE);   /* a STEP from a worker */
    zmq_send(d, "\x80", 1, 0);
    /* a heartbeat from an unregistered worker is told to register */
    zmq_send(d, "WRK1", 4, ZMQ_SNDMORE);
    zmq_send(d, "\x03", 1, ZMQ_SNDMORE);
    zmq_send(d, "\x80", 1, 0);
    zmq_pollitem_t it = {d, 0, ZMQ_POLLIN, 0};
    assert_int_equal(zmq_poll(&it, 1, 3000), 1);
    tp_zmsg z;
    assert_int_equal(tp_zmsg_recv(d, &z, 0), 0);
    assert_true(z.n >= 2 && z.f[1].len == 1 && ((const uint8_t *)z.f[1].data)[0] == TP_CMD_DISCONNECT);
    tp_zmsg_close(&z);
    zmq_close(d);

    void *p = zmq_socket(h->zctx, ZMQ_PUB);
    zmq_setsockopt(p, ZMQ_LINGER, &linger, sizeof linger);
    zmq_connect(p, h->publish);
    /* the PUB drops them until the broker's subscribe-all reaches it (a
     * fixed wait was too short on a loaded machine): again until counted */
    tp_m_stats_reply s;
    uint64_t before = harness_stats(h, &s) ? 0 : s.malformed_events;
    for (int64_t end = tp_now_ms() + WAIT_MS; harness_stats(h, &s) || s.malformed_events < before + 2;) {
        if (tp_now_ms() > end)
            fail_msg("malformed events sent for %d ms, the broker counted %llu", WAIT_MS,
                     (unsigned long long)(s.malformed_events - before));
        zmq_send(p, "job", 3, ZMQ_SNDMORE);
        zmq_send(p, "EVT1", 4, ZMQ_SNDMORE);
        zmq_send(p, "\x09", 1, ZMQ_SNDMORE);
        zmq_send(p, "\x80", 1, 0);
        zmq_send(p, "only-one-frame", 14, 0);
        harness_sleep_ms(50);
    }
    zmq_close(p);
}

static void daemon_survives_malformed_messages_and_keeps_serving(void **state)
{
    (void)state;
    harness h;
    assert_int_equal(harness_start(&h, false, "limits:\n  max_msg_bytes: 65536\n  max_prompt_bytes: 4096\n"), 0);
    /* a long job streams the whole time */
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s/tokpipe generate --config %s --json --timeout 20000 --prompt 'Once upon a time' --temperature 0 "
             "--max-tokens 300 --ignore-eos",
             h.bin, h.config);
    FILE *bg = popen(cmd, "r");
    assert_non_null(bg);
    harness_sleep_ms(100);
    malformed_frontend(&h);
    malformed_backend_and_events(&h);
    char out[65536];
    size_t len = fread(out, 1, sizeof out - 1, bg);
    out[len] = '\0';
    assert_int_equal(pclose(bg), 0);
    if (!strstr(out, "\"finish_reason\":\"length\"") || !strstr(out, "\"completion_tokens\":300"))
        fail_msg("the concurrent job did not complete: %s", out);
    tp_m_stats_reply s;
    assert_int_equal(harness_stats(&h, &s), 0);
    if (s.malformed_front < 12 || s.malformed_back < 2 || s.malformed_events < 2)
        fail_msg("malformed counts: front %llu back %llu events %llu", (unsigned long long)s.malformed_front,
                 (unsigned long long)s.malformed_back, (unsigned long long)s.malformed_events);
    assert_int_equal(s.jobs_finished, 1);
    assert_int_equal(harness_stop(&h), 0);
}

/* ---- rejections name the field ---------------------------------------------- */

static void submit_expect(harness *h, const char *job_id, void (*params)(mp *), uint32_t status, const char *field,
                          const char *what)
{
    mp m;
    mp_init(&m);
    msgpack_pack_map(&m.pk, job_id ? 3 : 2);
    mp_str(&m, "prompt");
    mp_str(&m, "Once upon a time");
    mp_str(&m, "params");
    params(&m);
    if (job_id) {
        mp_str(&m, "job_id");
        mp_str(&m, job_id);
    }
    uint8_t c = TP_CMD_SUBMIT;
    tp_frame f[3] = {{"JOB1", 4}, {&c, 1}, {m.sb.data, m.sb.size}};
    tp_zmsg z;
    if (harness_raw_call(h, f, 3, &z, 3000))
        fail_msg("%s: no reply", what);
    tp_msg r;
    tp_err e;
    assert_int_equal(tp_proto_decode(TP_FAM_JOB, z.f, z.n, &r, &e), 0);
    if (r.status != status)
        fail_msg("%s: status %u (%.*s), want %u", what, r.status, (int)r.error.len, r.error.ptr, status);
    if (field && (r.ack.field.len != strlen(field) || memcmp(r.ack.field.ptr, field, r.ack.field.len)))
        fail_msg("%s: field '%.*s', want '%s' (error: %.*s)", what, (int)r.ack.field.len, r.ack.field.ptr, field,
                 (int)r.error.len, r.error.ptr);
    tp_msg_clear(&r);
    tp_zmsg_close(&z);
    msgpack_sbuffer_destroy(&m.sb);
}

static void p_big_max_tokens(mp *m)
{
    msgpack_pack_map(&m->pk, 1);
    mp_str(m, "max_tokens");
    msgpack_pack_int(&m->pk, 100000);
}
static void p_bad_stop_id(mp *m)
{
    msgpack_pack_map(&m->pk, 1);
    mp_str(m, "stop_token_ids");
    msgpack_pack_array(&m->pk, 2);
    msgpack_pack_int(&m->pk, 5);
    msgpack_pack_int(&m->pk, 9999);
}
static void p_min_over_max(mp *m)
{
    msgpack_pack_map(&m->pk, 2);
    mp_str(m, "max_tokens");
    msgpack_pack_int(&m->pk, 4);
    mp_str(m, "min_tokens");
    msgpack_pack_int(&m->pk, 9);
}
static void p_top_p(mp *m)
{
    msgpack_pack_map(&m->pk, 1);
    mp_str(m, "top_p");
    msgpack_pack_double(&m->pk, 1.5);
}
static void p_long_stop(mp *m)
{
    static char s[2000];
    memset(s, 'a', sizeof s - 1);
    msgpack_pack_map(&m->pk, 1);
    mp_str(m, "stop");
    msgpack_pack_array(&m->pk, 2);
    mp_str(m, ".");
    mp_str(m, s);
}
static void p_ok(mp *m)
{
    msgpack_pack_map(&m->pk, 1);
    mp_str(m, "max_tokens");
    msgpack_pack_int(&m->pk, 2);
}

static void bad_parameters_are_rejected_naming_the_field(void **state)
{
    (void)state;
    harness h;
    assert_int_equal(harness_start(&h, false, NULL), 0);
    submit_expect(&h, NULL, p_big_max_tokens, TP_ST_BAD_REQUEST, "params.max_tokens", "max_tokens over the limit");
    submit_expect(&h, NULL, p_bad_stop_id, TP_ST_BAD_REQUEST, "params.stop_token_ids[1]", "stop id outside vocab");
    submit_expect(&h, NULL, p_min_over_max, TP_ST_BAD_REQUEST, "params.min_tokens", "min_tokens > max_tokens");
    submit_expect(&h, NULL, p_top_p, TP_ST_BAD_REQUEST, "params.top_p", "top_p 1.5");
    submit_expect(&h, NULL, p_long_stop, TP_ST_TOO_LARGE, "params.stop[1]", "stop string over max_stop_len");
    submit_expect(&h, "dup-1", p_ok, TP_ST_OK, NULL, "first dup-1");
    submit_expect(&h, "dup-1", p_ok, TP_ST_CONFLICT, "job_id", "second dup-1");
    submit_expect(&h, "bad id!", p_ok, TP_ST_BAD_REQUEST, "job_id", "job id charset");
    tp_m_stats_reply s;
    assert_int_equal(harness_stats(&h, &s), 0);
    assert_true(s.jobs_rejected >= 5);
    assert_int_equal(harness_stop(&h), 0);
}

/* ---- cancel and status ---------------------------------------------------------- */

static void submit_long(harness *h, const char *id)
{
    mp m;
    mp_init(&m);
    msgpack_pack_map(&m.pk, 3);
    mp_str(&m, "job_id");
    mp_str(&m, id);
    mp_str(&m, "prompt");
    mp_str(&m, "Once upon a time");
    mp_str(&m, "params");
    msgpack_pack_map(&m.pk, 3);
    mp_str(&m, "max_tokens");
    msgpack_pack_int(&m.pk, 500);
    mp_str(&m, "ignore_eos");
    msgpack_pack_true(&m.pk);
    mp_str(&m, "temperature");
    msgpack_pack_int(&m.pk, 0);
    uint8_t c = TP_CMD_SUBMIT;
    tp_frame f[3] = {{"JOB1", 4}, {&c, 1}, {m.sb.data, m.sb.size}};
    tp_zmsg z;
    assert_int_equal(harness_raw_call(h, f, 3, &z, 3000), 0);
    tp_zmsg_close(&z);
    msgpack_sbuffer_destroy(&m.sb);
}

/* Wait for the FINISH of job id on sub; returns its reason. */
static int wait_finish(void *sub, const char *id, uint32_t *completion, int timeout_ms)
{
    for (;;) {
        zmq_pollitem_t it = {sub, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, timeout_ms) <= 0)
            return -1;
        tp_zmsg z;
        tp_zmsg_recv(sub, &z, 0);
        tp_msg ev;
        tp_err e;
        int reason = -2;
        if (tp_proto_decode(TP_FAM_EVT, z.f, z.n, &ev, &e) == 0 && ev.cmd == TP_CMD_FINISH &&
            ev.finish.job_id.len == strlen(id) && !memcmp(ev.finish.job_id.ptr, id, strlen(id))) {
            reason = ev.finish.reason;
            if (completion)
                *completion = ev.finish.completion_tokens;
        }
        tp_msg_clear(&ev);
        tp_zmsg_close(&z);
        if (reason != -2)
            return reason;
    }
}

static void jobref(harness *h, uint8_t cmd, const char *id, tp_zmsg *z, tp_msg *r)
{
    tp_msg m;
    tp_msg_init(&m, TP_FAM_JOB, cmd);
    m.jobref.job_id = tp_str_of(id);
    assert_int_equal(harness_call(h, &m, z, r), 0);
}

static void cancel_finishes_the_job_and_status_reports_it(void **state)
{
    (void)state;
    harness h;
    assert_int_equal(harness_start(&h, false, NULL), 0);
    void *sub = harness_subscribe(&h, "c-1");
    submit_long(&h, "c-1");
    harness_sleep_ms(5);
    tp_zmsg z;
    tp_msg r;
    jobref(&h, TP_CMD_CANCEL, "c-1", &z, &r);
    assert_int_equal(r.status, TP_ST_OK);
    tp_msg_clear(&r);
    tp_zmsg_close(&z);
    uint32_t n = 0;
    assert_int_equal(wait_finish(sub, "c-1", &n, WAIT_MS), TP_REASON_CANCELLED);
    assert_true(n < 500);
    jobref(&h, TP_CMD_STATUS, "c-1", &z, &r);
    assert_int_equal(r.status, TP_ST_OK);
    assert_int_equal(r.status_reply.state, TP_STATE_FINISHED);
    assert_int_equal(r.status_reply.reason, TP_REASON_CANCELLED);
    assert_int_equal(r.status_reply.completion_tokens, n);
    assert_int_equal(r.status_reply.tokens.n, n);
    tp_msg_clear(&r);
    tp_zmsg_close(&z);
    jobref(&h, TP_CMD_CANCEL, "c-1", &z, &r);
    assert_int_equal(r.status, TP_ST_CONFLICT);   /* idempotent: already finished */
    tp_msg_clear(&r);
    tp_zmsg_close(&z);
    jobref(&h, TP_CMD_STATUS, "never-seen", &z, &r);
    assert_int_equal(r.status, TP_ST_NOT_FOUND);
    tp_msg_clear(&r);
    tp_zmsg_close(&z);
    zmq_close(sub);
    assert_int_equal(harness_stop(&h), 0);
}

/* ---- lost workers ---------------------------------------------------------------- */

/* A killed worker's job moves to its respawned replacement and ends as it
 * would have (max_tokens with ignore_eos: `length`), never in `error`. */
static void killed_worker_is_respawned_and_its_job_goes_on_there(void **state)
{
    (void)state;
    harness h;
    assert_int_equal(harness_start(&h, false, "  respawn_init_ms: 50\n"), 0);
    const char *stages[] = {"forward", "stop", "sample"};
    for (int s = 0; s < 3; s++) {
        char id[32];
        snprintf(id, sizeof id, "k-%s", stages[s]);
        void *sub = harness_subscribe(&h, id);
        submit_long(&h, id);
        harness_sleep_ms(20);
        pid_t victim = harness_child_serving(&h, stages[s]);
        assert_true(victim > 0);
        kill(victim, SIGKILL);
        int reason = wait_finish(sub, id, NULL, WAIT_MS);
        if (reason != TP_REASON_LENGTH)
            fail_msg("job on the killed %s worker finished with %d, want length", stages[s], reason);
        zmq_close(sub);
        /* the respawned worker registers and serves a new job */
        for (int64_t end = tp_now_ms() + WAIT_MS; tp_now_ms() < end;) {
            tp_m_stats_reply st;
            if (harness_stats(&h, &st) == 0 && st.workers[0] && st.workers[1] && st.workers[2] && st.workers[3] &&
                harness_child_serving(&h, stages[s]) > 0 && harness_child_serving(&h, stages[s]) != victim)
                break;
            harness_sleep_ms(50);
        }
        char cmd[1024], *out = NULL;
        snprintf(cmd, sizeof cmd, "%s/tokpipe generate --config %s --json --timeout 10000 --prompt 'Hi' --max-tokens 5",
                 h.bin, h.config);
        int st = harness_sh(cmd, &out);
        if (st != 0 || !strstr(out, "\"completion_tokens\":"))
            fail_msg("after the %s worker was respawned: status %d, %s", stages[s], st, out ? out : "");
        free(out);
    }
    assert_int_equal(harness_stop(&h), 0);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(daemon_survives_malformed_messages_and_keeps_serving),
        cmocka_unit_test(bad_parameters_are_rejected_naming_the_field),
        cmocka_unit_test(cancel_finishes_the_job_and_status_reports_it),
        cmocka_unit_test(killed_worker_is_respawned_and_its_job_goes_on_there),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
