/* Which tool-call syntax a chat template's model writes, told from the
 * template as llama.cpp tells its chat formats: by the markers the
 * template itself writes when it renders a call (a model is trained on
 * the format its template shows it). Then what only rendering shows. */
#include <cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "tc_internal.h"
#include "tokpipe/chat_template.h"

static bool has(const char *s, size_t n, const char *lit)
{
    return tc_find(s, n, lit) != NULL;
}

void tp_toolcall_detect(const char *src, size_t len, tp_tc_syntax *out)
{
    memset(out, 0, sizeof *out);
    out->family = tc_family_detect(src, len);
    out->thinks = has(src, len, "<think>") || has(src, len, "</think>") || has(src, len, "<|START_THINKING|>");
    /* harmony: the analysis channel */
    const tc_family_def *d = tc_family(out->family);
    if (d && d->channels && d->think_open && has(src, len, d->think_open))
        out->thinks = true;
}

/* The probe turns: a user asks, the assistant calls probe_fn with
 * arguments {"probe_arg": "probe_value"}, the tool answers. */
static cJSON *probe_conversation(bool object_args, bool null_content)
{
    const char *args = "{\"probe_arg\": \"probe_value\"}";
    cJSON *m = cJSON_Parse("[{\"role\":\"user\",\"content\":\"probe\"},"
                           "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"call00001\","
                           "\"type\":\"function\",\"function\":{\"name\":\"probe_fn\"}}]},"
                           "{\"role\":\"tool\",\"tool_call_id\":\"call00001\",\"name\":\"probe_fn\","
                           "\"content\":\"probe result\"}]");
    if (!m)
        return NULL;
    cJSON *fn = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 1), "tool_calls"), 0),
                                    "function");
    if (null_content)
        cJSON_ReplaceItemInObject(cJSON_GetArrayItem(m, 1), "content", cJSON_CreateNull());
    cJSON *a = object_args ? cJSON_Parse(args) : cJSON_CreateString(args);
    if (!fn || !a || !cJSON_AddItemToObject(fn, "arguments", a)) {
        cJSON_Delete(a);
        cJSON_Delete(m);
        return NULL;
    }
    return m;
}

static char *render(const tp_chat_template *t, const cJSON *msgs, bool gen, const char *bos, const char *eos)
{
    cJSON *extra = cJSON_Parse("{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"probe_fn\","
                               "\"description\":\"probe\",\"parameters\":{\"type\":\"object\",\"properties\":"
                               "{\"probe_arg\":{\"type\":\"string\",\"description\":\"probe\"}},"
                               "\"required\":[\"probe_arg\"]}}}]}");
    tp_chat_vars v = {.messages = msgs, .extra = extra, .bos_token = bos, .eos_token = eos,
                      .add_generation_prompt = gen};
    char *out = NULL;
    size_t len = 0;
    tp_err e;
    if (tp_chat_template_render(t, &v, &out, &len, &e))
        out = NULL;
    cJSON_Delete(extra);
    return out;
}

void tp_toolcall_syntax(const tp_chat_template *t, const char *bos, const char *eos, tp_tc_syntax *out)
{
    size_t len = 0;
    const char *src = tp_chat_template_source(t, &len);
    tp_toolcall_detect(src, len, out);
    cJSON *user = cJSON_Parse("[{\"role\":\"user\",\"content\":\"probe\"}]");
    char *gen = user ? render(t, user, true, bos, eos) : NULL;
    if (gen && out->thinks) {
        size_t n = strlen(gen);
        while (n && (gen[n - 1] == '\n' || gen[n - 1] == ' '))
            n--;
        out->think_open = (n >= 7 && !memcmp(gen + n - 7, "<think>", 7)) ||
                          (n >= 18 && !memcmp(gen + n - 18, "<|START_THINKING|>", 18));
    }
    free(gen);
    cJSON_Delete(user);
    if (out->family == TP_TC_NONE)
        return;
    /* A template that serialises the arguments (tojson) shows OpenAI's
     * string quoted, as "{\"probe_arg\"...": it wants the object. One that
     * fails on the string but renders the object wants it too. */
    cJSON *as_str = probe_conversation(false, false), *as_obj = probe_conversation(true, false);
    char *rs = as_str ? render(t, as_str, false, bos, eos) : NULL;
    char *ro = as_obj ? render(t, as_obj, false, bos, eos) : NULL;
    if (ro && (!rs || strstr(rs, "\"{\\\"probe_arg\\\"")))
        out->object_args = true;
    cJSON *as_null = probe_conversation(out->object_args, true);
    char *rn = as_null ? render(t, as_null, false, bos, eos) : NULL;
    out->null_content = rn != NULL;
    free(rs);
    free(ro);
    free(rn);
    cJSON_Delete(as_str);
    cJSON_Delete(as_obj);
    cJSON_Delete(as_null);
}

static bool name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
              c == '.'))
            return false;
    }
    return true;
}

int tp_tools_check(const char *json, size_t len, tp_err *err)
{
    cJSON *a = cJSON_ParseWithLength(json, len);
    if (!a)
        return tp_err_set(err, TP_EINVAL, "tools: not valid JSON");
    int rc = 0, i = 0;
    if (!cJSON_IsArray(a)) {
        rc = tp_err_set(err, TP_EINVAL, "tools: expected an array of {\"type\": \"function\", \"function\": {...}}");
        goto out;
    }
    for (const cJSON *t = a->child; t; t = t->next, i++) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!cJSON_IsObject(t) || !cJSON_IsString(type) || strcmp(type->valuestring, "function")) {
            rc = tp_err_set(err, TP_EINVAL, "tools[%d].type: expected \"function\"", i);
            goto out;
        }
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsObject(fn) || !cJSON_IsString(name) || !name_ok(name->valuestring)) {
            rc = tp_err_set(err, TP_EINVAL, "tools[%d].function.name: expected 1-64 characters of A-Z a-z 0-9 _ . -",
                            i);
            goto out;
        }
        const cJSON *desc = cJSON_GetObjectItemCaseSensitive(fn, "description");
        if (desc && !cJSON_IsString(desc)) {
            rc = tp_err_set(err, TP_EINVAL, "tools[%d].function.description: expected a string", i);
            goto out;
        }
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        if (params && !cJSON_IsObject(params)) {
            rc = tp_err_set(err, TP_EINVAL, "tools[%d].function.parameters: expected a JSON Schema object", i);
            goto out;
        }
        for (const cJSON *u = a->child; u != t; u = u->next) {
            const cJSON *un = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(u, "function"), "name");
            if (!strcmp(un->valuestring, name->valuestring)) {
                rc = tp_err_set(err, TP_EINVAL, "tools[%d].function.name: '%s' is offered twice", i, name->valuestring);
                goto out;
            }
        }
    }
out:
    cJSON_Delete(a);
    return rc;
}
