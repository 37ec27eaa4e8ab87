/* A job's workers: pinning and letting go; how a job ends (pin.c). */
#ifndef TOKPIPED_PIN_H
#define TOKPIPED_PIN_H

#include "state.h"

void pin_forward(broker *b, bjob *j, int f);
void pin_sample(broker *b, bjob *j, int s);
void pin_stop(broker *b, bjob *j, int t);
/* Send j's candidates that await verdicts (from n_verd on) to stop worker
 * t again: pin_stop does, except for a stop-stage suspect, whose
 * stop_resend step.c sends alone. */
void pin_stop_resend(broker *b, bjob *j, int t);
void pin_release(broker *b, bjob *j, int finish, const char *error);
uint64_t pin_slot_cmd(broker *b, int wi, uint8_t cmd, uint32_t slot);
bool pin_can_decode_ahead(const broker *b, const bjob *j);
void pin_fail(broker *b, bjob *j, const char *why);
void pin_cancel(broker *b, bjob *j);
void pin_publish_finish(broker *b, bjob *j, int reason, const char *error);

#endif
