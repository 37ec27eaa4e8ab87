/* Process story: queued work survives lost workers. With workers started on
 * their own (`tokpiped --no-spawn`), jobs whose prompt sits at a tokenize
 * worker that stops answering (SIGSTOP) or dies (SIGKILL) are tokenized
 * again by another one and finish with exactly the tokens of `tokpipe run`;
 * the stopped worker's late replies, once it runs again, change nothing;
 * a tokenize worker that registers again (restarted) gets the prompt again
 * and its answer to the old task is ignored; when the only forward worker
 * dies, the job it held and the jobs waiting for admission wait for the
 * next one and run there, giving the tokens of an undisturbed run; a poison
 * job, one that kills every worker it reaches, ends in error after two
 * workers while the others are served. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "support/daemon_harness.h"
#include "support/job_results.h"
#include "tokpipe/config.h"
#include "tokpipe/model.h"

/* lost after 5 silent intervals: 0.5 s, so a stopped worker is declared
 * lost quickly while a loaded machine does not lose the healthy ones */
/* A worker silent for 2 s is lost: long enough that a loaded machine
 * submits a few jobs to a stopped one before it is, short enough to wait
 * for. */
#define HB_YAML "heartbeat:\n  interval_ms: 100\n  liveness: 20\n"
/* hang detectors, not speed limits (ASan on a loaded 2-CPU machine) */
#define WAIT_MS 30000
#define MAX_TOKENS 40

static const char *const prompts[] = {"Once upon a time", "The cat sat", "Lily and Ben", "One day, a little bird"};

/* SUBMIT a greedy job; the reply's status (error text in *why). */
static uint32_t submit_status(harness *h, const char *id, const char *prompt, int max_tokens, char *why, size_t cap)
{
    tp_msg m, r;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_SUBMIT);
    m.submit.job_id = tp_str_of(id);
    m.submit.prompt = tp_str_of(prompt);
    m.submit.params.set = TP_P_MAX_TOKENS | TP_P_TEMPERATURE;
    m.submit.params.max_tokens = max_tokens;
    m.submit.params.temperature = 0;
    tp_zmsg z;
    if (harness_call(h, &m, &z, &r))
        fail_msg("SUBMIT %s: no reply", id);
    uint32_t st = r.status;
    snprintf(why, cap, "%.*s", (int)r.error.len, r.error.ptr ? r.error.ptr : "");
    tp_msg_clear(&r);
    tp_zmsg_close(&z);
    return st;
}

static void submit_greedy(harness *h, const char *id, const char *prompt, int max_tokens)
{
    char why[256];
    uint32_t st = submit_status(h, id, prompt, max_tokens, why, sizeof why);
    if (st != TP_ST_OK)
        fail_msg("SUBMIT %s: status %u %s", id, st, why);
}


static void expect_like_run(harness *h, const char *id, const char *prompt, int max_tokens)
{
    char *got = jr_wait_result(h, id, WAIT_MS), *want = jr_run_json(h, prompt, max_tokens);
    if (strcmp(got, want))
        fail_msg("job %s differs from tokpipe run\n daemon: %s\n    run: %s", id, got, want);
    free(got);
    free(want);
}

static void stop_worker(pid_t pid)
{
    kill(pid, SIGCONT);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}

/* Workers of every stage but tokenize, then one tokenize worker; its pid. */
static pid_t start_pipeline(harness *h, const char *extra, pid_t other[3])
{
    if (harness_start_ex(h, false, extra, true, NULL))
        fail_msg("daemon did not start");
    other[0] = harness_worker(h, "forward");
    other[1] = harness_worker(h, "sample");
    other[2] = harness_worker(h, "stop");
    pid_t tok = harness_worker(h, "tokenize");
    if (harness_wait_workers(h, WAIT_MS))
        fail_msg("workers did not register (see %s)", h->dir);
    return tok;
}

/* Stop the workers (tok2 may be 0: none) and the daemon, which exits 0. */
static void stop_pipeline(harness *h, pid_t tok, pid_t tok2, pid_t other[3])
{
    stop_worker(tok);
    if (tok2 > 0)
        stop_worker(tok2);
    for (int i = 0; i < 3; i++)
        stop_worker(other[i]);
    assert_int_equal(harness_stop(h), 0);
}

/* Submit one job per prompt while the only tokenize worker is stopped, and
 * check they were handed to it (it still counted as live afterwards). */
static void submit_to_stopped_tokenizer(harness *h, pid_t tok, const char *prefix)
{
    kill(tok, SIGSTOP);
    for (size_t i = 0; i < 3; i++) {
        char id[32];
        snprintf(id, sizeof id, "%s-%zu", prefix, i);
        submit_greedy(h, id, prompts[i], MAX_TOKENS);
    }
    tp_m_stats_reply s = jr_stats(h);
    if (s.workers[TP_SI_TOKENIZE] != 1)
        fail_msg("the stopped tokenize worker was lost before the jobs reached it: the machine is too slow for this "
                 "test's heartbeat");
    assert_int_equal(s.jobs_active, 3);
}

static void jobs_at_a_stopped_tokenize_worker_finish_after_it_is_lost(void **state)
{
    (void)state;
    harness h;
    pid_t other[3], tok = start_pipeline(&h, HB_YAML, other);
    submit_to_stopped_tokenizer(&h, tok, "s");
    if (harness_wait_stage(&h, TP_SI_TOKENIZE, 0, WAIT_MS))
        fail_msg("the stopped tokenize worker was never declared lost");
    /* nothing failed: the jobs wait for a tokenize worker */
    tp_m_stats_reply s = jr_stats(&h);
    assert_int_equal(s.jobs_active, 3);
    assert_int_equal(s.jobs_finished, 0);
    pid_t tok2 = harness_worker(&h, "tokenize");
    for (size_t i = 0; i < 3; i++) {
        char id[32];
        snprintf(id, sizeof id, "s-%zu", i);
        expect_like_run(&h, id, prompts[i], MAX_TOKENS);
    }
    /* the stopped worker runs again: it answers the TOKENIZE tasks it
     * holds, on a registration the broker has dropped, then registers anew */
    kill(tok, SIGCONT);
    if (harness_wait_stage(&h, TP_SI_TOKENIZE, 2, WAIT_MS))
        fail_msg("the resumed tokenize worker did not register again (see %s)", h.dir);
    /* its late replies made no job twice and broke nothing */
    for (size_t i = 0; i < 3; i++) {
        char id[32];
        snprintf(id, sizeof id, "s-%zu", i);
        expect_like_run(&h, id, prompts[i], MAX_TOKENS);
    }
    /* both tokenize workers serve new jobs (the least loaded gets each) */
    for (size_t i = 0; i < 4; i++) {
        char id[32];
        snprintf(id, sizeof id, "n-%zu", i);
        submit_greedy(&h, id, prompts[i], MAX_TOKENS);
    }
    for (size_t i = 0; i < 4; i++) {
        char id[32];
        snprintf(id, sizeof id, "n-%zu", i);
        expect_like_run(&h, id, prompts[i], MAX_TOKENS);
    }
    s = jr_stats(&h);
    assert_int_equal(s.jobs_submitted, 7);
    assert_int_equal(s.jobs_finished, 7);
    assert_int_equal(s.jobs_active, 0);
    assert_int_equal(s.finish[TP_REASON_ERROR], 0);
    stop_pipeline(&h, tok, tok2, other);
}

/* The heartbeat would take 25 s to expire here: the broker must notice the
 * closed connection of the killed worker instead (its log says which). */
static void jobs_at_a_killed_tokenize_worker_move_to_the_other_one(void **state)
{
    (void)state;
    harness h;
    pid_t other[3], tok = start_pipeline(&h, "heartbeat:\n  interval_ms: 250\n  liveness: 100\n", other);
    submit_to_stopped_tokenizer(&h, tok, "k");
    kill(tok, SIGKILL);
    waitpid(tok, NULL, 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t tok2 = harness_worker(&h, "tokenize");
    for (size_t i = 0; i < 3; i++) {
        char id[32];
        snprintf(id, sizeof id, "k-%zu", i);
        free(jr_wait_result(&h, id, 20000));
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double waited = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    char cmd[400], *log = NULL;
    snprintf(cmd, sizeof cmd, "grep -c 'lost: connection closed' %s/tokpiped.log", h.dir);
    harness_sh(cmd, &log);
    if (!log || atoi(log) != 1)
        fail_msg("the jobs of the killed worker waited %.1f s, and the broker's log has %s 'lost: connection closed' "
                 "lines, want 1 (see %s/tokpiped.log)",
                 waited, log ? log : "no", h.dir);
    free(log);
    for (size_t i = 0; i < 3; i++) {
        char id[32];
        snprintf(id, sizeof id, "k-%zu", i);
        expect_like_run(&h, id, prompts[i], MAX_TOKENS);
    }
    tp_m_stats_reply s = jr_stats(&h);
    assert_int_equal(s.workers[TP_SI_TOKENIZE], 1);
    assert_int_equal(s.jobs_finished, 3);
    assert_int_equal(s.finish[TP_REASON_ERROR], 0);
    stop_pipeline(&h, tok2, 0, other);
}

static void wait_state(harness *h, const char *id, int want)
{
    int st = TP_STATE_UNKNOWN;
    for (int waited = 0; (st = jr_status_json(h, id, NULL)) != want; waited += 10) {
        if (waited > WAIT_MS)
            fail_msg("job %s: state %d, want %d", id, st, want);
        harness_sleep_ms(10);
    }
}

static void jobs_at_the_lost_only_forward_worker_and_those_queued_run_on_the_next_one(void **state)
{
    (void)state;
    harness h;
    pid_t other[3], tok = start_pipeline(&h, HB_YAML "batching:\n  max_num_seqs: 1\n", other);
    pid_t fwd = other[0];
    /* the only forward worker holds one job (stopped, so it holds it for
     * good) and has no room for the next ones */
    kill(fwd, SIGSTOP);
    submit_greedy(&h, "q-run", prompts[0], MAX_TOKENS);
    wait_state(&h, "q-run", TP_STATE_RUNNING);
    submit_greedy(&h, "q-0", prompts[1], MAX_TOKENS);
    submit_greedy(&h, "q-1", prompts[2], MAX_TOKENS);
    wait_state(&h, "q-0", TP_STATE_QUEUED);
    kill(fwd, SIGKILL);
    waitpid(fwd, NULL, 0);
    if (harness_wait_stage(&h, TP_SI_FORWARD, 0, WAIT_MS))
        fail_msg("the killed forward worker was never declared lost");
    /* the job it held waits for another forward worker (recovery), and
     * a new job is refused while no forward worker is registered
     * (503, "retry later"), but the queued ones wait ... */
    char why[256];
    uint32_t st = submit_status(&h, "q-new", prompts[3], MAX_TOKENS, why, sizeof why);
    if (st != TP_ST_UNAVAILABLE || !strstr(why, "forward"))
        fail_msg("SUBMIT with no forward worker: status %u '%s', want 503 naming the forward stage", st, why);
    harness_sleep_ms(300);
    const char *queued[] = {"q-0", "q-1"};
    for (int i = 0; i < 2; i++)
        if (jr_status_json(&h, queued[i], NULL) != TP_STATE_QUEUED)
            fail_msg("job %s did not wait for a forward worker", queued[i]);
    if (jr_status_json(&h, "q-run", NULL) != TP_STATE_RUNNING)
        fail_msg("the job at the killed forward worker did not wait for another one");
    /* ... and all run, the recovered one first, once a forward worker
     * registers, each giving the tokens of an undisturbed run */
    other[0] = harness_worker(&h, "forward");
    expect_like_run(&h, "q-run", prompts[0], MAX_TOKENS);
    for (int i = 0; i < 2; i++)
        expect_like_run(&h, queued[i], prompts[i + 1], MAX_TOKENS);
    tp_m_stats_reply s = jr_stats(&h);
    assert_int_equal(s.jobs_finished, 3);
    assert_int_equal(s.finish[TP_REASON_ERROR], 0);
    assert_true(s.workers_lost >= 1);
    assert_true(s.recovered[TP_SI_FORWARD] >= 1);
    stop_pipeline(&h, tok, 0, other);
}

/* The one way a lost worker ends a job: no worker of its stage within
 * recovery.deadline_ms. The error names the stage, and the counts are
 * those of the tokens the job's events carried. */
static void a_job_without_a_stop_worker_past_the_recovery_deadline_ends_naming_the_stage(void **state)
{
    (void)state;
    harness h;
    pid_t other[3], tok = start_pipeline(&h, HB_YAML "recovery:\n  deadline_ms: 500\n", other);
    pid_t stp = other[2];
    /* stopped first, so the job is surely running (waiting for verdicts)
     * when its only stop worker dies */
    kill(stp, SIGSTOP);
    submit_greedy(&h, "d-0", prompts[0], 400);
    wait_state(&h, "d-0", TP_STATE_RUNNING);
    kill(stp, SIGKILL);
    waitpid(stp, NULL, 0);
    char *got = jr_wait_result(&h, "d-0", WAIT_MS);
    if (!strstr(got, "\"finish_reason\":\"error\"") || !strstr(got, "recovery: no stop worker within 500 ms"))
        fail_msg("a job without a stop worker past the deadline: %s, want an error naming the stop stage", got);
    cJSON *o = cJSON_Parse(got);
    assert_non_null(o);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "tokens")),
                     (int)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "completion_tokens")));
    cJSON_Delete(o);
    free(got);
    /* a new stop worker serves the next jobs */
    other[2] = harness_worker(&h, "stop");
    if (harness_wait_stage(&h, TP_SI_STOP, 1, WAIT_MS))
        fail_msg("the new stop worker did not register");
    submit_greedy(&h, "d-1", prompts[1], MAX_TOKENS);
    expect_like_run(&h, "d-1", prompts[1], MAX_TOKENS);
    stop_pipeline(&h, tok, 0, other);
}

/* ---- poison jobs ----------------------------------------------------------- */

/* Dead workers are noticed by their closed connection; the stopped ones
 * must not expire meanwhile (a loaded machine serving the other jobs takes
 * long): a silent worker is only lost after 100 s. */
#define POISON_HB "heartbeat:\n  interval_ms: 1000\n  liveness: 100\n"

/* Wait until the broker's log has a line containing what. */
static void wait_log(harness *h, const char *what)
{
    char cmd[400];
    snprintf(cmd, sizeof cmd, "grep -qF '%s' %s/tokpiped.log", what, h->dir);
    for (int waited = 0; harness_sh(cmd, NULL) != 0; waited += 20) {
        if (waited > WAIT_MS)
            fail_msg("the broker never logged '%s' (see %s/tokpiped.log)", what, h->dir);
        harness_sleep_ms(20);
    }
}

/* SIGKILL a worker and wait until the broker has lost n workers in all. */
static void kill_worker(harness *h, pid_t pid, uint64_t n)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    for (int waited = 0; jr_stats(h).workers_lost < n; waited += 20) {
        if (waited > WAIT_MS)
            fail_msg("the killed worker was never declared lost (see %s)", h->dir);
        harness_sleep_ms(20);
    }
}

/* Jobs innocent-0.. submitted now finish exactly as `tokpipe run`. */
static void innocents_are_served(harness *h, const char *prefix, int n)
{
    for (int i = 0; i < n; i++) {
        char id[32];
        snprintf(id, sizeof id, "%s-%d", prefix, i);
        submit_greedy(h, id, prompts[i % 4], MAX_TOKENS);
    }
    for (int i = 0; i < n; i++) {
        char id[32];
        snprintf(id, sizeof id, "%s-%d", prefix, i);
        expect_like_run(h, id, prompts[i % 4], MAX_TOKENS);
    }
}

/* The job ended in error naming the stage and that it lost two workers. */
static void expect_poison(harness *h, const char *id, const char *stage)
{
    char *got = jr_wait_result(h, id, WAIT_MS), want[96];
    snprintf(want, sizeof want, "%s worker lost twice while processing this job", stage);
    if (!strstr(got, "\"finish_reason\":\"error\"") || !strstr(got, want))
        fail_msg("the poison job ended %s, want an error saying '%s'", got, want);
    free(got);
}

/* Poison job id sits at worker `first` of stage si (stopped, so it surely
 * holds it): a second worker of the stage registers and is stopped too,
 * the first is killed, and the job is handed to the second (the broker
 * says so); then a healthy third registers. The second's pid; the third's
 * in *third. */
static pid_t hand_on_once(harness *h, pid_t first, int si, const char *id, pid_t *third)
{
    const char *stage = tp_config_stage_name(si);
    pid_t second = harness_worker(h, stage);
    if (harness_wait_stage(h, si, 2, WAIT_MS))
        fail_msg("the second %s worker did not register", stage);
    kill(second, SIGSTOP);
    kill_worker(h, first, 1);
    char line[96];
    snprintf(line, sizeof line, "job %s: %s continues on worker", id, stage);
    wait_log(h, line);
    *third = harness_worker(h, stage);
    if (harness_wait_stage(h, si, 2, WAIT_MS))
        fail_msg("the third %s worker did not register", stage);
    return second;
}

/* The crash loop, by hand: each tokenize worker the job reaches is
 * killed while it holds the job. After the second the job ends in error,
 * is never handed to a third, and the tokenize worker that came meanwhile
 * served every other job, never given one while the suspect was tried
 * alone. */
static void a_job_that_kills_each_tokenize_worker_it_reaches_ends_after_two(void **state)
{
    (void)state;
    harness h;
    pid_t other[3], t1 = start_pipeline(&h, POISON_HB, other), t3;
    kill(t1, SIGSTOP);
    submit_greedy(&h, "poison", prompts[0], MAX_TOKENS);
    pid_t t2 = hand_on_once(&h, t1, TP_SI_TOKENIZE, "poison", &t3);
    innocents_are_served(&h, "before", 4);
    kill_worker(&h, t2, 2);
    expect_poison(&h, "poison", "tokenize");
    innocents_are_served(&h, "after", 4);
    tp_m_stats_reply s = jr_stats(&h);
    assert_int_equal(s.jobs_poisoned, 1);
    assert_int_equal(s.recovered[TP_SI_TOKENIZE], 1);   /* handed on once, not twice */
    assert_int_equal(s.workers_lost, 2);
    assert_int_equal(s.finish[TP_REASON_ERROR], 1);
    assert_int_equal(s.jobs_finished, 9);
    assert_int_equal(s.workers[TP_SI_TOKENIZE], 1);
    stop_pipeline(&h, t3, 0, other);
}

/* The same at the forward stage, where jobs share a batch: the job's
 * forward worker is killed while a step of it is in flight there, twice.
 * The jobs running beside it on a healthy forward worker are not charged
 * and finish exactly as `tokpipe run`. */
static void a_job_that_kills_each_forward_worker_it_reaches_ends_after_two(void **state)
{
    (void)state;
    harness h;
    pid_t other[3], tok = start_pipeline(&h, POISON_HB, other);
    kill(other[0], SIGSTOP);
    submit_greedy(&h, "poison-f", prompts[0], 400);
    wait_state(&h, "poison-f", TP_STATE_RUNNING);
    pid_t f2 = hand_on_once(&h, other[0], TP_SI_FORWARD, "poison-f", &other[0]);
    innocents_are_served(&h, "beside", 4);
    kill_worker(&h, f2, 2);
    expect_poison(&h, "poison-f", "forward");
    innocents_are_served(&h, "after", 2);
    tp_m_stats_reply s = jr_stats(&h);
    assert_int_equal(s.jobs_poisoned, 1);
    assert_int_equal(s.finish[TP_REASON_ERROR], 1);
    assert_int_equal(s.jobs_finished, 7);
    stop_pipeline(&h, tok, 0, other);
}

/* ---- a tokenize worker that restarts on the same connection -------------- */

static void fake_send(void *d, tp_msg *m)
{
    tp_err e;
    if (tp_zsend_msg(d, NULL, 0, m, &e))
        fail_msg("fake worker: send %s: %s", tp_cmd_name(TP_FAM_WRK, m->cmd), e.msg);
}

/* A READY the broker believes: the model's identity and shape, as a real
 * worker of h's model sends them. */
static void fake_ready(harness *h, void *d, uint64_t incarnation)
{
    char path[700];
    snprintf(path, sizeof path, "%s/stories260K.bin", h->models);
    tp_model *model;
    tp_err e;
    if (tp_model_load(path, &model, &e))
        fail_msg("fake worker: %s", e.msg);
    tp_msg m;
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_READY);
    m.ready.stages = TP_STAGE_TOKENIZE;
    m.ready.instance = tp_str_of("fake-tokenize");
    m.ready.incarnation = incarnation;
    m.ready.capacity = 4;
    m.ready.bos_id = m.ready.eos_id = -1;
    m.ready.model_id = tp_str_of(tp_model_identity(model));
    m.ready.vocab_size = (uint32_t)tp_model_get_config(model)->vocab_size;
    m.ready.seq_len = (uint32_t)tp_model_get_config(model)->seq_len;
    fake_send(d, &m);
    tp_model_free(model);
}

/* Next message from the broker other than HEARTBEAT: its command, and for
 * TOKENIZE its task, slot and text. */
static uint8_t fake_recv(void *d, uint64_t *task, uint32_t *slot, char *text, size_t cap)
{
    for (;;) {
        zmq_pollitem_t it = {d, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 5000) <= 0)
            fail_msg("fake worker: nothing from the broker for 5 s");
        tp_zmsg z;
        tp_msg m;
        tp_err e;
        assert_int_equal(tp_zmsg_recv(d, &z, 0), 0);
        if (tp_proto_decode(TP_FAM_WRK, z.f, z.n, &m, &e))
            fail_msg("fake worker: undecodable message: %s", e.msg);
        uint8_t cmd = m.cmd;
        if (cmd == TP_CMD_TOKENIZE) {
            *task = m.task;
            *slot = m.tokenize.slot;
            snprintf(text, cap, "%.*s", (int)m.tokenize.text.len, m.tokenize.text.ptr);
        }
        tp_msg_clear(&m);
        tp_zmsg_close(&z);
        if (cmd != TP_CMD_HEARTBEAT)
            return cmd;
    }
}

static void fake_tokenized(void *d, uint64_t task, uint32_t slot, const int32_t *ids, size_t n)
{
    tp_msg m;
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_TOKENIZED);
    m.task = task;
    m.status = TP_ST_OK;
    m.tokenized.slot = slot;
    m.tokenized.ids = (tp_raw){ids, n};
    fake_send(d, &m);
}

/* PROTOCOL.md: a second READY from a registered identity means the worker
 * restarted and lost its state; the broker registers it anew. The prompt it
 * held is tokenized again, and its answer to the old task is ignored. */
static void a_tokenize_worker_that_registers_again_gets_the_prompt_again(void **state)
{
    (void)state;
    harness h;
    if (harness_start_ex(&h, false, "heartbeat:\n  interval_ms: 200\n  liveness: 25\n", true, NULL))
        fail_msg("daemon did not start");
    pid_t real[3] = {harness_worker(&h, "forward"), harness_worker(&h, "sample"), harness_worker(&h, "stop")};
    void *d = zmq_socket(h.zctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger);
    zmq_connect(d, h.back);
    uint64_t task1 = 0, task2 = 0;
    uint32_t slot1 = 0, slot2 = 0;
    char text[256];
    fake_ready(&h, d, 1);
    assert_int_equal(fake_recv(d, &task1, &slot1, text, sizeof text), TP_CMD_WELCOME);
    if (harness_wait_workers(&h, WAIT_MS))
        fail_msg("workers did not register (see %s)", h.dir);
    submit_greedy(&h, "again", prompts[0], MAX_TOKENS);
    assert_int_equal(fake_recv(d, &task1, &slot1, text, sizeof text), TP_CMD_TOKENIZE);
    assert_string_equal(text, prompts[0]);
    fake_ready(&h, d, 2);   /* "restarted": the TOKENIZE is forgotten */
    uint8_t cmd = fake_recv(d, &task2, &slot2, text, sizeof text);
    if (cmd != TP_CMD_WELCOME)
        fail_msg("a worker registering again got %s, want WELCOME", tp_cmd_name(TP_FAM_WRK, cmd));
    assert_int_equal(fake_recv(d, &task2, &slot2, text, sizeof text), TP_CMD_TOKENIZE);
    assert_string_equal(text, prompts[0]);
    assert_int_equal(slot2, slot1);
    assert_int_not_equal(task2, task1);
    assert_int_equal(jr_stats(&h).workers[TP_SI_TOKENIZE], 1);
    /* the answer to the forgotten task is wrong on purpose and must not be
     * used; then the right one: "Once upon a time" with BOS, as
     * shared/models/README.md gives it for tok512 */
    static const int32_t wrong[] = {1, 300, 301}, once[] = {1, 403, 407, 261, 378};
    fake_tokenized(d, task1, slot1, wrong, 3);
    fake_tokenized(d, task2, slot2, once, 5);
    expect_like_run(&h, "again", prompts[0], MAX_TOKENS);
    zmq_close(d);
    for (int i = 0; i < 3; i++)
        stop_worker(real[i]);
    assert_int_equal(harness_stop(&h), 0);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(jobs_at_a_stopped_tokenize_worker_finish_after_it_is_lost),
        cmocka_unit_test(jobs_at_a_killed_tokenize_worker_move_to_the_other_one),
        cmocka_unit_test(jobs_at_the_lost_only_forward_worker_and_those_queued_run_on_the_next_one),
        cmocka_unit_test(a_tokenize_worker_that_registers_again_gets_the_prompt_again),
        cmocka_unit_test(a_job_without_a_stop_worker_past_the_recovery_deadline_ends_naming_the_stage),
        cmocka_unit_test(a_job_that_kills_each_tokenize_worker_it_reaches_ends_after_two),
        cmocka_unit_test(a_job_that_kills_each_forward_worker_it_reaches_ends_after_two),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
