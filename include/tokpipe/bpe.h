/* Byte-level BPE (GPT-2 style, GGUF tokenizer.ggml.model "gpt2"): the
 * pre-tokenizer that tokenizer.ggml.pre names, the GPT-2 byte-to-unicode
 * mapping and merges by rank, as llama.cpp applies them.
 *
 * tp_tokenizer (tokenizer.h) owns a tp_bpe for BPE vocabularies and handles
 * special tokens, BOS/EOS and decoding around it; this module is the part
 * that turns plain text (no special tokens) into ids. Both objects are
 * read-only after creation and may be shared by any number of threads. */
#ifndef TOKPIPE_BPE_H
#define TOKPIPE_BPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokpipe/error.h"

/* ---- pre-tokenizer ------------------------------------------------------
 * A named list of regular expressions (PCRE2, UTF + UCP). Each one splits
 * every piece the previous ones left into its matches and the gaps between
 * them (llama.cpp's unicode_regex_split), so no byte is ever dropped. */
typedef struct tp_pretok tp_pretok;

/* name is a tokenizer.ggml.pre value (len bytes): gpt-2, llama-bpe (llama3,
 * llama-v3), qwen2, deepseek-llm, deepseek-coder, deepseek-v3, falcon,
 * starcoder, default and the
 * aliases llama.cpp gives the same rules. Unknown names: TP_EFORMAT naming
 * the value. *ignore_merges (may be NULL) is set for the pre-tokenizers
 * whose words that are already tokens skip the merges (Llama 3). */
int tp_pretok_new(const char *name, size_t len, tp_pretok **out, bool *ignore_merges, tp_err *err);
void tp_pretok_free(tp_pretok *p);

/* The canonical name of the rule set (e.g. "llama3" for "llama-bpe"). */
const char *tp_pretok_name(const tp_pretok *p);

/* Split len bytes of valid UTF-8 into words. *ends gets a malloc'd array of
 * *n end offsets (word i is [ends[i-1], ends[i]), the first starts at 0;
 * caller frees). Invalid UTF-8: TP_EINVAL naming the byte offset. */
int tp_pretok_split(const tp_pretok *p, const char *text, size_t len, size_t **ends, size_t *n,
                    tp_err *err);

/* ---- byte-level BPE ---------------------------------------------------- */
typedef struct tp_bpe tp_bpe;

/* pieces[i] (lens[i] bytes) is token i in the byte-level spelling of the
 * file ("Ġthe"); merges[r] ("Ġ t", merge_lens[r] bytes) is the merge of rank
 * r. pre names the pre-tokenizer (see tp_pretok_new). Everything is copied.
 * A merge line without its separating space is TP_EFORMAT naming the rank. */
int tp_bpe_new(const char *const *pieces, const size_t *lens, int n, const char *const *merges,
               const size_t *merge_lens, size_t n_merges, const char *pre, size_t pre_len,
               tp_bpe **out, tp_err *err);
void tp_bpe_free(tp_bpe *b);

const tp_pretok *tp_bpe_pretok(const tp_bpe *b);

/* Append the ids of plain text (valid UTF-8, no special-token handling) to
 * out[*n_out..cap). A word's symbol that is no token is emitted as the
 * tokens of its single bytes when they exist (llama.cpp's rule). TP_ERANGE
 * when cap is too small (len ids always suffice). */
int tp_bpe_encode(const tp_bpe *b, const char *text, size_t len, int *out, size_t cap,
                  size_t *n_out, tp_err *err);

/* Map a piece spelt in the GPT-2 byte alphabet back to raw bytes: each code
 * point of the alphabet is one byte; any other character (the file's own
 * text) is copied as its UTF-8. dst needs len bytes. Returns the length. */
size_t tp_bpe_unmap(const char *piece, size_t len, uint8_t *dst);

#endif
