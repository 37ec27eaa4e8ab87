/* What this machine's memory gives: the ceiling of a decode that reads
 * every weight once per token. */
#ifndef BENCH_SUPPORT_MEMBW_H
#define BENCH_SUPPORT_MEMBW_H

/* GB/s of threads threads each summing its share of a 512 MB buffer (best
 * of 3 passes, after one that faults the pages in); 0 if it cannot run. */
double bench_stream_gbps(int threads);

#endif
