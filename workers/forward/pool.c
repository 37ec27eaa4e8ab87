/* Passive compute pool: one futex word per helper to post a job, one shared
 * countdown the caller sleeps on. No thread ever spins (see pool.h). */
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

/* Each helper's post word on its own cache line: posting to one helper
 * does not invalidate the line another helper is sleeping on. */
typedef struct helper_slot {
    alignas(64) _Atomic uint32_t seq;
    int index;
    tp_pool *pool;
    pthread_t thread;
    bool started;
} helper_slot;

struct tp_pool {
    int n;              /* threads counting the caller */
    helper_slot *slots; /* [n]; slot 0 (the caller) is unused */
    /* the job in flight, written before the posts (release) */
    tp_pool_fn fn;
    void *arg;
    int n_rows, align, parts;
    alignas(64) _Atomic uint32_t pending; /* helpers still working */
    _Atomic bool quit;
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

void tp_pool_range(int n_rows, int align, int parts, int i, int *r0, int *r1)
{
    long long units = ((long long)n_rows + align - 1) / align;
    long long u0 = units * i / parts, u1 = units * (i + 1) / parts;
    long long a = u0 * align, b = u1 * align;
    *r0 = (int)(a < n_rows ? a : n_rows);
    *r1 = (int)(b < n_rows ? b : n_rows);
}

int tp_pool_parts(const tp_pool *p, int n_rows, int align, int max_parts)
{
    if (n_rows <= 0)
        return 0;
    long long units = ((long long)n_rows + align - 1) / align;
    long long parts = p->n;
    if (max_parts < parts)
        parts = max_parts;
    if (units < parts)
        parts = units;
    return parts < 1 ? 1 : (int)parts;
}

static void run_part(tp_pool *p, int i)
{
    int r0, r1;
    tp_pool_range(p->n_rows, p->align, p->parts, i, &r0, &r1);
    if (r0 < r1)
        p->fn(p->arg, r0, r1, i);
}

static void *helper_main(void *arg)
{
    helper_slot *s = arg;
    tp_pool *p = s->pool;
    uint32_t seen = 0;
    for (;;) {
        uint32_t now;
        while ((now = atomic_load_explicit(&s->seq, memory_order_acquire)) == seen)
            futex_wait(&s->seq, seen);
        seen = now;
        if (atomic_load_explicit(&p->quit, memory_order_acquire))
            break;
        run_part(p, s->index);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1)
            futex_wake(&p->pending, 1);
    }
    return NULL;
}

static void post(helper_slot *s)
{
    atomic_fetch_add_explicit(&s->seq, 1, memory_order_release);
    futex_wake(&s->seq, 1);
}

void tp_pool_free(tp_pool *p)
{
    if (!p)
        return;
    atomic_store_explicit(&p->quit, true, memory_order_release);
    for (int i = 1; i < p->n; i++)
        if (p->slots[i].started) {
            post(&p->slots[i]);
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
    tp_pool *p = calloc(1, sizeof *p);
    helper_slot *slots = p ? aligned_alloc(64, sizeof *slots * (size_t)n_threads) : NULL;
    if (!slots) {
        free(p);
        return tp_err_set(err, TP_ENOMEM, "forward: out of memory for %d compute threads", n_threads);
    }
    p->n = n_threads;
    p->slots = slots;
    for (int i = 0; i < n_threads; i++) {
        atomic_init(&slots[i].seq, 0);
        slots[i].index = i;
        slots[i].pool = p;
        slots[i].started = false;
    }
    atomic_init(&p->pending, 0);
    atomic_init(&p->quit, false);
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

void tp_pool_run(tp_pool *p, int n_rows, int align, int max_parts, tp_pool_fn fn, void *arg)
{
    if (n_rows <= 0)
        return;
    if (align < 1)
        align = 1;
    int parts = tp_pool_parts(p, n_rows, align, max_parts);
    if (parts == 1) {
        fn(arg, 0, n_rows, 0);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    p->n_rows = n_rows;
    p->align = align;
    p->parts = parts;
    atomic_store_explicit(&p->pending, (uint32_t)(parts - 1), memory_order_relaxed);
    for (int i = 1; i < parts; i++)
        post(&p->slots[i]);
    run_part(p, 0);
    uint32_t left;
    while ((left = atomic_load_explicit(&p->pending, memory_order_acquire)) != 0)
        futex_wait(&p->pending, left);
}
