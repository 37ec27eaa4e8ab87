/* Process story: SIGTERM at any moment stops tokpiped cleanly. Whether it
 * arrives while the config is being read, while the sockets are bound and
 * the workers start, right after a job, during a job or while the daemon
 * is already draining, tokpiped exits 0, lets a running job finish, and
 * leaves no worker process behind, every time; killed, it still leaves
 * none. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "support/daemon_harness.h"

/* Wait for the daemon to exit: its exit status, 128 + signal if a signal
 * killed it, -1 if it still runs after timeout_ms. */
static int wait_exit(harness *h, int timeout_ms)
{
    int st;
    for (int waited = 0; waited <= timeout_ms; waited += 5) {
        if (waitpid(h->pid, &st, WNOHANG) == h->pid) {
            h->pid = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        harness_sleep_ms(5);
    }
    return -1;
}

static bool log_has(const harness *h, const char *needle)
{
    char path[256];
    snprintf(path, sizeof path, "%s/tokpiped.log", h->dir);
    FILE *f = fopen(path, "r");
    char line[1024];
    bool found = false;
    while (f && !found && fgets(line, sizeof line, f))
        found = strstr(line, needle) != NULL;
    if (f)
        fclose(f);
    return found;
}

/* The daemon exited 0 and took its workers with it. */
static void expect_clean_exit(harness *h, const char *moment, int iteration)
{
    int st = wait_exit(h, 15000);
    if (st != 0)
        fail_msg("iteration %d, SIGTERM %s: tokpiped exit status %d, want 0 (log in %s)", iteration, moment, st, h->dir);
    int left = harness_live_workers(h);
    if (left != 0)
        fail_msg("iteration %d, SIGTERM %s: %d worker processes left behind", iteration, moment, left);
    if (log_has(h, "did not stop; killing it"))
        fail_msg("iteration %d, SIGTERM %s: a worker ignored SIGTERM and was killed (log in %s)", iteration, moment,
                 h->dir);
    harness_stop(h);
}

/* The config is a FIFO: tokpiped blocks reading it until we write, so the
 * SIGTERM surely lands while the config is read. Nothing may be bound. */
static void during_config_read(int iteration)
{
    harness h;
    assert_int_equal(harness_prepare(&h, false, NULL), 0);
    char *yaml = NULL, cmd[300];
    snprintf(cmd, sizeof cmd, "cat '%s'", h.config);
    assert_int_equal(harness_sh(cmd, &yaml), 0);
    assert_int_equal(unlink(h.config), 0);
    assert_int_equal(mkfifo(h.config, 0600), 0);
    assert_int_equal(harness_spawn_daemon(&h, false, NULL), 0);
    int fd = -1;
    for (int waited = 0; fd < 0; waited += 2) {
        fd = open(h.config, O_WRONLY | O_NONBLOCK);   /* ENXIO until tokpiped opens it */
        if (fd < 0 && (errno != ENXIO || waited > 10000))
            fail_msg("tokpiped never opened its config: %s", strerror(errno));
        if (fd < 0)
            harness_sleep_ms(2);
    }
    kill(h.pid, SIGTERM);
    harness_sleep_ms(iteration % 3);
    size_t len = strlen(yaml);
    assert_int_equal(write(fd, yaml, len), (ssize_t)len);
    close(fd);
    free(yaml);
    int st = wait_exit(&h, 15000);
    if (st != 0)
        fail_msg("iteration %d, SIGTERM while the config is read: exit status %d, want 0", iteration, st);
    char rt[200];
    snprintf(rt, sizeof rt, "%s/rt", h.dir);
    if (access(rt, F_OK) == 0)
        fail_msg("iteration %d: tokpiped stopped while reading its config but created its runtime dir", iteration);
    harness_stop(&h);
}

static bool catches_sigterm(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    unsigned long long mask = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "SigCgt:", 7))
            mask = strtoull(line + 7, NULL, 16);
    if (f)
        fclose(f);
    return mask & (1ull << (SIGTERM - 1));
}

/* delay_ms after tokpiped's main started: binding, spawning, registering */
static void during_startup(int iteration, int delay_ms)
{
    harness h;
    assert_int_equal(harness_prepare(&h, false, NULL), 0);
    assert_int_equal(harness_spawn_daemon(&h, false, NULL), 0);
    for (int waited = 0; !catches_sigterm(h.pid); waited++) {
        if (waited > 10000)
            fail_msg("tokpiped never installed its SIGTERM handler");
        harness_sleep_ms(1);
    }
    harness_sleep_ms(delay_ms);
    kill(h.pid, SIGTERM);
    expect_clean_exit(&h, "during startup", iteration);
}

static FILE *start_job(harness *h, int max_tokens)
{
    char cmd[1400];
    snprintf(cmd, sizeof cmd,
             "%s/tokpipe generate --config %s --json --timeout 20000 --prompt 'Once upon a time' --temperature 0 "
             "--ignore-eos --max-tokens %d",
             h->bin, h->config, max_tokens);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    return p;
}

static void expect_job_done(FILE *p, int max_tokens, const char *moment, int iteration)
{
    char out[65536], want[64];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    snprintf(want, sizeof want, "\"completion_tokens\":%d", max_tokens);
    if (st != 0 || !strstr(out, want))
        fail_msg("iteration %d, SIGTERM %s: the running job did not finish (status %d): %s", iteration, moment, st, out);
}

static void after_a_job(int iteration)
{
    harness h;
    assert_int_equal(harness_start(&h, false, NULL), 0);
    expect_job_done(start_job(&h, 8), 8, "before", iteration);
    kill(h.pid, SIGTERM);
    expect_clean_exit(&h, "right after a job", iteration);
}

/* twice: a second SIGTERM and a SIGINT during the drain change nothing */
static void during_a_job(int iteration, int delay_ms, bool twice)
{
    harness h;
    assert_int_equal(harness_start(&h, false, NULL), 0);
    FILE *p = start_job(&h, 200);
    tp_m_stats_reply s;
    for (int waited = 0; harness_stats(&h, &s) || s.jobs_active == 0; waited += 2) {
        if (waited > 10000)
            fail_msg("iteration %d: the job never reached the daemon", iteration);
        harness_sleep_ms(2);
    }
    harness_sleep_ms(delay_ms);
    kill(h.pid, SIGTERM);
    if (twice) {
        harness_sleep_ms(5);
        kill(h.pid, SIGINT);
        kill(h.pid, SIGTERM);
    }
    const char *moment = twice ? "twice while draining" : "during a job";
    expect_job_done(p, 200, moment, iteration);
    expect_clean_exit(&h, moment, iteration);
}

static void sigterm_at_any_moment_exits_zero_and_leaves_no_worker(void **state)
{
    (void)state;
    static const int delays[] = {0, 4, 15, 40};
    for (int i = 0; i < 20; i++) {
        int d = delays[(i / 5) % 4];
        switch (i % 5) {
        case 0: during_config_read(i); break;
        case 1: during_startup(i, d); break;
        case 2: after_a_job(i); break;
        case 3: during_a_job(i, d, false); break;
        default: during_a_job(i, d, true); break;
        }
    }
}

/* Not a clean stop, but still none left: a spawned worker gets SIGTERM
 * when tokpiped dies (PR_SET_PDEATHSIG). */
static void a_killed_tokpiped_leaves_no_worker(void **state)
{
    (void)state;
    harness h;
    assert_int_equal(harness_start(&h, false, NULL), 0);
    assert_int_equal(harness_live_workers(&h), 4);
    kill(h.pid, SIGKILL);
    assert_int_equal(wait_exit(&h, 30000), 128 + SIGKILL);
    /* 30 s: a hang detector (an ASan worker on a loaded machine exits slowly) */
    int left = 4;
    for (int waited = 0; left > 0 && waited < 30000; waited += 10) {
        left = harness_live_workers(&h);
        harness_sleep_ms(10);
    }
    if (left)
        fail_msg("%d workers outlived the killed tokpiped by 30 s", left);
    harness_stop(&h);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sigterm_at_any_moment_exits_zero_and_leaves_no_worker),
        cmocka_unit_test(a_killed_tokpiped_leaves_no_worker),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
