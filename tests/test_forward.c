/* Batched forward: kernel exactness, a tiny model against an independent
 * double-precision reference, the stories260K greedy reference from
 * llama2.c's run.c, batch invariance (bitwise) and the KV pool limits; the
 * opt-in OpenBLAS kernel against the reference and the invariant kernel. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <immintrin.h>
#include <float.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tokpipe/forward.h"
#include "tokpipe/isa.h"
#include "../workers/forward/kernels.h"
#include "../workers/forward/moe.h"
#include "../workers/forward/quant.h"
#include "../workers/forward/vexp.h"
#include "tokpipe/synth.h"
#include "support/batch_runs.h"
#include "support/model_files.h"
#include "support/tiny_model.h"

/* run.c (llama2.c 350e04f) greedy on stories260K.bin + tok512.bin, prompt
 * "Once upon a time" = 1 403 407 261 378: the 252 ids listed in
 * ../shared/models/README.md. */
static const int REF_IDS[252] = {
    432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408, 419, 292,
    411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388, 426,
    338, 391, 266, 267, 337, 335, 312, 432, 398, 312, 286, 267, 414, 270, 333, 415, 426, 13, 438, 310,
    439, 419, 357, 336, 432, 313, 438, 310, 432, 278, 316, 439, 419, 298, 414, 267, 265, 282, 295, 433,
    426, 436, 317, 286, 296, 418, 269, 279, 292, 416, 439, 413, 409, 416, 327, 263, 415, 294, 267, 400,
    426, 338, 336, 432, 313, 442, 391, 267, 337, 335, 364, 420, 268, 388, 432, 398, 359, 280, 303, 439,
    413, 272, 417, 264, 312, 426, 436, 13, 438, 310, 286, 296, 418, 269, 279, 292, 416, 439, 413, 409,
    416, 327, 263, 415, 294, 267, 400, 426, 338, 336, 432, 313, 442, 439, 423, 262, 304, 420, 422, 432,
    317, 426, 359, 279, 292, 416, 439, 413, 409, 416, 327, 263, 415, 294, 267, 400, 426, 436, 13, 438,
    310, 279, 292, 416, 439, 413, 391, 267, 281, 421, 427, 311, 357, 432, 384, 358, 336, 432, 313, 442,
    439, 423, 262, 304, 420, 422, 432, 357, 426, 359, 279, 292, 416, 439, 413, 409, 416, 327, 263, 415,
    294, 267, 400, 426, 436, 320, 285, 357, 336, 432, 313, 455, 289, 439, 413, 263, 304, 420, 422, 432,
    317, 426, 410, 448, 411, 280, 303, 281, 421, 427, 364, 426,
};
static const int PROMPT[5] = {1, 403, 407, 261, 378};

/* ---- kernel ------------------------------------------------------------ */

static void fill(float *x, size_t n, unsigned seed)
{
    uint32_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (float)((int)(s >> 8) - (1 << 23)) / (float)(1 << 23);
    }
}

/* ---- e^x (vexp.h) -------------------------------------------------------- */

__attribute__((target("avx2"))) static void vexp8_lanes(const float in[8], float out[8])
{
    _mm256_storeu_ps(out, tp_vexp8_avx2(_mm256_loadu_ps(in)));
}

__attribute__((target("avx512f"))) static void vexp8_lanes512(const float in[8], float out[8])
{
    _mm256_storeu_ps(out, tp_vexp8_avx512(_mm256_loadu_ps(in)));
}

static void vexp_check(const float *x, int n)
{
    float lanes[8], lanes512[8];
    for (int i0 = 0; i0 < n; i0 += 8) {
        int m = n - i0 < 8 ? n - i0 : 8;
        float in[8] = {0};
        memcpy(in, x + i0, sizeof(float) * (size_t)m);
        if (tp_isa_cpu() >= TP_ISA_AVX2)
            vexp8_lanes(in, lanes);
        if (tp_isa_cpu() >= TP_ISA_AVX512)
            vexp8_lanes512(in, lanes512);
        for (int k = 0; k < m; k++) {
            float got = tp_vexp(in[k]);
            if (isnan(in[k])) {
                if (!isnan(got))
                    fail_msg("e^NaN is %a", got);
                if (tp_isa_cpu() >= TP_ISA_AVX512 && !isnan(lanes512[k]))
                    fail_msg("e^NaN in AVX-512 lanes is %a", lanes512[k]);
                continue;
            }
            if (tp_isa_cpu() >= TP_ISA_AVX2 && memcmp(&got, &lanes[k], sizeof got))
                fail_msg("e^%a: the vector lane gives %a, the portable function %a", in[k], lanes[k], got);
            if (tp_isa_cpu() >= TP_ISA_AVX512 && memcmp(&got, &lanes512[k], sizeof got))
                fail_msg("e^%a: the AVX-512 lane gives %a, the portable function %a", in[k], lanes512[k], got);
            /* within an ulp of the true value (of the smallest subnormal's
             * spacing below the normal range; past the largest float: inf) */
            double want = exp((double)in[k]);
            if (want > FLT_MAX) {
                if (!(isinf(got) || got == FLT_MAX))
                    fail_msg("e^%a is %a, want inf", in[k], got);
                continue;
            }
            int ex;
            frexp(want, &ex);
            double ulp = ldexp(1.0, (ex - 24 < -149 ? -149 : ex - 24));
            if (fabs((double)got - want) > ulp)
                fail_msg("e^%a is %a, %.3g ulp from %a", in[k], got, fabs((double)got - want) / ulp, want);
        }
    }
}

/* The vector lanes (AVX2, AVX-512) give the portable function's bits, and all stay
 * within an ulp of e^x: a fine sweep of every input that does not round
 * to 0 or 1 or overflow, plus the edges. */
static void vexp_lanes_equal_the_portable_function_within_an_ulp(void **state)
{
    (void)state;
    enum { N = 1 << 16 };
    float *x = malloc(sizeof(float) * N);
    uint32_t lo, hi;
    /* every 61st float of [-104, 89.5] by bit pattern, each sign */
    for (int sign = 0; sign < 2; sign++) {
        float a = sign ? 104.0f : 89.5f;
        memcpy(&hi, &a, sizeof hi);
        lo = 0x33000000u; /* 2^-25: below it e^x rounds to 1 */
        int n = 0;
        for (uint32_t b = lo; b <= hi; b += 61) {
            uint32_t v = b | (sign ? 0x80000000u : 0);
            memcpy(&x[n++], &v, sizeof v);
            if (n == N) {
                vexp_check(x, n);
                n = 0;
            }
        }
        vexp_check(x, n);
    }
    const float edges[] = {0.0f, -0.0f, 1.0f, -1.0f, 88.72283f, 88.72284f, 89.0f, -87.33654f, -103.27893f,
                           -103.97208f, -104.0f, -150.0f, 1e-30f, -1e-30f, 0x1p-149f, FLT_MAX, -FLT_MAX,
                           INFINITY, -INFINITY, NAN, -NAN, 0.5f, -0.5f, 0.3465736f};
    vexp_check(edges, (int)(sizeof edges / sizeof edges[0]));
    free(x);
}

/* SwiGLU and gpt-oss's: the vector lanes (AVX2, AVX-512) give the
 * portable bits, across the clamps (7 and -7 and either side), zeros,
 * infinities and NaN, with a tail past the last eight. */
static void swiglu_lanes_equal_the_portable_function(void **state)
{
    (void)state;
    if (tp_isa_cpu() < TP_ISA_AVX2)
        skip();
    enum { N = 4099 };
    float *g = malloc(sizeof(float) * N), *u = malloc(sizeof(float) * N);
    float *a = malloc(sizeof(float) * N), *b = malloc(sizeof(float) * N);
    fill(g, N, 21);
    fill(u, N, 22);
    const float edges[] = {0.0f, -0.0f, 7.0f, -7.0f, 6.9999995f, 7.0000005f, -7.0000005f, 1e-30f, -60.0f, 60.0f,
                           INFINITY, -INFINITY, NAN, -NAN, FLT_MAX, -FLT_MAX};
    for (int i = 0; i < N; i++) {
        g[i] *= 12.0f, u[i] *= 12.0f;
        if (i % 5 == 0)
            g[i] = edges[(i / 5) % 16];
        if (i % 7 == 0)
            u[i] = edges[(i / 7) % 16];
    }
    tp_isa before = tp_isa_active();
    for (tp_isa level = TP_ISA_AVX2; level <= TP_ISA_AVX512 && level <= tp_isa_cpu(); level++) {
        tp_isa_cap_for_tests(level);
        for (int oai = 0; oai < 2; oai++) {
            (oai ? tp_swiglu_oai : tp_swiglu)(g, u, a, N, false);
            (oai ? tp_swiglu_oai : tp_swiglu)(g, u, b, N, true);
            for (int i = 0; i < N; i++)
                if (memcmp(&a[i], &b[i], sizeof a[i]))
                    fail_msg("%s(%a, %a): the %s lanes give %a, the portable function %a",
                             oai ? "swiglu_oai" : "swiglu", g[i], u[i], tp_isa_name(level), b[i], a[i]);
        }
    }
    tp_isa_cap_for_tests(before);
    free(g); free(u); free(a); free(b);
}

static void kernel_equals_sequential_fmaf_for_any_token_count(void **state)
{
    (void)state;
    const int shapes[][2] = {{37, 29}, {172, 64}, {64, 8}, {100, 3}};
    for (size_t s = 0; s < 4; s++) {
        int rows = shapes[s][0], cols = shapes[s][1], T = 13;
        float *W = malloc(sizeof(float) * rows * cols), *X = malloc(sizeof(float) * T * cols);
        float *Y = malloc(sizeof(float) * T * rows), *Y1 = malloc(sizeof(float) * rows);
        fill(W, (size_t)rows * cols, 1 + s);
        fill(X, (size_t)T * cols, 7 + s);
        tp_packed P;
        assert_int_equal(tp_pack((const float *const *)&W, &rows, 1, cols, &P), 0);
        for (int n = 1; n <= T; n++) {
            tp_matmul(&P, X, cols, n, Y, rows);
            for (int t = 0; t < n; t++)
                for (int r = 0; r < rows; r++) {
                    float acc = 0.0f;
                    for (int k = 0; k < cols; k++)
                        acc = fmaf(X[t * cols + k], W[r * cols + k], acc);
                    if (memcmp(&acc, &Y[t * rows + r], 4))
                        fail_msg("%dx%d, %d tokens: y[%d][%d] = %a, sequential fmaf gives %a", rows, cols,
                                 n, t, r, Y[t * rows + r], acc);
                }
            float *Ys = malloc(sizeof(float) * n * rows);
            tp_matmul_scalar(&P, X, cols, n, Ys, rows);
            assert_memory_equal(Ys, Y, sizeof(float) * n * rows); /* portable path, same bits */
            free(Ys);
            /* The last token alone gives the same bits as inside the batch. */
            tp_matmul(&P, X + (n - 1) * cols, cols, 1, Y1, rows);
            assert_memory_equal(Y1, Y + (n - 1) * rows, sizeof(float) * rows);
        }
        tp_packed_free(&P);
        free(W); free(X); free(Y); free(Y1);
    }
}

/* ---- tiny model vs reference ------------------------------------------ */

static void check_close(const float *got, const double *want, int n, double tol, const char *what)
{
    for (int i = 0; i < n; i++)
        if (fabs(got[i] - want[i]) > tol * (1 + fabs(want[i])))
            fail_msg("%s: logit %d is %.7g, reference %.7g", what, i, got[i], want[i]);
}

/* hidden 40: gate, up and SwiGLU as three jobs; hidden 128 (whole packed
 * row splits): one fused job, split over threads in ranges as small as
 * the kernels allow. */
static void tiny_model_matches_reference(tiny_shape sh, bool scalar, tp_fwd_kernel kernel, int threads)
{
    float *ck;
    tp_model *m = tiny_model_new(&sh, 5, 0.3f, &ck);
    tp_forward *f;
    tp_err e;
    assert_int_equal(tp_forward_new(m, 2, 0, 8, &f, &e), 0);
    if (scalar)
        tp_forward_use_scalar_for_tests(f);
    assert_int_equal(tp_forward_set_kernel(f, kernel, &e), 0);
    assert_int_equal(tp_forward_set_threads(f, threads, &e), 0);
    tp_forward_split_all_for_tests(f);
    int sid, toks[9] = {1, 5, 22, 0, 7, 7, 13, 2, 9};
    assert_int_equal(tp_forward_seq_open(f, &sid, &e), 0);
    float logits[23];
    double ref[23];
    /* prefill 4 tokens, then decode the rest one at a time */
    tp_fwd_item it = {sid, 0, toks, 4, false};
    assert_int_equal(tp_forward_step(f, &it, 1, logits, &e), 0);
    tiny_llama_reference(ck, toks, 4, ref);
    check_close(logits, ref, 23, 1e-4, "after prefill of 4");
    for (int p = 4; p < 9; p++) {
        tp_fwd_item d = {sid, p, &toks[p], 1, false};
        assert_int_equal(tp_forward_step(f, &d, 1, logits, &e), 0);
        tiny_llama_reference(ck, toks, p + 1, ref);
        check_close(logits, ref, 23, 1e-4, "decode step");
    }
    tp_forward_free(f);
    tp_model_free(m);
    free(ck);
}

/* Logits of a 70-token prefill and 6 decode steps (five key pages: the
 * AVX2 scores' four-page pass and a rest) of a model whose heads are hs
 * wide, with the CPU's vector kernels or the portable ones, on `threads`
 * threads. hs 48: six 8-element chunks; 96: a 64-element pass and four
 * chunks; 100: those and a 4-element tail. */
#define WIDE_PROMPT 70
static tp_isa wide_head_logits(int hs, bool kv16, bool scalar, int threads, float *out)
{
    tiny_shape sh = {2 * hs, 64, 2, 2, 1, 23, 80, 1};
    float *ck;
    tp_model *m = tiny_model_new(&sh, 7, 0.3f, &ck);
    tp_forward *f;
    tp_err e;
    assert_int_equal(tp_forward_new(m, 1, 0, WIDE_PROMPT, &f, &e), 0);
    if (kv16)
        assert_int_equal(tp_forward_set_kv_type(f, TP_KV_F16, &e), 0);
    if (scalar)
        tp_forward_use_scalar_for_tests(f);
    assert_int_equal(tp_forward_set_threads(f, threads, &e), 0);
    tp_forward_split_all_for_tests(f);
    int sid, toks[WIDE_PROMPT + 6];
    for (int i = 0; i < WIDE_PROMPT + 6; i++)
        toks[i] = (i * 7 + 3) % 23;
    assert_int_equal(tp_forward_seq_open(f, &sid, &e), 0);
    tp_fwd_item it = {sid, 0, toks, WIDE_PROMPT, false};
    assert_int_equal(tp_forward_step(f, &it, 1, out, &e), 0);
    for (int p = WIDE_PROMPT; p < WIDE_PROMPT + 6; p++) {
        tp_fwd_item d = {sid, p, &toks[p], 1, false};
        assert_int_equal(tp_forward_step(f, &d, 1, out + (size_t)(p - WIDE_PROMPT + 1) * 23, &e), 0);
    }
    tp_isa ran = tp_forward_isa(f);
    tp_forward_free(f);
    tp_model_free(m);
    free(ck);
    return ran;
}

/* Each vector level (AVX2 matmuls and attention, or AVX-512's), f32 or
 * f16 cache, takes the portable path's operations in its order: the same
 * bits, on 1 or 3 threads. The level is capped (isa.h) so that a CPU with
 * AVX-512 checks its AVX2 kernels too, and each forward is asked which
 * level it really ran; a level the CPU lacks is skipped, visibly. */
static void vector_level_gives_the_portable_bits(tp_isa level)
{
    if (tp_isa_cpu() < level) {
        print_message("skipped: this CPU has no %s\n", tp_isa_name(level));
        skip();
    }
    tp_isa before = tp_isa_active();
    tp_isa_cap_for_tests(level);
    static const int widths[] = {48, 96, 100};
    for (int kv16 = 0; kv16 < 2; kv16++)
        for (int w = 0; w < 3; w++) {
            float want[7 * 23], got[7 * 23];
            assert_int_equal(wide_head_logits(widths[w], kv16, true, 1, want), TP_ISA_PORTABLE);
            for (int threads = 1; threads <= 3; threads += 2) {
                tp_isa ran = wide_head_logits(widths[w], kv16, false, threads, got);
                if (ran != level)
                    fail_msg("capped at %s, the forward ran %s", tp_isa_name(level), tp_isa_name(ran));
                for (int k = 0; k < 7; k++)
                    if (memcmp(want + 23 * k, got + 23 * k, sizeof(float) * 23))
                        fail_msg("%s path, %s cache, heads %d wide, on %d thread(s): logits row %d differ from "
                                 "the portable path's",
                                 tp_isa_name(level), kv16 ? "f16" : "f32", widths[w], threads, k);
            }
        }
    tp_isa_cap_for_tests(before);
}

static void avx2_path_gives_the_portable_bits(void **state)
{
    (void)state;
    vector_level_gives_the_portable_bits(TP_ISA_AVX2);
}

static void avx512_path_gives_the_portable_bits(void **state)
{
    (void)state;
    vector_level_gives_the_portable_bits(TP_ISA_AVX512);
}

static void tiny_gqa_model_matches_reference(bool scalar, tp_fwd_kernel kernel)
{
    static const tiny_shape shapes[] = {{16, 40, 2, 4, 2, 23, 12, 1}, {16, 128, 2, 4, 2, 23, 12, 1}};
    for (int i = 0; i < 2; i++)
        for (int threads = 1; threads <= 3; threads += 2)
            tiny_model_matches_reference(shapes[i], scalar, kernel, threads);
}

static void tiny_gqa_model_matches_double_reference(void **state)
{
    (void)state;
    tiny_gqa_model_matches_reference(false, TP_FWD_KERNEL_INVARIANT);
}

static void scalar_path_matches_double_reference(void **state)
{
    (void)state;
    tiny_gqa_model_matches_reference(true, TP_FWD_KERNEL_INVARIANT);
}

static void openblas_kernel_matches_double_reference(void **state)
{
    (void)state;
    tiny_gqa_model_matches_reference(false, TP_FWD_KERNEL_OPENBLAS);
}

/* Hand-checkable: with wo and w2 all zero the residual stream stays the
 * embedding, so logits[v] = sum_j E[v][j] * g[j] * e[j] / rms(e), g the
 * final norm weights, e the input token's embedding. */
static void zero_blocks_give_normalized_embedding_logits(void **state)
{
    (void)state;
    tiny_shape sh = {4, 8, 1, 2, 2, 3, 4, 0};
    size_t size;
    float *ck = tiny_llama_build(&sh, 1, 0.5f, &size);
    float *w = ck + 7;
    const float E[3][4] = {{1, 2, 3, 4}, {0.5f, -1, 0, 2}, {-3, 1, 1, -1}};
    memcpy(w, E, sizeof E);
    size_t d = 4, L = 1, V = 3, kvd = 4;
    float *wo = w + V * d + L * d + L * d * d + 2 * L * d * kvd;
    memset(wo, 0, d * d * 4);
    float *w2 = wo + d * d + L * d + 8 * d;
    memset(w2, 0, 8 * d * 4);
    float *g = w2 + 2 * 8 * d;
    const float G[4] = {1, 0.5f, 2, 1};
    memcpy(g, G, sizeof G);
    tp_model *m = tiny_model_load(ck, size);
    tp_forward *f;
    tp_err e;
    assert_int_equal(tp_forward_new(m, 1, 0, 4, &f, &e), 0);
    int sid, tok = 1;
    tp_forward_seq_open(f, &sid, &e);
    float logits[3];
    tp_fwd_item it = {sid, 0, &tok, 1, false};
    assert_int_equal(tp_forward_step(f, &it, 1, logits, &e), 0);
    /* e = (0.5, -1, 0, 2): mean square 5.25/4, normed n = g*e/sqrt(1.3125+1e-5)
     * = (0.5, -0.5, 0, 2)/1.14564...; logits = E n */
    double r = sqrt(5.25 / 4 + 1e-5), n[4] = {0.5 / r, -0.5 / r, 0, 2 / r};
    for (int v = 0; v < 3; v++) {
        double want = E[v][0] * n[0] + E[v][1] * n[1] + E[v][2] * n[2] + E[v][3] * n[3];
        if (fabs(logits[v] - want) > 1e-5)
            fail_msg("logit %d is %.7g, by hand %.7g", v, logits[v], want);
    }
    tp_forward_free(f);
    tp_model_free(m);
    free(ck);
}

/* ---- real model -------------------------------------------------------- */

static void greedy(const char *file, bool scalar, tp_fwd_kernel kernel)
{
    tp_model *m = load_real(file);
    tp_forward *f;
    tp_err e;
    assert_int_equal(tp_forward_new(m, 1, 256, 8, &f, &e), 0);
    if (scalar)
        tp_forward_use_scalar_for_tests(f);
    assert_int_equal(tp_forward_set_kernel(f, kernel, &e), 0);
    int sid, V = tp_model_get_config(m)->vocab_size;
    tp_forward_seq_open(f, &sid, &e);
    float *logits = malloc(sizeof(float) * V);
    tp_fwd_item it = {sid, 0, PROMPT, 5, false};
    assert_int_equal(tp_forward_step(f, &it, 1, logits, &e), 0);
    for (int i = 0; i < 252; i++) {
        int tok = argmax(logits, V);
        if (tok != REF_IDS[i])
            fail_msg("%s, %s kernel: generated id %d is %d, run.c gives %d", file, tp_fwd_kernel_name(kernel),
                     i, tok, REF_IDS[i]);
        if (i == 251)
            break;
        tp_fwd_item d = {sid, 5 + i, &tok, 1, false};
        if (tp_forward_step(f, &d, 1, logits, &e))
            fail_msg("step %d: %s", i, e.msg);
    }
    free(logits);
    tp_forward_free(f);
    tp_model_free(m);
}

static void stories260k_greedy_reproduces_run_c(void **state)
{
    (void)state;
    greedy("stories260K.bin", false, TP_FWD_KERNEL_INVARIANT);
}

static void stories260k_openblas_kernel_greedy_reproduces_run_c(void **state)
{
    (void)state;
    greedy("stories260K.bin", false, TP_FWD_KERNEL_OPENBLAS);
}

static void stories260k_scalar_path_greedy_reproduces_run_c(void **state)
{
    (void)state;
    greedy("stories260K.bin", true, TP_FWD_KERNEL_INVARIANT);
}

static void stories260k_gguf_greedy_gives_the_same_ids(void **state)
{
    (void)state;
    greedy("stories260K.gguf", false, TP_FWD_KERNEL_INVARIANT);
}

/* ---- batch invariance -------------------------------------------------- */

static void model_batch_invariance(tp_model *m, bool scalar, tp_kv_type kv)
{
    int V = tp_model_get_config(m)->vocab_size;
    size_t n = (size_t)NSEQ * (DECODE + 1) * V;
    float *alone = malloc(sizeof(float) * n), *batched = calloc(n, sizeof(float));
    run_alone(m, alone, V, 1, scalar, kv);
    /* batched on N threads, and alone (batch 1: the split matvec) on N
     * threads, both bitwise equal to alone on 1 thread */
    for (int threads = 1; threads <= 4; threads++)
        for (int mode = threads == 1; mode < 2; mode++) {
            memset(batched, 0, sizeof(float) * n);
            if (mode)
                run_batched(m, batched, V, threads, scalar, kv);
            else
                run_alone(m, batched, V, threads, scalar, kv);
            for (int s = 0; s < NSEQ; s++)
                for (int k = 0; k <= DECODE; k++) {
                    size_t off = ((size_t)s * (DECODE + 1) + k) * V;
                    if (memcmp(alone + off, batched + off, sizeof(float) * V))
                        fail_msg("%s, %s, kv %s, %d thread(s): sequence %d, logits row %d: %s differs from "
                                 "alone on 1 thread", tp_model_identity(m), scalar ? "scalar" : "vector",
                                 tp_kv_type_name(kv), threads, s, k, mode ? "batched" : "alone");
                }
        }
    free(alone);
    free(batched);
}

static void batch_invariance(bool scalar, tp_kv_type kv)
{
    tp_model *m = load_real("stories260K.bin");
    model_batch_invariance(m, scalar, kv);
    tp_model_free(m);
}

/* A random model of arch (mkmodel's writer) with o's options and shape, loaded. */
static tp_model *synth_model_shaped(tp_synth_gguf o, const char *shape) { return synth_model_load(o, shape, 9); }

static tp_model *synth_model_with(tp_synth_gguf o)
{
    return synth_model_shaped(o, "64x2x4x2");
}

static tp_model *synth_model(const char *arch, int head_dim)
{
    return synth_model_with((tp_synth_gguf){.arch = arch, .head_dim = head_dim});
}

static tp_model *synth_model_window(const char *arch, int head_dim, int window)
{
    return synth_model_with((tp_synth_gguf){.arch = arch, .head_dim = head_dim, .sliding_window = window});
}

/* A random qwen3: heads of 32 where dim / heads is 16, Q/K norms, NEOX
 * RoPE; the same invariance on every path and cache type. */
static void qwen3_is_batch_chunk_and_thread_invariant(void **state)
{
    (void)state;
    tp_model *m = synth_model("qwen3", 32);
    assert_int_equal(tp_model_get_config(m)->q_dim, 128);
    assert_true(tp_model_get_config(m)->qk_norm);
    for (int scalar = 0; scalar < 2; scalar++) {
        model_batch_invariance(m, scalar, TP_KV_F32);
        model_batch_invariance(m, scalar, TP_KV_F16);
    }
    tp_model_free(m);
}

/* A random phi3: fused Q/K/V and gate/up matrices read as row views. */
static void phi3_is_batch_chunk_and_thread_invariant(void **state)
{
    (void)state;
    tp_model *m = synth_model("phi3", 0);
    model_batch_invariance(m, false, TP_KV_F32);
    model_batch_invariance(m, false, TP_KV_F16);
    tp_model_free(m);
}

/* Random gemma3 and gemma2 with windows of 4 (gemma3's two blocks slide,
 * with RoPE base 10000; gemma2's block 1 sees everything): the prompts of
 * up to 12 and 6 decode steps outgrow the window, so a window starts inside
 * a page and, with decode, past the first one. */
static void gemma3_and_gemma2_are_batch_chunk_and_thread_invariant(void **state)
{
    (void)state;
    const char *arch[2] = {"gemma3", "gemma2"};
    for (int a = 0; a < 2; a++) {
        tp_model *m = synth_model_window(arch[a], a ? 0 : 32, 4);
        const tp_model_config *c = tp_model_get_config(m);
        assert_int_equal(c->swa_window, 4);
        assert_true(tp_model_layer_slides(c, 0));
        assert_int_equal(tp_model_layer_slides(c, 1), a == 0);
        assert_true(c->post_norms && c->embd_scale && c->ffn_act == TP_FFN_GELU_TANH);
        for (int scalar = 0; scalar < 2; scalar++) {
            model_batch_invariance(m, scalar, TP_KV_F32);
            model_batch_invariance(m, scalar, TP_KV_F16);
        }
        tp_model_free(m);
    }
}

/* qwen3moe, 8 experts, 3 a token: NSEQ sequences' tokens in one step
 * share experts (NSEQ * 3 > 8), so an expert's matmul runs over rows of
 * several jobs; each job's logits stay those it has alone, on 1-4
 * threads, prefilled whole or in chunks, on every path. */
static void qwen3moe_is_batch_chunk_and_thread_invariant(void **state)
{
    (void)state;
    tp_model *m = synth_model_with((tp_synth_gguf){.arch = "qwen3moe", .head_dim = 32, .n_expert = 8,
                                                   .n_expert_used = 3, .expert_ff = 64});
    assert_int_equal(tp_model_get_config(m)->n_expert, 8);
    assert_true(NSEQ * 3 > 8);
    for (int scalar = 0; scalar < 2; scalar++)
        model_batch_invariance(m, scalar, TP_KV_F32);
    model_batch_invariance(m, false, TP_KV_F16);
    tp_model_free(m);
}

/* gpt-oss: sinks in every softmax, windows of 4 on block 0 (prompts of up
 * to 12 and the decode steps outgrow them), YaRN, biases, 8 experts with
 * 3 a token through swiglu_oai; the same invariance on every path and
 * cache type. */
static void gpt_oss_is_batch_chunk_and_thread_invariant(void **state)
{
    (void)state;
    tp_model *m = synth_model_with((tp_synth_gguf){.arch = "gpt-oss", .head_dim = 32, .n_expert = 8,
                                                   .n_expert_used = 3, .expert_ff = 64, .sliding_window = 4});
    const tp_model_config *c = tp_model_get_config(m);
    assert_int_equal(c->swa_window, 4);
    assert_true(tp_model_layer_slides(c, 0) && !tp_model_layer_slides(c, 1));
    assert_true(c->ffn_act == TP_FFN_SWIGLU_OAI && c->moe_softmax_topk);
    assert_true(c->yarn_factor == 32.0f && c->yarn_orig_ctx == 4096);
    assert_non_null(tp_model_get_weights(m)->layers[1].sinks);
    for (int scalar = 0; scalar < 2; scalar++) {
        model_batch_invariance(m, scalar, TP_KV_F32);
        model_batch_invariance(m, scalar, TP_KV_F16);
    }
    tp_model_free(m);
}

/* qwen35: blocks 0-2 Gated DeltaNet (the recurrent state per sequence,
 * value heads twice the key heads), block 3 gated attention with partial
 * RoPE: each sequence's logits are the same alone or batched, prefilled
 * whole or in chunks, on 1-4 threads, on every path and cache type. */
static void qwen35_is_batch_chunk_and_thread_invariant(void **state)
{
    (void)state;
    tp_model *m = synth_model_shaped((tp_synth_gguf){.arch = "qwen35", .head_dim = 32}, "64x4x4x2");
    const tp_model_config *c = tp_model_get_config(m);
    assert_true(tp_model_layer_recurrent(c, 0) && tp_model_layer_recurrent(c, 2));
    assert_false(tp_model_layer_recurrent(c, 3));
    assert_int_equal(c->ssm_v_heads, 2 * c->ssm_k_heads);
    assert_true(c->attn_gate && c->rope_dim == 8);
    for (int scalar = 0; scalar < 2; scalar++) {
        model_batch_invariance(m, scalar, TP_KV_F32);
        model_batch_invariance(m, scalar, TP_KV_F16);
    }
    tp_model_free(m);
}

/* The DeltaNet state's passes run blocks of 32 (AVX2) or 128 (AVX-512)
 * columns, then 8 or 16 at a time, then the rest one by one, and stream
 * S's rows past the caches where a row is whole vectors: heads of 36 and
 * 40 (tails on both paths), 136 and 144 (a block, then the rest; 144
 * streamed) give the portable path's logits on every level the CPU has,
 * capped. */
static void qwen35_state_passes_give_the_portable_bits_on_every_level(void **state)
{
    (void)state;
    static const int hds[] = {36, 40, 136, 144};
    for (int i = 0; i < 4; i++) {
        tp_model *m = synth_model_shaped((tp_synth_gguf){.arch = "qwen35", .head_dim = hds[i]}, "64x4x4x2");
        int V = tp_model_get_config(m)->vocab_size;
        size_t n = (size_t)NSEQ * (DECODE + 1) * V;
        float *want = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
        run_alone(m, want, V, 1, true, TP_KV_F32);
        tp_isa before = tp_isa_active();
        for (tp_isa level = TP_ISA_AVX2; level <= TP_ISA_AVX512; level++) {
            if (tp_isa_cpu() < level) {
                print_message("%s: not on this CPU, not checked\n", tp_isa_name(level));
                continue;
            }
            tp_isa_cap_for_tests(level);
            run_alone(m, got, V, 2, false, TP_KV_F32);
            if (memcmp(want, got, sizeof(float) * n))
                fail_msg("qwen35, heads of %d: the %s path's logits differ from the portable path's", hds[i],
                         tp_isa_name(level));
        }
        tp_isa_cap_for_tests(before);
        free(want);
        free(got);
        tp_model_free(m);
    }
}

/* A hybrid model's DeltaNet state is kept at each step's start: a retried
 * step (the same pos again) gives the same logits; a rewind to anywhere
 * else is refused by name, and pos 0 starts the state again. */
static void qwen35_retried_step_recomputes_the_same_logits_and_other_rewinds_are_refused(void **state)
{
    (void)state;
    tp_model *m = synth_model_shaped((tp_synth_gguf){.arch = "qwen35", .head_dim = 32}, "64x4x4x2");
    tp_forward *f;
    tp_err e;
    assert_int_equal(tp_forward_new(m, 1, 32, 8, &f, &e), 0);
    int a;
    tp_forward_seq_open(f, &a, &e);
    float first[32000], again[32000];
    tp_fwd_item it = {a, 0, PROMPT, 5, false};
    assert_int_equal(tp_forward_step(f, &it, 1, first, &e), 0);
    int next = 300;
    tp_fwd_item d = {a, 5, &next, 1, false};
    assert_int_equal(tp_forward_step(f, &d, 1, first, &e), 0);
    assert_int_equal(tp_forward_step(f, &d, 1, again, &e), 0); /* retried */
    assert_memory_equal(first, again, sizeof first);
    tp_fwd_item back = {a, 3, &PROMPT[3], 1, false};
    assert_int_equal(tp_forward_step(f, &back, 1, again, &e), TP_EINVAL);
    assert_non_null(strstr(e.msg, "DeltaNet"));
    tp_fwd_item restart = {a, 0, PROMPT, 5, false};
    float cold[32000];
    assert_int_equal(tp_forward_step(f, &it, 1, cold, &e), 0);
    assert_int_equal(tp_forward_step(f, &restart, 1, again, &e), 0);
    assert_memory_equal(cold, again, sizeof cold);
    tp_forward_free(f);
    tp_model_free(m);
}

/* qwen35moe: qwen35's hybrid blocks (0-2 Gated DeltaNet, 3 gated
 * attention), each FFN 8 experts, 3 a token, and a shared expert wider
 * than one of them that every token takes: each sequence's logits the
 * same alone or batched (sharing experts), whole or in chunks, on 1-4
 * threads, every path and cache type. */
static void qwen35moe_is_batch_chunk_and_thread_invariant(void **state)
{
    (void)state;
    tp_model *m = synth_model_shaped((tp_synth_gguf){.arch = "qwen35moe", .head_dim = 32, .n_expert = 8,
                                                     .n_expert_used = 3, .expert_ff = 64, .shexp_ff = 96},
                                     "64x4x4x2");
    const tp_model_config *c = tp_model_get_config(m);
    assert_int_equal(c->arch, TP_ARCH_QWEN35MOE);
    assert_true(tp_model_layer_recurrent(c, 0) && !tp_model_layer_recurrent(c, 3));
    assert_int_equal(c->n_expert, 8);
    assert_int_equal(c->shexp_ff, 96);
    for (int scalar = 0; scalar < 2; scalar++) {
        model_batch_invariance(m, scalar, TP_KV_F32);
        model_batch_invariance(m, scalar, TP_KV_F16);
    }
    tp_model_free(m);
}

static void mixtral_is_batch_chunk_and_thread_invariant(void **state)
{
    (void)state;
    tp_model *m = synth_model_with((tp_synth_gguf){.arch = "mixtral", .n_expert = 4, .n_expert_used = 2,
                                                   .expert_ff = 96});
    assert_int_equal(tp_model_get_config(m)->expert_ff, 96);
    model_batch_invariance(m, false, TP_KV_F32);
    tp_model_free(m);
}

/* The MoE FFN alone: a token's output row is the same bits in a step of
 * 9 tokens that share experts (checked) as alone, on 1 and 3 threads, and
 * its experts come by rank with weights that sum to 1. */
static void moe_rows_alone_or_sharing_experts(tp_model *m)
{
    const tp_model_config *c = tp_model_get_config(m);
    enum { T = 9 };
    int d = c->dim, k = c->n_expert_used;
    float *x = malloc(sizeof(float) * T * (size_t)d), *all = malloc(sizeof(float) * T * (size_t)d),
          *one = malloc(sizeof(float) * (size_t)d);
    uint32_t r = 12345;
    for (int i = 0; i < T * d; i++) {
        r = r * 1664525u + 1013904223u;
        x[i] = (float)((double)(r >> 8) / (1 << 24) - 0.5);
    }
    tp_moe *moe = NULL;
    assert_int_equal(tp_moe_new(m, T, true, &moe), 0);
    assert_non_null(moe);
    tp_err e;
    for (int threads = 1; threads <= 3; threads += 2) {
        tp_pool *pool = NULL;
        assert_int_equal(tp_pool_new(threads, &pool, &e), 0);
        tp_moe_run run = {pool, 1, tp_isa_active() >= TP_ISA_AVX2, tp_isa_active() >= TP_ISA_AVX2};
        tp_moe_ffn(moe, &run, 1, x, T, all);
        int uses[8] = {0}, shared = 0;
        for (int t = 0; t < T; t++) {
            const int *ex;
            const float *w;
            tp_moe_last_choice(moe, t, &ex, &w);
            float sum = 0;
            for (int q = 0; q < k; q++) {
                shared += uses[ex[q]]++ == 1;
                sum += w[q];
                if (q)
                    assert_true(w[q] <= w[q - 1]);
            }
            assert_true(fabsf(sum - 1.0f) < 1e-6f);
        }
        assert_true(shared > 0);
        for (int t = 0; t < T; t++) {
            tp_moe_ffn(moe, &run, 1, x + (size_t)t * d, 1, one);
            if (memcmp(one, all + (size_t)t * d, sizeof(float) * (size_t)d))
                fail_msg("%d thread(s): token %d's MoE row differs alone and among %d", threads, t, T);
        }
        tp_pool_free(pool);
    }
    tp_moe_free(moe);
    free(x);
    free(all);
    free(one);
}

static void moe_rows_are_the_same_alone_or_sharing_experts(void **state)
{
    (void)state;
    tp_model *m = synth_model_with((tp_synth_gguf){.arch = "qwen3moe", .head_dim = 32, .n_expert = 8,
                                                   .n_expert_used = 3, .expert_ff = 64});
    moe_rows_alone_or_sharing_experts(m);
    tp_model_free(m);
}

/* The same with qwen35moe's gated shared expert after the routed sum:
 * its matmuls over the step's rows keep each row's bits too. */
static void moe_rows_with_a_shared_expert_are_the_same_alone_or_together(void **state)
{
    (void)state;
    tp_model *m = synth_model_shaped((tp_synth_gguf){.arch = "qwen35moe", .head_dim = 32, .n_expert = 8,
                                                     .n_expert_used = 3, .expert_ff = 64, .shexp_ff = 96},
                                     "64x4x4x2");
    moe_rows_alone_or_sharing_experts(m);
    tp_model_free(m);
}

static void batched_mixed_prefill_and_decode_logits_equal_alone_bitwise(void **state)
{
    (void)state;
    batch_invariance(false, TP_KV_F32);
}

static void scalar_path_is_batch_invariant_too(void **state)
{
    (void)state;
    batch_invariance(true, TP_KV_F32);
}

static void kv_f16_is_batch_and_chunk_invariant_on_1_to_4_threads(void **state)
{
    (void)state;
    batch_invariance(false, TP_KV_F16);
    batch_invariance(true, TP_KV_F16);
}

/* ---- KV cache in f16 --------------------------------------------------- */

/* F16C's vcvtps2ph and vcvtph2ps (AVX-512's and the AVX2 kernels' own) */
__attribute__((target("f16c"))) static uint16_t hw_f32_to_f16(float x)
{
    __m128i h = _mm_cvtps_ph(_mm_set1_ps(x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return (uint16_t)_mm_extract_epi16(h, 0);
}

__attribute__((target("f16c"))) static float hw_f16_to_f32(uint16_t h)
{
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16((short)h)));
}

static void check_conversion(uint32_t bits)
{
    float x;
    memcpy(&x, &bits, sizeof x);
    if (isnan(x))
        return;
    uint16_t want = hw_f32_to_f16(x), got = tp_f32_to_f16(x);
    if (got != want)
        fail_msg("f32 0x%08x (%.9g) -> f16 0x%04x, the CPU's vcvtps2ph gives 0x%04x", bits, x, got, want);
}

static void f16_conversions_equal_the_cpus_for_every_half_and_halfway_point(void **state)
{
    (void)state;
    if (!tp_quant_have_f16c())
        skip();
    for (uint32_t h = 0; h < 65536; h++) {
        float want = hw_f16_to_f32((uint16_t)h), got = tp_f16_to_f32((uint16_t)h);
        if (isnan(want))
            continue;
        if (memcmp(&want, &got, sizeof got))
            fail_msg("f16 0x%04x -> %.9g, the CPU gives %.9g", h, got, want);
        if (tp_f32_to_f16(want) != h)
            fail_msg("f16 0x%04x does not survive the round trip through f32", h);
        /* the halfway points to the next half up (ties to even), and one
         * f32 ulp either side of them */
        uint32_t b;
        memcpy(&b, &want, sizeof b);
        for (int d = -1; d <= 1; d++) {
            check_conversion(b + 0x1000u + (uint32_t)d); /* normal halves keep 10 of 23 bits */
            check_conversion(b + (uint32_t)d);
        }
    }
    uint32_t s = 12345;
    for (int i = 0; i < 4000000; i++) { /* every exponent: subnormals, overflow to inf */
        s = s * 1664525u + 1013904223u;
        check_conversion(s);
    }
    for (uint32_t b = 0x33000000u; b < 0x38800000u; b += 0x800u) /* the subnormal half range, finely */
        check_conversion(b), check_conversion(b | 0x80000000u);
}

/* Teacher-forced along run.c's greedy path, so both caches see the same
 * tokens: the f16 cache's logits stay within KV16_TOL (absolute) of the
 * f32 cache's with the same argmax at every step. And greedy generation
 * from the f16 cache gives run.c's 252 ids. */
#define KV16_TOL 5e-2 /* measured here: 0.023 at most, vector (avx512) and scalar alike */
static void kv_f16_stays_close_to_f32(bool scalar)
{
    tp_model *m = load_real("stories260K.bin");
    int V = tp_model_get_config(m)->vocab_size;
    tp_err e;
    tp_forward *a, *b;
    assert_int_equal(tp_forward_new(m, 1, 256, 8, &a, &e), 0);
    assert_int_equal(tp_forward_new(m, 1, 256, 8, &b, &e), 0);
    assert_int_equal(tp_forward_set_kv_type(b, TP_KV_F16, &e), 0);
    if (scalar) {
        tp_forward_use_scalar_for_tests(a);
        tp_forward_use_scalar_for_tests(b);
    }
    int sa, sb;
    tp_forward_seq_open(a, &sa, &e);
    tp_forward_seq_open(b, &sb, &e);
    float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V);
    tp_fwd_item ia = {sa, 0, PROMPT, 5, false}, ib = {sb, 0, PROMPT, 5, false};
    double worst = 0;
    int same_argmax = 0;
    for (int i = 0; i < 252; i++) {
        assert_int_equal(tp_forward_step(a, &ia, 1, la, &e), 0);
        assert_int_equal(tp_forward_step(b, &ib, 1, lb, &e), 0);
        for (int v = 0; v < V; v++) {
            double d = fabs((double)la[v] - lb[v]);
            worst = d > worst ? d : worst;
        }
        if (worst > KV16_TOL)
            fail_msg("%s: step %d: an f16-cache logit is %.3g from the f32 cache's (tolerance %g)",
                     scalar ? "scalar" : "vector", i, worst, KV16_TOL);
        same_argmax += argmax(la, V) == argmax(lb, V);
        ia = (tp_fwd_item){sa, 5 + i, &REF_IDS[i], 1, false};
        ib = (tp_fwd_item){sb, 5 + i, &REF_IDS[i], 1, false};
    }
    assert_int_equal(same_argmax, 252);
    print_message("kv f16 (%s): largest logit difference from f32 over 252 steps: %.3g\n",
                  scalar ? "scalar" : "vector", worst);
    /* free-running greedy from the f16 cache */
    tp_forward_seq_close(b, sb);
    tp_forward_seq_open(b, &sb, &e);
    ib = (tp_fwd_item){sb, 0, PROMPT, 5, false};
    int tok = 0;
    for (int i = 0; i < 252; i++) {
        assert_int_equal(tp_forward_step(b, &ib, 1, lb, &e), 0);
        tok = argmax(lb, V);
        if (tok != REF_IDS[i])
            fail_msg("kv f16: greedy id %d is %d, the f32 cache (run.c) gives %d", i, tok, REF_IDS[i]);
        ib = (tp_fwd_item){sb, 5 + i, &tok, 1, false};
    }
    free(la);
    free(lb);
    tp_forward_free(a);
    tp_forward_free(b);
    tp_model_free(m);
}

static void kv_f16_logits_stay_close_to_f32_and_greedy_ids_are_equal(void **state)
{
    (void)state;
    kv_f16_stays_close_to_f32(false);
    kv_f16_stays_close_to_f32(true);
}

static void default_threads_follow_the_affinity_mask(void **state)
{
    (void)state;
    cpu_set_t all, one;
    assert_int_equal(sched_getaffinity(0, sizeof all, &all), 0);
    int n = CPU_COUNT(&all);
    assert_int_equal(tp_forward_default_threads(), n < TP_FORWARD_MAX_THREADS ? n : TP_FORWARD_MAX_THREADS);
    CPU_ZERO(&one);
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
        if (CPU_ISSET(cpu, &all)) {
            CPU_SET(cpu, &one);
            break;
        }
    assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
    int pinned = tp_forward_default_threads();
    assert_int_equal(sched_setaffinity(0, sizeof all, &all), 0);
    assert_int_equal(pinned, 1);
    /* and the bounds of an explicit count */
    tp_model *m = load_real("stories260K.bin");
    tp_forward *f;
    tp_err e;
    assert_int_equal(tp_forward_new(m, 1, 16, 8, &f, &e), 0);
    assert_int_equal(tp_forward_threads(f), 1);
    assert_int_equal(tp_forward_set_threads(f, 0, &e), TP_EINVAL);
    assert_int_equal(tp_forward_set_threads(f, TP_FORWARD_MAX_THREADS + 1, &e), TP_EINVAL);
    assert_non_null(strstr(e.msg, "257"));
    assert_int_equal(tp_forward_set_threads(f, 3, &e), 0);
    assert_int_equal(tp_forward_threads(f), 3);
    tp_forward_free(f);
    tp_model_free(m);
}

static void kv_type_changes_only_with_no_sequence_open_and_bad_names_are_named(void **state)
{
    (void)state;
    tp_model *m = load_real("stories260K.bin");
    tp_forward *f;
    tp_err e;
    assert_int_equal(tp_forward_new(m, 2, 16, 8, &f, &e), 0);
    assert_int_equal(tp_forward_kv_type(f), TP_KV_F32);
    int sid;
    assert_int_equal(tp_forward_seq_open(f, &sid, &e), 0);
    assert_int_equal(tp_forward_set_kv_type(f, TP_KV_F16, &e), TP_ESTATE);
    assert_non_null(strstr(e.msg, "kv_type"));
    assert_int_equal(tp_forward_kv_type(f), TP_KV_F32);
    tp_forward_seq_close(f, sid);
    assert_int_equal(tp_forward_set_kv_type(f, TP_KV_F16, &e), 0);
    assert_int_equal(tp_forward_kv_type(f), TP_KV_F16);
    tp_kv_type t;
    assert_int_equal(tp_kv_type_parse("f16", &t, &e), 0);
    assert_int_equal(t, TP_KV_F16);
    assert_int_equal(tp_kv_type_parse(tp_kv_type_name(TP_KV_F32), &t, &e), 0);
    assert_int_equal(t, TP_KV_F32);
    assert_int_equal(tp_kv_type_parse("bf16", &t, &e), TP_EINVAL);
    assert_non_null(strstr(e.msg, "'bf16'"));
    tp_forward_free(f);
    tp_model_free(m);
}

/* ---- OpenBLAS kernel vs invariant kernel ------------------------------- */

/* A fixed schedule (tokens never depend on logits, so both kernels see the
 * same inputs): sequence s joins at step s with a prompt of 1 + 5s mod 7
 * tokens fed in chunks of 3 (non-final chunks skip logits), then decodes
 * until it holds len tokens. Steps mix prefill and decode, and the first
 * and last have a single row. Returns the number of items. */
static int schedule_step(int step, int n_seq, int len, int V, int *fed, int toks[][16], const int *sid,
                         tp_fwd_item *items)
{
    int n = 0;
    for (int s = 0; s < n_seq && s <= step; s++) {
        int plen = 1 + (5 * s) % 7;
        if (fed[s] >= len)
            continue;
        int take = fed[s] < plen ? (plen - fed[s] < 3 ? plen - fed[s] : 3) : 1;
        for (int j = 0; j < take; j++)
            toks[s][j] = (7 * s + 13 * (fed[s] + j) + 1) % V;
        items[n++] = (tp_fwd_item){sid[s], fed[s], toks[s], take, fed[s] + take < plen};
        fed[s] += take;
    }
    return n;
}

/* Every logits row of the OpenBLAS kernel (1 and 2 threads) within
 * tol * (1 + |x|) of the invariant kernel's, over the whole schedule. */
static void kernels_agree(const tp_model *m, int n_seq, int len, double tol)
{
    int V = tp_model_get_config(m)->vocab_size;
    tp_err e;
    for (int threads = 1; threads <= 2; threads++) {
        tp_forward *ref, *blas;
        assert_int_equal(tp_forward_new(m, n_seq, len, 64, &ref, &e), 0);
        assert_int_equal(tp_forward_new(m, n_seq, len, 64, &blas, &e), 0);
        assert_int_equal(tp_forward_set_kernel(blas, TP_FWD_KERNEL_OPENBLAS, &e), 0);
        assert_int_equal(tp_forward_kernel(blas), TP_FWD_KERNEL_OPENBLAS);
        assert_int_equal(tp_forward_set_threads(blas, threads, &e), 0);
        int sid[8], fed[8] = {0}, toks[8][16], rows = 0;
        for (int s = 0; s < n_seq; s++) {
            tp_forward_seq_open(ref, &sid[s], &e);
            tp_forward_seq_open(blas, &sid[s], &e);
        }
        float *a = malloc(sizeof(float) * n_seq * V), *b = malloc(sizeof(float) * n_seq * V);
        tp_fwd_item items[8];
        for (int step = 0, n; (n = schedule_step(step, n_seq, len, V, fed, toks, sid, items)) > 0; step++) {
            assert_int_equal(tp_forward_step(ref, items, n, a, &e), 0);
            if (tp_forward_step(blas, items, n, b, &e))
                fail_msg("openblas step %d: %s", step, e.msg);
            for (int i = 0; i < n; i++) {
                rows += !items[i].skip_logits;
                for (int v = 0; !items[i].skip_logits && v < V; v++) {
                    float x = a[(size_t)i * V + v], y = b[(size_t)i * V + v];
                    if (fabs((double)y - x) > tol * (1 + fabs(x)))
                        fail_msg("%d thread(s), step %d, item %d, logit %d: openblas %.8g, invariant %.8g",
                                 threads, step, i, v, y, x);
                }
            }
        }
        int want_rows = 0;
        for (int s = 0; s < n_seq; s++)
            want_rows += 1 + len - (1 + (5 * s) % 7); /* last prompt chunk + each decode */
        assert_int_equal(rows, want_rows);
        free(a);
        free(b);
        tp_forward_free(ref);
        tp_forward_free(blas);
    }
}

static void openblas_kernel_agrees_with_invariant_on_stories260k(void **state)
{
    (void)state;
    tp_model *m = load_real("stories260K.bin");
    kernels_agree(m, 8, 40, 1e-4);
    tp_model_free(m);
}

static void openblas_kernel_agrees_with_invariant_on_tiny_model(void **state)
{
    (void)state;
    tiny_shape sh = {16, 40, 2, 4, 2, 23, 12, 1};
    float *ck;
    tp_model *m = tiny_model_new(&sh, 9, 0.3f, &ck);
    kernels_agree(m, 4, 12, 1e-4);
    tp_model_free(m);
    free(ck);
}

static void kernel_names_round_trip_and_a_bad_name_is_an_error_naming_it(void **state)
{
    (void)state;
    tp_fwd_kernel k = TP_FWD_KERNEL_OPENBLAS;
    tp_err e;
    assert_int_equal(tp_fwd_kernel_parse("invariant", &k, &e), 0);
    assert_int_equal(k, TP_FWD_KERNEL_INVARIANT);
    assert_int_equal(tp_fwd_kernel_parse(tp_fwd_kernel_name(TP_FWD_KERNEL_OPENBLAS), &k, &e), 0);
    assert_int_equal(k, TP_FWD_KERNEL_OPENBLAS);
    assert_int_equal(tp_fwd_kernel_parse("blas", &k, &e), TP_EINVAL);
    assert_non_null(strstr(e.msg, "'blas'"));
    assert_int_equal(k, TP_FWD_KERNEL_OPENBLAS); /* unchanged on error */
    tp_model *m = load_real("stories260K.bin");
    tp_forward *f;
    assert_int_equal(tp_forward_new(m, 1, 8, 4, &f, &e), 0);
    assert_int_equal(tp_forward_kernel(f), TP_FWD_KERNEL_INVARIANT); /* the default */
    assert_int_equal(tp_forward_set_kernel(f, (tp_fwd_kernel)7, &e), TP_EINVAL);
    assert_non_null(strstr(e.msg, "kernel 7"));
    assert_int_equal(tp_forward_kernel(f), TP_FWD_KERNEL_INVARIANT);
    tp_forward_free(f);
    tp_model_free(m);
}

/* ---- pool and validation ----------------------------------------------- */

static void kv_pool_exhaustion_is_an_error_not_a_crash(void **state)
{
    (void)state;
    tp_model *m = load_real("stories260K.bin");
    tp_forward *f;
    tp_err e;
    assert_int_equal(tp_forward_new(m, 2, 8, 16, &f, &e), 0);
    int a, b, c;
    assert_int_equal(tp_forward_seq_open(f, &a, &e), 0);
    assert_int_equal(tp_forward_seq_open(f, &b, &e), 0);
    assert_int_equal(tp_forward_seq_open(f, &c, &e), TP_EFULL);
    assert_non_null(strstr(e.msg, "KV pool full"));
    float logits[2 * 512];
    int toks[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    tp_fwd_item it[2] = {{a, 0, toks, 5, false}, {b, 0, toks, 9, false}};
    assert_int_equal(tp_forward_step(f, it, 2, logits, &e), TP_EFULL);
    assert_non_null(strstr(e.msg, "item 1"));
    assert_int_equal(tp_forward_seq_length(f, a), 0); /* the failed call changed nothing */
    it[1].n_tokens = 8;
    assert_int_equal(tp_forward_step(f, it, 2, logits, &e), 0);
    assert_int_equal(tp_forward_seq_length(f, b), 8);
    tp_fwd_item more = {b, 8, toks, 1, false};
    assert_int_equal(tp_forward_step(f, &more, 1, logits, &e), TP_EFULL);
    assert_int_equal(tp_forward_seq_close(f, b), 0);
    assert_int_equal(tp_forward_seq_open(f, &c, &e), 0); /* the slot is reusable */
    assert_int_equal(tp_forward_seq_length(f, c), 0);
    tp_forward_free(f);
    tp_model_free(m);
}

static void step_rejects_bad_items_naming_them(void **state)
{
    (void)state;
    tp_model *m = load_real("stories260K.bin");
    tp_forward *f;
    tp_err e;
    assert_int_equal(tp_forward_new(m, 2, 16, 4, &f, &e), 0);
    int a, b;
    tp_forward_seq_open(f, &a, &e);
    tp_forward_seq_open(f, &b, &e);
    float logits[2 * 512];
    int good[3] = {1, 2, 3}, bad[2] = {1, 512};
    struct { tp_fwd_item it[2]; int n; int code; const char *msg; } cases[] = {
        {{{a, 0, bad, 2, false}}, 1, TP_EINVAL, "token 1 is 512"},
        {{{7, 0, good, 1, false}}, 1, TP_ENOTFOUND, "sequence 7 is not open"},
        {{{a, 0, good, 1, false}, {a, 0, good, 1, false}}, 2, TP_EINVAL, "appears twice"},
        {{{a, 1, good, 1, false}}, 1, TP_EINVAL, "pos 1 outside 0..0"},
        {{{a, 0, good, 3, false}, {b, 0, good, 2, false}}, 2, TP_ERANGE, "max_batch_tokens 4"},
        {{{a, 0, good, 0, false}}, 1, TP_EINVAL, "n_tokens 0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = tp_forward_step(f, cases[i].it, cases[i].n, logits, &e);
        if (rc != cases[i].code || !strstr(e.msg, cases[i].msg))
            fail_msg("case %zu: got %d '%s', want %d '%s'", i, rc, e.msg, cases[i].code, cases[i].msg);
    }
    tp_fwd_item ok = {a, 0, good, 3, false};
    assert_int_equal(tp_forward_step(f, &ok, 1, NULL, &e), TP_EINVAL); /* logits wanted, no buffer */
    ok.skip_logits = true;
    assert_int_equal(tp_forward_step(f, &ok, 1, NULL, &e), 0);
    tp_forward_free(f);
    tp_model_free(m);
}

static void rewinding_a_sequence_recomputes_the_same_logits(void **state)
{
    (void)state;
    tp_model *m = load_real("stories260K.bin");
    tp_forward *f;
    tp_err e;
    assert_int_equal(tp_forward_new(m, 1, 16, 8, &f, &e), 0);
    int a;
    tp_forward_seq_open(f, &a, &e);
    float first[512], again[512];
    tp_fwd_item it = {a, 0, PROMPT, 5, false};
    assert_int_equal(tp_forward_step(f, &it, 1, first, &e), 0);
    int other = 300;
    tp_fwd_item d = {a, 5, &other, 1, false};
    assert_int_equal(tp_forward_step(f, &d, 1, again, &e), 0);
    tp_fwd_item retry = {a, 4, &PROMPT[4], 1, false}; /* re-feed the last prompt token */
    assert_int_equal(tp_forward_step(f, &retry, 1, again, &e), 0);
    assert_memory_equal(first, again, sizeof first);
    assert_int_equal(tp_forward_seq_length(f, a), 5);
    tp_forward_free(f);
    tp_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kernel_equals_sequential_fmaf_for_any_token_count),
        cmocka_unit_test(vexp_lanes_equal_the_portable_function_within_an_ulp),
        cmocka_unit_test(swiglu_lanes_equal_the_portable_function),
        cmocka_unit_test(tiny_gqa_model_matches_double_reference),
        cmocka_unit_test(avx2_path_gives_the_portable_bits),
        cmocka_unit_test(avx512_path_gives_the_portable_bits),
        cmocka_unit_test(scalar_path_matches_double_reference),
        cmocka_unit_test(openblas_kernel_matches_double_reference),
        cmocka_unit_test(zero_blocks_give_normalized_embedding_logits),
        cmocka_unit_test(stories260k_greedy_reproduces_run_c),
        cmocka_unit_test(stories260k_gguf_greedy_gives_the_same_ids),
        cmocka_unit_test(stories260k_scalar_path_greedy_reproduces_run_c),
        cmocka_unit_test(stories260k_openblas_kernel_greedy_reproduces_run_c),
        cmocka_unit_test(batched_mixed_prefill_and_decode_logits_equal_alone_bitwise),
        cmocka_unit_test(scalar_path_is_batch_invariant_too),
        cmocka_unit_test(kv_f16_is_batch_and_chunk_invariant_on_1_to_4_threads),
        cmocka_unit_test(f16_conversions_equal_the_cpus_for_every_half_and_halfway_point),
        cmocka_unit_test(kv_f16_logits_stay_close_to_f32_and_greedy_ids_are_equal),
        cmocka_unit_test(kv_type_changes_only_with_no_sequence_open_and_bad_names_are_named),
        cmocka_unit_test(default_threads_follow_the_affinity_mask),
        cmocka_unit_test(openblas_kernel_agrees_with_invariant_on_stories260k),
        cmocka_unit_test(openblas_kernel_agrees_with_invariant_on_tiny_model),
        cmocka_unit_test(kernel_names_round_trip_and_a_bad_name_is_an_error_naming_it),
        cmocka_unit_test(kv_pool_exhaustion_is_an_error_not_a_crash),
        cmocka_unit_test(step_rejects_bad_items_naming_them),
        cmocka_unit_test(rewinding_a_sequence_recomputes_the_same_logits),
        cmocka_unit_test(qwen3_is_batch_chunk_and_thread_invariant),
        cmocka_unit_test(gemma3_and_gemma2_are_batch_chunk_and_thread_invariant),
        cmocka_unit_test(phi3_is_batch_chunk_and_thread_invariant),
        cmocka_unit_test(qwen3moe_is_batch_chunk_and_thread_invariant),
        cmocka_unit_test(qwen35moe_is_batch_chunk_and_thread_invariant),
        cmocka_unit_test(mixtral_is_batch_chunk_and_thread_invariant),
        cmocka_unit_test(gpt_oss_is_batch_chunk_and_thread_invariant),
        cmocka_unit_test(qwen35_is_batch_chunk_and_thread_invariant),
        cmocka_unit_test(qwen35_state_passes_give_the_portable_bits_on_every_level),
        cmocka_unit_test(qwen35_retried_step_recomputes_the_same_logits_and_other_rewinds_are_refused),
        cmocka_unit_test(moe_rows_are_the_same_alone_or_sharing_experts),
        cmocka_unit_test(moe_rows_with_a_shared_expert_are_the_same_alone_or_together),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
