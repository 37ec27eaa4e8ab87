/* Compute pool (see pool.h): per helper one futex word saying whether it
 * is posted to the current job, one atomic counter the job's rows are
 * claimed from, and one countdown of running helpers the caller waits on.
 * Between steps every wait is a futex sleep; inside a step (tp_pool_hold)
 * a wait first spins for at most SPIN_NS. */
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
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* How long a wait inside a step spins before it sleeps. A futex wake-up
 * costs a few microseconds on an idle host and tens in a VM; the gap
 * between two matmuls of a decode step (norms, RoPE, attention on the
 * caller) is mostly shorter. Bounded so that a helper whose vCPU is
 * time-sliced against the caller's (research/limits.md 0.1) gives it back
 * soon. */
#define SPIN_NS 50000
/* The bit of `pending` saying the caller sleeps on it (finish wakes it
 * only then: no syscall when the caller is still spinning). */
#define CALLER_SLEEPS 0x80000000u

/* A helper's state word. The caller moves IDLE or SLEEPING -> POSTED (and
 * may take a post back, POSTED -> IDLE, if the helper has not started),
 * waking the helper only if it was SLEEPING; the helper moves IDLE ->
 * SLEEPING before it sleeps in futex_wait, POSTED -> RUNNING when it
 * starts, and RUNNING -> IDLE when it is done with the job's memory. */
enum { IDLE = 0, POSTED = 1, RUNNING = 2, QUIT = 3, SLEEPING = 4 };

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
    int n_rows, align, units, chunk, threads;
    unsigned long long jobs; /* jobs run on more than one thread */
    alignas(64) _Atomic uint32_t next;    /* next unclaimed unit */
    alignas(64) _Atomic uint32_t pending; /* helpers running or posted, | CALLER_SLEEPS */
    alignas(64) _Atomic uint32_t hold;    /* inside a step: waits spin first */
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

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Spin while *word == val, the pool holds and SPIN_NS have not passed.
 * Returns the last value read. */
static uint32_t spin_while(const tp_pool *p, _Atomic uint32_t *word, uint32_t val)
{
    uint32_t v = atomic_load_explicit(word, memory_order_acquire);
    if (v != val || !atomic_load_explicit(&p->hold, memory_order_relaxed))
        return v;
    long long t0 = now_ns();
    for (unsigned i = 1;; i++) {
        CPU_RELAX();
        v = atomic_load_explicit(word, memory_order_acquire);
        if (v != val)
            return v;
        if (!(i & 63) && (!atomic_load_explicit(&p->hold, memory_order_relaxed) || now_ns() - t0 > SPIN_NS))
            return v;
    }
}

/* Claim and compute chunks until the job's units run out. A claim takes
 * half a thread's share of what is left, at least p->chunk units ("guided"
 * scheduling): each thread starts on one long contiguous run of the
 * weights (the hardware prefetcher ramps up once per run, and a decode
 * step streams every weight once), and the runs shrink towards the end so
 * that a late thread still leaves little to wait for. */
static void work(tp_pool *p, int worker)
{
    uint32_t u0 = atomic_load_explicit(&p->next, memory_order_relaxed);
    for (;;) {
        if (u0 >= (uint32_t)p->units)
            return;
        uint32_t n = ((uint32_t)p->units - u0) / (2u * (uint32_t)p->threads);
        if (n < (uint32_t)p->chunk)
            n = (uint32_t)p->chunk;
        if (!atomic_compare_exchange_weak_explicit(&p->next, &u0, u0 + n, memory_order_relaxed,
                                                   memory_order_relaxed))
            continue; /* u0 is the new value */
        long long r0 = (long long)u0 * p->align, r1 = r0 + (long long)n * p->align;
        p->fn(p->arg, (int)r0, (int)(r1 < p->n_rows ? r1 : p->n_rows), worker);
        u0 = atomic_load_explicit(&p->next, memory_order_relaxed);
    }
}

static void finish(tp_pool *p)
{
    if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == (CALLER_SLEEPS | 1))
        futex_wake(&p->pending, 1);
}

static void *helper_main(void *arg)
{
    helper_slot *s = arg;
    tp_pool *p = s->pool;
    for (;;) {
        uint32_t st = spin_while(p, &s->state, IDLE);
        while (st == IDLE || st == SLEEPING) {
            uint32_t want = IDLE;
            if (st == SLEEPING ||
                atomic_compare_exchange_strong_explicit(&s->state, &want, SLEEPING, memory_order_acq_rel,
                                                        memory_order_acquire))
                futex_wait(&s->state, SLEEPING);
            st = atomic_load_explicit(&s->state, memory_order_acquire);
        }
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
    atomic_init(&p->hold, 0);
    p->jobs = 0;
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

void tp_pool_hold(tp_pool *p, bool on)
{
    /* Off: helpers spinning see it within 64 pauses and go to sleep. */
    atomic_store_explicit(&p->hold, on ? 1u : 0u, memory_order_relaxed);
}

unsigned long long tp_pool_jobs(const tp_pool *p) { return p->jobs; }

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
     * fields are ours to write. Claims shrink to about an eighth of a
     * thread's share (work). */
    p->fn = fn;
    p->arg = arg;
    p->n_rows = n_rows;
    p->align = align;
    p->units = (int)(((long long)n_rows + align - 1) / align);
    p->chunk = p->units / (threads * 8);
    if (p->chunk < 1)
        p->chunk = 1;
    p->threads = threads;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->pending, (uint32_t)(threads - 1), memory_order_relaxed);
    p->jobs++;
    for (int i = 1; i < threads; i++)
        if (atomic_exchange_explicit(&p->slots[i].state, POSTED, memory_order_acq_rel) == SLEEPING)
            futex_wake(&p->slots[i].state, 1);
    work(p, 0);
    /* Every row is claimed: a helper still asleep is not needed any more. */
    for (int i = 1; i < threads; i++) {
        uint32_t want = POSTED;
        if (atomic_compare_exchange_strong_explicit(&p->slots[i].state, &want, IDLE, memory_order_acq_rel,
                                                    memory_order_acquire))
            finish(p);
    }
    uint32_t left = atomic_load_explicit(&p->pending, memory_order_acquire);
    while (left & ~CALLER_SLEEPS) {
        left = spin_while(p, &p->pending, left);
        if (!(left & ~CALLER_SLEEPS))
            break;
        if (!(left & CALLER_SLEEPS)) {
            if (!atomic_compare_exchange_strong_explicit(&p->pending, &left, left | CALLER_SLEEPS,
                                                         memory_order_acq_rel, memory_order_acquire))
                continue; /* a helper finished meanwhile: left is the new count */
            left |= CALLER_SLEEPS;
        }
        futex_wait(&p->pending, left);
        left = atomic_load_explicit(&p->pending, memory_order_acquire);
    }
    /* Nobody touches pending now (every helper has finished): clear the bit. */
    atomic_store_explicit(&p->pending, 0, memory_order_relaxed);
}
