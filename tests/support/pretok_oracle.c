/* The published regex, alternative by alternative (leftmost alternative
 * that matches at a position wins, as in a backtracking engine):
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,3}
 *   | ?[^\s\p{L}\p{N}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
 * \s is Unicode White_Space. */
#include "pretok_oracle.h"

#include <stdint.h>
#include <stdlib.h>
#include <utf8proc.h>

static bool is_letter(int32_t c)
{
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
           k == UTF8PROC_CATEGORY_LM || k == UTF8PROC_CATEGORY_LO;
}

static bool is_number(int32_t c)
{
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

static bool is_space(int32_t c)
{
    utf8proc_category_t k = utf8proc_category(c);
    return (c >= 9 && c <= 13) || c == 0x85 || k == UTF8PROC_CATEGORY_ZS ||
           k == UTF8PROC_CATEGORY_ZL || k == UTF8PROC_CATEGORY_ZP;
}

static bool is_nl(int32_t c) { return c == '\r' || c == '\n'; }

static bool is_other(int32_t c) { return !is_space(c) && !is_letter(c) && !is_number(c); }

static int32_t lower_ascii(int32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* The end of \s*[\r\n]+ | \s+(?!\S) | \s+ at whitespace cp[i]:
 * \s*[\r\n]+ backs off to the last line break of the run; else
 * \s+(?!\S) leaves the run's last space to the word after it. */
static size_t space_end(const int32_t *cp, size_t i, size_t n)
{
    size_t j = i, last_nl = 0;
    while (j < n && is_space(cp[j])) {
        if (is_nl(cp[j]))
            last_nl = j + 1;
        j++;
    }
    if (last_nl)
        return last_nl;
    return j < n && j - i > 1 ? j - 1 : j;
}

size_t pretok_oracle_split(const char *text, size_t len, bool digits3, size_t *ends)
{
    int32_t *cp = malloc(sizeof *cp * (len + 1));
    size_t *off = malloc(sizeof *off * (len + 1)); /* byte offset of each code point */
    size_t n = 0, nw = 0;
    if (!cp || !off)
        abort();
    for (size_t i = 0; i < len;) {
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)text + i,
                                              (utf8proc_ssize_t)(len - i), &cp[n]);
        if (k <= 0)
            abort(); /* callers give valid UTF-8 */
        off[n++] = i;
        i += (size_t)k;
    }
    off[n] = len;
    size_t i = 0;
    while (i < n) {
        size_t e = i;
        int32_t c = cp[i], c1 = i + 1 < n ? cp[i + 1] : -1, c2 = i + 2 < n ? cp[i + 2] : -1;
        int32_t l1 = lower_ascii(c1), l2 = lower_ascii(c2);
        if (c == '\'' && (l1 == 's' || l1 == 't' || l1 == 'm' || l1 == 'd')) {
            e = i + 2;
        } else if (c == '\'' && ((l1 == 'r' && l2 == 'e') || (l1 == 'v' && l2 == 'e') ||
                                 (l1 == 'l' && l2 == 'l'))) {
            e = i + 3;
        } else if (is_letter(c) || (!is_nl(c) && !is_number(c) && c1 >= 0 && is_letter(c1))) {
            e = i + 1;
            while (e < n && is_letter(cp[e]))
                e++;
        } else if (is_number(c)) {
            size_t most = digits3 ? 3 : 1;
            e = i + 1;
            while (e < n && e - i < most && is_number(cp[e]))
                e++;
        } else if (is_other(c) || (c == ' ' && c1 >= 0 && is_other(c1))) {
            e = c == ' ' ? i + 1 : i;
            while (e < n && is_other(cp[e]))
                e++;
            while (e < n && is_nl(cp[e]))
                e++;
        } else {
            e = space_end(cp, i, n);
        }
        ends[nw++] = off[e];
        i = e;
    }
    free(cp);
    free(off);
    return nw;
}

/* ---- DeepSeek V3 ------------------------------------------------------- */

static bool is_mark(int32_t c)
{
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_ME;
}

static bool is_punct_or_symbol(int32_t c)
{
    utf8proc_category_t k = utf8proc_category(c);
    return (k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO) ||
           (k >= UTF8PROC_CATEGORY_SM && k <= UTF8PROC_CATEGORY_SO);
}

static bool is_ascii_punct(int32_t c)
{
    return (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') || (c >= '{' && c <= '~');
}

static bool is_ascii_letter(int32_t c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }

static bool is_cjk_kana(int32_t c)
{
    return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x3040 && c <= 0x309F) || (c >= 0x30A0 && c <= 0x30FF);
}

/* End (code point index) of the match of split `stage` starting at i in
 * the piece cp[0..n), or i when nothing matches there. */
static size_t ds3_match(int stage, const int32_t *cp, size_t i, size_t n)
{
    size_t e = i;
    int32_t c = cp[i], c1 = i + 1 < n ? cp[i + 1] : -1;
    if (stage == 0) {
        while (e < n && e - i < 3 && is_number(cp[e]))
            e++;
        return e;
    }
    if (stage == 1) {
        while (e < n && is_cjk_kana(cp[e]))
            e++;
        return e;
    }
    /* stage 2: the alternatives in order, the first that matches wins */
    if (is_ascii_punct(c) && c1 >= 0 && is_ascii_letter(c1)) {
        e = i + 1;
        while (e < n && is_ascii_letter(cp[e]))
            e++;
        return e;
    }
    bool lm1 = c1 >= 0 && (is_letter(c1) || is_mark(c1));
    if (!is_nl(c) && !is_letter(c) && !is_punct_or_symbol(c) && lm1) {
        e = i + 1;   /* the optional lead character, then letters and marks */
        while (e < n && (is_letter(cp[e]) || is_mark(cp[e])))
            e++;
        return e;
    }
    if (is_letter(c) || is_mark(c)) {
        while (e < n && (is_letter(cp[e]) || is_mark(cp[e])))
            e++;
        return e;
    }
    if (is_punct_or_symbol(c) || (c == ' ' && c1 >= 0 && is_punct_or_symbol(c1))) {
        e = c == ' ' ? i + 1 : i;
        while (e < n && is_punct_or_symbol(cp[e]))
            e++;
        while (e < n && is_nl(cp[e]))
            e++;
        return e;
    }
    return is_space(c) ? space_end(cp, i, n) : i;
}

size_t pretok_oracle_split_deepseek_v3(const char *text, size_t len, size_t *ends)
{
    int32_t *cp = malloc(sizeof *cp * (len + 1));
    size_t *off = malloc(sizeof *off * (len + 1));
    size_t *cur = malloc(sizeof *cur * (len + 1)), *next = malloc(sizeof *next * (len + 1));
    size_t n = 0, ncur = 0;
    if (!cp || !off || !cur || !next)
        abort();
    for (size_t i = 0; i < len;) {
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)text + i,
                                              (utf8proc_ssize_t)(len - i), &cp[n]);
        if (k <= 0)
            abort();
        off[n++] = i;
        i += (size_t)k;
    }
    off[n] = len;
    if (n)
        cur[ncur++] = n;   /* piece ends, in code points */
    for (int stage = 0; stage < 3; stage++) {
        size_t nnext = 0, from = 0;
        for (size_t p = 0; p < ncur; p++) {
            size_t to = cur[p], gap = from, i = from;
            while (i < to) {
                size_t e = from + ds3_match(stage, cp + from, i - from, to - from);
                if (e == i) {
                    i++;
                    continue;
                }
                if (i > gap)
                    next[nnext++] = i;
                next[nnext++] = e;
                gap = i = e;
            }
            if (gap < to)
                next[nnext++] = to;
            from = to;
        }
        size_t *t = cur;
        cur = next;
        next = t;
        ncur = nnext;
    }
    for (size_t p = 0; p < ncur; p++)
        ends[p] = off[cur[p]];
    free(cp);
    free(off);
    free(cur);
    free(next);
    return ncur;
}
