/* make bench: the prefix cache through the daemon (tokpiped and its
 * workers, default deployment), on random models made by `tokpipe mkmodel`
 * where prefill dominates. Every figure is a ratio of runs in the same
 * daemon, one after the other:
 *
 *  1. TTFT of a 2,000-token prompt cold, and of the same prompt + 20 new
 *     tokens warm (stories42M shape, 2,304-token context): warm should be
 *     at most 1/10 of cold.
 *  2. A chat of 8 turns, each adding 50 tokens to a growing history that
 *     starts at 400: TTFT per turn with the cache (flat) against the
 *     first turn's.
 *  3. Throughput of 32 jobs sharing a 1,000-token system prompt (+ 16
 *     tokens of their own) against 32 jobs with distinct prompts of the
 *     same length (a small 128x4 shape, so that the distinct side's 32,000
 *     prompt tokens stay within a bench run on 2 shared cores).
 *  4. Cache bytes per cached token (STATS), and the forward worker's RSS
 *     after a flood of distinct long prompts against its KV pool + weights
 *     (the cache lives in the pool: RSS must stay within them).
 *  5. A hybrid model (qwen35 shape, GGUF with the Llama 2 vocabulary):
 *     chat turn 2 TTFT against turn 1 with a 2,000-token history.
 *
 * All jobs are greedy, ignore_eos; the random prompts never repeat by
 * chance (ids drawn from 31,000). */
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "tokpipe/protocol.h"
#include "tokpipe/zwire.h"
#include "support/bdaemon.h"
#include "support/rand.h"
#include "support/timing.h"

#define MAX_PROMPT 2100

static uint64_t rng = 88172645463325252ull;

static void fill(int32_t *ids, int n)
{
    bench_random_ids(&rng, ids, n);
}

typedef struct batch_out {
    double ttft_mean, seconds; /* mean TTFT (s) and wall time of the whole batch */
    long tokens;
    long cached;               /* FINISH cached_tokens, summed */
} batch_out;

typedef struct firsts {
    double first[64];
    batch_out *out;
} firsts;

static void on_event(void *ctx, int j, const tp_msg *ev, double t)
{
    firsts *f = ctx;
    if (ev->cmd == TP_CMD_TOKEN) {
        if (!f->first[j])
            f->first[j] = t;
        f->out->tokens++;
    } else if (ev->cmd == TP_CMD_FINISH) {
        f->out->cached += ev->finish.cached_tokens;
    }
}

/* Submit n jobs (ids[j], n_ids[j]) at once and wait for their FINISH. */
static int batch(bench_daemon *d, const char *prefix, int32_t *const *ids, const int *n_ids, int n, int max_tokens,
                 batch_out *out)
{
    double t0 = bench_now();
    for (int j = 0; j < n; j++)
        if (bench_daemon_submit(d, prefix, j, ids[j], (size_t)n_ids[j], max_tokens))
            return -1;
    *out = (batch_out){0};
    firsts f = {{0}, out};
    if (bench_daemon_events(d, prefix, n, 300000, on_event, &f))
        return -1;
    out->seconds = bench_now() - t0;
    for (int j = 0; j < n; j++)
        out->ttft_mean += (f.first[j] - t0) / n;
    return 0;
}

static int one(bench_daemon *d, const char *id, int32_t *ids, int n, int max_tokens, batch_out *out)
{
    return batch(d, id, &ids, &n, 1, max_tokens, out);
}

static int stats(bench_daemon *d, tp_m_stats_reply *s)
{
    tp_msg m, r;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_STATS);
    tp_zmsg z;
    if (bench_daemon_call(d, &m, &z, &r))
        return -1;
    *s = r.stats_reply;
    s->triggers = NULL;
    s->n_triggers = 0;
    tp_msg_clear(&r);
    tp_zmsg_close(&z);
    return 0;
}

/* VmRSS (kB) of the daemon's child whose command line names "forward". */
static long forward_rss_kb(pid_t daemon)
{
    DIR *dir = opendir("/proc");
    struct dirent *de;
    long rss = -1;
    while (dir && (de = readdir(dir))) {
        char path[300], buf[4096];
        snprintf(path, sizeof path, "/proc/%s/stat", de->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        int ppid = 0;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = '\0';
        char *close = strrchr(buf, ')');
        if (!close || sscanf(close + 2, "%*c %d", &ppid) != 1 || ppid != daemon)
            continue;
        snprintf(path, sizeof path, "/proc/%s/cmdline", de->d_name);
        f = fopen(path, "r");
        n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f)
            fclose(f);
        for (size_t i = 0; i < n; i++)
            buf[i] = buf[i] ? buf[i] : ' ';
        buf[n] = '\0';
        if (!strstr(buf, "forward"))
            continue;
        snprintf(path, sizeof path, "/proc/%s/status", de->d_name);
        f = fopen(path, "r");
        while (f && fgets(buf, sizeof buf, f))
            if (!strncmp(buf, "VmRSS:", 6))
                rss = atol(buf + 6);
        if (f)
            fclose(f);
    }
    if (dir)
        closedir(dir);
    return rss;
}

/* tokpiped on dir/model.bin (made by mkmodel) with yaml added. */
static int start(bench_daemon *d, const char *bin, const char *dir, const char *name, const char *model,
                 const char *yaml)
{
    char cfg[512], front[512], events[512];
    snprintf(cfg, sizeof cfg, "%s/%s.yaml", dir, name);
    FILE *f = fopen(cfg, "w");
    if (!f)
        return -1;
    /* a long prefill step on a loaded machine must not look like a hung
     * worker (heartbeats wait for the step): 60 s of silence allowed */
    /* a GGUF model brings its own vocabulary; a llama2.c one takes mkmodel's */
    bool gguf = strstr(model, ".gguf") != NULL;
    fprintf(f, "runtime_dir: %s/rt-%s\nmodel:\n  path: %s/%s%s\n", dir, name, dir, model, gguf ? "" : ".bin");
    if (!gguf)
        fprintf(f, "  tokenizer: %s/tok.bin\n", dir);
    fprintf(f, "heartbeat:\n  interval_ms: 5000\n  liveness: 12\n%sworkers:\n  binary: %s/tokpipe-worker\n", yaml, bin);
    fclose(f);
    snprintf(front, sizeof front, "ipc://%s/rt-%s/front.sock", dir, name);
    snprintf(events, sizeof events, "ipc://%s/rt-%s/events.sock", dir, name);
    if (bench_daemon_start(d, bin, cfg, front, events)) {
        fprintf(stderr, "bench_prefix: daemon %s did not start\n", name);
        return -1;
    }
    return 0;
}

static int mkmodel(const char *bin, const char *dir, const char *name, const char *shape)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s/tokpipe mkmodel --shape %s --seed 1 --out %s/%s.bin --tokenizer-out %s/tok.bin "
             "--quiet", bin, shape, dir, name, dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* 1 and 2: TTFT cold / warm and the chat, stories42M shape. */
static int ttft(const char *bin, const char *dir)
{
    bench_daemon d;
    if (start(&d, bin, dir, "ttft", "m42", "kv:\n  slots: 4\nbatching:\n  max_num_seqs: 4\n"))
        return -1;
    static int32_t p[MAX_PROMPT];
    fill(p, MAX_PROMPT);
    p[0] = 1;
    batch_out cold, warm;
    if (one(&d, "cold", p, 2000, 1, &cold) || one(&d, "warm", p, 2020, 1, &warm))
        return -1;
    printf("  TTFT, 2000-token prompt cold %.3f s; + 20 new tokens warm %.3f s (%ld cached): warm/cold %.3f "
           "(target <= 0.1)\n", cold.ttft_mean, warm.ttft_mean, warm.cached, warm.ttft_mean / cold.ttft_mean);
    /* chat: the history grows by 50 tokens a turn */
    static int32_t h[MAX_PROMPT];
    int n = 400;
    fill(h, n);
    h[0] = 1;
    double t_first = 0;
    printf("  chat, TTFT per turn (history tokens / cached / ms):");
    for (int turn = 0; turn < 8; turn++) {
        char id[32];
        snprintf(id, sizeof id, "chat%d", turn);
        batch_out o;
        if (one(&d, id, h, n, 8, &o))
            return -1;
        if (turn == 0)
            t_first = o.ttft_mean;
        printf(" %d/%ld/%.0f", n, o.cached, o.ttft_mean * 1e3);
        /* the next turn: the history + 50 new tokens (standing for the
         * answer and the user's next message; random, so the cache can
         * only give the history's pages) */
        fill(h + n, 50);
        n += 50;
        if (turn == 7)
            printf("\n  chat: last turn TTFT / first turn %.2f (flat: ~1 or less, the first turn computes its "
                   "whole history; without the cache it grows with the history, %.1fx here)\n", o.ttft_mean / t_first,
                   (double)(n - 50) / 400.0);
    }
    bench_daemon_stop(&d);
    return 0;
}

/* 5. A hybrid model (qwen35: three of four layers Gated DeltaNet, whose
 * state the cache restores from its snapshot at the page boundary where a
 * hit ends): chat turn 2 (a 2,000-token history + 50 new tokens) TTFT
 * against turn 1 (the history, cold). */
static int hybrid(const char *bin, const char *dir)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s/tokpipe mkmodel --format gguf --arch qwen35 --vocab-from %s/llama.cpp-vocab/"
             "ggml-vocab-llama-spm.gguf --shape 512x8x8x2 --seq-len 2304 --seed 1 --out %s/q35.gguf --quiet",
             bin, getenv("TP_MODELS") ? getenv("TP_MODELS") : "../shared/models", dir);
    if (system(cmd) != 0) {
        printf("  qwen35: skipped (no vocabulary in $TP_MODELS for its GGUF)\n");
        return 0;
    }
    bench_daemon d;
    if (start(&d, bin, dir, "hybrid", "q35.gguf", "kv:\n  slots: 4\nbatching:\n  max_num_seqs: 4\n"))
        return -1;
    static int32_t h[MAX_PROMPT];
    fill(h, 2050);
    h[0] = 1;
    batch_out t1, t2;
    if (one(&d, "turn1", h, 2000, 8, &t1) || one(&d, "turn2", h, 2050, 8, &t2))
        return -1;
    printf("  qwen35 (512x8, 6 of 8 layers DeltaNet) chat: turn 1, a 2000-token history, TTFT %.3f s; turn 2, "
           "+ 50 tokens, %.3f s (%ld cached): turn 2 / turn 1 %.3f (target <= 0.2)\n", t1.ttft_mean, t2.ttft_mean,
           t2.cached, t2.ttft_mean / t1.ttft_mean);
    bench_daemon_stop(&d);
    return 0;
}

/* 3 and 4: shared system prompt vs distinct, bytes per token, RSS. */
static int shared(const char *bin, const char *dir)
{
    bench_daemon d;
    /* 40 slots of 1,280 positions: the pool of the flood below */
    if (start(&d, bin, dir, "shared", "m5", "kv:\n  slots: 40\n  max_pos: 1280\nbatching:\n  max_num_seqs: 40\n"))
        return -1;
    enum { J = 32, SYS = 1000, OWN = 16 };
    static int32_t buf[2][J][SYS + OWN];
    int32_t *ids[2][J];
    int n[J];
    fill(buf[0][0], SYS);
    buf[0][0][0] = 1;
    for (int j = 0; j < J; j++) {
        memcpy(buf[0][j], buf[0][0], SYS * sizeof(int32_t));
        fill(buf[0][j] + SYS, OWN);
        fill(buf[1][j], SYS + OWN);
        buf[1][j][0] = 1;
        ids[0][j] = buf[0][j];
        ids[1][j] = buf[1][j];
        n[j] = SYS + OWN;
    }
    batch_out warmup, sh, di;
    /* the system prompt once, as a deployment would have it cached */
    if (one(&d, "sys", buf[0][0], SYS + OWN, 1, &warmup) || batch(&d, "shared", ids[0], n, J, 16, &sh) ||
        batch(&d, "distinct", ids[1], n, J, 16, &di))
        return -1;
    printf("  32 jobs, 1016-token prompts, 16 tokens each: shared 1000-token prefix %.2f s (%ld cached, TTFT mean "
           "%.2f s), distinct %.2f s (%ld cached, TTFT mean %.2f s): %.1fx the throughput\n",
           sh.seconds, sh.cached, sh.ttft_mean, di.seconds, di.cached, di.ttft_mean, di.seconds / sh.seconds);
    tp_m_stats_reply s;
    if (stats(&d, &s))
        return -1;
    printf("  cache: %llu pages cached of %llu, %.0f bytes per cached token (keys + values, every layer), hit "
           "rate %.2f\n", (unsigned long long)s.prefix_pages_cached, (unsigned long long)s.prefix_pages_total,
           s.prefix_pages_cached ? (double)s.prefix_bytes / (16.0 * (double)s.prefix_pages_cached) : 0.0,
           s.prefix_prompt_tokens ? (double)s.prefix_hit_tokens / (double)s.prefix_prompt_tokens : 0.0);
    /* flood: 2 x 32 more distinct prompts; the pool is 40 x 1280 positions */
    for (int r = 0; r < 2; r++) {
        for (int j = 0; j < J; j++)
            fill(buf[1][j] + 1, SYS + OWN - 1);
        char pre[16];
        snprintf(pre, sizeof pre, "flood%d", r);
        if (batch(&d, pre, ids[1], n, J, 4, &di))
            return -1;
    }
    if (stats(&d, &s))
        return -1;
    long rss = forward_rss_kb(d.pid);
    double pool = (double)s.prefix_pages_total * (double)s.prefix_bytes / (double)(s.prefix_pages_cached ? s.prefix_pages_cached : 1);
    char model[512];
    snprintf(model, sizeof model, "%s/m5.bin", dir);
    FILE *mf = fopen(model, "rb");
    double weights = 0;
    if (mf) {
        fseek(mf, 0, SEEK_END);
        weights = (double)ftell(mf);
        fclose(mf);
    }
    printf("  flood of %d distinct 1016-token prompts: %llu evictions; forward worker RSS %.0f MB, KV pool %.0f MB + "
           "packed weights %.0f MB = %.0f MB (RSS / that %.2f)\n", 3 * J,
           (unsigned long long)s.prefix_evictions, rss / 1e3, pool / 1e6, weights / 1e6, (pool + weights) / 1e6,
           rss * 1e3 / (pool + weights));
    bench_daemon_stop(&d);
    return 0;
}

int main(void)
{
    const char *bin = getenv("BIN") ? getenv("BIN") : "bin";
    char dir[] = "/tmp/tpbench-prefix-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    if (mkmodel(bin, dir, "m42", "stories42M --seq-len 2304") || mkmodel(bin, dir, "m5", "128x4 --seq-len 1280")) {
        fprintf(stderr, "bench_prefix: mkmodel failed\n");
        return 1;
    }
    printf("bench_prefix: the prefix cache through the daemon (random models; greedy; figures of one run)\n");
    int rc = ttft(bin, dir) || hybrid(bin, dir) || shared(bin, dir);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        rc = 1;
    return rc ? 1 : 0;
}
