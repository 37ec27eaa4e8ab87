/* Seeded random numbers for the benchmarks (rand.h). */
#include "rand.h"

uint64_t bench_xorshift(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}

uint32_t bench_rand_below(uint64_t *state, uint32_t n)
{
    return (uint32_t)(bench_xorshift(state) >> 11) % n;
}

void bench_random_ids(uint64_t *state, int32_t *ids, int n)
{
    for (int k = 0; k < n; k++)
        ids[k] = 400 + (int32_t)(bench_xorshift(state) % 31000);
}
