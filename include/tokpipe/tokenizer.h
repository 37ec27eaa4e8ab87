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
 * (the file does not store it); pass 0 to infer it from the file length; a
 * file with more or fewer records is an error. As in llama2.c, id 0 is the
 * unknown token, 1 BOS and 2 EOS (control tokens); "<0xNN>" pieces are byte
 * tokens; all others normal. On success *out is owned by the caller
 * (tp_tokenizer_free); errors name the path, token and byte offset. */
int tp_tokenizer_load(const char *path, int vocab_size, tp_tokenizer **out, tp_err *err);

/* Same as tp_tokenizer_load, from the size bytes of a tokenizer.bin image in
 * memory (copied; data may be freed afterwards). Every length and offset is
 * checked against size: hostile input gets TP_EFORMAT naming the token and
 * byte offset, never an out-of-bounds read. */
int tp_tokenizer_load_mem(const void *data, size_t size, int vocab_size, tp_tokenizer **out,
                          tp_err *err);

/* Token types, numbered as GGUF's tokenizer.ggml.token_type (SentencePiece's
 * ModelProto piece types). */
enum tp_token_type {
    TP_TOKEN_NORMAL = 1,
    TP_TOKEN_UNKNOWN = 2,
    TP_TOKEN_CONTROL = 3,
    TP_TOKEN_USER_DEFINED = 4,
    TP_TOKEN_UNUSED = 5,
    TP_TOKEN_BYTE = 6,
};

/* Build a tokenizer from a vocabulary already in memory (the GGUF loader's
 * tokenizer.ggml.tokens/scores/token_type). pieces[i] has lens[i] bytes (not
 * NUL terminated); SentencePiece's meta space U+2581 is turned into ' '.
 * scores may be NULL (all 0). types may be NULL: then types are inferred as
 * for llama2.c files (id 0 unknown, bos/eos control, "<0xNN>" byte, else
 * normal). bos_id/eos_id are -1 if the vocabulary has none. Everything is
 * copied; the inputs may be freed afterwards. */
int tp_tokenizer_from_vocab(const char *const *pieces, const size_t *lens, const float *scores,
                            const int32_t *types, int n, int bos_id, int eos_id,
                            tp_tokenizer **out, tp_err *err);

void tp_tokenizer_free(tp_tokenizer *tok);

int tp_tokenizer_vocab_size(const tp_tokenizer *tok);
int tp_tokenizer_bos_id(const tp_tokenizer *tok);
int tp_tokenizer_eos_id(const tp_tokenizer *tok);
/* The unknown token's id, or -1 if the vocabulary has none. */
int tp_tokenizer_unk_id(const tp_tokenizer *tok);

/* The merge score of token id (higher merges first); 0 if out of range. */
float tp_tokenizer_score(const tp_tokenizer *tok, int id);

/* The type of token id (enum tp_token_type); 0 if id is out of range. */
int tp_tokenizer_token_type(const tp_tokenizer *tok, int id);

/* The piece as stored in the vocabulary (llama2.c spelling: ' ' for the
 * SentencePiece meta space, "<0x0A>" for byte tokens). Borrowed, not NUL
 * terminated; valid while tok lives. An id outside [0, vocab_size) gives
 * NULL and *len 0. */
const char *tp_tokenizer_piece(const tp_tokenizer *tok, int id, size_t *len);

/* The bytes token id contributes to generated text: a byte-fallback token
 * <0xNN> gives that one raw byte; control tokens (unknown, BOS, EOS) give no
 * bytes; any other piece gives its text. If prev_id is BOS the leading space
 * is dropped (SentencePiece's rule, as in llama2.c decode). Borrowed; valid
 * while tok lives. An id outside [0, vocab_size) gives NULL and *len 0. */
const uint8_t *tp_tokenizer_token_bytes(const tp_tokenizer *tok, int prev_id, int id, size_t *len);

/* Encode text (len bytes, any bytes) the way llama2.c's encode() does:
 * optional BOS, SentencePiece dummy-prefix space, byte fallback for unknown
 * characters, best-score merges (ties: leftmost pair first). Only normal and
 * user-defined pieces are matched, never control or byte pieces, as in
 * SentencePiece; a NUL byte is an ordinary byte. Writes up to cap ids to out
 * and the count to *n_out; TP_ERANGE if cap is too small (len + 2 always
 * suffices). O(len log len). Thread-safe on a shared tok. */
int tp_tokenizer_encode(const tp_tokenizer *tok, const char *text, size_t len, bool add_bos,
                        int *out, size_t cap, size_t *n_out, tp_err *err);

#endif
