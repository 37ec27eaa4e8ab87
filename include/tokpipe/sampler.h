/* Per-job token sampler: penalties, greedy or temperature sampling with
 * top-k / top-p / min-p, and a per-job random stream.
 *
 * Order of operations on each call (the Hugging Face warper order):
 *   1. penalties over the last penalty_window tokens of prompt + accepted
 *      tokens: repetition (CTRL: a positive logit is divided by it, a
 *      negative one multiplied), then presence (subtract once if the token
 *      occurs) and frequency (subtract times its count), OpenAI style;
 *   2. logit_bias is added (OpenAI's logit_bias: a bias <= -100 bans the
 *      id outright, -inf); while fewer than min_tokens tokens were
 *      accepted, ban_ids get -inf; NaN logits are treated as -inf;
 *   3. temperature 0: argmax, the first maximum wins (llama2.c); the other
 *      sampling fields are ignored and no random number is used;
 *   4. otherwise softmax(logits / temperature), keep the top_k most likely,
 *      then (typical_p < 1) the locally typical set of Meister et al. 2022
 *      (tokens ordered by |-log p - entropy|, the smallest prefix whose
 *      mass is >= typical_p), then the smallest set whose mass is >= top_p
 *      of what is left (renormalized), then
 *      drop tokens below min_p times the most likely one's probability, and
 *      draw from what remains in proportion to probability.
 * Tokens are ranked by penalized logit, ties by lower id, so the kept set is
 * well defined. Cost per call: O(vocab) expected (top-k by a k-heap, top-p by
 * llama2.c's cut then quickselect; no full sort), one pass over the logits
 * for greedy and none copying them; exp runs only for tokens that can
 * survive top-k / min-p, else over the vocabulary with AVX-512 when the CPU
 * has it. Every path gives the same tokens as the plain scalar code
 * (tests/test_sampler_exact.c); `make bench` has the figures.
 *
 * Randomness is counter based: the draw for the n-th generated token is
 * SplitMix64 output n of the stream seeded by `seed`. A job's tokens thus
 * depend only on its prompt, parameters, seed and the logits — never on
 * other jobs or the batch — and a sampler rebuilt from the prompt and the
 * accepted tokens (tp_sampler_accept) continues exactly where the lost one
 * would have. */
#ifndef TOKPIPE_SAMPLER_H
#define TOKPIPE_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "tokpipe/error.h"
#include "tokpipe/limits.h" /* the penalty window's */

/* Defaults (tp_sampler_params_default). */
#define TP_SAMPLER_DEFAULT_TEMPERATURE 1.0f
#define TP_SAMPLER_MAX_BIAS 100.0f   /* logit_bias values lie in [-100, 100] */
#define TP_SAMPLER_BAN_BIAS -100.0f  /* this bias (or less) bans the id */
#define TP_SAMPLER_MAX_TOP_LOGPROBS 20 /* alternatives per token on the wire (OpenAI's cap) */

typedef struct tp_sampler_params {
    float temperature;        /* >= 0; 0 = greedy */
    int top_k;                /* >= 0; 0 = off */
    float top_p;              /* (0, 1]; 1 = off */
    float min_p;              /* [0, 1]; 0 = off */
    float repetition_penalty; /* > 0; 1 = off */
    float presence_penalty;   /* [-2, 2]; 0 = off */
    float frequency_penalty;  /* [-2, 2]; 0 = off */
    int penalty_window;       /* [0, TP_SAMPLER_MAX_PENALTY_WINDOW]; 0 = no penalties */
    uint64_t seed;
    int min_tokens;           /* >= 0: ban_ids are never picked before this many accepts */
    const int32_t *ban_ids;   /* e.g. EOS and stop ids; copied by tp_sampler_new */
    size_t n_ban;
    float typical_p;          /* (0, 1]; 1 = off */
    const int32_t *bias_ids;  /* logit_bias: distinct ids in [0, vocab); copied */
    const float *bias_values; /* [-100, 100] each, added to the logit */
    size_t n_bias;
} tp_sampler_params;

/* Which distribution tp_sampler_logprobs reports. */
typedef enum tp_logprobs_mode {
    TP_LOGPROBS_RAW = 0,       /* log_softmax of the model's logits as given (vLLM's default) */
    TP_LOGPROBS_PROCESSED = 1, /* after penalties, logit_bias, min_tokens bans and temperature
                                * (temperature 0 counts as 1); before top-k/top-p/min-p/typical */
} tp_logprobs_mode;

typedef struct tp_logprob {
    int32_t id;
    float logprob;             /* natural log; -inf for an impossible token */
} tp_logprob;

typedef struct tp_sampler tp_sampler;

/* temperature 1, top_k 0, top_p 1, min_p 0, typical_p 1, no penalties,
 * window 64, seed 0, min_tokens 0, no ban ids, no logit bias. */
tp_sampler_params tp_sampler_params_default(void);

/* 0 if every field is in range for a vocabulary of vocab_size tokens, else
 * TP_EINVAL/TP_ERANGE and a message naming the field and value, e.g.
 * "temperature must be >= 0, got -1". */
int tp_sampler_params_validate(const tp_sampler_params *p, int vocab_size, tp_err *err);

/* A sampler for one job. p is validated and copied (ban_ids too); the prompt
 * ids (each in [0, vocab_size)) seed the penalty history. All scratch memory
 * is allocated here, none per call. *out is owned by the caller. */
int tp_sampler_new(const tp_sampler_params *p, int vocab_size, const int32_t *prompt_ids,
                   size_t n_prompt, tp_sampler **out, tp_err *err);

void tp_sampler_free(tp_sampler *s);

/* Pick the next token from logits[vocab_size] (not modified). Does not
 * change the sampler: calling it again before tp_sampler_accept gives the
 * same token. TP_ERANGE if no token is possible (every logit -inf/NaN or
 * banned). Not thread-safe on one sampler; separate samplers are
 * independent. */
int tp_sampler_sample(tp_sampler *s, const float *logits, int32_t *token_out, tp_err *err);

/* Record that token was accepted (appended to the job's output): it enters
 * the penalty window and advances the random stream. TP_ERANGE if token is
 * outside the vocabulary. */
int tp_sampler_accept(tp_sampler *s, int32_t token, tp_err *err);

/* Number of tokens accepted so far (prompt not included). */
size_t tp_sampler_n_accepted(const tp_sampler *s);

/* The log-probability of token under the distribution `mode` of these
 * logits (the ones just given to tp_sampler_sample), and the n_top most
 * likely tokens (ranked by probability, ties by lower id) into top[0,
 * *n_out) — fewer than n_top only if fewer tokens are possible. n_top may
 * be anything up to the vocabulary (the wire caps it at
 * TP_SAMPLER_MAX_TOP_LOGPROBS; tests ask for all). Costs one argmax pass,
 * one exp pass over the vocabulary and, with n_top > 0, a k-heap pass; it
 * is never called for jobs that do not ask, so sampling alone pays nothing.
 * Does not change the sampler. TP_ERANGE when no token is possible. */
int tp_sampler_logprobs(tp_sampler *s, const float *logits, tp_logprobs_mode mode, int32_t token,
                        size_t n_top, float *token_logprob, tp_logprob *top, size_t *n_out, tp_err *err);

#endif
