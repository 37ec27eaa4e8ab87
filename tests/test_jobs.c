/* daemon/jobs.c: what the broker keeps of a job's events for STATUS — the
 * text deltas (whole deltas up to the protocol's text cap, the rest only
 * counted) and the ids the TOKEN events carried, at their index. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "../daemon/jobs.h"

typedef struct fixture {
    bjobs b;   /* the job table alone: it needs nothing of the broker */
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    tp_err e;
    if (!f || jobs_init(&f->b, 16, &e))
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    jobs_free(&f->b);
    free(f);
    return 0;
}

static void token(bjobs *b, const char *id, uint32_t seq, uint32_t index, const char *text, const int32_t *ids,
                  size_t n)
{
    tp_msg m;
    tp_msg_init(&m, TP_FAM_EVT, TP_CMD_TOKEN);
    m.token = (tp_m_token){.job_id = tp_str_of(id), .seq = seq, .index = index, .text = tp_str_of(text), .ids = {ids, n}};
    const bjob *j;
    jobs_on_event(b, &m, &j);
}

static void running_job_keeps_the_text_and_ids_its_events_carried(void **state)
{
    fixture *f = *state;
    bjob *j = jobs_new(&f->b, "r1", 2);
    assert_non_null(j);
    j->state = J_RUNNING;
    int32_t a[] = {7}, b2[] = {8, 9};
    token(&f->b, "r1", 0, 0, "Once", a, 1);
    token(&f->b, "r1", 1, 1, "", b2, 2);   /* held back: no text, ids all the same */
    assert_int_equal(j->last_seq, 1);
    assert_int_equal(j->text_len, 4);
    assert_memory_equal(j->text, "Once", 4);
    assert_int_equal(j->n_shown, 3);
    assert_int_equal(j->shown[2], 9);
    /* a heartbeat is not a job's event */
    tp_msg hb;
    tp_msg_init(&hb, TP_FAM_EVT, TP_CMD_HEARTBEAT);
    const bjob *jh = NULL;
    jobs_on_event(&f->b, &hb, &jh);
    assert_null(jh);
    assert_int_equal(j->last_seq, 1);
}

static void events_of_a_lost_stop_worker_are_filled_from_the_verdicts(void **state)
{
    fixture *f = *state;
    bjob *j = jobs_new(&f->b, "r2", 2);
    j->state = J_RUNNING;
    for (int32_t id = 100; id < 104; id++)
        jobs_append_out(j, id);
    int32_t c[] = {104};
    /* a rebuilt stop worker replays 4 accepted tokens silently, then publishes index 4 */
    token(&f->b, "r2", 0, 4, " there", c, 1);
    assert_int_equal(j->n_shown, 5);
    for (int i = 0; i < 5; i++)
        assert_int_equal(j->shown[i], 100 + i);
}

static void text_is_kept_in_whole_deltas_up_to_the_cap(void **state)
{
    fixture *f = *state;
    bjob *j = jobs_new(&f->b, "big", 3);
    size_t half = TP_PROTO_MAX_TEXT / 2;
    char *s = malloc(half);
    memset(s, 'x', half);
    assert_int_equal(jobs_append_text(j, s, half), 0);
    assert_int_equal(jobs_append_text(j, s, half), 0);   /* exactly the cap: kept */
    assert_int_equal(jobs_append_text(j, "abc", 3), 0);  /* past it: counted only */
    assert_int_equal(jobs_append_text(j, "d", 1), 0);    /* and everything after it */
    assert_int_equal(j->text_len, TP_PROTO_MAX_TEXT);
    assert_int_equal(jobs_text_total(j), (uint64_t)TP_PROTO_MAX_TEXT + 4);
    free(s);
}

/* A TOKEN event with the thinking delta r and the call deltas calls. */
static void split_token(bjobs *b, const char *id, uint32_t seq, const char *r, tp_tool_call *calls, size_t n)
{
    tp_msg m;
    tp_msg_init(&m, TP_FAM_EVT, TP_CMD_TOKEN);
    int32_t tok = 1;
    m.token = (tp_m_token){.job_id = tp_str_of(id), .seq = seq, .index = seq, .text = tp_str_of(""),
                           .reasoning = tp_str_of(r), .tool_calls = calls, .n_tool_calls = n, .ids = {&tok, 1}};
    const bjob *j;
    jobs_on_event(b, &m, &j);
}

static tp_tool_call delta(const char *id, const char *name, const char *args)
{
    return (tp_tool_call){tp_str_of(id), tp_str_of(name), tp_str_of(args)};
}

/* The thinking kept for STATUS is bounded like the text, in whole deltas,
 * but a delta that does not fit does not stop a later one that does. */
static void reasoning_keeps_each_delta_that_fits_under_the_cap(void **state)
{
    fixture *f = *state;
    bjob *j = jobs_new(&f->b, "think", 5);
    j->state = J_RUNNING;
    size_t n = TP_PROTO_MAX_TEXT - 2;
    char *s = malloc(n + 1);
    assert_non_null(s);
    memset(s, 'x', n);
    s[n] = '\0';
    split_token(&f->b, "think", 0, s, NULL, 0);
    split_token(&f->b, "think", 1, "abc", NULL, 0);   /* 1 byte too many: refused whole */
    split_token(&f->b, "think", 2, "de", NULL, 0);    /* exactly the cap: kept */
    split_token(&f->b, "think", 3, "f", NULL, 0);     /* past it again */
    tp_str r = jobfields_reasoning(j);
    assert_int_equal(r.len, TP_PROTO_MAX_TEXT);
    assert_memory_equal(r.ptr, s, n);
    assert_memory_equal(r.ptr + n, "de", 2);
    free(s);
}

/* STATUS of a running job: the thinking and the calls as the deltas up to
 * last_seq built them; of a finished one: FINISH's */
static void reasoning_and_calls_so_far_are_kept_for_status(void **state)
{
    fixture *f = *state;
    bjob *j = jobs_new(&f->b, "tc", 2);
    j->state = J_RUNNING;
    assert_null(jobfields_reasoning(j).ptr);
    split_token(&f->b, "tc", 0, "Look", NULL, 0);
    split_token(&f->b, "tc", 1, " it up.", NULL, 0);
    tp_tool_call d1[] = {delta("call_a", "get_weather", ""), delta("call_a", "get_weather", "{\"ci")};
    split_token(&f->b, "tc", 2, NULL, d1, 2);
    tp_tool_call d2[] = {delta("call_a", "get_weather", "ty\": \"Paris\"}"), delta("call_b", "now", "{")};
    split_token(&f->b, "tc", 3, NULL, d2, 2);
    tp_str r = jobfields_reasoning(j);
    assert_int_equal(r.len, 11);
    assert_memory_equal(r.ptr, "Look it up.", 11);
    const tp_tool_call *c;
    assert_int_equal(jobfields_calls(j, &c), 2);
    assert_int_equal(c[0].arguments.len, strlen("{\"city\": \"Paris\"}"));
    assert_memory_equal(c[0].arguments.ptr, "{\"city\": \"Paris\"}", c[0].arguments.len);
    assert_memory_equal(c[1].name.ptr, "now", 3);
    assert_int_equal(c[1].arguments.len, 1);   /* unfinished so far */
    /* FINISH: its whole calls and thinking */
    tp_msg m;
    tp_msg_init(&m, TP_FAM_EVT, TP_CMD_FINISH);
    tp_tool_call whole[] = {delta("call_a", "get_weather", "{\"city\": \"Paris\"}"), delta("call_b", "now", "{}")};
    m.finish = (tp_m_finish){.job_id = tp_str_of("tc"), .seq = 4, .reason = TP_REASON_EOS, .text = tp_str_of(""),
                             .reasoning_content = tp_str_of("Look it up."), .tool_calls = whole, .n_tool_calls = 2};
    const bjob *jj;
    jobs_on_event(&f->b, &m, &jj);
    assert_int_equal(jobfields_calls(j, &c), 2);
    assert_int_equal(c[1].arguments.len, 2);
    assert_memory_equal(c[1].id.ptr, "call_b", 6);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(running_job_keeps_the_text_and_ids_its_events_carried, setup, teardown),
        cmocka_unit_test_setup_teardown(events_of_a_lost_stop_worker_are_filled_from_the_verdicts, setup, teardown),
        cmocka_unit_test_setup_teardown(text_is_kept_in_whole_deltas_up_to_the_cap, setup, teardown),
        cmocka_unit_test_setup_teardown(reasoning_and_calls_so_far_are_kept_for_status, setup, teardown),
        cmocka_unit_test_setup_teardown(reasoning_keeps_each_delta_that_fits_under_the_cap, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
