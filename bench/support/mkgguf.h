/* The random-weight GGUF files the architecture benches measure, written
 * by the tokpipe program under test ($BIN/tokpipe mkmodel, quantize). */
#ifndef BENCH_SUPPORT_MKGGUF_H
#define BENCH_SUPPORT_MKGGUF_H

/* out: an F32 GGUF of arch and shape with vocab's vocabulary, mkmodel's
 * flags and more (e.g. "--seed 1 --separate-output"). Exits the bench with
 * the command on failure. */
void bench_mkgguf(const char *bin, const char *arch, const char *vocab, const char *shape, const char *flags,
                  const char *more, const char *out);

/* out: src converted to type by `tokpipe quantize`; exits on failure. */
void bench_quantize(const char *bin, const char *src, const char *type, const char *out);

#endif
