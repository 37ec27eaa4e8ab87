/* Benchmarks: make OpenBLAS use its AVX-512 kernels.
 *
 * OpenBLAS picks its kernels once, when the library loads, from
 * OPENBLAS_CORETYPE (or its own CPU detection, which chose the AVX2
 * Haswell kernels on this machine: research/limits.md section 2). A
 * benchmark linked against it has loaded it before main(), so setting the
 * variable needs a re-exec. */
#ifndef TOKPIPE_BENCH_BLAS_ENV_H
#define TOKPIPE_BENCH_BLAS_ENV_H

/* On a CPU with avx512f and OPENBLAS_CORETYPE unset: set it to SkylakeX and
 * re-exec this program with the same argv (returns only if exec fails,
 * after printing why to stderr). Otherwise returns at once. Call first
 * thing in main(). */
void bench_blas_coretype(char **argv);

#endif
