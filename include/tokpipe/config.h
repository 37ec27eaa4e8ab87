/* tokpipe.yaml: the deployment's configuration, loaded with libyaml.
 *
 * tp_config is a plain value struct (not opaque): every program reads many
 * fields and none of them changes after loading. The defaults (documented
 * key by key in config/tokpipe.yaml) come from tp_config_defaults(); a file
 * overrides any subset. Unknown keys, duplicate keys, wrong types and values
 * out of range are errors naming the key and the line:
 *   "config/tokpipe.yaml:12: batching.max_num_seqs: 0 is outside [1, 4096]".
 *
 * Ownership: the strings in a tp_config are owned by it; tp_config_free
 * releases them (and accepts a zeroed or NULL config). */
#ifndef TOKPIPE_CONFIG_H
#define TOKPIPE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokpipe/error.h"

#define TP_CONFIG_DEFAULT_PATH "config/tokpipe.yaml"
#define TP_CONFIG_MAX_GROUPS 8  /* worker process kinds (fused stage sets) */
/* workers.forward_threads upper bound: forward.h's TP_FORWARD_MAX_THREADS
 * (config does not link the forward library; test_config checks they agree) */
#define TP_CONFIG_MAX_FORWARD_THREADS 256

/* The pipeline stages, as indexes: the four every job goes through, and
 * the draft stage of speculative decoding (a draft model's guesses; its
 * workers load speculative.draft_model, and a job goes on without them). */
enum { TP_SI_TOKENIZE = 0, TP_SI_FORWARD, TP_SI_SAMPLE, TP_SI_STOP, TP_SI_DRAFT, TP_SI_COUNT };

/* One kind of worker process the daemon spawns: a set of stages served by
 * one process (one stage unless fused), and how many such processes. */
typedef struct tp_worker_group {
    unsigned stages;   /* bit (1u << TP_SI_*) per stage */
    int count;
} tp_worker_group;

typedef struct tp_config {
    char *source;            /* file it came from, "(defaults)" otherwise */
    char *runtime_dir;       /* resolved: never empty after tp_config_resolve */

    /* endpoints: resolved to ipc://<runtime_dir>/<name>.sock when empty */
    char *ep_front;          /* producers (ROUTER) */
    char *ep_back;           /* workers (ROUTER) */
    char *ep_events;         /* subscribers (XPUB) */
    char *ep_publish;        /* stop workers' PUB -> broker XSUB */

    char *model_path;
    char *tokenizer_path;
    char *chat_template_path;   /* "" = tokenizer.chat_template of the GGUF vocabulary/model */

    /* workers */
    char *worker_binary;     /* "" = tokpipe-worker next to the running program */
    int stage_count[TP_SI_COUNT];
    char **fuse;             /* e.g. {"forward,sample"}: stages run in one process */
    size_t n_fuse;
    int forward_threads;     /* 0 = the CPUs the worker's affinity mask allows */
    int forward_kernel;      /* tp_fwd_kernel: 0 invariant (default), 1 openblas */
    int respawn_init_ms, respawn_max_ms;

    /* batching and the KV pool (per forward worker) */
    int max_num_seqs;
    int max_batch_tokens;
    int prefill_chunk;
    int micro_batches;
    bool decode_ahead;       /* feed a candidate before its stop verdict (see sched.c) */
    int spec_mode;           /* speculative.mode: a job's default (tp_spec_mode: off, ngram, draft) */
    int spec_n_max;          /* speculative.n_max: guesses per verify step, 1..16 */
    char *spec_draft_model;  /* speculative.draft_model: "" = none (draft jobs are refused) */
    int spec_draft_timeout_ms; /* speculative.draft_timeout_ms: a step waits this long for its guesses */
    int kv_slots;
    int kv_max_pos;          /* 0 = the model's seq_len */
    int kv_type;             /* tp_kv_type: 0 f32 (default), 1 f16 */
    bool prefix_cache;       /* keep prompts' KV pages for later jobs (forward.h) */
    int prefix_cache_extra_mb; /* memory for cached pages beyond the pool's (0: the pool's free pages only) */

    /* generation defaults (used for keys a SUBMIT leaves out) */
    int32_t def_max_tokens;
    double def_temperature, def_top_p, def_min_p;
    int32_t def_top_k;
    double def_repetition_penalty, def_presence_penalty, def_frequency_penalty;
    int32_t def_penalty_window;   /* tokens the penalties look back over */

    /* limits */
    int32_t max_tokens_limit;
    int32_t max_penalty_window;   /* largest penalty_window a SUBMIT may ask for */
    int max_concurrent_jobs;
    int64_t finished_ttl_ms;
    int64_t max_msg_bytes;
    int max_prompt_bytes;
    int max_stop_strings, max_stop_len, max_stop_ids;
    int sndhwm, linger_ms;
    int events_sndhwm;        /* per-subscriber queue on the events socket */
    /* structured output (grammar.*): GBNF / JSON Schema limits */
    int grammar_max_bytes, grammar_max_rules, grammar_max_compile_ms, grammar_max_states, grammar_mask_cache_mb;
    int schema_max_bytes, schema_max_depth;

    /* liveness */
    int heartbeat_ms, liveness;
    int reconnect_init_ms, reconnect_max_ms;
    int drain_timeout_ms;
    int recovery_deadline_ms;     /* a job waits this long for a worker of a stage it lost */
    int step_timeout_s;           /* a worker owing an answer to a task this long (or step_timeout_factor
                                   * times its stage's usual answer time, if longer) is lost: hung */
    int step_timeout_factor;

    /* security (zsec.h): CURVE on tcp endpoints; key paths, "" = unset */
    bool curve;
    char *server_secret_key;   /* broker */
    char *server_public_key;   /* clients and workers (the broker checks it) */
    char *authorized_keys;     /* broker: public keys admitted in both roles */
    char *client_keys;         /* broker: keys admitted on front + events */
    char *worker_keys;         /* broker: keys admitted on back + publish */
    char *client_secret_key;   /* clients and workers */

    /* standby: a Binary Star pair of brokers (daemon/standby.c) */
    int standby_role;          /* TP_STANDBY_NONE, _PRIMARY, _BACKUP */
    char *standby_state;       /* this broker's state endpoint (PUB, bound) */
    char *standby_peer_state;  /* the peer's state endpoint (SUB, connected) */
    int standby_failover_ms;   /* the backup takes over after this long without the primary, on a client request */
    char *peer_front, *peer_back, *peer_events, *peer_publish;   /* the peer broker's endpoints ("" = none):
                                                                 * clients and workers try them second */

    /* http: the OpenAI-compatible gateway (bin/tokpipe-http) */
    bool http_enabled;         /* tokpiped spawns and supervises the gateway */
    char *http_listen;         /* IPv4 address to bind, e.g. "127.0.0.1" */
    int http_port;
    char *http_api_key_file;   /* "" = no Authorization required */
    char *http_model_name;     /* id in /v1/models; "" = model file's base name */
    int http_max_connections;
    int http_max_body_bytes;
    int http_timeout_ms;       /* broker reply wait before answering 503 */
    int http_responses_max_count;  /* stored /v1/responses kept (LRU), 0 = none */
    int http_responses_max_bytes;  /* ... and their bytes in all */
} tp_config;

enum { TP_STANDBY_NONE = 0, TP_STANDBY_PRIMARY, TP_STANDBY_BACKUP };
extern const char *const tp_config_standby_roles[];   /* "none", "primary", "backup" */

/* Fill *cfg with the built-in defaults (no file read; endpoints empty until
 * tp_config_resolve). Returns TP_ENOMEM or 0. */
int tp_config_defaults(tp_config *cfg, tp_err *err);

/* Defaults overridden by the YAML file at path, then resolved. On failure
 * *cfg is freed and zeroed and err names the file, line and key. */
int tp_config_load(const char *path, tp_config *cfg, tp_err *err);

/* How every program finds its configuration: the file at path when given,
 * else TP_CONFIG_DEFAULT_PATH when readable, else the built-in defaults
 * (resolved). *used (may be NULL) gets the file read, or NULL. */
int tp_config_find(const char *path, tp_config *cfg, const char **used, tp_err *err);

/* The same from a YAML text in memory (name is used in error messages). */
int tp_config_parse(const char *yaml, size_t len, const char *name, tp_config *cfg, tp_err *err);

/* Fill empty runtime_dir ($RUNTIME_DIRECTORY, else /tmp/tokpipe-$UID) and
 * empty endpoints (ipc://<runtime_dir>/{front,back,events,publish}.sock);
 * checks ipc paths fit the 107-byte socket path limit. Idempotent. */
int tp_config_resolve(tp_config *cfg, tp_err *err);

/* The worker process kinds to spawn, from stage counts and fuse lists:
 * each fuse entry is one group (its stages' counts must agree), every other
 * stage with count > 0 is its own group; the draft stage only with a
 * speculative.draft_model. Returns the number of groups. */
int tp_config_groups(const tp_config *cfg, tp_worker_group *out, int cap);

/* Parse a stage list "forward,sample" into bits (1u << TP_SI_*); TP_EINVAL
 * naming the bad word. */
int tp_config_parse_stages(const char *list, unsigned *bits, tp_err *err);

/* The names workers.forward_kernel accepts, indexed by tp_fwd_kernel value
 * ("invariant", "openblas"), NULL-terminated. */
extern const char *const tp_config_kernel_names[];

/* The names kv.kv_type accepts, indexed by tp_kv_type value ("f32",
 * "f16"), NULL-terminated. */
extern const char *const tp_config_kv_type_names[];
extern const char *const tp_config_spec_mode_names[];

/* "tokenize", "forward", "sample", "stop", "draft" for an index. */
const char *tp_config_stage_name(int si);

void tp_config_free(tp_config *cfg);

/* Where every string setting of cfg lives (source included): fills out[]
 * with up to cap pointers to them; returns how many there are. */
size_t tp_config_strings(tp_config *cfg, char **out[], size_t cap);

#endif
