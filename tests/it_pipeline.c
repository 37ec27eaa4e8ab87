/* Process story: the real tokpiped and real workers (ipc, and tcp loopback
 * with a fused forward+sample worker) give, token for token, what
 * `tokpipe run` computes in one process — for greedy and seeded jobs of
 * different lengths and stop settings running concurrently, joining and
 * leaving the batch; and the daemon drains and exits 0 on SIGTERM. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/daemon_harness.h"
#include "support/run_compare.h"

/* Jobs sent at once, each group by its own `tokpipe generate` process so
 * they differ in parameters; every group also has several prompts. */
static const char *const groups[] = {
    "--prompt 'Once upon a time' --prompt 'The cat sat' --prompt 'Lily and Ben' --temperature 0 --max-tokens 60",
    "--prompt 'One day, a little bird' --prompt 'Tom had a red ball' --temperature 0.9 --seed 7 --max-tokens 48 "
    "--stop '.'",
    "--prompt 'The sun was' --temperature 1.0 --seed 11 --top-k 20 --top-p 0.9 --max-tokens 120 --stop-id 400",
    "--prompt 'Once upon a time there was a girl. She liked to play. She had a dog. The dog was big and brown. "
    "They went to the park every day. One day it rained and they stayed home. They played with toys and read "
    "books. Her mom made cookies.' --temperature 0 --max-tokens 24 --stop ' dog' --include-stop",
    "--prompt 'A boy' --temperature 0.7 --seed 3 --min-tokens 10 --max-tokens 30 --repetition-penalty 1.2",
    /* a window of 8 instead of 64 changes these tokens: it must reach the sampler */
    "--prompt 'Tom and Sue' --temperature 0.8 --seed 5 --max-tokens 80 --repetition-penalty 1.5 "
    "--presence-penalty 0.5 --penalty-window 8",
};
#define N_GROUPS (sizeof groups / sizeof groups[0])

static bool have_run(const harness *h)
{
    char cmd[700];
    snprintf(cmd, sizeof cmd, "%s/tokpipe run --help >/dev/null 2>&1", h->bin);
    return harness_sh(cmd, NULL) == 0;
}

static void concurrent_jobs_match_run(bool tcp, const char *extra)
{
    harness h;
    if (harness_start(&h, tcp, extra))
        fail_msg("daemon did not start (%s)", tcp ? "tcp" : "ipc");
    if (!have_run(&h)) {
        harness_stop(&h);
        skip();
    }
    /* all groups at once: their jobs join and leave one running batch */
    char model[1200];
    snprintf(model, sizeof model, "--model %s/stories260K.bin --tokenizer %s/tok512.bin", h.models, h.models);
    daemon_equals_run(&h, groups, N_GROUPS, 20000, model, tcp ? "tcp" : "ipc");
}

static void concurrent_jobs_over_ipc_equal_in_process_run(void **state)
{
    (void)state;
    concurrent_jobs_match_run(false, NULL);
}

static void concurrent_jobs_over_tcp_with_fused_sampling_equal_in_process_run(void **state)
{
    (void)state;
    concurrent_jobs_match_run(true, "  fuse: [\"forward,sample\"]\n");
}

static void small_batches_and_chunks_change_nothing(void **state)
{
    (void)state;
    /* one sequence per step, tiny prefill chunks, one micro-batch: the
     * schedule differs wildly, the tokens must not */
    concurrent_jobs_match_run(false, "batching:\n  max_num_seqs: 3\n  prefill_chunk: 7\n  micro_batches: 1\n"
                                     "  max_batch_tokens: 16\nkv:\n  slots: 3\n");
}

static void waiting_for_every_stop_verdict_changes_nothing(void **state)
{
    (void)state;
    /* without decoding ahead a job idles while its candidate is checked:
     * slower, and the tokens must be the same */
    concurrent_jobs_match_run(false, "batching:\n  decode_ahead: false\n");
}

static void jobs_spread_over_two_samplers_and_two_stop_workers_equal_in_process_run(void **state)
{
    (void)state;
    concurrent_jobs_match_run(false, "  sample: 2\n  stop: 2\n");
}

/* Equal jobs started together stay in micro_batches groups of equal size:
 * a step of a few rows costs about as much as a full one, so a job that
 * falls out of step must rejoin a group, not ride alone (it once did: 32
 * jobs ran as steps of 16 + 15 + 1). Read from the broker's counters. */
static void equal_jobs_run_in_balanced_micro_batches(void **state)
{
    (void)state;
    harness h;
    if (harness_start(&h, false, "batching:\n  micro_batches: 2\n"))
        fail_msg("daemon did not start");
    enum { JOBS = 16, TOKENS = 96 };
    char cmd[8192];
    int at = snprintf(cmd, sizeof cmd, "%s/tokpipe generate --config %s --timeout 20000 --temperature 0 "
                      "--ignore-eos --max-tokens %d", h.bin, h.config, TOKENS);
    for (int i = 0; i < JOBS; i++)
        at += snprintf(cmd + at, sizeof cmd - (size_t)at, " --prompt 'Story %d: once upon a time'", i);
    strcat(cmd, " >/dev/null");
    assert_int_equal(harness_sh(cmd, NULL), 0);
    tp_m_stats_reply st;
    assert_int_equal(harness_stats(&h, &st), 0);
    assert_int_equal(harness_stop(&h), 0);
    assert_int_equal(st.tokens_generated, JOBS * TOKENS);
    /* every accepted token but each job's last was fed back, once */
    uint64_t decode_rows = (uint64_t)JOBS * (TOKENS - 1);
    assert_true(st.forward_rows >= decode_rows + JOBS);
    double mean = (double)st.forward_rows / (double)st.forward_steps;
    print_message("%llu rows in %llu steps: %.2f per step\n", (unsigned long long)st.forward_rows,
                  (unsigned long long)st.forward_steps, mean);
    /* a balanced group is JOBS / 2 rows; the ramp while the jobs are
     * tokenized and admitted one by one costs a few short steps */
    if (mean < 0.8 * JOBS / 2)
        fail_msg("%llu rows in %llu steps: %.2f rows per step, want about %d", (unsigned long long)st.forward_rows,
                 (unsigned long long)st.forward_steps, mean, JOBS / 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(concurrent_jobs_over_ipc_equal_in_process_run),
        cmocka_unit_test(concurrent_jobs_over_tcp_with_fused_sampling_equal_in_process_run),
        cmocka_unit_test(waiting_for_every_stop_verdict_changes_nothing),
        cmocka_unit_test(small_batches_and_chunks_change_nothing),
        cmocka_unit_test(jobs_spread_over_two_samplers_and_two_stop_workers_equal_in_process_run),
        cmocka_unit_test(equal_jobs_run_in_balanced_micro_batches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
