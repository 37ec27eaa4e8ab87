/* OpenAI's Responses API: POST /v1/responses, GET and DELETE
 * /v1/responses/{id}.
 *
 * A front door onto the chat job, as anthropic.c is: the request is
 * translated into the chat request of the same conversation
 * (instructions -> a system turn, input items -> turns: messages by role
 * (developer -> system), function_call items -> an assistant turn's
 * tool_calls, function_call_output -> a tool turn, reasoning items dropped
 * as the templates drop earlier thinking; tools -> function tools,
 * text.format -> response_format, max_output_tokens -> max_tokens) and
 * decoded by oai.c, so the job, its limits and its refusals are the chat
 * endpoint's. previous_response_id puts the stored conversation of that
 * response (its input turns and its output turn, not its instructions)
 * before the input: the continued prompt begins with the tokens the last
 * one had, so the prefix cache serves them. Results are rendered here as
 * response objects and output items, streamed as the typed events
 * (response.created, response.output_text.delta, ...,
 * response.completed); a response with store (default true) is kept in
 * g->responses (rstore.c). reasoning.effort is accepted and echoed: the
 * job is the chat job either way, a model that thinks returns reasoning
 * items. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apijson.h"
#include "gw.h"

#define ID_PREFIX "resp_"

/* ---- requests ------------------------------------------------------------ */

static int oom(oai_error *e)
{
    return oai_fail(e, 500, NULL, "out of memory");
}

static const char *type_of(const cJSON *o)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

static const cJSON *item(const cJSON *o, const char *k)
{
    return cJSON_GetObjectItemCaseSensitive(o, k);
}

/* A message's content: a string, or input_text / output_text parts ->
 * the chat content (a string, or text parts). */
static cJSON *content_of(const cJSON *v, const char *nm, oai_error *e)
{
    if (cJSON_IsString(v))
        return cJSON_CreateString(v->valuestring);
    if (!cJSON_IsArray(v)) {
        oai_fail(e, 400, nm, "%s: expected a string or a list of input_text parts", nm);
        return NULL;
    }
    cJSON *parts = cJSON_CreateArray();
    int j = 0;
    for (const cJSON *p = v->child; parts && p; p = p->next, j++) {
        char pn[128];
        snprintf(pn, sizeof pn, "%s[%d]", nm, j);
        const char *t = type_of(p);
        static const char *const keys[] = {"type", "text", "annotations", "logprobs", NULL};
        const cJSON *text = item(p, "text");
        if (!t || (strcmp(t, "input_text") && strcmp(t, "output_text"))) {
            oai_fail(e, 400, pn, "%s.type: only input_text and output_text parts are supported here", pn);
        } else if (!cJSON_IsString(text)) {
            oai_fail(e, 400, pn, "%s.text: expected a string", pn);
        } else if (!aj_known_keys(p, keys, pn, e)) {
            cJSON *q = cJSON_CreateObject();
            cJSON_AddItemToArray(parts, q);
            cJSON_AddStringToObject(q, "type", "text");
            cJSON_AddStringToObject(q, "text", text->valuestring);
            continue;
        }
        cJSON_Delete(parts);
        return NULL;
    }
    return parts;
}

static int message_item(const cJSON *it, const char *nm, cJSON *out, cJSON **assistant, oai_error *e)
{
    static const char *const keys[] = {"type", "role", "content", "id", "status", NULL};
    if (aj_known_keys(it, keys, nm, e))
        return -1;
    const cJSON *role = item(it, "role");
    const char *r = cJSON_IsString(role) ? role->valuestring : "";
    if (strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "system") && strcmp(r, "developer"))
        return oai_fail(e, 400, nm, "%s.role: expected user, assistant, system or developer", nm);
    char cn[96];
    snprintf(cn, sizeof cn, "%s.content", nm);
    const cJSON *content = item(it, "content");
    if (!content)
        return oai_fail(e, 400, nm, "%s: required", cn);
    cJSON *c = content_of(content, cn, e);
    if (!c)
        return -1;
    cJSON *m = aj_new_turn(out, !strcmp(r, "developer") ? "system" : r);
    cJSON_AddItemToObject(m, "content", c);
    *assistant = strcmp(r, "assistant") ? NULL : m;
    return 0;
}

/* A function_call item joins the assistant turn just before it (the
 * message and the calls of one output are one chat turn) or starts one. */
static int call_item(const cJSON *it, const char *nm, cJSON *out, cJSON **assistant, oai_error *e)
{
    static const char *const keys[] = {"type", "id", "call_id", "name", "arguments", "status", NULL};
    if (aj_known_keys(it, keys, nm, e))
        return -1;
    const cJSON *id = item(it, "call_id"), *name = item(it, "name"), *args = item(it, "arguments");
    if (!cJSON_IsString(id) || !id->valuestring[0])
        return oai_fail(e, 400, nm, "%s.call_id: required, a string", nm);
    if (!cJSON_IsString(name) || !name->valuestring[0])
        return oai_fail(e, 400, nm, "%s.name: required, a string", nm);
    if (!cJSON_IsString(args))
        return oai_fail(e, 400, nm, "%s.arguments: required, the call's arguments as JSON text", nm);
    if (!*assistant) {
        *assistant = aj_new_turn(out, "assistant");
        cJSON_AddNullToObject(*assistant, "content");
    }
    cJSON *calls = cJSON_GetObjectItemCaseSensitive(*assistant, "tool_calls");
    if (!calls)
        calls = cJSON_AddArrayToObject(*assistant, "tool_calls");
    cJSON *call = cJSON_CreateObject(), *fn = cJSON_CreateObject();
    cJSON_AddItemToArray(calls, call);
    cJSON_AddStringToObject(call, "id", id->valuestring);
    cJSON_AddStringToObject(call, "type", "function");
    cJSON_AddItemToObject(call, "function", fn);
    cJSON_AddStringToObject(fn, "name", name->valuestring);
    if (!cJSON_AddStringToObject(fn, "arguments", args->valuestring))
        return oom(e);
    return 0;
}

static int output_item(const cJSON *it, const char *nm, cJSON *out, oai_error *e)
{
    static const char *const keys[] = {"type", "id", "call_id", "output", "status", NULL};
    if (aj_known_keys(it, keys, nm, e))
        return -1;
    const cJSON *id = item(it, "call_id"), *o = item(it, "output");
    if (!cJSON_IsString(id) || !id->valuestring[0])
        return oai_fail(e, 400, nm, "%s.call_id: required, the call_id of the function_call it answers", nm);
    if (!cJSON_IsString(o))
        return oai_fail(e, 400, nm, "%s.output: required, a string", nm);
    const char *name = aj_call_name(out, id->valuestring);
    cJSON *m = aj_new_turn(out, "tool");
    cJSON_AddStringToObject(m, "tool_call_id", id->valuestring);
    if (name)
        cJSON_AddStringToObject(m, "name", name);
    if (!cJSON_AddStringToObject(m, "content", o->valuestring))
        return oom(e);
    return 0;
}

/* input: a string (one user turn) or a list of items, appended to out. */
static int translate_input(const cJSON *v, cJSON *out, oai_error *e)
{
    if (cJSON_IsString(v)) {
        cJSON_AddStringToObject(aj_new_turn(out, "user"), "content", v->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(v))
        return oai_fail(e, 400, "input", "input: expected a string or a list of items");
    cJSON *assistant = NULL;   /* the assistant turn a function_call joins */
    int i = 0;
    for (const cJSON *it = v->child; it; it = it->next, i++) {
        char nm[64];
        snprintf(nm, sizeof nm, "input[%d]", i);
        if (!cJSON_IsObject(it))
            return oai_fail(e, 400, nm, "%s: expected an item object", nm);
        const char *t = type_of(it);
        if (item(it, "type") && !t)
            return oai_fail(e, 400, nm, "%s.type: expected a string", nm);
        int rc;
        if (!t || !strcmp(t, "message")) {
            rc = message_item(it, nm, out, &assistant, e);
        } else if (!strcmp(t, "function_call")) {
            rc = call_item(it, nm, out, &assistant, e);
        } else if (!strcmp(t, "function_call_output")) {
            rc = output_item(it, nm, out, e);
            assistant = NULL;
        } else if (!strcmp(t, "reasoning")) {
            static const char *const keys[] = {"type", "id", "summary", "content", "encrypted_content", "status",
                                               NULL};
            rc = aj_known_keys(it, keys, nm, e);
        } else {
            rc = oai_fail(e, 400, nm, "%s.type: '%.40s' is not message, function_call, function_call_output or reasoning",
                      nm, t);
        }
        if (rc)
            return -1;
    }
    return 0;
}

/* tools: [{type: "function", name, description?, parameters, strict?}] ->
 * chat's [{type: "function", function: {...}}]. */
static int translate_tools(const cJSON *v, cJSON *req, oai_error *e)
{
    if (!cJSON_IsArray(v))
        return oai_fail(e, 400, "tools", "tools: expected a list of function tools");
    cJSON *out = cJSON_AddArrayToObject(req, "tools");
    int i = 0;
    for (const cJSON *t = v->child; t; t = t->next, i++) {
        char nm[64];
        snprintf(nm, sizeof nm, "tools[%d]", i);
        if (!cJSON_IsObject(t))
            return oai_fail(e, 400, nm, "%s: expected an object {type: \"function\", name, parameters}", nm);
        const char *type = type_of(t);
        if (!type || strcmp(type, "function"))
            return oai_fail(e, 400, nm, "%s.type: only function tools are supported", nm);
        static const char *const keys[] = {"type", "name", "description", "parameters", "strict", NULL};
        if (aj_known_keys(t, keys, nm, e))
            return -1;
        cJSON *f = cJSON_CreateObject(), *fn = cJSON_CreateObject();
        cJSON_AddItemToArray(out, f);
        cJSON_AddStringToObject(f, "type", "function");
        cJSON_AddItemToObject(f, "function", fn);
        for (const cJSON *k = t->child; k; k = k->next)
            if (strcmp(k->string, "type"))
                cJSON_AddItemToObject(fn, k->string, cJSON_Duplicate(k, 1));
    }
    return 0;
}

/* tool_choice: none | auto | required | {type: "function", name}. */
static int translate_tool_choice(const cJSON *v, cJSON *req, oai_error *e)
{
    const char *k = "tool_choice";
    if (cJSON_IsString(v)) {
        cJSON_AddStringToObject(req, k, v->valuestring);   /* oai.c names a bad one */
        return 0;
    }
    const char *t = type_of(v);
    const cJSON *name = item(v, "name");
    if (!cJSON_IsObject(v) || !t || strcmp(t, "function"))
        return oai_fail(e, 400, k, "tool_choice: expected none, auto, required or {\"type\": \"function\", \"name\"}");
    static const char *const keys[] = {"type", "name", NULL};
    if (aj_known_keys(v, keys, k, e))
        return -1;
    if (!cJSON_IsString(name))
        return oai_fail(e, 400, k, "tool_choice.name: required, a string");
    cJSON *c = cJSON_AddObjectToObject(req, k);
    cJSON_AddStringToObject(c, "type", "function");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(c, "function"), "name", name->valuestring);
    return 0;
}

/* text: {format: {type: text | json_object | json_schema (name, schema,
 * description, strict)}, verbosity} -> response_format. */
static int translate_text(const cJSON *v, cJSON *req, oai_error *e)
{
    const char *k = "text";
    if (!cJSON_IsObject(v))
        return oai_fail(e, 400, k, "text: expected an object {format}");
    static const char *const keys[] = {"format", "verbosity", NULL};
    if (aj_known_keys(v, keys, k, e))
        return -1;
    const cJSON *verb = item(v, "verbosity");
    if (verb && !cJSON_IsNull(verb) && !(cJSON_IsString(verb) && !strcmp(verb->valuestring, "medium")))
        return oai_fail(e, 400, "text.verbosity", "text.verbosity: only medium (the model's own) is supported");
    const cJSON *f = item(v, "format");
    if (!f || cJSON_IsNull(f))
        return 0;
    const char *t = type_of(f);
    k = "text.format";
    if (!cJSON_IsObject(f) || !t)
        return oai_fail(e, 400, k, "text.format: expected an object with a type");
    if (!strcmp(t, "text") || !strcmp(t, "json_object")) {
        static const char *const tk[] = {"type", NULL};
        if (aj_known_keys(f, tk, k, e))
            return -1;
        if (!strcmp(t, "json_object"))
            cJSON_AddStringToObject(cJSON_AddObjectToObject(req, "response_format"), "type", "json_object");
        return 0;
    }
    if (strcmp(t, "json_schema"))
        return oai_fail(e, 400, k, "text.format.type: '%.40s' is not text, json_object or json_schema", t);
    static const char *const sk[] = {"type", "name", "schema", "description", "strict", NULL};
    if (aj_known_keys(f, sk, k, e))
        return -1;
    cJSON *rf = cJSON_AddObjectToObject(req, "response_format"), *js = cJSON_CreateObject();
    cJSON_AddStringToObject(rf, "type", "json_schema");
    cJSON_AddItemToObject(rf, "json_schema", js);
    for (const cJSON *x = f->child; x; x = x->next)
        if (strcmp(x->string, "type"))
            cJSON_AddItemToObject(js, x->string, cJSON_Duplicate(x, 1));
    return 0;
}

static int check_reasoning(const cJSON *v, oai_error *e)
{
    const char *k = "reasoning";
    if (cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsObject(v))
        return oai_fail(e, 400, k, "reasoning: expected an object {effort, summary}");
    static const char *const keys[] = {"effort", "summary", "generate_summary", NULL};
    if (aj_known_keys(v, keys, k, e))
        return -1;
    static const char *const efforts[] = {"minimal", "low", "medium", "high", NULL};
    static const char *const summaries[] = {"auto", "concise", "detailed", NULL};
    const char *const *allowed[] = {efforts, summaries, summaries};
    for (int j = 0; j < 3; j++) {
        const cJSON *x = item(v, keys[j]);
        if (!x || cJSON_IsNull(x))
            continue;
        int a = 0;
        while (cJSON_IsString(x) && allowed[j][a] && strcmp(allowed[j][a], x->valuestring))
            a++;
        if (!cJSON_IsString(x) || !allowed[j][a])
            return oai_fail(e, 400, "reasoning", "reasoning.%s: expected %s", keys[j],
                        j ? "auto, concise or detailed" : "minimal, low, medium or high");
    }
    return 0;
}

/* The fields passed on under the chat request's name. */
static const struct {
    const char *resp, *chat;
} plain_fields[] = {
    {"model", "model"},       {"max_output_tokens", "max_tokens"}, {"temperature", "temperature"},
    {"top_p", "top_p"},       {"stream", "stream"},                {"user", "user"},
    {"seed", "seed"},         {"parallel_tool_calls", "parallel_tool_calls"},
};

/* The Responses name of a chat request's field in an oai.c message or
 * param ("max_tokens" -> "max_output_tokens", "messages[3].content" ->
 * "input": the turns are not the items one for one). */
static void resp_name(const char *in, char *out, size_t cap)
{
    static const struct {
        const char *from, *to;
    } renames[] = {{"max_tokens", "max_output_tokens"}, {"response_format.json_schema.", "text.format."},
                   {"response_format", "text.format"},  {".function.parameters", ".parameters"},
                   {".function.", "."},                 {"messages", "input"}};
    size_t o = 0, n = sizeof renames / sizeof renames[0];
    for (const char *p = in; *p && o + 1 < cap;) {
        size_t k = 0;
        while (k < n && strncmp(p, renames[k].from, strlen(renames[k].from)))
            k++;
        if (k == n) {
            out[o++] = *p++;
            continue;
        }
        o += (size_t)snprintf(out + o, cap - o, "%s", renames[k].to);
        if (o >= cap)
            o = cap - 1;
        p += strlen(renames[k].from);
        if (!strcmp(renames[k].from, "messages")) {   /* "[3].content": no item's index */
            while (*p == '[' || *p == '.') {
                const char *q = *p == '[' ? strchr(p, ']') : p + 1 + strcspn(p + 1, ".[: ");
                if (!q)
                    break;
                p = *q == ']' ? q + 1 : q;
            }
        }
    }
    out[o < cap ? o : cap - 1] = '\0';
}

static bool is_neutral(const cJSON *f)
{
    const char *k = f->string;
    if (cJSON_IsNull(f))
        return true;
    if (!strcmp(k, "truncation"))
        return cJSON_IsString(f) && !strcmp(f->valuestring, "disabled");
    if (!strcmp(k, "background"))
        return cJSON_IsFalse(f);
    if (!strcmp(k, "include"))
        return cJSON_IsArray(f) && !f->child;
    if (!strcmp(k, "service_tier"))
        return cJSON_IsString(f) && (!strcmp(f->valuestring, "auto") || !strcmp(f->valuestring, "default"));
    if (!strcmp(k, "prompt_cache_key") || !strcmp(k, "safety_identifier"))
        return cJSON_IsString(f);   /* hints: tokpipe's prefix cache needs none */
    return false;
}

/* What the response object echoes of the request (OpenAI's defaults for
 * what it left out). */
static cJSON *echo_of(const cJSON *root)
{
    cJSON *o = cJSON_CreateObject();
    static const char *const keys[] = {"instructions", "max_output_tokens", "parallel_tool_calls",
                                       "previous_response_id", "reasoning", "store", "temperature", "text",
                                       "tool_choice", "tools", "top_p", "truncation", "user", "metadata"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const cJSON *v = item(root, keys[i]);
        if (v && !cJSON_IsNull(v)) {
            cJSON_AddItemToObject(o, keys[i], cJSON_Duplicate(v, 1));
            continue;
        }
        if (!strcmp(keys[i], "parallel_tool_calls") || !strcmp(keys[i], "store"))
            cJSON_AddTrueToObject(o, keys[i]);
        else if (!strcmp(keys[i], "reasoning")) {
            cJSON *r = cJSON_AddObjectToObject(o, keys[i]);
            cJSON_AddNullToObject(r, "effort");
            cJSON_AddNullToObject(r, "summary");
        } else if (!strcmp(keys[i], "text"))
            cJSON_AddStringToObject(cJSON_AddObjectToObject(cJSON_AddObjectToObject(o, keys[i]), "format"), "type",
                                    "text");
        else if (!strcmp(keys[i], "tool_choice"))
            cJSON_AddStringToObject(o, keys[i], "auto");
        else if (!strcmp(keys[i], "tools"))
            cJSON_AddArrayToObject(o, keys[i]);
        else if (!strcmp(keys[i], "truncation"))
            cJSON_AddStringToObject(o, keys[i], "disabled");
        else if (!strcmp(keys[i], "metadata"))
            cJSON_AddObjectToObject(o, keys[i]);
        else
            cJSON_AddNullToObject(o, keys[i]);
    }
    return o;
}

/* root -> req (the chat request) and state ({conv, echo}: the turns a
 * stored response keeps, what the answer echoes). */
static int translate(gw *g, const cJSON *root, cJSON *req, cJSON *state, oai_error *e)
{
    if (!cJSON_IsObject(root))
        return oai_fail(e, 400, NULL, "the request body must be a JSON object");
    const cJSON *input = NULL, *instructions = NULL, *prev = NULL, *store = NULL;
    for (const cJSON *f = root->child; f; f = f->next) {
        const char *k = f->string;
        for (const cJSON *p = root->child; p != f; p = p->next)
            if (!strcmp(p->string, k))
                return oai_fail(e, 400, k, "%s: given twice", k);
        size_t i = 0, n = sizeof plain_fields / sizeof plain_fields[0];
        while (i < n && strcmp(plain_fields[i].resp, k))
            i++;
        if (i < n) {
            if (cJSON_IsNumber(f) && !isfinite(f->valuedouble))
                return oai_fail(e, 400, k, "%s: the number given is not finite", k);
            if (!cJSON_IsNull(f))
                cJSON_AddItemToObject(req, plain_fields[i].chat, cJSON_Duplicate(f, 1));
        } else if (!strcmp(k, "input")) {
            input = f;
        } else if (!strcmp(k, "instructions")) {
            if (!cJSON_IsString(f) && !cJSON_IsNull(f))
                return oai_fail(e, 400, k, "instructions: expected a string");
            instructions = f;
        } else if (!strcmp(k, "previous_response_id")) {
            if (!cJSON_IsString(f) && !cJSON_IsNull(f))
                return oai_fail(e, 400, k, "previous_response_id: expected a string");
            prev = cJSON_IsString(f) ? f : NULL;
        } else if (!strcmp(k, "store")) {
            if (!cJSON_IsBool(f) && !cJSON_IsNull(f))
                return oai_fail(e, 400, k, "store: expected true or false");
            store = f;
        } else if (!strcmp(k, "tools")) {
            if (translate_tools(f, req, e))
                return -1;
        } else if (!strcmp(k, "tool_choice")) {
            if (translate_tool_choice(f, req, e))
                return -1;
        } else if (!strcmp(k, "text")) {
            if (!cJSON_IsNull(f) && translate_text(f, req, e))
                return -1;
        } else if (!strcmp(k, "reasoning")) {
            if (check_reasoning(f, e))
                return -1;
        } else if (!strcmp(k, "metadata")) {
            if (!cJSON_IsObject(f) && !cJSON_IsNull(f))
                return oai_fail(e, 400, k, "metadata: expected an object of strings");
            for (const cJSON *m = cJSON_IsObject(f) ? f->child : NULL; m; m = m->next)
                if (!cJSON_IsString(m))
                    return oai_fail(e, 400, k, "metadata.%.40s: expected a string", m->string);
        } else if (!is_neutral(f)) {
            return oai_fail(e, 400, k, "%s: %s", k, item(root, k) && (!strcmp(k, "truncation") ||
                        !strcmp(k, "background") || !strcmp(k, "include") || !strcmp(k, "service_tier"))
                        ? "only its neutral value is supported" : "unknown field");
        }
    }
    if (!input && !prev)
        return oai_fail(e, 400, "input", "input: required");
    cJSON *conv = cJSON_AddArrayToObject(state, "conv");
    cJSON_AddItemToObject(state, "echo", echo_of(root));
    cJSON_AddBoolToObject(state, "store", !cJSON_IsFalse(store));
    if (prev) {
        char *text = NULL;
        cJSON *turns = NULL;
        if (g->responses && gw_rstore_get(g->responses, prev->valuestring, NULL, &text))
            turns = text ? cJSON_Parse(text) : NULL;
        free(text);
        if (!cJSON_IsArray(turns)) {
            cJSON_Delete(turns);
            if (!text && g->responses && gw_rstore_get(g->responses, prev->valuestring, NULL, NULL))
                return oom(e);
            return oai_fail(e, 400, "previous_response_id",
                        "previous_response_id: no stored response '%.64s' (never stored, deleted, or past "
                        "http.responses_max_count / responses_max_bytes)", prev->valuestring);
        }
        for (cJSON *t = turns->child; t; t = turns->child)
            cJSON_AddItemToArray(conv, cJSON_DetachItemViaPointer(turns, t));
        cJSON_Delete(turns);
    }
    if (input && translate_input(input, conv, e))
        return -1;
    if (!conv->child)
        return oai_fail(e, 400, "input", "input: no turns (an empty list and no previous_response_id)");
    cJSON *msgs = cJSON_AddArrayToObject(req, "messages");
    if (cJSON_IsString(instructions))
        cJSON_AddStringToObject(aj_new_turn(msgs, "system"), "content", instructions->valuestring);
    for (const cJSON *t = conv->child; t; t = t->next)
        cJSON_AddItemToArray(msgs, cJSON_Duplicate(t, 1));
    return 0;
}

static int decode_responses(gw *g, const char *body, size_t len, oai_request *out, oai_error *e)
{
    memset(out, 0, sizeof *out);
    memset(e, 0, sizeof *e);
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root)
        return oai_fail(e, 400, NULL, "the request body is not valid JSON");
    cJSON *req = cJSON_CreateObject(), *state = cJSON_CreateObject();
    int rc = req && state ? translate(g, root, req, state, e) : oom(e);
    char *text = rc ? NULL : cJSON_PrintUnformatted(req);
    char *st = rc ? NULL : cJSON_PrintUnformatted(state);
    cJSON_Delete(root);
    cJSON_Delete(req);
    cJSON_Delete(state);
    if (!rc && (!text || !st))
        rc = oom(e);
    if (!rc && oai_decode(OAI_CHAT, text, strlen(text), out, e)) {
        char buf[sizeof e->message];
        resp_name(e->param, buf, sizeof e->param);
        memcpy(e->param, buf, sizeof e->param);
        resp_name(e->message, buf, sizeof buf);
        snprintf(e->message, sizeof e->message, "%s", buf);
        rc = -1;
    }
    free(text);
    if (!rc)
        out->api_state = st;
    else
        free(st);
    return rc;
}

/* ---- responses ----------------------------------------------------------- */

/* An output item's id: kind ("msg", "fc", "rs") and its index in the output. */
static cJSON *item_id(const gw_call *c, const char *kind, size_t index)
{
    char id[96];
    snprintf(id, sizeof id, "%s_%s_%zu", kind, c->id + strlen(ID_PREFIX), index);
    return cJSON_CreateString(id);
}

static cJSON *state_of(const gw_call *c)
{
    cJSON *s = c->oreq.api_state ? cJSON_Parse(c->oreq.api_state) : NULL;
    return s ? s : cJSON_CreateObject();
}

static bool incomplete(const gw_choice *ch)
{
    return ch->reason == TP_REASON_LENGTH;
}

static cJSON *text_part(const char *s, size_t len)
{
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "output_text");
    cJSON_AddItemToObject(p, "text", aj_text_of(s, len));
    cJSON_AddArrayToObject(p, "annotations");
    cJSON_AddArrayToObject(p, "logprobs");
    return p;
}

static cJSON *message_item_out(const gw_call *c, size_t index, const gw_choice *ch, bool done)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddItemToObject(m, "id", item_id(c, "msg", index));
    cJSON_AddStringToObject(m, "type", "message");
    cJSON_AddStringToObject(m, "status", !done ? "in_progress" : incomplete(ch) ? "incomplete" : "completed");
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON *content = cJSON_AddArrayToObject(m, "content");
    if (done)
        cJSON_AddItemToArray(content, text_part(ch->text.data, ch->text.len));
    return m;
}

static cJSON *reasoning_item_out(const gw_call *c, size_t index, const gw_choice *ch, bool done)
{
    cJSON *r = cJSON_CreateObject();
    cJSON_AddItemToObject(r, "id", item_id(c, "rs", index));
    cJSON_AddStringToObject(r, "type", "reasoning");
    cJSON_AddArrayToObject(r, "summary");
    cJSON *content = cJSON_AddArrayToObject(r, "content");
    if (done) {
        cJSON *p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "type", "reasoning_text");
        cJSON_AddItemToObject(p, "text", aj_text_of(ch->reasoning.data, ch->reasoning.len));
        cJSON_AddItemToArray(content, p);
    }
    return r;
}

/* call: chat's {id, type, function: {name, arguments}} (args NULL: those of call) */
static cJSON *call_item_out(const gw_call *c, size_t index, const char *id, const char *name, const char *args,
                            bool done)
{
    cJSON *f = cJSON_CreateObject();
    cJSON_AddItemToObject(f, "id", item_id(c, "fc", index));
    cJSON_AddStringToObject(f, "type", "function_call");
    cJSON_AddStringToObject(f, "status", done ? "completed" : "in_progress");
    cJSON_AddStringToObject(f, "call_id", id);
    cJSON_AddStringToObject(f, "name", name);
    cJSON_AddStringToObject(f, "arguments", args);
    return f;
}

static const char *call_str(const cJSON *call, const char *k)
{
    const cJSON *v = item(call, k) ? item(call, k) : item(item(call, "function"), k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* The streamed index of call id (the bridge's scalls), else fallback. */
static size_t call_index(const gw_choice *ch, const char *id, size_t fallback)
{
    for (size_t k = 0; k < ch->n_scalls; k++)
        if (!strcmp(ch->scalls[k].id, id))
            return ch->scalls[k].block;
    return fallback;
}

static bool has_message(const gw_choice *ch)
{
    return ch->text.len || !ch->tool_calls || !ch->tool_calls->child;
}

/* The output items: reasoning, the message, the calls, in that order
 * (streamed: at the indexes the stream gave them). */
static cJSON *output_of(const gw_call *c, const gw_choice *ch)
{
    size_t n = 0, at[3] = {0};
    bool streamed = c->oreq.stream;
    cJSON *items[3] = {NULL};
    if (ch->reasoning.len) {
        at[0] = streamed ? ch->reasoning_item - 1 : n;
        items[0] = reasoning_item_out(c, at[0], ch, true);
        n++;
    }
    if (has_message(ch)) {
        at[1] = streamed && ch->text_item ? ch->text_item - 1 : n;
        items[1] = message_item_out(c, at[1], ch, true);
        n++;
    }
    cJSON *out = cJSON_CreateArray();
    cJSON *calls = cJSON_CreateArray();
    for (const cJSON *t = ch->tool_calls ? ch->tool_calls->child : NULL; t; t = t->next, n++) {
        const char *id = call_str(t, "id");
        size_t k = streamed ? call_index(ch, id, n) : n;
        cJSON_AddItemToArray(calls, call_item_out(c, k, id, call_str(t, "name"), call_str(t, "arguments"), true));
    }
    /* in index order */
    for (size_t want = 0; want < n; want++) {
        for (int j = 0; j < 2; j++)
            if (items[j + 0] && at[j] == want)
                cJSON_AddItemToArray(out, items[j]), items[j] = NULL;
        for (cJSON *f = calls->child; f; f = f->next) {
            const char *id = cJSON_GetObjectItemCaseSensitive(f, "id")->valuestring;
            if ((size_t)strtoull(strrchr(id, '_') + 1, NULL, 10) == want) {
                cJSON_AddItemToArray(out, cJSON_DetachItemViaPointer(calls, f));
                break;
            }
        }
    }
    cJSON_Delete(items[0]);
    cJSON_Delete(items[1]);
    cJSON_Delete(calls);
    return out;
}

static cJSON *usage_of(const gw_choice *ch)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "input_tokens", (double)ch->prompt_tokens);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "input_tokens_details"), "cached_tokens",
                            (double)(ch->cached_tokens <= ch->prompt_tokens ? ch->cached_tokens : 0));
    cJSON_AddNumberToObject(u, "output_tokens", (double)ch->completion_tokens);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "output_tokens_details"), "reasoning_tokens", 0);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(ch->prompt_tokens + ch->completion_tokens));
    return u;
}

/* The response object; ch NULL: in progress (no output yet). */
static cJSON *response_of(const gw_call *c, const char *model, const gw_choice *ch)
{
    cJSON *o = cJSON_CreateObject(), *state = state_of(c);
    cJSON_AddStringToObject(o, "id", c->id);
    cJSON_AddStringToObject(o, "object", "response");
    cJSON_AddNumberToObject(o, "created_at", (double)c->created);
    cJSON_AddStringToObject(o, "status", !ch ? "in_progress" : incomplete(ch) ? "incomplete" : "completed");
    cJSON_AddNullToObject(o, "error");
    if (ch && incomplete(ch))
        cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "incomplete_details"), "reason", "max_output_tokens");
    else
        cJSON_AddNullToObject(o, "incomplete_details");
    cJSON_AddStringToObject(o, "model", model);
    cJSON_AddItemToObject(o, "output", ch ? output_of(c, ch) : cJSON_CreateArray());
    cJSON *echo = cJSON_DetachItemFromObjectCaseSensitive(state, "echo");
    for (cJSON *f = echo ? echo->child : NULL; f; f = echo->child)
        cJSON_AddItemToObject(o, f->string, cJSON_DetachItemViaPointer(echo, f));
    cJSON_Delete(echo);
    if (ch)
        cJSON_AddItemToObject(o, "usage", usage_of(ch));
    else
        cJSON_AddNullToObject(o, "usage");
    cJSON_Delete(state);
    return o;
}

/* Keep a finished response (store: true): the object, and the
 * conversation with its output as the assistant turn chat would get. */
static void keep(const gw_call *c, const cJSON *o, const gw_choice *ch)
{
    cJSON *state = state_of(c);
    cJSON *conv = cJSON_GetObjectItemCaseSensitive(state, "conv");
    if (!cJSON_IsTrue(item(state, "store")) || !cJSON_IsArray(conv) || !c->g->responses) {
        cJSON_Delete(state);
        return;
    }
    cJSON *turn = aj_new_turn(conv, "assistant");
    if (ch->text.len)
        cJSON_AddItemToObject(turn, "content", aj_text_of(ch->text.data, ch->text.len));
    else
        cJSON_AddNullToObject(turn, "content");
    if (ch->tool_calls && ch->tool_calls->child)
        cJSON_AddItemToObject(turn, "tool_calls", cJSON_Duplicate(ch->tool_calls, 1));
    else if (!ch->text.len)
        cJSON_ReplaceItemInObject(turn, "content", cJSON_CreateString(""));
    char *r = cJSON_PrintUnformatted(o), *t = cJSON_PrintUnformatted(conv);
    if (!r || !t || gw_rstore_put(c->g->responses, c->id, r, t))
        fprintf(stderr, "tokpipe-http: %s: not stored (out of memory)\n", c->id);
    free(r);
    free(t);
    cJSON_Delete(state);
}

static char *resp_body(const gw_call *c, const char *model)
{
    cJSON *o = response_of(c, model, &c->ch[0]);
    if (o)
        keep(c, o, &c->ch[0]);
    return aj_print_free(o);
}

/* A stored conversation's turns as input items: messages (input_text
 * parts; output_text for assistant turns), an assistant turn's calls as
 * function_call items, tool turns as function_call_output. */
static cJSON *items_of(const cJSON *turns, const char *id)
{
    cJSON *data = cJSON_CreateArray();
    size_t k = 0;
    for (const cJSON *t = turns ? turns->child : NULL; t; t = t->next) {
        const cJSON *role = item(t, "role"), *content = item(t, "content");
        const char *r = cJSON_IsString(role) ? role->valuestring : "user";
        char iid[160];
        if (!strcmp(r, "tool")) {
            cJSON *o = cJSON_CreateObject();
            snprintf(iid, sizeof iid, "fco_%s_%zu", id + strlen(ID_PREFIX), k++);
            cJSON_AddStringToObject(o, "id", iid);
            cJSON_AddStringToObject(o, "type", "function_call_output");
            cJSON_AddStringToObject(o, "call_id", call_str(t, "tool_call_id"));
            cJSON_AddStringToObject(o, "output", cJSON_IsString(content) ? content->valuestring : "");
            cJSON_AddItemToArray(data, o);
            continue;
        }
        bool text = cJSON_IsString(content) ? content->valuestring[0] != '\0' : cJSON_IsArray(content);
        if (text || !item(t, "tool_calls")) {
            cJSON *o = cJSON_CreateObject(), *parts;
            snprintf(iid, sizeof iid, "msg_%s_in%zu", id + strlen(ID_PREFIX), k++);
            cJSON_AddStringToObject(o, "id", iid);
            cJSON_AddStringToObject(o, "type", "message");
            cJSON_AddStringToObject(o, "role", r);
            cJSON_AddStringToObject(o, "status", "completed");
            parts = cJSON_AddArrayToObject(o, "content");
            const char *kind = strcmp(r, "assistant") ? "input_text" : "output_text";
            for (const cJSON *p = cJSON_IsArray(content) ? content->child : NULL; p; p = p->next) {
                cJSON *q = cJSON_CreateObject();
                cJSON_AddStringToObject(q, "type", kind);
                cJSON_AddStringToObject(q, "text", call_str(p, "text"));
                cJSON_AddItemToArray(parts, q);
            }
            if (cJSON_IsString(content)) {
                cJSON *q = cJSON_CreateObject();
                cJSON_AddStringToObject(q, "type", kind);
                cJSON_AddStringToObject(q, "text", content->valuestring);
                cJSON_AddItemToArray(parts, q);
            }
            cJSON_AddItemToArray(data, o);
        }
        for (const cJSON *c = item(t, "tool_calls") ? item(t, "tool_calls")->child : NULL; c; c = c->next) {
            cJSON *o = cJSON_CreateObject();
            snprintf(iid, sizeof iid, "fc_%s_in%zu", id + strlen(ID_PREFIX), k++);
            cJSON_AddStringToObject(o, "id", iid);
            cJSON_AddStringToObject(o, "type", "function_call");
            cJSON_AddStringToObject(o, "status", "completed");
            cJSON_AddStringToObject(o, "call_id", call_str(c, "id"));
            cJSON_AddStringToObject(o, "name", call_str(c, "name"));
            cJSON_AddStringToObject(o, "arguments", call_str(c, "arguments"));
            cJSON_AddItemToArray(data, o);
        }
    }
    return data;
}

char *gw_responses_stored(gw *g, const char *method, const char *path, int *status)
{
    char msg[256], id[128];
    const char *slash = strchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : strlen(path);
    bool items = slash && !strcmp(slash, "/input_items");
    bool del = !strcmp(method, "DELETE");
    snprintf(id, sizeof id, "%.*s", (int)(n < sizeof id - 1 ? n : sizeof id - 1), path);
    if ((slash && !items) || n >= sizeof id) {
        *status = 404;
        snprintf(msg, sizeof msg, "no such endpoint: %s /v1/responses/%.100s", method, path);
        return gw_error_json_code(404, msg, NULL, NULL);
    }
    if ((items || !del) && strcmp(method, "GET")) {
        *status = 405;
        return gw_error_json_code(405, items ? "use GET" : "use GET or DELETE", NULL, NULL);
    }
    char *conv = NULL;
    bool found = del ? gw_rstore_delete(g->responses, id) : gw_rstore_get(g->responses, id, NULL, &conv);
    if (!found) {
        *status = 404;
        snprintf(msg, sizeof msg, "No response found with id '%.64s' (never stored, deleted, or past "
                 "http.responses_max_count / responses_max_bytes)", id);
        return gw_error_json_code(404, msg, NULL, NULL);
    }
    *status = 200;
    cJSON *o = cJSON_CreateObject();
    if (del) {
        cJSON_AddStringToObject(o, "id", id);
        cJSON_AddStringToObject(o, "object", "response");
        cJSON_AddTrueToObject(o, "deleted");
    } else if (items) {
        /* the input: the conversation less its last turn (the response's output) */
        cJSON *turns = conv ? cJSON_Parse(conv) : NULL;
        cJSON_Delete(cJSON_DetachItemFromArray(turns, cJSON_GetArraySize(turns) - 1));
        cJSON *data = items_of(turns, id);
        cJSON_Delete(turns);
        cJSON_AddStringToObject(o, "object", "list");
        cJSON_AddItemToObject(o, "data", data);
        const cJSON *first = cJSON_GetArrayItem(data, 0), *last = cJSON_GetArrayItem(data, cJSON_GetArraySize(data) - 1);
        if (first)
            cJSON_AddStringToObject(o, "first_id", call_str(first, "id")), cJSON_AddStringToObject(o, "last_id", call_str(last, "id"));
        else
            cJSON_AddNullToObject(o, "first_id"), cJSON_AddNullToObject(o, "last_id");
        cJSON_AddFalseToObject(o, "has_more");
    } else {
        free(conv);
        char *r = NULL;
        cJSON_Delete(o);
        if (!gw_rstore_get(g->responses, id, &r, NULL))   /* deleted in between */
            return gw_responses_stored(g, method, path, status);
        return r;
    }
    free(conv);
    return aj_print_free(o);
}

/* ---- streaming: the typed events --------------------------------------- */

static void append(char **acc, bool *oom_, const char *name, cJSON *o, gw_choice *ch)
{
    if (o && ch)
        cJSON_AddNumberToObject(o, "sequence_number", (double)ch->n_events++);
    char *j = aj_print_free(o);
    size_t a = *acc ? strlen(*acc) : 0, n = j ? strlen(j) + strlen(name) + 20 : 0;
    char *p = j ? realloc(*acc, a + n + 1) : NULL;
    if (!p) {
        *oom_ = true;
        free(j);
        return;
    }
    snprintf(p + a, n + 1, "event: %s\ndata: %s\n\n", name, j);
    *acc = p;
    free(j);
}

static char *done(char *acc, bool oom_)
{
    if (oom_) {
        free(acc);
        return NULL;
    }
    return acc ? acc : strdup("");
}

static cJSON *ev(const char *type)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    return o;
}

/* an item event's place: item_id, output_index (and content_index) */
static cJSON *item_ev(const char *type, const gw_call *c, const char *kind, size_t index, bool content)
{
    cJSON *o = ev(type);
    cJSON_AddItemToObject(o, "item_id", item_id(c, kind, index));
    cJSON_AddNumberToObject(o, "output_index", (double)index);
    if (content)
        cJSON_AddNumberToObject(o, "content_index", 0);
    return o;
}

static void item_added(char **acc, bool *oom_, gw_choice *ch, size_t index, cJSON *it)
{
    cJSON *o = ev("response.output_item.added");
    cJSON_AddNumberToObject(o, "output_index", (double)index);
    cJSON_AddItemToObject(o, "item", it);
    append(acc, oom_, "response.output_item.added", o, ch);
}

static void item_done(char **acc, bool *oom_, gw_choice *ch, size_t index, cJSON *it)
{
    cJSON *o = ev("response.output_item.done");
    cJSON_AddNumberToObject(o, "output_index", (double)index);
    cJSON_AddItemToObject(o, "item", it);
    append(acc, oom_, "response.output_item.done", o, ch);
}

static char *resp_open(gw_call *c, const char *model)
{
    char *acc = NULL;
    bool oom_ = false;
    gw_choice *ch = &c->ch[0];
    const char *names[] = {"response.created", "response.in_progress"};
    for (int j = 0; j < 2; j++) {
        cJSON *o = ev(names[j]);
        cJSON_AddItemToObject(o, "response", response_of(c, model, NULL));
        append(&acc, &oom_, names[j], o, ch);
    }
    return done(acc, oom_);
}

static void open_message(gw_call *c, gw_choice *ch, char **acc, bool *oom_)
{
    size_t at = ch->n_blk++;
    ch->text_item = at + 1;
    item_added(acc, oom_, ch, at, message_item_out(c, at, ch, false));
    cJSON *o = item_ev("response.content_part.added", c, "msg", at, true);
    cJSON_AddItemToObject(o, "part", text_part("", 0));
    append(acc, oom_, "response.content_part.added", o, ch);
}

static char *resp_text(gw_call *c, const char *model, size_t i, const char *text, size_t len, size_t lp_from,
                       size_t lp_to)
{
    (void)model, (void)lp_from, (void)lp_to;
    gw_choice *ch = &c->ch[i];
    char *acc = NULL;
    bool oom_ = false;
    if (!len)
        return strdup("");
    if (tp_buf_add(&ch->text, text, len))   /* streaming too: the done events and the stored response say it */
        return NULL;
    if (!ch->text_item)
        open_message(c, ch, &acc, &oom_);
    cJSON *o = item_ev("response.output_text.delta", c, "msg", ch->text_item - 1, true);
    cJSON_AddItemToObject(o, "delta", aj_text_of(text, len));
    cJSON_AddArrayToObject(o, "logprobs");
    append(&acc, &oom_, "response.output_text.delta", o, ch);
    return done(acc, oom_);
}

static char *resp_reasoning(gw_call *c, const char *model, size_t i, const char *s, size_t len)
{
    (void)model;
    gw_choice *ch = &c->ch[i];
    char *acc = NULL;
    bool oom_ = false;
    if (!len)
        return strdup("");
    if (!ch->reasoning_item) {
        size_t at = ch->n_blk++;
        ch->reasoning_item = at + 1;
        item_added(&acc, &oom_, ch, at, reasoning_item_out(c, at, ch, false));
    }
    cJSON *o = item_ev("response.reasoning_text.delta", c, "rs", ch->reasoning_item - 1, true);
    cJSON_AddItemToObject(o, "delta", aj_text_of(s, len));
    append(&acc, &oom_, "response.reasoning_text.delta", o, ch);
    return done(acc, oom_);
}

static char *resp_call(gw_call *c, const char *model, size_t i, size_t k, const char *id, size_t id_len,
                       const char *name, size_t name_len, const char *args, size_t args_len)
{
    (void)model;
    gw_choice *ch = &c->ch[i];
    char *acc = NULL;
    bool oom_ = false;
    if (id) {
        size_t at = ch->n_blk++;
        ch->scalls[k].block = at;
        char *cid = strndup(id, id_len), *nm = strndup(name ? name : "", name_len);
        if (cid && nm)
            item_added(&acc, &oom_, ch, at, call_item_out(c, at, cid, nm, "", false));
        else
            oom_ = true;
        free(cid);
        free(nm);
    }
    if (args_len) {
        cJSON *o = item_ev("response.function_call_arguments.delta", c, "fc", ch->scalls[k].block, false);
        cJSON_AddItemToObject(o, "delta", aj_text_of(args, args_len));
        append(&acc, &oom_, "response.function_call_arguments.delta", o, ch);
    }
    return done(acc, oom_);
}

/* every item's done events: reasoning, the message, the calls */
static char *resp_finish(gw_call *c, const char *model, size_t i)
{
    (void)model;
    gw_choice *ch = &c->ch[i];
    char *acc = NULL;
    bool oom_ = false;
    if (ch->reasoning_item) {
        size_t at = ch->reasoning_item - 1;
        cJSON *o = item_ev("response.reasoning_text.done", c, "rs", at, true);
        cJSON_AddItemToObject(o, "text", aj_text_of(ch->reasoning.data, ch->reasoning.len));
        append(&acc, &oom_, "response.reasoning_text.done", o, ch);
        item_done(&acc, &oom_, ch, at, reasoning_item_out(c, at, ch, true));
    }
    if (!ch->text_item && has_message(ch))
        open_message(c, ch, &acc, &oom_);
    if (ch->text_item) {
        size_t at = ch->text_item - 1;
        cJSON *o = item_ev("response.output_text.done", c, "msg", at, true);
        cJSON_AddItemToObject(o, "text", aj_text_of(ch->text.data, ch->text.len));
        cJSON_AddArrayToObject(o, "logprobs");
        append(&acc, &oom_, "response.output_text.done", o, ch);
        o = item_ev("response.content_part.done", c, "msg", at, true);
        cJSON_AddItemToObject(o, "part", text_part(ch->text.data, ch->text.len));
        append(&acc, &oom_, "response.content_part.done", o, ch);
        item_done(&acc, &oom_, ch, at, message_item_out(c, at, ch, true));
    }
    for (const cJSON *t = ch->tool_calls ? ch->tool_calls->child : NULL; t; t = t->next) {
        const char *id = call_str(t, "id"), *args = call_str(t, "arguments");
        size_t at = call_index(ch, id, ch->n_blk);
        cJSON *o = item_ev("response.function_call_arguments.done", c, "fc", at, false);
        cJSON_AddStringToObject(o, "arguments", args);
        append(&acc, &oom_, "response.function_call_arguments.done", o, ch);
        item_done(&acc, &oom_, ch, at, call_item_out(c, at, id, call_str(t, "name"), args, true));
    }
    return done(acc, oom_);
}

/* response.completed (response.incomplete after max_output_tokens): the
 * whole response, as the non-streamed body */
static char *resp_close(gw_call *c, const char *model)
{
    gw_choice *ch = &c->ch[0];
    char *acc = NULL;
    bool oom_ = false;
    cJSON *r = response_of(c, model, ch);
    if (r)
        keep(c, r, ch);
    const char *name = incomplete(ch) ? "response.incomplete" : "response.completed";
    cJSON *o = ev(name);
    cJSON_AddItemToObject(o, "response", r);
    append(&acc, &oom_, name, o, ch);
    return done(acc, oom_);
}

/* OpenAI's error body with the field named as this API's request names
 * it (the bridge says "messages" of the job's conversation: here input) */
static char *resp_error(int status, const char *message, const char *param, const char *code)
{
    char p[64], m[TP_PROTO_MAX_ERROR + 160];
    resp_name(param ? param : "", p, sizeof p);
    resp_name(message, m, sizeof m);
    return gw_error_json_code(status, m, p, code);
}

static char *resp_stream_error(int status, const char *message_in, const char *param_in)
{
    char param[64], message[TP_PROTO_MAX_ERROR + 160];
    resp_name(param_in ? param_in : "", param, sizeof param);
    resp_name(message_in, message, sizeof message);
    cJSON *o = ev("error");
    char code[16];
    snprintf(code, sizeof code, "%d", status);
    cJSON_AddStringToObject(o, "code", code);
    cJSON_AddStringToObject(o, "message", message);
    if (param[0])
        cJSON_AddStringToObject(o, "param", param);
    else
        cJSON_AddNullToObject(o, "param");
    char *acc = NULL;
    bool oom_ = false;
    append(&acc, &oom_, "error", o, NULL);
    return done(acc, oom_);
}

static void resp_param(const char *field, char *out, size_t cap)
{
    char f[128];
    oai_param_of_field(field, f, sizeof f);
    resp_name(f, out, cap);
}

const gw_api gw_api_responses = {
    .path = "/v1/responses",
    .endpoint = GW_EP_RESPONSES,
    .decode_in = decode_responses,
    .id_prefix = ID_PREFIX,
    .error = resp_error,
    .stream_error = resp_stream_error,
    .param = resp_param,
    .body = resp_body,
    .open = resp_open,
    .text = resp_text,
    .reasoning = resp_reasoning,
    .call = resp_call,
    .finish = resp_finish,
    .close = resp_close,
};
