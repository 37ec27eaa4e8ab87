#include "tokpipe/stopmatch.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* States are numbered in BFS order (by depth). The first n_dense states
 * get a dense row of full DFA transitions over byte classes, within a
 * memory budget: random text keeps the automaton in shallow states, so
 * almost every byte takes one table lookup. Deeper states keep their
 * children as a consecutive id range (BFS numbers siblings consecutively)
 * and fall back along failure links until a dense state answers.
 * A state is handed out as id << shift, its row's offset, so the hot loop
 * is one add and one load per byte. */
#define HAS_OUT 0x80000000u       /* flag in a transition: target has an output */
#define STATE_MASK 0x7FFFFFFFu

struct tp_stopmatch {
    uint16_t cls[256];      /* byte -> class; 0 = a byte no pattern contains */
    size_t n_cls;
    unsigned shift;         /* rows are 1 << shift entries (>= n_cls) */
    uint32_t *row;          /* n_dense rows of transitions (target << shift | HAS_OUT) */
    size_t n_dense;
    size_t n_node;
    uint32_t *fail;         /* per state: longest proper suffix state */
    uint32_t *first;        /* per state: id of its first child */
    uint16_t *n_child;
    uint8_t *lab;           /* per state: byte of the edge into it */
    uint32_t *out;          /* per state: 1 + longest pattern ending here, 0 = none */
    uint16_t *partial;      /* per state: longest suffix that is a proper pattern prefix */
    char *bytes;            /* distinct patterns, concatenated */
    size_t *off, *len;      /* per distinct pattern */
    size_t n_pat;
    uint32_t *merged;       /* input index -> distinct index */
    size_t n_in;
};

/* Scratch used only while building; trie ids are DFS preorder. */
struct build {
    const char *const *pat;
    const size_t *len;
    size_t *order;          /* input indices sorted by bytes, then index */
    uint32_t *parent;
    uint16_t *depth;
    uint8_t *lab;           /* label of the edge into each node */
    uint32_t *term;         /* 1 + distinct pattern ending exactly here */
    uint32_t *queue;
    uint32_t *newid;        /* trie id -> state id */
    uint32_t *bfs;          /* state id -> trie id */
    uint32_t *n_kid, *kid_at, *kids;   /* children of each trie node, CSR */
};

static int cmp_pat(const void *a, const void *b, void *ctx)
{
    const struct build *bd = ctx;
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    size_t li = bd->len[i], lj = bd->len[j];
    int c = memcmp(bd->pat[i], bd->pat[j], li < lj ? li : lj);
    if (c) return c;
    if (li != lj) return li < lj ? -1 : 1;
    return i < j ? -1 : (i > j);
}

static bool same_pat(const struct build *bd, size_t i, size_t j)
{
    return bd->len[i] == bd->len[j] && !memcmp(bd->pat[i], bd->pat[j], bd->len[i]);
}

/* Number distinct patterns by first appearance and copy their bytes. */
static int collect_patterns(tp_stopmatch *m, struct build *bd)
{
    size_t n = m->n_in, total = 0;
    for (size_t k = 0; k < n; k++) bd->order[k] = k;
    qsort_r(bd->order, n, sizeof *bd->order, cmp_pat, bd);
    /* rep[i] = first input index equal to i (the group's smallest index). */
    size_t *rep = malloc((n ? n : 1) * sizeof *rep);
    if (!rep) return TP_ENOMEM;
    for (size_t k = 0; k < n; k++) {
        size_t i = bd->order[k];
        rep[i] = (k && same_pat(bd, i, bd->order[k - 1])) ? rep[bd->order[k - 1]] : i;
    }
    for (size_t i = 0; i < n; i++) {
        if (rep[i] == i) {
            m->merged[i] = (uint32_t)m->n_pat++;
            total += bd->len[i];
        } else {
            m->merged[i] = m->merged[rep[i]];
        }
    }
    free(rep);
    m->bytes = malloc(total ? total : 1);
    m->off = malloc((m->n_pat ? m->n_pat : 1) * sizeof *m->off);
    m->len = malloc((m->n_pat ? m->n_pat : 1) * sizeof *m->len);
    if (!m->bytes || !m->off || !m->len) return TP_ENOMEM;
    /* A distinct pattern is copied when first seen. */
    bool *seen = calloc(m->n_pat ? m->n_pat : 1, 1);
    if (!seen) return TP_ENOMEM;
    size_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = m->merged[i];
        if (seen[u]) continue;
        seen[u] = true;
        m->off[u] = pos;
        m->len[u] = bd->len[i];
        memcpy(m->bytes + pos, bd->pat[i], bd->len[i]);
        pos += bd->len[i];
    }
    free(seen);
    return 0;
}

/* Trie from the sorted patterns: a node's children are created in label
 * order, which is what the edge arrays need. Nodes are numbered in DFS
 * preorder; node 0 is the root. */
static void build_trie(tp_stopmatch *m, struct build *bd)
{
    uint32_t *path = bd->queue;   /* reused as the current root-to-leaf path */
    size_t path_len = 0, prev = SIZE_MAX;
    m->n_node = 1;
    bd->depth[0] = 0;
    bd->term[0] = 0;
    for (size_t k = 0; k < m->n_in; k++) {
        size_t i = bd->order[k];
        if (prev != SIZE_MAX && same_pat(bd, i, prev)) continue;
        const uint8_t *p = (const uint8_t *)bd->pat[i];
        size_t lcp = 0;
        if (prev != SIZE_MAX) {
            const uint8_t *q = (const uint8_t *)bd->pat[prev];
            size_t lim = bd->len[i] < bd->len[prev] ? bd->len[i] : bd->len[prev];
            while (lcp < lim && p[lcp] == q[lcp]) lcp++;
        }
        path_len = lcp;
        for (size_t d = lcp; d < bd->len[i]; d++) {
            uint32_t v = (uint32_t)m->n_node++;
            bd->parent[v] = d ? path[d - 1] : 0;
            bd->depth[v] = (uint16_t)(d + 1);
            bd->lab[v] = p[d];
            bd->term[v] = 0;
            path[path_len++] = v;
        }
        bd->term[path[bd->len[i] - 1]] = m->merged[i] + 1;
        prev = i;
    }
}

/* Children of each trie node in label order (DFS creates them in order). */
static void trie_children(size_t n_node, struct build *bd)
{
    memset(bd->n_kid, 0, n_node * sizeof *bd->n_kid);
    for (size_t v = 1; v < n_node; v++) bd->n_kid[bd->parent[v]]++;
    uint32_t pos = 0;
    for (size_t v = 0; v < n_node; v++) {
        bd->kid_at[v] = pos;
        pos += bd->n_kid[v];
        bd->n_kid[v] = 0;
    }
    for (size_t v = 1; v < n_node; v++) {
        uint32_t u = bd->parent[v];
        bd->kids[bd->kid_at[u] + bd->n_kid[u]++] = (uint32_t)v;
    }
}

/* Renumber in BFS order: a node's children get consecutive ids. */
static void renumber(tp_stopmatch *m, struct build *bd)
{
    size_t tail = 1;
    bd->bfs[0] = 0;
    bd->newid[0] = 0;
    for (size_t head = 0; head < m->n_node; head++) {
        uint32_t o = bd->bfs[head];
        m->first[head] = (uint32_t)tail;
        m->n_child[head] = (uint16_t)bd->n_kid[o];
        m->lab[head] = bd->lab[o];
        for (uint32_t k = 0; k < bd->n_kid[o]; k++) {
            uint32_t c = bd->kids[bd->kid_at[o] + k];
            bd->newid[c] = (uint32_t)tail;
            bd->bfs[tail++] = c;
        }
    }
}

static uint32_t sparse_child(const tp_stopmatch *m, uint32_t s, uint8_t c)
{
    const uint8_t *lab = m->lab + m->first[s];
    for (uint32_t i = 0; i < m->n_child[s]; i++)
        if (lab[i] == c) return m->first[s] + i;
    return 0;
}

/* Goto-or-fail while building: a dense state answers from its row (filled
 * already, rows hold scaled ids without flags yet), others scan their
 * children and fall back along failure links. */
static uint32_t build_delta(const tp_stopmatch *m, uint32_t s, uint8_t c)
{
    for (;;) {
        if (s < m->n_dense) return m->row[((size_t)s << m->shift) + m->cls[c]] >> m->shift;
        uint32_t t = sparse_child(m, s, c);
        if (t) return t;
        s = m->fail[s];
    }
}

/* A dense state's row: its failure state's row (complete: smaller id)
 * overwritten with its own children. */
static void fill_row(tp_stopmatch *m, uint32_t v)
{
    size_t width = (size_t)1 << m->shift;
    uint32_t *row = m->row + ((size_t)v << m->shift);
    if (v) memcpy(row, m->row + ((size_t)m->fail[v] << m->shift), width * sizeof *row);
    else memset(row, 0, width * sizeof *row);
    for (uint32_t c = m->first[v]; c < m->first[v] + m->n_child[v]; c++)
        row[m->cls[m->lab[c]]] = c << m->shift;
}

/* Failure links, outputs, hold-back lengths and dense rows in BFS order,
 * so each state's failure state (shallower) is complete before it. */
static void build_links(tp_stopmatch *m, struct build *bd)
{
    m->fail[0] = 0;
    m->out[0] = 0;
    m->partial[0] = 0;
    fill_row(m, 0);
    for (uint32_t v = 1; v < m->n_node; v++) {
        uint32_t o = bd->bfs[v], p = bd->newid[bd->parent[o]];
        uint32_t f = p == 0 ? 0 : build_delta(m, m->fail[p], m->lab[v]);
        m->fail[v] = f;
        m->out[v] = bd->term[o] ? bd->term[o] : m->out[f];
        m->partial[v] = m->n_child[v] ? bd->depth[o] : m->partial[f];
        if (v < m->n_dense) fill_row(m, v);
    }
}

/* Once every output is known: flag transitions into states that have one. */
static void flag_rows(tp_stopmatch *m)
{
    size_t n = m->n_dense << m->shift;
    for (size_t i = 0; i < n; i++)
        if (m->out[m->row[i] >> m->shift]) m->row[i] |= HAS_OUT;
}

static void build_classes(tp_stopmatch *m)
{
    bool used[256] = {false};
    for (size_t v = 1; v < m->n_node; v++) used[m->lab[v]] = true;
    m->n_cls = 1;
    for (int c = 0; c < 256; c++) m->cls[c] = used[c] ? (uint16_t)m->n_cls++ : 0;
}

static uint32_t flagged(const tp_stopmatch *m, uint32_t t)
{
    return t << m->shift | (m->out[t] ? HAS_OUT : 0);
}

static int check_patterns(const char *const *pat, const size_t *len, size_t n, size_t *total,
                          tp_err *err)
{
    *total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!pat[i] || len[i] == 0)
            return tp_err_set(err, TP_EINVAL, "pattern[%zu]: empty", i);
        if (len[i] > TP_STOPMATCH_MAX_LEN)
            return tp_err_set(err, TP_EINVAL, "pattern[%zu]: %zu bytes, more than %d", i, len[i],
                              TP_STOPMATCH_MAX_LEN);
        *total += len[i];
        if (*total >= STATE_MASK)
            return tp_err_set(err, TP_ERANGE, "patterns: more than 2 GiB in total");
    }
    return 0;
}

static void build_free(struct build *bd)
{
    free(bd->order);
    free(bd->parent);
    free(bd->depth);
    free(bd->lab);
    free(bd->term);
    free(bd->queue);
    free(bd->newid);
    free(bd->bfs);
    free(bd->n_kid);
    free(bd->kid_at);
    free(bd->kids);
}

static int build_alloc(tp_stopmatch *m, struct build *bd, size_t max_nodes)
{
    size_t n = m->n_in ? m->n_in : 1, u = sizeof(uint32_t);
    bd->order = malloc(n * sizeof *bd->order);
    bd->parent = malloc(max_nodes * u);
    bd->depth = malloc(max_nodes * sizeof *bd->depth);
    bd->lab = malloc(max_nodes);
    bd->term = malloc(max_nodes * u);
    bd->queue = malloc(max_nodes * u);
    bd->newid = malloc(max_nodes * u);
    bd->bfs = malloc(max_nodes * u);
    bd->n_kid = malloc(max_nodes * u);
    bd->kid_at = malloc(max_nodes * u);
    bd->kids = malloc(max_nodes * u);
    m->merged = malloc(n * sizeof *m->merged);
    if (!bd->order || !bd->parent || !bd->depth || !bd->lab || !bd->term || !bd->queue ||
        !bd->newid || !bd->bfs || !bd->n_kid || !bd->kid_at || !bd->kids || !m->merged)
        return TP_ENOMEM;
    return 0;
}

/* Per-state arrays, sized once the trie's node count is known. */
static int state_alloc(tp_stopmatch *m)
{
    size_t n = m->n_node, u = sizeof(uint32_t);
    m->fail = malloc(n * u);
    m->first = malloc(n * u);
    m->n_child = malloc(n * sizeof *m->n_child);
    m->lab = malloc(n);
    m->out = malloc(n * u);
    m->partial = malloc(n * sizeof *m->partial);
    return m->fail && m->first && m->n_child && m->lab && m->out && m->partial ? 0 : TP_ENOMEM;
}

static int row_alloc(tp_stopmatch *m, size_t budget)
{
    m->shift = 0;
    while (((size_t)1 << m->shift) < m->n_cls) m->shift++;
    if (((uint64_t)m->n_node << m->shift) > STATE_MASK) return TP_ERANGE;
    size_t per_row = ((size_t)1 << m->shift) * sizeof *m->row;
    m->n_dense = (budget ? budget : TP_STOPMATCH_DENSE_BYTES) / per_row;
    if (m->n_dense < 1) m->n_dense = 1;
    if (m->n_dense > m->n_node) m->n_dense = m->n_node;
    m->row = malloc(m->n_dense * per_row);
    return m->row ? 0 : TP_ENOMEM;
}

static int build(tp_stopmatch *m, struct build *bd, size_t total, size_t budget)
{
    int rc = build_alloc(m, bd, total + 1);
    if (!rc) rc = collect_patterns(m, bd);
    if (rc) return rc;
    build_trie(m, bd);
    trie_children(m->n_node, bd);
    if (state_alloc(m)) return TP_ENOMEM;
    renumber(m, bd);
    build_classes(m);
    rc = row_alloc(m, budget);
    if (rc) return rc;
    build_links(m, bd);
    flag_rows(m);
    return 0;
}

int tp_stopmatch_new(const char *const *pat, const size_t *len, size_t n, size_t dense_bytes,
                     tp_stopmatch **out, tp_err *err)
{
    size_t total;
    *out = NULL;
    int rc = check_patterns(pat, len, n, &total, err);
    if (rc) return rc;
    tp_stopmatch *m = calloc(1, sizeof *m);
    if (!m) return tp_err_set(err, TP_ENOMEM, "stop matcher: out of memory");
    struct build bd = {.pat = pat, .len = len};
    m->n_in = n;
    rc = build(m, &bd, total, dense_bytes);
    build_free(&bd);
    if (rc) {
        tp_stopmatch_free(m);
        if (rc == TP_ERANGE)
            return tp_err_set(err, rc, "stop matcher: %zu bytes of patterns is too many states", total);
        return tp_err_set(err, TP_ENOMEM, "stop matcher: out of memory for %zu patterns", n);
    }
    *out = m;
    return 0;
}

void tp_stopmatch_free(tp_stopmatch *m)
{
    if (!m) return;
    free(m->row);
    free(m->fail);
    free(m->first);
    free(m->n_child);
    free(m->lab);
    free(m->out);
    free(m->partial);
    free(m->bytes);
    free(m->off);
    free(m->len);
    free(m->merged);
    free(m);
}

size_t tp_stopmatch_count(const tp_stopmatch *m)
{
    return m->n_pat;
}

const char *tp_stopmatch_pattern(const tp_stopmatch *m, size_t i, size_t *len)
{
    *len = m->len[i];
    return m->bytes + m->off[i];
}

uint32_t tp_stopmatch_merged_index(const tp_stopmatch *m, size_t i)
{
    return m->merged[i];
}

/* A state without a dense row: its own children, else its failure state. */
static uint32_t slow_step(const tp_stopmatch *m, uint32_t scaled, uint8_t c)
{
    uint32_t s = scaled >> m->shift;
    for (;;) {
        if (s < m->n_dense) return m->row[((size_t)s << m->shift) + m->cls[c]];
        uint32_t t = sparse_child(m, s, c);
        if (t) return flagged(m, t);
        s = m->fail[s];
    }
}

size_t tp_stopmatch_find(const tp_stopmatch *m, uint32_t *state, const uint8_t *b, size_t n,
                         uint32_t *pat)
{
    uint32_t s = *state;
    const uint32_t *row = m->row;
    const uint32_t dense = (uint32_t)(m->n_dense << m->shift);
    if (m->n_dense == m->n_node) {
        /* Every state dense (small stop sets): one load per byte. */
        for (size_t i = 0; i < n; i++) {
            uint32_t t = row[s + m->cls[b[i]]];
            s = t & STATE_MASK;
            if (t & HAS_OUT) {
                *state = s;
                *pat = m->out[s >> m->shift] - 1;
                return i + 1;
            }
        }
        *state = s;
        *pat = TP_STOPMATCH_NONE;
        return n;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t t = s < dense ? row[s + m->cls[b[i]]] : slow_step(m, s, b[i]);
        s = t & STATE_MASK;
        if (t & HAS_OUT) {
            *state = s;
            *pat = m->out[s >> m->shift] - 1;
            return i + 1;
        }
    }
    *state = s;
    *pat = TP_STOPMATCH_NONE;
    return n;
}

size_t tp_stopmatch_partial(const tp_stopmatch *m, uint32_t state)
{
    return m->partial[state >> m->shift];
}

size_t tp_stopmatch_states(const tp_stopmatch *m)
{
    return m->n_node;
}

size_t tp_stopmatch_memory(const tp_stopmatch *m)
{
    size_t bytes = 0;
    for (size_t i = 0; i < m->n_pat; i++) bytes += m->len[i];
    size_t per_state = 3 * sizeof(uint32_t) + 2 * sizeof(uint16_t) + 1;
    return sizeof *m + (m->n_dense << m->shift) * sizeof *m->row + m->n_node * per_state + bytes +
           m->n_pat * 2 * sizeof(size_t) + m->n_in * sizeof *m->merged;
}
