#include "tokpipe/stopcheck.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/detok.h"
#include "tokpipe/utf8.h"

#define PIECE_DEFAULT_ID_BASE 1000

/* One parsed case. Strings point into the cJSON tree; hex pieces are
 * decoded into owned buffers. */
struct sc_case {
    cJSON *root;
    size_t n;                 /* candidates */
    const uint8_t **bytes;    /* pieces mode */
    size_t *len;
    uint8_t **owned;          /* decoded hex, freed with the case */
    int32_t *id;
    bool tokens_mode;
    int32_t prompt_last;
    bool has_prompt_last, has_eos, trace;
    const char **stop;
    size_t *stop_len;
    int32_t *stop_ids, *eos_ids;
    tp_stop_config cfg;
};

/* ---- JSON field readers ---- */

static int get_int(const cJSON *it, const char *field, int32_t *out, tp_err *err)
{
    double v = it->valuedouble;
    if (!cJSON_IsNumber(it) || v != floor(v) || v < INT32_MIN || v > INT32_MAX)
        return tp_err_set(err, TP_EINVAL, "%s: must be an integer", field);
    *out = (int32_t)v;
    return 0;
}

static int get_bool(const cJSON *it, const char *field, bool *out, tp_err *err)
{
    if (!cJSON_IsBool(it)) return tp_err_set(err, TP_EINVAL, "%s: must be true or false", field);
    *out = cJSON_IsTrue(it);
    return 0;
}

static void *alloc_n(size_t n, size_t size)
{
    return calloc(n ? n : 1, size);
}

/* An int or a list of ints (list_ok) into a new array. */
static int get_ids(const cJSON *it, const char *field, bool scalar_ok, int32_t **out, size_t *n,
                   tp_err *err)
{
    char name[64];
    if (scalar_ok && cJSON_IsNumber(it)) {
        *n = 1;
        *out = alloc_n(1, sizeof **out);
        if (!*out) return tp_err_set(err, TP_ENOMEM, "out of memory");
        return get_int(it, field, *out, err);
    }
    if (!cJSON_IsArray(it))
        return tp_err_set(err, TP_EINVAL, "%s: must be a list of integers", field);
    *n = (size_t)cJSON_GetArraySize(it);
    *out = alloc_n(*n, sizeof **out);
    if (!*out) return tp_err_set(err, TP_ENOMEM, "out of memory");
    size_t i = 0;
    for (const cJSON *e = it->child; e; e = e->next, i++) {
        snprintf(name, sizeof name, "%s[%zu]", field, i);
        int rc = get_int(e, name, &(*out)[i], err);
        if (rc) return rc;
    }
    return 0;
}

static int get_stops(struct sc_case *c, const cJSON *it, tp_err *err)
{
    if (!cJSON_IsArray(it)) return tp_err_set(err, TP_EINVAL, "stop: must be a list of strings");
    size_t n = (size_t)cJSON_GetArraySize(it), i = 0;
    c->stop = alloc_n(n, sizeof *c->stop);
    c->stop_len = alloc_n(n, sizeof *c->stop_len);
    if (!c->stop || !c->stop_len) return tp_err_set(err, TP_ENOMEM, "out of memory");
    for (const cJSON *e = it->child; e; e = e->next, i++) {
        if (!cJSON_IsString(e)) return tp_err_set(err, TP_EINVAL, "stop[%zu]: must be a string", i);
        c->stop[i] = e->valuestring;
        c->stop_len[i] = strlen(e->valuestring);
    }
    c->cfg.stop = c->stop;
    c->cfg.stop_len = c->stop_len;
    c->cfg.n_stop = n;
    return 0;
}

/* ---- pieces ---- */

static int hex_value(char ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

static int decode_hex(struct sc_case *c, size_t i, const char *hex, tp_err *err)
{
    size_t n = strlen(hex);
    if (n % 2) return tp_err_set(err, TP_EINVAL, "pieces[%zu].hex: odd number of digits", i);
    uint8_t *b = c->owned[i] = alloc_n(n / 2, 1);
    if (!b) return tp_err_set(err, TP_ENOMEM, "out of memory");
    for (size_t k = 0; k < n / 2; k++) {
        int hi = hex_value(hex[2 * k]), lo = hex_value(hex[2 * k + 1]);
        if (hi < 0 || lo < 0)
            return tp_err_set(err, TP_EINVAL, "pieces[%zu].hex: '%.2s' is not a hex byte", i,
                              hex + 2 * k);
        b[k] = (uint8_t)(hi << 4 | lo);
        /* JSON strings out of cJSON end at NUL, so such text could not be
         * reported faithfully. */
        if (b[k] == 0)
            return tp_err_set(err, TP_EINVAL, "pieces[%zu].hex: NUL bytes are not supported", i);
    }
    c->bytes[i] = b;
    c->len[i] = n / 2;
    return 0;
}

static int piece_object(struct sc_case *c, size_t i, const cJSON *p, tp_err *err)
{
    const cJSON *text = NULL, *hex = NULL;
    char name[48];
    for (const cJSON *f = p->child; f; f = f->next) {
        snprintf(name, sizeof name, "pieces[%zu].id", i);
        if (!strcmp(f->string, "text") && !text) text = f;
        else if (!strcmp(f->string, "hex") && !hex) hex = f;
        else if (!strcmp(f->string, "id")) {
            int rc = get_int(f, name, &c->id[i], err);
            if (rc) return rc;
        } else {
            return tp_err_set(err, TP_EINVAL, "pieces[%zu]: unknown or repeated field '%s'", i,
                              f->string);
        }
    }
    if (!text == !hex)
        return tp_err_set(err, TP_EINVAL, "pieces[%zu]: needs exactly one of \"text\" or \"hex\"", i);
    const cJSON *v = text ? text : hex;
    if (!cJSON_IsString(v))
        return tp_err_set(err, TP_EINVAL, "pieces[%zu].%s: must be a string", i,
                          text ? "text" : "hex");
    if (hex) return decode_hex(c, i, hex->valuestring, err);
    c->bytes[i] = (const uint8_t *)text->valuestring;
    c->len[i] = strlen(text->valuestring);
    return 0;
}

static int get_pieces(struct sc_case *c, const cJSON *it, tp_err *err)
{
    if (!cJSON_IsArray(it)) return tp_err_set(err, TP_EINVAL, "pieces: must be a list");
    size_t n = c->n = (size_t)cJSON_GetArraySize(it), i = 0;
    c->bytes = alloc_n(n, sizeof *c->bytes);
    c->len = alloc_n(n, sizeof *c->len);
    c->owned = alloc_n(n, sizeof *c->owned);
    c->id = alloc_n(n, sizeof *c->id);
    if (!c->bytes || !c->len || !c->owned || !c->id)
        return tp_err_set(err, TP_ENOMEM, "out of memory");
    for (const cJSON *p = it->child; p; p = p->next, i++) {
        c->id[i] = (int32_t)(PIECE_DEFAULT_ID_BASE + i);
        int rc;
        if (cJSON_IsString(p)) {
            c->bytes[i] = (const uint8_t *)p->valuestring;
            c->len[i] = strlen(p->valuestring);
            rc = 0;
        } else if (cJSON_IsObject(p)) {
            rc = piece_object(c, i, p, err);
        } else {
            rc = tp_err_set(err, TP_EINVAL, "pieces[%zu]: must be a string or an object", i);
        }
        if (rc) return rc;
    }
    return 0;
}

/* ---- the case object ---- */

enum field_bit {
    F_PIECES = 1 << 0, F_TOKENS = 1 << 1, F_STOP = 1 << 2, F_STOP_IDS = 1 << 3, F_EOS = 1 << 4,
    F_IGNORE_EOS = 1 << 5, F_MIN = 1 << 6, F_MAX = 1 << 7, F_INCLUDE = 1 << 8, F_PROMPT = 1 << 9,
    F_TRACE = 1 << 10,
};

static const struct {
    const char *name;
    unsigned bit;
} fields[] = {
    {"pieces", F_PIECES}, {"tokens", F_TOKENS}, {"stop", F_STOP},
    {"stop_token_ids", F_STOP_IDS}, {"eos_token_id", F_EOS}, {"ignore_eos", F_IGNORE_EOS},
    {"min_tokens", F_MIN}, {"max_tokens", F_MAX}, {"include_stop_str_in_output", F_INCLUDE},
    {"prompt_last_id", F_PROMPT}, {"trace", F_TRACE},
};

static int field_of(const char *name, unsigned *bit)
{
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
        if (!strcmp(name, fields[i].name)) {
            *bit = fields[i].bit;
            return 0;
        }
    }
    return TP_ENOTFOUND;
}

static int read_field(struct sc_case *c, unsigned bit, const cJSON *f, tp_err *err)
{
    tp_stop_config *g = &c->cfg;
    switch (bit) {
    case F_PIECES: return get_pieces(c, f, err);
    case F_TOKENS: c->tokens_mode = true; return get_ids(f, "tokens", false, &c->id, &c->n, err);
    case F_STOP: return get_stops(c, f, err);
    case F_STOP_IDS: return get_ids(f, "stop_token_ids", false, &c->stop_ids, &g->n_stop_ids, err);
    case F_EOS: c->has_eos = true; return get_ids(f, "eos_token_id", true, &c->eos_ids, &g->n_eos_ids, err);
    case F_IGNORE_EOS: return get_bool(f, "ignore_eos", &g->ignore_eos, err);
    case F_MIN: return get_int(f, "min_tokens", &g->min_tokens, err);
    case F_MAX: return get_int(f, "max_tokens", &g->max_tokens, err);
    case F_INCLUDE: return get_bool(f, "include_stop_str_in_output", &g->include_stop_str_in_output, err);
    case F_TRACE: return get_bool(f, "trace", &c->trace, err);
    default: c->has_prompt_last = true; return get_int(f, "prompt_last_id", &c->prompt_last, err);
    }
}

static int read_case(struct sc_case *c, const cJSON *root, tp_err *err)
{
    if (!cJSON_IsObject(root)) return tp_err_set(err, TP_EINVAL, "case: must be a JSON object");
    unsigned seen = 0, bit;
    c->cfg.max_tokens = TP_STOP_NO_LIMIT;
    for (const cJSON *f = root->child; f; f = f->next) {
        if (field_of(f->string, &bit))
            return tp_err_set(err, TP_EINVAL, "unknown field '%s'", f->string);
        if (seen & bit) return tp_err_set(err, TP_EINVAL, "%s: given twice", f->string);
        if ((bit & (F_PIECES | F_TOKENS)) && (seen & (F_PIECES | F_TOKENS)))
            return tp_err_set(err, TP_EINVAL, "case: needs exactly one of \"pieces\" or \"tokens\"");
        seen |= bit;
        int rc = read_field(c, bit, f, err);
        if (rc) return rc;
    }
    if (!(seen & (F_PIECES | F_TOKENS)) || (seen & F_PIECES && seen & F_TOKENS))
        return tp_err_set(err, TP_EINVAL, "case: needs exactly one of \"pieces\" or \"tokens\"");
    if ((seen & F_PROMPT) && !(seen & F_TOKENS))
        return tp_err_set(err, TP_EINVAL, "prompt_last_id: only with \"tokens\"");
    c->cfg.stop_ids = c->stop_ids;
    c->cfg.eos_ids = c->eos_ids;
    return 0;
}

static void case_free(struct sc_case *c)
{
    if (c->owned)
        for (size_t i = 0; i < c->n; i++) free(c->owned[i]);
    free(c->owned);
    free(c->bytes);
    free(c->len);
    free(c->id);
    free((void *)c->stop);
    free(c->stop_len);
    free(c->stop_ids);
    free(c->eos_ids);
    cJSON_Delete(c->root);
}

/* ---- running ---- */

static int add_chunk(cJSON *chunks, const tp_stop_step *st, tp_err *err)
{
    if (!st->chunk_len) return 0;
    char *s = malloc(st->chunk_len + 1);
    if (!s) return tp_err_set(err, TP_ENOMEM, "out of memory");
    memcpy(s, st->chunk, st->chunk_len);
    s[st->chunk_len] = '\0';
    cJSON *item = cJSON_CreateString(s);
    free(s);
    if (!item || !cJSON_AddItemToArray(chunks, item)) {
        cJSON_Delete(item);
        return tp_err_set(err, TP_ENOMEM, "out of memory");
    }
    return 0;
}

/* A stop string naming a control token ("</s>") also stops on that token,
 * by the rule the stop stage applies (tp_detok_control_stops): the token
 * renders as nothing, so as text alone the string would never match it. */
static int resolve_control_stops(struct sc_case *c, const tp_tokenizer *tok, tp_err *err)
{
    size_t n = c->cfg.n_stop;
    int32_t *ids = realloc(c->stop_ids, (c->cfg.n_stop_ids + n + 1) * sizeof *ids);
    if (!ids) return tp_err_set(err, TP_ENOMEM, "out of memory");
    c->stop_ids = ids;
    c->cfg.n_stop_ids += tp_detok_control_stops(tok, c->stop, c->stop_len, n, ids + c->cfg.n_stop_ids);
    c->cfg.stop_ids = ids;
    return 0;
}

/* Tokens mode: the tokenizer supplies the vocabulary, the EOS default and
 * each candidate's bytes. */
static int setup_tokens(struct sc_case *c, const tp_tokenizer *tok, tp_detok **d, tp_err *err)
{
    if (!tok) return tp_err_set(err, TP_EINVAL, "tokens: needs --tokenizer (or use \"pieces\")");
    c->cfg.vocab_size = tp_tokenizer_vocab_size(tok);
    if (!c->has_eos) { /* the vocabulary's end-of-generation ids, as a worker uses */
        const int32_t *eog;
        int n_eog = tp_tokenizer_eog_ids(tok, &eog);
        c->eos_ids = alloc_n(n_eog ? (size_t)n_eog : 1, sizeof *c->eos_ids);
        if (!c->eos_ids) return tp_err_set(err, TP_ENOMEM, "out of memory");
        if (n_eog) memcpy(c->eos_ids, eog, (size_t)n_eog * sizeof *eog);
        c->cfg.eos_ids = c->eos_ids;
        c->cfg.n_eos_ids = (size_t)n_eog;
    }
    for (size_t i = 0; i < c->n; i++)
        if (c->id[i] < 0 || c->id[i] >= c->cfg.vocab_size)
            return tp_err_set(err, TP_ERANGE, "tokens[%zu]: id %d outside the vocabulary [0, %d)", i,
                              c->id[i], c->cfg.vocab_size);
    int rc = resolve_control_stops(c, tok, err);
    if (rc) return rc;
    int32_t last = c->has_prompt_last ? c->prompt_last : tp_tokenizer_bos_id(tok);
    rc = tp_detok_new(tok, last, d, err);
    if (rc == TP_ERANGE) tp_err_set(err, rc, "prompt_last_id: id %d outside the vocabulary", last);
    return rc;
}

/* Hex of n bytes as a new cJSON string (NULL when out of memory). */
static cJSON *hex_json(const uint8_t *b, size_t n)
{
    char *h = malloc(2 * n + 1);
    if (!h) return NULL;
    for (size_t i = 0; i < n; i++) snprintf(h + 2 * i, 3, "%02x", b[i]);
    h[2 * n] = '\0';
    cJSON *j = cJSON_CreateString(h);
    free(h);
    return j;
}

/* trace: what the stage saw and did for one candidate — its id and bytes,
 * whether it was accepted, the chunk and the bytes still held back. */
static int add_trace(cJSON *steps, tp_stop *s, int32_t id, const uint8_t *b, size_t n,
                     const tp_stop_step *st, tp_err *err)
{
    cJSON *o = cJSON_CreateObject();
    size_t held_len;
    const uint8_t *held = tp_stop_held(s, &held_len);
    if (!o || !cJSON_AddItemToArray(steps, o)) {
        cJSON_Delete(o);
        return tp_err_set(err, TP_ENOMEM, "out of memory");
    }
    cJSON_AddNumberToObject(o, "id", id);
    cJSON_AddItemToObject(o, "bytes", hex_json(b, n));
    cJSON_AddBoolToObject(o, "accepted", st->accepted);
    char *chunk = strndup(st->chunk, st->chunk_len);
    cJSON_AddStringToObject(o, "chunk", chunk ? chunk : "");
    free(chunk);
    cJSON_AddItemToObject(o, "held", hex_json(held, held_len));
    if (st->finish != TP_FINISH_NONE)
        cJSON_AddStringToObject(o, "finish", tp_finish_reason_name(st->finish));
    return 0;
}

static int feed_one(struct sc_case *c, tp_detok *d, tp_stop *s, size_t i, tp_stop_step *st,
                    cJSON *steps, tp_err *err)
{
    const uint8_t *b = c->tokens_mode ? NULL : c->bytes[i];
    size_t n = c->tokens_mode ? 0 : c->len[i];
    if (d) {
        b = tp_detok_bytes(d, c->id[i], &n, err);
        if (!b) return err->code;
        if (memchr(b, 0, n))
            return tp_err_set(err, TP_EINVAL, "tokens[%zu]: token %d is a NUL byte, which the JSON "
                              "output cannot carry", i, c->id[i]);
    }
    int rc = tp_stop_feed(s, c->id[i], b, n, st);
    if (rc) return tp_err_set(err, rc, "stop: %s", tp_err_name(rc));
    if (steps && (rc = add_trace(steps, s, c->id[i], b, n, st, err))) return rc;
    if (d && st->accepted) return tp_detok_accept(d, c->id[i], err);
    return 0;
}

static cJSON *result_json(tp_stop *s, cJSON *chunks, cJSON *steps, const tp_stop_step *last)
{
    cJSON *o = cJSON_CreateObject();
    size_t len;
    const char *text = tp_stop_text(s, &len);
    cJSON_AddItemToObject(o, "chunks", chunks);
    cJSON_AddStringToObject(o, "text", text);
    cJSON_AddStringToObject(o, "finish_reason", tp_finish_reason_name(tp_stop_finish_reason(s)));
    if (last->matched_str) {
        char *m = strndup(last->matched_str, last->matched_len);
        cJSON_AddStringToObject(o, "matched", m ? m : "");
        free(m);
    } else if (last->matched_id >= 0) {
        cJSON_AddNumberToObject(o, "matched", last->matched_id);
    } else {
        cJSON_AddNullToObject(o, "matched");
    }
    cJSON_AddNumberToObject(o, "completion_tokens", tp_stop_completion_tokens(s));
    if (steps) cJSON_AddItemToObject(o, "steps", steps);
    return o;
}

static int run_case(struct sc_case *c, const tp_tokenizer *tok, tp_stop_stats *stats, cJSON **out,
                    tp_err *err)
{
    tp_detok *d = NULL;
    tp_stop *s = NULL;
    cJSON *chunks = cJSON_CreateArray(), *steps = c->trace ? cJSON_CreateArray() : NULL;
    int rc = chunks && (steps || !c->trace) ? 0 : tp_err_set(err, TP_ENOMEM, "out of memory");
    if (!rc && c->tokens_mode) rc = setup_tokens(c, tok, &d, err);
    if (!rc) rc = tp_stop_new(&c->cfg, &s, err);
    tp_stop_step st = {.matched_id = -1};
    for (size_t i = 0; !rc && i < c->n && tp_stop_finish_reason(s) == TP_FINISH_NONE; i++) {
        rc = feed_one(c, d, s, i, &st, steps, err);
        if (!rc) rc = add_chunk(chunks, &st, err);
    }
    if (!rc && tp_stop_finish_reason(s) == TP_FINISH_NONE) {
        tp_stop_cancel(s, &st);
        rc = add_chunk(chunks, &st, err);
    }
    if (!rc) {
        *out = result_json(s, chunks, steps, &st);
        chunks = steps = NULL;
        if (stats) tp_stop_stats_merge(stats, tp_stop_get_stats(s));
    }
    cJSON_Delete(chunks);
    cJSON_Delete(steps);
    tp_stop_free(s);
    tp_detok_free(d);
    return rc;
}

/* Messages may quote input bytes (a field name); keep the output UTF-8. */
static char *error_line(const char *msg)
{
    char clean[TP_UTF8_REPLACE_MAX(TP_ERR_MSG_MAX) + 1];
    size_t n = tp_utf8_replace((const uint8_t *)msg, strlen(msg), clean);
    clean[n] = '\0';
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "error", clean);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

char *tp_stopcheck_case(const char *json, size_t len, const tp_tokenizer *tok, tp_stop_stats *stats,
                        bool *failed)
{
    struct sc_case c = {0};
    tp_err err;
    tp_err_clear(&err);
    cJSON *result = NULL;
    *failed = true;
    c.root = cJSON_ParseWithLength(json, len);
    int rc = c.root ? read_case(&c, c.root, &err)
                    : tp_err_set(&err, TP_EFORMAT, "bad JSON near byte %zu",
                                 (size_t)(cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - json : 0));
    if (!rc) rc = run_case(&c, tok, stats, &result, &err);
    case_free(&c);
    if (rc) return error_line(err.msg);
    char *s = cJSON_PrintUnformatted(result);
    cJSON_Delete(result);
    *failed = false;
    return s;
}

/* ---- stats ---- */

static void add_u64(cJSON *o, const char *name, uint64_t v)
{
    cJSON_AddNumberToObject(o, name, (double)v);
}

static cJSON *trigger_json(const tp_stop_trigger *t)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    if (t->id >= 0) {
        cJSON_AddNumberToObject(o, "id", t->id);
    } else {
        char key[TP_UTF8_REPLACE_MAX(TP_STOP_STATS_KEY_MAX) + 1];
        size_t n = tp_utf8_replace((const uint8_t *)t->key, t->key_len, key);
        key[n] = '\0';
        cJSON_AddStringToObject(o, "string", key);
        if (t->key_truncated) cJSON_AddTrueToObject(o, "truncated");
    }
    add_u64(o, "count", t->count);
    return o;
}

char *tp_stop_stats_json(const tp_stop_stats *st)
{
    cJSON *o = cJSON_CreateObject(), *fin = cJSON_CreateObject(), *trig = cJSON_CreateArray();
    char *s = NULL;
    if (o && fin && trig) {
        add_u64(o, "jobs", st->jobs);
        for (int r = 1; r < TP_FINISH_REASON_COUNT; r++)
            add_u64(fin, tp_finish_reason_name((tp_finish_reason)r), st->finish[r]);
        cJSON_AddItemToObject(o, "finish", fin);
        fin = NULL;
        add_u64(o, "candidates", st->candidates);
        add_u64(o, "tokens_accepted", st->tokens_accepted);
        add_u64(o, "bytes_in", st->bytes_in);
        add_u64(o, "bytes_published", st->bytes_published);
        add_u64(o, "bytes_held", st->bytes_held);
        add_u64(o, "bytes_released", st->bytes_released);
        add_u64(o, "bytes_dropped", st->bytes_dropped);
        add_u64(o, "min_tokens_overrides", st->min_tokens_overrides);
        for (uint32_t i = 0; i < st->n_triggers && i < TP_STOP_STATS_TRIGGERS; i++)
            cJSON_AddItemToArray(trig, trigger_json(&st->trigger[i]));
        cJSON_AddItemToObject(o, "triggers", trig);
        trig = NULL;
        add_u64(o, "triggers_other", st->triggers_other);
        s = cJSON_PrintUnformatted(o);
    }
    cJSON_Delete(o);
    cJSON_Delete(fin);
    cJSON_Delete(trig);
    return s;
}
