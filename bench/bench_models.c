/* make bench: the architectures people run (issues 33 and 38) against
 * llama.cpp on the same files. Each case is a random-weight GGUF written by
 * `tokpipe mkmodel --arch A` with the Llama 2 vocabulary of
 * ../shared/models (llama.cpp loads no model without one), converted with
 * `tokpipe quantize` to the case's types; tokpipe (in process, the forward
 * pass the workers run) and llama.cpp (its own llama-bench, built from
 * source as its docs build it: support/llamacpp.h) decode the same file:
 *
 *   decode   batch 1, DEPTH tokens of context then TOKENS steps, at 1 thread
 *            and at all of them (llama-bench's tg at -d DEPTH)
 *   prefill  a PREFILL-token prompt in one step (dense cases; llama-bench's pp)
 *   batched  BATCH sequences decoding together (MoE cases; llama-batched-bench's
 *            S_TG), where only the routed experts' rows are read per token
 *
 * and a mixture of experts reports the bytes of weights a token reads
 * (attention, router, its experts' share, the classifier) against the
 * file's, and decode as GB/s of those bytes. Samples alternate which
 * program goes first; each figure is the median of SAMPLES. Wall clock: a
 * busy machine shows, the load average is printed.
 * $TP_BENCH_MODELS=qwen3,gpt-oss picks cases; $TP_LLAMACPP=0: tokpipe alone. */
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tokpipe/forward.h"
#include "tokpipe/gguf.h"
#include "tokpipe/model.h"
#include "support/decode.h"
#include "support/llamacpp.h"
#include "support/membw.h"
#include "support/mkgguf.h"
#include "support/timing.h"

#define SAMPLES 3
#define DEPTH 16
#define TOKENS 64      /* decode steps: at 16 (~80 ms) one neighbour's burst on a shared VM moved a sample by 30% */
#define BATCH_STEPS 16 /* batched decode: steps of BATCH sequences */
#define PREFILL 512
#define BATCH 32
#define MAX_POS (PREFILL + 16)
#define VOCAB_FILE "llama.cpp-vocab/ggml-vocab-llama-spm.gguf"

typedef struct bcase {
    const char *name;  /* as $TP_BENCH_MODELS names it */
    const char *arch;  /* mkmodel --arch */
    const char *shape; /* mkmodel --shape */
    const char *flags; /* more mkmodel flags */
    const char *types; /* tokpipe quantize --type, comma separated */
    bool moe;
} bcase;

/* Dense shapes of ~100 M parameters (files of 100-400 MB: past the L3 of
 * the machines this runs on, so decode reads memory as a real model's
 * does); the MoE shapes >= 1 B total with an active quarter or less. */
static const bcase CASES[] = {
    {"qwen3", "qwen3", "1024x8x16x8", "--head-dim 64", "Q8_0,Q4_K_M", false},
    {"phi3", "phi3", "1024x8", "", "Q8_0,Q4_K_M", false},
    {"gemma3", "gemma3", "1024x8x8x4", "--head-dim 128 --sliding-window 512", "Q8_0,Q4_K_M", false},
    {"qwen35", "qwen35", "1024x8x8x2", "", "Q8_0,Q4_K_M", false},
    {"mixtral", "mixtral", "1024x8x16x8", "--experts 8 --experts-used 2", "Q8_0,Q4_K_M", true},
    {"qwen3moe", "qwen3moe", "1024x12x16x4", "--experts 16 --experts-used 4 --expert-ff 2048", "Q8_0,Q4_K_M", true},
    {"gpt-oss", "gpt-oss", "1024x12x16x8", "--experts 32 --experts-used 4 --expert-ff 1024", "MXFP4_MOE", true},
};
#define NCASES (sizeof CASES / sizeof CASES[0])

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "bench_models: %s: %s\n", what, msg);
    exit(1);
}

/* The bytes of weights one token reads, and the file's: every matrix whole
 * but the 3-D expert tensors (their used/total share) and the embedding
 * table (one row; all of it where it is also the classifier). */
static void token_bytes(const char *path, double *active, double *total)
{
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st))
        die(path, "cannot open");
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        die(path, "cannot map");
    tp_gguf *g;
    tp_err e;
    if (tp_gguf_parse(map, (size_t)st.st_size, &g, &e))
        die(path, e.msg);
    int64_t used = 1, experts = 1;
    /* the keys carry the architecture's name: read them by it */
    tp_gguf_str arch;
    char key[160];
    if (!tp_gguf_get_str(g, "general.architecture", &arch, &e)) {
        snprintf(key, sizeof key, "%.*s.expert_used_count", (int)arch.len, arch.ptr);
        if (tp_gguf_get_int(g, key, &used, &e))
            used = 1;
        snprintf(key, sizeof key, "%.*s.expert_count", (int)arch.len, arch.ptr);
        if (tp_gguf_get_int(g, key, &experts, &e))
            experts = 1;
    }
    bool tied = !tp_gguf_tensor_find(g, "output.weight");
    *active = *total = 0;
    for (uint64_t i = 0; i < tp_gguf_n_tensors(g); i++) {
        const tp_gguf_tensor *t = tp_gguf_tensor_at(g, i);
        double b = (double)t->nbytes;
        *total += b;
        if (t->name.len >= 5 && memmem(t->name.ptr, t->name.len, "_exps", 5))
            b = b * (double)used / (double)experts;
        else if (t->name.len == 17 && !memcmp(t->name.ptr, "token_embd.weight", 17) && !tied)
            b = b / (double)t->dims[1];
        *active += b;
    }
    tp_gguf_free(g);
    munmap(map, (size_t)st.st_size);
}

typedef struct entry {
    const bcase *c;
    const char *type;
    char path[600];
    tp_model *m;
    tp_forward *f;
    double active, total; /* bytes of weights: a token's, the file's */
} entry;

static double timed(tp_forward *f, int vocab, int threads, char what)
{
    tp_err e;
    if (tp_forward_set_threads(f, threads, &e))
        die("threads", e.msg);
    double r = what == 'd'   ? bench_decode_rate(f, vocab, DEPTH, TOKENS, bench_now, &e)
               : what == 'p' ? bench_prefill_rate(f, vocab, PREFILL, bench_now, &e)
                             : bench_batched_rate(f, vocab, BATCH, DEPTH, BATCH_STEPS, bench_now, &e);
    if (r < 0)
        die("tokpipe", e.msg);
    return r;
}

static double loadavg(void)
{
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1)
            l = -1;
        fclose(f);
    }
    return l;
}

static void cpu_name(char *out, size_t n)
{
    snprintf(out, n, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            snprintf(out, n, "%s", strchr(line, ':') + 2);
            out[strcspn(out, "\n")] = 0;
            break;
        }
    if (f)
        fclose(f);
}

/* One table row: tokpipe's and llama.cpp's medians and their ratio. */
static void row(const char *label, double *tp, double *lc, bool have_lc, const char *extra)
{
    double a = bench_median(tp, SAMPLES);
    if (have_lc) {
        double b = bench_median(lc, SAMPLES);
        printf("  %-34s %9.1f %9.1f %7.2fx%s\n", label, a, b, a / b, extra);
    } else {
        printf("  %-34s %9.1f %9s %8s%s\n", label, a, "-", "-", extra);
    }
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--help")) {
        printf("usage: bench_models   (needs $BIN/tokpipe and $TP_MODELS/" VOCAB_FILE ")\n"
               "  per architecture (qwen3, phi3, gemma3, qwen35, mixtral, qwen3moe, gpt-oss), random weights\n"
               "  in the case's types: batch-1 decode at 1 and all threads, a %d-token prefill (dense), %d\n"
               "  sequences decoding at once (MoE), tokpipe beside llama.cpp on the same file; bytes a\n"
               "  token reads for MoE. $TP_BENCH_MODELS=a,b picks cases; $TP_LLAMACPP=0 tokpipe alone.\n",
               PREFILL, BATCH);
        return 0;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *bin = getenv("BIN"), *models = getenv("TP_MODELS"), *pick = getenv("TP_BENCH_MODELS");
    bin = bin ? bin : "bin";
    char vocab[1024], dir[] = "/tmp/tp-bench-models-XXXXXX", src[700], cpu[256];
    snprintf(vocab, sizeof vocab, "%s/" VOCAB_FILE, models ? models : "../shared/models");
    if (access(vocab, R_OK)) {
        printf("bench_models: skipped: no %s (the vocabulary llama.cpp's files need)\n", vocab);
        return 0;
    }
    if (!mkdtemp(dir))
        die("mkdtemp", "failed");
    bench_llamacpp lc;
    memset(&lc, 0, sizeof lc);
    bool have_lc = bench_llamacpp_open(&lc) == 0;
    int ncpu = tp_forward_default_threads(), counts[2] = {1, ncpu}, nc = ncpu > 1 ? 2 : 1;
    cpu_name(cpu, sizeof cpu);
    printf("bench_models: %s, %d CPUs, load %.2f; tokpipe vs llama.cpp %s (%.7s, %s)\n", cpu, ncpu, loadavg(),
           have_lc ? "" : "(unavailable)", have_lc ? lc.commit : "-", have_lc ? lc.build : lc.why);
    printf("  decode: batch 1 after %d tokens, %d steps; prefill %d tokens in one step; batched %d sequences,\n"
           "  %d steps; tok/s, median of %d paired samples\n",
           DEPTH, TOKENS, PREFILL, BATCH, BATCH_STEPS, SAMPLES);
    /* batch-1 decode reads every weight once per token: it cannot beat
     * the memory's stream, whoever computes it */
    double bw[2] = {bench_stream_gbps(1), ncpu > 1 ? bench_stream_gbps(ncpu) : 0};
    printf("  memory: a read-only stream of 512 MB runs at %.1f GB/s on 1 thread", bw[0]);
    if (nc > 1)
        printf(", %.1f GB/s on %d", bw[1], ncpu);
    printf(" (the ceiling of batch-1 decode)\n");
    printf("  %-34s %9s %9s %8s\n", "", "tokpipe", "llama.cpp", "ratio");

    for (size_t k = 0; k < NCASES; k++) {
        const bcase *c = &CASES[k];
        if (pick && !bench_list_has(pick, c->name))
            continue;
        snprintf(src, sizeof src, "%s/%s-F32.gguf", dir, c->name);
        fprintf(stderr, "bench_models: writing %s (%s %s)\n", c->name, c->shape, c->flags);
        bench_mkgguf(bin, c->arch, vocab, c->shape, c->flags, "--seed 1 --separate-output", src);
        char types[64];
        snprintf(types, sizeof types, "%s", c->types);
        entry e[4];
        int ne = 0;
        for (char *t = strtok(types, ","); t && ne < 4; t = strtok(NULL, ",")) {
            entry *x = &e[ne++];
            memset(x, 0, sizeof *x);
            x->c = c;
            x->type = c->types + (t - types);
            snprintf(x->path, sizeof x->path, "%s/%s-%s.gguf", dir, c->name, t);
            bench_quantize(bin, src, t, x->path);
        }
        remove(src);
        for (int i = 0; i < ne; i++) {
            entry *x = &e[i];
            tp_err err;
            char tname[32];
            snprintf(tname, sizeof tname, "%.*s", (int)strcspn(x->type, ","), x->type);
            token_bytes(x->path, &x->active, &x->total);
            if (tp_model_load(x->path, &x->m, &err) ||
                tp_forward_new(x->m, c->moe ? BATCH : 1, MAX_POS, c->moe ? BATCH * DEPTH : PREFILL, &x->f, &err))
                die(x->path, err.msg);
            int vocab_n = tp_model_get_config(x->m)->vocab_size;
            timed(x->f, vocab_n, 1, 'd'); /* warm: every weight page read once */
            double d[2][SAMPLES], ld[2][SAMPLES], p[2][SAMPLES], lp[2][SAMPLES], b[2][SAMPLES], lb[2][SAMPLES];
            bool ok = have_lc;
            for (int s = 0; s < SAMPLES; s++)
                for (int ci = 0; ci < nc; ci++)
                    for (int turn = 0; turn < 2; turn++)
                        if (turn == (s & 1)) {
                            d[ci][s] = timed(x->f, vocab_n, counts[ci], 'd');
                            if (!c->moe)
                                p[ci][s] = timed(x->f, vocab_n, counts[ci], 'p');
                            else
                                b[ci][s] = timed(x->f, vocab_n, counts[ci], 'b');
                        } else if (ok) {
                            ld[ci][s] = bench_llamacpp_decode(&lc, x->path, counts[ci], DEPTH, TOKENS);
                            if (!c->moe)
                                lp[ci][s] = bench_llamacpp_prefill(&lc, x->path, counts[ci], PREFILL);
                            else
                                lb[ci][s] = bench_llamacpp_batched(&lc, x->path, counts[ci], BATCH, DEPTH, BATCH_STEPS);
                            ok = ld[ci][s] > 0 && (c->moe ? lb[ci][s] : lp[ci][s]) > 0;
                            if (!ok)
                                fprintf(stderr, "bench_models: llama.cpp on %s: %s\n", x->path, lc.why);
                        }
            printf("%s %s (%s %s): %.0f MB file", c->name, tname, c->shape, c->flags, x->total / 1e6);
            if (c->moe)
                printf(", a token reads %.0f MB (%.2f of the file)", x->active / 1e6, x->active / x->total);
            printf("\n");
            for (int ci = 0; ci < nc; ci++) {
                char label[64], extra[128] = "";
                snprintf(label, sizeof label, "decode, %d thread%s", counts[ci], counts[ci] > 1 ? "s" : "");
                double gb = bench_median(d[ci], SAMPLES) * x->active / 1e9;
                double lgb = ok ? bench_median(ld[ci], SAMPLES) * x->active / 1e9 : 0;
                snprintf(extra, sizeof extra, "   %.1f / %.1f GB/s of weights, %.0f%% / %.0f%% of the stream", gb,
                         lgb, bw[ci] > 0 ? 100 * gb / bw[ci] : 0, bw[ci] > 0 ? 100 * lgb / bw[ci] : 0);
                row(label, d[ci], ld[ci], ok, extra);
                snprintf(label, sizeof label, "%s, %d thread%s", c->moe ? "batched 32" : "prefill 512", counts[ci],
                         counts[ci] > 1 ? "s" : "");
                row(label, c->moe ? b[ci] : p[ci], c->moe ? lb[ci] : lp[ci], ok, "");
            }
            tp_forward_free(x->f);
            tp_model_free(x->m);
            remove(x->path);
        }
    }
    rmdir(dir);
    printf("  load average at the end %.2f\n", loadavg());
    return 0;
}
