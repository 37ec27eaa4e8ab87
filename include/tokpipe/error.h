/* Error codes and the message buffer every fallible tokpipe call fills.
 *
 * Convention: a function returns 0 on success or a negative TP_E* code, and
 * when it fails and was given a non-NULL tp_err it writes one human-readable
 * line naming what was wrong (the field, key, offset or id). */
#ifndef TOKPIPE_ERROR_H
#define TOKPIPE_ERROR_H

#include <stddef.h>

enum {
    TP_OK = 0,
    TP_EINVAL = -1,   /* bad argument or parameter value */
    TP_ENOMEM = -2,   /* allocation failed */
    TP_EIO = -3,      /* read/write/open failed */
    TP_EFORMAT = -4,  /* malformed file or message */
    TP_ERANGE = -5,   /* value outside an allowed range or limit */
    TP_EFULL = -6,    /* a fixed pool (KV cache, job table) has no room */
    TP_ENOTFOUND = -7,/* unknown id, key or name */
    TP_ESTATE = -8,   /* call not valid in the object's current state */
};

#define TP_ERR_MSG_MAX 512

/* Exit statuses of the programs that tokpiped spawns, so the spawner can
 * tell a start that can never succeed from a crash worth a respawn. */
#define TP_EXIT_BAD_CONFIG 2 /* bad flags or configuration */
#define TP_EXIT_BAD_MODEL 3  /* the model or its vocabulary cannot be loaded */

typedef struct tp_err {
    int code;
    char msg[TP_ERR_MSG_MAX];
} tp_err;

/* Record code and a printf-style message in err (if non-NULL); returns code
 * so callers can write `return tp_err_set(err, TP_EINVAL, "...")`. */
int tp_err_set(tp_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Clear err (if non-NULL) to TP_OK and an empty message. */
void tp_err_clear(tp_err *err);

/* Short name of a code ("invalid argument", ...), never NULL. */
const char *tp_err_name(int code);

#endif
