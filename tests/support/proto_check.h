/* Test support for the protocol tests: string comparison and the
 * encode-then-decode round trip they all start from. */
#ifndef TP_TEST_PROTO_CHECK_H
#define TP_TEST_PROTO_CHECK_H

#include <stdbool.h>

#include "tokpipe/protocol.h"

/* s holds exactly want (a NULL s never does). */
bool str_is(tp_str s, const char *want);

/* Encode m, then decode the frames into out (which borrows from w: free
 * w and clear out after). Fails the running cmocka test, with the codec's
 * message, when either step fails or the command changes. */
void round_trip(const tp_msg *m, tp_wire *w, tp_msg *out);

#endif
