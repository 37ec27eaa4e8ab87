/* Process story: speculative decoding through the daemon. Jobs with
 * params.speculative ngram (and jobs that speculate by the config's
 * default) give, token for token, what `tokpipe run` computes in one
 * process, with separate and with fused sampling, small batches and
 * without decoding ahead; mixed with jobs that do not speculate; the
 * broker's counters show guesses were verified and taken. A worker of any
 * stage killed mid-job, the draft stage's (mode draft, stories260K drafting
 * for itself) included, changes nothing either. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "support/daemon_harness.h"
#include "support/run_compare.h"

#define SPEC " --speculative ngram"

/* Each group by its own `tokpipe generate` process; run gets the same
 * arguments (and speculates too: test_spec / spec_test show that changes
 * nothing in process). */
static const char *const groups[] = {
    "--prompt 'Once upon a time' --prompt 'The cat sat on the mat. The cat sat on the mat. The cat sat on the' "
    "--temperature 0 --max-tokens 90" SPEC,
    "--prompt 'One day, a little bird' --prompt 'Tom had a red ball' --temperature 0.9 --seed 7 --max-tokens 60 "
    "--stop '.'" SPEC " --draft-max 3",
    "--prompt 'The sun was' --temperature 1.0 --seed 11 --top-k 20 --top-p 0.9 --max-tokens 120 --stop-id 400" SPEC,
    "--prompt 'Lily wanted to play with her toys. She saw a big box. Lily wanted to play' --temperature 0 "
    "--max-tokens 70 --stop ' box' --include-stop" SPEC " --draft-max 16",
    "--prompt 'A boy' --temperature 0.7 --seed 3 --min-tokens 10 --max-tokens 50 --repetition-penalty 1.2" SPEC,
    /* no speculation: plain items beside the verify items */
    "--prompt 'Tom and Sue' --temperature 0.8 --seed 5 --max-tokens 80 --presence-penalty 0.5",
    "--prompt 'Once upon a time, there was a dog' --temperature 0 --ignore-eos --max-tokens 150 --logprobs "
    "--top-logprobs 2" SPEC,
};
#define N_GROUPS (sizeof groups / sizeof groups[0])

static void spec_jobs_match_run(bool tcp, const char *extra, const char *const *g, size_t n)
{
    harness h;
    if (harness_start(&h, tcp, extra))
        fail_msg("daemon did not start (%s)", tcp ? "tcp" : "ipc");
    char model[1200], cmd[4096];
    snprintf(model, sizeof model, "--model %s/stories260K.bin --tokenizer %s/tok512.bin", h.models, h.models);
    /* a first job shows the guesses are verified and taken here, and
     * FINISH (generate --json) counts them */
    char *out = NULL;
    snprintf(cmd, sizeof cmd, "%s/tokpipe generate --config %s --timeout 20000 --json %s", h.bin, h.config, g[0]);
    assert_int_equal(harness_sh(cmd, &out), 0);
    const char *d = out ? strstr(out, "\"draft_accepted\":") : NULL;
    if (!d || atoi(d + strlen("\"draft_accepted\":")) <= 0 || !strstr(out, "\"draft_tokens\":"))
        fail_msg("%s: generate --json has no draft counts or none accepted: %s", extra ? extra : "plain",
                 out ? out : "");
    free(out);
    tp_m_stats_reply st;
    assert_int_equal(harness_stats(&h, &st), 0);
    if (!st.spec_verify_steps || !st.spec_accepted)
        fail_msg("%s: %llu verify steps, %llu guesses taken", extra ? extra : "plain",
                 (unsigned long long)st.spec_verify_steps, (unsigned long long)st.spec_accepted);
    if (st.workers_lost)
        fail_msg("%s: %llu workers lost (crashed? see %s)", extra ? extra : "plain",
                 (unsigned long long)st.workers_lost, h.dir);
    daemon_equals_run(&h, g, n, 30000, model, extra ? extra : "plain");
}

/* draft without a draft model: refused, naming the field */
static void draft_without_a_draft_model_is_refused(void **state)
{
    (void)state;
    harness h;
    if (harness_start(&h, false, NULL))
        fail_msg("daemon did not start");
    char cmd[4096], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s/tokpipe generate --config %s --timeout 20000 --prompt hi --speculative draft 2>&1",
             h.bin, h.config);
    int rc = harness_sh(cmd, &out);
    assert_int_equal(harness_stop(&h), 0);
    assert_int_not_equal(rc, 0);
    if (!out || !strstr(out, "params.speculative.mode") || !strstr(out, "draft model"))
        fail_msg("generate --speculative draft said: %s", out ? out : "(nothing)");
    free(out);
}

static void speculating_jobs_equal_in_process_run(void **state)
{
    (void)state;
    spec_jobs_match_run(false, NULL, groups, N_GROUPS);
}

static void speculating_jobs_with_fused_sampling_equal_in_process_run(void **state)
{
    (void)state;
    spec_jobs_match_run(true, "  fuse: [\"forward,sample\"]\n", groups, N_GROUPS);
}

static void speculating_in_small_batches_without_decoding_ahead_changes_nothing(void **state)
{
    (void)state;
    spec_jobs_match_run(false, "batching:\n  max_num_seqs: 3\n  prefill_chunk: 7\n  micro_batches: 1\n"
                               "  max_batch_tokens: 16\n  decode_ahead: false\nkv:\n  slots: 3\n",
                        groups, N_GROUPS);
}

/* The config's default speculates for jobs that say nothing; run is told. */
static void the_configured_default_speculates_and_changes_nothing(void **state)
{
    (void)state;
    static const char *const plain[] = {
        "--prompt 'The cat sat on the mat. The cat sat on the mat. The cat sat on the' --temperature 0 "
        "--max-tokens 100 --ignore-eos",
        "--prompt 'Lily and Ben' --temperature 0.8 --seed 9 --max-tokens 60",
    };
    harness h;
    if (harness_start(&h, false, "speculative:\n  mode: ngram\n  n_max: 5\n"))
        fail_msg("daemon did not start");
    char model[1200];
    snprintf(model, sizeof model, "--model %s/stories260K.bin --tokenizer %s/tok512.bin", h.models, h.models);
    /* the broker's counters, read before daemon_equals_run stops it */
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s/tokpipe generate --config %s --timeout 20000 %s >/dev/null", h.bin, h.config,
             plain[0]);
    assert_int_equal(harness_sh(cmd, NULL), 0);
    tp_m_stats_reply st;
    assert_int_equal(harness_stats(&h, &st), 0);
    print_message("drafted %llu, accepted %llu in %llu verify steps\n", (unsigned long long)st.spec_drafted,
                  (unsigned long long)st.spec_accepted, (unsigned long long)st.spec_verify_steps);
    assert_true(st.spec_verify_steps > 0);
    assert_true(st.spec_accepted > 0);
    assert_true(st.spec_accepted <= st.spec_drafted);
    daemon_equals_run(&h, plain, 2, 30000, model, "config default");
}

/* The OpenBLAS kernel's rows depend on the step, so it never verifies:
 * a speculating job runs as a plain one (no guesses sent). */
static void the_openblas_kernel_does_not_verify(void **state)
{
    (void)state;
    harness h;
    if (harness_start(&h, false, "  forward_kernel: openblas\n"))
        fail_msg("daemon did not start");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s/tokpipe generate --config %s --timeout 20000 %s >/dev/null 2>&1", h.bin, h.config,
             groups[0]);
    int rc = harness_sh(cmd, NULL);
    tp_m_stats_reply st;
    assert_int_equal(harness_stats(&h, &st), 0);
    assert_int_equal(harness_stop(&h), 0);
    assert_int_equal(rc, 0);
    assert_int_equal(st.spec_verify_steps, 0);
    assert_int_equal(st.finish[TP_REASON_ERROR], 0);
}

/* A worker of `stage` killed (SIGKILL) while speculating jobs run: tokpiped
 * starts another, the jobs move there (their state rebuilt from the job
 * record: prompt + candidates), and their tokens are those of tokpipe run.
 * The draft stage's jobs (mode draft) step without guesses meanwhile and
 * are fed to the new draft worker from the start. */
static void killed_worker_changes_nothing(const char *stage)
{
    harness h;
    bool draft = !strcmp(stage, "draft");
    char extra[1400];
    int at = snprintf(extra, sizeof extra, "heartbeat:\n  interval_ms: 100\n  liveness: 50\n");
    const char *models = getenv("TP_MODELS");
    if (draft)   /* (the harness's default models directory, as it resolves it) */
        snprintf(extra + at, sizeof extra - (size_t)at, "speculative:\n  draft_model: %s/stories260K.bin\n",
                 models ? models : "../shared/models");
    if (harness_start(&h, false, extra))
        fail_msg("daemon did not start");
    char args[1600];
    snprintf(args, sizeof args, "--prompt 'The cat sat on the mat. The cat sat on the mat. The cat sat on the' "
             "--prompt 'Once upon a time' --prompt 'Lily and Ben went to the park' --prompt 'One day' "
             "--prompt 'The dog ran. The dog ran. The dog' --prompt 'Tim had a red ball' --temperature 0.6 --seed 21 "
             "--max-tokens 400 --ignore-eos --speculative %s --logprobs", draft ? "draft" : "ngram");
    char cmd[4096], out[600], done[600];
    snprintf(out, sizeof out, "%s/spec-gen.json", h.dir);
    snprintf(done, sizeof done, "%s/spec-gen.done", h.dir);
    snprintf(cmd, sizeof cmd, "(%s/tokpipe generate --config %s --timeout 30000 --json %s > %s 2>&1; touch %s) &",
             h.bin, h.config, args, out, done);
    /* mid-job: the victim is stopped from the start and let run a
     * millisecond at a time until some verify steps went through (a draft
     * worker runs freely, its jobs would not wait for one that slow: the
     * forward worker is held back instead) */
    pid_t pid = harness_child_serving(&h, stage);
    if (pid <= 0)
        fail_msg("no %s worker to kill", stage);
    tp_m_stats_reply st;
    /* (the jobs need no draft worker: one not registered yet would be
     * spared the jobs' drafts, not killed in the middle of them) */
    for (int waited = 0; draft && harness_stats(&h, &st) == 0 && !st.workers[4]; waited += 20) {
        if (waited > 30000)
            fail_msg("the draft worker never registered (see %s)", h.dir);
        harness_sleep_ms(20);
    }
    pid_t held = draft ? harness_child_serving(&h, "forward") : pid;
    kill(held, SIGSTOP);
    assert_int_equal(harness_sh(cmd, NULL), 0);
    for (int tries = 0; harness_stats(&h, &st) == 0 && st.spec_verify_steps < 5; tries++) {
        if (tries > 5000 || st.jobs_finished)
            fail_msg("%s: %llu verify steps, %llu jobs finished: not mid-job", stage,
                     (unsigned long long)st.spec_verify_steps, (unsigned long long)st.jobs_finished);
        kill(held, SIGCONT);
        harness_sleep_ms(1);
        kill(held, SIGSTOP);
        harness_sleep_ms(2);
    }
    kill(pid, SIGKILL);
    if (held != pid)
        kill(held, SIGCONT);
    struct stat sb;
    for (int waited = 0; stat(done, &sb) != 0; waited += 20) {
        if (waited > 60000)
            fail_msg("%s: generate did not finish (see %s)", stage, h.dir);
        harness_sleep_ms(20);
    }
    assert_int_equal(harness_stats(&h, &st), 0);
    char *got = NULL, *want = NULL;
    snprintf(cmd, sizeof cmd, "cat %s", out);
    harness_sh(cmd, &got);
    assert_int_equal(harness_stop(&h), 0);
    print_message("%s: pid %d, lost %llu, verify steps %llu, jobs finished %llu\n", stage, (int)pid,
                  (unsigned long long)st.workers_lost, (unsigned long long)st.spec_verify_steps,
                  (unsigned long long)st.jobs_finished);
    if (st.workers_lost < 1)
        fail_msg("%s: the killed worker was not lost (finished before it?)", stage);
    snprintf(cmd, sizeof cmd, "%s/tokpipe run --model %s/stories260K.bin --tokenizer %s/tok512.bin --json %s "
             "--draft-model %s/stories260K.bin 2>/dev/null", h.bin, h.models, h.models, args, h.models);
    assert_int_equal(harness_sh(cmd, &want), 0);
    char what[64];
    snprintf(what, sizeof what, "killed %s worker", stage);
    compare_run_lines(what, got ? got : "", want ? want : "");
    free(got);
    free(want);
}

static void a_killed_forward_worker_changes_nothing(void **state)
{
    (void)state;
    killed_worker_changes_nothing("forward");
}

static void a_killed_sample_worker_changes_nothing(void **state)
{
    (void)state;
    killed_worker_changes_nothing("sample");
}

static void a_killed_stop_worker_changes_nothing(void **state)
{
    (void)state;
    killed_worker_changes_nothing("stop");
}

static void a_killed_draft_worker_changes_nothing(void **state)
{
    (void)state;
    killed_worker_changes_nothing("draft");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(speculating_jobs_equal_in_process_run),
        cmocka_unit_test(speculating_jobs_with_fused_sampling_equal_in_process_run),
        cmocka_unit_test(speculating_in_small_batches_without_decoding_ahead_changes_nothing),
        cmocka_unit_test(the_configured_default_speculates_and_changes_nothing),
        cmocka_unit_test(draft_without_a_draft_model_is_refused),
        cmocka_unit_test(the_openblas_kernel_does_not_verify),
        cmocka_unit_test(a_killed_forward_worker_changes_nothing),
        cmocka_unit_test(a_killed_sample_worker_changes_nothing),
        cmocka_unit_test(a_killed_stop_worker_changes_nothing),
        cmocka_unit_test(a_killed_draft_worker_changes_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
