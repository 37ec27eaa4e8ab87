/* Integration-test harness: a real tokpiped on a private runtime dir. */
#include "daemon_harness.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* How long harness_subscribe waits for the broker's answering heartbeat:
 * a hang detector (it comes within milliseconds on a quiet machine). */
#define SUBSCRIBE_WAIT_MS 20000

void harness_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* n distinct free loopback ports, below the kernel's ephemeral range (so
 * no outgoing connection of a concurrently running test takes one between
 * now and the daemon's bind), held together while chosen so no two are
 * the same. */
static int free_ports(int *ports, int n)
{
    int fds[8], got = 0;
    unsigned x = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL);
    for (int tries = 0; got < n && got < 8 && tries < 1000; tries++) {
        x = x * 1103515245u + 12345u;
        int port = 20000 + (int)((x >> 8) % 12000);
        int s = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if (s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0) {
            fds[got] = s;
            ports[got++] = port;
        } else if (s >= 0) {
            close(s);
        }
    }
    for (int i = 0; i < got; i++)
        close(fds[i]);
    return got == n ? 0 : -1;
}

static int write_config(harness *h, bool tcp, const char *extra)
{
    FILE *f = fopen(h->config, "w");
    if (!f)
        return -1;
    fprintf(f, "runtime_dir: %s/rt\n", h->dir);
    /* stories260K unless the test brings its own model section, or names
     * in TP_TEST_MODEL another weights file of the stories260K vocabulary
     * (e.g. a quantized GGUF), for tests of the pipeline on it */
    if (!extra || (strncmp(extra, "model:", 6) && !strstr(extra, "\nmodel:"))) {
        const char *model = getenv("TP_TEST_MODEL");
        char def[600];
        snprintf(def, sizeof def, "%s/stories260K.bin", h->models);
        fprintf(f, "model:\n  path: %s\n  tokenizer: %s/tok512.bin\n", model ? model : def, h->models);
    }
    if (tcp) {
        int port[4];
        if (free_ports(port, 4)) {
            fclose(f);
            return -1;
        }
        snprintf(h->front, sizeof h->front, "tcp://127.0.0.1:%d", port[0]);
        snprintf(h->back, sizeof h->back, "tcp://127.0.0.1:%d", port[1]);
        snprintf(h->events, sizeof h->events, "tcp://127.0.0.1:%d", port[2]);
        snprintf(h->publish, sizeof h->publish, "tcp://127.0.0.1:%d", port[3]);
        fprintf(f, "endpoints:\n  front: %s\n  back: %s\n  events: %s\n  publish: %s\n", h->front, h->back,
                h->events, h->publish);
    } else {
        snprintf(h->front, sizeof h->front, "ipc://%s/rt/front.sock", h->dir);
        snprintf(h->back, sizeof h->back, "ipc://%s/rt/back.sock", h->dir);
        snprintf(h->events, sizeof h->events, "ipc://%s/rt/events.sock", h->dir);
        snprintf(h->publish, sizeof h->publish, "ipc://%s/rt/publish.sock", h->dir);
    }
    /* fast failure detection keeps the crash tests short (unless the test
     * sets its own: a second heartbeat section would be a duplicate key) */
    if (!extra || (strncmp(extra, "heartbeat:", 10) && !strstr(extra, "\nheartbeat:")))
        fprintf(f, "heartbeat:\n  interval_ms: 200\n  liveness: 5\n");
    /* no gateway on the shared default port unless the test asks for one */
    if (!extra || (strncmp(extra, "http:", 5) && !strstr(extra, "\nhttp:")))
        fprintf(f, "http:\n  enabled: false\n");
    /* last, so extra_yaml may continue the workers section ("  fuse: ...") */
    fprintf(f, "workers:\n  binary: %s/tokpipe-worker\n", h->bin);
    if (extra)
        fputs(extra, f);
    return fclose(f);
}

int harness_stats(harness *h, tp_m_stats_reply *s)
{
    tp_msg m, r;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_STATS);
    tp_zmsg z;
    if (harness_call(h, &m, &z, &r))
        return -1;
    int ok = r.cmd == TP_CMD_STATS_REPLY;
    if (ok) {
        *s = r.stats_reply;
        s->triggers = NULL;
        s->n_triggers = 0;
    }
    tp_msg_clear(&r);
    tp_zmsg_close(&z);
    return ok ? 0 : -1;
}

int harness_spawn_daemon(harness *h, bool no_spawn, const char *notify)
{
    char log[256];
    snprintf(log, sizeof log, "%s/tokpiped.log", h->dir);
    h->pid = fork();
    if (h->pid < 0)
        return -1;
    if (h->pid == 0) {
        /* a failed test must not leave a daemon behind */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        char exe[600];
        snprintf(exe, sizeof exe, "%s/tokpiped", h->bin);
        FILE *lf = freopen(log, "a", stderr);
        (void)lf;
        if (notify)
            setenv("NOTIFY_SOCKET", notify, 1);
        else
            unsetenv("NOTIFY_SOCKET");
        if (no_spawn)
            execl(exe, exe, "--config", h->config, "--no-spawn", (char *)NULL);
        else
            execl(exe, exe, "--config", h->config, (char *)NULL);
        _exit(127);
    }
    return 0;
}

pid_t harness_worker(harness *h, const char *stages)
{
    char log[256];
    snprintf(log, sizeof log, "%s/worker-%s.log", h->dir, stages);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        char exe[600];
        snprintf(exe, sizeof exe, "%s/tokpipe-worker", h->bin);
        FILE *lf = freopen(log, "a", stderr);
        (void)lf;
        execl(exe, exe, "--config", h->config, "--stage", stages, (char *)NULL);
        _exit(127);
    }
    return pid;
}

int harness_wait_workers(harness *h, int timeout_ms)
{
    for (int i = 0; i * 50 < timeout_ms; i++) {
        tp_m_stats_reply s;
        if (waitpid(h->pid, NULL, WNOHANG) == h->pid) {
            fprintf(stderr, "harness: tokpiped exited; see %s/tokpiped.log\n", h->dir);
            return -1;
        }
        if (harness_stats(h, &s) == 0 && s.workers[0] && s.workers[1] && s.workers[2] && s.workers[3])
            return 0;
        harness_sleep_ms(50);
    }
    return -1;
}

/* The config's CURVE client keys for the harness's sockets. Never fatal:
 * a test may hand the daemon a bad config on purpose (it says why itself);
 * the harness then talks plain text. */
static void load_security(harness *h)
{
    tp_config cfg;
    tp_err e;
    if (tp_config_load(h->config, &cfg, &e) == 0 && tp_zsec_client_load(&cfg, &h->sec, &e) != 0)
        fprintf(stderr, "harness: %s\n", e.msg);
    tp_config_free(&cfg);
}

int harness_prepare(harness *h, bool tcp, const char *extra_yaml)
{
    memset(h, 0, sizeof *h);
    const char *models = getenv("TP_MODELS"), *bin = getenv("TP_BIN_DIR");
    snprintf(h->models, sizeof h->models, "%s", models ? models : "../shared/models");
    snprintf(h->bin, sizeof h->bin, "%s", bin ? bin : "bin");
    snprintf(h->dir, sizeof h->dir, "/tmp/tpit-XXXXXX");
    if (!mkdtemp(h->dir))
        return -1;
    snprintf(h->config, sizeof h->config, "%s/tokpipe.yaml", h->dir);
    if (write_config(h, tcp, extra_yaml))
        return -1;
    load_security(h);
    h->zctx = zmq_ctx_new();
    h->dealer = zmq_socket(h->zctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(h->dealer, ZMQ_LINGER, &linger, sizeof linger);
    tp_zsec_client_apply(&h->sec, h->dealer, h->front, NULL);
    zmq_connect(h->dealer, h->front);
    return 0;
}

int harness_start_ex(harness *h, bool tcp, const char *extra_yaml, bool no_spawn, const char *notify)
{
    if (harness_prepare(h, tcp, extra_yaml) || harness_spawn_daemon(h, no_spawn, notify))
        return -1;
    if (no_spawn)
        return 0;
    if (harness_wait_workers(h, 30000) == 0)
        return 0;
    fprintf(stderr, "harness: workers did not register; see %s/tokpiped.log\n", h->dir);
    return -1;
}

int harness_start(harness *h, bool tcp, const char *extra_yaml)
{
    return harness_start_ex(h, tcp, extra_yaml, false, NULL);
}

static void rm_rf(const char *dir)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "harness: could not remove %s\n", dir);
}

int harness_stop(harness *h)
{
    if (h->dealer)
        zmq_close(h->dealer);
    if (h->zctx)
        zmq_ctx_term(h->zctx);
    h->dealer = h->zctx = NULL;
    int status = -1;
    if (h->pid > 0) {
        kill(h->pid, SIGTERM);
        for (int i = 0; i < 300; i++) {
            if (waitpid(h->pid, &status, WNOHANG) == h->pid)
                break;
            harness_sleep_ms(50);
            status = -1;
        }
        if (status == -1) {
            kill(h->pid, SIGKILL);
            waitpid(h->pid, NULL, 0);
        }
    }
    h->pid = 0;
    if (getenv("TP_KEEP_LOGS")) {
        fprintf(stderr, "harness: kept %s\n", h->dir);
    } else if (h->dir[0]) {
        rm_rf(h->dir);
    }
    return status == -1 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int harness_raw_call(harness *h, const tp_frame *frames, size_t n, tp_zmsg *reply, int timeout_ms)
{
    /* never block: a DEALER whose only peer failed its handshake (CURVE
     * keys refused) has no pipe left and a blocking send would hang */
    for (size_t i = 0; i < n; i++)
        if (zmq_send(h->dealer, frames[i].len ? frames[i].data : "", frames[i].len,
                     ZMQ_DONTWAIT | (i + 1 < n ? ZMQ_SNDMORE : 0)) < 0)
            return -1;
    zmq_pollitem_t it = {h->dealer, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, timeout_ms) <= 0)
        return -1;
    return tp_zmsg_recv(h->dealer, reply, 0);
}

int harness_call(harness *h, const tp_msg *m, tp_zmsg *z, tp_msg *out)
{
    tp_wire w;
    tp_err e;
    if (tp_proto_encode(m, &w, &e)) {
        fprintf(stderr, "harness: encode: %s\n", e.msg);
        return -1;
    }
    int rc = harness_raw_call(h, w.f, w.n, z, 5000);
    tp_wire_free(&w);
    if (rc)
        return -1;
    if (tp_proto_decode(TP_FAM_JOB, z->f, z->n, out, &e)) {
        fprintf(stderr, "harness: reply does not decode: %s\n", e.msg);
        tp_msg_clear(out);
        tp_zmsg_close(z);
        return -1;
    }
    return 0;
}

void *harness_subscribe(harness *h, const char *prefix)
{
    void *s = zmq_socket(h->zctx, ZMQ_SUB);
    int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s, ZMQ_SUBSCRIBE, prefix, strlen(prefix));
    /* A PUB drops what no subscription asked for, so the caller's jobs
     * must not start before the subscription is in force: a fixed wait was
     * too short on a loaded machine (the first TOKENs went missing). The
     * broker answers a subscription to its heartbeat topic with a beat,
     * which arrives only once the subscriptions sent before it (the
     * caller's prefix) are in force. */
    bool covered = !strncmp(TP_EVT_HEARTBEAT_TOPIC, prefix, strlen(prefix));
    if (!covered)
        zmq_setsockopt(s, ZMQ_SUBSCRIBE, TP_EVT_HEARTBEAT_TOPIC, strlen(TP_EVT_HEARTBEAT_TOPIC));
    tp_zsec_client_apply(&h->sec, s, h->events, NULL);
    zmq_connect(s, h->events);
    bool heard = false;
    for (int64_t end = tp_now_ms() + SUBSCRIBE_WAIT_MS, left; !heard && (left = end - tp_now_ms()) > 0;) {
        zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, (long)left) <= 0)
            break;
        tp_zmsg z;
        if (tp_zmsg_recv(s, &z, 0))
            break;
        tp_msg m;
        tp_err e;
        heard = tp_proto_decode(TP_FAM_EVT, z.f, z.n, &m, &e) == 0 && m.cmd == TP_CMD_HEARTBEAT;
        tp_msg_clear(&m);
        tp_zmsg_close(&z);
    }
    if (!heard)
        fprintf(stderr, "harness: no broker heartbeat on %s within %d ms; the subscription may miss events\n",
                h->events, SUBSCRIBE_WAIT_MS);
    /* a beat already on its way may still arrive: the callers skip them */
    if (!covered)
        zmq_setsockopt(s, ZMQ_UNSUBSCRIBE, TP_EVT_HEARTBEAT_TOPIC, strlen(TP_EVT_HEARTBEAT_TOPIC));
    return s;
}

int harness_sh(const char *cmdline, char **out)
{
    FILE *p = popen(cmdline, "r");
    if (!p)
        return -1;
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += got;
        if (cap - len < 2) {
            char *nb = realloc(buf, cap * 2);
            if (!nb)
                break;
            buf = nb;
            cap *= 2;
        }
    }
    if (buf)
        buf[len] = '\0';
    int st = pclose(p);
    if (out)
        *out = buf;
    else
        free(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int harness_children(harness *h, pid_t *pids, int cap)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)h->pid, (int)h->pid);
    FILE *f = fopen(path, "r");
    int n = 0, v;
    while (f && n < cap && fscanf(f, "%d", &v) == 1)
        pids[n++] = v;
    if (f)
        fclose(f);
    return n;
}

int harness_wait_stage(harness *h, int stage, uint64_t n, int timeout_ms)
{
    for (int i = 0; i * 20 < timeout_ms; i++) {
        tp_m_stats_reply s;
        if (harness_stats(h, &s) == 0 && s.workers[stage] == n)
            return 0;
        harness_sleep_ms(20);
    }
    return -1;
}

int harness_live_workers(const harness *h)
{
    DIR *d = opendir("/proc");
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        char path[300], args[2048];
        snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
        FILE *f = fopen(path, "r");
        size_t len = f ? fread(args, 1, sizeof args - 1, f) : 0;
        if (f)
            fclose(f);
        args[len] = '\0';
        /* argv[0] ends in tokpipe-worker; the config is a later argument */
        size_t a0 = strlen(args);
        bool worker = a0 >= 14 && !strcmp(args + a0 - 14, "tokpipe-worker");
        for (size_t k = 0; k < len; k++)
            if (!args[k])
                args[k] = ' ';
        n += worker && strstr(args, h->config) != NULL;
    }
    closedir(d);
    return n;
}

int harness_children_serving(harness *h, const char *stage, pid_t *out, int cap)
{
    pid_t pids[32];
    int n = harness_children(h, pids, 32), k = 0;
    for (int i = 0; i < n && k < cap; i++) {
        char path[64], args[512] = {0};
        snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pids[i]);
        FILE *f = fopen(path, "r");
        size_t len = f ? fread(args, 1, sizeof args - 1, f) : 0;
        if (f)
            fclose(f);
        for (size_t c = 0; c < len; c++)   /* NUL-separated arguments as one line */
            if (!args[c])
                args[c] = ' ';
        char want[64];
        snprintf(want, sizeof want, "--stage %s ", stage);
        if (strstr(args, want))
            out[k++] = pids[i];
    }
    return k;
}

pid_t harness_child_serving(harness *h, const char *stage)
{
    pid_t pid;
    return harness_children_serving(h, stage, &pid, 1) == 1 ? pid : -1;
}
