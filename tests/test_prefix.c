/* Prefix cache of the forward pass (tp_forward_seq_reuse, prefix_cache.h):
 * a sequence that takes cached pages gets logits bit-identical to one
 * computed from scratch by a forward with the cache off, for every weight
 * type, both KV types, 1 and 2 threads, the scalar path, any chunking and
 * any order of jobs; hits are exactly the whole pages shared; rewinds into
 * shared pages and eviction under pressure change nothing but the time. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tokpipe/forward.h"
#include "tokpipe/synth.h"
#include "tokpipe/stage.h"
#include "../workers/forward/prefix_cache.h"
#include "support/greedy.h"
#include "support/model_files.h"

void tp_forward_use_scalar_for_tests(tp_forward *f);
void tp_forward_split_all_for_tests(tp_forward *f);

#define GEN 12       /* greedy tokens generated per job */
#define MAXLEN 200   /* prompt + generated */

static tp_model *load_real(const char *name)
{
    const char *dir = getenv("TP_MODELS");
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir ? dir : "../shared/models", name);
    tp_model *m = NULL;
    tp_err e;
    if (tp_model_load(path, &m, &e))
        fail_msg("cannot load %s: %s", path, e.msg);
    return m;
}

/* What a job saw: the logits after its prompt and after each generated
 * token (greedy), and the tokens. */
typedef struct job_out {
    float *logits; /* [GEN][vocab] */
    int toks[GEN];
    int hit;       /* positions taken from the cache */
} job_out;

static void job_out_free(job_out *o) { free(o->logits); }

/* Run a greedy job on f: the prompt fed in chunks of `chunk` tokens (each
 * offered to the cache first when reuse), then GEN - 1 decode steps. The
 * sequence stays open when keep_open (its id in *seq_out). */
static job_out run_job(tp_forward *f, const int *prompt, int n, int chunk, bool reuse, bool keep_open, int *seq_out)
{
    int vocab = tp_model_get_config(tp_forward_model(f))->vocab_size;
    job_out o = {.logits = malloc((size_t)GEN * (size_t)vocab * sizeof(float))};
    assert_non_null(o.logits);
    int seq;
    tp_err e;
    assert_int_equal(tp_forward_seq_open(f, &seq, &e), 0);
    int pos = 0;
    while (pos < n) {
        int nt = n - pos < chunk ? n - pos : chunk;
        bool last = pos + nt == n;
        if (reuse) {
            int got = tp_forward_seq_reuse(f, seq, pos, prompt + pos, nt, last);
            o.hit += got;
            pos += got;
            nt -= got;
            if (!nt)
                continue;
        }
        tp_fwd_item it = {seq, pos, prompt + pos, nt, !last};
        if (tp_forward_step(f, &it, 1, o.logits, &e))
            fail_msg("prefill at %d: %s", pos, e.msg);
        pos += nt;
    }
    for (int g = 0; g < GEN; g++) {
        float *row = o.logits + (size_t)g * vocab;
        o.toks[g] = argmax(row, vocab);
        if (g + 1 == GEN)
            break;
        tp_fwd_item it = {seq, n + g, &o.toks[g], 1, false};
        if (tp_forward_step(f, &it, 1, o.logits + (size_t)(g + 1) * vocab, &e))
            fail_msg("decode %d: %s", g, e.msg);
    }
    if (keep_open)
        *seq_out = seq;
    else
        tp_forward_seq_close(f, seq);
    return o;
}

static tp_forward *new_fwd(const tp_model *m, int slots, int max_pos, tp_kv_type kv, int threads, bool scalar,
                           bool cache)
{
    tp_forward *f;
    tp_err e;
    if (tp_forward_new(m, slots, max_pos, 256, &f, &e))
        fail_msg("tp_forward_new: %s", e.msg);
    assert_int_equal(tp_forward_set_kv_type(f, kv, &e), 0);
    assert_int_equal(tp_forward_set_threads(f, threads, &e), 0);
    if (!cache)
        assert_int_equal(tp_forward_set_prefix_cache(f, false, 0, &e), 0);
    if (scalar)
        tp_forward_use_scalar_for_tests(f);
    if (threads > 1)
        tp_forward_split_all_for_tests(f);
    return f;
}

static void assert_same_job(const job_out *got, const job_out *want, int vocab, const char *what)
{
    for (int g = 0; g < GEN; g++)
        if (memcmp(got->logits + (size_t)g * vocab, want->logits + (size_t)g * vocab, (size_t)vocab * sizeof(float)))
            fail_msg("%s: logits after token %d differ from the uncached run", what, g);
    assert_memory_equal(got->toks, want->toks, sizeof got->toks);
}

/* The reference: the same prompt on a forward without a cache, one chunk. */
static job_out reference(const tp_model *m, tp_kv_type kv, const int *prompt, int n)
{
    tp_forward *f = new_fwd(m, 1, MAXLEN + 16, kv, 1, false, false);
    job_out o = run_job(f, prompt, n, n, false, false, NULL);
    tp_forward_free(f);
    return o;
}

/* Jobs sharing prefixes in several orders on one forward with the cache:
 * each equals the reference, and each hit is the shared whole pages. */
static void check_loaded(tp_model *m, const char *file, tp_kv_type kv, int threads, bool scalar)
{
    int vocab = tp_model_get_config(m)->vocab_size;
    char what[256];
    int base[MAXLEN], other[MAXLEN];
    seeded_prompt(base, 150, 11, vocab);
    memcpy(other, base, sizeof other);
    seeded_prompt(other + 37, 100, 12, vocab); /* shares 37 tokens: 2 pages */
    struct {
        const int *p;
        int n, chunk, want_hit;
    } seq[] = {
        {base, 100, 100, 0},   /* cold */
        {base, 100, 16, 96},   /* equal prompt: all pages but the one holding the last token */
        {base, 150, 32, 96},   /* extends it: the first prompt's 6 full pages */
        {base, 40, 40, 32},    /* a prefix of both: its 2 full pages before the last token */
        {other, 120, 128, 32}, /* diverges inside page 2 (token 37): pages 0 and 1 */
        /* chunks of 5 end inside pages: the partly computed page 0 is
         * swapped for the cached one at position 15 (1 token taken), page 1
         * at 30 (2 taken); page 2 would leave no last token to compute */
        {base, 40, 5, 3},
        {base, 150, 150, 144}, /* the third job's 150 + its generated tokens were cached */
    };
    tp_forward *f = new_fwd(m, 2, MAXLEN + 16, kv, threads, scalar, true);
    for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
        job_out want = reference(m, kv, seq[i].p, seq[i].n);
        job_out got = run_job(f, seq[i].p, seq[i].n, seq[i].chunk, true, false, NULL);
        snprintf(what, sizeof what, "%s kv %s, %d thread(s)%s, job %zu", file, tp_kv_type_name(kv), threads,
                 scalar ? " scalar" : "", i);
        assert_same_job(&got, &want, vocab, what);
        if (got.hit != seq[i].want_hit)
            fail_msg("%s: %d tokens from the cache, want %d", what, got.hit, seq[i].want_hit);
        job_out_free(&want);
        job_out_free(&got);
    }
    tp_fwd_prefix_stats st;
    tp_forward_prefix_stats(f, &st);
    assert_true(st.enabled);
    assert_int_equal(st.hit_tokens, 96 + 96 + 32 + 32 + 3 + 144);
    assert_int_equal(st.page_tokens, TP_KV_PAGE);
    assert_true(st.pages_cached > 0 && st.pages_used == 0);
    tp_forward_free(f);
}

static void check_model(const char *file, tp_kv_type kv, int threads, bool scalar)
{
    tp_model *m = load_real(file);
    check_loaded(m, file, kv, threads, scalar);
    tp_model_free(m);
}

/* A random gemma3 (mkmodel's writer) of six blocks, five of them sliding
 * with a window of 20 (not a whole number of pages). */
static tp_model *gemma3_window_20(void)
{
    return synth_model_load((tp_synth_gguf){.arch = "gemma3", .head_dim = 32, .sliding_window = 20}, "64x6x4x2", 3);
}

/* gemma3_window_20: a restored prefix
 * gives what a cold run computes though its jobs outgrow the window many
 * times. */
static void reuse_is_bitwise_exact_with_sliding_windows(void **state)
{
    (void)state;
    tp_model *m = gemma3_window_20();
    assert_int_equal(tp_model_get_config(m)->swa_window, 20);
    check_loaded(m, "gemma3 window 20", TP_KV_F32, 1, false);
    check_loaded(m, "gemma3 window 20", TP_KV_F16, 2, false);
    check_loaded(m, "gemma3 window 20", TP_KV_F32, 1, true);
    tp_model_free(m);
}

/* Sliding layers' window parts (forward.h, tp_fwd_kv_stats): a random
 * gemma3 (window 20) on steps of 16 tokens, so a slot keeps 4 parts and
 * the pool has 8 for 2 slots. A prompt run again takes its cached pages,
 * whose window parts the cache kept; after a flood of other jobs took
 * that memory, the pages are still cached but their parts are gone, and
 * the hit is cut to where the next query's window has them (here: none).
 * The prompt computed again gives its parts back to the cached pages. With
 * extra pages the cache keeps enough parts and the hit is whole. Every job
 * equals a cold run bit for bit. */
static void hits_on_sliding_layers_end_where_their_window_parts_are_kept(void **state)
{
    (void)state;
    tp_model *m = gemma3_window_20();
    tp_err e;
    int vocab = tp_model_get_config(m)->vocab_size;
    int base[MAXLEN], flood[MAXLEN];
    seeded_prompt(base, 100, 11, vocab);
    seeded_prompt(flood, 150, 12, vocab);
    job_out want = reference(m, TP_KV_F32, base, 100), wflood = reference(m, TP_KV_F32, flood, 150);
    for (int extra = 0; extra <= 40; extra += 40) {
        tp_forward *f;
        if (tp_forward_new(m, 2, MAXLEN + 16, 16, &f, &e) || tp_forward_set_prefix_cache(f, true, extra, &e))
            fail_msg("%s", e.msg);
        tp_fwd_kv_stats ks;
        tp_forward_kv_stats(f, &ks);
        assert_int_equal(ks.parts_total, 2 * 4 + extra);
        struct {
            const int *p;
            int n, want_hit, want_hit_extra;
            const job_out *ref;
        } jobs[] = {
            {base, 100, 0, 0, &want},
            {base, 100, 96, 96, &want},  /* blocks 4 and 5 (positions 77..95) kept their parts */
            {flood, 150, 0, 0, &wflood}, /* 10 parts' worth: every part of base's is taken */
            {base, 100, 0, 96, &want},   /* cut: the window of every page end lost its parts */
            {base, 100, 96, 96, &want},  /* the run before gave them back */
        };
        for (size_t i = 0; i < sizeof jobs / sizeof jobs[0]; i++) {
            char what[128];
            snprintf(what, sizeof what, "gemma3 window 20, %d extra pages, job %zu", extra, i);
            job_out got = run_job(f, jobs[i].p, jobs[i].n, 16, true, false, NULL);
            assert_same_job(&got, jobs[i].ref, vocab, what);
            int wh = extra ? jobs[i].want_hit_extra : jobs[i].want_hit;
            if (got.hit != wh)
                fail_msg("%s: %d tokens from the cache, want %d", what, got.hit, wh);
            job_out_free(&got);
        }
        tp_forward_kv_stats(f, &ks);
        assert_int_equal(ks.parts_held, 0);
        tp_forward_free(f);
    }
    job_out_free(&want);
    job_out_free(&wflood);
    tp_model_free(m);
}

/* A hybrid model's prefix hit must end at a page whose DeltaNet state was
 * kept: a step keeps the state after the last page boundary it crosses.
 * Each job equals a cold run bit for bit, and takes what was kept. */
static void check_hybrid(tp_model *m, tp_kv_type kv, int threads, bool scalar)
{
    int vocab = tp_model_get_config(m)->vocab_size;
    char what[256];
    int base[MAXLEN], other[MAXLEN];
    seeded_prompt(base, 150, 11, vocab);
    memcpy(other, base, sizeof other);
    seeded_prompt(other + 37, 100, 12, vocab); /* shares 37 tokens */
    struct {
        const int *p;
        int n, chunk, want_hit;
    } seq[] = {
        {base, 100, 100, 0},   /* cold: keeps the state at 96 (page 5) only */
        /* chunks of 16, each offered alone: pages 0-4 have no state, so
         * they are computed (each step keeping its end's); page 5 has one */
        {base, 100, 16, 16},
        {base, 40, 40, 32},    /* pages 0 and 1, restored at 32 */
        {other, 120, 128, 32}, /* diverges in page 2: the state at 32 */
        {base, 150, 150, 96},  /* pages 0-5 (page 6 was filled by generated tokens) */
    };
    tp_forward *f = new_fwd(m, 2, MAXLEN + 16, kv, threads, scalar, true);
    for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
        job_out want = reference(m, kv, seq[i].p, seq[i].n);
        job_out got = run_job(f, seq[i].p, seq[i].n, seq[i].chunk, true, false, NULL);
        snprintf(what, sizeof what, "qwen35 kv %s, %d thread(s)%s, job %zu", tp_kv_type_name(kv), threads,
                 scalar ? " scalar" : "", i);
        assert_same_job(&got, &want, vocab, what);
        if (got.hit != seq[i].want_hit)
            fail_msg("%s: %d tokens from the cache, want %d", what, got.hit, seq[i].want_hit);
        job_out_free(&want);
        job_out_free(&got);
    }
    tp_forward_free(f);
}

/* A random qwen35 of eight blocks, six Gated DeltaNet: a restored prefix
 * restores their conv and recurrent state at the page where the hit ends,
 * exactly. */
static void reuse_is_bitwise_exact_with_deltanet_state(void **state)
{
    (void)state;
    tp_model *m = synth_model_load((tp_synth_gguf){.arch = "qwen35", .head_dim = 32}, "64x8x4x2", 3);
    check_hybrid(m, TP_KV_F32, 1, false);
    check_hybrid(m, TP_KV_F16, 2, false);
    check_hybrid(m, TP_KV_F32, 1, true);
    tp_model_free(m);
}

static void reuse_is_bitwise_exact_on_stories260k_f32(void **state)
{
    (void)state;
    check_model("stories260K.bin", TP_KV_F32, 1, false);
    check_model("stories260K.bin", TP_KV_F16, 1, false);
    check_model("stories260K.bin", TP_KV_F32, 2, false);
    check_model("stories260K.bin", TP_KV_F32, 1, true);
    check_model("stories260K.bin", TP_KV_F16, 1, true);
}

static void reuse_is_bitwise_exact_on_every_gguf_weight_type(void **state)
{
    (void)state;
    const char *files[] = {"gguf-quant/stories260K-f16.gguf", "gguf-quant/stories260K-q8_0.gguf",
                           "gguf-quant/stories260K-q4_0.gguf", "stories260K.gguf"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        check_model(files[i], TP_KV_F32, 1, false);
        check_model(files[i], TP_KV_F16, 2, false);
    }
}

/* Two running sequences share pages (one computed them, the other took
 * them); the first then rewinds into a shared page (a retry), which must
 * copy it, not write it: the second's logits stay exact. */
static void running_jobs_share_pages_and_a_rewind_copies_instead_of_writing(void **state)
{
    (void)state;
    tp_model *m = load_real("stories260K.bin");
    int vocab = tp_model_get_config(m)->vocab_size;
    int p[MAXLEN];
    seeded_prompt(p, 90, 21, vocab);
    tp_forward *f = new_fwd(m, 3, MAXLEN + 16, TP_KV_F32, 1, false, true);
    int a, b;
    job_out ja = run_job(f, p, 90, 64, true, true, &a);
    tp_fwd_prefix_stats before;
    tp_forward_prefix_stats(f, &before);
    job_out jb = run_job(f, p, 90, 90, true, true, &b);
    assert_int_equal(jb.hit, 80);
    tp_fwd_prefix_stats st;
    tp_forward_prefix_stats(f, &st);
    /* b holds a's 5 prompt pages by reference: only its own last pages are new */
    assert_true(st.pages_used < before.pages_used + 5);
    /* a rewinds to position 40 (inside shared page 2) with other tokens */
    int alt[8] = {5, 6, 7, 8, 9, 10, 11, 12};
    float *lg = malloc((size_t)vocab * sizeof(float));
    tp_err e;
    tp_fwd_item it = {a, 40, alt, 8, false};
    assert_int_equal(tp_forward_step(f, &it, 1, lg, &e), 0);
    /* b goes on: its next logits equal a fresh uncached run of its tokens */
    int full[MAXLEN];
    memcpy(full, p, 90 * sizeof(int));
    memcpy(full + 90, jb.toks, (GEN - 1) * sizeof(int));
    int nb = 90 + GEN - 1;
    tp_fwd_item ib = {b, nb, &jb.toks[GEN - 1], 1, false};
    assert_int_equal(tp_forward_step(f, &ib, 1, lg, &e), 0);
    full[nb] = jb.toks[GEN - 1];
    job_out want = reference(m, TP_KV_F32, full, nb + 1);
    assert_memory_equal(lg, want.logits, (size_t)vocab * sizeof(float));
    /* and a's rewound sequence equals an uncached run of its new tokens */
    int ra[48];
    memcpy(ra, p, 40 * sizeof(int));
    memcpy(ra + 40, alt, sizeof alt);
    job_out wa = reference(m, TP_KV_F32, ra, 48);
    tp_fwd_item ia = {a, 40, alt, 8, false};
    assert_int_equal(tp_forward_step(f, &ia, 1, lg, &e), 0);
    assert_memory_equal(lg, wa.logits, (size_t)vocab * sizeof(float));
    free(lg);
    job_out_free(&ja);
    job_out_free(&jb);
    job_out_free(&want);
    job_out_free(&wa);
    tp_forward_free(f);
    tp_model_free(m);
}

/* A pool of 2 slots of 128 positions (16 pages) and a flood of distinct
 * prompts: cached pages are evicted for new ones, the pool never grows,
 * and a prompt cached before the flood but evicted by it is computed again
 * with the same bits. */
static void eviction_under_pressure_keeps_the_pool_bounded_and_results_exact(void **state)
{
    (void)state;
    tp_model *m = load_real("stories260K.bin");
    int vocab = tp_model_get_config(m)->vocab_size;
    tp_forward *f = new_fwd(m, 2, 128, TP_KV_F32, 1, false, true);
    int p[MAXLEN];
    seeded_prompt(p, 70, 100, vocab);
    job_out first = run_job(f, p, 70, 70, true, false, NULL);
    job_out again = run_job(f, p, 70, 70, true, false, NULL);
    assert_int_equal(again.hit, 64);
    for (unsigned s = 0; s < 6; s++) {
        int q[MAXLEN];
        seeded_prompt(q, 100, 200 + s, vocab);
        job_out o = run_job(f, q, 100, 100, true, false, NULL);
        job_out_free(&o);
    }
    tp_fwd_prefix_stats st;
    tp_forward_prefix_stats(f, &st);
    assert_int_equal(st.pages_total, 16);
    assert_true(st.evictions > 0);
    assert_true(st.pages_cached <= st.pages_total);
    job_out after = run_job(f, p, 70, 70, true, false, NULL);
    assert_int_equal(after.hit, 0); /* evicted by the flood */
    assert_same_job(&after, &first, vocab, "after eviction");
    assert_same_job(&again, &first, vocab, "second run");
    job_out_free(&first);
    job_out_free(&again);
    job_out_free(&after);
    tp_forward_free(f);
    tp_model_free(m);
}

/* Extra pages beyond the slots hold more of the cache; off, nothing is
 * taken; the OpenBLAS kernel (not chunk-invariant) never uses it. */
static void the_cache_can_be_sized_turned_off_and_is_unused_with_openblas(void **state)
{
    (void)state;
    tp_model *m = load_real("stories260K.bin");
    int vocab = tp_model_get_config(m)->vocab_size;
    int p[MAXLEN];
    seeded_prompt(p, 50, 5, vocab);
    tp_forward *f = new_fwd(m, 1, 64, TP_KV_F32, 1, false, false);
    job_out a = run_job(f, p, 50, 50, true, false, NULL), b = run_job(f, p, 50, 50, true, false, NULL);
    assert_int_equal(b.hit, 0);
    tp_fwd_prefix_stats st;
    tp_forward_prefix_stats(f, &st);
    assert_false(st.enabled);
    assert_int_equal(st.pages_cached, 0);
    tp_err e;
    assert_int_equal(tp_forward_set_prefix_cache(f, true, 12, &e), 0);
    tp_forward_prefix_stats(f, &st);
    assert_int_equal(st.pages_total, 4 + 12);
    assert_int_equal(tp_forward_set_prefix_cache(f, true, -1, &e), TP_EINVAL);
    int seq;
    assert_int_equal(tp_forward_seq_open(f, &seq, &e), 0);
    assert_int_equal(tp_forward_set_prefix_cache(f, false, 0, &e), TP_ESTATE);
    tp_forward_seq_close(f, seq);
    job_out c = run_job(f, p, 50, 50, true, false, NULL), d = run_job(f, p, 50, 50, true, false, NULL);
    assert_int_equal(d.hit, 48);
    assert_same_job(&d, &a, vocab, "cache sized 12 extra pages");
    if (tp_forward_set_kernel(f, TP_FWD_KERNEL_OPENBLAS, &e) == 0) {
        job_out o = run_job(f, p, 50, 50, true, false, NULL);
        assert_int_equal(o.hit, 0);
        job_out_free(&o);
    }
    job_out_free(&a);
    job_out_free(&b);
    job_out_free(&c);
    job_out_free(&d);
    tp_forward_free(f);
    tp_model_free(m);
}

/* Window parts alone: a page's part lives while claimed; let go, it stays
 * with a cached page (freed with any other) until a part is wanted, the
 * least recently released first; a publish that finds the page cached
 * hands the part over when the cached page has none. */
static void pcache_parts_stay_with_cached_pages_until_wanted(void **state)
{
    (void)state;
    tp_pcache *pc = tp_pcache_new(4, true);
    assert_non_null(pc);
    assert_int_equal(tp_pcache_set_parts(pc, 2), 0);
    int32_t k1[TP_KV_PAGE] = {1}, k2[TP_KV_PAGE] = {2};
    int a = tp_pcache_alloc(pc), b = tp_pcache_alloc(pc);
    int pa = tp_pcache_part_claim(pc, a), pb = tp_pcache_part_claim(pc, b);
    assert_true(pa >= 0 && pb >= 0 && pa != pb);
    assert_int_equal(tp_pcache_part_claim(pc, a), pa); /* a second claim, the same part */
    assert_int_equal(tp_pcache_parts_claimed(pc), 2);
    int c = tp_pcache_alloc(pc);
    assert_int_equal(tp_pcache_part_claim(pc, c), -1); /* all claimed */
    assert_int_equal(tp_pcache_publish(pc, a, -1, k1), a);
    assert_int_equal(tp_pcache_publish(pc, b, a, k2), b);
    tp_pcache_part_release(pc, a);
    tp_pcache_part_release(pc, a);
    tp_pcache_part_release(pc, b);
    assert_int_equal(tp_pcache_parts_claimed(pc), 0);
    assert_int_equal(tp_pcache_part(pc, a), pa);      /* cached: kept */
    assert_int_equal(tp_pcache_part_claim(pc, c), pa); /* released first, taken first */
    assert_int_equal(tp_pcache_part(pc, a), -1);
    assert_int_equal(tp_pcache_part(pc, b), pb);
    /* a page written again with a's key: publish finds a, which has no
     * part; the writer's part goes to a */
    tp_pcache_unref(pc, a);
    tp_pcache_unref(pc, b);
    int d = tp_pcache_alloc(pc);
    assert_int_equal(tp_pcache_part_claim(pc, d), pb);
    assert_int_equal(tp_pcache_part(pc, b), -1);
    assert_int_equal(tp_pcache_publish(pc, d, -1, k1), a);
    tp_pcache_part_move(pc, d, a);
    tp_pcache_unref(pc, d);
    assert_int_equal(tp_pcache_part(pc, a), pb);
    assert_int_equal(tp_pcache_parts_claimed(pc), 2); /* a's (moved) and c's */
    tp_pcache_part_release(pc, c);                     /* c is not cached: freed */
    tp_pcache_unref(pc, c);
    assert_int_equal(tp_pcache_parts_claimed(pc), 1);
    tp_pcache_part_release(pc, a);
    tp_pcache_unref(pc, a);
    assert_int_equal(tp_pcache_part(pc, a), pb);      /* still cached */
    tp_pcache_free(pc);
}

/* The page bookkeeping alone: keys compare exactly, only leaves nobody
 * holds are evicted, least recently used first. */
static void pcache_evicts_least_recent_unheld_leaves_only(void **state)
{
    (void)state;
    tp_pcache *pc = tp_pcache_new(3, true);
    assert_non_null(pc);
    int32_t k1[TP_KV_PAGE] = {1}, k2[TP_KV_PAGE] = {2}, k3[TP_KV_PAGE] = {3};
    int a = tp_pcache_alloc(pc), b = tp_pcache_alloc(pc), c = tp_pcache_alloc(pc);
    assert_true(a >= 0 && b >= 0 && c >= 0);
    assert_int_equal(tp_pcache_alloc(pc), -1); /* all held */
    assert_int_equal(tp_pcache_publish(pc, a, -1, k1), a);
    assert_int_equal(tp_pcache_publish(pc, b, a, k2), b);  /* child of a */
    assert_int_equal(tp_pcache_publish(pc, c, -1, k3), c);
    assert_true(tp_pcache_shared(pc, a));
    tp_pcache_unref(pc, a);
    tp_pcache_unref(pc, b);
    tp_pcache_unref(pc, c);
    assert_int_equal(tp_pcache_lookup(pc, -1, k1), a);
    assert_int_equal(tp_pcache_lookup(pc, a, k1), -1); /* wrong parent */
    assert_int_equal(tp_pcache_lookup(pc, -1, k2), -1);
    /* c is now least recent, but evict order must also skip a (has a child) */
    assert_int_equal(tp_pcache_lookup(pc, a, k2), b);
    assert_int_equal(tp_pcache_alloc(pc), c);
    assert_int_equal(tp_pcache_lookup(pc, -1, k3), -1);
    assert_int_equal(tp_pcache_alloc(pc), b);          /* the leaf before its parent */
    assert_int_equal(tp_pcache_alloc(pc), a);
    tp_pcache_stats st;
    tp_pcache_get_stats(pc, &st);
    assert_int_equal(st.evictions, 3);
    assert_int_equal(st.pages_cached, 0);
    assert_int_equal(st.pages_used, 3);
    tp_pcache_free(pc);
}

/* ---- the forward stage (STEP messages) ---------------------------------- */

typedef struct captured {
    uint32_t n, n_hits;
    uint32_t slots[8];
    int32_t hit_slots[8], hits[8];
    float *logits; /* [n][vocab] */
    size_t vocab;
} captured;

static int capture(void *ctx, const tp_msg *m)
{
    captured *c = ctx;
    assert_int_equal(m->cmd, TP_CMD_STEP_RESULT);
    if (m->status != TP_ST_OK)
        fail_msg("STEP_RESULT %u: %.*s", m->status, (int)m->error.len, m->error.ptr);
    const tp_m_step_result *r = &m->step_result;
    c->n = r->n;
    for (uint32_t i = 0; i < r->n; i++)
        c->slots[i] = tp_raw_u32(r->slots, i);
    memcpy(c->logits, r->out.data, (size_t)r->n * c->vocab * sizeof(float));
    c->n_hits = (uint32_t)r->n_cached_slots;
    for (size_t i = 0; i < r->n_cached_slots; i++) {
        c->hit_slots[i] = r->cached_slots[i];
        c->hits[i] = r->cached[i];
    }
    return 0;
}

static int ignore(void *ctx, const tp_msg *m)
{
    (void)ctx;
    (void)m;
    return 0;
}

/* Slots 0..n-1 each get the same 40-token prompt in one STEP (jobs that
 * arrived together): the first is computed, the others wait for a second
 * pass and take its 32 cached positions; every row's logits equal an
 * uncached run's. Slot 3 is a different prompt: computed as usual. */
static void twin_chunks_of_one_step_are_computed_once(void **state)
{
    (void)state;
    tp_model *m = load_real("stories260K.bin");
    int vocab = tp_model_get_config(m)->vocab_size;
    tp_forward_stage *st;
    tp_err e;
    assert_int_equal(tp_forward_stage_new(m, 4, 128, 256, 1, &st, &e), 0);
    int p[40], q[40];
    seeded_prompt(p, 40, 31, vocab);
    seeded_prompt(q, 40, 32, vocab);
    tp_stage_io quiet = {ignore, ignore, NULL};
    for (uint32_t slot = 0; slot < 4; slot++) {
        tp_msg o;
        tp_msg_init(&o, TP_FAM_WRK, TP_CMD_SEQ_OPEN);
        o.slot.slot = slot;
        assert_int_equal(tp_forward_stage_handle(st, &o, &quiet), 0);
    }
    uint32_t slots[4] = {0, 1, 2, 3}, pos[4] = {0}, ntok[4] = {40, 40, 40, 40};
    uint8_t flags[4] = {TP_ITEM_OUTPUT, TP_ITEM_OUTPUT, TP_ITEM_OUTPUT, TP_ITEM_OUTPUT};
    int32_t toks[160], acc[4] = {-1, -1, -1, -1};
    for (int i = 0; i < 40; i++)
        toks[i] = toks[40 + i] = toks[120 + i] = p[i], toks[80 + i] = q[i];
    /* order: p, p, q, p */
    tp_msg s;
    tp_msg_init(&s, TP_FAM_WRK, TP_CMD_STEP);
    s.step = (tp_m_step){.step = 1, .n = 4, .n_tokens = 160, .sample = false, .slots = {slots, 4},
                         .pos = {pos, 4}, .ntok = {ntok, 4}, .flags = {flags, 4}, .tokens = {toks, 160},
                         .accepted = {acc, 4}};
    captured c = {.logits = malloc(4 * (size_t)vocab * sizeof(float)), .vocab = (size_t)vocab};
    tp_stage_io io = {capture, ignore, &c};
    assert_int_equal(tp_forward_stage_handle(st, &s, &io), 0);
    assert_int_equal(c.n, 4);
    assert_int_equal(c.n_hits, 2); /* slots 1 and 3 took slot 0's pages */
    for (uint32_t i = 0; i < 2; i++) {
        assert_int_equal(c.hits[i], 32);
        assert_true(c.hit_slots[i] == 1 || c.hit_slots[i] == 3);
    }
    assert_int_not_equal(c.hit_slots[0], c.hit_slots[1]);
    job_out wp = reference(m, TP_KV_F32, p, 40), wq = reference(m, TP_KV_F32, q, 40);
    for (uint32_t r = 0; r < 4; r++) {
        const float *want = c.slots[r] == 2 ? wq.logits : wp.logits;
        if (memcmp(c.logits + (size_t)r * vocab, want, (size_t)vocab * sizeof(float)))
            fail_msg("slot %u: logits differ from an uncached run", c.slots[r]);
    }
    free(c.logits);
    job_out_free(&wp);
    job_out_free(&wq);
    tp_forward_stage_free(st);
    tp_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pcache_evicts_least_recent_unheld_leaves_only),
        cmocka_unit_test(pcache_parts_stay_with_cached_pages_until_wanted),
        cmocka_unit_test(reuse_is_bitwise_exact_on_stories260k_f32),
        cmocka_unit_test(reuse_is_bitwise_exact_on_every_gguf_weight_type),
        cmocka_unit_test(reuse_is_bitwise_exact_with_sliding_windows),
        cmocka_unit_test(hits_on_sliding_layers_end_where_their_window_parts_are_kept),
        cmocka_unit_test(reuse_is_bitwise_exact_with_deltanet_state),
        cmocka_unit_test(running_jobs_share_pages_and_a_rewind_copies_instead_of_writing),
        cmocka_unit_test(eviction_under_pressure_keeps_the_pool_bounded_and_results_exact),
        cmocka_unit_test(the_cache_can_be_sized_turned_off_and_is_unused_with_openblas),
        cmocka_unit_test(twin_chunks_of_one_step_are_computed_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
