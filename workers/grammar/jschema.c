/* JSON Schema -> GBNF (see tokpipe/jschema.h for the contract).
 *
 * Every schema the compiler meets becomes one rule `sN`, memoized by its
 * canonical JSON text, so $ref recursion is a rule that names itself and a
 * schema used twice is written once. Composition is normalized first:
 * $ref with siblings and allOf become one merged schema (the conjunction of
 * the keywords, refused where two cannot be merged exactly); anyOf/oneOf
 * become an alternation, their siblings merged into each branch; oneOf only
 * when its branches provably exclude each other. What remains is a plain
 * schema: one alternative per allowed JSON type, each with that type's
 * keywords. Any keyword not enforced is refused, naming it.
 *
 * The JSON written (canonical form): keys in the schema's `properties`
 * order, optional ones in their place, additional keys after them;
 * whitespace between tokens at most one space or a newline and up to 20
 * spaces/tabs; integers without fraction or exponent; numbers with bounds
 * without exponent; at most 16 integer and 16 fraction digits. */
#include "tokpipe/jschema.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jschema_fmt.h"
#include "jschema_int.h"

#define NEVER (-1) /* the schema accepts nothing */
#define FAIL (-2)  /* error recorded in the context */

#define JS_MAX_INT 9999999999999999LL /* TP_JSCHEMA_INT_DIGITS nines */
#define JS_EXACT 9007199254740992.0   /* 2^53: doubles are exact integers below */
#define JS_MAX_MERGE 1000             /* schemas flattened into one allOf */
#define JS_MAX_ONEOF_PAIRS 100000     /* oneOf branch pairs compared for exclusion */
#define JS_MAX_KEY_BYTES 1024         /* a declared key beside additional ones (one rule per byte) */

static const char common_rules[] =
    "ws ::= ( \" \" | \"\\n\" [ \\t]{0,20} )?\n"
    "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )\n"
    "kchar ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" [\"\\\\bfnrt]\n"
    "ktail ::= kchar* \"\\\"\"\n"
    "knonascii ::= [\\x80-\\uD7FF\\uE000-\\U0010FFFF]\n"
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "integer ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\n"
    "frac ::= \".\" [0-9]{1,16}\n"
    "nzfrac ::= \".\" ( [0-9]{0,15} [1-9] )\n"
    "number ::= integer frac? ( [eE] [-+]? [0-9]{1,3} )?\n"
    "boolean ::= \"true\" | \"false\"\n"
    "null ::= \"null\"\n"
    "value ::= object | array | string | number | boolean | null\n"
    "object ::= \"{\" ws ( string ws \":\" ws value ws ( \",\" ws string ws \":\" ws value ws )* )? \"}\"\n"
    "array ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n";

typedef struct memo {
    char *key;
    int id; /* rule number or NEVER */
} memo;

typedef struct jc {
    const tp_jschema_opts *o;
    cJSON *root;
    tp_err *err;
    int rc;
    tp_buf out;
    memo *m;
    int nm, cm;
    int *idx;
    size_t nidx;
    int next;
    int depth;
    unsigned fmt;
    int nstr; /* string rules written by compile_string_dfa */
    bool never_rule;
    /* rules being compiled (a stack) and where the ones still at their
     * left edge (nothing written yet) begin: naming one of those again is
     * left recursion, which no grammar engine can run */
    int *open;
    int nopen, copen, left_base;
    /* where refusals point: the schemas being compiled (innermost last),
     * the copies merging made of the user's nodes (copy -> original), and
     * the first subschema that accepts nothing */
    const cJSON **sch;
    struct origin {
        const cJSON *copy, *orig;
    } *orig;
    size_t norig, corig;
    const cJSON *never_at;
    cJSON **keep;
    size_t nkeep, ckeep;
    bool orig_lost; /* copies forgotten (out of memory) */
} jc;

#define JS_ERR_VALUE_BYTES 60    /* the offending value in a refusal, cut with an ellipsis */
#define JS_ERR_POINTER_BYTES 160 /* its JSON pointer, likewise */

/* the JSON pointer (RFC 6901) of node `at` under n, by identity, appended
 * to p; false (p as it was) when not there */
static bool path_to(const cJSON *n, const cJSON *at, tp_buf *p)
{
    if (n == at) return true;
    int i = 0;
    for (const cJSON *k = n->child; k; k = k->next, i++) {
        size_t mark = p->len;
        tp_buf_puts(p, "/");
        if (cJSON_IsArray(n)) {
            tp_buf_printf(p, "%d", i);
        } else {
            for (const char *q = k->string; q && *q; q++)
                tp_buf_puts(p, *q == '~' ? "~0" : *q == '/' ? "~1" : (char[2]){*q, 0});
        }
        if (path_to(k, at, p)) return true;
        p->len = mark;
        if (p->data) p->data[mark] = 0;
    }
    return false;
}

/* where `at` is in the user's schema: itself, or the node merging copied it
 * from (a copy of a copy too) */
static bool locate(const jc *c, const cJSON *at, tp_buf *p, int hops)
{
    if (!at || !c->root || hops > 8) return false;
    if (path_to(c->root, at, p)) return true;
    for (size_t i = 0; i < c->norig; i++) {
        /* a node inside a copied tree: the same position in the original */
        const cJSON *cp = c->orig[i].copy, *og = c->orig[i].orig;
        tp_buf sub;
        tp_buf_init(&sub, 4096);
        bool in = path_to(cp, at, &sub);
        if (in) {
            const cJSON *o = og;
            /* walk the same steps (members by position) in the original */
            const cJSON *x = cp;
            bool ok = true;
            while (x != at && ok) {
                const cJSON *k = x->child, *ko = o->child;
                ok = false;
                for (; k && ko; k = k->next, ko = ko->next) {
                    tp_buf t;
                    tp_buf_init(&t, 4096);
                    bool here = path_to(k, at, &t);
                    tp_buf_free(&t);
                    if (here) {
                        x = k, o = ko, ok = true;
                        break;
                    }
                }
            }
            tp_buf_free(&sub);
            if (ok && locate(c, o, p, hops + 1)) return true;
            continue;
        }
        tp_buf_free(&sub);
    }
    return false;
}

/* " (at \"POINTER\": VALUE)" for node at, or for the innermost schema being
 * compiled that can be located when at itself cannot */
static void refusal_at(const jc *c, const cJSON *at, char *out, size_t cap)
{
    tp_buf p;
    tp_buf_init(&p, 1u << 16);
    bool found = locate(c, at, &p, 0);
    for (int i = c->nopen - 1; !found && i >= 0; i--) {
        p.len = 0;
        if (p.data) p.data[0] = 0;
        found = locate(c, c->sch[i], &p, 0);
        if (found) at = at ? at : c->sch[i];
    }
    char *v = at ? cJSON_PrintUnformatted(at) : NULL;
    char vb[JS_ERR_VALUE_BYTES + 8] = "";
    if (v) {
        size_t n = strlen(v), k = n;
        if (n > JS_ERR_VALUE_BYTES) {
            k = JS_ERR_VALUE_BYTES;
            while (k && ((unsigned char)v[k] & 0xC0) == 0x80) k--;
        }
        snprintf(vb, sizeof vb, "%.*s%s", (int)k, v, k < n ? "\u2026" : "");
    }
    const char *ptr = p.data ? p.data : "";
    size_t pn = strlen(ptr), pk = pn;
    if (pn > JS_ERR_POINTER_BYTES) {
        pk = JS_ERR_POINTER_BYTES;
        while (pk && ((unsigned char)ptr[pk] & 0xC0) == 0x80) pk--;
    }
    if (!found) snprintf(out, cap, "%s%s%s", v ? " (value " : "", vb, v ? ")" : "");
    else snprintf(out, cap, " (at \"%.*s%s\"%s%s)", (int)pk, ptr, pk < pn ? "\u2026" : "", v ? ": " : "", vb);
    free(v);
    tp_buf_free(&p);
}

/* Record a refusal (the first one wins): the message, then the JSON pointer
 * of the offending node at in the user's schema and its value. */
static int jfail(jc *c, const cJSON *at, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int jfail(jc *c, const cJSON *at, int code, const char *fmt, ...)
{
    if (!c->rc) {
        char msg[TP_ERR_MSG_MAX], loc[JS_ERR_POINTER_BYTES + JS_ERR_VALUE_BYTES + 64] = "";
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        if (code != TP_ENOMEM) refusal_at(c, at, loc, sizeof loc);
        c->rc = code;
        tp_err_set(c->err, code, "json schema: %s%s", msg, loc);
    }
    return FAIL;
}

/* a merged schema, kept until the end: the copies in it stay valid for
 * locating refusals (deleted at once, and copies forgotten, without memory) */
static void keep(jc *c, cJSON *m)
{
    if (!m) return;
    if (c->nkeep == c->ckeep) {
        size_t cap = c->ckeep ? c->ckeep * 2 : 16;
        cJSON **k = realloc(c->keep, cap * sizeof *k);
        if (!k) {
            cJSON_Delete(m);
            c->norig = 0;
            c->orig_lost = true;
            return;
        }
        c->keep = k;
        c->ckeep = cap;
    }
    c->keep[c->nkeep++] = m;
}

/* a copy of n made while merging, remembered so refusals inside it point at
 * the user's node (caller deletes the copy) */
static cJSON *dup_from(jc *c, const cJSON *n)
{
    cJSON *d = cJSON_Duplicate(n, true);
    if (!d || c->orig_lost) return d;
    if (c->norig == c->corig) {
        size_t cap = c->corig ? c->corig * 2 : 64;
        void *o = realloc(c->orig, cap * sizeof *c->orig);
        if (!o) return d; /* only the pointers of refusals suffer */
        c->orig = o;
        c->corig = cap;
    }
    c->orig[c->norig++] = (struct origin){d, n};
    return d;
}

static int oom(jc *c)
{
    return jfail(c, NULL, TP_ENOMEM, "out of memory");
}

/* ---- keywords ---------------------------------------------------------- */

static const char *const annotations[] = {
    "title", "description", "examples", "$schema", "$id", "default", "$comment", "deprecated",
    "readOnly", "writeOnly", "$defs", "definitions", "$anchor", "$vocabulary", NULL};

static const char *const handled[] = {
    "type", "enum", "const", "properties", "required", "additionalProperties", "items",
    "prefixItems", "minItems", "maxItems", "anyOf", "oneOf", "allOf", "$ref", "minLength",
    "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "uniqueItems", NULL};

static bool in_list(const char *const *l, const char *k)
{
    for (; *l; l++)
        if (!strcmp(*l, k)) return true;
    return false;
}

static bool is_annotation(const char *k)
{
    return in_list(annotations, k) || !strncmp(k, "x-", 2);
}

/* a schema object with nothing but annotations (and the given key) */
static bool only_annotations(const cJSON *s, const char *except)
{
    for (const cJSON *k = s->child; k; k = k->next)
        if (!is_annotation(k->string) && !(except && !strcmp(k->string, except))) return false;
    return true;
}

/* ---- rules ------------------------------------------------------------- */

static void rule(jc *c, const char *name, const tp_buf *body)
{
    tp_buf_printf(&c->out, "%s ::= %s\n", name, body->data ? body->data : "\"\"");
}

static uint64_t str_hash(const char *s)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

/* entries stay in c->m (indices are stable); c->idx is an open-addressing
 * index over them (-1 empty), kept at most half full, so a schema with
 * thousands of subschemas costs linear time, not quadratic */
static int memo_find(jc *c, const char *key)
{
    if (!c->nidx) return -1;
    for (size_t i = str_hash(key) & (c->nidx - 1);; i = (i + 1) & (c->nidx - 1)) {
        int e = c->idx[i];
        if (e < 0) return -1;
        if (!strcmp(c->m[e].key, key)) return e;
    }
}

static bool memo_index(jc *c, size_t n)
{
    int *idx = malloc(n * sizeof *idx);
    if (!idx) return false;
    for (size_t i = 0; i < n; i++) idx[i] = -1;
    for (int e = 0; e < c->nm; e++) {
        size_t i = str_hash(c->m[e].key) & (n - 1);
        while (idx[i] >= 0) i = (i + 1) & (n - 1);
        idx[i] = e;
    }
    free(c->idx);
    c->idx = idx;
    c->nidx = n;
    return true;
}

static int memo_add(jc *c, char *key, int id)
{
    if (c->nm == c->cm) {
        int cm = c->cm ? c->cm * 2 : 16;
        memo *m = realloc(c->m, (size_t)cm * sizeof *m);
        if (!m) return -1;
        c->m = m;
        c->cm = cm;
    }
    c->m[c->nm].key = key;
    c->m[c->nm].id = id;
    c->nm++;
    if ((size_t)c->nm * 2 > c->nidx) {
        if (!memo_index(c, c->nidx ? c->nidx * 2 : 64)) {
            c->nm--;
            return -1;
        }
    } else {
        size_t i = str_hash(key) & (c->nidx - 1);
        while (c->idx[i] >= 0) i = (i + 1) & (c->nidx - 1);
        c->idx[i] = c->nm - 1;
    }
    return c->nm - 1;
}

static int compile(jc *c, const cJSON *s, const char *where, bool left);

/* the GBNF name of a compiled schema */
static void ref(tp_buf *b, int id)
{
    tp_buf_printf(b, "s%d", id);
}

/* ---- $ref -------------------------------------------------------------- */

static const cJSON *resolve(jc *c, const cJSON *rn)
{
    const char *r = rn->valuestring;
    if (r[0] != '#') {
        jfail(c, rn, TP_EINVAL, "$ref '%.200s': only local references ('#' or '#/...') are supported", r);
        return NULL;
    }
    const cJSON *n = c->root;
    const char *p = r + 1;
    if (*p && *p != '/') {
        jfail(c, rn, TP_EINVAL, "$ref '%.200s': anchors are not supported, use a JSON pointer '#/...'", r);
        return NULL;
    }
    while (*p == '/') {
        p++;
        char tok[256];
        size_t k = 0;
        while (*p && *p != '/') {
            char ch = *p++;
            if (ch == '~' && (*p == '0' || *p == '1')) ch = *p++ == '0' ? '~' : '/';
            else if (ch == '%' && p[0] && p[1] && strchr("0123456789abcdefABCDEF", p[0]) &&
                     strchr("0123456789abcdefABCDEF", p[1])) {
                char hx[3] = {p[0], p[1], 0};
                ch = (char)strtol(hx, NULL, 16);
                p += 2;
            }
            if (k + 1 >= sizeof tok) {
                jfail(c, rn, TP_EINVAL, "$ref '%.200s': a path segment is too long", r);
                return NULL;
            }
            tok[k++] = ch;
        }
        tok[k] = 0;
        if (cJSON_IsArray(n)) {
            char *end;
            long i = strtol(tok, &end, 10);
            n = (*tok && !*end && i >= 0) ? cJSON_GetArrayItem(n, (int)i) : NULL;
        } else if (cJSON_IsObject(n)) {
            n = cJSON_GetObjectItemCaseSensitive(n, tok);
        } else {
            n = NULL;
        }
        if (!n) {
            jfail(c, rn, TP_EINVAL, "$ref '%.200s': no such location in the schema", r);
            return NULL;
        }
    }
    return n;
}

/* ---- merging (allOf, $ref with siblings, anyOf branches) --------------- */

enum { T_NULL = 1, T_BOOL = 2, T_OBJ = 4, T_ARR = 8, T_NUM = 16, T_INT = 32, T_STR = 64, T_ALL = 127 };
static const struct {
    const char *name;
    unsigned bit;
} type_names[] = {{"null", T_NULL},   {"boolean", T_BOOL}, {"object", T_OBJ}, {"array", T_ARR},
                  {"number", T_NUM}, {"integer", T_INT},  {"string", T_STR}};

/* the `type` keyword as bits (number implies integer); 0 on error */
static unsigned types_of(jc *c, const cJSON *s)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (!t) return T_ALL;
    unsigned bits = 0;
    const cJSON *one = t;
    if (cJSON_IsArray(t)) one = t->child;
    for (; one; one = cJSON_IsArray(t) ? one->next : NULL) {
        unsigned b = 0;
        for (size_t i = 0; cJSON_IsString(one) && i < sizeof type_names / sizeof type_names[0]; i++)
            if (!strcmp(one->valuestring, type_names[i].name)) b = type_names[i].bit;
        if (!b) {
            jfail(c, one, TP_EINVAL, "type: expected one of null, boolean, object, array, number, integer, string");
            return 0;
        }
        bits |= b;
    }
    if (bits & T_NUM) bits |= T_INT;
    return bits ? bits : T_ALL + 128; /* type: [] accepts nothing */
}

static cJSON *types_json(unsigned bits)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < sizeof type_names / sizeof type_names[0]; i++) {
        unsigned b = type_names[i].bit;
        if (!(bits & b) || (b == T_INT && (bits & T_NUM))) continue;
        cJSON_AddItemToArray(a, cJSON_CreateString(type_names[i].name));
    }
    return a;
}

static cJSON *merge_all(jc *c, const cJSON **list, int n);

/* flatten $ref and allOf of the members into plain objects; returns the
 * count, -1 for "false", FAIL on error */
static int flatten(jc *c, const cJSON *s, const cJSON **out, int n, int depth)
{
    if (c->rc) return FAIL;
    if (depth > c->o->max_depth) return jfail(c, s, TP_ERANGE, "$ref/allOf nested deeper than %d (a cycle?)", c->o->max_depth);
    if (cJSON_IsTrue(s)) return n;
    if (cJSON_IsFalse(s)) return -1;
    if (!cJSON_IsObject(s)) return jfail(c, s, TP_EINVAL, "a schema must be an object or a boolean");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    if (!r && !all) {
        if (n >= JS_MAX_MERGE) return jfail(c, s, TP_ERANGE, "allOf: more than %d schemas to merge", JS_MAX_MERGE);
        out[n] = s;
        return n + 1;
    }
    /* s itself first, when it says more than $ref/allOf: its properties come
     * before those it pulls in (the order a reader of the schema sees) */
    bool rest = false;
    for (const cJSON *k = s->child; k; k = k->next)
        if (strcmp(k->string, "$ref") && strcmp(k->string, "allOf") && !is_annotation(k->string)) rest = true;
    if (rest) {
        if (n >= JS_MAX_MERGE) return jfail(c, s, TP_ERANGE, "allOf: more than %d schemas to merge", JS_MAX_MERGE);
        out[n++] = s;
    }
    if (r) {
        if (!cJSON_IsString(r)) return jfail(c, r, TP_EINVAL, "$ref: expected a string");
        const cJSON *t = resolve(c, r);
        if (!t) return FAIL;
        n = flatten(c, t, out, n, depth + 1);
    }
    if (n >= 0 && all) {
        if (!cJSON_IsArray(all) || !all->child) return jfail(c, all, TP_EINVAL, "allOf: expected a non-empty array");
        for (const cJSON *a = all->child; a && n >= 0; a = a->next) n = flatten(c, a, out, n, depth + 1);
    }
    return n;
}

static bool js_equal(const cJSON *a, const cJSON *b)
{
    return cJSON_Compare(a, b, true);
}

static double num_or(const cJSON *s, const char *k, double dflt, bool *has)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, k);
    if (has) *has = cJSON_IsNumber(v);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

/* merge the members' schemas at one place (a property, an array position)
 * and add it to dst under key (or as array item when key is NULL) */
static bool merge_sub(jc *c, cJSON *dst, const char *key, const cJSON **l, int n)
{
    cJSON *m = n == 1 ? dup_from(c, l[0]) : merge_all(c, l, n);
    if (!m) {
        if (!c->rc) oom(c);
        return false;
    }
    if (key) cJSON_AddItemToObject(dst, key, m);
    else cJSON_AddItemToArray(dst, m);
    return true;
}

/* the conjunction of schemas as one schema (caller deletes); NULL on error */
static cJSON *merge_all(jc *c, const cJSON **list, int n)
{
    if (++c->depth > c->o->max_depth) {
        c->depth--;
        jfail(c, list[0], TP_ERANGE, "schemas nested deeper than %d", c->o->max_depth);
        return NULL;
    }
    const cJSON **mem = malloc(JS_MAX_MERGE * sizeof *mem);
    const cJSON **sub = malloc(JS_MAX_MERGE * sizeof *sub);
    cJSON *res = NULL;
    int k = 0;
    if (!mem || !sub) goto oom;
    for (int i = 0; i < n && k >= 0; i++) k = flatten(c, list[i], mem, k, 0);
    if (k == FAIL) goto out;
    if (k < 0) {
        res = cJSON_CreateFalse();
        goto out;
    }
    res = cJSON_CreateObject();
    if (!res) goto oom;
    unsigned types = T_ALL;
    for (int i = 0; i < k; i++) {
        unsigned t = types_of(c, mem[i]);
        if (!t) goto fail;
        types &= t;
    }
    if (types != T_ALL) cJSON_AddItemToObject(res, "type", types_json(types & T_ALL));
    /* properties: the union in order of first appearance; each key's schema
     * is the conjunction of what every member says about it */
    cJSON *props = NULL;
    for (int i = 0; i < k; i++) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(mem[i], "properties");
        for (const cJSON *q = cJSON_IsObject(p) ? p->child : NULL; q; q = q->next) {
            if (!props) props = cJSON_AddObjectToObject(res, "properties");
            if (!props) goto oom;
            if (cJSON_GetObjectItemCaseSensitive(props, q->string)) continue;
            int ns = 0;
            for (int j = 0; j < k; j++) {
                const cJSON *pj = cJSON_GetObjectItemCaseSensitive(mem[j], "properties");
                const cJSON *v = cJSON_IsObject(pj) ? cJSON_GetObjectItemCaseSensitive(pj, q->string) : NULL;
                if (!v) v = cJSON_GetObjectItemCaseSensitive(mem[j], "additionalProperties");
                if (v) sub[ns++] = v;
            }
            if (!merge_sub(c, props, q->string, sub, ns)) goto fail;
        }
    }
    int ns = 0;
    for (int i = 0; i < k; i++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(mem[i], "additionalProperties");
        if (a) sub[ns++] = a;
    }
    if (ns && !merge_sub(c, res, "additionalProperties", sub, ns)) goto fail;
    cJSON *req = NULL;
    for (int i = 0; i < k; i++) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(mem[i], "required");
        if (r && !cJSON_IsArray(r)) {
            jfail(c, r, TP_EINVAL, "required: expected an array of strings");
            goto fail;
        }
        for (const cJSON *q = r ? r->child : NULL; q; q = q->next) {
            if (!cJSON_IsString(q)) {
                jfail(c, q, TP_EINVAL, "required: expected an array of strings");
                goto fail;
            }
            if (!req && !(req = cJSON_AddArrayToObject(res, "required"))) goto oom;
            bool dup = false;
            for (const cJSON *d = req->child; d; d = d->next) dup = dup || !strcmp(d->valuestring, q->valuestring);
            if (!dup) cJSON_AddItemToArray(req, cJSON_CreateString(q->valuestring));
        }
    }
    /* arrays: position i takes each member's prefixItems[i], or its items */
    int npre = 0;
    for (int i = 0; i < k; i++) {
        int m = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(mem[i], "prefixItems"));
        if (m > npre) npre = m;
    }
    cJSON *pre = npre ? cJSON_AddArrayToObject(res, "prefixItems") : NULL;
    if (npre && !pre) goto oom;
    for (int pos = 0; pos <= npre; pos++) {
        ns = 0;
        for (int i = 0; i < k; i++) {
            const cJSON *pi = cJSON_GetObjectItemCaseSensitive(mem[i], "prefixItems");
            const cJSON *v = pos < npre ? cJSON_GetArrayItem(pi, pos) : NULL;
            if (!v) v = cJSON_GetObjectItemCaseSensitive(mem[i], "items");
            if (v) sub[ns++] = v;
        }
        if (pos < npre) {
            if (!merge_sub(c, pre, NULL, sub, ns ? ns : 1) && ns) goto fail;
            if (!ns) cJSON_AddItemToArray(pre, cJSON_CreateTrue());
        } else if (ns && !merge_sub(c, res, "items", sub, ns)) {
            goto fail;
        }
    }
    /* numbers and counts: the strictest bound wins */
    static const char *const lows[] = {"minLength", "minItems", "minimum", "exclusiveMinimum", NULL};
    static const char *const highs[] = {"maxLength", "maxItems", "maximum", "exclusiveMaximum", NULL};
    for (int h = 0; h < 2; h++)
        for (const char *const *kw = h ? highs : lows; *kw; kw++) {
            bool any = false;
            double best = 0;
            for (int i = 0; i < k; i++) {
                bool has;
                double v = num_or(mem[i], *kw, 0, &has);
                if (has && (!any || (h ? v < best : v > best))) best = v, any = true;
                const cJSON *raw = cJSON_GetObjectItemCaseSensitive(mem[i], *kw);
                if (raw && !has) {
                    jfail(c, raw, TP_EINVAL, "%s: expected a number", *kw);
                    goto fail;
                }
            }
            if (any) cJSON_AddNumberToObject(res, *kw, best);
        }
    /* enum/const: the values every member allows */
    cJSON *vals = NULL;
    for (int i = 0; i < k; i++) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(mem[i], "enum");
        const cJSON *cn = cJSON_GetObjectItemCaseSensitive(mem[i], "const");
        cJSON one = {0};
        if (e && !cJSON_IsArray(e)) {
            jfail(c, e, TP_EINVAL, "enum: expected an array");
            goto fail;
        }
        for (int w = 0; w < 2; w++) {
            const cJSON *set = w ? e : NULL;
            if (!w && cn) {
                one.type = cJSON_Array;
                one.child = (cJSON *)cn;
                set = &one;
            }
            if (!set) continue;
            if (!vals) {
                vals = cJSON_Duplicate(set, true);
                if (!vals) goto oom;
                continue;
            }
            /* keep the values also in set */
            if ((double)cJSON_GetArraySize(vals) * (w ? cJSON_GetArraySize(set) : 1) > 1e6) {
                jfail(c, e, TP_ERANGE, "allOf: enums too large to intersect");
                goto fail;
            }
            cJSON *keep = cJSON_CreateArray();
            if (!keep) goto oom;
            for (const cJSON *v = vals->child; v; v = v->next) {
                bool in = false;
                for (const cJSON *u = set->child; u && !in; u = w ? u->next : NULL) in = js_equal(u, v);
                if (in) cJSON_AddItemToArray(keep, cJSON_Duplicate(v, true));
            }
            cJSON_Delete(vals);
            vals = keep;
        }
    }
    if (vals) cJSON_AddItemToObject(res, "enum", vals);
    /* everything else must agree (or be given once) */
    for (int i = 0; i < k; i++)
        for (const cJSON *q = mem[i]->child; q; q = q->next) {
            const char *kw = q->string;
            if (is_annotation(kw) || in_list(lows, kw) || in_list(highs, kw) || !strcmp(kw, "type") ||
                !strcmp(kw, "properties") || !strcmp(kw, "additionalProperties") || !strcmp(kw, "required") ||
                !strcmp(kw, "items") || !strcmp(kw, "prefixItems") || !strcmp(kw, "enum") || !strcmp(kw, "const") ||
                !strcmp(kw, "$ref") || !strcmp(kw, "allOf"))
                continue;
            const cJSON *have = cJSON_GetObjectItemCaseSensitive(res, kw);
            if (!have) {
                cJSON_AddItemToObject(res, kw, dup_from(c, q));
            } else if (!js_equal(have, q)) {
                jfail(c, q, TP_EINVAL, "allOf: two different '%s' cannot both be enforced", kw);
                goto fail;
            }
        }
    goto out;
oom:
    oom(c);
fail:
    cJSON_Delete(res);
    res = NULL;
out:
    free(mem);
    free(sub);
    c->depth--;
    return res;
}

/* ---- enum / const values ----------------------------------------------- */

static bool lit_value(jc *c, tp_buf *b, const cJSON *v, int depth);

static void lit_number(tp_buf *b, double d)
{
    char t[64];
    if (d == floor(d) && fabs(d) < JS_EXACT) {
        if (d == 0) {
            tp_buf_puts(b, "\"-\"? \"0\"");
            return;
        }
        snprintf(t, sizeof t, "%.0f", d);
    } else {
        /* the shortest text that reads back as d, as JSON writers print it */
        for (int p = 1; p <= 17; p++) {
            snprintf(t, sizeof t, "%.*g", p, d);
            if (strtod(t, NULL) == d) break;
        }
    }
    jgb_lit(b, t, strlen(t));
}

static bool lit_value(jc *c, tp_buf *b, const cJSON *v, int depth)
{
    if (depth > c->o->max_depth) {
        jfail(c, v, TP_ERANGE, "enum/const: a value nested deeper than %d", c->o->max_depth);
        return false;
    }
    if (cJSON_IsNull(v)) tp_buf_puts(b, "\"null\"");
    else if (cJSON_IsTrue(v)) tp_buf_puts(b, "\"true\"");
    else if (cJSON_IsFalse(v)) tp_buf_puts(b, "\"false\"");
    else if (cJSON_IsNumber(v)) lit_number(b, v->valuedouble);
    else if (cJSON_IsString(v)) {
        if (!jgb_json_str(b, v->valuestring, strlen(v->valuestring), true)) {
            jfail(c, v, TP_EINVAL, "enum/const: a string that is not valid UTF-8");
            return false;
        }
    } else {
        bool obj = cJSON_IsObject(v);
        tp_buf_puts(b, obj ? "\"{\" ws" : "\"[\" ws");
        for (const cJSON *e = v->child; e; e = e->next) {
            if (e != v->child) tp_buf_puts(b, " \",\" ws");
            tp_buf_puts(b, " ");
            if (obj) {
                if (!jgb_json_str(b, e->string, strlen(e->string), true)) {
                    jfail(c, e, TP_EINVAL, "enum/const: a key that is not valid UTF-8");
                    return false;
                }
                tp_buf_puts(b, " ws \":\" ws ");
            }
            if (!lit_value(c, b, e, depth + 1)) return false;
            tp_buf_puts(b, " ws");
        }
        tp_buf_puts(b, obj ? " \"}\"" : " \"]\"");
    }
    return true;
}

static size_t utf8_len(const char *s)
{
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* does v satisfy the simple keywords beside an enum (type, lengths, bounds)? */
static bool enum_keeps(const cJSON *s, unsigned types, const cJSON *v)
{
    unsigned t = cJSON_IsNull(v) ? T_NULL : cJSON_IsBool(v) ? T_BOOL : cJSON_IsObject(v) ? T_OBJ
                 : cJSON_IsArray(v) ? T_ARR : cJSON_IsString(v) ? T_STR
                 : (v->valuedouble == floor(v->valuedouble) ? T_INT : T_NUM);
    if (!(types & t)) return false;
    bool has;
    if (cJSON_IsString(v)) {
        size_t n = utf8_len(v->valuestring);
        double lo = num_or(s, "minLength", 0, NULL), hi = num_or(s, "maxLength", 0, &has);
        if ((double)n < lo || (has && (double)n > hi)) return false;
    }
    if (cJSON_IsNumber(v)) {
        double x = v->valuedouble, b;
        if ((b = num_or(s, "minimum", 0, &has)), has && x < b) return false;
        if ((b = num_or(s, "maximum", 0, &has)), has && x > b) return false;
        if ((b = num_or(s, "exclusiveMinimum", 0, &has)), has && x <= b) return false;
        if ((b = num_or(s, "exclusiveMaximum", 0, &has)), has && x >= b) return false;
    }
    if (cJSON_IsArray(v)) {
        double n = cJSON_GetArraySize(v);
        if (n < num_or(s, "minItems", 0, NULL)) return false;
        if ((num_or(s, "maxItems", 0, &has), has) && n > num_or(s, "maxItems", 0, NULL)) return false;
    }
    return true;
}

static int compile_enum(jc *c, const cJSON *s, unsigned types, tp_buf *b)
{
    static const char *const ok[] = {"type", "enum", "const", "minLength", "maxLength", "minimum",
                                     "maximum", "exclusiveMinimum", "exclusiveMaximum", "minItems",
                                     "maxItems", NULL};
    for (const cJSON *k = s->child; k; k = k->next)
        if (!is_annotation(k->string) && !in_list(ok, k->string))
            return jfail(c, k, TP_EINVAL, "enum/const together with '%s' is not supported", k->string);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (e && !cJSON_IsArray(e)) return jfail(c, e, TP_EINVAL, "enum: expected an array");
    int n = 0;
    for (int w = 0; w < 2; w++) {
        const cJSON *v = w ? (e ? e->child : NULL) : cn;
        for (; v; v = w ? v->next : NULL) {
            if (e && cn && w && !js_equal(v, cn)) continue;
            if (!enum_keeps(s, types, v)) continue;
            if (w && cn) continue; /* const already written */
            if (n++) tp_buf_puts(b, " | ");
            if (!lit_value(c, b, v, 0)) return FAIL;
        }
    }
    return n ? 0 : NEVER;
}

/* ---- numbers ----------------------------------------------------------- */

/* decimal strings without leading zeros of the integers in [a, b] */
static void digits_same(tp_buf *b, const char *A, const char *B, int n)
{
    if (!n) {
        tp_buf_puts(b, "\"\"");
        return;
    }
    if (!strncmp(A, B, (size_t)n)) {
        jgb_lit(b, A, (size_t)n);
        return;
    }
    if (A[0] == B[0]) {
        tp_buf_printf(b, "\"%c\" ", A[0]);
        digits_same(b, A + 1, B + 1, n - 1);
        return;
    }
    bool zeros = strspn(A + 1, "0") >= (size_t)(n - 1);
    bool nines = strspn(B + 1, "9") >= (size_t)(n - 1);
    char lo = zeros ? A[0] : (char)(A[0] + 1), hi = nines ? B[0] : (char)(B[0] - 1);
    tp_buf_puts(b, "(");
    bool any = false;
    char buf[20];
    if (!zeros) {
        tp_buf_printf(b, "\"%c\" ", A[0]);
        memset(buf, '9', (size_t)n - 1);
        digits_same(b, A + 1, buf, n - 1);
        any = true;
    }
    if (lo <= hi) {
        if (any) tp_buf_puts(b, " | ");
        if (lo == hi) tp_buf_printf(b, "\"%c\"", lo);
        else tp_buf_printf(b, "[%c-%c]", lo, hi);
        if (n > 1) tp_buf_printf(b, " [0-9]{%d}", n - 1);
        any = true;
    }
    if (!nines) {
        if (any) tp_buf_puts(b, " | ");
        tp_buf_printf(b, "\"%c\" ", B[0]);
        memset(buf, '0', (size_t)n - 1);
        digits_same(b, buf, B + 1, n - 1);
    }
    tp_buf_puts(b, ")");
}

static void digits_range(tp_buf *b, long long a, long long z)
{
    tp_buf_puts(b, "(");
    bool any = false;
    long long p = 1;
    for (int d = 1; d <= TP_JSCHEMA_INT_DIGITS; d++, p *= 10) {
        long long lo = d == 1 ? 0 : p, hi = p * 10 - 1;
        if (a > lo) lo = a;
        if (z < hi) hi = z;
        if (lo > hi) continue;
        char A[24], B[24];
        snprintf(A, sizeof A, "%lld", lo);
        snprintf(B, sizeof B, "%lld", hi);
        if (any) tp_buf_puts(b, " | ");
        digits_same(b, A, B, d);
        any = true;
    }
    tp_buf_puts(b, ")");
}

typedef struct bound {
    bool has, excl;
    long long v;
} bound;

/* y >= 0 with y's lower/upper bounds (integers); is_int: no fraction.
 * Returns false when no y fits. */
static bool nonneg(tp_buf *b, bound lo, bound hi, bool is_int, bool first)
{
    long long a = lo.has ? (lo.excl ? lo.v + 1 : lo.v) : 0;
    if (a < 0) a = 0;
    long long z = hi.has ? (hi.excl ? hi.v - 1 : hi.v) : JS_MAX_INT;
    if (z > JS_MAX_INT) z = JS_MAX_INT;
    bool any = false;
#define ALT() (tp_buf_puts(b, (any || !first) ? " | " : ""), any = true)
    if (is_int) {
        if (a <= z) {
            ALT();
            digits_range(b, a, z);
        }
        return any;
    }
    /* any fraction: integer parts k with [k, k+1) inside the bounds */
    long long fz = hi.has ? hi.v - 1 : JS_MAX_INT;
    if (fz > JS_MAX_INT) fz = JS_MAX_INT;
    if (a <= fz) {
        ALT();
        digits_range(b, a, fz);
        tp_buf_puts(b, " frac?");
    }
    /* just above an exclusive lower bound: a non-zero fraction */
    if (lo.has && lo.excl && lo.v >= 0 && (!hi.has || hi.v > lo.v) && lo.v <= JS_MAX_INT) {
        ALT();
        tp_buf_printf(b, "\"%lld\" nzfrac", lo.v);
    }
    /* an inclusive upper bound itself (its fraction all zeros) */
    if (hi.has && !hi.excl && hi.v >= 0 && hi.v <= JS_MAX_INT && hi.v >= a && !(lo.has && lo.excl && hi.v <= lo.v)) {
        ALT();
        tp_buf_printf(b, "\"%lld\" ( \".\" \"0\"{1,16} )?", hi.v);
    }
#undef ALT
    return any;
}

/* one bound from a keyword; integer-valued, exact, within the digit limit */
static int get_bound(jc *c, const cJSON *s, const char *kw, bool is_int, bool upper, bool excl, bound *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, kw);
    if (!v) return 0;
    if (!cJSON_IsNumber(v)) return jfail(c, v, TP_EINVAL, "%s: expected a number", kw);
    double d = v->valuedouble;
    if (!isfinite(d)) return jfail(c, v, TP_EINVAL, "%s: not a finite number", kw);
    if (fabs(d) >= JS_EXACT && fabs(d) <= 1e17)
        return jfail(c, v, TP_EINVAL, "%s: %.17g is beyond 2^53 and cannot be read exactly", kw, d);
    if (d != floor(d)) {
        if (!is_int) return jfail(c, v, TP_EINVAL, "%s: a non-integer bound on a number is not supported", kw);
        /* an integer x > 1.5 is x >= 2 */
        d = upper ? floor(d) : ceil(d);
        excl = false;
    }
    if (d > 1e17) d = 1e17; /* beyond the digit limit: no further limit */
    if (d < -1e17) d = -1e17;
    bound b = {true, excl, (long long)d};
    /* keep the stricter of minimum / exclusiveMinimum */
    if (out->has) {
        long long ov = out->v, nv = b.v;
        bool stricter = upper ? (nv < ov || (nv == ov && b.excl)) : (nv > ov || (nv == ov && b.excl));
        if (!stricter) return 0;
    }
    *out = b;
    return 0;
}

static int compile_number(jc *c, const cJSON *s, bool is_int, tp_buf *b)
{
    bound lo = {0}, hi = {0};
    if (get_bound(c, s, "minimum", is_int, false, false, &lo) || get_bound(c, s, "exclusiveMinimum", is_int, false, true, &lo) ||
        get_bound(c, s, "maximum", is_int, true, false, &hi) || get_bound(c, s, "exclusiveMaximum", is_int, true, true, &hi))
        return FAIL;
    if (!lo.has && !hi.has) {
        tp_buf_puts(b, is_int ? "integer" : "number");
        return 0;
    }
    tp_buf_puts(b, "(");
    /* x >= 0 */
    bool any = false;
    if (!(hi.has && (hi.v < 0 || (hi.v == 0 && hi.excl))))
        any = nonneg(b, lo, hi, is_int, true);
    /* x = -y, y >= 0 (with "-0" when 0 is allowed) */
    if (!lo.has || lo.v < 0 || (lo.v == 0 && !lo.excl)) {
        bound ylo = {true, false, 0}, yhi = {0};
        if (hi.has && hi.v <= 0) ylo = (bound){true, hi.excl, -hi.v};
        if (lo.has) yhi = (bound){true, lo.excl, -lo.v};
        tp_buf t;
        tp_buf_init(&t, c->o->max_gbnf_bytes);
        if (nonneg(&t, ylo, yhi, is_int, true)) {
            tp_buf_printf(b, "%s\"-\" (%s)", any ? " | " : "", t.data);
            any = true;
        }
        if (t.err) tp_buf_fail(b, TP_ERANGE);
        tp_buf_free(&t);
    }
    tp_buf_puts(b, ")");
    return any ? 0 : NEVER;
}

/* ---- strings ----------------------------------------------------------- */

static int get_count(jc *c, const cJSON *s, const char *kw, long long dflt, long long *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, kw);
    *out = dflt;
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble))
        return jfail(c, v, TP_EINVAL, "%s: expected a non-negative integer", kw);
    *out = v->valuedouble > 1e15 ? (long long)1e15 : (long long)v->valuedouble;
    return 0;
}

#define JS_UNBOUNDED (-1LL)

/* A format and/or pattern that must hold with the lengths mn..mx (SIZE_MAX:
 * no bound): each a DFA, both intersected, written as rules (jschema_dfa.c). */
static int compile_string_dfa(jc *c, const cJSON *at, const char *fmt, const char *pat, size_t mn, size_t mx, tp_buf *b)
{
    tp_err e = {0};
    jdfa *x = NULL, *y = NULL, *z = NULL;
    const char *what = fmt && pat ? "format with pattern" : fmt ? "format with minLength/maxLength"
                                                                : "pattern with minLength/maxLength";
    int rc = 0;
    if (fmt) {
        const char *re = fmt_regex(fmt);
        rc = rx_compile_dfa(re, strlen(re), c->o->max_depth, JS_MAX_DFA_STATES, &x, &e);
    }
    if (!rc && pat) rc = rx_compile_dfa(pat, strlen(pat), c->o->max_depth, JS_MAX_DFA_STATES, fmt ? &y : &x, &e);
    if (!rc && x && y && !(z = jdfa_product(x, y, JS_MAX_DFA_STATES, &e))) rc = e.code ? e.code : TP_ENOMEM;
    if (!rc) {
        tp_buf expr;
        tp_buf_init(&expr, 256);
        char base[32];
        snprintf(base, sizeof base, "str%d", c->nstr++);
        rc = jdfa_write(z ? z : x, mn, mx, base, JS_MAX_LEN_RULES, &c->out, &expr, &e);
        if (!rc) tp_buf_printf(b, "\"\\\"\" %s \"\\\"\"", expr.data);
        tp_buf_free(&expr);
    }
    jdfa_free(x);
    jdfa_free(y);
    jdfa_free(z);
    if (rc == 1) return NEVER;
    if (rc) return jfail(c, at, rc, "%s: %s", what, e.msg);
    return 0;
}

static int compile_string(jc *c, const cJSON *s, tp_buf *b)
{
    long long mn, mx;
    if (get_count(c, s, "minLength", 0, &mn) || get_count(c, s, "maxLength", JS_UNBOUNDED, &mx)) return FAIL;
    if (mx != JS_UNBOUNDED && mn > mx) return NEVER;
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    if (pat && !cJSON_IsString(pat)) return jfail(c, pat, TP_EINVAL, "pattern: expected a string");
    if (fmt && !cJSON_IsString(fmt)) return jfail(c, fmt, TP_EINVAL, "format: expected a string");
    size_t lo = 0, hi = SIZE_MAX;
    unsigned needs = 0;
    if (fmt && fmt_lookup(fmt->valuestring, &needs, &lo, &hi))
        return jfail(c, fmt, TP_EINVAL, "format '%.64s' is not supported (date, time, date-time, uuid, email, ipv4 are)",
                     fmt->valuestring);
    tp_buf body;
    tp_buf_init(&body, c->o->max_gbnf_bytes);
    if (pat) {
        tp_err e;
        size_t plo, phi;
        int rc = rx_compile_expr(pat->valuestring, strlen(pat->valuestring), true, "char", c->o->max_depth, &body, &plo,
                                 &phi, &e);
        if (rc) {
            tp_buf_free(&body);
            return jfail(c, pat, rc, "%s", e.msg);
        }
        if (!fmt) lo = plo, hi = phi;
    }
    size_t umx = mx == JS_UNBOUNDED ? SIZE_MAX : (size_t)mx;
    bool always = (size_t)mn <= lo && (umx == SIZE_MAX || (hi != SIZE_MAX && hi <= umx));
    if ((fmt || pat) && ((umx != SIZE_MAX && lo > umx) || (hi != SIZE_MAX && hi < (size_t)mn))) {
        tp_buf_free(&body); /* the lengths exclude every string of the format or pattern */
        return NEVER;
    }
    int r = 0;
    if ((fmt || pat) && (!always || (fmt && pat))) {
        /* all must hold: the intersection of their automata within the lengths */
        r = compile_string_dfa(c, pat ? pat : fmt, fmt ? fmt->valuestring : NULL, pat ? pat->valuestring : NULL, (size_t)mn, umx, b);
    } else if (fmt) {
        c->fmt |= needs;
        tp_buf_printf(b, "\"\\\"\" fmt-%s \"\\\"\"", fmt->valuestring);
    } else if (pat) {
        tp_buf_printf(b, "\"\\\"\" %s \"\\\"\"", body.data);
    } else if (!mn && mx == JS_UNBOUNDED) {
        tp_buf_puts(b, "string");
    } else {
        tp_buf_puts(b, "\"\\\"\" ");
        jgb_repeat(b, "char", mn, mx);
        tp_buf_puts(b, " \"\\\"\"");
    }
    if (body.err) tp_buf_fail(b, TP_ERANGE);
    tp_buf_free(&body);
    return r;
}

/* ---- objects ----------------------------------------------------------- */

typedef struct kv {
    const char *name;
    int id;   /* compiled value schema */
    bool req;
} kv;

/* a JSON string (quotes included) that is none of names: one rule per node
 * of the trie of names; extra keys may not use \u escapes, so every name has
 * one spelling and "not a name" is exact */
static int notin(jc *c, const char *base, const char **names, int n, int depth, int *counter)
{
    if (depth > JS_MAX_KEY_BYTES)
        return jfail(c, NULL, TP_ERANGE, "properties: a key longer than %d bytes beside additional properties", JS_MAX_KEY_BYTES);
    int me = (*counter)++;
    tp_buf b;
    tp_buf_init(&b, c->o->max_gbnf_bytes);
    bool term = false;
    cset kids = {0};
    for (int i = 0; i < n; i++) {
        if (!names[i][0]) {
            term = true;
            continue;
        }
        uint32_t cp;
        js_utf8_next((const unsigned char *)names[i], strlen(names[i]), &cp);
        jcs_add(&kids, cp, cp);
    }
    /* the string may end here unless a name does */
    bool alt = false;
    if (!term) {
        tp_buf_puts(&b, "\"\\\"\"");
        alt = true;
    }
    /* a first character no name continues with, then anything: one negated
     * class for the raw characters, one class for the short escapes; plain
     * sequences, so the engine makes no helper rules of them */
    cset ex = {0};
    jcs_add_set(&ex, &kids);
    jcs_add(&ex, 0, 0x1F);
    jcs_add(&ex, '"', '"');
    jcs_add(&ex, '\\', '\\');
    jcs_negate(&ex);
    /* non-ASCII characters through one shared rule unless a name continues
     * with one: each distinct big class costs the engine its own lowering */
    bool ascii_kids = kids.n == 0 || kids.r[kids.n - 1][1] < 0x80;
    if (ascii_kids) {
        cset lo = {0};
        for (int i = 0; i < ex.n && ex.r[i][0] < 0x80; i++)
            jcs_add(&lo, ex.r[i][0], ex.r[i][1] < 0x80 ? ex.r[i][1] : 0x7F);
        if (lo.n) {
            tp_buf_puts(&b, alt ? " | " : "");
            jgb_class(&b, &lo);
            tp_buf_puts(&b, " ktail");
            alt = true;
        }
        jcs_free(&lo);
        tp_buf_puts(&b, alt ? " | knonascii ktail" : "knonascii ktail");
    } else {
        tp_buf_puts(&b, alt ? " | " : "");
        jgb_class(&b, &ex);
        tp_buf_puts(&b, " ktail");
    }
    alt = true;
    jcs_free(&ex);
    static const char esc_cp[] = {'"', '\\', '\b', '\f', '\n', '\r', '\t'};
    static const char esc_ch[] = {'"', '\\', 'b', 'f', 'n', 'r', 't'};
    char escs[8];
    int ne = 0;
    for (int i = 0; i < 7; i++)
        if (!jcs_has(&kids, (unsigned char)esc_cp[i])) escs[ne++] = esc_ch[i];
    if (ne) {
        tp_buf_puts(&b, " | \"\\\\\" [");
        for (int i = 0; i < ne; i++) tp_buf_puts(&b, escs[i] == '"' ? "\\\"" : escs[i] == '\\' ? "\\\\" : (char[2]){escs[i], 0});
        tp_buf_puts(&b, "] ktail");
    }
    /* each first character of a name: that character, then the names' rests */
    const char **rest = malloc((size_t)(n ? n : 1) * sizeof *rest);
    if (!rest) {
        jcs_free(&kids);
        tp_buf_free(&b);
        return oom(c);
    }
    for (int r = 0; r < kids.n && !c->rc; r++)
        for (uint32_t cp = kids.r[r][0]; cp <= kids.r[r][1] && !c->rc; cp++) {
            int m = 0;
            for (int i = 0; i < n; i++) {
                uint32_t x;
                int len = js_utf8_next((const unsigned char *)names[i], strlen(names[i]), &x);
                if (len && x == cp) rest[m++] = names[i] + len;
            }
            int child = notin(c, base, rest, m, depth + 1, counter);
            if (child == FAIL) break;
            char e[8];
            size_t el = js_escape_cp(cp, e);
            tp_buf_puts(&b, alt ? " | " : "");
            jgb_lit(&b, e, el);
            tp_buf_printf(&b, " %s-k%d", base, child);
            alt = true;
        }
    free(rest);
    jcs_free(&kids);
    char name[64];
    snprintf(name, sizeof name, "%s-k%d", base, me);
    if (!alt) tp_buf_puts(&b, "\"\\\"\"");
    if (b.err) tp_buf_fail(&c->out, TP_ERANGE);
    rule(c, name, &b);
    tp_buf_free(&b);
    return c->rc ? FAIL : me;
}

static int compile_object(jc *c, const cJSON *s, int id, tp_buf *b)
{
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *ap = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return jfail(c, props, TP_EINVAL, "properties: expected an object");
    if (req && !cJSON_IsArray(req)) return jfail(c, req, TP_EINVAL, "required: expected an array of strings");
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
        if (!cJSON_IsString(r)) return jfail(c, r, TP_EINVAL, "required: expected an array of strings");
    int nprops = cJSON_GetArraySize(props), nreq = cJSON_GetArraySize(req);
    kv *kvs = calloc((size_t)(nprops + nreq + 1), sizeof *kvs);
    const char **names = calloc((size_t)(nprops + nreq + 1), sizeof *names);
    int n = 0, nn = 0, rc = 0;
    if (!kvs || !names) {
        rc = oom(c);
        goto out;
    }
    int apid = ap ? compile(c, ap, "additionalProperties", false) : compile(c, NULL, NULL, false);
    if (apid == FAIL) {
        rc = FAIL;
        goto out;
    }
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next) {
        bool r = false;
        for (const cJSON *q = req ? req->child : NULL; q; q = q->next) r = r || !strcmp(q->valuestring, p->string);
        int pid = compile(c, p, p->string, false);
        if (pid == FAIL) {
            rc = FAIL;
            goto out;
        }
        names[nn++] = p->string;
        if (pid == NEVER) {
            if (r) {
                rc = NEVER;
                goto out;
            }
            continue;
        }
        kvs[n++] = (kv){p->string, pid, r};
    }
    /* required keys the properties do not name take additionalProperties */
    for (const cJSON *q = req ? req->child : NULL; q; q = q->next) {
        bool known = false;
        for (int i = 0; i < nn; i++) known = known || !strcmp(names[i], q->valuestring);
        if (known) continue;
        if (apid == NEVER) {
            rc = NEVER;
            goto out;
        }
        names[nn++] = q->valuestring;
        kvs[n++] = (kv){q->valuestring, apid, true};
    }
    char base[32];
    snprintf(base, sizeof base, "s%d", id);
    /* extra keys: "key" ws ":" ws value */
    char extra[48] = "";
    if (apid != NEVER) {
        for (int i = 0; i < nn; i++) {
            uint32_t cp;
            const char *p = names[i];
            for (size_t len = strlen(p); len;) {
                int k = js_utf8_next((const unsigned char *)p, len, &cp);
                if (!k) {
                    rc = jfail(c, (props ? cJSON_GetObjectItemCaseSensitive(props, names[i]) : NULL) ? cJSON_GetObjectItemCaseSensitive(props, names[i]) : req, TP_EINVAL, "properties: a key that is not valid UTF-8");
                    goto out;
                }
                p += k, len -= (size_t)k;
            }
        }
        int counter = 0;
        tp_buf x;
        tp_buf_init(&x, c->o->max_gbnf_bytes);
        if (nn) {
            int k0 = notin(c, base, names, nn, 0, &counter);
            if (k0 == FAIL) {
                tp_buf_free(&x);
                rc = FAIL;
                goto out;
            }
            tp_buf_printf(&x, "\"\\\"\" %s-k%d ws \":\" ws s%d", base, k0, apid);
        } else {
            tp_buf_printf(&x, "\"\\\"\" kchar* \"\\\"\" ws \":\" ws s%d", apid);
        }
        snprintf(extra, sizeof extra, "%s-x", base);
        rule(c, extra, &x);
        tp_buf_free(&x);
    }
    /* T_i: the rest after something was written; F_i: nothing written yet */
    for (int i = n; i >= 0; i--) {
        tp_buf t, f;
        tp_buf_init(&t, c->o->max_gbnf_bytes);
        tp_buf_init(&f, c->o->max_gbnf_bytes);
        char name[64];
        if (i == n) {
            if (*extra) {
                tp_buf_printf(&t, "( \",\" ws %s ws )*", extra);
                tp_buf_printf(&f, "( %s ws ( \",\" ws %s ws )* )?", extra, extra);
            } else {
                tp_buf_puts(&t, "\"\"");
                tp_buf_puts(&f, "\"\"");
            }
        } else {
            tp_buf k;
            tp_buf_init(&k, 1u << 20);
            jgb_json_str(&k, kvs[i].name, strlen(kvs[i].name), true);
            tp_buf_printf(&k, " ws \":\" ws s%d ws", kvs[i].id);
            if (kvs[i].req) {
                tp_buf_printf(&t, "\",\" ws %s %s-t%d", k.data, base, i + 1);
                tp_buf_printf(&f, "%s %s-t%d", k.data, base, i + 1);
            } else {
                tp_buf_printf(&t, "( \",\" ws %s )? %s-t%d", k.data, base, i + 1);
                tp_buf_printf(&f, "%s %s-t%d | %s-f%d", k.data, base, i + 1, base, i + 1);
            }
            if (k.err) tp_buf_fail(&c->out, TP_ERANGE);
            tp_buf_free(&k);
        }
        snprintf(name, sizeof name, "%s-t%d", base, i);
        rule(c, name, &t);
        snprintf(name, sizeof name, "%s-f%d", base, i);
        rule(c, name, &f);
        if (t.err || f.err) tp_buf_fail(&c->out, TP_ERANGE);
        tp_buf_free(&t);
        tp_buf_free(&f);
    }
    tp_buf_printf(b, "\"{\" ws %s-f0 \"}\"", base);
out:
    free(kvs);
    free(names);
    return rc;
}

/* ---- arrays ------------------------------------------------------------ */

static int compile_array(jc *c, const cJSON *s, int id, tp_buf *b)
{
    long long mn, mx;
    if (get_count(c, s, "minItems", 0, &mn) || get_count(c, s, "maxItems", JS_UNBOUNDED, &mx)) return FAIL;
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(s, "uniqueItems");
    if (u && !cJSON_IsFalse(u)) return jfail(c, u, TP_EINVAL, "uniqueItems: true is not supported");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    if (pre && !cJSON_IsArray(pre)) return jfail(c, pre, TP_EINVAL, "prefixItems: expected an array of schemas");
    if (cJSON_IsArray(items)) return jfail(c, items, TP_EINVAL, "items: an array (draft 2019 form) is not supported, use prefixItems");
    int np = cJSON_GetArraySize(pre);
    int *pid = calloc((size_t)np + 1, sizeof *pid);
    if (!pid) return oom(c);
    int k = 0;
    for (const cJSON *p = pre ? pre->child : NULL; p; p = p->next) {
        pid[k] = compile(c, p, "prefixItems", false);
        if (pid[k] == FAIL) {
            free(pid);
            return FAIL;
        }
        if (pid[k] == NEVER) { /* no array reaches past this position */
            if (mx == JS_UNBOUNDED || mx > k) mx = k;
            break;
        }
        k++;
    }
    int iid = items ? compile(c, items, "items", false) : -3;
    if (iid == FAIL) {
        free(pid);
        return FAIL;
    }
    if (iid == NEVER && (mx == JS_UNBOUNDED || mx > k)) mx = k;
    if (k > mx && mx != JS_UNBOUNDED) k = (int)mx;
    if (mx != JS_UNBOUNDED && mn > mx) {
        free(pid);
        return NEVER;
    }
    char base[32];
    snprintf(base, sizeof base, "s%d", id);
    char item[32], more[64];
    if (iid >= 0) snprintf(item, sizeof item, "s%d", iid);
    else snprintf(item, sizeof item, "value");
    snprintf(more, sizeof more, "( \",\" ws %s ws )", item);
    /* A_i: the rest after i elements were written */
    for (int i = k; i >= 1; i--) {
        tp_buf t;
        tp_buf_init(&t, c->o->max_gbnf_bytes);
        if (i == k) {
            long long rmin = mn > k ? mn - k : 0;
            if (mx != JS_UNBOUNDED && mx - k == 0) tp_buf_puts(&t, "\"\"");
            else jgb_repeat(&t, more, rmin, mx == JS_UNBOUNDED ? -1 : mx - k);
        } else if (i < mn) {
            tp_buf_printf(&t, "\",\" ws s%d ws %s-a%d", pid[i], base, i + 1);
        } else {
            tp_buf_printf(&t, "( \",\" ws s%d ws %s-a%d )?", pid[i], base, i + 1);
        }
        char name[64];
        snprintf(name, sizeof name, "%s-a%d", base, i);
        rule(c, name, &t);
        if (t.err) tp_buf_fail(&c->out, TP_ERANGE);
        tp_buf_free(&t);
    }
    if (mx == 0) {
        tp_buf_puts(b, "\"[\" ws \"]\"");
    } else if (k > 0) {
        tp_buf_printf(b, "\"[\" ws ( s%d ws %s-a1 )%s \"]\"", pid[0], base, mn ? "" : "?");
    } else {
        long long rmin = mn ? mn - 1 : 0;
        tp_buf_printf(b, "\"[\" ws ( %s ws ", item);
        jgb_repeat(b, more, rmin, mx == JS_UNBOUNDED ? -1 : mx - 1);
        tp_buf_printf(b, " )%s \"]\"", mn ? "" : "?");
    }
    free(pid);
    return 0;
}

/* ---- oneOf ------------------------------------------------------------- */

/* can no instance satisfy both a and b? (a sufficient test) */
static bool disjoint(jc *c, const cJSON *a, const cJSON *b)
{
    if (cJSON_IsFalse(a) || cJSON_IsFalse(b)) return true;
    if (!cJSON_IsObject(a) || !cJSON_IsObject(b)) return false;
    unsigned ta = types_of(c, a), tb = types_of(c, b);
    if (ta & T_NUM) ta |= T_INT;
    if (tb & T_NUM) tb |= T_INT;
    if (!(ta & tb & T_ALL)) return true;
    /* enum/const sets with no common value */
    const cJSON *ea = cJSON_GetObjectItemCaseSensitive(a, "enum"), *eb = cJSON_GetObjectItemCaseSensitive(b, "enum");
    const cJSON *ca = cJSON_GetObjectItemCaseSensitive(a, "const"), *cb = cJSON_GetObjectItemCaseSensitive(b, "const");
    if ((ea || ca) && (eb || cb)) {
        bool common = false;
        for (const cJSON *x = ca ? ca : ea->child; x && !common; x = ca ? NULL : x->next)
            for (const cJSON *y = cb ? cb : eb->child; y && !common; y = cb ? NULL : y->next) common = js_equal(x, y);
        if (!common) return true;
    }
    /* objects only: a property both fix to different constants (a tag), or
     * one requires a key the other forbids */
    if ((ta | tb) & ~T_OBJ & T_ALL) return false;
    const cJSON *pa = cJSON_GetObjectItemCaseSensitive(a, "properties"), *pb = cJSON_GetObjectItemCaseSensitive(b, "properties");
    for (const cJSON *x = cJSON_IsObject(pa) ? pa->child : NULL; x; x = x->next) {
        const cJSON *y = cJSON_IsObject(pb) ? cJSON_GetObjectItemCaseSensitive(pb, x->string) : NULL;
        if (!y) continue;
        bool ra = false, rb = false;
        const cJSON *qa = cJSON_GetObjectItemCaseSensitive(a, "required"), *qb = cJSON_GetObjectItemCaseSensitive(b, "required");
        for (const cJSON *q = cJSON_IsArray(qa) ? qa->child : NULL; q; q = q->next) ra = ra || (cJSON_IsString(q) && !strcmp(q->valuestring, x->string));
        for (const cJSON *q = cJSON_IsArray(qb) ? qb->child : NULL; q; q = q->next) rb = rb || (cJSON_IsString(q) && !strcmp(q->valuestring, x->string));
        if ((ra || rb) && disjoint(c, x, y)) return true;
    }
    for (int w = 0; w < 2; w++) {
        const cJSON *r = w ? b : a, *o = w ? a : b;
        const cJSON *req = cJSON_GetObjectItemCaseSensitive(r, "required");
        const cJSON *po = w ? pa : pb;
        const cJSON *ap = cJSON_GetObjectItemCaseSensitive(o, "additionalProperties");
        for (const cJSON *q = cJSON_IsArray(req) ? req->child : NULL; q; q = q->next) {
            if (!cJSON_IsString(q)) continue;
            const cJSON *sch = cJSON_IsObject(po) ? cJSON_GetObjectItemCaseSensitive(po, q->valuestring) : NULL;
            if (!sch) sch = ap;
            if (cJSON_IsFalse(sch)) return true;
        }
    }
    return false;
}

/* oneOf with too many branches to compare in pairs: exclusive only when
 * every branch is a const/enum and no value repeats (one hash set) */
static int consts_distinct(jc *c, cJSON *const *br, int nb)
{
    jc seen = {.o = c->o};
    int rc = 0;
    for (int i = 0; i < nb && !rc; i++) {
        const cJSON *b = br[i];
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(b, "enum"), *k = cJSON_GetObjectItemCaseSensitive(b, "const");
        bool plain = cJSON_IsObject(b) && (e || k);
        for (const cJSON *f = cJSON_IsObject(b) ? b->child : NULL; f && plain; f = f->next)
            plain = is_annotation(f->string) || !strcmp(f->string, "enum") || !strcmp(f->string, "const");
        if (!plain || (e && k) || (e && !cJSON_IsArray(e))) {
            rc = jfail(c, b, TP_EINVAL, "oneOf: %d branches are too many to prove that they exclude each other (only "
                                     "when all are const/enum)", nb);
            break;
        }
        for (const cJSON *v = k ? k : e->child; v && !rc; v = k ? NULL : v->next) {
            char *t = cJSON_PrintUnformatted(v);
            if (!t) rc = oom(c);
            else if (memo_find(&seen, t) >= 0) {
                free(t);
                rc = jfail(c, v, TP_EINVAL, "oneOf: two branches allow the same value (it must match only one): not supported");
            } else if (memo_add(&seen, t, 0) < 0) {
                free(t);
                rc = oom(c);
            }
        }
    }
    for (int i = 0; i < seen.nm; i++) free(seen.m[i].key);
    free(seen.m);
    free(seen.idx);
    return rc;
}

/* ---- one schema -------------------------------------------------------- */

static int compile_plain(jc *c, const cJSON *s, int id, tp_buf *b)
{
    for (const cJSON *k = s->child; k; k = k->next)
        if (!is_annotation(k->string) && !in_list(handled, k->string))
            return jfail(c, k, TP_EINVAL, "keyword '%.64s' is not supported", k->string);
    const cJSON *pid = cJSON_GetObjectItemCaseSensitive(s, "$id");
    if (pid && s != c->root) return jfail(c, pid, TP_EINVAL, "$id: only on the root schema");
    unsigned types = types_of(c, s);
    if (!types) return FAIL;
    if (types & 128) return NEVER;
    if (cJSON_GetObjectItemCaseSensitive(s, "enum") || cJSON_GetObjectItemCaseSensitive(s, "const"))
        return compile_enum(c, s, types, b);
    int alts = 0;
    for (int t = 0; t < 6; t++) {
        static const unsigned order[] = {T_OBJ, T_ARR, T_STR, T_NUM, T_BOOL, T_NULL};
        unsigned bit = order[t];
        bool is_int = false;
        if (bit == T_NUM && !(types & T_NUM)) {
            if (!(types & T_INT)) continue;
            is_int = true;
        } else if (!(types & bit)) {
            continue;
        }
        tp_buf x;
        tp_buf_init(&x, c->o->max_gbnf_bytes);
        int r = 0;
        switch (bit) {
        case T_OBJ: r = compile_object(c, s, id, &x); break;
        case T_ARR: r = compile_array(c, s, id, &x); break;
        case T_STR: r = compile_string(c, s, &x); break;
        case T_NUM: r = compile_number(c, s, is_int, &x); break;
        case T_BOOL: tp_buf_puts(&x, "boolean"); break;
        default: tp_buf_puts(&x, "null"); break;
        }
        if (r == 0) {
            if (alts++) tp_buf_puts(b, " | ");
            tp_buf_puts(b, x.data);
        }
        if (x.err) tp_buf_fail(b, TP_ERANGE);
        tp_buf_free(&x);
        if (r == FAIL) return FAIL;
    }
    return alts ? 0 : NEVER;
}

static int compile_body(jc *c, const cJSON *s, int id, tp_buf *b)
{
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    if (r && only_annotations(s, "$ref")) {
        if (!cJSON_IsString(r)) return jfail(c, r, TP_EINVAL, "$ref: expected a string");
        const cJSON *t = resolve(c, r);
        if (!t) return FAIL;
        int tid = compile(c, t, r->valuestring, true);
        if (tid >= 0) ref(b, tid);
        return tid < 0 ? tid : 0;
    }
    if (r || all) {
        const cJSON *one[1] = {s};
        cJSON *m = merge_all(c, one, 1);
        if (!m) return FAIL;
        int mid = compile(c, m, "allOf", true);
        keep(c, m);
        if (mid >= 0) ref(b, mid);
        return mid < 0 ? mid : 0;
    }
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    const char *kw = "anyOf";
    if (!any) any = cJSON_GetObjectItemCaseSensitive(s, kw = "oneOf");
    if (!any) return compile_plain(c, s, id, b);
    if (!cJSON_IsArray(any) || !any->child) return jfail(c, any, TP_EINVAL, "%s: expected a non-empty array", kw);
    /* the siblings of anyOf/oneOf apply to every branch */
    cJSON *rest = cJSON_Duplicate(s, true);
    if (!rest) return oom(c);
    cJSON_DeleteItemFromObjectCaseSensitive(rest, kw);
    bool plain = only_annotations(rest, NULL);
    int nb = cJSON_GetArraySize(any), alts = 0, rc = 0;
    cJSON **br = calloc((size_t)nb, sizeof *br);
    if (!br) {
        cJSON_Delete(rest);
        return oom(c);
    }
    int i = 0;
    for (const cJSON *a = any->child; a; a = a->next, i++) {
        const cJSON *two[2] = {rest, a};
        /* a branch behind $ref/allOf is resolved first, so that oneOf sees
         * the properties that tell the branches apart */
        bool direct = plain && !(cJSON_IsObject(a) && (cJSON_GetObjectItemCaseSensitive(a, "$ref") ||
                                                      cJSON_GetObjectItemCaseSensitive(a, "allOf")));
        br[i] = direct ? dup_from(c, a) : merge_all(c, two + (plain ? 1 : 0), plain ? 1 : 2);
        if (!br[i]) {
            rc = c->rc ? FAIL : oom(c);
            goto out;
        }
    }
    if (!strcmp(kw, "oneOf") && (double)nb * (nb - 1) / 2 > JS_MAX_ONEOF_PAIRS) {
        rc = consts_distinct(c, br, nb);
        if (rc) goto out;
    } else if (!strcmp(kw, "oneOf"))
        for (int x = 0; x < nb; x++)
            for (int y = x + 1; y < nb; y++)
                if (!disjoint(c, br[x], br[y])) {
                    rc = jfail(c, cJSON_GetArrayItem(any, y), TP_EINVAL, "oneOf: branches %d and %d may both match; only oneOf with branches "
                                             "that exclude each other (types, constants, required/forbidden keys) is supported",
                               x, y);
                    goto out;
                }
    for (i = 0; i < nb; i++) {
        int bid = compile(c, br[i], kw, true);
        if (bid == FAIL) {
            rc = FAIL;
            goto out;
        }
        if (bid == NEVER) continue;
        if (alts++) tp_buf_puts(b, " | ");
        ref(b, bid);
    }
    rc = alts ? 0 : NEVER;
out:
    for (i = 0; i < nb; i++) keep(c, br[i]);
    free(br);
    cJSON_Delete(rest);
    return rc;
}

/* the rule number of schema s (compiled once), NEVER or FAIL. A NULL s is
 * the `true` schema (any value). */
static int compile_in(jc *c, const cJSON *s, const char *where);

static int compile(jc *c, const cJSON *s, const char *where, bool left)
{
    int base = c->left_base;
    if (!left) c->left_base = c->nopen;
    int r = compile_in(c, s, where);
    c->left_base = base;
    return r;
}

static bool left_recursive(const jc *c, int id)
{
    for (int i = c->left_base; i < c->nopen; i++)
        if (c->open[i] == id) return true;
    return false;
}

static int compile_in(jc *c, const cJSON *s, const char *where)
{
    if (c->rc) return FAIL;
    if (!s || cJSON_IsTrue(s) || (cJSON_IsObject(s) && only_annotations(s, NULL) && s != c->root)) {
        int i = memo_find(c, "true");
        if (i >= 0) return c->m[i].id;
        char *key = strdup("true");
        int id = c->next++;
        if (!key || memo_add(c, key, id) < 0) {
            free(key);
            return oom(c);
        }
        tp_buf_printf(&c->out, "s%d ::= value\n", id);
        return id;
    }
    if (cJSON_IsFalse(s)) return NEVER;
    if (!cJSON_IsObject(s))
        return jfail(c, s, TP_EINVAL, "%s%sa schema must be an object or a boolean", where ? where : "",
                     where ? ": " : "");
    if (c->depth >= c->o->max_depth) return jfail(c, s, TP_ERANGE, "schemas nested deeper than %d", c->o->max_depth);
    char *key = cJSON_PrintUnformatted(s);
    if (!key) return oom(c);
    int i = memo_find(c, key);
    if (i >= 0) {
        free(key);
        if (left_recursive(c, c->m[i].id))
            return jfail(c, s, TP_EINVAL, "%s%sa $ref cycle that writes nothing before it repeats (left recursion)",
                         where ? where : "", where ? ": " : "");
        return c->m[i].id;
    }
    int id = c->next++;
    int slot = memo_add(c, key, id);
    if (slot < 0) {
        free(key);
        return oom(c);
    }
    if (c->nopen == c->copen) {
        int cn = c->copen ? c->copen * 2 : 16;
        int *o = realloc(c->open, (size_t)cn * sizeof *o);
        if (!o) return oom(c);
        c->open = o;
        const cJSON **w = realloc(c->sch, (size_t)cn * sizeof *w);
        if (!w) return oom(c);
        c->sch = w;
        c->copen = cn;
    }
    c->sch[c->nopen] = s;
    c->open[c->nopen++] = id;
    c->depth++;
    tp_buf b;
    tp_buf_init(&b, c->o->max_gbnf_bytes);
    int r = compile_body(c, s, id, &b);
    c->depth--;
    c->nopen--;
    if (r == FAIL || c->rc) {
        tp_buf_free(&b);
        return FAIL;
    }
    if (b.err) tp_buf_fail(&c->out, TP_ERANGE);
    char name[32];
    snprintf(name, sizeof name, "s%d", id);
    if (r == NEVER) {
        /* the rule may already be named by a recursive use: it matches nothing */
        tp_buf_printf(&c->out, "%s ::= never\n", name);
        if (!c->never_rule) c->never_at = s;
        c->never_rule = true;
        c->m[slot].id = NEVER;
    } else {
        rule(c, name, &b);
    }
    tp_buf_free(&b);
    return r == NEVER ? NEVER : id;
}

void tp_jschema_opts_default(tp_jschema_opts *o)
{
    o->max_schema_bytes = TP_JSCHEMA_DEF_MAX_SCHEMA_BYTES;
    o->max_depth = TP_JSCHEMA_DEF_MAX_DEPTH;
    o->max_gbnf_bytes = TP_JSCHEMA_DEF_MAX_GBNF_BYTES;
}

/* cJSON's parser recurses once per nesting level (its own limit is 1000):
 * count the depth of the text first so a hostile schema is refused cheaply */
static int text_depth(const char *s, size_t n)
{
    int d = 0, max = 0;
    bool str = false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (str) {
            if (ch == '\\') i++;
            else if (ch == '"') str = false;
        } else if (ch == '"') {
            str = true;
        } else if (ch == '{' || ch == '[') {
            if (++d > max) max = d;
        } else if (ch == '}' || ch == ']') {
            d--;
        }
    }
    return max;
}

static int finish(jc *c, int root, char **gbnf)
{
    if (root == FAIL) return c->rc;
    char loc[JS_ERR_POINTER_BYTES + JS_ERR_VALUE_BYTES + 64];
    if (root == NEVER) {
        refusal_at(c, c->root, loc, sizeof loc);
        return tp_err_set(c->err, TP_EINVAL, "json schema: accepts no value at all%s", loc);
    }
    /* GBNF has no element that matches nothing (the engine refuses an empty
     * class), so a subschema no value satisfies is refused, not written */
    if (c->never_rule) {
        refusal_at(c, c->never_at, loc, sizeof loc);
        return tp_err_set(c->err, TP_EINVAL, "json schema: a subschema accepts no value (e.g. minimum above maximum)%s", loc);
    }
    tp_buf all;
    tp_buf_init(&all, c->o->max_gbnf_bytes);
    tp_buf_printf(&all, "root ::= s%d\n", root);
    tp_buf_add(&all, c->out.data ? c->out.data : "", c->out.len);
    tp_buf_puts(&all, common_rules);
    tp_err fe = {0};
    if (fmt_rules(&all, c->fmt, c->o->max_depth, &fe)) {
        tp_buf_free(&all);
        return tp_err_set(c->err, fe.code, "json schema: %s", fe.msg);
    }
    if (c->never_rule) tp_buf_puts(&all, "never ::= [^\\x00-\\U0010FFFF]\n");
    if (c->out.err == TP_ENOMEM || all.err == TP_ENOMEM) {
        tp_buf_free(&all);
        return tp_err_set(c->err, TP_ENOMEM, "json schema: out of memory");
    }
    if (c->out.err || all.err) {
        tp_buf_free(&all);
        return tp_err_set(c->err, TP_ERANGE, "json schema: the grammar exceeds the limit of %zu bytes",
                          c->o->max_gbnf_bytes);
    }
    *gbnf = tp_buf_take(&all);
    return 0;
}

static void jc_free(jc *c)
{
    for (size_t i = 0; i < c->nkeep; i++) cJSON_Delete(c->keep[i]);
    free(c->keep);
    free(c->orig);
    free(c->sch);
    for (int i = 0; i < c->nm; i++) free(c->m[i].key);
    free(c->m);
    free(c->idx);
    free(c->open);
    tp_buf_free(&c->out);
}

int tp_jschema_to_gbnf(const char *schema_json, size_t len, const tp_jschema_opts *o, char **gbnf,
                       tp_err *err)
{
    tp_jschema_opts def;
    int rc0 = js_begin("json schema", schema_json, len, &o, &def, gbnf, err);
    if (rc0) return rc0;
    if (text_depth(schema_json, len) > o->max_depth)
        return tp_err_set(err, TP_ERANGE, "json schema: nested deeper than the limit of %d", o->max_depth);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(schema_json, len, &end, false);
    if (!root) {
        size_t at = end ? (size_t)(end - schema_json) : 0;
        return tp_err_set(err, TP_EINVAL, "json schema: not valid JSON (at byte %zu)", at);
    }
    for (; end && (size_t)(end - schema_json) < len; end++)
        if (!strchr(" \t\r\n", *end) && *end) {
            cJSON_Delete(root);
            return tp_err_set(err, TP_EINVAL, "json schema: text after the JSON value (at byte %zu)",
                              (size_t)(end - schema_json));
        }
    jc c = {.o = o, .root = root, .err = err};
    tp_buf_init(&c.out, o->max_gbnf_bytes);
    int r = compile(&c, root, NULL, true);
    int rc = finish(&c, r, gbnf);
    jc_free(&c);
    cJSON_Delete(root);
    return rc;
}

int tp_jschema_json_mode_gbnf(char **gbnf, tp_err *err)
{
    tp_jschema_opts o;
    tp_jschema_opts_default(&o);
    jc c = {.o = &o, .err = err};
    tp_buf_init(&c.out, o.max_gbnf_bytes);
    tp_buf_puts(&c.out, "s0 ::= object\n");
    int rc = finish(&c, 0, gbnf);
    jc_free(&c);
    return rc;
}
