/* Wire names (finish reasons, job states, stages, commands) and the small
 * text checks of the protocol (job ids, UTF-8, the special tokens' frames). */
#include "schema.h"

static const char *const reason_names[TP_REASON_COUNT] = {
    "none", "stop_string", "stop_token", "eos", "length", "cancelled", "error",
};

const char *tp_reason_name(int reason)
{
    return reason >= 0 && reason < TP_REASON_COUNT ? reason_names[reason] : "unknown";
}

static int name_index(const char *const *names, int n, const char *s, size_t len)
{
    for (int i = 0; i < n; i++)
        if (strlen(names[i]) == len && !memcmp(names[i], s, len))
            return i;
    return -1;
}

int tp_reason_parse(const char *s, size_t len)
{
    return name_index(reason_names, TP_REASON_COUNT, s, len);
}

bool tp_reason_ends_in_calls(int reason, size_t n_calls, bool cut)
{
    return n_calls > 0 && !cut &&
           (reason == TP_REASON_STOP_STRING || reason == TP_REASON_STOP_TOKEN || reason == TP_REASON_EOS);
}

static const char *const pool_names[] = {"mean", "cls", "last", "model"};

int tp_pool_parse(tp_str s)
{
    int i = s.ptr ? name_index(pool_names, 4, s.ptr, s.len) : -1;
    return i < 0 ? -1 : i + 1;
}

static const char *const state_names[] = {"unknown", "queued", "running", "finished"};

const char *tp_state_name(int state)
{
    return state >= 0 && state < 4 ? state_names[state] : "unknown";
}

int tp_state_parse(const char *s, size_t len)
{
    return name_index(state_names, 4, s, len);
}

static const char *const stage_names[] = {"tokenize", "forward", "sample", "stop", "draft"};
#define N_STAGES (sizeof stage_names / sizeof *stage_names)

const char *tp_stage_name(unsigned stage_bit)
{
    for (size_t i = 0; i < N_STAGES; i++)
        if (stage_bit == 1u << i)
            return stage_names[i];
    return NULL;
}

int tp_stage_parse(const char *s, size_t len)
{
    int i = name_index(stage_names, (int)N_STAGES, s, len);
    return i < 0 ? -1 : 1 << i;
}

const char *tp_cmd_name(tp_family family, uint8_t cmd)
{
    const mdesc *d = schema_find(family, cmd);
    return d ? d->name : "?";
}

bool tp_job_id_valid(const char *s, size_t len)
{
    if (len < 1 || len > TP_PROTO_MAX_JOB_ID)
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == ':' || c == '-';
        if (!ok)
            return false;
    }
    return true;
}

/* RFC 3629 well-formed sequences (Unicode Table 3-7): no overlongs, no
 * surrogates, nothing above U+10FFFF. */
bool tp_proto_utf8_valid(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        unsigned need, lo = 0x80, hi = 0xbf;
        if (c >= 0xc2 && c <= 0xdf) need = 1;
        else if (c == 0xe0) need = 2, lo = 0xa0;
        else if (c == 0xed) need = 2, hi = 0x9f;
        else if (c >= 0xe1 && c <= 0xef) need = 2;
        else if (c == 0xf0) need = 3, lo = 0x90;
        else if (c >= 0xf1 && c <= 0xf3) need = 3;
        else if (c == 0xf4) need = 3, hi = 0x8f;
        else return false;
        if (len - i - 1 < need)
            return false;
        if (s[i + 1] < lo || s[i + 1] > hi)
            return false;
        for (unsigned k = 2; k <= need; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xbf)
                return false;
        i += need + 1;
    }
    return true;
}

int tp_proto_special_split(tp_raw ids, tp_raw text, tp_str *pieces, tp_err *err)
{
    const unsigned char *t = text.data;
    size_t at = 0;
    int32_t prev = -1;
    for (size_t i = 0; i < ids.n; i++) {
        int32_t id = tp_raw_i32(ids, i);
        if (id <= prev || id >= (int32_t)TP_PROTO_MAX_VOCAB)
            return tp_err_set(err, TP_EFORMAT, "special_ids[%zu]: %d after %d (ascending ids below %u)", i, id, prev,
                              TP_PROTO_MAX_VOCAB);
        prev = id;
        if (at >= text.n)
            return tp_err_set(err, TP_EFORMAT, "special_text: %zu pieces for %zu special_ids", i, ids.n);
        size_t len = t[at++];
        if (len > TP_PROTO_MAX_NAME || len > text.n - at)
            return tp_err_set(err, TP_EFORMAT, "special_text: piece %zu of %zu bytes (at most %u, %zu left)", i, len,
                              TP_PROTO_MAX_NAME, text.n - at);
        if (!tp_proto_utf8_valid((const char *)t + at, len))
            return tp_err_set(err, TP_EFORMAT, "special_text: piece %zu is not UTF-8", i);
        if (pieces)
            pieces[i] = (tp_str){(const char *)t + at, len};
        at += len;
    }
    if (at != text.n)
        return tp_err_set(err, TP_EFORMAT, "special_text: %zu bytes after the %zu pieces of special_ids", text.n - at,
                          ids.n);
    return 0;
}
