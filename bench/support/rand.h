/* The benchmarks' seeded random numbers: xorshift64, so a workload is the
 * same on every run and every machine. */
#ifndef BENCH_SUPPORT_RAND_H
#define BENCH_SUPPORT_RAND_H

#include <stdint.h>

/* Advance *state (nonzero) and return it. */
uint64_t bench_xorshift(uint64_t *state);

/* A draw in [0, n), n >= 1. */
uint32_t bench_rand_below(uint64_t *state, uint32_t n);

/* ids[0..n) drawn from 400 .. 31399: ordinary tokens of a 32000-token
 * llama vocabulary, none of them special. */
void bench_random_ids(uint64_t *state, int32_t *ids, int n);

#endif
