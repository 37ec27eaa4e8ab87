/* The forward stage's compute pool: every row of a job computed exactly
 * once in aligned ranges, idle and waiting threads burning no CPU (the pool
 * may spin only inside a step, and only briefly: research/limits.md 0.1),
 * and signals left to the thread that handles them. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../workers/forward/pool.h"

static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts))
        ;
}

typedef struct cover {
    _Atomic int *hits;   /* per row */
    int align, n_rows, threads;
    _Atomic int bad;     /* a range that is empty, misaligned or has a bad worker */
    _Atomic int busy[8]; /* calls running per worker index */
} cover;

static void mark(void *arg, int r0, int r1, int worker)
{
    cover *c = arg;
    if (r0 >= r1 || r0 % c->align || (r1 != c->n_rows && r1 % c->align) || r1 > c->n_rows || worker < 0 ||
        worker >= c->threads)
        atomic_fetch_add(&c->bad, 1);
    else if (atomic_fetch_add(&c->busy[worker], 1) != 0) /* two threads with one worker index */
        atomic_fetch_add(&c->bad, 1);
    for (int r = r0; r < r1 && r < c->n_rows; r++)
        atomic_fetch_add(&c->hits[r], 1);
    if (worker >= 0 && worker < c->threads)
        atomic_fetch_sub(&c->busy[worker], 1);
}

static void every_row_is_computed_once_in_aligned_ranges(void **state)
{
    (void)state;
    tp_err e;
    for (int threads = 1; threads <= 5; threads++) {
        tp_pool *p;
        assert_int_equal(tp_pool_new(threads, &p, &e), 0);
        assert_int_equal(tp_pool_threads(p), threads);
        const int rows_list[] = {1, 3, 16, 63, 64, 65, 200, 1000, 4097};
        const int aligns[] = {1, 16, 64};
        for (size_t ri = 0; ri < sizeof rows_list / sizeof rows_list[0]; ri++)
            for (size_t ai = 0; ai < 3; ai++)
                for (int max_threads = 1; max_threads <= 6; max_threads++) {
                    int n = rows_list[ri];
                    cover c;
                    memset(&c, 0, sizeof c);
                    c.hits = calloc((size_t)n, sizeof *c.hits);
                    c.align = aligns[ai];
                    c.n_rows = n;
                    c.threads = threads;
                    tp_pool_run(p, n, c.align, max_threads, mark, &c);
                    int used = tp_pool_job_threads(p, n, c.align, max_threads);
                    int units = (n + c.align - 1) / c.align;
                    int want = threads < max_threads ? threads : max_threads;
                    if (units < want)
                        want = units;
                    if (used != want)
                        fail_msg("%d threads, %d rows, align %d, max %d: %d threads, want %d", threads, n,
                                 c.align, max_threads, used, want);
                    if (atomic_load(&c.bad))
                        fail_msg("%d threads, %d rows, align %d: a range was empty or misaligned, or two "
                                 "threads ran as one worker", threads, n, c.align);
                    for (int r = 0; r < n; r++)
                        if (atomic_load(&c.hits[r]) != 1)
                            fail_msg("%d threads, %d rows, align %d, max %d: row %d computed %d times",
                                     threads, n, c.align, max_threads, r, atomic_load(&c.hits[r]));
                    free(c.hits);
                }
        tp_pool_free(p);
    }
}

typedef struct who {
    pthread_t caller;
    _Atomic int zero_elsewhere, helper_on_caller, helper_calls;
} who;

static void record(void *arg, int r0, int r1, int worker)
{
    (void)r0;
    (void)r1;
    who *w = arg;
    bool on_caller = pthread_equal(pthread_self(), w->caller) != 0;
    if (worker == 0)
        atomic_fetch_add(&w->zero_elsewhere, !on_caller);
    else {
        atomic_fetch_add(&w->helper_calls, 1);
        atomic_fetch_add(&w->helper_on_caller, on_caller);
    }
    struct timespec ts = {0, 200000}; /* slow rows: the helpers get to claim some */
    nanosleep(&ts, NULL);
}

static void worker_zero_is_the_caller_and_helpers_share_the_rows(void **state)
{
    (void)state;
    tp_err e;
    tp_pool *p;
    assert_int_equal(tp_pool_new(4, &p, &e), 0);
    who w = {.caller = pthread_self()};
    for (int i = 0; i < 20; i++)
        tp_pool_run(p, 64, 1, 4, record, &w);
    assert_int_equal(atomic_load(&w.zero_elsewhere), 0);
    assert_int_equal(atomic_load(&w.helper_on_caller), 0);
    if (atomic_load(&w.helper_calls) == 0)
        fail_msg("20 jobs of 64 slow rows on 4 threads: the helpers computed none");
    tp_pool_free(p);
}

static void nothing(void *arg, int r0, int r1, int worker)
{
    (void)arg;
    (void)r0;
    (void)r1;
    (void)worker;
}

/* A spinning pool burns a core per idle helper: about 3 s of CPU here. */
static void an_idle_pool_uses_no_cpu(void **state)
{
    (void)state;
    tp_err e;
    tp_pool *p;
    assert_int_equal(tp_pool_new(4, &p, &e), 0);
    for (int i = 0; i < 1000; i++) /* helpers have just worked: a spin-then-sleep pool would spin now */
        tp_pool_run(p, 4, 1, 4, nothing, NULL);
    double c0 = cpu_seconds();
    sleep_ms(1000);
    double used = cpu_seconds() - c0;
    if (used > 0.05)
        fail_msg("an idle pool of 4 threads used %.3f s of CPU in 1 s", used);
    tp_pool_free(p);
}

/* Inside a step helpers spin between jobs, but only for a bounded time:
 * a step that stops calling (the caller busy elsewhere, or the process
 * between steps without turning the hold off) costs a few tens of
 * microseconds per helper, not a core. */
static void a_held_pool_without_jobs_stops_spinning(void **state)
{
    (void)state;
    tp_err e;
    tp_pool *p;
    assert_int_equal(tp_pool_new(4, &p, &e), 0);
    tp_pool_hold(p, true);
    for (int i = 0; i < 1000; i++)
        tp_pool_run(p, 4, 1, 4, nothing, NULL);
    double c0 = cpu_seconds();
    sleep_ms(1000);
    double used = cpu_seconds() - c0;
    tp_pool_hold(p, false);
    if (used > 0.05)
        fail_msg("a held pool of 4 threads with no job used %.3f s of CPU in 1 s", used);
    tp_pool_free(p);
}

/* Released after a step, helpers go to sleep at once. */
static void a_released_pool_uses_no_cpu(void **state)
{
    (void)state;
    tp_err e;
    tp_pool *p;
    assert_int_equal(tp_pool_new(4, &p, &e), 0);
    for (int step = 0; step < 100; step++) {
        tp_pool_hold(p, true);
        for (int i = 0; i < 20; i++)
            tp_pool_run(p, 4, 1, 4, nothing, NULL);
        tp_pool_hold(p, false);
    }
    double c0 = cpu_seconds();
    sleep_ms(1000);
    double used = cpu_seconds() - c0;
    if (used > 0.02)
        fail_msg("a released pool of 4 threads used %.3f s of CPU in 1 s", used);
    tp_pool_free(p);
}

/* Held or not, every job's rows are computed once, and each job run on
 * several threads counts as one synchronisation point. */
static void held_jobs_compute_every_row_and_are_counted(void **state)
{
    (void)state;
    tp_err e;
    tp_pool *p;
    assert_int_equal(tp_pool_new(3, &p, &e), 0);
    unsigned long long before = tp_pool_jobs(p);
    tp_pool_hold(p, true);
    for (int job = 0; job < 300; job++) {
        int n = 1 + (job * 37) % 300;
        cover c;
        memset(&c, 0, sizeof c);
        c.hits = calloc((size_t)n, sizeof *c.hits);
        c.align = 1;
        c.n_rows = n;
        c.threads = 3;
        tp_pool_run(p, n, 1, 3, mark, &c);
        assert_int_equal(atomic_load(&c.bad), 0);
        for (int r = 0; r < n; r++)
            if (atomic_load(&c.hits[r]) != 1)
                fail_msg("held job %d of %d rows: row %d computed %d times", job, n, r, atomic_load(&c.hits[r]));
        free(c.hits);
    }
    tp_pool_hold(p, false);
    tp_pool_run(p, 1, 1, 3, nothing, NULL); /* one row: the caller alone, no synchronisation */
    /* 300 jobs of which those with 1 row ran on the caller alone */
    unsigned long long single = 0;
    for (int job = 0; job < 300; job++)
        single += 1 + (job * 37) % 300 == 1;
    assert_int_equal(tp_pool_jobs(p) - before, 300 - single);
    tp_pool_free(p);
}

static void slow_part(void *arg, int r0, int r1, int worker)
{
    (void)arg;
    (void)r1;
    (void)worker;
    if (r0 == 3)
        sleep_ms(500);
}

/* The threads done early wait for the one on the slow row asleep (after
 * a bounded spin inside a step). */
static void waiting_for_a_slow_part_uses_no_cpu(void **state)
{
    (void)state;
    tp_err e;
    tp_pool *p;
    assert_int_equal(tp_pool_new(4, &p, &e), 0);
    for (int held = 0; held < 2; held++) { /* held: waits spin a bounded time first */
        tp_pool_hold(p, held);
        double c0 = cpu_seconds();
        tp_pool_run(p, 4, 1, 4, slow_part, NULL);
        double used = cpu_seconds() - c0;
        if (used > 0.05)
            fail_msg("waiting 0.5 s for one part used %.3f s of CPU (%s)", used, held ? "held" : "not held");
    }
    tp_pool_hold(p, false);
    tp_pool_free(p);
}

static _Atomic int on_main, elsewhere;
static pthread_t main_thread;

static void on_usr1(int sig)
{
    (void)sig;
    if (pthread_equal(pthread_self(), main_thread))
        atomic_fetch_add(&on_main, 1);
    else
        atomic_fetch_add(&elsewhere, 1);
}

static void helpers_never_take_the_process_signals(void **state)
{
    (void)state;
    tp_err e;
    tp_pool *p;
    main_thread = pthread_self();
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, &old);
    assert_int_equal(tp_pool_new(4, &p, &e), 0);
    for (int i = 0; i < 50; i++) {
        kill(getpid(), SIGUSR1);
        tp_pool_run(p, 4, 1, 4, nothing, NULL);
    }
    sleep_ms(10);
    tp_pool_free(p);
    sigaction(SIGUSR1, &old, NULL);
    assert_int_equal(atomic_load(&elsewhere), 0);
    assert_true(atomic_load(&on_main) >= 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_row_is_computed_once_in_aligned_ranges),
        cmocka_unit_test(worker_zero_is_the_caller_and_helpers_share_the_rows),
        cmocka_unit_test(an_idle_pool_uses_no_cpu),
        cmocka_unit_test(waiting_for_a_slow_part_uses_no_cpu),
        cmocka_unit_test(a_held_pool_without_jobs_stops_spinning),
        cmocka_unit_test(a_released_pool_uses_no_cpu),
        cmocka_unit_test(held_jobs_compute_every_row_and_are_counted),
        cmocka_unit_test(helpers_never_take_the_process_signals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
