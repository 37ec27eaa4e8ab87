/* Clocks, order statistics and option lists shared by the benchmarks. */
#ifndef BENCH_SUPPORT_TIMING_H
#define BENCH_SUPPORT_TIMING_H

#include <stdbool.h>
#include <stddef.h>

/* CLOCK_MONOTONIC in seconds. */
double bench_now(void);

/* This thread's CPU time in seconds: on a shared machine, time spent
 * descheduled is not the code's under test. */
double bench_cpu_now(void);

/* qsort comparator for doubles, ascending. */
int bench_cmp_double(const void *a, const void *b);

/* The median of v[0..n) (sorts v); n >= 1. */
double bench_median(double *v, int n);

/* word is one of the comma-separated items of list. */
bool bench_list_has(const char *list, const char *word);

#endif
