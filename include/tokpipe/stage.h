/* Stage glue: turns WRK1 task messages into calls of the stage libraries
 * (tokenizer, forward, sampler, stop) and their results into replies.
 *
 * The glue knows messages, not sockets: replies go to the broker and events
 * to subscribers through the tp_stage_io callbacks the worker runtime
 * (workers/worker_main.c) provides. Each stage keeps per-job state under
 * the broker's slot number; tp_*_stage_reset drops all of it (the worker
 * reconnected, so the broker has forgotten those slots).
 *
 * A handler returns 0 when it dealt with the message (an error reply for a
 * bad task is still 0), TP_ENOTFOUND when the command is not one of its
 * stage's, and another negative code only for a failure of the process
 * itself (out of memory while replying). */
#ifndef TOKPIPE_STAGE_H
#define TOKPIPE_STAGE_H

#include <stdbool.h>
#include <stdint.h>

#include "tokpipe/error.h"
#include "tokpipe/forward.h"
#include "tokpipe/model.h"
#include "tokpipe/protocol.h"
#include "tokpipe/tokenizer.h"

typedef struct tp_stage_io {
    int (*reply)(void *ctx, const tp_msg *m);    /* to the broker */
    int (*publish)(void *ctx, const tp_msg *m);  /* an EVT1 event */
    void *ctx;
} tp_stage_io;

/* Reply RESULT (status, error or NULL) to the task message m. */
static inline int tp_stage_result(const tp_stage_io *io, const tp_msg *m, uint32_t status, const char *error)
{
    tp_msg r;
    tp_msg_init_reply(&r, m, TP_CMD_RESULT, status, error);
    return io->reply(io->ctx, &r);
}

/* ---- tokenize ---------------------------------------------------------- */
/* The jobs a stage holds, by the broker's slot number (the stages' common
 * skeleton, workers/stage/slots.c): a fixed table of capacity entries of
 * size bytes, each beginning with a tp_slot, zeroed when free. */
typedef struct tp_slot {
    bool used;
    uint32_t slot;
} tp_slot;

typedef struct tp_slots {
    unsigned char *e;
    size_t size;
    int capacity;
} tp_slots;

/* TP_ENOMEM or 0; tp_slots_free(NULL-safe on a zeroed t) frees the table. */
int tp_slots_init(tp_slots *t, int capacity, size_t size);
void tp_slots_free(tp_slots *t);
/* The job of slot, or NULL. */
void *tp_slots_find(const tp_slots *t, uint32_t slot);
/* Where an OPEN of slot goes: the job it already has (*reopen true: drop
 * it first, a re-open replaces the job), else a free entry; NULL when the
 * table is full. The entry counts as taken once tp_slots_take marks it. */
void *tp_slots_open(const tp_slots *t, uint32_t slot, bool *reopen);
void tp_slots_take(void *entry, uint32_t slot);
/* Entry i (0 <= i < capacity), taken or not: for walking the table. */
void *tp_slots_at(const tp_slots *t, int i);

typedef struct tp_tokenize_stage tp_tokenize_stage;
/* tok is borrowed and must outlive the stage (NULL: a stage that only
 * renders, tp_tokenize_stage_render). */
int tp_tokenize_stage_new(const tp_tokenizer *tok, tp_tokenize_stage **out, tp_err *err);
int tp_tokenize_stage_handle(tp_tokenize_stage *st, const tp_msg *m, const tp_stage_io *io);
void tp_tokenize_stage_free(tp_tokenize_stage *st);
/* Chat: TOKENIZE requests with messages are rendered with tmpl (owned by
 * the stage from now on; NULL = such requests are refused with why, a
 * message naming what is missing) and tokenized with control tokens parsed
 * and no BOS/EOS added (the template writes them). bos/eos: the texts the
 * template sees as bos_token/eos_token (copied; NULL = undefined). The
 * template's end-of-turn token (the first token of what it puts after an
 * assistant turn, when that is a control or user-defined token outside the
 * vocabulary's end-of-generation set) goes back in TOKENIZED stop_ids. */
struct tp_chat_template;
int tp_tokenize_stage_set_chat(tp_tokenize_stage *st, struct tp_chat_template *tmpl, const char *bos,
                               const char *eos, const char *why, tp_err *err);
/* Bytes a TOKENIZE with messages renders into before it gives up: past
 * TP_PROTO_MAX_PROMPT, so that a conversation too long for one prompt is
 * refused (TOKENIZED 413) with its length. */
#define TP_TOKENIZE_RENDER_ROOM (4u * TP_PROTO_MAX_PROMPT)
/* Render msgs (and tools: a JSON array, ptr NULL = none; reasoning_effort:
 * the template's variable, ptr NULL = none) with the chat
 * template as a TOKENIZE with messages does; *out (caller frees) is the
 * prompt text to tokenize with control tokens parsed and nothing added.
 * Errors start "messages: ", "messages[i]...: " or "tools...: " (tools
 * malformed, or a template with no tool support). */
int tp_tokenize_stage_render(const tp_tokenize_stage *st, const tp_chat_msg *msgs, size_t n, tp_str tools,
                             tp_str reasoning_effort, char **out, size_t *len, tp_err *err);
/* The tool-call syntax of the template set by tp_tokenize_stage_set_chat
 * (family none without a template). */
struct tp_tc_syntax;
void tp_tokenize_stage_syntax(const tp_tokenize_stage *st, struct tp_tc_syntax *out);
/* The end-of-turn ids found by tp_tokenize_stage_set_chat (borrowed). */
int tp_tokenize_stage_turn_end_ids(const tp_tokenize_stage *st, const int32_t **ids);

/* ---- sample ------------------------------------------------------------ */
typedef struct tp_sample_stage tp_sample_stage;
/* capacity: jobs it can hold; vocab_size of the model; eos_ids (borrowed,
 * must outlive the stage) are banned below min_tokens unless ignore_eos. */
int tp_sample_stage_new(int capacity, int vocab_size, const int *eos_ids, int n_eos, tp_sample_stage **out,
                        tp_err *err);
int tp_sample_stage_handle(tp_sample_stage *st, const tp_msg *m, const tp_stage_io *io);
/* Grammars (params.grammar of SAMPLE_OPEN) need the model's token bytes:
 * tok (borrowed, outlives the stage) is indexed on the first constrained
 * job, so a worker that never gets one pays nothing. Without a tokenizer
 * such jobs are refused. gl / el: the config's limits (NULL = defaults). */
struct tp_grammar_limits;
struct tp_gengine_limits;
void tp_sample_stage_set_grammar(tp_sample_stage *st, const tp_tokenizer *tok, const struct tp_grammar_limits *gl,
                                 const struct tp_gengine_limits *el);
/* Sample the candidate for slot from one row of logits (vocab floats, not
 * modified). accepted: the token accepted since the slot's last
 * sample (-1 none); index: completion tokens accepted so far, or
 * TP_SAMPLE_INDEX_TRACKED to use the count of accepted tokens reported so
 * far (a fused forward stage, whose STEP has no index column). */
#define TP_SAMPLE_INDEX_TRACKED UINT32_MAX
int tp_sample_stage_pick(tp_sample_stage *st, uint32_t slot, uint32_t index, int32_t accepted,
                         const float *logits, int32_t *candidate, tp_err *err);
void tp_sample_stage_reset(tp_sample_stage *st);
void tp_sample_stage_free(tp_sample_stage *st);
/* Logprob columns of one reply (SAMPLED, or a fused STEP_RESULT): reset
 * for up to n items (TP_ENOMEM if that cannot be held), then after item i's
 * candidate was picked from logits, lp_item fills row i (nothing is
 * computed for a job that did not ask), then lp_cols gives the columns of
 * items [0, n) — with logprobs.data NULL when no job asked, so a reply
 * without logprobs is what it always was. The columns borrow the stage's
 * buffers until the next reset. */
int tp_sample_stage_lp_reset(tp_sample_stage *st, uint32_t n);
void tp_sample_stage_lp_item(tp_sample_stage *st, uint32_t i, uint32_t slot, const float *logits, int32_t cand);
tp_lp_cols tp_sample_stage_lp_cols(tp_sample_stage *st, uint32_t n);

/* ---- forward ----------------------------------------------------------- */
typedef struct tp_forward_stage tp_forward_stage;
/* model is borrowed. kv_slots / max_pos / max_batch_tokens as for
 * tp_forward_new; threads 1..TP_FORWARD_MAX_THREADS, or 0 for
 * tp_forward_default_threads() (the CPUs the affinity mask allows). */
int tp_forward_stage_new(const tp_model *model, int kv_slots, int max_pos, int max_batch_tokens,
                         int threads, tp_forward_stage **out, tp_err *err);
/* Matmul kernel for every later step (tp_forward_set_kernel: the OpenBLAS
 * one gives up batch invariance). Call before serving, with SIGTERM/SIGINT
 * blocked: the first OpenBLAS opt-in loads the library, whose threads
 * inherit the signal mask. */
int tp_forward_stage_set_kernel(tp_forward_stage *st, tp_fwd_kernel k, tp_err *err);

/* Prefix cache on or off, with extra_pages pages beyond the pool's
 * (tp_forward_set_prefix_cache); call before serving. */
int tp_forward_stage_set_prefix_cache(tp_forward_stage *st, bool on, int extra_pages, tp_err *err);

/* Bytes of one KV page (16 positions of every layer, keys and values). */
size_t tp_forward_stage_page_bytes(const tp_forward_stage *st);
/* KV cache element type (tp_forward_set_kv_type); call before serving. */
int tp_forward_stage_set_kv_type(tp_forward_stage *st, tp_kv_type t, tp_err *err);
/* Fuse: STEP messages with sample=true are sampled in process by ss
 * (borrowed; NULL = not fused, such steps are refused). */
void tp_forward_stage_set_sampler(tp_forward_stage *st, tp_sample_stage *ss);
int tp_forward_stage_handle(tp_forward_stage *st, const tp_msg *m, const tp_stage_io *io);
int tp_forward_stage_kv_slots(const tp_forward_stage *st);
int tp_forward_stage_max_positions(const tp_forward_stage *st);
int tp_forward_stage_max_batch_tokens(const tp_forward_stage *st);
void tp_forward_stage_reset(tp_forward_stage *st);
void tp_forward_stage_free(tp_forward_stage *st);

/* ---- stop -------------------------------------------------------------- */
typedef struct tp_stop_stage tp_stop_stage;
typedef struct tp_stop_stage_limits {
    int capacity;          /* jobs */
    int max_stop_strings;
    int max_stop_len;
} tp_stop_stage_limits;
/* tok and the eos ids are borrowed (they must outlive the stage). */
/* The config's grammar.* limits for the grammars FINISH checks (NULL =
 * defaults, which the stage starts with). */
void tp_stop_stage_set_grammar_limits(tp_stop_stage *st, const struct tp_grammar_limits *gl,
                                      const struct tp_gengine_limits *el);
int tp_stop_stage_new(const tp_tokenizer *tok, const int *eos_ids, int n_eos, const tp_stop_stage_limits *lim,
                      tp_stop_stage **out, tp_err *err);
int tp_stop_stage_handle(tp_stop_stage *st, const tp_msg *m, const tp_stage_io *io);
/* The model's tool-call syntax, for jobs whose params ask to parse tool
 * calls or reasoning (copied; default: family none, no thinking). */
struct tp_tc_syntax;
void tp_stop_stage_set_syntax(tp_stop_stage *st, const struct tp_tc_syntax *syn);
void tp_stop_stage_reset(tp_stop_stage *st);
void tp_stop_stage_free(tp_stop_stage *st);

/* ---- draft -------------------------------------------------------------- */
/* Speculative decoding's draft model (tokpipe/draft.h): DRAFT and
 * DRAFT_CLOSE. draft is borrowed (the draft model, not the target: the
 * worker checked its vocabulary against the target's); kv_slots jobs of up
 * to max_pos positions (0 = the model's seq_len), threads as for
 * tp_forward_stage_new. */
typedef struct tp_draft_stage tp_draft_stage;
int tp_draft_stage_new(const tp_model *draft, int kv_slots, int max_pos, int max_batch_tokens, int threads,
                       tp_draft_stage **out, tp_err *err);
int tp_draft_stage_handle(tp_draft_stage *st, const tp_msg *m, const tp_stage_io *io);
int tp_draft_stage_kv_slots(const tp_draft_stage *st);
int tp_draft_stage_max_positions(const tp_draft_stage *st);
void tp_draft_stage_reset(tp_draft_stage *st);
void tp_draft_stage_free(tp_draft_stage *st);

#endif
