/* Process story: the daemon's prefix cache. Series of jobs whose prompts
 * share prefixes (equal prompts, a prompt that is a prefix of another, one
 * that extends another, a chat turn that resends the previous answer,
 * prefixes ending inside a page), run one after the other and at once,
 * greedy and seeded, with logprobs: every job's tokens and logprobs equal
 * `tokpipe run` alone, and each sequential job's cached_tokens is exactly
 * the whole pages it shares with what earlier jobs left in the cache (the
 * test tokenizes the prompts itself). Also: f16 KV and 2 threads, one
 * micro-batch, a forward worker killed mid-series (its replacement starts
 * with an empty cache; output unchanged), eviction under pressure in a
 * tiny pool, and the cache turned off. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/daemon_harness.h"

#define PAGE 16
#define MAX_IDS 2048
#define MAX_KNOWN 64

/* What the forward worker's cache may hold: each finished job's prompt and
 * its generated tokens (all but the last surely; the last too when it was
 * fed ahead of its verdict). */
typedef struct known {
    int ids[MAX_IDS];
    int n_sure, n_maybe;
} known;

typedef struct series {
    harness h;
    const char *run_args; /* what `tokpipe run` needs to compute as the daemon does */
    known k[MAX_KNOWN];
    int n_known;
} series;

static char *sh(const char *cmd)
{
    char *out = NULL;
    int st = harness_sh(cmd, &out);
    if (st != 0)
        fail_msg("`%s` failed (status %d): %s", cmd, st, out ? out : "");
    return out;
}

static int tokenize(series *s, const char *text, int *ids)
{
    char path[256], cmd[2048];
    snprintf(path, sizeof path, "%s/prompt.txt", s->h.dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "%s\n", text);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s/tokpipe tokenize --tokenizer %s/tok512.bin --bos < %s", s->h.bin, s->h.models,
             path);
    char *out = sh(cmd), *p = out;
    int n = 0;
    for (char *end; n < MAX_IDS; p = end) {
        long v = strtol(p, &end, 10);
        if (end == p)
            break;
        ids[n++] = (int)v;
    }
    free(out);
    return n;
}

static cJSON *parse_line(const char *line, const char *what)
{
    cJSON *o = cJSON_Parse(line);
    if (!o)
        fail_msg("%s: not JSON: %s", what, line);
    return o;
}

static int num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v))
        fail_msg("no %s in %s", k, cJSON_PrintUnformatted(o));
    return v->valueint;
}

/* tokens and logprobs of got equal want's */
static void assert_same_output(const cJSON *got, const cJSON *want, const char *what)
{
    const char *keys[] = {"tokens", "logprobs"};
    for (int i = 0; i < 2; i++) {
        const cJSON *gv = cJSON_GetObjectItemCaseSensitive(got, keys[i]);
        const cJSON *wv = cJSON_GetObjectItemCaseSensitive(want, keys[i]);
        if (!gv && !wv && i == 1)
            continue;   /* no logprobs asked for */
        char *g = gv ? cJSON_PrintUnformatted(gv) : NULL, *w = wv ? cJSON_PrintUnformatted(wv) : NULL;
        if (!g || !w || strcmp(g, w))
            fail_msg("%s: %s differ from tokpipe run's\ndaemon: %s\nrun:    %s", what, keys[i], g ? g : "(none)",
                     w ? w : "(none)");
        free(g);
        free(w);
    }
}

/* Whole pages of ids[0..n) the cache holds after earlier jobs, taken as
 * the forward worker takes them: the longest shared prefix in whole pages,
 * leaving the last prompt token to compute. lo / hi: the fed-ahead last
 * token of an earlier job may or may not be cached. */
static void expected_hit(const series *s, const int *ids, int n, int *lo, int *hi)
{
    int best_sure = 0, best_maybe = 0;
    for (int j = 0; j < s->n_known; j++) {
        const known *k = &s->k[j];
        int l = 0;
        while (l < n && l < k->n_maybe && ids[l] == k->ids[l])
            l++;
        int sure = l < k->n_sure ? l : k->n_sure;
        best_sure = sure > best_sure ? sure : best_sure;
        best_maybe = l > best_maybe ? l : best_maybe;
    }
    int cap = (n - 1) / PAGE * PAGE;
    *lo = best_sure / PAGE * PAGE < cap ? best_sure / PAGE * PAGE : cap;
    *hi = best_maybe / PAGE * PAGE < cap ? best_maybe / PAGE * PAGE : cap;
}

static void remember(series *s, const int *ids, int n, const cJSON *out)
{
    assert_true(s->n_known < MAX_KNOWN);
    known *k = &s->k[s->n_known++];
    memcpy(k->ids, ids, (size_t)n * sizeof *ids);
    const cJSON *t;
    int m = n;
    cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(out, "tokens"))
        if (m < MAX_IDS)
            k->ids[m++] = t->valueint;
    k->n_maybe = m;
    k->n_sure = m > n ? m - 1 : n;
}

/* Several prompts submitted at once with options opts: each equals
 * `tokpipe run`; with one prompt (or sequential = the prompts' cached
 * counts cannot race), cached_tokens is checked exactly. Returns the last
 * job's output (caller deletes). */
static cJSON *jobs(series *s, const char *const *texts, int n, const char *opts, bool exact)
{
    char cmd[16384], runcmd[16384];
    int o = snprintf(cmd, sizeof cmd, "%s/tokpipe generate --config %s --json --timeout 60000 %s", s->h.bin,
                     s->h.config, opts);
    int r = snprintf(runcmd, sizeof runcmd, "%s/tokpipe run --model %s/stories260K.bin --tokenizer %s/tok512.bin "
                     "--json %s %s", s->h.bin, s->h.models, s->h.models, s->run_args, opts);
    for (int i = 0; i < n; i++) {
        o += snprintf(cmd + o, sizeof cmd - (size_t)o, " --prompt '%s'", texts[i]);
        r += snprintf(runcmd + r, sizeof runcmd - (size_t)r, " --prompt '%s'", texts[i]);
    }
    snprintf(runcmd + r, sizeof runcmd - (size_t)r, " 2>/dev/null");
    int lo[16], hi[16], ids[16][MAX_IDS], nids[16];
    assert_true(n <= 16);
    for (int i = 0; i < n; i++) {
        nids[i] = tokenize(s, texts[i], ids[i]);
        expected_hit(s, ids[i], nids[i], &lo[i], &hi[i]);
    }
    char *got = sh(cmd), *want = sh(runcmd);
    char *gl = got, *wl = want;
    cJSON *last = NULL;
    for (int i = 0; i < n; i++) {
        char *ge = strchr(gl, '\n'), *we = strchr(wl, '\n');
        if (!ge || !we)
            fail_msg("job %d of %d: a line is missing\ndaemon:\n%s\nrun:\n%s", i, n, got, want);
        *ge = *we = '\0';
        cJSON *g = parse_line(gl, "generate"), *w = parse_line(wl, "run");
        char what[512];
        snprintf(what, sizeof what, "prompt '%.60s...' (%s)", texts[i], opts);
        assert_same_output(g, w, what);
        int pt = num(g, "prompt_tokens"), cached = num(g, "cached_tokens");
        if (pt != nids[i])
            fail_msg("%s: prompt_tokens %d, the test's tokenizer gives %d", what, pt, nids[i]);
        assert_int_equal(num(w, "cached_tokens"), 0);
        if (cached < 0 || cached >= pt)
            fail_msg("%s: cached_tokens %d outside 0..%d", what, cached, pt - 1);
        if (exact && (cached < lo[i] || cached > hi[i]))
            fail_msg("%s: cached_tokens %d, the cache holds %d%s%d of its %d tokens", what, cached, lo[i],
                     lo[i] == hi[i] ? " = " : " .. ", hi[i], pt);
        if (!exact && cached > hi[i] && cached > (pt - 1) / PAGE * PAGE)
            fail_msg("%s: cached_tokens %d more than could be shared", what, cached);
        remember(s, ids[i], nids[i], g);
        cJSON_Delete(w);
        cJSON_Delete(last);
        last = g;
        gl = ge + 1;
        wl = we + 1;
    }
    free(got);
    free(want);
    return last;
}

static void one(series *s, const char *text, const char *opts)
{
    cJSON_Delete(jobs(s, &text, 1, opts, true));
}

static const char *const STORY =
    "Once upon a time there was a little girl named Lily. She loved to play outside in the sun with her "
    "friends. One day she saw a big red ball in the park and she wanted to play with it";
static const char *const STORY_HALF = "Once upon a time there was a little girl named Lily. She loved to play";
static const char *const OTHER = "Tom had a small boat. He liked to sail it on the lake near his house every day";

static void start(series *s, const char *yaml, const char *run_args)
{
    memset(s, 0, sizeof *s);
    s->run_args = run_args;
    /* cached_tokens are exact only while the forward worker (and its
     * cache) lives: on a loaded machine the harness's 1 s liveness can
     * drop a worker that is merely slow, so allow 10 s */
    char full[2048];
    snprintf(full, sizeof full, "%sheartbeat:\n  interval_ms: 1000\n  liveness: 10\n", yaml ? yaml : "");
    if (harness_start(&s->h, false, full))
        fail_msg("daemon did not start with %s", full);
}

/* The sequential series every configuration runs. */
static void shared_prefix_series(series *s)
{
    const char *greedy = "--temperature 0 --max-tokens 24 --logprobs --top-logprobs 2";
    const char *seeded = "--temperature 0.9 --seed 77 --max-tokens 30 --logprobs";
    one(s, STORY, greedy);          /* cold */
    one(s, STORY, greedy);          /* equal prompt */
    one(s, STORY_HALF, greedy);     /* a prefix of it (ends inside a page) */
    char longer[2048];
    snprintf(longer, sizeof longer, "%s. Her mom said she could play with it if she was careful", STORY);
    one(s, longer, seeded);         /* extends it */
    one(s, longer, seeded);         /* the same seed again: the same draws */
    one(s, OTHER, seeded);          /* nothing shared */
    /* a chat turn: the history with the previous answer, then more */
    const char *t0 = STORY;
    cJSON *a = jobs(s, &t0, 1, greedy, true);
    char turn[4096];
    snprintf(turn, sizeof turn, "%s%s And then they went home", STORY,
             cJSON_GetObjectItemCaseSensitive(a, "text")->valuestring);
    cJSON_Delete(a);
    for (char *q = turn; *q; q++)
        if (*q == '\'' || *q == '\n')   /* the shell quotes; newlines would end the tokenize line */
            *q = ' ';
    one(s, turn, greedy);
}

static void shared_prefixes_give_run_s_output_and_exact_cached_tokens(void **state)
{
    (void)state;
    series *s = calloc(1, sizeof *s);
    start(s, NULL, "");
    shared_prefix_series(s);
    /* at once: four prompts sharing a prefix, greedy; outputs exact, cached
     * counts within what could be shared */
    const char *group[] = {STORY, STORY_HALF, OTHER, STORY};
    cJSON_Delete(jobs(s, group, 4, "--temperature 0 --max-tokens 20 --logprobs", false));
    /* four equal new prompts at once: one computes, the others take its
     * pages (from the cache, or as a twin chunk of the same step) */
    const char *fresh = "Sam and his sister Mia found a shiny key under the old oak tree behind the school";
    const char *four[] = {fresh, fresh, fresh, fresh};
    int fresh_ids[MAX_IDS], nf = tokenize(s, fresh, fresh_ids);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s/tokpipe generate --config %s --json --timeout 60000 --temperature 0 --max-tokens 8 "
             "--prompt '%s' --prompt '%s' --prompt '%s' --prompt '%s'", s->h.bin, s->h.config, four[0], four[1],
             four[2], four[3]);
    char *out = sh(cmd), *line = out;
    int zero = 0, full = 0;
    for (int i = 0; i < 4; i++) {
        char *end = strchr(line, '\n');
        assert_non_null(end);
        *end = '\0';
        cJSON *g = parse_line(line, "generate");
        int c = num(g, "cached_tokens");
        zero += c == 0;
        full += c == (nf - 1) / PAGE * PAGE;
        cJSON_Delete(g);
        line = end + 1;
    }
    free(out);
    if (zero != 1 || full != 3)
        fail_msg("4 equal prompts at once: %d computed theirs, %d took the %d cached tokens (want 1 and 3)", zero,
                 full, (nf - 1) / PAGE * PAGE);
    tp_m_stats_reply st;
    assert_int_equal(harness_stats(&s->h, &st), 0);
    assert_true(st.prefix_hit_tokens > 0 && st.prefix_hit_tokens < st.prefix_prompt_tokens);
    assert_true(st.prefix_lookups > 0 && st.prefix_pages_cached > 0 && st.prefix_bytes > 0);
    assert_true(st.prefix_pages_used <= st.prefix_pages_total); /* as of the last step */
    assert_int_equal(st.prefix_pages_total, 64 * 512 / PAGE);
    assert_int_equal(harness_stop(&s->h), 0);
    free(s);
}

static void f16_kv_two_threads_one_micro_batch_equal_run(void **state)
{
    (void)state;
    series *s = calloc(1, sizeof *s);
    start(s, "  forward_threads: 2\nkv:\n  kv_type: f16\nbatching:\n  micro_batches: 1\n",
          "--kv-type f16 --threads 2");
    shared_prefix_series(s);
    assert_int_equal(harness_stop(&s->h), 0);
    free(s);
}

static void a_quantized_model_equals_run_with_hits(void **state)
{
    (void)state;
    series *s = calloc(1, sizeof *s);
    char yaml[1024], args[1024];
    const char *dir = getenv("TP_MODELS");
    snprintf(yaml, sizeof yaml, "model:\n  path: %s/gguf-quant/stories260K-q8_0.gguf\n  tokenizer: %s/tok512.bin\n",
             dir ? dir : "../shared/models", dir ? dir : "../shared/models");
    /* run's --model comes after the fixed one: the last wins */
    snprintf(args, sizeof args, "--model %s/gguf-quant/stories260K-q8_0.gguf", dir ? dir : "../shared/models");
    start(s, yaml, args);
    shared_prefix_series(s);
    assert_int_equal(harness_stop(&s->h), 0);
    free(s);
}

/* The forward worker is killed between jobs and while one runs: the job
 * is prefilled again on its replacement (whose cache starts empty) and
 * its output does not change; the cache fills again. */
static void a_killed_forward_worker_changes_nothing_but_the_time(void **state)
{
    (void)state;
    series *s = calloc(1, sizeof *s);
    start(s, NULL, "");
    const char *greedy = "--temperature 0 --max-tokens 400 --ignore-eos --logprobs";
    one(s, STORY, greedy);
    one(s, STORY, greedy);
    pid_t fwd = harness_child_serving(&s->h, "forward");
    assert_true(fwd > 0);
    tp_m_stats_reply st;
    assert_int_equal(harness_stats(&s->h, &st), 0);
    uint64_t lost = st.workers_lost;
    kill(fwd, SIGKILL);
    for (int i = 0; i < 300 && st.workers_lost == lost; i++) {
        usleep(100000);
        assert_int_equal(harness_stats(&s->h, &st), 0);
    }
    assert_true(st.workers_lost > lost);
    assert_int_equal(harness_wait_stage(&s->h, TP_SI_FORWARD, 1, 30000), 0);
    s->n_known = 0; /* the new worker's cache is empty */
    one(s, STORY, greedy);
    one(s, STORY, greedy);
    /* killed mid-job: generate waits for the job, which recovers */
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s/tokpipe generate --config %s --json --timeout 60000 %s --prompt '%s'", s->h.bin,
             s->h.config, greedy, STORY);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    usleep(300000);
    fwd = harness_child_serving(&s->h, "forward");
    if (fwd > 0)
        kill(fwd, SIGKILL);
    char line[1 << 16];
    size_t len = fread(line, 1, sizeof line - 1, p);
    line[len] = '\0';
    assert_int_equal(pclose(p), 0);
    char runcmd[4096];
    snprintf(runcmd, sizeof runcmd, "%s/tokpipe run --model %s/stories260K.bin --tokenizer %s/tok512.bin --json %s "
             "--prompt '%s' 2>/dev/null", s->h.bin, s->h.models, s->h.models, greedy, STORY);
    char *want = sh(runcmd);
    cJSON *g = parse_line(line, "generate"), *w = parse_line(want, "run");
    assert_same_output(g, w, "the job whose forward worker was killed");
    int cached = num(g, "cached_tokens");
    assert_true(cached >= 0 && cached < num(g, "prompt_tokens"));
    cJSON_Delete(g);
    cJSON_Delete(w);
    free(want);
    assert_int_equal(harness_stop(&s->h), 0);
    free(s);
}

/* 2 slots of 128 positions (16 pages): distinct prompts evict older pages;
 * the pool never grows; outputs stay exact; a prompt evicted is computed
 * again (0 cached) with the same output. */
static void eviction_under_pressure_keeps_outputs_exact(void **state)
{
    (void)state;
    series *s = calloc(1, sizeof *s);
    start(s, "kv:\n  slots: 2\n  max_pos: 128\nbatching:\n  max_num_seqs: 2\n", "");
    const char *greedy = "--temperature 0 --max-tokens 40 --ignore-eos";
    one(s, STORY, greedy);
    one(s, STORY, greedy);
    const char *flood[] = {OTHER, "The sun was hot and the bird sang a song on the tree by the river bank",
                           "Ben and Mia built a tall tower of blocks in their room after lunch today",
                           "A little dog ran fast across the green field to find his bone under a tree"};
    for (int i = 0; i < 4; i++)
        one(s, flood[i], greedy);
    tp_m_stats_reply st;
    assert_int_equal(harness_stats(&s->h, &st), 0);
    assert_true(st.prefix_evictions > 0);
    assert_int_equal(st.prefix_pages_total, 2 * 128 / PAGE);
    assert_true(st.prefix_pages_cached <= st.prefix_pages_total);
    /* what the test's model of the cache cannot follow (which pages went)
     * is checked loosely: exact output, cached within bounds */
    cJSON_Delete(jobs(s, &STORY, 1, greedy, false));
    assert_int_equal(harness_stop(&s->h), 0);
    free(s);
}

static void the_cache_turned_off_caches_nothing(void **state)
{
    (void)state;
    series *s = calloc(1, sizeof *s);
    start(s, "kv:\n  prefix_cache: false\n", "");
    const char *greedy = "--temperature 0 --max-tokens 16";
    s->n_known = 0;
    for (int i = 0; i < 2; i++) {
        cJSON *g = jobs(s, &STORY, 1, greedy, false);
        assert_int_equal(num(g, "cached_tokens"), 0);
        cJSON_Delete(g);
    }
    tp_m_stats_reply st;
    assert_int_equal(harness_stats(&s->h, &st), 0);
    assert_int_equal(st.prefix_hit_tokens, 0);
    assert_int_equal(st.prefix_pages_cached, 0);
    assert_int_equal(harness_stop(&s->h), 0);
    free(s);
}

/* CPU seconds (user + system) of each forward worker, by pid order; the
 * count found. */
static int forward_cpu(harness *h, double *cpu, int cap)
{
    pid_t kids[16];
    int n = harness_children(h, kids, 16), k = 0;
    for (int i = 0; i < n && k < cap; i++) {
        char path[64], buf[4096];
        snprintf(path, sizeof path, "/proc/%d/cmdline", (int)kids[i]);
        FILE *f = fopen(path, "r");
        size_t len = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f)
            fclose(f);
        for (size_t c = 0; c < len; c++)
            buf[c] = buf[c] ? buf[c] : ' ';
        buf[len] = '\0';
        if (!strstr(buf, "forward"))
            continue;
        snprintf(path, sizeof path, "/proc/%d/stat", (int)kids[i]);
        f = fopen(path, "r");
        len = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f)
            fclose(f);
        buf[len] = '\0';
        char *close = strrchr(buf, ')');
        unsigned long ut = 0, st = 0;
        if (close && sscanf(close + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) == 2)
            cpu[k++] = (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
    }
    return k;
}

/* A shared-prefix workload (3 system prompts, each job adding its own
 * question), first one job at a time, then 12 at once; returns the hit
 * rate (STATS). With 2 forward workers, *share: the smaller worker's
 * fraction of the forward CPU time of the concurrent part. */
static double routed_workload(series *s, double *share)
{
    const char *sys[3] = {STORY, OTHER, "The sun was hot and the bird sang a song on the tree by the river bank. "
                          "A little dog ran fast across the green field to find his bone under a tree"};
    const char *asks[4] = {" What did she do next", " Why was he happy", " Where did they go", " Who came to see"};
    static char texts[24][1024];
    const char *one_at_a_time[12], *at_once[12];
    for (int i = 0; i < 24; i++) {
        snprintf(texts[i], sizeof texts[i], "%s.%s %d", sys[i % 3], asks[(i / 3) % 4], i);
        if (i < 12)
            one_at_a_time[i] = texts[i];
        else
            at_once[i - 12] = texts[i];
    }
    const char *greedy = "--temperature 0 --max-tokens 24 --ignore-eos";
    for (int i = 0; i < 12; i++)
        cJSON_Delete(jobs(s, &one_at_a_time[i], 1, greedy, false));
    double before[2] = {0}, after[2] = {0};
    int nf = forward_cpu(&s->h, before, 2);
    cJSON_Delete(jobs(s, at_once, 12, "--temperature 0 --max-tokens 120 --ignore-eos", false));
    if (nf == 2 && forward_cpu(&s->h, after, 2) == 2) {
        double a = after[0] - before[0], b = after[1] - before[1];
        *share = a + b > 0 ? (a < b ? a : b) / (a + b) : 0;
    }
    tp_m_stats_reply st;
    assert_int_equal(harness_stats(&s->h, &st), 0);
    assert_true(st.prefix_prompt_tokens > 0);
    return (double)st.prefix_hit_tokens / (double)st.prefix_prompt_tokens;
}

/* Two forward workers: the broker sends a job where its prefix is cached
 * unless that worker is clearly busier, so the hit rate stays >= 90% of
 * one worker's while both carry a share of the concurrent traffic; every
 * job still equals tokpipe run. */
static void two_forward_workers_keep_the_hit_rate_and_share_the_load(void **state)
{
    (void)state;
    series *s = calloc(1, sizeof *s);
    double share1 = 0, share2 = 0;
    start(s, NULL, "");
    double one_worker = routed_workload(s, &share1);
    assert_int_equal(harness_stop(&s->h), 0);
    memset(s, 0, sizeof *s);
    start(s, "  forward: 2\n", "");
    assert_int_equal(harness_wait_stage(&s->h, TP_SI_FORWARD, 2, 30000), 0);
    double two_workers = routed_workload(s, &share2);
    assert_int_equal(harness_stop(&s->h), 0);
    free(s);
    if (two_workers < 0.9 * one_worker)
        fail_msg("hit rate with 2 forward workers %.3f, with 1 %.3f: below 90%%", two_workers, one_worker);
    if (share2 < 0.2)
        fail_msg("2 forward workers: one did %.0f%% of the concurrent work", 100 * share2);
    printf("hit rate: 1 worker %.3f, 2 workers %.3f (%.0f%%); the smaller worker's share %.0f%%\n", one_worker,
           two_workers, 100 * two_workers / one_worker, 100 * share2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(shared_prefixes_give_run_s_output_and_exact_cached_tokens),
        cmocka_unit_test(f16_kv_two_threads_one_micro_batch_equal_run),
        cmocka_unit_test(a_quantized_model_equals_run_with_hits),
        cmocka_unit_test(a_killed_forward_worker_changes_nothing_but_the_time),
        cmocka_unit_test(eviction_under_pressure_keeps_outputs_exact),
        cmocka_unit_test(the_cache_turned_off_caches_nothing),
        cmocka_unit_test(two_forward_workers_keep_the_hit_rate_and_share_the_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
