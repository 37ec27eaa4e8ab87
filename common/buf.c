/* The growing byte buffer (buf.h). */
#include "tokpipe/buf.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* First allocation: most buffers hold a line or a small document. */
#define BUF_FIRST_CAP 64

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
    /* print into the spare room first: one pass when it fits */
    size_t room = b->data ? b->cap - b->len : 0;
    va_list again;
    va_copy(again, ap);
    int k = vsnprintf(room ? b->data + b->len : NULL, room, fmt, ap);
    int rc = 0;
    if (k < 0)
        rc = refuse(b, TP_EINVAL);
    else if ((size_t)k >= room && !(rc = tp_buf_reserve(b, (size_t)k)))
        vsnprintf(b->data + b->len, (size_t)k + 1, fmt, again);
    else if (!rc && b->capped && b->len + (size_t)k > b->max)
        rc = refuse(b, TP_ERANGE);   /* it fitted the memory, not the limit */
    va_end(again);
    if (!rc)
        b->len += (size_t)k;
    if (b->data)
        b->data[b->len] = '\0';   /* a refused print may have written there */
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
