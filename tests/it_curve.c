/* Process story: tokpiped with security.curve on tcp loopback. Keys come
 * from `tokpipe keygen`; one config serves the broker and the workers it
 * spawns. An authorized client gets the same tokens as `tokpipe run`; a
 * client with an unlisted key, a plain-text client and a plain-text worker
 * get nothing (the unlisted key is counted in STATS) while the authorized
 * ones go on being served; a secret key file others can read stops every
 * program with a message naming the file; ipc endpoints stay plain; with
 * client_keys and worker_keys a key is refused outside its role. */
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
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "support/daemon_harness.h"

static harness H;
static char keys[64];
static char extra[1024];

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *sh_out;

/* Run a formatted shell command (stderr merged into stdout, kept in
 * sh_out until the next call); its exit status. */
static int sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    strcat(cmd, " 2>&1");
    free(sh_out);
    sh_out = NULL;
    int st = harness_sh(cmd, &sh_out);
    if (!sh_out)
        sh_out = strdup("");
    return st;
}

/* h's config without its security section, plus `tail`. */
static void config_variant_of(const harness *h, const char *path, const char *tail)
{
    char *base = NULL;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "cat %s", h->config);
    assert_int_equal(harness_sh(cmd, &base), 0);
    char *sec = strstr(base, "security:");
    assert_non_null(sec);
    *sec = '\0';
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "%s%s", base, tail);
    assert_int_equal(fclose(f), 0);
    free(base);
}

static void config_variant(const char *path, const char *tail)
{
    config_variant_of(&H, path, tail);
}

static int setup(void **state)
{
    (void)state;
    const char *bin = getenv("TP_BIN_DIR");
    snprintf(keys, sizeof keys, "/tmp/tpcurve-XXXXXX");
    if (!mkdtemp(keys))
        return -1;
    const char *names[] = {"srv", "worker", "intruder", "alice"};
    for (int i = 0; i < 4; i++)
        if (sh("%s/tokpipe keygen --out %s/%s", bin ? bin : "bin", keys, names[i])) {
            fprintf(stderr, "keygen failed: %s\n", sh_out);
            return -1;
        }
    /* authorized_keys = the worker's .pub, as the README says */
    if (sh("(echo '# tokpipe workers and clients'; cat %s/worker.pub) > %s/authorized", keys, keys))
        return -1;
    snprintf(extra, sizeof extra,
             "security:\n  curve: true\n  server_secret_key: %s/srv.key\n  server_public_key: %s/srv.pub\n"
             "  authorized_keys: %s/authorized\n  client_secret_key: %s/worker.key\n",
             keys, keys, keys, keys);
    if (harness_start(&H, true, extra) == 0)
        return 0;
    harness_stop(&H);
    return -1;
}

static int teardown(void **state)
{
    (void)state;
    int st = harness_stop(&H);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", keys);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", keys);
    free(sh_out);
    return st == 0 ? 0 : -1;
}

static void keygen_writes_a_private_valid_pair_and_never_overwrites(void **state)
{
    (void)state;
    char kp[128], sec[64] = "", pub[64] = "", derived[41], line[256];
    snprintf(kp, sizeof kp, "%s/srv.key", keys);
    struct stat st;
    assert_int_equal(stat(kp, &st), 0);
    if ((st.st_mode & 0777) != 0600)
        fail_msg("%s has mode 0%o, want 0600", kp, st.st_mode & 0777);
    FILE *f = fopen(kp, "r");
    assert_non_null(f);
    while (fgets(line, sizeof line, f))
        if (line[0] != '#')
            sscanf(line, "%63s", sec);
    fclose(f);
    snprintf(line, sizeof line, "%s/srv.pub", keys);
    f = fopen(line, "r");
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%63s", pub), 1);
    fclose(f);
    assert_int_equal(zmq_curve_public(derived, sec), 0);
    assert_string_equal(derived, pub);
    int rc = sh("%s/tokpipe keygen --out %s/srv", H.bin, keys);
    if (rc == 0 || !strstr(sh_out, kp))
        fail_msg("second keygen over %s: status %d, output: %s", kp, rc, sh_out);
    f = fopen(kp, "r");
    char again[64] = "";
    while (f && fgets(line, sizeof line, f))
        if (line[0] != '#')
            sscanf(line, "%63s", again);
    if (f)
        fclose(f);
    assert_string_equal(again, sec);
}

static void unlisted_client_key_gets_nothing_and_is_counted(void **state)
{
    (void)state;
    sh("cat %s/tokpiped.log", H.dir);
    if (!strstr(sh_out, "CURVE on the tcp endpoints (front, back, events, publish): 1 client and 1 worker key from"))
        fail_msg("the daemon does not say what CURVE covers:\n%s", sh_out);
    if (!strstr(sh_out, "may act as clients AND as workers"))
        fail_msg("the daemon does not warn that authorized_keys mixes the roles:\n%s", sh_out);
    char cfg[128], tail[600];
    snprintf(cfg, sizeof cfg, "%s/intruder.yaml", keys);
    snprintf(tail, sizeof tail,
             "security:\n  curve: true\n  server_public_key: %s/srv.pub\n  client_secret_key: %s/intruder.key\n",
             keys, keys);
    config_variant(cfg, tail);
    tp_m_stats_reply before, after;
    assert_int_equal(harness_stats(&H, &before), 0);
    int rc = sh("%s/tokpipe stats --config %s --timeout 1500", H.bin, cfg);
    if (rc != 1 || !strstr(sh_out, "no reply") || !strstr(sh_out, "authorized_keys"))
        fail_msg("a client with an unlisted key got status %d (want 1 and a hint at its key): %s", rc, sh_out);
    rc = sh("%s/tokpipe generate --config %s --timeout 1500 --prompt hi --max-tokens 4", H.bin, cfg);
    if (rc == 0)
        fail_msg("a client with an unlisted key ran a job: %s", sh_out);
    /* the authorized client is still served, and sees the refusals */
    if (harness_stats(&H, &after))
        fail_msg("the authorized client lost its STATS after the refusals");
    if (after.zap_refused <= before.zap_refused)
        fail_msg("zap_refused went from %llu to %llu", (unsigned long long)before.zap_refused,
                 (unsigned long long)after.zap_refused);
    rc = sh("%s/tokpipe stats --config %s --json", H.bin, H.config);
    cJSON *j = rc == 0 ? cJSON_Parse(sh_out) : NULL;
    if (!j || cJSON_GetNumberValue(cJSON_GetObjectItem(j, "zap_refused")) < 1)
        fail_msg("tokpipe stats does not show zap_refused: %s", sh_out);
    cJSON_Delete(j);
}

static void plain_text_client_and_worker_get_nothing(void **state)
{
    (void)state;
    char cfg[128];
    snprintf(cfg, sizeof cfg, "%s/plain.yaml", keys);
    config_variant(cfg, "");
    int rc = sh("%s/tokpipe stats --config %s --timeout 1500", H.bin, cfg);
    if (rc != 1 || !strstr(sh_out, "no reply"))
        fail_msg("a plain-text client got status %d: %s", rc, sh_out);
    /* a plain-text sample worker cannot register on the backend */
    char exe[600];
    snprintf(exe, sizeof exe, "%s/tokpipe-worker", H.bin);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *nul = freopen("/dev/null", "w", stderr);
        (void)nul;
        execl(exe, exe, "--config", cfg, "--stage", "sample", (char *)NULL);
        _exit(127);
    }
    assert_true(pid > 0);
    struct timespec ts = {1, 500000000L};
    nanosleep(&ts, NULL);
    tp_m_stats_reply st;
    int got = harness_stats(&H, &st);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    assert_int_equal(got, 0);
    if (st.workers[2] != 1)
        fail_msg("%llu sample workers registered; the plain-text one must not", (unsigned long long)st.workers[2]);
}

/* "tokens" and "text" of each JSON line of a and b agree. */
static void same_tokens(const char *a, const char *b)
{
    cJSON *ja = cJSON_Parse(a), *jb = cJSON_Parse(b);
    if (!ja || !jb)
        fail_msg("not one JSON line each:\n%s\n%s", a, b);
    const char *fields[] = {"tokens", "text", "finish_reason"};
    for (int i = 0; i < 3; i++) {
        char *x = cJSON_PrintUnformatted(cJSON_GetObjectItem(ja, fields[i]));
        char *y = cJSON_PrintUnformatted(cJSON_GetObjectItem(jb, fields[i]));
        if (!x || !y || strcmp(x, y))
            fail_msg("%s differs:\n daemon: %s\n    run: %s", fields[i], x ? x : "(none)", y ? y : "(none)");
        free(x);
        free(y);
    }
    cJSON_Delete(ja);
    cJSON_Delete(jb);
}

static void authorized_client_job_equals_in_process_run(void **state)
{
    (void)state;
    const char *job = "--prompt 'Once upon a time' --temperature 0.8 --seed 5 --max-tokens 48 --stop '.'";
    if (sh("%s/tokpipe generate --config %s --json --timeout 20000 %s", H.bin, H.config, job))
        fail_msg("generate over CURVE failed: %s", sh_out);
    char *got = strdup(sh_out);
    if (sh("%s/tokpipe run --model %s/stories260K.bin --tokenizer %s/tok512.bin --json %s", H.bin, H.models,
           H.models, job))
        fail_msg("tokpipe run failed: %s", sh_out);
    same_tokens(got, sh_out);
    free(got);
}

static void secret_key_readable_by_others_stops_every_program_naming_it(void **state)
{
    (void)state;
    char open_key[128], cfg[128], tail[800];
    snprintf(open_key, sizeof open_key, "%s/open.key", keys);
    assert_int_equal(sh("cp %s/srv.key %s && chmod 644 %s", keys, open_key, open_key), 0);
    snprintf(cfg, sizeof cfg, "%s/open.yaml", keys);
    /* also the client key: the workers and clients read the same file */
    snprintf(tail, sizeof tail,
             "security:\n  curve: true\n  server_secret_key: %s\n  server_public_key: %s/srv.pub\n"
             "  authorized_keys: %s/authorized\n  client_secret_key: %s\n",
             open_key, keys, keys, open_key);
    config_variant(cfg, tail);
    const char *progs[] = {"timeout 10 %s/tokpiped --config %s --no-spawn",
                           "timeout 10 %s/tokpipe-worker --config %s --stage sample",
                           "timeout 10 %s/tokpipe stats --config %s"};
    for (int i = 0; i < 3; i++) {
        int rc = sh(progs[i], H.bin, cfg);
        if (rc == 0 || rc == 124 || !strstr(sh_out, open_key) || !strstr(sh_out, "0644"))
            fail_msg("'%s' with a 0644 secret key: status %d, output: %s", progs[i], rc, sh_out);
    }
}

/* How many workers of stage si the broker of h counts, asked with h's own
 * (client) key; -1 if it does not answer. */
static long long workers_of(harness *h, int si)
{
    tp_m_stats_reply st;
    return harness_stats(h, &st) ? -1 : (long long)st.workers[si];
}

/* Wait (up to 30 s: a loaded machine starts an ASan worker slowly) until
 * the broker of h has refused more CURVE peers than `than`; its count. */
static uint64_t wait_refused(harness *h, uint64_t than)
{
    tp_m_stats_reply st = {0};
    for (int i = 0; i < 1500 && (harness_stats(h, &st) || st.zap_refused <= than); i++) {
        struct timespec ts = {0, 20000000L};
        nanosleep(&ts, NULL);
    }
    return st.zap_refused;
}

static void client_and_worker_keys_are_refused_outside_their_role(void **state)
{
    (void)state;
    /* alice is a client, the worker key a worker: the split the README
     * recommends instead of one authorized_keys */
    char tail[1200], wcfg[128];
    assert_int_equal(sh("cat %s/alice.pub > %s/clients && cat %s/worker.pub > %s/workers", keys, keys, keys, keys), 0);
    snprintf(tail, sizeof tail,
             "security:\n  curve: true\n  server_secret_key: %s/srv.key\n  server_public_key: %s/srv.pub\n"
             "  client_keys: %s/clients\n  worker_keys: %s/workers\n  client_secret_key: %s/alice.key\n",
             keys, keys, keys, keys, keys);
    harness h;
    if (harness_start_ex(&h, true, tail, true, NULL))
        fail_msg("daemon with client_keys and worker_keys did not start");
    snprintf(wcfg, sizeof wcfg, "%s/as-worker.yaml", keys);
    snprintf(tail, sizeof tail,
             "security:\n  curve: true\n  server_public_key: %s/srv.pub\n  client_secret_key: %s/worker.key\n",
             keys, keys);
    config_variant_of(&h, wcfg, tail);
    long long w0 = workers_of(&h, TP_SI_SAMPLE);
    tp_m_stats_reply st0;
    assert_int_equal(harness_stats(&h, &st0), 0);

    /* a client key cannot register as a worker (refused at its handshake:
     * waited for, not guessed with a fixed sleep) ... */
    pid_t intruder = harness_worker(&h, "sample");
    uint64_t refused = wait_refused(&h, st0.zap_refused);
    struct timespec ts = {0, 300000000L};
    nanosleep(&ts, NULL);
    long long w1 = workers_of(&h, TP_SI_SAMPLE);
    kill(intruder, SIGTERM);
    waitpid(intruder, NULL, 0);
    /* ... nor publish events */
    tp_m_stats_reply before, after;
    int got_before = harness_stats(&h, &before);
    void *ctx = zmq_ctx_new(), *pub = zmq_socket(ctx, ZMQ_PUB);
    int zero = 0;
    zmq_setsockopt(pub, ZMQ_LINGER, &zero, sizeof zero);
    tp_zsec_client_apply(&h.sec, pub, h.publish, NULL);
    zmq_connect(pub, h.publish);
    wait_refused(&h, refused > before.zap_refused ? refused : before.zap_refused);
    zmq_send(pub, "forged", 6, ZMQ_SNDMORE);
    zmq_send(pub, "EVT1", 4, 0);
    nanosleep(&ts, NULL);
    zmq_close(pub);
    zmq_ctx_term(ctx);
    int got_after = harness_stats(&h, &after);
    /* a worker key cannot act as a client; the broker logs at most one
     * refusal a second, so a refusal right after the publisher's may go
     * unlogged: asked again (each ask takes its 1.5 s timeout) until the
     * log names the client endpoints */
    int rc = 0;
    char *as_client = NULL;
    for (int i = 0; i < 5; i++) {
        free(as_client);
        rc = sh("%s/tokpipe stats --config %s --timeout 1500", h.bin, wcfg);
        as_client = strdup(sh_out);
        if (rc != 1 || sh("grep -c 'on the client endpoints' %s/tokpiped.log", h.dir) == 0)
            break;
    }
    /* and the worker key does register as a worker */
    char exe[600];
    snprintf(exe, sizeof exe, "%s/tokpipe-worker", h.bin);
    pid_t real = fork();
    if (real == 0) {
        FILE *nul = freopen("/dev/null", "w", stderr);
        (void)nul;
        execl(exe, exe, "--config", wcfg, "--stage", "sample", (char *)NULL);
        _exit(127);
    }
    int registered = harness_wait_stage(&h, TP_SI_SAMPLE, (uint64_t)w0 + 1, 10000);
    kill(real, SIGTERM);
    waitpid(real, NULL, 0);
    sh("cat %s/tokpiped.log", h.dir);
    char *log = strdup(sh_out);
    assert_int_equal(harness_stop(&h), 0);

    if (w0 != 0 || w1 != 0)
        fail_msg("a client key registered a worker (sample workers %lld -> %lld)", w0, w1);
    if (got_before || got_after || after.malformed_events != before.malformed_events ||
        after.zap_refused <= before.zap_refused)
        fail_msg("a client key publishing events was not refused (zap_refused %llu -> %llu, malformed_events "
                 "%llu -> %llu)", (unsigned long long)before.zap_refused, (unsigned long long)after.zap_refused,
                 (unsigned long long)before.malformed_events, (unsigned long long)after.malformed_events);
    if (rc != 1 || !strstr(as_client, "no reply"))
        fail_msg("a worker key was answered on the front (status %d): %s", rc, as_client);
    if (registered)
        fail_msg("the worker key did not register as a worker:\n%s", log);
    if (!strstr(log, "on the worker endpoints") || !strstr(log, "on the client endpoints"))
        fail_msg("the refusals do not name the role:\n%s", log);
    free(as_client);
    free(log);
}

static void ipc_endpoints_stay_plain_with_curve_on(void **state)
{
    (void)state;
    harness h;
    if (harness_start(&h, false, extra))
        fail_msg("daemon with curve on and ipc endpoints did not start");
    int rc = sh("%s/tokpipe generate --config %s --timeout 20000 --prompt 'The cat' --temperature 0 --max-tokens 8",
                h.bin, h.config);
    tp_m_stats_reply st;
    int srv = harness_stats(&h, &st);
    char *log = NULL;
    sh("cat %s/tokpiped.log", h.dir);
    log = strdup(sh_out);
    assert_int_equal(harness_stop(&h), 0);
    if (rc)
        fail_msg("job over ipc with curve on: %s", sh_out);
    if (!strstr(log, "every endpoint is ipc"))
        fail_msg("the daemon did not warn that curve secures nothing over ipc:\n%s", log);
    free(log);
    assert_int_equal(srv, 0);
    assert_int_equal(st.zap_refused, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(keygen_writes_a_private_valid_pair_and_never_overwrites),
        cmocka_unit_test(unlisted_client_key_gets_nothing_and_is_counted),
        cmocka_unit_test(plain_text_client_and_worker_get_nothing),
        cmocka_unit_test(authorized_client_job_equals_in_process_run),
        cmocka_unit_test(secret_key_readable_by_others_stops_every_program_naming_it),
        cmocka_unit_test(ipc_endpoints_stay_plain_with_curve_on),
        cmocka_unit_test(client_and_worker_keys_are_refused_outside_their_role),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
