/* Multipart send/receive of protocol messages over libzmq. */
#include "tokpipe/zwire.h"

#include <errno.h>
#include <string.h>
#include <time.h>

int tp_zmsg_recv(void *sock, tp_zmsg *m, int flags)
{
    m->n = 0;
    m->dropped = 0;
    for (;;) {
        zmq_msg_t tmp, *p = m->n < TP_ZMSG_MAX ? &m->part[m->n] : &tmp;
        zmq_msg_init(p);
        if (zmq_msg_recv(p, sock, m->n || m->dropped ? 0 : flags) < 0) {
            int e = errno;
            zmq_msg_close(p);
            /* a failure mid-message cannot happen in libzmq (all parts
             * arrive atomically); only the first recv may fail */
            tp_zmsg_close(m);
            errno = e;
            return -1;
        }
        int more = zmq_msg_more(p);
        if (p == &tmp) {
            zmq_msg_close(p);
            m->dropped++;
        } else {
            m->f[m->n].data = zmq_msg_data(p);
            m->f[m->n].len = zmq_msg_size(p);
            m->n++;
        }
        if (!more)
            return 0;
    }
}

void tp_zmsg_close(tp_zmsg *m)
{
    for (size_t i = 0; i < m->n; i++)
        zmq_msg_close(&m->part[i]);
    m->n = 0;
}

int tp_zsend(void *sock, const tp_frame *prefix, size_t n_prefix, const tp_wire *w, int flags)
{
    size_t total = n_prefix + w->n;
    for (size_t i = 0; i < total; i++) {
        const tp_frame *f = i < n_prefix ? &prefix[i] : &w->f[i - n_prefix];
        int fl = flags | (i + 1 < total ? ZMQ_SNDMORE : 0);
        if (zmq_send(sock, f->len ? f->data : "", f->len, fl) < 0)
            return -1;
    }
    return 0;
}

int tp_zsend_msg(void *sock, const tp_frame *prefix, size_t n_prefix, const tp_msg *m, tp_err *err)
{
    tp_wire w;
    int rc = tp_proto_encode(m, &w, err);
    if (rc)
        return rc;
    if (tp_zsend(sock, prefix, n_prefix, &w, ZMQ_DONTWAIT) < 0) {
        int e = errno;
        tp_wire_free(&w);
        return tp_err_set(err, TP_EIO, "send %s: %s", tp_cmd_name(m->family, m->cmd), zmq_strerror(e));
    }
    tp_wire_free(&w);
    return 0;
}

int64_t tp_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

uint64_t tp_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

uint64_t tp_wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}
