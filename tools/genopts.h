/* Generation flags shared by `tokpipe run` (in-process) and `tokpipe
 * generate` (through the daemon), so both accept exactly the same options
 * with the same defaults and the same error messages. */
#ifndef TOKPIPE_TOOLS_GENOPTS_H
#define TOKPIPE_TOOLS_GENOPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "tokpipe/error.h"
#include "tokpipe/protocol.h"

#define GENOPTS_MAX_PROMPTS 256
#define GENOPTS_MAX_MESSAGES 1024
#define GENOPTS_MAX_STOPS 1024

/* The valued flags, in the order genopts_parse_one knows them; bit 1 << f
 * of genopts.given says flag f was on the command line. */
typedef enum genopt_flag {
    GO_PROMPT, GO_MAX_TOKENS, GO_MIN_TOKENS, GO_TEMPERATURE, GO_TOP_P, GO_TOP_K, GO_MIN_P,
    GO_REPETITION_PENALTY, GO_PRESENCE_PENALTY, GO_FREQUENCY_PENALTY, GO_SEED, GO_STOP, GO_STOP_ID,
    GO_PENALTY_WINDOW, GO_TOP_LOGPROBS, GO_LOGPROBS_MODE, GO_LOGIT_BIAS, GO_TYPICAL_P, GO_TRUNCATE_PROMPT,
} genopt_flag;

#define GENOPTS_MAX_BIAS 1024   /* --logit-bias entries (= the wire's TP_PROTO_MAX_LOGIT_BIAS) */

typedef struct genopts {
    uint32_t given;   /* 1 << genopt_flag of each flag given */
    const char *prompts[GENOPTS_MAX_PROMPTS];
    size_t n_prompts;
    int32_t max_tokens;
    int32_t min_tokens;
    float temperature;
    float top_p;
    int32_t top_k;
    float min_p;
    float repetition_penalty;
    float presence_penalty;
    float frequency_penalty;
    int32_t penalty_window;
    uint64_t seed;
    const char *stops[GENOPTS_MAX_STOPS];
    size_t n_stops;
    int32_t stop_ids[GENOPTS_MAX_STOPS];
    size_t n_stop_ids;
    bool ignore_eos;
    bool include_stop;
    bool json;
    bool logprobs;
    int32_t top_logprobs;      /* [0, 20] */
    bool lp_processed;         /* --logprobs-mode processed */
    float typical_p;
    int32_t bias_ids[GENOPTS_MAX_BIAS];
    float bias_values[GENOPTS_MAX_BIAS];
    size_t n_bias;
    int32_t truncate_prompt_tokens; /* 0 = keep the whole prompt */
    bool parse_special;   /* control-token texts in the prompt become those tokens */
    /* --message ROLE=TEXT / --messages FILE: one conversation, rendered by
     * the model's chat template (instead of --prompt) */
    tp_chat_msg messages[GENOPTS_MAX_MESSAGES];
    size_t n_messages;
    void *messages_json;  /* cJSON of --messages FILE (the strings point into it) */
    /* structured output, at most one: --grammar FILE (GBNF), --json-schema
     * FILE (a JSON Schema), --json-mode; the files' text, malloc'd */
    char *grammar;
    size_t grammar_len;
    char *json_schema;
    size_t json_schema_len;
    bool json_mode;
    /* --tools FILE (an OpenAI tools array) and --tool-choice */
    tp_str tools;
    tp_str reasoning_effort;  /* a conversation object's "reasoning_effort" (the template's), ptr NULL none */
    const char *tool_choice;       /* NULL | "none" | "auto" | "required" | "function" */
    const char *tool_choice_name;  /* tool_choice "function" */
    bool one_call;                 /* --no-parallel-tool-calls: the job ends after its first call */
    /* --speculative MODE, --draft-max N, --draft-model FILE (tokpipe/spec.h):
     * the output is the same either way, only faster */
    int spec_mode;                 /* tp_spec_mode; TP_SPEC_OFF unless given */
    bool spec_given;               /* --speculative was given (generate: else the daemon's default) */
    int32_t spec_n_max;            /* 1..TP_SPEC_MAX_DRAFT; 0 = the default */
    const char *draft_model;
    void **owned;                  /* what the above point into (freed by genopts_free) */
    size_t n_owned;
} genopts;

/* Defaults: max_tokens 256, temperature 1.0, top_p 1.0, top_k 0 (off),
 * min_p 0, penalties off over a 64-token window, seed from the clock unless
 * --seed is given. */
void genopts_init(genopts *o);

/* If argv[*i] is a generation flag, consume it (and its value) advancing *i
 * and return 1; return 0 if it is not one of ours; on a bad value return
 * TP_EINVAL with err naming the flag. */
int genopts_parse_one(genopts *o, int argc, char **argv, int *i, tp_err *err);

/* The option lines for a --help text. */
void genopts_print_help(FILE *out);

/* An OpenAI-shaped conversation in JSON text: [turns] or {"messages":
 * [turns], "tools": [...]} (tools kept as their exact text), as --messages
 * reads a file. */
int genopts_conversation(genopts *o, const char *text, size_t len, tp_err *err);

/* Free what parsing allocated (the --messages file). */
void genopts_free(genopts *o);

/* The GBNF the job is constrained by: --grammar's text, or --json-schema /
 * --json-mode compiled to GBNF (malloc'd, caller frees); NULL and 0 when
 * none is asked for. Errors name the flag. */
int genopts_gbnf(const genopts *o, char **gbnf, tp_err *err);

/* Check the prompt flags together: exactly one of --prompt and
 * --message/--messages (what a command needs); --tools/--tool-choice only
 * with a conversation. */
int genopts_check_prompt(const genopts *o, tp_err *err);

#endif
