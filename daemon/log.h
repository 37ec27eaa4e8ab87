/* The daemon's log (log.c). */
#ifndef TOKPIPED_LOG_H
#define TOKPIPED_LOG_H

#include "state.h"

void blog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
