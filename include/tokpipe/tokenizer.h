/* Tokenizers of two kinds behind one interface: SentencePiece BPE as in
 * llama2.c (tokenizer.bin, or a GGUF vocabulary with tokenizer.ggml.model
 * "llama") and byte-level BPE (GGUF "gpt2": Llama 3, Qwen 2, GPT-2, ...;
 * see bpe.h).
 *
 * Owns the vocabulary: pieces, scores, token types and, per id, the bytes the
 * token contributes to generated text. Special tokens follow the token types
 * as llama.cpp does: user-defined tokens are always matched whole in text,
 * control and unknown tokens only when the caller asks (TP_ENCODE_SPECIAL).
 * Read-only after load, so one tokenizer may be shared by any number of jobs
 * and threads. */
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

/* A vocabulary in memory, as a GGUF file describes it (the fields of
 * tokenizer.ggml.*). Everything is copied by tp_tokenizer_new. */
typedef struct tp_vocab_spec {
    int kind;                  /* TP_TOKENIZER_SPM or TP_TOKENIZER_BPE */
    int n;
    const char *const *pieces; /* n pieces as spelt in the file */
    const size_t *lens;
    const float *scores;       /* NULL: all 0 */
    const int32_t *types;      /* NULL: SPM infers (as for llama2.c), BPE all normal */
    const char *const *merges; /* BPE: merge lines "a b", rank = index */
    const size_t *merge_lens;
    size_t n_merges;
    const char *pre;           /* BPE: tokenizer.ggml.pre; NULL = "default" */
    size_t pre_len;
    int bos_id, eos_id, unk_id, eot_id, eom_id; /* -1: none */
    int add_bos, add_eos;      /* -1: the kind's default (SPM: BOS; BPE: as pre says) */
    int add_space_prefix;      /* SPM: -1 default (yes) */
    bool rstrip_specials;      /* Phi-3: text after a special token (but <unk>, <s>,
                                  <|endoftext|>) loses its leading whitespace */
} tp_vocab_spec;

enum { TP_TOKENIZER_SPM = 1, TP_TOKENIZER_BPE = 2 };

/* Build a tokenizer of either kind. Errors name the field. */
int tp_tokenizer_new(const tp_vocab_spec *spec, tp_tokenizer **out, tp_err *err);

/* Open a tokenizer from a file: a GGUF file with an embedded vocabulary
 * (tokenizer.ggml.*, with or without tensors; chosen by the "GGUF" magic)
 * or a llama2.c tokenizer.bin (vocab_size as for tp_tokenizer_load; a GGUF
 * vocabulary of another size is refused when vocab_size > 0). Errors name
 * the path. */
int tp_tokenizer_open(const char *path, int vocab_size, tp_tokenizer **out, tp_err *err);

/* From a GGUF image in memory (borrowed only during the call). */
int tp_tokenizer_from_gguf_mem(const void *data, size_t size, tp_tokenizer **out, tp_err *err);

/* From a parsed GGUF file's tokenizer.ggml.* metadata: model "llama"
 * (SentencePiece) or "gpt2" (byte-level BPE, needs merges; pre names the
 * pre-tokenizer, absent = "default"); any other model is refused by name.
 * Reads tokens, scores, token_type, merges, pre, the bos/eos/unknown/eot/eom
 * ids, add_bos_token, add_eos_token and add_space_prefix. */
struct tp_gguf;
int tp_tokenizer_from_gguf(const struct tp_gguf *g, tp_tokenizer **out, tp_err *err);

void tp_tokenizer_free(tp_tokenizer *tok);

/* TP_TOKENIZER_SPM or TP_TOKENIZER_BPE. */
int tp_tokenizer_kind(const tp_tokenizer *tok);

/* Whether the vocabulary asks for BOS before / EOS after a prompt
 * (tokenizer.ggml.add_bos_token / add_eos_token, else the kind's default). */
bool tp_tokenizer_add_bos(const tp_tokenizer *tok);
bool tp_tokenizer_add_eos(const tp_tokenizer *tok);

/* The ids that end generation (llama.cpp's end-of-generation set): eos,
 * eot, eom and the tokens whose text marks an end of turn (<|eot_id|>,
 * <|im_end|>, <|end|>, <end_of_turn>, <|endoftext|>, <|eom_id|>, <EOT>).
 * Returns the count; *ids is borrowed (valid while tok lives). */
int tp_tokenizer_eog_ids(const tp_tokenizer *tok, const int32_t **ids);

/* ids (n of them, e.g. a model's own end ids) followed by the tokenizer's
 * end-of-generation ids not among them, written to out (cap entries);
 * returns the count (at most cap). tok may be NULL (just ids). */
int tp_tokenizer_merge_eog(const tp_tokenizer *tok, const int *ids, int n, int *out, int cap);

/* The control or unknown token whose text is text[0..len) (whitespace
 * around the vocabulary piece ignored: llama2.c spells BOS "\n<s>\n"), or
 * -1. Looks only at the special tokens, not the whole vocabulary. */
int tp_tokenizer_control_id(const tp_tokenizer *tok, const char *text, size_t len);

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
 * <0xNN> gives that one raw byte; control, unknown and unused tokens give no
 * bytes (as llama.cpp renders them by default); a byte-level BPE piece gives
 * the raw bytes its GPT-2 alphabet spells; a user-defined token gives its
 * text; any other piece gives its text. SentencePiece only: if prev_id is
 * BOS the leading space is dropped (as in llama2.c decode). Borrowed; valid
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

/* Flags for tp_tokenizer_encode_ex. */
enum {
    TP_ENCODE_BOS = 1u << 0,     /* start with BOS */
    TP_ENCODE_EOS = 1u << 1,     /* end with EOS */
    TP_ENCODE_SPECIAL = 1u << 2, /* control/unknown token texts become those tokens */
    /* BOS/EOS exactly when the vocabulary asks for them (tp_tokenizer_add_bos/eos) */
    TP_ENCODE_ADD_SPECIAL = 1u << 3,
};

/* Encode as tp_tokenizer_encode does, with special-token handling: the text
 * is first cut at user-defined tokens (always) and control/unknown tokens
 * (with TP_ENCODE_SPECIAL), longest token text first, leftmost; the pieces
 * between are encoded by the vocabulary's kind (SentencePiece: each piece
 * after a special token gets the dummy-prefix space, as llama.cpp does).
 * Byte-level BPE needs valid UTF-8 (TP_EINVAL naming the byte offset).
 * tp_tokenizer_max_ids(len) ids always suffice. */
int tp_tokenizer_encode_ex(const tp_tokenizer *tok, const char *text, size_t len, unsigned flags,
                           int *out, size_t cap, size_t *n_out, tp_err *err);

/* An upper bound on the ids encoding len bytes can give. */
size_t tp_tokenizer_max_ids(size_t len);

#endif
