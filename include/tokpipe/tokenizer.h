/* SentencePiece BPE tokenizer as in llama2.c (tokenizer.bin) or from a GGUF
 * vocabulary.
 *
 * Owns the vocabulary: pieces, scores, token types and, per id, the bytes the
 * token contributes to generated text. Read-only after load, so one tokenizer
 * may be shared by any number of jobs and threads. */
#ifndef TOKPIPE_TOKENIZER_H
#define TOKPIPE_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokpipe/error.h"

typedef struct tp_tokenizer tp_tokenizer;

/* Load a llama2.c tokenizer.bin. vocab_size is the model's vocabulary size
 * (the file does not store it); pass 0 to infer it from the file length.
 * On success *out is owned by the caller (tp_tokenizer_free). */
int tp_tokenizer_load(const char *path, int vocab_size, tp_tokenizer **out, tp_err *err);

void tp_tokenizer_free(tp_tokenizer *tok);

int tp_tokenizer_vocab_size(const tp_tokenizer *tok);
int tp_tokenizer_bos_id(const tp_tokenizer *tok);
int tp_tokenizer_eos_id(const tp_tokenizer *tok);

/* The piece as stored in the vocabulary (llama2.c spelling: ' ' for the
 * SentencePiece meta space, "<0x0A>" for byte tokens). Borrowed, not NUL
 * terminated; valid while tok lives. id must be in [0, vocab_size). */
const char *tp_tokenizer_piece(const tp_tokenizer *tok, int id, size_t *len);

/* The bytes token id contributes to generated text: a byte-fallback token
 * <0xNN> gives that one raw byte; control tokens (unknown, BOS, EOS) give no
 * bytes; any other piece gives its text. If prev_id is BOS the leading space
 * is dropped (SentencePiece's rule, as in llama2.c decode). Borrowed; valid
 * while tok lives. id must be in [0, vocab_size). */
const uint8_t *tp_tokenizer_token_bytes(const tp_tokenizer *tok, int prev_id, int id, size_t *len);

/* Encode text (len bytes, any bytes) the way llama2.c's encode() does:
 * optional BOS, SentencePiece dummy-prefix space, byte fallback for unknown
 * characters, best-score merges. Writes up to cap ids to out and the count
 * to *n_out; TP_ERANGE if cap is too small. */
int tp_tokenizer_encode(const tp_tokenizer *tok, const char *text, size_t len, bool add_bos,
                        int *out, size_t cap, size_t *n_out, tp_err *err);

#endif
