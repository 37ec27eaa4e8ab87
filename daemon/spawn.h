/* Worker processes tokpiped starts and restarts (spawn.c). */
#ifndef TOKPIPED_SPAWN_H
#define TOKPIPED_SPAWN_H

#include "state.h"

int spawn_init(broker *b, tp_err *err);
void spawn_tick(broker *b, int64_t now);
/* SIGKILL the spawned worker process registered as instance (a hung one:
 * it reads no DISCONNECT); spawn_tick starts another. False if none. */
bool spawn_kill(broker *b, const char *instance);
void spawn_stop_all(broker *b, int timeout_ms);
void spawn_free(broker *b);

#endif
