/* The Binary Star state machine and its two sockets (standby.h). The
 * pattern: https://zguide.zeromq.org/docs/chapter4/#Binary-Star-Reactor.
 * The state message between the pair is one frame, "TPBS" + the state
 * byte, published every failover_ms / 4 (the guide's HEARTBEAT; the peer
 * is lost after failover_ms, the guide's 2 x HEARTBEAT). */
#include "standby.h"
#include "log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "tokpipe/config.h"
#include "tokpipe/zwire.h"

#define BS_MAGIC "TPBS"

void bstar_init(bstar *bs, int role, int64_t failover_ms, int64_t now)
{
    bs->role = role;
    bs->state = role == TP_STANDBY_BACKUP ? BS_BACKUP : BS_PRIMARY;
    bs->failover_ms = failover_ms;
    bs->peer_expiry = now + failover_ms;
}

const char *bstar_state_name(int state)
{
    switch (state) {
    case BS_PRIMARY: return "primary";
    case BS_BACKUP: return "backup";
    case BS_ACTIVE: return "active";
    case BS_PASSIVE: return "passive";
    }
    return "?";
}

bool bstar_event(bstar *bs, int ev, int64_t now, const char **why)
{
    *why = NULL;
    if (ev != BS_CLIENT_REQUEST)
        bs->peer_expiry = now + bs->failover_ms;
    bool expired = now >= bs->peer_expiry;
    switch (bs->state) {
    case BS_PRIMARY:
        if (ev == BS_PEER_BACKUP) {
            *why = "connected to the backup (passive): active";
            bs->state = BS_ACTIVE;
        } else if (ev == BS_PEER_ACTIVE) {
            *why = "connected to the backup (active): passive";
            bs->state = BS_PASSIVE;
        } else if (ev == BS_CLIENT_REQUEST) {
            /* a client may make us active once we have waited long enough
             * to believe the backup is not active (after a failover) */
            if (!expired)
                return false;
            *why = "no backup heard within failover_ms, a client asked: active";
            bs->state = BS_ACTIVE;
        }
        return true;
    case BS_BACKUP:
        if (ev == BS_PEER_ACTIVE) {
            *why = "connected to the primary (active): passive";
            bs->state = BS_PASSIVE;
        } else if (ev == BS_CLIENT_REQUEST) {
            return false;
        }
        return true;
    case BS_ACTIVE:
        if (ev == BS_PEER_ACTIVE) {
            /* two actives (the pair was cut apart and each had clients):
             * the guide aborts; here the backup stands down, the primary
             * goes on, so there is never more than one for long */
            if (bs->role == TP_STANDBY_BACKUP) {
                *why = "the primary is active too: standing down (passive)";
                bs->state = BS_PASSIVE;
            } else {
                *why = "the backup is active too: it stands down, this primary stays active";
            }
        }
        return true;
    case BS_PASSIVE:
        if (ev == BS_PEER_PRIMARY || ev == BS_PEER_BACKUP) {
            /* the peer is restarting: we go active, it goes passive */
            *why = "the peer restarted: active";
            bs->state = BS_ACTIVE;
        } else if (ev == BS_PEER_PASSIVE) {
            *why = "the peer is passive too: nobody serves until one restarts";
        } else if (ev == BS_CLIENT_REQUEST) {
            /* the client request is what triggers the failover */
            if (!expired)
                return false;
            *why = "the peer is gone and a client asked: failover, active";
            bs->state = BS_ACTIVE;
        }
        return true;
    }
    return true;
}

/* ---- the broker's glue ------------------------------------------------------------- */

struct bstandby {
    bstar bs;
    void *pub, *sub;
    int64_t next_pub;
};

static int sock_err(tp_err *err, const char *what, const char *ep)
{
    return tp_err_set(err, TP_EIO, "standby: %s %s: %s", what, ep, zmq_strerror(errno));
}

int standby_open(broker *b, tp_err *err)
{
    const tp_config *c = b->cfg;
    if (!c->standby_role)
        return 0;
    struct bstandby *s = calloc(1, sizeof *s);
    if (!s)
        return tp_err_set(err, TP_ENOMEM, "standby: out of memory");
    b->standby = s;
    bstar_init(&s->bs, c->standby_role, c->standby_failover_ms, tp_now_ms());
    int linger = 0;
    if (!(s->pub = zmq_socket(b->zctx, ZMQ_PUB)) || !(s->sub = zmq_socket(b->zctx, ZMQ_SUB)))
        return sock_err(err, "socket", "");
    zmq_setsockopt(s->pub, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s->sub, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s->sub, ZMQ_SUBSCRIBE, BS_MAGIC, 4);
    if (zmq_bind(s->pub, c->standby_state))
        return sock_err(err, "bind", c->standby_state);
    if (zmq_connect(s->sub, c->standby_peer_state))
        return sock_err(err, "connect", c->standby_peer_state);
    blog("standby: %s, state on %s, peer's on %s, failover after %d ms", bstar_state_name(s->bs.state),
         c->standby_state, c->standby_peer_state, c->standby_failover_ms);
    return 0;
}

void standby_close(broker *b)
{
    struct bstandby *s = b->standby;
    if (!s)
        return;
    if (s->pub)
        zmq_close(s->pub);
    if (s->sub)
        zmq_close(s->sub);
    free(s);
    b->standby = NULL;
}

void *standby_socket(broker *b)
{
    return b->standby ? b->standby->sub : NULL;
}

static bool apply(broker *b, int ev, int64_t now)
{
    struct bstandby *s = b->standby;
    int was = s->bs.state;
    const char *why;
    bool ok = bstar_event(&s->bs, ev, now, &why);
    if (why)
        blog("standby: %s -> %s: %s", bstar_state_name(was), bstar_state_name(s->bs.state), why);
    if (s->bs.state != was)
        s->next_pub = 0;   /* say it at once */
    return ok;
}

void standby_tick(broker *b, int64_t now)
{
    struct bstandby *s = b->standby;
    if (!s)
        return;
    for (int k = 0; k < 16; k++) {
        uint8_t buf[8];
        int n = zmq_recv(s->sub, buf, sizeof buf, ZMQ_DONTWAIT);
        if (n < 0)
            break;
        if (n == 5 && !memcmp(buf, BS_MAGIC, 4) && buf[4] >= BS_PRIMARY && buf[4] <= BS_PASSIVE)
            apply(b, buf[4], now);   /* BS_PEER_x = BS_x */
    }
    if (now >= s->next_pub) {
        uint8_t msg[5] = {'T', 'P', 'B', 'S', (uint8_t)s->bs.state};
        zmq_send(s->pub, msg, sizeof msg, ZMQ_DONTWAIT);
        s->next_pub = now + s->bs.failover_ms / 4;
    }
}

bool standby_client_request(broker *b)
{
    return !b->standby || apply(b, BS_CLIENT_REQUEST, tp_now_ms());
}

bool standby_serving(const broker *b)
{
    const struct bstandby *s = b->standby;
    if (!s)
        return true;
    return s->bs.state == BS_ACTIVE || (s->bs.state == BS_PRIMARY && tp_now_ms() >= s->bs.peer_expiry);
}
