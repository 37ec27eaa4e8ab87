/* Process story: lifecycle. Workers started on their own (as systemd does,
 * `tokpiped --no-spawn`) register, survive a broker crash and restart by
 * reconnecting, and serve again; SIGTERM lets running jobs finish before
 * the daemon exits 0; the daemon tells systemd READY=1 and STOPPING=1; a
 * second daemon on the same sockets refuses to start. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "support/daemon_harness.h"

/* hang detectors, not speed limits (ASan on a loaded 2-CPU machine) */
#define WAIT_MS 30000

static void generate_ok(harness *h, const char *what)
{
    char cmd[1400], *out = NULL;
    snprintf(cmd, sizeof cmd,
             "%s/tokpipe generate --config %s --json --timeout 10000 --prompt 'Once upon a time' --temperature 0 "
             "--max-tokens 20 2>&1",
             h->bin, h->config);
    int st = harness_sh(cmd, &out);
    if (st != 0 || !strstr(out, "\"finish_reason\":\"length\""))
        fail_msg("%s: generate status %d: %s", what, st, out ? out : "");
    free(out);
}

static void workers_reconnect_after_the_broker_restarts(void **state)
{
    (void)state;
    harness h;
    assert_int_equal(harness_start_ex(&h, false, NULL, true, NULL), 0);
    const char *stages[] = {"tokenize", "forward", "sample", "stop"};
    pid_t w[4];
    for (int i = 0; i < 4; i++)
        w[i] = harness_worker(&h, stages[i]);
    assert_int_equal(harness_wait_workers(&h, WAIT_MS), 0);
    generate_ok(&h, "before the restart");
    /* crash the broker: no DISCONNECT, no cleanup */
    kill(h.pid, SIGKILL);
    waitpid(h.pid, NULL, 0);
    harness_sleep_ms(300);
    assert_int_equal(harness_spawn_daemon(&h, true, NULL), 0);
    if (harness_wait_workers(&h, WAIT_MS))
        fail_msg("workers did not register with the restarted broker (see %s)", h.dir);
    generate_ok(&h, "after the restart");
    for (int i = 0; i < 4; i++) {
        int st;
        assert_int_equal(waitpid(w[i], &st, WNOHANG), 0);   /* never exited */
        kill(w[i], SIGTERM);
        waitpid(w[i], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            fail_msg("worker %s did not exit 0 on SIGTERM", stages[i]);
    }
    assert_int_equal(harness_stop(&h), 0);
}

static void sigterm_lets_running_jobs_finish_then_exits_zero(void **state)
{
    (void)state;
    harness h;
    assert_int_equal(harness_start(&h, false, NULL), 0);
    char cmd[1400];
    snprintf(cmd, sizeof cmd,
             "%s/tokpipe generate --config %s --json --timeout 20000 --prompt 'Once upon a time' --temperature 0 "
             "--max-tokens 400 --ignore-eos",
             h.bin, h.config);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    /* the job is running (a fixed wait let a loaded machine send SIGTERM
     * before generate's SUBMIT, which the draining broker then refused) */
    tp_m_stats_reply s;
    for (int64_t end = tp_now_ms() + WAIT_MS; harness_stats(&h, &s) || s.jobs_active == 0; harness_sleep_ms(5))
        if (tp_now_ms() > end)
            fail_msg("generate's job never reached the daemon (log in %s)", h.dir);
    kill(h.pid, SIGTERM);
    char out[65536];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    assert_int_equal(pclose(p), 0);
    if (!strstr(out, "\"completion_tokens\":400"))
        fail_msg("the running job did not finish during the drain: %s", out);
    int st;
    assert_int_equal(waitpid(h.pid, &st, 0), h.pid);
    h.pid = 0;
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    harness_stop(&h);
}

static void daemon_notifies_systemd(void **state)
{
    (void)state;
    char path[108];
    snprintf(path, sizeof path, "/tmp/tpit-notify-%d.sock", (int)getpid());
    unlink(path);
    int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timeval tv = {WAIT_MS / 1000, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    harness h;
    assert_int_equal(harness_start_ex(&h, false, NULL, false, path), 0);
    char buf[1024];
    ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
    assert_true(n > 0);
    buf[n] = '\0';
    if (!strstr(buf, "READY=1"))
        fail_msg("first notification is not READY=1: %s", buf);
    kill(h.pid, SIGTERM);
    bool stopping = false;
    while (!stopping && (n = recv(fd, buf, sizeof buf - 1, 0)) > 0) {
        buf[n] = '\0';
        stopping = strstr(buf, "STOPPING=1") != NULL;
    }
    assert_true(stopping);
    assert_int_equal(harness_stop(&h), 0);
    close(fd);
    unlink(path);
}

static uint32_t submit_status(harness *h, const char *id, int max_tokens)
{
    tp_msg m, r;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_SUBMIT);
    m.submit.job_id = tp_str_of(id);
    m.submit.prompt = tp_str_of("Once upon a time");
    m.submit.params.set = TP_P_MAX_TOKENS | TP_P_IGNORE_EOS;
    m.submit.params.max_tokens = max_tokens;
    m.submit.params.ignore_eos = true;
    tp_zmsg z;
    assert_int_equal(harness_call(h, &m, &z, &r), 0);
    uint32_t st = r.status;
    tp_msg_clear(&r);
    tp_zmsg_close(&z);
    return st;
}

static uint32_t status_of(harness *h, const char *id, int *state)
{
    tp_msg m, r;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_STATUS);
    m.jobref.job_id = tp_str_of(id);
    tp_zmsg z;
    assert_int_equal(harness_call(h, &m, &z, &r), 0);
    uint32_t st = r.status;
    *state = r.status_reply.state;
    tp_msg_clear(&r);
    tp_zmsg_close(&z);
    return st;
}

static void admission_limit_answers_429_and_finished_jobs_expire(void **state)
{
    (void)state;
    harness h;
    /* the TTL leaves a loaded machine time to see the job FINISHED */
    assert_int_equal(harness_start(&h, false, "limits:\n  max_concurrent_jobs: 2\n  finished_ttl_ms: 1500\n"), 0);
    assert_int_equal(submit_status(&h, "a1", 400), TP_ST_OK);
    assert_int_equal(submit_status(&h, "a2", 400), TP_ST_OK);
    assert_int_equal(submit_status(&h, "a3", 400), TP_ST_OVERLOADED);
    int st = 0;
    int64_t end = tp_now_ms() + WAIT_MS;
    while (!(status_of(&h, "a1", &st) == TP_ST_OK && st == TP_STATE_FINISHED) && tp_now_ms() < end)
        harness_sleep_ms(25);
    assert_int_equal(st, TP_STATE_FINISHED);   /* kept for STATUS ... */
    int64_t seen = tp_now_ms();
    while (status_of(&h, "a1", &st) == TP_ST_OK && tp_now_ms() < seen + WAIT_MS)
        harness_sleep_ms(25);
    assert_int_equal(status_of(&h, "a1", &st), TP_ST_NOT_FOUND);   /* ... until its TTL ends */
    assert_int_equal(harness_stop(&h), 0);
}

/* A second tokpiped on the same ipc endpoints (say `make run` while the
 * service runs) must refuse to start, not take the sockets over: the
 * first one's workers and clients would silently reach the second, and
 * once it exited, nobody. */
static void a_second_daemon_on_the_same_sockets_refuses_to_start(void **state)
{
    (void)state;
    harness h;
    assert_int_equal(harness_start(&h, false, NULL), 0);
    pid_t first = h.pid;
    assert_int_equal(harness_spawn_daemon(&h, true, NULL), 0);
    int st = 0;
    pid_t second = h.pid;
    h.pid = first;
    for (int waited = 0; waitpid(second, &st, WNOHANG) != second; waited += 20) {
        if (waited > WAIT_MS) {
            kill(second, SIGKILL);
            waitpid(second, NULL, 0);
            fail_msg("a second tokpiped took over the first one's sockets and kept running");
        }
        harness_sleep_ms(20);
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 1)
        fail_msg("the second tokpiped exited with %d (raw status), want exit 1", st);
    char cmd[700], *log = NULL;
    snprintf(cmd, sizeof cmd, "grep -c 'is listening there' %s/tokpiped.log", h.dir);
    harness_sh(cmd, &log);
    if (!log || atoi(log) < 1)
        fail_msg("the second tokpiped did not say why it refused (see %s/tokpiped.log)", h.dir);
    free(log);
    generate_ok(&h, "the first daemon after the second one gave up");
    assert_int_equal(harness_stop(&h), 0);
}

static bool cpu_has_avx512f(void)
{
    char *out = NULL;
    bool yes = harness_sh("grep -qw avx512f /proc/cpuinfo && echo yes", &out) == 0 && out && strstr(out, "yes");
    free(out);
    return yes;
}

static void spawned_workers_get_openblas_coretype_on_avx512(void **state)
{
    (void)state;
    if (!cpu_has_avx512f() || getenv("OPENBLAS_CORETYPE"))
        skip();
    harness h;
    assert_int_equal(harness_start(&h, false, NULL), 0);
    pid_t pids[8];
    int n = harness_children(&h, pids, 8);
    assert_true(n >= 4);
    for (int i = 0; i < n; i++) {
        char path[64], env[16384];
        snprintf(path, sizeof path, "/proc/%d/environ", (int)pids[i]);
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        size_t len = fread(env, 1, sizeof env - 1, f);
        fclose(f);
        bool found = false;
        for (size_t k = 0; k < len; k += strlen(env + k) + 1)
            found = found || !strcmp(env + k, "OPENBLAS_CORETYPE=SkylakeX");
        if (!found)
            fail_msg("worker pid %d lacks OPENBLAS_CORETYPE=SkylakeX", (int)pids[i]);
    }
    assert_int_equal(harness_stop(&h), 0);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(workers_reconnect_after_the_broker_restarts),
        cmocka_unit_test(sigterm_lets_running_jobs_finish_then_exits_zero),
        cmocka_unit_test(daemon_notifies_systemd),
        cmocka_unit_test(admission_limit_answers_429_and_finished_jobs_expire),
        cmocka_unit_test(a_second_daemon_on_the_same_sockets_refuses_to_start),
        cmocka_unit_test(spawned_workers_get_openblas_coretype_on_avx512),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
