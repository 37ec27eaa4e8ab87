/* A GGUF file's vocabulary (tokenizer.ggml.*), read in one place.
 *
 * The model loader keeps one per GGUF model (its end ids, its tokenizer);
 * vocabulary files (model.tokenizer, llama.cpp's ggml-vocab-*.gguf) are
 * read by the same code through tp_tokenizer_open. Pieces point into the
 * parsed file, which must outlive the vocabulary. */
#ifndef TOKPIPE_VOCAB_H
#define TOKPIPE_VOCAB_H

#include <stdbool.h>

#include "tokpipe/error.h"
#include "tokpipe/gguf.h"
#include "tokpipe/tokenizer.h"

typedef struct tp_gguf_vocab {
    tp_vocab_spec spec; /* kind 0: a tokenizer.ggml.model tokpipe cannot tokenize */
    char model[32];     /* tokenizer.ggml.model as the file spells it ("" if absent) */
    bool bos_given;     /* tokenizer.ggml.bos_token_id is in the file, not a default */
    /* owned */
    tp_gguf_str *toks, *merges;
    const char **pieces, **mpieces;
    size_t *lens, *mlens;
    float *scores;
    int32_t *types;
} tp_gguf_vocab;

/* tokenizer.ggml.tokens, scores, token_type, model, merges and pre (byte-level
 * BPE), the bos/eos/unknown/eot/eom ids (SentencePiece's defaults 1/2/0 when
 * absent) and add_bos/add_eos/add_space_prefix. TP_ENOTFOUND without
 * tokenizer.ggml.tokens; a wrong-shaped array or an id outside the
 * vocabulary is an error naming the key. Release with tp_gguf_vocab_release. */
int tp_gguf_vocab_read(const tp_gguf *g, tp_gguf_vocab *out, tp_err *err);
void tp_gguf_vocab_release(tp_gguf_vocab *v);

/* The tokenizer of a vocabulary read above (independent of it afterwards);
 * a tokenizer.ggml.model other than "llama" or "gpt2" is refused by name. */
int tp_gguf_vocab_tokenizer(const tp_gguf_vocab *v, tp_tokenizer **out, tp_err *err);

#endif
