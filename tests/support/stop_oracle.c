#include "stop_oracle.h"

#include <stdlib.h>
#include <string.h>

/* ---- UTF-8 by code points ---- */

/* Do the L bytes at b form one well-formed character? Decode the code point
 * and check the encoding is the shortest one and the value is a scalar. */
static bool well_formed(const uint8_t *b, size_t L)
{
    static const uint8_t lead_mask[5] = {0, 0x80, 0xE0, 0xF0, 0xF8};
    static const uint8_t lead_bits[5] = {0, 0x00, 0xC0, 0xE0, 0xF0};
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if ((b[0] & lead_mask[L]) != lead_bits[L]) return false;
    uint32_t cp = b[0] & (uint8_t)~lead_mask[L];
    for (size_t i = 1; i < L; i++) {
        if ((b[i] & 0xC0) != 0x80) return false;
        cp = (cp << 6) | (b[i] & 0x3F);
    }
    if (cp < min_cp[L] || cp > 0x10FFFF) return false;
    return !(cp >= 0xD800 && cp <= 0xDFFF);
}

/* Can the k bytes at b be continued into a well-formed character (k < its
 * length)? Try completions made of the boundary continuation values. */
static bool proper_prefix(const uint8_t *b, size_t k)
{
    static const uint8_t fill[] = {0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF};
    uint8_t buf[4];
    for (size_t L = k + 1; L <= 4; L++) {
        size_t free_n = L - k, combos = 1;
        for (size_t i = 0; i < free_n; i++) combos *= sizeof fill;
        memcpy(buf, b, k);
        for (size_t c = 0; c < combos; c++) {
            size_t x = c;
            for (size_t i = 0; i < free_n; i++, x /= sizeof fill) buf[k + i] = fill[x % sizeof fill];
            if (well_formed(buf, L)) return true;
        }
    }
    return false;
}

char *oracle_utf8_replace(const uint8_t *b, size_t n, size_t *out_len)
{
    char *out = malloc(3 * n + 1);
    size_t o = 0, i = 0;
    while (i < n) {
        size_t L;
        for (L = 1; L <= 4; L++)
            if (i + L <= n && well_formed(b + i, L)) break;
        if (L <= 4) {
            memcpy(out + o, b + i, L);
            o += L;
            i += L;
            continue;
        }
        size_t k = 1;   /* maximal subpart: longest prefix that could still continue */
        for (size_t j = 3; j >= 1; j--) {
            if (i + j <= n && proper_prefix(b + i, j)) {
                k = j;
                break;
            }
        }
        memcpy(out + o, "\xEF\xBF\xBD", 3);
        o += 3;
        i += k;
    }
    out[o] = '\0';
    *out_len = o;
    return out;
}

static bool utf8_ok(const uint8_t *b, size_t n)
{
    size_t len;
    char *d = oracle_utf8_replace(b, n, &len);
    bool ok = len == n && !memcmp(d, b, n);
    free(d);
    return ok;
}

static size_t unfinished_tail(const uint8_t *t, size_t n)
{
    for (size_t k = 3; k >= 1; k--)
        if (k <= n && proper_prefix(t + n - k, k)) return k;
    return 0;
}

/* ---- stop strings ---- */

static size_t slen(const tp_stop_config *c, size_t j)
{
    return c->stop_len ? c->stop_len[j] : strlen(c->stop[j]);
}

/* Longest suffix of t that is a proper prefix of some stop string. */
static size_t stop_prefix_tail(const tp_stop_config *c, const uint8_t *t, size_t n)
{
    size_t best = 0;
    for (size_t j = 0; j < c->n_stop; j++)
        for (size_t k = 1; k < slen(c, j) && k <= n; k++)
            if (k > best && !memcmp(t + n - k, c->stop[j], k)) best = k;
    return best;
}

/* Earliest end e > from where a stop ends (ties: longest); -1 if none. */
static int find_stop(const tp_stop_config *c, const uint8_t *t, size_t n, size_t from, size_t *end)
{
    for (size_t e = from + 1; e <= n; e++) {
        int best = -1;
        for (size_t j = 0; j < c->n_stop; j++) {
            size_t L = slen(c, j);
            if (L <= e && !memcmp(t + e - L, c->stop[j], L) &&
                (best < 0 || L > slen(c, (size_t)best)))
                best = (int)j;
        }
        if (best >= 0) {
            *end = e;
            return best;
        }
    }
    return -1;
}

static bool in_list(const int32_t *ids, size_t n, int32_t id)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id) return true;
    return false;
}

static bool ids_ok(const int32_t *ids, size_t n, int32_t vocab)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (vocab > 0 && ids[i] >= vocab)) return false;
    return true;
}

static bool config_invalid(const tp_stop_config *c)
{
    size_t max_n = c->max_stop_strings ? c->max_stop_strings : 1024;
    size_t max_len = c->max_stop_len ? c->max_stop_len : 1024;
    if (c->max_tokens < 1 || c->min_tokens < 0 || c->min_tokens > c->max_tokens) return true;
    if (!ids_ok(c->stop_ids, c->n_stop_ids, c->vocab_size)) return true;
    if (!ids_ok(c->eos_ids, c->n_eos_ids, c->vocab_size)) return true;
    /* the limit counts distinct strings: compare every pair, plainly */
    size_t distinct = 0;
    for (size_t j = 0; j < c->n_stop; j++) {
        bool seen = false;
        for (size_t k = 0; k < j && !seen; k++)
            seen = slen(c, k) == slen(c, j) && !memcmp(c->stop[k], c->stop[j], slen(c, j));
        distinct += !seen;
    }
    if (distinct > max_n) return true;
    for (size_t j = 0; j < c->n_stop; j++) {
        size_t L = slen(c, j);
        if (L == 0 || L > max_len || !utf8_ok((const uint8_t *)c->stop[j], L)) return true;
    }
    return false;
}

/* ---- the run ---- */

struct run {
    uint8_t *t;            /* generated text T */
    size_t n;
    char *pub;             /* decoding of the published prefix of T */
    size_t pub_len;
    oracle_result *r;
};

/* Publish T[0..upto) (upto >= what was published): the chunk is what its
 * decoding adds to the previous one. */
static void publish(struct run *w, size_t step, size_t upto)
{
    size_t len;
    char *d = oracle_utf8_replace(w->t, upto, &len);
    if (len < w->pub_len || (w->pub_len && memcmp(d, w->pub, w->pub_len))) w->r->retracted = true;
    size_t add = len > w->pub_len ? len - w->pub_len : 0;
    w->r->chunk[step] = malloc(add + 1);
    memcpy(w->r->chunk[step], d + (len - add), add);
    w->r->chunk_len[step] = add;
    free(w->pub);
    w->pub = d;
    w->pub_len = len;
}

static void finish(struct run *w, tp_finish_reason why, size_t step, size_t cut)
{
    publish(w, step, cut);
    w->r->finish = why;
    w->r->text = oracle_utf8_replace(w->t, cut, &w->r->text_len);
}

static int first_equal(const tp_stop_config *c, int j)
{
    for (int i = 0; i < j; i++)
        if (slen(c, i) == slen(c, j) && !memcmp(c->stop[i], c->stop[j], slen(c, j))) return i;
    return j;
}

/* One candidate; returns true when the job finished. */
static bool step(struct run *w, const tp_stop_config *c, const oracle_piece *p, size_t k,
                 size_t *min_len)
{
    oracle_result *r = w->r;
    bool in_min = r->completion_tokens < c->min_tokens;
    if (!in_min && in_list(c->stop_ids, c->n_stop_ids, p->id)) {
        r->matched_id = p->id;
        finish(w, TP_FINISH_STOP_TOKEN, k, w->n);
        return true;
    }
    if (!in_min && !c->ignore_eos && in_list(c->eos_ids, c->n_eos_ids, p->id)) {
        r->matched_id = p->id;
        finish(w, TP_FINISH_EOS, k, w->n);
        return true;
    }
    memcpy(w->t + w->n, p->bytes, p->len);
    w->n += p->len;
    size_t end;
    int j = in_min ? -1 : find_stop(c, w->t, w->n, *min_len, &end);
    if (j >= 0) {
        r->matched_stop = first_equal(c, j);
        finish(w, TP_FINISH_STOP_STRING, k, c->include_stop_str_in_output ? end : end - slen(c, j));
        return true;
    }
    r->accepted[k] = true;
    if (++r->completion_tokens == c->min_tokens) *min_len = w->n;
    if (r->completion_tokens >= c->max_tokens) {
        finish(w, TP_FINISH_LENGTH, k, w->n);
        return true;
    }
    size_t hold = c->include_stop_str_in_output ? 0 : stop_prefix_tail(c, w->t, w->n);
    size_t u8 = unfinished_tail(w->t, w->n);
    publish(w, k, w->n - (u8 > hold ? u8 : hold));
    return false;
}

void oracle_run(const tp_stop_config *c, const oracle_piece *pieces, size_t n, oracle_result *r)
{
    memset(r, 0, sizeof *r);
    r->matched_stop = -1;
    r->matched_id = -1;
    if (config_invalid(c)) {
        r->invalid = true;
        return;
    }
    size_t total = 0, min_len = 0;
    for (size_t k = 0; k < n; k++) total += pieces[k].len;
    struct run w = {.t = malloc(total + 1), .r = r};
    for (size_t k = 0; k < n; k++) {
        r->steps = k + 1;
        if (step(&w, c, &pieces[k], k, &min_len)) {
            free(w.t);
            free(w.pub);
            return;
        }
    }
    r->steps = n;
    finish(&w, TP_FINISH_CANCELLED, n, w.n);
    free(w.t);
    free(w.pub);
}

void oracle_free(oracle_result *r)
{
    for (size_t k = 0; k <= ORACLE_MAX_STEPS; k++) free(r->chunk[k]);
    free(r->text);
    memset(r, 0, sizeof *r);
}
