/* The real tokpiped for benchmarks (bdaemon.h). */
#include "bdaemon.h"
#include "timing.h"

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

int bench_daemon_call(bench_daemon *d, const tp_msg *m, tp_zmsg *z, tp_msg *r)
{
    tp_wire w;
    tp_err e;
    if (tp_proto_encode(m, &w, &e))
        return -1;
    tp_zsend(d->dealer, NULL, 0, &w, 0);
    tp_wire_free(&w);
    zmq_pollitem_t it = {d->dealer, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, 5000) <= 0 || tp_zmsg_recv(d->dealer, z, 0))
        return -1;
    if (tp_proto_decode(TP_FAM_JOB, z->f, z->n, r, &e)) {
        tp_msg_clear(r);
        tp_zmsg_close(z);
        return -1;
    }
    return 0;
}

int bench_daemon_start(bench_daemon *d, const char *bin, const char *cfg, const char *front, const char *events)
{
    d->pid = fork();
    if (d->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        char exe[600];
        snprintf(exe, sizeof exe, "%s/tokpiped", bin);
        if (!freopen(getenv("TP_DAEMON_LOG") ? getenv("TP_DAEMON_LOG") : "/dev/null", "a", stderr))
            _exit(126);
        execl(exe, exe, "--config", cfg, (char *)NULL);
        _exit(127);
    }
    d->ctx = zmq_ctx_new();
    d->dealer = zmq_socket(d->ctx, ZMQ_DEALER);
    d->sub = zmq_socket(d->ctx, ZMQ_SUB);
    int zero = 0, big = 1000000;
    zmq_setsockopt(d->dealer, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(d->sub, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(d->sub, ZMQ_RCVHWM, &big, sizeof big);
    zmq_setsockopt(d->sub, ZMQ_SUBSCRIBE, "", 0);
    zmq_connect(d->dealer, front);
    zmq_connect(d->sub, events);
    for (int i = 0; i < 400; i++) {
        tp_msg m, r;
        tp_msg_init(&m, TP_FAM_JOB, TP_CMD_STATS);
        tp_zmsg z;
        if (bench_daemon_call(d, &m, &z, &r) == 0) {
            const uint64_t *w = r.stats_reply.workers;
            bool ok = w[0] && w[1] && w[2] && w[3];
            tp_msg_clear(&r);
            tp_zmsg_close(&z);
            if (ok) {
                usleep(200000);   /* the SUB connection settles */
                return 0;
            }
        }
        usleep(50000);
    }
    return -1;
}

void bench_daemon_stop(bench_daemon *d)
{
    zmq_close(d->dealer);
    zmq_close(d->sub);
    zmq_ctx_term(d->ctx);
    kill(d->pid, SIGTERM);
    waitpid(d->pid, NULL, 0);
}

int bench_daemon_submit(bench_daemon *d, const char *prefix, int j, const int32_t *ids, size_t n, int max_tokens)
{
    tp_msg m;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_SUBMIT);
    char id[64];
    snprintf(id, sizeof id, "%s-%d", prefix, j);
    m.submit.job_id = tp_str_of(id);
    m.submit.prompt_ids = (tp_raw){ids, n};
    tp_params *p = &m.submit.params;
    p->set = TP_P_TEMPERATURE | TP_P_MAX_TOKENS | TP_P_IGNORE_EOS;
    p->temperature = 0;
    p->max_tokens = max_tokens;
    p->ignore_eos = true;
    tp_err e;
    int rc = tp_zsend_msg(d->dealer, NULL, 0, &m, &e);
    if (rc)
        fprintf(stderr, "bench: submit %s: %s\n", id, e.msg);
    return rc ? -1 : 0;
}

void bench_daemon_subscribe(bench_daemon *d, const char *prefix)
{
    zmq_setsockopt(d->sub, ZMQ_UNSUBSCRIBE, "", 0);
    zmq_setsockopt(d->sub, ZMQ_SUBSCRIBE, prefix, strlen(prefix));
}

int bench_daemon_events(bench_daemon *d, const char *prefix, int n, int timeout_ms, bench_event_fn fn, void *ctx)
{
    int finished = 0, acks = 0;
    size_t plen = strlen(prefix);
    while (finished < n || acks < n) {
        zmq_pollitem_t it[2] = {{d->sub, 0, ZMQ_POLLIN, 0}, {d->dealer, 0, ZMQ_POLLIN, 0}};
        if (zmq_poll(it, 2, timeout_ms) <= 0) {
            fprintf(stderr, "bench: pipeline stalled (%d/%d finished)\n", finished, n);
            return -1;
        }
        tp_zmsg z;
        if ((it[1].revents & ZMQ_POLLIN) && tp_zmsg_recv(d->dealer, &z, 0) == 0) {
            acks++;
            tp_zmsg_close(&z);
        }
        if (!(it[0].revents & ZMQ_POLLIN) || tp_zmsg_recv(d->sub, &z, 0))
            continue;
        double t = bench_now();
        tp_msg ev;
        tp_err e;
        if (tp_proto_decode(TP_FAM_EVT, z.f, z.n, &ev, &e) == 0 && ev.cmd != TP_CMD_HEARTBEAT) {
            const tp_str *id = ev.cmd == TP_CMD_TOKEN ? &ev.token.job_id : &ev.finish.job_id;
            if (id->len > plen + 1 && !memcmp(id->ptr, prefix, plen) && id->ptr[plen] == '-') {
                int j = atoi(id->ptr + plen + 1);
                if (j >= 0 && j < n)
                    fn(ctx, j, &ev, t);
                finished += ev.cmd == TP_CMD_FINISH;
            }
        }
        tp_msg_clear(&ev);
        tp_zmsg_close(&z);
    }
    return 0;
}
