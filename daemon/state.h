/* tokpiped's state: the one broker every floor is handed, its registered
 * workers, spawned processes, counters and outgoing messages. The floors'
 * functions are in their own headers (broker.h, front.h, sched.h, admit.h,
 * step.h, recover.h, pin.h, choose.h, route.h, registry.h, info.h,
 * spawn.h, outbox.h, log.h), each included only by the floors above it. */
#ifndef TOKPIPED_STATE_H
#define TOKPIPED_STATE_H

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
#include "grammar_admit.h"
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

/* A task a worker owes the answer to (TOKENIZE, STEP, SAMPLE, STOP_STEP),
 * noted as it is queued (outbox.c). A worker answers its tasks in order,
 * so the oldest one owed is the one it is computing: the one a crash or a
 * hang happened in (recover.c), and the one its step deadline runs for. */
typedef struct bowed {
    uint64_t task;
    int64_t sent_ms;
    int si;                         /* TP_SI_* of the work */
    uint32_t n;                     /* the slots of its jobs (owned) */
    uint32_t *slots;
} bowed;

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
    int n_fwd, n_smp, n_stp, n_dft; /* jobs pinned per stage */
    int tok_inflight;
    int steps_inflight;
    bool tok_suspect;               /* a TOKENIZE of a job that lost workers before: takes no other */
    bool step_suspect;              /* a STEP of such a job alone: no other step meanwhile */
    int malformed;
    bool gone;                      /* lost at the next safe point (recover_reap): a send failed, ... */
    const char *gone_why;           /* ... or this (static text; NULL = the connection closed) */
    uint64_t cache[TP_CACHE_COUNT]; /* forward: its prefix cache, from its last STEP_RESULT (0s: none) */
    bowed *owed;                    /* tasks owed, oldest first (registry_drop frees) */
    size_t n_owed, cap_owed;
    int64_t last_answer_ms;         /* its last answer to an owed task */
    bool hung;                      /* gone because it stopped answering in the middle of a task */
} bworker;

/* Counters for STATS (the job table keeps those of finished jobs). */
typedef struct bstats {
    uint64_t jobs_submitted, jobs_rejected, events_published;
    uint64_t malformed_front, malformed_back, malformed_events;
    uint64_t forward_steps, forward_rows, forward_tokens;
    /* speculative decoding: guesses verified and taken, verify steps and the
     * candidates they gave (tokens per verify step) */
    uint64_t spec_drafted, spec_accepted, spec_verify_steps, spec_verify_tokens;
    uint64_t workers_lost, events_duplicate, events_refused;
    uint64_t recovered[4];          /* jobs moved to another worker, per stage (TP_SI_*) */
    uint64_t jobs_poisoned;         /* jobs ended because they lost B_POISON_TRIES workers (recover.c) */
    uint64_t workers_hung;          /* workers lost past their step deadline or silent while owing an answer */
    uint64_t replies_refused;       /* answers and heartbeats from a worker no longer registered (declared lost) */
    double answer_ms[TP_SI_COUNT];  /* moving average of a task's answer time per stage (step deadline) */
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
    int32_t *tokens, *acc, *cands, *guess;
    float *logits;
    size_t cap, tok_cap, logit_cap;
    int32_t *ids;                   /* a job's prompt + candidates, for prompt lookup */
    size_t ids_cap;
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
    grammar_memo gmemo;             /* grammars admission compiled (grammar_admit.h) */
    bcols cols;                     /* scratch of step.c */
    boutbox out;

    bchild *children;
    int n_children;
    bool spawn;
    struct binfo *info;             /* INFO: the model's optional READY keys (info.c) */
    unsigned stages_failed;         /* TP_STAGE_* of spawned workers given up on */
    int64_t refused_log_ms;         /* last log line about a refused event */
    struct bstandby *standby;       /* standby.c: the Binary Star pair; NULL = alone */

    /* The model the config names, as read by the broker at start: every
     * worker's READY must match it (model_id[0] == 0: the file is not
     * readable here, so the first worker's model is the reference). */
    char model_id[TP_PROTO_MAX_MODEL_ID + 1];
    uint32_t model_vocab, model_seq_len;
    bool model_hybrid;              /* full_attn_interval > 0 (qwen35): nobody guesses (guess.c) */
    char draft_model_id[TP_PROTO_MAX_MODEL_ID + 1];   /* speculative.draft_model's, "" = not read here */
} broker;

#define B_POISON_TRIES 2          /* workers a job may lose while they process it */

#endif
