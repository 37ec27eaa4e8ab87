/* The real tokpiped for benchmarks: started on a config, a producer socket
 * and a subscriber on its endpoints, stopped with SIGTERM. */
#ifndef BENCH_SUPPORT_BDAEMON_H
#define BENCH_SUPPORT_BDAEMON_H

#include <sys/types.h>

#include "tokpipe/protocol.h"
#include "tokpipe/zwire.h"

typedef struct bench_daemon {
    pid_t pid;
    void *ctx, *dealer, *sub;
} bench_daemon;

/* Start bin/tokpiped on cfg (its log to $TP_DAEMON_LOG, else nowhere),
 * connect to front and events, wait until every stage has a worker. 0 or
 * -1. */
int bench_daemon_start(bench_daemon *d, const char *bin, const char *cfg, const char *front, const char *events);

/* Send m on the producer socket and decode the reply into *r (borrowing
 * from *z: clear and close both). 0 or -1 (5 s without a reply). */
int bench_daemon_call(bench_daemon *d, const tp_msg *m, tp_zmsg *z, tp_msg *r);

void bench_daemon_stop(bench_daemon *d);

/* Take only the events whose topic (job id) starts with prefix instead of
 * all of them, so events of jobs submitted another way (over HTTP) do not
 * queue up unread and get drained inside a later measurement. Takes effect
 * after a short while, like any subscription. */
void bench_daemon_subscribe(bench_daemon *d, const char *prefix);

/* Submit job `prefix-j` (the naming bench_daemon_events reads): prompt
 * ids[0..n), greedy, ignore_eos, max_tokens. 0, or -1 said on stderr. The
 * ACK is read by bench_daemon_events. */
int bench_daemon_submit(bench_daemon *d, const char *prefix, int j, const int32_t *ids, size_t n, int max_tokens);

/* Called for each TOKEN / FINISH event of job `prefix-j`, at time t
 * (bench_now). */
typedef void (*bench_event_fn)(void *ctx, int j, const tp_msg *ev, double t);

/* Read replies and events until n ACKs came and jobs prefix-0 ..
 * prefix-(n-1) have finished, calling fn for their events. 0, or -1 when
 * nothing arrives for timeout_ms. */
int bench_daemon_events(bench_daemon *d, const char *prefix, int n, int timeout_ms, bench_event_fn fn, void *ctx);

#endif
