/* ZeroMQ multipart send/receive of tokpipe messages: the glue between
 * tp_wire / tp_frame (protocol.h, no sockets) and libzmq sockets. Used by
 * the broker, the worker runtime, the clients, tests and benchmarks. */
#ifndef TOKPIPE_ZWIRE_H
#define TOKPIPE_ZWIRE_H

#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "tokpipe/error.h"
#include "tokpipe/protocol.h"

/* A received multipart message: up to TP_ZMSG_MAX frames, owned. */
#define TP_ZMSG_MAX (TP_PROTO_MAX_FRAMES + 6)

typedef struct tp_zmsg {
    size_t n;              /* frames received (<= TP_ZMSG_MAX) */
    size_t dropped;        /* frames past TP_ZMSG_MAX (read and discarded) */
    zmq_msg_t part[TP_ZMSG_MAX];
    tp_frame f[TP_ZMSG_MAX];   /* views of part[] */
} tp_zmsg;

/* Receive one whole multipart message (flags: 0 or ZMQ_DONTWAIT). Always
 * reads every frame of the message, so a too-long message cannot leave the
 * socket mid-message. Returns 0, or -1 with errno (EAGAIN, EINTR, ...);
 * on success free with tp_zmsg_close. */
int tp_zmsg_recv(void *sock, tp_zmsg *m, int flags);

void tp_zmsg_close(tp_zmsg *m);

/* Send n_prefix raw frames (ROUTER identity, topic, ...) followed by the
 * frames of w, as one multipart message. flags: 0 or ZMQ_DONTWAIT. Returns
 * 0 or -1 with errno. */
int tp_zsend(void *sock, const tp_frame *prefix, size_t n_prefix, const tp_wire *w, int flags);

/* Encode m and send it after the prefix frames. Returns 0, a negative
 * TP_E* from encoding (err filled), or TP_EIO when zmq refused (err names
 * errno). */
int tp_zsend_msg(void *sock, const tp_frame *prefix, size_t n_prefix, const tp_msg *m, tp_err *err);

/* Monotonic and wall clocks. */
int64_t tp_now_ms(void);
uint64_t tp_now_us(void);        /* CLOCK_MONOTONIC */
uint64_t tp_wall_us(void);       /* CLOCK_REALTIME */

#endif
