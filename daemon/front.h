/* Producer requests: SUBMIT, CANCEL, STATUS, STATS, INFO (front.c). */
#ifndef TOKPIPED_FRONT_H
#define TOKPIPED_FRONT_H

#include "state.h"

void front_on_message(broker *b, const tp_frame *frames, size_t n, bool too_many);

#endif
