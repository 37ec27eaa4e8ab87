/* Producer/subscriber client over ZeroMQ (see client.h). */
#include "client.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "tokpipe/config.h"
#include "tokpipe/zwire.h"

#define DEFAULT_TIMEOUT_MS 5000

struct tp_client {
    void *ctx;
    void *dealer;
    void *sub;
    void *monitor;          /* PAIR receiving the SUB socket's handshake events */
    char *front;
    char *events;
    char *peer_front, *peer_events;   /* the standby peer's, or NULL */
    tp_zsec_client sec;
    int timeout_ms;
    uint64_t next_req;
    uint64_t bad_events;
    bool events_ready;
    bool beat_subscribed;
    bool silent;            /* SILENT was said; the next heartbeat ends it */
    tp_client_live live;
    int interrupt_fd;       /* -1 none; readable = stop waiting */
};

void tp_recv_free(tp_recv *r)
{
    if (!r)
        return;
    tp_msg_clear(&r->m);
    for (size_t i = 0; i < r->n; i++)
        free((void *)r->f[i].data);
    memset(r, 0, sizeof *r);
}

static int zerr(tp_err *err, const char *what, const char *ep)
{
    return tp_err_set(err, TP_EIO, "%s %s: %s", what, ep ? ep : "", zmq_strerror(zmq_errno()));
}

static int set_int(void *s, int opt, int v)
{
    return zmq_setsockopt(s, opt, &v, sizeof v);
}

static int open_monitor(tp_client *c, tp_err *err)
{
    char addr[64];
    snprintf(addr, sizeof addr, "inproc://tp-client-mon-%p", (void *)c);
    if (zmq_socket_monitor(c->sub, addr, ZMQ_EVENT_HANDSHAKE_SUCCEEDED) != 0)
        return zerr(err, "monitor", c->events);
    c->monitor = zmq_socket(c->ctx, ZMQ_PAIR);
    if (!c->monitor || zmq_connect(c->monitor, addr) != 0)
        return zerr(err, "monitor", c->events);
    return 0;
}

static int open_sockets(tp_client *c, tp_err *err)
{
    if (c->front) {
        c->dealer = zmq_socket(c->ctx, ZMQ_DEALER);
        if (!c->dealer || set_int(c->dealer, ZMQ_LINGER, 0))
            return zerr(err, "cannot connect to frontend", c->front);
        int rc = tp_zsec_client_apply(&c->sec, c->dealer, c->front, err);
        if (rc)
            return rc;
        /* a standby pair: requests only to a broker with a live
         * connection (not queued for a dead one) */
        if (c->peer_front && set_int(c->dealer, ZMQ_IMMEDIATE, 1))
            return zerr(err, "cannot connect to frontend", c->front);
        if (zmq_connect(c->dealer, c->front))
            return zerr(err, "cannot connect to frontend", c->front);
        if (c->peer_front && ((rc = tp_zsec_client_apply(&c->sec, c->dealer, c->peer_front, err)) ||
                              zmq_connect(c->dealer, c->peer_front)))
            return rc ? rc : zerr(err, "cannot connect to frontend", c->peer_front);
    }
    if (c->events) {
        c->sub = zmq_socket(c->ctx, ZMQ_SUB);
        if (!c->sub || set_int(c->sub, ZMQ_LINGER, 0))
            return zerr(err, "cannot create SUB socket for", c->events);
        int rc = open_monitor(c, err); /* before connect, so the handshake event is not missed */
        if (!rc)
            rc = tp_zsec_client_apply(&c->sec, c->sub, c->events, err);
        if (rc)
            return rc;
        if (zmq_connect(c->sub, c->events))
            return zerr(err, "cannot connect to events", c->events);
        /* a passive broker publishes nothing: the events are the active one's */
        if (c->peer_events && ((rc = tp_zsec_client_apply(&c->sec, c->sub, c->peer_events, err)) ||
                               zmq_connect(c->sub, c->peer_events)))
            return rc ? rc : zerr(err, "cannot connect to events", c->peer_events);
    }
    return 0;
}

int tp_client_new(const tp_client_opts *o, tp_client **out, tp_err *err)
{
    tp_client *c = calloc(1, sizeof *c);
    if (!c)
        return tp_err_set(err, TP_ENOMEM, "client: out of memory");
    c->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : DEFAULT_TIMEOUT_MS;
    c->interrupt_fd = -1;
    if (o->sec)
        c->sec = *o->sec;
    c->ctx = zmq_ctx_new();
    c->front = o->front ? strdup(o->front) : NULL;
    c->events = o->events ? strdup(o->events) : NULL;
    if (o->front && o->peer_front && *o->peer_front)
        c->peer_front = strdup(o->peer_front);
    if (o->events && o->peer_events && *o->peer_events)
        c->peer_events = strdup(o->peer_events);
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, 0) != sizeof seed)
        seed = (uint64_t)time(NULL) ^ (uint64_t)getpid();
    c->next_req = (seed >> 16) | 1; /* distinct from other clients' numbers, never 0 */
    int rc = 0;
    if (!c->ctx || (o->front && !c->front) || (o->events && !c->events))
        rc = tp_err_set(err, TP_ENOMEM, "client: out of memory");
    if (!rc)
        rc = open_sockets(c, err);
    if (rc) {
        tp_client_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

void tp_client_free(tp_client *c)
{
    if (!c)
        return;
    if (c->sub)
        zmq_socket_monitor(c->sub, NULL, 0);
    if (c->monitor)
        zmq_close(c->monitor);
    if (c->dealer)
        zmq_close(c->dealer);
    if (c->sub)
        zmq_close(c->sub);
    if (c->ctx)
        zmq_ctx_term(c->ctx);
    free(c->front);
    free(c->events);
    free(c->peer_front);
    free(c->peer_events);
    memset(&c->sec, 0, sizeof c->sec);
    free(c);
}

const char *tp_client_front(const tp_client *c)
{
    return c->front ? c->front : "(none)";
}

const char *tp_client_events(const tp_client *c)
{
    return c->events ? c->events : "(none)";
}

uint64_t tp_client_bad_events(const tp_client *c)
{
    return c->bad_events;
}

int tp_client_send(tp_client *c, tp_msg *m, uint64_t *req_out, tp_err *err)
{
    if (!c->dealer)
        return tp_err_set(err, TP_ESTATE, "client: no frontend endpoint");
    if (m->req == 0)
        m->req = c->next_req++;
    if (req_out)
        *req_out = m->req;
    tp_wire w;
    int rc = tp_proto_encode(m, &w, err);
    if (rc)
        return rc;
    for (size_t i = 0; i < w.n && !rc; i++)
        if (zmq_send(c->dealer, w.f[i].data, w.f[i].len, i + 1 < w.n ? ZMQ_SNDMORE : 0) < 0)
            rc = zerr(err, "send to", c->front);
    tp_wire_free(&w);
    return rc;
}

void tp_client_set_interrupt_fd(tp_client *c, int fd)
{
    c->interrupt_fd = fd;
}

/* Wait for socket s to be readable: 1 readable, 0 timeout, 2 the interrupt
 * fd is readable, < 0 error. */
static int wait_readable(const tp_client *c, void *s, int timeout_ms)
{
    zmq_pollitem_t it[2] = {{s, 0, ZMQ_POLLIN, 0}, {NULL, c->interrupt_fd, ZMQ_POLLIN, 0}};
    for (;;) {
        int n = zmq_poll(it, c->interrupt_fd >= 0 ? 2 : 1, timeout_ms);
        if (n >= 0)
            return (it[1].revents & ZMQ_POLLIN) ? 2 : n > 0;
        if (zmq_errno() != EINTR)
            return -1;
    }
}

static int interrupted(tp_err *err)
{
    return tp_err_set(err, TP_ESTATE, "interrupted");
}

/* Read one whole multipart message into r's frames (heap copies). */
static int read_frames(void *s, tp_recv *r, tp_err *err, const char *ep)
{
    memset(r, 0, sizeof *r);
    int more = 1;
    while (more) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, s, 0) < 0) {
            zmq_msg_close(&part);
            tp_recv_free(r);
            return zerr(err, "receive from", ep);
        }
        more = zmq_msg_more(&part);
        if (r->n < sizeof r->f / sizeof *r->f) {
            size_t len = zmq_msg_size(&part);
            void *copy = malloc(len ? len : 1);
            if (!copy) {
                zmq_msg_close(&part);
                tp_recv_free(r);
                return tp_err_set(err, TP_ENOMEM, "client: out of memory");
            }
            memcpy(copy, zmq_msg_data(&part), len);
            r->f[r->n++] = (tp_frame){copy, len};
        } else {
            r->n = sizeof r->f / sizeof *r->f; /* too many frames: the decoder rejects it */
        }
        zmq_msg_close(&part);
    }
    return 0;
}

/* The end of a "no answer" message: with CURVE, a refused key looks
 * exactly like a broker that is not there. */
static const char *no_answer_hint(const tp_client *c, const char *ep)
{
    return c->sec.on && !strncmp(ep, "tcp://", 6)
               ? "is tokpiped running, with this client's public key in its security.client_keys (or authorized_keys) "
                 "and its public key in security.server_public_key?"
               : "is tokpiped running?";
}

int tp_client_recv_reply(tp_client *c, tp_recv *reply, tp_err *err)
{
    memset(reply, 0, sizeof *reply);
    if (!c->dealer)
        return tp_err_set(err, TP_ESTATE, "client: no frontend endpoint");
    int ready = wait_readable(c, c->dealer, c->timeout_ms);
    if (ready < 0)
        return zerr(err, "poll", c->front);
    if (ready == 2)
        return interrupted(err);
    if (ready == 0)
        return tp_err_set(err, TP_EIO, "no reply from %s within %d ms: %s", c->front, c->timeout_ms,
                          no_answer_hint(c, c->front));
    int rc = read_frames(c->dealer, reply, err, c->front);
    if (rc)
        return rc;
    tp_err e;
    if ((rc = tp_proto_decode(TP_FAM_JOB, reply->f, reply->n, &reply->m, &e))) {
        tp_recv_free(reply);
        return tp_err_set(err, rc, "malformed reply from %s: %s", c->front, e.msg);
    }
    return 0;
}

bool tp_client_passive_refusal(const tp_msg *r)
{
    size_t n = strlen(TP_STANDBY_PASSIVE_ERROR);
    return r->status == TP_ST_UNAVAILABLE && r->error.len == n && !memcmp(r->error.ptr, TP_STANDBY_PASSIVE_ERROR, n);
}

int tp_client_call(tp_client *c, tp_msg *m, tp_recv *reply, tp_err *err)
{
    /* a passive standby broker's refusal: again (the DEALER takes the
     * other connection next), until the active one answers or, while the
     * backup waits out failover_ms, for as long as a reply may take */
    int64_t until = tp_now_ms() + c->timeout_ms;
    for (;;) {
        uint64_t req;
        int rc = tp_client_send(c, m, &req, err);
        while (!rc) {
            rc = tp_client_recv_reply(c, reply, err);
            if (rc || reply->m.req == req || (reply->m.cmd == TP_CMD_ERROR && reply->m.req == 0))
                break;
            tp_recv_free(reply); /* a late reply to an earlier request */
        }
        if (rc || !c->peer_front || !tp_client_passive_refusal(&reply->m) || tp_now_ms() >= until)
            return rc;
        tp_recv_free(reply);
        usleep(50 * 1000);
    }
}

int tp_client_subscribe(tp_client *c, const char *prefix, tp_err *err)
{
    if (!c->sub)
        return tp_err_set(err, TP_ESTATE, "client: no events endpoint");
    if (zmq_setsockopt(c->sub, ZMQ_SUBSCRIBE, prefix, strlen(prefix)))
        return zerr(err, "subscribe on", c->events);
    return 0;
}


int tp_client_subscribe_heartbeat(tp_client *c, tp_err *err)
{
    int rc = tp_client_subscribe(c, TP_EVT_HEARTBEAT_TOPIC, err);
    c->beat_subscribed = rc == 0;
    return rc;
}

const tp_client_live *tp_client_liveness(const tp_client *c)
{
    return &c->live;
}

/* One decodable message from the SUB socket within left ms (< 0 forever):
 * 1 got it, 0 timeout, < 0 error. */
static int recv_event(tp_client *c, int left, tp_recv *ev, tp_err *err)
{
    int64_t deadline = left < 0 ? -1 : tp_now_ms() + left;
    for (;;) {
        int ready = wait_readable(c, c->sub, left);
        if (ready < 0)
            return zerr(err, "poll", c->events);
        if (ready == 2)
            return interrupted(err);
        if (ready == 0)
            return 0;
        int rc = read_frames(c->sub, ev, err, c->events);
        if (rc)
            return rc;
        tp_err e;
        if (tp_proto_decode(TP_FAM_EVT, ev->f, ev->n, &ev->m, &e) == 0)
            return 1;
        c->bad_events++;
        tp_recv_free(ev);
        if (deadline >= 0 && (left = (int)(deadline - tp_now_ms())) < 0)
            left = 0;
    }
}

/* Take a heartbeat in: the TP_NEXT_* news it brings, or -1 none. */
static int on_beat(tp_client *c, const tp_m_beat *b)
{
    tp_client_live *l = &c->live;
    int64_t now = tp_now_ms();
    int news = -1;
    l->silent_ms = l->last_beat_ms ? now - l->last_beat_ms : 0;
    if (l->incarnation && b->incarnation != l->incarnation) {
        l->prev_incarnation = l->incarnation;
        news = TP_NEXT_RESTARTED;
    } else if (c->silent) {
        news = TP_NEXT_ALIVE;
    }
    c->silent = false;
    l->incarnation = b->incarnation;
    l->uptime_ms = b->uptime_ms;
    l->interval_ms = b->interval_ms;
    l->liveness = b->liveness;
    l->last_beat_ms = now;
    return news;
}

/* When the broker will have been silent too long; -1 not judged (no
 * heartbeat yet, or SILENT already said). */
static int64_t silence_at(const tp_client *c)
{
    if (!c->live.last_beat_ms || c->silent)
        return -1;
    return c->live.last_beat_ms + (int64_t)c->live.interval_ms * c->live.liveness;
}

static int wait_first_beat(tp_client *c, int64_t deadline, tp_err *err)
{
    while (!c->live.incarnation) {
        int left = (int)(deadline - tp_now_ms());
        tp_recv ev;
        int rc = left > 0 ? recv_event(c, left, &ev, err) : 0;
        if (rc < 0)
            return rc;
        if (rc == 0)
            return tp_err_set(err, TP_EIO, "connected to %s, but no heartbeat from the broker within %d ms: "
                              "is it tokpiped?", c->events, c->timeout_ms);
        if (ev.m.cmd == TP_CMD_HEARTBEAT)
            on_beat(c, &ev.m.beat);
        tp_recv_free(&ev);   /* nothing submitted yet: no event of ours to lose */
    }
    return 0;
}

int tp_client_wait_events_ready(tp_client *c, tp_err *err)
{
    if (!c->sub)
        return tp_err_set(err, TP_ESTATE, "client: no events endpoint");
    int64_t deadline = tp_now_ms() + c->timeout_ms;
    while (!c->events_ready) {
        int left = (int)(deadline - tp_now_ms());
        int ready = left > 0 ? wait_readable(c, c->monitor, left) : 0;
        if (ready == 2)
            return interrupted(err);
        if (ready <= 0)
            return tp_err_set(err, TP_EIO, "cannot connect to the event endpoint %s within %d ms: %s", c->events,
                              c->timeout_ms, no_answer_hint(c, c->events));
        tp_recv ev;
        int rc = read_frames(c->monitor, &ev, err, "monitor");
        if (rc)
            return rc;
        uint16_t id = 0;
        if (ev.n >= 1 && ev.f[0].len >= 2)
            memcpy(&id, ev.f[0].data, 2);
        c->events_ready = id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED;
        tp_recv_free(&ev);
    }
    if (c->beat_subscribed)
        return wait_first_beat(c, deadline, err);
    /* The handshake is done and our subscriptions are the next thing on the
     * wire: give them a moment to reach the broker before the caller
     * submits (a late one is still caught: gaps fall back to STATUS). */
    usleep(20 * 1000);
    return 0;
}

int tp_client_next_event(tp_client *c, int timeout_ms, tp_recv *ev, tp_err *err)
{
    memset(ev, 0, sizeof *ev);
    if (!c->sub)
        return tp_err_set(err, TP_ESTATE, "client: no events endpoint");
    int64_t deadline = timeout_ms < 0 ? -1 : tp_now_ms() + timeout_ms;
    for (;;) {
        int64_t now = tp_now_ms(), quiet = silence_at(c), until = deadline;
        if (quiet >= 0 && (until < 0 || quiet < until))
            until = quiet;
        int rc = recv_event(c, until < 0 ? -1 : until > now ? (int)(until - now) : 0, ev, err);
        if (rc < 0)
            return rc;
        if (rc == 1 && ev->m.cmd != TP_CMD_HEARTBEAT)
            return TP_NEXT_EVENT;
        if (rc == 1) {
            int news = on_beat(c, &ev->m.beat);
            tp_recv_free(ev);
            if (news >= 0)
                return news;
            continue;
        }
        now = tp_now_ms();
        if (quiet >= 0 && now >= quiet) {
            c->silent = true;
            c->live.silent_ms = now - c->live.last_beat_ms;
            return TP_NEXT_SILENT;
        }
        if (deadline >= 0 && now >= deadline)
            return TP_NEXT_TIMEOUT;
    }
}

static int copy_ep(char *dst, size_t cap, const char *src, const char *what, tp_err *err)
{
    if (!src || !*src)
        return tp_err_set(err, TP_EINVAL, "no %s endpoint", what);
    if (strlen(src) >= cap)
        return tp_err_set(err, TP_EINVAL, "%s endpoint too long", what);
    strcpy(dst, src);
    return 0;
}

int tp_endpoints_resolve(const char *config_path, const char *front, const char *events, tp_endpoints *ep,
                         tp_err *err)
{
    tp_config cfg;
    int rc;
    memset(ep, 0, sizeof *ep);
    rc = tp_config_find(config_path, &cfg, NULL, err);
    if (rc)
        return rc;
    rc = copy_ep(ep->front, sizeof ep->front, front ? front : cfg.ep_front, "front", err);
    if (!rc)
        rc = copy_ep(ep->events, sizeof ep->events, events ? events : cfg.ep_events, "events", err);
    if (!rc && !front && strlen(cfg.peer_front) < sizeof ep->peer_front)
        strcpy(ep->peer_front, cfg.peer_front);
    if (!rc && !events && strlen(cfg.peer_events) < sizeof ep->peer_events)
        strcpy(ep->peer_events, cfg.peer_events);
    if (!rc)
        rc = tp_zsec_client_load(&cfg, &ep->sec, err);
    tp_config_free(&cfg);
    return rc;
}

void tp_client_job_id(char *out, size_t cap, unsigned i)
{
    uint32_t r = 0;
    if (getrandom(&r, sizeof r, 0) != sizeof r)
        r = (uint32_t)time(NULL);
    snprintf(out, cap, "g-%d-%08x-%u", (int)getpid(), r, i);
}

int tp_client_parse_arg(tp_client_args *a, int argc, char **argv, int *i, tp_err *err)
{
    static const char *const flags[] = {"--config", "--front", "--events", "--timeout"};
    size_t k = 0;
    while (k < 4 && strcmp(argv[*i], flags[k]))
        k++;
    if (k == 4)
        return 0;
    if (*i + 1 >= argc)
        return tp_err_set(err, TP_EINVAL, "%s needs a value", flags[k]);
    const char *v = argv[++*i];
    if (k == 0)
        a->config = v;
    else if (k == 1)
        a->front = v;
    else if (k == 2)
        a->events = v;
    else {
        char *end;
        errno = 0;
        long ms = strtol(v, &end, 10);
        if (errno || end == v || *end || ms < 1 || ms > 3600000)
            return tp_err_set(err, TP_EINVAL, "--timeout: '%s' is not a number of ms in [1, 3600000]", v);
        a->timeout_ms = (int)ms;
    }
    return 1;
}

int tp_client_open(const tp_client_args *a, bool front, bool events, tp_client **out, tp_err *err)
{
    tp_endpoints ep;
    int rc = tp_endpoints_resolve(a->config, a->front, a->events, &ep, err);
    if (rc)
        return rc;
    tp_client_opts o = {front ? ep.front : NULL, events ? ep.events : NULL, a->timeout_ms, &ep.sec, ep.peer_front,
                        ep.peer_events};
    rc = tp_client_new(&o, out, err);
    memset(&ep.sec, 0, sizeof ep.sec);
    return rc;
}

int tp_client_cmd_parse(tp_client_cmd *c, int argc, char **argv)
{
    tp_err err = {0};
    for (int i = 1; i < argc; i++) {
        int rc = tp_client_parse_arg(&c->a, argc, argv, &i, &err);
        if (rc < 0)
            return fprintf(stderr, "tokpipe %s: %s\n", c->name, err.msg), 2;
        if (rc)
            continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            return fputs(c->usage, stdout), 0;
        if (c->json_flag && !strcmp(argv[i], c->json_flag))
            c->json = true;
        else if (c->takes_job && !c->job && argv[i][0] != '-')
            c->job = argv[i];
        else
            return fprintf(stderr, "tokpipe %s: unknown argument '%s'\n%s", c->name, argv[i], c->usage), 2;
    }
    if (c->takes_job && (!c->job || !tp_job_id_valid(c->job, strlen(c->job))))
        return fprintf(stderr, "tokpipe %s: %s\n%s", c->name, c->job ? "not a job id" : "JOB is required", c->usage),
               2;
    return -1;
}

int tp_client_cmd_call(tp_client_cmd *c, uint8_t cmd, uint8_t want)
{
    tp_msg_init(&c->request, TP_FAM_JOB, cmd);
    if (c->job)
        c->request.jobref.job_id = tp_str_of(c->job);
    tp_client *cl = NULL;
    int rc = tp_client_open(&c->a, true, false, &cl, &c->err);
    if (!rc)
        rc = tp_client_call(cl, &c->request, &c->reply, &c->err);
    tp_client_free(cl);
    const tp_msg *r = &c->reply.m;
    if (!rc && want && (r->cmd != want || r->status != TP_ST_OK))
        rc = tp_err_set(&c->err, TP_EIO, "%s answered %u %.*s", tp_cmd_name(TP_FAM_JOB, cmd), r->status,
                        (int)r->error.len, r->error.ptr ? r->error.ptr : "");
    return rc;
}

int tp_client_cmd_done(tp_client_cmd *c, int rc)
{
    if (rc)
        fprintf(stderr, "tokpipe %s: %s\n", c->name, c->err.msg);
    tp_recv_free(&c->reply);
    return rc ? 1 : 0;
}
