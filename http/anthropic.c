/* Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens.
 *
 * A front door onto the chat job: the request is translated into the
 * OpenAI chat request the same conversation is at /v1/chat/completions
 * (system -> a system turn, text blocks -> text parts, tool_use blocks ->
 * an assistant turn's tool_calls, tool_result blocks -> tool turns, tools'
 * input_schema -> function parameters, tool_choice any -> required, tool
 * -> a named function, stop_sequences -> stop) and decoded by oai.c, so
 * the job, its limits and its refusals are the chat endpoint's; the
 * results are rendered here in Anthropic's shapes (content blocks,
 * stop_reason, usage, the named SSE events, {"type": "error"} bodies).
 * Errors name the field as Anthropic's request spells it. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apijson.h"
#include "gw.h"

/* ---- requests ------------------------------------------------------------ */

static bool is_type(const cJSON *block, const char *type)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(block, "type");
    return cJSON_IsString(t) && !strcmp(t->valuestring, type);
}

/* A text block {type: "text", text} as OpenAI's text part (cache_control
 * and citations are accepted and change nothing). */
static int text_part(const cJSON *block, const char *nm, cJSON *parts, oai_error *e)
{
    static const char *const keys[] = {"type", "text", "cache_control", "citations", NULL};
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(block, "text");
    if (!cJSON_IsString(t))
        return oai_fail(e, 400, nm, "%s.text: expected a string", nm);
    if (aj_known_keys(block, keys, nm, e))
        return -1;
    cJSON *p = cJSON_CreateObject();
    cJSON_AddItemToArray(parts, p);
    if (!cJSON_AddStringToObject(p, "type", "text") || !cJSON_AddStringToObject(p, "text", t->valuestring))
        return oai_fail(e, 500, NULL, "out of memory");
    return 0;
}

/* A string or a list of text blocks as OpenAI's content (a string or text parts). */
static cJSON *text_content(const cJSON *v, const char *nm, oai_error *e)
{
    if (cJSON_IsString(v))
        return cJSON_CreateString(v->valuestring);
    if (!cJSON_IsArray(v)) {
        oai_fail(e, 400, nm, "%s: expected a string or a list of text blocks", nm);
        return NULL;
    }
    cJSON *parts = cJSON_CreateArray();
    int j = 0;
    for (const cJSON *b = v->child; parts && b; b = b->next, j++) {
        char bn[96];
        snprintf(bn, sizeof bn, "%s[%d]", nm, j);
        if (!is_type(b, "text")) {
            oai_fail(e, 400, bn, "%s: only text blocks ({\"type\": \"text\", \"text\": ...}) are supported here", bn);
            cJSON_Delete(parts);
            return NULL;
        }
        if (text_part(b, bn, parts, e)) {
            cJSON_Delete(parts);
            return NULL;
        }
    }
    return parts;
}

/* The name of the call tool_use_id answers: the function a tool turn is
 * the result of (templates that show it get it as the tool turn's name). */

/* A user turn: runs of text blocks -> user turns, each tool_result -> a tool turn. */
static int user_turn(const cJSON *content, const char *nm, cJSON *out, oai_error *e)
{
    cJSON *parts = NULL;
    int j = 0;
    for (const cJSON *b = content->child; b; b = b->next, j++) {
        char bn[96];
        snprintf(bn, sizeof bn, "%s.content[%d]", nm, j);
        if (is_type(b, "text")) {
            if (!parts)
                cJSON_AddItemToObject(aj_new_turn(out, "user"), "content", parts = cJSON_CreateArray());
            if (text_part(b, bn, parts, e))
                return -1;
            continue;
        }
        if (!is_type(b, "tool_result"))
            return oai_fail(e, 400, bn, "%s.type: expected text or tool_result in a user turn", bn);
        static const char *const keys[] = {"type", "tool_use_id", "content", "is_error", "cache_control", NULL};
        if (aj_known_keys(b, keys, bn, e))
            return -1;
        parts = NULL;
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "tool_use_id");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(b, "content");
        const cJSON *err = cJSON_GetObjectItemCaseSensitive(b, "is_error");
        if (!cJSON_IsString(id) || !id->valuestring[0])
            return oai_fail(e, 400, bn, "%s.tool_use_id: required, the id of the tool_use block it answers", bn);
        if (err && !cJSON_IsBool(err))
            return oai_fail(e, 400, bn, "%s.is_error: expected true or false", bn);
        char cn[112];
        snprintf(cn, sizeof cn, "%s.content", bn);
        cJSON *text = c ? text_content(c, cn, e) : cJSON_CreateString("");
        if (!text)
            return -1;
        cJSON *m = aj_new_turn(out, "tool");
        cJSON_AddStringToObject(m, "tool_call_id", id->valuestring);
        const char *name = aj_call_name(out, id->valuestring);
        if (name)
            cJSON_AddStringToObject(m, "name", name);
        cJSON_AddItemToObject(m, "content", text);
    }
    if (!content->child)
        cJSON_AddStringToObject(aj_new_turn(out, "user"), "content", "");
    return 0;
}

/* An assistant turn: text blocks -> its content, tool_use blocks -> its
 * tool_calls (input as JSON text); earlier thinking is not sent back to a
 * template (as Anthropic drops it from the context). */
static int assistant_turn(const cJSON *content, const char *nm, cJSON *out, oai_error *e)
{
    cJSON *m = aj_new_turn(out, "assistant");
    cJSON *parts = cJSON_CreateArray(), *calls = NULL;
    cJSON_AddItemToObject(m, "content", parts);
    int j = 0;
    for (const cJSON *b = content->child; b; b = b->next, j++) {
        char bn[96];
        snprintf(bn, sizeof bn, "%s.content[%d]", nm, j);
        if (is_type(b, "text")) {
            if (text_part(b, bn, parts, e))
                return -1;
        } else if (is_type(b, "thinking") || is_type(b, "redacted_thinking")) {
            continue;
        } else if (is_type(b, "tool_use")) {
            static const char *const keys[] = {"type", "id", "name", "input", "cache_control", NULL};
            if (aj_known_keys(b, keys, bn, e))
                return -1;
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "id");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(b, "name");
            const cJSON *input = cJSON_GetObjectItemCaseSensitive(b, "input");
            if (!cJSON_IsString(id) || !cJSON_IsString(name) || !name->valuestring[0])
                return oai_fail(e, 400, bn, "%s: a tool_use block needs an id and a name (strings)", bn);
            if (!cJSON_IsObject(input))
                return oai_fail(e, 400, bn, "%s.input: expected an object", bn);
            char *args = cJSON_PrintUnformatted(input);
            if (!calls)
                cJSON_AddItemToObject(m, "tool_calls", calls = cJSON_CreateArray());
            cJSON *call = cJSON_CreateObject(), *fn = cJSON_CreateObject();
            cJSON_AddItemToArray(calls, call);
            cJSON_AddStringToObject(call, "id", id->valuestring);
            cJSON_AddStringToObject(call, "type", "function");
            cJSON_AddItemToObject(call, "function", fn);
            cJSON_AddStringToObject(fn, "name", name->valuestring);
            if (!args || !cJSON_AddStringToObject(fn, "arguments", args)) {
                free(args);
                return oai_fail(e, 500, NULL, "out of memory");
            }
            free(args);
        } else {
            return oai_fail(e, 400, bn, "%s.type: expected text, tool_use or thinking in an assistant turn", bn);
        }
    }
    /* OpenAI's shape of a turn of only calls */
    if (calls && !cJSON_GetArraySize(parts))
        cJSON_ReplaceItemInObject(m, "content", cJSON_CreateNull());
    return 0;
}

static int translate_messages(const cJSON *v, cJSON *out, oai_error *e)
{
    if (!cJSON_IsArray(v) || !v->child)
        return oai_fail(e, 400, "messages", "messages: expected a non-empty list of {role, content}");
    int i = 0;
    for (const cJSON *it = v->child; it; it = it->next, i++) {
        char nm[64];
        snprintf(nm, sizeof nm, "messages[%d]", i);
        static const char *const keys[] = {"role", "content", NULL};
        if (!cJSON_IsObject(it))
            return oai_fail(e, 400, nm, "%s: expected an object {role, content}", nm);
        if (aj_known_keys(it, keys, nm, e))
            return -1;
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        bool user = cJSON_IsString(role) && !strcmp(role->valuestring, "user");
        if (!user && !(cJSON_IsString(role) && !strcmp(role->valuestring, "assistant")))
            return oai_fail(e, 400, nm, "%s.role: expected \"user\" or \"assistant\"", nm);
        if (cJSON_IsString(content)) {
            cJSON_AddStringToObject(aj_new_turn(out, role->valuestring), "content", content->valuestring);
            continue;
        }
        if (!cJSON_IsArray(content))
            return oai_fail(e, 400, nm, "%s.content: required, a string or a list of content blocks", nm);
        if (user ? user_turn(content, nm, out, e) : assistant_turn(content, nm, out, e))
            return -1;
    }
    return 0;
}

/* tools: [{name, description?, input_schema, cache_control?, type?: "custom"}]
 * -> [{type: "function", function: {name, description, parameters}}]. */
static int translate_tools(const cJSON *v, cJSON *req, oai_error *e)
{
    if (!cJSON_IsArray(v))
        return oai_fail(e, 400, "tools", "tools: expected a list of {name, description, input_schema}");
    cJSON *out = cJSON_AddArrayToObject(req, "tools");
    int i = 0;
    for (const cJSON *t = v->child; t; t = t->next, i++) {
        char nm[64];
        snprintf(nm, sizeof nm, "tools[%d]", i);
        static const char *const keys[] = {"type", "name", "description", "input_schema", "cache_control", NULL};
        if (!cJSON_IsObject(t))
            return oai_fail(e, 400, nm, "%s: expected an object {name, description, input_schema}", nm);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        if (type && !is_type(t, "custom"))
            return oai_fail(e, 400, nm, "%s.type: only client tools (\"custom\") are supported, not Anthropic's server tools",
                        nm);
        if (aj_known_keys(t, keys, nm, e))
            return -1;
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
        const cJSON *desc = cJSON_GetObjectItemCaseSensitive(t, "description");
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(t, "input_schema");
        if (!cJSON_IsString(name))
            return oai_fail(e, 400, nm, "%s.name: required, a string", nm);
        if (desc && !cJSON_IsString(desc))
            return oai_fail(e, 400, nm, "%s.description: expected a string", nm);
        if (!cJSON_IsObject(schema))
            return oai_fail(e, 400, nm, "%s.input_schema: required, a JSON Schema object", nm);
        cJSON *f = cJSON_CreateObject(), *fn = cJSON_CreateObject();
        cJSON_AddItemToArray(out, f);
        cJSON_AddStringToObject(f, "type", "function");
        cJSON_AddItemToObject(f, "function", fn);
        cJSON_AddStringToObject(fn, "name", name->valuestring);
        if (desc)
            cJSON_AddStringToObject(fn, "description", desc->valuestring);
        cJSON_AddItemToObject(fn, "parameters", cJSON_Duplicate(schema, 1));
    }
    return 0;
}

/* tool_choice {type: auto | any | tool (+ name) | none,
 * disable_parallel_tool_use} -> auto | required | function | none. */
static int translate_tool_choice(const cJSON *v, cJSON *req, oai_error *e)
{
    const char *k = "tool_choice";
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(v, "type");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(v, "name");
    const cJSON *dp = cJSON_GetObjectItemCaseSensitive(v, "disable_parallel_tool_use");
    if (!cJSON_IsObject(v) || !cJSON_IsString(type))
        return oai_fail(e, 400, k, "tool_choice: expected {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}");
    static const char *const keys[] = {"type", "name", "disable_parallel_tool_use", NULL};
    if (aj_known_keys(v, keys, k, e))
        return -1;
    const char *t = type->valuestring;
    if (dp && !cJSON_IsBool(dp))
        return oai_fail(e, 400, k, "tool_choice.disable_parallel_tool_use: expected true or false");
    if (!strcmp(t, "tool")) {
        if (!cJSON_IsString(name))
            return oai_fail(e, 400, k, "tool_choice.name: required with type \"tool\"");
        cJSON *c = cJSON_AddObjectToObject(req, k);
        cJSON_AddStringToObject(c, "type", "function");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(c, "function"), "name", name->valuestring);
    } else if (!strcmp(t, "auto") || !strcmp(t, "any") || !strcmp(t, "none")) {
        if (name)
            return oai_fail(e, 400, k, "tool_choice.name: only with type \"tool\"");
        cJSON_AddStringToObject(req, k, !strcmp(t, "any") ? "required" : t);
    } else {
        return oai_fail(e, 400, k, "tool_choice.type: '%.40s' is not auto, any, tool or none", t);
    }
    if (cJSON_IsTrue(dp))
        cJSON_AddFalseToObject(req, "parallel_tool_calls");
    return 0;
}

/* thinking {type: enabled, budget_tokens} | {type: disabled}: checked as
 * Anthropic documents it. The job is the chat job either way: a model
 * that thinks returns its thinking as thinking blocks, and the budget is
 * not enforced apart from max_tokens. */
static int check_thinking(const cJSON *v, const cJSON *max_tokens, oai_error *e)
{
    const char *k = "thinking";
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(v, "type");
    const cJSON *budget = cJSON_GetObjectItemCaseSensitive(v, "budget_tokens");
    if (!cJSON_IsObject(v) || !cJSON_IsString(type))
        return oai_fail(e, 400, k, "thinking: expected {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}");
    if (!strcmp(type->valuestring, "disabled")) {
        static const char *const keys[] = {"type", NULL};
        return aj_known_keys(v, keys, k, e);
    }
    if (strcmp(type->valuestring, "enabled"))
        return oai_fail(e, 400, k, "thinking.type: '%.40s' is not enabled or disabled", type->valuestring);
    static const char *const keys[] = {"type", "budget_tokens", NULL};
    if (aj_known_keys(v, keys, k, e))
        return -1;
    if (!cJSON_IsNumber(budget) || budget->valuedouble != floor(budget->valuedouble) ||
        budget->valuedouble < 1024)
        return oai_fail(e, 400, k, "thinking.budget_tokens: required, an integer >= 1024");
    if (cJSON_IsNumber(max_tokens) && budget->valuedouble >= max_tokens->valuedouble)
        return oai_fail(e, 400, k, "thinking.budget_tokens: must be less than max_tokens");
    return 0;
}

static int check_metadata(const cJSON *v, oai_error *e)
{
    if (cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsObject(v))
        return oai_fail(e, 400, "metadata", "metadata: expected an object {user_id}");
    static const char *const keys[] = {"user_id", NULL};
    if (aj_known_keys(v, keys, "metadata", e))
        return -1;
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(v, "user_id");
    if (u && !cJSON_IsString(u) && !cJSON_IsNull(u))
        return oai_fail(e, 400, "metadata", "metadata.user_id: expected a string");
    return 0;
}

/* The fields passed on under the chat request's name. */
static const struct {
    const char *anthropic, *openai;
    bool messages, count;   /* taken by /v1/messages, by count_tokens */
} plain_fields[] = {
    {"model", "model", true, true},
    {"max_tokens", "max_tokens", true, false},
    {"temperature", "temperature", true, false},
    {"top_p", "top_p", true, false},
    {"top_k", "top_k", true, false},
    {"stop_sequences", "stop", true, false},
    {"stream", "stream", true, false},
    {"speculative", "speculative", true, false},   /* tokpipe's, as on every endpoint */
    {"speculative.n_max", "speculative.n_max", true, false},
};

/* The Anthropic name of a chat request's field in an oai.c message or
 * param ("stop[1]" -> "stop_sequences[1]", "tools[0].function.parameters"
 * -> "tools[0].input_schema"). */
static void anthropic_name(const char *in, char *out, size_t cap)
{
    static const struct {
        const char *from, *to;
    } renames[] = {{"stop", "stop_sequences"}, {".function.parameters", ".input_schema"}, {".function.", "."},
                   {"parallel_tool_calls", "tool_choice.disable_parallel_tool_use"}};
    size_t o = 0;
    for (const char *p = in; *p && o + 1 < cap;) {
        size_t k = 0, n = sizeof renames / sizeof renames[0];
        while (k < n && strncmp(p, renames[k].from, strlen(renames[k].from)))
            k++;
        /* "stop" only as a whole word at the field's start ("stop: ", "stop[") */
        if (k == 0 && (p != in || (p[4] && p[4] != '[' && p[4] != ':' && p[4] != ' ')))
            k = n;
        if (k < n) {
            o += (size_t)snprintf(out + o, cap - o, "%s", renames[k].to);
            if (o >= cap)
                o = cap - 1;
            p += strlen(renames[k].from);
        } else {
            out[o++] = *p++;
        }
    }
    out[o < cap ? o : cap - 1] = '\0';
}

static int translate(bool count, const cJSON *root, cJSON *req, oai_error *e)
{
    if (!cJSON_IsObject(root))
        return oai_fail(e, 400, NULL, "the request body must be a JSON object");
    const cJSON *max_tokens = cJSON_GetObjectItemCaseSensitive(root, "max_tokens");
    const cJSON *system = NULL, *messages = NULL;
    for (const cJSON *f = root->child; f; f = f->next) {
        const char *k = f->string;
        for (const cJSON *p = root->child; p != f; p = p->next)
            if (!strcmp(p->string, k))
                return oai_fail(e, 400, k, "%s: given twice", k);
        size_t i = 0, n = sizeof plain_fields / sizeof plain_fields[0];
        while (i < n && strcmp(plain_fields[i].anthropic, k))
            i++;
        if (i < n && (count ? plain_fields[i].count : plain_fields[i].messages)) {
            /* cJSON would print an overflowing number (1e999) as null */
            if (cJSON_IsNumber(f) && !isfinite(f->valuedouble))
                return oai_fail(e, 400, k, "%s: the number given is not finite", k);
            if (!strcmp(k, "stop_sequences") && !cJSON_IsArray(f) && !cJSON_IsNull(f))
                return oai_fail(e, 400, k, "stop_sequences: expected a list of strings");
            if (!cJSON_IsNull(f))
                cJSON_AddItemToObject(req, plain_fields[i].openai, cJSON_Duplicate(f, 1));
        } else if (!strcmp(k, "system")) {
            system = f;
        } else if (!strcmp(k, "messages")) {
            messages = f;
        } else if (!strcmp(k, "tools")) {
            if (translate_tools(f, req, e))
                return -1;
        } else if (!strcmp(k, "tool_choice")) {
            if (translate_tool_choice(f, req, e))
                return -1;
        } else if (!strcmp(k, "thinking")) {
            if (check_thinking(f, count ? NULL : max_tokens, e))
                return -1;
        } else if (!strcmp(k, "metadata") && !count) {
            if (check_metadata(f, e))
                return -1;
        } else {
            return oai_fail(e, 400, k, "%s: unknown field%s", k, count ? " (count_tokens takes model, messages, "
                        "system, tools, tool_choice, thinking)" : "");
        }
    }
    if (!count && (!max_tokens || cJSON_IsNull(max_tokens)))
        return oai_fail(e, 400, "max_tokens", "max_tokens: required");
    if (!messages)
        return oai_fail(e, 400, "messages", "messages: required");
    cJSON *out = cJSON_AddArrayToObject(req, "messages");
    if (system) {
        cJSON *c = text_content(system, "system", e);
        if (!c)
            return -1;
        cJSON_AddItemToObject(aj_new_turn(out, "system"), "content", c);
    }
    if (translate_messages(messages, out, e))
        return -1;
    /* count_tokens: the prompt is the job's; one token is the least a job makes */
    if (count)
        cJSON_AddNumberToObject(req, "max_tokens", 1);
    return 0;
}

int gw_anthropic_decode(bool count, const char *body, size_t len, oai_request *out, oai_error *e)
{
    memset(out, 0, sizeof *out);
    memset(e, 0, sizeof *e);
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root)
        return oai_fail(e, 400, NULL, "the request body is not valid JSON");
    cJSON *req = cJSON_CreateObject();
    int rc = req ? translate(count, root, req, e) : oai_fail(e, 500, NULL, "out of memory");
    char *text = rc ? NULL : cJSON_PrintUnformatted(req);
    cJSON_Delete(root);
    cJSON_Delete(req);
    if (!rc && !text)
        rc = oai_fail(e, 500, NULL, "out of memory");
    if (!rc && oai_decode(OAI_CHAT, text, strlen(text), out, e)) {
        char buf[sizeof e->message];
        anthropic_name(e->param, buf, sizeof e->param);
        memcpy(e->param, buf, sizeof e->param);
        anthropic_name(e->message, buf, sizeof buf);
        snprintf(e->message, sizeof e->message, "%s", buf);
        rc = -1;
    }
    free(text);
    return rc;
}

/* ---- responses ----------------------------------------------------------- */

static const char *error_type(int status)
{
    switch (status) {
    case 400:
    case 405:
        return "invalid_request_error";
    case 401:
        return "authentication_error";
    case 403:
        return "permission_error";
    case 404:
        return "not_found_error";
    case 413:
        return "request_too_large";
    case 429:
        return "rate_limit_error";
    case 503:
    case 529:
        return "overloaded_error";
    default:
        return "api_error";
    }
}

static cJSON *error_object(int status, const char *message, const char *param)
{
    cJSON *o = cJSON_CreateObject(), *e = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "error");
    cJSON_AddItemToObject(o, "error", e);
    cJSON_AddStringToObject(e, "type", error_type(status));
    /* Anthropic's errors have no param: the message names the field */
    char name[64] = "", msg[TP_PROTO_MAX_ERROR + 160];
    if (param && param[0])
        anthropic_name(param, name, sizeof name);
    size_t nl = strlen(name);
    if (nl && strncmp(message, name, nl))
        snprintf(msg, sizeof msg, "%s: %s", name, message);
    else
        snprintf(msg, sizeof msg, "%s", message);
    cJSON_AddStringToObject(e, "message", msg);
    return o;
}

/* code (context_length_exceeded) has no place in Anthropic's shape: the
 * message says it */
static char *ant_error(int status, const char *message, const char *param, const char *code)
{
    (void)code;
    return aj_print_free(error_object(status, message, param));
}

static char *event(const char *name, cJSON *o)
{
    char *j = aj_print_free(o);
    if (!j)
        return NULL;
    size_t n = strlen(j) + strlen(name) + 20;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "event: %s\ndata: %s\n\n", name, j);
    free(j);
    return s;
}

static char *ant_stream_error(int status, const char *message, const char *param)
{
    return event("error", error_object(status, message, param));
}

static void ant_param(const char *field, char *out, size_t cap)
{
    char f[128];
    oai_param_of_field(field, f, sizeof f);
    anthropic_name(f, out, cap);
}

/* stop_reason and stop_sequence: tool_use when the job ended for its
 * calls, each whole (the rule the chat endpoint's "tool_calls" follows);
 * a length finish is max_tokens, calls or not */
static void add_stop(cJSON *o, const gw_choice *ch)
{
    size_t n_calls = ch->tool_calls ? (size_t)cJSON_GetArraySize(ch->tool_calls) : 0;
    const char *r = ch->reason == TP_REASON_LENGTH                                   ? "max_tokens"
                    : tp_reason_ends_in_calls(ch->reason, n_calls, ch->tool_calls_cut) ? "tool_use"
                    : ch->reason == TP_REASON_STOP_STRING ? "stop_sequence"
                                                          : "end_turn";
    cJSON_AddStringToObject(o, "stop_reason", r);
    if (!strcmp(r, "stop_sequence") && ch->matched.kind == TP_MATCHED_STR)
        cJSON_AddStringToObject(o, "stop_sequence", ch->matched_buf ? ch->matched_buf : "");
    else
        cJSON_AddNullToObject(o, "stop_sequence");
}

/* Anthropic's input_tokens leave out the tokens read from the cache
 * (input = input_tokens + cache_read_input_tokens + cache_creation_input_tokens). */
static void add_usage(cJSON *u, const gw_choice *ch, bool input)
{
    uint32_t cached = ch->cached_tokens; /* below prompt_tokens: the protocol checks FINISH */
    if (input) {
        cJSON_AddNumberToObject(u, "input_tokens", (double)(ch->prompt_tokens - cached));
        cJSON_AddNumberToObject(u, "cache_creation_input_tokens", 0);
        cJSON_AddNumberToObject(u, "cache_read_input_tokens", (double)cached);
    }
    cJSON_AddNumberToObject(u, "output_tokens", (double)ch->completion_tokens);
}

/* A call's arguments as tool_use input: the object the model wrote; {}
 * for arguments that are no JSON object (a call cut short). */
static cJSON *call_input(const cJSON *call)
{
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
    cJSON *in = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
    if (!cJSON_IsObject(in)) {
        cJSON_Delete(in);
        in = cJSON_CreateObject();
    }
    return in;
}

static cJSON *message_head(const gw_call *c, const char *model)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", c->id);
    cJSON_AddStringToObject(o, "type", "message");
    cJSON_AddStringToObject(o, "role", "assistant");
    cJSON_AddStringToObject(o, "model", model);
    return o;
}

static char *ant_body(const gw_call *c, const char *model)
{
    const gw_choice *ch = &c->ch[0];
    cJSON *o = message_head(c, model);
    cJSON *content = cJSON_AddArrayToObject(o, "content");
    if (ch->reasoning.len) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "type", "thinking");
        cJSON_AddItemToObject(b, "thinking", aj_text_of(ch->reasoning.data, ch->reasoning.len));
        cJSON_AddStringToObject(b, "signature", "");
        cJSON_AddItemToArray(content, b);
    }
    if (ch->text.len) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "type", "text");
        cJSON_AddItemToObject(b, "text", aj_text_of(ch->text.data, ch->text.len));
        cJSON_AddItemToArray(content, b);
    }
    for (const cJSON *t = ch->tool_calls ? ch->tool_calls->child : NULL; t; t = t->next) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "type", "tool_use");
        cJSON_AddItemToObject(b, "id", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(t, "id"), 1));
        cJSON_AddItemToObject(b, "name", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(fn, "name"), 1));
        cJSON_AddItemToObject(b, "input", call_input(t));
        cJSON_AddItemToArray(content, b);
    }
    add_stop(o, ch);
    add_usage(cJSON_AddObjectToObject(o, "usage"), ch, true);
    return aj_print_free(o);
}

static char *count_body(const gw_call *c, const char *model)
{
    (void)model;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "input_tokens", (double)c->ch[0].prompt_tokens);
    return aj_print_free(o);
}

/* ---- streaming: the named events ------------------------------------------ */

/* Appends an event to *acc (NULL-safe; *acc NULL after out of memory). */
static void append(char **acc, bool *oom, char *ev)
{
    if (!ev) {
        *oom = true;
        return;
    }
    size_t a = *acc ? strlen(*acc) : 0, n = strlen(ev);
    char *p = realloc(*acc, a + n + 1);
    if (!p) {
        *oom = true;
        free(ev);
        return;
    }
    memcpy(p + a, ev, n + 1);
    *acc = p;
    free(ev);
}

static char *done(char *acc, bool oom)
{
    if (oom) {
        free(acc);
        return NULL;
    }
    return acc;
}

static void close_block(gw_choice *ch, char **acc, bool *oom)
{
    if (ch->blk == GW_BLK_NONE)
        return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "content_block_stop");
    cJSON_AddNumberToObject(o, "index", (double)ch->blk_at);
    append(acc, oom, event("content_block_stop", o));
    ch->blk = GW_BLK_NONE;
}

/* Opens a block of kind (content_block the start's body); returns its index. */
static size_t open_block(gw_choice *ch, gw_block kind, cJSON *block, char **acc, bool *oom)
{
    close_block(ch, acc, oom);
    ch->blk = kind;
    ch->blk_at = ch->n_blk++;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "content_block_start");
    cJSON_AddNumberToObject(o, "index", (double)ch->blk_at);
    cJSON_AddItemToObject(o, "content_block", block);
    append(acc, oom, event("content_block_start", o));
    return ch->blk_at;
}

static void delta(size_t index, const char *type, const char *key, const char *s, size_t len, char **acc, bool *oom)
{
    cJSON *o = cJSON_CreateObject(), *d = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "content_block_delta");
    cJSON_AddNumberToObject(o, "index", (double)index);
    cJSON_AddItemToObject(o, "delta", d);
    cJSON_AddStringToObject(d, "type", type);
    cJSON_AddItemToObject(d, key, aj_text_of(s, len));
    append(acc, oom, event("content_block_delta", o));
}

/* message_start (usage is known at the end: message_delta says it), ping */
static char *ant_open(gw_call *c, const char *model)
{
    char *acc = NULL;
    bool oom = false;
    cJSON *o = cJSON_CreateObject(), *m = message_head(c, model);
    cJSON_AddStringToObject(o, "type", "message_start");
    cJSON_AddItemToObject(o, "message", m);
    cJSON_AddArrayToObject(m, "content");
    cJSON_AddNullToObject(m, "stop_reason");
    cJSON_AddNullToObject(m, "stop_sequence");
    cJSON *u = cJSON_AddObjectToObject(m, "usage");
    cJSON_AddNumberToObject(u, "input_tokens", 0);
    cJSON_AddNumberToObject(u, "output_tokens", 0);
    append(&acc, &oom, event("message_start", o));
    o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "ping");
    append(&acc, &oom, event("ping", o));
    return done(acc, oom);
}

static char *ant_text(gw_call *c, const char *model, size_t i, const char *text, size_t len, size_t lp_from,
                      size_t lp_to)
{
    (void)model, (void)lp_from, (void)lp_to;
    gw_choice *ch = &c->ch[i];
    char *acc = NULL;
    bool oom = false;
    if (!len)
        return strdup("");
    if (ch->blk != GW_BLK_TEXT) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "type", "text");
        cJSON_AddStringToObject(b, "text", "");
        open_block(ch, GW_BLK_TEXT, b, &acc, &oom);
    }
    delta(ch->blk_at, "text_delta", "text", text, len, &acc, &oom);
    return done(acc, oom);
}

static char *ant_reasoning(gw_call *c, const char *model, size_t i, const char *s, size_t len)
{
    (void)model;
    gw_choice *ch = &c->ch[i];
    char *acc = NULL;
    bool oom = false;
    if (!len)
        return strdup("");
    if (ch->blk != GW_BLK_THINKING) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "type", "thinking");
        cJSON_AddStringToObject(b, "thinking", "");
        cJSON_AddStringToObject(b, "signature", "");
        open_block(ch, GW_BLK_THINKING, b, &acc, &oom);
    }
    delta(ch->blk_at, "thinking_delta", "thinking", s, len, &acc, &oom);
    return done(acc, oom);
}

static char *ant_call(gw_call *c, const char *model, size_t i, size_t k, const char *id, size_t id_len,
                      const char *name, size_t name_len, const char *args, size_t args_len)
{
    (void)model;
    gw_choice *ch = &c->ch[i];
    char *acc = NULL;
    bool oom = false;
    if (id) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "type", "tool_use");
        cJSON_AddItemToObject(b, "id", aj_text_of(id, id_len));
        cJSON_AddItemToObject(b, "name", aj_text_of(name, name_len));
        cJSON_AddObjectToObject(b, "input");
        ch->scalls[k].block = open_block(ch, GW_BLK_TOOL, b, &acc, &oom);
    }
    if (args_len)
        delta(ch->scalls[k].block, "input_json_delta", "partial_json", args, args_len, &acc, &oom);
    return done(acc ? acc : strdup(""), oom);
}

/* the last block's stop and message_delta: stop_reason, the whole usage */
static char *ant_finish(gw_call *c, const char *model, size_t i)
{
    (void)model;
    gw_choice *ch = &c->ch[i];
    char *acc = NULL;
    bool oom = false;
    close_block(ch, &acc, &oom);
    cJSON *o = cJSON_CreateObject(), *d = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "message_delta");
    cJSON_AddItemToObject(o, "delta", d);
    add_stop(d, ch);
    add_usage(cJSON_AddObjectToObject(o, "usage"), ch, true);
    append(&acc, &oom, event("message_delta", o));
    return done(acc, oom);
}

static char *ant_close(gw_call *c, const char *model)
{
    (void)c, (void)model;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "message_stop");
    return event("message_stop", o);
}

static int decode_messages(const char *body, size_t len, oai_request *out, oai_error *e)
{
    return gw_anthropic_decode(false, body, len, out, e);
}

static int decode_count(const char *body, size_t len, oai_request *out, oai_error *e)
{
    return gw_anthropic_decode(true, body, len, out, e);
}

const gw_api gw_api_messages = {
    .path = "/v1/messages",
    .endpoint = GW_EP_MESSAGES,
    .decode = decode_messages,
    .id_prefix = "msg_",
    .error = ant_error,
    .stream_error = ant_stream_error,
    .param = ant_param,
    .body = ant_body,
    .open = ant_open,
    .text = ant_text,
    .reasoning = ant_reasoning,
    .call = ant_call,
    .finish = ant_finish,
    .close = ant_close,
};

/* never streamed: the decoder takes no stream field */
const gw_api gw_api_count_tokens = {
    .path = "/v1/messages/count_tokens",
    .endpoint = GW_EP_COUNT_TOKENS,
    .decode = decode_count,
    .id_prefix = "msg_",
    .error = ant_error,
    .stream_error = ant_stream_error,
    .param = ant_param,
    .body = count_body,
    .text = ant_text,
    .reasoning = ant_reasoning,
    .call = ant_call,
    .finish = ant_finish,
    .close = ant_close,
};
