/* tokpiped's job table: the jobs (slot = index) and an id -> slot hash,
 * each job's record and its state transitions. The bottom floor of the
 * daemon: it neither sends nor logs; what happened is in its return values
 * and counters, which the floors above publish. */
#ifndef TOKPIPED_JOBS_H
#define TOKPIPED_JOBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokpipe/error.h"
#include "tokpipe/protocol.h"
#include "tokpipe/spec.h"
#include "metrics.h"

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
    tp_chat_msg *messages;  /* SUBMIT's conversation (one block: tp_chat_msgs_dup), for TOKENIZE */
    size_t n_messages;
    tp_str tools;           /* SUBMIT's tools (in the messages block) */
    char reasoning_effort[8]; /* SUBMIT's ("low", "medium", "high"; checked), "" none */
    int32_t *prompt;
    uint32_t n_prompt;
    /* running */
    int fwd, smp, stp;              /* worker indexes, -1 none (dft: below) */
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
    tp_spec spec;                   /* speculative decoding's controller (n_max 0: off) */
    int32_t guess[TP_SPEC_MAX_DRAFT]; /* the guesses its step in flight verifies */
    uint32_t n_guess;
    /* speculative mode draft (draft.c): its guesses come from a draft worker */
    bool draft_mode;
    int dft;                        /* its draft worker, -1 none */
    uint32_t draft_fed;             /* tokens of prompt + cands the draft worker holds (or will) */
    uint64_t draft_task;            /* the DRAFT it awaits the answer of, 0 none */
    int64_t draft_sent_ms;
    uint32_t draft_for;             /* prompt + cands the guesses below continue, 0 none */
    uint32_t n_drafted;             /* 0..TP_SPEC_MAX_DRAFT (0 for draft_for: no guesses in that step) */
    int32_t drafted[TP_SPEC_MAX_DRAFT];
    uint32_t draft_base, draft_got; /* of the guesses in flight: what they continue, how many came */
    uint8_t draft_losses;           /* draft workers lost while drafting for it (B_POISON_TRIES: no more) */
    uint32_t n_tok_ids;             /* ids carried by the TOKEN events forwarded to subscribers */
    int64_t lost_ms;                /* when the job lost a worker it still misses (0 = none) */
    uint8_t losses;                 /* workers of loss_stage lost while they processed this job alone, */
    int8_t loss_stage;              /* without progress there since (recover.c: poison jobs) */
    bool suspect;                   /* lost a worker processing it since: tried alone (recover.c) */
    bool stop_resend;               /* its candidates awaiting verdicts wait to go to its new stop worker */
    int64_t recover_t0;             /* a loss not yet followed by an event (recovery latency) */
    int close_stp;                  /* CLOSING: the stop worker that publishes FINISH, -1 none */
    int close_finish;               /* CLOSING: the STOP_CLOSE finish, said again to a replacement */
    char *close_error;
    char *gbnf;                     /* the job's grammar (params.grammar points here), or NULL */
    const char *gtrigger;           /* static: it applies from this text on (tool_choice auto), or NULL */
    bool cancel;
    uint8_t embed;                  /* an embedding job: SEQ_OPEN's pool (SUBMIT embed), 0 a generating job */
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
    const char *rejected;           /* the client's error found after the ACK: its TP_CODE_* (FINISH
                                     * error_code; STATS counts it in jobs_rejected), NULL if none */
    uint32_t context_refused;       /* with TP_CODE_CONTEXT: the model's context length (FINISH) */
    struct joblp *lp;               /* logprobs its TOKEN events carried, for STATUS (joblp.c) */
    struct jobclp *clp;             /* logprobs the sampler sent with its candidates (joblp.c) */
    struct jobfields *fields;       /* reasoning and calls its events carried, for STATUS (jobfields.c) */
    uint64_t t_last_token_us;       /* metrics: arrival of its last TOKEN event */
} bjob;

/* What the table counts as jobs end (STATS). */
typedef struct bjobcounts {
    uint64_t jobs_finished, tokens_generated;
    uint64_t jobs_rejected;         /* refused after the ACK (prompt over the context) */
    uint64_t finish[TP_REASON_COUNT];
    uint64_t triggers_other;
    uint64_t recovery_n, recovery_ms_sum, recovery_ms_max;   /* streams resumed after a lost worker */
    size_t n_triggers;
    struct btrigger {
        tp_matched key;
        char str[49];
        bool truncated;
        uint64_t count;
    } triggers[64];
} bjobcounts;

typedef struct bjobs {
    bjob *jobs;                     /* cap entries, slot = index */
    uint32_t cap;
    uint32_t *hash;                 /* id -> slot+1, open addressing, hash_cap entries */
    uint32_t hash_cap;
    int n_active;                   /* TOKENIZE + ADMIT + RUNNING + CLOSING */
    uint64_t next_seqno;
    bjobcounts c;
    bmetrics metrics;               /* latency histograms for STATS (metrics.c) */
} bjobs;

/* Room for max_active jobs plus the finished ones kept for STATUS. */
int jobs_init(bjobs *t, int max_active, tp_err *err);
void jobs_free(bjobs *t);
bjob *jobs_find(bjobs *t, const char *id, size_t len);
bjob *jobs_by_slot(bjobs *t, uint32_t slot);
bjob *jobs_new(bjobs *t, const char *id, size_t len);
void jobs_release(bjobs *t, bjob *j);

/* Release the finished jobs older than ttl_ms. */
void jobs_expire(bjobs *t, int64_t now, int64_t ttl_ms);
int jobs_append_text(bjob *j, const char *s, size_t n);
int jobs_append_out(bjob *j, int32_t id);
int jobs_append_cand(bjob *j, int32_t id);
uint64_t jobs_text_total(const bjob *j);

/* Is a TOKEN/FINISH from the stop worker its job is pinned to (it carries
 * the pin of the job's last STOP_OPEN)? Events of unknown jobs are not. */
bool jobs_event_from_pinned(bjobs *t, const tp_msg *ev);
bool jobs_event_wanted(bjobs *t, const tp_msg *ev);

/* An event on its way to subscribers: keep the job's text and result.
 * Returns how long the job's stream had stopped when this event resumed
 * it after a lost worker (ms), else -1; *job names the job then. */
int64_t jobs_on_event(bjobs *t, const tp_msg *ev, const bjob **job);

/* The FINISH the broker publishes itself for j (a job that never reached a
 * stop worker, or whose stop worker is gone): false when j already has its
 * result. ev borrows j's id and error until it is encoded; record it with
 * jobs_on_event once sent. */
bool jobs_own_finish(const bjob *j, int reason, const char *error, tp_msg *ev);
void jobs_mark_finished(bjobs *t, bjob *j);

/* The prompt text and conversation of j's request, once tokenized or
 * finished (the tools' text lives in the same block). */
void jobs_drop_request(bjob *j);

/* Did j lose a worker that was processing it? Such a job is run apart from
 * others until it finishes or is found to be poison (recover.c). */
bool jobs_suspect(const bjob *j);

/* j got a result of stage si (TP_SI_*): a loss there is forgiven. */
void jobs_progress(bjob *j, int si);

/* joblp.c: the logprobs a job's TOKEN events carried */
void joblp_on_token(bjob *j, const tp_m_token *t);
tp_lp_cols joblp_status(const bjob *j, size_t n_tokens);
void joblp_free(bjob *j);
/* The row `row` of lp, the sampler's for j's candidate `index`: kept (jobs
 * that asked for logprobs only) so a candidate sent to a new stop worker
 * carries it again. */
void joblp_on_candidate(bjob *j, uint32_t index, const tp_lp_cols *lp, size_t row);
/* The kept rows of candidates [from, to) (a NaN logprob where none came),
 * borrowed until the next joblp_on_candidate; no frames when the last has
 * none. */
tp_lp_cols joblp_candidates(const bjob *j, uint32_t from, uint32_t to);
void joblp_cand_free(bjob *j);

/* jobfields.c: the reasoning and tool calls a job's events carried */
void jobfields_on_token(bjob *j, const tp_m_token *t);
void jobfields_on_finish(bjob *j, const tp_m_finish *f);
tp_str jobfields_reasoning(const bjob *j);   /* ptr NULL: none */
/* The calls so far (running: as the TOKEN deltas built them; finished:
 * FINISH's), valid until the job's next event. */
size_t jobfields_calls(bjob *j, const tp_tool_call **calls);
void jobfields_free(bjob *j);

#endif
