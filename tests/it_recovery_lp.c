/* Process story: recovery keeps every byte, logprobs included. Jobs that
 * ask for logprobs and top logprobs run while the sample and stop workers
 * (or one of them) are killed together, at several points of the run; the
 * spawned workers come back and every job's logprobs and top logprobs equal
 * `tokpipe run --json`'s, value for value (no -9999, "could not compute",
 * where a candidate's verdict was owed by a lost stop worker). */
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
#include <unistd.h>

#include "support/daemon_harness.h"
#include "support/run_compare.h"

/* hang detectors, not speed limits (ASan on a loaded 2-CPU machine) */
#define WAIT_MS 60000
#define ROUNDS 6

static const char *const group =
    "--prompt 'Once upon a time' --prompt 'The cat sat' --prompt 'Lily and Ben' "
    "--temperature 0 --max-tokens 200 --ignore-eos --top-logprobs 3";

/* Kill every worker of the daemon serving one of stages ("sample", "stop"). */
static int kill_stages(harness *h, const char *const *stages, size_t n)
{
    pid_t pids[8];
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        pid_t p = harness_child_serving(h, stages[i]);
        if (p > 0 && k < 8)
            pids[k++] = p;
    }
    for (int i = 0; i < k; i++)
        kill(pids[i], SIGKILL);
    return k;
}

/* Every line's logprobs equal run's, entry for entry. */
static void compare_logprobs(const char *what, const char *got, const char *want)
{
    compare_run_lines(what, got, want);
    const char *g = got, *w = want;
    for (int line = 0; *w; line++) {
        const char *ge = strchr(g, '\n'), *we = strchr(w, '\n');
        cJSON *jg = cJSON_ParseWithLength(g, (size_t)(ge - g)), *jw = cJSON_ParseWithLength(w, (size_t)(we - w));
        cJSON *lg = cJSON_GetObjectItem(jg, "logprobs"), *lw = cJSON_GetObjectItem(jw, "logprobs");
        if (!lg || !lw || cJSON_GetArraySize(lg) != cJSON_GetArraySize(lw))
            fail_msg("%s: line %d: %d logprob entries, run has %d", what, line, lg ? cJSON_GetArraySize(lg) : -1,
                     lw ? cJSON_GetArraySize(lw) : -1);
        for (int i = 0; i < cJSON_GetArraySize(lw); i++) {
            char *a = cJSON_PrintUnformatted(cJSON_GetArrayItem(lg, i));
            char *b = cJSON_PrintUnformatted(cJSON_GetArrayItem(lw, i));
            if (!a || !b || strcmp(a, b))
                fail_msg("%s: line %d: logprobs of token %d differ\n daemon: %s\n    run: %s", what, line, i,
                         a ? a : "(none)", b ? b : "(none)");
            free(a);
            free(b);
        }
        cJSON_Delete(jg);
        cJSON_Delete(jw);
        g = ge + 1;
        w = we + 1;
    }
}

/* ROUNDS runs of the group; in each the workers of stages are killed
 * delay_ms[r] into the run (the spawner brings them back). */
static void logprobs_survive(const char *const *stages, size_t n_stages, const char *what)
{
    harness h;
    assert_int_equal(harness_start(&h, false, NULL), 0);
    static const int delay_ms[ROUNDS] = {30, 80, 150, 250, 400, 600};
    char *got[ROUNDS];
    int killed = 0;
    for (int r = 0; r < ROUNDS; r++) {
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "%s/tokpipe generate --config %s --json --timeout %d %s", h.bin, h.config, WAIT_MS,
                 group);
        tp_m_stats_reply before;
        assert_int_equal(harness_stats(&h, &before), 0);
        FILE *p = popen(cmd, "r");
        assert_non_null(p);
        harness_sleep_ms(delay_ms[r]);
        int now_killed = kill_stages(&h, stages, n_stages);
        killed += now_killed;
        size_t cap = 1 << 18, len = fread(got[r] = calloc(1, cap), 1, cap - 1, p);
        got[r][len] = '\0';
        int st = pclose(p);
        if (st != 0)
            fail_msg("%s: generate of round %d failed (status %d): %s", what, r, st, got[r]);
        /* the next round starts once the broker has seen this round's
         * losses and their replacements registered: a loss it had not seen
         * yet would leave a dead worker counted as live */
        for (int waited = 0;; waited += 20) {
            tp_m_stats_reply now;
            assert_int_equal(harness_stats(&h, &now), 0);
            if (now.workers_lost >= before.workers_lost + (uint64_t)now_killed)
                break;
            if (waited > WAIT_MS)
                fail_msg("%s: the broker did not see the %d workers killed (see %s)", what, now_killed, h.dir);
            harness_sleep_ms(20);
        }
        if (harness_wait_workers(&h, WAIT_MS))
            fail_msg("%s: the killed workers did not come back (see %s)", what, h.dir);
    }
    tp_m_stats_reply s;
    assert_int_equal(harness_stats(&h, &s), 0);
    if (s.workers_lost < (uint64_t)killed)
        fail_msg("%s: %d workers killed, the broker lost %llu", what, killed, (unsigned long long)s.workers_lost);
    char cmd[2048], *want = NULL;
    snprintf(cmd, sizeof cmd, "%s/tokpipe run --model %s/stories260K.bin --tokenizer %s/tok512.bin --json %s 2>/dev/null",
             h.bin, h.models, h.models, group);
    assert_int_equal(harness_stop(&h), 0);
    if (harness_sh(cmd, &want) != 0)
        fail_msg("%s: tokpipe run failed: %s", what, want ? want : "");
    for (int r = 0; r < ROUNDS; r++) {
        char label[128];
        snprintf(label, sizeof label, "%s, round %d (kill at %d ms)", what, r, delay_ms[r]);
        compare_logprobs(label, got[r], want);
        free(got[r]);
    }
    free(want);
}

static void logprobs_survive_sample_and_stop_killed_together(void **state)
{
    (void)state;
    static const char *const stages[] = {"sample", "stop"};
    logprobs_survive(stages, 2, "sample+stop killed");
}

static void logprobs_survive_stop_killed(void **state)
{
    (void)state;
    static const char *const stages[] = {"stop"};
    logprobs_survive(stages, 1, "stop killed");
}

static void logprobs_survive_sample_killed(void **state)
{
    (void)state;
    static const char *const stages[] = {"sample"};
    logprobs_survive(stages, 1, "sample killed");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(logprobs_survive_sample_and_stop_killed_together),
        cmocka_unit_test(logprobs_survive_stop_killed),
        cmocka_unit_test(logprobs_survive_sample_killed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
