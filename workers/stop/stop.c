#include "tokpipe/stop.h"

#include <stdlib.h>
#include <string.h>

#include "tokpipe/stopmatch.h"
#include "tokpipe/utf8.h"

struct tp_stop {
    tp_stopmatch *match;
    int32_t *stop_ids, *eos_ids;    /* sorted */
    size_t n_stop_ids, n_eos_ids;
    bool ignore_eos, include_stop;
    int32_t min_tokens, max_tokens;
    uint32_t state;                 /* automaton state after all of T */
    uint8_t *pend;                  /* raw bytes of T not yet published */
    size_t pend_len, pend_cap;
    size_t held_counted;            /* leading pend bytes already counted in stats.bytes_held */
    char *text;                     /* published text (= concatenated chunks), NUL-terminated */
    size_t text_len, text_cap;
    int32_t accepted;
    tp_finish_reason finish;
    tp_stop_stats stats;
};

static const char *const reason_names[TP_FINISH_REASON_COUNT] = {
    "none", "stop_string", "stop_token", "eos", "length", "cancelled", "error",
};

const char *tp_finish_reason_name(tp_finish_reason r)
{
    if ((unsigned)r < TP_FINISH_REASON_COUNT) return reason_names[r];
    return "unknown";
}

int tp_finish_reason_parse(const char *name, tp_finish_reason *out)
{
    for (int r = 0; r < TP_FINISH_REASON_COUNT; r++) {
        if (!strcmp(name, reason_names[r])) {
            *out = (tp_finish_reason)r;
            return 0;
        }
    }
    return TP_ENOTFOUND;
}

/* ---- validation ---- */

static int check_ids(const char *field, const int32_t *ids, size_t n, int32_t vocab, tp_err *err)
{
    if (n && !ids) return tp_err_set(err, TP_EINVAL, "%s: NULL array with %zu ids", field, n);
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (vocab > 0 && ids[i] >= vocab))
            return tp_err_set(err, TP_ERANGE, "%s[%zu]: id %d outside the vocabulary [0, %d)", field,
                              i, ids[i], vocab > 0 ? vocab : INT32_MAX);
    }
    return 0;
}

static size_t stop_len_of(const tp_stop_config *c, size_t i)
{
    return c->stop_len ? c->stop_len[i] : strlen(c->stop[i]);
}

size_t tp_stop_count_distinct(const char *const *stop, const size_t *lens, size_t n)
{
    /* open addressing over FNV-1a hashes, table at most half full */
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    size_t *slot = malloc(cap * sizeof *slot);   /* 1 + index of the first copy, 0 empty */
    if (!slot)
        return SIZE_MAX;
    memset(slot, 0, cap * sizeof *slot);
    size_t distinct = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = lens ? lens[i] : strlen(stop[i]);
        uint64_t h = 1469598103934665603ull;
        for (size_t k = 0; k < len; k++)
            h = (h ^ (uint8_t)stop[i][k]) * 1099511628211ull;
        for (size_t at = (size_t)h & (cap - 1);; at = (at + 1) & (cap - 1)) {
            if (!slot[at]) {
                slot[at] = i + 1;
                distinct++;
                break;
            }
            size_t j = slot[at] - 1, lj = lens ? lens[j] : strlen(stop[j]);
            if (lj == len && !memcmp(stop[j], stop[i], len))
                break;
        }
    }
    free(slot);
    return distinct;
}

static int check_strings(const tp_stop_config *c, tp_err *err)
{
    size_t max_n = c->max_stop_strings ? c->max_stop_strings : TP_STOP_DEFAULT_MAX_STRINGS;
    size_t max_len = c->max_stop_len ? c->max_stop_len : TP_STOP_DEFAULT_MAX_LEN;
    if (max_len > TP_STOP_HARD_MAX_LEN)
        return tp_err_set(err, TP_EINVAL, "max_stop_len: %zu is more than %d", max_len,
                          TP_STOP_HARD_MAX_LEN);
    if (c->n_stop && !c->stop)
        return tp_err_set(err, TP_EINVAL, "stop: NULL array with %zu strings", c->n_stop);
    for (size_t i = 0; i < c->n_stop; i++)
        if (!c->stop[i]) return tp_err_set(err, TP_EINVAL, "stop[%zu]: NULL string", i);
    size_t distinct = c->n_stop > max_n ? tp_stop_count_distinct(c->stop, c->stop_len, c->n_stop) : c->n_stop;
    if (distinct == SIZE_MAX)
        return tp_err_set(err, TP_ENOMEM, "stop: out of memory");
    if (distinct > max_n)
        return tp_err_set(err, TP_ERANGE,
                          "stop: %zu distinct strings, more than the limit of %zu (max_stop_strings)",
                          distinct, max_n);
    for (size_t i = 0; i < c->n_stop; i++) {
        if (!c->stop[i]) return tp_err_set(err, TP_EINVAL, "stop[%zu]: NULL string", i);
        size_t len = stop_len_of(c, i), bad;
        if (len == 0) return tp_err_set(err, TP_EINVAL, "stop[%zu]: empty string", i);
        if (len > max_len)
            return tp_err_set(err, TP_ERANGE,
                              "stop[%zu]: %zu bytes, more than the limit of %zu (max_stop_len)", i,
                              len, max_len);
        if (!tp_utf8_valid((const uint8_t *)c->stop[i], len, &bad))
            return tp_err_set(err, TP_EINVAL, "stop[%zu]: invalid UTF-8 at byte %zu", i, bad);
    }
    return 0;
}

static int check_config(const tp_stop_config *c, tp_err *err)
{
    if (!c) return tp_err_set(err, TP_EINVAL, "stop config: NULL");
    if (c->max_tokens < 1)
        return tp_err_set(err, TP_ERANGE, "max_tokens: must be at least 1 (got %d)", c->max_tokens);
    if (c->min_tokens < 0)
        return tp_err_set(err, TP_ERANGE, "min_tokens: must not be negative (got %d)",
                          c->min_tokens);
    if (c->min_tokens > c->max_tokens)
        return tp_err_set(err, TP_ERANGE, "min_tokens: %d is more than max_tokens %d",
                          c->min_tokens, c->max_tokens);
    if (c->vocab_size < 0)
        return tp_err_set(err, TP_EINVAL, "vocab_size: must not be negative (got %d)",
                          c->vocab_size);
    int rc = check_ids("stop_token_ids", c->stop_ids, c->n_stop_ids, c->vocab_size, err);
    if (!rc) rc = check_ids("eos_token_ids", c->eos_ids, c->n_eos_ids, c->vocab_size, err);
    if (!rc) rc = check_strings(c, err);
    return rc;
}

/* ---- construction ---- */

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int copy_ids(const int32_t *ids, size_t n, int32_t **out)
{
    *out = malloc((n ? n : 1) * sizeof **out);
    if (!*out) return TP_ENOMEM;
    if (n) memcpy(*out, ids, n * sizeof **out);
    qsort(*out, n, sizeof **out, cmp_i32);
    return 0;
}

static bool has_id(const int32_t *ids, size_t n, int32_t id)
{
    return n && bsearch(&id, ids, n, sizeof *ids, cmp_i32) != NULL;
}

static int build_matcher(const tp_stop_config *c, tp_stop *s, tp_err *err)
{
    size_t *lens = malloc((c->n_stop ? c->n_stop : 1) * sizeof *lens);
    if (!lens) return tp_err_set(err, TP_ENOMEM, "stop: out of memory");
    for (size_t i = 0; i < c->n_stop; i++) lens[i] = stop_len_of(c, i);
    int rc = tp_stopmatch_new(c->stop, lens, c->n_stop, c->matcher_dense_bytes, &s->match, err);
    free(lens);
    return rc;
}

int tp_stop_new(const tp_stop_config *cfg, tp_stop **out, tp_err *err)
{
    *out = NULL;
    int rc = check_config(cfg, err);
    if (rc) return rc;
    tp_stop *s = calloc(1, sizeof *s);
    if (!s) return tp_err_set(err, TP_ENOMEM, "stop: out of memory");
    s->ignore_eos = cfg->ignore_eos;
    s->include_stop = cfg->include_stop_str_in_output;
    s->min_tokens = cfg->min_tokens;
    s->max_tokens = cfg->max_tokens;
    s->n_stop_ids = cfg->n_stop_ids;
    s->n_eos_ids = cfg->n_eos_ids;
    s->text_cap = 64;
    s->text = malloc(s->text_cap);
    s->pend_cap = 64;
    s->pend = malloc(s->pend_cap);
    if (!s->text || !s->pend || copy_ids(cfg->stop_ids, cfg->n_stop_ids, &s->stop_ids) ||
        copy_ids(cfg->eos_ids, cfg->n_eos_ids, &s->eos_ids)) {
        tp_stop_free(s);
        return tp_err_set(err, TP_ENOMEM, "stop: out of memory");
    }
    s->text[0] = '\0';
    rc = build_matcher(cfg, s, err);
    if (rc) {
        tp_stop_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

void tp_stop_free(tp_stop *s)
{
    if (!s) return;
    tp_stopmatch_free(s->match);
    free(s->stop_ids);
    free(s->eos_ids);
    free(s->pend);
    free(s->text);
    free(s);
}

/* ---- buffers ---- */

static int reserve(void **buf, size_t *cap, size_t need)
{
    if (need <= *cap) return 0;
    size_t c = *cap * 2;
    if (c < need) c = need;
    void *p = realloc(*buf, c);
    if (!p) return TP_ENOMEM;
    *buf = p;
    *cap = c;
    return 0;
}

/* Copy n bytes, memmove semantics (src and dst may overlap). Tokens are a
 * few bytes: two possibly overlapping word moves, all loads before the
 * stores, beat a libc call. */
static void copy_small(uint8_t *dst, const uint8_t *src, size_t n)
{
    if (n >= 8) {
        memmove(dst, src, n);
    } else if (n >= 4) {
        uint32_t a, b;
        memcpy(&a, src, 4);
        memcpy(&b, src + n - 4, 4);
        memcpy(dst, &a, 4);
        memcpy(dst + n - 4, &b, 4);
    } else if (n >= 2) {
        uint16_t a, b;
        memcpy(&a, src, 2);
        memcpy(&b, src + n - 2, 2);
        memcpy(dst, &a, 2);
        memcpy(dst + n - 2, &b, 2);
    } else if (n) {
        dst[0] = src[0];
    }
}

static bool all_ascii(const uint8_t *b, size_t k)
{
    uint8_t any = 0;
    for (size_t i = 0; i < k; i++) any |= b[i];
    return any < 0x80;
}

/* Decode k bytes onto the text (capacity reserved); ASCII, the common
 * case, is copied as is. */
static void append_text(tp_stop *s, const uint8_t *b, size_t k)
{
    if (all_ascii(b, k)) {
        copy_small((uint8_t *)s->text + s->text_len, b, k);
        s->text_len += k;
    } else {
        s->text_len += tp_utf8_replace(b, k, s->text + s->text_len);
    }
}

/* The unpublished text is pend followed by the candidate's bytes nb[0..n).
 * Publish its first k bytes: decode them into the text, update the
 * hold-back counters and keep the rest in pend (pend_cap was reserved for
 * pend_len + n). Cut points are always before a non-continuation byte or
 * at the end of a finished job, so decoding the pieces separately gives
 * the same text as decoding T at once. */
static int publish(tp_stop *s, const uint8_t *nb, size_t n, size_t k, tp_stop_step *out)
{
    size_t before = s->text_len;
    if (before + TP_UTF8_REPLACE_MAX(k) + 1 > s->text_cap &&
        reserve((void **)&s->text, &s->text_cap, before + TP_UTF8_REPLACE_MAX(k) + 1))
        return TP_ENOMEM;
    if (s->pend_len) {
        /* Decode in one piece: the held bytes may be the start of a
         * character the candidate completes. */
        copy_small(s->pend + s->pend_len, nb, n);
        s->pend_len += n;
        append_text(s, s->pend, k);
        copy_small(s->pend, s->pend + k, s->pend_len - k);
        s->pend_len -= k;
    } else {
        /* Nothing held: no copy of what is published. */
        if (n) {   /* nb may be NULL when n == 0 */
            append_text(s, nb, k);
            copy_small(s->pend, nb + k, n - k);
        }
        s->pend_len = n - k;
    }
    s->text[s->text_len] = '\0';
    size_t released = k < s->held_counted ? k : s->held_counted;
    s->stats.bytes_released += released;
    s->stats.bytes_published += k;
    s->held_counted -= released;
    out->chunk = s->text + before;
    out->chunk_len = s->text_len - before;
    return 0;
}

/* ---- finishing ---- */

static void record_trigger(tp_stop_stats *st, int32_t id, const char *key, size_t len)
{
    tp_stop_trigger t = {.id = id, .count = 1};
    if (key) {
        size_t k = len < TP_STOP_STATS_KEY_MAX ? len : TP_STOP_STATS_KEY_MAX;
        memcpy(t.key, key, k);
        t.key_len = (uint16_t)k;
        t.key_truncated = len > k;
    }
    tp_stop_stats one = {.n_triggers = 1};
    one.trigger[0] = t;
    tp_stop_stats_merge(st, &one);
}

static void finish(tp_stop *s, tp_finish_reason r, tp_stop_step *out)
{
    s->finish = r;
    out->finish = r;
    s->stats.jobs = 1;
    s->stats.finish[r]++;
    if (r == TP_FINISH_STOP_STRING)
        record_trigger(&s->stats, -1, out->matched_str, out->matched_len);
    else if (r == TP_FINISH_STOP_TOKEN || r == TP_FINISH_EOS)
        record_trigger(&s->stats, out->matched_id, NULL, 0);
}

/* Finish other than a stop string: every held byte is released. */
static int finish_release(tp_stop *s, const uint8_t *nb, size_t n, tp_finish_reason r,
                          tp_stop_step *out)
{
    int rc = publish(s, nb, n, s->pend_len + n, out);
    if (rc) return rc;
    finish(s, r, out);
    return 0;
}

static int fail_nomem(tp_stop *s, tp_stop_step *out)
{
    out->chunk = s->text + s->text_len;
    out->chunk_len = 0;
    out->accepted = false;
    finish(s, TP_FINISH_ERROR, out);
    return TP_ENOMEM;
}

/* ---- per candidate ---- */

static void step_init(tp_stop *s, tp_stop_step *out)
{
    *out = (tp_stop_step){.matched_id = -1, .chunk = s->text + s->text_len};
}

/* Rules 1 and 2; during min_tokens such a candidate is an ordinary token. */
static tp_finish_reason token_rule(tp_stop *s, int32_t id)
{
    tp_finish_reason r = TP_FINISH_NONE;
    if (has_id(s->stop_ids, s->n_stop_ids, id)) r = TP_FINISH_STOP_TOKEN;
    else if (!s->ignore_eos && has_id(s->eos_ids, s->n_eos_ids, id)) r = TP_FINISH_EOS;
    if (r != TP_FINISH_NONE && s->accepted < s->min_tokens) {
        s->stats.min_tokens_overrides++;
        r = TP_FINISH_NONE;
    }
    return r;
}

/* Run the candidate's bytes through the automaton. Returns the offset in
 * nb just past the earliest stop end that counts, *pat that stop, or
 * TP_STOPMATCH_NONE. Below min_tokens matches do not count but the
 * automaton still reads every byte. */
static size_t scan(tp_stop *s, const uint8_t *nb, size_t n, uint32_t *pat)
{
    size_t pos = 0;
    bool counts = s->accepted >= s->min_tokens;
    *pat = TP_STOPMATCH_NONE;
    while (pos < n) {
        pos += tp_stopmatch_find(s->match, &s->state, nb + pos, n - pos, pat);
        if (*pat != TP_STOPMATCH_NONE && counts) return pos;
    }
    *pat = TP_STOPMATCH_NONE;
    return pos;
}

/* end: offset in pend ++ nb just past the stop. */
static int stop_string(tp_stop *s, const uint8_t *nb, size_t n, size_t end, uint32_t pat,
                       tp_stop_step *out)
{
    out->matched_str = tp_stopmatch_pattern(s->match, pat, &out->matched_len);
    /* end - matched_len >= 0: the stop's earlier bytes are a proper stop
     * prefix, so they were held back and are still pending. */
    size_t cut = s->include_stop ? end : end - out->matched_len;
    s->stats.bytes_dropped += s->pend_len + n - cut;
    if (publish(s, nb, n, cut, out)) return fail_nomem(s, out);
    s->held_counted = 0;
    s->pend_len = 0;
    finish(s, TP_FINISH_STOP_STRING, out);
    return 0;
}

/* Unfinished UTF-8 at the end of pend ++ nb (it may start in pend). */
static size_t unfinished_tail(const tp_stop *s, const uint8_t *nb, size_t n)
{
    if (n && nb[n - 1] < 0x80) return 0;
    uint8_t last[3];
    size_t k = 0;
    for (size_t i = s->pend_len + n - (s->pend_len + n < 3 ? s->pend_len + n : 3); k < 3 &&
         i < s->pend_len + n; i++)
        last[k++] = i < s->pend_len ? s->pend[i] : nb[i - s->pend_len];
    return tp_utf8_unfinished_tail(last, k);
}

/* Accepted: publish all but the held-back tail (a stop prefix, an
 * unfinished UTF-8 sequence), or everything when max_tokens is reached. */
static int accept(tp_stop *s, const uint8_t *nb, size_t n, tp_stop_step *out)
{
    out->accepted = true;
    s->accepted++;
    s->stats.tokens_accepted++;
    if (s->accepted >= s->max_tokens)
        return finish_release(s, nb, n, TP_FINISH_LENGTH, out) ? fail_nomem(s, out) : 0;
    size_t hold = s->include_stop ? 0 : tp_stopmatch_partial(s->match, s->state);
    size_t u8 = unfinished_tail(s, nb, n);
    if (u8 > hold) hold = u8;
    if (publish(s, nb, n, s->pend_len + n - hold, out)) return fail_nomem(s, out);
    s->stats.bytes_held += s->pend_len - s->held_counted;
    s->held_counted = s->pend_len;
    return 0;
}

int tp_stop_feed(tp_stop *s, int32_t token_id, const uint8_t *bytes, size_t n, tp_stop_step *out)
{
    step_init(s, out);
    if (s->finish != TP_FINISH_NONE) return TP_ESTATE;
    s->stats.candidates++;
    s->stats.bytes_in += n;
    tp_finish_reason r = token_rule(s, token_id);
    if (r != TP_FINISH_NONE) {
        out->matched_id = token_id;
        return finish_release(s, NULL, 0, r, out) ? fail_nomem(s, out) : 0;
    }
    if (reserve((void **)&s->pend, &s->pend_cap, s->pend_len + n)) return fail_nomem(s, out);
    uint32_t pat;
    size_t end = scan(s, bytes, n, &pat);
    if (pat != TP_STOPMATCH_NONE) return stop_string(s, bytes, n, s->pend_len + end, pat, out);
    return accept(s, bytes, n, out);
}

static int finish_now(tp_stop *s, tp_finish_reason r, tp_stop_step *out)
{
    step_init(s, out);
    if (s->finish != TP_FINISH_NONE) return TP_ESTATE;
    return finish_release(s, NULL, 0, r, out) ? fail_nomem(s, out) : 0;
}

int tp_stop_cancel(tp_stop *s, tp_stop_step *out)
{
    return finish_now(s, TP_FINISH_CANCELLED, out);
}

int tp_stop_end(tp_stop *s, tp_stop_step *out)
{
    return finish_now(s, TP_FINISH_EOS, out);
}

int tp_stop_fail(tp_stop *s, tp_stop_step *out)
{
    return finish_now(s, TP_FINISH_ERROR, out);
}

/* ---- accessors ---- */

const char *tp_stop_text(const tp_stop *s, size_t *len)
{
    *len = s->text_len;
    return s->text;
}

int32_t tp_stop_completion_tokens(const tp_stop *s)
{
    return s->accepted;
}

tp_finish_reason tp_stop_finish_reason(const tp_stop *s)
{
    return s->finish;
}

size_t tp_stop_held_bytes(const tp_stop *s)
{
    return s->pend_len;
}

const uint8_t *tp_stop_held(const tp_stop *s, size_t *len)
{
    *len = s->pend_len;
    return s->pend;
}

size_t tp_stop_memory(const tp_stop *s)
{
    return sizeof *s + tp_stopmatch_memory(s->match) + s->pend_cap + s->text_cap +
           (s->n_stop_ids + s->n_eos_ids) * sizeof(int32_t);
}

size_t tp_stop_n_strings(const tp_stop *s)
{
    return tp_stopmatch_count(s->match);
}

const char *tp_stop_string(const tp_stop *s, size_t i, size_t *len)
{
    return tp_stopmatch_pattern(s->match, i, len);
}

const tp_stop_stats *tp_stop_get_stats(const tp_stop *s)
{
    return &s->stats;
}

/* ---- stats ---- */

static bool same_trigger(const tp_stop_trigger *a, const tp_stop_trigger *b)
{
    return a->id == b->id && a->key_len == b->key_len && a->key_truncated == b->key_truncated &&
           !memcmp(a->key, b->key, a->key_len);
}

static void merge_trigger(tp_stop_stats *into, const tp_stop_trigger *t)
{
    for (uint32_t i = 0; i < into->n_triggers; i++) {
        if (same_trigger(&into->trigger[i], t)) {
            into->trigger[i].count += t->count;
            return;
        }
    }
    if (into->n_triggers < TP_STOP_STATS_TRIGGERS) into->trigger[into->n_triggers++] = *t;
    else into->triggers_other += t->count;
}

void tp_stop_stats_merge(tp_stop_stats *into, const tp_stop_stats *from)
{
    into->jobs += from->jobs;
    for (int r = 0; r < TP_FINISH_REASON_COUNT; r++) into->finish[r] += from->finish[r];
    into->candidates += from->candidates;
    into->tokens_accepted += from->tokens_accepted;
    into->bytes_in += from->bytes_in;
    into->bytes_published += from->bytes_published;
    into->bytes_held += from->bytes_held;
    into->bytes_released += from->bytes_released;
    into->bytes_dropped += from->bytes_dropped;
    into->min_tokens_overrides += from->min_tokens_overrides;
    into->triggers_other += from->triggers_other;
    for (uint32_t i = 0; i < from->n_triggers && i < TP_STOP_STATS_TRIGGERS; i++)
        merge_trigger(into, &from->trigger[i]);
}
