/* Chat templates, part 2: tokens -> parse tree, by Jinja's grammar and
 * operator precedence. Statements, filters and tests outside the subset are
 * refused here, naming the construct and its line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_internal.h"

typedef struct parser {
    tp_chat_tok *t;
    size_t n, i;
    tp_chat_arena *arena;
    tp_err *err;
    int depth;
    int in_loop;
    int failed;
} parser;

/* Filters, tests and the statements the renderer implements: anything else
 * is refused at parse time. */
static const char *const FILTERS[] = {
    "abs", "capitalize", "count", "d", "default", "dictsort", "e", "escape", "first", "float", "indent", "int",
    "items", "join", "last", "length", "list", "lower", "map", "reject", "rejectattr", "replace",
    "reverse", "safe", "select", "selectattr", "string", "tojson", "trim", "unique", "upper", NULL,
};
static const char *const TESTS[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "even", "false",
    "float", "ge", "greaterthan", "gt", "in", "integer", "iterable", "le", "lessthan", "lower",
    "lt", "mapping", "ne", "none", "number", "odd", "sameas", "sequence", "string", "true",
    "undefined", "upper", "==", "!=", "<", "<=", ">", ">=", NULL,
};

int tp_chat_known_filter(const char *name)
{
    for (int k = 0; FILTERS[k]; k++)
        if (!strcmp(FILTERS[k], name))
            return 1;
    return 0;
}

int tp_chat_known_test(const char *name)
{
    for (int k = 0; TESTS[k]; k++)
        if (!strcmp(TESTS[k], name))
            return 1;
    return 0;
}

static tp_chat_tok *cur(parser *p)
{
    return &p->t[p->i];
}

static int fail(parser *p, int code, int line, const char *fmt, const char *arg)
{
    if (!p->failed) {
        char what[256];
        snprintf(what, sizeof what, fmt, arg ? arg : "");
        tp_err_set(p->err, code, "chat template line %d: %s", line, what);
        p->failed = 1;
    }
    return code;
}

static void *nalloc(parser *p, size_t n)
{
    void *x = tp_chat_alloc(p->arena, n);
    if (!x && !p->failed) {
        tp_err_set(p->err, TP_ENOMEM, "chat template: out of memory");
        p->failed = 1;
    }
    return x;
}

static char *dupn(parser *p, const char *s, size_t n)
{
    char *o = nalloc(p, n + 1);
    if (o)
        memcpy(o, s, n);
    return o;
}

static tp_chat_node *node(parser *p, int kind, int line)
{
    tp_chat_node *x = nalloc(p, sizeof *x);
    if (x) {
        x->kind = kind;
        x->line = line;
    }
    return x;
}

static int is_op(parser *p, const char *op)
{
    tp_chat_tok *t = cur(p);
    return t->kind == TK_OP && !strcmp(t->op, op);
}

static int is_name(parser *p, const char *nm)
{
    tp_chat_tok *t = cur(p);
    return t->kind == TK_NAME && t->n == strlen(nm) && !memcmp(t->s, nm, t->n);
}

static int expect_op(parser *p, const char *op)
{
    if (!is_op(p, op))
        return fail(p, TP_EFORMAT, cur(p)->line, "expected '%s'", op);
    p->i++;
    return 0;
}

/* Growable node list in the arena (copied on growth; the arena is freed whole). */
typedef struct nlist {
    tp_chat_node **v;
    size_t n, cap;
} nlist;

static int nl_push(parser *p, nlist *l, tp_chat_node *x)
{
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4;
        tp_chat_node **nv = nalloc(p, nc * sizeof *nv);
        if (!nv)
            return TP_ENOMEM;
        if (l->n)
            memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = x;
    return 0;
}

typedef struct slist {
    const char **v;
    size_t n, cap;
} slist;

static int sl_push(parser *p, slist *l, const char *s)
{
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4;
        const char **nv = nalloc(p, nc * sizeof *nv);
        if (!nv)
            return TP_ENOMEM;
        if (l->n)
            memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = s;
    return 0;
}

static tp_chat_node *parse_expr(parser *p, int with_cond);
static tp_chat_node *parse_unary(parser *p, int with_filter);
static tp_chat_node *parse_or(parser *p);

static tp_chat_val *mkval(parser *p, int type)
{
    tp_chat_val *v = nalloc(p, sizeof *v);
    if (v)
        v->type = type;
    return v;
}

static tp_chat_node *lit_node(parser *p, int line, tp_chat_val *v)
{
    tp_chat_node *x = node(p, N_LIT, line);
    if (x)
        x->lit = v;
    return v ? x : NULL;
}

/* (args, kw=args) after the "(" has been consumed. */
static int parse_call_args(parser *p, tp_chat_node *x)
{
    nlist pos = {0}, kwv = {0};
    slist kwn = {0};
    while (!is_op(p, ")")) {
        if (pos.n + kwv.n > 0 && expect_op(p, ","))
            return TP_EFORMAT;
        if (is_op(p, ")"))
            break;
        if (is_op(p, "*") || is_op(p, "**"))
            return fail(p, TP_EINVAL, cur(p)->line, "unsupported construct: *args / **kwargs in a call%s", NULL);
        if (cur(p)->kind == TK_NAME && p->t[p->i + 1].kind == TK_OP && !strcmp(p->t[p->i + 1].op, "=")) {
            const char *nm = dupn(p, cur(p)->s, cur(p)->n);
            p->i += 2;
            tp_chat_node *v = parse_expr(p, 1);
            if (!v || !nm || sl_push(p, &kwn, nm) || nl_push(p, &kwv, v))
                return TP_EFORMAT;
        } else {
            if (kwv.n)
                return fail(p, TP_EFORMAT, cur(p)->line, "positional argument after keyword argument%s", NULL);
            tp_chat_node *v = parse_expr(p, 1);
            if (!v || nl_push(p, &pos, v))
                return TP_EFORMAT;
        }
    }
    p->i++;
    for (size_t k = 0; k < kwv.n; k++)
        if (nl_push(p, &pos, kwv.v[k]))
            return TP_ENOMEM;
    x->args = pos.v;
    x->n_args = pos.n;
    x->kw_names = kwn.v;
    x->n_kw = kwn.n;
    return 0;
}

static tp_chat_node *parse_primary(parser *p)
{
    tp_chat_tok *t = cur(p);
    int line = t->line;
    if (t->kind == TK_NAME) {
        p->i++;
        tp_chat_val *v = NULL;
#define NM(lit_) (t->n == strlen(lit_) && !memcmp(t->s, lit_, t->n))
        if (NM("true") || NM("True") || NM("false") || NM("False")) {
            if ((v = mkval(p, V_BOOL)))
                v->b = t->s[0] == 't' || t->s[0] == 'T';
            return lit_node(p, line, v);
        }
        if (NM("none") || NM("None"))
            return lit_node(p, line, mkval(p, V_NONE));
#undef NM
        tp_chat_node *x = node(p, N_NAME, line);
        if (x) {
            x->name = dupn(p, t->s, t->n);
            x->name_len = t->n;
        }
        return x;
    }
    if (t->kind == TK_STRING) {
        /* adjacent literals concatenate, as in Python */
        size_t total = 0, j = p->i;
        while (p->t[j].kind == TK_STRING)
            total += p->t[j++].n;
        char *s = nalloc(p, total + 1);
        tp_chat_val *v = mkval(p, V_STR);
        if (!s || !v)
            return NULL;
        size_t k = 0;
        while (cur(p)->kind == TK_STRING) {
            memcpy(s + k, cur(p)->s, cur(p)->n);
            k += cur(p)->n;
            p->i++;
        }
        v->str.s = s;
        v->str.n = total;
        return lit_node(p, line, v);
    }
    if (t->kind == TK_INT || t->kind == TK_FLOAT) {
        p->i++;
        tp_chat_val *v = mkval(p, t->kind == TK_INT ? V_INT : V_FLOAT);
        if (v) {
            if (t->kind == TK_INT)
                v->i = t->i;
            else
                v->f = t->f;
        }
        return lit_node(p, line, v);
    }
    if (is_op(p, "(")) {
        p->i++;
        if (is_op(p, ")")) {
            p->i++;
            return node(p, N_TUPLE, line);
        }
        tp_chat_node *e = parse_expr(p, 1);
        if (!e)
            return NULL;
        if (is_op(p, ",")) {
            nlist l = {0};
            if (nl_push(p, &l, e))
                return NULL;
            while (is_op(p, ",")) {
                p->i++;
                if (is_op(p, ")"))
                    break;
                tp_chat_node *x = parse_expr(p, 1);
                if (!x || nl_push(p, &l, x))
                    return NULL;
            }
            tp_chat_node *tu = node(p, N_TUPLE, line);
            if (!tu)
                return NULL;
            tu->args = l.v;
            tu->n_args = l.n;
            e = tu;
        }
        if (expect_op(p, ")"))
            return NULL;
        return e;
    }
    if (is_op(p, "[")) {
        p->i++;
        nlist l = {0};
        while (!is_op(p, "]")) {
            if (l.n && expect_op(p, ","))
                return NULL;
            if (is_op(p, "]"))
                break;
            tp_chat_node *x = parse_expr(p, 1);
            if (!x || nl_push(p, &l, x))
                return NULL;
        }
        p->i++;
        tp_chat_node *x = node(p, N_LIST, line);
        if (x) {
            x->args = l.v;
            x->n_args = l.n;
        }
        return x;
    }
    if (is_op(p, "{")) {
        p->i++;
        nlist ks = {0}, vs = {0};
        while (!is_op(p, "}")) {
            if (ks.n && expect_op(p, ","))
                return NULL;
            if (is_op(p, "}"))
                break;
            tp_chat_node *k = parse_expr(p, 1);
            if (!k || expect_op(p, ":"))
                return NULL;
            tp_chat_node *v = parse_expr(p, 1);
            if (!v || nl_push(p, &ks, k) || nl_push(p, &vs, v))
                return NULL;
        }
        p->i++;
        tp_chat_node *x = node(p, N_DICT, line);
        if (x) {
            x->args = ks.v;
            x->vals = vs.v;
            x->n_args = ks.n;
        }
        return x;
    }
    if (t->kind == TK_OP)
        fail(p, TP_EFORMAT, line, "unexpected '%s' in expression", t->op);
    else if (t->kind == TK_EOF)
        fail(p, TP_EFORMAT, line, "unexpected end of template%s", NULL);
    else
        fail(p, TP_EFORMAT, line, "unexpected end of tag%s", NULL);
    return NULL;
}

static tp_chat_node *parse_postfix(parser *p, tp_chat_node *x)
{
    while (x) {
        int line = cur(p)->line;
        if (is_op(p, ".")) {
            p->i++;
            tp_chat_tok *t = cur(p);
            if (t->kind == TK_INT) {
                /* x.0 is x[0] in Jinja */
                tp_chat_node *it = node(p, N_ITEM, line);
                tp_chat_val *v = mkval(p, V_INT);
                if (!it || !v)
                    return NULL;
                v->i = t->i;
                it->a = x;
                it->b = lit_node(p, line, v);
                p->i++;
                x = it;
                continue;
            }
            if (t->kind != TK_NAME) {
                fail(p, TP_EFORMAT, line, "expected an attribute name after '.'%s", NULL);
                return NULL;
            }
            tp_chat_node *at = node(p, N_ATTR, line);
            if (!at)
                return NULL;
            at->a = x;
            at->name = dupn(p, t->s, t->n);
            at->name_len = t->n;
            p->i++;
            x = at;
        } else if (is_op(p, "[")) {
            p->i++;
            tp_chat_node *parts[3] = {0};
            int colons = 0;
            for (;;) {
                if (is_op(p, ":")) {
                    if (++colons > 2) {
                        fail(p, TP_EFORMAT, line, "too many ':' in subscript%s", NULL);
                        return NULL;
                    }
                    p->i++;
                    continue;
                }
                if (is_op(p, "]"))
                    break;
                if (parts[colons]) {
                    fail(p, TP_EFORMAT, line, "expected ']'%s", NULL);
                    return NULL;
                }
                if (!(parts[colons] = parse_expr(p, 1)))
                    return NULL;
            }
            p->i++;
            tp_chat_node *it = node(p, colons ? N_SLICE : N_ITEM, line);
            if (!it)
                return NULL;
            it->a = x;
            if (!colons && !parts[0]) {
                fail(p, TP_EFORMAT, line, "empty subscript%s", NULL);
                return NULL;
            }
            it->b = parts[0];
            it->c = parts[1];
            it->d = parts[2];
            x = it;
        } else if (is_op(p, "(")) {
            p->i++;
            tp_chat_node *c = node(p, N_CALL, line);
            if (!c)
                return NULL;
            c->a = x;
            if (parse_call_args(p, c))
                return NULL;
            x = c;
        } else {
            break;
        }
    }
    return x;
}

static const char *dotted_name(parser *p)
{
    tp_chat_tok *t = cur(p);
    if (t->kind != TK_NAME)
        return NULL;
    p->i++;
    if (is_op(p, ".")) {
        fail(p, TP_EINVAL, t->line, "unsupported construct: dotted filter or test name%s", NULL);
        return NULL;
    }
    return dupn(p, t->s, t->n);
}

static tp_chat_node *parse_filter(parser *p, tp_chat_node *x)
{
    int line = cur(p)->line;
    const char *nm = dotted_name(p);
    if (!nm) {
        fail(p, TP_EFORMAT, line, "expected a filter name after '|'%s", NULL);
        return NULL;
    }
    if (!tp_chat_known_filter(nm)) {
        fail(p, TP_EINVAL, line, "unsupported construct: filter '%s'", nm);
        return NULL;
    }
    tp_chat_node *f = node(p, N_FILTER, line);
    if (!f)
        return NULL;
    f->a = x;
    f->name = nm;
    if (is_op(p, "(")) {
        p->i++;
        if (parse_call_args(p, f))
            return NULL;
    }
    return f;
}

static tp_chat_node *parse_filter_expr(parser *p, tp_chat_node *x)
{
    while (x) {
        if (is_op(p, "|")) {
            p->i++;
            x = parse_filter(p, x);
        } else if (is_name(p, "is")) {
            int line = cur(p)->line;
            p->i++;
            tp_chat_node *t = node(p, N_TEST, line);
            if (!t)
                return NULL;
            if (is_name(p, "not")) {
                t->negate = 1;
                p->i++;
            }
            const char *nm;
            tp_chat_tok *tk = cur(p);
            if (tk->kind == TK_OP && (!strcmp(tk->op, "==") || !strcmp(tk->op, "!=") || !strcmp(tk->op, "<") ||
                                      !strcmp(tk->op, "<=") || !strcmp(tk->op, ">") || !strcmp(tk->op, ">="))) {
                nm = dupn(p, tk->op, strlen(tk->op));
                p->i++;
            } else if (tk->kind == TK_NAME && tk->n == 4 && !memcmp(tk->s, "none", 4)) {
                nm = "none";
                p->i++;
            } else if (tk->kind == TK_NAME && ((tk->n == 4 && !memcmp(tk->s, "true", 4)) ||
                                               (tk->n == 5 && !memcmp(tk->s, "false", 5)))) {
                nm = tk->n == 4 ? "true" : "false";
                p->i++;
            } else {
                nm = dotted_name(p);
            }
            if (!nm) {
                fail(p, TP_EFORMAT, line, "expected a test name after 'is'%s", NULL);
                return NULL;
            }
            if (!tp_chat_known_test(nm)) {
                fail(p, TP_EINVAL, line, "unsupported construct: test '%s'", nm);
                return NULL;
            }
            t->name = nm;
            t->a = x;
            tk = cur(p);
            if (is_op(p, "(")) {
                p->i++;
                if (parse_call_args(p, t))
                    return NULL;
            } else if ((tk->kind == TK_NAME || tk->kind == TK_STRING || tk->kind == TK_INT || tk->kind == TK_FLOAT ||
                        is_op(p, "[") || is_op(p, "{")) &&
                       !is_name(p, "else") && !is_name(p, "or") && !is_name(p, "and")) {
                if (is_name(p, "is")) {
                    fail(p, TP_EFORMAT, tk->line, "unexpected 'is'%s", NULL);
                    return NULL;
                }
                tp_chat_node *arg = parse_postfix(p, parse_primary(p));
                if (!arg)
                    return NULL;
                tp_chat_node **a = nalloc(p, sizeof *a);
                if (!a)
                    return NULL;
                a[0] = arg;
                t->args = a;
                t->n_args = 1;
            }
            x = t;
        } else if (is_op(p, "(")) {
            int line = cur(p)->line;
            p->i++;
            tp_chat_node *c = node(p, N_CALL, line);
            if (!c)
                return NULL;
            c->a = x;
            if (parse_call_args(p, c))
                return NULL;
            x = c;
        } else {
            break;
        }
    }
    return x;
}

static tp_chat_node *parse_unary(parser *p, int with_filter)
{
    int line = cur(p)->line;
    if (++p->depth > TP_CHAT_MAX_DEPTH) {
        fail(p, TP_ERANGE, line, "expression nested deeper than %s levels", "64");
        return NULL;
    }
    tp_chat_node *x;
    if (is_op(p, "-") || is_op(p, "+")) {
        int neg = is_op(p, "-");
        p->i++;
        tp_chat_node *u = node(p, neg ? N_NEG : N_POS, line);
        tp_chat_node *a = parse_unary(p, 0);
        if (!u || !a) {
            p->depth--;
            return NULL;
        }
        u->a = a;
        x = u;
    } else {
        x = parse_primary(p);
    }
    x = parse_postfix(p, x);
    if (with_filter)
        x = parse_filter_expr(p, x);
    p->depth--;
    return x;
}

static tp_chat_node *binop(parser *p, int line, const char *op, tp_chat_node *a, tp_chat_node *b)
{
    if (!a || !b)
        return NULL;
    tp_chat_node *x = node(p, N_BIN, line);
    if (x) {
        x->name = op;
        x->a = a;
        x->b = b;
    }
    return x;
}

static tp_chat_node *parse_pow(parser *p)
{
    tp_chat_node *x = parse_unary(p, 1);
    while (x && is_op(p, "**")) {
        int line = cur(p)->line;
        p->i++;
        x = binop(p, line, "**", x, parse_unary(p, 1));
    }
    return x;
}

static tp_chat_node *parse_math2(parser *p)
{
    tp_chat_node *x = parse_pow(p);
    while (x && (is_op(p, "*") || is_op(p, "/") || is_op(p, "//") || is_op(p, "%"))) {
        int line = cur(p)->line;
        const char *op = is_op(p, "*") ? "*" : is_op(p, "/") ? "/" : is_op(p, "//") ? "//" : "%";
        p->i++;
        x = binop(p, line, op, x, parse_pow(p));
    }
    return x;
}

static tp_chat_node *parse_concat(parser *p)
{
    tp_chat_node *x = parse_math2(p);
    while (x && is_op(p, "~")) {
        int line = cur(p)->line;
        p->i++;
        x = binop(p, line, "~", x, parse_math2(p));
    }
    return x;
}

static tp_chat_node *parse_math1(parser *p)
{
    tp_chat_node *x = parse_concat(p);
    while (x && (is_op(p, "+") || is_op(p, "-"))) {
        int line = cur(p)->line;
        const char *op = is_op(p, "+") ? "+" : "-";
        p->i++;
        x = binop(p, line, op, x, parse_concat(p));
    }
    return x;
}

static tp_chat_node *parse_compare(parser *p)
{
    int line = cur(p)->line;
    tp_chat_node *x = parse_math1(p);
    if (!x)
        return NULL;
    nlist vals = {0};
    slist ops = {0};
    for (;;) {
        const char *op = NULL;
        static const char *const CMP[] = {"==", "!=", "<", "<=", ">", ">=", NULL};
        for (int k = 0; CMP[k]; k++)
            if (is_op(p, CMP[k]))
                op = CMP[k];
        if (op) {
            p->i++;
        } else if (is_name(p, "in")) {
            op = "in";
            p->i++;
        } else if (is_name(p, "not") && p->t[p->i + 1].kind == TK_NAME && p->t[p->i + 1].n == 2 &&
                   !memcmp(p->t[p->i + 1].s, "in", 2)) {
            op = "not in";
            p->i += 2;
        } else {
            break;
        }
        tp_chat_node *y = parse_math1(p);
        if (!y || sl_push(p, &ops, op) || nl_push(p, &vals, y))
            return NULL;
    }
    if (!vals.n)
        return x;
    tp_chat_node *c = node(p, N_CMP, line);
    if (!c)
        return NULL;
    c->a = x;
    c->vals = vals.v;
    c->ops = ops.v;
    c->n_args = vals.n;
    return c;
}

static tp_chat_node *parse_not(parser *p)
{
    if (is_name(p, "not")) {
        int line = cur(p)->line;
        p->i++;
        if (++p->depth > TP_CHAT_MAX_DEPTH) {
            fail(p, TP_ERANGE, line, "expression nested deeper than %s levels", "64");
            return NULL;
        }
        tp_chat_node *x = node(p, N_NOT, line);
        tp_chat_node *a = parse_not(p);
        p->depth--;
        if (!x || !a)
            return NULL;
        x->a = a;
        return x;
    }
    return parse_compare(p);
}

static tp_chat_node *parse_and(parser *p)
{
    tp_chat_node *x = parse_not(p);
    while (x && is_name(p, "and")) {
        int line = cur(p)->line;
        p->i++;
        tp_chat_node *b = parse_not(p);
        tp_chat_node *y = node(p, N_AND, line);
        if (!b || !y)
            return NULL;
        y->a = x;
        y->b = b;
        x = y;
    }
    return x;
}

static tp_chat_node *parse_or(parser *p)
{
    tp_chat_node *x = parse_and(p);
    while (x && is_name(p, "or")) {
        int line = cur(p)->line;
        p->i++;
        tp_chat_node *b = parse_and(p);
        tp_chat_node *y = node(p, N_OR, line);
        if (!b || !y)
            return NULL;
        y->a = x;
        y->b = b;
        x = y;
    }
    return x;
}

static tp_chat_node *parse_expr(parser *p, int with_cond)
{
    int line = cur(p)->line;
    if (++p->depth > TP_CHAT_MAX_DEPTH) {
        fail(p, TP_ERANGE, line, "expression nested deeper than %s levels", "64");
        return NULL;
    }
    tp_chat_node *x = parse_or(p);
    while (with_cond && x && is_name(p, "if")) {
        int l2 = cur(p)->line;
        p->i++;
        tp_chat_node *c = node(p, N_COND, l2);
        tp_chat_node *test = parse_or(p);
        if (!c || !test) {
            x = NULL;
            break;
        }
        c->a = x;
        c->b = test;
        if (is_name(p, "else")) {
            p->i++;
            if (!(c->c = parse_expr(p, 1))) {
                x = NULL;
                break;
            }
        }
        x = c;
    }
    p->depth--;
    return x;
}

/* ---- statements -------------------------------------------------------- */

static int expect_block_end(parser *p)
{
    if (cur(p)->kind != TK_BLOCK_END)
        return fail(p, TP_EFORMAT, cur(p)->line, "expected end of statement '%%}'%s", NULL);
    p->i++;
    return 0;
}

static int parse_body(parser *p, const char *const *ends, nlist *out, int *which);

/* "{% NAME" where NAME is one of ends: returns its index, leaves p after it. */
static int at_end_tag(parser *p, const char *const *ends)
{
    if (cur(p)->kind != TK_BLOCK_BEGIN || p->t[p->i + 1].kind != TK_NAME)
        return -1;
    tp_chat_tok *t = &p->t[p->i + 1];
    for (int k = 0; ends[k]; k++)
        if (t->n == strlen(ends[k]) && !memcmp(t->s, ends[k], t->n))
            return k;
    return -1;
}

static tp_chat_node *parse_stmt(parser *p);

static int parse_body(parser *p, const char *const *ends, nlist *out, int *which)
{
    if (++p->depth > TP_CHAT_MAX_DEPTH)
        return fail(p, TP_ERANGE, cur(p)->line, "blocks nested deeper than %s levels", "64");
    for (;;) {
        tp_chat_tok *t = cur(p);
        if (t->kind == TK_EOF) {
            if (ends && ends[0]) {
                p->depth--;
                return fail(p, TP_EFORMAT, t->line, "missing '{%% %s %%}'", ends[0]);
            }
            *which = -1;
            p->depth--;
            return 0;
        }
        int k = ends ? at_end_tag(p, ends) : -1;
        if (k >= 0) {
            p->i += 2;
            *which = k;
            p->depth--;
            return 0;
        }
        tp_chat_node *x;
        if (t->kind == TK_DATA) {
            x = node(p, N_TEXT, t->line);
            if (x) {
                x->name = t->s;
                x->name_len = t->n;
            }
            p->i++;
        } else if (t->kind == TK_VAR_BEGIN) {
            p->i++;
            x = node(p, N_OUT, t->line);
            if (x && !(x->a = parse_expr(p, 1)))
                x = NULL;
            if (x && cur(p)->kind != TK_VAR_END) {
                fail(p, TP_EFORMAT, cur(p)->line, "expected end of expression '}}'%s", NULL);
                x = NULL;
            }
            p->i++;
        } else if (t->kind == TK_BLOCK_BEGIN) {
            p->i++;
            x = parse_stmt(p);
        } else {
            fail(p, TP_EFORMAT, t->line, "unexpected token%s", NULL);
            x = NULL;
        }
        if (!x || nl_push(p, out, x)) {
            p->depth--;
            return TP_EFORMAT;
        }
    }
}

static tp_chat_node *parse_if(parser *p, int line)
{
    tp_chat_node *x = node(p, N_IF, line);
    if (!x || !(x->a = parse_expr(p, 1)) || expect_block_end(p))
        return NULL;
    static const char *const ENDS[] = {"endif", "elif", "else", NULL};
    nlist body = {0};
    int which;
    if (parse_body(p, ENDS, &body, &which))
        return NULL;
    x->body = body.v;
    x->n_body = body.n;
    if (which == 1) {
        tp_chat_node *e = parse_if(p, p->t[p->i - 1].line);
        if (!e)
            return NULL;
        tp_chat_node **b2 = nalloc(p, sizeof *b2);
        if (!b2)
            return NULL;
        b2[0] = e;
        x->body2 = b2;
        x->n_body2 = 1;
        return x;
    }
    if (which == 2) {
        if (expect_block_end(p))
            return NULL;
        static const char *const ENDS2[] = {"endif", NULL};
        nlist els = {0};
        if (parse_body(p, ENDS2, &els, &which))
            return NULL;
        x->body2 = els.v;
        x->n_body2 = els.n;
    }
    if (expect_block_end(p))
        return NULL;
    return x;
}

static tp_chat_node *parse_for(parser *p, int line)
{
    tp_chat_node *x = node(p, N_FOR, line);
    if (!x)
        return NULL;
    slist names = {0};
    for (;;) {
        tp_chat_tok *t = cur(p);
        if (t->kind != TK_NAME) {
            fail(p, TP_EFORMAT, t->line, "expected a loop variable name%s", NULL);
            return NULL;
        }
        if (sl_push(p, &names, dupn(p, t->s, t->n)))
            return NULL;
        p->i++;
        if (!is_op(p, ","))
            break;
        p->i++;
    }
    if (!is_name(p, "in")) {
        fail(p, TP_EFORMAT, cur(p)->line, "expected 'in' in for loop%s", NULL);
        return NULL;
    }
    p->i++;
    x->targets = names.v;
    x->n_targets = names.n;
    if (!(x->a = parse_expr(p, 0)))
        return NULL;
    if (is_name(p, "if")) {
        p->i++;
        if (!(x->b = parse_expr(p, 1)))
            return NULL;
    }
    if (is_name(p, "recursive")) {
        fail(p, TP_EINVAL, cur(p)->line, "unsupported construct: recursive for loop%s", NULL);
        return NULL;
    }
    if (expect_block_end(p))
        return NULL;
    static const char *const ENDS[] = {"endfor", "else", NULL};
    nlist body = {0};
    int which;
    p->in_loop++;
    int rc = parse_body(p, ENDS, &body, &which);
    p->in_loop--;
    if (rc)
        return NULL;
    x->body = body.v;
    x->n_body = body.n;
    if (which == 1) {
        if (expect_block_end(p))
            return NULL;
        static const char *const ENDS2[] = {"endfor", NULL};
        nlist els = {0};
        if (parse_body(p, ENDS2, &els, &which))
            return NULL;
        x->body2 = els.v;
        x->n_body2 = els.n;
    }
    if (expect_block_end(p))
        return NULL;
    return x;
}

static tp_chat_node *parse_set(parser *p, int line)
{
    tp_chat_tok *t = cur(p);
    if (t->kind != TK_NAME) {
        fail(p, TP_EFORMAT, t->line, "expected a variable name after 'set'%s", NULL);
        return NULL;
    }
    const char *nm = dupn(p, t->s, t->n);
    const char *attr = NULL;
    p->i++;
    if (is_op(p, ".")) {
        p->i++;
        if (cur(p)->kind != TK_NAME) {
            fail(p, TP_EFORMAT, cur(p)->line, "expected an attribute name in 'set'%s", NULL);
            return NULL;
        }
        attr = dupn(p, cur(p)->s, cur(p)->n);
        p->i++;
    }
    if (is_op(p, ",")) {
        fail(p, TP_EINVAL, line, "unsupported construct: 'set' of several names%s", NULL);
        return NULL;
    }
    if (is_op(p, "=")) {
        p->i++;
        tp_chat_node *x = node(p, N_SET, line);
        if (!x || !(x->a = parse_expr(p, 1)) || expect_block_end(p))
            return NULL;
        x->name = nm;
        x->attr = attr;
        return x;
    }
    if (attr || cur(p)->kind != TK_BLOCK_END) {
        fail(p, TP_EINVAL, line, "unsupported construct: 'set' block with filters or attribute%s", NULL);
        return NULL;
    }
    p->i++;
    tp_chat_node *x = node(p, N_SETBLOCK, line);
    static const char *const ENDS[] = {"endset", NULL};
    nlist body = {0};
    int which;
    if (!x || parse_body(p, ENDS, &body, &which) || expect_block_end(p))
        return NULL;
    x->name = nm;
    x->body = body.v;
    x->n_body = body.n;
    return x;
}

static tp_chat_node *parse_macro(parser *p, int line)
{
    tp_chat_tok *t = cur(p);
    if (t->kind != TK_NAME) {
        fail(p, TP_EFORMAT, t->line, "expected a macro name%s", NULL);
        return NULL;
    }
    tp_chat_node *x = node(p, N_MACRO, line);
    if (!x)
        return NULL;
    x->name = dupn(p, t->s, t->n);
    p->i++;
    if (expect_op(p, "("))
        return NULL;
    slist names = {0};
    nlist defs = {0};
    while (!is_op(p, ")")) {
        if (names.n && expect_op(p, ","))
            return NULL;
        if (is_op(p, ")"))
            break;
        if (cur(p)->kind != TK_NAME) {
            fail(p, TP_EFORMAT, cur(p)->line, "expected a parameter name%s", NULL);
            return NULL;
        }
        if (sl_push(p, &names, dupn(p, cur(p)->s, cur(p)->n)))
            return NULL;
        p->i++;
        tp_chat_node *d = NULL;
        if (is_op(p, "=")) {
            p->i++;
            if (!(d = parse_expr(p, 1)))
                return NULL;
        } else if (defs.n && defs.v[defs.n - 1]) {
            fail(p, TP_EFORMAT, cur(p)->line, "parameter without default after one with a default%s", NULL);
            return NULL;
        }
        if (nl_push(p, &defs, d))
            return NULL;
    }
    p->i++;
    if (expect_block_end(p))
        return NULL;
    x->targets = names.v;
    x->n_targets = names.n;
    x->defaults = defs.v;
    static const char *const ENDS[] = {"endmacro", NULL};
    nlist body = {0};
    int which;
    int saved = p->in_loop;
    p->in_loop = 0;
    int rc = parse_body(p, ENDS, &body, &which);
    p->in_loop = saved;
    if (rc || expect_block_end(p))
        return NULL;
    x->body = body.v;
    x->n_body = body.n;
    return x;
}

static tp_chat_node *parse_filter_block(parser *p, int line)
{
    tp_chat_node *x = node(p, N_FILTERBLOCK, line);
    if (!x)
        return NULL;
    nlist fl = {0};
    for (;;) {
        tp_chat_node *f = parse_filter(p, NULL);
        if (!f || nl_push(p, &fl, f))
            return NULL;
        if (!is_op(p, "|"))
            break;
        p->i++;
    }
    if (expect_block_end(p))
        return NULL;
    static const char *const ENDS[] = {"endfilter", NULL};
    nlist body = {0};
    int which;
    if (parse_body(p, ENDS, &body, &which) || expect_block_end(p))
        return NULL;
    x->args = fl.v;
    x->n_args = fl.n;
    x->body = body.v;
    x->n_body = body.n;
    return x;
}

static tp_chat_node *parse_stmt(parser *p)
{
    tp_chat_tok *t = cur(p);
    int line = t->line;
    if (t->kind != TK_NAME) {
        fail(p, TP_EFORMAT, line, "expected a statement name after '{%%'%s", NULL);
        return NULL;
    }
    char nm[32];
    snprintf(nm, sizeof nm, "%.*s", (int)(t->n < 31 ? t->n : 31), t->s);
    p->i++;
    if (!strcmp(nm, "if"))
        return parse_if(p, line);
    if (!strcmp(nm, "for"))
        return parse_for(p, line);
    if (!strcmp(nm, "set"))
        return parse_set(p, line);
    if (!strcmp(nm, "macro"))
        return parse_macro(p, line);
    if (!strcmp(nm, "filter"))
        return parse_filter_block(p, line);
    if (!strcmp(nm, "break") || !strcmp(nm, "continue")) {
        if (!p->in_loop) {
            fail(p, TP_EFORMAT, line, "'%s' outside a for loop", nm);
            return NULL;
        }
        tp_chat_node *x = node(p, nm[0] == 'b' ? N_BREAK : N_CONTINUE, line);
        if (!x || expect_block_end(p))
            return NULL;
        return x;
    }
    static const char *const STRAY[] = {"endif", "endfor", "elif", "else", "endset", "endmacro", "endfilter", NULL};
    for (int k = 0; STRAY[k]; k++)
        if (!strcmp(nm, STRAY[k])) {
            fail(p, TP_EFORMAT, line, "'%s' without its opening statement", nm);
            return NULL;
        }
    fail(p, TP_EINVAL, line, "unsupported construct: statement '%s'", nm);
    return NULL;
}

int tp_chat_parse(tp_chat_tok *toks, size_t n, tp_chat_arena *arena, tp_chat_node ***body, size_t *n_body,
                  tp_err *err)
{
    parser p = {.t = toks, .n = n, .arena = arena, .err = err};
    nlist out = {0};
    int which;
    int rc = parse_body(&p, NULL, &out, &which);
    if (rc || p.failed)
        return p.failed ? (err ? err->code : TP_EFORMAT) : rc;
    *body = out.v;
    *n_body = out.n;
    return 0;
}
