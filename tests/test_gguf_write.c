/* GGUF writer: files it writes read back through tp_gguf_parse with every
 * key, value, shape and byte; bad tensors and alignments are refused. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>

#include "tokpipe/gguf.h"
#include "tokpipe/gguf_write.h"
#include "support/model_files.h"

typedef struct tmpdir { char path[64]; char file[96]; } tmpdir;

static int setup(void **state)
{
    tmpdir *t = calloc(1, sizeof *t);
    snprintf(t->path, sizeof t->path, "/tmp/tp_gguf_write.XXXXXX");
    if (!mkdtemp(t->path))
        return -1;
    snprintf(t->file, sizeof t->file, "%s/out.gguf", t->path);
    *state = t;
    return 0;
}

static int teardown(void **state)
{
    tmpdir *t = *state;
    DIR *d = opendir(t->path);
    struct dirent *e;
    char p[400];
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') {
            snprintf(p, sizeof p, "%s/%s", t->path, e->d_name);
            unlink(p);
        }
    if (d)
        closedir(d);
    rmdir(t->path);
    free(t);
    return 0;
}

static uint8_t *slurp(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = aligned_alloc(64, (*size + 63) / 64 * 64);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, *size, f), *size);
    fclose(f);
    return b;
}

static int count_files(const char *dir)
{
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += e->d_name[0] != '.';
    if (d)
        closedir(d);
    return n;
}

static void metadata_of_every_kind_reads_back(void **state)
{
    tmpdir *t = *state;
    tp_gguf_writer *w;
    tp_err e;
    assert_int_equal(tp_gguf_writer_new(&w, &e), 0);
    const char *names[] = {"a", "", "ü€😀", "<|eot_id|>"};
    int32_t ints[] = {-7, 0, 1 << 30};
    float fl[] = {1.5f, -0.25f};
    assert_int_equal(tp_gguf_set_str(w, "general.architecture", "llama", &e), 0);
    assert_int_equal(tp_gguf_set_u32(w, "x.u32", 4000000000u, &e), 0);
    assert_int_equal(tp_gguf_set_i32(w, "x.i32", -5, &e), 0);
    assert_int_equal(tp_gguf_set_u64(w, "x.u64", 1ull << 40, &e), 0);
    assert_int_equal(tp_gguf_set_f32(w, "x.f32", 0.125f, &e), 0);
    assert_int_equal(tp_gguf_set_bool(w, "x.bool", true, &e), 0);
    assert_int_equal(tp_gguf_set_arr_str(w, "x.strs", names, 4, &e), 0);
    assert_int_equal(tp_gguf_set_arr_i32(w, "x.ints", ints, 3, &e), 0);
    assert_int_equal(tp_gguf_set_arr_f32(w, "x.floats", fl, 2, &e), 0);
    /* replacing a key keeps one entry, with the new type and value */
    assert_int_equal(tp_gguf_set_str(w, "x.i32", "now a string", &e), 0);
    assert_int_equal(tp_gguf_write(w, t->file, &e), 0);
    tp_gguf_writer_free(w);

    size_t size;
    uint8_t *b = slurp(t->file, &size);
    tp_gguf *g;
    assert_int_equal(tp_gguf_parse(b, size, &g, &e), 0);
    assert_int_equal(tp_gguf_n_kv(g), 9);
    assert_int_equal(tp_gguf_n_tensors(g), 0);
    tp_gguf_kv_view kv;
    assert_int_equal(tp_gguf_kv_at(g, 0, &kv, &e), 0);
    assert_int_equal(kv.key.len, strlen("general.architecture"));
    int64_t v;
    double d;
    tp_gguf_str s;
    assert_int_equal(tp_gguf_get_int(g, "x.u32", &v, &e), 0);
    assert_int_equal(v, 4000000000ll);
    assert_int_equal(tp_gguf_get_str(g, "x.i32", &s, &e), 0);
    assert_int_equal(s.len, 12);
    assert_memory_equal(s.ptr, "now a string", 12);
    assert_int_equal(tp_gguf_get_int(g, "x.u64", &v, &e), 0);
    assert_int_equal(v, 1ll << 40);
    assert_int_equal(tp_gguf_get_float(g, "x.f32", &d, &e), 0);
    assert_true(d == 0.125);
    assert_int_equal(tp_gguf_get_int(g, "x.bool", &v, &e), 0);
    assert_int_equal(v, 1);
    tp_gguf_str *strs;
    uint64_t n;
    assert_int_equal(tp_gguf_get_str_array(g, "x.strs", &strs, &n, &e), 0);
    assert_int_equal(n, 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(strs[i].len, strlen(names[i]));
        assert_memory_equal(strs[i].ptr, names[i], strs[i].len);
    }
    free(strs);
    uint32_t et;
    const uint8_t *raw;
    assert_int_equal(tp_gguf_get_array(g, "x.ints", &et, &n, &raw, &e), 0);
    assert_int_equal(et, TP_GGUF_I32);
    assert_int_equal(n, 3);
    assert_memory_equal(raw, ints, sizeof ints);
    assert_int_equal(tp_gguf_get_array(g, "x.floats", &et, &n, &raw, &e), 0);
    assert_int_equal(et, TP_GGUF_F32);
    assert_memory_equal(raw, fl, sizeof fl);
    tp_gguf_free(g);
    free(b);
    assert_int_equal(count_files(t->path), 1); /* the temporary file was renamed, not left */
}

static void tensors_land_aligned_with_their_bytes(void **state)
{
    tmpdir *t = *state;
    tp_gguf_writer *w;
    tp_err e;
    assert_int_equal(tp_gguf_writer_new(&w, &e), 0);
    assert_int_equal(tp_gguf_set_u32(w, "general.alignment", 64, &e), 0);
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t h[5] = {0x3c00, 1, 2, 3, 4};
    uint8_t q[2 * 2 * 34];
    for (size_t i = 0; i < sizeof q; i++)
        q[i] = (uint8_t)(i * 7 + 1);
    uint64_t ne_a[2] = {3, 2}, ne_h[1] = {5}, ne_q[2] = {64, 2};
    assert_int_equal(tp_gguf_add_tensor(w, "a", TP_GGML_F32, 2, ne_a, a, sizeof a, &e), 0);
    assert_int_equal(tp_gguf_add_tensor(w, "h", TP_GGML_F16, 1, ne_h, h, sizeof h, &e), 0);
    assert_int_equal(tp_gguf_add_tensor(w, "q", TP_GGML_Q8_0, 2, ne_q, q, sizeof q, &e), 0);
    assert_int_equal(tp_gguf_write(w, t->file, &e), 0);
    tp_gguf_writer_free(w);

    size_t size;
    uint8_t *b = slurp(t->file, &size);
    tp_gguf *g;
    assert_int_equal(tp_gguf_parse(b, size, &g, &e), 0);
    assert_int_equal(tp_gguf_n_tensors(g), 3);
    const struct { const char *name; uint32_t type; uint32_t nd; const uint64_t *ne; const void *data; size_t n; } want[] = {
        {"a", TP_GGML_F32, 2, ne_a, a, sizeof a},
        {"h", TP_GGML_F16, 1, ne_h, h, sizeof h},
        {"q", TP_GGML_Q8_0, 2, ne_q, q, sizeof q},
    };
    for (int i = 0; i < 3; i++) {
        const tp_gguf_tensor *x = tp_gguf_tensor_at(g, (uint64_t)i);
        assert_int_equal(x->name.len, 1);
        assert_memory_equal(x->name.ptr, want[i].name, 1);
        assert_int_equal(x->type, want[i].type);
        assert_int_equal(x->n_dims, want[i].nd);
        for (uint32_t k = 0; k < want[i].nd; k++)
            assert_int_equal(x->dims[k], want[i].ne[k]);
        assert_int_equal(x->offset % 64, 0);
        assert_int_equal(((const uint8_t *)x->data - b) % 64, 0);
        assert_int_equal(x->nbytes, want[i].n);
        assert_memory_equal(x->data, want[i].data, want[i].n);
    }
    tp_gguf_free(g);
    free(b);
}

static void default_alignment_is_32(void **state)
{
    tmpdir *t = *state;
    tp_gguf_writer *w;
    tp_err e;
    assert_int_equal(tp_gguf_writer_new(&w, &e), 0);
    float a[3] = {1, 2, 3}, c[5] = {4, 5, 6, 7, 8};
    uint64_t ne3 = 3, ne5 = 5;
    assert_int_equal(tp_gguf_set_str(w, "k", "odd length value", &e), 0);
    assert_int_equal(tp_gguf_add_tensor(w, "a", TP_GGML_F32, 1, &ne3, a, sizeof a, &e), 0);
    assert_int_equal(tp_gguf_add_tensor(w, "c", TP_GGML_F32, 1, &ne5, c, sizeof c, &e), 0);
    assert_int_equal(tp_gguf_write(w, t->file, &e), 0);
    tp_gguf_writer_free(w);
    size_t size;
    uint8_t *b = slurp(t->file, &size);
    tp_gguf *g;
    assert_int_equal(tp_gguf_parse(b, size, &g, &e), 0);
    const tp_gguf_tensor *x = tp_gguf_tensor_find(g, "c");
    assert_int_equal(x->offset, 32);
    assert_int_equal(((const uint8_t *)x->data - b) % 32, 0);
    assert_memory_equal(x->data, c, sizeof c);
    tp_gguf_free(g);
    free(b);
}

static void vocabulary_metadata_copies_from_a_real_file(void **state)
{
    tmpdir *t = *state;
    char src[512];
    model_file_path("stories260K.gguf", src, sizeof src);
    tp_gguf_writer *w;
    tp_err e;
    assert_int_equal(tp_gguf_writer_new(&w, &e), 0);
    assert_int_equal(tp_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", 77, &e), 0);
    assert_int_equal(tp_gguf_copy_kv_from_file(w, src, "tokenizer.", &e), 0);
    assert_int_equal(tp_gguf_write(w, t->file, &e), 0);
    tp_gguf_writer_free(w);

    size_t sa, sb;
    uint8_t *a = model_file_read("stories260K.gguf", &sa);
    uint8_t *b = slurp(t->file, &sb);
    tp_gguf *ga, *gb;
    assert_int_equal(tp_gguf_parse(a, sa, &ga, &e), 0);
    assert_int_equal(tp_gguf_parse(b, sb, &gb, &e), 0);
    uint64_t n_tok = 0;
    for (uint64_t i = 0; i < tp_gguf_n_kv(ga); i++) {
        tp_gguf_kv_view x, y;
        assert_int_equal(tp_gguf_kv_at(ga, i, &x, &e), 0);
        if (x.key.len < 10 || memcmp(x.key.ptr, "tokenizer.", 10))
            continue;
        n_tok++;
        int found = 0;
        for (uint64_t j = 0; j < tp_gguf_n_kv(gb); j++) {
            assert_int_equal(tp_gguf_kv_at(gb, j, &y, &e), 0);
            if (y.key.len == x.key.len && !memcmp(y.key.ptr, x.key.ptr, x.key.len)) {
                found = 1;
                assert_int_equal(y.type, x.type);
                assert_int_equal(y.elem_type, x.elem_type);
                assert_int_equal(y.count, x.count);
                assert_int_equal(y.raw_len, x.raw_len);
                assert_memory_equal(y.raw, x.raw, x.raw_len); /* replaced bos id included */
            }
        }
        if (!found)
            fail_msg("key %.*s was not copied", (int)x.key.len, x.key.ptr);
    }
    assert_true(n_tok >= 5);
    assert_int_equal(tp_gguf_n_kv(gb), n_tok); /* nothing outside the prefix */
    tp_gguf_free(ga);
    tp_gguf_free(gb);
    free(a);
    free(b);
    /* NULL prefix: every key, in the source's order */
    assert_int_equal(tp_gguf_writer_new(&w, &e), 0);
    assert_int_equal(tp_gguf_copy_kv_from_file(w, src, NULL, &e), 0);
    assert_int_equal(tp_gguf_write(w, t->file, &e), 0);
    tp_gguf_writer_free(w);
    a = model_file_read("stories260K.gguf", &sa);
    b = slurp(t->file, &sb);
    assert_int_equal(tp_gguf_parse(a, sa, &ga, &e), 0);
    assert_int_equal(tp_gguf_parse(b, sb, &gb, &e), 0);
    assert_int_equal(tp_gguf_n_kv(gb), tp_gguf_n_kv(ga));
    for (uint64_t i = 0; i < tp_gguf_n_kv(ga); i++) {
        tp_gguf_kv_view x, y;
        assert_int_equal(tp_gguf_kv_at(ga, i, &x, &e), 0);
        assert_int_equal(tp_gguf_kv_at(gb, i, &y, &e), 0);
        assert_int_equal(x.key.len, y.key.len);
        assert_memory_equal(x.key.ptr, y.key.ptr, x.key.len);
        assert_int_equal(x.raw_len, y.raw_len);
        assert_memory_equal(x.raw, y.raw, x.raw_len);
    }
    assert_int_equal(tp_gguf_n_tensors(gb), 0);
    tp_gguf_free(ga);
    tp_gguf_free(gb);
    free(a);
    free(b);
    assert_int_equal(tp_gguf_writer_new(&w, &e), 0);
    assert_int_equal(tp_gguf_copy_kv_from_file(w, "/nonexistent/x.gguf", NULL, &e), TP_EIO);
    assert_non_null(strstr(e.msg, "/nonexistent/x.gguf"));
    tp_gguf_writer_free(w);
}

static void bad_tensors_and_alignments_are_refused_by_name(void **state)
{
    tmpdir *t = *state;
    tp_gguf_writer *w;
    tp_err e;
    assert_int_equal(tp_gguf_writer_new(&w, &e), 0);
    uint8_t buf[4096] = {0};
    uint64_t ne[2] = {30, 2}, ok[2] = {32, 1};
    assert_int_equal(tp_gguf_add_tensor(w, "q4", TP_GGML_Q4_0, 2, ne, buf, 36, &e), TP_EINVAL);
    assert_non_null(strstr(e.msg, "q4"));
    assert_non_null(strstr(e.msg, "block"));
    assert_int_equal(tp_gguf_add_tensor(w, "q4", TP_GGML_Q4_0, 2, ok, buf, 17, &e), TP_EINVAL);
    assert_non_null(strstr(e.msg, "needs 18"));
    assert_int_equal(tp_gguf_add_tensor(w, "old", 4, 2, ok, buf, 18, &e), TP_EINVAL);
    assert_non_null(strstr(e.msg, "type 4"));
    assert_int_equal(tp_gguf_add_tensor(w, "q4", TP_GGML_Q4_0, 2, ok, buf, 18, &e), 0);
    assert_int_equal(tp_gguf_add_tensor(w, "q4", TP_GGML_Q4_0, 2, ok, buf, 18, &e), TP_EINVAL);
    assert_non_null(strstr(e.msg, "already"));
    char longname[80];
    memset(longname, 'x', 64);
    longname[64] = 0;
    assert_int_equal(tp_gguf_add_tensor(w, longname, TP_GGML_F32, 1, ok, buf, 128, &e), TP_EINVAL);
    assert_int_equal(tp_gguf_add_tensor(w, "z", TP_GGML_F32, 5, ok, buf, 128, &e), TP_EINVAL);
    assert_int_equal(tp_gguf_set_u32(w, "general.alignment", 48, &e), 0);
    assert_int_equal(tp_gguf_write(w, t->file, &e), TP_EINVAL);
    assert_non_null(strstr(e.msg, "general.alignment"));
    assert_int_equal(tp_gguf_set_u32(w, "general.alignment", 16, &e), 0);
    char bad[200];
    snprintf(bad, sizeof bad, "%s/no/such/dir/x.gguf", t->path);
    assert_int_equal(tp_gguf_write(w, bad, &e), TP_EIO);
    assert_non_null(strstr(e.msg, bad));
    assert_int_equal(tp_gguf_write(w, t->file, &e), 0);
    assert_int_equal(count_files(t->path), 1);
    tp_gguf_writer_free(w);
    tp_gguf_writer_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(metadata_of_every_kind_reads_back, setup, teardown),
        cmocka_unit_test_setup_teardown(tensors_land_aligned_with_their_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(default_alignment_is_32, setup, teardown),
        cmocka_unit_test_setup_teardown(vocabulary_metadata_copies_from_a_real_file, setup, teardown),
        cmocka_unit_test_setup_teardown(bad_tensors_and_alignments_are_refused_by_name, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
