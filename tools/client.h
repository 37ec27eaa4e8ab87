/* The producer/subscriber side of the wire protocol (PROTOCOL.md), for the
 * bin/tokpipe client commands: a DEALER to the broker's frontend and a SUB
 * to its event endpoint, every wait bounded by a timeout.
 *
 * Not thread-safe: one tp_client per thread. */
#ifndef TOKPIPE_TOOLS_CLIENT_H
#define TOKPIPE_TOOLS_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokpipe/error.h"
#include "tokpipe/protocol.h"
#include "tokpipe/zsec.h"

typedef struct tp_client tp_client;

/* A received message: the decoded tp_msg plus the frames it borrows from
 * (copied to heap blocks, so payload arrays are aligned). Free with
 * tp_recv_free. */
typedef struct tp_recv {
    tp_msg m;
    size_t n;
    tp_frame f[TP_PROTO_MAX_FRAMES + 4];
} tp_recv;

void tp_recv_free(tp_recv *r);

/* Endpoints of a client: front (required for requests) and events
 * (required for subscriptions); either may be NULL when unused. */
typedef struct tp_client_opts {
    const char *front;
    const char *events;
    int timeout_ms;     /* every request / connection wait; <= 0 = 5000 */
    const tp_zsec_client *sec;  /* CURVE keys for tcp endpoints; NULL = plain */
    /* the other broker of a standby pair (NULL or "": none): the client
     * connects to both; a request goes to one with a live connection, and
     * one a passive broker refuses goes again, to the other */
    const char *peer_front;
    const char *peer_events;
} tp_client_opts;

/* A passive standby broker's refusal (TP_STANDBY_PASSIVE_ERROR): send the
 * request again, it goes to the other broker. tp_client_call does. */
bool tp_client_passive_refusal(const tp_msg *r);

/* Create the sockets and connect (connection happens in the background;
 * ZeroMQ retries). *out owned by the caller (tp_client_free). */
int tp_client_new(const tp_client_opts *o, tp_client **out, tp_err *err);

void tp_client_free(tp_client *c);

/* Send a JOB1 request; m->req is set to a fresh number if 0 (and written
 * back through *req_out when non-NULL). */
int tp_client_send(tp_client *c, tp_msg *m, uint64_t *req_out, tp_err *err);

/* Wait up to the timeout for the next reply on the frontend. Replies that
 * do not decode are an error naming them. On timeout: TP_EIO with a message
 * naming the endpoint ("no reply from ipc://... within 5000 ms: is tokpiped
 * running?"). */
int tp_client_recv_reply(tp_client *c, tp_recv *reply, tp_err *err);

/* send + recv_reply, skipping replies to other requests. */
int tp_client_call(tp_client *c, tp_msg *m, tp_recv *reply, tp_err *err);

/* Subscribe to events whose topic starts with prefix ("" = all). */
int tp_client_subscribe(tp_client *c, const char *prefix, tp_err *err);

/* Subscribe to the broker's HEARTBEAT topic. Call it after the job
 * subscriptions: the broker answers it with a heartbeat at once, and
 * subscriptions reach it in order, so that heartbeat proves the earlier
 * ones are in force (tp_client_wait_events_ready waits for it). */
int tp_client_subscribe_heartbeat(tp_client *c, tp_err *err);

/* Wait until the SUB socket is connected to the event endpoint and, when
 * the heartbeat topic is subscribed, until the broker's first heartbeat
 * (so that a job submitted afterwards is seen from its first event; events
 * before that heartbeat are dropped), or fail after the timeout naming the
 * endpoint. */
int tp_client_wait_events_ready(tp_client *c, tp_err *err);

/* What tp_client_next_event returns (or a negative error). */
enum {
    TP_NEXT_EVENT = 0,      /* *ev holds a TOKEN or FINISH */
    TP_NEXT_TIMEOUT = 1,    /* timeout_ms passed without one */
    TP_NEXT_SILENT = 2,     /* no heartbeat for interval_ms * liveness: said once per silence */
    TP_NEXT_ALIVE = 3,      /* a heartbeat again after SILENT, from the same broker */
    TP_NEXT_RESTARTED = 4,  /* a heartbeat with a new incarnation: a new broker, the old one's jobs are gone */
};

/* Next TOKEN/FINISH event within timeout_ms (< 0: forever), or news of the
 * broker's liveness from its heartbeats (tp_client_liveness has the
 * details; silence is only judged once a first heartbeat came). Events that
 * do not decode are counted (tp_client_bad_events) and skipped. */
int tp_client_next_event(tp_client *c, int timeout_ms, tp_recv *ev, tp_err *err);

/* The broker as its heartbeats describe it. */
typedef struct tp_client_live {
    uint64_t incarnation;       /* 0 until the first heartbeat */
    uint64_t prev_incarnation;  /* after TP_NEXT_RESTARTED: the broker before */
    uint64_t uptime_ms;
    uint32_t interval_ms, liveness;
    int64_t last_beat_ms;       /* CLOCK_MONOTONIC ms of the last heartbeat */
    int64_t silent_ms;          /* after SILENT / ALIVE / RESTARTED: time without one */
} tp_client_live;

const tp_client_live *tp_client_liveness(const tp_client *c);

uint64_t tp_client_bad_events(const tp_client *c);

/* Also watch fd (e.g. a signalfd for SIGINT): every wait returns TP_ESTATE
 * "interrupted" as soon as it is readable. -1 = none. */
void tp_client_set_interrupt_fd(tp_client *c, int fd);

/* Endpoint strings as given (for messages). */
const char *tp_client_front(const tp_client *c);
const char *tp_client_events(const tp_client *c);

/* Client-side endpoint selection shared by the commands: --config FILE
 * (default config/tokpipe.yaml if it exists, else built-in defaults), then
 * --front / --events overrides. The strings are copied into *ep. */
typedef struct tp_endpoints {
    char front[512];
    char events[512];
    char peer_front[512];   /* standby.peer_front / peer_events ("" = none; not with --front / --events) */
    char peer_events[512];
    tp_zsec_client sec;   /* the config's security.* client side */
} tp_endpoints;

int tp_endpoints_resolve(const char *config_path, const char *front, const char *events, tp_endpoints *ep,
                         tp_err *err);

/* Options every client command takes: --config FILE, --front EP,
 * --events EP, --timeout MS. */
typedef struct tp_client_args {
    const char *config;
    const char *front;
    const char *events;
    int timeout_ms;
} tp_client_args;

#define TP_CLIENT_ARGS_HELP                                                                    \
    "connection options:\n"                                                                   \
    "  --config FILE   read endpoints from FILE (default config/tokpipe.yaml if present,\n"      \
    "                  else the built-in defaults: ipc under /tmp/tokpipe-$UID)\n"               \
    "  --front EP      producer endpoint, overrides the config (e.g. tcp://127.0.0.1:5555)\n"   \
    "  --events EP     event endpoint, overrides the config\n"                                  \
    "  --timeout MS    how long to wait for the daemon (default 5000)\n"

/* If argv[*i] is one of the options above, consume it (and its value) and
 * return 1; 0 if not ours; TP_EINVAL naming the flag on a bad value. */
int tp_client_parse_arg(tp_client_args *a, int argc, char **argv, int *i, tp_err *err);

/* Resolve the endpoints and open a client with the sockets asked for. */
int tp_client_open(const tp_client_args *a, bool front, bool events, tp_client **out, tp_err *err);

/* A command that sends one request and prints the reply (info, stats,
 * status, cancel). It takes the connection options, --help/-h, and what it
 * declares here; the flag's name stays in the command's source, next to
 * its --help text. */
typedef struct tp_client_cmd {
    const char *name;       /* "info": messages start "tokpipe info: " */
    const char *usage;      /* the --help text, shown again after a usage error */
    const char *json_flag;  /* the flag that asks for JSON ("--json"); NULL = none */
    bool takes_job;         /* one JOB operand, required, a valid job id */
    /* parsed */
    tp_client_args a;
    bool json;
    const char *job;
    /* the exchange */
    tp_msg request;
    tp_recv reply;
    tp_err err;
} tp_client_cmd;

/* Parse argv into *c. Returns -1 when the command goes on, else its exit
 * code: 0 after --help, 2 after a usage error (said on stderr). */
int tp_client_cmd_parse(tp_client_cmd *c, int argc, char **argv);

/* Send request cmd (about c->job, if the command takes one) on a client
 * opened for it and closed again, the answer in c->reply. want != 0:
 * anything but a want reply with status 200 is TP_EIO "<REQUEST> answered
 * <status> <error>". Errors in c->err. */
int tp_client_cmd_call(tp_client_cmd *c, uint8_t cmd, uint8_t want);

/* The end of a command: says a failure (rc != 0) on stderr, frees the
 * reply and returns the exit code (0 or 1). */
int tp_client_cmd_done(tp_client_cmd *c, int rc);

/* A fresh job id "g-<pid>-<random>-<i>" (fits TP_PROTO_MAX_JOB_ID). */
void tp_client_job_id(char *out, size_t cap, unsigned i);

#endif
