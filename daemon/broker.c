/* The broker's sockets and its single poll loop (nginx-style: signal
 * handlers only set a flag the loop reads). The top floor: it calls the
 * floors below (broker.h) and is the only file that sends, draining the
 * outbox they fill after each message and tick. */
#include "broker.h"
#include "front.h"
#include "info.h"
#include "log.h"
#include "outbox.h"
#include "pin.h"
#include "recover.h"
#include "registry.h"
#include "route.h"
#include "sched.h"
#include "spawn.h"
#include "standby.h"
#include "step.h"

#include <errno.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "tokpipe/draft.h"
#include "tokpipe/model.h"
#include "tokpipe/rand.h"
#include "tokpipe/zwire.h"

/* ---- sending: the outbox, heartbeats ---------------------------------------------- */

static void *out_socket(broker *b, int sock)
{
    return sock == OUT_FRONT ? b->front : sock == OUT_BACK ? b->back : b->xpub;
}

/* Send what the floors below put in the outbox, in order. A worker a send
 * fails to (gone: EHOSTUNREACH, or hopelessly behind: EAGAIN) gets
 * nothing more; it is lost at the next safe point (recover_reap). */
static void flush(broker *b)
{
    boutbox *o = &b->out;
    for (size_t k = 0; k < o->n; k++) {
        bout_msg *x = o->q[k];
        bworker *w = x->wi >= 0 ? &b->workers[x->wi] : NULL;
        if (w && (!w->live || w->worker_no != x->worker_no))
            w = NULL;   /* lost and its slot reused since: the frames still go to its identity */
        bool skip = w && w->gone;
        size_t sent = 0;
        int err = 0;
        for (; !skip && sent < x->n; sent++)
            if (zmq_msg_send(&x->part[sent], out_socket(b, x->sock), ZMQ_DONTWAIT | (sent + 1 < x->n ? ZMQ_SNDMORE : 0)) <
                0) {
                err = errno;
                break;
            }
        if (err && w) {
            blog("to worker %s: send %s: %s", w->instance, tp_cmd_name(x->family, x->cmd), zmq_strerror(err));
            w->gone = true;
        } else if (err && x->sock == OUT_FRONT) {
            blog("reply %s: send: %s", tp_cmd_name(x->family, x->cmd), zmq_strerror(err));
        } else if (!err && !skip && w) {
            w->last_send = tp_now_ms();
        }
        /* zmq_msg_send took the frames it sent; close the rest */
        for (size_t i = sent; i < x->n; i++)
            zmq_msg_close(&x->part[i]);
        free(x);
    }
    o->n = 0;
}

/* HEARTBEAT to worker wi; false if its connection is gone. The backend
 * ROUTER is ROUTER_MANDATORY, so a peer whose socket closed (the process
 * died) answers EHOSTUNREACH, and since a reconnecting worker gets a new
 * identity this registration can never be reached again: no need to wait
 * `liveness` intervals for it. (A full queue, EAGAIN, is left to expiry.) */
static bool send_heartbeat(broker *b, int wi)
{
    bworker *w = &b->workers[wi];
    tp_msg m;
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_HEARTBEAT);
    tp_wire wire;
    tp_err e;
    if (tp_proto_encode(&m, &wire, &e))
        return true;
    tp_frame id = {w->ident, w->ident_len};
    int rc = tp_zsend(b->back, &id, 1, &wire, ZMQ_DONTWAIT);
    int err = errno;
    tp_wire_free(&wire);
    if (rc == 0)
        w->last_send = tp_now_ms();
    return rc == 0 || err != EHOSTUNREACH;
}

/* After a backend disconnect: which worker was it? The one the ROUTER no
 * longer knows (each probe is one small HEARTBEAT). */
static void probe_workers(broker *b)
{
    for (int i = 0; i < B_MAX_WORKERS; i++)
        if (b->workers[i].live && !b->workers[i].gone && !send_heartbeat(b, i))
            b->workers[i].gone = true;
}

static void beat_workers(broker *b, int64_t now)
{
    for (int i = 0; i < B_MAX_WORKERS; i++) {
        bworker *w = &b->workers[i];
        if (w->live && !w->gone && now - w->last_send >= b->cfg->heartbeat_ms && !send_heartbeat(b, i))
            w->gone = true;
    }
}

/* Lose the workers marked gone, and send what that sent. */
static void reap(broker *b)
{
    recover_reap(b);
    flush(b);
}

/* The broker's own event (PROTOCOL.md §3, HEARTBEAT): subscribers tell a
 * quiet broker from a dead or restarted one by it. */
static void publish_beat(broker *b)
{
    if (!standby_serving(b))
        return;   /* a passive broker is silent: subscribers hear the active one */
    tp_msg ev;
    tp_msg_init(&ev, TP_FAM_EVT, TP_CMD_HEARTBEAT);
    ev.beat.incarnation = b->incarnation;
    ev.beat.uptime_ms = (uint64_t)(tp_now_ms() - b->t_start_ms);
    ev.beat.interval_ms = (uint32_t)b->cfg->heartbeat_ms;
    ev.beat.liveness = (uint32_t)b->cfg->liveness;
    tp_err e;
    if (tp_zsend_msg(b->xpub, NULL, 0, &ev, &e))
        blog("HEARTBEAT: %s", e.msg);
    b->last_beat_ms = tp_now_ms();
}

/* A subscription that takes the heartbeat topic ("", "@", ...) gets a
 * heartbeat at once: a client learns the incarnation without waiting an
 * interval, and knows its earlier subscriptions are in force. Every
 * subscriber hears it, so a crowd of new subscriptions shares one beat per
 * B_BEAT_MIN_GAP_MS (the loop sends the deferred one). */
static void on_subscription(broker *b, const tp_frame *f)
{
    const uint8_t *p = f->data;
    size_t n = f->len ? f->len - 1 : 0;
    if (f->len >= 1 && p[0] == 1 && n <= strlen(TP_EVT_HEARTBEAT_TOPIC) && !memcmp(p + 1, TP_EVT_HEARTBEAT_TOPIC, n))
        b->beat_asked = true;
}

static void beat_tick(broker *b, int64_t now)
{
    int64_t since = now - b->last_beat_ms;
    if (since >= b->cfg->heartbeat_ms || (b->beat_asked && since >= B_BEAT_MIN_GAP_MS)) {
        publish_beat(b);
        b->beat_asked = false;
    }
}

/* ---- setup -------------------------------------------------------------------- */

/* Does a process accept connections on the unix socket at path? A file left
 * by a crashed run refuses them; a running broker's accepts. */
static bool ipc_in_use(const char *path)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (path[0] == '@' || strlen(path) >= sizeof a.sun_path)   /* abstract: nothing to unlink */
        return false;
    memcpy(a.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    bool live = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return live;
}

static void *make_socket(broker *b, int type, const char *ep, tp_zsec_role role, tp_err *err, int *rc)
{
    void *s = zmq_socket(b->zctx, type);
    if (!s) {
        *rc = tp_err_set(err, TP_EIO, "zmq_socket: %s", zmq_strerror(errno));
        return NULL;
    }
    int linger = b->cfg->linger_ms, one = 1;
    /* events are droppable (a subscriber that falls behind recovers from
     * STATUS), so each subscriber's queue is small: it bounds what one that
     * never reads costs */
    int hwm = type == ZMQ_XPUB ? b->cfg->events_sndhwm : b->cfg->sndhwm;
    int64_t maxmsg = type == ZMQ_XPUB ? B_MAX_SUBSCRIPTION : b->cfg->max_msg_bytes;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    if (type == ZMQ_ROUTER)   /* EHOSTUNREACH instead of a silent drop */
        zmq_setsockopt(s, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    if (type == ZMQ_XPUB)     /* every subscription, not only a topic's first */
        zmq_setsockopt(s, ZMQ_XPUB_VERBOSE, &one, sizeof one);
    if (!strncmp(ep, "ipc://", 6)) {
        /* zmq would replace the file and orphan a running broker: its
         * workers and clients would reach this one, and nobody it */
        if (ipc_in_use(ep + 6)) {
            *rc = tp_err_set(err, TP_EIO, "bind %s: another process (a running tokpiped?) is listening there", ep);
            zmq_close(s);
            return NULL;
        }
        unlink(ep + 6);   /* a stale socket file from a crashed run */
    }
    if ((*rc = tp_zsec_server_apply(b->zsec, s, ep, role, err))) {
        zmq_close(s);
        return NULL;
    }
    if (zmq_bind(s, ep)) {
        *rc = tp_err_set(err, TP_EIO, "bind %s: %s", ep, zmq_strerror(errno));
        zmq_close(s);
        return NULL;
    }
    /* the ipc form of roles: the runtime directory may be open to a group
     * of clients (systemd: /run/tokpipe, group tokpipe), but only the
     * broker's own user may reach the worker endpoints */
    if (role == TP_ZSEC_WORKER && !strncmp(ep, "ipc://", 6) && ep[6] != '@' && chmod(ep + 6, 0600)) {
        *rc = tp_err_set(err, TP_EIO, "chmod 0600 %s: %s", ep + 6, strerror(errno));
        zmq_close(s);
        return NULL;
    }
    return s;
}

/* speculative.draft_model, read as a draft worker would: one whose
 * vocabulary is not the target's stops tokpiped at start, naming both
 * sizes (its guesses would be ids of another vocabulary). */
static int load_draft_ref(broker *b, tp_err *err)
{
    const char *path = b->cfg->spec_draft_model;
    if (!*path)
        return 0;
    tp_model *m = NULL;
    tp_err e;
    tp_err_clear(&e);
    int rc = tp_model_load(path, &m, &e);
    if (rc == TP_EIO) {
        blog("speculative.draft_model: %s: not readable here; draft workers are checked as they register", e.msg);
        return 0;
    }
    if (rc)
        return tp_err_set(err, rc, "speculative.draft_model %s: %s", path, e.msg);
    snprintf(b->draft_model_id, sizeof b->draft_model_id, "%s", tp_model_identity(m));
    rc = b->model_vocab ? tp_draft_check((int)b->model_vocab, m, path, err) : 0;
    tp_model_free(m);
    return rc;
}

/* Read the model the config names, as a worker would, for the reference
 * every READY must match: a corrupt file stops tokpiped at start, naming
 * it, instead of leaving a broker that looks healthy while its workers
 * fail. A file this host cannot read (workers elsewhere) is not an error:
 * the first worker's model is the reference then. */
static int load_model_ref(broker *b, tp_err *err)
{
    tp_model *m = NULL;
    tp_err e;
    tp_err_clear(&e);
    int rc = tp_model_load(b->cfg->model_path, &m, &e);
    if (rc == TP_EIO) {
        blog("model.path: %s: not readable here; the first worker's model is the reference", e.msg);
        return 0;
    }
    if (rc)
        return tp_err_set(err, rc, "model.path %s: %s", b->cfg->model_path, e.msg);
    const tp_model_config *mc = tp_model_get_config(m);
    snprintf(b->model_id, sizeof b->model_id, "%s", tp_model_identity(m));
    b->model_vocab = (uint32_t)mc->vocab_size;
    b->model_seq_len = (uint32_t)mc->seq_len;
    b->model_hybrid = mc->full_attn_interval > 0;
    tp_model_free(m);
    return load_draft_ref(b, err);
}

static void zsec_log(void *ctx, const char *line)
{
    (void)ctx;
    blog("%s", line);
}

int broker_init(broker *b, tp_config *cfg, tp_err *err)
{
    b->cfg = cfg;
    b->t_start_ms = tp_now_ms();
    b->incarnation = tp_random_u64();
    int rc = jobs_init(&b->jt, cfg->max_concurrent_jobs, err);
    if (rc || (rc = load_model_ref(b, err)))
        return rc;
    if (mkdir(cfg->runtime_dir, 0700) && errno != EEXIST)
        return tp_err_set(err, TP_EIO, "runtime_dir %s: %s", cfg->runtime_dir, strerror(errno));
    b->zctx = zmq_ctx_new();
    if (!b->zctx)
        return tp_err_set(err, TP_EIO, "zmq_ctx_new failed");
    /* the ZAP handler first: a CURVE socket without one admits every key */
    if ((rc = tp_zsec_server_new(b->zctx, cfg, zsec_log, b, &b->zsec, err)))
        return rc;
    rc = 0;
    if (!(b->front = make_socket(b, ZMQ_ROUTER, cfg->ep_front, TP_ZSEC_CLIENT, err, &rc)) ||
        !(b->back = make_socket(b, ZMQ_ROUTER, cfg->ep_back, TP_ZSEC_WORKER, err, &rc)) ||
        !(b->xsub = make_socket(b, ZMQ_XSUB, cfg->ep_publish, TP_ZSEC_WORKER, err, &rc)) ||
        !(b->xpub = make_socket(b, ZMQ_XPUB, cfg->ep_events, TP_ZSEC_CLIENT, err, &rc)))
        return rc;
    if ((rc = standby_open(b, err)))
        return rc;
    /* A worker's connection closing is seen at once: the monitor reports
     * the disconnect (without saying whose), and the broker then probes
     * every worker until the ROUTER refuses the dead one (EHOSTUNREACH). */
    char mon[96];
    snprintf(mon, sizeof mon, "inproc://tokpiped-back-monitor-%p", (void *)b);
    if (zmq_socket_monitor(b->back, mon, ZMQ_EVENT_DISCONNECTED) || !(b->back_mon = zmq_socket(b->zctx, ZMQ_PAIR)) ||
        zmq_connect(b->back_mon, mon))
        return tp_err_set(err, TP_EIO, "backend monitor: %s", zmq_strerror(errno));
    /* The broker keeps every job's result, so it takes all events whatever
     * the subscribers ask for (their subscriptions are not forwarded). */
    uint8_t sub_all = 1;
    zmq_send(b->xsub, &sub_all, 1, 0);
    return 0;
}

void broker_free(broker *b)
{
    void *socks[] = {b->front, b->back, b->xsub, b->xpub};
    if (b->back_mon) {
        zmq_socket_monitor(b->back, NULL, 0);
        zmq_close(b->back_mon);
    }
    for (size_t i = 0; i < 4; i++)
        if (socks[i])
            zmq_close(socks[i]);
    standby_close(b);
    info_free(b);
    tp_zsec_server_free(b->zsec);
    if (b->zctx)
        zmq_ctx_term(b->zctx);
    /* only the files this broker bound: the others may be another's */
    const char *eps[] = {b->cfg->ep_front, b->cfg->ep_back, b->cfg->ep_publish, b->cfg->ep_events};
    for (size_t i = 0; i < 4; i++)
        if (socks[i] && !strncmp(eps[i], "ipc://", 6))
            unlink(eps[i] + 6);
    for (int i = 0; i < B_MAX_WORKERS; i++)
        registry_drop(b, i);   /* the tasks each still owed */
    jobs_free(&b->jt);
    route_free(b);
    step_free(b);
    spawn_free(b);
    out_free(b);
}

/* ---- the loop ------------------------------------------------------------------- */

static void on_event(broker *b, tp_zmsg *z)
{
    tp_msg m;
    tp_err e;
    if (tp_proto_decode(TP_FAM_EVT, z->f, z->n, &m, &e) || z->dropped ||
        (m.cmd != TP_CMD_TOKEN && m.cmd != TP_CMD_FINISH)) {
        b->stats.malformed_events++;
        blog("dropped a malformed event: %s",
                   z->dropped ? "too many frames" : m.cmd == TP_CMD_HEARTBEAT ? "a HEARTBEAT is the broker's" : e.msg);
        tp_msg_clear(&m);
        return;
    }
    if (!jobs_event_from_pinned(&b->jt, &m)) {
        /* a forger, or a worker the job was moved away from: neither is
         * believed nor forwarded */
        b->stats.events_refused++;
        int64_t now = tp_now_ms();
        if (now - b->refused_log_ms >= 1000) {
            b->refused_log_ms = now;
            blog("refused an event for job '%.*s': not from the stop worker it is pinned to (%llu so far)",
                       (int)(m.cmd == TP_CMD_TOKEN ? m.token.job_id.len : m.finish.job_id.len),
                       m.cmd == TP_CMD_TOKEN ? m.token.job_id.ptr : m.finish.job_id.ptr,
                       (unsigned long long)b->stats.events_refused);
        }
        tp_msg_clear(&m);
        return;
    }
    if (!jobs_event_wanted(&b->jt, &m)) {
        b->stats.events_duplicate++;
        tp_msg_clear(&m);
        return;
    }
    if (m.cmd == TP_CMD_FINISH) {
        /* how much of the prompt came from a prefix cache is the broker's
         * to say (step.c sums what the forward workers reported): the
         * one field of a FINISH the stop worker does not know */
        const bjob *fj = jobs_find(&b->jt, m.finish.job_id.ptr, m.finish.job_id.len);
        m.finish.cached_tokens = fj ? fj->cached : 0;
        if (tp_zsend_msg(b->xpub, NULL, 0, &m, &e))
            blog("job %.*s: FINISH not published: %s", (int)m.finish.job_id.len, m.finish.job_id.ptr, e.msg);
    } else {
        for (size_t i = 0; i < z->n; i++)
            zmq_send(b->xpub, z->f[i].len ? z->f[i].data : "", z->f[i].len,
                     ZMQ_DONTWAIT | (i + 1 < z->n ? ZMQ_SNDMORE : 0));
    }
    b->stats.events_published++;
    const bjob *j = NULL;
    int64_t resumed = jobs_on_event(&b->jt, &m, &j);
    if (resumed >= 0)
        blog("job %s: stream resumed %lld ms after its worker was lost", j->id, (long long)resumed);
    tp_msg_clear(&m);
}

/* A worker's message: the registry says what it is for. */
static void on_backend(broker *b, tp_zmsg *z)
{
    tp_msg m;
    int wi;
    switch (registry_on_message(b, &z->f[0], z->f + 1, z->n - 1, &m, &wi)) {
    case REG_RESULT:
        sched_on_result(b, wi, &m);
        break;
    case REG_LOST:
        recover_worker_lost(b, wi, "it disconnected", true);
        break;
    case REG_READY:
        if (!standby_serving(b)) {   /* a passive broker: the worker tries the other one */
            tp_msg d;
            tp_msg_init(&d, TP_FAM_WRK, TP_CMD_DISCONNECT);
            d.disconnect.reason = tp_str_of(TP_STANDBY_PASSIVE_ERROR);
            tp_err e;
            tp_zsend_msg(b->back, &z->f[0], 1, &d, &e);
            break;
        }
        if (wi >= 0)
            recover_worker_lost(b, wi, "it registered again", false);
        if (registry_on_ready(b, &z->f[0], &m.ready))
            info_on_ready(b, &m.ready);
        break;
    }
    tp_msg_clear(&m);
}

static void drain_socket(broker *b, void *s, int which)
{
    /* bounded so one busy socket cannot starve the others */
    for (int k = 0; k < 256; k++) {
        tp_zmsg z;
        if (tp_zmsg_recv(s, &z, ZMQ_DONTWAIT) < 0)
            return;
        if (which == 0) {
            front_on_message(b, z.f, z.n, z.dropped > 0);
        } else if (which == 1) {
            if (z.n >= 1 && !z.dropped)
                on_backend(b, &z);
            else
                b->stats.malformed_back++;
        } else if (which == 2) {
            on_event(b, &z);
        } else if (z.n == 1) {
            on_subscription(b, &z.f[0]);   /* XPUB subscription notices */
        }
        tp_zmsg_close(&z);
        flush(b);
    }
}

/* Backend monitor events (two frames each): any disconnect starts probing. */
static void on_monitor(broker *b)
{
    for (int k = 0; k < 64; k++) {
        tp_zmsg z;
        if (tp_zmsg_recv(b->back_mon, &z, ZMQ_DONTWAIT) < 0)
            return;
        b->probe_until = tp_now_ms() + B_PROBE_MS;
        tp_zmsg_close(&z);
    }
}

static void start_drain(broker *b)
{
    b->draining = true;
    b->drain_deadline = tp_now_ms() + b->cfg->drain_timeout_ms;
    sd_notify(0, "STOPPING=1\nSTATUS=draining");
    blog("draining: %d active jobs, up to %d ms", b->jt.n_active, b->cfg->drain_timeout_ms);
}

static void drain_tick(broker *b, int64_t now)
{
    if (!b->cancelled_all && now >= b->drain_deadline) {
        b->cancelled_all = true;
        b->drain_deadline = now + 2000;   /* time for the cancels' FINISH events */
        for (uint32_t i = 0; i < b->jt.cap; i++) {
            bjob *j = &b->jt.jobs[i];
            if (j->state == J_TOKENIZE || j->state == J_ADMIT || (j->state == J_RUNNING && !j->cancel))
                pin_cancel(b, j);
        }
        sched_run(b);
    }
    if (b->jt.n_active == 0 || (b->cancelled_all && now >= b->drain_deadline))
        b->done = true;
}

static void say_status(broker *b)
{
    char st[240];
    snprintf(st, sizeof st, "STATUS=workers tokenize %d forward %d sample %d stop %d draft %d; %d active jobs",
             registry_count(b, TP_STAGE_TOKENIZE), registry_count(b, TP_STAGE_FORWARD),
             registry_count(b, TP_STAGE_SAMPLE), registry_count(b, TP_STAGE_STOP), registry_count(b, TP_STAGE_DRAFT),
             b->jt.n_active);
    sd_notify(0, st);
}

/* DISCONNECT to every worker (they register anew, here or elsewhere). */
static void disconnect_workers(broker *b, const char *why)
{
    for (int i = 0; i < B_MAX_WORKERS; i++)
        if (b->workers[i].live) {
            tp_msg m;
            tp_msg_init(&m, TP_FAM_WRK, TP_CMD_DISCONNECT);
            m.disconnect.reason = tp_str_of(why);
            out_worker(b, i, &m);
        }
    flush(b);
}

int broker_run(broker *b)
{
    sd_notify(0, "READY=1\nSTATUS=broker ready, waiting for workers");
    blog("listening: front %s, back %s, events %s, publish %s", b->cfg->ep_front, b->cfg->ep_back,
               b->cfg->ep_events, b->cfg->ep_publish);
    int64_t last_tick = 0, last_status = 0;
    bool serving = standby_serving(b);
    publish_beat(b);
    while (!b->done) {
        if (*b->quit && !b->draining)
            start_drain(b);
        zmq_pollitem_t it[7] = {{b->front, 0, ZMQ_POLLIN, 0}, {b->back, 0, ZMQ_POLLIN, 0},
                                {b->xsub, 0, ZMQ_POLLIN, 0}, {b->xpub, 0, ZMQ_POLLIN, 0},
                                {b->back_mon, 0, ZMQ_POLLIN, 0},
                                {tp_zsec_server_socket(b->zsec), 0, ZMQ_POLLIN, 0},
                                {standby_socket(b), 0, ZMQ_POLLIN, 0}};
        if (!b->zsec)
            it[5] = it[6];
        bool probing = tp_now_ms() < b->probe_until;
        int n = zmq_poll(it, 5 + (b->zsec != NULL) + (b->standby != NULL),
                         probing ? 5 : b->beat_asked ? B_BEAT_MIN_GAP_MS : 50);
        if (n < 0 && errno != EINTR)
            break;
        /* events first: a lost stop worker's last events are then known
         * before its loss is handled from the backend */
        if (n > 0 && (it[2].revents & ZMQ_POLLIN))
            drain_socket(b, it[2].socket, 2);
        for (int i = 0; n > 0 && i < 4; i++)
            if (i != 2 && (it[i].revents & ZMQ_POLLIN))
                drain_socket(b, it[i].socket, i);
        if (n > 0 && (it[4].revents & ZMQ_POLLIN))
            on_monitor(b);
        if (n > 0 && b->zsec && (it[5].revents & ZMQ_POLLIN))
            tp_zsec_server_handle(b->zsec);
        if (probing)
            probe_workers(b);
        reap(b);
        int64_t now = tp_now_ms();
        if (now - last_tick >= 50) {
            last_tick = now;
            registry_tick(b, now);
            beat_workers(b, now);
            reap(b);
            jobs_expire(&b->jt, now, b->cfg->finished_ttl_ms);
            recover_lost_finish(b, now);
            if (b->spawn)
                spawn_tick(b, now);
            if (b->draining)
                drain_tick(b, now);
            sched_run(b);
            flush(b);
            /* a burst (thousands of jobs, slow subscribers' queues) leaves
             * glibc holding the freed memory; hand it back once quiet */
            if (b->jt.n_active > 0) {
                b->last_busy_ms = now;
                b->trimmed = false;
            } else if (!b->trimmed && now - b->last_busy_ms >= B_TRIM_IDLE_MS) {
                malloc_trim(0);
                b->trimmed = true;
            }
        }
        standby_tick(b, now);
        if (serving != standby_serving(b)) {
            serving = !serving;
            if (serving)
                publish_beat(b);   /* subscribers hear the new active broker at once */
            else
                disconnect_workers(b, TP_STANDBY_PASSIVE_ERROR);   /* they go to the active one */
        }
        beat_tick(b, now);
        if (now - last_status >= 5000) {
            last_status = now;
            say_status(b);
        }
    }
    /* tell every worker, then stop the processes we started */
    disconnect_workers(b, "broker shutting down");
    if (b->spawn)
        spawn_stop_all(b, 3000);
    blog("stopped");
    return 0;
}
