/* bin/tokpipe-http internals: the state shared by the HTTP side
 * (libmicrohttpd's one internal epoll thread, server.c) and the broker side
 * (one thread owning every ZeroMQ socket, bridge.c).
 *
 * Threads: MHD's thread decodes requests and hands a gw_call to the bridge
 * through an inbox (gw.lock + an eventfd the bridge polls), then suspends
 * the connection. The bridge submits the jobs, follows their events,
 * writes the response (a whole body, or SSE bytes) into the call under
 * gw.lock and resumes the connection. Fields say who may touch them. A
 * call is freed by whichever side lets go last (refs, under gw.lock). */
#ifndef TOKPIPE_HTTP_GW_H
#define TOKPIPE_HTTP_GW_H

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lp.h"
#include "oai.h"
#include "tokpipe/buf.h"
#include "tokpipe/config.h"
#include "tokpipe/protocol.h"

struct MHD_Connection;
struct MHD_Daemon;

typedef enum { GW_CALL_COMPLETION, GW_CALL_HEALTH, GW_CALL_METRICS } gw_call_kind;

/* The endpoints /metrics counts responses of (the label endpoint=). */
typedef enum {
    GW_EP_COMPLETIONS,
    GW_EP_CHAT,
    GW_EP_MESSAGES,
    GW_EP_COUNT_TOKENS,
    GW_EP_RESPONSES,           /* POST /v1/responses, GET and DELETE /v1/responses/{id} */
    GW_EP_EMBEDDINGS,
    GW_EP_MODELS,
    GW_EP_HEALTH,
    GW_EP_METRICS,
    GW_EP_OTHER,
    GW_EP_COUNT
} gw_endpoint;

/* Streamed content blocks (APIs that stream by blocks: Anthropic). */
typedef enum { GW_BLK_NONE, GW_BLK_THINKING, GW_BLK_TEXT, GW_BLK_TOOL } gw_block;

/* One job of a completion: choice `index` of the response. Bridge only. */
typedef struct gw_choice {
    char job_id[TP_PROTO_MAX_JOB_ID + 1];
    size_t prompt;             /* index into oreq.prompts */
    bool acked, finished;
    uint32_t next_seq;
    tp_buf text;               /* non-streaming: the text so far */
    uint32_t prompt_tokens, completion_tokens;
    uint32_t cached_tokens; /* of the prompt, taken from a prefix cache (FINISH) */
    uint32_t draft_tokens, draft_accepted; /* speculative decoding's guesses, verified and taken (FINISH) */
    int reason;                /* TP_REASON_* once finished */
    tp_matched matched;        /* matched.str points into matched_buf */
    char *matched_buf;
    char *error;               /* reason error: what went wrong */
    const char *rejected;      /* FINISH error_code of the client's error found after the ACK
                                * (TP_CODE_CONTEXT, TP_CODE_PROMPT_SIZE): a 400 with that code; else NULL */
    bool started;              /* its first event (TOKEN or a FINISH) came */
    uint64_t seed;             /* the seed its first ACK reported (seeded), resubmitted with the job */
    bool seeded;
    uint32_t skip;             /* after a resubmission: events of seq < skip were forwarded already */
    bool resubmitted;          /* submitted again to a broker that took over (or restarted) */
    int64_t resend_ms;         /* SUBMIT again at this time (a passive or not yet ready broker); 0 = no */
    int64_t sent_ms;           /* its last SUBMIT */
    gw_lp lp;                  /* the request asked for logprobs: its tokens */
    size_t lp_sent;            /* streaming: entries [0, lp_sent) are out */
    bool constrained;          /* FINISH said grammar_complete (a job with a grammar) */
    bool grammar_complete;     /* ... and the text is a whole document of it */
    tp_buf reasoning;          /* the thinking text (TOKEN reasoning deltas, then FINISH's whole) */
    size_t reasoning_sent;     /* streaming: bytes of it already out */
    struct cJSON *tool_calls;  /* FINISH tool_calls in OpenAI's shape, NULL none */
    bool tool_calls_cut;       /* FINISH tool_calls_cut: a call is not whole */
    struct gw_scall {          /* streaming: the calls whose first chunk is out, in index order */
        char *id;
        size_t sent;           /* bytes of its arguments out */
        size_t block;          /* APIs that stream by blocks: the call's block index */
    } *scalls;
    size_t n_scalls, cap_scalls;
    gw_block blk;              /* streaming by blocks: the open block (GW_BLK_NONE: none) */
    size_t blk_at;             /* ... its index */
    size_t n_blk;              /* blocks started */
    uint64_t n_events;         /* streaming: events out (APIs that number them: sequence_number) */
    size_t text_item, reasoning_item;  /* streaming by items (Responses): output index + 1, 0 = none yet */
    float *embd;               /* an embedding job: FINISH's vector (n_embd floats), NULL none */
    size_t n_embd;
} gw_choice;

struct gw_call;
struct gw;

/* One API the gateway speaks: how its answers look. The bridge runs every
 * call's jobs the same way whatever its API and hands the results to
 * these; each returns a malloc'd NUL-terminated string (NULL: out of
 * memory, or nothing to send where noted). The stream functions may keep
 * per-choice state in the choice (blk, scalls[].block). */
typedef struct gw_api {
    const char *path;          /* "/v1/chat/completions": POST only */
    gw_endpoint endpoint;
    /* the request body as the job it asks for (as oai_decode: 0, or -1 with
     * e naming the field in this API's terms) */
    int (*decode)(const char *body, size_t len, oai_request *out, oai_error *e);
    /* when set, used in place of decode: a request that refers to the
     * gateway's state (a stored response's conversation) */
    int (*decode_in)(struct gw *g, const char *body, size_t len, oai_request *out, oai_error *e);
    const char *id_prefix;     /* of the response id: "cmpl-", "chatcmpl-", "msg_" */
    /* an error body; code a string code (context_length_exceeded) or NULL */
    char *(*error)(int status, const char *message, const char *param, const char *code);
    /* the same as the SSE bytes that end a stream whose 200 is out */
    char *(*stream_error)(int status, const char *message, const char *param);
    /* the request's name of a SUBMIT field ("params.stop[1]" -> "stop[1]") */
    void (*param)(const char *field, char *out, size_t cap);
    /* the whole answer once every choice finished (not streaming) */
    char *(*body)(const struct gw_call *c, const char *model);
    /* streaming: the first events once the 200 is decided (NULL: none) */
    char *(*open)(struct gw_call *c, const char *model);
    /* choice i's text delta with its logprobs entries [lp_from, lp_to) */
    char *(*text)(struct gw_call *c, const char *model, size_t i, const char *text, size_t len, size_t lp_from,
                  size_t lp_to);
    /* choice i's thinking delta */
    char *(*reasoning)(struct gw_call *c, const char *model, size_t i, const char *s, size_t len);
    /* choice i's call k: its start (id given, args "") or a fragment of its arguments (id NULL) */
    char *(*call)(struct gw_call *c, const char *model, size_t i, size_t k, const char *id, size_t id_len,
                  const char *name, size_t name_len, const char *args, size_t args_len);
    /* choice i finished (its finish fields are set) */
    char *(*finish)(struct gw_call *c, const char *model, size_t i);
    /* every choice finished: the stream's last bytes */
    char *(*close)(struct gw_call *c, const char *model);
    /* optional: every choice finished, not streaming: 0, or the 4xx of a
     * request the results show wrong (message and param filled) */
    int (*refuse)(const struct gw_call *c, char *msg, size_t msg_cap, char *param, size_t param_cap);
} gw_api;

/* openai.c, anthropic.c; server.c routes by gw_apis (NULL-terminated):
 * an API is its file and its lines there */
extern const gw_api gw_api_completions, gw_api_chat, gw_api_messages, gw_api_count_tokens, gw_api_responses,
    gw_api_embeddings;
extern const gw_api *const gw_apis[];

typedef struct gw_call {
    /* set by the HTTP side before it is queued, then read-only */
    struct gw *g;
    gw_call_kind kind;
    const gw_api *api;         /* completions: the API it answers in */
    oai_request oreq;
    char id[48];               /* "cmpl-..." / "chatcmpl-..." / "msg_..." */
    int64_t created;           /* unix seconds */
    struct MHD_Connection *conn;
    int client_fd;             /* polled for a hang-up while suspended */
    uint64_t no;               /* unique per gateway run */

    /* bridge only */
    gw_choice *ch;
    size_t n_ch;
    size_t n_acked, n_finished, n_started;
    bool replied;              /* status/body (or the stream's start) handed over */
    bool cancelled;            /* CANCELs sent for its jobs */
    bool watch_fd;
    int64_t deadline_ms;       /* ACK / STATS reply wait */
    bool waiting;              /* queued until the broker's first heartbeat */
    int stats_left;            /* STATS replies to come (a standby pair: one from each broker) */

    /* shared: under gw.lock */
    int status;                /* HTTP status of the answer, 0 = not known yet */
    char *body;                /* whole body (JSON or text), NULL while streaming */
    size_t body_len;
    const char *content_type;
    int retry_after;           /* seconds, 0 = no Retry-After header */
    tp_buf out;                /* streaming: SSE bytes not yet read by MHD */
    size_t out_off;
    bool out_done;             /* streaming: nothing more after out */
    bool suspended;            /* the connection waits for the bridge */
    bool http_done;            /* MHD finished with the connection */
    int refs;
    struct gw_call *next;      /* inbox link */
} gw_call;

/* Counters of the gateway itself (under gw.lock), shown in /metrics. */
typedef struct gw_counters {
    uint64_t requests[GW_EP_COUNT][6];   /* by endpoint and status class: 2xx..5xx at [2..5] */
    uint64_t client_gone;      /* completions whose client left early */
    uint64_t streams_resumed;  /* streams whose jobs were resubmitted after a lost broker */
    uint64_t jobs_resubmitted; /* jobs submitted again (same id and seed) after a lost broker */
} gw_counters;

typedef struct gw {
    const tp_config *cfg;
    const char *model_name;
    const tp_tokenizer *tok;   /* the model's vocabulary: token text for logprobs; NULL unreadable */
    const char *tok_error;     /* why tok is NULL */
    char **api_keys;           /* NULL = no key needed */
    size_t n_api_keys;

    pthread_mutex_t lock;
    gw_call *inbox, *inbox_tail;   /* calls for the bridge */
    int wake_fd;                   /* eventfd: inbox non-empty or quit */
    bool stopping;                 /* refuse new work (503) */
    int open_calls;                /* calls whose connection MHD still serves */
    gw_counters counters;
    uint64_t next_call_no;

    struct gw_rstore *responses;   /* stored /v1/responses (rstore.c: its own lock) */

    int64_t started;               /* unix seconds: the model's "created" in /v1/models */
    volatile sig_atomic_t quit;
    struct MHD_Daemon *mhd;
} gw;

/* An Anthropic Messages request body (count: POST /v1/messages/count_tokens)
 * as the chat job the same conversation asks for at /v1/chat/completions
 * (anthropic.c; gw_api_messages.decode); as oai_decode, the error naming
 * the field in Anthropic's terms. */
int gw_anthropic_decode(bool count, const char *body, size_t len, oai_request *out, oai_error *e);

/* Stored responses (rstore.c): at most max_count of them and max_bytes of
 * their texts, the least recently used (stored or read) going first; one
 * lock of its own, so either thread may call. NULL from new: out of memory. */
typedef struct gw_rstore gw_rstore;
gw_rstore *gw_rstore_new(size_t max_count, size_t max_bytes);
void gw_rstore_free(gw_rstore *s);
/* Copies id, the response object and the conversation (JSON texts) in,
 * replacing one of the same id; one larger than max_bytes is not kept.
 * Returns 0, or -1 out of memory. */
int gw_rstore_put(gw_rstore *s, const char *id, const char *response, const char *conversation);
/* Copies of the stored texts (caller frees; either out may be NULL): true
 * when id is stored, and it becomes the most recently used. */
bool gw_rstore_get(gw_rstore *s, const char *id, char **response, char **conversation);
/* true when id was stored (and is no more). */
bool gw_rstore_delete(gw_rstore *s, const char *id);
/* How many are stored and their bytes (for tests and /metrics). */
void gw_rstore_usage(gw_rstore *s, size_t *count, size_t *bytes);

/* GET or DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items
 * (path: what follows "/v1/responses/"; responses.c): the body (malloc'd,
 * NULL out of memory) and its status (404 none such, 405 another method). */
char *gw_responses_stored(gw *g, const char *method, const char *path, int *status);

/* Take a reference off a call; frees it at zero. Caller holds gw.lock. */
void gw_call_unref(gw_call *c);

/* Give c to the bridge (adds its reference). Returns -1 when stopping. */
int gw_submit_call(gw *g, gw_call *c);

/* The bridge thread: runs until g->quit, then fails what is left. */
void *gw_bridge_main(void *arg);

/* HTTP side: start/stop libmicrohttpd on cfg's http.listen:http.port. */
int gw_server_start(gw *g, tp_err *err);
void gw_server_stop(gw *g);

/* Bodies (render.c). Each returns a malloc'd NUL-terminated string or NULL
 * (out of memory). */
char *gw_error_json(int status, const char *message, const char *param);
/* The same with a string code (OpenAI's "context_length_exceeded") in
 * place of the status number; code NULL: the status number. */
char *gw_error_json_code(int status, const char *message, const char *param, const char *code);
char *gw_models_json(const char *model, int64_t created);
char *gw_completion_json(const gw_call *c, const char *model);
/* One SSE event ("data: {...}\n\n") for choice i: a text delta with the
 * logprobs entries [lp_from, lp_to) of its tokens (when asked for), or
 * (final) its finish_reason / stop_reason. */
char *gw_chunk_sse(const gw_call *c, const char *model, size_t i, const char *text, size_t len, size_t lp_from,
                   size_t lp_to, bool final);
char *gw_usage_sse(const gw_call *c, const char *model);
/* A chat SSE event for choice i with delta {reasoning_content} (len bytes). */
char *gw_delta_sse(const gw_call *c, const char *model, size_t i, const char *reasoning, size_t len);
/* A chat SSE event for choice i with delta {tool_calls: [{index, ...}]} as
 * OpenAI streams calls: a call's first chunk {index, id, type: "function",
 * function: {name, arguments: ""}} (id given), then {index, function:
 * {arguments: fragment}} (id NULL). */
char *gw_call_sse(const gw_call *c, const char *model, size_t i, size_t index, const char *id, size_t id_len,
                  const char *name, size_t name_len, const char *args, size_t args_len);
/* The finish_reason of choice ch: "tool_calls" when it ended for its calls,
 * each whole (tp_reason_ends_in_calls: a length finish stays "length"). */
const char *gw_choice_finish(const gw_choice *ch);
char *gw_health_json(const tp_m_stats_reply *s, int *status);
char *gw_metrics_text(const tp_m_stats_reply *s, const gw_counters *gc);
/* The endpoint label of /metrics ("/v1/chat/completions", "other"). */
const char *gw_endpoint_name(gw_endpoint ep);
const char *gw_finish_reason(int reason);

#endif
