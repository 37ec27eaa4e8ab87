/* Multi-pattern byte matcher for stop strings: one Aho-Corasick automaton
 * over bytes holding every pattern of a job.
 *
 * Feeding bytes costs O(bytes) amortized whatever the number of patterns:
 * the shallow states (where random text keeps the automaton) have dense
 * rows of full DFA transitions over byte classes, within a memory budget;
 * deeper states keep their few children and fall back along failure links. Each state
 * also carries what the stop stage asks per byte, precomputed once: the
 * longest pattern ending here (earliest end wins because the caller stops
 * at the first byte where one ends; ties at that byte go to the longest),
 * and the length of the longest suffix of the text that is a proper prefix
 * of some pattern (the bytes to hold back while streaming).
 *
 * Immutable after tp_stopmatch_new: one automaton may be shared by threads;
 * the per-text position is the caller's uint32_t state (start: 0). */
#ifndef TOKPIPE_STOPMATCH_H
#define TOKPIPE_STOPMATCH_H

#include <stddef.h>
#include <stdint.h>

#include "tokpipe/error.h"

#define TP_STOPMATCH_MAX_LEN 65535   /* bytes per pattern (16-bit depths) */
#define TP_STOPMATCH_NONE UINT32_MAX
#define TP_STOPMATCH_DENSE_BYTES (2u << 20)   /* default budget for dense rows */

typedef struct tp_stopmatch tp_stopmatch;

/* Build the automaton for n patterns (pat[i], len[i] bytes; n may be 0).
 * dense_bytes caps the memory of dense rows (0 = TP_STOPMATCH_DENSE_BYTES;
 * the start state always gets one).
 * Patterns must be non-empty and at most TP_STOPMATCH_MAX_LEN bytes
 * (TP_EINVAL naming "pattern[i]" otherwise). Equal patterns are merged;
 * distinct patterns are numbered in order of first appearance. The bytes are
 * copied. On success *out is owned by the caller. */
int tp_stopmatch_new(const char *const *pat, const size_t *len, size_t n, size_t dense_bytes,
                     tp_stopmatch **out, tp_err *err);

void tp_stopmatch_free(tp_stopmatch *m);

/* Distinct patterns, and the i-th (borrowed while m lives). */
size_t tp_stopmatch_count(const tp_stopmatch *m);
const char *tp_stopmatch_pattern(const tp_stopmatch *m, size_t i, size_t *len);

/* Index of the distinct pattern that input pattern i (as passed to new) was
 * merged into. */
uint32_t tp_stopmatch_merged_index(const tp_stopmatch *m, size_t i);

/* Feed b[0..n) starting from *state until a pattern ends. If one ends at
 * byte i, stops there: returns i + 1, *state is the state after byte i and
 * *pat the longest pattern ending at i. Otherwise returns n with *pat =
 * TP_STOPMATCH_NONE. Call again with the rest to go on past a match. */
size_t tp_stopmatch_find(const tp_stopmatch *m, uint32_t *state, const uint8_t *b, size_t n,
                         uint32_t *pat);

/* Length of the longest suffix of the text read into state that is a proper
 * prefix of some pattern (0 at the start state). */
size_t tp_stopmatch_partial(const tp_stopmatch *m, uint32_t state);

/* Number of states, and bytes of memory the automaton uses. */
size_t tp_stopmatch_states(const tp_stopmatch *m);
size_t tp_stopmatch_memory(const tp_stopmatch *m);

#endif
