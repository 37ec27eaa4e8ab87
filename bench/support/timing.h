/* Clock and order statistics shared by the benchmarks. */
#ifndef BENCH_SUPPORT_TIMING_H
#define BENCH_SUPPORT_TIMING_H

#include <stddef.h>

/* CLOCK_MONOTONIC in seconds. */
double bench_now(void);

/* qsort comparator for doubles, ascending. */
int bench_cmp_double(const void *a, const void *b);

/* The median of v[0..n) (sorts v); n >= 1. */
double bench_median(double *v, int n);

#endif
