/* Encoding: walk the same schema tables as the decoder, then decode the
 * result once so an invalid message is caught here, naming the field,
 * instead of at the peer. Payloads are not copied (frames point at the
 * caller's arrays), so the re-decode only costs the header. */
#include "schema.h"

#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>

_Static_assert(offsetof(tp_lp_cols, top_n) == 0, "FF_LP_TOP_N reads the columns at the field");

static bool present(const table *t, const field *f, const char *base)
{
    const char *p = base + f->off;
    if (f->flags & (FF_REQUIRED | FF_ALWAYS))
        return true;
    /* only STATUS_REPLY's fields carry it, and its base is the whole message */
    if (f->flags & FF_FINISHED)
        return ((const tp_msg *)(const void *)base)->status_reply.state == TP_STATE_FINISHED;
    /* PROTOCOL.md: top_n is there whenever the job asked for logprobs,
     * top_logprobs 0 included, so a reader never has to guess the width */
    if (f->flags & FF_LP_TOP_N)
        return ((const tp_lp_cols *)p)->top_n || ((const tp_lp_cols *)p)->logprobs.data;
    if (f->setbit && t->set_off >= 0)
        return (*(const uint32_t *)(base + t->set_off) & f->setbit) != 0;
    switch (f->type) {
    case FT_U32: return *(const uint32_t *)p != 0;
    case FT_U64: return *(const uint64_t *)p != 0;
    case FT_I32: return *(const int32_t *)p != 0;
    case FT_I64: return *(const int64_t *)p != 0;
    case FT_F64: return *(const double *)p != 0;
    case FT_BOOL: return *(const bool *)p;
    case FT_STR: return ((const tp_str *)p)->ptr != NULL;
    case FT_STRS:
    case FT_I32S:
    case FT_TRIGGERS:
    case FT_MSGS:
    case FT_CALLS:
    case FT_U64S: return *(const size_t *)(p + sizeof(void *)) != 0;
    case FT_MATCHED: return ((const tp_matched *)p)->kind != TP_MATCHED_NONE;
    case FT_REASON:
    case FT_STATE: return *(const int *)p != 0;
    case FT_STAGES: return *(const unsigned *)p != 0;
    case FT_MAP: return f->sub->set_off < 0 || *(const uint32_t *)(p + f->sub->set_off) != 0;
    case FT_BIAS: return ((const tp_logit_bias *)p)->n != 0;
    }
    return false;
}

static int pack_str(msgpack_packer *pk, const char *s, size_t n)
{
    return msgpack_pack_str_with_body(pk, s ? s : "", s ? n : 0);
}

static int pack_matched(msgpack_packer *pk, const tp_matched *m)
{
    if (m->kind == TP_MATCHED_STR)
        return pack_str(pk, m->str.ptr, m->str.len);
    if (m->kind == TP_MATCHED_ID)
        return msgpack_pack_int32(pk, m->id);
    return msgpack_pack_nil(pk);
}

static int pack_map(msgpack_packer *pk, const table *t, const char *base);

static int pack_call(msgpack_packer *pk, const tp_tool_call *t)
{
    return msgpack_pack_map(pk, 3) || pack_str(pk, "id", 2) || pack_str(pk, t->id.ptr, t->id.len) ||
           pack_str(pk, "name", 4) || pack_str(pk, t->name.ptr, t->name.len) || pack_str(pk, "arguments", 9) ||
           pack_str(pk, t->arguments.ptr, t->arguments.len);
}

/* Optional keys only when present, so an old decoder reads a plain turn. */
static int pack_msg(msgpack_packer *pk, const tp_chat_msg *m)
{
    size_t n = 2 + (m->name.ptr != NULL) + (m->tool_call_id.ptr != NULL) + (m->n_tool_calls != 0);
    int rc = msgpack_pack_map(pk, n) || pack_str(pk, "role", 4) || pack_str(pk, m->role.ptr, m->role.len) ||
             pack_str(pk, "content", 7) || pack_str(pk, m->content.ptr, m->content.len);
    if (!rc && m->name.ptr)
        rc = pack_str(pk, "name", 4) || pack_str(pk, m->name.ptr, m->name.len);
    if (!rc && m->tool_call_id.ptr)
        rc = pack_str(pk, "tool_call_id", 12) || pack_str(pk, m->tool_call_id.ptr, m->tool_call_id.len);
    if (!rc && m->n_tool_calls) {
        rc = pack_str(pk, "tool_calls", 10) || msgpack_pack_array(pk, m->n_tool_calls);
        for (size_t i = 0; i < m->n_tool_calls && !rc; i++)
            rc = pack_call(pk, &m->tool_calls[i]);
    }
    return rc;
}

static int pack_array_field(msgpack_packer *pk, const field *f, const char *p)
{
    size_t n = *(const size_t *)(p + sizeof(void *));
    int rc = msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n && !rc; i++) {
        if (f->type == FT_STRS) {
            const tp_str *s = *(tp_str *const *)p;
            rc = pack_str(pk, s[i].ptr, s[i].len);
        } else if (f->type == FT_I32S) {
            rc = msgpack_pack_int32(pk, (*(int32_t *const *)p)[i]);
        } else if (f->type == FT_MSGS) {
            rc = pack_msg(pk, &(*(tp_chat_msg *const *)p)[i]);
        } else if (f->type == FT_CALLS) {
            rc = pack_call(pk, &(*(tp_tool_call *const *)p)[i]);
        } else if (f->type == FT_U64S) {
            rc = msgpack_pack_uint64(pk, (*(uint64_t *const *)p)[i]);
        } else {
            const tp_trigger *tr = &(*(tp_trigger *const *)p)[i];
            rc = msgpack_pack_array(pk, 3) || pack_matched(pk, &tr->key) || msgpack_pack_uint64(pk, tr->count) ||
                 (tr->truncated ? msgpack_pack_true(pk) : msgpack_pack_false(pk));
        }
    }
    return rc;
}

static int pack_stages(msgpack_packer *pk, unsigned bits)
{
    int n = 0;
    for (unsigned b = 1; b <= TP_STAGE_DRAFT; b <<= 1)
        n += (bits & b) != 0;
    int rc = msgpack_pack_array(pk, (size_t)n);
    for (unsigned b = 1; b <= TP_STAGE_DRAFT && !rc; b <<= 1)
        if (bits & b)
            rc = pack_str(pk, tp_stage_name(b), strlen(tp_stage_name(b)));
    return rc;
}

static int pack_value(msgpack_packer *pk, const field *f, const char *base)
{
    const char *p = base + f->off;
    switch (f->type) {
    case FT_U32: return msgpack_pack_uint32(pk, *(const uint32_t *)p);
    case FT_U64: return msgpack_pack_uint64(pk, *(const uint64_t *)p);
    case FT_I32: return msgpack_pack_int32(pk, *(const int32_t *)p);
    case FT_I64: return msgpack_pack_int64(pk, *(const int64_t *)p);
    case FT_F64: return msgpack_pack_double(pk, *(const double *)p);
    case FT_BOOL: return *(const bool *)p ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
    case FT_STR: return pack_str(pk, ((const tp_str *)p)->ptr, ((const tp_str *)p)->len);
    case FT_STRS:
    case FT_I32S:
    case FT_TRIGGERS:
    case FT_MSGS:
    case FT_CALLS:
    case FT_U64S: return pack_array_field(pk, f, p);
    case FT_MATCHED: return pack_matched(pk, (const tp_matched *)p);
    case FT_REASON: {
        const char *s = tp_reason_name(*(const int *)p);
        return pack_str(pk, s, strlen(s));
    }
    case FT_STATE: {
        const char *s = tp_state_name(*(const int *)p);
        return pack_str(pk, s, strlen(s));
    }
    case FT_STAGES: return pack_stages(pk, *(const unsigned *)p);
    case FT_MAP: return pack_map(pk, f->sub, p);
    case FT_BIAS: {
        const tp_logit_bias *b = (const tp_logit_bias *)p;
        int rc = msgpack_pack_map(pk, b->n);
        for (size_t i = 0; i < b->n && !rc; i++) {
            char k[16];
            int kl = snprintf(k, sizeof k, "%d", (int)b->ids[i]);
            rc = pack_str(pk, k, (size_t)kl) || msgpack_pack_double(pk, b->values[i]);
        }
        return rc;
    }
    }
    return -1;
}

static int pack_map(msgpack_packer *pk, const table *t, const char *base)
{
    size_t n = 0;
    for (const field *f = t->fields; f->key; f++)
        n += present(t, f, base);
    int rc = msgpack_pack_map(pk, n);
    for (const field *f = t->fields; f->key && !rc; f++)
        if (present(t, f, base))
            rc = pack_str(pk, f->key, strlen(f->key)) || pack_value(pk, f, base);
    return rc;
}

void tp_wire_free(tp_wire *w)
{
    if (!w)
        return;
    free(w->buf);
    memset(w, 0, sizeof *w);
}

static tp_str event_topic(const tp_msg *m)
{
    if (m->cmd == TP_CMD_HEARTBEAT)
        return tp_str_of(TP_EVT_HEARTBEAT_TOPIC);
    return m->cmd == TP_CMD_TOKEN ? m->token.job_id : m->finish.job_id;
}

int tp_proto_encode(const tp_msg *m, tp_wire *w, tp_err *err)
{
    static const char empty[1];
    memset(w, 0, sizeof *w);
    const mdesc *d = schema_find(m->family, m->cmd);
    if (!d)
        return tp_err_set(err, TP_EINVAL, "encode: unknown command 0x%02x in family %d", m->cmd, (int)m->family);
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    /* The command byte lives in the same heap buffer as the header, so the
     * frames stay valid if the tp_wire struct itself is copied. */
    char cmd = (char)m->cmd;
    if (msgpack_sbuffer_write(&sb, &cmd, 1) || pack_map(&pk, d->hdr, (const char *)m)) {
        msgpack_sbuffer_destroy(&sb);
        return tp_err_set(err, TP_ENOMEM, "encode %s: out of memory", d->name);
    }
    w->buf = sb.data;
    if (m->family == TP_FAM_EVT) {
        tp_str t = event_topic(m);
        w->f[w->n++] = (tp_frame){t.ptr ? t.ptr : empty, t.ptr ? t.len : 0};
    }
    w->f[w->n++] = (tp_frame){schema_magic(m->family), TP_MAGIC_LEN};
    w->f[w->n++] = (tp_frame){sb.data, 1};
    w->f[w->n++] = (tp_frame){sb.data + 1, sb.size - 1};
    for (const pframe *p = d->frames; p->name; p++) {
        const tp_raw *r = (const tp_raw *)((const char *)m + p->off);
        if (p->optional && !r->data)
            break;
        if (w->n == sizeof w->f / sizeof *w->f) {
            tp_wire_free(w);
            return tp_err_set(err, TP_EINVAL, "encode %s: too many frames", d->name);
        }
        w->f[w->n++] = (tp_frame){r->data ? r->data : empty, r->n * p->esize};
    }
    tp_msg check;
    tp_err e;
    int rc = tp_proto_decode(m->family, w->f, w->n, &check, &e);
    tp_msg_clear(&check);
    if (rc) {
        tp_wire_free(w);
        return tp_err_set(err, rc, "encode %s: %s", d->name, e.msg);
    }
    return 0;
}
