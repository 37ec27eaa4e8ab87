/* One sequence's batch-1 decode rate over a forward pass: the workload
 * bench_quant and bench_threads both time. */
#ifndef BENCH_SUPPORT_DECODE_H
#define BENCH_SUPPORT_DECODE_H

#include "tokpipe/forward.h"

/* A spread of ids in [3, vocab): the benches' tokens (3 keeps clear of the
 * usual control ids). */
int bench_tok_of(int i, int vocab);

/* Tokens per second, by clock, of one new sequence decoding n tokens after
 * a prompt_len prefill (the prefill is not timed); negative with err set on
 * failure. */
double bench_decode_rate(tp_forward *f, int vocab, int prompt_len, int n, double (*clock)(void), tp_err *err);

/* Tokens per second, by clock, of one new sequence's prompt_len-token
 * prompt taken in one step (the logits of its last token); negative with
 * err set on failure. */
double bench_prefill_rate(tp_forward *f, int vocab, int prompt_len, double (*clock)(void), tp_err *err);

/* Tokens per second, by clock, of seqs new sequences decoding together:
 * their prompt_len-token prompts in one step (not timed), then n steps of
 * one token each for every sequence (seqs * n tokens). Negative with err
 * set on failure. The forward needs seqs KV slots. */
double bench_batched_rate(tp_forward *f, int vocab, int seqs, int prompt_len, int n, double (*clock)(void), tp_err *err);

#endif
