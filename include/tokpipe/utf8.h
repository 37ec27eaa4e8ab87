/* UTF-8 helpers for streaming text: well-formedness (Unicode 15, Table 3-7),
 * the unfinished tail to hold back, and U+FFFD replacement by the "maximal
 * subpart" rule (Unicode §3.9 U+FFFD substitution of maximal subparts; the
 * same result as Python's bytes.decode("utf-8", "replace")). */
#ifndef TOKPIPE_UTF8_H
#define TOKPIPE_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Worst-case growth of tp_utf8_replace: every byte becomes U+FFFD (3 bytes). */
#define TP_UTF8_REPLACE_MAX(n) ((n) * 3)

/* Length (1..4) of the well-formed sequence starting at b[0], or 0 if b
 * (n > 0 bytes available) does not start with one. *subpart is set to the
 * length of the maximal subpart to replace when 0 is returned (>= 1), or to
 * the number of bytes that are a valid but incomplete prefix when n ends
 * first (then the return is 0 and *incomplete is true). */
size_t tp_utf8_seq(const uint8_t *b, size_t n, size_t *subpart, bool *incomplete);

/* True if all n bytes are well-formed UTF-8. On false, *bad_at (if not
 * NULL) is the offset of the first byte that is not. */
bool tp_utf8_valid(const uint8_t *b, size_t n, size_t *bad_at);

/* Length (0..3) of the trailing bytes of b that are a valid but unfinished
 * sequence: text that may still become a character when more bytes come. */
size_t tp_utf8_unfinished_tail(const uint8_t *b, size_t n);

/* Decode n bytes, replacing each maximal subpart of an ill-formed sequence
 * with U+FFFD, into out (capacity >= TP_UTF8_REPLACE_MAX(n)). Returns the
 * bytes written. An unfinished sequence at the end counts as ill-formed. */
size_t tp_utf8_replace(const uint8_t *b, size_t n, char *out);

/* The code point of the well-formed sequence at b[0] (of n bytes) into
 * *cp; returns its length 1..4, or 0 (cp untouched) if b does not start
 * with a whole well-formed sequence (tp_utf8_seq's rules). */
size_t tp_utf8_get(const uint8_t *b, size_t n, uint32_t *cp);

/* Walking text known to be UTF-8 (checked where it came in) by its lead
 * bytes: a character's length 1..4 from its first byte (1 for a byte that
 * leads nothing, so a walk over anything ends); the characters of s[0, n);
 * the byte offset of character ci (n when past the end). */
size_t tp_utf8_char_len(uint8_t lead);
size_t tp_utf8_count(const char *s, size_t n);
size_t tp_utf8_offset(const char *s, size_t n, size_t ci);

/* Write code point cp (<= 0x10FFFF; the caller checks) as 1-4 UTF-8 bytes
 * to out; returns how many. */
size_t tp_utf8_put(uint32_t cp, char out[4]);

#endif
