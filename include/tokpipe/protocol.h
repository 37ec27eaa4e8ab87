/* tokpipe wire protocol: encode, decode and validate every message (no
 * sockets here). protocol/PROTOCOL.md is the spec; this header is its C
 * binding.
 *
 * A message is a list of ZeroMQ frames (after any ROUTER identity frames,
 * and, for events, after the topic frame):
 *   F0 magic+version, 4 bytes: "JOB1" producer<->broker, "WRK1"
 *      broker<->worker, "EVT1" events (XPUB)
 *   F1 command, 1 byte (TP_CMD_*)
 *   F2 header: one msgpack map with string keys (PROTOCOL.md lists them)
 *   F3.. payload frames: raw little-endian arrays (int32 token ids, uint32
 *      slots/positions, uint8 flags, float32 logits), never msgpack arrays.
 *
 * Decoding is strict: frame sizes are checked against the hard caps below
 * before any msgpack parsing, the msgpack structure is pre-scanned so a
 * declared count can never exceed the bytes present or the object budget
 * (msgpack-c allocates from declared counts), then types, ranges and counts
 * are checked per field. Every error names the frame or field.
 *
 * Ownership: a decoded tp_msg borrows every string and payload from the
 * frames it was decoded from (strings are NOT NUL-terminated): keep the
 * frames alive while reading it, copy what must outlive them. Arrays the
 * decoder had to build (stop strings, stop ids, triggers) are owned by the
 * tp_msg and freed by tp_msg_clear; after a successful decode they are never
 * NULL (an absent key gives a valid empty array, n = 0). Payload arrays may
 * be unaligned: read them with tp_raw_i32/u32/f32 or copy them with
 * tp_raw_copy; an absent optional payload frame is data NULL. */
#ifndef TOKPIPE_PROTOCOL_H
#define TOKPIPE_PROTOCOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tokpipe/error.h"

/* ---- frames and families ---------------------------------------------- */

#define TP_MAGIC_JOB "JOB1"   /* producer <-> broker frontend (ROUTER) */
#define TP_MAGIC_WRK "WRK1"   /* broker backend (ROUTER) <-> workers (DEALER) */
#define TP_MAGIC_EVT "EVT1"   /* events: stop stage PUB -> broker XSUB/XPUB -> SUB */
#define TP_MAGIC_LEN 4

typedef enum {
    TP_FAM_JOB = 1,
    TP_FAM_WRK = 2,
    TP_FAM_EVT = 3,
} tp_family;

/* One frame as bytes: borrowed, never owned by the struct. */
typedef struct tp_frame {
    const void *data;
    size_t len;
} tp_frame;

/* ---- commands (F1) ------------------------------------------------------ */

enum {
    /* JOB1 */
    TP_CMD_SUBMIT = 0x01,       /* P->B */
    TP_CMD_ACK = 0x02,          /* B->P: reply to SUBMIT and CANCEL */
    TP_CMD_CANCEL = 0x03,       /* P->B */
    TP_CMD_STATUS = 0x04,       /* P->B */
    TP_CMD_STATUS_REPLY = 0x05, /* B->P */
    TP_CMD_STATS = 0x06,        /* P->B */
    TP_CMD_STATS_REPLY = 0x07,  /* B->P */
    TP_CMD_INFO = 0x08,         /* P->B: the model and the broker's limits */
    TP_CMD_INFO_REPLY = 0x09,   /* B->P */
    TP_CMD_ERROR = 0x7F,        /* B->P: malformed request (any family) */

    /* EVT1 (and TP_CMD_HEARTBEAT = 0x03: the broker's heartbeat, on the
     * topic TP_EVT_HEARTBEAT_TOPIC) */
    TP_CMD_TOKEN = 0x01,
    TP_CMD_FINISH = 0x02,

    /* WRK1: control */
    TP_CMD_READY = 0x01,        /* W->B */
    TP_CMD_WELCOME = 0x02,      /* B->W */
    TP_CMD_HEARTBEAT = 0x03,    /* both */
    TP_CMD_DISCONNECT = 0x04,   /* both */
    TP_CMD_RESULT = 0x05,       /* W->B: reply to *_OPEN / *_CLOSE */
    /* WRK1: tokenize stage */
    TP_CMD_TOKENIZE = 0x10,     /* B->W */
    TP_CMD_TOKENIZED = 0x11,    /* W->B */
    /* WRK1: forward stage */
    TP_CMD_SEQ_OPEN = 0x20,     /* B->W */
    TP_CMD_SEQ_CLOSE = 0x21,    /* B->W */
    TP_CMD_STEP = 0x22,         /* B->W */
    TP_CMD_STEP_RESULT = 0x23,  /* W->B */
    TP_CMD_EMBEDDED = 0x24,     /* W->B: before a STEP_RESULT, the embeddings its STEP asked for */
    /* WRK1: sample stage */
    TP_CMD_SAMPLE_OPEN = 0x30,  /* B->W */
    TP_CMD_SAMPLE_CLOSE = 0x31, /* B->W */
    TP_CMD_SAMPLE = 0x32,       /* B->W */
    TP_CMD_SAMPLED = 0x33,      /* W->B */
    /* WRK1: stop stage */
    TP_CMD_STOP_OPEN = 0x40,    /* B->W */
    TP_CMD_STOP_CLOSE = 0x41,   /* B->W */
    TP_CMD_STOP_STEP = 0x42,    /* B->W */
    TP_CMD_VERDICTS = 0x43,     /* W->B */
    /* draft stage (speculative decoding with a draft model) */
    TP_CMD_DRAFT = 0x50,        /* B->W */
    TP_CMD_DRAFTED = 0x51,      /* W->B */
    TP_CMD_DRAFT_CLOSE = 0x52,  /* B->W */
};

/* ---- status codes (HTTP-like, in every reply) --------------------------- */

enum {
    TP_ST_OK = 200,
    TP_ST_BAD_REQUEST = 400,    /* a field is missing, mistyped or out of range */
    TP_ST_NOT_FOUND = 404,      /* unknown job id / slot */
    TP_ST_CONFLICT = 409,       /* job id already in use; cancel of a finished job */
    TP_ST_TOO_LARGE = 413,      /* a frame, string or count exceeds a cap */
    TP_ST_OVERLOADED = 429,     /* admission limit reached: retry later */
    TP_ST_INTERNAL = 500,
    TP_ST_UNKNOWN_COMMAND = 501,
    TP_ST_UNAVAILABLE = 503,    /* draining, or no worker for a needed stage */
    TP_ST_BAD_VERSION = 505,    /* F0 is not this family's magic+version */
};

/* The error text of a passive standby broker's 503 (to a SUBMIT, CANCEL or
 * STATUS) and of its DISCONNECT to a worker's READY: the other broker of
 * the pair serves (PROTOCOL.md "Standby broker"). A client sends the
 * request again, to the other broker. */
#define TP_STANDBY_PASSIVE_ERROR "standby: passive broker, the other one serves"


/* ---- finish reasons (same numbering as tp_finish_reason in stop.h) ------ */

enum {
    TP_REASON_NONE = 0,
    TP_REASON_STOP_STRING = 1,
    TP_REASON_STOP_TOKEN = 2,
    TP_REASON_EOS = 3,
    TP_REASON_LENGTH = 4,
    TP_REASON_CANCELLED = 5,
    TP_REASON_ERROR = 6,
};
#define TP_REASON_COUNT 7

/* Wire name ("none", "stop_string", ..., "error"); "unknown" otherwise. */
const char *tp_reason_name(int reason);
/* Parse a wire name (len bytes); -1 if unknown. */
int tp_reason_parse(const char *s, size_t len);
/* Whether a job that finished for reason with n_calls tool calls (FINISH
 * tool_calls; cut: FINISH tool_calls_cut, a call is not whole) ended for
 * its calls: what an OpenAI API answers as finish_reason "tool_calls"
 * (the gateway, run and generate --json). Only when the model ended the
 * output itself (stop_string, stop_token, eos) after at least one call,
 * every call whole. A length finish stays "length", calls or not: the
 * output was cut, and the last call may be cut mid-arguments, not JSON
 * (OpenAI answers "length" too); the calls before it are whole. A call a
 * stop string cut (or whose syntax broke) leaves the reason's own name. */
bool tp_reason_ends_in_calls(int reason, size_t n_calls, bool cut);

/* Job states in STATUS_REPLY. */
enum {
    TP_STATE_UNKNOWN = 0,   /* not known (never submitted, or expired) */
    TP_STATE_QUEUED = 1,    /* accepted, waiting for tokenize / a batch slot */
    TP_STATE_RUNNING = 2,
    TP_STATE_FINISHED = 3,  /* result kept for the configured TTL */
};
const char *tp_state_name(int state);

/* Stages, as a bit set in READY. */
enum {
    TP_STAGE_TOKENIZE = 1u << 0,
    TP_STAGE_FORWARD = 1u << 1,
    TP_STAGE_SAMPLE = 1u << 2,
    TP_STAGE_STOP = 1u << 3,
    TP_STAGE_DRAFT = 1u << 4,   /* a draft model's guesses (speculative decoding): its own model */
};
/* "tokenize", "forward", "sample", "stop", "draft" for one bit; NULL otherwise. */
const char *tp_stage_name(unsigned stage_bit);

/* ---- hard caps (config limits may be lower, never higher) --------------- */

#define TP_PROTO_MAX_FRAMES 12              /* frames per message after the envelope/topic, F0 included */
#define TP_PROTO_MAX_HEADER (4u << 20)      /* bytes of F2 */
#define TP_PROTO_MAX_OBJECTS 65536          /* msgpack objects in one header */
#define TP_PROTO_MAX_DEPTH 5                /* nesting of msgpack containers (SUBMIT messages[].tool_calls[] is 5 deep) */
#define TP_PROTO_MAX_PAYLOAD (256u << 20)   /* bytes of one payload frame */
#define TP_PROTO_MAX_JOB_ID 64              /* bytes; charset [A-Za-z0-9._:-] */
#define TP_PROTO_MAX_PROMPT (1u << 20)      /* bytes of prompt text */
#define TP_PROTO_MAX_MESSAGES 4096          /* turns in SUBMIT messages */
#define TP_PROTO_MAX_ROLE 64                /* bytes of a message's role */
#define TP_PROTO_MAX_TEXT (2u << 20)        /* bytes of an event delta / a result text */
#define TP_PROTO_MAX_IDS (1u << 20)         /* token ids in one frame */
/* ids of one TOKENIZED: what the longest prompt text can encode to
 * (tp_tokenizer_max_ids(TP_PROTO_MAX_PROMPT): one id per byte, a
 * SentencePiece space after each special token, BOS and EOS). Above any
 * model's context (seq_len <= 2^20), so the broker refuses such a prompt
 * as context_length_exceeded with its exact count. */
#define TP_PROTO_MAX_TOKENIZED (2u * TP_PROTO_MAX_PROMPT + 3u)
#define TP_PROTO_MAX_STOP 4096              /* stop strings per job */
#define TP_PROTO_MAX_STOP_LEN 65535         /* bytes per stop string */
#define TP_PROTO_MAX_STOP_IDS 4096          /* stop token ids per job */
#define TP_PROTO_MAX_ITEMS 4096             /* items (sequences) in one step */
#define TP_PROTO_MAX_VOCAB (1u << 20)
#define TP_PROTO_MAX_ERROR 1024             /* bytes of an error message */
#define TP_PROTO_MAX_NAME 64                /* instance, field paths */
#define TP_PROTO_MAX_MODEL_ID 256           /* READY model_id */
#define TP_PROTO_MAX_TRIGGERS 1024          /* entries of stats stop_triggers */
#define TP_PROTO_MAX_LOGIT_BIAS 1024        /* entries of params.logit_bias */
#define TP_PROTO_MAX_GRAMMAR (1u << 20)     /* bytes of params.grammar / params.json_schema */
#define TP_PROTO_MAX_TOP_LOGPROBS 20        /* params.top_logprobs (OpenAI's cap) */
#define TP_PROTO_MAX_TOOLS (1u << 20)       /* bytes of SUBMIT tools (JSON text) */
#define TP_PROTO_MAX_TOOL_CALLS 128         /* tool calls in one message / one FINISH */
#define TP_PROTO_MAX_EOG 1024               /* eog_ids in READY / INFO_REPLY (special tokens: frames, see
                                             * tp_proto_special_split) */

/* Error codes (ACK and FINISH `error_code`): a machine-readable reason
 * beside the status and the message. */
#define TP_CODE_CONTEXT "context_length_exceeded" /* the prompt does not fit the context */
#define TP_CODE_PROMPT_SIZE "prompt_too_large"     /* a conversation renders past TP_PROTO_MAX_PROMPT bytes */
#define TP_PROTO_MAX_BUCKETS 64             /* buckets of one STATS histogram */

/* ---- payload arrays ----------------------------------------------------- */

/* A raw little-endian array borrowed from a payload frame (or, when
 * encoding, from the caller). n counts elements, not bytes. */
typedef struct tp_raw {
    const void *data;
    size_t n;
} tp_raw;

static inline int32_t tp_raw_i32(tp_raw r, size_t i)
{
    int32_t v;
    memcpy(&v, (const char *)r.data + 4 * i, 4);
    return v;
}
static inline uint32_t tp_raw_u32(tp_raw r, size_t i)
{
    uint32_t v;
    memcpy(&v, (const char *)r.data + 4 * i, 4);
    return v;
}
static inline float tp_raw_f32(tp_raw r, size_t i)
{
    float v;
    memcpy(&v, (const char *)r.data + 4 * i, 4);
    return v;
}
static inline uint8_t tp_raw_u8(tp_raw r, size_t i)
{
    return ((const uint8_t *)r.data)[i];
}
/* Copy r (elem_size bytes per element) into dst, which holds r.n elements. */
static inline void tp_raw_copy(void *dst, tp_raw r, size_t elem_size)
{
    if (r.n)
        memcpy(dst, r.data, r.n * elem_size);
}

/* A string borrowed from a header frame: NOT NUL-terminated. An optional
 * key that is absent decodes to ptr NULL (present and empty: ptr non-NULL,
 * len 0); when encoding, an optional string key is written iff ptr != NULL. */
typedef struct tp_str {
    const char *ptr;
    size_t len;
} tp_str;

static inline tp_str tp_str_of(const char *s)
{
    tp_str t = {s, s ? strlen(s) : 0};
    return t;
}

/* Matched stop: a stop string, a token id, or nothing. */
typedef struct tp_matched {
    enum { TP_MATCHED_NONE = 0, TP_MATCHED_STR, TP_MATCHED_ID } kind;
    tp_str str;
    int32_t id;
} tp_matched;

/* Log-probabilities of a column of tokens (TOKEN events, and the SAMPLED /
 * STEP_RESULT / STOP_STEP that carry them there). Frames present iff
 * logprobs.data != NULL: logprobs f32[n] (NaN: this item did not ask),
 * top_ids i32[n * top_n] and top_logprobs f32[n * top_n] (row i = item i's
 * alternatives, most likely first; id -1 / -inf pad a short row). */
typedef struct tp_lp_cols {
    uint32_t top_n;        /* alternatives per item, [0, TP_PROTO_MAX_TOP_LOGPROBS] */
    tp_raw logprobs;
    tp_raw top_ids;
    tp_raw top_logprobs;
} tp_lp_cols;

/* ---- generation parameters (SUBMIT params, SAMPLE_OPEN, STOP_OPEN) ------ */

/* Bits of tp_params.set: which keys were present (decode) / are to be
 * written (encode). Absent keys take the broker's configured defaults. */
enum {
    TP_P_MAX_TOKENS = 1u << 0,
    TP_P_MIN_TOKENS = 1u << 1,
    TP_P_TEMPERATURE = 1u << 2,
    TP_P_TOP_P = 1u << 3,
    TP_P_TOP_K = 1u << 4,
    TP_P_MIN_P = 1u << 5,
    TP_P_REPETITION_PENALTY = 1u << 6,
    TP_P_PRESENCE_PENALTY = 1u << 7,
    TP_P_FREQUENCY_PENALTY = 1u << 8,
    TP_P_SEED = 1u << 9,
    TP_P_STOP = 1u << 10,
    TP_P_STOP_TOKEN_IDS = 1u << 11,
    TP_P_IGNORE_EOS = 1u << 12,
    TP_P_INCLUDE_STOP = 1u << 13,
    TP_P_PENALTY_WINDOW = 1u << 14,
    TP_P_LOGPROBS = 1u << 15,
    TP_P_TOP_LOGPROBS = 1u << 16,
    TP_P_LOGPROBS_MODE = 1u << 17,
    TP_P_TYPICAL_P = 1u << 18,
    TP_P_LOGIT_BIAS = 1u << 19,
    TP_P_TRUNCATE_PROMPT = 1u << 20,
    TP_P_GRAMMAR = 1u << 24,
    TP_P_JSON_SCHEMA = 1u << 25,
    TP_P_JSON_MODE = 1u << 26,
    TP_P_PARSE_TOOL_CALLS = 1u << 21,
    TP_P_PARSE_REASONING = 1u << 22,
    TP_P_PARALLEL_TOOL_CALLS = 1u << 23,
    TP_P_GBNF = 1u << 27,
};

/* params.logit_bias: token id -> bias, as parallel arrays (owned by the
 * decoded tp_msg; ids distinct, each >= 0; values in [-100, 100]). */
typedef struct tp_logit_bias {
    int32_t *ids;
    float *values;
    size_t n;
} tp_logit_bias;

/* logprobs_mode values. */
enum { TP_LPMODE_RAW = 0, TP_LPMODE_PROCESSED = 1 };

/* params.speculative: {mode, n_max} (tokpipe/spec.h); set bits below. */
enum { TP_SPEC_P_MODE = 1u << 0, TP_SPEC_P_N_MAX = 1u << 1 };
typedef struct tp_spec_params {
    uint32_t set;                    /* TP_SPEC_P_* bits; 0 = not given (the config's default) */
    tp_str mode;                     /* "off" | "ngram" | "draft" */
    int32_t n_max;                   /* guesses per verify step, 1..16 */
} tp_spec_params;

typedef struct tp_params {
    uint32_t set;                    /* TP_P_* bits */
    int32_t max_tokens;              /* >= 1 */
    int32_t min_tokens;              /* >= 0, <= max_tokens when both set */
    double temperature;              /* >= 0 (0 = greedy) */
    double top_p;                    /* (0, 1] */
    int32_t top_k;                   /* >= 0 (0 = off) */
    double min_p;                    /* [0, 1] */
    double repetition_penalty;       /* > 0 (1 = off) */
    double presence_penalty;         /* [-2, 2] */
    double frequency_penalty;        /* [-2, 2] */
    int32_t penalty_window;          /* >= 0: last tokens the penalties see (limit: broker) */
    uint64_t seed;
    tp_str *stop;                    /* n_stop non-empty valid UTF-8 strings */
    size_t n_stop;
    int32_t *stop_token_ids;         /* >= 0 each (vocabulary range: broker) */
    size_t n_stop_token_ids;
    bool ignore_eos;
    bool include_stop_str_in_output;
    bool logprobs;                   /* report each accepted token's log-probability */
    int32_t top_logprobs;            /* [0, 20]: and this many alternatives (needs logprobs) */
    tp_str logprobs_mode;            /* "raw" (default) | "processed": tp_params_lpmode */
    double typical_p;                /* (0, 1]; 1 = off */
    tp_logit_bias logit_bias;        /* <= TP_PROTO_MAX_LOGIT_BIAS entries (vocabulary: broker) */
    int32_t truncate_prompt_tokens;  /* >= 1: keep only the last N prompt tokens */
    /* Structured output, at most one of the three (limits: broker). The
     * broker compiles whichever the producer gave (or tool_choice) and
     * sends workers `gbnf` only. */
    tp_str grammar;                  /* GBNF text (llama.cpp's dialect), root rule `root` */
    tp_str gbnf;                     /* workers only (the broker sets it): the GBNF the stages
                                      * apply, what grammar, json_schema, json_mode or tool_choice
                                      * compiled to at admission */
    tp_str grammar_trigger;          /* workers only (the broker sets it for tool_choice auto): the
                                      * grammar applies from the first time the output holds this
                                      * text (or generates the special token it names) on; the
                                      * output before it is free (tp_glazy) */
    tp_str json_schema;              /* a JSON Schema as JSON text */
    bool json_mode;                  /* the output is one JSON object */
    /* How the stop stage splits the output (the broker sets the first two
     * from SUBMIT tools / messages unless the producer did): */
    bool parse_tool_calls;           /* tool-call text becomes FINISH tool_calls, never TOKEN text */
    bool parse_reasoning;            /* <think> text becomes TOKEN reasoning / FINISH reasoning_content */
    bool parallel_tool_calls;        /* default true; false: the job ends after its first call */
    tp_spec_params speculative;      /* speculative decoding: the output is the same either way */
} tp_params;

/* TP_LPMODE_* of p (raw when logprobs_mode is absent). */
int tp_params_lpmode(const tp_params *p);

/* ---- JOB1 messages ------------------------------------------------------ */

/* One function call: of an assistant turn (SUBMIT messages) or parsed
 * from the output (FINISH tool_calls). */
typedef struct tp_tool_call {
    tp_str id;            /* FINISH: unique, non-empty; messages: may be empty */
    tp_str name;          /* non-empty */
    tp_str arguments;     /* JSON text of the arguments (OpenAI's string), may be empty */
} tp_tool_call;

/* One turn of a conversation (SUBMIT and TOKENIZE `messages`). */
typedef struct tp_chat_msg {
    tp_str role;          /* non-empty */
    tp_str content;       /* may be empty (nil and absent read as empty) */
    tp_str name;          /* opt (ptr NULL = absent): a tool turn's function name */
    tp_str tool_call_id;  /* opt: the call a tool turn answers */
    tp_tool_call *tool_calls;   /* an assistant turn's calls */
    size_t n_tool_calls;
} tp_chat_msg;

/* Bytes of text in a conversation's turns (roles, contents, names, calls). */
size_t tp_chat_msgs_bytes(const tp_chat_msg *msgs, size_t n);
/* Deep copy of n turns and tools (ptr NULL = none) into one block: *out
 * (free() it once; the turns, their calls and all strings, each string NUL
 * terminated, live in it) and *tools_out pointing into it. TP_ENOMEM. */
int tp_chat_msgs_dup(const tp_chat_msg *msgs, size_t n, tp_str tools, tp_chat_msg **out, tp_str *tools_out);

typedef struct tp_m_submit {
    tp_str job_id;        /* empty = broker assigns one (returned in ACK) */
    tp_str prompt;        /* text prompt; ptr NULL = absent, then prompt_ids or messages */
    tp_raw prompt_ids;    /* int32 frame F3, present iff prompt and messages are absent, >= 1 id */
    tp_params params;
    bool parse_special;   /* control-token texts in prompt become those tokens */
    tp_chat_msg *messages;   /* a conversation, rendered by the model's chat template */
    size_t n_messages;       /* 0 = absent; exactly one of prompt, prompt_ids, messages */
    tp_str tools;            /* opt, with messages: JSON array of OpenAI tools (the template's `tools`) */
    tp_str tool_choice;      /* opt: "auto" (default) | "none" | "required" | "function" */
    tp_str tool_choice_name; /* tool_choice "function": the function to call */
    tp_str reasoning_effort; /* opt, with messages: "low" | "medium" | "high", the template's
                              * `reasoning_effort` (OpenAI's field; gpt-oss's harmony reads it) */
    tp_str embed;            /* opt: an embedding job, its pooling: "mean" | "last" | "cls" | "model" */
} tp_m_submit;

/* Bits of tp_m_ack.set / tp_m_finish.set for keys whose 0 is a value. */
enum { TP_ACK_SEED = 1u << 0, TP_FIN_GRAMMAR = 1u << 1 };

typedef struct tp_m_ack {   /* ACK and ERROR. status 200: accepted / cancel done; else rejected */
    tp_str job_id;
    tp_str field;         /* the offending field for 400/413, else empty */
    uint32_t set;         /* TP_ACK_SEED: seed is present */
    uint64_t seed;        /* SUBMIT accepted: the job's seed (given, or chosen by the broker) */
    tp_str error_code;    /* opt: TP_CODE_* */
    uint32_t prompt_tokens;   /* with TP_CODE_CONTEXT: the prompt's tokens */
    uint32_t context_length;  /* with TP_CODE_CONTEXT: the model's context */
} tp_m_ack;

typedef struct tp_m_jobref {  /* CANCEL, STATUS */
    tp_str job_id;
} tp_m_jobref;

typedef struct tp_timings {   /* microseconds */
    uint64_t queue_us;    /* submit -> first forward step */
    uint64_t ttft_us;     /* submit -> first accepted token (0: none) */
    uint64_t total_us;    /* submit -> finish */
} tp_timings;

typedef struct tp_m_status_reply {
    tp_str job_id;
    int state;                 /* TP_STATE_* */
    uint32_t prompt_tokens;
    uint32_t completion_tokens;
    uint32_t cached_tokens;    /* prompt tokens taken from a prefix cache (< prompt_tokens) */
    int64_t last_seq;          /* seq of the last event published, -1 none */
    /* Every known job (status 200): what the events up to last_seq carried
     * (running: never bytes the stop stage still holds back; finished: the
     * final result). completion_tokens = tokens.n. */
    tp_str text;               /* the text so far / the final text */
    uint64_t text_len;         /* bytes of that text; > text.len only past TP_PROTO_MAX_TEXT */
    tp_raw tokens;             /* int32 frame F3: completion ids so far / all */
    /* When state == FINISHED: */
    int reason;                /* TP_REASON_* */
    tp_matched matched;
    tp_str job_error;          /* reason error: what went wrong */
    tp_timings timings;
    tp_lp_cols lp;             /* the job asked for logprobs: one row per id of tokens */
    /* Jobs whose output is split: what the events up to last_seq carried
     * (running: the reasoning deltas joined, the calls as their deltas built
     * them; finished: FINISH's). */
    tp_str reasoning_content;  /* opt */
    tp_tool_call *tool_calls;  /* opt */
    size_t n_tool_calls;
} tp_m_status_reply;

typedef struct tp_trigger {    /* how often one stop string / id finished a job */
    tp_matched key;
    uint64_t count;
    bool truncated;            /* key is a prefix of a longer stop string */
} tp_trigger;

/* A latency histogram of STATS (microseconds): buckets[i] counts the
 * samples in (bounds_us[i-1], bounds_us[i]]; the last bucket (i =
 * n_bounds) those above every bound. n_buckets = n_bounds + 1, or both 0
 * (an older broker). */
typedef struct tp_hist {
    uint64_t count;            /* samples */
    uint64_t sum_us;           /* their sum */
    uint64_t *bounds_us;       /* strictly increasing upper bounds */
    size_t n_bounds;
    uint64_t *buckets;         /* per bucket, not cumulative */
    size_t n_buckets;
} tp_hist;

/* The histograms of STATS, in this order (names on the wire). */
enum { TP_HIST_QUEUE = 0, TP_HIST_TTFT, TP_HIST_ITL, TP_HIST_E2E, TP_HIST_COUNT };

typedef struct tp_m_stats_reply {
    uint64_t uptime_ms;
    uint64_t jobs_submitted;       /* SUBMITs seen */
    uint64_t jobs_rejected;        /* ACK status != 200 */
    uint64_t jobs_active;          /* queued + running now */
    uint64_t jobs_finished;
    uint64_t tokens_generated;     /* completion tokens of finished jobs */
    uint64_t events_published;
    uint64_t malformed_front;      /* dropped/ERRORed frontend messages */
    uint64_t malformed_back;       /* dropped backend messages */
    uint64_t malformed_events;     /* dropped event messages (XSUB side) */
    uint64_t workers[5];           /* live workers per stage: tokenize, forward, sample, stop, draft */
    uint64_t finish[TP_REASON_COUNT]; /* finished jobs per reason */
    tp_trigger *triggers;          /* per stop string / stop id */
    size_t n_triggers;
    uint64_t triggers_other;       /* triggers not tracked by key */
    uint64_t forward_steps;        /* STEPs sent to forward workers */
    uint64_t forward_rows;         /* sequences in them (rows per step = the batch) */
    uint64_t forward_tokens;       /* tokens in them (decode + prefill) */
    uint64_t spec_drafted;         /* speculative decoding: guesses verified */
    uint64_t spec_accepted;        /* of those, taken */
    uint64_t spec_verify_steps;    /* verify items (a job's token and its guesses) */
    uint64_t spec_verify_tokens;   /* candidates they gave */
    uint64_t zap_refused;          /* CURVE clients refused by the ZAP handler */
    uint64_t jobs_running;         /* admitted (pinned to workers) now */
    uint64_t jobs_waiting;         /* tokenizing or waiting for admission now */
    uint64_t kv_slots_used;        /* sequences held by forward workers now */
    uint64_t kv_slots_total;       /* their capacity (sum over live forward workers) */
    tp_hist hist[TP_HIST_COUNT];   /* queue time, TTFT, inter-token latency, end-to-end */
    uint64_t workers_lost;         /* registrations lost (dead, hung, disconnected, restarted) */
    uint64_t recovered[4];         /* jobs moved to another worker per stage: tokenize, forward, sample, stop */
    uint64_t recovery_count;       /* recoveries timed: loss -> the job's next event */
    uint64_t recovery_ms_total, recovery_ms_max;
    uint64_t events_duplicate;     /* events dropped because their seq was already forwarded */
    unsigned stages_failed;        /* TP_STAGE_* bits: spawned workers that cannot start, given up */
    uint64_t events_refused;       /* events not from the stop worker their job is pinned to */
    uint64_t jobs_poisoned;        /* jobs ended because workers kept being lost while processing them */
    uint64_t workers_hung;         /* workers lost past their step deadline, or silent while they owed an answer */
    uint64_t replies_refused;      /* answers and heartbeats from a worker registration the broker had dropped */
    /* Prefix cache (PROTOCOL.md STATS_REPLY): counters summed over the
     * forward workers' reports, gauges over the live ones. */
    uint64_t prefix_lookups;       /* prompt chunks offered to a cache */
    uint64_t prefix_hit_tokens;    /* prompt positions taken from a cache */
    uint64_t prefix_prompt_tokens; /* prompt positions asked for (taken + computed): the hit rate's base */
    uint64_t prefix_evictions;     /* cached pages given up for new ones */
    uint64_t prefix_pages_used;    /* KV pages held by running sequences now */
    uint64_t prefix_pages_cached;  /* KV pages in the cache now (held or not) */
    uint64_t prefix_pages_total;   /* KV pages of the pools */
    uint64_t prefix_bytes;         /* bytes of the cached pages */
    uint64_t kv_bytes_held;        /* KV the running sequences hold now (a sliding layer only its window) */
    uint64_t kv_bytes_pool;        /* the live forward workers' KV pools */
} tp_m_stats_reply;

typedef struct tp_m_info_limits {   /* INFO_REPLY limits (the broker's configuration) */
    uint32_t max_tokens, max_prompt_bytes, max_stop_strings, max_stop_len, max_stop_ids;
    uint32_t max_penalty_window, max_concurrent_jobs, max_logit_bias, max_top_logprobs;
    uint32_t max_grammar_bytes, max_grammar_rules, max_grammar_compile_ms, max_schema_bytes, max_schema_depth;
} tp_m_info_limits;

typedef struct tp_m_info_reply {
    tp_str model_id;           /* "" while no model worker is registered */
    uint32_t vocab_size;
    uint32_t context_length;   /* positions per sequence (prompt + completion) */
    int32_t bos_id, eos_id;    /* -1 unknown */
    int32_t *eog_ids;          /* every id that ends generation (EOS included) */
    size_t n_eog_ids;
    tp_raw special_ids;        /* F3, opt: the control / user-defined / unknown tokens (i32) */
    tp_raw special_text;       /* F4: their pieces (u8, tp_proto_special_split) */
    bool chat_template;        /* the model carries a chat template */
    tp_str weight_type;        /* e.g. "f32"; "" unknown */
    tp_m_info_limits limits;
} tp_m_info_reply;

/* ---- EVT1 messages (topic frame = job id) ------------------------------- */


typedef struct tp_m_token {
    tp_str job_id;
    uint32_t seq;          /* per job: 0, 1, 2, ... over TOKEN and FINISH */
    uint32_t index;        /* completion tokens accepted before this event */
    tp_str text;           /* UTF-8 delta, may be empty (held back) */
    tp_str reasoning;      /* opt: delta of the thinking text (params.parse_reasoning) */
    tp_tool_call *tool_calls;  /* opt: call deltas (params.parse_tool_calls): each names its call
                                * by id (and name); arguments is the next fragment of that
                                * call's arguments; a call's first delta is the first with its id */
    size_t n_tool_calls;
    tp_raw ids;            /* int32 frame: accepted token ids */
    tp_lp_cols lp;         /* the job asked for logprobs: one per id */
    uint64_t pin;          /* the STOP_OPEN pin of the publishing worker */
} tp_m_token;

/* The topic of the broker's EVT1 HEARTBEAT. '@' is not a job id character,
 * so no job's topic equals it or starts with it (and a subscription to a
 * job id never matches it). */
#define TP_EVT_HEARTBEAT_TOPIC "@heartbeat"

typedef struct tp_m_beat {     /* EVT1 HEARTBEAT: the broker is alive */
    uint64_t incarnation;  /* random per broker start: a new value = restarted, its jobs are gone */
    uint64_t uptime_ms;
    uint32_t interval_ms;  /* one heartbeat per interval_ms */
    uint32_t liveness;     /* none for interval_ms * liveness: presume the broker dead */
} tp_m_beat;

typedef struct tp_m_finish {
    tp_str job_id;
    uint32_t seq;          /* always the job's last event */
    int reason;            /* TP_REASON_*, never NONE */
    tp_matched matched;    /* stop_string: str; stop_token/eos: id */
    tp_str text;           /* last delta (released hold-back), may be empty */
    tp_str job_error;      /* reason error: message */
    uint32_t prompt_tokens;
    uint32_t completion_tokens;
    uint32_t cached_tokens; /* opt: prompt tokens taken from a prefix cache (< prompt_tokens): the
                            * broker's count, which it writes into the stop worker's FINISH */
    uint32_t draft_tokens;  /* opt: speculative decoding's guesses verified for the job */
    uint32_t draft_accepted; /* opt: of those, taken */
    uint64_t text_len;     /* bytes of the final text */
    tp_timings timings;
    uint32_t set;          /* TP_ACK_SEED: seed is present; TP_FIN_GRAMMAR: grammar_complete is */
    uint64_t seed;         /* the job's seed */
    tp_str error_code;     /* opt: TP_CODE_* (reason error) */
    uint32_t context_length; /* opt: with TP_CODE_CONTEXT or detail "context" */
    tp_str detail;         /* opt, reason length: "context" (the context ran out) or "max_tokens";
                            * reason eos: "grammar" (the job's grammar ended it) */
    bool grammar_complete; /* opt, jobs with a grammar (set has TP_FIN_GRAMMAR): the final text is
                            * a whole sentence of the grammar */
    uint64_t pin;          /* the STOP_OPEN pin of the publishing worker */
    tp_str reasoning_content;  /* opt: the whole thinking text (params.parse_reasoning) */
    tp_tool_call *tool_calls;  /* opt: the calls parsed from the output (params.parse_tool_calls) */
    size_t n_tool_calls;
    bool tool_calls_cut;       /* opt (sent when true): a call is not whole, its arguments what was
                                * generated when the text broke its syntax or the output stopped */
    tp_raw embedding;          /* opt frame F3, an embedding job's: f32[dim], the pooled hidden state */
} tp_m_finish;

/* ---- WRK1 messages ------------------------------------------------------ */

typedef struct tp_m_ready {
    unsigned stages;           /* TP_STAGE_* bits, >= 1 */
    tp_str instance;           /* e.g. "forward.0" */
    uint64_t incarnation;      /* random per process start: a new value = new state */
    uint32_t capacity;         /* sequences/jobs it can hold (forward, stop, sample) */
    uint32_t heartbeat_ms;
    tp_str model_id;           /* "" if the stage needs no model */
    uint32_t vocab_size;
    int32_t bos_id;            /* -1 unknown */
    int32_t eos_id;
    uint32_t seq_len;          /* max positions per sequence (forward) */
    uint32_t max_batch_tokens; /* tokens per STEP (forward) */
    /* optional, for INFO (absent = unknown) */
    int32_t *eog_ids;          /* ids that end generation */
    size_t n_eog_ids;
    tp_raw special_ids;        /* F3, opt: control tokens (i32) */
    tp_raw special_text;       /* F4: their pieces (u8, tp_proto_special_split) */
    bool chat_template;
    tp_str tool_syntax;        /* the template's tool-call family (tp_tc_family_name), with chat_template */
    bool think_open;           /* ... and its generation prompt opens the thinking (DeepSeek R1) */
    tp_str weight_type;
} tp_m_ready;

typedef struct tp_m_welcome {
    uint64_t incarnation;      /* broker's */
    uint32_t heartbeat_ms;
    uint32_t liveness;         /* missed intervals before a peer is dead */
    uint32_t worker_no;
} tp_m_welcome;

typedef struct tp_m_heartbeat {
    uint64_t progress;         /* steps/tasks completed (stuck detection) */
    uint32_t inflight;
} tp_m_heartbeat;

typedef struct tp_m_disconnect {
    tp_str reason;
} tp_m_disconnect;

typedef struct tp_m_tokenize {
    uint32_t slot;
    tp_str text;
    bool add_bos;         /* add BOS/EOS as the vocabulary asks (add_bos_token/add_eos_token) */
    bool parse_special;   /* control-token texts become those tokens */
    tp_chat_msg *messages;   /* n_messages > 0: render these with the chat template */
    size_t n_messages;       /* instead of text (then empty) */
    tp_str tools;            /* opt: JSON array, the template's `tools` */
    tp_str reasoning_effort; /* opt: the template's `reasoning_effort` (SUBMIT's) */
} tp_m_tokenize;

typedef struct tp_m_tokenized {
    uint32_t slot;
    tp_raw ids;                /* int32 frame, present iff status 200 */
    int32_t *stop_ids;         /* rendered messages: the template's end-of-turn ids, */
    size_t n_stop_ids;         /* for the job's stop_token_ids */
} tp_m_tokenized;

typedef struct tp_m_slot {     /* SEQ_OPEN, SEQ_CLOSE, SAMPLE_CLOSE, DRAFT_CLOSE */
    uint32_t slot;
    uint32_t pool;             /* SEQ_OPEN opt: an embedding job's pooling, TP_POOL_* of model.h or
                                * TP_POOL_MODEL (0: none, a generating job) */
} tp_m_slot;

/* STEP item flags (u8 column). */
enum {
    TP_ITEM_OUTPUT = 1u << 0,  /* produce logits (or a candidate) after the item's last token */
    TP_ITEM_EMBED = 1u << 1,   /* an embedding job's last chunk: its pooled vector in EMBEDDED */
    TP_ITEM_VERIFY = 1u << 2,  /* speculative decoding: output after every token of the item */
};

/* SUBMIT embed as SEQ_OPEN pool: "mean" 1, "cls" 2, "last" 3 (TP_POOL_*
 * of model.h), "model" TP_POOL_MODEL (the model's own); -1 none of them. */
#define TP_POOL_MODEL 4
int tp_pool_parse(tp_str s);

typedef struct tp_m_embedded {
    uint64_t step;             /* the STEP it answers (its STEP_RESULT follows) */
    uint32_t n;                /* items that asked for their embedding, in STEP order */
    uint32_t dim;              /* floats per embedding */
    tp_raw slots;              /* u32[n] */
    tp_raw embd;               /* f32[n*dim]: each the pooled final-normed hidden state */
} tp_m_embedded;

typedef struct tp_m_step {
    uint64_t step;
    uint32_t n;                /* items */
    uint32_t n_tokens;         /* sum of ntok */
    bool sample;               /* fused: return candidates, not logits */
    tp_raw slots;              /* u32[n] */
    tp_raw pos;                /* u32[n] position of the item's first token */
    tp_raw ntok;               /* u32[n] >= 1 */
    tp_raw flags;              /* u8[n] TP_ITEM_* */
    tp_raw tokens;             /* i32[n_tokens], items' tokens concatenated */
    tp_raw accepted;           /* i32[n] token accepted since the last sample of
                                * the slot, -1 none (used when sample) */
} tp_m_step;

typedef struct tp_m_step_result {
    uint64_t step;
    uint32_t n;                /* items that asked for output, in STEP order */
    uint32_t vocab;            /* logits per item (0 when sampled) */
    bool sampled;
    tp_raw slots;              /* u32[n] */
    tp_raw out;                /* f32[n*vocab] logits, or i32[n] candidates */
    tp_lp_cols lp;             /* sampled only: the candidates' logprobs */
    int32_t *cached_slots;     /* opt: slots of this step's items that took cached positions */
    size_t n_cached_slots;
    int32_t *cached;           /* opt: how many each took (parallel to cached_slots) */
    size_t n_cached;
    uint64_t *cache;           /* opt: the worker's prefix cache now, TP_CACHE_* */
    size_t n_cache;
} tp_m_step_result;

/* Indexes of STEP_RESULT `cache` (a forward worker's prefix cache). */
enum {
    TP_CACHE_LOOKUPS = 0, TP_CACHE_HIT_TOKENS, TP_CACHE_PROMPT_TOKENS, TP_CACHE_EVICTIONS, TP_CACHE_PAGES_USED,
    TP_CACHE_PAGES_CACHED, TP_CACHE_PAGES_TOTAL, TP_CACHE_PAGE_BYTES,
    TP_CACHE_KV_HELD, TP_CACHE_KV_POOL, /* the worker's KV: bytes its open sequences hold, bytes of its pools */
    TP_CACHE_COUNT
};

typedef struct tp_m_sample_open {
    uint32_t slot;
    tp_params params;          /* sampling keys + min_tokens */
    int32_t *ban_ids;          /* never sampled while fewer than min_tokens are
                                * accepted (EOS + stop ids) */
    size_t n_ban_ids;
    tp_raw context;            /* i32 frame: prompt (+ accepted) ids for penalties */
    tp_raw replay;             /* i32 frame, optional: candidates to accept before the first
                                * draw (rebuilding a lost sampler; empty for a new job) */
} tp_m_sample_open;

typedef struct tp_m_sample {
    uint64_t step;
    uint32_t n;
    uint32_t vocab;
    tp_raw slots;              /* u32[n] */
    tp_raw index;              /* u32[n] completion tokens accepted so far */
    tp_raw accepted;           /* i32[n] accepted since the last SAMPLE, -1 none */
    tp_raw logits;             /* f32[n*vocab] */
    tp_raw guess;              /* i32[n] or absent: the token fed after row i's position (a verify
                                * item's next row of the same slot follows while the candidate
                                * equals it), -1 none */
} tp_m_sample;

typedef struct tp_m_sampled {
    uint64_t step;
    uint32_t n;
    tp_raw slots;              /* u32[n] */
    tp_raw candidates;         /* i32[n] */
    tp_lp_cols lp;             /* the candidates' logprobs (jobs that asked) */
} tp_m_sampled;

typedef struct tp_m_stop_open {
    uint32_t slot;
    tp_str job_id;
    tp_params params;          /* stop keys + min/max_tokens */
    uint32_t prompt_tokens;
    int32_t prev_token;        /* last prompt id (BOS leading-space rule), -1 none */
    uint32_t next_seq;         /* first event seq to publish (0; > 0 on rebuild) */
    uint64_t t_submit_us;      /* CLOCK_REALTIME of SUBMIT */
    uint64_t t_start_us;       /* CLOCK_REALTIME of the first forward step */
    tp_raw replay;             /* i32 frame: accepted ids to re-feed silently */
    uint32_t context_length;   /* opt: max_tokens was lowered to fit this context */
    uint64_t pin;              /* random, nonzero: echoed in every event of the job, so the
                                * broker believes only the worker the job is pinned to */
} tp_m_stop_open;

typedef struct tp_m_stop_close {
    uint32_t slot;
    int finish;                /* NONE: just free; CANCELLED / ERROR: publish FINISH */
    tp_str job_error;
} tp_m_stop_close;

typedef struct tp_m_stop_step {
    uint64_t step;
    uint32_t n;
    tp_raw slots;              /* u32[n] */
    tp_raw candidates;         /* i32[n] */
    tp_lp_cols lp;             /* the candidates' logprobs, passed on to TOKEN */
    int32_t *draft_tokens;     /* opt: per row, the job's guesses verified so far (speculative decoding) */
    size_t n_draft_tokens;
    int32_t *draft_accepted;   /* opt: per row, of those, taken */
    size_t n_draft_accepted;
} tp_m_stop_step;

/* DRAFT: per item (a job, by slot), the draft worker's sequence of the
 * job is kept up to pos and ntok tokens are fed after it; then k guesses
 * follow greedily (argmax of the draft model). */
#define TP_PROTO_MAX_DRAFT 16      /* guesses per item (spec.h TP_SPEC_MAX_DRAFT) */
typedef struct tp_m_draft {
    uint32_t n;                /* items */
    uint32_t n_tokens;         /* sum of ntok */
    tp_raw slots;              /* u32[n], each once */
    tp_raw pos;                /* u32[n] position of the item's first token */
    tp_raw ntok;               /* u32[n] >= 1 */
    tp_raw k;                  /* u32[n] guesses wanted, 1..TP_PROTO_MAX_DRAFT */
    tp_raw tokens;             /* i32[n_tokens], items' tokens concatenated */
} tp_m_draft;

typedef struct tp_m_drafted {
    uint32_t n;                /* items, in DRAFT order */
    tp_raw slots;              /* u32[n] */
    tp_raw ngot;               /* u32[n] guesses of the item, 0..its k (0: the worker could not) */
    tp_raw guesses;            /* i32[sum ngot], items' guesses concatenated */
} tp_m_drafted;

typedef struct tp_m_verdicts {
    uint64_t step;
    uint32_t n;
    tp_raw slots;              /* u32[n] */
    tp_raw accepted;           /* u8[n] 1 = the candidate entered the sequence */
    tp_raw finish;             /* u8[n] TP_REASON_* (NONE = goes on) */
} tp_m_verdicts;

/* ---- one message -------------------------------------------------------- */

typedef struct tp_msg {
    tp_family family;
    uint8_t cmd;
    uint64_t req;          /* JOB1: client-chosen, echoed in the reply (0 = none) */
    uint64_t task;         /* WRK1 stage messages: broker-chosen, echoed in the reply */
    uint32_t status;       /* replies: TP_ST_*; on decode failure: the status to reply with */
    tp_str error;          /* replies with status != 200: message naming the field */
    tp_str topic;          /* EVT1 decode: the topic frame (= job id); encode: ignored */
    union {
        tp_m_submit submit;
        tp_m_ack ack;
        tp_m_jobref jobref;
        tp_m_status_reply status_reply;
        tp_m_stats_reply stats_reply;
        tp_m_info_reply info_reply;
        tp_m_token token;
        tp_m_finish finish;
        tp_m_beat beat;
        tp_m_ready ready;
        tp_m_welcome welcome;
        tp_m_heartbeat heartbeat;
        tp_m_disconnect disconnect;
        tp_m_tokenize tokenize;
        tp_m_tokenized tokenized;
        tp_m_slot slot;
        tp_m_step step;
        tp_m_step_result step_result;
        tp_m_embedded embedded;
        tp_m_sample_open sample_open;
        tp_m_sample sample;
        tp_m_sampled sampled;
        tp_m_stop_open stop_open;
        tp_m_stop_close stop_close;
        tp_m_stop_step stop_step;
        tp_m_verdicts verdicts;
        tp_m_draft draft;
        tp_m_drafted drafted;
    };
    char bad_field[TP_PROTO_MAX_NAME + 1]; /* decode failure: the offending field path, or "" */
    void *owned_;          /* decoder allocations; freed by tp_msg_clear */
} tp_msg;

/* Zero m and set family and cmd, ready to fill and encode. */
void tp_msg_init(tp_msg *m, tp_family family, uint8_t cmd);

/* tp_msg_init for the reply to req: same family, req's task id, the given
 * status and error (borrowed: NUL-terminated or NULL). */
void tp_msg_init_reply(tp_msg *r, const tp_msg *req, uint8_t cmd, uint32_t status, const char *error);

/* Free what the decoder allocated in m (NULL ok); m is zeroed. */
void tp_msg_clear(tp_msg *m);

/* Name of a command in a family ("SUBMIT", ...), "?" if unknown. */
const char *tp_cmd_name(tp_family family, uint8_t cmd);

/* Decode one message of the given family. frames[0] is F0 (for EVT1:
 * frames[0] is the topic and frames[1] is F0). On success fills *out (which
 * borrows from frames, see above; call tp_msg_clear when done) and returns
 * 0. On failure returns TP_EFORMAT / TP_ERANGE / TP_ENOTFOUND / TP_ENOMEM
 * with err naming the frame or field, and still fills out->family, cmd,
 * req/task when they could be read, and out->status with the status a
 * broker should answer (400, 413, 501, 505). out needs tp_msg_clear either
 * way. */
int tp_proto_decode(tp_family family, const tp_frame *frames, size_t n_frames, tp_msg *out,
                    tp_err *err);

/* An encoded message: frames to send in order (SNDMORE on all but the
 * last). Frame data points into w's own header buffer and into the payload
 * arrays of the encoded tp_msg (borrowed: keep them alive until sent). */
typedef struct tp_wire {
    size_t n;
    tp_frame f[TP_PROTO_MAX_FRAMES + 1];
    char *buf;             /* owned: the command byte then the msgpack header */
} tp_wire;

/* Encode m (validated like a decode would: an invalid message is an error
 * naming the field, so a peer never receives what we would reject). On
 * success *w holds the frames; free with tp_wire_free. For EVT1 the first
 * frame is the topic (= job id). */
int tp_proto_encode(const tp_msg *m, tp_wire *w, tp_err *err);

void tp_wire_free(tp_wire *w);

/* The wire's rule for the float generation parameter `key` ("top_p", ...)
 * applied to v, so a command line refuses exactly what SUBMIT refuses, with
 * the same message: v and (float)v must both be in the parameter's range.
 * On success *out = (float)v. */
int tp_proto_param_float(const char *key, double v, float *out, tp_err *err);

/* Check that s (len bytes) is a valid job id: 1..TP_PROTO_MAX_JOB_ID bytes
 * of [A-Za-z0-9._:-]. */
bool tp_job_id_valid(const char *s, size_t len);

/* true if the bytes are valid UTF-8 (no surrogates, no overlongs). */
bool tp_proto_utf8_valid(const char *s, size_t len);

/* A vocabulary's special tokens (READY, INFO_REPLY) travel as two payload
 * frames, so that how many there may be is bounded by the vocabulary
 * (ascending ids below TP_PROTO_MAX_VOCAB), not by what one header holds:
 * special_ids (i32, strictly ascending) and special_text, for each id in
 * order its piece as one length byte (0..TP_PROTO_MAX_NAME) then that many
 * bytes of UTF-8. Check the pair (special_text absent = no ids); with
 * pieces non-NULL (ids.n entries) point each piece into text (borrowed as
 * text is). */
int tp_proto_special_split(tp_raw ids, tp_raw text, tp_str *pieces, tp_err *err);

#endif
