/* Fresh randomness for identities and unseeded jobs (not for sampling:
 * a job's draws come from its own seeded stream, see sampler.h). */
#ifndef TOKPIPE_RAND_H
#define TOKPIPE_RAND_H

#include <stdint.h>

/* 64 bits from the kernel's CSPRNG (getrandom), or, if that fails, from
 * the clock, pid and an address; never 0, so 0 can mean "unset". */
uint64_t tp_random_u64(void);

#endif
