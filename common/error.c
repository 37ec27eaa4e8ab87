#include "tokpipe/error.h"

#include <stdarg.h>
#include <stdio.h>

int tp_err_set(tp_err *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

void tp_err_clear(tp_err *err)
{
    if (err) {
        err->code = TP_OK;
        err->msg[0] = '\0';
    }
}

const char *tp_err_name(int code)
{
    switch (code) {
    case TP_OK: return "ok";
    case TP_EINVAL: return "invalid argument";
    case TP_ENOMEM: return "out of memory";
    case TP_EIO: return "i/o error";
    case TP_EFORMAT: return "malformed input";
    case TP_ERANGE: return "out of range";
    case TP_EFULL: return "pool full";
    case TP_ENOTFOUND: return "not found";
    case TP_ESTATE: return "invalid state";
    default: return "unknown error";
    }
}
