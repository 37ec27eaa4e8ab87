/* A growing byte buffer: text built piece by piece (JSON, GBNF, SSE
 * bytes, template output, deltas kept for STATUS).
 *
 * The struct is open: callers read data and len directly and embed the
 * buffer by value. `tp_buf b = {0}` is an empty buffer without a limit;
 * tp_buf_init gives one a limit. data is NULL until the first append (of
 * any length, 0 included) or reserve, and from then on NUL-terminated at
 * data[len], so it can be used as a C string (tp_buf_str covers the NULL
 * case).
 *
 * Failure policy, chosen per buffer:
 *  - a limit in bytes (tp_buf_init): an append that would take len past
 *    max is refused whole with TP_ERANGE, so what is kept is always whole
 *    pieces; exactly max bytes is allowed;
 *  - sticky failure (the default): the first refused append (TP_ERANGE,
 *    TP_ENOMEM) is kept in err and every later append is refused with it,
 *    so a caller can append many pieces and check err once at the end;
 *  - lenient = true: a refused append is not remembered, and each later
 *    one is tried on its own (whole deltas or nothing, under a limit);
 *  - a caller that cannot go on without memory aborts on a non-zero
 *    return itself.
 * Every append also returns its status (0 or the negative TP_E* code), for
 * callers that check each one. A refused append never changes data or
 * len. */
#ifndef TOKPIPE_BUF_H
#define TOKPIPE_BUF_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokpipe/error.h"

typedef struct tp_buf {
    char *data;    /* owned; NULL until the first append or reserve */
    size_t len;    /* bytes in data, not counting the NUL */
    size_t cap;    /* bytes allocated */
    size_t max;    /* with capped: the most len may reach */
    bool capped;   /* max applies (set by tp_buf_init) */
    bool lenient;  /* failures are not sticky (see above) */
    int err;       /* first failure kept (sticky buffers): 0, TP_ENOMEM, TP_ERANGE, TP_EINVAL */
} tp_buf;

/* An empty buffer holding at most max bytes (0 allows only empty text). */
void tp_buf_init(tp_buf *b, size_t max);

/* Append n bytes of s (s may be NULL when n is 0). 0 or a negative TP_E*. */
int tp_buf_add(tp_buf *b, const void *s, size_t n);

/* Append the C string s (NULL appends nothing but still makes data a
 * string). */
int tp_buf_puts(tp_buf *b, const char *s);

/* Append printf-style output, whatever its length. A format error is
 * TP_EINVAL. */
/* JSON's escape of byte c (\" \\ \b \f \n \r \t, \u00xx for the other
 * control bytes) into out; its length, 0 when c stands for itself. */
size_t tp_json_escape(uint8_t c, char out[6]);
/* s[0, n) appended as a JSON string: quotes, tp_json_escape's escapes,
 * every other byte as it is (UTF-8 stays UTF-8). */
int tp_buf_json_str(tp_buf *b, const char *s, size_t n);

int tp_buf_printf(tp_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int tp_buf_vprintf(tp_buf *b, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

/* Make room for `more` bytes past len (plus the NUL) without appending,
 * under the same limit and policy as an append. Who writes into
 * data[len .. len+more) then raises len and writes data[len] = '\0'. */
int tp_buf_reserve(tp_buf *b, size_t more);

/* Record code as the buffer's failure unless one is recorded already (an
 * inner buffer's failure passed on to the outer one). Returns b->err. */
int tp_buf_fail(tp_buf *b, int code);

/* Empty the text; the memory, settings and a recorded failure stay (the
 * failure is forgotten by tp_buf_take and tp_buf_free only, so a caller
 * that empties a buffer between uses still sees that a piece was lost). */
void tp_buf_reset(tp_buf *b);

/* The text, owned by the caller from now on (free()); "" when nothing was
 * appended; NULL only when memory ran out. The buffer is left empty with
 * its settings, as tp_buf_free leaves it. */
char *tp_buf_take(tp_buf *b);

/* Release the memory; the buffer is empty, without failure, and keeps its
 * limit and policy, so it can be used again. NULL is accepted. */
void tp_buf_free(tp_buf *b);

/* The text as a C string, "" while data is NULL. Borrowed. */
static inline const char *tp_buf_str(const tp_buf *b)
{
    return b->data ? b->data : "";
}

#endif
