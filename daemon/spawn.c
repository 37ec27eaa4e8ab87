/* Supervisor of the worker processes tokpiped starts (unless --no-spawn):
 * fork/exec of tokpipe-worker per configured process kind, reaping, and
 * respawn with doubling backoff. Children get PR_SET_PDEATHSIG so a killed
 * broker never leaves workers behind, their own process group so a
 * terminal's Ctrl-C reaches only the broker (which drains, then stops
 * them), and OPENBLAS_CORETYPE=SkylakeX on AVX-512 CPUs when unset
 * (OpenBLAS 0.3.21 picks its Haswell kernels there; research/limits.md §2). */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "spawn.h"
#include "log.h"
#include "tokpipe/zwire.h"

#define HEALTHY_MS 10000   /* a child that ran this long resets its backoff */

static void stage_list(unsigned stages, char *buf, size_t cap)
{
    buf[0] = '\0';
    for (int s = 0; s < TP_SI_COUNT; s++)
        if (stages & (1u << s)) {
            size_t l = strlen(buf);
            snprintf(buf + l, cap - l, "%s%s", l ? "," : "", tp_config_stage_name(s));
        }
}

/* tokpipe-worker (or workers.binary), or for the gateway tokpipe-http,
 * next to the running program. */
static void worker_binary(const broker *b, const char *name, char *buf, size_t cap)
{
    if (!strcmp(name, "tokpipe-worker") && b->cfg->worker_binary[0]) {
        snprintf(buf, cap, "%s", b->cfg->worker_binary);
        return;
    }
    char self[PATH_MAX - 32];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        snprintf(buf, cap, "%s", name);
        return;
    }
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = '\0';
    snprintf(buf, cap, "%s/%s", self, name);
}

int spawn_init(broker *b, tp_err *err)
{
    tp_worker_group g[TP_CONFIG_MAX_GROUPS + TP_SI_COUNT];
    int ng = tp_config_groups(b->cfg, g, (int)(sizeof g / sizeof g[0]));
    int total = 0;
    for (int i = 0; i < ng; i++)
        total += g[i].count;
    b->children = calloc((size_t)total + 1, sizeof *b->children);   /* + the gateway */
    if (!b->children)
        return tp_err_set(err, TP_ENOMEM, "spawner: out of memory");
    for (int i = 0; i < ng; i++)
        for (int k = 0; k < g[i].count; k++)
            b->children[b->n_children++] = (bchild){.stages = g[i].stages, .index = k,
                                                     .backoff_ms = b->cfg->respawn_init_ms};
    if (b->cfg->http_enabled)
        b->children[b->n_children++] = (bchild){.stages = 0, .backoff_ms = b->cfg->respawn_init_ms};
    b->spawn = true;
    return 0;
}

/* The --instance name of child c (what its READY says). */
static void child_instance(const bchild *c, char *buf, size_t cap)
{
    char stages[64];
    stage_list(c->stages, stages, sizeof stages);
    snprintf(buf, cap, "%s.%d", c->stages ? stages : "http", c->index);
}

static pid_t start_child(broker *b, bchild *c)
{
    char bin[PATH_MAX], stages[64], instance[96];
    worker_binary(b, c->stages ? "tokpipe-worker" : "tokpipe-http", bin, sizeof bin);
    stage_list(c->stages, stages, sizeof stages);
    child_instance(c, instance, sizeof instance);
    char *argv[9];
    int a = 0;
    argv[a++] = bin;
    if (c->stages) {
        argv[a++] = "--stage";
        argv[a++] = stages;
        argv[a++] = "--instance";
        argv[a++] = instance;
    }
    if (b->config_path) {
        argv[a++] = "--config";
        argv[a++] = (char *)b->config_path;
    }
    argv[a] = NULL;
    pid_t parent = getpid();
    /* The broker's handler, inherited by the child until exec, would swallow
     * a SIGTERM sent before exec (spawn_stop_all right after a start): hold
     * the signals across fork, and let the child take them only once their
     * default action (die) is back. */
    sigset_t term, old;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigaddset(&term, SIGINT);
    sigprocmask(SIG_BLOCK, &term, &old);
    pid_t pid = fork();
    int fork_errno = errno;
    if (pid == 0) {
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        sigprocmask(SIG_SETMASK, &old, NULL);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)   /* the broker died before prctl */
            _exit(1);
        setpgid(0, 0);
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx512f"))
            setenv("OPENBLAS_CORETYPE", "SkylakeX", 0);
        execv(bin, argv);
        fprintf(stderr, "tokpiped: exec %s: %s\n", bin, strerror(errno));
        _exit(127);
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) {
        blog("fork: %s", strerror(fork_errno));
        return 0;
    }
    blog("started worker %s (pid %d)", instance, (int)pid);
    return pid;
}

static void reap(broker *b, int64_t now)
{
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int i = 0; i < b->n_children; i++) {
            bchild *c = &b->children[i];
            if (c->pid != pid)
                continue;
            c->pid = 0;
            if (now - c->started_at > HEALTHY_MS)
                c->backoff_ms = b->cfg->respawn_init_ms;
            c->respawn_at = now + c->backoff_ms;
            /* a bad model or config fails every start the same way:
             * respawning forever would only hide it */
            int code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
            bool fatal = (code == TP_EXIT_BAD_CONFIG || code == TP_EXIT_BAD_MODEL) && now - c->started_at <= HEALTHY_MS;
            c->fatal_starts = fatal ? c->fatal_starts + 1 : 0;
            if (c->fatal_starts >= B_MAX_FATAL_STARTS && !b->draining) {
                char stages[64];
                stage_list(c->stages, stages, sizeof stages);
                c->failed = true;
                b->stages_failed |= c->stages;
                blog("%s exited with status %d (%s) %d times in a row at start: not starting it again; "
                              "fix it (the line it logged says why) and restart tokpiped",
                           c->stages ? stages : "tokpipe-http", code,
                           code == TP_EXIT_BAD_MODEL ? "its model or vocabulary cannot be loaded" : "bad configuration",
                           c->fatal_starts);
                continue;
            }
            if (!b->draining)
                blog("worker pid %d exited (%s %d); respawn in %d ms", (int)pid,
                           WIFSIGNALED(status) ? "signal" : "status",
                           WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status), c->backoff_ms);
            c->backoff_ms = c->backoff_ms * 2 > b->cfg->respawn_max_ms ? b->cfg->respawn_max_ms : c->backoff_ms * 2;
        }
    }
}

void spawn_tick(broker *b, int64_t now)
{
    reap(b, now);
    if (b->draining)
        return;
    for (int i = 0; i < b->n_children; i++) {
        bchild *c = &b->children[i];
        if (c->pid == 0 && !c->failed && now >= c->respawn_at) {
            c->pid = start_child(b, c);
            c->started_at = now;
            if (!c->pid)
                c->respawn_at = now + c->backoff_ms;
        }
    }
}

bool spawn_kill(broker *b, const char *instance)
{
    for (int i = 0; i < b->n_children; i++) {
        bchild *c = &b->children[i];
        char name[96];
        child_instance(c, name, sizeof name);
        if (c->stages && c->pid > 0 && !strcmp(name, instance)) {
            kill(c->pid, SIGKILL);   /* reap() sees it exit and starts another */
            return true;
        }
    }
    return false;
}

static int running(const broker *b)
{
    int n = 0;
    for (int i = 0; i < b->n_children; i++)
        n += b->children[i].pid > 0;
    return n;
}

void spawn_stop_all(broker *b, int timeout_ms)
{
    for (int i = 0; i < b->n_children; i++)
        if (b->children[i].pid > 0)
            kill(b->children[i].pid, SIGTERM);
    int64_t end = tp_now_ms() + timeout_ms;
    while (running(b) && tp_now_ms() < end) {
        reap(b, tp_now_ms());
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    for (int i = 0; i < b->n_children; i++)
        if (b->children[i].pid > 0) {
            blog("worker pid %d did not stop; killing it", (int)b->children[i].pid);
            kill(b->children[i].pid, SIGKILL);
            waitpid(b->children[i].pid, NULL, 0);
            b->children[i].pid = 0;
        }
}

void spawn_free(broker *b)
{
    free(b->children);
    b->children = NULL;
    b->n_children = 0;
}
