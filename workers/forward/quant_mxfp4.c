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
 * 32), its integer dot products exact. The kernels decode the codes with
 * a byte shuffle and follow that order: AVX2 eight rows a vector, from the
 * file's blocks (two rows a register, a horizontal sum per block) or from
 * a panel of eight rows made at load; AVX-512 (VNNI's byte dot products)
 * sixteen rows from a panel of sixteen. In a panel the rows' codes lie
 * side by side, so each row's sum comes out in its own lane. */
#include "quant.h"
#include "quant_avx.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define MXFP4_BYTES 17
/* tokens the AVX2 kernel takes together */
#define TOKENS 4

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

/* The codes plus 12, unsigned (0..24), for the byte multiply-add's
 * unsigned side: w . x = (w + 12) . x - 12 * sum(x), the activation block's
 * sum being tp_qact's (nsum32: its negative). Integer, so exact. */
static const uint8_t KVALUES_U[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

/* Eight scale bytes (the low byte of each lane) as tp_e8m0_to_f32_half
 * gives them: the bits (e - 1) << 23, or 0x00200000 << e below 2. */
__attribute__((target("avx2"), always_inline)) static inline __m256 scales8(__m256i e)
{
    e = _mm256_and_si256(e, _mm256_set1_epi32(0xff));
    __m256i norm = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    __m256i small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(norm, sub, small));
}

/* Two rows' block b as 32-bit sums of (w + 12) * x, four a row: row k's
 * codes in the low lane, row k + 1's in the high one, the low nibbles
 * against columns 0..15 (xlo, in both lanes), the high ones against
 * 16..31. Each 16-bit sum is at most 4 * 24 * 127: no saturation. */
__attribute__((target("avx2"), always_inline)) static inline __m256i dot_pair(const uint8_t *q0, const uint8_t *q1,
                                                                            __m256i table, __m256i xlo, __m256i xhi)
{
    const __m256i m = _mm256_set1_epi8(0x0f);
    __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)q0)),
                                        _mm_loadu_si128((const __m128i *)q1), 1);
    __m256i wlo = _mm256_shuffle_epi8(table, _mm256_and_si256(q, m));
    __m256i whi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(q, 4), m));
    __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(wlo, xlo), _mm256_maddubs_epi16(whi, xhi));
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

/* The eight rows' scale bytes of the block at off, as tp_e8m0_to_f32_half
 * gives them: byte loads composed in a register (a gather costs more on
 * the CPUs measured, and the loads are one cache line each). */
__attribute__((target("avx2"), always_inline)) static inline __m256 block_scales(const uint8_t *const *row, size_t off)
{
    uint64_t e8 = (uint64_t)row[0][off] | (uint64_t)row[1][off] << 8 | (uint64_t)row[2][off] << 16 |
                  (uint64_t)row[3][off] << 24 | (uint64_t)row[4][off] << 32 | (uint64_t)row[5][off] << 40 |
                  (uint64_t)row[6][off] << 48 | (uint64_t)row[7][off] << 56;
    return scales8(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)e8)));
}

/* Eight rows' integer sums of block b against token tok, as floats times
 * the block's scale (d, the rows') and the token's (dx): the term each
 * row's accumulator takes, acc = fmaf(d * dx, (float)P, acc), the scalar
 * path's bits. */
__attribute__((target("avx2,fma"), always_inline)) static inline __m256
block_term(const uint8_t *const *row, const tp_qact *a, int nb, int b, size_t off, size_t tok, __m256 d,
           __m256i table, __m256 acc)
{
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    size_t blk = tok * (size_t)nb + (size_t)b;
    const int8_t *xq = a->q + tok * (size_t)a->cols + 32 * (size_t)b;
    __m256i xlo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)xq));
    __m256i xhi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(xq + 16)));
    __m256i p0 = dot_pair(row[0] + off, row[1] + off, table, xlo, xhi);
    __m256i p1 = dot_pair(row[2] + off, row[3] + off, table, xlo, xhi);
    __m256i p2 = dot_pair(row[4] + off, row[5] + off, table, xlo, xhi);
    __m256i p3 = dot_pair(row[6] + off, row[7] + off, table, xlo, xhi);
    /* lanes: rows 0 2 4 6 | 1 3 5 7, then in order */
    __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
    h = _mm256_permutevar8x32_epi32(h, order);
    h = _mm256_add_epi32(h, _mm256_set1_epi32(12 * a->nsum32[blk]));
    __m256 s = _mm256_mul_ps(d, _mm256_set1_ps(a->dx[blk]));
    return _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(h), acc);
}

/* Eight rows for one token (decode) and for four (a block decoded once for
 * them), the accumulators named so that they stay in registers. */
__attribute__((target("avx2,fma"), always_inline)) static inline void rows8_one(const uint8_t *const *row,
                                                                               const tp_qact *a, int nb, int t0,
                                                                               __m256i table, __m256 *out)
{
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        size_t off = (size_t)b * MXFP4_BYTES;
        acc = block_term(row, a, nb, b, off + 1, (size_t)t0, block_scales(row, off), table, acc);
    }
    out[0] = acc;
}

__attribute__((target("avx2,fma"), always_inline)) static inline void rows8_four(const uint8_t *const *row,
                                                                                const tp_qact *a, int nb, int t0,
                                                                                __m256i table, __m256 *out)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int b = 0; b < nb; b++) {
        size_t off = (size_t)b * MXFP4_BYTES;
        __m256 d = block_scales(row, off);
        a0 = block_term(row, a, nb, b, off + 1, (size_t)t0, d, table, a0);
        a1 = block_term(row, a, nb, b, off + 1, (size_t)t0 + 1, d, table, a1);
        a2 = block_term(row, a, nb, b, off + 1, (size_t)t0 + 2, d, table, a2);
        a3 = block_term(row, a, nb, b, off + 1, (size_t)t0 + 3, d, table, a3);
    }
    out[0] = a0, out[1] = a1, out[2] = a2, out[3] = a3;
}

/* Rows [r0, r1) eight at a time (past r1 the group's last row again, not
 * stored), up to four tokens together (a block decoded once for them). */
__attribute__((target("avx2,fma"))) void tp_qrows_mxfp4_avx2(const tp_wmat *w, const tp_qact *a, float *y, int ldy,
                                                            int r0, int r1)
{
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)KVALUES_U));
    int nb = w->cols / 32;
    for (int g = r0; g < r1; g += 8) {
        const uint8_t *row[8];
        int n = r1 - g < 8 ? r1 - g : 8;
        for (int k = 0; k < 8; k++)
            row[k] = (const uint8_t *)w->data + (size_t)(g + (k < n ? k : n - 1)) * w->row_bytes;
        for (int t0 = 0; t0 < a->n_tok; t0 += TOKENS) {
            int nt = a->n_tok - t0 < TOKENS ? a->n_tok - t0 : TOKENS;
            __m256 acc[TOKENS];
            if (nt == TOKENS)
                rows8_four(row, a, nb, t0, table, acc);
            else /* a group's last one to three tokens one at a time: the same terms */
                for (int t = 0; t < nt; t++)
                    rows8_one(row, a, nb, t0 + t, table, acc + t);
            for (int t = 0; t < nt; t++) {
                float out[8];
                _mm256_storeu_ps(out, acc[t]);
                for (int k = 0; k < n; k++)
                    y[(size_t)(t0 + t) * (size_t)ldy + (size_t)(g + k)] = out[k];
            }
        }
    }
}

/* ---- panels: rows side by side --------------------------------------
 *
 * A panel (tp_qpanel) of n rows a group (16 for AVX-512, 8 for AVX2):
 * group g (rows ng..ng+n-1; past the last row, zero bytes: weights 0) at
 * data + g * group_bytes, block b of 32 columns at 16 n b: the n rows'
 * codes in quant.h's 4-bit layout (quad k = columns 4k..4k+3, n rows x 4
 * bytes, in vector k / 2's nibble k % 2; a vector is 4 n bytes), so a
 * byte dot product of a vector and an activation quad broadcast gives n
 * rows' sums side by side, no horizontal reduction. After the group's
 * blocks, at 16 n blocks, each block's n scales as e - 128 (int8; row r's
 * at n b + r), the group rounded up to a cache line: the file's bytes per
 * weight. */

size_t tp_mxfp4_panel_group_bytes(int blocks, int n)
{
    return 16 * (size_t)n * (size_t)blocks + ((size_t)n * (size_t)blocks + 63) / 64 * 64;
}

void tp_mxfp4_panel_put_row(uint8_t *grp, int blocks, int n, int r, const uint8_t *row)
{
    for (int b = 0; b < blocks; b++) {
        const uint8_t *blk = row + (size_t)b * MXFP4_BYTES;
        uint8_t *codes = grp + 16 * (size_t)n * (size_t)b;
        grp[16 * (size_t)n * (size_t)blocks + (size_t)n * (size_t)b + (size_t)r] = (uint8_t)(blk[0] - 128);
        /* vector v, byte j of the row: columns 8v + j (low nibble) and 8v + 4 + j */
        for (int v = 0; v < 4; v++)
            for (int j = 0; j < 4; j++) {
                int c0 = 8 * v + j, c1 = c0 + 4;
                int lo = c0 < 16 ? blk[1 + c0] & 0x0f : blk[1 + c0 - 16] >> 4;
                int hi = c1 < 16 ? blk[1 + c1] & 0x0f : blk[1 + c1 - 16] >> 4;
                codes[4 * (size_t)n * (size_t)v + 4 * (size_t)r + (size_t)j] = (uint8_t)(lo | hi << 4);
            }
    }
}

/* ---- AVX2 from the panel of eight rows ---------------------------------- */

/* AVX2's panel prefetch: bytes ahead of the group's read (one run, each
 * line asked once, up to the range's end). gpt-oss decode at one thread
 * (Zen 4, AVX2 forced): 4 KB ahead 75 tok/s, 8 to 32 KB 88. */
#define AVX2_AHEAD 16384

/* A tile: eight rows (group g) x nt tokens from t0 (a constant: 1 or
 * TOKENS). Per block the codes are decoded once (a byte shuffle to
 * w + 12) for the tokens; maddubs pairs are at most 2 * 24 * 127, so four
 * quads sum in 16 bits (24384) before widening; then as block_term:
 * acc = fmaf(d * dx, (float)P, acc), the scalar path's bits. */
__attribute__((target("avx2,fma"), always_inline)) static inline void
ptile8(const tp_qpanel *p, int g, const tp_qact *a, int t0, const int nt, const uint8_t *pf_end, float *y,
       size_t ldy, int r0, int r1)
{
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)KVALUES_U));
    const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const int nb = p->blocks, cols = a->cols;
    const uint8_t *base = p->data + (size_t)g * p->group_bytes, *exps = base + 128 * (size_t)nb;
    /* the codes' lines, and the scales' spread over the blocks as read:
     * step bytes of the run a block */
    const char *pf = (const char *)base + AVX2_AHEAD, *stop = (const char *)pf_end;
    const size_t step = (p->group_bytes + (size_t)nb - 1) / (size_t)nb;
    __m256 acc[TOKENS];
    TP_QUNROLL for (int t = 0; t < nt; t++)
        acc[t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = base + 128 * (size_t)b;
        for (const char *to = (const char *)base + AVX2_AHEAD + (size_t)(b + 1) * step; pf < to && pf < stop; pf += 64)
            _mm_prefetch(pf, _MM_HINT_T1);
        __m256i w[8];
        TP_QUNROLL for (int v = 0; v < 4; v++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(blk + 32 * v));
            w[2 * v] = _mm256_shuffle_epi8(table, _mm256_and_si256(q, m4));
            w[2 * v + 1] = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
        }
        int64_t e8;
        memcpy(&e8, exps + 8 * (size_t)b, 8);
        __m256i e = _mm256_add_epi32(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(e8)), _mm256_set1_epi32(128));
        __m256 d = scales8(e);
        TP_QUNROLL for (int t = 0; t < nt; t++) {
            size_t tt = (size_t)(t0 + t), tb = tt * (size_t)nb + (size_t)b;
            const int8_t *xq = a->q + tt * (size_t)cols + 32 * (size_t)b;
            __m256i s = _mm256_set1_epi32(12 * a->nsum32[tb]);
            TP_QUNROLL for (int h = 0; h < 2; h++) {
                __m256i s16 = _mm256_setzero_si256();
                TP_QUNROLL for (int k = 4 * h; k < 4 * h + 4; k++) {
                    int32_t xk;
                    memcpy(&xk, xq + 4 * k, 4);
                    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w[k], _mm256_set1_epi32(xk)));
                }
                s = _mm256_add_epi32(s, _mm256_madd_epi16(s16, ones));
            }
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(a->dx[tb])), _mm256_cvtepi32_ps(s), acc[t]);
        }
    }
    int lo = 8 * g, a0 = r0 > lo ? r0 - lo : 0, a1 = r1 - lo < 8 ? r1 - lo : 8;
    TP_QUNROLL for (int t = 0; t < nt; t++) {
        float out[8];
        _mm256_storeu_ps(out, acc[t]);
        memcpy(y + (size_t)t * ldy + (size_t)(lo + a0), out + a0, sizeof(float) * (size_t)(a1 - a0));
    }
}

__attribute__((target("avx2,fma"))) static void ptile8_four(const tp_qpanel *p, int g, const tp_qact *a, int t0,
                                                           const uint8_t *pf_end, float *y, size_t ldy, int r0,
                                                           int r1)
{
    ptile8(p, g, a, t0, TOKENS, pf_end, y, ldy, r0, r1);
}

__attribute__((target("avx2,fma"))) static void ptile8_one(const tp_qpanel *p, int g, const tp_qact *a, int t0,
                                                          const uint8_t *pf_end, float *y, size_t ldy, int r0, int r1)
{
    ptile8(p, g, a, t0, 1, pf_end, y, ldy, r0, r1);
}

/* Rows [r0, r1) from the panel of eight rows: TOKENS tokens a pass, the
 * last ones one a pass (the same terms). */
void tp_qrows_mxfp4_avx2_panel(const tp_wmat *w, const tp_qact *a, float *y, int ldy, int r0, int r1)
{
    const tp_qpanel *p = w->panel;
    int g1 = (r1 + 7) / 8;
    const uint8_t *end = p->data + (size_t)g1 * p->group_bytes;
    for (int g = r0 / 8; g < g1; g++) {
        int t0 = 0;
        for (; t0 + TOKENS <= a->n_tok; t0 += TOKENS)
            ptile8_four(p, g, a, t0, end, y + (size_t)t0 * (size_t)ldy, (size_t)ldy, r0, r1);
        for (; t0 < a->n_tok; t0++)
            ptile8_one(p, g, a, t0, end, y + (size_t)t0 * (size_t)ldy, (size_t)ldy, r0, r1);
    }
}

/* ---- AVX-512 (VNNI) from the panel of sixteen rows ---------------------- */

#define ISA512 "avx512f,avx512bw,avx512vnni"
#define PANEL_CODES 256

/* A tile: G groups (1 or 2) x T tokens (1..TP_QTB) from t0. Per block and
 * quad vector, the codes are decoded once (a byte shuffle to w + 12) for
 * the T tokens, each token's activation quads broadcast once for the G
 * groups; per block, acc = fmaf(d * dx, (float)P, acc), d * dx as
 * vscalefps(dx, e - 128): dx times a power of two rounded once, the
 * product tp_e8m0_to_f32_half(e) * dx of the scalar path (d is exact, a
 * subnormal too), so the bits are the scalar path's. */
__attribute__((target(ISA512), always_inline)) static inline void
ptile(const tp_qpanel *p, int g0, const tp_qact *a, int t0, float *y, size_t ldy, int r0, int r1,
      const uint8_t *pf_end, const int G, const int T)
{
    const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)KVALUES_U));
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512 acc[2][TP_QTB];
    TP_QUNROLL for (int g = 0; g < G; g++)
        TP_QUNROLL for (int t = 0; t < T; t++)
            acc[g][t] = _mm512_setzero_ps();
    const int nb = p->blocks, cols = a->cols;
    const size_t gb = p->group_bytes;
    const uint8_t *base = p->data + (size_t)g0 * gb, *exps = base + (size_t)PANEL_CODES * (size_t)nb;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = base + (size_t)b * PANEL_CODES;
        /* see TP_QPF: every line of each group's stream asked for once,
         * TP_QPF ahead, up to the range's end (past it: another matrix's
         * or none; that line would be read for nothing) */
        TP_QUNROLL for (int g = 0; g < G; g++) {
            const uint8_t *q = blk + (size_t)g * gb + TP_QPF, *e = exps + (size_t)g * gb + 16 * (size_t)b + TP_QPF;
            if (q < pf_end)
                for (int o = 0; o < PANEL_CODES; o += 64)
                    _mm_prefetch((const char *)q + o, TP_QPF_HINT);
            if (b % 4 == 0 && e < pf_end)
                _mm_prefetch((const char *)e, TP_QPF_HINT);
        }
        __m512i ia[2][TP_QTB];
        TP_QUNROLL for (int t = 0; t < T; t++) {
            __m512i init = _mm512_set1_epi32(12 * a->nsum32[(size_t)(t0 + t) * (size_t)nb + (size_t)b]);
            TP_QUNROLL for (int g = 0; g < G; g++)
                ia[g][t] = init;
        }
        TP_QUNROLL for (int v = 0; v < 4; v++) {
            __m512i lo[2], hi[2];
            TP_QUNROLL for (int g = 0; g < G; g++) {
                __m512i q = _mm512_loadu_si512((const void *)(blk + (size_t)g * gb + 64 * (size_t)v));
                lo[g] = _mm512_shuffle_epi8(table, _mm512_and_si512(q, m4));
                hi[g] = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(q, 4), m4));
            }
            TP_QUNROLL for (int t = 0; t < T; t++) {
                const int8_t *xq = a->q + (size_t)(t0 + t) * (size_t)cols + 32 * (size_t)b + 8 * (size_t)v;
                int32_t x0, x1;
                memcpy(&x0, xq, 4);
                memcpy(&x1, xq + 4, 4);
                __m512i xb0 = _mm512_set1_epi32(x0), xb1 = _mm512_set1_epi32(x1);
                TP_QUNROLL for (int g = 0; g < G; g++)
                    ia[g][t] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(ia[g][t], lo[g], xb0), hi[g], xb1);
            }
        }
        __m512 ex[2];
        TP_QUNROLL for (int g = 0; g < G; g++)
            ex[g] = _mm512_cvtepi32_ps(
                _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(exps + (size_t)g * gb + 16 * (size_t)b))));
        TP_QUNROLL for (int t = 0; t < T; t++) {
            __m512 dx = _mm512_set1_ps(a->dx[(size_t)(t0 + t) * (size_t)nb + (size_t)b]);
            TP_QUNROLL for (int g = 0; g < G; g++)
                acc[g][t] = _mm512_fmadd_ps(_mm512_scalef_ps(dx, ex[g]), _mm512_cvtepi32_ps(ia[g][t]), acc[g][t]);
        }
    }
    TP_QUNROLL for (int g = 0; g < G; g++) {
        int lo = 16 * (g0 + g), a0 = r0 > lo ? r0 - lo : 0, a1 = r1 - lo < 16 ? r1 - lo : 16;
        __mmask16 m = (__mmask16)(((1u << a1) - 1) & ~((1u << a0) - 1));
        TP_QUNROLL for (int t = 0; t < T; t++)
            _mm512_mask_storeu_ps(y + (size_t)t * ldy + (size_t)lo, m, acc[g][t]);
    }
}

/* Rows [r0, r1) from the panel: decode (one token) two groups a tile; more
 * tokens, tiles of up to two groups x TP_QTB tokens. */
__attribute__((target(ISA512))) void tp_qrows_mxfp4_avx512(const tp_wmat *w, const tp_qact *a, float *y, int ldy,
                                                          int r0, int r1)
{
    const tp_qpanel *p = w->panel;
    size_t ld = (size_t)ldy;
    int g1 = (r1 + 15) / 16;
    const uint8_t *end = p->data + (size_t)g1 * p->group_bytes;
    for (int g = r0 / 16; g < g1;) {
        int two = g1 - g >= 2;
        for (int t0 = 0; t0 < a->n_tok;) {
            int tb = a->n_tok - t0 < TP_QTB ? a->n_tok - t0 : TP_QTB;
            float *yt = y + (size_t)t0 * ld;
            switch (tb * 2 + two) {
            case 2: ptile(p, g, a, t0, yt, ld, r0, r1, end, 1, 1); break;
            case 3: ptile(p, g, a, t0, yt, ld, r0, r1, end, 2, 1); break;
            case 4: ptile(p, g, a, t0, yt, ld, r0, r1, end, 1, 2); break;
            case 5: ptile(p, g, a, t0, yt, ld, r0, r1, end, 2, 2); break;
            case 6: ptile(p, g, a, t0, yt, ld, r0, r1, end, 1, 3); break;
            case 7: ptile(p, g, a, t0, yt, ld, r0, r1, end, 2, 3); break;
            case 8: ptile(p, g, a, t0, yt, ld, r0, r1, end, 1, 4); break;
            case 9: ptile(p, g, a, t0, yt, ld, r0, r1, end, 2, 4); break;
            case 10: ptile(p, g, a, t0, yt, ld, r0, r1, end, 1, 5); break;
            case 11: ptile(p, g, a, t0, yt, ld, r0, r1, end, 2, 5); break;
            case 12: ptile(p, g, a, t0, yt, ld, r0, r1, end, 1, 6); break;
            default: ptile(p, g, a, t0, yt, ld, r0, r1, end, 2, 6); break;
            }
            t0 += tb;
        }
        g += two ? 2 : 1;
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
