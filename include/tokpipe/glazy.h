/* A lazy grammar (tool_choice auto): the output is free until it holds a
 * trigger text (or generates the special token the trigger names), and
 * from there on held to the grammar, which starts at the trigger. The
 * sample stage and `tokpipe run` drive it the same way, token by token,
 * so a greedy or seeded job gives the same tokens in both; a rebuilt
 * sampler replays the accepted tokens into a fresh one. */
#ifndef TOKPIPE_GLAZY_H
#define TOKPIPE_GLAZY_H

#include <stddef.h>
#include <stdint.h>

#include "tokpipe/error.h"
#include "tokpipe/grammar.h"

typedef struct tp_glazy tp_glazy;

/* m: a fresh matcher of the grammar (borrowed: the caller keeps and frees
 * it); trigger[0, len), 1..64 bytes. */
int tp_glazy_new(tp_gmatch *m, const char *trigger, size_t len, tp_glazy **out, tp_err *err);
void tp_glazy_free(tp_glazy *z);

/* The next accepted token. Before the trigger its bytes are watched; the
 * token that completes the trigger hands the grammar the text from the
 * trigger's start (a token that runs past it included). Text the grammar
 * does not take there leaves the output free for good (never an error).
 * TP_ENOMEM only. */
int tp_glazy_accept(tp_glazy *z, int32_t token, tp_err *err);

/* The matcher once the trigger came (mask with it), else NULL. */
tp_gmatch *tp_glazy_active(const tp_glazy *z);

#endif
