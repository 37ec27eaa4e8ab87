/* Test oracle: the Llama 3 and Qwen 2 pre-tokenizer regexes, as published
 * in their tokenizer.json, evaluated by hand over code points with
 * utf8proc's Unicode categories (no regex engine), to check the PCRE2 rules
 * of workers/tokenize/bpe.c through an independent path. */
#ifndef TP_TEST_PRETOK_ORACLE_H
#define TP_TEST_PRETOK_ORACLE_H

#include <stdbool.h>
#include <stddef.h>

/* Split len bytes of valid UTF-8 into words: writes the byte end offset of
 * each word to ends (room for len entries) and returns the count. digits3:
 * Llama 3's \p{N}{1,3}; else Qwen 2's \p{N}. */
size_t pretok_oracle_split(const char *text, size_t len, bool digits3, size_t *ends);

#endif
