/* The growing byte buffer (buf.h). */
#include "tokpipe/buf.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* First allocation: most buffers hold a few lines or a small document. */
#define BUF_FIRST_CAP 256

void tp_buf_init(tp_buf *b, size_t max)
{
    memset(b, 0, sizeof *b);
    b->max = max;
    b->capped = true;
}

static int refuse(tp_buf *b, int code)
{
    if (!b->lenient && !b->err)
        b->err = code;
    return code;
}

int tp_buf_fail(tp_buf *b, int code)
{
    if (!b->err)
        b->err = code;
    return b->err;
}

int tp_buf_reserve(tp_buf *b, size_t more)
{
    if (b->err)
        return b->err;
    if (b->capped && (more > b->max || b->len > b->max - more))
        return refuse(b, TP_ERANGE);
    if (more >= SIZE_MAX - b->len)
        return refuse(b, TP_ENOMEM);
    size_t need = b->len + more + 1;
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : BUF_FIRST_CAP;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *p = realloc(b->data, cap);
    if (!p)
        return refuse(b, TP_ENOMEM);
    if (!b->data)
        p[0] = '\0';
    b->data = p;
    b->cap = cap;
    return 0;
}

int tp_buf_add(tp_buf *b, const void *s, size_t n)
{
    /* the common case first: it fits the memory and the limit */
    if (!b->err && n < b->cap - b->len && (!b->capped || n <= b->max - b->len)) {
        if (n)
            memcpy(b->data + b->len, s, n);
        b->len += n;
        b->data[b->len] = '\0';
        return 0;
    }
    int rc = tp_buf_reserve(b, n);
    if (rc)
        return rc;
    /* memcpy from NULL is undefined even for 0 bytes (UBSan says so) */
    if (n)
        memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int tp_buf_puts(tp_buf *b, const char *s)
{
    return tp_buf_add(b, s, s ? strlen(s) : 0);
}

int tp_buf_vprintf(tp_buf *b, const char *fmt, va_list ap)
{
    if (b->err)
        return b->err;
    /* One pass when the text fits where it is printed: the spare room when
     * there is plenty, else a line on the stack (most prints are short,
     * and a first print into an empty buffer would otherwise take two). */
    char line[256];
    size_t room = b->data ? b->cap - b->len : 0;
    bool direct = room > sizeof line;
    char *dst = direct ? b->data + b->len : line;
    size_t dn = direct ? room : sizeof line;
    va_list again;
    va_copy(again, ap);
    int k = vsnprintf(dst, dn, fmt, ap);
    int rc;
    if (k < 0)
        rc = refuse(b, TP_EINVAL);
    else if (!direct && (size_t)k < dn)
        rc = tp_buf_add(b, line, (size_t)k);
    else if ((size_t)k < dn)
        rc = b->capped && b->len + (size_t)k > b->max ? refuse(b, TP_ERANGE) : 0;   /* fitted the memory, not the limit */
    else if (!(rc = tp_buf_reserve(b, (size_t)k)))
        vsnprintf(b->data + b->len, (size_t)k + 1, fmt, again);
    va_end(again);
    if (direct || (k >= 0 && (size_t)k >= dn)) {
        if (!rc)
            b->len += (size_t)k;
        if (b->data)
            b->data[b->len] = '\0';   /* a refused print may have written there */
    }
    return rc;
}

int tp_buf_printf(tp_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = tp_buf_vprintf(b, fmt, ap);
    va_end(ap);
    return rc;
}

void tp_buf_reset(tp_buf *b)
{
    b->len = 0;
    if (b->data)
        b->data[0] = '\0';
}

char *tp_buf_take(tp_buf *b)
{
    char *p = b->data ? b->data : calloc(1, 1);
    b->data = NULL;
    b->len = b->cap = 0;
    b->err = 0;
    return p;
}

void tp_buf_free(tp_buf *b)
{
    if (!b)
        return;
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->err = 0;
}

size_t tp_json_escape(uint8_t c, char out[6])
{
    static const char hex[] = "0123456789abcdef";
    const char *named = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\b' ? "\\b" : c == '\f' ? "\\f"
                      : c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" : NULL;
    if (named) {
        memcpy(out, named, 2);
        return 2;
    }
    if (c >= 0x20)
        return 0;
    memcpy(out, "\\u00", 4);
    out[4] = hex[c >> 4];
    out[5] = hex[c & 15];
    return 6;
}

int tp_buf_json_str(tp_buf *b, const char *s, size_t n)
{
    tp_buf_add(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        char e[6];
        size_t k = tp_json_escape((uint8_t)s[i], e);
        if (k) {
            tp_buf_add(b, s + run, i - run);
            tp_buf_add(b, e, k);
            run = i + 1;
        }
    }
    tp_buf_add(b, s + run, n - run);
    return tp_buf_add(b, "\"", 1);
}
