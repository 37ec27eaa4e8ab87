/* Deep copies of a conversation (SUBMIT messages + tools), for a holder
 * that outlives the decoded message (the broker's job table). */
#include <stdlib.h>
#include <string.h>

#include "tokpipe/error.h"
#include "tokpipe/protocol.h"

static size_t str_bytes(tp_str s)
{
    return s.ptr ? s.len + 1 : 0;
}

static tp_str put_str(char **w, tp_str s)
{
    if (!s.ptr)
        return s;
    char *p = *w;
    if (s.len)
        memcpy(p, s.ptr, s.len);
    p[s.len] = 0;
    *w += s.len + 1;
    return (tp_str){p, s.len};
}

size_t tp_chat_msgs_bytes(const tp_chat_msg *msgs, size_t n)
{
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        const tp_chat_msg *m = &msgs[i];
        bytes += m->role.len + m->content.len + m->name.len + m->tool_call_id.len;
        for (size_t k = 0; k < m->n_tool_calls; k++)
            bytes += m->tool_calls[k].id.len + m->tool_calls[k].name.len + m->tool_calls[k].arguments.len;
    }
    return bytes;
}

int tp_chat_msgs_dup(const tp_chat_msg *msgs, size_t n, tp_str tools, tp_chat_msg **out, tp_str *tools_out)
{
    size_t n_calls = 0, bytes = str_bytes(tools);
    for (size_t i = 0; i < n; i++) {
        const tp_chat_msg *m = &msgs[i];
        bytes += str_bytes(m->role) + str_bytes(m->content) + str_bytes(m->name) + str_bytes(m->tool_call_id);
        n_calls += m->n_tool_calls;
        for (size_t k = 0; k < m->n_tool_calls; k++)
            bytes += str_bytes(m->tool_calls[k].id) + str_bytes(m->tool_calls[k].name) +
                     str_bytes(m->tool_calls[k].arguments);
    }
    /* one block: the turns, then every turn's calls, then the text */
    size_t head = n * sizeof(tp_chat_msg) + n_calls * sizeof(tp_tool_call);
    char *blk = malloc(head + bytes + 1);
    if (!blk)
        return TP_ENOMEM;
    tp_chat_msg *v = (tp_chat_msg *)(void *)blk;
    tp_tool_call *calls = (tp_tool_call *)(void *)(blk + n * sizeof(tp_chat_msg));
    char *w = blk + head;
    for (size_t i = 0; i < n; i++) {
        const tp_chat_msg *m = &msgs[i];
        v[i].role = put_str(&w, m->role);
        v[i].content = put_str(&w, m->content);
        v[i].name = put_str(&w, m->name);
        v[i].tool_call_id = put_str(&w, m->tool_call_id);
        v[i].tool_calls = calls;
        v[i].n_tool_calls = m->n_tool_calls;
        for (size_t k = 0; k < m->n_tool_calls; k++, calls++) {
            calls->id = put_str(&w, m->tool_calls[k].id);
            calls->name = put_str(&w, m->tool_calls[k].name);
            calls->arguments = put_str(&w, m->tool_calls[k].arguments);
        }
    }
    *tools_out = put_str(&w, tools);
    *out = v;
    return 0;
}
