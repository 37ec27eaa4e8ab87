/* Passive compute pool (see pool.h): per helper one futex word saying
 * whether it is posted to the current job, one atomic counter the job's
 * rows are claimed from, and one countdown of running helpers the caller
 * sleeps on. No thread ever spins. */
#include "pool.h"

#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

/* A helper's state word. The caller moves IDLE -> POSTED (and may take a
 * post back, POSTED -> IDLE, if the helper has not started); the helper
 * moves POSTED -> RUNNING when it wakes, and RUNNING -> IDLE when it is
 * done with the job's memory. */
enum { IDLE = 0, POSTED = 1, RUNNING = 2, QUIT = 3 };

/* Each helper's word on its own cache line: posting to one helper does not
 * disturb the line another helper sleeps on. */
typedef struct helper_slot {
    alignas(64) _Atomic uint32_t state;
    int index;
    tp_pool *pool;
    pthread_t thread;
    bool started;
} helper_slot;

struct tp_pool {
    int n;              /* threads counting the caller */
    helper_slot *slots; /* [n]; slot 0 (the caller) is unused */
    /* the job in flight: written while no helper is RUNNING, published by
     * the release of a post */
    tp_pool_fn fn;
    void *arg;
    int n_rows, align, units, chunk;
    alignas(64) _Atomic uint32_t next;    /* next unclaimed unit */
    alignas(64) _Atomic uint32_t pending; /* helpers running or posted */
};

static void futex_wait(_Atomic uint32_t *word, uint32_t val)
{
    /* Returns at once if *word != val, and on a wake or a signal; every
     * caller re-checks its condition in a loop. */
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *word, int n)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

/* Claim and compute chunks until the job's units run out. */
static void work(tp_pool *p, int worker)
{
    for (;;) {
        uint32_t u0 = atomic_fetch_add_explicit(&p->next, (uint32_t)p->chunk, memory_order_relaxed);
        if (u0 >= (uint32_t)p->units)
            return;
        long long r0 = (long long)u0 * p->align, r1 = r0 + (long long)p->chunk * p->align;
        p->fn(p->arg, (int)r0, (int)(r1 < p->n_rows ? r1 : p->n_rows), worker);
    }
}

static void finish(tp_pool *p)
{
    if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1)
        futex_wake(&p->pending, 1);
}

static void *helper_main(void *arg)
{
    helper_slot *s = arg;
    tp_pool *p = s->pool;
    for (;;) {
        uint32_t st;
        while ((st = atomic_load_explicit(&s->state, memory_order_acquire)) == IDLE)
            futex_wait(&s->state, IDLE);
        if (st == QUIT)
            return NULL;
        uint32_t want = POSTED;
        if (!atomic_compare_exchange_strong_explicit(&s->state, &want, RUNNING, memory_order_acq_rel,
                                                     memory_order_acquire))
            continue; /* the post was taken back */
        work(p, s->index);
        atomic_store_explicit(&s->state, IDLE, memory_order_release);
        finish(p);
    }
}

void tp_pool_free(tp_pool *p)
{
    if (!p)
        return;
    for (int i = 1; i < p->n; i++)
        if (p->slots[i].started) {
            atomic_store_explicit(&p->slots[i].state, QUIT, memory_order_release);
            futex_wake(&p->slots[i].state, 1);
            pthread_join(p->slots[i].thread, NULL);
        }
    free(p->slots);
    free(p);
}

int tp_pool_new(int n_threads, tp_pool **out, tp_err *err)
{
    *out = NULL;
    if (n_threads < 1)
        return tp_err_set(err, TP_EINVAL, "forward: %d compute threads (need at least 1)", n_threads);
    tp_pool *p = aligned_alloc(64, (sizeof *p + 63) / 64 * 64);
    helper_slot *slots = p ? aligned_alloc(64, sizeof *slots * (size_t)n_threads) : NULL;
    if (!slots) {
        free(p);
        return tp_err_set(err, TP_ENOMEM, "forward: out of memory for %d compute threads", n_threads);
    }
    p->n = n_threads;
    p->slots = slots;
    atomic_init(&p->next, 0);
    atomic_init(&p->pending, 0);
    for (int i = 0; i < n_threads; i++) {
        atomic_init(&slots[i].state, IDLE);
        slots[i].index = i;
        slots[i].pool = p;
        slots[i].started = false;
    }
    /* Helpers inherit the mask in force at pthread_create: block
     * everything so signals keep going to the thread that handles them. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = 0;
    for (int i = 1; i < n_threads && !rc; i++) {
        if (pthread_create(&slots[i].thread, NULL, helper_main, &slots[i]))
            rc = tp_err_set(err, TP_ENOMEM, "forward: cannot start compute thread %d of %d", i + 1, n_threads);
        else
            slots[i].started = true;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) {
        tp_pool_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

int tp_pool_threads(const tp_pool *p) { return p->n; }

int tp_pool_job_threads(const tp_pool *p, int n_rows, int align, int max_threads)
{
    if (n_rows <= 0)
        return 0;
    long long units = ((long long)n_rows + (align < 1 ? 1 : align) - 1) / (align < 1 ? 1 : align);
    long long t = p->n;
    if (max_threads < t)
        t = max_threads;
    if (units < t)
        t = units;
    return t < 1 ? 1 : (int)t;
}

void tp_pool_run(tp_pool *p, int n_rows, int align, int max_threads, tp_pool_fn fn, void *arg)
{
    if (n_rows <= 0)
        return;
    if (align < 1)
        align = 1;
    int threads = tp_pool_job_threads(p, n_rows, align, max_threads);
    if (threads == 1) {
        fn(arg, 0, n_rows, 0);
        return;
    }
    /* No helper is RUNNING here (the last job waited for them), so the job
     * fields are ours to write. Chunks of about an eighth of a thread's
     * share: few claims, and a late thread leaves little to wait for. */
    p->fn = fn;
    p->arg = arg;
    p->n_rows = n_rows;
    p->align = align;
    p->units = (int)(((long long)n_rows + align - 1) / align);
    p->chunk = p->units / (threads * 8);
    if (p->chunk < 1)
        p->chunk = 1;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->pending, (uint32_t)(threads - 1), memory_order_relaxed);
    for (int i = 1; i < threads; i++) {
        atomic_store_explicit(&p->slots[i].state, POSTED, memory_order_release);
        futex_wake(&p->slots[i].state, 1);
    }
    work(p, 0);
    /* Every row is claimed: a helper still asleep is not needed any more. */
    for (int i = 1; i < threads; i++) {
        uint32_t want = POSTED;
        if (atomic_compare_exchange_strong_explicit(&p->slots[i].state, &want, IDLE, memory_order_acq_rel,
                                                    memory_order_acquire))
            finish(p);
    }
    uint32_t left;
    while ((left = atomic_load_explicit(&p->pending, memory_order_acquire)) != 0)
        futex_wait(&p->pending, left);
}
