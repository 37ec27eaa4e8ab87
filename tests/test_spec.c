/* Speculative decoding's parts: the prompt-lookup guesser (against a
 * brute-force oracle), the per-job controller, and the forward's verify
 * step and rollback on stories260K: every position's logits of a verify
 * item are bit-identical to feeding the tokens one step at a time, with
 * rejected guesses rolled back in between, across KV page boundaries and
 * next to plain items in the same step; and the draft model's guesses
 * (tp_draft_propose): the greedy chain a token-at-a-time oracle gives,
 * batched, chunked and fed incrementally. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/draft.h"
#include "tokpipe/forward.h"
#include "tokpipe/model.h"
#include "tokpipe/spec.h"

/* ---- the guesser --------------------------------------------------------- */

/* The oracle: for n from the longest down, is ids' last n-gram found
 * earlier (ending before the last token)? The latest such place's
 * successors, extended by the same shift. */
static size_t oracle_guess(const int32_t *ids, size_t n, size_t max_out, int32_t *out)
{
    for (size_t len = TP_SPEC_NGRAM_MAX; len >= TP_SPEC_NGRAM_MIN; len--) {
        if (len + 1 > n)
            continue;
        for (size_t e = n - 1; e-- > 0;) {
            if (e + 1 < len || memcmp(ids + e + 1 - len, ids + n - len, len * sizeof *ids))
                continue;
            /* the longest match here may be longer than len: then a longer
             * n found it first, unless capped */
            int32_t seq[4096];
            memcpy(seq, ids, n * sizeof *ids);
            size_t d = n - 1 - e;
            for (size_t t = 0; t < max_out; t++)
                seq[n + t] = seq[n + t - d];
            memcpy(out, seq + n, max_out * sizeof *out);
            return max_out;
        }
    }
    return 0;
}

static void ngram_proposes_what_followed_the_match(void **state)
{
    (void)state;
    /* 5 6 7 8 9 ... 5 6 7 -> 8 9 */
    const int32_t ids[] = {1, 5, 6, 7, 8, 9, 2, 3, 5, 6, 7};
    int32_t out[4];
    assert_int_equal(tp_ngram_guess(ids, 11, 2, out), 2);
    assert_int_equal(out[0], 8);
    assert_int_equal(out[1], 9);
}

static void ngram_prefers_the_longest_then_the_latest(void **state)
{
    (void)state;
    /* "6 7" is followed by 1 (long match 5 6 7) early and by 2 later; the
     * 3-gram 5 6 7 wins over the later 2-gram */
    const int32_t ids[] = {5, 6, 7, 1, 4, 6, 7, 2, 5, 6, 7};
    int32_t out[1];
    assert_int_equal(tp_ngram_guess(ids, 11, 1, out), 1);
    assert_int_equal(out[0], 1);
    /* two equal matches: the latest */
    const int32_t two[] = {6, 7, 1, 6, 7, 2, 6, 7};
    assert_int_equal(tp_ngram_guess(two, 8, 1, out), 1);
    assert_int_equal(out[0], 2);
}

static void ngram_repeats_a_period_past_the_known_tokens(void **state)
{
    (void)state;
    const int32_t ids[] = {9, 1, 2, 3, 1, 2, 3, 1, 2};
    int32_t out[6];
    assert_int_equal(tp_ngram_guess(ids, 9, 6, out), 6);
    const int32_t want[] = {3, 1, 2, 3, 1, 2};
    assert_memory_equal(out, want, sizeof want);
}

static void ngram_without_a_match_guesses_nothing(void **state)
{
    (void)state;
    const int32_t ids[] = {1, 2, 3, 4, 5, 6, 7, 3};
    int32_t out[4];
    assert_int_equal(tp_ngram_guess(ids, 8, 4, out), 0); /* a 1-gram is below TP_SPEC_NGRAM_MIN */
    assert_int_equal(tp_ngram_guess(ids, 1, 4, out), 0);
    assert_int_equal(tp_ngram_guess(ids, 8, 0, out), 0);
}

static void ngram_equals_the_oracle_on_random_sequences(void **state)
{
    (void)state;
    uint64_t x = 88172645463325252ull;
    for (int trial = 0; trial < 3000; trial++) {
        int32_t ids[200], got[16], want[16];
        size_t n = 1 + (size_t)(trial % 199);
        int alphabet = 2 + trial % 5;
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            ids[i] = (int32_t)(x % (uint64_t)alphabet);
        }
        size_t k = 1 + (size_t)(trial % 16);
        size_t a = tp_ngram_guess(ids, n, k, got), b = oracle_guess(ids, n, k, want);
        if (a != b || memcmp(got, want, a * sizeof *got))
            fail_msg("trial %d (n %zu, alphabet %d, k %zu): guessed %zu tokens, the oracle %zu or other ones",
                     trial, n, alphabet, k, a, b);
    }
}

/* ---- the controller -------------------------------------------------------- */

static void controller_grows_shrinks_and_pauses(void **state)
{
    (void)state;
    tp_spec s;
    tp_spec_init(&s, 8);
    assert_int_equal(tp_spec_want(&s, 1, 100), 4);
    tp_spec_result(&s, 4, 4);
    assert_int_equal(tp_spec_want(&s, 1, 100), 8);
    assert_int_equal(tp_spec_want(&s, 1, 3), 3); /* room caps it */
    tp_spec_result(&s, 8, 2);
    assert_int_equal(tp_spec_want(&s, 1, 100), 3);
    tp_spec_result(&s, 3, 0); /* nothing taken: a pause, then one guess */
    for (int i = 0; i < TP_SPEC_PAUSE_MIN; i++)
        assert_int_equal(tp_spec_want(&s, 1, 100), 0);
    assert_int_equal(tp_spec_want(&s, 1, 100), 1);
    tp_spec_result(&s, 1, 0); /* failing again: twice as long */
    for (int i = 0; i < 2 * TP_SPEC_PAUSE_MIN; i++)
        assert_int_equal(tp_spec_want(&s, 1, 100), 0);
    assert_int_equal(tp_spec_want(&s, 1, 100), 1);
    assert_int_equal(s.drafted, 4 + 8 + 3 + 1);
    assert_int_equal(s.accepted, 4 + 2);
    assert_int_equal(s.verifies, 4);
}

static void controller_stays_off_in_a_big_batch_or_when_off(void **state)
{
    (void)state;
    tp_spec s, off;
    tp_spec_init(&s, 16);
    tp_spec_init(&off, 0);
    assert_int_equal(tp_spec_want(&s, TP_SPEC_BATCH_MAX + 1, 100), 0);
    assert_int_equal(tp_spec_want(&s, TP_SPEC_BATCH_MAX, 100), 4);
    assert_int_equal(tp_spec_want(&off, 1, 100), 0);
    tp_spec_init(&s, 99);
    assert_int_equal(s.n_max, TP_SPEC_MAX_DRAFT);
}

static void mode_names_round_trip(void **state)
{
    (void)state;
    tp_spec_mode m;
    tp_err e;
    for (int i = 0; i <= TP_SPEC_DRAFT; i++) {
        assert_int_equal(tp_spec_mode_parse(tp_spec_mode_name((tp_spec_mode)i), &m, &e), 0);
        assert_int_equal((int)m, i);
    }
    assert_int_equal(tp_spec_mode_parse("eagle", &m, &e), TP_EINVAL);
    assert_non_null(strstr(e.msg, "eagle"));
}

/* ---- the verify step --------------------------------------------------------- */

typedef struct engine {
    tp_model *m;
    tp_forward *f;
    int vocab;
} engine;

#define GEN 40

static void engine_open(engine *g, int slots)
{
    const char *dir = getenv("TP_MODELS");
    char path[4096];
    snprintf(path, sizeof path, "%s/stories260K.bin", dir ? dir : "../shared/models");
    tp_err e;
    if (tp_model_load(path, &g->m, &e) || tp_forward_new(g->m, slots, 0, 64, &g->f, &e))
        fail_msg("%s: %s", path, e.msg);
    g->vocab = tp_model_get_config(g->m)->vocab_size;
}

static void engine_close(engine *g)
{
    tp_forward_free(g->f);
    tp_model_free(g->m);
}

/* The reference: the prompt, then ids fed one step at a time; rows[i]: the
 * logits after ids[i]. */
static void single_steps(engine *g, const int *prompt, int np, const int *ids, int n, float *rows)
{
    tp_err e;
    int sid;
    assert_int_equal(tp_forward_seq_open(g->f, &sid, &e), 0);
    tp_fwd_item it = {sid, 0, prompt, np, true};
    assert_int_equal(tp_forward_step(g->f, &it, 1, NULL, &e), 0);
    for (int i = 0; i < n; i++) {
        tp_fwd_item d = {sid, np + i, &ids[i], 1, false};
        assert_int_equal(tp_forward_step(g->f, &d, 1, rows + (size_t)i * g->vocab, &e), 0);
    }
    tp_forward_seq_close(g->f, sid);
}

static const int PROMPT[] = {1, 403, 407, 261, 378, 64, 3, 9};

static void verify_rows_equal_single_steps_with_rollbacks(void **state)
{
    (void)state;
    engine g;
    engine_open(&g, 2);
    int ids[GEN];
    for (int i = 0; i < GEN; i++)
        ids[i] = (i * 37 + 11) % g.vocab;
    size_t V = (size_t)g.vocab;
    float *ref = malloc(sizeof *ref * GEN * V), *rows = malloc(sizeof *rows * (TP_SPEC_MAX_DRAFT + 1) * V),
          *two = malloc(sizeof *two * 2 * V), *plain = two + V, *other = malloc(sizeof *other * GEN * V);
    single_steps(&g, PROMPT, 8, ids, GEN, ref);
    single_steps(&g, PROMPT, 3, ids, GEN, other);

    /* the job: verify items of varying k whose guesses are right for a
     * while, then wrong; rolled back to the right ones each time. Beside
     * it, a second sequence decodes one plain token per step. */
    tp_err e;
    int sa, sb;
    assert_int_equal(tp_forward_seq_open(g.f, &sa, &e), 0);
    assert_int_equal(tp_forward_seq_open(g.f, &sb, &e), 0);
    tp_fwd_item pa = {sa, 0, PROMPT, 8, true}, pb = {sb, 0, PROMPT, 3, true};
    assert_int_equal(tp_forward_step(g.f, &pa, 1, NULL, &e), 0);
    assert_int_equal(tp_forward_step(g.f, &pb, 1, NULL, &e), 0);
    int done = 0, step = 0, b_done = 0;
    while (done < GEN) {
        int k = 1 + step % 7, right = step % 3 == 0 ? k : step % 4; /* guesses right */
        if (right > k)
            right = k;
        int toks[TP_SPEC_MAX_DRAFT + 1], n = 1;
        toks[0] = ids[done];
        for (int i = 0; i < k && done + 1 + i < GEN; i++, n++)
            toks[1 + i] = i < right ? ids[done + 1 + i] : (ids[done + 1 + i] + 1) % g.vocab;
        tp_fwd_item it[2] = {{sa, 8 + done, toks, n, false}, {sb, 3 + b_done, &ids[b_done], 1, false}};
        float *all[2] = {rows, NULL};
        int items = b_done < GEN ? 2 : 1;
        assert_int_equal(tp_forward_step_verify(g.f, it, items, two, all, &e), 0);
        if (items == 2)
            assert_memory_equal(plain, other + (size_t)b_done++ * V, V * sizeof *plain);
        /* rows valid while the guesses were right: position 0 and 1 + right */
        int valid = 1 + (right < n - 1 ? right : n - 1);
        for (int i = 0; i < valid; i++)
            if (memcmp(rows + (size_t)i * V, ref + (size_t)(done + i) * V, V * sizeof *rows))
                fail_msg("step %d: row %d (position %d) differs from a single step's", step, i, 8 + done + i);
        done += valid;
        assert_int_equal(tp_forward_seq_truncate(g.f, sa, 8 + done), 0);
        assert_int_equal(tp_forward_seq_length(g.f, sa), 8 + done);
        step++;
    }
    assert_true(step < GEN); /* some steps took several positions */
    assert_int_equal(tp_forward_seq_truncate(g.f, sa, 8 + done + 1), TP_EINVAL);
    assert_int_equal(tp_forward_seq_truncate(g.f, 99, 0), TP_ENOTFOUND);
    free(ref);
    free(rows);
    free(two);
    free(other);
    engine_close(&g);
}

static void verify_needs_the_invariant_kernel(void **state)
{
    (void)state;
    engine g;
    engine_open(&g, 1);
    tp_err e;
    if (tp_forward_set_kernel(g.f, TP_FWD_KERNEL_OPENBLAS, &e)) {
        engine_close(&g);
        skip();
    }
    int sid;
    assert_int_equal(tp_forward_seq_open(g.f, &sid, &e), 0);
    float *rows = malloc(sizeof *rows * 8 * (size_t)g.vocab);
    tp_fwd_item it = {sid, 0, PROMPT, 8, false};
    float *all[1] = {rows};
    assert_int_equal(tp_forward_step_verify(g.f, &it, 1, NULL, all, &e), TP_EINVAL);
    assert_non_null(strstr(e.msg, "invariant"));
    free(rows);
    engine_close(&g);
}

/* ---- the draft model ----------------------------------------------------- */

/* The oracle: ids fed one token at a time on a sequence of its own, then
 * k times the argmax (lowest id on a tie) fed back. */
static void greedy_chain(engine *g, const int *ids, int n, int k, int32_t *out)
{
    tp_err e;
    int sid, tok;
    float *row = malloc(sizeof *row * (size_t)g->vocab);
    assert_int_equal(tp_forward_seq_open(g->f, &sid, &e), 0);
    for (int i = 0; i < n + k - 1; i++) {
        tok = i < n ? ids[i] : out[i - n];
        tp_fwd_item it = {sid, i, &tok, 1, i < n - 1};
        assert_int_equal(tp_forward_step(g->f, &it, 1, row, &e), 0);
        if (i >= n - 1) {
            int best = 0;
            for (int v = 1; v < g->vocab; v++)
                if (row[v] > row[best])
                    best = v;
            out[i - n + 1] = best;
        }
    }
    tp_forward_seq_close(g->f, sid);
    free(row);
}

static void draft_guesses_are_the_greedy_chain_batched_chunked_and_incremental(void **state)
{
    (void)state;
    engine g;
    engine_open(&g, 6);   /* max_batch_tokens 64: a 100-token feed takes two chunks */
    enum { LONG = 100 };
    int32_t ids[LONG + 8], want[TP_SPEC_MAX_DRAFT], got[3 * TP_SPEC_MAX_DRAFT];
    for (int i = 0; i < LONG; i++)
        ids[i] = i < 8 ? PROMPT[i] : (i * 53 + 7) % g.vocab;
    tp_err e;
    int seq[3], ngot[3];
    for (int i = 0; i < 3; i++)
        assert_int_equal(tp_forward_seq_open(g.f, &seq[i], &e), 0);
    tp_draft_item it[3] = {{seq[0], 0, ids, LONG, 5}, {seq[1], 0, PROMPT, 8, 1}, {seq[2], 0, ids + 3, 8, 16}};
    assert_int_equal(tp_draft_propose(g.f, it, 3, got, ngot, &e), 0);
    const int ks[3] = {5, 1, 16};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ngot[i], ks[i]);
        greedy_chain(&g, it[i].tokens, it[i].n_tokens, ks[i], want);
        if (memcmp(got + i * TP_SPEC_MAX_DRAFT, want, (size_t)ks[i] * sizeof *want))
            fail_msg("item %d: the draft's guesses differ from the greedy chain", i);
        /* it holds its tokens and every guess but the last */
        assert_int_equal(tp_forward_seq_length(g.f, seq[i]), it[i].n_tokens + ks[i] - 1);
    }
    /* the job took two of item 0's guesses, then sampled another token:
     * the draft keeps what is the job's and is fed the rest */
    memcpy(ids + LONG, got, 2 * sizeof *got);
    ids[LONG + 2] = (got[2] + 1) % g.vocab;
    tp_draft_item next[2] = {{seq[0], LONG + 2, ids + LONG + 2, 1, 3}, {seq[1], 99, PROMPT, 1, 2}};
    assert_int_equal(tp_draft_propose(g.f, next, 2, got, ngot, &e), 0);
    assert_int_equal(ngot[0], 3);
    greedy_chain(&g, ids, LONG + 3, 3, want);
    assert_memory_equal(got, want, 3 * sizeof *want);
    assert_int_equal(ngot[1], 0);   /* a pos past what it holds: not served, left as it was */
    assert_int_equal(tp_forward_seq_length(g.f, seq[1]), 8);
    engine_close(&g);
}

static void draft_model_of_another_vocabulary_is_refused(void **state)
{
    (void)state;
    tp_err e;
    assert_int_equal(tp_draft_vocab_check(512, 512, "d.bin", &e), 0);
    assert_int_equal(tp_draft_vocab_check(512, 600, "d.bin", &e), TP_EINVAL);
    assert_non_null(strstr(e.msg, "600"));
    assert_non_null(strstr(e.msg, "512"));
    assert_non_null(strstr(e.msg, "d.bin"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ngram_proposes_what_followed_the_match),
        cmocka_unit_test(ngram_prefers_the_longest_then_the_latest),
        cmocka_unit_test(ngram_repeats_a_period_past_the_known_tokens),
        cmocka_unit_test(ngram_without_a_match_guesses_nothing),
        cmocka_unit_test(ngram_equals_the_oracle_on_random_sequences),
        cmocka_unit_test(controller_grows_shrinks_and_pauses),
        cmocka_unit_test(controller_stays_off_in_a_big_batch_or_when_off),
        cmocka_unit_test(mode_names_round_trip),
        cmocka_unit_test(verify_rows_equal_single_steps_with_rollbacks),
        cmocka_unit_test(verify_needs_the_invariant_kernel),
        cmocka_unit_test(draft_guesses_are_the_greedy_chain_batched_chunked_and_incremental),
        cmocka_unit_test(draft_model_of_another_vocabulary_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
