/* tokpiped internals: the state the daemon/ sources share, and each
 * floor's functions. Every file calls only the floors under it (checked by
 * tests/layers_test.py), top to bottom:
 *
 *   broker.c    the sockets and the one poll loop; the only file that sends:
 *               it drains the outbox the floors below fill
 *   front.c     producer requests (SUBMIT, CANCEL, STATUS, STATS, INFO)
 *   sched.c     one scheduling pass (recover, admit, steps) and the
 *               dispatch of stage results
 *   admit.c     admission and queues: tokenize dispatch, first pinning
 *   step.c      the step cycle: building STEPs, consuming results
 *   recover.c   lost workers: moving and replaying jobs, poison jobs
 *   pin.c       pinning a job to workers and letting go; how a job ends
 *   choose.c    worker choice
 *   registry.c, info.c, spawn.c, metrics.c   workers, model facts,
 *               worker processes, latency histograms
 *   outbox.c, log.c, jobs.c (+ joblp.c)      messages waiting to be sent,
 *               the log, the job table (jobs.h: pure data)
 *
 * One thread, one poll loop. Events from stop workers arrive on the XSUB
 * socket, are recorded into the job table (for STATUS) and forwarded
 * verbatim to subscribers on the XPUB socket. */
#ifndef TOKPIPED_BROKER_H
#define TOKPIPED_BROKER_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "tokpipe/config.h"
#include "tokpipe/grammar.h"
#include "tokpipe/error.h"
#include "tokpipe/protocol.h"
#include "tokpipe/toolcall.h"
#include "tokpipe/zsec.h"
#include <zmq.h>
#include "jobs.h"
#include "metrics.h"

#define B_MAX_WORKERS 256
#define B_IDENT_MAX 255
#define B_CLOSING_GRACE_MS 3000
/* Every message a subscriber sends is a subscription (a topic: a job id or
 * "@heartbeat", 64 bytes at most, plus up to 10 of framing) or a handshake
 * command (CURVE's INITIATE with its metadata is the largest, a few hundred
 * bytes), so anything longer is an attack on the broker's memory: ZeroMQ
 * drops that connection before reading the message. */
#define B_MAX_SUBSCRIPTION 1024
#define B_TRIM_IDLE_MS 10000
#define B_MAX_FATAL_STARTS 3          /* a spawned worker exiting TP_EXIT_BAD_* this often in a row is given up */
#define B_MAX_CAPACITY 65536          /* largest READY capacity believed */
#define B_MAX_BATCH_TOKENS (1 << 20)  /* largest READY max_batch_tokens believed */          /* idle this long: give freed memory back to the system */
#define B_BEAT_MIN_GAP_MS 10          /* extra heartbeats for new subscribers: at most one per this */
#define B_RING 4                  /* candidates of one job awaiting stop verdicts (decode-ahead bound) */
#define B_PROBE_MS 1000           /* after a backend disconnect: probe the workers this long */

/* ---- workers ---------------------------------------------------------------- */

typedef struct bworker {
    bool live;
    uint8_t ident[B_IDENT_MAX];
    size_t ident_len;
    unsigned stages;                /* TP_STAGE_* bits */
    char instance[TP_PROTO_MAX_NAME + 1];
    char model_id[TP_PROTO_MAX_MODEL_ID + 1];
    uint64_t incarnation;
    uint32_t capacity, vocab, seq_len, max_batch_tokens;
    int32_t bos, eos;
    uint32_t worker_no;
    int64_t last_recv, last_send;
    int n_fwd, n_smp, n_stp;        /* jobs pinned per stage */
    int tok_inflight;
    int steps_inflight;
    bool tok_suspect;               /* a TOKENIZE of a job that lost workers before: takes no other */
    bool step_suspect;              /* a STEP of such a job alone: no other step meanwhile */
    int malformed;
    bool gone;                      /* lost at the next safe point (recover_reap): a send failed, ... */
    const char *gone_why;           /* ... or this (static text; NULL = the connection closed) */
    uint64_t cache[TP_CACHE_COUNT]; /* forward: its prefix cache, from its last STEP_RESULT (0s: none) */
} bworker;

/* Counters for STATS (the job table keeps those of finished jobs). */
typedef struct bstats {
    uint64_t jobs_submitted, jobs_rejected, events_published;
    uint64_t malformed_front, malformed_back, malformed_events;
    uint64_t forward_steps, forward_rows, forward_tokens;
    uint64_t workers_lost, events_duplicate, events_refused;
    uint64_t worker_msgs_refused;   /* back messages from an identity not registered (registry.c) */
    uint64_t recovered[4];          /* jobs moved to another worker, per stage (TP_SI_*) */
    uint64_t jobs_poisoned;         /* jobs ended because they lost B_POISON_TRIES workers (recover.c) */
} bstats;

/* ---- spawned worker processes ------------------------------------------------- */

typedef struct bchild {
    unsigned stages;                /* 0: the HTTP gateway (tokpipe-http) */
    int index;                      /* instance number within its group */
    pid_t pid;                      /* 0 = not running */
    int backoff_ms;
    int64_t respawn_at, started_at;
    int fatal_starts;               /* exits in a row that no respawn can fix */
    bool failed;                    /* given up on: never started again */
} bchild;

/* Column buffers for building stage messages (reused, grown on demand). */
typedef struct bcols {
    uint32_t *slots, *pos, *ntok, *index;
    uint8_t *flags;
    int32_t *tokens, *acc, *cands;
    float *logits;
    size_t cap, tok_cap, logit_cap;
} bcols;

/* Messages the floors under broker.c have built, in the order they were
 * built, each encoded and copied into its own frames: broker.c sends them
 * (outbox.c). */
enum { OUT_FRONT, OUT_BACK, OUT_EVENTS };

typedef struct bout_msg {
    int sock;                       /* OUT_* */
    int wi;                         /* OUT_BACK: the registered worker, else -1 */
    uint32_t worker_no;             /* ... and its registration (a slot may be reused) */
    uint8_t family, cmd;            /* for the log */
    size_t n;
    zmq_msg_t part[];
} bout_msg;

typedef struct boutbox {
    bout_msg **q;
    size_t n, cap;
} boutbox;

typedef struct broker {
    tp_config *cfg;
    const char *config_path;        /* passed to spawned workers; NULL = none */
    const char *self_path;          /* argv[0] of tokpiped, to find tokpipe-worker */
    void *zctx, *front, *back, *xsub, *xpub;
    void *back_mon;                 /* PAIR: the backend's disconnect events */
    int64_t probe_until;            /* probe every worker's connection until then */
    tp_zsec_server *zsec;           /* CURVE + ZAP; NULL = security off */
    uint64_t incarnation;           /* random per start: in WELCOME and event HEARTBEATs */
    int64_t t_start_ms;
    int64_t last_beat_ms;           /* last HEARTBEAT on the events socket */
    bool beat_asked;                /* a new subscription waits for one */
    volatile sig_atomic_t *quit;    /* set by signals: start draining */
    bool draining;
    int64_t drain_deadline;
    bool cancelled_all;
    bool done;

    bworker workers[B_MAX_WORKERS];
    struct route_mirror *route[B_MAX_WORKERS]; /* route_prefix.c: what each forward worker caches */
    uint32_t next_worker_no;

    bjobs jt;                       /* the job table (jobs.c) */
    int64_t last_busy_ms;           /* last loop tick with an active job */
    bool trimmed;                   /* malloc_trim done since then */
    uint64_t next_task, next_step, next_auto_id;

    bstats stats;
    bcols cols;                     /* scratch of step.c */
    boutbox out;

    bchild *children;
    int n_children;
    bool spawn;
    struct binfo *info;             /* INFO: the model's optional READY keys (info.c) */
    unsigned stages_failed;         /* TP_STAGE_* of spawned workers given up on */
    int64_t refused_log_ms;         /* last log line about a refused event */

    /* The model the config names, as read by the broker at start: every
     * worker's READY must match it (model_id[0] == 0: the file is not
     * readable here, so the first worker's model is the reference). */
    char model_id[TP_PROTO_MAX_MODEL_ID + 1];
    uint32_t model_vocab, model_seq_len;
} broker;

#define B_POISON_TRIES 2          /* workers a job may lose while they process it */

/* ---- broker.c: the top floor ------------------------------------------------- */
int broker_init(broker *b, tp_config *cfg, tp_err *err);
int broker_run(broker *b);
void broker_free(broker *b);

/* ---- front.c ------------------------------------------------------------------- */
void front_on_message(broker *b, const tp_frame *frames, size_t n, bool too_many);

/* ---- sched.c: one pass of the schedule ------------------------------------------- */
void sched_run(broker *b);
void sched_on_result(broker *b, int wi, const tp_msg *m);

/* ---- admit.c: admission and queues ---------------------------------------------- */
void admit_start(broker *b, bjob *j);
void admit_waiting(broker *b);
void admit_on_tokenized(broker *b, int wi, const tp_msg *m);

/* ---- step.c: the step cycle ------------------------------------------------------ */
void step_run(broker *b);
void step_on_result(broker *b, int wi, const tp_msg *m);
void step_free(broker *b);

/* ---- recover.c: lost workers, replay, poison jobs --------------------------------- */
void recover_run(broker *b, int64_t now);
/* died: the worker's process ended (its connection closed, or it said
 * DISCONNECT), which is what a job that crashes workers does; a hung or
 * re-registered worker's loss counts against no job (recover.c). */
void recover_worker_lost(broker *b, int wi, const char *cause, bool died);
void recover_lose(broker *b, int wi, const char *why, bool died);
void recover_reap(broker *b);
void recover_lost_finish(broker *b, int64_t now);

/* ---- pin.c: a job's workers, and how a job ends --------------------------------- */
void pin_forward(broker *b, bjob *j, int f);
void pin_sample(broker *b, bjob *j, int s);
void pin_stop(broker *b, bjob *j, int t);
void pin_release(broker *b, bjob *j, int finish, const char *error);
uint64_t pin_slot_cmd(broker *b, int wi, uint8_t cmd, uint32_t slot);
bool pin_can_decode_ahead(const broker *b, const bjob *j);
void pin_fail(broker *b, bjob *j, const char *why);
void pin_cancel(broker *b, bjob *j);
void pin_publish_finish(broker *b, bjob *j, int reason, const char *error);

/* ---- choose.c: worker choice (-1: none has room) --------------------------------- */
int choose_tokenize(broker *b, bool alone);
int choose_forward(broker *b);
bool choose_forward_can_take(broker *b, int i);   /* a forward worker with room for a new job */
int choose_sample(broker *b, int f);
int choose_stop(broker *b);

/* ---- route_prefix.c: the forward worker most likely to hold j's prompt start
 * (its prefix cache), unless clearly busier; route_note: worker wi now holds
 * the full pages of ids + more; route_free at exit --------------------------- */
int route_forward(broker *b, const bjob *j);
void route_note(broker *b, int wi, const int32_t *ids, uint32_t n, const int32_t *more, uint32_t n_more);
void route_free(broker *b);

/* ---- registry.c, info.c, spawn.c, metrics.c (metrics.h) -------------------------- */
enum { REG_DONE, REG_RESULT, REG_LOST, REG_READY };

/* A worker's message: REG_RESULT (a stage result in *m from worker *wi),
 * REG_LOST (worker *wi said DISCONNECT: its state is gone), REG_READY (a
 * READY in *m; *wi: the old registration of the same connection, whose
 * state is gone, or -1) or REG_DONE. *m needs tp_msg_clear either way. */
int registry_on_message(broker *b, const tp_frame *ident, const tp_frame *frames, size_t n, tp_msg *m, int *wi);

/* Register the worker of a READY (or refuse it); true when registered. */
bool registry_on_ready(broker *b, const tp_frame *ident, const tp_m_ready *r);
void registry_tick(broker *b, int64_t now);
void registry_lose(broker *b, int wi, const char *why);
void registry_drop(broker *b, int wi);
void registry_tok_done(broker *b, int wi);
int registry_find(broker *b, const void *ident, size_t len);
bool registry_usable(const broker *b, int wi);
int registry_count(const broker *b, unsigned stage_bit);
const bworker *registry_model(const broker *b);

void info_on_ready(broker *b, const tp_m_ready *r);
void info_reply(broker *b, uint64_t req, tp_msg *r);
/* The tool-call syntax of the model's chat template, as a tokenize worker's
 * READY said (TP_TC_NONE while none did). */
tp_tc_family info_tool_family(const broker *b);
/* The template's generation prompt opens the thinking (READY think_open). */
bool info_think_open(const broker *b);
/* The model's vocabulary as grammar token references see it: its size and
 * the special tokens INFO lists, by text (for admission). */
void info_gnames(const broker *b, tp_gnames *out);
void info_free(broker *b);

int spawn_init(broker *b, tp_err *err);
void spawn_tick(broker *b, int64_t now);
void spawn_stop_all(broker *b, int timeout_ms);
void spawn_free(broker *b);

/* ---- outbox.c, log.c: the ground floor ------------------------------------------- */
int out_worker(broker *b, int wi, const tp_msg *m);
void out_ident(broker *b, const tp_frame *ident, const tp_msg *m);
int out_event(broker *b, const tp_msg *m);
void out_reply(broker *b, const tp_frame *env, size_t n_env, const tp_msg *m);
uint64_t out_task(broker *b);
void out_msg_free(bout_msg *o);
void out_free(broker *b);

void blog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
