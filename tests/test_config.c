/* config: tokpipe.yaml loading, defaults, and errors naming key and line. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/config.h"
#include "tokpipe/forward.h"

static int parse(const char *yaml, tp_config *c, tp_err *e)
{
    return tp_config_parse(yaml, strlen(yaml), "t.yaml", c, e);
}

static void expect_error(const char *yaml, const char *needle1, const char *needle2)
{
    tp_config c;
    tp_err e;
    tp_err_clear(&e);
    int rc = parse(yaml, &c, &e);
    if (rc == 0)
        fail_msg("expected an error for:\n%s", yaml);
    if (!strstr(e.msg, needle1) || (needle2 && !strstr(e.msg, needle2)))
        fail_msg("error '%s' should mention '%s' and '%s'", e.msg, needle1, needle2 ? needle2 : "");
    assert_null(c.source);   /* freed and zeroed on failure */
}

/* The shipped file documents the defaults: both must give the same values. */
static void shipped_yaml_equals_builtin_defaults(void **state)
{
    (void)state;
    tp_config a, b;
    tp_err e;
    if (tp_config_load(TP_CONFIG_DEFAULT_PATH, &a, &e))
        fail_msg("shipped config does not load: %s", e.msg);
    assert_int_equal(tp_config_defaults(&b, &e), 0);
    assert_int_equal(tp_config_resolve(&b, &e), 0);
    char **sa[64], **sb[64];
    tp_config ca = a, cb = b;
    char **pa[64], **pb[64];
    size_t n = tp_config_strings(&a, sa, 64);
    assert_true(n <= 64);
    tp_config_strings(&b, sb, 64);
    tp_config_strings(&ca, pa, 64);
    tp_config_strings(&cb, pb, 64);
    for (size_t i = 1; i < n; i++)   /* 0 is source, which differs */
        if (strcmp(*sa[i], *sb[i]))
            fail_msg("string setting %zu differs: file '%s' vs default '%s'", i, *sa[i], *sb[i]);
    assert_int_equal(a.n_fuse, b.n_fuse);
    /* compare every number at once: blank the pointers, which differ */
    for (size_t i = 0; i < n; i++)
        *pa[i] = *pb[i] = NULL;
    ca.fuse = cb.fuse = NULL;
    if (memcmp(&ca, &cb, sizeof ca))
        fail_msg("a numeric value in %s differs from the built-in default", TP_CONFIG_DEFAULT_PATH);
    tp_config_free(&a);
    tp_config_free(&b);
}

static void file_overrides_only_the_keys_it_names(void **state)
{
    (void)state;
    tp_config c;
    tp_err e;
    int rc = parse("batching:\n  max_num_seqs: 8\n  decode_ahead: false\ngeneration:\n  temperature: 0.5\n"
                   "model:\n  path: /m.bin\n",
                   &c, &e);
    if (rc)
        fail_msg("%s", e.msg);
    assert_int_equal(c.max_num_seqs, 8);
    assert_false(c.decode_ahead);
    assert_true(c.def_temperature == 0.5);
    assert_string_equal(c.model_path, "/m.bin");
    assert_int_equal(c.max_batch_tokens, 512);   /* untouched default */
    assert_string_equal(c.tokenizer_path, "../shared/models/tok512.bin");
    tp_config_free(&c);
}

/* A GGUF model named without a tokenizer reads its own vocabulary; a
 * tokenizer named beside it is kept, even the default's file. */
static void a_gguf_model_brings_its_vocabulary(void **state)
{
    (void)state;
    tp_config c;
    tp_err e;
    if (parse("model:\n  path: /models/Qwen3-8B-Q4_K_M.GGUF\n", &c, &e))
        fail_msg("%s", e.msg);
    assert_string_equal(c.tokenizer_path, "");
    tp_config_free(&c);
    if (parse("model:\n  path: /m.gguf\n  tokenizer: ../shared/models/tok512.bin\n", &c, &e))
        fail_msg("%s", e.msg);
    assert_string_equal(c.tokenizer_path, "../shared/models/tok512.bin");
    tp_config_free(&c);
    if (parse("model:\n  tokenizer: /v.gguf\n", &c, &e))   /* the default model stays itself */
        fail_msg("%s", e.msg);
    assert_string_equal(c.tokenizer_path, "/v.gguf");
    tp_config_free(&c);
}

static void empty_file_gives_defaults(void **state)
{
    (void)state;
    tp_config c;
    tp_err e;
    assert_int_equal(parse("", &c, &e), 0);
    assert_int_equal(c.stage_count[TP_SI_FORWARD], 1);
    tp_config_free(&c);
    assert_int_equal(parse("# only a comment\n", &c, &e), 0);
    tp_config_free(&c);
}

static void unknown_key_is_named_with_its_line(void **state)
{
    (void)state;
    expect_error("batching:\n  max_num_seqs: 4\n  max_num_seq: 3\n", "t.yaml:3:", "batching.max_num_seq: unknown key");
    expect_error("bogus: 1\n", "t.yaml:1:", "bogus: unknown key");
    expect_error("heartbeat:\n  nested:\n    x: 1\n", ":2:", "heartbeat.nested");
}

static void out_of_range_value_is_named_with_its_line(void **state)
{
    (void)state;
    expect_error("\n\nbatching:\n  max_num_seqs: 0\n", "t.yaml:4:", "batching.max_num_seqs: 0 is outside [1, 4096]");
    expect_error("generation:\n  top_p: 1.5\n", "t.yaml:2:", "generation.top_p: 1.5 is outside (0, 1]");
    /* the engine computes in float32 (PROTOCOL.md): a default the wire would refuse is refused here,
     * not at every job's SAMPLE_OPEN */
    expect_error("generation:\n  top_p: 1e-300\n", "t.yaml:2:",
                 "generation.top_p: 1e-300 is outside (0, 1] as a 32-bit float (it becomes 0)");
    expect_error("generation:\n  repetition_penalty: 1e-60\n", "t.yaml:2:", "as a 32-bit float");
    expect_error("generation:\n  temperature: -1\n", "generation.temperature", "outside");
    expect_error("heartbeat:\n  liveness: 99999999999999999999\n", "heartbeat.liveness", "not an integer");
}

static void wrong_types_are_rejected(void **state)
{
    (void)state;
    expect_error("batching:\n  max_num_seqs: lots\n", ":2:", "'lots' is not an integer");
    expect_error("batching:\n  max_num_seqs: \"8\"\n", "batching.max_num_seqs", "not an integer");
    expect_error("batching:\n  max_num_seqs: [1]\n", "batching.max_num_seqs", "single value");
    expect_error("generation:\n  top_p: high\n", "generation.top_p", "not a number");
    expect_error("batching:\n  decode_ahead: yes\n", "batching.decode_ahead", "'yes' is not true or false");
    expect_error("batching:\n  decode_ahead: \"true\"\n", "batching.decode_ahead", "not true or false");
    expect_error("batching: 3\n", "batching", "expected a mapping");
    expect_error("workers:\n  fuse: forward\n", "workers.fuse", "list of strings");
    expect_error("- a\n- b\n", "t.yaml:1:", "top level must be a mapping");
}

static void duplicate_key_is_an_error(void **state)
{
    (void)state;
    expect_error("kv:\n  slots: 4\n  slots: 8\n", "t.yaml:3:", "kv.slots: duplicate key");
}

static void syntax_error_reports_a_line(void **state)
{
    (void)state;
    expect_error("batching:\n  max_num_seqs: 4\n bad: [\n", "t.yaml:", "YAML syntax error");
}

static void cross_field_limits_are_checked(void **state)
{
    (void)state;
    expect_error("generation:\n  max_tokens: 5000\n", "generation.max_tokens (5000) > limits.max_tokens (4096)", NULL);
    expect_error("batching:\n  max_num_seqs: 100\n", "batching.max_num_seqs (100) > kv.slots (64)", NULL);
    expect_error("heartbeat:\n  reconnect_init_ms: 500\n  reconnect_max_ms: 100\n", "heartbeat.reconnect_max_ms", NULL);
    /* a prompt at limits.max_prompt_bytes must tokenize into a message the
     * broker takes (issue 21: the tokenize worker was lost on it) */
    expect_error("limits:\n  max_msg_bytes: 65536\n", "limits.max_msg_bytes (65536)", "limits.max_prompt_bytes (1048576)");
    tp_config c;
    tp_err e;
    const char *ok = "limits:\n  max_msg_bytes: 65536\n  max_prompt_bytes: 4096\n";
    if (parse(ok, &c, &e))
        fail_msg("a consistent pair was refused: %s", e.msg);
    tp_config_free(&c);
}

static void endpoints_default_to_ipc_under_the_runtime_dir(void **state)
{
    (void)state;
    tp_config c;
    tp_err e;
    assert_int_equal(parse("runtime_dir: /tmp/rt\nendpoints:\n  front: tcp://127.0.0.1:5555\n", &c, &e), 0);
    assert_string_equal(c.ep_front, "tcp://127.0.0.1:5555");
    assert_string_equal(c.ep_back, "ipc:///tmp/rt/back.sock");
    assert_string_equal(c.ep_events, "ipc:///tmp/rt/events.sock");
    assert_string_equal(c.ep_publish, "ipc:///tmp/rt/publish.sock");
    tp_config_free(&c);
    expect_error("endpoints:\n  back: http://x\n", "endpoints.back", "not an ipc:// or tcp://");
    char yaml[400];
    snprintf(yaml, sizeof yaml, "runtime_dir: /tmp/%0120d\n", 7);
    expect_error(yaml, "endpoints.front", "longer than 107");
}

static void fuse_entries_become_one_process_kind(void **state)
{
    (void)state;
    tp_config c;
    tp_err e;
    int rc = parse("workers:\n  forward: 2\n  sample: 2\n  fuse: [\"forward,sample\"]\n", &c, &e);
    if (rc)
        fail_msg("%s", e.msg);
    tp_worker_group g[8];
    int n = tp_config_groups(&c, g, 8);
    assert_int_equal(n, 3);
    assert_int_equal(g[0].stages, (1u << TP_SI_FORWARD) | (1u << TP_SI_SAMPLE));
    assert_int_equal(g[0].count, 2);
    assert_int_equal(g[1].stages, 1u << TP_SI_TOKENIZE);
    assert_int_equal(g[2].stages, 1u << TP_SI_STOP);
    tp_config_free(&c);
    assert_int_equal(parse("", &c, &e), 0);
    assert_int_equal(tp_config_groups(&c, g, 8), 4);   /* default: one process per stage */
    tp_config_free(&c);
}

static void bad_fuse_entries_are_rejected(void **state)
{
    (void)state;
    expect_error("workers:\n  forward: 2\n  fuse: [\"forward,sample\"]\n", "workers.fuse[0]", "equal counts");
    expect_error("workers:\n  fuse: [\"forward,smaple\"]\n", "workers.fuse[0]", "unknown stage 'smaple'");
    expect_error("workers:\n  fuse: [\"forward,sample\", \"sample,stop\"]\n", "workers.fuse[1]", "two fuse");
}

static void forward_kernel_takes_the_names_of_the_forward_library(void **state)
{
    (void)state;
    tp_config c;
    tp_err e;
    if (parse("workers:\n  forward_kernel: openblas\n", &c, &e))
        fail_msg("%s", e.msg);
    assert_int_equal(c.forward_kernel, TP_FWD_KERNEL_OPENBLAS);
    tp_config_free(&c);
    assert_int_equal(parse("", &c, &e), 0);
    assert_int_equal(c.forward_kernel, TP_FWD_KERNEL_INVARIANT);
    tp_config_free(&c);
    int n = 0;
    for (; tp_config_kernel_names[n]; n++) {
        tp_fwd_kernel k;
        if (tp_fwd_kernel_parse(tp_config_kernel_names[n], &k, &e) || (int)k != n)
            fail_msg("config kernel name %d '%s' is not tp_fwd_kernel %d", n, tp_config_kernel_names[n], n);
    }
    assert_int_equal(n, 2);
}

static void bad_forward_kernel_is_named_with_its_line(void **state)
{
    (void)state;
    expect_error("workers:\n  forward: 1\n  forward_kernel: blas\n", "t.yaml:3:",
                 "workers.forward_kernel: 'blas' is not one of invariant, openblas");
    expect_error("workers:\n  forward_kernel: \"openblas\"\n", "t.yaml:2:", "workers.forward_kernel");
    expect_error("workers:\n  forward_kernel: [openblas]\n", "workers.forward_kernel", "single value");
}

static void forward_threads_takes_0_for_the_affinity_up_to_the_forward_limit(void **state)
{
    (void)state;
    tp_config c;
    tp_err e;
    assert_int_equal(TP_CONFIG_MAX_FORWARD_THREADS, TP_FORWARD_MAX_THREADS);
    assert_int_equal(parse("", &c, &e), 0);
    assert_int_equal(c.forward_threads, 0);
    tp_config_free(&c);
    if (parse("workers:\n  forward_threads: 256\n", &c, &e))
        fail_msg("%s", e.msg);
    assert_int_equal(c.forward_threads, 256);
    tp_config_free(&c);
    expect_error("workers:\n  forward_threads: 257\n", "t.yaml:2:",
                 "workers.forward_threads: 257 is outside [0, 256]");
    expect_error("workers:\n  forward_threads: -1\n", "t.yaml:2:", "workers.forward_threads");
    expect_error("workers:\n  forward_threads: many\n", "t.yaml:2:",
                 "workers.forward_threads: 'many' is not an integer");
}

static void kv_type_takes_the_names_of_the_forward_library(void **state)
{
    (void)state;
    tp_config c;
    tp_err e;
    assert_int_equal(parse("", &c, &e), 0);
    assert_int_equal(c.kv_type, TP_KV_F32);
    tp_config_free(&c);
    if (parse("kv:\n  kv_type: f16\n", &c, &e))
        fail_msg("%s", e.msg);
    assert_int_equal(c.kv_type, TP_KV_F16);
    tp_config_free(&c);
    int n = 0;
    for (; tp_config_kv_type_names[n]; n++) {
        tp_kv_type t;
        if (tp_kv_type_parse(tp_config_kv_type_names[n], &t, &e) || (int)t != n)
            fail_msg("config kv_type name %d '%s' is not tp_kv_type %d", n, tp_config_kv_type_names[n], n);
    }
    assert_int_equal(n, 2);
    expect_error("kv:\n  slots: 4\n  kv_type: bf16\n", "t.yaml:3:", "kv.kv_type: 'bf16' is not one of f32, f16");
    expect_error("kv:\n  kv_type: [f16]\n", "kv.kv_type", "single value");
}

static void penalty_window_is_bounded_by_its_limit(void **state)
{
    (void)state;
    tp_config c;
    tp_err e;
    if (parse("generation:\n  penalty_window: 0\nlimits:\n  max_penalty_window: 8\n", &c, &e))
        fail_msg("%s", e.msg);
    assert_int_equal(c.def_penalty_window, 0);
    assert_int_equal(c.max_penalty_window, 8);
    tp_config_free(&c);
    expect_error("generation:\n  penalty_window: -1\n", "t.yaml:2:", "generation.penalty_window: -1 is outside [0, ");
    expect_error("limits:\n  max_penalty_window: 2000000\n", "t.yaml:2:", "limits.max_penalty_window: 2000000");
    expect_error("limits:\n  max_penalty_window: 16\n",
                 "generation.penalty_window (64) > limits.max_penalty_window (16)", NULL);
}

static void missing_file_names_the_path(void **state)
{
    (void)state;
    tp_config c;
    tp_err e;
    assert_int_equal(tp_config_load("/nonexistent/x.yaml", &c, &e), TP_EIO);
    assert_non_null(strstr(e.msg, "/nonexistent/x.yaml"));
}

static void parse_stages_reads_lists(void **state)
{
    (void)state;
    unsigned b;
    tp_err e;
    assert_int_equal(tp_config_parse_stages("stop", &b, &e), 0);
    assert_int_equal(b, 1u << TP_SI_STOP);
    assert_int_equal(tp_config_parse_stages("tokenize,forward,sample,stop", &b, &e), 0);
    assert_int_equal(b, 15u);
    assert_int_equal(tp_config_parse_stages("forward,", &b, &e), TP_EINVAL);
    assert_int_equal(tp_config_parse_stages("", &b, &e), TP_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(shipped_yaml_equals_builtin_defaults),
        cmocka_unit_test(file_overrides_only_the_keys_it_names),
        cmocka_unit_test(a_gguf_model_brings_its_vocabulary),
        cmocka_unit_test(empty_file_gives_defaults),
        cmocka_unit_test(unknown_key_is_named_with_its_line),
        cmocka_unit_test(out_of_range_value_is_named_with_its_line),
        cmocka_unit_test(wrong_types_are_rejected),
        cmocka_unit_test(duplicate_key_is_an_error),
        cmocka_unit_test(syntax_error_reports_a_line),
        cmocka_unit_test(cross_field_limits_are_checked),
        cmocka_unit_test(endpoints_default_to_ipc_under_the_runtime_dir),
        cmocka_unit_test(fuse_entries_become_one_process_kind),
        cmocka_unit_test(bad_fuse_entries_are_rejected),
        cmocka_unit_test(forward_kernel_takes_the_names_of_the_forward_library),
        cmocka_unit_test(bad_forward_kernel_is_named_with_its_line),
        cmocka_unit_test(forward_threads_takes_0_for_the_affinity_up_to_the_forward_limit),
        cmocka_unit_test(kv_type_takes_the_names_of_the_forward_library),
        cmocka_unit_test(penalty_window_is_bounded_by_its_limit),
        cmocka_unit_test(missing_file_names_the_path),
        cmocka_unit_test(parse_stages_reads_lists),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
