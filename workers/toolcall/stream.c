/* Calls as they are generated: a scanner that follows a call region in the
 * shape its family's grammar produces (tc_family_def's calls_open,
 * call_open, ...) and tells, of the next call, its name once it is whole
 * and how many bytes of its arguments the text holds so far. The splitter
 * streams what it finds; the family's parser still decides at the end.
 *
 * Every answer is stable under more text: a byte once counted as
 * arguments stays so, which is what lets those bytes go out at once. */
#include <string.h>

#include "tc_internal.h"

enum { LIT_FAIL = -1, LIT_PARTIAL = 0, LIT_MATCH = 1 };

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Match lit at s[*i..n): whitespace in lit stands for any run of
 * whitespace (none included), and space may come before a '[' or '{' (a
 * model's "[TOOL_CALLS] [" is the same call). */
static int lit_match(const char *s, size_t n, size_t *i, const char *lit)
{
    size_t k = *i;
    for (const char *l = lit; *l; l++) {
        if (is_ws(*l)) {
            while (k < n && is_ws(s[k]))
                k++;
            continue;
        }
        if (*l == '[' || *l == '{')
            while (k < n && is_ws(s[k]))
                k++;
        if (k >= n)
            return LIT_PARTIAL;
        if (s[k] != *l)
            return LIT_FAIL;
        k++;
    }
    *i = k;
    return LIT_MATCH;
}

/* ---- a JSON value's prefix ----------------------------------------------- */

enum { J_BAD = -1, J_PART = 0, J_DONE = 1 };

/* The JSON value at s[0..n): J_DONE with *len its bytes; J_PART when all n
 * bytes are a valid beginning of one (*len = n); J_BAD at the first byte
 * no value can have there (*len = the bytes before it). */
static int jscan(const char *s, size_t n, size_t *len)
{
    char stack[TC_MAX_JSON_DEPTH];
    int depth = 0;
    /* what may come next: a value, a key (or '}' right after '{'), ':',
     * ',' or a close; after_open: ']' / '}' may close an empty container */
    enum { V, KEY, COLON, NEXT } want = V;
    bool after_open = false;
    size_t i = 0;
    while (i < n) {
        char c = s[i];
        if (is_ws(c) && (depth || want != V || i)) {
            if (!depth && want == NEXT)
                break;
            i++;
            continue;
        }
        if (want == NEXT || (after_open && (c == ']' || c == '}'))) {
            after_open = false;
            if (c == ',' && depth) {
                want = stack[depth - 1] == '{' ? KEY : V;
                i++;
                continue;
            }
            if ((c == ']' || c == '}') && depth && stack[depth - 1] == (c == ']' ? '[' : '{')) {
                depth--;
                i++;
                want = NEXT;
                if (!depth)
                    break;
                continue;
            }
            *len = i;
            return J_BAD;
        }
        after_open = false;
        if (want == COLON) {
            if (c != ':')
                return *len = i, J_BAD;
            want = V;
            i++;
            continue;
        }
        if (want == KEY && c != '"')
            return *len = i, J_BAD;
        if (c == '{' || c == '[') {
            if (depth == TC_MAX_JSON_DEPTH)
                return *len = i, J_BAD;
            stack[depth++] = c;
            want = c == '{' ? KEY : V;
            after_open = true;
            i++;
            continue;
        }
        if (c == '"') {
            for (i++; i < n && s[i] != '"'; i++) {
                if ((unsigned char)s[i] < 0x20)
                    return *len = i, J_BAD;
                if (s[i] == '\\') {
                    if (++i >= n)
                        break;
                    if (s[i] == 'u') {
                        for (int h = 0; h < 4 && i + 1 < n; h++)
                            if (!strchr("0123456789abcdefABCDEF", s[++i]) || !s[i])
                                return *len = i, J_BAD;
                    } else if (!strchr("\"\\/bfnrt", s[i]) || !s[i]) {
                        return *len = i, J_BAD;
                    }
                }
            }
            if (i >= n)
                return *len = n, J_PART;
            i++;
        } else if (c == 't' || c == 'f' || c == 'n') {
            const char *w = c == 't' ? "true" : c == 'f' ? "false" : "null";
            for (; *w && i < n; w++, i++)
                if (s[i] != *w)
                    return *len = i, J_BAD;
            if (*w)
                return *len = n, J_PART;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            /* -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)? */
            int st = 0;   /* 0 sign, 1 int first, 2 int more, 3 int done(0), 4 frac first, 5 frac, 6 exp sign, 7 exp first, 8 exp */
            if (c == '-')
                i++;
            st = 1;
            for (; i < n; i++) {
                char d = s[i];
                bool dig = d >= '0' && d <= '9';
                if (st == 1 && dig)
                    st = d == '0' ? 3 : 2;
                else if (st == 2 && dig)
                    ;
                else if ((st == 2 || st == 3) && d == '.')
                    st = 4;
                else if ((st == 4 || st == 5) && dig)
                    st = 5;
                else if ((st == 2 || st == 3 || st == 5) && (d == 'e' || d == 'E'))
                    st = 6;
                else if (st == 6 && (d == '+' || d == '-'))
                    st = 7;
                else if ((st == 6 || st == 7 || st == 8) && dig)
                    st = 8;
                else
                    break;
            }
            if (i >= n && depth)
                return *len = n, J_PART;
            if (st == 1 || st == 4 || st == 6 || st == 7) {
                if (i >= n)
                    return *len = n, J_PART;
                return *len = i, J_BAD;
            }
            if (i >= n)
                return *len = n, J_PART;   /* a number may go on */
        } else {
            return *len = i, J_BAD;
        }
        if (want == KEY) {
            want = COLON;
            continue;
        }
        want = NEXT;
        if (!depth)
            break;
    }
    if (!depth && want == NEXT) {
        *len = i;
        return J_DONE;
    }
    *len = n;
    return J_PART;
}

/* ---- one call ------------------------------------------------------------ */

static bool name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '.';
}

/* Names the family's parser does not count as calls. */
static bool not_a_call(const tc_family_def *d, const char *name, size_t len, bool json)
{
    if (json && len >= 2)
        name++, len -= 2;
    if (d == &tc_functionary_v32)
        return (len == 3 && !memcmp(name, "all", 3)) || (len == 6 && !memcmp(name, "python", 6));
    if (d == &tc_command_r_plus)
        return len == 15 && (!memcmp(name, "directly_answer", 15) || !memcmp(name, "directly-answer", 15));
    return false;
}

/* Space, then the byte ch at s[*k..n): LIT_MATCH with *k past it. */
static int expect(const char *s, size_t n, size_t *k, char ch)
{
    *k += tc_ws(s + *k, n - *k);
    if (*k >= n)
        return LIT_PARTIAL;
    if (s[*k] != ch)
        return LIT_FAIL;
    ++*k;
    return LIT_MATCH;
}

/* The body {"name": ..., "arguments": {...}} at s[*i..n). */
static int json_body(const tc_family_def *d, const char *s, size_t n, size_t *i, tc_scan_call *c)
{
    size_t k = *i;
    int r = expect(s, n, &k, '{');
    if (r != LIT_MATCH)
        return r;
    for (;;) {
        k += tc_ws(s + k, n - k);
        if (k >= n)
            return LIT_PARTIAL;
        if (s[k] == '}') {
            *i = k + 1;
            c->args_done = true;   /* whole, or none: the parser's {} */
            return c->named ? LIT_MATCH : LIT_FAIL;
        }
        size_t kl;
        r = s[k] == '"' ? jscan(s + k, n - k, &kl) : J_BAD;
        if (r != J_DONE)
            return r == J_BAD ? LIT_FAIL : LIT_PARTIAL;
        const char *key = s + k + 1;
        size_t key_len = kl - 2;
        k += kl;
        if ((r = expect(s, n, &k, ':')) != LIT_MATCH)
            return r;
        k += tc_ws(s + k, n - k);
        if (k >= n)
            return LIT_PARTIAL;
        bool is_name = !c->named && key_len == strlen(d->name_key) && !memcmp(key, d->name_key, key_len);
        bool is_args = !c->has_args && key_len == strlen(d->args_key) && !memcmp(key, d->args_key, key_len);
        size_t vl;
        r = jscan(s + k, n - k, &vl);
        if (is_args) {
            if (s[k] != '{')
                return LIT_FAIL;
            c->has_args = true;
            c->args_off = k;
            c->args_len = vl;
            c->args_done = r == J_DONE;
        } else if (is_name && r == J_DONE && (s[k] != '"' || not_a_call(d, s + k, vl, true))) {
            return LIT_FAIL;
        }
        if (r != J_DONE)
            return r == J_BAD ? LIT_FAIL : LIT_PARTIAL;
        size_t v0 = k;
        k += vl;
        k += tc_ws(s + k, n - k);
        if (k >= n)
            return LIT_PARTIAL;
        if (s[k] != ',' && s[k] != '}')
            return LIT_FAIL;
        if (is_name) {
            /* whole once the object goes on past it */
            c->named = true;
            c->name_off = v0;
            c->name_len = vl;
            c->name_json = true;
        }
        if (s[k] == ',')
            k++;
    }
}

/* NAME name_close {...} at s[*i..n). */
static int named_body(const tc_family_def *d, const char *s, size_t n, size_t *i, tc_scan_call *c)
{
    size_t k = *i, n0 = k;
    while (k < n && name_char(s[k]))
        k++;
    if (k >= n)
        return LIT_PARTIAL;
    if (k == n0 || not_a_call(d, s + n0, k - n0, false))
        return LIT_FAIL;
    size_t name_end = k;
    int r = lit_match(s, n, &k, d->name_close);
    if (r != LIT_MATCH)
        return r;
    c->named = true;
    c->name_off = n0;
    c->name_len = name_end - n0;
    k += tc_ws(s + k, n - k);
    if (k >= n)
        return LIT_PARTIAL;
    if (s[k] != '{')
        return LIT_FAIL;
    size_t vl;
    int j = jscan(s + k, n - k, &vl);
    c->has_args = true;
    c->args_off = k;
    c->args_len = vl;
    c->args_done = j == J_DONE;
    if (j != J_DONE)
        return j == J_BAD ? LIT_FAIL : LIT_PARTIAL;
    *i = k + vl;
    return LIT_MATCH;
}

bool tc_stream_scan(const tc_family_def *d, const char *s, size_t n, bool parallel, tc_scan *st, tc_scan_call *c)
{
    memset(c, 0, sizeof *c);
    c->index = st->k;
    size_t i = st->off;
    int r;
    if (st->phase == TC_SCAN_DONE || !d->calls_open)
        return false;
    if (st->phase == TC_SCAN_START) {
        /* a frame's header may open the first call too (harmony's
         * "<|start|>assistant" before "<|channel|>commentary to=") */
        if ((d->recipient_first || d->channels) && tc_starts(s, n, d->calls_sep))
            i += strlen(d->calls_sep);
        r = lit_match(s, n, &i, d->calls_open);
        if (r == LIT_FAIL)
            st->phase = TC_SCAN_DONE;
        if (r != LIT_MATCH)
            return false;
    } else {
        if (!parallel) {
            st->phase = TC_SCAN_DONE;
            return false;
        }
        r = lit_match(s, n, &i, d->calls_sep);
        if (r == LIT_FAIL)
            st->phase = TC_SCAN_DONE;
        if (r != LIT_MATCH)
            return false;
    }
    r = lit_match(s, n, &i, d->call_open);
    if (r == LIT_MATCH)
        r = d->name_key ? json_body(d, s, n, &i, c) : named_body(d, s, n, &i, c);
    if (r == LIT_MATCH)
        r = lit_match(s, n, &i, d->call_close);
    if (r == LIT_FAIL)
        st->phase = TC_SCAN_DONE;   /* not the shape: the parser decides at the end */
    if (!c->named)
        return false;
    if (r == LIT_MATCH) {
        c->done = true;
        st->off = i;
        st->k++;
        st->phase = TC_SCAN_NEXT;
    }
    return true;
}
