/* OpenAI request body -> SUBMIT parameters (oai.h). */
#include "oai.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/toolcall.h"

int oai_fail(oai_error *e, int status, const char *param, const char *fmt, ...)
{
    e->status = status;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

static int oom(oai_error *e)
{
    return oai_fail(e, 500, NULL, "out of memory");
}

/* JSON numbers are doubles: an integer must be integral and, for exactness,
 * within 2^53. */
static int get_int(const cJSON *v, const char *name, double lo, double hi, int64_t *out, oai_error *e)
{
    if (!cJSON_IsNumber(v))
        return oai_fail(e, 400, name, "%s: expected an integer", name);
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d))
        return oai_fail(e, 400, name, "%s: %g is not an integer", name, d);
    if (d < lo || d > hi)
        return oai_fail(e, 400, name, "%s: %.0f is outside [%.0f, %.0f]", name, d, lo, hi);
    *out = (int64_t)d;
    return 0;
}

static int get_num(const cJSON *v, const char *name, double *out, oai_error *e)
{
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return oai_fail(e, 400, name, "%s: expected a number", name);
    *out = v->valuedouble;
    return 0;
}

static int get_bool(const cJSON *v, const char *name, bool *out, oai_error *e)
{
    if (!cJSON_IsBool(v))
        return oai_fail(e, 400, name, "%s: expected true or false", name);
    *out = cJSON_IsTrue(v);
    return 0;
}

static int copy_text(const char *s, const char *name, char **out, size_t *len, oai_error *e)
{
    size_t l = strlen(s);
    if (!tp_proto_utf8_valid(s, l))
        return oai_fail(e, 400, name, "%s: not valid UTF-8", name);
    *out = malloc(l + 1);
    if (!*out)
        return oom(e);
    memcpy(*out, s, l + 1);
    if (len)
        *len = l;
    return 0;
}

static int decode_ids(const cJSON *arr, const char *name, oai_prompt *p, oai_error *e)
{
    int n = cJSON_GetArraySize(arr);
    if (n < 1)
        return oai_fail(e, 400, name, "%s: an empty list of token ids", name);
    if ((size_t)n > TP_PROTO_MAX_IDS)
        return oai_fail(e, 413, name, "%s: more than %u token ids", name, TP_PROTO_MAX_IDS);
    p->ids = malloc((size_t)n * sizeof *p->ids);
    if (!p->ids)
        return oom(e);
    int i = 0;
    for (const cJSON *it = arr->child; it; it = it->next, i++) {
        int64_t v;
        char nm[64];
        snprintf(nm, sizeof nm, "%s[%d]", name, i);
        if (get_int(it, nm, 0, INT32_MAX, &v, e))
            return -1;
        p->ids[i] = (int32_t)v;
    }
    p->n_ids = (size_t)n;
    return 0;
}

static int add_prompt(oai_request *r, oai_error *e, oai_prompt **p)
{
    if (r->n_prompts >= OAI_MAX_PROMPTS)
        return oai_fail(e, 400, "prompt", "prompt: more than %d prompts", OAI_MAX_PROMPTS);
    if (!r->prompts) {
        r->prompts = calloc(OAI_MAX_PROMPTS, sizeof *r->prompts);
        if (!r->prompts)
            return oom(e);
    }
    *p = &r->prompts[r->n_prompts++];
    return 0;
}

static int decode_prompt(const cJSON *v, oai_request *r, oai_error *e)
{
    oai_prompt *p;
    if (cJSON_IsString(v)) {
        if (add_prompt(r, e, &p))
            return -1;
        return copy_text(v->valuestring, "prompt", &p->text, &p->text_len, e);
    }
    if (!cJSON_IsArray(v) || !v->child)
        return oai_fail(e, 400, "prompt", "prompt: expected a string, a list of strings or a list of token ids");
    if (cJSON_IsNumber(v->child)) {   /* one prompt as token ids */
        if (add_prompt(r, e, &p))
            return -1;
        return decode_ids(v, "prompt", p, e);
    }
    int i = 0;
    for (const cJSON *it = v->child; it; it = it->next, i++) {
        char nm[64];
        snprintf(nm, sizeof nm, "prompt[%d]", i);
        if (add_prompt(r, e, &p))
            return -1;
        if (cJSON_IsString(it)) {
            if (copy_text(it->valuestring, nm, &p->text, &p->text_len, e))
                return -1;
        } else if (cJSON_IsArray(it)) {
            if (decode_ids(it, nm, p, e))
                return -1;
        } else {
            return oai_fail(e, 400, nm, "%s: expected a string or a list of token ids", nm);
        }
    }
    return 0;
}

static int decode_stop(const cJSON *v, tp_params *pp, oai_error *e)
{
    if (cJSON_IsNull(v))
        return 0;
    int n = cJSON_IsString(v) ? 1 : cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (n < 0)
        return oai_fail(e, 400, "stop", "stop: expected a string or a list of strings");
    if (n > TP_PROTO_MAX_STOP)
        return oai_fail(e, 400, "stop", "stop: more than %d strings", TP_PROTO_MAX_STOP);
    pp->set |= TP_P_STOP;
    if (!n)
        return 0;
    pp->stop = calloc((size_t)n, sizeof *pp->stop);
    if (!pp->stop)
        return oom(e);
    const cJSON *it = cJSON_IsString(v) ? v : v->child;
    for (int i = 0; i < n; i++, it = it->next) {
        char nm[64];
        snprintf(nm, sizeof nm, cJSON_IsString(v) ? "stop" : "stop[%d]", i);
        if (!cJSON_IsString(it))
            return oai_fail(e, 400, nm, "%s: expected a string", nm);
        char *s;
        size_t len;
        if (copy_text(it->valuestring, nm, &s, &len, e))
            return -1;
        pp->stop[pp->n_stop++] = (tp_str){s, len};
    }
    return 0;
}

static int decode_stop_ids(const cJSON *v, tp_params *pp, oai_error *e)
{
    if (cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsArray(v))
        return oai_fail(e, 400, "stop_token_ids", "stop_token_ids: expected a list of token ids");
    int n = cJSON_GetArraySize(v);
    if (n > TP_PROTO_MAX_STOP_IDS)
        return oai_fail(e, 400, "stop_token_ids", "stop_token_ids: more than %d ids", TP_PROTO_MAX_STOP_IDS);
    pp->set |= TP_P_STOP_TOKEN_IDS;
    if (!n)
        return 0;
    pp->stop_token_ids = malloc((size_t)n * sizeof *pp->stop_token_ids);
    if (!pp->stop_token_ids)
        return oom(e);
    int i = 0;
    for (const cJSON *it = v->child; it; it = it->next, i++) {
        char nm[64];
        int64_t x;
        snprintf(nm, sizeof nm, "stop_token_ids[%d]", i);
        if (get_int(it, nm, 0, INT32_MAX, &x, e))
            return -1;
        pp->stop_token_ids[pp->n_stop_token_ids++] = (int32_t)x;
    }
    return 0;
}

/* A float parameter: null = the broker's default. */
static int opt_num(const cJSON *v, const char *name, uint32_t bit, double *dst, tp_params *pp, oai_error *e)
{
    if (cJSON_IsNull(v))
        return 0;
    if (get_num(v, name, dst, e))
        return -1;
    pp->set |= bit;
    return 0;
}

static int opt_int32(const cJSON *v, const char *name, uint32_t bit, double lo, int32_t *dst, tp_params *pp,
                     oai_error *e)
{
    if (cJSON_IsNull(v))
        return 0;
    int64_t x;
    if (get_int(v, name, lo, INT32_MAX, &x, e))
        return -1;
    *dst = (int32_t)x;
    pp->set |= bit;
    return 0;
}

/* {"13": -100, ...}: token id (decimal string) -> bias; the ranges and
 * the vocabulary are the protocol's and the broker's to check. */
static int decode_logit_bias(const cJSON *v, tp_params *pp, oai_error *e)
{
    if (cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsObject(v))
        return oai_fail(e, 400, "logit_bias", "logit_bias: expected an object of token id -> bias");
    int n = cJSON_GetArraySize(v);
    if (n > TP_PROTO_MAX_LOGIT_BIAS)
        return oai_fail(e, 400, "logit_bias", "logit_bias: more than %d entries", TP_PROTO_MAX_LOGIT_BIAS);
    if (!n)
        return 0;
    tp_logit_bias *lb = &pp->logit_bias;
    lb->ids = malloc((size_t)n * sizeof *lb->ids);
    lb->values = malloc((size_t)n * sizeof *lb->values);
    if (!lb->ids || !lb->values)
        return oom(e);
    for (const cJSON *it = v->child; it; it = it->next) {
        char nm[64];
        snprintf(nm, sizeof nm, "logit_bias.%.40s", it->string);
        char *end;
        long id = strtol(it->string, &end, 10);
        if (!it->string[0] || *end || id < 0 || id > INT32_MAX)
            return oai_fail(e, 400, "logit_bias", "%s: the key must be a token id", nm);
        double b = 0;
        if (get_num(it, nm, &b, e))
            return -1;
        lb->ids[lb->n] = (int32_t)id;
        lb->values[lb->n++] = (float)b;
    }
    pp->set |= TP_P_LOGIT_BIAS;
    return 0;
}

/* The content of a turn: a string, or OpenAI's list of parts of which
 * only {"type": "text", "text": ...} parts exist for a text model (joined). */
static int decode_content(const cJSON *c, const char *nm, char **out, size_t *len, oai_error *e)
{
    if (cJSON_IsString(c))
        return copy_text(c->valuestring, nm, out, len, e);
    if (cJSON_IsNull(c))
        return copy_text("", nm, out, len, e);
    if (!cJSON_IsArray(c))
        return oai_fail(e, 400, nm, "%s: expected a string or a list of text parts", nm);
    size_t total = 0;
    for (const cJSON *p = c->child; p; p = p->next) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "text");
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type");
        if (!cJSON_IsString(t) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "text"))
            return oai_fail(e, 400, nm, "%s: only text parts ({\"type\": \"text\", \"text\": ...}) are supported", nm);
        total += strlen(t->valuestring);
    }
    char *s = malloc(total + 1);
    if (!s)
        return oom(e);
    size_t at = 0;
    for (const cJSON *p = c->child; p; p = p->next) {
        const char *t = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        memcpy(s + at, t, strlen(t));
        at += strlen(t);
    }
    s[at] = '\0';
    *out = s;
    *len = at;
    if (!tp_proto_utf8_valid(s, at))
        return oai_fail(e, 400, nm, "%s: not valid UTF-8", nm);
    return 0;
}

/* An assistant turn's tool_calls: [{"id", "type": "function", "function":
 * {"name", "arguments"}}], arguments as OpenAI sends them (a JSON string;
 * an object is taken too and written as JSON). */
static int decode_calls(const cJSON *v, const char *nm, tp_chat_msg *m, oai_error *e)
{
    char fn[96];
    snprintf(fn, sizeof fn, "%s.tool_calls", nm);
    if (cJSON_IsNull(v))
        return 0;
    int n = cJSON_GetArraySize(v);
    if (!cJSON_IsArray(v) || n > TP_PROTO_MAX_TOOL_CALLS)
        return oai_fail(e, 400, fn, "%s: expected a list of at most %d calls", fn, TP_PROTO_MAX_TOOL_CALLS);
    if (m->tool_calls)
        return oai_fail(e, 400, fn, "%s: given twice", fn);
    m->tool_calls = calloc((size_t)n + 1, sizeof *m->tool_calls);
    if (!m->tool_calls)
        return oom(e);
    int k = 0;
    for (const cJSON *c = v->child; c; c = c->next, k++) {
        char cn[128];
        snprintf(cn, sizeof cn, "%s[%d]", fn, k);
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(c, "id");
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(c, "type");
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(f, "arguments");
        if (!cJSON_IsObject(c) || (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "function"))))
            return oai_fail(e, 400, cn, "%s: expected {\"type\": \"function\", \"function\": {\"name\", \"arguments\"}}",
                        cn);
        if (!cJSON_IsString(name) || !name->valuestring[0])
            return oai_fail(e, 400, cn, "%s.function.name: expected a non-empty string", cn);
        if (id && !cJSON_IsString(id))
            return oai_fail(e, 400, cn, "%s.id: expected a string", cn);
        tp_tool_call *t = &m->tool_calls[m->n_tool_calls++];
        char *s = NULL;
        size_t len = 0;
        if (copy_text(name->valuestring, cn, &s, &len, e))
            return -1;
        t->name = (tp_str){s, len};
        if (copy_text(id ? id->valuestring : "", cn, &s, &len, e))
            return -1;
        t->id = (tp_str){s, len};
        char *printed = NULL;
        if (cJSON_IsObject(args) && !(printed = cJSON_PrintUnformatted(args)))
            return oom(e);
        if (args && !cJSON_IsString(args) && !printed)
            return oai_fail(e, 400, cn, "%s.function.arguments: expected a JSON string", cn);
        int rc = copy_text(printed ? printed : args ? args->valuestring : "{}", cn, &s, &len, e);
        free(printed);
        if (rc)
            return -1;
        t->arguments = (tp_str){s, len};
    }
    return 0;
}

static int decode_messages(const cJSON *v, oai_request *r, oai_error *e)
{
    if (!cJSON_IsArray(v) || !v->child)
        return oai_fail(e, 400, "messages", "messages: expected a non-empty list of messages");
    int n = cJSON_GetArraySize(v);
    if (n > OAI_MAX_MESSAGES)
        return oai_fail(e, 400, "messages", "messages: more than %d turns", OAI_MAX_MESSAGES);
    r->messages = calloc((size_t)n, sizeof *r->messages);
    if (!r->messages)
        return oom(e);
    int i = 0;
    for (const cJSON *it = v->child; it; it = it->next, i++) {
        char nm[64];
        snprintf(nm, sizeof nm, "messages[%d]", i);
        if (!cJSON_IsObject(it))
            return oai_fail(e, 400, nm, "%s: expected an object {role, content}", nm);
        tp_chat_msg *m = &r->messages[r->n_messages++];
        for (const cJSON *f = it->child; f; f = f->next) {
            if (!strcmp(f->string, "tool_calls")) {
                if (decode_calls(f, nm, m, e))
                    return -1;
                continue;
            }
            if (!strcmp(f->string, "name") || !strcmp(f->string, "tool_call_id")) {
                char fn[96];
                snprintf(fn, sizeof fn, "%s.%s", nm, f->string);
                tp_str *dst = f->string[0] == 'n' ? &m->name : &m->tool_call_id;
                char *s = NULL;
                size_t len = 0;
                if (!cJSON_IsString(f))
                    return oai_fail(e, 400, fn, "%s: expected a string", fn);
                if (copy_text(f->valuestring, fn, &s, &len, e))
                    return -1;
                free((void *)dst->ptr);
                *dst = (tp_str){s, len};
                continue;
            }
            char fn[96];
            snprintf(fn, sizeof fn, "%s.%.20s", nm, f->string);
            char *s = NULL;
            size_t len = 0;
            if (!strcmp(f->string, "role")) {
                if (!cJSON_IsString(f))
                    return oai_fail(e, 400, fn, "%s: expected a string", fn);
                if (copy_text(f->valuestring, fn, &s, &len, e))
                    return -1;
                free((void *)m->role.ptr);
                m->role = (tp_str){s, len};
            } else if (!strcmp(f->string, "content")) {
                if (decode_content(f, fn, &s, &len, e)) {
                    free(s);
                    return -1;
                }
                free((void *)m->content.ptr);
                m->content = (tp_str){s, len};
            } else {
                return oai_fail(e, 400, fn, "%s: not supported (a turn has role, content, name, tool_call_id, tool_calls)",
                            fn);
            }
        }
        if (!m->role.ptr || !m->role.len)
            return oai_fail(e, 400, nm, "%s.role: required", nm);
        /* PROTOCOL.md: content (null included) is required unless the turn carries calls */
        if (!m->content.ptr && !m->n_tool_calls) {
            char fn[96];
            snprintf(fn, sizeof fn, "%s.content", nm);
            return oai_fail(e, 400, fn, "%s: required (a string, a list of text parts, or null)", fn);
        }
        if (!m->content.ptr)
            m->content = (tp_str){strdup(""), 0};
        if (!m->content.ptr)
            return oom(e);
    }
    return 0;
}

/* Completions: logprobs is the number of alternatives (0..5, OpenAI's
 * legacy cap); chat: a boolean, the alternatives come in top_logprobs.
 * false/null: none, as before. */
static int decode_logprobs(const cJSON *v, oai_request *r, oai_error *e)
{
    if (cJSON_IsNull(v) || cJSON_IsFalse(v))
        return 0;
    if (r->kind == OAI_CHAT) {
        if (!cJSON_IsTrue(v))
            return oai_fail(e, 400, "logprobs", "logprobs: expected true or false");
        r->logprobs = true;
        return 0;
    }
    int64_t x;
    if (!cJSON_IsNumber(v))
        return oai_fail(e, 400, "logprobs", "logprobs: expected an integer in [0, %d] (alternatives per token) or null",
                    OAI_MAX_LEGACY_LOGPROBS);
    if (get_int(v, "logprobs", 0, OAI_MAX_LEGACY_LOGPROBS, &x, e))
        return -1;
    r->logprobs = true;
    r->top_logprobs = (int)x;
    return 0;
}

/* OpenAI fields without a tokpipe meaning, accepted at their neutral value
 * only (clients often send them explicitly). */
static int neutral(const cJSON *v, const char *name, const oai_request *r, oai_error *e)
{
    bool ok = cJSON_IsNull(v);
    if (!strcmp(name, "echo"))
        ok = ok || cJSON_IsFalse(v);
    if (!strcmp(name, "best_of"))
        ok = ok || (cJSON_IsNumber(v) && v->valuedouble == r->n);
    if (!strcmp(name, "suffix"))
        ok = ok || (cJSON_IsString(v) && !v->valuestring[0]);
    if (!ok)
        return oai_fail(e, 400, name, "%s: not supported by tokpipe (only its neutral value is accepted)", name);
    return 0;
}


/* Record one output constraint; a second one is refused naming both. */
static int set_constraint(oai_request *r, const char *param, char *grammar, char *schema, bool json_mode,
                          oai_error *e)
{
    if (r->constraint_param[0]) {
        free(grammar);
        free(schema);
        return oai_fail(e, 400, param, "%s and %s: only one output constraint per request", r->constraint_param, param);
    }
    snprintf(r->constraint_param, sizeof r->constraint_param, "%s", param);
    r->grammar = grammar;
    r->json_schema = schema;
    r->json_mode = json_mode;
    return 0;
}

/* a schema (object or boolean) as JSON text for SUBMIT's json_schema */
static int schema_text(const cJSON *v, const char *param, const char *what, oai_error *e, char **out)
{
    if (!cJSON_IsObject(v) && !cJSON_IsBool(v))
        return oai_fail(e, 400, param, "%s: expected a JSON Schema (an object or a boolean)", what);
    *out = cJSON_PrintUnformatted(v);
    return *out ? 0 : oom(e);
}

/* OpenAI's response_format: {type: text} (no constraint), {type:
 * json_object} (JSON mode; llama.cpp's server also takes a schema there),
 * {type: json_schema, json_schema: {name, schema, strict, description}};
 * strict is accepted and changes nothing: the schema is always enforced. */
static int decode_response_format(const cJSON *v, oai_request *r, oai_error *e)
{
    const char *k = "response_format";
    if (cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsObject(v))
        return oai_fail(e, 400, k, "response_format: expected an object with a type");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(v, "type");
    if (!cJSON_IsString(type))
        return oai_fail(e, 400, k, "response_format.type: required, one of text, json_object, json_schema");
    const char *t = type->valuestring;
    const cJSON *js = NULL, *schema = NULL;
    for (const cJSON *f = v->child; f; f = f->next) {
        if (!strcmp(f->string, "type"))
            continue;
        if (!strcmp(t, "json_schema") && !strcmp(f->string, "json_schema"))
            js = f;
        else if (!strcmp(t, "json_object") && !strcmp(f->string, "schema"))
            schema = f;
        else
            return oai_fail(e, 400, k, "response_format.%s: unknown field for type %s", f->string, t);
    }
    if (!strcmp(t, "text"))
        return 0;
    char *text = NULL;
    if (!strcmp(t, "json_object")) {
        if (!schema || cJSON_IsNull(schema))
            return set_constraint(r, k, NULL, NULL, true, e);
        if (schema_text(schema, k, "response_format.schema", e, &text))
            return -1;
        return set_constraint(r, k, NULL, text, false, e);
    }
    if (strcmp(t, "json_schema"))
        return oai_fail(e, 400, k, "response_format.type: '%.64s' is not text, json_object or json_schema", t);
    if (!cJSON_IsObject(js))
        return oai_fail(e, 400, k, "response_format.json_schema: required, an object with name and schema");
    for (const cJSON *f = js->child; f; f = f->next) {
        if (!strcmp(f->string, "schema")) {
            schema = f;
        } else if (!strcmp(f->string, "name") || !strcmp(f->string, "description")) {
            if (!cJSON_IsString(f) && !cJSON_IsNull(f))
                return oai_fail(e, 400, k, "response_format.json_schema.%s: expected a string", f->string);
        } else if (!strcmp(f->string, "strict")) {
            if (!cJSON_IsBool(f) && !cJSON_IsNull(f))
                return oai_fail(e, 400, k, "response_format.json_schema.strict: expected a boolean");
        } else {
            return oai_fail(e, 400, k, "response_format.json_schema.%s: unknown field", f->string);
        }
    }
    if (!schema || cJSON_IsNull(schema))
        return oai_fail(e, 400, k, "response_format.json_schema.schema: required");
    if (schema_text(schema, k, "response_format.json_schema.schema", e, &text))
        return -1;
    return set_constraint(r, k, NULL, text, false, e);
}

static const char *const neutral_fields[] = {"echo", "best_of", "suffix", NULL};

/* tool_choice: "none" | "auto" | "required" | {"type": "function",
 * "function": {"name"}} (SUBMIT tool_choice "function" + tool_choice_name);
 * the broker holds required / named to a call (or refuses, naming why). */
static int decode_tool_choice(const cJSON *v, oai_request *r, oai_error *e)
{
    if (cJSON_IsNull(v))
        return 0;
    if (cJSON_IsString(v) &&
        (!strcmp(v->valuestring, "none") || !strcmp(v->valuestring, "auto") || !strcmp(v->valuestring, "required")))
        return copy_text(v->valuestring, "tool_choice", &r->tool_choice, NULL, e);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(v, "type");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(v, "function");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
    if (cJSON_IsObject(v) && cJSON_IsString(type) && !strcmp(type->valuestring, "function") && cJSON_IsString(name)) {
        if (!name->valuestring[0] || strlen(name->valuestring) > 64)
            return oai_fail(e, 400, "tool_choice", "tool_choice.function.name: expected 1-64 characters");
        if (copy_text(name->valuestring, "tool_choice", &r->tool_choice_name, NULL, e))
            return -1;
        return copy_text("function", "tool_choice", &r->tool_choice, NULL, e);
    }
    return oai_fail(e, 400, "tool_choice", "tool_choice: expected \"none\", \"auto\", \"required\" or "
                "{\"type\": \"function\", \"function\": {\"name\": ...}}");
}

/* tools: kept as the JSON text the client sent, so the template sees the
 * schemas exactly (cJSON would round integers past 2^53). */
static int decode_tools(const cJSON *v, const char *body, size_t len, oai_request *r, oai_error *e)
{
    if (cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsArray(v))
        return oai_fail(e, 400, "tools", "tools: expected a list of {\"type\": \"function\", \"function\": {...}}");
    if (!v->child)
        return 0;   /* no tools: as if none were sent */
    const char *span;
    size_t n = 0;
    char *printed = NULL;
    if (!tp_json_member_span(body, len, "tools", &span, &n)) {
        if (!(printed = cJSON_PrintUnformatted(v)))
            return oom(e);
        span = printed;
        n = strlen(printed);
    }
    tp_err te;
    int rc = tp_tools_check(span, n, &te);
    char *copy = rc ? NULL : malloc(n + 1);
    if (copy) {
        memcpy(copy, span, n);
        copy[n] = 0;
    }
    free(printed);
    if (rc)
        return oai_fail(e, 400, "tools", "%s", te.msg);
    if (!copy)
        return oom(e);
    r->tools = (tp_str){copy, n};
    return 0;
}

/* `speculative: {mode, n_max}` (tokpipe's SUBMIT params.speculative), and
 * llama.cpp's flat `speculative.n_max` (its `speculative.n_min` and
 * `speculative.p_min` are taken and have no effect: k adapts by itself). */
static int decode_speculative(const cJSON *v, const char *k, tp_params *pp, oai_error *e)
{
    if (cJSON_IsNull(v))
        return 0;
    int64_t x;
    tp_spec_params *sp = &pp->speculative;
    if (!strcmp(k, "speculative.n_max")) {
        if (get_int(v, k, 1, 16, &x, e))
            return -1;
        sp->n_max = (int32_t)x;
        sp->set |= TP_SPEC_P_N_MAX;
        return 0;
    }
    if (strcmp(k, "speculative")) {   /* n_min, p_min */
        if (!cJSON_IsNumber(v))
            return oai_fail(e, 400, k, "%s: expected a number", k);
        return 0;
    }
    if (!cJSON_IsObject(v))
        return oai_fail(e, 400, k, "speculative: expected an object {mode, n_max}");
    for (const cJSON *it = v->child; it; it = it->next) {
        char name[64];
        snprintf(name, sizeof name, "speculative.%.40s", it->string);
        if (!strcmp(it->string, "mode")) {
            static const char *const modes[] = {"off", "ngram", "draft"};
            size_t m = 0;
            while (m < 3 && !(cJSON_IsString(it) && !strcmp(it->valuestring, modes[m])))
                m++;
            if (m == 3)
                return oai_fail(e, 400, name, "%s: expected \"off\", \"ngram\" or \"draft\"", name);
            sp->mode = tp_str_of(modes[m]);
            sp->set |= TP_SPEC_P_MODE;
        } else if (!strcmp(it->string, "n_max") || !strcmp(it->string, "n_min") || !strcmp(it->string, "p_min")) {
            if (decode_speculative(it, name, pp, e))
                return -1;
        } else {
            return oai_fail(e, 400, name, "%s: unknown field", name);
        }
    }
    return 0;
}

static int decode_field(const cJSON *v, oai_request *r, oai_error *e)
{
    const char *k = v->string;
    tp_params *pp = &r->params;
    int64_t x;
    if (!strcmp(k, "model")) {
        if (!cJSON_IsString(v))
            return oai_fail(e, 400, k, "model: expected a string");
        return copy_text(v->valuestring, k, &r->model, NULL, e);
    }
    if (!strcmp(k, "prompt")) {
        if (r->kind == OAI_CHAT)
            return oai_fail(e, 400, k, "prompt: not a chat completions field (use messages, or /v1/completions)");
        return decode_prompt(v, r, e);
    }
    if (!strcmp(k, "messages")) {
        if (r->kind != OAI_CHAT)
            return oai_fail(e, 400, k, "messages: only for /v1/chat/completions");
        return decode_messages(v, r, e);
    }
    if (!strcmp(k, "tools") || !strcmp(k, "tool_choice") || !strcmp(k, "parallel_tool_calls")) {
        if (r->kind != OAI_CHAT)
            return oai_fail(e, 400, k, "%s: only for /v1/chat/completions", k);
        if (!strcmp(k, "tool_choice"))
            return decode_tool_choice(v, r, e);
        if (!strcmp(k, "tools"))
            return 0;   /* oai_decode: it needs the body's text */
        if (cJSON_IsNull(v))
            return 0;
        pp->set |= TP_P_PARALLEL_TOOL_CALLS;
        return get_bool(v, k, &pp->parallel_tool_calls, e);
    }
    if (!strcmp(k, "reasoning_effort")) { /* OpenAI's reasoning models' field; the template reads it */
        if (r->kind != OAI_CHAT)
            return oai_fail(e, 400, k, "%s: only for /v1/chat/completions", k);
        if (cJSON_IsNull(v))
            return 0;
        if (!cJSON_IsString(v) || (strcmp(v->valuestring, "low") && strcmp(v->valuestring, "medium") &&
                                   strcmp(v->valuestring, "high")))
            return oai_fail(e, 400, k, "reasoning_effort: expected \"low\", \"medium\" or \"high\"");
        free(r->reasoning_effort); /* a repeated key: the last one */
        r->reasoning_effort = NULL;
        return copy_text(v->valuestring, k, &r->reasoning_effort, NULL, e);
    }
    if (!strcmp(k, "max_tokens") || !strcmp(k, "max_completion_tokens"))
        return opt_int32(v, k, TP_P_MAX_TOKENS, 1, &pp->max_tokens, pp, e);
    if (!strcmp(k, "min_tokens"))
        return opt_int32(v, k, TP_P_MIN_TOKENS, 0, &pp->min_tokens, pp, e);
    if (!strcmp(k, "temperature"))
        return opt_num(v, k, TP_P_TEMPERATURE, &pp->temperature, pp, e);
    if (!strcmp(k, "top_p"))
        return opt_num(v, k, TP_P_TOP_P, &pp->top_p, pp, e);
    if (!strcmp(k, "min_p"))
        return opt_num(v, k, TP_P_MIN_P, &pp->min_p, pp, e);
    if (!strcmp(k, "repetition_penalty"))
        return opt_num(v, k, TP_P_REPETITION_PENALTY, &pp->repetition_penalty, pp, e);
    if (!strcmp(k, "presence_penalty"))
        return opt_num(v, k, TP_P_PRESENCE_PENALTY, &pp->presence_penalty, pp, e);
    if (!strcmp(k, "frequency_penalty"))
        return opt_num(v, k, TP_P_FREQUENCY_PENALTY, &pp->frequency_penalty, pp, e);
    if (!strcmp(k, "top_k")) {   /* vLLM spells "off" -1, tokpipe 0 */
        if (cJSON_IsNull(v))
            return 0;
        if (get_int(v, k, -1, INT32_MAX, &x, e))
            return -1;
        pp->top_k = x < 0 ? 0 : (int32_t)x;
        pp->set |= TP_P_TOP_K;
        return 0;
    }
    if (!strcmp(k, "seed")) {
        if (cJSON_IsNull(v))
            return 0;
        if (get_int(v, k, 0, 9007199254740991.0, &x, e))
            return -1;
        pp->seed = (uint64_t)x;
        pp->set |= TP_P_SEED;
        r->has_seed = true;
        return 0;
    }
    if (!strcmp(k, "n")) {
        if (cJSON_IsNull(v))
            return 0;
        if (get_int(v, k, 1, OAI_MAX_N, &x, e))
            return -1;
        r->n = (int)x;
        return 0;
    }
    if (!strcmp(k, "stop"))
        return decode_stop(v, pp, e);
    if (!strcmp(k, "logit_bias"))
        return decode_logit_bias(v, pp, e);
    if (!strcmp(k, "logprobs"))
        return decode_logprobs(v, r, e);
    if (!strcmp(k, "top_logprobs")) {
        if (cJSON_IsNull(v))
            return 0;
        if (r->kind != OAI_CHAT)
            return oai_fail(e, 400, k, "top_logprobs: a chat completions field (/v1/completions takes logprobs: N)");
        if (get_int(v, k, 0, OAI_MAX_CHAT_TOP_LOGPROBS, &x, e))
            return -1;
        r->top_logprobs = (int)x;
        return 0;
    }
    if (!strcmp(k, "typical_p"))
        return opt_num(v, k, TP_P_TYPICAL_P, &pp->typical_p, pp, e);
    if (!strcmp(k, "truncate_prompt_tokens"))
        return opt_int32(v, k, TP_P_TRUNCATE_PROMPT, 1, &pp->truncate_prompt_tokens, pp, e);
    if (!strcmp(k, "stop_token_ids"))
        return decode_stop_ids(v, pp, e);
    if (!strcmp(k, "ignore_eos")) {
        if (cJSON_IsNull(v))
            return 0;
        pp->set |= TP_P_IGNORE_EOS;
        return get_bool(v, k, &pp->ignore_eos, e);
    }
    if (!strcmp(k, "include_stop_str_in_output")) {
        if (cJSON_IsNull(v))
            return 0;
        pp->set |= TP_P_INCLUDE_STOP;
        return get_bool(v, k, &pp->include_stop_str_in_output, e);
    }
    if (!strcmp(k, "stream"))
        return cJSON_IsNull(v) ? 0 : get_bool(v, k, &r->stream, e);
    if (!strcmp(k, "stream_options")) {
        if (cJSON_IsNull(v))
            return 0;
        if (!cJSON_IsObject(v))
            return oai_fail(e, 400, k, "stream_options: expected an object");
        for (const cJSON *it = v->child; it; it = it->next) {
            if (strcmp(it->string, "include_usage"))
                return oai_fail(e, 400, "stream_options", "stream_options.%s: unknown field", it->string);
            if (!cJSON_IsNull(it) && get_bool(it, "stream_options.include_usage", &r->include_usage, e))
                return -1;
        }
        return 0;
    }
    if (!strncmp(k, "speculative", 11) && (!k[11] || !strcmp(k + 11, ".n_max") || !strcmp(k + 11, ".n_min") ||
                                           !strcmp(k + 11, ".p_min")))
        return decode_speculative(v, k, pp, e);
    if (!strcmp(k, "response_format"))
        return decode_response_format(v, r, e);
    if (!strcmp(k, "grammar")) {
        if (cJSON_IsNull(v))
            return 0;
        if (!cJSON_IsString(v) || !v->valuestring[0])
            return oai_fail(e, 400, k, "grammar: expected GBNF text (a non-empty string)");
        char *g = strdup(v->valuestring);
        if (!g)
            return oom(e);
        return set_constraint(r, k, g, NULL, false, e);
    }
    if (!strcmp(k, "json_schema")) {
        if (cJSON_IsNull(v))
            return 0;
        char *text;
        if (schema_text(v, k, "json_schema", e, &text))
            return -1;
        return set_constraint(r, k, NULL, text, false, e);
    }
    if (!strcmp(k, "user")) {
        if (!cJSON_IsString(v) && !cJSON_IsNull(v))
            return oai_fail(e, 400, k, "user: expected a string");
        return 0;
    }
    for (int i = 0; neutral_fields[i]; i++)
        if (!strcmp(k, neutral_fields[i]))
            return neutral(v, k, r, e);
    return oai_fail(e, 400, k, "%s: unknown field", k);
}

/* cJSON keeps C strings, so an escaped NUL would silently cut a prompt or
 * a stop string short: find one (an odd run of backslashes before u0000). */
static bool has_escaped_nul(const char *s, size_t len)
{
    for (size_t i = 0; i + 6 <= len; i++) {
        if (s[i] != '\\' || (s[i + 1] != 'u' && s[i + 1] != 'U') || memcmp(s + i + 2, "0000", 4))
            continue;
        size_t run = 0;
        while (run < i && s[i - 1 - run] == '\\')
            run++;
        if (run % 2 == 0)
            return true;
    }
    return false;
}

int oai_decode(oai_kind kind, const char *body, size_t len, oai_request *out, oai_error *e)
{
    memset(out, 0, sizeof *out);
    memset(e, 0, sizeof *e);
    out->kind = kind;
    out->n = 1;
    if (has_escaped_nul(body, len))
        return oai_fail(e, 400, NULL, "the request body holds a \\u0000 (NUL) character, which tokpipe does not take");
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root)
        return oai_fail(e, 400, NULL, "the request body is not valid JSON");
    int rc = 0;
    if (!cJSON_IsObject(root))
        rc = oai_fail(e, 400, NULL, "the request body must be a JSON object");
    /* n first: best_of is checked against it */
    const cJSON *nv = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "n") : NULL;
    if (!rc && nv)
        rc = decode_field(nv, out, e);
    for (const cJSON *it = rc ? NULL : root->child; it && !rc; it = it->next) {
        for (const cJSON *p = root->child; p != it; p = p->next)
            if (!strcmp(p->string, it->string)) {
                rc = oai_fail(e, 400, it->string, "%s: given twice", it->string);
                break;
            }
        if (!rc && strcmp(it->string, "n"))
            rc = decode_field(it, out, e);
    }
    const cJSON *tv = !rc && kind == OAI_CHAT ? cJSON_GetObjectItemCaseSensitive(root, "tools") : NULL;
    if (tv)
        rc = decode_tools(tv, body, len, out, e);
    if (!rc && out->tool_choice && !out->tools.ptr) {
        /* OpenAI: tool_choice none without tools is harmless; auto is not */
        if (strcmp(out->tool_choice, "none"))
            rc = oai_fail(e, 400, "tool_choice", "tool_choice: only with tools");
        free(out->tool_choice);
        free(out->tool_choice_name);
        out->tool_choice = out->tool_choice_name = NULL;
    }
    if (!rc && kind == OAI_COMPLETIONS && !out->n_prompts)
        rc = oai_fail(e, 400, "prompt", "prompt: required");
    if (!rc && kind == OAI_CHAT && !out->n_messages)
        rc = oai_fail(e, 400, "messages", "messages: required");
    if (!rc && kind == OAI_CHAT && out->top_logprobs && !out->logprobs)
        rc = oai_fail(e, 400, "top_logprobs", "top_logprobs: only allowed with logprobs: true");
    if (!rc && out->logprobs) {
        out->params.logprobs = true;
        out->params.top_logprobs = out->top_logprobs;
        out->params.set |= TP_P_LOGPROBS | TP_P_TOP_LOGPROBS;
    }
    if (!rc && out->grammar) {
        out->params.grammar = tp_str_of(out->grammar);
        out->params.set |= TP_P_GRAMMAR;
    }
    if (!rc && out->json_schema) {
        out->params.json_schema = tp_str_of(out->json_schema);
        out->params.set |= TP_P_JSON_SCHEMA;
    }
    if (!rc && out->json_mode) {
        out->params.json_mode = true;
        out->params.set |= TP_P_JSON_MODE;
    }
    if (!rc && out->include_usage && !out->stream)
        rc = oai_fail(e, 400, "stream_options", "stream_options: only allowed with stream: true");
    if (!rc && (out->n_prompts ? out->n_prompts : 1) * (size_t)out->n > OAI_MAX_CHOICES)
        rc = oai_fail(e, 400, "n", "n: %zu prompts x %d choices is more than %d jobs", out->n_prompts, out->n,
                  OAI_MAX_CHOICES);
    cJSON_Delete(root);
    if (rc)
        oai_request_free(out);
    return rc;
}

void oai_request_free(oai_request *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n_prompts; i++) {
        free(r->prompts[i].text);
        free(r->prompts[i].ids);
    }
    free(r->prompts);
    for (size_t i = 0; i < r->params.n_stop; i++)
        free((void *)r->params.stop[i].ptr);
    free(r->params.stop);
    free(r->params.stop_token_ids);
    free(r->params.logit_bias.ids);
    free(r->params.logit_bias.values);
    free(r->model);
    for (size_t i = 0; i < r->n_messages; i++) {
        tp_chat_msg *m = &r->messages[i];
        free((void *)m->role.ptr);
        free((void *)m->content.ptr);
        free((void *)m->name.ptr);
        free((void *)m->tool_call_id.ptr);
        for (size_t k = 0; k < m->n_tool_calls; k++) {
            free((void *)m->tool_calls[k].id.ptr);
            free((void *)m->tool_calls[k].name.ptr);
            free((void *)m->tool_calls[k].arguments.ptr);
        }
        free(m->tool_calls);
    }
    free(r->messages);
    free(r->grammar);
    free(r->json_schema);
    free((void *)r->tools.ptr);
    free(r->tool_choice);
    free(r->reasoning_effort);
    free(r->tool_choice_name);
    free(r->api_state);
    memset(r, 0, sizeof *r);
}

void oai_param_of_field(const char *field, char *out, size_t cap)
{
    if (!field || !field[0]) {
        snprintf(out, cap, "%s", "");
        return;
    }
    if (!strncmp(field, "params.", 7))
        field += 7;
    if (!strcmp(field, "prompt_ids"))
        field = "prompt";
    snprintf(out, cap, "%s", field);
}
