/* bin/tokpipe mkmodel and the synth module: the checkpoints load with the
 * documented shapes, the seed decides the bytes, the tokenizer is well
 * formed, bad arguments are refused with a message. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/forward.h"
#include "tokpipe/model.h"
#include "tokpipe/synth.h"

static char *scratch(const char *name)
{
    static char path[4][4096]; /* test-local; the test runs single-threaded */
    static int next;
    const char *dir = getenv("TP_BUILD_DIR");
    char *p = path[next++ % 4];
    snprintf(p, sizeof path[0], "%s/mkmodel_test_%s", dir ? dir : "/tmp", name);
    return p;
}

static int run(const char *args, char *out, size_t cap)
{
    const char *bin = getenv("TP_BIN_DIR");
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s/tokpipe mkmodel %s 2>&1", bin ? bin : "bin", args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void *slurp(const char *path, size_t *size)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    fseek(fp, 0, SEEK_END);
    *size = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    void *b = malloc(*size ? *size : 1);
    if (fread(b, 1, *size, fp) != *size) {
        free(b);
        b = NULL;
    }
    fclose(fp);
    return b;
}

static void named_shapes_match_the_llama2c_models(void **state)
{
    (void)state;
    struct { const char *name; int d, h, L, H, KV, V, S; uint64_t bytes; } want[] = {
        /* bytes: README formula for stories15M; others from the same rule */
        {"stories15M", 288, 768, 6, 6, 6, 32000, 256, 60816028},
        {"stories42M", 512, 1376, 8, 8, 8, 32000, 1024, 0},
        {"stories110M", 768, 2048, 12, 12, 12, 32000, 1024, 0},
        {"stories260K", 64, 172, 5, 8, 4, 512, 512, 1056540},
    };
    for (size_t i = 0; i < 4; i++) {
        tp_synth_shape s;
        tp_err e;
        assert_int_equal(tp_synth_parse_shape(want[i].name, &s, &e), 0);
        int got[] = {s.dim, s.hidden_dim, s.n_layers, s.n_heads, s.n_kv_heads, s.vocab_size, s.seq_len};
        int exp[] = {want[i].d, want[i].h, want[i].L, want[i].H, want[i].KV, want[i].V, want[i].S};
        assert_memory_equal(got, exp, sizeof exp);
        if (want[i].bytes)
            assert_int_equal(tp_synth_model_bytes(&s), want[i].bytes);
    }
}

static void dim_x_layers_follows_the_llama2c_hidden_rule(void **state)
{
    (void)state;
    tp_synth_shape s;
    tp_err e;
    assert_int_equal(tp_synth_parse_shape("1024x16", &s, &e), 0);
    assert_int_equal(s.hidden_dim, 2752); /* 2/3 * 4096 = 2730 -> 2752 */
    assert_int_equal(s.n_heads, 16);
    assert_int_equal(s.n_layers, 16);
    assert_int_equal(tp_synth_parse_shape("288x3", &s, &e), 0);
    assert_int_equal(s.n_heads, 6); /* 288 = 6 x 48 */
    assert_int_equal(tp_synth_parse_shape("512x8x8x2", &s, &e), 0);
    assert_int_equal(s.n_kv_heads, 2);
    const char *bad[] = {"x", "512", "512x", "512x8x3", "512x8x8x3", "0x4", "stories15", "512x8y"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tp_err be = {0, ""};
        if (tp_synth_parse_shape(bad[i], &s, &be) != TP_EINVAL || !strstr(be.msg, bad[i]))
            fail_msg("shape '%s' should be refused naming it, got '%s'", bad[i], be.msg);
    }
}

static void mkmodel_writes_a_loadable_seeded_checkpoint(void **state)
{
    (void)state;
    char out[4096], args[8192];
    char *a = scratch("a.bin"), *b = scratch("b.bin"), *c = scratch("c.bin"), *t = scratch("tok.bin");
    snprintf(args, sizeof args, "--shape 128x2x4x2 --seed 9 --out %s --tokenizer-out %s --vocab 1000 --quiet", a, t);
    assert_int_equal(run(args, out, sizeof out), 0);
    snprintf(args, sizeof args, "--shape 128x2x4x2 --seed 9 --out %s --vocab 1000 --quiet", b);
    assert_int_equal(run(args, out, sizeof out), 0);
    snprintf(args, sizeof args, "--shape 128x2x4x2 --seed 10 --out %s --vocab 1000 --quiet", c);
    assert_int_equal(run(args, out, sizeof out), 0);
    size_t na, nb, nc;
    void *ba = slurp(a, &na), *bb = slurp(b, &nb), *bc = slurp(c, &nc);
    assert_non_null(ba);
    assert_int_equal(na, nb);
    assert_memory_equal(ba, bb, na);                   /* same seed, same bytes */
    assert_int_not_equal(memcmp(ba, bc, na < nc ? na : nc), 0); /* other seed, other weights */
    tp_model *m;
    tp_err e;
    assert_int_equal(tp_model_load(a, &m, &e), 0);
    const tp_model_config *cf = tp_model_get_config(m);
    assert_int_equal(cf->dim, 128);
    assert_int_equal(cf->n_kv_heads, 2);
    assert_int_equal(cf->vocab_size, 1000);
    /* and it runs: finite logits */
    tp_forward *f;
    assert_int_equal(tp_forward_new(m, 1, 8, 4, &f, &e), 0);
    int sid, toks[3] = {1, 500, 999};
    tp_forward_seq_open(f, &sid, &e);
    float *lg = malloc(sizeof(float) * 1000);
    tp_fwd_item it = {sid, 0, toks, 3, false};
    assert_int_equal(tp_forward_step(f, &it, 1, lg, &e), 0);
    for (int i = 0; i < 1000; i++)
        if (!(lg[i] == lg[i]) || lg[i] > 1e30f || lg[i] < -1e30f)
            fail_msg("logit %d is not finite: %g", i, lg[i]);
    free(lg);
    tp_forward_free(f);
    tp_model_free(m);
    /* tokenizer.bin: max_len, then per token score, length, bytes */
    size_t nt;
    uint8_t *tb = slurp(t, &nt);
    assert_non_null(tb);
    size_t off = 4;
    for (int id = 0; id < 1000; id++) {
        int32_t len;
        assert_true(off + 8 <= nt);
        memcpy(&len, tb + off + 4, 4);
        assert_true(len > 0 && off + 8 + (size_t)len <= nt);
        if (id == 1)
            assert_memory_equal(tb + off + 8, "\n<s>\n", 5);
        if (id == 3 + 0x41)
            assert_memory_equal(tb + off + 8, "<0x41>", 6);
        off += 8 + (size_t)len;
    }
    assert_int_equal(off, nt);
    free(tb); free(ba); free(bb); free(bc);
    remove(a); remove(b); remove(c); remove(t);
}

static void mkmodel_refuses_bad_arguments_with_a_message(void **state)
{
    (void)state;
    char out[16384]; /* the whole --help: a shorter read closes the pipe on it */
    assert_int_equal(run("--shape stories15M --out /dev/null", out, sizeof out), 2);
    assert_non_null(strstr(out, "--seed"));
    assert_int_equal(run("--shape 12x --seed 1 --out /dev/null", out, sizeof out), 2);
    assert_non_null(strstr(out, "shape '12x'"));
    assert_int_equal(run("--shape 64x1 --seed -4 --out /dev/null", out, sizeof out), 2);
    assert_int_equal(run("--shape 64x1 --seed 1 --out /nonexistent/dir/x.bin", out, sizeof out), 1);
    assert_non_null(strstr(out, "/nonexistent/dir/x.bin"));
    assert_int_equal(run("--help", out, sizeof out), 0);
    assert_non_null(strstr(out, "DIMxLAYERS"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(named_shapes_match_the_llama2c_models),
        cmocka_unit_test(dim_x_layers_follows_the_llama2c_hidden_rule),
        cmocka_unit_test(mkmodel_writes_a_loadable_seeded_checkpoint),
        cmocka_unit_test(mkmodel_refuses_bad_arguments_with_a_message),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
