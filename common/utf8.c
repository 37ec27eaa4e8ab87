#include "tokpipe/utf8.h"

#include <string.h>

/* Sequence length for a lead byte and the allowed range of the second byte
 * (Unicode Table 3-7); later bytes are always 80..BF. len 0 = not a lead. */
static void lead_info(uint8_t c, size_t *len, uint8_t *lo, uint8_t *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (c < 0x80) *len = 1;
    else if (c < 0xC2) *len = 0;
    else if (c < 0xE0) *len = 2;
    else if (c < 0xF0) {
        *len = 3;
        if (c == 0xE0) *lo = 0xA0;
        if (c == 0xED) *hi = 0x9F;   /* no surrogates */
    } else if (c < 0xF5) {
        *len = 4;
        if (c == 0xF0) *lo = 0x90;
        if (c == 0xF4) *hi = 0x8F;   /* nothing above U+10FFFF */
    } else *len = 0;
}

size_t tp_utf8_seq(const uint8_t *b, size_t n, size_t *subpart, bool *incomplete)
{
    size_t len;
    uint8_t lo, hi;
    *incomplete = false;
    *subpart = 1;
    lead_info(b[0], &len, &lo, &hi);
    if (len == 0) return 0;
    for (size_t i = 1; i < len; i++) {
        if (i >= n) {
            *incomplete = true;
            *subpart = i;
            return 0;
        }
        if (b[i] < lo || b[i] > hi) {
            *subpart = i;
            return 0;
        }
        lo = 0x80;
        hi = 0xBF;
    }
    return len;
}

bool tp_utf8_valid(const uint8_t *b, size_t n, size_t *bad_at)
{
    size_t i = 0, sub;
    bool inc;
    while (i < n) {
        size_t k = b[i] < 0x80 ? 1 : tp_utf8_seq(b + i, n - i, &sub, &inc);
        if (k == 0) {
            if (bad_at) *bad_at = i;
            return false;
        }
        i += k;
    }
    return true;
}

size_t tp_utf8_unfinished_tail(const uint8_t *b, size_t n)
{
    /* Only the last 3 bytes can hold an unfinished sequence; its lead is the
     * last non-continuation byte among them. */
    size_t start = n > 3 ? n - 3 : 0;
    for (size_t i = n; i > start; i--) {
        uint8_t c = b[i - 1];
        if ((c & 0xC0) == 0x80) continue;
        size_t sub;
        bool inc;
        if (tp_utf8_seq(b + i - 1, n - (i - 1), &sub, &inc) == 0 && inc)
            return n - (i - 1);
        return 0;
    }
    return 0;
}

size_t tp_utf8_replace(const uint8_t *b, size_t n, char *out)
{
    size_t i = 0, o = 0;
    while (i < n) {
        uint64_t w;
        if (i + 8 <= n && (memcpy(&w, b + i, 8), !(w & 0x8080808080808080ull))) {
            memcpy(out + o, &w, 8);   /* eight ASCII bytes at once */
            i += 8;
            o += 8;
            continue;
        }
        if (b[i] < 0x80) {
            out[o++] = (char)b[i++];
            continue;
        }
        size_t sub;
        bool inc;
        size_t k = tp_utf8_seq(b + i, n - i, &sub, &inc);
        if (k) {
            memcpy(out + o, b + i, k);
            o += k;
            i += k;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += sub;
        }
    }
    return o;
}

size_t tp_utf8_put(uint32_t cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t tp_utf8_get(const uint8_t *b, size_t n, uint32_t *cp)
{
    size_t sub;
    bool incomplete;
    size_t k = n ? tp_utf8_seq(b, n, &sub, &incomplete) : 0;
    if (!k)
        return 0;
    uint32_t v = k == 1 ? b[0] : b[0] & (0x7Fu >> k);
    for (size_t i = 1; i < k; i++)
        v = v << 6 | (b[i] & 0x3Fu);
    *cp = v;
    return k;
}

size_t tp_utf8_char_len(uint8_t lead)
{
    return lead < 0x80 ? 1 : (lead & 0xe0) == 0xc0 ? 2 : (lead & 0xf0) == 0xe0 ? 3 : (lead & 0xf8) == 0xf0 ? 4 : 1;
}

size_t tp_utf8_count(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i += tp_utf8_char_len((uint8_t)s[i]))
        k++;
    return k;
}

size_t tp_utf8_offset(const char *s, size_t n, size_t ci)
{
    size_t i = 0;
    for (; ci > 0 && i < n; ci--)
        i += tp_utf8_char_len((uint8_t)s[i]);
    return i < n ? i : n;
}
