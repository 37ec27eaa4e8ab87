/* GGUF v3 container parser (the llama.cpp model file format).
 *
 * Parses the header, the key/value metadata and the tensor directory of a
 * GGUF file held in memory (usually an mmap). Every count, string length,
 * array size and tensor offset/extent is checked against the buffer size
 * with overflow-safe arithmetic, so a truncated or hostile file gives an
 * error naming what is wrong and never an out-of-bounds read. The parser
 * borrows the buffer: it must outlive the tp_gguf. Little-endian only. */
#ifndef TOKPIPE_GGUF_H
#define TOKPIPE_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "tokpipe/error.h"
#include "tokpipe/ggml_types.h"

typedef struct tp_gguf tp_gguf;

/* GGUF metadata value types (gguf_type in the spec). */
enum {
    TP_GGUF_U8 = 0, TP_GGUF_I8 = 1, TP_GGUF_U16 = 2, TP_GGUF_I16 = 3,
    TP_GGUF_U32 = 4, TP_GGUF_I32 = 5, TP_GGUF_F32 = 6, TP_GGUF_BOOL = 7,
    TP_GGUF_STRING = 8, TP_GGUF_ARRAY = 9, TP_GGUF_U64 = 10, TP_GGUF_I64 = 11,
    TP_GGUF_F64 = 12,
};

#define TP_GGUF_MAX_DIMS 4

typedef struct tp_gguf_str {
    const char *ptr; /* borrowed from the buffer, not NUL terminated */
    uint64_t len;
} tp_gguf_str;

typedef struct tp_gguf_tensor {
    tp_gguf_str name;
    uint32_t n_dims;
    uint64_t dims[TP_GGUF_MAX_DIMS]; /* dims[0] varies fastest (ggml "ne") */
    uint32_t type;
    uint64_t offset;     /* relative to the start of the tensor data section */
    const void *data;    /* borrowed; NULL if the type is not in ggml_types.h */
    uint64_t nbytes;     /* 0 if the type is not in ggml_types.h */
} tp_gguf_tensor;

/* Parse a GGUF v3 buffer of size bytes. On success *out is owned by the
 * caller (tp_gguf_free) and borrows data. */
int tp_gguf_parse(const void *data, size_t size, tp_gguf **out, tp_err *err);

void tp_gguf_free(tp_gguf *g);

/* Tensor directory. The index is in file order. */
uint64_t tp_gguf_n_tensors(const tp_gguf *g);
const tp_gguf_tensor *tp_gguf_tensor_at(const tp_gguf *g, uint64_t i);
/* NULL if no tensor has this name. */
const tp_gguf_tensor *tp_gguf_tensor_find(const tp_gguf *g, const char *name);

/* Metadata lookups. Each returns TP_ENOTFOUND if the key is absent (err
 * names the key) and TP_EFORMAT if it has an incompatible type. */

/* Any integer type (or bool) whose value fits in int64. */
int tp_gguf_get_int(const tp_gguf *g, const char *key, int64_t *out, tp_err *err);
/* F32 or F64. */
int tp_gguf_get_float(const tp_gguf *g, const char *key, double *out, tp_err *err);
/* A string; *out borrows the buffer. */
int tp_gguf_get_str(const tp_gguf *g, const char *key, tp_gguf_str *out, tp_err *err);
/* An array of strings: *out is a caller-freed (free()) array of *n views. */
int tp_gguf_get_str_array(const tp_gguf *g, const char *key, tp_gguf_str **out, uint64_t *n,
                          tp_err *err);
/* An array of a fixed-size element type: *elem_type, *n, and a borrowed
 * pointer to the raw little-endian elements (possibly unaligned: memcpy). */
int tp_gguf_get_array(const tp_gguf *g, const char *key, uint32_t *elem_type, uint64_t *n,
                      const uint8_t **raw, tp_err *err);

/* Every metadata entry, in file order (for copying metadata between files). */
typedef struct tp_gguf_kv_view {
    tp_gguf_str key;
    uint32_t type;       /* TP_GGUF_* */
    uint32_t elem_type;  /* arrays: element type */
    uint64_t count;      /* arrays: element count */
    const uint8_t *raw;  /* borrowed: the encoded value; for arrays the elements
                          * after the element type and count */
    uint64_t raw_len;
} tp_gguf_kv_view;

uint64_t tp_gguf_n_kv(const tp_gguf *g);
/* TP_ERANGE if i >= tp_gguf_n_kv(g). */
int tp_gguf_kv_at(const tp_gguf *g, uint64_t i, tp_gguf_kv_view *out, tp_err *err);

#endif
