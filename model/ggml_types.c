/* ggml type table: block sizes from ggml's block_* struct layouts. */
#include "tokpipe/ggml_types.h"

#include <stddef.h>

static const tp_ggml_type_info TYPES[] = {
    {TP_GGML_F32, "f32", 1, 4},          {TP_GGML_F16, "f16", 1, 2},
    {TP_GGML_Q4_0, "q4_0", 32, 18},      {TP_GGML_Q4_1, "q4_1", 32, 20},
    {TP_GGML_Q5_0, "q5_0", 32, 22},      {TP_GGML_Q5_1, "q5_1", 32, 24},
    {TP_GGML_Q8_0, "q8_0", 32, 34},      {TP_GGML_Q8_1, "q8_1", 32, 36},
    {TP_GGML_Q2_K, "q2_K", 256, 84},     {TP_GGML_Q3_K, "q3_K", 256, 110},
    {TP_GGML_Q4_K, "q4_K", 256, 144},    {TP_GGML_Q5_K, "q5_K", 256, 176},
    {TP_GGML_Q6_K, "q6_K", 256, 210},    {TP_GGML_Q8_K, "q8_K", 256, 292},
    {TP_GGML_IQ2_XXS, "iq2_xxs", 256, 66}, {TP_GGML_IQ2_XS, "iq2_xs", 256, 74},
    {TP_GGML_IQ3_XXS, "iq3_xxs", 256, 98}, {TP_GGML_IQ1_S, "iq1_s", 256, 50},
    {TP_GGML_IQ4_NL, "iq4_nl", 32, 18},  {TP_GGML_IQ3_S, "iq3_s", 256, 110},
    {TP_GGML_IQ2_S, "iq2_s", 256, 82},   {TP_GGML_IQ4_XS, "iq4_xs", 256, 136},
    {TP_GGML_I8, "i8", 1, 1},            {TP_GGML_I16, "i16", 1, 2},
    {TP_GGML_I32, "i32", 1, 4},          {TP_GGML_I64, "i64", 1, 8},
    {TP_GGML_F64, "f64", 1, 8},          {TP_GGML_IQ1_M, "iq1_m", 256, 56},
    {TP_GGML_BF16, "bf16", 1, 2},        {TP_GGML_TQ1_0, "tq1_0", 256, 54},
    {TP_GGML_TQ2_0, "tq2_0", 256, 66},
    /* block_mxfp4: an E8M0 scale byte, 16 bytes of E2M1 codes */
    {TP_GGML_MXFP4, "mxfp4", 32, 17},
};

const tp_ggml_type_info *tp_ggml_type(uint32_t id)
{
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++)
        if (TYPES[i].id == id)
            return &TYPES[i];
    return NULL;
}

int tp_ggml_nbytes(uint32_t type, int n_dims, const uint64_t *ne, uint64_t *nbytes, tp_err *err)
{
    const tp_ggml_type_info *t = tp_ggml_type(type);
    if (!t)
        return tp_err_set(err, TP_EFORMAT, "ggml type %u is unknown", type);
    if (n_dims < 1 || n_dims > 4)
        return tp_err_set(err, TP_EFORMAT, "%d dimensions (1..4 allowed)", n_dims);
    if (ne[0] % t->block_elems)
        return tp_err_set(err, TP_EFORMAT, "ne[0] = %llu is not a multiple of the %s block size %u",
                          (unsigned long long)ne[0], t->name, t->block_elems);
    /* Bound by 2^62 so every product below is exact. */
    const uint64_t limit = UINT64_C(1) << 62;
    uint64_t n = ne[0] / t->block_elems * t->block_bytes;
    if (ne[0] == 0 || n > limit)
        return tp_err_set(err, TP_EFORMAT, "ne[0] = %llu is zero or too large", (unsigned long long)ne[0]);
    for (int d = 1; d < n_dims; d++) {
        if (ne[d] == 0 || ne[d] > limit / n)
            return tp_err_set(err, TP_EFORMAT, "ne[%d] = %llu is zero or too large", d,
                              (unsigned long long)ne[d]);
        n *= ne[d];
    }
    *nbytes = n;
    return 0;
}

bool tp_ggml_matrix_type_ok(uint32_t type)
{
    switch (type) {
    case TP_GGML_F32: case TP_GGML_F16: case TP_GGML_BF16: case TP_GGML_Q8_0: case TP_GGML_Q4_0:
    case TP_GGML_Q4_1: case TP_GGML_Q5_0: case TP_GGML_Q5_1: case TP_GGML_Q4_K: case TP_GGML_Q5_K:
    case TP_GGML_Q6_K: case TP_GGML_MXFP4:
        return true;
    default:
        return false;
    }
}
