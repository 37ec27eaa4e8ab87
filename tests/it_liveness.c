/* Process story: broker liveness on the event socket. While `tokpipe
 * generate` waits on a job, the real tokpiped is killed -9 and restarted
 * (generate must notice at once, not at its --timeout, submit the job
 * again and finish it there), or hangs (generate gives up after the heartbeat liveness and
 * one STATUS timeout). A plain SUB socket hears heartbeats of one
 * incarnation, and another after a restart. The job is kept running by
 * stopping the forward worker (SIGSTOP) before it is submitted. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "support/daemon_harness.h"

/* hang detectors, not speed limits (ASan on a loaded 2-CPU machine) */
#define WAIT_MS 30000

/* `tokpipe generate` in the background, its stderr into a file. */
static pid_t start_generate(harness *h, const char *errfile, int timeout_ms)
{
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(errfile, O_WRONLY | O_CREAT | O_TRUNC, 0600), null = open("/dev/null", O_WRONLY);
        dup2(fd, 2);
        dup2(null, 1);
        char exe[600], t[16];
        snprintf(exe, sizeof exe, "%s/tokpipe", h->bin);
        snprintf(t, sizeof t, "%d", timeout_ms);
        execl(exe, exe, "generate", "--config", h->config, "--timeout", t, "--prompt", "Once upon a time",
              "--temperature", "0", "--max-tokens", "50", (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Wait until the broker holds an active job (generate submitted it). */
static void wait_active_job(harness *h)
{
    for (int64_t end = tp_now_ms() + WAIT_MS; tp_now_ms() < end;) {
        tp_m_stats_reply st;
        if (harness_stats(h, &st) == 0 && st.jobs_active >= 1)
            return;
        harness_sleep_ms(10);
    }
    fail_msg("generate's job never became active");
}

/* Exit status of pid within limit_ms (fails the test otherwise); *took_ms. */
static int wait_exit(pid_t pid, int limit_ms, int64_t *took_ms)
{
    int64_t t0 = tp_now_ms();
    int st;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (tp_now_ms() - t0 > limit_ms) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            fail_msg("generate still waiting %d ms later", limit_ms);
        }
        harness_sleep_ms(10);
    }
    *took_ms = tp_now_ms() - t0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *slurp(const char *path)
{
    char *out = NULL;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "cat '%s'", path);
    harness_sh(cmd, &out);
    return out ? out : strdup("");
}

/* A daemon whose forward worker is stopped, and a generate waiting on its
 * job: the job stays active until the test acts on the broker. */
typedef struct stuck {
    harness h;
    pid_t fwd, gen;
    char errfile[256];
} stuck;

static void start_stuck(stuck *s, const char *yaml, int timeout_ms)
{
    if (harness_start(&s->h, false, yaml))
        fail_msg("daemon did not start");
    s->fwd = harness_child_serving(&s->h, "forward");
    assert_true(s->fwd > 0);
    kill(s->fwd, SIGSTOP);
    snprintf(s->errfile, sizeof s->errfile, "%s/generate.err", s->h.dir);
    s->gen = start_generate(&s->h, s->errfile, timeout_ms);
    wait_active_job(&s->h);
}

/* generate's exit status (within WAIT_MS), the time it took and its stderr
 * (caller frees). */
static int generate_end(stuck *s, int64_t *took_ms, char **err)
{
    int rc = wait_exit(s->gen, WAIT_MS, took_ms);
    *err = slurp(s->errfile);
    print_message("generate exited %d after %lld ms:\n%s", rc, (long long)*took_ms, *err);
    return rc;
}

/* The restarted broker does not know generate's job: generate submits it
 * again (same id and seed) and finishes it there. */
static void generate_submits_again_the_job_a_restarted_broker_lost(void **state)
{
    (void)state;
    stuck s;
    /* the stopped forward worker must outlive the test's first second */
    start_stuck(&s, "heartbeat:\n  interval_ms: 1000\n  liveness: 3\n", 60000);
    kill(s.h.pid, SIGKILL);
    waitpid(s.h.pid, NULL, 0);
    kill(s.fwd, SIGKILL);   /* stopped: it would never see its SIGTERM from the dead broker */
    assert_int_equal(harness_spawn_daemon(&s.h, false, NULL), 0);
    int64_t took;
    char *err;
    int rc = generate_end(&s, &took, &err);
    if (rc != 0 || !strstr(err, "tokpiped restarted") || !strstr(err, "submitting it again"))
        fail_msg("generate exited %d, stderr:\n%s", rc, err);
    /* the restart is seen at the new broker's first heartbeat, far below
     * --timeout 60000 (the job then runs on workers a loaded machine may
     * take seconds to start: no tighter bound) */
    if (took > 25000)
        fail_msg("generate took %lld ms to notice the restart", (long long)took);
    free(err);
    harness_wait_workers(&s.h, WAIT_MS);
    assert_int_equal(harness_stop(&s.h), 0);
}

static void generate_gives_up_on_a_hung_broker(void **state)
{
    (void)state;
    stuck s;
    /* silent for 3 x 300 ms = presumed dead; then one STATUS of --timeout 1000 */
    start_stuck(&s, "heartbeat:\n  interval_ms: 300\n  liveness: 3\n", 1000);
    kill(s.h.pid, SIGSTOP);   /* hung: no heartbeat, no reply, no worker expiry */
    int64_t took;
    char *err;
    int rc = generate_end(&s, &took, &err);
    kill(s.h.pid, SIGCONT);
    kill(s.fwd, SIGCONT);
    if (rc != 1 || !strstr(err, "no heartbeat from tokpiped") || !strstr(err, "tokpiped is gone"))
        fail_msg("generate exited %d, stderr:\n%s", rc, err);
    if (took < 800 || took > 15000)
        fail_msg("generate gave up after %lld ms; expected about 900 + 1000", (long long)took);
    free(err);
    assert_int_equal(harness_stop(&s.h), 0);
}

/* Heartbeats received on sub until want of them, or ms passed: their
 * count and the incarnations. Beats of incarnation skip (a broker killed
 * meanwhile: still queued) are passed over. */
static int collect_beats(void *sub, int want, int ms, uint64_t skip, uint64_t *first_inc, uint64_t *last_inc,
                         bool *stable)
{
    int n = 0;
    int64_t end = tp_now_ms() + ms;
    *stable = true;
    for (int64_t left; n < want && (left = end - tp_now_ms()) > 0;) {
        zmq_pollitem_t it = {sub, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, (long)left) <= 0)
            break;
        tp_zmsg z;
        if (tp_zmsg_recv(sub, &z, 0))
            break;
        tp_msg m;
        tp_err e;
        if (tp_proto_decode(TP_FAM_EVT, z.f, z.n, &m, &e) == 0 && m.cmd == TP_CMD_HEARTBEAT &&
            !(skip && m.beat.incarnation == skip)) {
            if (n == 0)
                *first_inc = m.beat.incarnation;
            *stable = *stable && m.beat.incarnation == *first_inc;
            *last_inc = m.beat.incarnation;
            n++;
        }
        tp_msg_clear(&m);
        tp_zmsg_close(&z);
    }
    return n;
}

static void subscriber_hears_one_incarnation_until_the_broker_restarts(void **state)
{
    (void)state;
    harness h;
    if (harness_start(&h, false, NULL))   /* heartbeats every 200 ms */
        fail_msg("daemon did not start");
    void *sub = harness_subscribe(&h, TP_EVT_HEARTBEAT_TOPIC);
    uint64_t a, b, c, d;
    bool stable;
    /* 4 beats: 0.6 s or more at 200 ms intervals, as slow as the machine is */
    int n = collect_beats(sub, 4, WAIT_MS, 0, &a, &b, &stable);
    if (n < 4 || !stable)
        fail_msg("%d heartbeats in %d ms at 200 ms intervals, incarnation %s", n, WAIT_MS,
                 stable ? "stable" : "changed");
    assert_false(tp_job_id_valid(TP_EVT_HEARTBEAT_TOPIC, strlen(TP_EVT_HEARTBEAT_TOPIC)));
    kill(h.pid, SIGKILL);
    waitpid(h.pid, NULL, 0);
    assert_int_equal(harness_spawn_daemon(&h, false, NULL), 0);
    /* the new broker's beats, past the killed one's still queued (a restart
     * that kept the incarnation would show none) */
    n = collect_beats(sub, 3, WAIT_MS, a, &c, &d, &stable);
    if (n < 3 || !stable || c == a)
        fail_msg("after the restart: %d heartbeats of a new incarnation, incarnation %016llx (was %016llx), %s", n,
                 (unsigned long long)c, (unsigned long long)a, stable ? "stable" : "changing");
    zmq_close(sub);
    harness_wait_workers(&h, WAIT_MS);
    assert_int_equal(harness_stop(&h), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(subscriber_hears_one_incarnation_until_the_broker_restarts),
        cmocka_unit_test(generate_submits_again_the_job_a_restarted_broker_lost),
        cmocka_unit_test(generate_gives_up_on_a_hung_broker),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
