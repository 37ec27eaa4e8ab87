/* The outbox: every message the floors under broker.c build, encoded at
 * once (what it borrows may change right after) and copied into frames of
 * its own, in the order built. broker.c sends them after each thing it
 * handles, so the floors below never call up into the loop, and what
 * reaches each peer is in the order it was built. The copy is the one
 * zmq_send would make: broker.c hands the frames over with zmq_msg_send. */
#include <stdlib.h>
#include <string.h>

#include "outbox.h"
#include "log.h"
#include "tokpipe/zwire.h"

static int push(broker *b, int sock, int wi, const tp_frame *prefix, size_t n_prefix, const tp_msg *m, tp_err *e)
{
    tp_wire w;
    int rc = tp_proto_encode(m, &w, e);
    if (rc)
        return rc;
    boutbox *o = &b->out;
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 64;
        bout_msg **q = realloc(o->q, cap * sizeof *q);
        if (!q) {
            tp_wire_free(&w);
            return tp_err_set(e, TP_ENOMEM, "outbox: out of memory");
        }
        o->q = q;
        o->cap = cap;
    }
    size_t n = n_prefix + w.n;
    bout_msg *x = malloc(sizeof *x + n * sizeof x->part[0]);
    if (!x) {
        tp_wire_free(&w);
        return tp_err_set(e, TP_ENOMEM, "outbox: out of memory");
    }
    x->sock = sock;
    x->wi = wi;
    x->worker_no = wi >= 0 ? b->workers[wi].worker_no : 0;
    x->family = (uint8_t)m->family;
    x->cmd = m->cmd;
    x->n = 0;
    for (size_t i = 0; i < n; i++) {
        const tp_frame *f = i < n_prefix ? &prefix[i] : &w.f[i - n_prefix];
        if (zmq_msg_init_size(&x->part[i], f->len)) {
            out_msg_free(x);
            tp_wire_free(&w);
            return tp_err_set(e, TP_ENOMEM, "outbox: out of memory for a %zu-byte frame", f->len);
        }
        x->n++;
        if (f->len)
            memcpy(zmq_msg_data(&x->part[i]), f->data, f->len);
    }
    tp_wire_free(&w);
    o->q[o->n++] = x;
    return 0;
}

void out_msg_free(bout_msg *x)
{
    for (size_t i = 0; i < x->n; i++)
        zmq_msg_close(&x->part[i]);
    free(x);
}

/* A message that cannot even be encoded means the worker cannot be served
 * as it should: it is lost at the next safe point, like one a send failed
 * to. */
/* The work m asks of a worker, and the slots of its jobs: what the worker
 * owes an answer to (state.h, bowed). Other commands (OPEN, CLOSE) are
 * quick bookkeeping: their RESULT is not waited for. */
static int owed_stage(const tp_msg *m, tp_raw *slots, uint32_t *one)
{
    switch (m->cmd) {
    case TP_CMD_TOKENIZE:
        *one = m->tokenize.slot;
        *slots = (tp_raw){one, 1};
        return TP_SI_TOKENIZE;
    case TP_CMD_STEP:
        *slots = m->step.slots;
        return TP_SI_FORWARD;
    case TP_CMD_SAMPLE:
        *slots = m->sample.slots;
        return TP_SI_SAMPLE;
    case TP_CMD_STOP_STEP:
        *slots = m->stop_step.slots;
        return TP_SI_STOP;
    default:
        return -1;
    }
}

/* Note that worker wi owes the answer to m. Out of memory: not noted, so
 * that task has no deadline (the heartbeat still watches the worker). */
static void owe(bworker *w, const tp_msg *m)
{
    tp_raw slots;
    uint32_t one;
    int si = owed_stage(m, &slots, &one);
    if (si < 0)
        return;
    if (w->n_owed == w->cap_owed) {
        size_t nc = w->cap_owed ? w->cap_owed * 2 : 8;
        bowed *o = realloc(w->owed, nc * sizeof *o);
        if (!o)
            return;
        w->owed = o;
        w->cap_owed = nc;
    }
    uint32_t *s = malloc((slots.n ? slots.n : 1) * sizeof *s);
    if (!s)
        return;
    for (size_t i = 0; i < slots.n; i++)
        s[i] = tp_raw_u32(slots, i);
    w->owed[w->n_owed++] = (bowed){m->task, tp_now_ms(), si, (uint32_t)slots.n, s};
}

int out_worker(broker *b, int wi, const tp_msg *m)
{
    bworker *w = &b->workers[wi];
    tp_frame id = {w->ident, w->ident_len};
    tp_err e;
    int rc = push(b, OUT_BACK, wi, &id, 1, m, &e);
    if (rc) {
        blog("to worker %s: %s", w->instance, e.msg);
        w->gone = true;
    } else {
        owe(w, m);
    }
    return rc;
}

void out_ident(broker *b, const tp_frame *ident, const tp_msg *m)
{
    tp_err e;
    push(b, OUT_BACK, -1, ident, 1, m, &e);
}

int out_event(broker *b, const tp_msg *m)
{
    tp_err e;
    int rc = push(b, OUT_EVENTS, -1, NULL, 0, m, &e);
    if (rc)
        blog("%s: %s", tp_cmd_name(m->family, m->cmd), e.msg);
    else
        b->stats.events_published++;
    return rc;
}

void out_reply(broker *b, const tp_frame *env, size_t n_env, const tp_msg *m)
{
    tp_err e;
    if (push(b, OUT_FRONT, -1, env, n_env, m, &e))
        blog("reply %s: %s", tp_cmd_name(TP_FAM_JOB, m->cmd), e.msg);
}

uint64_t out_task(broker *b)
{
    return ++b->next_task;
}

void out_free(broker *b)
{
    for (size_t i = 0; i < b->out.n; i++)
        out_msg_free(b->out.q[i]);
    free(b->out.q);
    memset(&b->out, 0, sizeof b->out);
}
