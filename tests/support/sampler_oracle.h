/* The sampler before vectorization, as an oracle for exact-equality tests
 * (tests/test_sampler_exact.c). Same contracts as tp_sampler_new / _sample /
 * _accept / _free in tokpipe/sampler.h; params must already be valid. */
#ifndef TOKPIPE_TESTS_SAMPLER_ORACLE_H
#define TOKPIPE_TESTS_SAMPLER_ORACLE_H

#include <stddef.h>
#include <stdint.h>

#include "tokpipe/error.h"
#include "tokpipe/sampler.h"

typedef struct oracle_sampler oracle_sampler;

int oracle_sampler_new(const tp_sampler_params *p, int vocab_size, const int32_t *prompt_ids,
                       size_t n_prompt, oracle_sampler **out, tp_err *err);
void oracle_sampler_free(oracle_sampler *s);
int oracle_sampler_sample(oracle_sampler *s, const float *logits, int32_t *token_out, tp_err *err);
int oracle_sampler_accept(oracle_sampler *s, int32_t token, tp_err *err);

#endif
