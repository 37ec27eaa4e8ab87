#include "mkgguf.h"

#include <stdio.h>
#include <stdlib.h>

static void run(const char *cmd)
{
    if (system(cmd) != 0) {
        fprintf(stderr, "bench: failed: %s\n", cmd);
        exit(1);
    }
}

void bench_mkgguf(const char *bin, const char *arch, const char *vocab, const char *shape, const char *flags,
                  const char *more, const char *out)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s/tokpipe mkmodel --format gguf --arch %s --vocab-from %s --shape %s %s %s --quiet --out %s",
             bin, arch, vocab, shape, flags, more, out);
    run(cmd);
}

void bench_quantize(const char *bin, const char *src, const char *type, const char *out)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s/tokpipe quantize %s %s --type %s --quiet", bin, src, out, type);
    run(cmd);
}
