/* Process story: STATUS of a job while it runs. The real tokpiped answers a
 * running job with exactly what a subscriber has been sent up to last_seq
 * (text deltas and token ids, never text the stop stage still holds back),
 * which is a prefix of the final result; the final STATUS equals what the
 * subscriber saw; `tokpipe status --json` shows the same. The oracle is a
 * plain SUB socket's record of the events. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "support/daemon_harness.h"

#define MAX_EVENTS 1024
#define MAX_SNAPS 256
#define MAX_TOKENS 400
#define JOB "st-long"

/* Every event of one job as a subscriber saw it: the text and ids after
 * each seq. */
typedef struct evlog {
    char text[MAX_TOKENS * 64];
    size_t len;
    int32_t ids[MAX_TOKENS + 1];
    size_t n_ids;
    size_t text_at[MAX_EVENTS], ids_at[MAX_EVENTS];
    uint32_t n_ev;
    int empty_deltas;          /* TOKEN events whose text was held back */
    bool finished;
    uint32_t fin_completion;
    uint64_t fin_text_len;
} evlog;

/* One STATUS reply, copied. */
typedef struct snap {
    int state;
    int64_t last_seq;
    uint32_t completion;
    char *text;
    size_t len;
    int32_t *ids;
    size_t n_ids;
    uint64_t text_len;
} snap;

static void log_event(evlog *l, const tp_msg *m)
{
    uint32_t seq = m->cmd == TP_CMD_TOKEN ? m->token.seq : m->finish.seq;
    if (seq != l->n_ev)
        fail_msg("the subscriber lost events: got seq %u, expected %u", seq, l->n_ev);
    tp_str t = m->cmd == TP_CMD_TOKEN ? m->token.text : m->finish.text;
    assert_true(l->len + t.len <= sizeof l->text);
    memcpy(l->text + l->len, t.ptr, t.len);
    l->len += t.len;
    if (m->cmd == TP_CMD_TOKEN) {
        l->empty_deltas += t.len == 0;
        for (size_t i = 0; i < m->token.ids.n && l->n_ids <= MAX_TOKENS; i++)
            l->ids[l->n_ids++] = tp_raw_i32(m->token.ids, i);
    } else {
        l->finished = true;
        l->fin_completion = m->finish.completion_tokens;
        l->fin_text_len = m->finish.text_len;
    }
    l->text_at[seq] = l->len;
    l->ids_at[seq] = l->n_ids;
    l->n_ev++;
}

static void drain_events(void *sub, evlog *l, int timeout_ms)
{
    zmq_pollitem_t it = {sub, 0, ZMQ_POLLIN, 0};
    while (zmq_poll(&it, 1, timeout_ms) > 0) {
        tp_zmsg z;
        if (tp_zmsg_recv(sub, &z, ZMQ_DONTWAIT))
            return;
        tp_msg m;
        tp_err e;
        if (tp_proto_decode(TP_FAM_EVT, z.f, z.n, &m, &e) == 0 && (m.cmd == TP_CMD_TOKEN || m.cmd == TP_CMD_FINISH) &&
            m.topic.len == strlen(JOB) && !memcmp(m.topic.ptr, JOB, m.topic.len))
            log_event(l, &m);
        tp_msg_clear(&m);
        tp_zmsg_close(&z);
        timeout_ms = 0;
    }
}

static void submit(harness *h, const char *id)
{
    tp_str stop[1] = {tp_str_of(" girlzz")};   /* " g", " gir", " girl" are held back, then released */
    tp_msg m, r;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_SUBMIT);
    m.submit.job_id = tp_str_of(id);
    m.submit.prompt = tp_str_of("Once upon a time");
    tp_params *p = &m.submit.params;
    p->set = TP_P_MAX_TOKENS | TP_P_IGNORE_EOS | TP_P_TEMPERATURE | TP_P_STOP;
    p->max_tokens = MAX_TOKENS, p->ignore_eos = true, p->temperature = 0;
    p->stop = stop, p->n_stop = 1;
    tp_zmsg z;
    assert_int_equal(harness_call(h, &m, &z, &r), 0);
    if (r.cmd != TP_CMD_ACK || r.status != TP_ST_OK)
        fail_msg("SUBMIT %s answered %u %.*s", id, r.status, (int)r.error.len, r.error.ptr ? r.error.ptr : "");
    tp_msg_clear(&r);
    tp_zmsg_close(&z);
}

static snap status(harness *h, const char *id)
{
    tp_msg m, r;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_STATUS);
    m.jobref.job_id = tp_str_of(id);
    tp_zmsg z;
    assert_int_equal(harness_call(h, &m, &z, &r), 0);
    if (r.cmd != TP_CMD_STATUS_REPLY || r.status != TP_ST_OK)
        fail_msg("STATUS %s answered %u", id, r.status);
    const tp_m_status_reply *s = &r.status_reply;
    snap x = {s->state, s->last_seq, s->completion_tokens, malloc(s->text.len + 1), s->text.len,
              malloc((s->tokens.n + 1) * 4), s->tokens.n, s->text_len};
    assert_non_null(s->text.ptr);
    assert_non_null(s->tokens.data);
    memcpy(x.text, s->text.ptr, s->text.len);
    tp_raw_copy(x.ids, s->tokens, 4);
    tp_msg_clear(&r);
    tp_zmsg_close(&z);
    return x;
}

static void snap_free(snap *s)
{
    free(s->text);
    free(s->ids);
}

/* s is exactly the subscriber's record up to s->last_seq. */
static void expect_snapshot_is_event_prefix(const snap *s, const evlog *l, int k)
{
    size_t tl = s->last_seq < 0 ? 0 : l->text_at[s->last_seq];
    size_t il = s->last_seq < 0 ? 0 : l->ids_at[s->last_seq];
    if (s->last_seq >= (int64_t)l->n_ev)
        fail_msg("snapshot %d: last_seq %lld but the subscriber saw %u events", k, (long long)s->last_seq, l->n_ev);
    if (s->len != tl || memcmp(s->text, l->text, tl))
        fail_msg("snapshot %d (last_seq %lld): text '%.*s' is not the events' text '%.*s'", k, (long long)s->last_seq,
                 (int)s->len, s->text, (int)tl, l->text);
    if (s->n_ids != il || memcmp(s->ids, l->ids, il * 4))
        fail_msg("snapshot %d (last_seq %lld): %zu tokens, the events carried %zu (or they differ)", k,
                 (long long)s->last_seq, s->n_ids, il);
    if (s->completion != s->n_ids || s->text_len != s->len)
        fail_msg("snapshot %d: completion_tokens %u / text_len %llu disagree with %zu ids / %zu bytes", k,
                 s->completion, (unsigned long long)s->text_len, s->n_ids, s->len);
}

static void status_of_a_running_job_is_a_prefix_of_its_result(void **state)
{
    (void)state;
    harness h;
    if (harness_start(&h, false, NULL))
        fail_msg("daemon did not start");
    void *sub = harness_subscribe(&h, JOB);
    evlog *l = calloc(1, sizeof *l);
    snap *snaps = calloc(MAX_SNAPS, sizeof *snaps);
    int n = 0;
    submit(&h, JOB);
    for (int spins = 0; !l->finished && spins < 20000; spins++) {
        drain_events(sub, l, 0);
        if (n < MAX_SNAPS)
            snaps[n++] = status(&h, JOB);
        else
            drain_events(sub, l, 10);
    }
    assert_true(l->finished);
    /* the FINISH event can arrive before the job lets go of its workers */
    snap fin = status(&h, JOB);
    for (int i = 0; i < 3000 && fin.state != TP_STATE_FINISHED; i++)   /* 30 s: a hang detector */
        snap_free(&fin), harness_sleep_ms(10), fin = status(&h, JOB);
    drain_events(sub, l, 50);

    assert_int_equal(fin.state, TP_STATE_FINISHED);
    assert_int_equal(fin.n_ids, MAX_TOKENS);
    if (fin.len != l->len || memcmp(fin.text, l->text, l->len))
        fail_msg("final STATUS text '%.*s' differs from the events' '%.*s'", (int)fin.len, fin.text, (int)l->len,
                 l->text);
    if (fin.n_ids != l->n_ids || memcmp(fin.ids, l->ids, l->n_ids * 4))
        fail_msg("final STATUS has %zu tokens, the events %zu (or they differ)", fin.n_ids, l->n_ids);
    assert_int_equal(fin.completion, l->fin_completion);
    assert_int_equal(fin.text_len, l->fin_text_len);
    if (l->empty_deltas == 0)
        fail_msg("no TOKEN event held text back: the stop string no longer exercises hold-back");

    int running = 0;
    for (int k = 0; k < n; k++) {
        const snap *s = &snaps[k];
        expect_snapshot_is_event_prefix(s, l, k);
        if (s->len > fin.len || memcmp(s->text, fin.text, s->len) || s->n_ids > fin.n_ids ||
            memcmp(s->ids, fin.ids, s->n_ids * 4))
            fail_msg("snapshot %d is not a prefix of the final result", k);
        if (k > 0 && (s->last_seq < snaps[k - 1].last_seq || s->n_ids < snaps[k - 1].n_ids))
            fail_msg("snapshot %d went backwards", k);
        running += s->state == TP_STATE_RUNNING && s->n_ids > 0 && s->n_ids < fin.n_ids;
    }
    print_message("%d STATUS replies, %d while running with partial output\n", n, running);
    if (running == 0)
        fail_msg("no STATUS reply caught the job running with partial output (%d replies)", n);
    for (int k = 0; k < n; k++)
        snap_free(&snaps[k]);
    snap_free(&fin);
    free(snaps);
    free(l);
    zmq_close(sub);
    assert_int_equal(harness_stop(&h), 0);
}

/* `tokpipe status --json` of a running job, then of the finished one. */
static void status_command_shows_text_and_tokens_so_far(void **state)
{
    (void)state;
    harness h;
    if (harness_start(&h, false, NULL))
        fail_msg("daemon did not start");
    submit(&h, "st-cmd");
    char cmd[1200], *early = NULL, *late = NULL;
    snprintf(cmd, sizeof cmd, "%s/tokpipe status st-cmd --json --config %s", h.bin, h.config);
    assert_int_equal(harness_sh(cmd, &early), 0);
    snap fin = status(&h, "st-cmd");
    for (int i = 0; i < 3000 && fin.state != TP_STATE_FINISHED; i++)   /* 30 s: a hang detector */
        snap_free(&fin), harness_sleep_ms(10), fin = status(&h, "st-cmd");
    assert_int_equal(fin.state, TP_STATE_FINISHED);
    assert_int_equal(harness_sh(cmd, &late), 0);
    cJSON *e = cJSON_Parse(early), *f = cJSON_Parse(late);
    if (!e || !f)
        fail_msg("not JSON:\n%s\n%s", early, late);
    const char *et = cJSON_GetStringValue(cJSON_GetObjectItem(e, "text"));
    const char *ft = cJSON_GetStringValue(cJSON_GetObjectItem(f, "text"));
    cJSON *eids = cJSON_GetObjectItem(e, "tokens"), *fids = cJSON_GetObjectItem(f, "tokens");
    if (!et || !ft || !cJSON_IsArray(eids) || !cJSON_IsArray(fids))
        fail_msg("text or tokens missing:\n%s\n%s", early, late);
    print_message("first reply: state %s, %d tokens\n",
                  cJSON_GetStringValue(cJSON_GetObjectItem(e, "state")), cJSON_GetArraySize(eids));
    if (strncmp(et, ft, strlen(et)))
        fail_msg("early text '%s' is not a prefix of the final '%s'", et, ft);
    if (strlen(ft) != fin.len || memcmp(ft, fin.text, fin.len))
        fail_msg("status --json text '%s' differs from STATUS's '%.*s'", ft, (int)fin.len, fin.text);
    assert_int_equal(cJSON_GetArraySize(fids), MAX_TOKENS);
    for (int i = 0; i < cJSON_GetArraySize(eids); i++)
        assert_int_equal(cJSON_GetArrayItem(eids, i)->valueint, fin.ids[i]);
    assert_int_equal((int)cJSON_GetNumberValue(cJSON_GetObjectItem(f, "completion_tokens")), MAX_TOKENS);
    cJSON_Delete(e);
    cJSON_Delete(f);
    free(early);
    free(late);
    snap_free(&fin);
    assert_int_equal(harness_stop(&h), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(status_of_a_running_job_is_a_prefix_of_its_result),
        cmocka_unit_test(status_command_shows_text_and_tokens_so_far),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
