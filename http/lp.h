/* Logprobs of one choice of an OpenAI response: the accepted tokens of a
 * job (ids, log-probabilities, alternatives, bytes) and which of them the
 * response's text carries so far. No sockets, no JSON: bridge.c feeds it
 * TOKEN/FINISH events, render.c reads the released entries.
 *
 * The rule (README, HTTP section): a token's entry goes out with the text
 * that carries the token's last byte. Text the stop stage holds back (a
 * possible stop-string prefix, an unfinished UTF-8 sequence) holds its
 * tokens' entries back too; a token whose bytes a stop string cuts (wholly
 * or partly) never gets an entry, nor does the stopping candidate (it is
 * never accepted). So the entries' bytes concatenate to the response text,
 * or, after a stop string, to a prefix of it that ends before the cut
 * token. Published text is the lossy UTF-8 decoding of the tokens' bytes
 * (U+FFFD by maximal subparts), which the walk below follows to map text
 * lengths back to token bytes. */
#ifndef TOKPIPE_HTTP_LP_H
#define TOKPIPE_HTTP_LP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokpipe/protocol.h"
#include "tokpipe/tokenizer.h"

#define GW_LP_UNKNOWN (-9999.0)   /* a logprob the sampler could not compute (OpenAI's "unknown") */

typedef struct gw_lp {
    uint32_t top_n;           /* alternatives per token */
    int32_t prev0;            /* the id before the first token (its bytes may depend on it), -1 none */
    size_t n, cap;            /* accepted tokens */
    int32_t *ids;
    float *lps;
    int32_t *top_ids;         /* n * top_n, -1 pads */
    float *top_lps;
    size_t *end;              /* end of token k's bytes in raw */
    size_t *off;              /* characters of text before token k's first byte (set once walked) */
    uint8_t *raw;             /* every accepted token's bytes */
    size_t raw_len, raw_cap;
    size_t text_len;          /* bytes of text published so far */
    size_t rw, ow, oc;        /* walk: raw bytes, text bytes, text characters covered */
    size_t n_off;             /* tokens whose off is set */
    size_t released;          /* tokens [0, released) have entries in the response */
} gw_lp;

/* An empty record for a job asking for top_n alternatives whose first
 * token follows prev0 (-1: not BOS, or unknown). */
void gw_lp_init(gw_lp *l, uint32_t top_n, int32_t prev0);
void gw_lp_free(gw_lp *l);

/* Append the accepted ids of one TOKEN event and their logprob columns
 * (lp->logprobs.data may be NULL: entries read GW_LP_UNKNOWN). tok gives
 * each id's bytes (an id outside the vocabulary has none). Returns 0, or
 * -1 out of memory. */
int gw_lp_add(gw_lp *l, const tp_tokenizer *tok, tp_raw ids, const tp_lp_cols *lp);

/* The response text grew by text_len bytes; release the tokens it now
 * carries wholly. final: the job finished (an unfinished UTF-8 tail was
 * published as U+FFFD); all: it finished without a stop string cut, so
 * every accepted token is in the text. Returns l->released. */
size_t gw_lp_release(gw_lp *l, size_t text_len, bool final, bool all);

/* The bytes token k (or alternative id alt after token k-1, alt >= 0)
 * contributes; borrowed from tok; *len 0 for none. */
const uint8_t *gw_lp_bytes(const gw_lp *l, const tp_tokenizer *tok, size_t k, int32_t alt, size_t *len);

#endif
