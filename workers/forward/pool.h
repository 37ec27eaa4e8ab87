/* Private to the forward stage (and its tests): a small pool of compute
 * threads that wait passively.
 *
 * Why passive: on this kind of shared VM a spinning pool (libgomp's default
 * wait policy, OpenBLAS's pthread spin) fell about 700x when the two vCPUs
 * were time-sliced on one core (research/limits.md 0.1). An idle helper
 * here sleeps in futex(FUTEX_WAIT) and burns no CPU; a job wakes only the
 * helpers it needs; the caller does the first part itself and sleeps on a
 * futex until the others are done. The price is a wake-up per job (a few
 * microseconds, more on a loaded host), which is why callers give small jobs
 * fewer parts (max_parts).
 *
 * The contract for work (what every kernel that runs on the pool follows):
 * a job is N "rows" (output rows of a matmul, or any independent units, e.g.
 * (token, head) pairs of attention) split into at most max_parts
 * contiguous ranges [r0, r1) whose starts are multiples of align (the last
 * range ends at N). fn(arg, r0, r1, part) must compute exactly the outputs
 * of rows [r0, r1) and nothing else, and those outputs must not depend on
 * r0 and r1 (only on the row): then the bits are the same for any thread
 * count, which is how the forward keeps batch invariance on N threads.
 * part (0 <= part < parts) is unique among the ranges of one job and
 * indexes per-thread scratch; part 0 always runs on the calling thread.
 *
 * One caller at a time: a tp_pool is not thread-safe (the forward that owns
 * it is not either). Helper threads block every signal, so a process that
 * handles signals on a signalfd keeps receiving them. */
#ifndef TOKPIPE_FORWARD_POOL_H
#define TOKPIPE_FORWARD_POOL_H

#include "tokpipe/error.h"

typedef struct tp_pool tp_pool;

typedef void (*tp_pool_fn)(void *arg, int r0, int r1, int part);

/* A pool of n_threads compute threads counting the caller (n_threads - 1
 * helpers are started; 1 starts none). TP_EINVAL outside 1..max_threads is
 * the caller's job to check; TP_ENOMEM if a thread cannot be started.
 * *out is owned by the caller (tp_pool_free). */
int tp_pool_new(int n_threads, tp_pool **out, tp_err *err);

/* Stop and join the helpers; accepts NULL. */
void tp_pool_free(tp_pool *p);

int tp_pool_threads(const tp_pool *p);

/* Run fn over rows [0, n_rows) in up to max_parts parts (at most the
 * pool's threads and the number of align-sized units) and return when
 * every part is done. n_rows <= 0 does nothing; align >= 1. */
void tp_pool_run(tp_pool *p, int n_rows, int align, int max_parts, tp_pool_fn fn, void *arg);

/* The parts tp_pool_run would use, and range i of them: for callers that
 * size per-part scratch, and for tests. */
int tp_pool_parts(const tp_pool *p, int n_rows, int align, int max_parts);
void tp_pool_range(int n_rows, int align, int parts, int i, int *r0, int *r1);

#endif
