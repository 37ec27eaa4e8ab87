/* Test oracle: the Llama 3, Qwen 2 and DeepSeek V3 pre-tokenizer regexes, as published
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

/* The same for DeepSeek V3's tokenizer.json: three Isolated splits, each
 * cutting the pieces the one before left (matches and the gaps between
 * them each become a piece):
 *   1. \p{N}{1,3}
 *   2. [U+4E00-U+9FA5 U+3040-U+309F U+30A0-U+30FF]+
 *   3. [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+
 *      | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ | ?[\p{P}\p{S}]+[\r\n]*
 *      | \s*[\r\n]+ | \s+(?!\S) | \s+ */
size_t pretok_oracle_split_deepseek_v3(const char *text, size_t len, size_t *ends);

#endif
