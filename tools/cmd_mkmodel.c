/* tokpipe mkmodel: write a llama2.c checkpoint or a GGUF model (llama,
 * Llama 3, Mixtral, qwen2, qwen3, phi3, qwen3moe, gemma3, gemma2, qwen35, qwen35moe, gpt-oss: model/archs.c) of a real model shape with seeded random weights (and
 * optionally a matching synthetic tokenizer), so speed and architectures
 * can be tested at sizes and kinds whose real weights are not available. */
#include "tools.h"
#include "tokpipe/synth.h"

#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char cmd_mkmodel_summary[] = "write a random-weight llama2.c or GGUF model of a given shape";

static void usage(FILE *out)
{
    fprintf(out,
            "usage: tokpipe mkmodel --shape SHAPE --seed N --out FILE [--tokenizer-out FILE]\n"
            "       tokpipe mkmodel --format gguf --arch llama|llama3|qwen2|qwen3|phi3|qwen3moe|mixtral|gemma3|gemma2|\n"
            "                       qwen35|qwen35moe|gpt-oss\n"
            "                       --vocab-from FILE.gguf --shape SHAPE --seed N --out FILE\n"
            "                       [--separate-output] [--head-dim N] [--experts N --experts-used K]\n"
            "                       [--expert-ff N] [--shared-ff N] [--sliding-window N] [--pooling P]\n"
            "\n"
            "Writes a llama2.c (version 0) checkpoint with weights uniform in +-0.5/sqrt(fan-in)\n"
            "drawn from a generator seeded with N (same seed, same bytes), RMSNorm weights 1,\n"
            "shared classifier. Speed does not depend on the weight values.\n"
            "With --format gguf, writes a GGUF v3 file of F32 tensors under llama.cpp's names and\n"
            "keys instead (RMSNorm weights 1 +- 0.25, biases +- 0.5, same seeding).\n"
            "\n"
            "  --shape SHAPE          stories15M   dim 288, hidden 768, 6 layers, 6/6 heads, vocab 32000, seq 256\n"
            "                         stories42M   dim 512, hidden 1376, 8 layers, 8/8 heads, vocab 32000, seq 1024\n"
            "                         stories110M  dim 768, hidden 2048, 12 layers, 12/12 heads, vocab 32000, seq 1024\n"
            "                         stories260K  dim 64, hidden 172, 5 layers, 8/4 heads, vocab 512, seq 512\n"
            "                         DIMxLAYERS[xHEADS[xKV_HEADS]]  e.g. 1024x16 or 512x8x8x2: hidden is\n"
            "                         llama2.c's rule (2/3 of 4*DIM rounded up to a multiple of 32), heads\n"
            "                         default to DIM/64 (DIM/48 if 64 does not divide it), kv heads to\n"
            "                         heads, vocab 32000, seq 1024\n"
            "  --vocab N              override the vocabulary size\n"
            "  --seq-len N            override the maximum sequence length\n"
            "  --seed N               weight seed (required)\n"
            "  --out FILE             checkpoint to write (required)\n"
            "  --tokenizer-out FILE   also write a synthetic llama2.c tokenizer.bin of the vocab size\n"
            "                         (<unk>, BOS, EOS, 256 byte tokens, then distinct made-up pieces)\n"
            "  --format FMT           llama2c (default) or gguf\n"
            "  --arch ARCH            gguf only: llama (Llama 2 RoPE, base 10000), llama3 (base 500000,\n"
            "                         Llama 3.1 RoPE scaling as llama.cpp's rope_freqs.weight tensor),\n"
            "                         qwen2 (Q/K/V biases, NEOX RoPE, base 1e6), qwen3 (RMSNorm of each\n"
            "                         Q and K head, NEOX RoPE, base 1e6), phi3 (fused attn_qkv and\n"
            "                         gate/up ffn_up, NEOX RoPE), qwen3moe (qwen3's attention, a mixture\n"
            "                         of experts FFN), mixtral (llama with experts), gemma3 (scaled\n"
            "                         embeddings, post-norms, GELU, Q/K norms, 5 of 6 layers sliding\n"
            "                         with base 10000, global base 1e6), gemma2 (no Q/K norms,\n"
            "                         soft-capping, every other layer sliding), qwen35 (DeltaNet, every\n"
            "                         4th layer gated attention), qwen35moe, gpt-oss (attention sinks,\n"
            "                         biases, every other layer sliding (128), YaRN RoPE (factor 32 of\n"
            "                         4096, base 150000), 8 experts, 4 used, swiglu_oai); default llama\n"
            "  --vocab-from FILE      gguf only (required): copy FILE's tokenizer.* metadata (tokens,\n"
            "                         scores, token types, merges, special ids, chat template); the\n"
            "                         vocabulary size is its token count\n"
            "  --separate-output      gguf only: write output.weight (default: tied to token_embd; gpt-oss\n"
            "                         always has one, as llama.cpp requires)\n"
            "  --pooling mean|cls|last  gguf only: write {arch}.pooling_type, as an embedding model's file\n"
            "  --sliding-window N     gguf gemma3/gemma2/gpt-oss only: attention.sliding_window (default\n"
            "                         512 / 4096 / 128)\n"
            "  --head-dim N           gguf qwen3/gemma/gpt-oss only: heads of N (attention.key_length) instead of\n"
            "                         DIM/HEADS, as Qwen3's 128 with DIM/HEADS 64\n"
            "  --experts N            gguf qwen3moe, mixtral, gpt-oss, llama: N experts (expert_count;\n"
            "                         default 8 for qwen3moe, mixtral and gpt-oss)\n"
            "  --experts-used K       the experts each token takes (expert_used_count; default 2, gpt-oss 4)\n"
            "  --expert-ff N          one expert's hidden width (default the shape's hidden width)\n"
            "  --shared-ff N          qwen35moe's shared expert's width (default --expert-ff)\n"
            "  --rope-scaling-keys    gguf llama3 only: write llama.rope.scaling.* keys instead of\n"
            "                         the rope_freqs.weight tensor\n"
            "  --rope-dim N           gguf phi3/qwen35 only: RoPE turns the first N of a head's elements\n"
            "                         (rope.dimension_count; Phi-4-mini 96 of 128; default all, qwen35 a quarter)\n"
            "  --rope-linear F        gguf: rope.scaling.type linear, factor F (Gemma 3 4B-27B: 8; gemma3\n"
            "                         turns its sliding layers unscaled)\n"
            "  --longrope ORIG        gguf phi3 only: LongRoPE as Phi-3.5 / Phi-4-mini carry it\n"
            "                         (rope_factors_long / _short, original context ORIG, attn_factor\n"
            "                         sqrt(1 + ln(seq / ORIG) / ln ORIG)); a forward serving more than ORIG\n"
            "                         positions takes the long factors\n"
            "  --quiet                no progress on stderr\n");
}

static void progress(uint64_t done, uint64_t total, void *ctx)
{
    int *last = ctx;
    int pct = (int)(done * 100 / (total ? total : 1));
    if (pct / 10 != *last / 10 || done == total) {
        fprintf(stderr, "\rmkmodel: %3d%% of %.1f MB", pct, (double)total / 1e6);
        if (done == total)
            fputc('\n', stderr);
        *last = pct;
    }
}

static int parse_int(const char *name, const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "tokpipe mkmodel: %s '%s' is not an integer in %lld..%lld\n", name, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int write_file(const char *path, const tp_synth_shape *s, long long seed, bool quiet, bool tokenizer)
{
    FILE *fp = fopen(path, "wb");
    if (!fp) {
        fprintf(stderr, "tokpipe mkmodel: cannot create %s: %s\n", path, strerror(errno));
        return 1;
    }
    tp_err e = {0, ""};
    int last = -10;
    int rc = tokenizer ? tp_synth_write_tokenizer(fp, s->vocab_size, &e)
                       : tp_synth_write_model(fp, s, (uint64_t)seed, quiet ? NULL : progress, &last, &e);
    if (fclose(fp) && !rc)
        rc = tp_err_set(&e, -1, "closing the file failed: %s", strerror(errno));
    if (rc) {
        fprintf(stderr, "tokpipe mkmodel: %s: %s\n", path, e.msg);
        unlink(path);
        return 1;
    }
    return 0;
}

int cmd_mkmodel(int argc, char **argv)
{
    static const struct option opts[] = {
        {"shape", required_argument, 0, 's'}, {"seed", required_argument, 0, 'S'},
        {"out", required_argument, 0, 'o'},   {"tokenizer-out", required_argument, 0, 't'},
        {"vocab", required_argument, 0, 'v'}, {"seq-len", required_argument, 0, 'l'},
        {"quiet", no_argument, 0, 'q'},       {"help", no_argument, 0, 'h'},
        {"format", required_argument, 0, 'f'}, {"arch", required_argument, 0, 'a'},
        {"vocab-from", required_argument, 0, 'V'}, {"separate-output", no_argument, 0, 'O'},
        {"rope-scaling-keys", no_argument, 0, 'R'}, {"head-dim", required_argument, 0, 'H'},
        {"sliding-window", required_argument, 0, 'W'},
        {"experts", required_argument, 0, 'E'}, {"experts-used", required_argument, 0, 'K'},
        {"expert-ff", required_argument, 0, 'F'}, {"shared-ff", required_argument, 0, 'X'},
        {"pooling", required_argument, 0, 'P'},
        {"rope-dim", required_argument, 0, 'D'}, {"longrope", required_argument, 0, 'L'},
        {"rope-linear", required_argument, 0, 'I'},
        {0, 0, 0, 0},
    };
    const char *shape = NULL, *out = NULL, *tok_out = NULL, *format = "llama2c";
    long long seed = -1, vocab = 0, seq = 0;
    bool quiet = false;
    tp_synth_gguf g = {.arch = NULL};
    long long head_dim = 0, window = 0, n_exp = 0, n_used = 0, exp_ff = 0, sh_ff = 0, rope_dim = 0, lrope = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 's': shape = optarg; break;
        case 'o': out = optarg; break;
        case 't': tok_out = optarg; break;
        case 'q': quiet = true; break;
        case 'f': format = optarg; break;
        case 'a': g.arch = optarg; break;
        case 'V': g.vocab_from = optarg; break;
        case 'O': g.separate_output = true; break;
        case 'R': g.rope_scaling_keys = true; break;
        case 'H': if (parse_int("--head-dim", optarg, 2, 4096, &head_dim)) return 2; break;
        case 'W': if (parse_int("--sliding-window", optarg, 1, 1 << 20, &window)) return 2; break;
        case 'E': if (parse_int("--experts", optarg, 1, 512, &n_exp)) return 2; break;
        case 'K': if (parse_int("--experts-used", optarg, 1, 512, &n_used)) return 2; break;
        case 'F': if (parse_int("--expert-ff", optarg, 1, 1 << 18, &exp_ff)) return 2; break;
        case 'P': {
            static const char *const pools[] = {"mean", "cls", "last"};   /* TP_POOL_MEAN.. */
            g.pooling = 0;
            for (int i = 0; i < 3; i++)
                if (!strcmp(optarg, pools[i]))
                    g.pooling = i + 1;
            if (!g.pooling) {
                fprintf(stderr, "tokpipe mkmodel: --pooling '%s' is not mean, cls or last\n", optarg);
                return 2;
            }
            break;
        }
        case 'X': if (parse_int("--shared-ff", optarg, 1, 1 << 18, &sh_ff)) return 2; break;
        case 'D': if (parse_int("--rope-dim", optarg, 2, 4096, &rope_dim)) return 2; break;
        case 'L': if (parse_int("--longrope", optarg, 1, 1 << 20, &lrope)) return 2; break;
        case 'I': {
            char *end;
            g.rope_linear = strtof(optarg, &end);
            if (end == optarg || *end || !(g.rope_linear >= 1 && g.rope_linear <= 1e6)) {
                fprintf(stderr, "tokpipe mkmodel: --rope-linear '%s' is not a factor in 1..1e6\n", optarg);
                return 2;
            }
            break;
        }
        case 'h': usage(stdout); return 0;
        case 'S': if (parse_int("--seed", optarg, 0, INT64_MAX, &seed)) return 2; break;
        case 'v': if (parse_int("--vocab", optarg, 354, 1 << 22, &vocab)) return 2; break;
        case 'l': if (parse_int("--seq-len", optarg, 1, 1 << 20, &seq)) return 2; break;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc || !shape || !out || seed < 0) {
        fprintf(stderr, "tokpipe mkmodel: %s\n", optind < argc ? "unexpected argument"
                        : "--shape, --seed and --out are required");
        usage(stderr);
        return 2;
    }
    bool gguf = !strcmp(format, "gguf");
    if (!gguf && strcmp(format, "llama2c")) {
        fprintf(stderr, "tokpipe mkmodel: --format '%s' is not llama2c or gguf\n", format);
        return 2;
    }
    const char *misplaced = gguf ? (tok_out ? "--tokenizer-out" : vocab ? "--vocab" : NULL)
                                 : g.arch ? "--arch" : g.vocab_from ? "--vocab-from"
                                 : g.separate_output ? "--separate-output"
                                 : g.rope_scaling_keys ? "--rope-scaling-keys"
                                 : head_dim ? "--head-dim" : window ? "--sliding-window" : n_exp ? "--experts"
                                 : n_used ? "--experts-used" : exp_ff ? "--expert-ff" : sh_ff ? "--shared-ff"
                                 : g.pooling ? "--pooling" : rope_dim ? "--rope-dim" : lrope ? "--longrope"
                                 : g.rope_linear > 0 ? "--rope-linear" : NULL;
    if (misplaced) {
        fprintf(stderr, "tokpipe mkmodel: %s does not apply to --format %s\n", misplaced, format);
        return 2;
    }
    if (gguf && !g.vocab_from) {
        fprintf(stderr, "tokpipe mkmodel: --format gguf needs --vocab-from FILE.gguf\n");
        return 2;
    }
    tp_synth_shape s;
    tp_err e;
    if (tp_synth_parse_shape(shape, &s, &e)) {
        fprintf(stderr, "tokpipe mkmodel: %s\n", e.msg);
        return 2;
    }
    if (vocab)
        s.vocab_size = (int)vocab;
    if (seq)
        s.seq_len = (int)seq;
    g.head_dim = (int)head_dim;
    g.sliding_window = (int)window;
    g.n_expert = (int)n_exp;
    g.n_expert_used = (int)n_used;
    g.expert_ff = (int)exp_ff;
    g.shexp_ff = (int)sh_ff;
    g.rope_dim = (int)rope_dim;
    g.longrope_orig = (int)lrope;
    if (gguf) {
        if (!g.arch)
            g.arch = "llama";
        if (tp_synth_write_gguf(out, &s, (uint64_t)seed, &g, &e)) {
            fprintf(stderr, "tokpipe mkmodel: %s: %s\n", out, e.msg);
            return 1;
        }
        return 0;
    }
    if (write_file(out, &s, seed, quiet, false))
        return 1;
    if (tok_out && write_file(tok_out, &s, seed, quiet, true))
        return 1;
    return 0;
}
