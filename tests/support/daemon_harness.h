/* Integration-test harness: start the real tokpiped (which spawns the real
 * workers) on a private runtime directory over ipc or tcp loopback, talk to
 * it as a producer and subscriber, run bin/tokpipe commands, stop it. */
#ifndef TESTS_DAEMON_HARNESS_H
#define TESTS_DAEMON_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "tokpipe/protocol.h"
#include "tokpipe/zsec.h"
#include "tokpipe/zwire.h"

typedef struct harness {
    char dir[128];           /* temp dir: config + runtime dir */
    char config[192];
    char front[160], back[160], events[160], publish[160];
    char models[512];        /* TP_MODELS */
    char bin[512];           /* TP_BIN_DIR */
    pid_t pid;
    void *zctx;
    void *dealer;            /* producer socket to front */
    tp_zsec_client sec;      /* the config's CURVE client keys (security.curve) */
} harness;

/* Start tokpiped with the stories260K model. tcp: loopback ports instead
 * of ipc. extra_yaml is appended to the generated config (may be NULL; a
 * "heartbeat:" or "model:" section in it replaces the harness's default); with
 * security.curve in it, the harness's own sockets use the config's client
 * keys, as the real clients do.
 * Waits (up to 30 s) until every stage has a registered worker. 0 or -1 (message on
 * stderr). */
int harness_start(harness *h, bool tcp, const char *extra_yaml);

/* The same with options: no_spawn runs `tokpiped --no-spawn` (start
 * workers with harness_worker; then it does not wait for them), notify
 * sets NOTIFY_SOCKET for the daemon (NULL = unset). */
int harness_start_ex(harness *h, bool tcp, const char *extra_yaml, bool no_spawn, const char *notify);

/* Only the setup of harness_start_ex: temp dir, config, producer socket;
 * no daemon yet (start it with harness_spawn_daemon). 0 or -1. */
int harness_prepare(harness *h, bool tcp, const char *extra_yaml);

/* (Re)start only the daemon of an already set-up harness (same config). */
int harness_spawn_daemon(harness *h, bool no_spawn, const char *notify);

/* Start a tokpipe-worker serving stages with the harness config; its pid. */
pid_t harness_worker(harness *h, const char *stages);

/* Wait until every stage has a registered worker; 0 or -1. */
int harness_wait_workers(harness *h, int timeout_ms);

/* Wait until STATS counts exactly n live workers of stage (TP_SI_*); 0 or
 * -1 on timeout. */
int harness_wait_stage(harness *h, int stage, uint64_t n, int timeout_ms);

/* How many tokpipe-worker processes run with this harness's config (the
 * daemon's spawned workers and harness_worker ones); -1 if /proc is
 * unreadable. Zombies do not count (their cmdline is empty). */
int harness_live_workers(const harness *h);

/* SIGTERM the daemon and wait (up to 15 s); returns its exit status, or -1
 * if it had to be killed. Removes the temp dir. */
int harness_stop(harness *h);

/* Send one JOB1 request given as raw frames and receive the reply frames.
 * 0, or -1 on timeout (timeout_ms). */
int harness_raw_call(harness *h, const tp_frame *frames, size_t n, tp_zmsg *reply, int timeout_ms);

/* Encode and send m, receive and decode the reply into *out (which borrows
 * from *z: close both when done). 0 or -1. */
int harness_call(harness *h, const tp_msg *m, tp_zmsg *z, tp_msg *out);

/* A SUB socket on the events endpoint subscribed to prefix, connected,
 * returned once the subscription is in force (the broker answered it with
 * a HEARTBEAT; a later beat may still arrive, so readers skip them). Call
 * it before submitting the jobs it is to watch. Caller closes it. */
void *harness_subscribe(harness *h, const char *prefix);

/* Run a shell command line, capture stdout (malloc'd, caller frees) and
 * return the exit status (-1 if it could not run). */
int harness_sh(const char *cmdline, char **out);

/* pids of the daemon's worker processes (up to cap). */
int harness_children(harness *h, pid_t *pids, int cap);

/* The daemon's worker process whose command line names stage (e.g.
 * "forward"), or -1. */
pid_t harness_child_serving(harness *h, const char *stage);

/* All of them (up to cap) into out; how many. */
int harness_children_serving(harness *h, const char *stage, pid_t *out, int cap);

/* Read STATS into *s via a fresh request; 0 or -1. Borrowed strings are
 * not kept (counters only). */
int harness_stats(harness *h, tp_m_stats_reply *s);

/* Sleep ms milliseconds (a signal may cut it short: callers poll). */
void harness_sleep_ms(int ms);

#endif
