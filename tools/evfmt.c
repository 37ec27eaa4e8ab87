#include "evfmt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

cJSON *evfmt_str(tp_str s)
{
    char *buf = malloc(s.len + 1);
    if (!buf)
        return cJSON_CreateNull();
    if (s.len)
        memcpy(buf, s.ptr, s.len);
    buf[s.len] = '\0';
    cJSON *j = cJSON_CreateString(buf);
    free(buf);
    return j;
}

cJSON *evfmt_matched(const tp_matched *m)
{
    if (m->kind == TP_MATCHED_STR)
        return evfmt_str(m->str);
    if (m->kind == TP_MATCHED_ID)
        return cJSON_CreateNumber(m->id);
    return cJSON_CreateNull();
}

cJSON *evfmt_ids(tp_raw r)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < r.n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(tp_raw_i32(r, i)));
    return a;
}

static void add_timings(cJSON *o, const tp_timings *t)
{
    cJSON_AddNumberToObject(o, "queue_us", (double)t->queue_us);
    cJSON_AddNumberToObject(o, "ttft_us", (double)t->ttft_us);
    cJSON_AddNumberToObject(o, "total_us", (double)t->total_us);
}

static cJSON *lp_number(float v)
{
    return isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull();
}

cJSON *evfmt_logprobs(tp_raw ids, const tp_lp_cols *lp)
{
    if (!lp->logprobs.data)
        return NULL;
    cJSON *arr = cJSON_CreateArray();
    uint32_t k = lp->top_n;
    for (size_t i = 0; arr && i < ids.n && i < lp->logprobs.n; i++) {
        cJSON *e = cJSON_CreateObject(), *top = cJSON_CreateArray();
        cJSON_AddNumberToObject(e, "id", tp_raw_i32(ids, i));
        cJSON_AddItemToObject(e, "logprob", lp_number(tp_raw_f32(lp->logprobs, i)));
        for (uint32_t c = 0; c < k; c++) {
            int32_t id = tp_raw_i32(lp->top_ids, i * k + c);
            if (id < 0)
                continue;
            cJSON *a = cJSON_CreateObject();
            cJSON_AddNumberToObject(a, "id", id);
            cJSON_AddItemToObject(a, "logprob", lp_number(tp_raw_f32(lp->top_logprobs, i * k + c)));
            cJSON_AddItemToArray(top, a);
        }
        cJSON_AddItemToObject(e, "top", top);
        cJSON_AddItemToArray(arr, e);
    }
    return arr;
}

cJSON *evfmt_tool_calls(const tp_tool_call *c, size_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < n; i++) {
        cJSON *o = cJSON_CreateObject(), *fn = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "id", evfmt_str(c[i].id));
        cJSON_AddStringToObject(o, "type", "function");
        cJSON_AddItemToObject(fn, "name", evfmt_str(c[i].name));
        cJSON_AddItemToObject(fn, "arguments", evfmt_str(c[i].arguments));
        cJSON_AddItemToObject(o, "function", fn);
        cJSON_AddItemToArray(a, o);
    }
    return a;
}

cJSON *evfmt_event(const tp_msg *m)
{
    cJSON *o = cJSON_CreateObject();
    if (m->cmd == TP_CMD_TOKEN) {
        const tp_m_token *t = &m->token;
        cJSON_AddStringToObject(o, "event", "token");
        cJSON_AddItemToObject(o, "job_id", evfmt_str(t->job_id));
        cJSON_AddNumberToObject(o, "seq", t->seq);
        cJSON_AddNumberToObject(o, "index", t->index);
        cJSON_AddItemToObject(o, "ids", evfmt_ids(t->ids));
        cJSON_AddItemToObject(o, "text", evfmt_str(t->text));
        if (t->reasoning.ptr)
            cJSON_AddItemToObject(o, "reasoning", evfmt_str(t->reasoning));
        if (t->n_tool_calls)
            cJSON_AddItemToObject(o, "tool_calls", evfmt_tool_calls(t->tool_calls, t->n_tool_calls));
        cJSON *lp = evfmt_logprobs(t->ids, &t->lp);
        if (lp)
            cJSON_AddItemToObject(o, "logprobs", lp);
        return o;
    }
    const tp_m_finish *f = &m->finish;
    cJSON_AddStringToObject(o, "event", "finish");
    cJSON_AddItemToObject(o, "job_id", evfmt_str(f->job_id));
    cJSON_AddNumberToObject(o, "seq", f->seq);
    cJSON_AddStringToObject(o, "reason", tp_reason_name(f->reason));
    cJSON_AddItemToObject(o, "matched", evfmt_matched(&f->matched));
    cJSON_AddItemToObject(o, "text", evfmt_str(f->text));
    cJSON_AddNumberToObject(o, "prompt_tokens", f->prompt_tokens);
    cJSON_AddNumberToObject(o, "cached_tokens", f->cached_tokens);
    cJSON_AddNumberToObject(o, "completion_tokens", f->completion_tokens);
    cJSON_AddNumberToObject(o, "text_len", (double)f->text_len);
    add_timings(o, &f->timings);
    if (f->job_error.ptr)
        cJSON_AddItemToObject(o, "error", evfmt_str(f->job_error));
    if (f->set & TP_ACK_SEED) {
        char seed[24];
        snprintf(seed, sizeof seed, "%llu", (unsigned long long)f->seed);
        cJSON_AddRawToObject(o, "seed", seed);
    }
    if (f->detail.ptr)
        cJSON_AddItemToObject(o, "detail", evfmt_str(f->detail));
    if (f->set & TP_FIN_GRAMMAR)
        cJSON_AddBoolToObject(o, "grammar_complete", f->grammar_complete);
    if (f->error_code.ptr)
        cJSON_AddItemToObject(o, "error_code", evfmt_str(f->error_code));
    if (f->context_length)
        cJSON_AddNumberToObject(o, "context_length", f->context_length);
    if (f->reasoning_content.ptr)
        cJSON_AddItemToObject(o, "reasoning_content", evfmt_str(f->reasoning_content));
    if (f->n_tool_calls)
        cJSON_AddItemToObject(o, "tool_calls", evfmt_tool_calls(f->tool_calls, f->n_tool_calls));
    if (f->tool_calls_cut)
        cJSON_AddTrueToObject(o, "tool_calls_cut");
    return o;
}

cJSON *evfmt_status(const tp_msg *m)
{
    const tp_m_status_reply *s = &m->status_reply;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "status", m->status);
    if (m->error.ptr)
        cJSON_AddItemToObject(o, "error", evfmt_str(m->error));
    cJSON_AddItemToObject(o, "job_id", evfmt_str(s->job_id));
    cJSON_AddStringToObject(o, "state", tp_state_name(s->state));
    cJSON_AddNumberToObject(o, "prompt_tokens", s->prompt_tokens);
    cJSON_AddNumberToObject(o, "cached_tokens", s->cached_tokens);
    cJSON_AddNumberToObject(o, "completion_tokens", s->completion_tokens);
    cJSON_AddNumberToObject(o, "last_seq", (double)s->last_seq);
    if (m->status != TP_ST_OK)
        return o;
    cJSON_AddItemToObject(o, "text", evfmt_str(s->text));
    cJSON_AddNumberToObject(o, "text_len", (double)(s->text_len > s->text.len ? s->text_len : s->text.len));
    cJSON_AddItemToObject(o, "tokens", evfmt_ids(s->tokens));
    cJSON *lp = evfmt_logprobs(s->tokens, &s->lp);
    if (lp)
        cJSON_AddItemToObject(o, "logprobs", lp);
    if (s->reasoning_content.ptr)
        cJSON_AddItemToObject(o, "reasoning_content", evfmt_str(s->reasoning_content));
    if (s->n_tool_calls)
        cJSON_AddItemToObject(o, "tool_calls", evfmt_tool_calls(s->tool_calls, s->n_tool_calls));
    if (s->state != TP_STATE_FINISHED)
        return o;
    cJSON_AddStringToObject(o, "finish_reason", tp_reason_name(s->reason));
    cJSON_AddItemToObject(o, "matched", evfmt_matched(&s->matched));
    if (s->job_error.ptr)
        cJSON_AddItemToObject(o, "job_error", evfmt_str(s->job_error));
    add_timings(o, &s->timings);
    return o;
}

/* The bound of the bucket holding quantile q: an upper estimate, as
 * Prometheus' histogram_quantile would give at a bucket edge (the last
 * bucket, above every bound, reports the largest bound). */
static uint64_t hist_quantile(const tp_hist *h, double q)
{
    uint64_t want = (uint64_t)(q * (double)h->count + 0.999999), seen = 0;
    for (size_t i = 0; i < h->n_buckets; i++) {
        seen += h->buckets[i];
        if (seen >= want && want)
            return h->bounds_us[i < h->n_bounds ? i : h->n_bounds - 1];
    }
    return 0;
}

static cJSON *u64_array(const uint64_t *v, size_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v[i]));
    return a;
}

static void add_histograms(cJSON *o, const tp_m_stats_reply *s)
{
    static const char *const names[TP_HIST_COUNT] = {"queue_us", "ttft_us", "itl_us", "e2e_us"};
    cJSON *hs = cJSON_AddObjectToObject(o, "histograms");
    for (int i = 0; i < TP_HIST_COUNT; i++) {
        const tp_hist *h = &s->hist[i];
        cJSON *x = cJSON_AddObjectToObject(hs, names[i]);
        cJSON_AddNumberToObject(x, "count", (double)h->count);
        cJSON_AddNumberToObject(x, "sum_us", (double)h->sum_us);
        if (!h->n_bounds)
            continue;
        cJSON_AddNumberToObject(x, "mean_us", h->count ? (double)h->sum_us / (double)h->count : 0);
        cJSON_AddNumberToObject(x, "p50_le_us", (double)hist_quantile(h, 0.5));
        cJSON_AddNumberToObject(x, "p90_le_us", (double)hist_quantile(h, 0.9));
        cJSON_AddNumberToObject(x, "p99_le_us", (double)hist_quantile(h, 0.99));
        cJSON_AddItemToObject(x, "bounds_us", u64_array(h->bounds_us, h->n_bounds));
        cJSON_AddItemToObject(x, "buckets", u64_array(h->buckets, h->n_buckets));
    }
}

cJSON *evfmt_stats(const tp_msg *m)
{
    const tp_m_stats_reply *s = &m->stats_reply;
    cJSON *o = cJSON_CreateObject();
    const struct {
        const char *k;
        uint64_t v;
    } c[] = {
        {"uptime_ms", s->uptime_ms}, {"jobs_submitted", s->jobs_submitted}, {"jobs_rejected", s->jobs_rejected},
        {"jobs_active", s->jobs_active}, {"jobs_finished", s->jobs_finished},
        {"tokens_generated", s->tokens_generated}, {"events_published", s->events_published},
        {"malformed_front", s->malformed_front}, {"malformed_back", s->malformed_back},
        {"malformed_events", s->malformed_events}, {"forward_steps", s->forward_steps},
        {"forward_rows", s->forward_rows}, {"forward_tokens", s->forward_tokens},
        {"zap_refused", s->zap_refused}, {"jobs_running", s->jobs_running}, {"jobs_waiting", s->jobs_waiting},
        {"kv_slots_used", s->kv_slots_used}, {"kv_slots_total", s->kv_slots_total},
        {"workers_lost", s->workers_lost}, {"jobs_poisoned", s->jobs_poisoned},
        {"workers_hung", s->workers_hung}, {"replies_refused", s->replies_refused},
        {"recovered_tokenize", s->recovered[0]}, {"recovered_forward", s->recovered[1]},
        {"recovered_sample", s->recovered[2]}, {"recovered_stop", s->recovered[3]},
        {"recovery_count", s->recovery_count}, {"recovery_ms_total", s->recovery_ms_total},
        {"recovery_ms_max", s->recovery_ms_max}, {"events_duplicate", s->events_duplicate},
        {"events_refused", s->events_refused},
        {"prefix_lookups", s->prefix_lookups}, {"prefix_hit_tokens", s->prefix_hit_tokens},
        {"prefix_prompt_tokens", s->prefix_prompt_tokens}, {"prefix_evictions", s->prefix_evictions},
        {"prefix_pages_used", s->prefix_pages_used}, {"prefix_pages_cached", s->prefix_pages_cached},
        {"prefix_pages_total", s->prefix_pages_total}, {"prefix_bytes", s->prefix_bytes},
        {"kv_bytes_held", s->kv_bytes_held}, {"kv_bytes_pool", s->kv_bytes_pool},
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++)
        cJSON_AddNumberToObject(o, c[i].k, (double)c[i].v);
    cJSON *w = cJSON_AddObjectToObject(o, "workers");
    for (unsigned b = 0; b < 5; b++)
        cJSON_AddNumberToObject(w, tp_stage_name(1u << b), (double)s->workers[b]);
    cJSON *failed = cJSON_AddArrayToObject(o, "stages_failed");
    for (unsigned b = 0; b < 5; b++)
        if (s->stages_failed & (1u << b))
            cJSON_AddItemToArray(failed, cJSON_CreateString(tp_stage_name(1u << b)));
    cJSON *f = cJSON_AddObjectToObject(o, "finish");
    for (int r = 1; r < TP_REASON_COUNT; r++)
        cJSON_AddNumberToObject(f, tp_reason_name(r), (double)s->finish[r]);
    cJSON *t = cJSON_AddArrayToObject(o, "stop_triggers");
    for (size_t i = 0; i < s->n_triggers; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddItemToObject(e, "matched", evfmt_matched(&s->triggers[i].key));
        cJSON_AddNumberToObject(e, "count", (double)s->triggers[i].count);
        cJSON_AddBoolToObject(e, "truncated", s->triggers[i].truncated);
        cJSON_AddItemToArray(t, e);
    }
    cJSON_AddNumberToObject(o, "triggers_other", (double)s->triggers_other);
    add_histograms(o, s);
    return o;
}

void evfmt_print_line(FILE *out, cJSON *j)
{
    char *s = cJSON_PrintUnformatted(j);
    if (s)
        fprintf(out, "%s\n", s);
    free(s);
    cJSON_Delete(j);
}
