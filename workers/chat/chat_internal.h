/* Chat templates: what the lexer, parser, values and renderer share. Not a
 * public header: include/tokpipe/chat_template.h is the module's API. */
#ifndef TOKPIPE_CHAT_INTERNAL_H
#define TOKPIPE_CHAT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokpipe/chat_template.h"

/* ---- tokens ------------------------------------------------------------ */
enum {
    TK_DATA, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END,
    TK_NAME, TK_STRING, TK_INT, TK_FLOAT, TK_OP, TK_EOF,
};

typedef struct tp_chat_tok {
    int kind;
    int line;
    const char *s;   /* DATA, NAME, STRING text (STRING decoded, owned) */
    size_t n;
    int owned;
    int64_t i;
    double f;
    char op[3];
} tp_chat_tok;

typedef struct tp_chat_lexer {
    const char *src;
    size_t len;
    tp_chat_tok *toks;
    size_t n, cap;
    tp_err *err;
} tp_chat_lexer;

int tp_chat_lex(tp_chat_lexer *lx);
void tp_chat_lexer_free(tp_chat_lexer *lx);
size_t tp_chat_ws_at(const char *s, size_t n, size_t i);
size_t tp_chat_ws_before(const char *s, size_t i);

/* ---- arena: every parse node and every render value lives in one ---------- */
typedef struct tp_chat_arena {
    struct arena_chunk *head;
    size_t used, cap;   /* cap 0 = unbounded */
} tp_chat_arena;

void *tp_chat_alloc(tp_chat_arena *a, size_t n);   /* zeroed; NULL when out of memory or cap */
void tp_chat_arena_free(tp_chat_arena *a);

/* ---- values ------------------------------------------------------------ */
enum {
    V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT,
    V_NS, V_MACRO, V_METHOD, V_FUNC, V_LOOP,
};

typedef struct tp_chat_val tp_chat_val;
struct tp_chat_node;

struct tp_chat_val {
    int type;
    union {
        int b;
        int64_t i;
        double f;
        struct { const char *s; size_t n; int safe; } str;
        /* lazy: a generator (what Jinja's map/select/reject/unique give), which
         * has no len(), is always true, iterates once; consumed: 1 after a
         * full iteration, 2 after a partial one (first). */
        struct { tp_chat_val **v; size_t n; int tuple, lazy, consumed; } list;
        struct { tp_chat_val **k; tp_chat_val **v; size_t n, cap; } dict;   /* V_DICT, V_NS */
        struct { const struct tp_chat_node *def; } macro;
        struct { tp_chat_val *self; const char *name; } method;
        struct { const char *name; } func;
        struct { tp_chat_val **items; size_t index0, length; } loop;
        struct { const char *name; } undef;
    };
};

/* ---- parse tree -------------------------------------------------------- */
enum {
    /* expressions */
    N_LIT, N_NAME, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST, N_NEG, N_POS,
    N_BIN, N_AND, N_OR, N_NOT, N_CMP, N_COND, N_LIST, N_TUPLE, N_DICT,
    /* statements */
    N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_FILTERBLOCK, N_BREAK, N_CONTINUE,
};

typedef struct tp_chat_node tp_chat_node;
struct tp_chat_node {
    int kind;
    int line;
    const char *name;       /* NAME, ATTR, FILTER, TEST, MACRO, SET target, BIN/CMP op */
    size_t name_len;
    tp_chat_val *lit;       /* LIT */
    tp_chat_node *a, *b, *c;   /* operands; COND: a if b else c; SLICE: a[b:c:d] */
    tp_chat_node *d;
    tp_chat_node **args;    /* CALL/FILTER/TEST args, LIST/TUPLE items, DICT keys */
    size_t n_args;
    const char **kw_names;  /* keyword args (n_kw of them, values after the positionals in args) */
    size_t n_kw;
    tp_chat_node **vals;    /* DICT values; CMP operands 1..n; IF conditions */
    const char **ops;       /* CMP operators */
    tp_chat_node **body;    /* statement lists */
    size_t n_body;
    tp_chat_node **body2;   /* else / for-else */
    size_t n_body2;
    const char **targets;   /* FOR loop names; MACRO parameter names */
    size_t n_targets;
    tp_chat_node **defaults;   /* MACRO parameter defaults (NULL = none) */
    int negate;             /* TEST is not */
    const char *attr;       /* SET ns.attr */
};

#endif
