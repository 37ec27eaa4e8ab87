/* GGUF v3 writer: metadata and tensors in, one little-endian file out.
 *
 * Build a file in memory order: set metadata keys (setting a key again
 * replaces its value and keeps its place), add tensors (their data is
 * borrowed until tp_gguf_write returns), then write. Tensors are laid out
 * in the order added, each at an offset that is a multiple of the
 * alignment (general.alignment if set, a power of two; else 32, as GGUF
 * says). The file is written to a temporary name beside path and renamed
 * over it, so a reader never sees half a file. The files are read back by
 * tp_gguf_parse (gguf.h) and by llama.cpp's gguf reader. */
#ifndef TOKPIPE_GGUF_WRITE_H
#define TOKPIPE_GGUF_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokpipe/error.h"

typedef struct tp_gguf_writer tp_gguf_writer;

/* An empty writer; *out is owned by the caller (tp_gguf_writer_free). */
int tp_gguf_writer_new(tp_gguf_writer **out, tp_err *err);
void tp_gguf_writer_free(tp_gguf_writer *w); /* NULL ok */

/* Scalar and string metadata. Keys and strings are copied. Keys must be
 * non-empty and shorter than 64 KiB. */
int tp_gguf_set_str(tp_gguf_writer *w, const char *key, const char *v, tp_err *err);
int tp_gguf_set_u32(tp_gguf_writer *w, const char *key, uint32_t v, tp_err *err);
int tp_gguf_set_i32(tp_gguf_writer *w, const char *key, int32_t v, tp_err *err);
int tp_gguf_set_u64(tp_gguf_writer *w, const char *key, uint64_t v, tp_err *err);
int tp_gguf_set_f32(tp_gguf_writer *w, const char *key, float v, tp_err *err);
int tp_gguf_set_bool(tp_gguf_writer *w, const char *key, bool v, tp_err *err);

/* Array metadata; the n values are copied. */
int tp_gguf_set_arr_str(tp_gguf_writer *w, const char *key, const char *const *v, size_t n, tp_err *err);
int tp_gguf_set_arr_i32(tp_gguf_writer *w, const char *key, const int32_t *v, size_t n, tp_err *err);
int tp_gguf_set_arr_f32(tp_gguf_writer *w, const char *key, const float *v, size_t n, tp_err *err);

/* Copy every metadata entry of the GGUF file at gguf_path whose key starts
 * with prefix (NULL: all of them) into w, replacing keys w already has.
 * The values are copied; the file is closed on return. */
int tp_gguf_copy_kv_from_file(tp_gguf_writer *w, const char *gguf_path, const char *prefix, tp_err *err);

/* A tensor of ggml type ggml_type (ggml_types.h) with n_dims (1..4)
 * dimensions ne (ne[0] varies fastest). nbytes must be exactly what ggml
 * stores for that type and shape. data is borrowed until tp_gguf_write.
 * A name already added, or one of 64 bytes or more (ggml's limit), is
 * refused. */
int tp_gguf_add_tensor(tp_gguf_writer *w, const char *name, uint32_t ggml_type, int n_dims,
                       const uint64_t *ne, const void *data, size_t nbytes, tp_err *err);

/* Write the file (via a temporary file in the same directory, renamed over
 * path). The writer stays usable: it may be written again. */
int tp_gguf_write(tp_gguf_writer *w, const char *path, tp_err *err);

#endif
