/* MXFP4 weights (ggml's block_mxfp4, GGML_TYPE_MXFP4 = 39; OCP's
 * microscaling FP4, gpt-oss's experts): blocks of 32 values, one E8M0
 * scale byte e, then 16 bytes of 4-bit E2M1 codes (columns 0..15 the low
 * nibbles of qs[0..15], columns 16..31 their high nibbles). ggml reads a
 * code through kvalues_mxfp4, the E2M1 values doubled as int8
 * {0, 1, 2, 3, 4, 6, 8, 12, and their negatives}, and halves the scale to
 * match (GGML_E8M0_TO_FP32_HALF(e) = 2^(e - 128)):
 *
 *   w = kvalues_mxfp4[code] * 2^(e - 128)
 *
 * So a block is an int8 block with a power-of-two scale: the canonical
 * order of quant.h as for Q8_0 (acc = fmaf(d * dx, P, acc) per block of
 * 32), its integer dot products exact. The AVX2 kernel decodes the codes
 * with one byte shuffle and follows that order, eight rows a vector; the
 * file's blocks are read in place (no panel). */
#include "quant.h"
#include "quant_avx.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define MXFP4_BYTES 17

static const int8_t KVALUES[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

float tp_e8m0_to_f32_half(uint8_t e)
{
    /* 2^(e - 128): below e = 2 a subnormal (ggml's 0x00200000 << e) */
    uint32_t bits = e < 2 ? UINT32_C(0x00200000) << e : (uint32_t)(e - 1) << 23;
    float d;
    memcpy(&d, &bits, 4);
    return d;
}

void tp_qunpack_mxfp4(const uint8_t *row, int c, int n_cols, int8_t w[64], float ws[16], float wm[16])
{
    int nb = n_cols - 64 * c >= 64 ? 2 : 1;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = row + (size_t)(2 * c + b) * MXFP4_BYTES;
        float d = tp_e8m0_to_f32_half(blk[0]);
        for (int j = 0; j < 16; j++) {
            w[32 * b + j] = KVALUES[blk[1 + j] & 0x0f];
            w[32 * b + 16 + j] = KVALUES[blk[1 + j] >> 4];
        }
        for (int l = 0; l < 8; l++) {
            ws[8 * b + l] = d;
            wm[8 * b + l] = 0.0f;
        }
    }
}

/* The 32 int8 weights of one block, in column order. */
__attribute__((target("avx2"), always_inline)) static inline __m256i decode32(const uint8_t *blk, __m256i table)
{
    __m128i qs = _mm_loadu_si128((const __m128i *)(blk + 1));
    __m128i m = _mm_set1_epi8(0x0f);
    __m256i idx = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), m), _mm_and_si128(qs, m));
    return _mm256_shuffle_epi8(table, idx);
}

/* Eight lanes of 32-bit partial sums of w . x (signed by signed): |w| times
 * x with w's sign, pairs to 16 bits (|w| <= 12: no saturation), then to
 * 32 bits. Exact. */
__attribute__((target("avx2"), always_inline)) static inline __m256i dot32(__m256i w, __m256i x)
{
    __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

/* The sums of eight vectors' lanes, vector i's in lane i (integer: exact). */
__attribute__((target("avx2"), always_inline)) static inline __m256i hsum8(const __m256i p[8])
{
    __m256i s01 = _mm256_hadd_epi32(p[0], p[1]), s23 = _mm256_hadd_epi32(p[2], p[3]);
    __m256i s45 = _mm256_hadd_epi32(p[4], p[5]), s67 = _mm256_hadd_epi32(p[6], p[7]);
    __m256i a = _mm256_hadd_epi32(s01, s23), b = _mm256_hadd_epi32(s45, s67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* Rows [r0, r1) eight at a time (past r1 the group's last row again, not
 * stored); per token the blocks in column order, each lane one row's
 * accumulator: acc = fmaf(d * dx, (float)P, acc), the scalar path's bits. */
__attribute__((target("avx2,fma"))) void tp_qrows_mxfp4_avx2(const tp_wmat *w, const tp_qact *a, float *y, int ldy,
                                                            int r0, int r1)
{
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)KVALUES));
    int nb = w->cols / 32;
    for (int g = r0; g < r1; g += 8) {
        const uint8_t *row[8];
        int n = r1 - g < 8 ? r1 - g : 8;
        for (int k = 0; k < 8; k++)
            row[k] = (const uint8_t *)w->data + (size_t)(g + (k < n ? k : n - 1)) * w->row_bytes;
        for (int t = 0; t < a->n_tok; t++) {
            const int8_t *xq = a->q + (size_t)t * (size_t)a->cols;
            const float *dx = a->dx + (size_t)t * (size_t)nb;
            __m256 acc = _mm256_setzero_ps();
            for (int b = 0; b < nb; b++) {
                __m256i x = _mm256_loadu_si256((const __m256i *)(xq + 32 * b));
                __m256i p[8];
                float d[8];
                for (int k = 0; k < 8; k++) {
                    const uint8_t *blk = row[k] + (size_t)b * MXFP4_BYTES;
                    p[k] = dot32(decode32(blk, table), x);
                    d[k] = tp_e8m0_to_f32_half(blk[0]);
                }
                __m256 s = _mm256_mul_ps(_mm256_loadu_ps(d), _mm256_set1_ps(dx[b]));
                acc = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(hsum8(p)), acc);
            }
            float out[8];
            _mm256_storeu_ps(out, acc);
            for (int k = 0; k < n; k++)
                y[(size_t)t * (size_t)ldy + (size_t)(g + k)] = out[k];
        }
    }
}

/* The nearest code to x at scale d (ggml's best_index_mxfp4: the first of
 * equal errors). */
static int best_index(float x, float d)
{
    int best = 0;
    float best_err = fabsf((float)KVALUES[0] * d - x);
    for (int i = 1; i < 16; i++) {
        float err = fabsf((float)KVALUES[i] * d - x);
        if (err < best_err) {
            best = i;
            best_err = err;
        }
    }
    return best;
}

/* ggml's quantize_row_mxfp4_ref: e = floor(log2(max|x|)) - 2 + 127 (0 for
 * an all-zero block), each value the nearest code at 2^(e - 128). */
void tp_quantize_mxfp4(const float *x, int n, uint8_t *out)
{
    for (int b = 0; b < n / 32; b++, x += 32, out += MXFP4_BYTES) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++)
            if (amax < fabsf(x[i]))
                amax = fabsf(x[i]);
        float le = amax > 0.0f ? floorf(log2f(amax)) - 2 + 127 : 0.0f;
        /* ggml casts straight to uint8_t; a finite float's exponent keeps this in range */
        uint8_t e = le < 0.0f ? 0 : le > 254.0f ? 254 : (uint8_t)le;
        float d = tp_e8m0_to_f32_half(e);
        out[0] = e;
        for (int j = 0; j < 16; j++)
            out[1 + j] = (uint8_t)(best_index(x[j], d) | best_index(x[16 + j], d) << 4);
    }
}
