/* A stage's grammars (grammar.h, tp_gcache): the lazily built vocabulary
 * index and the engines, keyed by grammar text. */
#include <stdlib.h>
#include <string.h>

#include "tokpipe/grammar.h"
#include "tokpipe/tokenizer.h"

typedef struct gentry {
    char *text;
    size_t len;
    uint64_t hash;
    tp_grammar *g;
    tp_gengine *e;
    int refs;
    uint64_t last_use;
} gentry;

struct tp_gcache {
    const tp_tokenizer *tok;
    int *eog;
    int n_eog;
    tp_grammar_limits gl;
    tp_gengine_limits el;
    tp_gvocab *v;
    gentry **ents;
    int n_max;
    uint64_t clock;
};

int tp_gcache_new(const tp_tokenizer *tok, const int *eog, int n_eog, const tp_grammar_limits *gl,
                  const tp_gengine_limits *el, int max_grammars, tp_gcache **out, tp_err *err)
{
    tp_gcache *c = calloc(1, sizeof *c);
    if (c) {
        c->ents = calloc((size_t)(max_grammars > 0 ? max_grammars : 1), sizeof *c->ents);
        c->eog = malloc((size_t)(n_eog > 0 ? n_eog : 1) * sizeof *c->eog);
    }
    if (!c || !c->ents || !c->eog) {
        tp_gcache_free(c);
        return tp_err_set(err, TP_ENOMEM, "grammars: out of memory");
    }
    c->tok = tok;
    if (n_eog > 0)
        memcpy(c->eog, eog, (size_t)n_eog * sizeof *eog);
    c->n_eog = n_eog > 0 ? n_eog : 0;
    c->n_max = max_grammars > 0 ? max_grammars : 1;
    if (gl)
        c->gl = *gl;
    else
        tp_grammar_limits_default(&c->gl);
    if (el)
        c->el = *el;
    else
        tp_gengine_limits_default(&c->el);
    *out = c;
    return 0;
}

static void entry_free(gentry *g)
{
    if (!g)
        return;
    tp_gengine_free(g->e);
    tp_grammar_free(g->g);
    free(g->text);
    free(g);
}

void tp_gcache_free(tp_gcache *c)
{
    if (!c)
        return;
    for (int i = 0; c->ents && i < c->n_max; i++)
        entry_free(c->ents[i]);
    free(c->ents);
    free(c->eog);
    tp_gvocab_free(c->v);
    free(c);
}

int tp_gcache_vocab_size(const tp_gcache *c) { return c->v ? tp_gvocab_size(c->v) : 0; }

static uint64_t text_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;   /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static int entry_for(tp_gcache *c, const char *text, size_t len, gentry **out, tp_err *err)
{
    if (!c->tok)
        return tp_err_set(err, TP_EINVAL, "grammar: this worker has no vocabulary to apply grammars with");
    int rc;
    if (!c->v && (rc = tp_gvocab_from_tokenizer(c->tok, c->eog, c->n_eog, &c->v, err)))
        return rc;
    uint64_t h = text_hash(text, len);
    int free_at = -1, lru = -1;
    for (int i = 0; i < c->n_max; i++) {
        gentry *g = c->ents[i];
        if (!g) {
            if (free_at < 0)
                free_at = i;
        } else if (g->hash == h && g->len == len && !memcmp(g->text, text, len)) {
            *out = g;
            return 0;
        } else if (!g->refs && (lru < 0 || g->last_use < c->ents[lru]->last_use))
            lru = i;
    }
    if (free_at < 0 && lru < 0)
        return tp_err_set(err, TP_ERANGE, "grammar: %d different grammars are in use, the most a worker keeps",
                          c->n_max);
    gentry *g = calloc(1, sizeof *g);
    if (!g || !(g->text = malloc(len ? len : 1))) {
        free(g);
        return tp_err_set(err, TP_ENOMEM, "grammar: out of memory");
    }
    memcpy(g->text, text, len);
    g->len = len;
    g->hash = h;
    if ((rc = tp_grammar_compile(text, len, &c->gl, &g->g, err)) || (rc = tp_gengine_new(g->g, c->v, &c->el, &g->e, err))) {
        entry_free(g);
        return rc;
    }
    if (free_at < 0) {
        entry_free(c->ents[lru]);
        free_at = lru;
    }
    c->ents[free_at] = g;
    *out = g;
    return 0;
}

int tp_gcache_matcher(tp_gcache *c, const char *text, size_t len, tp_gmatch **out, tp_err *err)
{
    *out = NULL;
    gentry *g = NULL;
    int rc = entry_for(c, text, len, &g, err);
    if (rc || (rc = tp_gmatch_new(g->e, out, err)))
        return rc;
    g->refs++;
    g->last_use = ++c->clock;
    return 0;
}

void tp_gcache_release(tp_gcache *c, tp_gmatch *m)
{
    if (!m)
        return;
    for (int i = 0; i < c->n_max; i++)
        if (c->ents[i] && c->ents[i]->e == tp_gmatch_engine(m)) {
            c->ents[i]->refs--;
            break;
        }
    tp_gmatch_free(m);
}
