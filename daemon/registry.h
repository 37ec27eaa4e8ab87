/* The registered workers (registry.c): READY, heartbeats, losses, what
 * each owes. */
#ifndef TOKPIPED_REGISTRY_H
#define TOKPIPED_REGISTRY_H

#include "state.h"

enum { REG_DONE, REG_RESULT, REG_LOST, REG_READY };

/* A worker's message: REG_RESULT (a stage result in *m from worker *wi),
 * REG_LOST (worker *wi said DISCONNECT: its state is gone), REG_READY (a
 * READY in *m; *wi: the old registration of the same connection, whose
 * state is gone, or -1) or REG_DONE. *m needs tp_msg_clear either way. */
int registry_on_message(broker *b, const tp_frame *ident, const tp_frame *frames, size_t n, tp_msg *m, int *wi);

/* Register the worker of a READY (or refuse it); true when registered. */
bool registry_on_ready(broker *b, const tp_frame *ident, const tp_m_ready *r);
void registry_tick(broker *b, int64_t now);
void registry_lose(broker *b, int wi, const char *why);
void registry_drop(broker *b, int wi);
void registry_tok_done(broker *b, int wi);
/* Worker wi answered task m (TOKENIZED, STEP_RESULT, SAMPLED, VERDICTS):
 * that task and any owed before it are no longer owed. */
void registry_answered(broker *b, int wi, const tp_msg *m);
/* How long a task of stage si may go unanswered: recovery.step_timeout_s,
 * or step_timeout_factor times the stage's usual answer time if longer. */
int64_t registry_step_limit_ms(const broker *b, int si);
int registry_find(broker *b, const void *ident, size_t len);
bool registry_usable(const broker *b, int wi);
int registry_count(const broker *b, unsigned stage_bit);
const bworker *registry_model(const broker *b);

#endif
