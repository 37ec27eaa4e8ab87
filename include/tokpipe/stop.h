/* Per-job stop state: decides, for every sampled candidate token, whether it
 * is accepted or finishes the job, and which text may be published now.
 *
 * Semantics are DESIGN.md §3, for each candidate c *before* it is accepted:
 *   1. c in stop_ids                      -> finish stop_token (matched_id = c)
 *   2. c in eos_ids and not ignore_eos    -> finish eos        (matched_id = c)
 *   3. c's bytes are appended to the generated text T and every stop string
 *      is matched at once; the stop ending earliest in T (ties: the longest)
 *      cuts the text at its start (at its end with include_stop_str_in_output)
 *      -> finish stop_string (matched_str)
 *   4. otherwise c is accepted; after max_tokens accepted -> finish length.
 * A candidate finishing by 1-3 is NOT accepted and not counted in
 * completion_tokens; text it carried before a stop string is still published.
 *
 * min_tokens: during the first min_tokens accepted tokens a stop string only
 * counts if it ends after their text. The sampler never picks EOS or a stop
 * id then; if such a candidate arrives anyway (a buggy sampler, or pieces
 * mode), it is treated as an ordinary token and accepted with its bytes —
 * vLLM's rule (check_stop returns "not stopped" below min_tokens), so
 * min_tokens stays a guarantee of at least that many accepted tokens.
 *
 * Streaming: after each step the chunk holds exactly the bytes that can no
 * longer change, decoded as UTF-8 with U+FFFD for invalid bytes (maximal
 * subpart rule, = Python bytes.decode("utf-8", "replace")). Held back are
 * (a) the longest suffix of T that is a proper prefix of a stop string (not
 * with include_stop_str_in_output) and (b) an unfinished UTF-8 sequence at
 * the end. Held bytes are released at every finish except stop_string.
 * Concatenated chunks == final text, always. Chunks are not token-aligned
 * (publish token ids beside them). T is generated text only: a character
 * the prompt left unfinished is not completed across the boundary (its
 * continuation bytes decode as U+FFFD). For a multi-token step (speculative
 * decoding) feed the tokens in order and drop the rest at the first finish.
 *
 * Cost per candidate is O(bytes of the candidate) amortized, whatever the
 * number of stop strings (one Aho-Corasick automaton over bytes, built once
 * in tp_stop_new). Not thread-safe per object; one object per job.
 *
 * Deterministic: the same config and candidates give the same steps. A
 * replacement worker rebuilds a job's state from the job record by feeding
 * its accepted tokens again and publishing nothing for them. */
#ifndef TOKPIPE_STOP_H
#define TOKPIPE_STOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokpipe/error.h"

typedef enum {
    TP_FINISH_NONE = 0,
    TP_FINISH_STOP_STRING,
    TP_FINISH_STOP_TOKEN,
    TP_FINISH_EOS,
    TP_FINISH_LENGTH,
    TP_FINISH_CANCELLED,
    TP_FINISH_ERROR,
} tp_finish_reason;

#define TP_FINISH_REASON_COUNT 7

/* "none", "stop_string", "stop_token", "eos", "length", "cancelled",
 * "error"; "unknown" for anything else. Never NULL. */
const char *tp_finish_reason_name(tp_finish_reason r);

/* Parse a name produced by tp_finish_reason_name; TP_ENOTFOUND if unknown. */
int tp_finish_reason_parse(const char *name, tp_finish_reason *out);

/* Defaults for the limits below when the config leaves them 0. */
#define TP_STOP_DEFAULT_MAX_STRINGS 1024
#define TP_STOP_DEFAULT_MAX_LEN 1024
/* Upper bound accepted for max_stop_len (depths are stored in 16 bits). */
#define TP_STOP_HARD_MAX_LEN 65535
/* max_tokens value meaning "no length limit" (max_tokens < 1 is an error). */
#define TP_STOP_NO_LIMIT INT32_MAX

typedef struct tp_stop_config {
    const char *const *stop;      /* n_stop strings, raw bytes, need not be NUL-terminated */
    const size_t *stop_len;       /* their lengths; NULL = use strlen */
    size_t n_stop;
    const int32_t *stop_ids;
    size_t n_stop_ids;
    const int32_t *eos_ids;
    size_t n_eos_ids;
    bool ignore_eos;
    int32_t min_tokens;           /* >= 0, <= max_tokens */
    int32_t max_tokens;           /* >= 1; TP_STOP_NO_LIMIT for none */
    bool include_stop_str_in_output;
    int32_t vocab_size;           /* 0 = don't range-check ids */
    size_t max_stop_strings;      /* 0 = TP_STOP_DEFAULT_MAX_STRINGS; counts distinct strings (copies are one) */
    size_t max_stop_len;          /* 0 = TP_STOP_DEFAULT_MAX_LEN, bytes per string */
    size_t matcher_dense_bytes;   /* 0 = default; memory budget of the automaton's dense rows */
} tp_stop_config;

typedef struct tp_stop tp_stop;

/* Validate cfg and build the job's stop state; all stop strings are compiled
 * once into one byte automaton (duplicates merged, not an error). The config
 * is copied: cfg and its arrays may be freed after the call. On error returns
 * TP_EINVAL / TP_ERANGE / TP_ENOMEM with a message naming the field, e.g.
 * "stop[2]: empty string", "stop_token_ids[0]: id 40000 outside the
 * vocabulary [0, 32000)". On success *out is owned by the caller. */
int tp_stop_new(const tp_stop_config *cfg, tp_stop **out, tp_err *err);

/* The number of distinct strings among stop[0, n) (lens[i] bytes each; lens
 * NULL: NUL-terminated), what max_stop_strings limits: a stop string sent
 * twice matches as one. SIZE_MAX when out of memory. O(n) expected. */
size_t tp_stop_count_distinct(const char *const *stop, const size_t *lens, size_t n);

void tp_stop_free(tp_stop *s);

typedef struct tp_stop_step {
    bool accepted;            /* the candidate entered the sequence */
    tp_finish_reason finish;  /* TP_FINISH_NONE while the job goes on */
    const char *chunk;        /* valid UTF-8 safe to publish now; borrowed until the next call on s */
    size_t chunk_len;         /* may be 0 (text held back) */
    const char *matched_str;  /* finish stop_string: the stop string (borrowed while s lives), else NULL */
    size_t matched_len;
    int32_t matched_id;       /* finish stop_token / eos: the id, else -1 */
} tp_stop_step;

/* Decide one candidate. bytes (n of them, may be NULL when n == 0) are the
 * text the candidate contributes (tp_detok_bytes). Fills *out. Returns 0, or
 * TP_ESTATE if the job already finished, TP_ENOMEM (then the job is finished
 * with TP_FINISH_ERROR). */
int tp_stop_feed(tp_stop *s, int32_t token_id, const uint8_t *bytes, size_t n, tp_stop_step *out);

/* Finish the job as cancelled (client gone, deadline, shutdown): releases
 * every held byte in out->chunk. TP_ESTATE if already finished. */
int tp_stop_cancel(tp_stop *s, tp_stop_step *out);

/* Finish the job as TP_FINISH_EOS after its last accepted token, with no
 * candidate (matched_id -1): its grammar admits nothing more. Held bytes
 * are released as for cancel. TP_ESTATE if already finished. */
int tp_stop_end(tp_stop *s, tp_stop_step *out);

/* Finish the job with TP_FINISH_ERROR (e.g. a worker-side failure): held
 * bytes are released as for cancel. TP_ESTATE if already finished. */
int tp_stop_fail(tp_stop *s, tp_stop_step *out);

/* The text published so far (= concatenated chunks; the final text once
 * finished). Borrowed until the next call on s; NUL-terminated. */
const char *tp_stop_text(const tp_stop *s, size_t *len);

/* Accepted (= completion) tokens so far. */
int32_t tp_stop_completion_tokens(const tp_stop *s);

/* TP_FINISH_NONE while running. */
tp_finish_reason tp_stop_finish_reason(const tp_stop *s);

/* Raw bytes currently held back (not yet published): their count, and the
 * bytes themselves (borrowed until the next call on s). */
size_t tp_stop_held_bytes(const tp_stop *s);
const uint8_t *tp_stop_held(const tp_stop *s, size_t *len);

/* Bytes of memory the job's stop state uses (automaton + buffers). */
size_t tp_stop_memory(const tp_stop *s);

/* Number of distinct stop strings after merging duplicates, and the i-th
 * (in order of first appearance in the config). Borrowed while s lives. */
size_t tp_stop_n_strings(const tp_stop *s);
const char *tp_stop_string(const tp_stop *s, size_t i, size_t *len);

/* ---- monitoring counters ----
 * A plain fixed-size struct so a worker can keep one per process, merge each
 * finished job into it (tp_stop_stats_merge) and ship it as is. */

#define TP_STOP_STATS_TRIGGERS 32  /* distinct stop strings/ids tracked by name */
#define TP_STOP_STATS_KEY_MAX 48   /* bytes of a stop string kept as its key */

typedef struct tp_stop_trigger {
    int32_t id;                    /* stop_token / eos id, or -1 for a stop string */
    uint16_t key_len;              /* bytes of key used (string triggers) */
    bool key_truncated;            /* the stop string was longer than the key */
    char key[TP_STOP_STATS_KEY_MAX];
    uint64_t count;
} tp_stop_trigger;

typedef struct tp_stop_stats {
    uint64_t jobs;                              /* jobs finished */
    uint64_t finish[TP_FINISH_REASON_COUNT];    /* indexed by tp_finish_reason */
    uint64_t candidates;                        /* tp_stop_feed calls */
    uint64_t tokens_accepted;
    uint64_t bytes_in;                          /* candidate bytes fed */
    uint64_t bytes_published;                   /* raw bytes covered by chunks */
    uint64_t bytes_held;                        /* bytes that were held back at the end of a step (each counted once) */
    uint64_t bytes_released;                    /* of those, later published */
    uint64_t bytes_dropped;                     /* cut off by a stop string (the stop itself unless included, and after it) */
    uint64_t min_tokens_overrides;              /* EOS/stop-id candidates accepted because of min_tokens */
    uint32_t n_triggers;                        /* used entries of trigger[] */
    tp_stop_trigger trigger[TP_STOP_STATS_TRIGGERS]; /* per stop string / stop id: how often it finished a job */
    uint64_t triggers_other;                    /* triggers not tracked by name (table full) */
} tp_stop_stats;

/* This job's counters (jobs/finish/trigger filled once it finished). */
const tp_stop_stats *tp_stop_get_stats(const tp_stop *s);

/* Add every counter of from into into; triggers are matched by (id, key). */
void tp_stop_stats_merge(tp_stop_stats *into, const tp_stop_stats *from);

#endif
