/* zsec: CURVE key files, keygen, and the ZAP handler admitting only listed
 * client keys (over real tcp loopback sockets in one process). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "tokpipe/zsec.h"
#include "tokpipe/zwire.h"

static char dir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/tpzsec-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void path_of(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", dir, name);
}

static void write_file(const char *name, const char *text, mode_t mode)
{
    char p[128];
    path_of(p, sizeof p, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    assert_int_equal(chmod(p, mode), 0);
}

/* The last whitespace-separated word on the first non-comment line. */
static void first_key_in(const char *path, char out[41])
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[256];
    out[0] = '\0';
    while (fgets(line, sizeof line, f))
        if (line[0] != '#' && sscanf(line, "%40s", out) == 1)
            break;
    fclose(f);
}

static void keygen_writes_a_matching_pair_with_a_private_secret(void **state)
{
    (void)state;
    char prefix[128], kp[160], pp[160];
    path_of(prefix, sizeof prefix, "broker");
    snprintf(kp, sizeof kp, "%s.key", prefix);
    snprintf(pp, sizeof pp, "%s.pub", prefix);
    tp_err e;
    if (tp_zsec_keygen(prefix, &e))
        fail_msg("keygen failed: %s", e.msg);
    struct stat st;
    assert_int_equal(stat(kp, &st), 0);
    if ((st.st_mode & 0777) != 0600)
        fail_msg("secret key file has mode 0%o, want 0600", st.st_mode & 0777);
    char sec[41], pub[41], derived[41];
    first_key_in(kp, sec);
    first_key_in(pp, pub);
    assert_int_equal(strlen(sec), 40);
    assert_int_equal(zmq_curve_public(derived, sec), 0);
    if (strcmp(derived, pub))
        fail_msg(".pub holds %s but the secret key's public key is %s", pub, derived);
}

static void keygen_refuses_to_overwrite_an_existing_key(void **state)
{
    (void)state;
    char prefix[128], kp[160];
    path_of(prefix, sizeof prefix, "twice");
    snprintf(kp, sizeof kp, "%s.key", prefix);
    tp_err e;
    assert_int_equal(tp_zsec_keygen(prefix, &e), 0);
    char before[41], after[41];
    first_key_in(kp, before);
    assert_int_not_equal(tp_zsec_keygen(prefix, &e), 0);
    if (!strstr(e.msg, kp) || !strstr(e.msg, "not overwriting"))
        fail_msg("refusal does not name %s: %s", kp, e.msg);
    first_key_in(kp, after);
    assert_string_equal(before, after);
}

static void secret_key_readable_by_others_is_refused_naming_the_file(void **state)
{
    (void)state;
    char pub[41], sec[41], text[200], p[128], out[41];
    assert_int_equal(zmq_curve_keypair(pub, sec), 0);
    snprintf(text, sizeof text, "%s\n", sec);
    write_file("open.key", text, 0644);
    path_of(p, sizeof p, "open.key");
    tp_err e;
    assert_int_equal(tp_zsec_read_key(p, true, out, &e), TP_EINVAL);
    if (!strstr(e.msg, p) || !strstr(e.msg, "0644"))
        fail_msg("message does not name the file and its mode: %s", e.msg);
    /* the same file is fine once private */
    assert_int_equal(chmod(p, 0600), 0);
    if (tp_zsec_read_key(p, true, out, &e))
        fail_msg("0600 key refused: %s", e.msg);
    assert_string_equal(out, sec);
}

/* A service user reads root:tokpipe 0640 keys (ssh's rule for a file
 * someone else owns); world bits are refused whoever owns the file. */
static void group_readable_key_owned_by_another_user_is_accepted(void **state)
{
    (void)state;
    if (geteuid() != 0)
        skip();   /* only root can give a file away */
    char pub[41], sec[41], text[200], p[128], out[41];
    assert_int_equal(zmq_curve_keypair(pub, sec), 0);
    snprintf(text, sizeof text, "%s\n", sec);
    write_file("shared.key", text, 0640);
    path_of(p, sizeof p, "shared.key");
    assert_int_equal(chown(p, 65534, 0), 0);
    tp_err e;
    if (tp_zsec_read_key(p, true, out, &e))
        fail_msg("0640 key owned by another user refused: %s", e.msg);
    assert_int_equal(chmod(p, 0644), 0);
    assert_int_equal(tp_zsec_read_key(p, true, out, &e), TP_EINVAL);
}

static void bad_key_line_is_named_with_file_and_line(void **state)
{
    (void)state;
    char p[128], out[41];
    tp_err e;
    write_file("bad.pub", "# comment\n\nnot-a-key\n", 0644);
    path_of(p, sizeof p, "bad.pub");
    assert_int_equal(tp_zsec_read_key(p, false, out, &e), TP_EFORMAT);
    char want[160];
    snprintf(want, sizeof want, "%s:3:", p);
    if (!strstr(e.msg, want))
        fail_msg("expected '%s' in: %s", want, e.msg);
    /* 40 characters, but '"' is not in the Z85 alphabet */
    write_file("quote.pub", "\"000000000000000000000000000000000000000\n", 0644);
    path_of(p, sizeof p, "quote.pub");
    assert_int_equal(tp_zsec_read_key(p, false, out, &e), TP_EFORMAT);
    snprintf(want, sizeof want, "%s:1:", p);
    if (!strstr(e.msg, want))
        fail_msg("expected '%s' in: %s", want, e.msg);
}

static void key_file_with_two_keys_or_none_is_refused(void **state)
{
    (void)state;
    char pub[41], sec[41], text[200], p[128], out[41];
    tp_err e;
    assert_int_equal(zmq_curve_keypair(pub, sec), 0);
    snprintf(text, sizeof text, "%s a\n%s b\n", pub, pub);
    write_file("two.pub", text, 0644);
    path_of(p, sizeof p, "two.pub");
    assert_int_equal(tp_zsec_read_key(p, false, out, &e), TP_EFORMAT);
    if (!strstr(e.msg, ":2:"))
        fail_msg("second key not named by line: %s", e.msg);
    write_file("none.pub", "# only a comment\n", 0644);
    path_of(p, sizeof p, "none.pub");
    assert_int_equal(tp_zsec_read_key(p, false, out, &e), TP_EFORMAT);
    if (!strstr(e.msg, "no key"))
        fail_msg("empty key file: %s", e.msg);
}

static void client_without_a_secret_key_names_the_missing_setting(void **state)
{
    (void)state;
    tp_config c;
    tp_err e;
    const char *y = "security:\n  curve: true\n  server_public_key: x.pub\n";
    assert_int_equal(tp_config_parse(y, strlen(y), "t.yaml", &c, &e), 0);
    tp_zsec_client zc;
    assert_int_not_equal(tp_zsec_client_load(&c, &zc, &e), 0);
    if (!strstr(e.msg, "security.client_secret_key"))
        fail_msg("missing key not named: %s", e.msg);
    assert_false(zc.on);
    tp_config_free(&c);
    assert_int_equal(tp_config_parse("", 0, "t.yaml", &c, &e), 0);
    assert_int_equal(tp_zsec_client_load(&c, &zc, &e), 0);
    assert_false(zc.on);
    tp_config_free(&c);
}

/* ---- ZAP over real sockets -------------------------------------------------- */

static void make_pair(const char *name, char pub[41], mode_t key_mode)
{
    char sec[41], text[200];
    assert_int_equal(zmq_curve_keypair(pub, sec), 0);
    char f[64];
    snprintf(text, sizeof text, "%s\n", sec);
    snprintf(f, sizeof f, "%s.key", name);
    write_file(f, text, key_mode);
    snprintf(text, sizeof text, "%s %s\n", pub, name);
    snprintf(f, sizeof f, "%s.pub", name);
    write_file(f, text, 0644);
}

static void load_config(tp_config *c, const char *client)
{
    char y[1024];
    snprintf(y, sizeof y,
             "security:\n  curve: true\n  server_secret_key: %s/srv.key\n  server_public_key: %s/srv.pub\n"
             "  authorized_keys: %s/authorized\n  client_secret_key: %s/%s.key\n",
             dir, dir, dir, dir, client);
    tp_err e;
    if (tp_config_parse(y, strlen(y), "t.yaml", c, &e))
        fail_msg("config: %s", e.msg);
}

/* Send one message from a client socket; poll the server's router and ZAP
 * until it arrives or 1 s passes. Returns whether the router got it. */
static bool reaches_server(tp_zsec_server *s, void *router, void *client)
{
    zmq_send(client, "hi", 2, ZMQ_DONTWAIT);
    int64_t end = tp_now_ms() + 1000;
    while (tp_now_ms() < end) {
        zmq_pollitem_t it[2] = {{router, 0, ZMQ_POLLIN, 0}, {tp_zsec_server_socket(s), 0, ZMQ_POLLIN, 0}};
        zmq_poll(it, 2, 50);
        if (it[1].revents & ZMQ_POLLIN)
            tp_zsec_server_handle(s);
        if (it[0].revents & ZMQ_POLLIN) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            while (zmq_msg_recv(&m, router, ZMQ_DONTWAIT) >= 0 && zmq_msg_more(&m))
                ;
            zmq_msg_close(&m);
            return true;
        }
    }
    return false;
}

static void *client_socket(void *ctx, const tp_config *c, const char *ep, bool curve)
{
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
    tp_zsec_client zc;
    tp_err e;
    if (curve && (tp_zsec_client_load(c, &zc, &e) || tp_zsec_client_apply(&zc, d, ep, &e)))
        fail_msg("client keys: %s", e.msg);
    assert_int_equal(zmq_connect(d, ep), 0);
    return d;
}

static void count_refusal_lines(void *ctx, const char *line)
{
    if (strstr(line, "refused"))
        ++*(int *)ctx;
}

static void zap_admits_listed_keys_and_counts_the_others(void **state)
{
    (void)state;
    char srv[41], good[41], bad[41], text[300];
    make_pair("srv", srv, 0600);
    make_pair("good", good, 0600);
    make_pair("bad", bad, 0600);
    snprintf(text, sizeof text, "# workers\n%s good\n\n", good);
    write_file("authorized", text, 0644);
    tp_config cs, cg, cb;
    load_config(&cs, "good");
    load_config(&cg, "good");
    load_config(&cb, "bad");
    void *ctx = zmq_ctx_new();
    tp_zsec_server *s;
    tp_err e;
    int lines = 0;
    if (tp_zsec_server_new(ctx, &cs, count_refusal_lines, &lines, &s, &e))
        fail_msg("server: %s", e.msg);
    assert_int_equal(tp_zsec_server_n_authorized(s), 1);
    void *router = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(router, ZMQ_LINGER, &zero, sizeof zero);
    if (tp_zsec_server_apply(s, router, "tcp://127.0.0.1:0", TP_ZSEC_CLIENT, &e))
        fail_msg("apply: %s", e.msg);
    assert_int_equal(zmq_bind(router, "tcp://127.0.0.1:*"), 0);
    char ep[64];
    size_t len = sizeof ep;
    zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &len);

    void *d_bad = client_socket(ctx, &cb, ep, true);
    void *d_bad2 = client_socket(ctx, &cb, ep, true);
    void *d_plain = client_socket(ctx, &cg, ep, false);
    void *d_good = client_socket(ctx, &cg, ep, true);
    if (reaches_server(s, router, d_bad))
        fail_msg("a key not in authorized_keys got through");
    if (reaches_server(s, router, d_bad2))
        fail_msg("a second connection with the unlisted key got through");
    if (tp_zsec_server_refused(s) < 2)
        fail_msg("%llu refusals counted for two unlisted connections", (unsigned long long)tp_zsec_server_refused(s));
    /* a client retrying in a loop must not flood the log */
    if (lines != 1)
        fail_msg("%d log lines for two refusals within a second, want 1", lines);
    if (reaches_server(s, router, d_plain))
        fail_msg("a plain-text client got through to a CURVE socket");
    if (!reaches_server(s, router, d_good))
        fail_msg("the authorized key did not get through");
    zmq_close(d_bad);
    zmq_close(d_bad2);
    zmq_close(d_plain);
    zmq_close(d_good);
    zmq_close(router);
    tp_zsec_server_free(s);
    zmq_ctx_term(ctx);
    tp_config_free(&cs);
    tp_config_free(&cg);
    tp_config_free(&cb);
}

static void server_refuses_a_public_key_of_another_pair(void **state)
{
    (void)state;
    char srv[41], other[41];
    make_pair("srv", srv, 0600);
    make_pair("other", other, 0600);
    write_file("authorized", "", 0644);
    char y[600];
    snprintf(y, sizeof y,
             "security:\n  curve: true\n  server_secret_key: %s/srv.key\n  server_public_key: %s/other.pub\n"
             "  authorized_keys: %s/authorized\n",
             dir, dir, dir);
    tp_config c;
    tp_err e;
    assert_int_equal(tp_config_parse(y, strlen(y), "t.yaml", &c, &e), 0);
    void *ctx = zmq_ctx_new();
    tp_zsec_server *s = NULL;
    assert_int_not_equal(tp_zsec_server_new(ctx, &c, NULL, NULL, &s, &e), 0);
    assert_null(s);
    if (!strstr(e.msg, "other.pub") || !strstr(e.msg, "srv.key"))
        fail_msg("mismatch not explained: %s", e.msg);
    zmq_ctx_term(ctx);
    tp_config_free(&c);
}

static void authorized_keys_writable_by_others_is_refused(void **state)
{
    (void)state;
    char srv[41];
    make_pair("srv", srv, 0600);
    write_file("authorized", "", 0666);
    tp_config c;
    load_config(&c, "srv");
    void *ctx = zmq_ctx_new();
    tp_zsec_server *s = NULL;
    tp_err e;
    assert_int_not_equal(tp_zsec_server_new(ctx, &c, NULL, NULL, &s, &e), 0);
    if (!strstr(e.msg, "/authorized") || !strstr(e.msg, "0666"))
        fail_msg("refusal does not name the file and mode: %s", e.msg);
    zmq_ctx_term(ctx);
    tp_config_free(&c);
}

static void role_key_file_holding_no_key_is_refused_naming_it(void **state)
{
    (void)state;
    char srv[41], a[41], y[1024];
    make_pair("srv", srv, 0600);
    make_pair("alice", a, 0600);
    write_file("nobody", "# no keys yet\n\n", 0644);
    snprintf(y, sizeof y,
             "security:\n  curve: true\n  server_secret_key: %s/srv.key\n  client_keys: %s/alice.pub\n"
             "  worker_keys: %s/nobody\n",
             dir, dir, dir);
    tp_config c;
    tp_err e;
    if (tp_config_parse(y, strlen(y), "t.yaml", &c, &e))
        fail_msg("config: %s", e.msg);
    void *ctx = zmq_ctx_new();
    tp_zsec_server *s = NULL;
    assert_int_not_equal(tp_zsec_server_new(ctx, &c, NULL, NULL, &s, &e), 0);
    if (!strstr(e.msg, "/nobody") || !strstr(e.msg, "no key") || !strstr(e.msg, "worker"))
        fail_msg("an empty worker_keys file is not refused by name: %s", e.msg);
    zmq_ctx_term(ctx);
    tp_config_free(&c);
}

static void secret_key_in_a_folder_others_can_write_is_refused(void **state)
{
    (void)state;
    char sub_dir[128], key[160], pub[41], sec[41], text[100];
    snprintf(sub_dir, sizeof sub_dir, "%s/open", dir);
    assert_int_equal(mkdir(sub_dir, 0700), 0);
    assert_int_equal(zmq_curve_keypair(pub, sec), 0);
    snprintf(key, sizeof key, "%s/k.key", sub_dir);
    snprintf(text, sizeof text, "%s\n", sec);
    FILE *f = fopen(key, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    assert_int_equal(chmod(key, 0600), 0);
    char got[41];
    tp_err e;
    if (tp_zsec_read_key(key, true, got, &e))
        fail_msg("a key in a 0700 folder was refused: %s", e.msg);
    assert_int_equal(chmod(sub_dir, 0777), 0);
    assert_int_not_equal(tp_zsec_read_key(key, true, got, &e), 0);
    if (!strstr(e.msg, sub_dir) || !strstr(e.msg, "0777"))
        fail_msg("refusal does not name the folder and its mode: %s", e.msg);
    assert_int_equal(chmod(sub_dir, 01777), 0);   /* sticky, like /tmp */
    if (tp_zsec_read_key(key, true, got, &e))
        fail_msg("a key in a sticky folder was refused: %s", e.msg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(keygen_writes_a_matching_pair_with_a_private_secret),
        cmocka_unit_test(keygen_refuses_to_overwrite_an_existing_key),
        cmocka_unit_test(secret_key_readable_by_others_is_refused_naming_the_file),
        cmocka_unit_test(group_readable_key_owned_by_another_user_is_accepted),
        cmocka_unit_test(bad_key_line_is_named_with_file_and_line),
        cmocka_unit_test(key_file_with_two_keys_or_none_is_refused),
        cmocka_unit_test(client_without_a_secret_key_names_the_missing_setting),
        cmocka_unit_test(zap_admits_listed_keys_and_counts_the_others),
        cmocka_unit_test(server_refuses_a_public_key_of_another_pair),
        cmocka_unit_test(authorized_keys_writable_by_others_is_refused),
        cmocka_unit_test(role_key_file_holding_no_key_is_refused_naming_it),
        cmocka_unit_test(secret_key_in_a_folder_others_can_write_is_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
