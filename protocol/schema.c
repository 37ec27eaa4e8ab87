/* The schema of every message (PROTOCOL.md in table form) and the
 * cross-field rules no single field can check. */
#include "schema.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>
#include <stdio.h>

#define M(member) offsetof(tp_msg, member)
#define P(member) offsetof(tp_params, member)
#define END {.key = NULL}

#define F_U32(k, o, fl, lo, hi) {.key = k, .type = FT_U32, .off = o, .flags = fl, .ilo = lo, .ihi = hi}
#define F_U64(k, o, fl) {.key = k, .type = FT_U64, .off = o, .flags = fl}
#define F_I32(k, o, fl, lo, hi) {.key = k, .type = FT_I32, .off = o, .flags = fl, .ilo = lo, .ihi = hi}
#define F_I64(k, o, fl, lo, hi) {.key = k, .type = FT_I64, .off = o, .flags = fl, .ilo = lo, .ihi = hi}
#define F_BOOL(k, o, fl) {.key = k, .type = FT_BOOL, .off = o, .flags = fl}
#define F_STR(k, o, fl, mx) {.key = k, .type = FT_STR, .off = o, .flags = fl, .max = mx}
#define F_JOBID(k, o, fl) F_STR(k, o, (fl) | FF_JOBID, TP_PROTO_MAX_JOB_ID)

#define REQ F_U64("req", M(req), 0)
/* PROTOCOL.md: a reply copies req, 0 included, so a client can read it without a default */
#define REQ_REPLY F_U64("req", M(req), FF_ALWAYS)
#define TASK F_U64("task", M(task), FF_REQUIRED)
#define STATUS F_U32("status", M(status), FF_REQUIRED, 100, 599)
#define ERROR F_STR("error", M(error), 0, TP_PROTO_MAX_ERROR)
#define SLOT(o) F_U32("slot", o, FF_REQUIRED, 0, UINT32_MAX)
#define STEPNO(o) F_U64("step", o, FF_REQUIRED)
#define COUNT(k, o, lo, hi) F_U32(k, o, FF_REQUIRED, lo, hi)

/* The logprob columns: a top_n header key and three optional frames. */
#define TOP_N(o) F_U32("top_n", o, FF_LP_TOP_N, 0, TP_PROTO_MAX_TOP_LOGPROBS)
#define LP_FRAMES(o) {"logprobs", (o) + offsetof(tp_lp_cols, logprobs), 4, 1}, \
    {"top_ids", (o) + offsetof(tp_lp_cols, top_ids), 4, 1}, {"top_logprobs", (o) + offsetof(tp_lp_cols, top_logprobs), 4, 1}

/* ---- generation parameters ---- */

static const field spec_fields[] = {
    {.key = "mode", .type = FT_STR, .off = offsetof(tp_spec_params, mode), .flags = FF_NONEMPTY,
     .max = TP_PROTO_MAX_NAME, .setbit = TP_SPEC_P_MODE},
    {.key = "n_max", .type = FT_I32, .off = offsetof(tp_spec_params, n_max), .ilo = 1, .ihi = 16,
     .setbit = TP_SPEC_P_N_MAX},
    END,
};
static const table spec_table = {spec_fields, (long)offsetof(tp_spec_params, set)};

static const field params_fields[] = {
    {.key = "max_tokens", .type = FT_I32, .off = P(max_tokens), .ilo = 1, .ihi = INT32_MAX, .setbit = TP_P_MAX_TOKENS},
    {.key = "min_tokens", .type = FT_I32, .off = P(min_tokens), .ilo = 0, .ihi = INT32_MAX, .setbit = TP_P_MIN_TOKENS},
    {.key = "temperature", .type = FT_F64, .off = P(temperature), .flo = 0, .fhi = FLT_MAX, .setbit = TP_P_TEMPERATURE},
    {.key = "top_p", .type = FT_F64, .off = P(top_p), .flags = FF_LO_OPEN, .flo = 0, .fhi = 1, .setbit = TP_P_TOP_P},
    {.key = "top_k", .type = FT_I32, .off = P(top_k), .ilo = 0, .ihi = INT32_MAX, .setbit = TP_P_TOP_K},
    {.key = "min_p", .type = FT_F64, .off = P(min_p), .flo = 0, .fhi = 1, .setbit = TP_P_MIN_P},
    {.key = "repetition_penalty", .type = FT_F64, .off = P(repetition_penalty), .flags = FF_LO_OPEN,
     .flo = 0, .fhi = FLT_MAX, .setbit = TP_P_REPETITION_PENALTY},
    {.key = "presence_penalty", .type = FT_F64, .off = P(presence_penalty), .flo = -2, .fhi = 2,
     .setbit = TP_P_PRESENCE_PENALTY},
    {.key = "frequency_penalty", .type = FT_F64, .off = P(frequency_penalty), .flo = -2, .fhi = 2,
     .setbit = TP_P_FREQUENCY_PENALTY},
    {.key = "penalty_window", .type = FT_I32, .off = P(penalty_window), .ilo = 0, .ihi = INT32_MAX,
     .setbit = TP_P_PENALTY_WINDOW},
    {.key = "seed", .type = FT_U64, .off = P(seed), .setbit = TP_P_SEED},
    {.key = "stop", .type = FT_STRS, .off = P(stop), .flags = FF_NONEMPTY, .max = TP_PROTO_MAX_STOP,
     .max_elem = TP_PROTO_MAX_STOP_LEN, .setbit = TP_P_STOP},
    {.key = "stop_token_ids", .type = FT_I32S, .off = P(stop_token_ids), .ilo = 0, .ihi = INT32_MAX,
     .max = TP_PROTO_MAX_STOP_IDS, .setbit = TP_P_STOP_TOKEN_IDS},
    {.key = "ignore_eos", .type = FT_BOOL, .off = P(ignore_eos), .setbit = TP_P_IGNORE_EOS},
    {.key = "include_stop_str_in_output", .type = FT_BOOL, .off = P(include_stop_str_in_output),
     .setbit = TP_P_INCLUDE_STOP},
    {.key = "logprobs", .type = FT_BOOL, .off = P(logprobs), .setbit = TP_P_LOGPROBS},
    {.key = "top_logprobs", .type = FT_I32, .off = P(top_logprobs), .ilo = 0, .ihi = TP_PROTO_MAX_TOP_LOGPROBS,
     .setbit = TP_P_TOP_LOGPROBS},
    {.key = "logprobs_mode", .type = FT_STR, .off = P(logprobs_mode), .max = TP_PROTO_MAX_NAME,
     .setbit = TP_P_LOGPROBS_MODE},
    {.key = "typical_p", .type = FT_F64, .off = P(typical_p), .flags = FF_LO_OPEN, .flo = 0, .fhi = 1,
     .setbit = TP_P_TYPICAL_P},
    {.key = "logit_bias", .type = FT_BIAS, .off = P(logit_bias), .flo = -100, .fhi = 100,
     .max = TP_PROTO_MAX_LOGIT_BIAS, .setbit = TP_P_LOGIT_BIAS},
    {.key = "truncate_prompt_tokens", .type = FT_I32, .off = P(truncate_prompt_tokens), .ilo = 1,
     .ihi = INT32_MAX, .setbit = TP_P_TRUNCATE_PROMPT},
    {.key = "grammar", .type = FT_STR, .off = P(grammar), .flags = FF_NONEMPTY, .max = TP_PROTO_MAX_GRAMMAR,
     .setbit = TP_P_GRAMMAR},
    {.key = "json_schema", .type = FT_STR, .off = P(json_schema), .flags = FF_NONEMPTY, .max = TP_PROTO_MAX_GRAMMAR,
     .setbit = TP_P_JSON_SCHEMA},
    {.key = "json_mode", .type = FT_BOOL, .off = P(json_mode), .setbit = TP_P_JSON_MODE},
    {.key = "gbnf", .type = FT_STR, .off = P(gbnf), .flags = FF_NONEMPTY, .max = TP_PROTO_MAX_GRAMMAR,
     .setbit = TP_P_GBNF},
    {.key = "grammar_trigger", .type = FT_STR, .off = P(grammar_trigger), .flags = FF_NONEMPTY,
     .max = TP_PROTO_MAX_NAME},
    {.key = "parse_tool_calls", .type = FT_BOOL, .off = P(parse_tool_calls), .setbit = TP_P_PARSE_TOOL_CALLS},
    {.key = "parse_reasoning", .type = FT_BOOL, .off = P(parse_reasoning), .setbit = TP_P_PARSE_REASONING},
    {.key = "parallel_tool_calls", .type = FT_BOOL, .off = P(parallel_tool_calls),
     .setbit = TP_P_PARALLEL_TOOL_CALLS},
    {.key = "speculative", .type = FT_MAP, .off = P(speculative), .sub = &spec_table},
    END,
};
static const table params_table = {params_fields, (long)P(set)};

int schema_float_check(const field *f, double v, char *msg, size_t cap)
{
    bool open = f->flags & FF_LO_OPEN;
    char lo = open ? '(' : '[';
    /* written so NaN fails */
    if (!(open ? v > f->flo : v >= f->flo) || !(v <= f->fhi))
        return snprintf(msg, cap, "%g is outside %c%g, %g]", v, lo, f->flo, f->fhi), -1;
    float fv = (float)v;
    if (!(open ? fv > f->flo : fv >= f->flo) || !(fv <= f->fhi) || isinf(fv))
        return snprintf(msg, cap, "%g is outside %c%g, %g] as a 32-bit float (it becomes %g)", v, lo, f->flo,
                        f->fhi, (double)fv), -1;
    return 0;
}

int tp_proto_param_float(const char *key, double v, float *out, tp_err *err)
{
    for (const field *f = params_fields; f->key; f++)
        if (f->type == FT_F64 && !strcmp(f->key, key)) {
            char msg[TP_ERR_MSG_MAX];
            if (schema_float_check(f, v, msg, sizeof msg))
                return tp_err_set(err, TP_EINVAL, "%s: %s", key, msg);
            *out = (float)v;
            return 0;
        }
    return tp_err_set(err, TP_EINVAL, "%s: not a float parameter", key);
}

#define PARAMS(o) {.key = "params", .type = FT_MAP, .off = o, .sub = &params_table}

/* ---- JOB1 ---- */

static const field submit_f[] = {
    REQ, F_JOBID("job_id", M(submit.job_id), 0),
    F_STR("prompt", M(submit.prompt), 0, TP_PROTO_MAX_PROMPT),
    PARAMS(M(submit.params)), F_BOOL("parse_special", M(submit.parse_special), 0),
    {.key = "messages", .type = FT_MSGS, .off = M(submit.messages), .flags = FF_NONEMPTY,
     .max = TP_PROTO_MAX_MESSAGES, .max_elem = TP_PROTO_MAX_PROMPT},
    F_STR("tools", M(submit.tools), 0, TP_PROTO_MAX_TOOLS),
    F_STR("tool_choice", M(submit.tool_choice), 0, TP_PROTO_MAX_NAME),
    F_STR("tool_choice_name", M(submit.tool_choice_name), FF_NONEMPTY, TP_PROTO_MAX_NAME * 4),
    F_STR("reasoning_effort", M(submit.reasoning_effort), FF_NONEMPTY, TP_PROTO_MAX_NAME),
    F_STR("embed", M(submit.embed), FF_NONEMPTY, TP_PROTO_MAX_NAME),
    END,
};
static const pframe submit_p[] = {{"prompt_ids", M(submit.prompt_ids), 4, 1}, {NULL, 0, 0, 0}};

#define ERROR_CODE(o) F_STR("error_code", o, 0, TP_PROTO_MAX_NAME)
static const field ack_f[] = {
    REQ_REPLY, STATUS, ERROR, F_JOBID("job_id", M(ack.job_id), FF_REQUIRED),
    F_STR("field", M(ack.field), 0, TP_PROTO_MAX_NAME),
    {.key = "seed", .type = FT_U64, .off = M(ack.seed), .setbit = TP_ACK_SEED},
    ERROR_CODE(M(ack.error_code)), F_U32("prompt_tokens", M(ack.prompt_tokens), 0, 0, UINT32_MAX),
    F_U32("context_length", M(ack.context_length), 0, 0, UINT32_MAX), END,
};
static const field error_f[] = {
    REQ_REPLY, STATUS, F_STR("error", M(error), FF_REQUIRED, TP_PROTO_MAX_ERROR),
    F_STR("field", M(ack.field), 0, TP_PROTO_MAX_NAME), ERROR_CODE(M(ack.error_code)),
    F_U32("prompt_tokens", M(ack.prompt_tokens), 0, 0, UINT32_MAX),
    F_U32("context_length", M(ack.context_length), 0, 0, UINT32_MAX), END,
};
static const field jobref_f[] = {REQ, F_JOBID("job_id", M(jobref.job_id), FF_REQUIRED | FF_NONEMPTY), END};

#define SR(m) M(status_reply.m)
static const field status_reply_f[] = {
    REQ_REPLY, STATUS, ERROR, F_JOBID("job_id", SR(job_id), FF_REQUIRED),
    {.key = "state", .type = FT_STATE, .off = SR(state), .flags = FF_REQUIRED},
    F_U32("prompt_tokens", SR(prompt_tokens), FF_REQUIRED, 0, UINT32_MAX),
    F_U32("completion_tokens", SR(completion_tokens), FF_REQUIRED, 0, UINT32_MAX),
    F_U32("cached_tokens", SR(cached_tokens), 0, 0, UINT32_MAX),
    F_I64("last_seq", SR(last_seq), FF_REQUIRED, -1, UINT32_MAX),
    {.key = "reason", .type = FT_REASON, .off = SR(reason), .flags = FF_FINISHED},
    {.key = "matched", .type = FT_MATCHED, .off = SR(matched), .flags = FF_FINISHED},
    F_STR("text", SR(text), 0, TP_PROTO_MAX_TEXT), F_U64("text_len", SR(text_len), 0),
    F_STR("job_error", SR(job_error), 0, TP_PROTO_MAX_ERROR),
    F_U64("queue_us", SR(timings.queue_us), FF_FINISHED), F_U64("ttft_us", SR(timings.ttft_us), FF_FINISHED),
    F_U64("total_us", SR(timings.total_us), FF_FINISHED), TOP_N(SR(lp.top_n)),
    F_STR("reasoning_content", SR(reasoning_content), 0, TP_PROTO_MAX_TEXT),
    {.key = "tool_calls", .type = FT_CALLS, .off = SR(tool_calls), .max = TP_PROTO_MAX_TOOL_CALLS}, END,
};
static const pframe status_reply_p[] = {{"tokens", SR(tokens), 4, 1}, LP_FRAMES(SR(lp)), {NULL, 0, 0, 0}};

static const field stats_f[] = {REQ, END};

static const field workers_fields[] = {
    F_U64("tokenize", 0, 0), F_U64("forward", 8, 0), F_U64("sample", 16, 0), F_U64("stop", 24, 0), F_U64("draft", 32, 0), END,
};
static const table workers_table = {workers_fields, -1};
static const field finish_fields[] = {
    F_U64("stop_string", 8 * TP_REASON_STOP_STRING, 0), F_U64("stop_token", 8 * TP_REASON_STOP_TOKEN, 0),
    F_U64("eos", 8 * TP_REASON_EOS, 0), F_U64("length", 8 * TP_REASON_LENGTH, 0),
    F_U64("cancelled", 8 * TP_REASON_CANCELLED, 0), F_U64("error", 8 * TP_REASON_ERROR, 0), END,
};
static const table finish_table = {finish_fields, -1};

#define H(m) offsetof(tp_hist, m)
static const field hist_fields[] = {
    F_U64("count", H(count), 0), F_U64("sum_us", H(sum_us), 0),
    {.key = "bounds_us", .type = FT_U64S, .off = H(bounds_us), .max = TP_PROTO_MAX_BUCKETS},
    {.key = "buckets", .type = FT_U64S, .off = H(buckets), .max = TP_PROTO_MAX_BUCKETS + 1}, END,
};
static const table hist_table = {hist_fields, -1};
#define HIST(k, i) {.key = k, .type = FT_MAP, .off = (i) * sizeof(tp_hist), .sub = &hist_table}
static const field hists_fields[] = {
    HIST("queue_us", TP_HIST_QUEUE), HIST("ttft_us", TP_HIST_TTFT), HIST("itl_us", TP_HIST_ITL),
    HIST("e2e_us", TP_HIST_E2E), END,
};
static const table hists_table = {hists_fields, -1};

#define ST(m) M(stats_reply.m)
static const field stats_reply_f[] = {
    REQ_REPLY, STATUS, ERROR,
    F_U64("uptime_ms", ST(uptime_ms), 0), F_U64("jobs_submitted", ST(jobs_submitted), 0),
    F_U64("jobs_rejected", ST(jobs_rejected), 0), F_U64("jobs_active", ST(jobs_active), 0),
    F_U64("jobs_finished", ST(jobs_finished), 0), F_U64("tokens_generated", ST(tokens_generated), 0),
    F_U64("events_published", ST(events_published), 0), F_U64("malformed_front", ST(malformed_front), 0),
    F_U64("malformed_back", ST(malformed_back), 0), F_U64("malformed_events", ST(malformed_events), 0),
    {.key = "workers", .type = FT_MAP, .off = ST(workers), .flags = FF_REQUIRED, .sub = &workers_table},
    {.key = "finish", .type = FT_MAP, .off = ST(finish), .flags = FF_REQUIRED, .sub = &finish_table},
    {.key = "stop_triggers", .type = FT_TRIGGERS, .off = ST(triggers), .flags = FF_REQUIRED,
     .max = TP_PROTO_MAX_TRIGGERS},
    F_U64("triggers_other", ST(triggers_other), 0), F_U64("forward_steps", ST(forward_steps), 0),
    F_U64("forward_rows", ST(forward_rows), 0), F_U64("forward_tokens", ST(forward_tokens), 0),
    F_U64("spec_drafted", ST(spec_drafted), 0), F_U64("spec_accepted", ST(spec_accepted), 0),
    F_U64("spec_verify_steps", ST(spec_verify_steps), 0), F_U64("spec_verify_tokens", ST(spec_verify_tokens), 0),
    F_U64("zap_refused", ST(zap_refused), 0), F_U64("jobs_running", ST(jobs_running), 0),
    F_U64("jobs_waiting", ST(jobs_waiting), 0), F_U64("kv_slots_used", ST(kv_slots_used), 0),
    F_U64("kv_slots_total", ST(kv_slots_total), 0),
    {.key = "histograms", .type = FT_MAP, .off = ST(hist), .sub = &hists_table},
    F_U64("workers_lost", ST(workers_lost), 0), F_U64("jobs_poisoned", ST(jobs_poisoned), 0),
    F_U64("workers_hung", ST(workers_hung), 0), F_U64("replies_refused", ST(replies_refused), 0),
    F_U64("recovered_tokenize", ST(recovered[0]), 0), F_U64("recovered_forward", ST(recovered[1]), 0),
    F_U64("recovered_sample", ST(recovered[2]), 0), F_U64("recovered_stop", ST(recovered[3]), 0),
    F_U64("recovery_count", ST(recovery_count), 0), F_U64("recovery_ms_total", ST(recovery_ms_total), 0),
    F_U64("recovery_ms_max", ST(recovery_ms_max), 0), F_U64("events_duplicate", ST(events_duplicate), 0),
    {.key = "stages_failed", .type = FT_STAGES, .off = ST(stages_failed)},
    F_U64("events_refused", ST(events_refused), 0),
    F_U64("prefix_lookups", ST(prefix_lookups), 0), F_U64("prefix_hit_tokens", ST(prefix_hit_tokens), 0),
    F_U64("prefix_prompt_tokens", ST(prefix_prompt_tokens), 0), F_U64("prefix_evictions", ST(prefix_evictions), 0),
    F_U64("prefix_pages_used", ST(prefix_pages_used), 0), F_U64("prefix_pages_cached", ST(prefix_pages_cached), 0),
    F_U64("prefix_pages_total", ST(prefix_pages_total), 0), F_U64("prefix_bytes", ST(prefix_bytes), 0),
    F_U64("kv_bytes_held", ST(kv_bytes_held), 0), F_U64("kv_bytes_pool", ST(kv_bytes_pool), 0), END,
};

#define IR(m) M(info_reply.m)
static const field limits_fields[] = {
    F_U32("max_tokens", offsetof(tp_m_info_limits, max_tokens), 0, 0, UINT32_MAX),
    F_U32("max_prompt_bytes", offsetof(tp_m_info_limits, max_prompt_bytes), 0, 0, UINT32_MAX),
    F_U32("max_stop_strings", offsetof(tp_m_info_limits, max_stop_strings), 0, 0, UINT32_MAX),
    F_U32("max_stop_len", offsetof(tp_m_info_limits, max_stop_len), 0, 0, UINT32_MAX),
    F_U32("max_stop_ids", offsetof(tp_m_info_limits, max_stop_ids), 0, 0, UINT32_MAX),
    F_U32("max_penalty_window", offsetof(tp_m_info_limits, max_penalty_window), 0, 0, UINT32_MAX),
    F_U32("max_concurrent_jobs", offsetof(tp_m_info_limits, max_concurrent_jobs), 0, 0, UINT32_MAX),
    F_U32("max_logit_bias", offsetof(tp_m_info_limits, max_logit_bias), 0, 0, UINT32_MAX),
    F_U32("max_top_logprobs", offsetof(tp_m_info_limits, max_top_logprobs), 0, 0, UINT32_MAX),
    F_U32("max_grammar_bytes", offsetof(tp_m_info_limits, max_grammar_bytes), 0, 0, UINT32_MAX),
    F_U32("max_grammar_rules", offsetof(tp_m_info_limits, max_grammar_rules), 0, 0, UINT32_MAX),
    F_U32("max_grammar_compile_ms", offsetof(tp_m_info_limits, max_grammar_compile_ms), 0, 0, UINT32_MAX),
    F_U32("max_schema_bytes", offsetof(tp_m_info_limits, max_schema_bytes), 0, 0, UINT32_MAX),
    F_U32("max_schema_depth", offsetof(tp_m_info_limits, max_schema_depth), 0, 0, UINT32_MAX), END,
};
static const table limits_table = {limits_fields, -1};
#define EOG_IDS(o) {.key = "eog_ids", .type = FT_I32S, .off = o, .ilo = 0, .ihi = INT32_MAX, .max = TP_PROTO_MAX_EOG}
static const field info_reply_f[] = {
    REQ_REPLY, STATUS, ERROR, F_STR("model_id", IR(model_id), FF_REQUIRED, TP_PROTO_MAX_MODEL_ID),
    F_U32("vocab_size", IR(vocab_size), FF_REQUIRED, 0, TP_PROTO_MAX_VOCAB),
    F_U32("context_length", IR(context_length), FF_REQUIRED, 0, UINT32_MAX),
    F_I32("bos_id", IR(bos_id), FF_REQUIRED, -1, INT32_MAX), F_I32("eos_id", IR(eos_id), FF_REQUIRED, -1, INT32_MAX),
    EOG_IDS(IR(eog_ids)),
    F_BOOL("chat_template", IR(chat_template), 0), F_STR("weight_type", IR(weight_type), 0, TP_PROTO_MAX_NAME),
    {.key = "limits", .type = FT_MAP, .off = IR(limits), .flags = FF_REQUIRED, .sub = &limits_table}, END,
};
static const pframe info_reply_p[] = {{"special_ids", IR(special_ids), 4, 1}, {"special_text", IR(special_text), 1, 1},
                                      {NULL, 0, 0, 0}};

/* ---- EVT1 ---- */

static const field token_f[] = {
    F_JOBID("job_id", M(token.job_id), FF_REQUIRED | FF_NONEMPTY),
    F_U32("seq", M(token.seq), FF_REQUIRED, 0, UINT32_MAX),
    F_U32("index", M(token.index), FF_REQUIRED, 0, UINT32_MAX),
    F_STR("text", M(token.text), FF_REQUIRED, TP_PROTO_MAX_TEXT), TOP_N(M(token.lp.top_n)), F_U64("pin", M(token.pin), 0),
    F_STR("reasoning", M(token.reasoning), 0, TP_PROTO_MAX_TEXT),
    {.key = "tool_calls", .type = FT_CALLS, .off = M(token.tool_calls), .max = TP_PROTO_MAX_TOOL_CALLS}, END,
};
static const pframe token_p[] = {{"ids", M(token.ids), 4, 0}, LP_FRAMES(M(token.lp)), {NULL, 0, 0, 0}};

#define FI(m) M(finish.m)
static const field finish_f[] = {
    F_JOBID("job_id", FI(job_id), FF_REQUIRED | FF_NONEMPTY),
    F_U32("seq", FI(seq), FF_REQUIRED, 0, UINT32_MAX),
    {.key = "reason", .type = FT_REASON, .off = FI(reason), .flags = FF_REQUIRED},
    {.key = "matched", .type = FT_MATCHED, .off = FI(matched), .flags = FF_REQUIRED},
    F_STR("text", FI(text), FF_REQUIRED, TP_PROTO_MAX_TEXT),
    F_STR("error", FI(job_error), 0, TP_PROTO_MAX_ERROR),
    F_U32("prompt_tokens", FI(prompt_tokens), FF_REQUIRED, 0, UINT32_MAX),
    F_U32("completion_tokens", FI(completion_tokens), FF_REQUIRED, 0, UINT32_MAX),
    F_U32("cached_tokens", FI(cached_tokens), 0, 0, UINT32_MAX),
    F_U32("draft_tokens", FI(draft_tokens), 0, 0, UINT32_MAX), F_U32("draft_accepted", FI(draft_accepted), 0, 0, UINT32_MAX),
    F_U64("text_len", FI(text_len), FF_REQUIRED), F_U64("queue_us", FI(timings.queue_us), FF_REQUIRED),
    F_U64("ttft_us", FI(timings.ttft_us), FF_REQUIRED), F_U64("total_us", FI(timings.total_us), FF_REQUIRED),
    F_U64("pin", FI(pin), 0),     {.key = "seed", .type = FT_U64, .off = FI(seed), .setbit = TP_ACK_SEED}, ERROR_CODE(FI(error_code)),
    F_U32("context_length", FI(context_length), 0, 0, UINT32_MAX), F_STR("detail", FI(detail), 0, TP_PROTO_MAX_NAME),
    {.key = "grammar_complete", .type = FT_BOOL, .off = FI(grammar_complete), .setbit = TP_FIN_GRAMMAR},
    F_STR("reasoning_content", FI(reasoning_content), 0, TP_PROTO_MAX_TEXT),
    {.key = "tool_calls", .type = FT_CALLS, .off = FI(tool_calls), .max = TP_PROTO_MAX_TOOL_CALLS},
    {.key = "tool_calls_cut", .type = FT_BOOL, .off = FI(tool_calls_cut)},
    END,
};
static const pframe finish_p[] = {{"embedding", M(finish.embedding), 4, 1}, {NULL, 0, 0, 0}};

static const field beat_f[] = {
    F_U64("incarnation", M(beat.incarnation), FF_REQUIRED), F_U64("uptime_ms", M(beat.uptime_ms), FF_REQUIRED),
    F_U32("interval_ms", M(beat.interval_ms), FF_REQUIRED, 1, UINT32_MAX),
    F_U32("liveness", M(beat.liveness), FF_REQUIRED, 1, UINT32_MAX), END,
};

/* ---- WRK1 control ---- */

#define RD(m) M(ready.m)
static const field ready_f[] = {
    {.key = "stages", .type = FT_STAGES, .off = RD(stages), .flags = FF_REQUIRED},
    F_STR("instance", RD(instance), FF_REQUIRED | FF_NONEMPTY, TP_PROTO_MAX_NAME),
    F_U64("incarnation", RD(incarnation), FF_REQUIRED),
    F_U32("capacity", RD(capacity), FF_REQUIRED, 1, UINT32_MAX),
    F_U32("heartbeat_ms", RD(heartbeat_ms), FF_REQUIRED, 0, UINT32_MAX),
    F_STR("model_id", RD(model_id), FF_REQUIRED, TP_PROTO_MAX_MODEL_ID),
    F_U32("vocab_size", RD(vocab_size), FF_REQUIRED, 0, TP_PROTO_MAX_VOCAB),
    F_I32("bos_id", RD(bos_id), FF_REQUIRED, -1, INT32_MAX),
    F_I32("eos_id", RD(eos_id), FF_REQUIRED, -1, INT32_MAX),
    F_U32("seq_len", RD(seq_len), FF_REQUIRED, 0, UINT32_MAX),
    F_U32("max_batch_tokens", RD(max_batch_tokens), FF_REQUIRED, 0, UINT32_MAX),
    EOG_IDS(RD(eog_ids)),
    F_BOOL("chat_template", RD(chat_template), 0), F_STR("tool_syntax", RD(tool_syntax), 0, TP_PROTO_MAX_NAME),
    F_BOOL("think_open", RD(think_open), 0),
    F_STR("weight_type", RD(weight_type), 0, TP_PROTO_MAX_NAME), END,
};
static const pframe ready_p[] = {{"special_ids", RD(special_ids), 4, 1}, {"special_text", RD(special_text), 1, 1},
                                 {NULL, 0, 0, 0}};
static const field welcome_f[] = {
    F_U64("incarnation", M(welcome.incarnation), FF_REQUIRED),
    F_U32("heartbeat_ms", M(welcome.heartbeat_ms), FF_REQUIRED, 0, UINT32_MAX),
    F_U32("liveness", M(welcome.liveness), FF_REQUIRED, 0, UINT32_MAX),
    F_U32("worker_no", M(welcome.worker_no), FF_REQUIRED, 0, UINT32_MAX), END,
};
static const field heartbeat_f[] = {
    F_U64("progress", M(heartbeat.progress), 0),
    F_U32("inflight", M(heartbeat.inflight), 0, 0, UINT32_MAX), END,
};
static const field disconnect_f[] = {F_STR("reason", M(disconnect.reason), FF_REQUIRED, TP_PROTO_MAX_ERROR), END};
static const field result_f[] = {TASK, STATUS, ERROR, END};

/* ---- WRK1 stages ---- */

static const field tokenize_f[] = {
    TASK, SLOT(M(tokenize.slot)), F_STR("text", M(tokenize.text), FF_REQUIRED, TP_PROTO_MAX_PROMPT),
    F_BOOL("add_bos", M(tokenize.add_bos), FF_REQUIRED),
    F_BOOL("parse_special", M(tokenize.parse_special), 0),
    {.key = "messages", .type = FT_MSGS, .off = M(tokenize.messages), .flags = FF_NONEMPTY,
     .max = TP_PROTO_MAX_MESSAGES, .max_elem = TP_PROTO_MAX_PROMPT},
    F_STR("tools", M(tokenize.tools), 0, TP_PROTO_MAX_TOOLS),
    F_STR("reasoning_effort", M(tokenize.reasoning_effort), FF_NONEMPTY, TP_PROTO_MAX_NAME),
    END,
};
static const field tokenized_f[] = {
    TASK, STATUS, ERROR, SLOT(M(tokenized.slot)),
    {.key = "stop_ids", .type = FT_I32S, .off = M(tokenized.stop_ids), .ilo = 0, .ihi = INT32_MAX,
     .max = TP_PROTO_MAX_STOP_IDS},
    END,
};
static const pframe tokenized_p[] = {{"ids", M(tokenized.ids), 4, 1}, {NULL, 0, 0, 0}};

static const field slot_f[] = {TASK, SLOT(M(slot.slot)), F_U32("pool", M(slot.pool), 0, 0, TP_POOL_MODEL), END};

static const field embedded_f[] = {
    TASK, STATUS, ERROR, STEPNO(M(embedded.step)), COUNT("n", M(embedded.n), 1, TP_PROTO_MAX_ITEMS),
    COUNT("dim", M(embedded.dim), 1, TP_PROTO_MAX_VOCAB), END,
};
static const pframe embedded_p[] = {{"slots", M(embedded.slots), 4, 0}, {"embd", M(embedded.embd), 4, 0},
                                    {NULL, 0, 0, 0}};

#define SP(m) M(step.m)
static const field step_f[] = {
    TASK, STEPNO(SP(step)), COUNT("n", SP(n), 1, TP_PROTO_MAX_ITEMS),
    COUNT("n_tokens", SP(n_tokens), 1, TP_PROTO_MAX_IDS), F_BOOL("sample", SP(sample), FF_REQUIRED), END,
};
static const pframe step_p[] = {
    {"slots", SP(slots), 4, 0}, {"pos", SP(pos), 4, 0}, {"ntok", SP(ntok), 4, 0},
    {"flags", SP(flags), 1, 0}, {"tokens", SP(tokens), 4, 0}, {"accepted", SP(accepted), 4, 0},
    {NULL, 0, 0, 0},
};

#define SR2(m) M(step_result.m)
static const field step_result_f[] = {
    TASK, STATUS, ERROR, STEPNO(SR2(step)), COUNT("n", SR2(n), 0, TP_PROTO_MAX_ITEMS),
    COUNT("vocab", SR2(vocab), 0, TP_PROTO_MAX_VOCAB), F_BOOL("sampled", SR2(sampled), FF_REQUIRED),
    TOP_N(SR2(lp.top_n)),
    {.key = "cached_slots", .type = FT_I32S, .off = SR2(cached_slots), .ilo = 0, .ihi = INT32_MAX,
     .max = TP_PROTO_MAX_ITEMS},
    {.key = "cached", .type = FT_I32S, .off = SR2(cached), .ilo = 1, .ihi = INT32_MAX, .max = TP_PROTO_MAX_ITEMS},
    {.key = "cache", .type = FT_U64S, .off = SR2(cache), .max = 64}, END,
};
static const pframe step_result_p[] = {
    {"slots", SR2(slots), 4, 1}, {"out", SR2(out), 4, 1}, LP_FRAMES(SR2(lp)), {NULL, 0, 0, 0},
};

static const field sample_open_f[] = {
    TASK, SLOT(M(sample_open.slot)), PARAMS(M(sample_open.params)),
    {.key = "ban_ids", .type = FT_I32S, .off = M(sample_open.ban_ids), .ilo = 0, .ihi = INT32_MAX,
     .max = TP_PROTO_MAX_STOP_IDS + 16},
    END,
};
static const pframe sample_open_p[] = {
    {"context", M(sample_open.context), 4, 0}, {"replay", M(sample_open.replay), 4, 1}, {NULL, 0, 0, 0},
};

static const field sample_f[] = {
    TASK, STEPNO(M(sample.step)), COUNT("n", M(sample.n), 1, TP_PROTO_MAX_ITEMS),
    COUNT("vocab", M(sample.vocab), 1, TP_PROTO_MAX_VOCAB), END,
};
static const pframe sample_p[] = {
    {"slots", M(sample.slots), 4, 0}, {"index", M(sample.index), 4, 0},
    {"accepted", M(sample.accepted), 4, 0}, {"logits", M(sample.logits), 4, 0}, {"guess", M(sample.guess), 4, 1},
    {NULL, 0, 0, 0},
};

static const field sampled_f[] = {TASK, STATUS, ERROR, STEPNO(M(sampled.step)),
                                  COUNT("n", M(sampled.n), 0, TP_PROTO_MAX_ITEMS), TOP_N(M(sampled.lp.top_n)), END};
static const pframe sampled_p[] = {
    {"slots", M(sampled.slots), 4, 1}, {"candidates", M(sampled.candidates), 4, 1}, LP_FRAMES(M(sampled.lp)),
    {NULL, 0, 0, 0},
};

#define SO(m) M(stop_open.m)
static const field stop_open_f[] = {
    TASK, SLOT(SO(slot)), F_JOBID("job_id", SO(job_id), FF_REQUIRED | FF_NONEMPTY), PARAMS(SO(params)),
    F_U32("prompt_tokens", SO(prompt_tokens), FF_REQUIRED, 0, UINT32_MAX),
    F_I32("prev_token", SO(prev_token), FF_REQUIRED, -1, INT32_MAX),
    F_U32("next_seq", SO(next_seq), FF_REQUIRED, 0, UINT32_MAX),
    F_U64("t_submit_us", SO(t_submit_us), FF_REQUIRED), F_U64("t_start_us", SO(t_start_us), FF_REQUIRED),
    F_U64("pin", SO(pin), 0),     F_U32("context_length", SO(context_length), 0, 0, UINT32_MAX), END,
};
static const pframe stop_open_p[] = {{"replay", SO(replay), 4, 0}, {NULL, 0, 0, 0}};

static const field stop_close_f[] = {
    TASK, SLOT(M(stop_close.slot)),
    {.key = "finish", .type = FT_REASON, .off = M(stop_close.finish), .flags = FF_REQUIRED},
    F_STR("error", M(stop_close.job_error), 0, TP_PROTO_MAX_ERROR), END,
};

static const field stop_step_f[] = {TASK, STEPNO(M(stop_step.step)),
                                    COUNT("n", M(stop_step.n), 1, TP_PROTO_MAX_ITEMS), TOP_N(M(stop_step.lp.top_n)),
                                    {.key = "draft_tokens", .type = FT_I32S, .off = M(stop_step.draft_tokens),
                                     .ilo = 0, .ihi = INT32_MAX, .max = TP_PROTO_MAX_ITEMS},
                                    {.key = "draft_accepted", .type = FT_I32S, .off = M(stop_step.draft_accepted),
                                     .ilo = 0, .ihi = INT32_MAX, .max = TP_PROTO_MAX_ITEMS},
                                    END};
static const pframe stop_step_p[] = {
    {"slots", M(stop_step.slots), 4, 0}, {"candidates", M(stop_step.candidates), 4, 0}, LP_FRAMES(M(stop_step.lp)),
    {NULL, 0, 0, 0},
};

static const field verdicts_f[] = {TASK, STATUS, ERROR, STEPNO(M(verdicts.step)),
                                   COUNT("n", M(verdicts.n), 0, TP_PROTO_MAX_ITEMS), END};
static const pframe verdicts_p[] = {
    {"slots", M(verdicts.slots), 4, 1}, {"accepted", M(verdicts.accepted), 1, 1},
    {"finish", M(verdicts.finish), 1, 1}, {NULL, 0, 0, 0},
};

static const field draft_f[] = {
    TASK, COUNT("n", M(draft.n), 1, TP_PROTO_MAX_ITEMS), COUNT("n_tokens", M(draft.n_tokens), 1, TP_PROTO_MAX_IDS), END,
};
static const pframe draft_p[] = {
    {"slots", M(draft.slots), 4, 0}, {"pos", M(draft.pos), 4, 0}, {"ntok", M(draft.ntok), 4, 0},
    {"k", M(draft.k), 4, 0}, {"tokens", M(draft.tokens), 4, 0}, {NULL, 0, 0, 0},
};

static const field drafted_f[] = {TASK, STATUS, ERROR, COUNT("n", M(drafted.n), 0, TP_PROTO_MAX_ITEMS), END};
static const pframe drafted_p[] = {
    {"slots", M(drafted.slots), 4, 1}, {"ngot", M(drafted.ngot), 4, 1}, {"guesses", M(drafted.guesses), 4, 1},
    {NULL, 0, 0, 0},
};

/* ---- cross-field rules ---- */

int tp_params_lpmode(const tp_params *p)
{
    return p->logprobs_mode.ptr && p->logprobs_mode.len == 9 && !memcmp(p->logprobs_mode.ptr, "processed", 9)
               ? TP_LPMODE_PROCESSED
               : TP_LPMODE_RAW;
}

static int params_check(const tp_params *p, const char *path, tp_err *err)
{
    const tp_str *sm = &p->speculative.mode;
    if ((p->speculative.set & TP_SPEC_P_MODE) &&
        !((sm->len == 3 && !memcmp(sm->ptr, "off", 3)) || (sm->len == 5 && !memcmp(sm->ptr, "ngram", 5)) ||
          (sm->len == 5 && !memcmp(sm->ptr, "draft", 5))))
        return tp_err_set(err, TP_EINVAL, "%s.speculative.mode: '%.*s' is not off, ngram or draft", path,
                          (int)(sm->len > 32 ? 32 : sm->len), sm->ptr);
    if ((p->set & TP_P_LOGPROBS_MODE) &&
        !((p->logprobs_mode.len == 3 && !memcmp(p->logprobs_mode.ptr, "raw", 3)) ||
          tp_params_lpmode(p) == TP_LPMODE_PROCESSED))
        return tp_err_set(err, TP_EINVAL, "%s.logprobs_mode: '%.*s' is not raw or processed", path,
                          (int)(p->logprobs_mode.len > 32 ? 32 : p->logprobs_mode.len), p->logprobs_mode.ptr);
    /* one constraint at a time: which one would win is not obvious */
    static const struct { uint32_t bit; const char *key; } cons[] = {
        {TP_P_GRAMMAR, "grammar"}, {TP_P_JSON_SCHEMA, "json_schema"}, {TP_P_JSON_MODE, "json_mode"}};
    for (int a = 0; a < 3; a++)
        for (int b = a + 1; b < 3; b++)
            if ((p->set & cons[a].bit) && (p->set & cons[b].bit) &&
                (cons[b].bit != TP_P_JSON_MODE || p->json_mode) && (cons[a].bit != TP_P_JSON_MODE || p->json_mode))
                return tp_err_set(err, TP_EINVAL, "%s.%s: %s and %s cannot both be given (one constraint per job)",
                                  path, cons[b].key, cons[a].key, cons[b].key);
    if (p->top_logprobs > 0 && !p->logprobs)
        return tp_err_set(err, TP_EINVAL, "%s.top_logprobs: %d alternatives need logprobs: true", path,
                          (int)p->top_logprobs);
    if ((p->set & TP_P_MIN_TOKENS) && (p->set & TP_P_MAX_TOKENS) && p->min_tokens > p->max_tokens)
        return tp_err_set(err, TP_EINVAL, "%s.min_tokens: %d is greater than max_tokens %d", path,
                          (int)p->min_tokens, (int)p->max_tokens);
    return 0;
}

static int want_count(tp_raw r, size_t n, const char *what, tp_err *err)
{
    if (r.n != n)
        return tp_err_set(err, TP_EFORMAT, "%s: %zu elements, header says %zu", what, r.n, n);
    return 0;
}

/* The logprob frames of n items: all three or none, counts per top_n. */
static int check_lp(const tp_lp_cols *lp, size_t n, tp_err *err)
{
    if (!lp->logprobs.data) {
        if (lp->top_n)
            return tp_err_set(err, TP_EFORMAT, "logprobs: frame missing, top_n is %u", lp->top_n);
        return 0;
    }
    if (!lp->top_ids.data || !lp->top_logprobs.data)
        return tp_err_set(err, TP_EFORMAT, "top_ids: the logprobs frames come as three (logprobs, top_ids, top_logprobs)");
    int rc;
    if ((rc = want_count(lp->logprobs, n, "logprobs", err)) ||
        (rc = want_count(lp->top_ids, n * lp->top_n, "top_ids", err)))
        return rc;
    return want_count(lp->top_logprobs, n * lp->top_n, "top_logprobs", err);
}

static bool str_is(tp_str s, const char *lit)
{
    return s.ptr && s.len == strlen(lit) && !memcmp(s.ptr, lit, s.len);
}

/* tools go with messages (a template renders them); tool_choice with tools. */
static int check_tools(const tp_m_submit *s, tp_err *err)
{
    if (s->reasoning_effort.ptr && !s->n_messages)
        return tp_err_set(err, TP_EINVAL, "reasoning_effort: only with messages (the chat template reads it)");
    if (s->reasoning_effort.ptr && !str_is(s->reasoning_effort, "low") && !str_is(s->reasoning_effort, "medium") &&
        !str_is(s->reasoning_effort, "high"))
        return tp_err_set(err, TP_EINVAL, "reasoning_effort: \"%.*s\" is not one of low, medium, high",
                          (int)s->reasoning_effort.len, s->reasoning_effort.ptr);
    if (s->tools.ptr && !s->n_messages)
        return tp_err_set(err, TP_EINVAL, "tools: only with messages (the chat template renders them)");
    if (s->tool_choice_name.ptr && !str_is(s->tool_choice, "function"))
        return tp_err_set(err, TP_EINVAL, "tool_choice_name: only with tool_choice \"function\"");
    if (!s->tool_choice.ptr)
        return 0;
    if (!s->tools.ptr)
        return tp_err_set(err, TP_EINVAL, "tool_choice: only with tools");
    if (str_is(s->tool_choice, "auto") || str_is(s->tool_choice, "none"))
        return 0;
    if (str_is(s->tool_choice, "function") && !s->tool_choice_name.ptr)
        return tp_err_set(err, TP_EINVAL, "tool_choice_name: missing for tool_choice \"function\"");
    if (str_is(s->tool_choice, "required") || str_is(s->tool_choice, "function"))
        return 0;   /* the broker builds the call's grammar (it knows the template's syntax) */
    return tp_err_set(err, TP_EINVAL, "tool_choice: \"%.*s\" is not one of auto, none, required, function",
                      (int)s->tool_choice.len, s->tool_choice.ptr);
}

static int check_submit(tp_msg *m, tp_err *err)
{
    tp_m_submit *s = &m->submit;
    bool ids = s->prompt_ids.data != NULL;
    if (s->embed.ptr && tp_pool_parse(s->embed) < 0)
        return tp_err_set(err, TP_EINVAL, "embed: '%.*s' is not mean, last, cls or model", (int)s->embed.len,
                          s->embed.ptr);
    if (s->embed.ptr && s->n_messages)
        return tp_err_set(err, TP_EFORMAT, "embed: an embedding job takes a prompt (text or prompt_ids), not messages");
    if (s->n_messages && (s->prompt.ptr || ids))
        return tp_err_set(err, TP_EFORMAT, "messages: give either messages or a prompt (text or prompt_ids), not both");
    int rc = check_tools(s, err);
    if (rc)
        return rc;
    if (s->n_messages)
        return params_check(&s->params, "params", err);
    if (s->prompt.ptr && ids)
        return tp_err_set(err, TP_EFORMAT, "prompt: give either prompt text or a prompt_ids frame, not both");
    if (!s->prompt.ptr && !ids)
        return tp_err_set(err, TP_EFORMAT, "prompt: missing (no prompt key, no prompt_ids frame, no messages)");
    if (ids && s->prompt_ids.n < 1)
        return tp_err_set(err, TP_EINVAL, "prompt_ids: empty frame, need at least one id");
    if (ids && s->prompt_ids.n > TP_PROTO_MAX_IDS)
        return tp_err_set(err, TP_ERANGE, "prompt_ids: %zu ids, at most %u", s->prompt_ids.n, TP_PROTO_MAX_IDS);
    for (size_t i = 0; ids && i < s->prompt_ids.n; i++)
        if (tp_raw_i32(s->prompt_ids, i) < 0)
            return tp_err_set(err, TP_EINVAL, "prompt_ids[%zu]: negative id %d", i, (int)tp_raw_i32(s->prompt_ids, i));
    return params_check(&s->params, "params", err);
}

static int check_status_reply(tp_msg *m, tp_err *err)
{
    tp_m_status_reply *r = &m->status_reply;
    bool done = r->state == TP_STATE_FINISHED;
    if (done && r->reason == TP_REASON_NONE)
        return tp_err_set(err, TP_EFORMAT, "reason: missing for a finished job");
    if (r->state == TP_STATE_UNKNOWN && r->tokens.data)
        return tp_err_set(err, TP_EFORMAT, "tokens: frame present for an unknown job");
    if (done && !r->tokens.data)
        return tp_err_set(err, TP_EFORMAT, "tokens: frame missing for a finished job");
    if (r->cached_tokens && r->cached_tokens >= r->prompt_tokens)
        return tp_err_set(err, TP_EINVAL, "cached_tokens: %u of %u prompt tokens (at most prompt_tokens - 1)",
                          r->cached_tokens, r->prompt_tokens);
    return check_lp(&r->lp, r->tokens.n, err);
}

static int check_stats_reply(tp_msg *m, tp_err *err)
{
    static const char *const names[TP_HIST_COUNT] = {"queue_us", "ttft_us", "itl_us", "e2e_us"};
    for (int h = 0; h < TP_HIST_COUNT; h++) {
        const tp_hist *x = &m->stats_reply.hist[h];
        if (!x->n_bounds && !x->n_buckets)
            continue;
        if (x->n_buckets != x->n_bounds + 1)
            return tp_err_set(err, TP_EINVAL, "histograms.%s.buckets: %zu buckets for %zu bounds (want bounds + 1)",
                              names[h], x->n_buckets, x->n_bounds);
        uint64_t total = 0;
        for (size_t i = 0; i < x->n_buckets; i++) {
            if (i && i < x->n_bounds && x->bounds_us[i] <= x->bounds_us[i - 1])
                return tp_err_set(err, TP_EINVAL, "histograms.%s.bounds_us[%zu]: not above the previous bound",
                                  names[h], i);
            total += x->buckets[i];
        }
        if (total != x->count)
            return tp_err_set(err, TP_EINVAL, "histograms.%s.count: %llu, but the buckets hold %llu", names[h],
                              (unsigned long long)x->count, (unsigned long long)total);
    }
    return 0;
}

static int check_topic(tp_str job_id, tp_str topic, tp_err *err)
{
    if (topic.len != job_id.len || memcmp(topic.ptr, job_id.ptr, job_id.len))
        return tp_err_set(err, TP_EFORMAT, "topic: frame differs from job_id");
    return 0;
}

static int check_finish(tp_msg *m, tp_err *err)
{
    if (m->finish.reason == TP_REASON_NONE)
        return tp_err_set(err, TP_EINVAL, "reason: 'none' is not a finish reason");
    /* at least the prompt's last position is always computed */
    if (m->finish.cached_tokens && m->finish.cached_tokens >= m->finish.prompt_tokens)
        return tp_err_set(err, TP_EINVAL, "cached_tokens: %u of %u prompt tokens (at most prompt_tokens - 1)",
                          m->finish.cached_tokens, m->finish.prompt_tokens);
    return 0;
}

static int check_ready(tp_msg *m, tp_err *err)
{
    if (!m->ready.stages)
        return tp_err_set(err, TP_EINVAL, "stages: empty");
    return tp_proto_special_split(m->ready.special_ids, m->ready.special_text, NULL, err);
}

static int check_tokenized(tp_msg *m, tp_err *err)
{
    bool ok = m->status == TP_ST_OK;
    if (ok != (m->tokenized.ids.data != NULL))
        return tp_err_set(err, TP_EFORMAT, "ids: frame must be present iff status is 200");
    if (ok && m->tokenized.ids.n > TP_PROTO_MAX_TOKENIZED)
        return tp_err_set(err, TP_ERANGE, "ids: %zu ids, at most %u", m->tokenized.ids.n, TP_PROTO_MAX_TOKENIZED);
    return 0;
}

static int check_step(tp_msg *m, tp_err *err)
{
    tp_m_step *s = &m->step;
    int rc;
    if ((rc = want_count(s->slots, s->n, "slots", err)) || (rc = want_count(s->pos, s->n, "pos", err)) ||
        (rc = want_count(s->ntok, s->n, "ntok", err)) || (rc = want_count(s->flags, s->n, "flags", err)) ||
        (rc = want_count(s->tokens, s->n_tokens, "tokens", err)) ||
        (rc = want_count(s->accepted, s->n, "accepted", err)))
        return rc;
    uint64_t sum = 0;
    for (size_t i = 0; i < s->n; i++) {
        uint32_t k = tp_raw_u32(s->ntok, i);
        if (k < 1)
            return tp_err_set(err, TP_EINVAL, "ntok[%zu]: an item needs at least one token", i);
        sum += k;
    }
    if (sum != s->n_tokens)
        return tp_err_set(err, TP_EFORMAT, "ntok: sum %llu differs from n_tokens %u", (unsigned long long)sum,
                          s->n_tokens);
    return 0;
}

/* Replies whose payload frames are present iff status is 200. */
static int ok_frames(const tp_msg *m, const tp_raw *first, tp_err *err)
{
    bool ok = m->status == TP_ST_OK;
    if (ok != (first->data != NULL))
        return tp_err_set(err, TP_EFORMAT, "payload: frames must be present iff status is 200");
    return 0;
}

static int check_step_result(tp_msg *m, tp_err *err)
{
    tp_m_step_result *r = &m->step_result;
    int rc = ok_frames(m, &r->slots, err);
    if (rc || m->status != TP_ST_OK)
        return rc;
    if (!r->out.data)
        return tp_err_set(err, TP_EFORMAT, "out: frame missing");
    if (r->sampled && r->vocab != 0)
        return tp_err_set(err, TP_EINVAL, "vocab: must be 0 when sampled");
    if (!r->sampled && r->vocab == 0 && r->n > 0)
        return tp_err_set(err, TP_EINVAL, "vocab: 0 with logits");
    if ((rc = want_count(r->slots, r->n, "slots", err)))
        return rc;
    if (!r->sampled && r->lp.logprobs.data)
        return tp_err_set(err, TP_EFORMAT, "logprobs: only a sampled STEP_RESULT carries them");
    if ((rc = check_lp(&r->lp, r->n, err)))
        return rc;
    if (r->n_cached != r->n_cached_slots)
        return tp_err_set(err, TP_EINVAL, "cached: %zu counts for %zu cached_slots", r->n_cached, r->n_cached_slots);
    return want_count(r->out, r->sampled ? r->n : (size_t)r->n * r->vocab, "out", err);
}

static int check_embedded(tp_msg *m, tp_err *err)
{
    tp_m_embedded *r = &m->embedded;
    int rc = want_count(r->slots, r->n, "slots", err);
    return rc ? rc : want_count(r->embd, (size_t)r->n * r->dim, "embd", err);
}

static int check_sample_open(tp_msg *m, tp_err *err)
{
    if (m->sample_open.context.n > TP_PROTO_MAX_IDS)
        return tp_err_set(err, TP_ERANGE, "context: more than %u ids", TP_PROTO_MAX_IDS);
    if (m->sample_open.replay.n > TP_PROTO_MAX_IDS)
        return tp_err_set(err, TP_ERANGE, "replay: more than %u ids", TP_PROTO_MAX_IDS);
    return params_check(&m->sample_open.params, "params", err);
}

static int check_sample(tp_msg *m, tp_err *err)
{
    tp_m_sample *s = &m->sample;
    int rc;
    if ((rc = want_count(s->slots, s->n, "slots", err)) || (rc = want_count(s->index, s->n, "index", err)) ||
        (rc = want_count(s->accepted, s->n, "accepted", err)))
        return rc;
    if (s->guess.data && (rc = want_count(s->guess, s->n, "guess", err)))
        return rc;
    return want_count(s->logits, (size_t)s->n * s->vocab, "logits", err);
}

static int check_sampled(tp_msg *m, tp_err *err)
{
    int rc = ok_frames(m, &m->sampled.slots, err);
    if (rc || m->status != TP_ST_OK)
        return rc;
    if ((rc = want_count(m->sampled.slots, m->sampled.n, "slots", err)) ||
        (rc = check_lp(&m->sampled.lp, m->sampled.n, err)))
        return rc;
    return want_count(m->sampled.candidates, m->sampled.n, "candidates", err);
}

static int check_stop_open(tp_msg *m, tp_err *err)
{
    if (m->stop_open.replay.n > TP_PROTO_MAX_IDS)
        return tp_err_set(err, TP_ERANGE, "replay: more than %u ids", TP_PROTO_MAX_IDS);
    return params_check(&m->stop_open.params, "params", err);
}

static int check_stop_close(tp_msg *m, tp_err *err)
{
    int f = m->stop_close.finish;
    if (f != TP_REASON_NONE && f != TP_REASON_CANCELLED && f != TP_REASON_ERROR)
        return tp_err_set(err, TP_EINVAL, "finish: '%s' is not one of none, cancelled, error", tp_reason_name(f));
    return 0;
}

static int check_stop_step(tp_msg *m, tp_err *err)
{
    int rc = want_count(m->stop_step.slots, m->stop_step.n, "slots", err);
    if (!rc)
        rc = check_lp(&m->stop_step.lp, m->stop_step.n, err);
    return rc ? rc : want_count(m->stop_step.candidates, m->stop_step.n, "candidates", err);
}

static int check_verdicts(tp_msg *m, tp_err *err)
{
    tp_m_verdicts *v = &m->verdicts;
    int rc = ok_frames(m, &v->slots, err);
    if (rc || m->status != TP_ST_OK)
        return rc;
    if ((rc = want_count(v->slots, v->n, "slots", err)) || (rc = want_count(v->accepted, v->n, "accepted", err)) ||
        (rc = want_count(v->finish, v->n, "finish", err)))
        return rc;
    for (size_t i = 0; i < v->n; i++) {
        if (tp_raw_u8(v->accepted, i) > 1)
            return tp_err_set(err, TP_EINVAL, "accepted[%zu]: %u is not 0 or 1", i, tp_raw_u8(v->accepted, i));
        if (tp_raw_u8(v->finish, i) >= TP_REASON_COUNT)
            return tp_err_set(err, TP_EINVAL, "finish[%zu]: unknown reason code %u", i, tp_raw_u8(v->finish, i));
    }
    return 0;
}

/* Items' counts (u32[n] each) and their concatenated payload: every count
 * in lo..hi, their sum the payload's length. */
static int check_runs(tp_raw counts, uint32_t lo, uint32_t hi, size_t payload, const char *what, tp_err *err)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < counts.n; i++) {
        uint32_t k = tp_raw_u32(counts, i);
        if (k < lo || k > hi)
            return tp_err_set(err, TP_EINVAL, "%s[%zu]: %u is outside %u..%u", what, i, k, lo, hi);
        sum += k;
    }
    if (sum != payload)
        return tp_err_set(err, TP_EFORMAT, "%s: sum %llu differs from the %zu ids", what, (unsigned long long)sum,
                          payload);
    return 0;
}

static int check_draft(tp_msg *m, tp_err *err)
{
    tp_m_draft *d = &m->draft;
    int rc;
    if ((rc = want_count(d->slots, d->n, "slots", err)) || (rc = want_count(d->pos, d->n, "pos", err)) ||
        (rc = want_count(d->ntok, d->n, "ntok", err)) || (rc = want_count(d->k, d->n, "k", err)) ||
        (rc = want_count(d->tokens, d->n_tokens, "tokens", err)) ||
        (rc = check_runs(d->ntok, 1, TP_PROTO_MAX_IDS, d->tokens.n, "ntok", err)))
        return rc;
    for (size_t i = 0; i < d->n; i++) {
        uint32_t k = tp_raw_u32(d->k, i);
        if (k < 1 || k > TP_PROTO_MAX_DRAFT)
            return tp_err_set(err, TP_EINVAL, "k[%zu]: %u is outside 1..%u", i, k, TP_PROTO_MAX_DRAFT);
        for (size_t j = 0; j < i; j++)
            if (tp_raw_u32(d->slots, j) == tp_raw_u32(d->slots, i))
                return tp_err_set(err, TP_EINVAL, "slots[%zu]: slot %u is in the message twice", i,
                                  tp_raw_u32(d->slots, i));
    }
    for (size_t i = 0; i < d->tokens.n; i++)
        if (tp_raw_i32(d->tokens, i) < 0)
            return tp_err_set(err, TP_EINVAL, "tokens[%zu]: negative id %d", i, (int)tp_raw_i32(d->tokens, i));
    return 0;
}

static int check_drafted(tp_msg *m, tp_err *err)
{
    tp_m_drafted *d = &m->drafted;
    int rc = ok_frames(m, &d->slots, err);
    if (rc || m->status != TP_ST_OK)
        return rc;
    if ((rc = want_count(d->slots, d->n, "slots", err)) || (rc = want_count(d->ngot, d->n, "ngot", err)) ||
        (rc = check_runs(d->ngot, 0, TP_PROTO_MAX_DRAFT, d->guesses.n, "ngot", err)))
        return rc;
    for (size_t i = 0; i < d->guesses.n; i++)
        if (tp_raw_i32(d->guesses, i) < 0)
            return tp_err_set(err, TP_EINVAL, "guesses[%zu]: negative id %d", i, (int)tp_raw_i32(d->guesses, i));
    return 0;
}

static int check_token_topic(tp_msg *m, tp_err *err);
static int check_info_reply(tp_msg *m, tp_err *err);
static int check_finish_topic(tp_msg *m, tp_err *err);
static int check_beat_topic(tp_msg *m, tp_err *err);

/* ---- the registry ---- */

static const table T_submit = {submit_f, -1}, T_ack = {ack_f, (long)M(ack.set)}, T_error = {error_f, -1},
                   T_jobref = {jobref_f, -1}, T_status_reply = {status_reply_f, -1}, T_stats = {stats_f, -1},
                   T_stats_reply = {stats_reply_f, -1}, T_token = {token_f, -1}, T_finish = {finish_f, (long)M(finish.set)}, T_beat = {beat_f, -1},
                   T_ready = {ready_f, -1}, T_welcome = {welcome_f, -1}, T_heartbeat = {heartbeat_f, -1},
                   T_disconnect = {disconnect_f, -1}, T_result = {result_f, -1}, T_tokenize = {tokenize_f, -1},
                   T_tokenized = {tokenized_f, -1}, T_slot = {slot_f, -1}, T_step = {step_f, -1},
                   T_step_result = {step_result_f, -1}, T_sample_open = {sample_open_f, -1},
                   T_sample = {sample_f, -1}, T_sampled = {sampled_f, -1}, T_stop_open = {stop_open_f, -1},
                   T_stop_close = {stop_close_f, -1}, T_stop_step = {stop_step_f, -1},
                   T_verdicts = {verdicts_f, -1}, T_info_reply = {info_reply_f, -1},
                   T_embedded = {embedded_f, -1}, T_draft = {draft_f, -1}, T_drafted = {drafted_f, -1};

static const pframe no_frames[] = {{NULL, 0, 0, 0}};

static const mdesc descs[] = {
    {TP_FAM_JOB, TP_CMD_SUBMIT, "SUBMIT", &T_submit, submit_p, 0, check_submit},
    {TP_FAM_JOB, TP_CMD_ACK, "ACK", &T_ack, no_frames, 1, NULL},
    {TP_FAM_JOB, TP_CMD_CANCEL, "CANCEL", &T_jobref, no_frames, 0, NULL},
    {TP_FAM_JOB, TP_CMD_STATUS, "STATUS", &T_jobref, no_frames, 0, NULL},
    {TP_FAM_JOB, TP_CMD_STATUS_REPLY, "STATUS_REPLY", &T_status_reply, status_reply_p, 1, check_status_reply},
    {TP_FAM_JOB, TP_CMD_STATS, "STATS", &T_stats, no_frames, 0, NULL},
    {TP_FAM_JOB, TP_CMD_STATS_REPLY, "STATS_REPLY", &T_stats_reply, no_frames, 1, check_stats_reply},
    {TP_FAM_JOB, TP_CMD_INFO, "INFO", &T_stats, no_frames, 0, NULL},
    {TP_FAM_JOB, TP_CMD_INFO_REPLY, "INFO_REPLY", &T_info_reply, info_reply_p, 1, check_info_reply},
    {TP_FAM_JOB, TP_CMD_ERROR, "ERROR", &T_error, no_frames, 1, NULL},
    {TP_FAM_EVT, TP_CMD_TOKEN, "TOKEN", &T_token, token_p, 1, check_token_topic},
    {TP_FAM_EVT, TP_CMD_FINISH, "FINISH", &T_finish, finish_p, 1, check_finish_topic},
    {TP_FAM_EVT, TP_CMD_HEARTBEAT, "HEARTBEAT", &T_beat, no_frames, 1, check_beat_topic},
    {TP_FAM_WRK, TP_CMD_READY, "READY", &T_ready, ready_p, 0, check_ready},
    {TP_FAM_WRK, TP_CMD_WELCOME, "WELCOME", &T_welcome, no_frames, 0, NULL},
    {TP_FAM_WRK, TP_CMD_HEARTBEAT, "HEARTBEAT", &T_heartbeat, no_frames, 0, NULL},
    {TP_FAM_WRK, TP_CMD_DISCONNECT, "DISCONNECT", &T_disconnect, no_frames, 0, NULL},
    {TP_FAM_WRK, TP_CMD_RESULT, "RESULT", &T_result, no_frames, 0, NULL},
    {TP_FAM_WRK, TP_CMD_TOKENIZE, "TOKENIZE", &T_tokenize, no_frames, 0, NULL},
    {TP_FAM_WRK, TP_CMD_TOKENIZED, "TOKENIZED", &T_tokenized, tokenized_p, 0, check_tokenized},
    {TP_FAM_WRK, TP_CMD_SEQ_OPEN, "SEQ_OPEN", &T_slot, no_frames, 0, NULL},
    {TP_FAM_WRK, TP_CMD_SEQ_CLOSE, "SEQ_CLOSE", &T_slot, no_frames, 0, NULL},
    {TP_FAM_WRK, TP_CMD_STEP, "STEP", &T_step, step_p, 0, check_step},
    {TP_FAM_WRK, TP_CMD_STEP_RESULT, "STEP_RESULT", &T_step_result, step_result_p, 0, check_step_result},
    {TP_FAM_WRK, TP_CMD_EMBEDDED, "EMBEDDED", &T_embedded, embedded_p, 0, check_embedded},
    {TP_FAM_WRK, TP_CMD_SAMPLE_OPEN, "SAMPLE_OPEN", &T_sample_open, sample_open_p, 0, check_sample_open},
    {TP_FAM_WRK, TP_CMD_SAMPLE_CLOSE, "SAMPLE_CLOSE", &T_slot, no_frames, 0, NULL},
    {TP_FAM_WRK, TP_CMD_SAMPLE, "SAMPLE", &T_sample, sample_p, 0, check_sample},
    {TP_FAM_WRK, TP_CMD_SAMPLED, "SAMPLED", &T_sampled, sampled_p, 0, check_sampled},
    {TP_FAM_WRK, TP_CMD_STOP_OPEN, "STOP_OPEN", &T_stop_open, stop_open_p, 0, check_stop_open},
    {TP_FAM_WRK, TP_CMD_STOP_CLOSE, "STOP_CLOSE", &T_stop_close, no_frames, 0, check_stop_close},
    {TP_FAM_WRK, TP_CMD_STOP_STEP, "STOP_STEP", &T_stop_step, stop_step_p, 0, check_stop_step},
    {TP_FAM_WRK, TP_CMD_VERDICTS, "VERDICTS", &T_verdicts, verdicts_p, 0, check_verdicts},
    {TP_FAM_WRK, TP_CMD_DRAFT, "DRAFT", &T_draft, draft_p, 0, check_draft},
    {TP_FAM_WRK, TP_CMD_DRAFTED, "DRAFTED", &T_drafted, drafted_p, 0, check_drafted},
    {TP_FAM_WRK, TP_CMD_DRAFT_CLOSE, "DRAFT_CLOSE", &T_slot, no_frames, 0, NULL},
};

static int check_token_topic(tp_msg *m, tp_err *err)
{
    int rc = check_topic(m->token.job_id, m->topic, err);
    return rc ? rc : check_lp(&m->token.lp, m->token.ids.n, err);
}

static int check_info_reply(tp_msg *m, tp_err *err)
{
    return tp_proto_special_split(m->info_reply.special_ids, m->info_reply.special_text, NULL, err);
}

static int check_finish_topic(tp_msg *m, tp_err *err)
{
    int rc = check_topic(m->finish.job_id, m->topic, err);
    return rc ? rc : check_finish(m, err);
}

static int check_beat_topic(tp_msg *m, tp_err *err)
{
    return check_topic(tp_str_of(TP_EVT_HEARTBEAT_TOPIC), m->topic, err);
}

const mdesc *schema_find(tp_family family, uint8_t cmd)
{
    for (size_t i = 0; i < sizeof descs / sizeof *descs; i++)
        if (descs[i].family == family && descs[i].cmd == cmd)
            return &descs[i];
    return NULL;
}

const char *schema_magic(tp_family family)
{
    switch (family) {
    case TP_FAM_JOB: return TP_MAGIC_JOB;
    case TP_FAM_WRK: return TP_MAGIC_WRK;
    case TP_FAM_EVT: return TP_MAGIC_EVT;
    default: return NULL;
    }
}
