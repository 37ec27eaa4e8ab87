/* Protocol test helpers (proto_check.h). */
#include "proto_check.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

bool str_is(tp_str s, const char *want)
{
    return s.ptr && s.len == strlen(want) && !memcmp(s.ptr, want, s.len);
}

void round_trip(const tp_msg *m, tp_wire *w, tp_msg *out)
{
    tp_err e = {0};
    if (tp_proto_encode(m, w, &e))
        fail_msg("encode failed: %s", e.msg);
    if (tp_proto_decode(m->family, w->f, w->n, out, &e))
        fail_msg("decode failed: %s", e.msg);
    assert_int_equal(out->cmd, m->cmd);
}
