/* Chat templates, part 1: text -> tokens, with Jinja's whitespace rules
 * (trim_blocks, lstrip_blocks, "-" and "+" markers, newline normalisation,
 * the dropped trailing newline) applied to the data between tags. */
#include "tokpipe/utf8.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_internal.h"

/* Python's str.isspace() set, which Jinja's \s and str.strip() use. */
size_t tp_chat_ws_at(const char *s, size_t n, size_t i)
{
    unsigned char c = (unsigned char)s[i];
    if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f))
        return 1;
    if (c < 0x80)
        return 0;
    uint32_t cp;
    size_t len = tp_utf8_get((const uint8_t *)s + i, n - i, &cp);
    if (!len)
        return 0;
    if (cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
        cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000)
        return len;
    return 0;
}

/* Byte length of the whitespace character ending at i (exclusive), or 0. */
size_t tp_chat_ws_before(const char *s, size_t i)
{
    if (i == 0)
        return 0;
    if (tp_chat_ws_at(s, i, i - 1) == 1)
        return 1;
    for (size_t len = 2; len <= 3 && len <= i; len++)
        if (tp_chat_ws_at(s, i, i - len) == len)
            return len;
    return 0;
}

static int lex_fail(tp_chat_lexer *lx, int code, int line, const char *what)
{
    return tp_err_set(lx->err, code, "chat template line %d: %s", line, what);
}

static int push(tp_chat_lexer *lx, tp_chat_tok t)
{
    if (lx->n == lx->cap) {
        size_t nc = lx->cap ? lx->cap * 2 : 256;
        tp_chat_tok *nt = realloc(lx->toks, nc * sizeof *nt);
        if (!nt)
            return tp_err_set(lx->err, TP_ENOMEM, "chat template: out of memory");
        lx->toks = nt;
        lx->cap = nc;
    }
    lx->toks[lx->n++] = t;
    return 0;
}

static int count_lines(const char *s, size_t a, size_t b)
{
    int k = 0;
    for (size_t i = a; i < b; i++)
        k += s[i] == '\n';
    return k;
}

static int is_name_start(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* A string literal's body with Python's unicode-escape rules (what Jinja
 * applies); an escape Python keeps literally (\d) is kept. */
static int lex_string(tp_chat_lexer *lx, size_t *pos, int line, tp_chat_tok *t)
{
    const char *s = lx->src;
    char q = s[*pos];
    size_t i = *pos + 1;
    size_t start = i;
    while (i < lx->len && s[i] != q) {
        if (s[i] == '\\' && i + 1 < lx->len)
            i++;
        i++;
    }
    if (i >= lx->len)
        return lex_fail(lx, TP_EFORMAT, line, "unterminated string literal");
    char *o = malloc(i - start + 1);
    if (!o)
        return tp_err_set(lx->err, TP_ENOMEM, "chat template: out of memory");
    size_t k = 0;
    for (size_t j = start; j < i; j++) {
        if (s[j] != '\\') {
            o[k++] = s[j];
            continue;
        }
        char e = s[++j];
        switch (e) {
        case 'n': o[k++] = '\n'; break;
        case 't': o[k++] = '\t'; break;
        case 'r': o[k++] = '\r'; break;
        case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break;
        case '"': o[k++] = '"'; break;
        case 'a': o[k++] = '\a'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'v': o[k++] = '\v'; break;
        case '\n': break;
        case 'x': case 'u': case 'U': {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            unsigned cp = 0;
            for (int d = 0; d < nd; d++) {
                int h = j + 1 + (size_t)d < i ? hexval(s[j + 1 + d]) : -1;
                if (h < 0) {
                    free(o);
                    return lex_fail(lx, TP_EFORMAT, line, "truncated \\x/\\u escape in string literal");
                }
                cp = cp * 16 + (unsigned)h;
            }
            if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
                free(o);
                return lex_fail(lx, TP_EINVAL, line, "unsupported construct: surrogate or out-of-range escape");
            }
            j += (size_t)nd;
            k += tp_utf8_put(cp, o + k);
            break;
        }
        case 'N':
            free(o);
            return lex_fail(lx, TP_EINVAL, line, "unsupported construct: \\N{...} escape");
        default:
            if (e >= '0' && e <= '7') {
                unsigned cp = 0;
                int d = 0;
                while (d < 3 && j < i && s[j] >= '0' && s[j] <= '7') {
                    cp = cp * 8 + (unsigned)(s[j] - '0');
                    j++;
                    d++;
                }
                j--;
                k += tp_utf8_put(cp, o + k);
            } else {
                o[k++] = '\\';
                o[k++] = e;
            }
        }
    }
    t->kind = TK_STRING;
    t->s = o;
    t->n = k;
    t->owned = 1;
    *pos = i + 1;
    return 0;
}

static int lex_number(tp_chat_lexer *lx, size_t *pos, int line, tp_chat_tok *t)
{
    const char *s = lx->src;
    size_t i = *pos;
    char buf[64];
    size_t k = 0;
    int is_float = 0;
    while (i < lx->len && (is_digit(s[i]) || s[i] == '_')) {
        if (s[i] != '_' && k < sizeof buf - 1)
            buf[k++] = s[i];
        i++;
    }
    if (i + 1 < lx->len && s[i] == '.' && is_digit(s[i + 1])) {
        is_float = 1;
        if (k < sizeof buf - 1)
            buf[k++] = '.';
        i++;
        while (i < lx->len && (is_digit(s[i]) || s[i] == '_')) {
            if (s[i] != '_' && k < sizeof buf - 1)
                buf[k++] = s[i];
            i++;
        }
    }
    if (i < lx->len && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1;
        if (j < lx->len && (s[j] == '+' || s[j] == '-'))
            j++;
        if (j < lx->len && is_digit(s[j])) {
            is_float = 1;
            while (i < j && k < sizeof buf - 1)
                buf[k++] = s[i++];
            while (i < lx->len && is_digit(s[i]) && k < sizeof buf - 1)
                buf[k++] = s[i++];
        }
    }
    buf[k] = 0;
    if (k >= sizeof buf - 1)
        return lex_fail(lx, TP_ERANGE, line, "number literal too long");
    if (is_float) {
        t->kind = TK_FLOAT;
        t->f = strtod(buf, NULL);
    } else {
        char *end;
        unsigned long long v = strtoull(buf, &end, 10);
        if (k > 18 || v > (unsigned long long)INT64_MAX)
            return lex_fail(lx, TP_ERANGE, line, "integer literal out of range");
        t->kind = TK_INT;
        t->i = (int64_t)v;
    }
    *pos = i;
    return 0;
}

static const char *const OPS2[] = {"//", "**", "==", "!=", "<=", ">=", NULL};
static const char OPS1[] = "+-*/%~<>=()[]{},.:|";

/* Tokens of one tag, from *pos (just after "{{"/"{%" and a marker) to its
 * end; *strip_after / *no_trim say how the tag ended. */
static int lex_tag(tp_chat_lexer *lx, size_t *pos, int *line, int is_block, int *strip_after, int *no_trim)
{
    const char *s = lx->src;
    size_t i = *pos;
    int depth = 0;   /* open ( [ {: "}}" inside a dict literal is not the end */
    char close = is_block ? '%' : '}';
    for (;;) {
        while (i < lx->len && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) {
            if (s[i] == '\n')
                (*line)++;
            i++;
        }
        if (i >= lx->len)
            return lex_fail(lx, TP_EFORMAT, *line, is_block ? "unterminated {% tag" : "unterminated {{ tag");
        if (depth == 0 || is_block) {
            size_t j = i;
            int minus = 0, plus = 0;
            if (s[j] == '-' && j + 2 < lx->len + 1 && j + 1 < lx->len && s[j + 1] == close) {
                minus = 1;
                j++;
            } else if (is_block && s[j] == '+' && j + 1 < lx->len && s[j + 1] == close) {
                plus = 1;
                j++;
            }
            if (j + 1 < lx->len && s[j] == close && s[j + 1] == '}' && (is_block || depth == 0)) {
                *strip_after = minus;
                *no_trim = plus;
                *pos = j + 2;
                return 0;
            }
        }
        tp_chat_tok t = {0};
        t.line = *line;
        char c = s[i];
        int rc;
        if (c == '\'' || c == '"') {
            int l0 = *line;
            size_t a = i;
            if ((rc = lex_string(lx, &i, l0, &t)))
                return rc;
            *line += count_lines(s, a, i);
        } else if (is_digit(c)) {
            if ((rc = lex_number(lx, &i, *line, &t)))
                return rc;
        } else if (is_name_start(c)) {
            size_t a = i;
            while (i < lx->len && (is_name_start(s[i]) || is_digit(s[i])))
                i++;
            t.kind = TK_NAME;
            t.s = s + a;
            t.n = i - a;
        } else {
            t.kind = TK_OP;
            int found = 0;
            for (int k = 0; OPS2[k]; k++) {
                if (i + 1 < lx->len && s[i] == OPS2[k][0] && s[i + 1] == OPS2[k][1]) {
                    memcpy(t.op, OPS2[k], 2);
                    i += 2;
                    found = 1;
                    break;
                }
            }
            if (!found) {
                if (!strchr(OPS1, c) || c == 0) {
                    char msg[64];
                    snprintf(msg, sizeof msg, "unexpected character '%c' in tag", c);
                    return lex_fail(lx, TP_EFORMAT, *line, msg);
                }
                t.op[0] = c;
                i++;
                if (c == '(' || c == '[' || c == '{')
                    depth++;
                else if ((c == ')' || c == ']' || c == '}') && depth > 0)
                    depth--;
            }
        }
        if ((rc = push(lx, t))) {
            if (t.owned)
                free((char *)t.s);
            return rc;
        }
    }
}

int tp_chat_lex(tp_chat_lexer *lx)
{
    const char *s = lx->src;
    size_t n = lx->len;
    size_t pos = 0;
    int line = 1;
    int line_starting = 1;
    int strip_next = 0;
    int rc;
    while (pos < n) {
        if (strip_next) {
            size_t w;
            while (pos < n && (w = tp_chat_ws_at(s, n, pos))) {
                if (s[pos] == '\n')
                    line++;
                pos += w;
            }
            strip_next = 0;
            continue;
        }
        size_t tag = pos;
        while (tag + 1 < n && !(s[tag] == '{' && (s[tag + 1] == '{' || s[tag + 1] == '%' || s[tag + 1] == '#')))
            tag++;
        if (tag + 1 >= n)
            tag = n;
        size_t text_end = tag;
        char kind = tag < n ? s[tag + 1] : 0;
        char sign = tag + 2 < n ? s[tag + 2] : 0;
        if (tag < n && sign == '-') {
            size_t w;
            while (text_end > pos && (w = tp_chat_ws_before(s, text_end)) && text_end - w >= pos)
                text_end -= w;
        } else if (tag < n && sign != '+' && kind != '{') {
            size_t l_pos = text_end;
            while (l_pos > pos && s[l_pos - 1] != '\n')
                l_pos--;
            if ((l_pos > pos || line_starting) && l_pos < text_end) {
                int all_ws = 1;
                for (size_t k = l_pos; k < text_end;) {
                    size_t w = tp_chat_ws_at(s, text_end, k);
                    if (!w || s[k] == '\n') {
                        all_ws = 0;
                        break;
                    }
                    k += w;
                }
                if (all_ws)
                    text_end = l_pos;
            }
        }
        if (text_end > pos) {
            tp_chat_tok t = {.kind = TK_DATA, .line = line, .s = s + pos, .n = text_end - pos};
            if ((rc = push(lx, t)))
                return rc;
        }
        line += count_lines(s, pos, tag);
        if (tag >= n)
            break;
        size_t p = tag + 2;
        if (sign == '-' || sign == '+')
            p++;
        if (kind == '#') {
            size_t e = p;
            while (e + 1 < n && !(s[e] == '#' && s[e + 1] == '}'))
                e++;
            if (e + 1 >= n)
                return lex_fail(lx, TP_EFORMAT, line, "unterminated {# comment");
            line += count_lines(s, p, e);
            int minus = e > p && s[e - 1] == '-';
            pos = e + 2;
            if (minus)
                strip_next = 1;
            else if (pos < n && s[pos] == '\n') {
                pos++;
                line++;
            }
            line_starting = s[pos - 1] == '\n';
            continue;
        }
        int is_block = kind == '%';
        tp_chat_tok b = {.kind = is_block ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, .line = line};
        if ((rc = push(lx, b)))
            return rc;
        int strip_after = 0, no_trim = 0;
        if ((rc = lex_tag(lx, &p, &line, is_block, &strip_after, &no_trim)))
            return rc;
        tp_chat_tok e = {.kind = is_block ? TK_BLOCK_END : TK_VAR_END, .line = line};
        if ((rc = push(lx, e)))
            return rc;
        pos = p;
        if (strip_after)
            strip_next = 1;
        else if (is_block && !no_trim && pos < n && s[pos] == '\n') {
            pos++;
            line++;
        }
        line_starting = s[pos - 1] == '\n';
    }
    tp_chat_tok eof = {.kind = TK_EOF, .line = line};
    return push(lx, eof);
}

void tp_chat_lexer_free(tp_chat_lexer *lx)
{
    for (size_t i = 0; i < lx->n; i++)
        if (lx->toks[i].owned)
            free((char *)lx->toks[i].s);
    free(lx->toks);
    lx->toks = NULL;
    lx->n = lx->cap = 0;
}
