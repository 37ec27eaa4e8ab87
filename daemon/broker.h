/* tokpiped internals: the broker's state shared by the daemon/ sources.
 *
 * One thread, one poll loop (broker.c). The broker owns the job table
 * (jobs.c), the worker registry (registry.c), the schedule (sched.c), the
 * producer-facing requests (front.c) and the supervisor of spawned worker
 * processes (spawn.c). Events from stop workers arrive on the XSUB socket,
 * are recorded into the job table (for STATUS) and forwarded verbatim to
 * subscribers on the XPUB socket. */
#ifndef TOKPIPED_BROKER_H
#define TOKPIPED_BROKER_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "tokpipe/config.h"
#include "tokpipe/error.h"
#include "tokpipe/protocol.h"
#include "tokpipe/zsec.h"
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
    int malformed;
    bool gone;                      /* a send failed: lost at the next safe point (registry_reap) */
    uint64_t cache[TP_CACHE_COUNT]; /* forward: its prefix cache, from its last STEP_RESULT (0s: none) */
} bworker;

/* ---- jobs --------------------------------------------------------------------- */

enum { J_FREE = 0, J_TOKENIZE, J_ADMIT, J_RUNNING, J_CLOSING, J_FINISHED };
enum { P_READY = 0, P_FORWARD, P_SAMPLE, P_STOP };

typedef struct bjob {
    int state;
    char id[TP_PROTO_MAX_JOB_ID + 1];
    uint32_t slot;                  /* = index in the table */
    uint64_t seqno;                 /* admission order (FCFS) */
    /* request: params with owned copies of the stop strings / ids */
    tp_params params;
    char *stop_buf;
    char *prompt_text;
    size_t prompt_len;
    bool parse_special;     /* SUBMIT's parse_special, for the TOKENIZE request */
    tp_chat_msg *messages;  /* SUBMIT's conversation (strings in prompt_text), for TOKENIZE */
    size_t n_messages;
    int32_t *prompt;
    uint32_t n_prompt;
    /* running */
    int fwd, smp, stp;              /* worker indexes, -1 none */
    int tok_worker;
    uint64_t tok_task;
    uint32_t n_fed;                 /* positions in the KV cache */
    uint32_t cached;                /* prompt positions its forward worker took from its prefix cache */
    int32_t pending;                /* accepted token to feed next, -1 none */
    int32_t acc_for_sampler;        /* accepted since the sampler last saw the slot */
    int phase;
    uint64_t step;
    uint32_t n_cand;                /* candidates produced (= accepted, unless the last finishes) */
    int32_t *cands;                 /* every candidate in order: out[] is their accepted prefix, and
                                     * prompt + cands is what the KV cache holds (or will) */
    uint32_t cap_cands;
    uint32_t n_verd;                /* candidates with a verdict; cands[n_verd..n_cand) await theirs */
    uint32_t n_tok_ids;             /* ids carried by the TOKEN events forwarded to subscribers */
    int64_t lost_ms;                /* when the job lost a worker it still misses (0 = none) */
    int64_t recover_t0;             /* a loss not yet followed by an event (recovery latency) */
    int close_stp;                  /* CLOSING: the stop worker that publishes FINISH, -1 none */
    int close_finish;               /* CLOSING: the STOP_CLOSE finish, said again to a replacement */
    char *close_error;
    bool cancel;
    int32_t *out;
    uint32_t n_out, cap_out;
    int engine_reason;              /* from VERDICTS, before the FINISH event */
    bool result_ready;              /* the FINISH event was seen */
    uint64_t open_task[3];          /* SEQ_OPEN, SAMPLE_OPEN, STOP_OPEN task ids */
    uint64_t stop_pin;              /* of the last STOP_OPEN: its events must carry it */
    int64_t closing_since;
    /* times */
    uint64_t t_submit_wall, t_start_wall;
    int64_t t_submit_ms;
    /* result (from events): what subscribers were sent up to last_seq. The
     * text is kept up to TP_PROTO_MAX_TEXT (whole deltas; text_cut counts
     * the bytes past it), so STATUS always fits its reply; shown[] are the
     * ids of the TOKEN events (verdicts may run a step ahead of them in
     * out[]), kept while the job runs. */
    int64_t last_seq;
    char *text;
    size_t text_len, text_cap;
    uint64_t text_cut;
    int32_t *shown;
    size_t n_shown, cap_shown;
    int reason;
    tp_matched matched;
    char *matched_buf;
    char *job_error;
    tp_timings timings;
    int64_t done_ms;
    uint32_t context_refused;       /* the prompt did not fit: the context length (FINISH error_code) */
    struct joblp *lp;               /* logprobs its TOKEN events carried, for STATUS (joblp.c) */
    uint64_t t_last_token_us;       /* metrics: arrival of its last TOKEN event */
} bjob;

typedef struct bstats {
    uint64_t jobs_submitted, jobs_rejected, jobs_finished, tokens_generated, events_published;
    uint64_t malformed_front, malformed_back, malformed_events;
    uint64_t finish[TP_REASON_COUNT];
    uint64_t triggers_other;
    uint64_t forward_steps, forward_rows, forward_tokens;
    uint64_t workers_lost, events_duplicate, events_refused;
    uint64_t recovered[4];          /* jobs moved to another worker, per stage (TP_SI_*) */
    uint64_t recovery_n, recovery_ms_sum, recovery_ms_max;
    size_t n_triggers;
    struct btrigger {
        tp_matched key;
        char str[49];
        bool truncated;
        uint64_t count;
    } triggers[64];
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
    uint32_t next_worker_no;

    bjob *jobs;                     /* table: n_jobs_cap entries, slot = index */
    uint32_t jobs_cap;
    uint32_t *hash;                 /* id -> slot+1, open addressing, hash_cap entries */
    uint32_t hash_cap;
    int n_active;                   /* TOKENIZE + ADMIT + RUNNING + CLOSING */
    int64_t last_busy_ms;           /* last loop tick with an active job */
    bool trimmed;                   /* malloc_trim done since then */
    uint64_t next_seqno, next_task, next_step, next_auto_id;

    bstats stats;
    bmetrics metrics;               /* histograms for STATS (metrics.c) */
    bcols cols;

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

/* broker.c */
int broker_init(broker *b, tp_config *cfg, tp_err *err);
int broker_run(broker *b);
void broker_free(broker *b);
void broker_log(const broker *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int broker_send_worker(broker *b, int wi, const tp_msg *m);
void broker_publish_finish(broker *b, bjob *j, int reason, const char *error);
void broker_publish_beat(broker *b);

/* jobs.c */
int jobs_init(broker *b, tp_err *err);
void jobs_free(broker *b);
bjob *jobs_find(broker *b, const char *id, size_t len);
bjob *jobs_by_slot(broker *b, uint32_t slot);
bjob *jobs_new(broker *b, const char *id, size_t len);
void jobs_release(broker *b, bjob *j);
void jobs_expire(broker *b, int64_t now);
int jobs_append_text(bjob *j, const char *s, size_t n);
int jobs_append_out(bjob *j, int32_t id);
int jobs_append_cand(bjob *j, int32_t id);
bool jobs_event_wanted(broker *b, const tp_msg *ev);

/* Is a TOKEN/FINISH from the stop worker its job is pinned to (it carries
 * the pin of the job's last STOP_OPEN)? Events of unknown jobs are not. */
bool jobs_event_from_pinned(broker *b, const tp_msg *ev);
uint64_t jobs_text_total(const bjob *j);
void jobs_on_event(broker *b, const tp_msg *ev);
void jobs_mark_finished(broker *b, bjob *j);

/* registry.c */
void registry_on_message(broker *b, const tp_frame *ident, const tp_frame *frames, size_t n);
void registry_tick(broker *b, int64_t now);
void registry_lose(broker *b, int wi, const char *why);
int registry_find(broker *b, const void *ident, size_t len);
void registry_reap(broker *b);
void registry_probe(broker *b);
bool registry_usable(const broker *b, int wi);
int registry_count(const broker *b, unsigned stage_bit);
const bworker *registry_model(const broker *b);

/* sched.c */
void sched_run(broker *b);
void sched_on_result(broker *b, int wi, const tp_msg *m);
void sched_fail_job(broker *b, bjob *j, const char *why);
void sched_cancel_job(broker *b, bjob *j);
void sched_start_job(broker *b, bjob *j);
void sched_worker_lost(broker *b, int wi);
void sched_recover(broker *b, int64_t now);
void sched_free(broker *b);

/* front.c */
void front_on_message(broker *b, const tp_frame *frames, size_t n, bool too_many);

/* joblp.c */
void joblp_on_token(bjob *j, const tp_m_token *t);
tp_lp_cols joblp_status(const bjob *j, size_t n_tokens);
void joblp_free(bjob *j);
/* info.c */
void info_on_ready(broker *b, const tp_m_ready *r);
void info_reply(broker *b, uint64_t req, tp_msg *r);
void info_free(broker *b);
/* spawn.c */
int spawn_init(broker *b, tp_err *err);
void spawn_tick(broker *b, int64_t now);
void spawn_stop_all(broker *b, int timeout_ms);
void spawn_free(broker *b);

#endif
