/* Process story: the daemon serving a quantized GGUF (llama.cpp's
 * stories260K Q4_0 file, which mixes Q4_0, Q8_0 and F32 tensors, and a
 * Q4_K_M file written by `tokpipe quantize`) gives, token for token, what
 * `tokpipe run` computes in one process on the same file, for greedy and
 * seeded jobs running concurrently. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/daemon_harness.h"
#include "support/run_compare.h"

static const char *const groups[] = {
    "--prompt 'Once upon a time' --prompt 'The cat sat' --prompt 'Lily and Ben' --temperature 0 --max-tokens 60",
    "--prompt 'One day, a little bird' --prompt 'Tom had a red ball' --temperature 0.9 --seed 7 --max-tokens 48",
    "--prompt 'The sun was' --temperature 1.0 --seed 11 --top-k 20 --max-tokens 90 --stop '.'",
};
#define N_GROUPS (sizeof groups / sizeof groups[0])

static void pipeline_equals_run(const char *model)
{
    setenv("TP_TEST_MODEL", model, 1);
    harness h;
    int started = harness_start(&h, false, NULL);
    unsetenv("TP_TEST_MODEL");
    if (started)
        fail_msg("daemon did not start with %s", model);
    char run_model[2200];
    snprintf(run_model, sizeof run_model, "--model %s --tokenizer %s/tok512.bin", model, h.models);
    daemon_equals_run(&h, groups, N_GROUPS, 20000, run_model, model);
}

static void daemon_on_llama_cpp_q4_0_file_equals_in_process_run(void **state)
{
    (void)state;
    const char *dir = getenv("TP_MODELS");
    char path[1024];
    snprintf(path, sizeof path, "%s/gguf-quant/stories260K-q4_0.gguf", dir ? dir : "../shared/models");
    pipeline_equals_run(path);
}

static void daemon_on_tokpipe_quantized_q4_k_m_file_equals_in_process_run(void **state)
{
    (void)state;
    const char *dir = getenv("TP_MODELS"), *bin = getenv("TP_BIN_DIR");
    char out[] = "/tmp/tp-it-quant-XXXXXX", cmd[2048], path[1100];
    assert_non_null(mkdtemp(out));
    snprintf(path, sizeof path, "%s/m.gguf", out);
    snprintf(cmd, sizeof cmd, "%s/tokpipe quantize %s/stories260K.gguf %s --type Q4_K_M --quiet",
             bin ? bin : "bin", dir ? dir : "../shared/models", path);
    assert_int_equal(system(cmd), 0);
    pipeline_equals_run(path);
    remove(path);
    rmdir(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(daemon_on_llama_cpp_q4_0_file_equals_in_process_run),
        cmocka_unit_test(daemon_on_tokpipe_quantized_q4_k_m_file_equals_in_process_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
