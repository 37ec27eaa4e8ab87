#include "tokpipe/rand.h"

#include <sys/random.h>
#include <time.h>
#include <unistd.h>

uint64_t tp_random_u64(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, GRND_NONBLOCK) != (ssize_t)sizeof v) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        v = ((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^
            (uint64_t)(uintptr_t)&v;
    }
    return v ? v : 1;
}
