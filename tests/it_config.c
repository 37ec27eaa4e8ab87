/* Process story: configuration keys reach the workers. A job that leaves
 * penalty_window out gets generation.penalty_window (the same tokens as
 * `tokpipe run --penalty-window`), a window over limits.max_penalty_window
 * is rejected naming the field, `tokpipe generate` leaves the flags it was
 * not given to the daemon's defaults, and forward workers configured with the
 * OpenBLAS kernel serve jobs; a bad kernel name stops tokpiped naming the
 * key and line. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <cJSON.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "support/daemon_harness.h"

#define SAMPLING "--temperature 0.8 --seed 5 --max-tokens 80 --repetition-penalty 1.5 --presence-penalty 0.5"

#define LEFT_OUT INT32_MIN

/* SUBMIT "Tom and Sue" with SAMPLING's values and penalty_window = window
 * (none for LEFT_OUT); returns the ACK status, field and error in why. */
static uint32_t submit(harness *h, const char *id, int32_t window, char *why, size_t why_len)
{
    tp_msg m, r;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_SUBMIT);
    m.submit.job_id = tp_str_of(id);
    m.submit.prompt = tp_str_of("Tom and Sue");
    tp_params *p = &m.submit.params;
    p->set = TP_P_TEMPERATURE | TP_P_SEED | TP_P_MAX_TOKENS | TP_P_REPETITION_PENALTY | TP_P_PRESENCE_PENALTY;
    p->temperature = 0.8, p->seed = 5, p->max_tokens = 80, p->repetition_penalty = 1.5, p->presence_penalty = 0.5;
    if (window != LEFT_OUT)
        p->set |= TP_P_PENALTY_WINDOW, p->penalty_window = window;
    tp_zmsg z;
    assert_int_equal(harness_call(h, &m, &z, &r), 0);
    uint32_t st = r.status;
    snprintf(why, why_len, "field '%.*s': %.*s", (int)r.ack.field.len, r.ack.field.ptr ? r.ack.field.ptr : "",
             (int)r.error.len, r.error.ptr ? r.error.ptr : "");
    tp_msg_clear(&r);
    tp_zmsg_close(&z);
    return st;
}

/* The finished job's completion ids as a JSON array text (caller frees). */
static char *finished_tokens(harness *h, const char *id)
{
    for (int i = 0; i < 1200; i++) {   /* 30 s: a hang detector */
        tp_msg m, r;
        tp_msg_init(&m, TP_FAM_JOB, TP_CMD_STATUS);
        m.jobref.job_id = tp_str_of(id);
        tp_zmsg z;
        assert_int_equal(harness_call(h, &m, &z, &r), 0);
        char *out = NULL;
        if (r.status == TP_ST_OK && r.status_reply.state == TP_STATE_FINISHED) {
            cJSON *a = cJSON_CreateArray();
            for (size_t k = 0; k < r.status_reply.tokens.n; k++)
                cJSON_AddItemToArray(a, cJSON_CreateNumber(tp_raw_i32(r.status_reply.tokens, k)));
            out = cJSON_PrintUnformatted(a);
            cJSON_Delete(a);
        }
        tp_msg_clear(&r);
        tp_zmsg_close(&z);
        if (out)
            return out;
        harness_sleep_ms(25);
    }
    fail_msg("job %s did not finish", id);
    return NULL;
}

/* `tokpipe run --json ARGS` for "Tom and Sue": its tokens array text. */
static char *run_tokens(const harness *h, const char *args)
{
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s/tokpipe run --model %s/stories260K.bin --tokenizer %s/tok512.bin --json "
             "--prompt 'Tom and Sue' %s 2>&1", h->bin, h->models, h->models, args);
    if (harness_sh(cmd, &out) != 0)
        fail_msg("tokpipe run %s failed: %s", args, out ? out : "");
    cJSON *j = cJSON_Parse(out);
    char *tokens = j ? cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "tokens")) : NULL;
    if (!tokens)
        fail_msg("tokpipe run printed no tokens: %s", out);
    cJSON_Delete(j);
    free(out);
    return tokens;
}

static void configured_penalty_window_is_used_when_a_job_leaves_it_out(void **state)
{
    (void)state;
    harness h;
    if (harness_start(&h, false, "generation:\n  penalty_window: 8\nlimits:\n  max_penalty_window: 16\n"))
        fail_msg("daemon did not start");
    char why[300];
    if (submit(&h, "w-default", LEFT_OUT, why, sizeof why) != TP_ST_OK)
        fail_msg("SUBMIT without penalty_window refused: %s", why);
    if (submit(&h, "w-16", 16, why, sizeof why) != TP_ST_OK)
        fail_msg("SUBMIT with penalty_window 16 refused: %s", why);
    char *got8 = finished_tokens(&h, "w-default"), *got16 = finished_tokens(&h, "w-16");
    assert_int_equal(harness_stop(&h), 0);
    char *want8 = run_tokens(&h, SAMPLING " --penalty-window 8");
    char *want16 = run_tokens(&h, SAMPLING " --penalty-window 16");
    if (!strcmp(want8, want16))
        fail_msg("windows 8 and 16 give the same tokens: the test cannot tell them apart");
    if (strcmp(got8, want8))
        fail_msg("configured window 8:\n daemon: %s\n    run: %s", got8, want8);
    if (strcmp(got16, want16))
        fail_msg("requested window 16:\n daemon: %s\n    run: %s", got16, want16);
    free(got8), free(got16), free(want8), free(want16);
}

/* Our encoder refuses a negative window, so this SUBMIT is packed by hand. */
static void negative_window_is_rejected(harness *h)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2);
    msgpack_pack_str_with_body(&pk, "prompt", 6);
    msgpack_pack_str_with_body(&pk, "hi", 2);
    msgpack_pack_str_with_body(&pk, "params", 6);
    msgpack_pack_map(&pk, 1);
    msgpack_pack_str_with_body(&pk, "penalty_window", 14);
    msgpack_pack_int(&pk, -1);
    uint8_t c = TP_CMD_SUBMIT;
    tp_frame f[3] = {{"JOB1", 4}, {&c, 1}, {sb.data, sb.size}};
    tp_zmsg z;
    if (harness_raw_call(h, f, 3, &z, 3000))
        fail_msg("negative window: no reply");
    tp_msg r;
    tp_err e;
    assert_int_equal(tp_proto_decode(TP_FAM_JOB, z.f, z.n, &r, &e), 0);
    if (r.status != TP_ST_BAD_REQUEST || r.ack.field.len != 21 || memcmp(r.ack.field.ptr, "params.penalty_window", 21))
        fail_msg("negative window: status %u, field '%.*s', error %.*s", r.status, (int)r.ack.field.len,
                 r.ack.field.ptr, (int)r.error.len, r.error.ptr);
    tp_msg_clear(&r);
    tp_zmsg_close(&z);
    msgpack_sbuffer_destroy(&sb);
}

static void penalty_window_outside_its_range_is_rejected_naming_the_field(void **state)
{
    (void)state;
    harness h;
    if (harness_start(&h, false, "generation:\n  penalty_window: 8\nlimits:\n  max_penalty_window: 16\n"))
        fail_msg("daemon did not start");
    char why[300];
    assert_int_equal(submit(&h, "w-17", 17, why, sizeof why), TP_ST_BAD_REQUEST);
    if (!strstr(why, "field 'params.penalty_window'") || !strstr(why, "params.penalty_window: 17 exceeds the limit 16"))
        fail_msg("window over the limit: %s", why);
    negative_window_is_rejected(&h);
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s/tokpipe generate --config %s --prompt hi --penalty-window 17 2>&1", h.bin, h.config);
    int st = harness_sh(cmd, &out);
    assert_int_equal(harness_stop(&h), 0);
    if (st != 1 || !out || !strstr(out, "params.penalty_window"))
        fail_msg("tokpipe generate --penalty-window 17: status %d, output: %s", st, out ? out : "");
    free(out);
    out = NULL;
    snprintf(cmd, sizeof cmd, "%s/tokpipe run --model %s/stories260K.bin --tokenizer %s/tok512.bin --prompt hi "
             "--penalty-window -1 2>&1", h.bin, h.models, h.models);
    st = harness_sh(cmd, &out);
    if (st != 2 || !out || !strstr(out, "--penalty-window: -1 is outside [0, "))
        fail_msg("tokpipe run --penalty-window -1: status %d, output: %s", st, out ? out : "");
    free(out);
}

/* `tokpipe generate` sends only the flags it was given: the daemon's
 * generation.* defaults fill in the rest (greedy and 20 tokens here, as
 * `run --temperature 0 --max-tokens 20` computes), and a limit below the
 * shipped penalty window does not refuse a plain generate. */
static void generate_leaves_unset_flags_to_the_daemons_defaults(void **state)
{
    (void)state;
    harness h;
    if (harness_start(&h, false, "generation:\n  temperature: 0\n  max_tokens: 20\n  penalty_window: 8\n"
                                 "limits:\n  max_penalty_window: 8\n"))
        fail_msg("daemon did not start");
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s/tokpipe generate --config %s --json --timeout 20000 --prompt 'Tom and Sue' 2>&1",
             h.bin, h.config);
    int st = harness_sh(cmd, &out);
    assert_int_equal(harness_stop(&h), 0);
    if (st != 0 || !out)
        fail_msg("plain generate failed (status %d): %s", st, out ? out : "");
    cJSON *j = cJSON_Parse(out);
    char *got = j ? cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "tokens")) : NULL;
    if (!got)
        fail_msg("generate printed no tokens: %s", out);
    char *want = run_tokens(&h, "--temperature 0 --max-tokens 20");
    if (strcmp(got, want))
        fail_msg("generate without flags on a greedy, 20-token daemon:\n daemon: %s\n    run: %s", got, want);
    cJSON_Delete(j);
    free(got), free(want), free(out);
}

static void forward_workers_with_the_openblas_kernel_serve_jobs(void **state)
{
    (void)state;
    harness h;
    if (harness_start(&h, false, "  forward_kernel: openblas\n"))
        fail_msg("daemon did not start");
    char cmd[2048], *out = NULL, *log = NULL;
    snprintf(cmd, sizeof cmd, "%s/tokpipe generate --config %s --json --timeout 20000 --temperature 0 --ignore-eos "
             "--max-tokens 40 --prompt 'Once upon a time' --prompt 'The cat sat'", h.bin, h.config);
    int st = harness_sh(cmd, &out);
    snprintf(cmd, sizeof cmd, "cat %s/tokpiped.log", h.dir);
    harness_sh(cmd, &log);
    assert_int_equal(harness_stop(&h), 0);
    if (!log || !strstr(log, "forward kernel openblas"))
        fail_msg("the forward worker did not report the openblas kernel:\n%s", log ? log : "");
    if (st != 0 || !out)
        fail_msg("generate failed (status %d): %s", st, out ? out : "");
    int lines = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"), lines++) {
        cJSON *j = cJSON_Parse(line);
        cJSON *reason = cJSON_GetObjectItem(j, "finish_reason"), *n = cJSON_GetObjectItem(j, "completion_tokens");
        if (!cJSON_IsString(reason) || strcmp(reason->valuestring, "length") || !cJSON_IsNumber(n) ||
            n->valueint != 40)
            fail_msg("job %d did not run to 40 tokens: %s", lines, line);
        cJSON_Delete(j);
    }
    assert_int_equal(lines, 2);
    free(out);
    free(log);
}

static void unknown_forward_kernel_stops_the_daemon_naming_key_and_line(void **state)
{
    (void)state;
    const char *bin = getenv("TP_BIN_DIR");
    char dir[] = "/tmp/tp-it-config-XXXXXX", cmd[2048], *out = NULL;
    assert_non_null(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "printf 'workers:\\n  forward: 1\\n  forward_kernel: blas\\n' > %s/c.yaml && "
             "%s/tokpiped --config %s/c.yaml 2>&1; rc=$?; rm -rf %s; exit $rc", dir, bin ? bin : "bin", dir, dir);
    int st = harness_sh(cmd, &out);
    if (st != 2 || !out || !strstr(out, "c.yaml:3: workers.forward_kernel: 'blas' is not one of invariant, openblas"))
        fail_msg("tokpiped with forward_kernel: blas: status %d, output: %s", st, out ? out : "");
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(configured_penalty_window_is_used_when_a_job_leaves_it_out),
        cmocka_unit_test(penalty_window_outside_its_range_is_rejected_naming_the_field),
        cmocka_unit_test(generate_leaves_unset_flags_to_the_daemons_defaults),
        cmocka_unit_test(forward_workers_with_the_openblas_kernel_serve_jobs),
        cmocka_unit_test(unknown_forward_kernel_stops_the_daemon_naming_key_and_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
