/* ggml tensor types: ids, names and block layouts, shared by the GGUF
 * reader, the GGUF writer and the weight loaders.
 *
 * A ggml tensor of a block type stores its rows (ne[0] elements each) as
 * ne[0] / block_elems blocks of block_bytes bytes; plain types have
 * block_elems 1. The ids are ggml's (enum ggml_type), as written in GGUF
 * files; ids ggml retired (4, 5, 31..33) are unknown here. */
#ifndef TOKPIPE_GGML_TYPES_H
#define TOKPIPE_GGML_TYPES_H

#include <stdbool.h>
#include <stdint.h>

#include "tokpipe/error.h"

enum {
    TP_GGML_F32 = 0, TP_GGML_F16 = 1, TP_GGML_Q4_0 = 2, TP_GGML_Q4_1 = 3,
    TP_GGML_Q5_0 = 6, TP_GGML_Q5_1 = 7, TP_GGML_Q8_0 = 8, TP_GGML_Q8_1 = 9,
    TP_GGML_Q2_K = 10, TP_GGML_Q3_K = 11, TP_GGML_Q4_K = 12, TP_GGML_Q5_K = 13,
    TP_GGML_Q6_K = 14, TP_GGML_Q8_K = 15, TP_GGML_IQ2_XXS = 16, TP_GGML_IQ2_XS = 17,
    TP_GGML_IQ3_XXS = 18, TP_GGML_IQ1_S = 19, TP_GGML_IQ4_NL = 20, TP_GGML_IQ3_S = 21,
    TP_GGML_IQ2_S = 22, TP_GGML_IQ4_XS = 23, TP_GGML_I8 = 24, TP_GGML_I16 = 25,
    TP_GGML_I32 = 26, TP_GGML_I64 = 27, TP_GGML_F64 = 28, TP_GGML_IQ1_M = 29,
    TP_GGML_BF16 = 30, TP_GGML_TQ1_0 = 34, TP_GGML_TQ2_0 = 35, TP_GGML_MXFP4 = 39,
};

typedef struct tp_ggml_type_info {
    uint32_t id;
    const char *name;     /* ggml's name: "f32", "q4_K", ... */
    uint32_t block_elems; /* elements per block (1 for plain types) */
    uint32_t block_bytes; /* bytes per block */
} tp_ggml_type_info;

/* The layout of ggml type id, or NULL if it is not a type ggml defines. */
const tp_ggml_type_info *tp_ggml_type(uint32_t id);

/* Bytes a tensor of this type and shape takes (ne[0] varies fastest, n_dims
 * 1..4). Fails naming the type or dimension if the type is unknown, a
 * dimension is 0, ne[0] is not a whole number of blocks or the size
 * overflows. */
int tp_ggml_nbytes(uint32_t type, int n_dims, const uint64_t *ne, uint64_t *nbytes, tp_err *err);

/* True for the types a weight matrix may have in a file tokpipe loads
 * (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, MXFP4): the
 * loader refuses the others by name, the forward's kernels read these. */
bool tp_ggml_matrix_type_ok(uint32_t type);

#endif
