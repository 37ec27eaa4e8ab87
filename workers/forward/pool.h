/* Private to the forward stage (and its tests): a small pool of compute
 * threads that sleep between steps and spin, briefly, only inside one.
 *
 * Why not a spinning pool: on this kind of shared VM one (libgomp's default
 * wait policy, OpenBLAS's pthread spin) fell about 700x when the two vCPUs
 * were time-sliced on one core (research/limits.md 0.1). An idle helper
 * here sleeps in futex(FUTEX_WAIT) and burns no CPU; a job wakes only the
 * helpers it needs; the caller does the first part itself and waits until
 * the others are done. A wake-up costs microseconds (tens on a loaded
 * host), so inside a step (tp_pool_hold) waits spin for a bounded time
 * first, and callers give small jobs fewer parts (max_parts).
 *
 * Work is claimed, not dealt: the rows of a job are taken in chunks from
 * one atomic counter by the caller and the helpers it woke (long runs
 * first, shorter ones towards the end: pool.c work), and a helper
 * that has not woken up by the time the caller runs out of rows is called
 * off instead of waited for. On a shared host, where a helper's vCPU may be
 * busy with someone else's process, a job then degrades to about the
 * caller's own speed instead of waiting for the slowest thread.
 *
 * The contract for work (what every kernel that runs on the pool follows):
 * a job is N "rows" (output rows of a matmul, or any independent units, e.g.
 * (token, head) pairs of attention) cut into ranges [r0, r1) whose starts
 * are multiples of align (the last range ends at N). fn(arg, r0, r1, worker)
 * must compute exactly the outputs of rows [r0, r1) and nothing else, and
 * those outputs must not depend on r0, r1 or worker (only on the row): then
 * the bits are the same for any thread count and any timing, which is how
 * the forward keeps batch invariance on N threads. fn may be called several
 * times per job on each thread, concurrently on different threads; worker
 * (0 = the calling thread, up to tp_pool_threads - 1) is unique among the
 * threads running at once and indexes per-thread scratch.
 *
 * One caller at a time: a tp_pool is not thread-safe (the forward that owns
 * it is not either). Helper threads block every signal, so a process that
 * handles signals on a signalfd keeps receiving them. */
#ifndef TOKPIPE_FORWARD_POOL_H
#define TOKPIPE_FORWARD_POOL_H

#include "tokpipe/error.h"

#include <stdbool.h>

typedef struct tp_pool tp_pool;

typedef void (*tp_pool_fn)(void *arg, int r0, int r1, int worker);

/* A pool of n_threads compute threads counting the caller (n_threads - 1
 * helpers are started; 1 starts none). TP_EINVAL below 1 (upper bounds
 * are the caller's), TP_ENOMEM if a thread cannot be started.
 * *out is owned by the caller (tp_pool_free). */
int tp_pool_new(int n_threads, tp_pool **out, tp_err *err);

/* Stop and join the helpers; accepts NULL. */
void tp_pool_free(tp_pool *p);

int tp_pool_threads(const tp_pool *p);

/* Run fn over rows [0, n_rows) with up to max_threads threads (the caller
 * and max_threads - 1 helpers; fewer when there are fewer align-sized
 * units) and return when every row is done. n_rows <= 0 does nothing;
 * align >= 1. */
void tp_pool_run(tp_pool *p, int n_rows, int align, int max_threads, tp_pool_fn fn, void *arg);

/* Inside a step (on) a thread waiting for the next job or for the
 * helpers spins for a bounded time (pool.c SPIN_NS) before it sleeps, which
 * saves a futex wake-up per job when jobs come close together; off
 * (the default, and between steps) every wait sleeps at once, and helpers
 * spinning go to sleep. */
void tp_pool_hold(tp_pool *p, bool on);

/* Jobs run on more than one thread so far: the step's synchronisation
 * points (for tests and benchmarks). */
unsigned long long tp_pool_jobs(const tp_pool *p);

/* The threads tp_pool_run may use for such a job (for tests). */
int tp_pool_job_threads(const tp_pool *p, int n_rows, int align, int max_threads);

#endif
