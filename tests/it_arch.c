/* Process story: random-weight qwen2, qwen3, phi3, Llama 3, qwen3moe, Mixtral, qwen35, qwen35moe and gpt-oss GGUF models (written by
 * `tokpipe mkmodel --format gguf`, with llama.cpp's SentencePiece Llama or
 * byte-level BPE GPT-2 vocabulary) served by the real tokpiped and workers give, token for
 * token, what `tokpipe run` computes in one process, for concurrent greedy
 * and seeded jobs with stops, also with tiny batches and prefill chunks and
 * quantized (Q4_K_M, Q8_0, MXFP4_MOE, MXFP4) by `tokpipe quantize`;
 * and `tokpipe run` gives each prompt of a batch what it gives it alone. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/daemon_harness.h"
#include "support/run_compare.h"

static const char *const groups[] = {
    "--prompt 'Once upon a time' --prompt 'The cat sat on the mat' --prompt 'def main():' --temperature 0 "
    "--max-tokens 40 --ignore-eos",
    "--prompt 'Hello, world' --prompt 'Это тест 😀' --temperature 0.9 --seed 7 --max-tokens 32 --stop 'ing'",
    "--prompt 'The sun was' --temperature 1.0 --seed 11 --top-k 20 --top-p 0.9 --max-tokens 50 --stop-id 400",
    "--prompt 'Once upon a time there was a girl. She liked to play. She had a dog. The dog was big and brown. "
    "They went to the park every day.' --temperature 0 --max-tokens 24 --ignore-eos",
};
#define N_GROUPS (sizeof groups / sizeof groups[0])

typedef struct arch_case {
    const char *arch, *shape, *extra, *vocab;
    const char *quant; /* tokpipe quantize --type, or NULL for F32 */
} arch_case;

#define SPM "ggml-vocab-llama-spm.gguf"
#define GPT2 "ggml-vocab-gpt-2.gguf"

static const arch_case CASES[] = {
    {"qwen2", "64x2x4x2", "", SPM, NULL},
    {"llama3", "128x2x4x1", "--separate-output", SPM, NULL},
    {"qwen2", "64x2x4x2", "", GPT2, NULL},
    {"llama3", "128x2x4x1", "", GPT2, NULL},
    {"qwen2", "256x2x4x2", "", SPM, "Q4_K_M"},
    {"llama3", "256x2x4x1", "--separate-output", SPM, "Q8_0"},
    /* qwen3: heads wider than dim / heads (Qwen3-0.6B's 128 for 64) */
    {"qwen3", "64x2x4x2", "--head-dim 32", SPM, NULL},
    {"qwen3", "256x2x4x2", "--head-dim 128", SPM, "Q4_K_M"},
    /* phi3: fused attn_qkv and gate/up */
    {"phi3", "64x2x4x2", "--separate-output", SPM, NULL},
    {"phi3", "256x2x4x2", "", SPM, "Q8_0"},
    /* gemma3: windows of 8 on blocks 0-4 (40 generated tokens outgrow
     * them), block 5 global; gemma2: soft-capping, every other block
     * sliding */
    {"gemma3", "64x6x4x2", "--head-dim 32 --sliding-window 8", SPM, NULL},
    {"gemma3", "256x2x4x2", "--head-dim 64 --sliding-window 16", SPM, "Q4_K_M"},
    {"gemma2", "64x2x4x2", "--sliding-window 8", SPM, NULL},
    /* experts: qwen3moe and Mixtral (llama with llama.expert_count) */
    {"qwen3moe", "64x2x4x2", "--head-dim 32 --experts 8 --experts-used 3 --expert-ff 64", SPM, NULL},
    {"qwen3moe", "256x2x4x2", "--experts 8 --experts-used 2 --expert-ff 256", SPM, "Q8_0"},
    {"qwen3moe", "256x2x4x2", "--experts 6 --experts-used 4 --expert-ff 256", SPM, "Q4_K_M"},
    {"mixtral", "64x2x4x2", "--experts 4 --expert-ff 96", SPM, NULL},
    /* qwen35: three Gated DeltaNet blocks of four (their state per
     * sequence), a gated attention block with partial RoPE */
    {"qwen35", "64x8x4x2", "--head-dim 32", SPM, NULL},
    {"qwen35", "256x4x4x2", "", SPM, "Q8_0"},
    /* qwen35moe: qwen35's blocks, each FFN experts and a gated shared
     * expert (wider than one routed; as wide, quantized) */
    {"qwen35moe", "64x4x4x2", "--head-dim 32 --experts 8 --experts-used 3 --expert-ff 64 --shared-ff 96", SPM, NULL},
    {"qwen35moe", "256x4x4x2", "--experts 8 --experts-used 2 --expert-ff 256", SPM, "Q8_0"},
    {"qwen35moe", "256x4x4x2", "--experts 6 --experts-used 4 --expert-ff 256", SPM, "Q4_K_M"},
    /* gpt-oss: sinks, biases, YaRN, windows of 8 on blocks 0 and 2;
     * its experts in MXFP4 (llama.cpp's MXFP4_MOE mix) and every matrix
     * MXFP4 */
    {"gpt-oss", "64x4x4x2", "--head-dim 32 --experts 8 --experts-used 3 --expert-ff 64 --sliding-window 8", SPM,
     NULL},
    {"gpt-oss", "256x2x4x2", "--head-dim 64 --experts 8 --experts-used 4 --expert-ff 256 --sliding-window 8", SPM,
     "MXFP4_MOE"},
    {"gpt-oss", "128x2x4x2", "--head-dim 32 --experts 4 --experts-used 2 --expert-ff 128 --sliding-window 8", SPM,
     "MXFP4"},
};

/* Write the case's model into dir; its path in out. */
static void make_model(const char *dir, const arch_case *c, char *out, size_t cap)
{
    const char *models = getenv("TP_MODELS"), *bin = getenv("TP_BIN_DIR");
    snprintf(out, cap, "%s/%s.gguf", dir, c->arch);
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s/tokpipe mkmodel --format gguf --arch %s --shape %s %s --seed 5 --out %s "
             "--vocab-from %s/llama.cpp-vocab/%s",
             bin ? bin : "bin", c->arch, c->shape, c->extra, out, models ? models : "../shared/models", c->vocab);
    char *log = NULL;
    if (harness_sh(cmd, &log) != 0)
        fail_msg("mkmodel failed: %s\n%s", cmd, log ? log : "");
    free(log);
    if (!c->quant)
        return;
    char f32[300];
    snprintf(f32, sizeof f32, "%s.f32", out);
    rename(out, f32);
    snprintf(cmd, sizeof cmd, "%s/tokpipe quantize %s %s --type %s --quiet", bin ? bin : "bin", f32, out, c->quant);
    log = NULL;
    if (harness_sh(cmd, &log) != 0)
        fail_msg("quantize failed: %s\n%s", cmd, log ? log : "");
    free(log);
    unlink(f32);
}

static void arch_equals_run(const arch_case *c, const char *batching)
{
    char dir[] = "/tmp/tp_it_arch.XXXXXX", model[256];
    assert_non_null(mkdtemp(dir));
    make_model(dir, c, model, sizeof model);
    char yaml[1024];
    snprintf(yaml, sizeof yaml, "model:\n  path: %s\n  tokenizer: %s\n%s", model, model, batching);
    harness h;
    if (harness_start(&h, false, yaml))
        fail_msg("daemon did not start with %s", model);
    char run_model[300], what[128];
    snprintf(run_model, sizeof run_model, "--model %s", model);
    snprintf(what, sizeof what, "%s/%s/%s", c->arch, c->vocab, c->quant ? c->quant : "F32");
    daemon_equals_run(&h, groups, N_GROUPS, 30000, run_model, what);
    unlink(model);
    rmdir(dir);
}

static const char *const BATCH[] = {"Once upon a time", "The cat sat on the mat", "def main():",
                                    "Hello, world", "Это тест 😀", "1 2 3 4 5 6 7 8 9 10"};
#define N_BATCH (sizeof BATCH / sizeof BATCH[0])

static void run_batch_equals_each_alone(const arch_case *c, const char *sampling)
{
    char dir[] = "/tmp/tp_it_arch.XXXXXX", model[256];
    assert_non_null(mkdtemp(dir));
    make_model(dir, c, model, sizeof model);
    const char *bin = getenv("TP_BIN_DIR");
    char cmd[4096];
    int n = snprintf(cmd, sizeof cmd, "%s/tokpipe run --model %s --json --max-tokens 40 --ignore-eos %s",
                     bin ? bin : "bin", model, sampling);
    for (size_t i = 0; i < N_BATCH; i++)
        n += snprintf(cmd + n, sizeof cmd - (size_t)n, " --prompt '%s'", BATCH[i]);
    strcat(cmd, " 2>/dev/null");
    char *all = NULL;
    if (harness_sh(cmd, &all) != 0)
        fail_msg("%s: %s failed", c->arch, cmd);
    char *want = calloc(1, 1 << 16);
    for (size_t i = 0; i < N_BATCH; i++) {
        char *one = NULL;
        snprintf(cmd, sizeof cmd, "%s/tokpipe run --model %s --json --max-tokens 40 --ignore-eos %s --prompt '%s' "
                 "2>/dev/null", bin ? bin : "bin", model, sampling, BATCH[i]);
        if (harness_sh(cmd, &one) != 0)
            fail_msg("%s: %s failed", c->arch, cmd);
        strcat(want, one);
        free(one);
    }
    char what[128];
    snprintf(what, sizeof what, "%s/%s batch of %zu (%s)", c->arch, c->vocab, N_BATCH, sampling);
    compare_run_lines(what, all, want);
    free(all);
    free(want);
    unlink(model);
    rmdir(dir);
}

static void run_batches_equal_each_prompt_alone_for_every_architecture(void **state)
{
    (void)state;
    /* SentencePiece and BPE vocabularies; loading a BPE vocabulary costs
     * ~0.3 s of CPU per run, so those cases run the seeded sampling only */
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        if (CASES[i].quant) /* quant's own tests cover batch invariance per type */
            continue;
        if (!strcmp(CASES[i].vocab, SPM))
            run_batch_equals_each_alone(&CASES[i], "--temperature 0");
        run_batch_equals_each_alone(&CASES[i], "--temperature 0.9 --top-p 0.9 --seed 42");
    }
}

static void qwen2_jobs_in_the_daemon_equal_in_process_run(void **state)
{
    (void)state;
    arch_equals_run(&CASES[0], "");
}

static void llama3_jobs_in_the_daemon_equal_in_process_run(void **state)
{
    (void)state;
    arch_equals_run(&CASES[1], "");
}

static void gpt2_vocabulary_models_in_the_daemon_equal_in_process_run(void **state)
{
    (void)state;
    arch_equals_run(&CASES[2], "");
    arch_equals_run(&CASES[3], "");
}

static void quantized_qwen2_and_llama3_in_the_daemon_equal_in_process_run(void **state)
{
    (void)state;
    arch_equals_run(&CASES[4], "");
    arch_equals_run(&CASES[5], "");
}

static void qwen3_jobs_in_the_daemon_equal_in_process_run(void **state)
{
    (void)state;
    arch_equals_run(&CASES[6], "");
    arch_equals_run(&CASES[7], "");
}

static void phi3_jobs_in_the_daemon_equal_in_process_run(void **state)
{
    (void)state;
    arch_equals_run(&CASES[8], "");
    arch_equals_run(&CASES[9], "");
}

static void gemma3_and_gemma2_jobs_in_the_daemon_equal_in_process_run(void **state)
{
    (void)state;
    arch_equals_run(&CASES[10], "");
    arch_equals_run(&CASES[11], "");
    arch_equals_run(&CASES[12], "");
}

static void moe_jobs_in_the_daemon_equal_in_process_run(void **state)
{
    (void)state;
    for (int i = 13; i <= 16; i++)
        arch_equals_run(&CASES[i], "");
}

/* qwen35 and qwen35moe: the DeltaNet state per sequence in the forward
 * worker, the experts and the shared expert, F32 and quantized */
static void hybrid_jobs_in_the_daemon_equal_in_process_run(void **state)
{
    (void)state;
    for (int i = 17; i <= 21; i++)
        arch_equals_run(&CASES[i], "");
}

/* gpt-oss in F32, with MXFP4 experts (MXFP4_MOE) and all-MXFP4 matrices */
static void gpt_oss_jobs_in_the_daemon_equal_in_process_run(void **state)
{
    (void)state;
    for (int i = 22; i <= 24; i++)
        arch_equals_run(&CASES[i], "");
}

static void small_batches_and_chunks_change_nothing_for_every_architecture(void **state)
{
    (void)state;
    const char *tiny = "batching:\n  max_num_seqs: 3\n  prefill_chunk: 7\n  micro_batches: 1\n"
                       "  max_batch_tokens: 16\nkv:\n  slots: 3\n";
    arch_equals_run(&CASES[0], tiny);
    arch_equals_run(&CASES[1], tiny);
    arch_equals_run(&CASES[6], tiny);
    arch_equals_run(&CASES[8], tiny);
    arch_equals_run(&CASES[10], tiny);
    arch_equals_run(&CASES[12], tiny);
    arch_equals_run(&CASES[16], tiny);
    arch_equals_run(&CASES[17], tiny);
    arch_equals_run(&CASES[19], tiny);
    arch_equals_run(&CASES[22], tiny);
    arch_equals_run(&CASES[23], tiny);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(run_batches_equal_each_prompt_alone_for_every_architecture),
        cmocka_unit_test(qwen2_jobs_in_the_daemon_equal_in_process_run),
        cmocka_unit_test(llama3_jobs_in_the_daemon_equal_in_process_run),
        cmocka_unit_test(gpt2_vocabulary_models_in_the_daemon_equal_in_process_run),
        cmocka_unit_test(quantized_qwen2_and_llama3_in_the_daemon_equal_in_process_run),
        cmocka_unit_test(qwen3_jobs_in_the_daemon_equal_in_process_run),
        cmocka_unit_test(phi3_jobs_in_the_daemon_equal_in_process_run),
        cmocka_unit_test(gemma3_and_gemma2_jobs_in_the_daemon_equal_in_process_run),
        cmocka_unit_test(moe_jobs_in_the_daemon_equal_in_process_run),
        cmocka_unit_test(hybrid_jobs_in_the_daemon_equal_in_process_run),
        cmocka_unit_test(gpt_oss_jobs_in_the_daemon_equal_in_process_run),
        cmocka_unit_test(small_batches_and_chunks_change_nothing_for_every_architecture),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
