#include "tokpipe/stopmatch.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* One automaton state. 16 bytes, so 10 000 stops of 32 bytes (~320 000
 * states) take ~5 MB plus 5 bytes per edge. */
struct node {
    uint32_t fail;     /* longest proper suffix state */
    uint32_t edge;     /* first edge in the shared arrays */
    uint32_t out;      /* 1 + longest pattern ending here, 0 = none */
    uint16_t n_edge;
    uint16_t partial;  /* longest suffix that is a proper pattern prefix */
};

struct tp_stopmatch {
    uint32_t root[256];     /* dense row of the start state (0 = stay) */
    struct node *node;
    size_t n_node;
    uint8_t *label;         /* edges, sorted by label within each state */
    uint32_t *target;
    char *bytes;            /* distinct patterns, concatenated */
    size_t *off, *len;      /* per distinct pattern */
    size_t n_pat;
    uint32_t *merged;       /* input index -> distinct index */
    size_t n_in;
};

/* Scratch used only while building. */
struct build {
    const char *const *pat;
    const size_t *len;
    size_t *order;          /* input indices sorted by bytes, then index */
    uint32_t *parent;
    uint16_t *depth;
    uint8_t *lab;           /* label of the edge into each node */
    uint32_t *term;         /* 1 + distinct pattern ending exactly here */
    uint32_t *queue;
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

/* Edge arrays: children of each node, contiguous, in label order. */
static void build_edges(tp_stopmatch *m, struct build *bd)
{
    for (size_t v = 0; v < m->n_node; v++) m->node[v].n_edge = 0;
    for (size_t v = 1; v < m->n_node; v++) m->node[bd->parent[v]].n_edge++;
    uint32_t pos = 0;
    for (size_t v = 0; v < m->n_node; v++) {
        m->node[v].edge = pos;
        pos += m->node[v].n_edge;
        m->node[v].n_edge = 0;
    }
    for (size_t v = 1; v < m->n_node; v++) {
        struct node *u = &m->node[bd->parent[v]];
        uint32_t e = u->edge + u->n_edge++;
        m->label[e] = bd->lab[v];
        m->target[e] = (uint32_t)v;
    }
    memset(m->root, 0, sizeof m->root);
    for (uint32_t e = 0; e < m->node[0].n_edge; e++) m->root[m->label[e]] = m->target[e];
}

static uint32_t child(const tp_stopmatch *m, uint32_t s, uint8_t c)
{
    const struct node *n = &m->node[s];
    const uint8_t *lab = m->label + n->edge;
    for (uint32_t e = 0; e < n->n_edge; e++)
        if (lab[e] == c) return m->target[n->edge + e];
    return 0;
}

/* Failure links, outputs and hold-back lengths in BFS order, so each state's
 * failure state (shallower) is complete before the state itself. */
static void build_links(tp_stopmatch *m, struct build *bd)
{
    uint32_t *q = bd->queue;
    size_t head = 0, tail = 0;
    m->node[0].fail = 0;
    m->node[0].out = 0;
    m->node[0].partial = 0;
    q[tail++] = 0;
    while (head < tail) {
        uint32_t u = q[head++];
        const struct node *un = &m->node[u];
        for (uint32_t e = un->edge; e < un->edge + un->n_edge; e++) {
            uint32_t v = m->target[e], f = 0;
            if (u != 0) {
                f = un->fail;
                uint32_t t;
                while ((t = f ? child(m, f, m->label[e]) : m->root[m->label[e]]) == 0 && f)
                    f = m->node[f].fail;
                f = t;
            }
            struct node *vn = &m->node[v];
            vn->fail = f;
            vn->out = bd->term[v] ? bd->term[v] : m->node[f].out;
            vn->partial = vn->n_edge ? bd->depth[v] : m->node[f].partial;
            q[tail++] = v;
        }
    }
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
        if (*total >= UINT32_MAX)
            return tp_err_set(err, TP_ERANGE, "patterns: more than 4 GiB in total");
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
}

static int build_alloc(tp_stopmatch *m, struct build *bd, size_t max_nodes)
{
    size_t n = m->n_in ? m->n_in : 1;
    bd->order = malloc(n * sizeof *bd->order);
    bd->parent = malloc(max_nodes * sizeof *bd->parent);
    bd->depth = malloc(max_nodes * sizeof *bd->depth);
    bd->lab = malloc(max_nodes);
    bd->term = malloc(max_nodes * sizeof *bd->term);
    bd->queue = malloc(max_nodes * sizeof *bd->queue);
    m->merged = malloc(n * sizeof *m->merged);
    m->node = malloc(max_nodes * sizeof *m->node);
    m->label = malloc(max_nodes);
    m->target = malloc(max_nodes * sizeof *m->target);
    if (!bd->order || !bd->parent || !bd->depth || !bd->lab || !bd->term || !bd->queue ||
        !m->merged || !m->node || !m->label || !m->target)
        return TP_ENOMEM;
    return 0;
}

/* Give back the over-allocation (max_nodes was the sum of lengths). */
static void shrink(tp_stopmatch *m)
{
    struct node *n = realloc(m->node, m->n_node * sizeof *n);
    if (n) m->node = n;
}

int tp_stopmatch_new(const char *const *pat, const size_t *len, size_t n, tp_stopmatch **out,
                     tp_err *err)
{
    size_t total;
    *out = NULL;
    int rc = check_patterns(pat, len, n, &total, err);
    if (rc) return rc;
    tp_stopmatch *m = calloc(1, sizeof *m);
    if (!m) return tp_err_set(err, TP_ENOMEM, "stop matcher: out of memory");
    struct build bd = {.pat = pat, .len = len};
    m->n_in = n;
    rc = build_alloc(m, &bd, total + 1);
    if (!rc) rc = collect_patterns(m, &bd);
    if (rc) {
        build_free(&bd);
        tp_stopmatch_free(m);
        return tp_err_set(err, TP_ENOMEM, "stop matcher: out of memory for %zu patterns", n);
    }
    build_trie(m, &bd);
    build_edges(m, &bd);
    build_links(m, &bd);
    build_free(&bd);
    shrink(m);
    *out = m;
    return 0;
}

void tp_stopmatch_free(tp_stopmatch *m)
{
    if (!m) return;
    free(m->node);
    free(m->label);
    free(m->target);
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

size_t tp_stopmatch_find(const tp_stopmatch *m, uint32_t *state, const uint8_t *b, size_t n,
                         uint32_t *pat)
{
    uint32_t s = *state;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = b[i];
        for (;;) {
            if (s == 0) {
                s = m->root[c];
                break;
            }
            uint32_t t = child(m, s, c);
            if (t) {
                s = t;
                break;
            }
            s = m->node[s].fail;
        }
        if (m->node[s].out) {
            *state = s;
            *pat = m->node[s].out - 1;
            return i + 1;
        }
    }
    *state = s;
    *pat = TP_STOPMATCH_NONE;
    return n;
}

size_t tp_stopmatch_partial(const tp_stopmatch *m, uint32_t state)
{
    return m->node[state].partial;
}

size_t tp_stopmatch_states(const tp_stopmatch *m)
{
    return m->n_node;
}

size_t tp_stopmatch_memory(const tp_stopmatch *m)
{
    size_t edges = m->n_node - 1, bytes = 0;
    for (size_t i = 0; i < m->n_pat; i++) bytes += m->len[i];
    return sizeof *m + m->n_node * sizeof *m->node + edges * (1 + sizeof *m->target) + bytes +
           m->n_pat * 2 * sizeof(size_t) + m->n_in * sizeof *m->merged;
}
