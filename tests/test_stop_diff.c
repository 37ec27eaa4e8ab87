/* Differential test: tp_stop against the brute-force oracle in
 * tests/support/stop_oracle.c on 100 000+ random jobs — random pieces (raw
 * bytes, split multi-byte characters, invalid bytes), stop strings drawn from
 * the generated text and at random, random flags and limits. Every step's
 * chunk, accepted flag, the finish reason, matched stop, final text and token
 * count must be identical. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/stop_oracle.h"
#include "tokpipe/stop.h"

#define CASES 120000
#define MAX_BYTES 64
#define MAX_PIECES 16
#define MAX_STOPS 5

static uint64_t rng_state;

static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11) % n;
}

/* Atoms the text is made of: ASCII, whole multi-byte characters and stray
 * bytes (lone leads, continuations, never-valid bytes). */
static const char *const atoms[] = {
    "a", "b", "a", "b", "c", " ", "\n", "\xC3\xA9", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80",
    "\xD7\x90", "e\xCC\x81", "\xE4", "\xB8", "\xAD", "\xF0\x9F", "\x80", "\xFF", "\xC0", "\xED\xA0\x80",
};

struct gen {
    uint8_t text[MAX_BYTES];
    size_t text_len;
    oracle_piece piece[MAX_PIECES];
    size_t n_piece;
    char stop_buf[MAX_STOPS][16];
    const char *stop[MAX_STOPS];
    size_t stop_len[MAX_STOPS];
    int32_t stop_ids[3], eos_ids[2];
    tp_stop_config cfg;
};

static void gen_text(struct gen *g)
{
    size_t target = 1 + rnd(40);
    g->text_len = 0;
    while (g->text_len < target) {
        const char *a = atoms[rnd(sizeof atoms / sizeof *atoms)];
        size_t l = strlen(a);
        if (g->text_len + l > MAX_BYTES) break;
        memcpy(g->text + g->text_len, a, l);
        g->text_len += l;
    }
}

/* Split the text at random points; some pieces are empty. Ids come from a
 * small range so stop ids and EOS collide with them often. */
static void gen_pieces(struct gen *g)
{
    size_t pos = 0;
    g->n_piece = 0;
    while (g->n_piece < MAX_PIECES && (pos < g->text_len || rnd(4) == 0)) {
        size_t left = g->text_len - pos;
        size_t l = left ? rnd((uint32_t)(left < 6 ? left : 6) + 1) : 0;
        if (g->n_piece == MAX_PIECES - 1) l = left;
        oracle_piece *p = &g->piece[g->n_piece++];
        p->bytes = g->text + pos;
        p->len = l;
        p->id = rnd(3) ? (int32_t)(100 + rnd(1000)) : (int32_t)rnd(8);
        pos += l;
    }
}

static void gen_stop(struct gen *g, size_t j)
{
    char *s = g->stop_buf[j];
    size_t len = 0;
    if (rnd(3) && g->text_len) {   /* a substring of the text */
        size_t at = rnd((uint32_t)g->text_len);
        len = 1 + rnd(6);
        if (at + len > g->text_len) len = g->text_len - at;
        memcpy(s, g->text + at, len);
    } else if (rnd(20) == 0 && j > 0) {   /* a duplicate */
        len = g->stop_len[j - 1];
        memcpy(s, g->stop[j - 1], len);
    } else if (rnd(30) != 0) {   /* random atoms */
        for (size_t k = 1 + rnd(3); k > 0; k--) {
            const char *a = atoms[rnd(12)];
            if (len + strlen(a) > 15) break;
            memcpy(s + len, a, strlen(a));
            len += strlen(a);
        }
    }   /* else empty: must be rejected */
    g->stop[j] = s;
    g->stop_len[j] = len;
}

static void gen_config(struct gen *g)
{
    tp_stop_config *c = &g->cfg;
    memset(c, 0, sizeof *c);
    c->n_stop = rnd(MAX_STOPS + 1);
    for (size_t j = 0; j < c->n_stop; j++) gen_stop(g, j);
    c->stop = g->stop;
    c->stop_len = g->stop_len;
    c->n_stop_ids = rnd(4);
    for (size_t i = 0; i < c->n_stop_ids; i++) g->stop_ids[i] = (int32_t)rnd(8);
    c->stop_ids = g->stop_ids;
    c->n_eos_ids = rnd(3);
    for (size_t i = 0; i < c->n_eos_ids; i++) g->eos_ids[i] = (int32_t)rnd(8);
    c->eos_ids = g->eos_ids;
    c->ignore_eos = rnd(3) == 0;
    c->include_stop_str_in_output = rnd(3) == 0;
    c->min_tokens = rnd(3) ? 0 : (int32_t)rnd(5);
    c->max_tokens = rnd(2) ? TP_STOP_NO_LIMIT : (int32_t)rnd(12);
    c->vocab_size = rnd(8) == 0 ? 6 : 0;
    if (rnd(50) == 0) c->max_stop_strings = 2;
    if (rnd(50) == 0) c->max_stop_len = 3;
    if (rnd(2)) c->matcher_dense_bytes = 1;   /* only the start state dense: failure links */
}

static void fail_case(uint64_t seed, const char *what, size_t step)
{
    fail_msg("case seed %llu: %s (step %zu)", (unsigned long long)seed, what, step);
}

static void check_chunk(uint64_t seed, size_t k, const tp_stop_step *st, const oracle_result *o)
{
    if (st->chunk_len != o->chunk_len[k] || memcmp(st->chunk, o->chunk[k], st->chunk_len))
        fail_case(seed, "chunk differs from the oracle", k);
}

static void check_end(uint64_t seed, tp_stop *s, const tp_stop_step *last, const oracle_result *o,
                      const tp_stop_config *c)
{
    size_t len;
    const char *text = tp_stop_text(s, &len);
    if (len != o->text_len || memcmp(text, o->text, len)) fail_case(seed, "final text differs", 0);
    if (tp_stop_finish_reason(s) != o->finish) fail_case(seed, "finish reason differs", 0);
    if (tp_stop_completion_tokens(s) != o->completion_tokens)
        fail_case(seed, "completion_tokens differs", 0);
    if (last->matched_id != o->matched_id) fail_case(seed, "matched id differs", 0);
    if (o->matched_stop >= 0) {
        size_t L = c->stop_len[o->matched_stop];
        if (last->matched_len != L || memcmp(last->matched_str, c->stop[o->matched_stop], L))
            fail_case(seed, "matched stop string differs", 0);
    } else if (last->matched_str) {
        fail_case(seed, "matched a stop string the oracle did not", 0);
    }
}

static void run_case(uint64_t seed)
{
    struct gen g;
    rng_state = seed * 0x9E3779B97F4A7C15ull + 1;
    gen_text(&g);
    gen_pieces(&g);
    gen_config(&g);
    oracle_result o;
    oracle_run(&g.cfg, g.piece, g.n_piece, &o);
    if (o.retracted) fail_case(seed, "oracle saw a retraction", 0);
    tp_stop *s;
    tp_err err;
    int rc = tp_stop_new(&g.cfg, &s, &err);
    if (o.invalid != (rc != 0)) fail_case(seed, rc ? err.msg : "config accepted, oracle rejects", 0);
    if (rc) {
        oracle_free(&o);
        return;
    }
    tp_stop_step st = {0};
    size_t k;
    for (k = 0; k < g.n_piece && tp_stop_finish_reason(s) == TP_FINISH_NONE; k++) {
        if (tp_stop_feed(s, g.piece[k].id, g.piece[k].bytes, g.piece[k].len, &st))
            fail_case(seed, "feed failed", k);
        if (st.accepted != o.accepted[k]) fail_case(seed, "accepted differs", k);
        check_chunk(seed, k, &st, &o);
    }
    if (tp_stop_finish_reason(s) == TP_FINISH_NONE) {
        tp_stop_cancel(s, &st);
        check_chunk(seed, g.n_piece, &st, &o);
    }
    if (k != o.steps) fail_case(seed, "steps consumed differ", k);
    check_end(seed, s, &st, &o, &g.cfg);
    tp_stop_free(s);
    oracle_free(&o);
}

static void stop_matches_oracle_on_random_jobs(void **state)
{
    (void)state;
    const char *env = getenv("TP_STOP_DIFF_CASES");
    long cases = env ? atol(env) : CASES;
    for (long i = 0; i < cases; i++) run_case((uint64_t)i);
}

/* The answer must not depend on how the text was split into tokens: with
 * only stop strings in play, every split gives the same text and stop. */
static void stop_result_does_not_depend_on_tokenization(void **state)
{
    (void)state;
    for (uint64_t seed = 0; seed < 20000; seed++) {
        struct gen g;
        rng_state = seed * 0x2545F4914F6CDD1Dull + 7;
        gen_text(&g);
        gen_config(&g);
        g.cfg.n_stop_ids = g.cfg.n_eos_ids = 0;
        g.cfg.min_tokens = 0;
        g.cfg.max_tokens = TP_STOP_NO_LIMIT;
        char first[3 * MAX_BYTES + 1];
        size_t first_len = 0;
        for (int split = 0; split < 3; split++) {
            gen_pieces(&g);
            tp_stop *s;
            if (tp_stop_new(&g.cfg, &s, NULL)) break;
            tp_stop_step st;
            for (size_t k = 0; k < g.n_piece && tp_stop_finish_reason(s) == TP_FINISH_NONE; k++)
                tp_stop_feed(s, 1000, g.piece[k].bytes, g.piece[k].len, &st);
            if (tp_stop_finish_reason(s) == TP_FINISH_NONE) tp_stop_cancel(s, &st);
            size_t len;
            const char *t = tp_stop_text(s, &len);
            if (split == 0) {
                memcpy(first, t, len);
                first_len = len;
            } else if (len != first_len || memcmp(first, t, len)) {
                fail_case(seed, "text changed with the token split", (size_t)split);
            }
            tp_stop_free(s);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stop_matches_oracle_on_random_jobs),
        cmocka_unit_test(stop_result_does_not_depend_on_tokenization),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
