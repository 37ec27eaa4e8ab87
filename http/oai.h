/* The OpenAI request bodies the gateway accepts, decoded into SUBMIT
 * parameters: JSON in, tp_params + prompts out, or an error naming the
 * field in OpenAI's terms. No sockets, no HTTP: this is the decoder the
 * fuzz target (fuzz/fuzz_oai_request.c) drives.
 *
 * Fields: model, prompt (string, array of strings, array of token ids,
 * array of arrays of token ids), messages (chat: role + content turns, the
 * content a string, null or a list of text parts; assistant turns may carry
 * tool_calls, tool turns tool_call_id and name), max_tokens
 * / max_completion_tokens, temperature, top_p, top_k (-1 = off), min_p,
 * repetition_penalty, presence_penalty, frequency_penalty, stop (string or
 * array), stop_token_ids, seed, n, stream, stream_options.include_usage,
 * user, ignore_eos, min_tokens, include_stop_str_in_output, logit_bias,
 * typical_p, truncate_prompt_tokens, tools, tool_choice (none / auto /
 * required / a named function, the last two held to a call by the
 * broker's grammar), parallel_tool_calls, logprobs (completions: 0..5
 * alternatives; chat: a boolean) and top_logprobs (chat, 0..20, needs
 * logprobs: true), response_format ({type: text | json_object |
 * json_schema, json_schema: {name, schema, strict, description}}), and
 * llama.cpp server's grammar (GBNF text) and json_schema (a schema object;
 * {} = any JSON value); one constraint per request. OpenAI fields tokpipe does not
 * implement here are accepted only at their neutral value (echo false,
 * best_of null or n, suffix null); any other key is refused naming it, so a typo never silently
 * becomes a default. */
#ifndef TOKPIPE_HTTP_OAI_H
#define TOKPIPE_HTTP_OAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokpipe/protocol.h"

#define OAI_MAX_N 128          /* choices per prompt */
#define OAI_MAX_PROMPTS 256    /* prompts in one request */
#define OAI_MAX_CHOICES 1024   /* prompts x n: jobs one request may start */
#define OAI_MAX_MESSAGES TP_PROTO_MAX_MESSAGES
#define OAI_MAX_LEGACY_LOGPROBS 5                        /* /v1/completions logprobs: N (OpenAI's cap) */
#define OAI_MAX_CHAT_TOP_LOGPROBS TP_PROTO_MAX_TOP_LOGPROBS  /* chat top_logprobs */

typedef enum { OAI_COMPLETIONS = 0, OAI_CHAT } oai_kind;

typedef struct oai_prompt {
    char *text;          /* NUL-terminated prompt text, or NULL: ids */
    size_t text_len;
    int32_t *ids;        /* token ids when text is NULL (>= 1) */
    size_t n_ids;
} oai_prompt;

typedef struct oai_request {
    oai_kind kind;
    char *model;             /* as given, or NULL */
    oai_prompt *prompts;     /* completions: >= 1; chat: none */
    size_t n_prompts;
    int n;                   /* choices per prompt, >= 1 */
    bool stream;
    bool include_usage;      /* stream_options.include_usage */
    bool logprobs;           /* logprobs asked for (params.logprobs set to match) */
    int top_logprobs;        /* alternatives per token (completions: logprobs: N) */
    bool has_seed;           /* params.seed is choice 0's; choice j gets seed + j */
    tp_params params;        /* stop strings owned by the request */
    tp_chat_msg *messages;   /* chat: the turns (every string owned by the request) */
    size_t n_messages;
    /* the output constraint, at most one (owned by the request; params point
     * at them): response_format json_object -> json_mode, json_schema ->
     * json_schema (the schema as JSON text), llama.cpp's `grammar` (GBNF) and
     * `json_schema` fields */
    char *grammar;
    char *json_schema;
    bool json_mode;
    char constraint_param[32];   /* the request field that gave it, for errors */
    tp_str tools;            /* chat: the tools array's JSON text as sent (owned), ptr NULL = none */
    char *tool_choice;       /* "none" | "auto" | "required" | "function" (NULL: not given) */
    char *tool_choice_name;  /* tool_choice "function": the function's name */
    char *reasoning_effort;  /* chat: "low" | "medium" | "high" (NULL: not given), the template's */
    const char *embed;       /* an embedding request: SUBMIT embed, the pooling (static), NULL none */
    char *api_state;         /* what a translating API keeps of its own request for its
                              * answers (JSON text, owned; NULL none: oai_decode sets none) */
} oai_request;

typedef struct oai_error {
    int status;              /* HTTP status: 400, 413 */
    char param[64];          /* OpenAI field name ("top_p", "stop[2]"), "" none */
    char message[512];
} oai_error;

/* Decode one request body (len bytes, need not be NUL-terminated). On
 * success fills *out (free with oai_request_free) and returns 0; on failure
 * returns -1 with *e naming the field; *out is then empty. */
int oai_decode(oai_kind kind, const char *body, size_t len, oai_request *out, oai_error *e);

/* e filled (status, param, the message from fmt) for a refusal; -1. The
 * other API translators refuse with it too. */
int oai_fail(oai_error *e, int status, const char *param, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

void oai_request_free(oai_request *r);

/* The OpenAI parameter name for a SUBMIT field path from the broker or the
 * encoder ("params.top_p" -> "top_p", "prompt_ids" -> "prompt"); writes a
 * NUL-terminated name into out. */
void oai_param_of_field(const char *field, char *out, size_t cap);

#endif
