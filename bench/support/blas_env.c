#include "blas_env.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void bench_blas_coretype(char **argv)
{
    if (getenv("OPENBLAS_CORETYPE") || !__builtin_cpu_supports("avx512f"))
        return;
    if (setenv("OPENBLAS_CORETYPE", "SkylakeX", 1)) {
        fprintf(stderr, "%s: cannot set OPENBLAS_CORETYPE: %s\n", argv[0], strerror(errno));
        return;
    }
    execv("/proc/self/exe", argv);
    fprintf(stderr, "%s: re-exec with OPENBLAS_CORETYPE=SkylakeX failed: %s\n", argv[0], strerror(errno));
}
