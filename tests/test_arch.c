/* Loader rules for GGUF architectures: llama (with Llama 3 RoPE scaling),
 * qwen2 and qwen3 load with the right RoPE kind, biases, Q/K norms, head
 * size and frequency divisors;
 * a missing, misshapen or unexpected tensor, an unknown architecture or
 * scaling kind, or an inconsistent head size is refused with a message
 * naming it. The files are built with the GGUF writer. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tokpipe/gguf.h"
#include "tokpipe/gguf_write.h"
#include "tokpipe/model.h"
#include "tokpipe/synth.h"

#define D 8
#define H 16
#define V 5
#define HEADS 2
#define KV 1
#define HS (D / HEADS)

typedef struct spec {
    const char *arch;
    const char *skip;      /* tensor left out */
    const char *extra;     /* extra 1-d tensor of D floats */
    const char *bad_shape; /* tensor written with one element too many in ne[0] */
    bool biases;
    bool rope_freqs;
    float rope_freq0;      /* first rope_freqs entry */
    bool qk_norm;          /* attn_q_norm / attn_k_norm of the head size */
    int head_dim;          /* 0: D / HEADS; else written as attention.key_length */
    bool no_eps;           /* leave attention.layer_norm_rms_epsilon out */
    bool post_norms;       /* post_attention_norm / post_ffw_norm (Gemma) */
    void (*keys)(tp_gguf_writer *w);
} spec;

static float zeros[(D + 1) * H * 2 + V * D]; /* large enough for any tensor here */

static void tensor(tp_gguf_writer *w, const spec *s, const char *name, int ne0, int ne1)
{
    if (s->skip && !strcmp(s->skip, name))
        return;
    if (s->bad_shape && !strcmp(s->bad_shape, name))
        ne0++;
    uint64_t ne[2] = {(uint64_t)ne0, (uint64_t)ne1};
    size_t n = (size_t)ne0 * (size_t)(ne1 ? ne1 : 1);
    tp_err e;
    if (tp_gguf_add_tensor(w, name, 0, ne1 ? 2 : 1, ne, zeros, n * 4, &e))
        fail_msg("%s", e.msg);
}

/* Write the spec's model to a temp file and load it: rc, with *m or err. */
static int load(const spec *s, tp_model **m, tp_err *err)
{
    tp_gguf_writer *w;
    tp_err e;
    assert_int_equal(tp_gguf_writer_new(&w, &e), 0);
    char k[96];
    const char *a = s->arch;
    assert_int_equal(tp_gguf_set_str(w, "general.architecture", a, &e), 0);
#define KEY(x) (snprintf(k, sizeof k, "%s.%s", strncmp(a, "qwen", 4) && strncmp(a, "gemma", 5) ? "llama" : a, x), k)
    tp_gguf_set_u32(w, KEY("embedding_length"), D, &e);
    tp_gguf_set_u32(w, KEY("feed_forward_length"), H, &e);
    tp_gguf_set_u32(w, KEY("block_count"), 1, &e);
    tp_gguf_set_u32(w, KEY("attention.head_count"), HEADS, &e);
    tp_gguf_set_u32(w, KEY("attention.head_count_kv"), KV, &e);
    tp_gguf_set_u32(w, KEY("context_length"), 64, &e);
    if (!s->no_eps)
        tp_gguf_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-6f, &e);
    int hd = s->head_dim ? s->head_dim : HS;
    if (s->head_dim)
        tp_gguf_set_u32(w, KEY("attention.key_length"), (uint32_t)hd, &e);
#undef KEY
    if (s->keys)
        s->keys(w);
    tensor(w, s, "token_embd.weight", D, V);
    tensor(w, s, "output_norm.weight", D, 0);
    float ff[HS / 2]; /* borrowed by the writer until the write below */
    if (s->rope_freqs) {
        for (int i = 0; i < HS / 2; i++)
            ff[i] = i ? 2.0f * (float)i : s->rope_freq0;
        uint64_t ne = HS / 2;
        if (s->bad_shape && !strcmp(s->bad_shape, "rope_freqs.weight"))
            ne = 1;
        assert_int_equal(tp_gguf_add_tensor(w, "rope_freqs.weight", 0, 1, &ne, ff, ne * 4, &e), 0);
    }
    const struct { const char *n; int ne0, ne1; } L[] = {
        {"blk.0.attn_norm.weight", D, 0}, {"blk.0.attn_q.weight", D, HEADS * hd}, {"blk.0.attn_k.weight", D, KV * hd},
        {"blk.0.attn_v.weight", D, KV * hd}, {"blk.0.attn_output.weight", HEADS * hd, D},
        {"blk.0.ffn_norm.weight", D, 0},
        {"blk.0.ffn_gate.weight", D, H}, {"blk.0.ffn_down.weight", H, D}, {"blk.0.ffn_up.weight", D, H},
    };
    for (size_t i = 0; i < sizeof L / sizeof L[0]; i++)
        tensor(w, s, L[i].n, L[i].ne0, L[i].ne1);
    if (s->biases) {
        tensor(w, s, "blk.0.attn_q.bias", D, 0);
        tensor(w, s, "blk.0.attn_k.bias", KV * HS, 0);
        tensor(w, s, "blk.0.attn_v.bias", KV * HS, 0);
    }
    if (s->qk_norm) {
        tensor(w, s, "blk.0.attn_q_norm.weight", hd, 0);
        tensor(w, s, "blk.0.attn_k_norm.weight", hd, 0);
    }
    if (s->post_norms) {
        tensor(w, s, "blk.0.post_attention_norm.weight", D, 0);
        tensor(w, s, "blk.0.post_ffw_norm.weight", D, 0);
    }
    if (s->extra)
        tensor(w, s, s->extra, D, 0);
    char path[] = "/tmp/tp_test_arch.XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    if (tp_gguf_write(w, path, &e))
        fail_msg("%s", e.msg);
    tp_gguf_writer_free(w);
    int rc = tp_model_load(path, m, err);
    unlink(path); /* the mmap stays valid */
    return rc;
}

static void expect_refused(const spec *s, const char *needle)
{
    tp_model *m = NULL;
    tp_err e = {0, ""};
    int rc = load(s, &m, &e);
    tp_model_free(m);
    if (rc == 0 || !strstr(e.msg, needle))
        fail_msg("rc %d message '%s', want it to name '%s'", rc, e.msg, needle);
}

static void qwen2_loads_with_biases_and_neox_rope(void **state)
{
    (void)state;
    spec s = {.arch = "qwen2", .biases = true};
    tp_model *m;
    tp_err e;
    if (load(&s, &m, &e))
        fail_msg("%s", e.msg);
    const tp_model_config *c = tp_model_get_config(m);
    assert_int_equal(c->arch, TP_ARCH_QWEN2);
    assert_int_equal(c->rope_style, TP_ROPE_NEOX);
    assert_true(c->attn_bias);
    assert_true(c->shared_classifier);
    const tp_model_weights *w = tp_model_get_weights(m);
    assert_non_null(w->layers[0].bq);
    assert_non_null(w->layers[0].bv);
    assert_null(w->rope_freqs);
    assert_non_null(strstr(tp_model_identity(m), "gguf qwen2 "));
    tp_model_free(m);
}

static void qwen3_loads_with_qk_norms_and_the_head_size_of_key_length(void **state)
{
    (void)state;
    spec s = {.arch = "qwen3", .qk_norm = true, .head_dim = 8};
    tp_model *m;
    tp_err e;
    if (load(&s, &m, &e))
        fail_msg("%s", e.msg);
    const tp_model_config *c = tp_model_get_config(m);
    assert_int_equal(c->arch, TP_ARCH_QWEN3);
    assert_int_equal(c->rope_style, TP_ROPE_NEOX);
    assert_true(c->qk_norm);
    assert_false(c->attn_bias);
    assert_int_equal(c->head_size, 8);
    assert_int_equal(c->q_dim, HEADS * 8);
    assert_int_equal(c->kv_dim, KV * 8);
    assert_int_equal(c->dim, D);
    assert_true(fabsf(c->norm_eps - 1e-6f) < 1e-12f);
    const tp_model_weights *w = tp_model_get_weights(m);
    assert_non_null(w->layers[0].q_norm);
    assert_non_null(w->layers[0].k_norm);
    assert_int_equal(w->layers[0].m.wo.cols, HEADS * 8);
    tp_model_free(m);
    spec plain = {.arch = "qwen3", .qk_norm = true}; /* no key_length: dim / heads */
    if (load(&plain, &m, &e))
        fail_msg("%s", e.msg);
    assert_int_equal(tp_model_get_config(m)->head_size, HS);
    tp_model_free(m);
}

static void qwen3_without_or_with_misshapen_qk_norms_or_epsilon_is_refused_naming_it(void **state)
{
    (void)state;
    spec a = {.arch = "qwen3", .qk_norm = true, .head_dim = 8, .skip = "blk.0.attn_q_norm.weight"};
    expect_refused(&a, "tensor 'blk.0.attn_q_norm.weight' is missing");
    spec b = {.arch = "qwen3", .qk_norm = true, .head_dim = 8, .bad_shape = "blk.0.attn_k_norm.weight"};
    expect_refused(&b, "tensor 'blk.0.attn_k_norm.weight' has shape [9, 1] (1 dims), expected [8, 1]");
    spec c = {.arch = "qwen3", .qk_norm = true, .head_dim = 8, .bad_shape = "blk.0.attn_output.weight"};
    expect_refused(&c, "tensor 'blk.0.attn_output.weight' has shape [17, 8] (2 dims), expected [16, 8]");
    spec d = {.arch = "qwen3", .qk_norm = true, .no_eps = true};
    expect_refused(&d, "qwen3.attention.layer_norm_rms_epsilon");
    spec f = {.arch = "qwen3", .qk_norm = true, .biases = true};
    expect_refused(&f, "'blk.0.attn_q.bias' is not used by the qwen3 architecture");
    spec g = {.arch = "qwen2", .biases = true, .qk_norm = true};
    expect_refused(&g, "'blk.0.attn_q_norm.weight' is not used by the qwen2 architecture");
}

/* mkmodel's file of shape and o (seed 3, the Llama 2 vocabulary) at path,
 * a mkstemp template. */
static void synth_write(char *path, const char *shape, tp_synth_gguf *o)
{
    char vocab[512];
    const char *models = getenv("TP_MODELS");
    snprintf(vocab, sizeof vocab, "%s/llama.cpp-vocab/ggml-vocab-llama-spm.gguf", models ? models : "../shared/models");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    tp_synth_shape sh;
    tp_err e;
    assert_int_equal(tp_synth_parse_shape(shape, &sh, &e), 0);
    o->vocab_from = vocab;
    if (tp_synth_write_gguf(path, &sh, 3, o, &e))
        fail_msg("mkmodel %s: %s", o->arch, e.msg);
}

/* phi3's fused matrices: each part a view of its rows, in order. */
static void phi3_fused_matrices_give_each_part_its_rows(void **state)
{
    (void)state;
    char path[] = "/tmp/tp_test_arch_phi3.XXXXXX";
    tp_err e;
    synth_write(path, "64x2x4x2", &(tp_synth_gguf){.arch = "phi3"});
    tp_model *m = NULL;
    int rc = tp_model_load(path, &m, &e);
    unlink(path);
    if (rc)
        fail_msg("%s", e.msg);
    const tp_model_config *c = tp_model_get_config(m);
    assert_int_equal(c->arch, TP_ARCH_PHI3);
    assert_int_equal(c->rope_style, TP_ROPE_NEOX);
    const tp_layer_weights *lw = &tp_model_get_weights(m)->layers[1];
    int d = c->dim, kvd = c->kv_dim, h = c->hidden_dim;
    assert_int_equal(lw->m.wq.rows, d);
    assert_int_equal(lw->m.wk.rows, kvd);
    assert_int_equal(lw->m.wv.rows, kvd);
    assert_ptr_equal(lw->wk, lw->wq + (size_t)d * d);
    assert_ptr_equal(lw->wv, lw->wk + (size_t)kvd * d);
    assert_ptr_equal(lw->m.wv.data, (const char *)lw->m.wq.data + (size_t)(d + kvd) * lw->m.wq.row_bytes);
    assert_int_equal(lw->m.w1.rows, h);
    assert_int_equal(lw->m.w3.rows, h);
    assert_ptr_equal(lw->w3, lw->w1 + (size_t)h * d); /* gate first, then up */
    tp_model_free(m);
}

/* Phi-3.5 / Phi-4-mini's LongRoPE as converted: both factor sets read,
 * the original context and attention factor; partial RoPE; a factor that
 * is not positive is refused naming the tensor and the entry. */
static void phi3_longrope_factors_and_partial_rope_are_read(void **state)
{
    (void)state;
    char path[] = "/tmp/tp_test_arch_phi3l.XXXXXX";
    tp_err e;
    synth_write(path, "64x2x4x2", &(tp_synth_gguf){.arch = "phi3", .rope_dim = 12, .longrope_orig = 64});
    tp_model *m = NULL;
    if (tp_model_load(path, &m, &e))
        fail_msg("%s", e.msg);
    const tp_model_config *c = tp_model_get_config(m);
    const tp_model_weights *w = tp_model_get_weights(m);
    assert_int_equal(c->rope_dim, 12);
    assert_int_equal(c->rope_orig_ctx, 64);
    assert_true(fabsf(c->rope_attn_factor - sqrtf(1 + logf(1024.0f / 64) / logf(64))) < 1e-6f);
    assert_non_null(w->rope_long);
    assert_non_null(w->rope_short);
    assert_null(w->rope_freqs);
    assert_true(w->rope_long[0] == 1.0f && w->rope_long[5] == 40.0f && w->rope_short[5] > 1.0f);
    tp_model_free(m);
    /* the first long factor made 0 in the file */
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    size_t n = (size_t)ftell(f);
    uint8_t *img = malloc(n);
    assert_non_null(img);
    rewind(f);
    assert_int_equal(fread(img, 1, n, f), n);
    tp_gguf *g = NULL;
    assert_int_equal(tp_gguf_parse(img, n, &g, &e), 0);
    const tp_gguf_tensor *t = tp_gguf_tensor_find(g, "rope_factors_long.weight");
    assert_non_null(t);
    long at = (long)((const uint8_t *)t->data - img);
    tp_gguf_free(g);
    free(img);
    float zero = 0.0f;
    assert_int_equal(fseek(f, at, SEEK_SET), 0);
    assert_int_equal(fwrite(&zero, 4, 1, f), 1);
    fclose(f);
    int rc = tp_model_load(path, &m, &e);
    unlink(path);
    assert_int_equal(rc, TP_EFORMAT);
    assert_non_null(strstr(e.msg, "rope_factors_long.weight[0] = 0 is not positive"));
}

/* qwen3moe's 3-D expert tensors: expert e of each a view of the
 * [rows][cols] at e * rows rows into the file's tensor; the router a
 * matrix [n_expert][dim]; no dense FFN. */
static void qwen3moe_experts_are_views_of_the_3d_tensors(void **state)
{
    (void)state;
    char path[] = "/tmp/tp_test_arch_moe.XXXXXX";
    tp_err e;
    synth_write(path, "64x2x4x2",
                &(tp_synth_gguf){.arch = "qwen3moe", .n_expert = 5, .n_expert_used = 2, .expert_ff = 96});
    tp_model *m = NULL;
    int rc = tp_model_load(path, &m, &e);
    unlink(path);
    if (rc)
        fail_msg("%s", e.msg);
    const tp_model_config *c = tp_model_get_config(m);
    assert_int_equal(c->arch, TP_ARCH_QWEN3MOE);
    assert_int_equal(c->n_expert, 5);
    assert_int_equal(c->n_expert_used, 2);
    assert_int_equal(c->expert_ff, 96);
    const tp_layer_weights *lw = &tp_model_get_weights(m)->layers[1];
    assert_int_equal(lw->m.wr.rows, 5);
    assert_int_equal(lw->m.wr.cols, c->dim);
    assert_non_null(lw->wr);
    assert_null(lw->m.w1.data);
    for (int x = 0; x < 5; x++) {
        assert_int_equal(lw->w1_exps[x].rows, 96);
        assert_int_equal(lw->w1_exps[x].cols, c->dim);
        assert_int_equal(lw->w2_exps[x].rows, c->dim);
        assert_int_equal(lw->w2_exps[x].cols, 96);
        assert_ptr_equal(lw->w3_exps[x].data, (const char *)lw->w3_exps[0].data + (size_t)x * 96 * lw->w3_exps[0].row_bytes);
    }
    assert_non_null(strstr(tp_model_identity(m), "experts=5/2/96"));
    tp_model_free(m);
}

/* qwen35moe: qwen35's hybrid blocks with experts and a shared expert of
 * expert_shared_feed_forward_length, its gate a [dim] vector; no dense FFN. */
static void qwen35moe_loads_experts_and_the_shared_expert_in_every_block(void **state)
{
    (void)state;
    char path[] = "/tmp/tp_test_arch_q35moe.XXXXXX";
    tp_err e;
    synth_write(path, "64x4x4x2", &(tp_synth_gguf){.arch = "qwen35moe", .head_dim = 32, .n_expert = 4,
                                                   .n_expert_used = 2, .expert_ff = 32, .shexp_ff = 96});
    tp_model *m = NULL;
    int rc = tp_model_load(path, &m, &e);
    unlink(path);
    if (rc)
        fail_msg("%s", e.msg);
    const tp_model_config *c = tp_model_get_config(m);
    assert_int_equal(c->arch, TP_ARCH_QWEN35MOE);
    assert_int_equal(c->full_attn_interval, 4);
    assert_true(c->attn_gate);
    assert_int_equal(c->n_expert, 4);
    assert_int_equal(c->expert_ff, 32);
    assert_int_equal(c->shexp_ff, 96);
    for (int l = 0; l < 4; l++) {
        const tp_layer_weights *lw = &tp_model_get_weights(m)->layers[l];
        assert_int_equal(lw->wqkv_lin != NULL, l != 3); /* DeltaNet blocks 0-2, attention 3 */
        assert_null(lw->m.w1.data);
        assert_int_equal(lw->w1_exps[3].rows, 32);
        assert_int_equal(lw->m.w1_shexp.rows, 96);
        assert_int_equal(lw->m.w1_shexp.cols, c->dim);
        assert_int_equal(lw->m.w3_shexp.rows, 96);
        assert_int_equal(lw->m.w2_shexp.rows, c->dim);
        assert_int_equal(lw->m.w2_shexp.cols, 96);
        assert_non_null(lw->w2_shexp);
        assert_non_null(lw->shexp_gate);
    }
    assert_non_null(strstr(tp_model_identity(m), "experts=4/2/32 shexp=96"));
    tp_model_free(m);
}

static void an_unknown_architecture_is_refused_with_the_list_of_those_supported(void **state)
{
    (void)state;
    spec s = {.arch = "gemma7"};
    expect_refused(&s, "general.architecture 'gemma7' is not supported (supported: llama, qwen2, qwen3, phi3, gemma3, gemma2, qwen3moe, qwen35, qwen35moe, gpt-oss)");
}

static void window_16(tp_gguf_writer *w)
{
    tp_err e;
    assert_int_equal(tp_gguf_set_u32(w, "gemma3.attention.sliding_window", 16, &e), 0);
}

static void gemma2_window_0(tp_gguf_writer *w)
{
    tp_err e;
    assert_int_equal(tp_gguf_set_u32(w, "gemma2.attention.sliding_window", 0, &e), 0);
}

static const tp_model_config *loaded(const spec *s, tp_model **m)
{
    tp_err e;
    if (load(s, m, &e))
        fail_msg("%s: %s", s->arch, e.msg);
    return tp_model_get_config(*m);
}

/* gemma3 as llama.cpp's load_hparams reads it: with attention.sliding_window
 * five blocks of six slide, turning with base 10000 unscaled; Q scaled by
 * 1 / sqrt(head size); no soft-capping unless final_logit_softcapping says */
static void gemma3_reads_its_window_pattern_local_base_and_scale(void **state)
{
    (void)state;
    spec s = {.arch = "gemma3", .qk_norm = true, .post_norms = true, .head_dim = 8, .keys = window_16};
    tp_model *m;
    const tp_model_config *c = loaded(&s, &m);
    assert_int_equal(c->arch, TP_ARCH_GEMMA3);
    assert_int_equal(c->rope_style, TP_ROPE_NEOX);
    assert_int_equal(c->swa_window, 16);
    assert_int_equal(c->swa_pattern, 6);
    for (int l = 0; l < 12; l++)
        assert_int_equal(tp_model_layer_slides(c, l), l % 6 != 5);
    assert_true(c->rope_theta_swa == 10000.0f && !c->rope_swa_scaled);
    assert_true(c->attn_scale == 1.0f / sqrtf(8.0f));
    assert_true(c->attn_softcap == 0 && c->final_softcap == 0);
    assert_true(c->embd_scale && c->post_norms && c->qk_norm && c->ffn_act == TP_FFN_GELU_TANH);
    assert_non_null(tp_model_get_weights(m)->layers[0].rms_ffn_post);
    tp_model_free(m);
    spec none = {.arch = "gemma3", .qk_norm = true, .post_norms = true}; /* no window key: no layer slides */
    c = loaded(&none, &m);
    assert_int_equal(c->swa_window, 0);
    assert_false(tp_model_layer_slides(c, 0));
    tp_model_free(m);
}

/* llama.cpp's f_attention_scale for the 27B, told by its block count (62
 * for gemma3, 46 for gemma2): 1 / sqrt(dim / heads), not of the head size
 * (gemma_pytorch's query_pre_attn_scalar) */
static void gemma_27b_block_counts_scale_q_by_dim_over_heads(void **state)
{
    (void)state;
    const char *arch[2] = {"gemma3", "gemma2"}, *shape[2] = {"64x62x4x2", "64x46x4x2"};
    const char *models = getenv("TP_MODELS");
    char vocab[512];
    snprintf(vocab, sizeof vocab, "%s/llama.cpp-vocab/ggml-vocab-llama-spm.gguf", models ? models : "../shared/models");
    for (int a = 0; a < 2; a++) {
        char path[] = "/tmp/tp_test_arch_gemma.XXXXXX";
        int fd = mkstemp(path);
        assert_true(fd >= 0);
        close(fd);
        tp_synth_shape sh;
        tp_err e;
        assert_int_equal(tp_synth_parse_shape(shape[a], &sh, &e), 0);
        tp_synth_gguf o = {.arch = arch[a], .vocab_from = vocab, .head_dim = 32};
        if (tp_synth_write_gguf(path, &sh, 3, &o, &e))
            fail_msg("mkmodel %s: %s", arch[a], e.msg);
        tp_model *m = NULL;
        int rc = tp_model_load(path, &m, &e);
        unlink(path);
        if (rc)
            fail_msg("%s", e.msg);
        assert_int_equal(tp_model_get_config(m)->head_size, 32);
        assert_true(tp_model_get_config(m)->attn_scale == 1.0f / sqrtf(16.0f));
        tp_model_free(m);
    }
}

/* gemma2's defaults: a window of 4096 on every other block, the global
 * RoPE, scores capped at 50 and logits at 30 */
static void gemma2_defaults_to_llama_cpps_window_and_soft_caps(void **state)
{
    (void)state;
    spec s = {.arch = "gemma2", .post_norms = true};
    tp_model *m;
    const tp_model_config *c = loaded(&s, &m);
    assert_int_equal(c->arch, TP_ARCH_GEMMA2);
    assert_int_equal(c->swa_window, 4096);
    assert_true(tp_model_layer_slides(c, 0) && !tp_model_layer_slides(c, 1) && tp_model_layer_slides(c, 2));
    assert_true(c->rope_theta_swa == c->rope_theta && c->rope_swa_scaled);
    assert_true(c->attn_softcap == 50.0f && c->final_softcap == 30.0f);
    assert_false(c->qk_norm);
    tp_model_free(m);
}

static void gemma_without_post_norms_epsilon_or_a_window_is_refused_naming_it(void **state)
{
    (void)state;
    spec a = {.arch = "gemma3", .qk_norm = true, .post_norms = true, .skip = "blk.0.post_ffw_norm.weight"};
    expect_refused(&a, "blk.0.post_ffw_norm.weight");
    spec b = {.arch = "gemma3", .qk_norm = true, .post_norms = true, .no_eps = true};
    expect_refused(&b, "gemma3.attention.layer_norm_rms_epsilon");
    spec c = {.arch = "gemma2", .post_norms = true, .keys = gemma2_window_0};
    expect_refused(&c, "gemma2.attention.sliding_window = 0 is not a window");
    spec d = {.arch = "gemma2", .post_norms = true, .qk_norm = true};
    expect_refused(&d, "'blk.0.attn_q_norm.weight' is not used by the gemma2 architecture");
}

static void qwen2_without_a_bias_is_refused_naming_it(void **state)
{
    (void)state;
    spec s = {.arch = "qwen2", .biases = true, .skip = "blk.0.attn_k.bias"};
    expect_refused(&s, "'blk.0.attn_k.bias' is missing");
    spec t = {.arch = "qwen2", .biases = true, .bad_shape = "blk.0.attn_v.bias"};
    expect_refused(&t, "'blk.0.attn_v.bias' has shape [5, 1]");
}

static void llama_loads_adjacent_rope_and_optional_biases(void **state)
{
    (void)state;
    spec s = {.arch = "llama"};
    tp_model *m;
    tp_err e;
    if (load(&s, &m, &e))
        fail_msg("%s", e.msg);
    assert_int_equal(tp_model_get_config(m)->rope_style, TP_ROPE_ADJACENT);
    assert_false(tp_model_get_config(m)->attn_bias);
    assert_null(tp_model_get_weights(m)->layers[0].bq);
    tp_model_free(m);
    spec b = {.arch = "llama", .biases = true};
    if (load(&b, &m, &e))
        fail_msg("%s", e.msg);
    assert_true(tp_model_get_config(m)->attn_bias);
    tp_model_free(m);
}

static void unknown_architecture_and_unused_tensor_are_refused_by_name(void **state)
{
    (void)state;
    spec s = {.arch = "mamba"};
    expect_refused(&s, "general.architecture 'mamba' is not supported");
    spec t = {.arch = "llama", .extra = "blk.0.attn_output.bias"};
    expect_refused(&t, "'blk.0.attn_output.bias' is not used by the llama architecture");
}

static void rope_freqs_tensor_becomes_the_divisors(void **state)
{
    (void)state;
    spec s = {.arch = "llama", .rope_freqs = true, .rope_freq0 = 1.0f};
    tp_model *m;
    tp_err e;
    if (load(&s, &m, &e))
        fail_msg("%s", e.msg);
    const float *ff = tp_model_get_weights(m)->rope_freqs;
    assert_non_null(ff);
    assert_true(ff[0] == 1.0f && ff[1] == 2.0f);
    tp_model_free(m);
    spec bad = {.arch = "llama", .rope_freqs = true, .rope_freq0 = 0.0f};
    expect_refused(&bad, "rope_freqs.weight[0] = 0");
    spec shape = {.arch = "llama", .rope_freqs = true, .rope_freq0 = 1.0f, .bad_shape = "rope_freqs.weight"};
    expect_refused(&shape, "'rope_freqs.weight' has shape [1, 1] (1 dims), expected [2, 1]");
}

static void llama3_keys(tp_gguf_writer *w)
{
    tp_err e;
    tp_gguf_set_f32(w, "llama.rope.freq_base", 500000.0f, &e);
    tp_gguf_set_str(w, "llama.rope.scaling.type", "llama3", &e);
    tp_gguf_set_f32(w, "llama.rope.scaling.factor", 8.0f, &e);
    tp_gguf_set_u32(w, "llama.rope.scaling.original_context_length", 8192, &e);
}

/* YaRN without its factor (llama.cpp's rope_freq_scale_train would be 1 /
 * 0) */
static void yarn_keys(tp_gguf_writer *w)
{
    tp_err e;
    tp_gguf_set_str(w, "llama.rope.scaling.type", "yarn", &e);
}

static void longrope_keys(tp_gguf_writer *w)
{
    tp_err e;
    tp_gguf_set_str(w, "llama.rope.scaling.type", "longrope", &e);
}

static void yarn_factor_keys(tp_gguf_writer *w)
{
    tp_err e;
    tp_gguf_set_str(w, "llama.rope.scaling.type", "yarn", &e);
    tp_gguf_set_f32(w, "llama.rope.scaling.factor", 4.0f, &e);
    tp_gguf_set_u32(w, "llama.rope.scaling.original_context_length", 64, &e);
    tp_gguf_set_f32(w, "llama.rope.scaling.yarn_beta_fast", 16.0f, &e);
}

/* YaRN's keys as llama.cpp reads them: the factor, the original context,
 * beta_fast and beta_slow (defaults 32 and 1), the attention factor (1). */
static void yarn_scaling_reads_its_keys(void **state)
{
    (void)state;
    spec y = {.arch = "llama", .keys = yarn_factor_keys};
    tp_model *m;
    tp_err e;
    if (load(&y, &m, &e))
        fail_msg("%s", e.msg);
    const tp_model_config *c = tp_model_get_config(m);
    assert_true(c->yarn_factor == 4.0f && c->yarn_orig_ctx == 64);
    assert_true(c->yarn_beta_fast == 16.0f && c->yarn_beta_slow == 1.0f && c->yarn_attn_factor == 1.0f);
    assert_null(tp_model_get_weights(m)->rope_freqs);
    tp_model_free(m);
}

static void key_length_keys(tp_gguf_writer *w)
{
    tp_err e;
    tp_gguf_set_u32(w, "llama.attention.key_length", 8, &e);
}

static void linear_keys(tp_gguf_writer *w)
{
    tp_err e;
    tp_gguf_set_str(w, "llama.rope.scaling.type", "linear", &e);
    tp_gguf_set_f32(w, "llama.rope.scaling.factor", 4.0f, &e);
}

static void rope_scaling_keys_give_llama3_and_linear_divisors(void **state)
{
    (void)state;
    spec s = {.arch = "llama", .keys = llama3_keys};
    tp_model *m;
    tp_err e;
    if (load(&s, &m, &e))
        fail_msg("%s", e.msg);
    /* head size 4: pair 0 has wavelength 2 pi (kept), pair 1 2 pi sqrt(500000) ~ 4443,
     * between 8192/4 and 8192: blended, smooth = (8192 / 4443 - 1) / 3, ~2.7 */
    const float *ff = tp_model_get_weights(m)->rope_freqs;
    assert_non_null(ff);
    assert_float_equal(ff[0], 1.0, 1e-6);
    double smooth = (8192.0 / (2 * 3.14159265358979 * sqrt(500000.0)) - 1) / 3;
    assert_float_equal(ff[1], 1 / ((1 - smooth) / 8 + smooth), 1e-4);
    tp_model_free(m);
    spec lin = {.arch = "llama", .keys = linear_keys};
    if (load(&lin, &m, &e))
        fail_msg("%s", e.msg);
    ff = tp_model_get_weights(m)->rope_freqs;
    assert_true(ff && ff[0] == 4.0f && ff[1] == 4.0f);
    tp_model_free(m);
}

static void unsupported_rope_scaling_and_head_size_are_refused_by_name(void **state)
{
    (void)state;
    spec y = {.arch = "llama", .keys = yarn_keys};
    expect_refused(&y, "llama.rope.scaling.factor = 0: YaRN needs a factor >= 1");
    spec lr = {.arch = "llama", .keys = longrope_keys};
    expect_refused(&lr, "llama.rope.scaling.type 'longrope' is not supported");
    spec k = {.arch = "llama", .keys = key_length_keys};
    expect_refused(&k, "llama.attention.key_length 8 != head size 4");
    spec q = {.arch = "qwen2", .biases = true, .skip = "blk.0.ffn_up.weight"};
    expect_refused(&q, "'blk.0.ffn_up.weight' is missing");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(qwen2_loads_with_biases_and_neox_rope),
        cmocka_unit_test(qwen2_without_a_bias_is_refused_naming_it),
        cmocka_unit_test(qwen3_loads_with_qk_norms_and_the_head_size_of_key_length),
        cmocka_unit_test(qwen3_without_or_with_misshapen_qk_norms_or_epsilon_is_refused_naming_it),
        cmocka_unit_test(an_unknown_architecture_is_refused_with_the_list_of_those_supported),
        cmocka_unit_test(phi3_fused_matrices_give_each_part_its_rows),
        cmocka_unit_test(gemma3_reads_its_window_pattern_local_base_and_scale),
        cmocka_unit_test(gemma2_defaults_to_llama_cpps_window_and_soft_caps),
        cmocka_unit_test(gemma_27b_block_counts_scale_q_by_dim_over_heads),
        cmocka_unit_test(gemma_without_post_norms_epsilon_or_a_window_is_refused_naming_it),
        cmocka_unit_test(qwen3moe_experts_are_views_of_the_3d_tensors),
        cmocka_unit_test(qwen35moe_loads_experts_and_the_shared_expert_in_every_block),
        cmocka_unit_test(llama_loads_adjacent_rope_and_optional_biases),
        cmocka_unit_test(unknown_architecture_and_unused_tensor_are_refused_by_name),
        cmocka_unit_test(rope_freqs_tensor_becomes_the_divisors),
        cmocka_unit_test(phi3_longrope_factors_and_partial_rope_are_read),
        cmocka_unit_test(rope_scaling_keys_give_llama3_and_linear_divisors),
        cmocka_unit_test(unsupported_rope_scaling_and_head_size_are_refused_by_name),
        cmocka_unit_test(yarn_scaling_reads_its_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
