/* Process story: poison jobs that hang or crash a stage worker part way
 * through their sequence, each time they reach it again (the worker's
 * TP_TEST_POISON hook), among innocent jobs in flight with them. The
 * broker (spawning its workers) notices a forward or stop worker that
 * stopped answering by the step deadline (recovery.step_timeout_s: the
 * heartbeat here would take 100 s), kills and replaces it; a crashed stop
 * worker by its closed connection. A stopped worker's late answer, once
 * it runs again, is refused and counted. The jobs of the task the worker was computing are
 * tried alone; the poison job ends in `error` naming the stage after it
 * took down a worker while alone twice, within a bounded time, while the
 * innocent jobs finish exactly as `tokpipe run` and the daemon serves new
 * ones. */
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

/* hang detectors, not speed limits (a loaded 2-CPU machine) */
#define WAIT_MS 60000
#define MAX_TOKENS 40

/* A worker silent for 100 s is lost: a hung one must be caught by its step
 * deadline, 4 s here (a healthy step of this model takes milliseconds; 4 s
 * leaves a loaded machine a wide margin). */
#define POISON_YAML(step_s)                                                                                          \
    "  respawn_init_ms: 100\n"                                                                                       \
    "heartbeat:\n  interval_ms: 1000\n  liveness: 100\n"                                                             \
    "recovery:\n  step_timeout_s: " #step_s "\n"

static const char *const prompts[] = {"Once upon a time", "The cat sat", "Lily and Ben", "One day, a little bird"};
/* The poison job's prompt: its first chunk holds token 410 ("A"), which
 * no innocent prompt holds (tok512). */
#define POISON_PROMPT "A dragon slept"
#define POISON_TOKEN "410"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void submit_greedy(harness *h, const char *id, const char *prompt, int max_tokens)
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
    if (r.status != TP_ST_OK)
        fail_msg("SUBMIT %s: status %u %.*s", id, r.status, (int)r.error.len, r.error.ptr);
    tp_msg_clear(&r);
    tp_zmsg_close(&z);
}


static void submit_innocents(harness *h, const char *prefix, int n, int max_tokens)
{
    for (int i = 0; i < n; i++) {
        char id[32];
        snprintf(id, sizeof id, "%s-%d", prefix, i);
        submit_greedy(h, id, prompts[i % 4], max_tokens);
    }
}

/* Jobs prefix-0.. finished exactly as `tokpipe run`. */
static void expect_innocents(harness *h, const char *prefix, int n, int max_tokens)
{
    for (int i = 0; i < n; i++) {
        char id[32];
        snprintf(id, sizeof id, "%s-%d", prefix, i);
        char *got = jr_wait_result(h, id, WAIT_MS), *want = jr_run_json(h, prompts[i % 4], max_tokens);
        if (strcmp(got, want))
            fail_msg("innocent job %s differs from tokpipe run\n daemon: %s\n    run: %s", id, got, want);
        free(got);
        free(want);
    }
}

/* The poison job ends in error saying the stage lost two workers. */
static void expect_poison(harness *h, const char *id, const char *stage)
{
    char *got = jr_wait_result(h, id, WAIT_MS), want[96];
    snprintf(want, sizeof want, "%s worker lost twice while processing this job", stage);
    if (!strstr(got, "\"finish_reason\":\"error\"") || !strstr(got, want))
        fail_msg("the poison job ended %s, want an error saying '%s' (log in %s)", got, want, h->dir);
    free(got);
}

/* The broker's log has a line containing what (count lines in *n). */
static int log_count(harness *h, const char *what)
{
    char cmd[400], *out = NULL;
    snprintf(cmd, sizeof cmd, "grep -cF '%s' %s/tokpiped.log", what, h->dir);
    harness_sh(cmd, &out);
    int n = out ? atoi(out) : 0;
    free(out);
    return n;
}

/* Start the daemon with its workers under TP_TEST_POISON=spec (only the
 * workers of the spec's stage act on it). */
static void start_poisoned(harness *h, const char *spec, const char *yaml)
{
    setenv("TP_TEST_POISON", spec, 1);
    int rc = harness_start(h, false, yaml);
    unsetenv("TP_TEST_POISON");
    if (rc)
        fail_msg("daemon did not start");
}

/* The poison job hangs the forward worker once its sequence passes 20
 * positions (8 tokens generated), in a batch with four innocent jobs. The
 * worker sends nothing any more, not even heartbeats, and would be lost
 * only after 100 s: the step deadline loses it after 4 s, kills it, and
 * the broker starts another. The jobs of the hung step are tried alone;
 * the poison one hangs the next worker alone, then the next, and ends. */
static void a_job_that_hangs_its_forward_worker_ends_naming_the_stage(void **state)
{
    (void)state;
    harness h;
    start_poisoned(&h, "forward:hang:20:" POISON_TOKEN, POISON_YAML(4));
    double t0 = now_s();
    submit_greedy(&h, "poison", POISON_PROMPT, 200);
    submit_innocents(&h, "beside", 4, MAX_TOKENS);
    expect_poison(&h, "poison", "forward");
    double took = now_s() - t0;
    expect_innocents(&h, "beside", 4, MAX_TOKENS);
    /* three hung workers at most (the first in a batch, then two alone),
     * 4 s each, and their replacements' starts */
    if (took > 45.0)
        fail_msg("the poison job took %.1f s to end, want under 45 (log in %s)", took, h.dir);
    if (log_count(&h, "lost: step deadline") > 3)
        fail_msg("%d forward workers were lost to the step deadline, want 3 at most (log in %s)",
                 log_count(&h, "lost: step deadline"), h.dir);
    /* the daemon goes on serving with a new forward worker */
    submit_innocents(&h, "after", 2, MAX_TOKENS);
    expect_innocents(&h, "after", 2, MAX_TOKENS);
    tp_m_stats_reply s = jr_stats(&h);
    assert_int_equal(s.jobs_poisoned, 1);
    assert_int_equal(s.finish[TP_REASON_ERROR], 1);
    assert_int_equal(s.jobs_finished, 7);
    assert_int_equal(harness_stop(&h), 0);
}

/* The poison job crashes the stop worker at its sixth candidate, each time
 * it gets there (a new worker replays the five accepted ones first), while
 * eight innocent jobs run beside it with candidates at the same worker:
 * the crash is charged to the job whose verdicts the worker was computing,
 * so the innocent ones, never in that task, are not suspects at all. */
static void a_job_that_crashes_its_stop_worker_part_way_ends_naming_the_stage(void **state)
{
    (void)state;
    harness h;
    start_poisoned(&h, "stop:crash:5:poison", POISON_YAML(30));
    double t0 = now_s();
    submit_innocents(&h, "beside", 4, 120);
    submit_greedy(&h, "poison", POISON_PROMPT, 200);
    submit_innocents(&h, "more", 4, 120);
    expect_poison(&h, "poison", "stop");
    double took = now_s() - t0;
    tp_m_stats_reply s = jr_stats(&h);
    /* the first crash may be in a batch, the next two are alone */
    if (s.workers_lost > 3)
        fail_msg("%llu stop workers were lost, want 3 at most: the poison job was not tried alone (log in %s)",
                 (unsigned long long)s.workers_lost, h.dir);
    if (took > 30.0)
        fail_msg("the poison job took %.1f s to end, want under 30 (log in %s)", took, h.dir);
    expect_innocents(&h, "beside", 4, 120);
    expect_innocents(&h, "more", 4, 120);
    submit_innocents(&h, "after", 2, MAX_TOKENS);
    expect_innocents(&h, "after", 2, MAX_TOKENS);
    s = jr_stats(&h);
    assert_int_equal(s.jobs_poisoned, 1);
    assert_int_equal(s.finish[TP_REASON_ERROR], 1);
    assert_int_equal(s.jobs_finished, 11);
    assert_int_equal(harness_stop(&h), 0);
}

/* The poison job hangs the stop worker at its fourth candidate: the stop
 * worker every job shares stops answering, so all of them wait for the
 * step deadline (4 s); the hung worker is killed, the jobs whose verdicts
 * it owed are replayed, the suspect's alone, and the poison job ends after
 * it hung a worker alone twice. */
static void a_job_that_hangs_its_stop_worker_ends_naming_the_stage(void **state)
{
    (void)state;
    harness h;
    start_poisoned(&h, "stop:hang:3:poison", POISON_YAML(4));
    double t0 = now_s();
    submit_innocents(&h, "beside", 4, 120);
    submit_greedy(&h, "poison", POISON_PROMPT, 200);
    expect_poison(&h, "poison", "stop");
    double took = now_s() - t0;
    if (took > 45.0)
        fail_msg("the poison job took %.1f s to end, want under 45 (log in %s)", took, h.dir);
    tp_m_stats_reply s = jr_stats(&h);
    if (s.workers_hung > 3 || s.workers_hung < 2)
        fail_msg("%llu stop workers hung, want 2 or 3 (log in %s)", (unsigned long long)s.workers_hung, h.dir);
    expect_innocents(&h, "beside", 4, 120);
    submit_innocents(&h, "after", 2, MAX_TOKENS);
    expect_innocents(&h, "after", 2, MAX_TOKENS);
    s = jr_stats(&h);
    assert_int_equal(s.jobs_poisoned, 1);
    assert_int_equal(s.finish[TP_REASON_ERROR], 1);
    assert_int_equal(s.jobs_finished, 7);
    assert_int_equal(harness_stop(&h), 0);
}

/* A forward worker stopped (SIGSTOP) with a job's step owed, started by
 * hand (`tokpiped --no-spawn`): lost at its step deadline, 3 s, though its
 * heartbeat would last 100 s, and counted as hung; the job runs on the next
 * forward worker exactly as `tokpipe run`. Run again, the stopped worker
 * answers the step on the registration the broker dropped: the answer is
 * refused and counted, and the worker registers anew. */
static void a_stopped_forward_worker_is_lost_at_its_step_deadline_and_its_late_answer_refused(void **state)
{
    (void)state;
    harness h;
    if (harness_start_ex(&h, false, POISON_YAML(3), true, NULL))
        fail_msg("daemon did not start");
    pid_t w[5] = {harness_worker(&h, "tokenize"), harness_worker(&h, "forward"), harness_worker(&h, "sample"),
                  harness_worker(&h, "stop"), 0};
    if (harness_wait_workers(&h, WAIT_MS))
        fail_msg("workers did not register (see %s)", h.dir);
    kill(w[1], SIGSTOP);
    double t0 = now_s();
    submit_greedy(&h, "held", prompts[0], MAX_TOKENS);
    if (harness_wait_stage(&h, TP_SI_FORWARD, 0, WAIT_MS))
        fail_msg("the stopped forward worker was never declared lost (see %s)", h.dir);
    double took = now_s() - t0;
    if (took > 20.0)
        fail_msg("the stopped forward worker was lost after %.1f s, want its 3 s step deadline", took);
    tp_m_stats_reply s = jr_stats(&h);
    assert_int_equal(s.workers_hung, 1);
    assert_int_equal(s.replies_refused, 0);
    w[4] = harness_worker(&h, "forward");
    char *got = jr_wait_result(&h, "held", WAIT_MS), *want = jr_run_json(&h, prompts[0], MAX_TOKENS);
    if (strcmp(got, want))
        fail_msg("the job of the hung worker differs from tokpipe run\n daemon: %s\n    run: %s", got, want);
    free(got);
    free(want);
    kill(w[1], SIGCONT);
    for (int waited = 0; jr_stats(&h).replies_refused < 1; waited += 50) {
        if (waited > WAIT_MS)
            fail_msg("the resumed worker's late answer was not refused and counted (see %s)", h.dir);
        harness_sleep_ms(50);
    }
    if (harness_wait_stage(&h, TP_SI_FORWARD, 2, WAIT_MS))
        fail_msg("the resumed forward worker did not register again (see %s)", h.dir);
    s = jr_stats(&h);
    assert_int_equal(s.jobs_finished, 1);
    assert_int_equal(s.finish[TP_REASON_ERROR], 0);
    for (int i = 0; i < 5; i++) {
        kill(w[i], SIGTERM);
        waitpid(w[i], NULL, 0);
    }
    assert_int_equal(harness_stop(&h), 0);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_job_that_hangs_its_forward_worker_ends_naming_the_stage),
        cmocka_unit_test(a_job_that_crashes_its_stop_worker_part_way_ends_naming_the_stage),
        cmocka_unit_test(a_job_that_hangs_its_stop_worker_ends_naming_the_stage),
        cmocka_unit_test(a_stopped_forward_worker_is_lost_at_its_step_deadline_and_its_late_answer_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
