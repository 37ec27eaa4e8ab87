/* Open a tokenizer for the command-line tools from either a llama2.c
 * tokenizer.bin or any GGUF file whose metadata carries a SentencePiece
 * vocabulary (tokenizer.ggml.model "llama"), including vocab-only files
 * without tensors. */
#ifndef TOKPIPE_TOOLS_TOKLOAD_H
#define TOKPIPE_TOOLS_TOKLOAD_H

#include "tokpipe/error.h"
#include "tokpipe/tokenizer.h"

/* The format is chosen by the file's first bytes ("GGUF" or not). On
 * success *out is owned by the caller (tp_tokenizer_free). Errors name the
 * path and what is wrong. */
int tools_tokenizer_open(const char *path, tp_tokenizer **out, tp_err *err);

#endif
