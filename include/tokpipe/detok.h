/* Incremental detokenizer for one job: per candidate token id, the bytes it
 * adds to the generated text, in context (SentencePiece leading-space rule
 * after BOS, byte-fallback <0xNN> -> one raw byte, control tokens -> none).
 *
 * It never re-decodes a window: the only context a token's bytes depend on
 * is the previous token id, so the state is that one id. Bytes, not text:
 * several byte-fallback tokens form one character, and UTF-8 assembly and
 * U+FFFD replacement happen in tp_stop. Typical loop:
 *
 *     b = tp_detok_bytes(d, cand, &n, err);
 *     tp_stop_feed(stop, cand, b, n, &step);
 *     if (step.accepted) tp_detok_accept(d, cand);
 */
#ifndef TOKPIPE_DETOK_H
#define TOKPIPE_DETOK_H

#include <stddef.h>
#include <stdint.h>

#include "tokpipe/error.h"
#include "tokpipe/tokenizer.h"

typedef struct tp_detok tp_detok;

/* tok is borrowed and must outlive the detokenizer. last_prompt_id is the
 * last token of the prompt (BOS for an empty prompt); it must be in the
 * vocabulary. On success *out is owned by the caller. */
int tp_detok_new(const tp_tokenizer *tok, int32_t last_prompt_id, tp_detok **out, tp_err *err);

void tp_detok_free(tp_detok *d);

/* The bytes candidate id would add after the accepted tokens so far. Does
 * not change the state. Returns NULL and sets err (TP_ERANGE) if id is
 * outside the vocabulary; a token with no text gives a non-NULL pointer
 * and *len = 0. Borrowed while the tokenizer lives. */
const uint8_t *tp_detok_bytes(const tp_detok *d, int32_t id, size_t *len, tp_err *err);

/* Record that id was accepted (it becomes the context of the next token).
 * TP_ERANGE if id is outside the vocabulary. */
int tp_detok_accept(tp_detok *d, int32_t id, tp_err *err);

/* If text (len bytes) names a token that renders as no text — a control
 * or unknown token such as "</s>", "<s>", "<unk>" — return its id, else -1.
 * Whitespace around the vocabulary piece is ignored (llama2.c spells BOS
 * "\n<s>\n"). As a stop string such a text could never match, since the
 * token adds no bytes (research note §B9): callers turn it into a stop id. */
int32_t tp_detok_control_id(const tp_tokenizer *tok, const char *text, size_t len);

/* The rule for a stop string naming a control token, shared by the stop
 * stage and `tokpipe stopcheck` so both give the same answer: control
 * tokens add no bytes to the text, so such a string also stops on the
 * token itself — its id becomes a stop id (finish stop_token, matched = the
 * id), and the string stays a text stop for the same characters spelt by
 * ordinary tokens. Writes the distinct ids of stop[0..n_stop) that name a
 * control or unknown token to ids (room for n_stop) and returns how many. */
size_t tp_detok_control_stops(const tp_tokenizer *tok, const char *const *stop, const size_t *stop_len,
                              size_t n_stop, int32_t *ids);

#endif
