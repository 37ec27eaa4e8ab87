/* make bench: cost per candidate token of the stop stage for 1, 64, 1024
 * and 10 000 stop strings (8-32 bytes) over 4 096 tokens that never
 * complete a stop, against the seed's approach measured in the same run:
 * decode the last 64 tokens + the candidate (here: concatenate their bytes,
 * the cheapest decode there is) and test ends_with for every stop.
 *
 * That memcpy decode is a lower bound of the seed's cost; a second column
 * adds the UTF-8 check a decode to a string makes (Rust's String), closer
 * to what the seed really pays.
 *
 * Text and stops use the same alphabet (lowercase and space), so partial
 * matches are common and the automaton leaves its start state often. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokpipe/stop.h"
#include "tokpipe/utf8.h"
#include "support/rand.h"
#include "support/timing.h"

#define N_TOKENS 4096
#define WINDOW 64
#define MAX_PIECE 8
#define MAX_STOP 32

static uint64_t rng = 0x243F6A8885A308D3ull;

static uint32_t rnd(uint32_t n)
{
    return bench_rand_below(&rng, n);
}

static char rnd_char(void)
{
    uint32_t r = rnd(27);
    return r == 26 ? ' ' : (char)('a' + r);
}

struct piece {
    uint8_t b[MAX_PIECE];
    size_t n;
};

static struct piece tokens[N_TOKENS];

static void make_tokens(void)
{
    for (size_t i = 0; i < N_TOKENS; i++) {
        tokens[i].n = 1 + rnd(MAX_PIECE);
        for (size_t k = 0; k < tokens[i].n; k++) tokens[i].b[k] = (uint8_t)rnd_char();
    }
}

struct stops {
    char (*s)[MAX_STOP];
    const char **ptr;
    size_t *len;
    size_t n;
};

static void make_stops(struct stops *st, size_t n)
{
    st->s = malloc(n * sizeof *st->s);
    st->ptr = malloc(n * sizeof *st->ptr);
    st->len = malloc(n * sizeof *st->len);
    if (!st->s || !st->ptr || !st->len) {
        fprintf(stderr, "bench_stop: out of memory\n");
        exit(1);
    }
    st->n = n;
    for (size_t i = 0; i < n; i++) {
        st->len[i] = 8 + rnd(MAX_STOP - 8 + 1);
        for (size_t k = 0; k < st->len[i]; k++) st->s[i][k] = rnd_char();
        st->ptr[i] = st->s[i];
    }
}

static void free_stops(struct stops *st)
{
    free(st->s);
    free(st->ptr);
    free(st->len);
}

/* ---- tokpipe: one tp_stop per job, every token through tp_stop_feed ---- */

static size_t last_memory;

static double run_tokpipe(const struct stops *st, double *build_ms, size_t *published)
{
    tp_stop_config cfg = {.stop = st->ptr, .stop_len = st->len, .n_stop = st->n,
                          .max_tokens = TP_STOP_NO_LIMIT, .max_stop_strings = st->n};
    tp_stop *s;
    tp_err err;
    double t0 = bench_now();
    if (tp_stop_new(&cfg, &s, &err)) {
        fprintf(stderr, "bench_stop: %s\n", err.msg);
        exit(1);
    }
    *build_ms = (bench_now() - t0) * 1e3;
    tp_stop_step step;
    t0 = bench_now();
    for (size_t i = 0; i < N_TOKENS; i++) tp_stop_feed(s, 1000, tokens[i].b, tokens[i].n, &step);
    double dt = bench_now() - t0;
    if (tp_stop_finish_reason(s) != TP_FINISH_NONE) {
        fprintf(stderr, "bench_stop: a random stop matched; change the seed\n");
        exit(1);
    }
    tp_stop_text(s, published);
    last_memory = tp_stop_memory(s);
    tp_stop_free(s);
    return dt * 1e9 / N_TOKENS;
}

/* ---- the seed: re-decode a 64-token window + candidate, ends_with ---- */

static double run_seed(const struct stops *st, bool validate, size_t *hits)
{
    static uint8_t buf[(WINDOW + 1) * MAX_PIECE];
    *hits = 0;
    double t0 = bench_now();
    for (size_t i = 0; i < N_TOKENS; i++) {
        size_t first = i > WINDOW ? i - WINDOW : 0, n = 0;
        for (size_t k = first; k <= i; k++) {
            memcpy(buf + n, tokens[k].b, tokens[k].n);
            n += tokens[k].n;
        }
        if (validate && !tp_utf8_valid(buf, n, NULL)) (*hits)++;
        for (size_t j = 0; j < st->n; j++)
            if (st->len[j] <= n && !memcmp(buf + n - st->len[j], st->s[j], st->len[j])) (*hits)++;
    }
    return (bench_now() - t0) * 1e9 / N_TOKENS;
}

static double best_of(int reps, double (*fn)(const struct stops *, double *, size_t *),
                      const struct stops *st, double *build_ms, size_t *out)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double v = fn(st, build_ms, out);
        if (v < best) best = v;
    }
    return best;
}

static double seed_best(int reps, const struct stops *st, bool validate, size_t *hits)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double v = run_seed(st, validate, hits);
        if (v < best) best = v;
    }
    return best;
}

int main(void)
{
    static const size_t counts[] = {1, 64, 1024, 10000};
    make_tokens();
    printf("stop stage: ns per candidate token over %d non-matching tokens (best of runs)\n",
           N_TOKENS);
    printf("%8s %9s %13s %8s %13s %8s %9s %10s\n", "stops", "tokpipe", "seed memcpy", "ratio",
           "seed +utf8", "ratio", "build ms", "memory KB");
    for (size_t c = 0; c < sizeof counts / sizeof *counts; c++) {
        struct stops st;
        make_stops(&st, counts[c]);
        double build_ms;
        size_t published, hits;
        double ours = best_of(20, run_tokpipe, &st, &build_ms, &published);
        int reps = counts[c] >= 1024 ? 3 : 10;
        double seed = seed_best(reps, &st, false, &hits);
        double seed_u8 = seed_best(reps, &st, true, &hits);
        if (hits) fprintf(stderr, "bench_stop: the seed saw %zu matches\n", hits);
        printf("%8zu %9.1f %13.1f %7.1fx %13.1f %7.1fx %9.2f %10zu\n", counts[c], ours, seed,
               seed / ours, seed_u8, seed_u8 / ours, build_ms, last_memory / 1024);
        free_stops(&st);
    }
    return 0;
}
