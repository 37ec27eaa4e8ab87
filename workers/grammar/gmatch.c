/* Grammar runtime: vocabulary trie, the lazily built DFA over interned
 * pushdown stack sets, cached token masks, per-job matchers (grammar.h has
 * the model; this file the mechanics).
 *
 * A stack is a node (element index of its top, parent node), interned so
 * equal stacks are one id; node 0 is the empty stack (the root rule is
 * complete). A parser state is the sorted set of nodes whose top is a byte
 * set (plus node 0 when accepting), interned as a DFA state. Moving on
 * byte b pops each top that has b and expands what follows (closure): an
 * alternative's end pops to the parent, a reference pushes its
 * continuation — unless the continuation is the alternative's end (tail
 * call), which keeps repetitions (R ::= x R) at constant depth. */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"
#include "tokpipe/isa.h"
#include "tokpipe/utf8.h"
#include "tokpipe/tokenizer.h"

#define UNKNOWN_STATE (-2)
#define DEAD (-1)
#define MAX_STACK_DEPTH 4096   /* nesting the runtime follows (JSON depth and the like) */

/* ---- vocabulary ---- */

typedef struct tnode {
    uint32_t skip;    /* preorder index of the next node outside this subtree, minus this one's */
    int32_t tok;      /* first token whose bytes end here, -1 if none */
    uint16_t depth;   /* 1 for a child of the root */
    uint8_t byte;
} tnode;

/* A slice (llguidance's idea): the tokens made only of the characters a
 * state takes over and over — the ASCII bytes of a set and, with mb, every
 * whole multi-byte character — by length in characters (by_len[L]: those of
 * at most L), and per trie node the most characters of a token in its
 * subtree (SLICE_OUT if one is not in the slice). The inside of a JSON
 * string (a loop: any length) or of a string with a maxLength (a chain of
 * counted states: up to the count left) starts its mask from the slice and
 * skips every subtree it covers, walking only to the tokens that leave it
 * (a quote, an escape, a split character). Built once per vocabulary for
 * each set seen. */
#define SLICE_LMAX 32
#define SLICE_OUT 255
#define PRE_MAX 254
#define PRE_MORE 255
typedef struct gslice {
    uint64_t ascii[2];
    bool mb;
    uint64_t *by_len[SLICE_LMAX + 1];  /* one block */
    uint8_t *maxc;        /* per trie node */
    /* For chains (derive_mask): per token the characters of the slice it
     * starts with (a partial multi-byte character at its end counts as one;
     * PRE_MORE past PRE_MAX), and the tokens sorted by it. */
    uint8_t *pre;
    int32_t *by_pre;
    uint32_t pre_off[PRE_MORE + 2];
    int max_pre;
} gslice;

#define MAX_SLICES 16

typedef struct slice_cache {
    gslice s[MAX_SLICES];
    int n;
} slice_cache;

struct tp_gvocab {
    slice_cache *sc;      /* memoized slices: written by mask computations */
    int n;
    uint8_t *bytes;       /* all tokens' bytes back to back */
    uint32_t *off;        /* n + 1 offsets */
    int32_t *next_same;   /* next token with the same bytes, -1 */
    tnode *nodes;
    size_t n_nodes;
    int max_depth;
    uint64_t *eog;        /* bitset */
    int32_t *eog_ids;
    int n_eog;
    uint64_t *text;       /* bitset: tokens with bytes that do not end generation (what !<x> takes) */
    struct gname {        /* special tokens' texts, for <text> references */
        char *text;
        size_t len;
        int32_t id;
    } *names;
    size_t n_names, cap_names;
};

static int cmp_tok(const void *a, const void *b, void *ctx)
{
    int x = *(const int *)a, y = *(const int *)b;
    const tp_gvocab *v = ctx;
    size_t lx = v->off[x + 1] - v->off[x], ly = v->off[y + 1] - v->off[y];
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], lx < ly ? lx : ly);
    if (c)
        return c;
    if (lx != ly)
        return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int build_trie(tp_gvocab *v, tp_err *err)
{
    int *ord = malloc((size_t)v->n * sizeof *ord);
    v->next_same = malloc((size_t)v->n * sizeof *v->next_same);
    if (!ord || !v->next_same) {
        free(ord);
        return tp_err_set(err, TP_ENOMEM, "grammar vocabulary: out of memory");
    }
    int m = 0;
    size_t total = 0;
    for (int i = 0; i < v->n; i++) {
        v->next_same[i] = -1;
        size_t l = v->off[i + 1] - v->off[i];
        if (l > 0 && l < 65535) {
            ord[m++] = i;
            total += l;
        }
    }
    qsort_r(ord, (size_t)m, sizeof *ord, cmp_tok, v);
    v->nodes = malloc((total ? total : 1) * sizeof *v->nodes);
    uint32_t *open = malloc(65536 * sizeof *open);   /* node index at each depth on the current path */
    if (!v->nodes || !open) {
        free(ord), free(open);
        return tp_err_set(err, TP_ENOMEM, "grammar vocabulary: out of memory");
    }
    size_t nn = 0;
    int depth = 0;   /* depth of the open path */
    const uint8_t *pb = NULL;
    size_t pl = 0;
    int last_tok_at_end = -1;
    for (int k = 0; k < m; k++) {
        int t = ord[k];
        const uint8_t *b = v->bytes + v->off[t];
        size_t l = v->off[t + 1] - v->off[t];
        size_t lcp = 0;
        while (lcp < l && lcp < pl && b[lcp] == pb[lcp])
            lcp++;
        if (lcp == l && l == pl) {   /* same bytes as the previous token */
            v->next_same[last_tok_at_end] = t;
            last_tok_at_end = t;
            continue;
        }
        /* close the nodes deeper than lcp */
        for (; depth > (int)lcp; depth--)
            v->nodes[open[depth]].skip = (uint32_t)(nn - open[depth]);
        for (size_t d = lcp; d < l; d++) {
            open[++depth] = (uint32_t)nn;
            v->nodes[nn++] = (tnode){0, -1, (uint16_t)(d + 1), b[d]};
        }
        v->nodes[open[depth]].tok = t;
        last_tok_at_end = t;
        if ((int)l > v->max_depth)
            v->max_depth = (int)l;
        pb = b, pl = l;
    }
    for (; depth > 0; depth--)
        v->nodes[open[depth]].skip = (uint32_t)(nn - open[depth]);
    v->n_nodes = nn;
    free(ord);
    free(open);
    return 0;
}

int tp_gvocab_new(int n, const uint8_t *const *bytes, const size_t *lens, const int *eog, int n_eog,
                  tp_gvocab **out, tp_err *err)
{
    *out = NULL;
    if (n <= 0)
        return tp_err_set(err, TP_EINVAL, "grammar vocabulary: %d tokens", n);
    tp_gvocab *v = calloc(1, sizeof *v);
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += lens[i];
    if (v) {
        v->n = n;
        v->off = malloc(((size_t)n + 1) * sizeof *v->off);
        v->bytes = malloc(total ? total : 1);
        v->eog = calloc(tp_gmask_words(n), sizeof *v->eog);
        v->text = calloc(tp_gmask_words(n), sizeof *v->text);
        v->eog_ids = malloc((size_t)(n_eog > 0 ? n_eog : 1) * sizeof *v->eog_ids);
        v->sc = calloc(1, sizeof *v->sc);
    }
    if (!v || !v->off || !v->bytes || !v->eog || !v->text || !v->eog_ids || !v->sc) {
        tp_gvocab_free(v);
        return tp_err_set(err, TP_ENOMEM, "grammar vocabulary: out of memory");
    }
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        v->off[i] = (uint32_t)o;
        if (lens[i])
            memcpy(v->bytes + o, bytes[i], lens[i]);
        o += lens[i];
    }
    v->off[n] = (uint32_t)o;
    for (int i = 0; i < n_eog; i++)
        if (eog[i] >= 0 && eog[i] < n && !tp_gvocab_is_eog(v, eog[i])) {
            v->eog[eog[i] / 64] |= 1ull << (eog[i] % 64);
            v->eog_ids[v->n_eog++] = eog[i];
        }
    for (int i = 0; i < n; i++)
        if (lens[i] && !tp_gvocab_is_eog(v, i))
            v->text[i / 64] |= 1ull << (i % 64);
    int rc = build_trie(v, err);
    if (rc) {
        tp_gvocab_free(v);
        return rc;
    }
    *out = v;
    return 0;
}

int tp_gvocab_from_tokenizer(const tp_tokenizer *tok, const int *eog, int n_eog, tp_gvocab **out, tp_err *err)
{
    int n = tp_tokenizer_vocab_size(tok);
    const uint8_t **b = malloc((size_t)n * sizeof *b);
    size_t *l = malloc((size_t)n * sizeof *l);
    /* the special tokens' pieces, for <text> references */
    int *sid = malloc((size_t)n * sizeof *sid);
    const char **sp = malloc((size_t)n * sizeof *sp);
    size_t *sl = malloc((size_t)n * sizeof *sl);
    if (!b || !l || !sid || !sp || !sl) {
        free(b), free(l), free(sid), free(sp), free(sl);
        return tp_err_set(err, TP_ENOMEM, "grammar vocabulary: out of memory");
    }
    int ns = 0;
    for (int i = 0; i < n; i++) {
        int ty = tp_tokenizer_token_type(tok, i);
        b[i] = tp_tokenizer_token_bytes(tok, -1, i, &l[i]);
        if (ty == TP_TOKEN_CONTROL || ty == TP_TOKEN_UNKNOWN || ty == TP_TOKEN_UNUSED || !b[i])
            l[i] = 0;
        if (ty == TP_TOKEN_CONTROL || ty == TP_TOKEN_USER_DEFINED || ty == TP_TOKEN_UNKNOWN) {
            sp[ns] = tp_tokenizer_piece(tok, i, &sl[ns]);
            if (sp[ns] && sl[ns])
                sid[ns++] = i;
        }
    }
    int rc = tp_gvocab_new(n, b, l, eog, n_eog, out, err);
    if (!rc && (rc = tp_gvocab_name_tokens(*out, ns, sid, sp, sl, err))) {
        tp_gvocab_free(*out);
        *out = NULL;
    }
    free(b), free(l), free(sid), free(sp), free(sl);
    return rc;
}

int tp_gvocab_name_tokens(tp_gvocab *v, int n, const int *ids, const char *const *texts, const size_t *lens,
                          tp_err *err)
{
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= v->n)
            return tp_err_set(err, TP_EINVAL, "grammar vocabulary: named token %d is outside the vocabulary", ids[i]);
        char *t = malloc(lens[i] ? lens[i] : 1);
        if (!t || gr_grow((void **)&v->names, &v->cap_names, v->n_names + 1, sizeof *v->names)) {
            free(t);
            return tp_err_set(err, TP_ENOMEM, "grammar vocabulary: out of memory");
        }
        memcpy(t, texts[i], lens[i]);
        v->names[v->n_names++] = (struct gname){t, lens[i], ids[i]};
    }
    return 0;
}

int tp_gvocab_find_name(void *ctx, const char *text, size_t len)
{
    const tp_gvocab *v = ctx;
    for (size_t i = 0; i < v->n_names; i++)
        if (v->names[i].len == len && !memcmp(v->names[i].text, text, len))
            return v->names[i].id;
    return -1;
}

void tp_gvocab_free(tp_gvocab *v)
{
    if (!v)
        return;
    for (size_t i = 0; i < v->n_names; i++)
        free(v->names[i].text);
    free(v->names), free(v->text);
    free(v->bytes), free(v->off), free(v->next_same), free(v->nodes), free(v->eog), free(v->eog_ids);
    for (int i = 0; v->sc && i < v->sc->n; i++)
        free(v->sc->s[i].by_len[0]), free(v->sc->s[i].maxc), free(v->sc->s[i].pre), free(v->sc->s[i].by_pre);
    free(v->sc);
    free(v);
}

int tp_gvocab_size(const tp_gvocab *v) { return v->n; }

const uint8_t *tp_gvocab_bytes(const tp_gvocab *v, int id, size_t *len)
{
    if (id < 0 || id >= v->n) {
        *len = 0;
        return NULL;
    }
    *len = v->off[id + 1] - v->off[id];
    return v->bytes + v->off[id];
}

bool tp_gvocab_is_eog(const tp_gvocab *v, int id)
{
    return id >= 0 && id < v->n && ((v->eog[id / 64] >> (id % 64)) & 1);
}

size_t tp_gvocab_memory(const tp_gvocab *v)
{
    return sizeof *v + v->off[v->n] + ((size_t)v->n + 1) * 4 + (size_t)v->n * 4 + v->n_nodes * sizeof(tnode) +
           tp_gmask_words(v->n) * 8 + (size_t)v->n_eog * 4;
}

/* ---- engine ---- */

typedef struct gnode {
    int32_t pos, parent;
    int32_t depth;
} gnode;

typedef struct gstate {
    uint32_t off, n;      /* its nodes: the engine's pool[off, off + n) */
    int32_t *trans;       /* 256 transitions, UNKNOWN_STATE until computed; NULL until first used */
    uint64_t *mask;       /* cached token mask, NULL until asked */
    uint32_t hash;
    uint8_t accepting, done;
    uint8_t tok;          /* some stack has a token reference on top */
    /* A state of a chain of counted states over one class (register_chain):
     * its head, whose mask is walked, and how many more characters of the
     * class may come here (CHAIN_ANY: more than any token holds). The head
     * keeps the last state whose mask it gave, to derive the next from. */
    int8_t chain_slice;
    uint16_t chain_room;
    int32_t chain_head, chain_last;
} gstate;

struct tp_gengine {
    const tp_grammar *g;
    const tp_gvocab *v;
    tp_gengine_limits lim;
    /* nodes, interned by (pos, parent) */
    gnode *nodes;
    size_t n_nodes, cap_nodes;
    int32_t *nhash;       /* open addressing, -1 empty */
    size_t nhash_cap;
    uint32_t *visited;    /* generation stamp per node (closure) */
    size_t cap_visited;
    uint32_t gen;
    /* states, interned by node set */
    gstate *states;
    size_t n_states, cap_states;
    int32_t *pool;
    size_t n_pool, cap_pool;
    int32_t *shash;
    size_t shash_cap;
    int32_t start;
    int32_t *tok_ids;     /* each token reference's id in this vocabulary */
    /* scratch */
    int32_t *work, *outv;
    size_t cap_work, cap_out;
    int32_t *walk;        /* state per trie depth */
    size_t mask_bytes;
    size_t trans_bytes;
    int error;            /* sticky TP_ERANGE / TP_ENOMEM */
};

static uint32_t mix(uint32_t h)
{
    h ^= h >> 16;
    h *= 0x7feb352dU;
    h ^= h >> 15;
    h *= 0x846ca68bU;
    h ^= h >> 16;
    return h;
}

static int rehash_nodes(tp_gengine *e, size_t cap)
{
    int32_t *h = malloc(cap * sizeof *h);
    if (!h)
        return -1;
    memset(h, -1, cap * sizeof *h);
    for (size_t i = 0; i < e->n_nodes; i++) {
        uint32_t k = mix((uint32_t)e->nodes[i].pos * 2654435761U ^ (uint32_t)e->nodes[i].parent) & (uint32_t)(cap - 1);
        while (h[k] >= 0)
            k = (k + 1) & (uint32_t)(cap - 1);
        h[k] = (int32_t)i;
    }
    free(e->nhash);
    e->nhash = h;
    e->nhash_cap = cap;
    return 0;
}

/* Node id of (pos, parent); -1 on a limit or out of memory (e->error set). */
static int32_t intern_node(tp_gengine *e, int32_t pos, int32_t parent)
{
    uint32_t mask = (uint32_t)(e->nhash_cap - 1);
    uint32_t k = mix((uint32_t)pos * 2654435761U ^ (uint32_t)parent) & mask;
    for (int32_t i; (i = e->nhash[k]) >= 0; k = (k + 1) & mask)
        if (e->nodes[i].pos == pos && e->nodes[i].parent == parent)
            return i;
    int32_t depth = parent > 0 ? e->nodes[parent].depth + 1 : 1;
    if (depth > MAX_STACK_DEPTH || e->n_nodes >= (size_t)e->lim.max_states * 64) {
        e->error = TP_ERANGE;
        return -1;
    }
    if (gr_grow((void **)&e->nodes, &e->cap_nodes, e->n_nodes + 1, sizeof *e->nodes) ||
        gr_grow((void **)&e->visited, &e->cap_visited, e->n_nodes + 1, sizeof *e->visited)) {
        e->error = TP_ENOMEM;
        return -1;
    }
    int32_t id = (int32_t)e->n_nodes++;
    e->nodes[id] = (gnode){pos, parent, depth};
    e->visited[id] = 0;
    if (e->n_nodes * 2 > e->nhash_cap) {
        if (rehash_nodes(e, e->nhash_cap * 2)) {
            e->error = TP_ENOMEM;
            return -1;
        }
    } else
        e->nhash[k] = id;
    return id;
}

static int push_work(tp_gengine *e, size_t *n, int32_t id)
{
    if (id < 0)
        return -1;
    if (gr_grow((void **)&e->work, &e->cap_work, *n + 1, sizeof *e->work)) {
        e->error = TP_ENOMEM;
        return -1;
    }
    e->work[(*n)++] = id;
    return 0;
}

/* Expand the stacks on the work list until each top is a byte set or the
 * stack is empty; append those nodes to e->outv (deduplicated by the
 * generation stamp). Left recursion was refused at compile time, so every
 * expansion path ends. */
static int closure(tp_gengine *e, size_t nw, size_t *nout)
{
    const tp_grammar *g = e->g;
    while (nw) {
        int32_t id = e->work[--nw];
        if (e->visited[id] == e->gen)
            continue;
        e->visited[id] = e->gen;
        if (id == 0) {
            if (gr_grow((void **)&e->outv, &e->cap_out, *nout + 1, sizeof *e->outv))
                return e->error = TP_ENOMEM;
            e->outv[(*nout)++] = 0;
            continue;
        }
        gnode nd = e->nodes[id];
        gel el = g->el[nd.pos];
        if (el.type == GE_END) {
            if (push_work(e, &nw, nd.parent))
                return e->error;
        } else if (el.type == GE_BYTES || el.type == GE_TOKEN) {
            if (gr_grow((void **)&e->outv, &e->cap_out, *nout + 1, sizeof *e->outv))
                return e->error = TP_ENOMEM;
            e->outv[(*nout)++] = id;
        } else {
            int32_t cont = nd.pos + 1, parent = nd.parent;
            if (g->el[cont].type != GE_END && (parent = intern_node(e, cont, nd.parent)) < 0)
                return e->error;
            const grule *r = &g->rules[el.v];
            for (int a = 0; a < r->n_alts; a++)
                if (push_work(e, &nw, intern_node(e, (int32_t)r->alts[a], parent)))
                    return e->error;
        }
    }
    return 0;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

static int rehash_states(tp_gengine *e, size_t cap)
{
    int32_t *h = malloc(cap * sizeof *h);
    if (!h)
        return -1;
    memset(h, -1, cap * sizeof *h);
    for (size_t i = 0; i < e->n_states; i++) {
        uint32_t k = e->states[i].hash & (uint32_t)(cap - 1);
        while (h[k] >= 0)
            k = (k + 1) & (uint32_t)(cap - 1);
        h[k] = (int32_t)i;
    }
    free(e->shash);
    e->shash = h;
    e->shash_cap = cap;
    return 0;
}

/* The state of node set outv[0, n) (sorted here); DEAD when empty. */
static int32_t intern_state(tp_gengine *e, size_t n)
{
    if (!n)
        return DEAD;
    qsort(e->outv, n, sizeof *e->outv, cmp_i32);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (!m || e->outv[m - 1] != e->outv[i])
            e->outv[m++] = e->outv[i];
    n = m;
    uint32_t h = 0x9e3779b9u;
    for (size_t i = 0; i < n; i++)
        h = mix(h ^ (uint32_t)e->outv[i]);
    uint32_t mask = (uint32_t)(e->shash_cap - 1);
    uint32_t k = h & mask;
    for (int32_t i; (i = e->shash[k]) >= 0; k = (k + 1) & mask) {
        gstate *s = &e->states[i];
        if (s->hash == h && s->n == n && !memcmp(e->pool + s->off, e->outv, n * sizeof *e->outv))
            return i;
    }
    if (e->n_states >= (size_t)e->lim.max_states) {
        e->error = TP_ERANGE;
        return DEAD;
    }
    if (gr_grow((void **)&e->states, &e->cap_states, e->n_states + 1, sizeof *e->states) ||
        gr_grow((void **)&e->pool, &e->cap_pool, e->n_pool + n, sizeof *e->pool)) {
        e->error = TP_ENOMEM;
        return DEAD;
    }
    int32_t id = (int32_t)e->n_states++;
    gstate *s = &e->states[id];
    memset(s, 0, sizeof *s);
    s->chain_head = s->chain_last = -1;
    s->off = (uint32_t)e->n_pool;
    s->n = (uint32_t)n;
    s->hash = h;
    s->accepting = e->outv[0] == 0;
    s->done = n == 1 && e->outv[0] == 0;
    for (size_t i = 0; i < n; i++)
        if (e->outv[i] && e->g->el[e->nodes[e->outv[i]].pos].type == GE_TOKEN)
            s->tok = 1;
    memcpy(e->pool + e->n_pool, e->outv, n * sizeof *e->outv);
    e->n_pool += n;
    if (e->n_states * 2 > e->shash_cap) {
        if (rehash_states(e, e->shash_cap * 2)) {
            e->error = TP_ENOMEM;
            return DEAD;
        }
    } else
        e->shash[k] = id;
    return id;
}

static void next_gen(tp_gengine *e)
{
    if (++e->gen == 0) {   /* stamps wrapped: clear them */
        memset(e->visited, 0, e->n_nodes * sizeof *e->visited);
        e->gen = 1;
    }
}

static int32_t compute_trans(tp_gengine *e, int32_t sid, unsigned b)
{
    const tp_grammar *g = e->g;
    next_gen(e);
    size_t nw = 0, nout = 0;
    gstate s = e->states[sid];
    for (uint32_t i = 0; i < s.n; i++) {
        int32_t id = e->pool[s.off + i];
        if (id == 0)
            continue;
        gnode nd = e->nodes[id];
        if (g->el[nd.pos].type != GE_BYTES || !gset_has(g->sets[g->el[nd.pos].v], b))
            continue;
        if (push_work(e, &nw, intern_node(e, nd.pos + 1, nd.parent)))
            return DEAD;
    }
    if (closure(e, nw, &nout))
        return DEAD;
    return intern_state(e, nout);
}

static inline int32_t step(tp_gengine *e, int32_t sid, unsigned b)
{
    int32_t *t = e->states[sid].trans;
    if (__builtin_expect(t != NULL && t[b] != UNKNOWN_STATE, 1))
        return t[b];
    if (!t) {
        t = malloc(256 * sizeof *t);
        if (!t) {
            e->error = TP_ENOMEM;
            return DEAD;
        }
        for (int i = 0; i < 256; i++)
            t[i] = UNKNOWN_STATE;
        e->states[sid].trans = t;
        e->trans_bytes += 256 * sizeof *t;
    }
    int32_t r = compute_trans(e, sid, b);
    if (e->error)
        return DEAD;   /* not cached: the limit may be lifted by nothing, but never memoize a failure */
    e->states[sid].trans[b] = r;   /* states may have moved */
    return r;
}

void tp_gengine_limits_default(tp_gengine_limits *l)
{
    l->max_states = TP_GRAMMAR_DEFAULT_MAX_STATES;
    l->mask_bytes = (size_t)TP_GRAMMAR_DEFAULT_MASK_MB << 20;
}

int tp_gengine_new(const tp_grammar *g, const tp_gvocab *v, const tp_gengine_limits *limits, tp_gengine **out,
                   tp_err *err)
{
    *out = NULL;
    tp_gengine *e = calloc(1, sizeof *e);
    if (!e)
        return tp_err_set(err, TP_ENOMEM, "grammar engine: out of memory");
    e->g = g;
    e->v = v;
    if (limits)
        e->lim = *limits;
    else
        tp_gengine_limits_default(&e->lim);
    e->walk = malloc(((size_t)v->max_depth + 1) * sizeof *e->walk);
    e->tok_ids = malloc((g->n_toks ? g->n_toks : 1) * sizeof *e->tok_ids);
    if (!e->walk || !e->tok_ids || rehash_nodes(e, 1024) || rehash_states(e, 256)) {
        tp_gengine_free(e);
        return tp_err_set(err, TP_ENOMEM, "grammar engine: out of memory");
    }
    tp_gnames names = {v->n, tp_gvocab_find_name, (void *)(uintptr_t)v};
    int rc = tp_grammar_check_tokens(g, &names, e->tok_ids, err);
    if (rc) {
        tp_gengine_free(e);
        return rc;
    }
    e->gen = 1;
    /* node 0: the empty stack */
    intern_node(e, -1, -1);
    /* start: the root rule's alternatives on an empty stack */
    size_t nw = 0, nout = 0;
    const grule *r = &g->rules[g->root];
    for (int a = 0; a < r->n_alts && !e->error; a++)
        push_work(e, &nw, intern_node(e, (int32_t)r->alts[a], 0));
    if (!e->error)
        closure(e, nw, &nout);
    if (!e->error)
        e->start = intern_state(e, nout);
    if (e->error || e->start < 0) {
        int code = e->error ? e->error : TP_EFORMAT;
        tp_gengine_free(e);
        return tp_err_set(err, code, code == TP_EFORMAT ? "grammar: the language is empty"
                                                        : "grammar engine: state limit at the start");
    }
    *out = e;
    return 0;
}

void tp_gengine_free(tp_gengine *e)
{
    if (!e)
        return;
    for (size_t i = 0; i < e->n_states; i++) {
        free(e->states[i].trans);
        free(e->states[i].mask);
    }
    free(e->states), free(e->pool), free(e->shash), free(e->nodes), free(e->nhash), free(e->visited);
    free(e->work), free(e->outv), free(e->walk), free(e->tok_ids);
    free(e);
}

size_t tp_gengine_memory(const tp_gengine *e)
{
    return sizeof *e + e->cap_nodes * sizeof(gnode) + e->nhash_cap * 4 + e->cap_visited * 4 +
           e->cap_states * sizeof(gstate) + e->cap_pool * 4 + e->shash_cap * 4 + e->trans_bytes + e->mask_bytes;
}

const tp_grammar *tp_gengine_grammar(const tp_gengine *e) { return e->g; }
const tp_gvocab *tp_gengine_vocab(const tp_gengine *e) { return e->v; }

static void drop_masks(tp_gengine *e)
{
    for (size_t i = 0; i < e->n_states; i++) {
        free(e->states[i].mask);
        e->states[i].mask = NULL;
    }
    e->mask_bytes = 0;
}

/* The byte ranges of the multi-byte UTF-8 characters (U+0080..U+10FFFF
 * without surrogates), as the compiler lowers a class that has them all. */
static const uint8_t mb_seqs[8][4][2] = {
    {{0xC2, 0xDF}, {0x80, 0xBF}},
    {{0xE0, 0xE0}, {0xA0, 0xBF}, {0x80, 0xBF}},
    {{0xE1, 0xEC}, {0x80, 0xBF}, {0x80, 0xBF}},
    {{0xED, 0xED}, {0x80, 0x9F}, {0x80, 0xBF}},
    {{0xEE, 0xEF}, {0x80, 0xBF}, {0x80, 0xBF}},
    {{0xF0, 0xF0}, {0x90, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
    {{0xF1, 0xF3}, {0x80, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
    {{0xF4, 0xF4}, {0x80, 0x8F}, {0x80, 0xBF}, {0x80, 0xBF}},
};
static const int mb_len[8] = {2, 3, 3, 3, 3, 4, 4, 4};

/* Which of mb_seqs starts with lead byte c, -1 if none. */
static int mb_seq_of(uint8_t c)
{
    for (int q = 0; q < 8; q++)
        if (c >= mb_seqs[q][0][0] && c <= mb_seqs[q][0][1])
            return q;
    return -1;
}

/* How many characters of the slice (ASCII of a; with mb any multi-byte
 * character) bytes b[0, n) start with; a valid partial character at the
 * end counts as one. */
static int pre_chars(const uint8_t *b, size_t n, const uint64_t a[2], bool mb)
{
    int chars = 0;
    for (size_t i = 0; i < n && chars <= PRE_MAX;) {
        uint8_t c = b[i];
        if (c < 0x80) {
            if (!((a[c >> 6] >> (c & 63)) & 1))
                break;
            chars++, i++;
            continue;
        }
        int q = mb ? mb_seq_of(c) : -1;
        if (q < 0)
            break;
        int k = 1;
        while (k < mb_len[q] && i + (size_t)k < n && b[i + (size_t)k] >= mb_seqs[q][k][0] &&
               b[i + (size_t)k] <= mb_seqs[q][k][1])
            k++;
        if (k < mb_len[q] && i + (size_t)k < n)
            break;   /* not a character: the rest is no class's */
        chars++;
        i += (size_t)k;
    }
    return chars > PRE_MAX ? PRE_MORE : chars;
}

/* The characters of bytes b[0, n) if they are ASCII of set a or (mb) whole
 * valid UTF-8 characters of two bytes or more, else -1. */
static int slice_chars(const uint8_t *b, size_t n, const uint64_t a[2], bool mb)
{
    int chars = 0;
    for (size_t i = 0; i < n; chars++) {
        uint8_t c = b[i];
        if (c < 0x80) {
            if (!((a[c >> 6] >> (c & 63)) & 1))
                return -1;
            i++;
            continue;
        }
        uint32_t cp;
        size_t k = mb ? tp_utf8_get(b + i, n - i, &cp) : 0;
        if (!k)
            return -1;
        i += k;
    }
    return n > 0 ? chars : -1;
}

static const gslice *get_slice(const tp_gvocab *v, const uint64_t a[2], bool mb)
{
    slice_cache *sc = v->sc;
    for (int i = 0; i < sc->n; i++)
        if (sc->s[i].ascii[0] == a[0] && sc->s[i].ascii[1] == a[1] && sc->s[i].mb == mb)
            return &sc->s[i];
    if (sc->n == MAX_SLICES)
        return NULL;
    size_t words = tp_gmask_words(v->n);
    gslice g = {.ascii = {a[0], a[1]}, .mb = mb, .by_len = {calloc(words * (SLICE_LMAX + 1), 8)},
                .maxc = malloc(v->n_nodes ? v->n_nodes : 1)};
    uint8_t *len = malloc((size_t)v->n);
    if (!g.by_len[0] || !g.maxc || !len) {
        free(g.by_len[0]), free(g.maxc), free(len);
        return NULL;
    }
    for (int l = 1; l <= SLICE_LMAX; l++)
        g.by_len[l] = g.by_len[0] + (size_t)l * words;
    for (int t = 0; t < v->n; t++) {
        int c = slice_chars(v->bytes + v->off[t], v->off[t + 1] - v->off[t], a, mb);
        len[t] = c < 0 || c > SLICE_LMAX ? SLICE_OUT : (uint8_t)c;
        for (int l = c; c >= 0 && l <= SLICE_LMAX; l++)
            g.by_len[l][t >> 6] |= 1ull << (t & 63);
    }
    /* children come after their parent in preorder: fill from the end */
    for (size_t i = v->n_nodes; i-- > 0;) {
        const tnode *nd = &v->nodes[i];
        uint8_t m = 0;
        for (int32_t t = nd->tok; t >= 0; t = v->next_same[t])
            m = len[t] > m ? len[t] : m;
        for (size_t c = i + 1; m != SLICE_OUT && c < i + nd->skip; c += v->nodes[c].skip)
            m = g.maxc[c] > m ? g.maxc[c] : m;
        g.maxc[i] = m;
    }
    free(len);
    g.pre = malloc((size_t)v->n);
    g.by_pre = malloc((size_t)v->n * sizeof *g.by_pre);
    if (!g.pre || !g.by_pre) {
        free(g.by_len[0]), free(g.maxc), free(g.pre), free(g.by_pre);
        return NULL;
    }
    memset(g.pre_off, 0, sizeof g.pre_off);
    for (int t = 0; t < v->n; t++) {
        size_t l = v->off[t + 1] - v->off[t];
        g.pre[t] = (uint8_t)(l ? pre_chars(v->bytes + v->off[t], l, a, mb) : 0);
        g.pre_off[g.pre[t] + 1]++;
        if (g.pre[t] > g.max_pre)
            g.max_pre = g.pre[t];
    }
    for (int k = 0; k <= PRE_MORE; k++)
        g.pre_off[k + 1] += g.pre_off[k];
    uint32_t fill[PRE_MORE + 1];
    memcpy(fill, g.pre_off, sizeof fill);
    for (int t = 0; t < v->n; t++)
        g.by_pre[fill[g.pre[t]]++] = t;
    sc->s[sc->n] = g;
    return &sc->s[sc->n++];
}

/* Every sequence of the byte ranges of one whole multi-byte character
 * (U+0080..U+10FFFF without surrogates) leads from sid to `to`. */
static bool multibyte_leads(tp_gengine *e, int32_t sid, int32_t to)
{
    const int *len = mb_len;
    for (int q = 0; q < 8; q++) {
        int32_t cur[8], n = 1;   /* the states a prefix of the sequence can reach */
        cur[0] = sid;
        for (int k = 0; k < len[q]; k++) {
            int32_t nxt[8];
            int m = 0;
            for (int i = 0; i < n; i++)
                for (unsigned b = mb_seqs[q][k][0]; b <= mb_seqs[q][k][1]; b++) {
                    int32_t s = step(e, cur[i], b);
                    if (s < 0)
                        return false;
                    int j = 0;
                    while (j < m && nxt[j] != s)
                        j++;
                    if (j == m) {
                        if (m == 8)
                            return false;   /* too many: not the simple loop we look for */
                        nxt[m++] = s;
                    }
                }
            memcpy(cur, nxt, (size_t)m * sizeof *cur);
            n = m;
        }
        if (n != 1 || cur[0] != to)
            return false;
    }
    return true;
}

#define SLICE_MIN_ASCII 48   /* a loop over fewer bytes is not worth a slice */

/* The slice state sid repeats, and how many of its characters may come
 * (*room; SLICE_LMAX for any number): the ASCII bytes that all lead to one
 * state — sid itself (a loop), or the next of a chain of counted states
 * where the same bytes lead on each time. NULL when there is none. */
static const gslice *slice_of(tp_gengine *e, int32_t sid, int *room)
{
    int32_t to[128];
    for (unsigned b = 0; b < 128; b++)
        to[b] = step(e, sid, b);
    e->error = 0;
    /* the most common live target */
    int32_t best = DEAD;
    int best_n = 0;
    for (unsigned b = 0; b < 128; b++) {
        if (to[b] < 0 || to[b] == best)
            continue;
        int n = 0;
        for (unsigned c = b; c < 128; c++)
            n += to[c] == to[b];
        if (n > best_n)
            best = to[b], best_n = n;
    }
    if (best_n < SLICE_MIN_ASCII)
        return NULL;
    uint64_t a[2] = {0, 0};
    for (unsigned b = 0; b < 128; b++)
        if (to[b] == best)
            a[b >> 6] |= 1ull << (b & 63);
    if (best == sid) {
        *room = SLICE_LMAX;
        bool mb = multibyte_leads(e, sid, sid);
        e->error = 0;
        return get_slice(e->v, a, mb);
    }
    /* a chain: count the steps on which every byte of a leads to one state
     * (and whether every multi-byte character does too, all the way) */
    int n = 1;
    bool mb = multibyte_leads(e, sid, best);
    e->error = 0;
    for (int32_t cur = best; n < SLICE_LMAX; n++) {
        int32_t next = DEAD;
        bool same = true;
        for (unsigned b = 0; b < 128 && same; b++)
            if ((a[b >> 6] >> (b & 63)) & 1) {
                int32_t s = step(e, cur, b);
                same = s >= 0 && (next == DEAD || s == next);
                next = s;
            }
        e->error = 0;
        if (!same)
            break;
        if (next == cur) {   /* the chain ends in a loop: any length */
            n = SLICE_LMAX;
            mb = mb && multibyte_leads(e, cur, cur);
            e->error = 0;
            break;
        }
        mb = mb && multibyte_leads(e, cur, next);
        e->error = 0;
        cur = next;
    }
    *room = n;
    return get_slice(e->v, a, mb);
}

static inline bool bit_of(const uint64_t *m, int32_t t) { return (m[t >> 6] >> (t & 63)) & 1; }

/* Whether the token reference k, on top of a stack, takes token t. */
static bool tok_takes(const tp_gengine *e, uint32_t k, int32_t t)
{
    int32_t id = e->tok_ids[k];
    if (!e->g->toks[k].neg)
        return t == id;
    return t != id && bit_of(e->v->text, t);
}

/* Add to mask what the token references on top of sid's stacks take: each
 * named id; for a negated one every token with text but its id (which stays
 * as the rest of the state allows it). */
static void token_tops_mask(tp_gengine *e, int32_t sid, uint64_t *mask)
{
    const tp_grammar *g = e->g;
    gstate s = e->states[sid];
    const tp_gvocab *v = e->v;
    int32_t neg_id = -1;   /* the one id negated, -2 when several differ */
    bool neg_had = false;
    for (uint32_t i = 0; i < s.n; i++) {
        int32_t id = e->pool[s.off + i];
        gel el = id ? g->el[e->nodes[id].pos] : (gel){GE_END, 0};
        if (el.type != GE_TOKEN || !g->toks[el.v].neg)
            continue;
        int32_t x = e->tok_ids[el.v];
        if (neg_id == -1) {
            neg_id = x;
            neg_had = bit_of(mask, x);
        } else if (neg_id != x)
            neg_id = -2;
    }
    if (neg_id != -1) {
        size_t words = tp_gmask_words(v->n);
        for (size_t w = 0; w < words; w++)
            mask[w] |= v->text[w];
        if (neg_id >= 0 && !neg_had)
            mask[neg_id >> 6] &= ~(1ull << (neg_id & 63));
    }
    for (uint32_t i = 0; i < s.n; i++) {
        int32_t id = e->pool[s.off + i];
        gel el = id ? g->el[e->nodes[id].pos] : (gel){GE_END, 0};
        if (el.type == GE_TOKEN && !g->toks[el.v].neg) {
            int32_t t = e->tok_ids[el.v];
            mask[t >> 6] |= 1ull << (t & 63);
        }
    }
}

/* The state after token t from sid through the token references on top of
 * its stacks, joined with bs, the state its bytes lead to (DEAD: none).
 * bs itself when no reference takes t. */
static int32_t token_trans(tp_gengine *e, int32_t sid, int32_t t, int32_t bs)
{
    const tp_grammar *g = e->g;
    next_gen(e);
    size_t nw = 0, nout = 0;
    gstate s = e->states[sid];
    bool taken = false;
    for (uint32_t i = 0; i < s.n; i++) {
        int32_t id = e->pool[s.off + i];
        if (!id)
            continue;
        gnode nd = e->nodes[id];
        if (g->el[nd.pos].type != GE_TOKEN || !tok_takes(e, g->el[nd.pos].v, t))
            continue;
        taken = true;
        if (push_work(e, &nw, intern_node(e, nd.pos + 1, nd.parent)))
            return DEAD;
    }
    if (!taken)
        return bs;
    if (closure(e, nw, &nout))
        return DEAD;
    if (bs >= 0) {
        gstate b = e->states[bs];
        if (gr_grow((void **)&e->outv, &e->cap_out, nout + b.n, sizeof *e->outv)) {
            e->error = TP_ENOMEM;
            return DEAD;
        }
        memcpy(e->outv + nout, e->pool + b.off, b.n * sizeof *e->outv);
        nout += b.n;
    }
    return intern_state(e, nout);
}

/* ---- chains of counted states ----
 * A counted repetition of one class, [^\n]{0,200} or [a-z0-9 ]{0,12},
 * makes a chain of states s_r (r characters of the class may still come)
 * that differ only in r. When every s_r of a chain has its stacks that
 * take a class byte all from one parent (the lowered class: the ASCII set
 * and, if any, every multi-byte character, each followed by the end of its
 * alternative; or the ASCII set alone), the same other stacks (those that take the rest: what may
 * follow the repetition), and the chain ends in a state that takes no
 * class byte, then a token that starts with p characters of the class is
 * allowed in s_r exactly when p <= r and its rest is allowed after the
 * repetition, the same for every r. So the mask of s_r is that of any
 * s_R, R >= r, without the tokens of more than r such characters: a few
 * word operations instead of a walk of the trie for each count. */

#define CHAIN_ANY 0xFFFF
#define CHAIN_MAX 256   /* states of a chain checked at once */

/* Whether element run el[pos..] is mb_seqs[q] followed by the end of its
 * alternative. */
static bool is_mb_seq(const tp_grammar *g, size_t pos, int q)
{
    for (int k = 0; k < mb_len[q]; k++) {
        gel x = g->el[pos + (size_t)k];
        if (x.type != GE_BYTES)
            return false;
        const uint64_t *set = g->sets[x.v];
        for (unsigned b = 0; b < 256; b++)
            if (gset_has(set, b) != (b >= mb_seqs[q][k][0] && b <= mb_seqs[q][k][1]))
                return false;
    }
    return g->el[pos + (size_t)mb_len[q]].type == GE_END;
}

/* Split state sid's nodes: those that take a class byte (ASCII of a, with
 * mb any lead byte) must be the lowered class with one parent; the others
 * go to rest[] (*n_rest). *empty: no node takes a class byte. False when
 * sid is not a chain state of this class. */
static bool chain_split(tp_gengine *e, int32_t sid, const uint64_t a[2], bool mb, int32_t *rest, uint32_t *n_rest,
                        bool *empty)
{
    const tp_grammar *g = e->g;
    gstate s = e->states[sid];
    int32_t parent = -2;
    bool ascii = false;
    unsigned seen = 0;
    *n_rest = 0;
    for (uint32_t i = 0; i < s.n; i++) {
        int32_t id = e->pool[s.off + i];
        if (id == 0) {
            rest[(*n_rest)++] = id;
            continue;
        }
        gnode nd = e->nodes[id];
        gel el = g->el[nd.pos];
        if (el.type != GE_BYTES)
            return false;   /* a token reference: not worth it */
        const uint64_t *set = g->sets[el.v];
        bool lead = mb && (set[3] & 0x001FFFFFFFFFFFFCull) != 0;   /* a byte of 0xC2..0xF4 */
        if (!(set[0] & a[0]) && !(set[1] & a[1]) && !lead) {
            rest[(*n_rest)++] = id;
            continue;
        }
        if (parent != -2 && nd.parent != parent)
            return false;
        parent = nd.parent;
        if (set[0] | set[1]) {
            /* with multi-byte characters all must end their alternatives
             * (pop to the one parent); alone, the ASCII set may go on */
            if (ascii || set[0] != a[0] || set[1] != a[1] || set[2] || set[3] ||
                (mb && g->el[nd.pos + 1].type != GE_END))
                return false;
            ascii = true;
            continue;
        }
        int q = 0;
        while (q < 8 && !gset_has(set, mb_seqs[q][0][0]))
            q++;
        if (q == 8 || (seen >> q) & 1 || !is_mb_seq(g, (size_t)nd.pos, q))
            return false;
        seen |= 1u << q;
    }
    *empty = parent == -2;
    return *empty || (ascii && (!mb || seen == 0xFF));
}

/* After a walk of head's mask: if head starts a chain over the class of
 * slice k (sl), mark the chain's states with head and their room. */
static void register_chain(tp_gengine *e, int32_t head, int k, const gslice *sl)
{
    if (e->states[head].chain_head >= 0)
        return;
    gstate h = e->states[head];
    int32_t *r0 = malloc(2 * (h.n + 1) * sizeof *r0);
    int32_t *chain = malloc((CHAIN_MAX + 1) * sizeof *chain);
    if (!r0 || !chain) {
        free(r0), free(chain);
        return;
    }
    int32_t *r1 = r0 + h.n + 1;
    uint32_t n0, n1;
    bool empty;
    unsigned first = 0;
    while (!((sl->ascii[first >> 6] >> (first & 63)) & 1))
        first++;
    if (!chain_split(e, head, sl->ascii, sl->mb, r0, &n0, &empty) || empty) {
        free(r0), free(chain);
        return;
    }
    int len = 0;
    bool ended = false;
    chain[0] = head;
    while (len < CHAIN_MAX) {
        int32_t next = step(e, chain[len], first);
        e->error = 0;
        if (next < 0 || next == chain[len])
            break;   /* a loop is no chain (its mask is one state's anyway) */
        gstate ns = e->states[next];
        if (ns.n > h.n + 1 || !chain_split(e, next, sl->ascii, sl->mb, r1, &n1, &empty) || n1 != n0 ||
            memcmp(r0, r1, n0 * sizeof *r0))
            break;
        chain[++len] = next;
        if (empty) {
            ended = true;
            break;
        }
    }
    /* without a known end, only the states from which no token reaches
     * past the part seen */
    int upto = ended ? len : len - 1 - sl->max_pre;
    for (int j = 1; j <= upto; j++) {
        gstate *c = &e->states[chain[j]];
        if (c->chain_head >= 0)
            continue;
        c->chain_head = head;
        c->chain_slice = (int8_t)k;
        c->chain_room = ended ? (uint16_t)(len - j) : CHAIN_ANY;
    }
    if (upto > 0) {
        gstate *c = &e->states[head];
        c->chain_head = head;
        c->chain_slice = (int8_t)k;
        c->chain_room = ended ? (uint16_t)len : CHAIN_ANY;
    }
    free(r0), free(chain);
}

/* The mask of chain state sid from a cached one of its chain (the head, or
 * the last state derived, when it has room for at least as much): 0, or -1
 * when none is cached. */
static int derive_mask(tp_gengine *e, int32_t sid, uint64_t *mask)
{
    gstate s = e->states[sid];
    int32_t hd = s.chain_head;
    int32_t src = e->states[hd].chain_last;
    if (src < 0 || !e->states[src].mask || e->states[src].chain_head != hd || e->states[src].chain_room < s.chain_room)
        src = hd;
    if (!e->states[src].mask)
        return -1;
    size_t words = tp_gmask_words(e->v->n);
    memcpy(mask, e->states[src].mask, words * sizeof *mask);
    unsigned from = s.chain_room, to = e->states[src].chain_room;
    if (from != CHAIN_ANY && from < to) {
        const gslice *sl = &e->v->sc->s[s.chain_slice];
        for (uint32_t i = sl->pre_off[from + 1]; i < sl->pre_off[to + 1 < PRE_MORE + 1 ? to + 1 : PRE_MORE + 1]; i++) {
            int32_t t = sl->by_pre[i];
            mask[t >> 6] &= ~(1ull << (t & 63));
        }
    }
    e->states[hd].chain_last = sid;
    return 0;
}

/* The token mask of state sid, by one preorder walk of the trie. */
static int build_mask(tp_gengine *e, int32_t sid, uint64_t *mask)
{
    const tp_gvocab *v = e->v;
    size_t words = tp_gmask_words(v->n);
    int room = 0;
    const gslice *sl = slice_of(e, sid, &room);
    if (sl)
        memcpy(mask, sl->by_len[room], words * sizeof *mask);
    else
        memset(mask, 0, words * sizeof *mask);
    const uint8_t *maxc = sl ? sl->maxc : NULL;
    const tnode *nodes = v->nodes;
    int32_t *st = e->walk;
    st[0] = sid;
    for (size_t i = 0; i < v->n_nodes;) {
        const tnode *nd = &nodes[i];
        /* every token below is in the slice and short enough: all set */
        if (maxc && maxc[i] <= room) {
            i += nd->skip;
            continue;
        }
        int32_t s = step(e, st[nd->depth - 1], nd->byte);
        if (s < 0) {
            if (e->error)
                return e->error;
            i += nd->skip;
            continue;
        }
        st[nd->depth] = s;
        for (int32_t t = nd->tok; t >= 0; t = v->next_same[t])
            mask[t >> 6] |= 1ull << (t & 63);
        i++;
    }
    /* end-of-generation ids: exactly when the grammar accepts (or names one) */
    for (int i = 0; i < v->n_eog; i++) {
        int32_t t = v->eog_ids[i];
        if (e->states[sid].accepting)
            mask[t >> 6] |= 1ull << (t & 63);
        else
            mask[t >> 6] &= ~(1ull << (t & 63));
    }
    if (e->states[sid].tok)
        token_tops_mask(e, sid, mask);
    if (sl)
        register_chain(e, sid, (int)(sl - e->v->sc->s), sl);
    return 0;
}

/* ---- matcher ---- */

struct tp_gmatch {
    tp_gengine *e;
    int32_t state;
    bool finished;        /* an end-of-generation token was taken */
    size_t n_accepted;
};

int tp_gmatch_new(tp_gengine *e, tp_gmatch **out, tp_err *err)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return tp_err_set(err, TP_ENOMEM, "grammar matcher: out of memory");
    (*out)->e = e;
    (*out)->state = e->start;
    return 0;
}

void tp_gmatch_free(tp_gmatch *m) { free(m); }

tp_gengine *tp_gmatch_engine(const tp_gmatch *m) { return m->e; }

tp_gmatch *tp_gmatch_clone(const tp_gmatch *m)
{
    tp_gmatch *c = malloc(sizeof *c);
    if (c)
        *c = *m;
    return c;
}

int tp_gmatch_mask(tp_gmatch *m, uint64_t *mask, tp_err *err)
{
    tp_gengine *e = m->e;
    size_t words = tp_gmask_words(e->v->n);
    if (m->finished) {
        memset(mask, 0, words * sizeof *mask);
        return 0;
    }
    gstate *s = &e->states[m->state];
    if (s->mask) {
        memcpy(mask, s->mask, words * sizeof *mask);
        return 0;
    }
    int rc = s->chain_head >= 0 && s->chain_head != m->state && !derive_mask(e, m->state, mask)
                 ? 0
                 : build_mask(e, m->state, mask);
    if (rc) {
        e->error = 0;
        return tp_err_set(err, rc, rc == TP_ERANGE ? "grammar: the parser state limit was reached "
                                                     "(grammar too ambiguous or nested too deep)"
                                                   : "grammar: out of memory");
    }
    size_t bytes = words * sizeof *mask;
    if (e->mask_bytes + bytes > e->lim.mask_bytes)
        drop_masks(e);
    s = &e->states[m->state];
    if (bytes <= e->lim.mask_bytes && (s->mask = malloc(bytes))) {
        memcpy(s->mask, mask, bytes);
        e->mask_bytes += bytes;
    }
    return 0;
}

static void apply_words(const uint64_t *mask, const float *logits, float *out, int vocab, int w0)
{
    for (int w = w0; w * 64 < vocab; w++) {
        uint64_t m = mask[w];
        int base = w * 64, n = vocab - base < 64 ? vocab - base : 64;
        if (m == ~0ull && n == 64) {
            memcpy(out + base, logits + base, 64 * sizeof *out);
            continue;
        }
        for (int k = 0; k < n; k++)
            out[base + k] = (m >> k) & 1 ? logits[base + k] : -INFINITY;
    }
}

/* Eight lanes at a time: a 151k-token row is rewritten for every
 * constrained token, so this is most of what a warm mask costs. */
__attribute__((target("avx2"))) static void apply_avx2(const uint64_t *mask, const float *logits, float *out,
                                                       int vocab)
{
    const __m256i bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    int full = vocab / 64;
    for (int w = 0; w < full; w++) {
        uint64_t m = mask[w];
        const float *l = logits + (size_t)w * 64;
        float *o = out + (size_t)w * 64;
        if (m == ~0ull) {
            memcpy(o, l, 64 * sizeof *o);
            continue;
        }
        for (int g = 0; g < 8; g++) {
            __m256i b = _mm256_set1_epi32((int)((m >> (8 * g)) & 0xFF));
            __m256 sel = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(b, bits), bits));
            _mm256_storeu_ps(o + 8 * g, _mm256_blendv_ps(ninf, _mm256_loadu_ps(l + 8 * g), sel));
        }
    }
    apply_words(mask, logits, out, vocab, full);
}

void tp_grammar_apply_mask(const uint64_t *mask, const float *logits, float *out, int vocab)
{
    if (tp_isa_active() >= TP_ISA_AVX2)
        apply_avx2(mask, logits, out, vocab);
    else
        apply_words(mask, logits, out, vocab, 0);
}

/* The state after bytes b[0, n) from sid; DEAD if refused. */
static int32_t walk_bytes(tp_gengine *e, int32_t sid, const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n && sid >= 0; i++)
        sid = step(e, sid, b[i]);
    return sid;
}

bool tp_gmatch_allows(tp_gmatch *m, int32_t token)
{
    const tp_gvocab *v = m->e->v;
    if (m->finished || token < 0 || token >= v->n)
        return false;
    const gstate *s = &m->e->states[m->state];
    for (uint32_t i = 0; s->tok && i < s->n; i++) {
        int32_t id = m->e->pool[s->off + i];
        gel el = id ? m->e->g->el[m->e->nodes[id].pos] : (gel){GE_END, 0};
        if (el.type == GE_TOKEN && tok_takes(m->e, el.v, token))
            return true;
    }
    if (tp_gvocab_is_eog(v, token))
        return m->e->states[m->state].accepting;
    size_t n;
    const uint8_t *b = tp_gvocab_bytes(v, token, &n);
    if (!n)
        return false;
    bool ok = walk_bytes(m->e, m->state, b, n) >= 0;
    m->e->error = 0;
    return ok;
}

int tp_gmatch_accept(tp_gmatch *m, int32_t token, tp_err *err)
{
    const tp_gvocab *v = m->e->v;
    if (m->finished)
        return tp_err_set(err, TP_EINVAL, "grammar: token %d after the end of the grammar", token);
    if (token < 0 || token >= v->n)
        return tp_err_set(err, TP_EINVAL, "grammar: token %d is outside the vocabulary", token);
    if (m->e->states[m->state].tok) {
        size_t n;
        const uint8_t *b = tp_gvocab_bytes(v, token, &n);
        int32_t bs = n && !tp_gvocab_is_eog(v, token) ? walk_bytes(m->e, m->state, b, n) : DEAD;
        int32_t s = m->e->error ? DEAD : token_trans(m->e, m->state, token, bs);
        if (m->e->error) {
            int rc = m->e->error;
            m->e->error = 0;
            return tp_err_set(err, rc, rc == TP_ERANGE ? "grammar: the parser state limit was reached"
                                                       : "grammar: out of memory");
        }
        if (s >= 0) {
            m->state = s;
            m->n_accepted++;
            return 0;
        }
    }
    if (tp_gvocab_is_eog(v, token)) {
        if (!m->e->states[m->state].accepting)
            return tp_err_set(err, TP_EINVAL, "grammar: end-of-generation token %d before the grammar is complete",
                              token);
        m->finished = true;
        m->n_accepted++;
        return 0;
    }
    size_t n;
    const uint8_t *b = tp_gvocab_bytes(v, token, &n);
    int32_t s = n ? walk_bytes(m->e, m->state, b, n) : DEAD;
    if (s < 0) {
        int rc = m->e->error;
        m->e->error = 0;
        if (rc == TP_ERANGE)
            return tp_err_set(err, rc, "grammar: the parser state limit was reached");
        return tp_err_set(err, TP_EINVAL, "grammar: token %d is not allowed here", token);
    }
    m->state = s;
    m->n_accepted++;
    return 0;
}

int tp_gmatch_accept_bytes(tp_gmatch *m, const uint8_t *b, size_t n, tp_err *err)
{
    if (m->finished)
        return tp_err_set(err, TP_EINVAL, "grammar: text after the end of the grammar");
    int32_t s = walk_bytes(m->e, m->state, b, n);
    if (s < 0) {
        m->e->error = 0;
        return tp_err_set(err, TP_EINVAL, "grammar: the text leaves the grammar");
    }
    m->state = s;
    return 0;
}

bool tp_gmatch_accepting(const tp_gmatch *m) { return m->finished || m->e->states[m->state].accepting; }

bool tp_gmatch_done(const tp_gmatch *m) { return m->finished || m->e->states[m->state].done; }

size_t tp_gmatch_n_accepted(const tp_gmatch *m) { return m->n_accepted; }

size_t tp_gmatch_memory(const tp_gmatch *m) { return sizeof *m; }

bool tp_gmatch_complete(const tp_gmatch *m, const uint8_t *text, size_t len, bool cut)
{
    if (m->e->g->n_toks)
        return !cut && tp_gmatch_accepting(m);
    tp_gmatch *c = NULL;
    bool whole = !tp_gmatch_new(m->e, &c, NULL) && !tp_gmatch_accept_bytes(c, text, len, NULL) &&
                 tp_gmatch_accepting(c);
    tp_gmatch_free(c);
    return whole;
}
