/* Response bodies in OpenAI's shapes, /health and /metrics (Prometheus text
 * exposition format 0.0.4). */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gw.h"
#include "tokpipe/utf8.h"

/* Labels per stop-trigger family: a job may bring any stop string, and
 * every distinct label value is a time series the scraper keeps forever. */
#define METRICS_MAX_TRIGGER_LABELS 50

const char *gw_finish_reason(int reason)
{
    switch (reason) {
    case TP_REASON_STOP_STRING:
    case TP_REASON_STOP_TOKEN:
    case TP_REASON_EOS:
        return "stop";
    case TP_REASON_LENGTH:
        return "length";
    case TP_REASON_CANCELLED:
        return "abort";
    default:
        return "error";
    }
}

const char *gw_choice_finish(const gw_choice *ch)
{
    if (tp_reason_ends_in_calls(ch->reason, ch->tool_calls ? (size_t)cJSON_GetArraySize(ch->tool_calls) : 0,
                                ch->tool_calls_cut))
        return "tool_calls";
    return gw_finish_reason(ch->reason);
}

static char *print_free(cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

static const char *error_type(int status)
{
    switch (status) {
    case 400:
    case 404:
    case 405:
    case 413:
        return "invalid_request_error";
    case 401:
        return "authentication_error";
    case 429:
        return "rate_limit_error";
    case 503:
        return "service_unavailable";
    default:
        return "server_error";
    }
}

char *gw_error_json(int status, const char *message, const char *param)
{
    return gw_error_json_code(status, message, param, NULL);
}

char *gw_error_json_code(int status, const char *message, const char *param, const char *code)
{
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    if (!e) {
        cJSON_Delete(o);
        return NULL;
    }
    cJSON_AddStringToObject(e, "message", message);
    cJSON_AddStringToObject(e, "type", error_type(status));
    if (param && param[0])
        cJSON_AddStringToObject(e, "param", param);
    else
        cJSON_AddNullToObject(e, "param");
    if (code)
        cJSON_AddStringToObject(e, "code", code);
    else
        cJSON_AddNumberToObject(e, "code", status);
    return print_free(o);
}

char *gw_models_json(const char *model, int64_t created)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", model);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)created);
    cJSON_AddStringToObject(m, "owned_by", "tokpipe");
    cJSON_AddItemToArray(data, m);
    return print_free(o);
}

/* vLLM's stop_reason: the stop string, the stop token id, or null (EOS,
 * length: what finished it is no stop the client gave). */
static void add_stop_reason(cJSON *o, const gw_choice *ch)
{
    /* tokpipe's extension for constrained jobs: whether the text is a whole
     * document of the grammar / schema (false: cut, e.g. by max_tokens) */
    if (ch->constrained)
        cJSON_AddBoolToObject(o, "grammar_complete", ch->grammar_complete);
    if (ch->reason == TP_REASON_STOP_STRING && ch->matched.kind == TP_MATCHED_STR)
        cJSON_AddStringToObject(o, "stop_reason", ch->matched_buf ? ch->matched_buf : "");
    else if (ch->reason == TP_REASON_STOP_TOKEN && ch->matched.kind == TP_MATCHED_ID)
        cJSON_AddNumberToObject(o, "stop_reason", ch->matched.id);
    else
        cJSON_AddNullToObject(o, "stop_reason");
}

static cJSON *head(const gw_call *c, const char *model, const char *object)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", c->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)c->created);
    cJSON_AddStringToObject(o, "model", model);
    return o;
}

/* Prompt tokens count once per prompt, whatever n is (as OpenAI and vLLM),
 * and so do the cached ones: the first choice's job of each prompt says
 * how many of its prompt tokens the prefix cache held (the n - 1 others of
 * a prompt usually hit it too, but the prompt was processed once). */
static cJSON *usage(const gw_call *c)
{
    uint64_t prompt = 0, completion = 0, cached = 0;
    for (size_t i = 0; i < c->n_ch; i++) {
        if (i % (size_t)c->oreq.n == 0) {
            prompt += c->ch[i].prompt_tokens;
            cached += c->ch[i].cached_tokens; /* below prompt_tokens: the protocol checks FINISH */
        }
        completion += c->ch[i].completion_tokens;
    }
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)completion);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + completion));
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    if (d)
        cJSON_AddNumberToObject(d, "cached_tokens", (double)cached);
    return u;
}

/* llama.cpp's `timings`, as far as speculative decoding goes: guesses
 * verified (draft_n) and taken (draft_n_accepted) over the choices. Only
 * when the request asked for speculation or some job speculated (the
 * config's default). */
static void add_timings(cJSON *o, const gw_call *c)
{
    uint64_t n = 0, acc = 0, pred = 0;
    for (size_t i = 0; i < c->n_ch; i++) {
        n += c->ch[i].draft_tokens;
        acc += c->ch[i].draft_accepted;
        pred += c->ch[i].completion_tokens;
    }
    const tp_spec_params *sp = &c->oreq.params.speculative;
    if (!n && !(sp->set & TP_SPEC_P_MODE && !(sp->mode.len == 3 && !memcmp(sp->mode.ptr, "off", 3))))
        return;
    cJSON *t = cJSON_AddObjectToObject(o, "timings");
    if (!t)
        return;
    cJSON_AddNumberToObject(t, "predicted_n", (double)pred);
    cJSON_AddNumberToObject(t, "draft_n", (double)n);
    cJSON_AddNumberToObject(t, "draft_n_accepted", (double)acc);
}

static cJSON *text_item(const char *text, size_t len)
{
    /* cJSON copies C strings: the text is NUL-free valid UTF-8 except in
     * the rare byte-fallback <0x00> piece, which would end it early */
    char *s = malloc(len + 1);
    if (!s)
        return NULL;
    memcpy(s, text ? text : "", len);
    s[len] = '\0';
    cJSON *j = cJSON_CreateString(s);
    free(s);
    return j;
}

/* A token's text as OpenAI shows it: its bytes decoded, U+FFFD for
 * a partial UTF-8 sequence (bytes keeps them exact). */
static cJSON *token_text(const uint8_t *b, size_t len)
{
    char *s = malloc(TP_UTF8_REPLACE_MAX(len) + 1);
    if (!s)
        return NULL;
    size_t n = tp_utf8_replace(b, len, s);
    cJSON *j = text_item(s, n);
    free(s);
    return j;
}

static cJSON *token_bytes(const uint8_t *b, size_t len)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < len; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(b[i]));
    return a;
}

static double lp_value(float v)
{
    return isfinite(v) ? (double)v : GW_LP_UNKNOWN;
}

/* Chat: {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]} */
static cJSON *chat_logprobs(const gw_call *c, const gw_lp *l, size_t from, size_t to)
{
    const tp_tokenizer *tok = c->g ? c->g->tok : NULL;
    cJSON *o = cJSON_CreateObject(), *content = cJSON_AddArrayToObject(o, "content");
    for (size_t k = from; content && k < to; k++) {
        cJSON *e = cJSON_CreateObject();
        size_t len;
        const uint8_t *b = gw_lp_bytes(l, tok, k, -1, &len);
        cJSON_AddItemToObject(e, "token", token_text(b, len));
        cJSON_AddNumberToObject(e, "logprob", lp_value(l->lps[k]));
        cJSON_AddItemToObject(e, "bytes", token_bytes(b, len));
        cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
        for (uint32_t a = 0; top && a < l->top_n; a++) {
            int32_t id = l->top_ids[k * l->top_n + a];
            if (id < 0)
                continue;
            cJSON *t = cJSON_CreateObject();
            b = gw_lp_bytes(l, tok, k, id, &len);
            cJSON_AddItemToObject(t, "token", token_text(b, len));
            cJSON_AddNumberToObject(t, "logprob", lp_value(l->top_lps[k * l->top_n + a]));
            cJSON_AddItemToObject(t, "bytes", token_bytes(b, len));
            cJSON_AddItemToArray(top, t);
        }
        cJSON_AddItemToArray(content, e);
    }
    return o;
}

/* Legacy completions: {tokens, token_logprobs, top_logprobs: [{text: lp}],
 * text_offset}. A top_logprobs map holds the alternatives and the chosen
 * token (as OpenAI: up to logprobs + 1 keys); two ids with the same text
 * keep the first (the more likely). */
static cJSON *legacy_logprobs(const gw_call *c, const gw_lp *l, size_t from, size_t to)
{
    const tp_tokenizer *tok = c->g ? c->g->tok : NULL;
    cJSON *o = cJSON_CreateObject();
    cJSON *tokens = cJSON_AddArrayToObject(o, "tokens"), *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs"), *offs = cJSON_AddArrayToObject(o, "text_offset");
    if (!tokens || !lps || !tops || !offs) {
        cJSON_Delete(o);
        return NULL;
    }
    for (size_t k = from; k < to; k++) {
        size_t len;
        const uint8_t *b = gw_lp_bytes(l, tok, k, -1, &len);
        cJSON *chosen = token_text(b, len);
        cJSON_AddItemToArray(tokens, chosen);
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(lp_value(l->lps[k])));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)l->off[k]));
        cJSON *map = cJSON_CreateObject();
        for (uint32_t a = 0; map && a <= l->top_n; a++) {
            int32_t id = a < l->top_n ? l->top_ids[k * l->top_n + a] : l->ids[k];
            if (id < 0)
                continue;
            float v = a < l->top_n ? l->top_lps[k * l->top_n + a] : l->lps[k];
            const uint8_t *tb = gw_lp_bytes(l, tok, k, id, &len);
            cJSON *t = token_text(tb, len);
            if (t && !cJSON_GetObjectItemCaseSensitive(map, t->valuestring))
                cJSON_AddNumberToObject(map, t->valuestring, lp_value(v));
            cJSON_Delete(t);
        }
        cJSON_AddItemToArray(tops, map);
    }
    return o;
}

static void add_logprobs(cJSON *x, const gw_call *c, const gw_choice *ch, size_t from, size_t to)
{
    if (!c->oreq.logprobs)
        cJSON_AddNullToObject(x, "logprobs");
    else if (c->oreq.kind == OAI_CHAT)
        cJSON_AddItemToObject(x, "logprobs", chat_logprobs(c, &ch->lp, from, to));
    else
        cJSON_AddItemToObject(x, "logprobs", legacy_logprobs(c, &ch->lp, from, to));
}

char *gw_completion_json(const gw_call *c, const char *model)
{
    bool chat = c->oreq.kind == OAI_CHAT;
    cJSON *o = head(c, model, chat ? "chat.completion" : "text_completion");
    cJSON *arr = cJSON_AddArrayToObject(o, "choices");
    for (size_t i = 0; i < c->n_ch; i++) {
        const gw_choice *ch = &c->ch[i];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "index", (double)i);
        if (chat) {
            cJSON *m = cJSON_AddObjectToObject(x, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            /* OpenAI: content null when the turn is only calls */
            if (!ch->text.len && ch->tool_calls)
                cJSON_AddNullToObject(m, "content");
            else
                cJSON_AddItemToObject(m, "content", text_item(ch->text.data, ch->text.len));
            if (ch->reasoning.len)
                cJSON_AddItemToObject(m, "reasoning_content", text_item(ch->reasoning.data, ch->reasoning.len));
            if (ch->tool_calls)
                cJSON_AddItemToObject(m, "tool_calls", cJSON_Duplicate(ch->tool_calls, 1));
        } else {
            cJSON_AddItemToObject(x, "text", text_item(ch->text.data, ch->text.len));
        }
        add_logprobs(x, c, ch, 0, ch->lp.released);
        cJSON_AddStringToObject(x, "finish_reason", gw_choice_finish(ch));
        add_stop_reason(x, ch);
        cJSON_AddItemToArray(arr, x);
    }
    cJSON_AddItemToObject(o, "usage", usage(c));
    add_timings(o, c);
    return print_free(o);
}

static char *sse(cJSON *o)
{
    char *j = print_free(o);
    if (!j)
        return NULL;
    size_t n = strlen(j);
    char *s = malloc(n + 9);
    if (s)
        snprintf(s, n + 9, "data: %s\n\n", j);
    free(j);
    return s;
}

char *gw_chunk_sse(const gw_call *c, const char *model, size_t i, const char *text, size_t len, size_t lp_from,
                   size_t lp_to, bool final)
{
    bool chat = c->oreq.kind == OAI_CHAT;
    cJSON *o = head(c, model, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *arr = cJSON_AddArrayToObject(o, "choices");
    cJSON *x = cJSON_CreateObject();
    cJSON_AddNumberToObject(x, "index", (double)i);
    if (chat) {
        cJSON *d = cJSON_AddObjectToObject(x, "delta");
        /* every delta says who speaks, the finishing one too (README "Chat"): clients that
         * join late need no state */
        cJSON_AddStringToObject(d, "role", "assistant");
        if (len || !final)
            cJSON_AddItemToObject(d, "content", text_item(text, len));
    } else {
        cJSON_AddItemToObject(x, "text", text_item(text, len));
    }
    if (final)
        cJSON_AddNullToObject(x, "logprobs");
    else
        add_logprobs(x, c, &c->ch[i], lp_from, lp_to);
    if (final) {
        cJSON_AddStringToObject(x, "finish_reason", gw_choice_finish(&c->ch[i]));
        add_stop_reason(x, &c->ch[i]);
    } else {
        cJSON_AddNullToObject(x, "finish_reason");
    }
    cJSON_AddItemToArray(arr, x);
    return sse(o);
}

static cJSON *delta_event(const gw_call *c, const char *model, size_t i, cJSON **d)
{
    cJSON *o = head(c, model, "chat.completion.chunk");
    cJSON *arr = cJSON_AddArrayToObject(o, "choices");
    cJSON *x = cJSON_CreateObject();
    cJSON_AddNumberToObject(x, "index", (double)i);
    *d = cJSON_AddObjectToObject(x, "delta");
    cJSON_AddStringToObject(*d, "role", "assistant");
    cJSON_AddNullToObject(x, "logprobs");
    cJSON_AddNullToObject(x, "finish_reason");
    cJSON_AddItemToArray(arr, x);
    return o;
}

char *gw_delta_sse(const gw_call *c, const char *model, size_t i, const char *reasoning, size_t len)
{
    cJSON *d;
    cJSON *o = delta_event(c, model, i, &d);
    cJSON_AddItemToObject(d, "reasoning_content", text_item(reasoning, len));
    return sse(o);
}

char *gw_call_sse(const gw_call *c, const char *model, size_t i, size_t index, const char *id, size_t id_len,
                  const char *name, size_t name_len, const char *args, size_t args_len)
{
    cJSON *d;
    cJSON *o = delta_event(c, model, i, &d);
    cJSON *tc = cJSON_AddArrayToObject(d, "tool_calls");
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "index", (double)index);
    if (id) {
        cJSON_AddItemToObject(e, "id", text_item(id, id_len));
        cJSON_AddStringToObject(e, "type", "function");
    }
    cJSON *fn = cJSON_AddObjectToObject(e, "function");
    if (id)
        cJSON_AddItemToObject(fn, "name", text_item(name, name_len));
    cJSON_AddItemToObject(fn, "arguments", text_item(args, args_len));
    cJSON_AddItemToArray(tc, e);
    return sse(o);
}

char *gw_usage_sse(const gw_call *c, const char *model)
{
    cJSON *o = head(c, model, c->oreq.kind == OAI_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON_AddArrayToObject(o, "choices");
    cJSON_AddItemToObject(o, "usage", usage(c));
    add_timings(o, c);
    return sse(o);
}

/* the four every job needs (health), then the draft stage (speculative
 * decoding's, optional) */
static const char *const stage_names[5] = {"tokenize", "forward", "sample", "stop", "draft"};

char *gw_health_json(const tp_m_stats_reply *s, int *status)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *w = cJSON_AddObjectToObject(o, "workers");
    cJSON *missing = cJSON_CreateArray();
    for (int i = 0; i < 4; i++) {
        cJSON_AddNumberToObject(w, stage_names[i], (double)s->workers[i]);
        if (!s->workers[i])
            cJSON_AddItemToArray(missing, cJSON_CreateString(stage_names[i]));
    }
    bool ok = cJSON_GetArraySize(missing) == 0;
    cJSON_AddStringToObject(o, "status", ok ? "ok" : "unavailable");
    if (ok) {
        cJSON_Delete(missing);
    } else {
        cJSON_AddItemToObject(o, "missing", missing);
        char msg[512] = "no live worker for stage";
        for (int i = 0; i < 4; i++)
            if (!s->workers[i])
                snprintf(msg + strlen(msg), sizeof msg - strlen(msg), " %s", stage_names[i]);
        for (int i = 0; i < 4; i++)
            if ((s->stages_failed >> i) & 1u)
                snprintf(msg + strlen(msg), sizeof msg - strlen(msg), "; %s workers cannot start (tokpiped gave up: "
                         "see its log)", stage_names[i]);
        cJSON_AddStringToObject(o, "message", msg);
    }
    cJSON_AddNumberToObject(o, "jobs_active", (double)s->jobs_active);
    *status = ok ? 200 : 503;
    return print_free(o);
}

/* ---- /metrics ------------------------------------------------------------ */

static void family(tp_buf *b, const char *name, const char *type, const char *help)
{
    tp_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void sample(tp_buf *b, const char *name, const char *labels, uint64_t v)
{
    tp_buf_printf(b, "%s%s%s%s %" PRIu64 "\n", name, labels ? "{" : "", labels ? labels : "", labels ? "}" : "", v);
}

static void one(tp_buf *b, const char *name, const char *type, const char *help, uint64_t v)
{
    family(b, name, type, help);
    sample(b, name, NULL, v);
}

/* The signals the Gateway API Inference Extension's endpoint picker scrapes
 * from a model server (its model server protocol: TotalQueuedRequests,
 * TotalRunningRequests, KVCacheUtilization), under the vLLM names it reads
 * by default, so replicas of tokpipe can sit in one InferencePool (README
 * "Behind a Kubernetes inference gateway"). KV cache use is a fraction:
 * sequences held over the slots of the live forward workers (a job holds
 * one slot for its life; with none free, jobs wait). vllm:gpu_cache_usage_perc
 * is the same under the name older pickers read. */
static void inference_gateway(tp_buf *b, const tp_m_stats_reply *s)
{
    double use = s->kv_slots_total ? (double)s->kv_slots_used / (double)s->kv_slots_total : 0.0;
    one(b, "vllm:num_requests_waiting", "gauge", "Jobs waiting: tokenizing or waiting for admission (TotalQueuedRequests)",
        s->jobs_waiting);
    one(b, "vllm:num_requests_running", "gauge", "Jobs admitted to workers now (TotalRunningRequests)",
        s->jobs_running);
    family(b, "vllm:kv_cache_usage_perc", "gauge",
           "KV cache use, 0-1: slots held over the live forward workers' slots (KVCacheUtilization)");
    tp_buf_printf(b, "vllm:kv_cache_usage_perc %.6f\n", use);
    family(b, "vllm:gpu_cache_usage_perc", "gauge", "vllm:kv_cache_usage_perc under its older name");
    tp_buf_printf(b, "vllm:gpu_cache_usage_perc %.6f\n", use);
}

/* The forward workers' prefix caches (README "Prefix caching"). */
static void prefix_cache(tp_buf *b, const tp_m_stats_reply *s)
{
    one(b, "tokpipe_prefix_cache_lookups_total", "counter", "Prompt chunks offered to a prefix cache",
        s->prefix_lookups);
    one(b, "tokpipe_prefix_cache_hit_tokens_total", "counter", "Prompt tokens taken from a prefix cache",
        s->prefix_hit_tokens);
    one(b, "tokpipe_prefix_cache_prompt_tokens_total", "counter",
        "Prompt tokens the forward workers were asked for (taken from the cache + computed)",
        s->prefix_prompt_tokens);
    family(b, "tokpipe_prefix_cache_hit_rate", "gauge", "hit_tokens / prompt_tokens (0 before any prompt)");
    double rate = s->prefix_prompt_tokens ? (double)s->prefix_hit_tokens / (double)s->prefix_prompt_tokens : 0.0;
    tp_buf_printf(b, "tokpipe_prefix_cache_hit_rate %.6f\n", rate);
    one(b, "tokpipe_prefix_cache_evictions_total", "counter", "Cached KV pages given up for new ones",
        s->prefix_evictions);
    one(b, "tokpipe_prefix_cache_pages_used", "gauge", "KV pages held by running sequences", s->prefix_pages_used);
    one(b, "tokpipe_prefix_cache_pages_cached", "gauge", "KV pages in the prefix cache (held or not)",
        s->prefix_pages_cached);
    one(b, "tokpipe_prefix_cache_pages_capacity", "gauge", "KV pages of the live forward workers' pools",
        s->prefix_pages_total);
    one(b, "tokpipe_prefix_cache_bytes", "gauge", "Bytes of the cached KV pages", s->prefix_bytes);
    one(b, "tokpipe_kv_bytes_held", "gauge",
        "Bytes of KV the running sequences hold (a sliding-window layer only its window)", s->kv_bytes_held);
    one(b, "tokpipe_kv_bytes_capacity", "gauge", "Bytes of the live forward workers' KV pools", s->kv_bytes_pool);
}

/* Label value escaping of the text format: backslash, quote, newline. */
static void add_label_value(tp_buf *b, const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        const char *esc = s[i] == '\\' ? "\\\\" : s[i] == '"' ? "\\\"" : s[i] == '\n' ? "\\n" : NULL;
        if (esc)
            tp_buf_puts(b, esc);
        else
            tp_buf_add(b, &s[i], 1);
    }
}

static int by_count_desc(const void *a, const void *b)
{
    const tp_trigger *x = *(tp_trigger *const *)a, *y = *(tp_trigger *const *)b;
    return x->count < y->count ? 1 : x->count > y->count ? -1 : 0;
}

static void triggers(tp_buf *b, const tp_m_stats_reply *s)
{
    tp_trigger **t = malloc((s->n_triggers ? s->n_triggers : 1) * sizeof *t);
    if (!t)
        return;
    for (size_t i = 0; i < s->n_triggers; i++)
        t[i] = &s->triggers[i];
    qsort(t, s->n_triggers, sizeof *t, by_count_desc);
    uint64_t other = s->triggers_other;
    int shown[2] = {0, 0};
    family(b, "tokpipe_stop_string_triggers_total", "counter",
           "Jobs finished by each stop string (the most frequent ones; the rest in "
           "tokpipe_stop_triggers_other_total)");
    for (size_t i = 0; i < s->n_triggers; i++)
        if (t[i]->key.kind == TP_MATCHED_STR) {
            if (shown[0]++ >= METRICS_MAX_TRIGGER_LABELS) {
                other += t[i]->count;
                continue;
            }
            tp_buf_puts(b, "tokpipe_stop_string_triggers_total{stop=\"");
            add_label_value(b, t[i]->key.str.ptr, t[i]->key.str.len);
            tp_buf_printf(b, "\"} %" PRIu64 "\n", t[i]->count);
        }
    family(b, "tokpipe_stop_id_triggers_total", "counter",
           "Jobs finished by each stop token id or EOS id (the most frequent ones)");
    for (size_t i = 0; i < s->n_triggers; i++)
        if (t[i]->key.kind == TP_MATCHED_ID) {
            if (shown[1]++ >= METRICS_MAX_TRIGGER_LABELS) {
                other += t[i]->count;
                continue;
            }
            char lab[48];
            snprintf(lab, sizeof lab, "token_id=\"%d\"", (int)t[i]->key.id);
            sample(b, "tokpipe_stop_id_triggers_total", lab, t[i]->count);
        }
    one(b, "tokpipe_stop_triggers_other_total", "counter",
        "Stop triggers not shown by stop string or id (label cap or the broker's table full)", other);
    free(t);
}

/* A broker histogram (µs buckets) as a Prometheus histogram in seconds:
 * cumulative _bucket{le} series, +Inf, _sum and _count. */
static void histogram(tp_buf *b, const char *name, const char *help, const tp_hist *h)
{
    family(b, name, "histogram", help);
    uint64_t cum = 0;
    for (size_t i = 0; i < h->n_bounds; i++) {
        cum += h->buckets[i];
        tp_buf_printf(b, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name, (double)h->bounds_us[i] / 1e6, cum);
    }
    tp_buf_printf(b, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n%s_sum %.6f\n%s_count %" PRIu64 "\n", name, h->count, name,
                  (double)h->sum_us / 1e6, name, h->count);
}

const char *gw_endpoint_name(gw_endpoint ep)
{
    static const char *const names[GW_EP_COUNT] = {
        [GW_EP_COMPLETIONS] = "/v1/completions", [GW_EP_CHAT] = "/v1/chat/completions",
        [GW_EP_MESSAGES] = "/v1/messages",       [GW_EP_COUNT_TOKENS] = "/v1/messages/count_tokens",
        [GW_EP_RESPONSES] = "/v1/responses",   [GW_EP_EMBEDDINGS] = "/v1/embeddings",
        [GW_EP_MODELS] = "/v1/models",           [GW_EP_HEALTH] = "/health",
        [GW_EP_METRICS] = "/metrics",            [GW_EP_OTHER] = "other",
    };
    return (unsigned)ep < GW_EP_COUNT ? names[ep] : "other";
}

static const char *const reason_names[TP_REASON_COUNT] = {"none", "stop_string", "stop_token", "eos",
                                                          "length", "cancelled", "error"};

char *gw_metrics_text(const tp_m_stats_reply *s, const gw_counters *gc)
{
    tp_buf b = {0};
    char lab[64];
    family(&b, "tokpipe_uptime_seconds", "gauge", "Seconds since the broker started");
    tp_buf_printf(&b, "tokpipe_uptime_seconds %.3f\n", (double)s->uptime_ms / 1000.0);
    one(&b, "tokpipe_jobs_submitted_total", "counter", "SUBMIT requests seen by the broker", s->jobs_submitted);
    one(&b, "tokpipe_jobs_rejected_total", "counter",
        "SUBMITs refused (status other than 200, or a prompt found too long for the context)", s->jobs_rejected);
    one(&b, "tokpipe_jobs_active", "gauge", "Jobs queued or running now", s->jobs_active);
    family(&b, "tokpipe_jobs_finished_total", "counter", "Finished jobs by finish reason");
    for (int r = 1; r < TP_REASON_COUNT; r++) {
        snprintf(lab, sizeof lab, "reason=\"%s\"", reason_names[r]);
        sample(&b, "tokpipe_jobs_finished_total", lab, s->finish[r]);
    }
    one(&b, "tokpipe_tokens_generated_total", "counter", "Completion tokens of finished jobs", s->tokens_generated);
    one(&b, "tokpipe_events_published_total", "counter", "TOKEN and FINISH events passed to subscribers",
        s->events_published);
    family(&b, "tokpipe_malformed_messages_total", "counter", "Malformed messages per broker socket");
    sample(&b, "tokpipe_malformed_messages_total", "socket=\"front\"", s->malformed_front);
    sample(&b, "tokpipe_malformed_messages_total", "socket=\"back\"", s->malformed_back);
    sample(&b, "tokpipe_malformed_messages_total", "socket=\"events\"", s->malformed_events);
    family(&b, "tokpipe_workers", "gauge", "Live registered workers per stage");
    for (int i = 0; i < 5; i++) {
        snprintf(lab, sizeof lab, "stage=\"%s\"", stage_names[i]);
        sample(&b, "tokpipe_workers", lab, s->workers[i]);
    }
    triggers(&b, s);
    one(&b, "tokpipe_forward_steps_total", "counter", "STEPs sent to forward workers", s->forward_steps);
    one(&b, "tokpipe_forward_rows_total", "counter", "Sequences in those STEPs (rows / steps = mean batch)",
        s->forward_rows);
    one(&b, "tokpipe_forward_tokens_total", "counter", "Tokens in those STEPs (decode + prefill)", s->forward_tokens);
    one(&b, "tokpipe_spec_drafted_total", "counter", "Speculative decoding: guesses verified", s->spec_drafted);
    one(&b, "tokpipe_spec_accepted_total", "counter", "Speculative decoding: guesses taken", s->spec_accepted);
    one(&b, "tokpipe_spec_verify_steps_total", "counter", "Speculative decoding: verify items (a job's token and its "
        "guesses)", s->spec_verify_steps);
    one(&b, "tokpipe_spec_verify_tokens_total", "counter", "Speculative decoding: tokens the verify items gave "
        "(/ verify steps = tokens per verify step)", s->spec_verify_tokens);
    one(&b, "tokpipe_jobs_running", "gauge", "Jobs admitted to workers now", s->jobs_running);
    one(&b, "tokpipe_jobs_waiting", "gauge", "Jobs tokenizing or waiting for admission now", s->jobs_waiting);
    one(&b, "tokpipe_kv_slots_used", "gauge", "KV cache slots (sequences) held by forward workers", s->kv_slots_used);
    one(&b, "tokpipe_kv_slots_capacity", "gauge", "KV cache slots of the live forward workers", s->kv_slots_total);
    inference_gateway(&b, s);
    prefix_cache(&b, s);
    histogram(&b, "tokpipe_queue_time_seconds", "Time from SUBMIT to a job's first forward step",
              &s->hist[TP_HIST_QUEUE]);
    histogram(&b, "tokpipe_time_to_first_token_seconds", "Time from SUBMIT to a job's first accepted token",
              &s->hist[TP_HIST_TTFT]);
    histogram(&b, "tokpipe_inter_token_latency_seconds", "Time between a job's token events, per token",
              &s->hist[TP_HIST_ITL]);
    histogram(&b, "tokpipe_e2e_request_latency_seconds", "Time from SUBMIT to a job's finish",
              &s->hist[TP_HIST_E2E]);
    one(&b, "tokpipe_workers_lost_total", "counter", "Worker registrations lost (dead, hung, disconnected, restarted)",
        s->workers_lost);
    one(&b, "tokpipe_jobs_poisoned_total", "counter",
        "Jobs ended in error because the workers processing them kept being lost (poison jobs)", s->jobs_poisoned);
    one(&b, "tokpipe_workers_hung_total", "counter",
        "Workers lost because they stopped answering in the middle of a task (step deadline)", s->workers_hung);
    one(&b, "tokpipe_replies_refused_total", "counter", "Stage answers and heartbeats from worker registrations already dropped",
        s->replies_refused);
    family(&b, "tokpipe_jobs_recovered_total", "counter", "Jobs moved to another worker after a loss, per stage");
    for (int i = 0; i < 4; i++) {
        snprintf(lab, sizeof lab, "stage=\"%s\"", stage_names[i]);
        sample(&b, "tokpipe_jobs_recovered_total", lab, s->recovered[i]);
    }
    one(&b, "tokpipe_recoveries_total", "counter", "Recoveries timed (worker loss to the job's next event)",
        s->recovery_count);
    family(&b, "tokpipe_recovery_seconds_total", "counter", "Sum of the recoveries' durations");
    tp_buf_printf(&b, "tokpipe_recovery_seconds_total %.3f\n", (double)s->recovery_ms_total / 1e3);
    family(&b, "tokpipe_recovery_max_seconds", "gauge", "Longest recovery since the broker started");
    tp_buf_printf(&b, "tokpipe_recovery_max_seconds %.3f\n", (double)s->recovery_ms_max / 1e3);
    one(&b, "tokpipe_events_duplicate_total", "counter", "Events dropped because their seq was already forwarded",
        s->events_duplicate);
    one(&b, "tokpipe_events_refused_total", "counter",
        "Events dropped for not carrying the pin of their job's current stop worker", s->events_refused);
    family(&b, "tokpipe_stage_failed", "gauge", "1 when the spawned workers of a stage cannot start (given up)");
    for (int i = 0; i < 4; i++) {
        snprintf(lab, sizeof lab, "stage=\"%s\"", stage_names[i]);
        sample(&b, "tokpipe_stage_failed", lab, (s->stages_failed >> i) & 1u);
    }
    one(&b, "tokpipe_zap_refused_total", "counter", "CURVE handshakes refused (client key not authorized)",
        s->zap_refused);
    family(&b, "tokpipe_http_responses_total", "counter", "Responses of this gateway by endpoint and status class");
    for (int ep = 0; ep < GW_EP_COUNT; ep++)
        for (int k = 2; k <= 5; k++) {
            snprintf(lab, sizeof lab, "endpoint=\"%s\",code=\"%dxx\"", gw_endpoint_name((gw_endpoint)ep), k);
            sample(&b, "tokpipe_http_responses_total", lab, gc->requests[ep][k]);
        }
    one(&b, "tokpipe_http_client_disconnects_total", "counter",
        "Completions whose client went away before the end (their jobs were cancelled)", gc->client_gone);
    one(&b, "tokpipe_http_streams_resumed_total", "counter",
        "Streams whose jobs were submitted again (same id and seed) after their broker was lost, "
        "going on where they stopped", gc->streams_resumed);
    one(&b, "tokpipe_http_jobs_resubmitted_total", "counter",
        "Jobs submitted again (same id and seed) after their broker was lost", gc->jobs_resubmitted);
    return b.data;
}
