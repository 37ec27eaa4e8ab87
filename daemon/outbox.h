/* Messages waiting to be sent (outbox.c): the floors build them, broker.c
 * sends them. The ground floor. */
#ifndef TOKPIPED_OUTBOX_H
#define TOKPIPED_OUTBOX_H

#include "state.h"

int out_worker(broker *b, int wi, const tp_msg *m);
void out_ident(broker *b, const tp_frame *ident, const tp_msg *m);
int out_event(broker *b, const tp_msg *m);
void out_reply(broker *b, const tp_frame *env, size_t n_env, const tp_msg *m);
uint64_t out_task(broker *b);
void out_msg_free(bout_msg *o);
void out_free(broker *b);

#endif
