#include "gbnf_bt.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { N_SEQ, N_ALT, N_LIT, N_CLS, N_REF, N_REP };

typedef struct node {
    int kind;
    struct node **kid;
    int nk;
    uint32_t *cp; /* N_LIT: code points; N_CLS: ranges lo,hi pairs */
    int ncp;
    bool neg;
    int ref;         /* N_REF: rule index */
    long min, max;   /* N_REP; max < 0 unbounded */
} node;

typedef struct rule {
    char name[128];
    node *body;
} rule;

struct gbt {
    rule *r;
    int nr;
    const char *s; /* parse position */
    uint32_t *text;
    size_t n;
    long steps;
    bool out_of_steps;
    bool bad;
};

static node *mk(int kind)
{
    node *x = calloc(1, sizeof *x);
    if (x) x->kind = kind;
    return x;
}

static void add_kid(node *p, node *k)
{
    p->kid = realloc(p->kid, (size_t)(p->nk + 1) * sizeof *p->kid);
    p->kid[p->nk++] = k;
}

static void add_cp(node *p, uint32_t c)
{
    p->cp = realloc(p->cp, (size_t)(p->ncp + 1) * sizeof *p->cp);
    p->cp[p->ncp++] = c;
}

static void free_node(node *x)
{
    if (!x) return;
    for (int i = 0; i < x->nk; i++) free_node(x->kid[i]);
    free(x->kid);
    free(x->cp);
    free(x);
}

static void skip(gbt *g, bool newlines)
{
    for (;;) {
        if (*g->s == '#') {
            while (*g->s && *g->s != '\n') g->s++;
        } else if (*g->s == ' ' || *g->s == '\t' || *g->s == '\r' || (newlines && *g->s == '\n')) {
            g->s++;
        } else {
            return;
        }
    }
}

static bool namech(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static int rule_index(gbt *g, const char *name, size_t len)
{
    for (int i = 0; i < g->nr; i++)
        if (strlen(g->r[i].name) == len && !strncmp(g->r[i].name, name, len)) return i;
    if (len >= sizeof g->r[0].name) return -1;
    g->r = realloc(g->r, (size_t)(g->nr + 1) * sizeof *g->r);
    memset(&g->r[g->nr], 0, sizeof g->r[0]);
    memcpy(g->r[g->nr].name, name, len);
    return g->nr++;
}

static int hexv(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static int dec_utf8(const unsigned char *s, uint32_t *c)
{
    if (s[0] < 0x80) return *c = s[0], 1;
    int n = s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC0 ? 2 : 0;
    if (!n) return 0;
    uint32_t v = s[0] & (0x7F >> n);
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = v << 6 | (s[i] & 0x3F);
    }
    *c = v;
    return n;
}

/* one character of a literal or class, escapes decoded */
static bool parse_char(gbt *g, uint32_t *c)
{
    if (*g->s == '\\') {
        g->s++;
        char e = *g->s++;
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (digits) {
            uint32_t v = 0;
            for (int i = 0; i < digits; i++) {
                int h = hexv(*g->s++);
                if (h < 0) return false;
                v = v * 16 + (uint32_t)h;
            }
            *c = v;
            return true;
        }
        switch (e) {
        case 'n': *c = '\n'; return true;
        case 't': *c = '\t'; return true;
        case 'r': *c = '\r'; return true;
        case '\\': case '"': case '[': case ']': *c = (unsigned char)e; return true;
        default: return false;
        }
    }
    int k = dec_utf8((const unsigned char *)g->s, c);
    if (!k || !*g->s) return false;
    g->s += k;
    return true;
}

static node *parse_alts(gbt *g, bool nested);

static bool parse_num(gbt *g, long *v)
{
    if (*g->s < '0' || *g->s > '9') return false;
    *v = strtol(g->s, (char **)&g->s, 10);
    return true;
}

static node *parse_seq(gbt *g, bool nested)
{
    node *seq = mk(N_SEQ);
    for (;;) {
        skip(g, nested);
        node *a = NULL;
        char c = *g->s;
        if (c == '"') {
            g->s++;
            a = mk(N_LIT);
            while (*g->s && *g->s != '"') {
                uint32_t cp;
                if (!parse_char(g, &cp)) goto bad;
                add_cp(a, cp);
            }
            if (*g->s++ != '"') goto bad;
        } else if (c == '[') {
            g->s++;
            a = mk(N_CLS);
            if (*g->s == '^') a->neg = true, g->s++;
            while (*g->s && *g->s != ']') {
                uint32_t lo, hi;
                if (!parse_char(g, &lo)) goto bad;
                hi = lo;
                if (*g->s == '-' && g->s[1] != ']') {
                    g->s++;
                    if (!parse_char(g, &hi)) goto bad;
                }
                add_cp(a, lo);
                add_cp(a, hi);
            }
            if (*g->s++ != ']') goto bad;
        } else if (c == '(') {
            g->s++;
            a = parse_alts(g, true);
            if (!a) goto bad;
            skip(g, true);
            if (*g->s++ != ')') {
                free_node(a);
                goto bad;
            }
        } else if (namech(c)) {
            const char *b = g->s;
            while (namech(*g->s)) g->s++;
            const char *e = g->s;
            skip(g, false);
            if (!strncmp(g->s, "::=", 3)) { /* the next rule begins */
                g->s = b;
                return seq;
            }
            a = mk(N_REF);
            a->ref = rule_index(g, b, (size_t)(e - b));
        } else {
            return seq;
        }
        /* quantifiers */
        skip(g, false);
        long mn = -1, mx = -1;
        if (*g->s == '*') mn = 0, mx = -1, g->s++;
        else if (*g->s == '+') mn = 1, mx = -1, g->s++;
        else if (*g->s == '?') mn = 0, mx = 1, g->s++;
        else if (*g->s == '{') {
            g->s++;
            if (!parse_num(g, &mn)) goto badq;
            mx = mn;
            if (*g->s == ',') {
                g->s++;
                mx = -1;
                if (*g->s != '}' && !parse_num(g, &mx)) goto badq;
            }
            if (*g->s++ != '}') goto badq;
        }
        if (mn >= 0) {
            node *r = mk(N_REP);
            r->min = mn;
            r->max = mx;
            add_kid(r, a);
            a = r;
        }
        add_kid(seq, a);
        continue;
    badq:
        free_node(a);
    bad:
        free_node(seq);
        return NULL;
    }
}

static node *parse_alts(gbt *g, bool nested)
{
    node *alt = mk(N_ALT);
    for (;;) {
        node *s = parse_seq(g, nested);
        if (!s) {
            free_node(alt);
            return NULL;
        }
        add_kid(alt, s);
        skip(g, nested);
        if (*g->s != '|') return alt;
        g->s++;
        skip(g, true);
    }
}

gbt *gbt_new(const char *text, const char **why)
{
    gbt *g = calloc(1, sizeof *g);
    const char *w = NULL;
    g->s = text;
    for (;;) {
        skip(g, true);
        if (!*g->s) break;
        const char *b = g->s;
        while (namech(*g->s)) g->s++;
        const char *e = g->s;
        skip(g, false);
        if (e == b || strncmp(g->s, "::=", 3)) {
            w = "expected 'name ::='";
            goto bad;
        }
        g->s += 3;
        int i = rule_index(g, b, (size_t)(e - b));
        if (i < 0 || g->r[i].body) {
            w = "rule defined twice";
            goto bad;
        }
        node *body = parse_alts(g, false);
        if (!body) {
            w = "syntax error";
            goto bad;
        }
        g->r[i].body = body;
    }
    for (int i = 0; i < g->nr; i++)
        if (!g->r[i].body) {
            w = "undefined rule";
            goto bad;
        }
    bool root = false;
    for (int i = 0; i < g->nr; i++) root = root || !strcmp(g->r[i].name, "root");
    if (!root) {
        w = "no root";
        goto bad;
    }
    return g;
bad:
    if (why) *why = w;
    gbt_free(g);
    return NULL;
}

void gbt_free(gbt *g)
{
    if (!g) return;
    for (int i = 0; i < g->nr; i++) free_node(g->r[i].body);
    free(g->r);
    free(g);
}

/* continuation: match the rest of frame `n` (a sequence from index i, or a
 * repetition after `count` rounds that began at `start`), then `next` */
typedef struct K {
    const node *n;
    long i;
    size_t start;
    const struct K *next;
} K;

#define STEP_BUDGET 50000000L

static bool m(gbt *g, const node *x, size_t pos, const K *k);

static bool run(gbt *g, size_t pos, const K *k)
{
    if (!k) return pos == g->n;
    const node *x = k->n;
    if (x->kind == N_SEQ) {
        if (k->i == x->nk) return run(g, pos, k->next);
        K f = {x, k->i + 1, 0, k->next};
        return m(g, x->kid[k->i], pos, &f);
    }
    /* N_REP after k->i rounds, the last one begun at k->start */
    if (k->i >= x->min && run(g, pos, k->next)) return true;
    if (x->max >= 0 && k->i >= x->max) return false;
    if (k->i >= x->min && k->i > 0 && pos == k->start) return false; /* an empty round adds nothing */
    K f = {x, k->i + 1, pos, k->next};
    return m(g, x->kid[0], pos, &f);
}

static bool m(gbt *g, const node *x, size_t pos, const K *k)
{
    if (++g->steps > STEP_BUDGET) {
        g->out_of_steps = true;
        return false;
    }
    switch (x->kind) {
    case N_LIT:
        for (int i = 0; i < x->ncp; i++)
            if (pos + (size_t)i >= g->n || g->text[pos + (size_t)i] != x->cp[i]) return false;
        return run(g, pos + (size_t)x->ncp, k);
    case N_CLS: {
        if (pos >= g->n) return false;
        bool in = false;
        for (int i = 0; i + 1 < x->ncp; i += 2) in = in || (g->text[pos] >= x->cp[i] && g->text[pos] <= x->cp[i + 1]);
        if (in == x->neg) return false;
        return run(g, pos + 1, k);
    }
    case N_REF: return m(g, g->r[x->ref].body, pos, k);
    case N_ALT:
        for (int i = 0; i < x->nk; i++)
            if (m(g, x->kid[i], pos, k)) return true;
        return false;
    case N_SEQ: {
        K f = {x, 0, 0, k};
        return run(g, pos, &f);
    }
    default: { /* N_REP: -1 so that the first round does not look empty */
        K f = {x, 0, (size_t)-1, k};
        return run(g, pos, &f);
    }
    }
}

static void *match_root(void *arg)
{
    gbt *g = arg;
    int root = rule_index(g, "root", 4);
    return m(g, g->r[root].body, 0, NULL) ? arg : NULL;
}

int gbt_match(gbt *g, const char *text, size_t n)
{
    uint32_t *t = malloc((n + 1) * sizeof *t);
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        int l = dec_utf8((const unsigned char *)text + i, &t[k]);
        if (!l || i + (size_t)l > n) {
            free(t);
            return -1;
        }
        i += (size_t)l;
        k++;
    }
    g->text = t;
    g->n = k;
    g->steps = 0;
    g->out_of_steps = false;
    /* the matcher recurses a few frames per character: run it on a thread
     * with a large stack (reserved, not committed) so long texts fit, also
     * under ASan's bigger frames */
    pthread_attr_t at;
    pthread_t th;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, (size_t)1 << 30);
    bool ok = false;
    if (pthread_create(&th, &at, match_root, g) == 0) {
        void *r;
        pthread_join(th, &r);
        ok = r != NULL;
    } else {
        g->out_of_steps = true;
    }
    pthread_attr_destroy(&at);
    free(t);
    g->text = NULL;
    if (g->out_of_steps) return -1;
    return ok;
}
