/* Finite automata over code points for the string keywords that must hold
 * together (jschema_int.h): a pattern or format (NFA from the regex tree,
 * then a DFA by subset construction), the intersection of two (the product
 * DFA), and the strings of a DFA within a length range written as GBNF.
 *
 * The length range is a counter beside the DFA state, written as one
 * right-linear rule per (state, count) pair that can still end inside the
 * range. The count is dropped (one rule per state) once it can no longer
 * matter: when every way to finish from the state ends inside the range.
 * So finite parts (an IPv4 literal, a time zone) cost their own states
 * only near the bound, and a loop (the local part of an e-mail) costs a
 * rule per state and count: that is what GBNF, which has no counters, needs.
 * Every transition set is disjoint from its siblings, so the rules are
 * unambiguous and the matcher follows one stack per string. */
#include "jschema_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INF SIZE_MAX

/* ---- NFA --------------------------------------------------------------- */

int jnfa_state(jnfa *a)
{
    return a->oom ? -1 : a->n++;
}

void jnfa_edge(jnfa *a, int from, int to, const cset *set)
{
    if (a->oom || from < 0 || to < 0) return;
    if (a->ne == a->ce) {
        int ce = a->ce ? a->ce * 2 : 64;
        void *e = realloc(a->e, (size_t)ce * sizeof *a->e);
        if (!e) {
            a->oom = true;
            return;
        }
        a->e = e;
        a->ce = ce;
    }
    jnfa_e *e = &a->e[a->ne++];
    memset(e, 0, sizeof *e);
    e->from = from;
    e->to = to;
    e->eps = !set;
    if (set) {
        jcs_add_set(&e->set, set);
        if (e->set.oom) a->oom = true;
    }
}

void jnfa_free(jnfa *a)
{
    for (int i = 0; i < a->ne; i++) jcs_free(&a->e[i].set);
    free(a->e);
    memset(a, 0, sizeof *a);
}

/* ---- an open-addressing table of ids, equality decided by the caller --- */

typedef struct imap {
    int *slot; /* id + 1; 0 empty */
    size_t cap, n;
} imap;

typedef bool (*imap_eq)(const void *ctx, int id, const void *key);
typedef uint64_t (*imap_hash)(const void *ctx, int id);

/* the slot holding key or the empty one where it goes; -1 out of memory */
static long imap_find(imap *m, uint64_t h, imap_eq eq, imap_hash hf, const void *ctx, const void *key)
{
    if ((m->n + 1) * 2 > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 256;
        int *s = calloc(cap, sizeof *s);
        if (!s) return -1;
        for (size_t i = 0; i < m->cap; i++)
            if (m->slot[i]) {
                size_t j = hf(ctx, m->slot[i] - 1) & (cap - 1);
                while (s[j]) j = (j + 1) & (cap - 1);
                s[j] = m->slot[i];
            }
        free(m->slot);
        m->slot = s;
        m->cap = cap;
    }
    size_t j = h & (m->cap - 1);
    while (m->slot[j] && !eq(ctx, m->slot[j] - 1, key)) j = (j + 1) & (m->cap - 1);
    return (long)j;
}

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    return h * 0xFF51AFD7ED558CCDull;
}

/* ---- DFA --------------------------------------------------------------- */

struct jdfa {
    int n;
    bool *acc;
    int *first;    /* transitions of state s: t[first[s] .. first[s+1]) */
    struct jdt {
        int to;
        cset set;
    } *t;
    int nt, ct;
    bool oom;
};

void jdfa_free(jdfa *d)
{
    if (!d) return;
    for (int i = 0; i < d->nt; i++) jcs_free(&d->t[i].set);
    free(d->t);
    free(d->acc);
    free(d->first);
    free(d);
}

/* append state n (its transitions come next) */
static int dfa_state(jdfa *d, bool acc)
{
    if ((d->n & (d->n - 1)) == 0 || !d->n) {
        size_t cap = d->n ? (size_t)d->n * 2 : 16;
        bool *a = realloc(d->acc, cap * sizeof *a);
        if (a) d->acc = a;
        int *f = realloc(d->first, (cap + 1) * sizeof *f);
        if (f) d->first = f;
        if (!a || !f) {
            d->oom = true;
            return -1;
        }
    }
    d->acc[d->n] = acc;
    d->first[d->n] = d->first[d->n + 1] = d->nt;
    return d->n++;
}

/* a transition of the last state added (the set is taken over) */
static void dfa_trans(jdfa *d, int to, cset *set)
{
    if (d->nt == d->ct) {
        int ct = d->ct ? d->ct * 2 : 64;
        void *t = realloc(d->t, (size_t)ct * sizeof *d->t);
        if (!t) {
            d->oom = true;
            jcs_free(set);
            return;
        }
        d->t = t;
        d->ct = ct;
    }
    d->t[d->nt].to = to;
    d->t[d->nt].set = *set;
    memset(set, 0, sizeof *set);
    d->nt++;
    d->first[d->n] = d->nt;
}

/* subsets of NFA states, each sorted, back to back in one pool */
typedef struct subsets {
    int *pool;
    size_t np, cp;
    size_t *at; /* start of subset i in pool; at[i+1] its end */
    int n, c;
} subsets;

typedef struct skey {
    const int *s;
    size_t len;
} skey;

static uint64_t sub_hash_of(const int *s, size_t len)
{
    uint64_t h = len;
    for (size_t i = 0; i < len; i++) h = mix(h, (uint64_t)s[i]);
    return h;
}

static uint64_t sub_hash(const void *ctx, int id)
{
    const subsets *ss = ctx;
    return sub_hash_of(ss->pool + ss->at[id], ss->at[id + 1] - ss->at[id]);
}

static bool sub_eq(const void *ctx, int id, const void *key)
{
    const subsets *ss = ctx;
    const skey *k = key;
    size_t len = ss->at[id + 1] - ss->at[id];
    return len == k->len && !memcmp(ss->pool + ss->at[id], k->s, len * sizeof *k->s);
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* the id of the subset buf[0..nb), added when new; -1 out of memory */
static int sub_intern(subsets *ss, imap *map, const int *buf, size_t nb)
{
    skey k = {buf, nb};
    long sl = imap_find(map, sub_hash_of(buf, nb), sub_eq, sub_hash, ss, &k);
    if (sl < 0) return -1;
    if (map->slot[sl]) return map->slot[sl] - 1;
    if (ss->n + 2 > ss->c) {
        int c = ss->c ? ss->c * 2 : 64;
        size_t *at = realloc(ss->at, (size_t)c * sizeof *at);
        if (!at) return -1;
        ss->at = at;
        ss->c = c;
    }
    if (ss->np + nb > ss->cp) {
        size_t c = ss->cp ? ss->cp * 2 : 1024;
        while (c < ss->np + nb) c *= 2;
        int *p = realloc(ss->pool, c * sizeof *p);
        if (!p) return -1;
        ss->pool = p;
        ss->cp = c;
    }
    memcpy(ss->pool + ss->np, buf, nb * sizeof *buf);
    ss->at[ss->n] = ss->np;
    ss->np += nb;
    ss->at[++ss->n] = ss->np;
    map->slot[sl] = ss->n;
    map->n++;
    return ss->n - 1;
}

typedef struct nfa_csr {
    int *off, *idx; /* edges leaving state s: idx[off[s] .. off[s+1]) */
} nfa_csr;

/* the epsilon closure of the states in *buf (count *n, room for a->n),
 * sorted; stamp marks the members (value mark) */
static void closure(const jnfa *a, const nfa_csr *g, int *buf, size_t *n, int *stamp, int mark, int *stack)
{
    size_t sp = 0;
    for (size_t i = 0; i < *n; i++) {
        stamp[buf[i]] = mark;
        stack[sp++] = buf[i];
    }
    while (sp) {
        int s = stack[--sp];
        for (int k = g->off[s]; k < g->off[s + 1]; k++) {
            const jnfa_e *e = &a->e[g->idx[k]];
            if (e->eps && stamp[e->to] != mark) {
                stamp[e->to] = mark;
                buf[(*n)++] = e->to;
                stack[sp++] = e->to;
            }
        }
    }
    qsort(buf, *n, sizeof *buf, cmp_int);
}

jdfa *jdfa_from_nfa(const jnfa *a, int start, int accept, int max_states, tp_err *err)
{
    jdfa *d = calloc(1, sizeof *d);
    nfa_csr g = {calloc((size_t)a->n + 1, sizeof(int)), calloc((size_t)a->ne + 1, sizeof(int))};
    int *stamp = calloc((size_t)a->n + 1, sizeof(int));
    int *buf = malloc(((size_t)a->n + 1) * sizeof(int));
    int *stack = malloc(((size_t)a->n + 1) * sizeof(int));
    int *tmark = calloc((size_t)a->n + 1, sizeof(int));
    subsets ss = {0};
    imap map = {0};
    uint32_t *bd = NULL;
    int *edges = NULL, *tgt = NULL;
    int mark = 0, tm = 0;
    if (!d || !g.off || !g.idx || !stamp || !buf || !stack || !tmark || a->oom) goto oom;
    for (int i = 0; i < a->ne; i++) g.off[a->e[i].from + 1]++;
    for (int s = 0; s < a->n; s++) g.off[s + 1] += g.off[s];
    {
        int *fill = calloc((size_t)a->n + 1, sizeof(int));
        if (!fill) goto oom;
        for (int i = 0; i < a->ne; i++) g.idx[g.off[a->e[i].from] + fill[a->e[i].from]++] = i;
        free(fill);
    }
    /* the subset of the start state */
    size_t nb = 1;
    buf[0] = start;
    closure(a, &g, buf, &nb, stamp, ++mark, stack);
    if (sub_intern(&ss, &map, buf, nb) < 0) goto oom;
    /* each subset in id order becomes DFA state id: its transitions go to
     * the subsets of the elementary intervals of its edges' sets */
    size_t cbd = 0, work = 0;
    int cedges = 0;
    for (int id = 0; id < ss.n; id++) {
        if (ss.n > max_states) {
            jdfa_free(d);
            d = NULL;
            tp_err_set(err, TP_ERANGE, "more than %d automaton states", max_states);
            goto out;
        }
        const int *mem = ss.pool + ss.at[id];
        size_t nm = ss.at[id + 1] - ss.at[id];
        bool acc = false;
        for (size_t i = 0; i < nm; i++) acc = acc || mem[i] == accept;
        if (dfa_state(d, acc) < 0) goto oom;
        /* the edges with a set, and the boundaries of their ranges */
        int ne = 0;
        size_t nbd = 0;
        for (size_t i = 0; i < nm; i++)
            for (int k = g.off[mem[i]]; k < g.off[mem[i] + 1]; k++) {
                const jnfa_e *e = &a->e[g.idx[k]];
                if (e->eps || !e->set.n) continue;
                if (ne == cedges) {
                    cedges = cedges ? cedges * 2 : 64;
                    int *x = realloc(edges, (size_t)cedges * sizeof *x);
                    if (!x) goto oom;
                    edges = x;
                }
                edges[ne++] = g.idx[k];
                if (nbd + 2 * (size_t)e->set.n + 2 > cbd) {
                    cbd = (nbd + 2 * (size_t)e->set.n + 2) * 2;
                    uint32_t *x = realloc(bd, cbd * sizeof *x);
                    if (!x) goto oom;
                    bd = x;
                }
                for (int r = 0; r < e->set.n; r++) {
                    bd[nbd++] = e->set.r[r][0];
                    bd[nbd++] = e->set.r[r][1] + 1;
                }
            }
        if (!ne) continue;
        /* a pattern like (.|..){0,2000} has subsets that grow with the
         * state count: bound the whole construction, not only its states */
        work += nm + (size_t)ne + nbd;
        if (work > JS_MAX_DFA_WORK) {
            jdfa_free(d);
            d = NULL;
            tp_err_set(err, TP_ERANGE, "the automaton takes more than %d steps to build", JS_MAX_DFA_WORK);
            goto out;
        }
        qsort(bd, nbd, sizeof *bd, cmp_u32);
        size_t u = 0;
        for (size_t i = 0; i < nbd; i++)
            if (!u || bd[i] != bd[u - 1]) bd[u++] = bd[i];
        /* one target subset per interval; the intervals with the same
         * target are one transition */
        int *itgt = realloc(tgt, (u + 1) * sizeof *itgt);
        if (!itgt) goto oom;
        tgt = itgt;
        for (size_t i = 0; i + 1 < u; i++) {
            uint32_t lo = bd[i];
            nb = 0;
            ++tm;
            for (int k = 0; k < ne; k++) {
                const jnfa_e *e = &a->e[edges[k]];
                if (tmark[e->to] != tm && jcs_has(&e->set, lo)) {
                    tmark[e->to] = tm;
                    buf[nb++] = e->to;
                }
            }
            tgt[i] = -1;
            if (!nb || (lo >= 0xD800 && bd[i + 1] - 1 <= 0xDFFF)) continue;
            closure(a, &g, buf, &nb, stamp, ++mark, stack);
            tgt[i] = sub_intern(&ss, &map, buf, nb);
            if (tgt[i] < 0) goto oom;
        }
        for (size_t i = 0; i + 1 < u; i++) {
            if (tgt[i] < 0) continue;
            int to = tgt[i];
            cset set = {0};
            for (size_t j = i; j + 1 < u; j++)
                if (tgt[j] == to) {
                    uint32_t lo = bd[j], hi = bd[j + 1] - 1;
                    /* never a surrogate (not a character in UTF-8) */
                    if (lo < 0xD800 || hi > 0xDFFF) {
                        if (lo < 0xD800 && hi >= 0xD800) {
                            jcs_add(&set, lo, 0xD7FF);
                            if (hi > 0xDFFF) jcs_add(&set, 0xE000, hi);
                        } else if (lo <= 0xDFFF && hi > 0xDFFF) {
                            jcs_add(&set, 0xE000, hi);
                        } else {
                            jcs_add(&set, lo, hi);
                        }
                    }
                    tgt[j] = -1;
                }
            if (set.oom) {
                jcs_free(&set);
                goto oom;
            }
            if (set.n) dfa_trans(d, to, &set);
            else jcs_free(&set);
            if (d->oom) goto oom;
        }
    }
    goto out;
oom:
    jdfa_free(d);
    d = NULL;
    tp_err_set(err, TP_ENOMEM, "out of memory");
out:
    free(g.off);
    free(g.idx);
    free(stamp);
    free(buf);
    free(stack);
    free(tmark);
    free(ss.pool);
    free(ss.at);
    free(map.slot);
    free(bd);
    free(edges);
    free(tgt);
    return d;
}

/* ---- intersection ------------------------------------------------------ */

static void jcs_and(cset *out, const cset *a, const cset *b)
{
    int i = 0, j = 0;
    while (i < a->n && j < b->n) {
        uint32_t lo = a->r[i][0] > b->r[j][0] ? a->r[i][0] : b->r[j][0];
        uint32_t hi = a->r[i][1] < b->r[j][1] ? a->r[i][1] : b->r[j][1];
        if (lo <= hi) jcs_add(out, lo, hi);
        if (a->r[i][1] < b->r[j][1]) i++;
        else j++;
    }
}

typedef struct pairs {
    int *a, *b;
    int n, c;
    int nb;
} pairs;

static uint64_t pair_hash(const void *ctx, int id)
{
    const pairs *p = ctx;
    return mix(mix(0, (uint64_t)p->a[id]), (uint64_t)p->b[id]);
}

static bool pair_eq(const void *ctx, int id, const void *key)
{
    const pairs *p = ctx;
    const int *k = key;
    return p->a[id] == k[0] && p->b[id] == k[1];
}

jdfa *jdfa_product(const jdfa *x, const jdfa *y, int max_states, tp_err *err)
{
    jdfa *d = calloc(1, sizeof *d);
    pairs p = {0};
    imap map = {0};
    if (!d) goto oom;
    int key[2] = {0, 0};
    for (int id = -1; id < p.n; id++) {
        if (id >= 0) {
            if (dfa_state(d, x->acc[p.a[id]] && y->acc[p.b[id]]) < 0) goto oom;
        }
        int sa = id < 0 ? 0 : p.a[id], sb = id < 0 ? 0 : p.b[id];
        int ta0 = id < 0 ? 0 : x->first[sa], ta1 = id < 0 ? 1 : x->first[sa + 1];
        for (int ta = ta0; ta < ta1; ta++) {
            int tb0 = id < 0 ? 0 : y->first[sb], tb1 = id < 0 ? 1 : y->first[sb + 1];
            for (int tb = tb0; tb < tb1; tb++) {
                cset set = {0};
                if (id >= 0) {
                    jcs_and(&set, &x->t[ta].set, &y->t[tb].set);
                    if (set.oom) {
                        jcs_free(&set);
                        goto oom;
                    }
                    if (!set.n) continue;
                    key[0] = x->t[ta].to;
                    key[1] = y->t[tb].to;
                }
                long sl = imap_find(&map, mix(mix(0, (uint64_t)key[0]), (uint64_t)key[1]), pair_eq, pair_hash, &p, key);
                if (sl < 0) {
                    jcs_free(&set);
                    goto oom;
                }
                if (!map.slot[sl]) {
                    if (p.n >= max_states) {
                        jcs_free(&set);
                        jdfa_free(d);
                        d = NULL;
                        tp_err_set(err, TP_ERANGE, "more than %d automaton states", max_states);
                        goto out;
                    }
                    if (p.n == p.c) {
                        int c = p.c ? p.c * 2 : 64;
                        int *na = realloc(p.a, (size_t)c * sizeof *na);
                        if (na) p.a = na;
                        int *nb = realloc(p.b, (size_t)c * sizeof *nb);
                        if (nb) p.b = nb;
                        if (!na || !nb) {
                            jcs_free(&set);
                            goto oom;
                        }
                        p.c = c;
                    }
                    p.a[p.n] = key[0];
                    p.b[p.n] = key[1];
                    map.slot[sl] = ++p.n;
                    map.n++;
                }
                if (id >= 0) dfa_trans(d, map.slot[sl] - 1, &set);
                if (d->oom) goto oom;
            }
        }
    }
    goto out;
oom:
    jdfa_free(d);
    d = NULL;
    tp_err_set(err, TP_ENOMEM, "out of memory");
out:
    free(p.a);
    free(p.b);
    free(map.slot);
    return d;
}

/* ---- minimization (Moore) ---------------------------------------------- */

typedef struct sig {
    unsigned char *p;
    size_t n;
    int s;
} sig;

static int cmp_sig(const void *a, const void *b)
{
    const sig *x = a, *y = b;
    size_t m = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->p, y->p, m);
    if (c) return c;
    return (x->n > y->n) - (x->n < y->n);
}

/* state s's transitions grouped by the class of their target: the union of
 * the sets going to each class, in class order */
static bool grouped(const jdfa *d, const int *cl, int s, cset *by, int *used, int *nu)
{
    *nu = 0;
    for (int t = d->first[s]; t < d->first[s + 1]; t++) {
        int k = cl[d->t[t].to];
        if (!by[k].n) used[(*nu)++] = k;
        jcs_add_set(&by[k], &d->t[t].set);
        if (by[k].oom) return false;
    }
    qsort(used, (size_t)*nu, sizeof *used, cmp_int);
    return true;
}

/* the minimal DFA of d's language (caller frees); NULL out of memory, or
 * with *big when refining would take more than JS_MAX_DFA_WORK steps (a
 * long chain refines one state per round): then d is used as it is */
static jdfa *jdfa_minimize(const jdfa *d, bool *big)
{
    size_t work = 0;
    *big = false;
    int n = d->n;
    int *cl = malloc((size_t)n * sizeof *cl), *ncl = malloc((size_t)n * sizeof *ncl), *used = malloc((size_t)n * sizeof *used);
    cset *by = calloc((size_t)n, sizeof *by);
    sig *sg = calloc((size_t)n, sizeof *sg);
    jdfa *m = NULL;
    int classes = 0;
    bool ok = cl && ncl && used && by && sg;
    for (int s = 0; ok && s < n; s++) cl[s] = d->acc[s];
    for (int prev = -1; ok;) {
        work += (size_t)n + (size_t)d->nt;
        if (work > JS_MAX_DFA_WORK) {
            *big = true;
            ok = false;
            break;
        }
        for (int s = 0; ok && s < n; s++) {
            tp_buf b;
            tp_buf_init(&b, (size_t)1 << 30);
            uint32_t w = (uint32_t)cl[s];
            tp_buf_add(&b, &w, sizeof w);
            int nu;
            ok = grouped(d, cl, s, by, used, &nu);
            for (int i = 0; ok && i < nu; i++) {
                int k = used[i];
                w = (uint32_t)k;
                tp_buf_add(&b, &w, sizeof w);
                w = (uint32_t)by[k].n;
                tp_buf_add(&b, &w, sizeof w);
                tp_buf_add(&b, by[k].r, (size_t)by[k].n * sizeof *by[k].r);
                jcs_free(&by[k]);
            }
            if (b.err) ok = false;
            free(sg[s].p);
            sg[s].n = b.len;
            sg[s].s = s;
            sg[s].p = (unsigned char *)tp_buf_take(&b);
            if (!sg[s].p) ok = false;
        }
        if (!ok) break;
        qsort(sg, (size_t)n, sizeof *sg, cmp_sig);
        classes = 0;
        for (int i = 0; i < n; i++) {
            if (i && cmp_sig(&sg[i - 1], &sg[i])) classes++;
            ncl[sg[i].s] = classes;
        }
        classes++;
        memcpy(cl, ncl, (size_t)n * sizeof *cl);
        if (classes == prev) break;
        prev = classes;
    }
    if (ok) {
        /* renumber: the start's class first, the others in order of a state */
        int *order = ncl;
        for (int k = 0; k < classes; k++) order[k] = -1;
        int next = 0;
        order[cl[0]] = next++;
        for (int s = 0; s < n; s++)
            if (order[cl[s]] < 0) order[cl[s]] = next++;
        int *rep = used;
        for (int s = n - 1; s >= 0; s--) rep[order[cl[s]]] = s;
        for (int s = 0; s < n; s++) cl[s] = order[cl[s]];
        m = calloc(1, sizeof *m);
        ok = m != NULL;
        for (int k = 0; ok && k < classes; k++) {
            int s = rep[k];
            if (dfa_state(m, d->acc[s]) < 0) break;
            /* the sets to each target class, merged */
            for (int t = d->first[s]; t < d->first[s + 1]; t++) jcs_add_set(&by[cl[d->t[t].to]], &d->t[t].set);
            for (int t = d->first[s]; t < d->first[s + 1]; t++) {
                int to = cl[d->t[t].to];
                if (!by[to].n) continue;
                if (by[to].oom) m->oom = true;
                dfa_trans(m, to, &by[to]);
            }
        }
        if (m && m->oom) {
            jdfa_free(m);
            m = NULL;
        }
    }
    for (int s = 0; sg && s < n; s++) free(sg[s].p);
    for (int s = 0; by && s < n; s++) jcs_free(&by[s]);
    free(sg);
    free(by);
    free(cl);
    free(ncl);
    free(used);
    return m;
}

/* ---- the strings within a length range, as GBNF ------------------------ */

/* the longest way from live state s to acceptance (INF: unbounded, a
 * cycle of live states on the way); depth-first, memoized in mx */
static void rem_longest(const jdfa *d, const size_t *mn, size_t *mx, int *color, int s)
{
    color[s] = 1;
    size_t best = 0;
    for (int t = d->first[s]; t < d->first[s + 1]; t++) {
        int to = d->t[t].to;
        if (mn[to] == INF) continue; /* dead */
        if (color[to] == 1) {
            best = INF;
            continue;
        }
        if (!color[to]) rem_longest(d, mn, mx, color, to);
        if (best != INF) best = mx[to] == INF ? INF : (mx[to] + 1 > best ? mx[to] + 1 : best);
    }
    mx[s] = best;
    color[s] = 2;
}

typedef struct pstate {
    int d;
    long n; /* count so far, -1: no longer counted */
} pstate;

typedef struct pgraph {
    pstate *st;
    int n, c;
    int *ef, *et, *tr; /* edges: from, to, DFA transition */
    int ne, ce;
} pgraph;

static uint64_t ps_hash(const void *ctx, int id)
{
    const pgraph *g = ctx;
    return mix(mix(1, (uint64_t)g->st[id].d), (uint64_t)g->st[id].n);
}

static bool ps_eq(const void *ctx, int id, const void *key)
{
    const pgraph *g = ctx;
    const pstate *k = key;
    return g->st[id].d == k->d && g->st[id].n == k->n;
}

static uint64_t set_hash_of(const cset *s)
{
    uint64_t h = (uint64_t)s->n;
    for (int i = 0; i < s->n; i++) h = mix(mix(h, s->r[i][0]), s->r[i][1]);
    return h;
}

static uint64_t set_hash(const void *ctx, int id)
{
    return set_hash_of(&((const jdfa *)ctx)->t[id].set);
}

static bool set_eq(const void *ctx, int id, const void *key)
{
    const cset *a = &((const jdfa *)ctx)->t[id].set, *b = key;
    return a->n == b->n && !memcmp(a->r, b->r, (size_t)a->n * sizeof *a->r);
}

static int write_min(const jdfa *d, size_t lo, size_t hi, const char *base, int max_rules, tp_buf *rules, tp_buf *expr,
                     tp_err *err);

int jdfa_write(const jdfa *d, size_t lo, size_t hi, const char *base, int max_rules, tp_buf *rules, tp_buf *expr,
               tp_err *err)
{
    bool big;
    jdfa *m = jdfa_minimize(d, &big);
    if (!m && !big) return tp_err_set(err, TP_ENOMEM, "out of memory");
    int rc = write_min(m ? m : d, lo, hi, base, max_rules, rules, expr, err);
    jdfa_free(m);
    return rc;
}

static int write_min(const jdfa *d, size_t lo, size_t hi, const char *base, int max_rules, tp_buf *rules, tp_buf *expr,
                     tp_err *err)
{
    size_t *mn = malloc((size_t)d->n * sizeof *mn), *mx = calloc((size_t)d->n, sizeof *mx);
    int *color = calloc((size_t)d->n, sizeof *color);
    pgraph g = {0};
    imap map = {0};
    bool *live = NULL;
    int *num = NULL, *cls = NULL;
    char **cname = NULL;
    int rc = 0;
    if (!mn || !mx || !color) goto oom;
    /* shortest: backwards from the accepting states, to a fixed point */
    for (int s = 0; s < d->n; s++) mn[s] = d->acc[s] ? 0 : INF;
    for (bool ch = true; ch;) {
        ch = false;
        for (int s = 0; s < d->n; s++)
            for (int t = d->first[s]; t < d->first[s + 1]; t++)
                if (mn[d->t[t].to] != INF && mn[d->t[t].to] + 1 < mn[s]) mn[s] = mn[d->t[t].to] + 1, ch = true;
    }
    /* longest: INF when a cycle of live states is reachable */
    for (int s = 0; s < d->n; s++)
        if (!color[s] && mn[s] != INF) rem_longest(d, mn, mx, color, s);
    /* explore the (state, count) pairs from the start */
    for (int i = -1; i < g.n; i++) {
        int s = i < 0 ? 0 : g.st[i].d;
        long n0 = i < 0 ? -1 : g.st[i].n;
        int t0 = i < 0 ? -1 : d->first[s], t1 = i < 0 ? 0 : d->first[s + 1];
        for (int t = t0; t < t1; t++) {
            int to = t < 0 ? 0 : d->t[t].to;
            size_t n = t < 0 ? 0 : (n0 < 0 ? 0 : (size_t)n0 + 1);
            if (mn[to] == INF) continue;
            pstate k = {to, -1};
            if (t < 0 || n0 >= 0) {
                if (hi != INF && n + mn[to] > hi) continue;
                bool up = hi == INF || (mx[to] != INF && n + mx[to] <= hi);
                bool down = n + mn[to] >= lo;
                if (!up || !down) k.n = (long)n;
            }
            long sl = imap_find(&map, mix(mix(1, (uint64_t)k.d), (uint64_t)k.n), ps_eq, ps_hash, &g, &k);
            if (sl < 0) goto oom;
            if (!map.slot[sl]) {
                if (g.n >= JS_MAX_LEN_STATES) {
                    rc = tp_err_set(err, TP_ERANGE, "the lengths need more than %d automaton states", JS_MAX_LEN_STATES);
                    goto out;
                }
                if (g.n == g.c) {
                    int c = g.c ? g.c * 2 : 64;
                    pstate *x = realloc(g.st, (size_t)c * sizeof *x);
                    if (!x) goto oom;
                    g.st = x;
                    g.c = c;
                }
                g.st[g.n] = k;
                map.slot[sl] = ++g.n;
                map.n++;
            }
            if (t < 0) continue;
            if (g.ne == g.ce) {
                int c = g.ce ? g.ce * 2 : 64;
                int *a = realloc(g.ef, (size_t)c * sizeof *a);
                if (a) g.ef = a;
                int *b = realloc(g.et, (size_t)c * sizeof *b);
                if (b) g.et = b;
                int *e = realloc(g.tr, (size_t)c * sizeof *e);
                if (e) g.tr = e;
                if (!a || !b || !e) goto oom;
                g.ce = c;
            }
            g.ef[g.ne] = i;
            g.et[g.ne] = map.slot[sl] - 1;
            g.tr[g.ne++] = t;
        }
    }
    if (!g.n) {
        rc = 1;
        goto out;
    }
    /* keep the pairs that can still finish inside the range */
    live = calloc((size_t)g.n, sizeof *live);
    num = malloc((size_t)g.n * sizeof *num);
    if (!live || !num) goto oom;
    for (int i = 0; i < g.n; i++)
        live[i] = d->acc[g.st[i].d] && (g.st[i].n < 0 || ((size_t)g.st[i].n >= lo && (size_t)g.st[i].n <= hi));
    for (bool ch = true; ch;) {
        ch = false;
        for (int e = g.ne - 1; e >= 0; e--)
            if (live[g.et[e]] && !live[g.ef[e]]) live[g.ef[e]] = ch = true;
    }
    if (!live[0]) {
        rc = 1;
        goto out;
    }
    int nl = 0;
    for (int i = 0; i < g.n; i++) num[i] = live[i] ? nl++ : -1;
    /* each transition set once: inline when GBNF reads it as one element
     * without a helper rule, else a rule of its own */
    cls = malloc(((size_t)d->nt + 1) * sizeof *cls);
    cname = calloc((size_t)d->nt + 1, sizeof *cname);
    if (!cls || !cname) goto oom;
    int ncls = 0;
    free(map.slot);
    map = (imap){0};
    for (int t = 0; t < d->nt; t++) {
        long sl = imap_find(&map, set_hash_of(&d->t[t].set), set_eq, set_hash, d, &d->t[t].set);
        if (sl < 0) goto oom;
        if (!map.slot[sl]) map.slot[sl] = t + 1, map.n++;
        cls[t] = map.slot[sl] - 1;
        if (cls[t] != t) continue;
        tp_buf b;
        tp_buf_init(&b, rules->max);
        jgb_json_class(&b, &d->t[t].set);
        const cset *s = &d->t[t].set;
        bool one = s->n == 1 && s->r[0][0] == s->r[0][1];
        if (b.err) {
            tp_buf_free(&b);
            goto oom;
        }
        if (b.data && b.data[0] != '(' && (one || s->r[s->n - 1][1] < 0x80)) {
            cname[t] = tp_buf_take(&b);
        } else {
            char name[80];
            snprintf(name, sizeof name, "%s-c%d", base, ncls++);
            tp_buf_printf(rules, "%s ::= %s\n", name, b.data ? b.data : "\"\"");
            tp_buf_free(&b);
            cname[t] = strdup(name);
        }
        if (!cname[t]) goto oom;
    }
    if (nl + ncls > max_rules) {
        rc = tp_err_set(err, TP_ERANGE, "the lengths need %d grammar rules, above the limit of %d", nl + ncls, max_rules);
        goto out;
    }
    /* one rule per live pair; edges are grouped by their source */
    int e = 0;
    for (int i = 0; i < g.n; i++) {
        while (e < g.ne && g.ef[e] < i) e++;
        if (!live[i]) continue;
        tp_buf_printf(rules, "%s-%d ::=", base, num[i]);
        const char *sep = " ";
        for (int k = e; k < g.ne && g.ef[k] == i; k++) {
            if (!live[g.et[k]]) continue;
            tp_buf_printf(rules, "%s%s %s-%d", sep, cname[cls[g.tr[k]]], base, num[g.et[k]]);
            sep = " | ";
        }
        const pstate *p = &g.st[i];
        if (d->acc[p->d] && (p->n < 0 || ((size_t)p->n >= lo && (size_t)p->n <= hi))) tp_buf_printf(rules, "%s\"\"", sep);
        tp_buf_puts(rules, "\n");
    }
    tp_buf_printf(expr, "%s-0", base);
    goto out;
oom:
    rc = tp_err_set(err, TP_ENOMEM, "out of memory");
out:
    if (cname)
        for (int t = 0; t < d->nt; t++) free(cname[t]);
    free(cname);
    free(cls);
    free(live);
    free(num);
    free(mn);
    free(mx);
    free(color);
    free(g.st);
    free(g.ef);
    free(g.et);
    free(g.tr);
    free(map.slot);
    return rc;
}
