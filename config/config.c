/* tokpipe.yaml loader: libyaml document tree walked against one key table. */
#include "tokpipe/config.h"
#include "tokpipe/limits.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <yaml.h>

enum kind { K_INT, K_I64, K_DBL, K_STR, K_STRLIST, K_BOOL, K_ENUM };

/* One leaf key. Ranges are inclusive; doubles use dmin/dmax; an enum is
 * stored as the int index of its name in names. */
struct key {
    const char *path;
    enum kind kind;
    size_t off;
    int64_t min, max;
    double dmin, dmax;
    const char *const *names;
};

/* Config knows the kernel names, not the forward library (tokpiped does not
 * link it); test_config checks they are tp_fwd_kernel_parse's. */
const char *const tp_config_kernel_names[] = {"invariant", "openblas", NULL};
const char *const tp_config_kv_type_names[] = {"f32", "f16", NULL};
/* tp_spec_mode's names, in its order (test_config checks them) */
const char *const tp_config_spec_mode_names[] = {"off", "ngram", "draft", NULL};
const char *const tp_config_standby_roles[] = {"none", "primary", "backup", NULL};

#define OFF(f) offsetof(tp_config, f)
#define KI(p, f, lo, hi) {p, K_INT, OFF(f), lo, hi, 0, 0, NULL}
#define KL(p, f, lo, hi) {p, K_I64, OFF(f), lo, hi, 0, 0, NULL}
#define KD(p, f, lo, hi) {p, K_DBL, OFF(f), 0, 0, lo, hi, NULL}
#define KS(p, f) {p, K_STR, OFF(f), 0, 0, 0, 0, NULL}
#define KB(p, f) {p, K_BOOL, OFF(f), 0, 0, 0, 0, NULL}
#define KE(p, f, names) {p, K_ENUM, OFF(f), 0, 0, 0, 0, names}

static const struct key keys[] = {
    KS("runtime_dir", runtime_dir),
    KS("endpoints.front", ep_front),
    KS("endpoints.back", ep_back),
    KS("endpoints.events", ep_events),
    KS("endpoints.publish", ep_publish),
    KS("model.path", model_path),
    KS("model.tokenizer", tokenizer_path),
    KS("model.chat_template", chat_template_path),
    KS("workers.binary", worker_binary),
    KI("workers.tokenize", stage_count[TP_SI_TOKENIZE], 0, 64),
    KI("workers.forward", stage_count[TP_SI_FORWARD], 0, 64),
    KI("workers.sample", stage_count[TP_SI_SAMPLE], 0, 64),
    KI("workers.stop", stage_count[TP_SI_STOP], 0, 64),
    KI("workers.draft", stage_count[TP_SI_DRAFT], 0, 64),
    {"workers.fuse", K_STRLIST, OFF(fuse), 0, TP_CONFIG_MAX_GROUPS, 0, 0, NULL},
    KI("workers.forward_threads", forward_threads, 0, TP_CONFIG_MAX_FORWARD_THREADS),
    KE("workers.forward_kernel", forward_kernel, tp_config_kernel_names),
    KI("workers.respawn_init_ms", respawn_init_ms, 10, 600000),
    KI("workers.respawn_max_ms", respawn_max_ms, 10, 3600000),
    KI("batching.max_num_seqs", max_num_seqs, 1, 4096),
    KI("batching.max_batch_tokens", max_batch_tokens, 1, 65536),
    KI("batching.prefill_chunk", prefill_chunk, 1, 65536),
    KI("batching.micro_batches", micro_batches, 1, 8),
    KB("batching.decode_ahead", decode_ahead),
    KE("speculative.mode", spec_mode, tp_config_spec_mode_names),
    KI("speculative.n_max", spec_n_max, 1, 16),
    KS("speculative.draft_model", spec_draft_model),
    KI("speculative.draft_timeout_ms", spec_draft_timeout_ms, 1, 600000),
    KI("kv.slots", kv_slots, 1, 4096),
    KI("kv.max_pos", kv_max_pos, 0, 1 << 20),
    KE("kv.kv_type", kv_type, tp_config_kv_type_names),
    KB("kv.prefix_cache", prefix_cache),
    KI("kv.prefix_cache_extra_mb", prefix_cache_extra_mb, 0, 1 << 20),
    KI("generation.max_tokens", def_max_tokens, 1, INT32_MAX),
    KD("generation.temperature", def_temperature, 0, 1e6),
    KD("generation.top_p", def_top_p, 1e-300, 1),
    KI("generation.top_k", def_top_k, 0, INT32_MAX),
    KD("generation.min_p", def_min_p, 0, 1),
    KD("generation.repetition_penalty", def_repetition_penalty, 1e-300, 1e6),
    KD("generation.presence_penalty", def_presence_penalty, -2, 2),
    KD("generation.frequency_penalty", def_frequency_penalty, -2, 2),
    KI("generation.penalty_window", def_penalty_window, 0, TP_SAMPLER_MAX_PENALTY_WINDOW),
    KI("limits.max_tokens", max_tokens_limit, 1, INT32_MAX),
    KI("limits.max_penalty_window", max_penalty_window, 0, TP_SAMPLER_MAX_PENALTY_WINDOW),
    KI("limits.max_concurrent_jobs", max_concurrent_jobs, 1, 1 << 20),
    KL("limits.finished_ttl_ms", finished_ttl_ms, 0, INT64_C(1) << 40),
    KL("limits.max_msg_bytes", max_msg_bytes, 4096, INT64_C(1) << 32),
    KI("limits.max_prompt_bytes", max_prompt_bytes, 1, 1 << 20),
    KI("limits.max_stop_strings", max_stop_strings, 0, 4096),
    KI("limits.max_stop_len", max_stop_len, 1, 65535),
    KI("limits.max_stop_ids", max_stop_ids, 0, 4096),
    KI("grammar.max_bytes", grammar_max_bytes, 16, 1 << 20),
    KI("grammar.max_rules", grammar_max_rules, 1, 1 << 20),
    KI("grammar.max_compile_ms", grammar_max_compile_ms, 1, 600000),
    KI("grammar.max_states", grammar_max_states, 16, 1 << 24),
    KI("grammar.mask_cache_mb", grammar_mask_cache_mb, 0, 1 << 16),
    KI("grammar.max_schema_bytes", schema_max_bytes, 2, 1 << 20),
    KI("grammar.max_schema_depth", schema_max_depth, 1, 1024),
    KI("limits.sndhwm", sndhwm, 0, 1 << 24),
    KI("limits.events_sndhwm", events_sndhwm, 1, 1 << 20),
    KI("limits.linger_ms", linger_ms, 0, 600000),
    KI("heartbeat.interval_ms", heartbeat_ms, 10, 600000),
    KI("heartbeat.liveness", liveness, 2, 100),
    KI("heartbeat.reconnect_init_ms", reconnect_init_ms, 1, 600000),
    KI("heartbeat.reconnect_max_ms", reconnect_max_ms, 1, 3600000),
    KI("shutdown.drain_timeout_ms", drain_timeout_ms, 0, 3600000),
    KI("recovery.deadline_ms", recovery_deadline_ms, 0, 3600000),
    KI("recovery.step_timeout_s", step_timeout_s, 1, 86400),
    KI("recovery.step_timeout_factor", step_timeout_factor, 2, 10000),
    KB("security.curve", curve),
    KS("security.server_secret_key", server_secret_key),
    KS("security.server_public_key", server_public_key),
    KS("security.authorized_keys", authorized_keys),
    KS("security.client_keys", client_keys),
    KS("security.worker_keys", worker_keys),
    KS("security.client_secret_key", client_secret_key),
    KE("standby.role", standby_role, tp_config_standby_roles),
    KS("standby.state", standby_state),
    KS("standby.peer_state", standby_peer_state),
    KI("standby.failover_ms", standby_failover_ms, 100, 600000),
    KS("standby.peer_front", peer_front),
    KS("standby.peer_back", peer_back),
    KS("standby.peer_events", peer_events),
    KS("standby.peer_publish", peer_publish),
    KB("http.enabled", http_enabled),
    KS("http.listen", http_listen),
    KI("http.port", http_port, 1, 65535),
    KS("http.api_key_file", http_api_key_file),
    KS("http.model_name", http_model_name),
    KI("http.max_connections", http_max_connections, 1, 65536),
    KI("http.max_body_bytes", http_max_body_bytes, 1024, 64 << 20),
    KI("http.timeout_ms", http_timeout_ms, 100, 600000),
    KI("http.responses_max_count", http_responses_max_count, 0, 1 << 20),
    KI("http.responses_max_bytes", http_responses_max_bytes, 0, 1 << 30),
};
#define N_KEYS (sizeof keys / sizeof keys[0])

static const char *const stage_names[TP_SI_COUNT] = {"tokenize", "forward", "sample", "stop", "draft"};

const char *tp_config_stage_name(int si)
{
    return si >= 0 && si < TP_SI_COUNT ? stage_names[si] : "?";
}

static int set_str(char **dst, const char *s, tp_err *err)
{
    char *c = strdup(s);
    if (!c)
        return tp_err_set(err, TP_ENOMEM, "config: out of memory");
    free(*dst);
    *dst = c;
    return 0;
}

/* Every string of a tp_config with its default: the one list that
 * defaults, free and tp_config_strings walk. */
static const struct { size_t off; const char *v; } str_fields[] = {
    {OFF(source), "(defaults)"}, {OFF(runtime_dir), ""}, {OFF(ep_front), ""},
    {OFF(ep_back), ""}, {OFF(ep_events), ""}, {OFF(ep_publish), ""},
    {OFF(model_path), "../shared/models/stories260K.bin"},
    {OFF(tokenizer_path), "../shared/models/tok512.bin"}, {OFF(chat_template_path), ""}, {OFF(worker_binary), ""},
    {OFF(server_secret_key), ""}, {OFF(server_public_key), ""}, {OFF(authorized_keys), ""},
    {OFF(client_secret_key), ""}, {OFF(client_keys), ""}, {OFF(worker_keys), ""},
    {OFF(standby_state), ""}, {OFF(standby_peer_state), ""}, {OFF(peer_front), ""}, {OFF(peer_back), ""},
    {OFF(peer_events), ""}, {OFF(peer_publish), ""},
    {OFF(http_listen), "127.0.0.1"}, {OFF(http_api_key_file), ""}, {OFF(http_model_name), ""},
    {OFF(spec_draft_model), ""},
};
#define N_STRS (sizeof str_fields / sizeof str_fields[0])

size_t tp_config_strings(tp_config *cfg, char **out[], size_t cap)
{
    for (size_t i = 0; i < N_STRS && i < cap; i++)
        out[i] = (char **)((char *)cfg + str_fields[i].off);
    return N_STRS;
}

int tp_config_defaults(tp_config *cfg, tp_err *err)
{
    memset(cfg, 0, sizeof *cfg);
    for (size_t i = 0; i < N_STRS; i++)
        if (set_str((char **)((char *)cfg + str_fields[i].off), str_fields[i].v, err)) {
            tp_config_free(cfg);
            return TP_ENOMEM;
        }
    for (int s = 0; s < TP_SI_COUNT; s++)
        cfg->stage_count[s] = 1;
    cfg->forward_threads = 0;
    cfg->respawn_init_ms = 250;
    cfg->respawn_max_ms = 30000;
    cfg->max_num_seqs = 64;
    cfg->max_batch_tokens = 512;
    cfg->prefill_chunk = 128;
    cfg->micro_batches = 2;
    cfg->decode_ahead = true;
    cfg->spec_mode = 0;
    cfg->spec_n_max = 8;
    cfg->spec_draft_timeout_ms = 200;
    cfg->kv_slots = 64;
    cfg->kv_max_pos = 0;
    cfg->prefix_cache = true;
    cfg->prefix_cache_extra_mb = 0;
    cfg->def_max_tokens = 256;
    cfg->def_temperature = 1.0;
    cfg->def_top_p = 1.0;
    cfg->def_top_k = 0;
    cfg->def_min_p = 0.0;
    cfg->def_repetition_penalty = 1.0;
    cfg->def_penalty_window = TP_SAMPLER_DEFAULT_PENALTY_WINDOW;
    cfg->max_tokens_limit = 4096;
    cfg->max_penalty_window = 4096;
    cfg->max_concurrent_jobs = 256;
    cfg->finished_ttl_ms = 300000;
    cfg->max_msg_bytes = 64 << 20;
    cfg->max_prompt_bytes = 1 << 20;
    cfg->max_stop_strings = 1024;
    cfg->max_stop_len = 1024;
    cfg->max_stop_ids = 1024;
    cfg->grammar_max_bytes = TP_GRAMMAR_DEFAULT_MAX_BYTES;
    cfg->grammar_max_rules = TP_GRAMMAR_DEFAULT_MAX_RULES;
    cfg->grammar_max_compile_ms = TP_GRAMMAR_DEFAULT_COMPILE_MS;
    cfg->grammar_max_states = TP_GRAMMAR_DEFAULT_MAX_STATES;
    cfg->grammar_mask_cache_mb = TP_GRAMMAR_DEFAULT_MASK_MB;
    cfg->schema_max_bytes = 256 * 1024;
    cfg->schema_max_depth = 64;
    cfg->sndhwm = 100000;
    cfg->events_sndhwm = 10000;
    cfg->linger_ms = 1000;
    cfg->heartbeat_ms = 1000;
    cfg->liveness = 3;
    cfg->reconnect_init_ms = 100;
    cfg->reconnect_max_ms = 8000;
    cfg->drain_timeout_ms = 10000;
    cfg->standby_failover_ms = 2000;
    cfg->http_enabled = true;
    cfg->http_port = 8080;
    cfg->http_max_connections = 256;
    cfg->http_max_body_bytes = 8 << 20;
    cfg->http_timeout_ms = 10000;
    cfg->http_responses_max_count = 1024;
    cfg->http_responses_max_bytes = 64 << 20;
    cfg->recovery_deadline_ms = 30000;
    cfg->step_timeout_s = 30;
    cfg->step_timeout_factor = 20;
    return 0;
}

void tp_config_free(tp_config *cfg)
{
    if (!cfg)
        return;
    char **strs[N_STRS];
    tp_config_strings(cfg, strs, N_STRS);
    for (size_t i = 0; i < N_STRS; i++)
        free(*strs[i]);
    for (size_t i = 0; i < cfg->n_fuse; i++)
        free(cfg->fuse[i]);
    free(cfg->fuse);
    memset(cfg, 0, sizeof *cfg);
}

/* ---- walking the document ---------------------------------------------- */

struct walk {
    yaml_document_t *doc;
    tp_config *cfg;
    const char *name;
    tp_err *err;
};

static int line_of(const yaml_node_t *n)
{
    return (int)n->start_mark.line + 1;
}

static int fail(struct walk *w, const yaml_node_t *n, int code, const char *path, const char *what)
{
    return tp_err_set(w->err, code, "%s:%d: %s: %s", w->name, line_of(n), path, what);
}

static const struct key *find_key(const char *path)
{
    for (size_t i = 0; i < N_KEYS; i++)
        if (!strcmp(keys[i].path, path))
            return &keys[i];
    return NULL;
}

static bool is_section(const char *path)
{
    size_t n = strlen(path);
    for (size_t i = 0; i < N_KEYS; i++)
        if (!strncmp(keys[i].path, path, n) && keys[i].path[n] == '.')
            return true;
    return false;
}

static const char *scalar(const yaml_node_t *n)
{
    return (const char *)n->data.scalar.value;
}

static bool plain_null(const yaml_node_t *n)
{
    const char *s = scalar(n);
    return n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
           (!*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL"));
}

static int set_int(struct walk *w, const struct key *k, const yaml_node_t *n)
{
    const char *s = scalar(n);
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    char msg[160];
    if (n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE || !*s || *end || errno) {
        snprintf(msg, sizeof msg, "'%.60s' is not an integer", s);
        return fail(w, n, TP_EINVAL, k->path, msg);
    }
    if (v < k->min || v > k->max) {
        snprintf(msg, sizeof msg, "%lld is outside [%lld, %lld]", v, (long long)k->min, (long long)k->max);
        return fail(w, n, TP_ERANGE, k->path, msg);
    }
    if (k->kind == K_INT)
        *(int *)((char *)w->cfg + k->off) = (int)v;
    else
        *(int64_t *)((char *)w->cfg + k->off) = v;
    return 0;
}

static int set_dbl(struct walk *w, const struct key *k, const yaml_node_t *n)
{
    const char *s = scalar(n);
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    char msg[160];
    if (n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE || !*s || *end || errno || !isfinite(v)) {
        snprintf(msg, sizeof msg, "'%.60s' is not a number", s);
        return fail(w, n, TP_EINVAL, k->path, msg);
    }
    /* the engine computes in float32 (PROTOCOL.md "Header rules"): a value is checked as written
     * and as the float it becomes, or a default the wire refuses would fail every job */
    double f = (double)(float)v;
    bool bad32 = f < k->dmin || f > k->dmax || isinf(f);
    if (v < k->dmin || v > k->dmax || bad32) {
        int at = k->dmin > 0 && k->dmin < 1e-200 ? snprintf(msg, sizeof msg, "%g is outside (0, %g]", v, k->dmax)
                                                 : snprintf(msg, sizeof msg, "%g is outside [%g, %g]", v, k->dmin,
                                                            k->dmax);
        if (bad32 && !(v < k->dmin || v > k->dmax))
            snprintf(msg + at, sizeof msg - (size_t)at, " as a 32-bit float (it becomes %g)", f);
        return fail(w, n, TP_ERANGE, k->path, msg);
    }
    *(double *)((char *)w->cfg + k->off) = v;
    return 0;
}

/* YAML 1.2 core schema booleans only: "yes"/"on" are strings there. */
static int set_bool(struct walk *w, const struct key *k, const yaml_node_t *n)
{
    const char *s = scalar(n);
    bool v;
    if (n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
        (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "TRUE")))
        v = true;
    else if (n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
             (!strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "FALSE")))
        v = false;
    else {
        char msg[160];
        snprintf(msg, sizeof msg, "'%.60s' is not true or false", s);
        return fail(w, n, TP_EINVAL, k->path, msg);
    }
    *(bool *)((char *)w->cfg + k->off) = v;
    return 0;
}

static int set_enum(struct walk *w, const struct key *k, const yaml_node_t *n)
{
    const char *s = scalar(n);
    for (int i = 0; k->names[i]; i++)
        if (n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE && !strcmp(s, k->names[i])) {
            *(int *)((char *)w->cfg + k->off) = i;
            return 0;
        }
    char msg[160], *at = msg;
    at += snprintf(msg, sizeof msg, "'%.60s' is not one of", s);
    for (int i = 0; k->names[i]; i++)
        at += snprintf(at, sizeof msg - (size_t)(at - msg), "%s %s", i ? "," : "", k->names[i]);
    return fail(w, n, TP_EINVAL, k->path, msg);
}

static int set_strlist(struct walk *w, const struct key *k, const yaml_node_t *n)
{
    if (n->type != YAML_SEQUENCE_NODE)
        return fail(w, n, TP_EINVAL, k->path, "expected a list of strings");
    size_t cnt = (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
    if (cnt > (size_t)k->max)
        return fail(w, n, TP_ERANGE, k->path, "too many entries");
    char **list = calloc(cnt ? cnt : 1, sizeof *list);
    if (!list)
        return tp_err_set(w->err, TP_ENOMEM, "config: out of memory");
    for (size_t i = 0; i < cnt; i++) {
        yaml_node_t *it = yaml_document_get_node(w->doc, n->data.sequence.items.start[i]);
        if (!it || it->type != YAML_SCALAR_NODE || !(list[i] = strdup(scalar(it)))) {
            for (size_t j = 0; j < i; j++)
                free(list[j]);
            free(list);
            return it && it->type != YAML_SCALAR_NODE
                       ? fail(w, it, TP_EINVAL, k->path, "entries must be strings")
                       : tp_err_set(w->err, TP_ENOMEM, "config: out of memory");
        }
    }
    for (size_t i = 0; i < w->cfg->n_fuse; i++)
        free(w->cfg->fuse[i]);
    free(w->cfg->fuse);
    w->cfg->fuse = list;
    w->cfg->n_fuse = cnt;
    return 0;
}

static int set_leaf(struct walk *w, const struct key *k, const yaml_node_t *n)
{
    if (k->kind == K_STRLIST)
        return set_strlist(w, k, n);
    if (n->type != YAML_SCALAR_NODE)
        return fail(w, n, TP_EINVAL, k->path, "expected a single value, not a list or mapping");
    switch (k->kind) {
    case K_INT:
    case K_I64:
        return set_int(w, k, n);
    case K_DBL:
        return set_dbl(w, k, n);
    case K_BOOL:
        return set_bool(w, k, n);
    case K_ENUM:
        return set_enum(w, k, n);
    default:
        return set_str((char **)((char *)w->cfg + k->off), plain_null(n) ? "" : scalar(n), w->err);
    }
}

static int walk_map(struct walk *w, const yaml_node_t *map, const char *prefix);

static int walk_pair(struct walk *w, const yaml_node_pair_t *p, const char *prefix)
{
    yaml_node_t *kn = yaml_document_get_node(w->doc, p->key);
    yaml_node_t *vn = yaml_document_get_node(w->doc, p->value);
    if (!kn || !vn || kn->type != YAML_SCALAR_NODE)
        return tp_err_set(w->err, TP_EINVAL, "%s:%d: keys must be plain strings", w->name,
                          kn ? line_of(kn) : 0);
    char path[256];
    if ((size_t)snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", scalar(kn)) >= sizeof path)
        return fail(w, kn, TP_EINVAL, prefix, "key too long");
    const struct key *k = find_key(path);
    if (k)
        return set_leaf(w, k, vn);
    if (is_section(path)) {
        if (vn->type == YAML_SCALAR_NODE && plain_null(vn))
            return 0;   /* an empty section keeps its defaults */
        if (vn->type != YAML_MAPPING_NODE)
            return fail(w, vn, TP_EINVAL, path, "expected a mapping of keys");
        return walk_map(w, vn, path);
    }
    return fail(w, kn, TP_ENOTFOUND, path, "unknown key");
}

static int walk_map(struct walk *w, const yaml_node_t *map, const char *prefix)
{
    const yaml_node_pair_t *b = map->data.mapping.pairs.start, *e = map->data.mapping.pairs.top;
    for (const yaml_node_pair_t *p = b; p < e; p++) {
        /* libyaml keeps duplicate keys; the second one would silently win. */
        yaml_node_t *kn = yaml_document_get_node(w->doc, p->key);
        for (const yaml_node_pair_t *q = b; q < p && kn && kn->type == YAML_SCALAR_NODE; q++) {
            yaml_node_t *qn = yaml_document_get_node(w->doc, q->key);
            if (qn && qn->type == YAML_SCALAR_NODE && !strcmp(scalar(qn), scalar(kn))) {
                char path[256];
                snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", scalar(kn));
                return fail(w, kn, TP_EINVAL, path, "duplicate key");
            }
        }
        int rc = walk_pair(w, p, prefix);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- cross-field checks -------------------------------------------------- */

static int check_all(tp_config *c, tp_err *err)
{
    const char *f = c->source;
    if (c->respawn_max_ms < c->respawn_init_ms)
        return tp_err_set(err, TP_ERANGE, "%s: workers.respawn_max_ms (%d) < workers.respawn_init_ms (%d)",
                          f, c->respawn_max_ms, c->respawn_init_ms);
    if (c->reconnect_max_ms < c->reconnect_init_ms)
        return tp_err_set(err, TP_ERANGE,
                          "%s: heartbeat.reconnect_max_ms (%d) < heartbeat.reconnect_init_ms (%d)", f,
                          c->reconnect_max_ms, c->reconnect_init_ms);
    /* the tokenize worker's reply to a prompt of max_prompt_bytes holds up
     * to 2 ids a byte (+3, tp_tokenizer_max_ids); a message over
     * max_msg_bytes makes ZeroMQ drop the worker, and the job would take
     * the next one down the same way */
    int64_t tokenized = 4 * (2 * (int64_t)c->max_prompt_bytes + 3) + 4096;
    if (c->max_msg_bytes < tokenized)
        return tp_err_set(err, TP_ERANGE,
                          "%s: limits.max_msg_bytes (%lld) is less than the tokenized form of a prompt of "
                          "limits.max_prompt_bytes (%d) needs (%lld: 8 bytes a prompt byte + 4 KiB); lower "
                          "limits.max_prompt_bytes or raise limits.max_msg_bytes",
                          f, (long long)c->max_msg_bytes, c->max_prompt_bytes, (long long)tokenized);
    if (c->def_max_tokens > c->max_tokens_limit)
        return tp_err_set(err, TP_ERANGE, "%s: generation.max_tokens (%d) > limits.max_tokens (%d)", f,
                          c->def_max_tokens, c->max_tokens_limit);
    if (c->def_penalty_window > c->max_penalty_window)
        return tp_err_set(err, TP_ERANGE,
                          "%s: generation.penalty_window (%d) > limits.max_penalty_window (%d)", f,
                          c->def_penalty_window, c->max_penalty_window);
    if (c->max_num_seqs > c->kv_slots)
        return tp_err_set(err, TP_ERANGE, "%s: batching.max_num_seqs (%d) > kv.slots (%d)", f,
                          c->max_num_seqs, c->kv_slots);
    if (c->prefill_chunk > c->max_batch_tokens)
        return tp_err_set(err, TP_ERANGE, "%s: batching.prefill_chunk (%d) > batching.max_batch_tokens (%d)",
                          f, c->prefill_chunk, c->max_batch_tokens);
    unsigned seen = 0;
    for (size_t i = 0; i < c->n_fuse; i++) {
        unsigned bits;
        tp_err e;
        if (tp_config_parse_stages(c->fuse[i], &bits, &e))
            return tp_err_set(err, TP_EINVAL, "%s: workers.fuse[%zu]: %s", f, i, e.msg);
        int cnt = -1;
        for (int s = 0; s < TP_SI_COUNT; s++) {
            if (!(bits & (1u << s)))
                continue;
            if (seen & (1u << s))
                return tp_err_set(err, TP_EINVAL, "%s: workers.fuse[%zu]: stage %s is in two fuse entries", f,
                                  i, stage_names[s]);
            if (cnt >= 0 && c->stage_count[s] != cnt)
                return tp_err_set(err, TP_EINVAL,
                                  "%s: workers.fuse[%zu]: fused stages need equal counts (workers.%s)", f, i,
                                  stage_names[s]);
            cnt = c->stage_count[s];
        }
        if ((bits & (1u << TP_SI_DRAFT)) && bits != 1u << TP_SI_DRAFT)
            return tp_err_set(err, TP_EINVAL, "%s: workers.fuse[%zu]: the draft stage runs its own model and fuses "
                              "with no other stage", f, i);
        seen |= bits;
    }
    return 0;
}

int tp_config_parse_stages(const char *list, unsigned *bits, tp_err *err)
{
    *bits = 0;
    const char *p = list;
    for (;;) {
        size_t n = strcspn(p, ",");
        int found = -1;
        for (int s = 0; s < TP_SI_COUNT; s++)
            if (strlen(stage_names[s]) == n && !strncmp(p, stage_names[s], n))
                found = s;
        if (found < 0)
            return tp_err_set(err, TP_EINVAL, "unknown stage '%.*s' (tokenize, forward, sample, stop, draft)",
                              (int)(n > 40 ? 40 : n), p);
        *bits |= 1u << found;
        if (!p[n])
            return 0;
        p += n + 1;
    }
}

int tp_config_groups(const tp_config *cfg, tp_worker_group *out, int cap)
{
    int n = 0;
    unsigned fused = 0;
    for (size_t i = 0; i < cfg->n_fuse && n < cap; i++) {
        unsigned bits;
        if (tp_config_parse_stages(cfg->fuse[i], &bits, NULL))
            continue;
        int cnt = 0;
        for (int s = 0; s < TP_SI_COUNT; s++)
            if (bits & (1u << s))
                cnt = cfg->stage_count[s];
        fused |= bits;
        if (cnt > 0)
            out[n++] = (tp_worker_group){bits, cnt};
    }
    for (int s = 0; s < TP_SI_COUNT && n < cap; s++)
        if (!(fused & (1u << s)) && cfg->stage_count[s] > 0 && (s != TP_SI_DRAFT || *cfg->spec_draft_model))
            out[n++] = (tp_worker_group){1u << s, cfg->stage_count[s]};
    return n;
}

static int resolve_ep(char **ep, const char *dir, const char *name, tp_err *err)
{
    if (!**ep) {
        char buf[512];
        if ((size_t)snprintf(buf, sizeof buf, "ipc://%s/%s.sock", dir, name) >= sizeof buf)
            return tp_err_set(err, TP_ERANGE, "runtime_dir is too long");
        if (set_str(ep, buf, err))
            return TP_ENOMEM;
    }
    /* The kernel's sun_path holds 107 bytes plus the NUL. */
    if (!strncmp(*ep, "ipc://", 6) && strlen(*ep + 6) > 107)
        return tp_err_set(err, TP_ERANGE, "endpoints.%s: ipc path longer than 107 bytes: %s", name, *ep);
    if (strncmp(*ep, "ipc://", 6) && strncmp(*ep, "tcp://", 6))
        return tp_err_set(err, TP_EINVAL, "endpoints.%s: '%s' is not an ipc:// or tcp:// endpoint", name, *ep);
    return 0;
}

int tp_config_resolve(tp_config *cfg, tp_err *err)
{
    if (!*cfg->runtime_dir) {
        const char *rd = getenv("RUNTIME_DIRECTORY");
        char buf[256];
        if (rd && *rd) {
            /* systemd may list several directories separated by ':'. */
            snprintf(buf, sizeof buf, "%.*s", (int)strcspn(rd, ":"), rd);
        } else {
            snprintf(buf, sizeof buf, "/tmp/tokpipe-%u", (unsigned)getuid());
        }
        if (set_str(&cfg->runtime_dir, buf, err))
            return TP_ENOMEM;
    }
    int rc;
    if ((rc = resolve_ep(&cfg->ep_front, cfg->runtime_dir, "front", err)) ||
        (rc = resolve_ep(&cfg->ep_back, cfg->runtime_dir, "back", err)) ||
        (rc = resolve_ep(&cfg->ep_events, cfg->runtime_dir, "events", err)) ||
        (rc = resolve_ep(&cfg->ep_publish, cfg->runtime_dir, "publish", err)))
        return rc;
    if (cfg->standby_role && (!*cfg->standby_state || !*cfg->standby_peer_state))
        return tp_err_set(err, TP_EINVAL, "standby.role %s needs standby.state and standby.peer_state",
                          tp_config_standby_roles[cfg->standby_role]);
    return 0;
}

static int parse_doc(yaml_document_t *doc, const char *name, tp_config *cfg, tp_err *err)
{
    yaml_node_t *root = yaml_document_get_root_node(doc);
    if (!root)
        return 0;   /* an empty file: all defaults */
    if (root->type == YAML_SCALAR_NODE && plain_null(root))
        return 0;
    if (root->type != YAML_MAPPING_NODE)
        return tp_err_set(err, TP_EINVAL, "%s:%d: the top level must be a mapping of keys", name,
                          line_of(root));
    struct walk w = {doc, cfg, name, err};
    return walk_map(&w, root, "");
}

int tp_config_parse(const char *yaml, size_t len, const char *name, tp_config *cfg, tp_err *err)
{
    int rc = tp_config_defaults(cfg, err);
    if (rc)
        return rc;
    if ((rc = set_str(&cfg->source, name, err)))
        goto out;
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser)) {
        rc = tp_err_set(err, TP_ENOMEM, "config: out of memory");
        goto out;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)yaml, len);
    if (!yaml_parser_load(&parser, &doc)) {
        rc = tp_err_set(err, TP_EFORMAT, "%s:%zu: YAML syntax error: %s", name, parser.problem_mark.line + 1,
                        parser.problem ? parser.problem : "unknown");
        yaml_parser_delete(&parser);
        goto out;
    }
    const char *tok0 = cfg->tokenizer_path, *model0 = cfg->model_path;
    rc = parse_doc(&doc, name, cfg, err);
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    /* The default tokenizer goes with the default model: a GGUF model named
     * without a tokenizer brings its own vocabulary (tok512.bin beside it
     * would fail, or worse, fit) */
    size_t ml = strlen(cfg->model_path);
    if (!rc && cfg->tokenizer_path == tok0 && cfg->model_path != model0 && ml >= 5 &&
        !strcasecmp(cfg->model_path + ml - 5, ".gguf"))
        rc = set_str(&cfg->tokenizer_path, "", err);
    if (!rc)
        rc = check_all(cfg, err);
    if (!rc)
        rc = tp_config_resolve(cfg, err);
out:
    if (rc)
        tp_config_free(cfg);
    return rc;
}

int tp_config_find(const char *path, tp_config *cfg, const char **used, tp_err *err)
{
    if (!path && access(TP_CONFIG_DEFAULT_PATH, R_OK) == 0)
        path = TP_CONFIG_DEFAULT_PATH;
    if (used)
        *used = path;
    if (path)
        return tp_config_load(path, cfg, err);
    int rc = tp_config_defaults(cfg, err);
    return rc ? rc : tp_config_resolve(cfg, err);
}

int tp_config_load(const char *path, tp_config *cfg, tp_err *err)
{
    memset(cfg, 0, sizeof *cfg);
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return tp_err_set(err, TP_EIO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            if (cap >= (16u << 20)) {
                fclose(fp);
                free(buf);
                return tp_err_set(err, TP_ERANGE, "%s: larger than 16 MiB", path);
            }
            char *nb = realloc(buf, cap = cap ? 2 * cap : 8192);
            if (!nb) {
                fclose(fp);
                free(buf);
                return tp_err_set(err, TP_ENOMEM, "config: out of memory");
            }
            buf = nb;
        }
        size_t got = fread(buf + len, 1, cap - len, fp);
        len += got;
        if (got == 0)
            break;
    }
    int ioerr = ferror(fp);
    fclose(fp);
    if (ioerr) {
        free(buf);
        return tp_err_set(err, TP_EIO, "%s: read error", path);
    }
    int rc = tp_config_parse(buf, len, path, cfg, err);
    free(buf);
    return rc;
}
