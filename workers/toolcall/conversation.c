/* A SUBMIT conversation as the variables JSON a chat template renders: the
 * OpenAI shape a Hugging Face user passes, shaped by what the template
 * wants (tp_tc_syntax). Built as text so every byte and every integer of
 * the tools reaches the renderer as sent. */
#include <cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tc_internal.h"

static void key(tp_buf *b, const char *k)
{
    tp_buf_add(b, ",\"", 2);
    tp_buf_puts(b, k);
    tp_buf_add(b, "\":", 2);
}

static void str(tp_buf *b, tp_str s)
{
    tp_buf_json_str(b, s.ptr ? s.ptr : "", s.len);
}

/* A call's arguments: OpenAI's string, or (object_args) the object it holds. */
static int arguments(tp_buf *b, tp_str a, bool object, size_t i, size_t k, tp_err *err)
{
    if (!object) {
        str(b, a);
        return 0;
    }
    cJSON *j = cJSON_ParseWithLength(a.ptr ? a.ptr : "", a.len);
    bool ok = cJSON_IsObject(j);
    cJSON_Delete(j);
    if (!ok)
        return tp_err_set(err, TP_EINVAL, "messages[%zu].tool_calls[%zu].arguments: not a JSON object", i, k);
    tp_buf_add(b, a.ptr, a.len);
    return 0;
}

static int turn(tp_buf *b, const tp_tc_syntax *syn, const tp_chat_msg *m, size_t i, tp_err *err)
{
    tp_buf_puts(b, i ? ",{\"role\":" : "{\"role\":");
    str(b, m->role);
    key(b, "content");
    if (!m->content.len && m->n_tool_calls && syn->null_content)
        tp_buf_puts(b, "null");   /* OpenAI's own: a turn of only calls */
    else
        str(b, m->content);
    if (m->name.ptr) {
        key(b, "name");
        str(b, m->name);
    }
    if (m->tool_call_id.ptr) {
        key(b, "tool_call_id");
        str(b, m->tool_call_id);
    }
    if (!m->n_tool_calls)
        return 0;
    key(b, "tool_calls");
    tp_buf_add(b, "[", 1);
    for (size_t k = 0; k < m->n_tool_calls; k++) {
        const tp_tool_call *c = &m->tool_calls[k];
        tp_buf_puts(b, k ? ",{\"id\":" : "{\"id\":");
        str(b, c->id);
        tp_buf_puts(b, ",\"type\":\"function\",\"function\":{\"name\":");
        str(b, c->name);
        key(b, "arguments");
        int rc = arguments(b, c->arguments, syn->object_args, i, k, err);
        if (rc)
            return rc;
        tp_buf_puts(b, "}}");
    }
    tp_buf_add(b, "]", 1);
    return 0;
}

int tp_toolcall_chat_vars(const tp_tc_syntax *syn, const tp_chat_msg *msgs, size_t n, tp_str tools, char **out,
                          size_t *len, tp_err *err)
{
    tp_buf b = {0};
    tp_buf_puts(&b, "{\"messages\":[");
    for (size_t i = 0; i < n; i++) {
        int rc = turn(&b, syn, &msgs[i], i, err);
        if (!rc)
            tp_buf_add(&b, "}", 1);
        if (rc) {
            tp_buf_free(&b);
            return rc;
        }
    }
    tp_buf_add(&b, "]", 1);
    if (tools.ptr) {
        key(&b, "tools");
        tp_buf_add(&b, tools.ptr, tools.len);
        const tc_family_def *fam = tc_family(syn->family);
        if (fam && fam->tools_as_functions) {
            char when[64];
            time_t now = time(NULL);
            struct tm tm;
            strftime(when, sizeof when, "%b %d %Y %H:%M:%S GMT", gmtime_r(&now, &tm));
            key(&b, "functions");
            str(&b, tools);
            key(&b, "datetime");
            str(&b, tp_str_of(when));
        }
    }
    tp_buf_add(&b, "}", 1);
    if (b.err) {
        tp_buf_free(&b);
        return tp_err_set(err, TP_ENOMEM, "tokenize: out of memory");
    }
    *out = b.data;
    *len = b.len;
    return 0;
}
