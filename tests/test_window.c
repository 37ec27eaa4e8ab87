/* KV memory that matches what the model needs (forward.h, tp_fwd_kv_stats):
 * a sliding layer's keys and values behind every future query's window
 * are let go, and a DeltaNet layer keeps none.
 *
 * The reference is the same forward keeping every position of every layer
 * (tp_forward_keep_windows_for_tests: the pool as it was before window
 * parts). Jobs on random gemma3 and gpt-oss models run prompts of several
 * times the window and decode past it, prefilled in chunks of several
 * sizes, three jobs batched in every step, on 1 and 2 threads, f32 and f16
 * KV: every logit equals the reference's bit for bit, while the memory a
 * sequence holds stays within the window's bound (and under the
 * reference's). A verify step and its rollback on such a sequence equal
 * the reference's; a step further back than the rule keeps is refused. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/forward.h"
#include "support/greedy.h"
#include "support/model_files.h"

void tp_forward_split_all_for_tests(tp_forward *f);
int tp_forward_keep_windows_for_tests(tp_forward *f, tp_err *err);

#define NJOBS 3
#define PLEN 120   /* prompt: six windows of 20, thirty of 4 */
#define DEC 40     /* decode steps past the prompt */
#define MAX_POS 176
#define STEP_TOKENS 88 /* the chunks of one step: 48 + 1 + 33 */

static tp_model *model(tp_synth_gguf o, const char *shape) { return synth_model_load(o, shape, 5); }

static tp_forward *new_fwd(const tp_model *m, int slots, int step_tokens, bool keep, tp_kv_type kv, int threads)
{
    tp_forward *f;
    tp_err e;
    if (tp_forward_new(m, slots, MAX_POS, step_tokens, &f, &e) ||
        (keep && tp_forward_keep_windows_for_tests(f, &e)) || tp_forward_set_kv_type(f, kv, &e) ||
        tp_forward_set_threads(f, threads, &e))
        fail_msg("forward: %s", e.msg);
    if (threads > 1)
        tp_forward_split_all_for_tests(f);
    return f;
}

/* The logits after the prompt and after each of DEC greedy tokens: [DEC + 1][vocab]. */
typedef struct job {
    int prompt[PLEN], toks[DEC + 1];
    float *rows;
    int seq, pos, chunk, last_n;
} job;

/* The parts a sequence whose last step fed n tokens may keep (forward.c's
 * window rule): its window before the step's first query and the step,
 * over whole pages. */
static size_t part_bound(int n, int window) { return (size_t)((n + window - 2) / 16 + 2); }

static void check_held(tp_forward *f, const job *j, const char *what)
{
    tp_fwd_kv_stats st;
    tp_forward_kv_stats(f, &st);
    int len = tp_forward_seq_length(f, j->seq);
    size_t pages = (size_t)(len + 15) / 16, got = tp_forward_seq_kv_bytes(f, j->seq);
    size_t most = pages * st.page_bytes + part_bound(j->last_n, st.window) * st.part_bytes;
    if (got > most)
        fail_msg("%s: a sequence of %d positions (last step %d tokens) holds %zu bytes of KV, more than its "
                 "pages and window allow (%zu)", what, len, j->last_n, got, most);
}

/* The jobs on f, all in every step: prompts in chunks of each job's
 * chunk (the step's tokens within step_tokens), then DEC decode steps
 * together, the memory bound checked after every step. */
static void run_jobs(tp_forward *f, job *jobs, int n_jobs, int vocab, const char *what)
{
    tp_err e;
    for (int i = 0; i < n_jobs; i++) {
        assert_int_equal(tp_forward_seq_open(f, &jobs[i].seq, &e), 0);
        jobs[i].pos = 0;
    }
    tp_fwd_item it[NJOBS];
    float *logits = malloc(sizeof(float) * NJOBS * (size_t)vocab);
    for (int done = 0; done < n_jobs;) {
        int n = 0, row[NJOBS];
        for (int i = 0; i < n_jobs; i++) {
            job *j = &jobs[i];
            if (j->pos == PLEN)
                continue;
            int nt = PLEN - j->pos < j->chunk ? PLEN - j->pos : j->chunk;
            row[n] = i;
            it[n++] = (tp_fwd_item){j->seq, j->pos, j->prompt + j->pos, nt, j->pos + nt < PLEN};
            j->pos += nt;
            j->last_n = nt;
            done += j->pos == PLEN;
        }
        if (tp_forward_step(f, it, n, logits, &e))
            fail_msg("%s: prefill: %s", what, e.msg);
        for (int k = 0; k < n; k++) {
            job *j = &jobs[row[k]];
            if (j->pos == PLEN)
                memcpy(j->rows, logits + (size_t)k * vocab, sizeof(float) * (size_t)vocab);
            check_held(f, j, what);
        }
    }
    for (int d = 0; d <= DEC; d++) {
        for (int i = 0; i < n_jobs; i++) {
            job *j = &jobs[i];
            j->toks[d] = argmax(j->rows + (size_t)d * vocab, vocab);
            it[i] = (tp_fwd_item){j->seq, PLEN + d, &j->toks[d], 1, false};
            j->last_n = 1;
        }
        if (d == DEC)
            break;
        if (tp_forward_step(f, it, n_jobs, logits, &e))
            fail_msg("%s: decode %d: %s", what, d, e.msg);
        for (int i = 0; i < n_jobs; i++) {
            memcpy(jobs[i].rows + (size_t)(d + 1) * vocab, logits + (size_t)i * vocab, sizeof(float) * (size_t)vocab);
            check_held(f, &jobs[i], what);
        }
    }
    free(logits);
}

/* Every job of a forward with window parts (chunks 7, 16, 20, the prefix
 * cache on, then 48, 1, 33 without it; on 1 and 2 threads, f32 and f16) equals the same job alone on a
 * forward keeping every position, prompt whole; and holds less. */
static void check_model(const tp_model *m, const char *name)
{
    const tp_model_config *c = tp_model_get_config(m);
    int vocab = c->vocab_size;
    assert_true(PLEN > 2 * c->swa_window);
    const int chunks[2][NJOBS] = {{7, 16, 20}, {48, 1, 33}};
    for (int kv = 0; kv < 2; kv++) {
        tp_kv_type kt = kv ? TP_KV_F16 : TP_KV_F32;
        job want[NJOBS], got[NJOBS];
        size_t kept_bytes = 0;
        for (int i = 0; i < NJOBS; i++) {
            want[i].rows = malloc(sizeof(float) * (DEC + 1) * (size_t)vocab);
            seeded_prompt(want[i].prompt, PLEN, 31 + (unsigned)i, vocab);
            want[i].chunk = PLEN;
            tp_forward *ref = new_fwd(m, 1, PLEN, true, kt, 1);
            run_jobs(ref, &want[i], 1, vocab, "reference");
            kept_bytes = tp_forward_seq_kv_bytes(ref, want[i].seq);
            tp_forward_free(ref);
        }
        for (int pass = 0; pass < 2; pass++) {
            char what[160];
            snprintf(what, sizeof what, "%s, kv %s, chunks %d/%d/%d, %d thread(s), cache %s", name,
                     tp_kv_type_name(kt), chunks[pass][0], chunks[pass][1], chunks[pass][2], pass + 1,
                     pass ? "off" : "on");
            tp_forward *f = new_fwd(m, NJOBS, STEP_TOKENS, false, kt, pass + 1);
            tp_err e;
            /* without the cache a part let go is free at once, and taken
             * again by the next page (a read of it would see other bytes) */
            if (pass == 1 && tp_forward_set_prefix_cache(f, false, 0, &e))
                fail_msg("%s", e.msg);
            tp_fwd_kv_stats st;
            tp_forward_kv_stats(f, &st);
            assert_int_equal(st.window, c->swa_window);
            assert_true(st.part_bytes > 0 && st.parts_total < st.pages_total);
            for (int i = 0; i < NJOBS; i++) {
                memcpy(got[i].prompt, want[i].prompt, sizeof got[i].prompt);
                got[i].chunk = chunks[pass][i];
                got[i].rows = malloc(sizeof(float) * (DEC + 1) * (size_t)vocab);
            }
            run_jobs(f, got, NJOBS, vocab, what);
            for (int i = 0; i < NJOBS; i++) {
                for (int d = 0; d <= DEC; d++)
                    if (memcmp(got[i].rows + (size_t)d * vocab, want[i].rows + (size_t)d * vocab,
                               sizeof(float) * (size_t)vocab))
                        fail_msg("%s: job %d: logits after %d decode steps differ from keeping every position",
                                 what, i, d);
                assert_memory_equal(got[i].toks, want[i].toks, sizeof got[i].toks);
                size_t held = tp_forward_seq_kv_bytes(f, got[i].seq);
                if (held >= kept_bytes)
                    fail_msg("%s: job %d holds %zu bytes, keeping every position %zu", what, i, held, kept_bytes);
            }
            tp_forward_kv_stats(f, &st);
            assert_true(st.parts_held <= NJOBS * part_bound(1, c->swa_window));
            for (int i = 0; i < NJOBS; i++) {
                tp_forward_seq_close(f, got[i].seq);
                free(got[i].rows);
            }
            tp_forward_kv_stats(f, &st);
            assert_int_equal(st.parts_held, 0);
            assert_int_equal(st.held_bytes, 0);
            tp_forward_free(f);
        }
        for (int i = 0; i < NJOBS; i++)
            free(want[i].rows);
    }
}

/* gemma3, six blocks: 0-4 slide with a window of 20 (not a whole number
 * of pages), block 5 sees everything. */
static void gemma3_lets_go_of_pages_behind_the_window_and_gives_the_same_logits(void **state)
{
    (void)state;
    tp_model *m = model((tp_synth_gguf){.arch = "gemma3", .head_dim = 32, .sliding_window = 20}, "64x6x4x2");
    check_model(m, "gemma3 window 20");
    tp_model_free(m);
}

/* gpt-oss: block 0 slides with a window of 4, block 1 sees everything;
 * sinks, experts. */
static void gpt_oss_lets_go_of_pages_behind_the_window_and_gives_the_same_logits(void **state)
{
    (void)state;
    tp_model *m = model((tp_synth_gguf){.arch = "gpt-oss", .head_dim = 32, .n_expert = 8, .n_expert_used = 3,
                                        .expert_ff = 64, .sliding_window = 4},
                        "64x2x4x2");
    check_model(m, "gpt-oss window 4");
    tp_model_free(m);
}

/* A verify step of 5 tokens past twice the window, rolled back to 2 of
 * them, then decoded on: the same rows as keeping every position. A step
 * or a truncate back past the window of the last step's start is
 * refused; back to 0 starts anew, as a cold run. */
static void verify_rollback_stays_within_the_window_and_farther_back_is_refused(void **state)
{
    (void)state;
    tp_model *m = model((tp_synth_gguf){.arch = "gemma3", .head_dim = 32, .sliding_window = 20}, "64x6x4x2");
    int vocab = tp_model_get_config(m)->vocab_size;
    int prompt[PLEN];
    seeded_prompt(prompt, PLEN, 77, vocab);
    float *rows[2], *out[2];
    for (int k = 0; k < 2; k++) {
        rows[k] = malloc(sizeof(float) * 5 * (size_t)vocab);
        out[k] = malloc(sizeof(float) * 4 * (size_t)vocab);
    }
    tp_err e;
    for (int k = 0; k < 2; k++) { /* k 0: the reference keeping every position */
        tp_forward *f = new_fwd(m, 1, PLEN, k == 0, TP_KV_F32, 1);
        int s;
        assert_int_equal(tp_forward_seq_open(f, &s, &e), 0);
        tp_fwd_item it = {s, 0, prompt, 100, true};
        assert_int_equal(tp_forward_step(f, &it, 1, NULL, &e), 0);
        float *const all[1] = {rows[k]};
        tp_fwd_item v = {s, 100, prompt + 100, 5, false};
        assert_int_equal(tp_forward_step_verify(f, &v, 1, NULL, all, &e), 0);
        assert_int_equal(tp_forward_seq_truncate(f, s, 102), 0);
        for (int d = 0; d < 3; d++) {
            tp_fwd_item it1 = {s, 102 + d, prompt + 110 + d, 1, false};
            assert_int_equal(tp_forward_step(f, &it1, 1, out[k] + (size_t)d * vocab, &e), 0);
        }
        if (k == 1) {
            /* the last step started at 104: its window reaches back to 85,
             * page 5; pages 0-4 let their parts go */
            tp_fwd_item back = {s, 60, prompt + 60, 1, false};
            assert_int_equal(tp_forward_step(f, &back, 1, out[k] + 3 * (size_t)vocab, &e), TP_EINVAL);
            assert_non_null(strstr(e.msg, "sliding layers"));
            assert_int_equal(tp_forward_seq_truncate(f, s, 60), TP_EINVAL);
            assert_int_equal(tp_forward_seq_truncate(f, s, 104), 0); /* the last step's start */
            assert_int_equal(tp_forward_seq_truncate(f, s, 0), 0);
            tp_fwd_item again = {s, 0, prompt, 100, false};
            assert_int_equal(tp_forward_step(f, &again, 1, out[k] + 3 * (size_t)vocab, &e), 0);
        } else {
            assert_int_equal(tp_forward_seq_truncate(f, s, 0), 0);
            tp_fwd_item again = {s, 0, prompt, 100, false};
            assert_int_equal(tp_forward_step(f, &again, 1, out[k] + 3 * (size_t)vocab, &e), 0);
        }
        tp_forward_free(f);
    }
    assert_memory_equal(rows[0], rows[1], sizeof(float) * 5 * (size_t)vocab);
    assert_memory_equal(out[0], out[1], sizeof(float) * 4 * (size_t)vocab);
    for (int k = 0; k < 2; k++) {
        free(rows[k]);
        free(out[k]);
    }
    tp_model_free(m);
}

/* qwen35 (blocks 0-2 Gated DeltaNet, 3 attention): a page holds block 3's
 * keys and values only, a quarter of a dense qwen3 of the same shape; a
 * sequence holds its pages and nothing for the DeltaNet blocks. */
static void qwen35_keeps_kv_only_for_its_attention_layers(void **state)
{
    (void)state;
    tp_model *hy = model((tp_synth_gguf){.arch = "qwen35", .head_dim = 32}, "64x4x4x2");
    tp_model *dense = model((tp_synth_gguf){.arch = "qwen3", .head_dim = 32}, "64x4x4x2");
    const tp_model_config *c = tp_model_get_config(hy);
    assert_int_equal(c->kv_dim, tp_model_get_config(dense)->kv_dim);
    tp_forward *fh = new_fwd(hy, 2, PLEN, false, TP_KV_F32, 1), *fd = new_fwd(dense, 2, PLEN, false, TP_KV_F32, 1);
    tp_fwd_kv_stats sh, sd;
    tp_forward_kv_stats(fh, &sh);
    tp_forward_kv_stats(fd, &sd);
    size_t one_layer = 2 * sizeof(float) * 16 * (size_t)c->kv_dim;
    assert_int_equal(sh.page_bytes, one_layer); /* the one attention block */
    assert_int_equal(sd.page_bytes, 4 * one_layer);
    assert_int_equal(sh.part_bytes, 0);
    assert_int_equal(sh.window, 0);
    assert_int_equal(tp_forward_page_bytes(fh), one_layer);
    assert_int_equal(sh.pool_bytes * 4, sd.pool_bytes);
    int prompt[PLEN], s;
    seeded_prompt(prompt, PLEN, 5, c->vocab_size);
    tp_err e;
    assert_int_equal(tp_forward_seq_open(fh, &s, &e), 0);
    tp_fwd_item it = {s, 0, prompt, 100, true};
    assert_int_equal(tp_forward_step(fh, &it, 1, NULL, &e), 0);
    assert_int_equal(tp_forward_seq_kv_bytes(fh, s), 7 * one_layer);
    tp_forward_kv_stats(fh, &sh);
    assert_int_equal(sh.held_bytes, 7 * one_layer);
    tp_forward_free(fh);
    tp_forward_free(fd);
    tp_model_free(hy);
    tp_model_free(dense);
}

/* A window as long as the slot (or longer): nothing to let go, no parts. */
static void a_window_the_slot_cannot_outgrow_keeps_the_page_whole(void **state)
{
    (void)state;
    tp_model *m = model((tp_synth_gguf){.arch = "gemma3", .head_dim = 32, .sliding_window = MAX_POS}, "64x6x4x2");
    tp_forward *f = new_fwd(m, 1, 16, false, TP_KV_F32, 1);
    tp_fwd_kv_stats st;
    tp_forward_kv_stats(f, &st);
    assert_int_equal(st.window, 0);
    assert_int_equal(st.part_bytes, 0);
    assert_int_equal(st.page_bytes, 2 * sizeof(float) * 16 * 6 * (size_t)tp_model_get_config(m)->kv_dim);
    tp_forward_free(f);
    tp_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gemma3_lets_go_of_pages_behind_the_window_and_gives_the_same_logits),
        cmocka_unit_test(gpt_oss_lets_go_of_pages_behind_the_window_and_gives_the_same_logits),
        cmocka_unit_test(verify_rollback_stays_within_the_window_and_farther_back_is_refused),
        cmocka_unit_test(qwen35_keeps_kv_only_for_its_attention_layers),
        cmocka_unit_test(a_window_the_slot_cannot_outgrow_keeps_the_page_whole),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
