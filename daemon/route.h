/* The forward worker most likely to hold j's prompt start in its prefix
 * cache, unless clearly busier (route_prefix.c); route_note: worker wi now
 * holds the full pages of ids + more; route_free at exit. */
#ifndef TOKPIPED_ROUTE_H
#define TOKPIPED_ROUTE_H

#include "state.h"

int route_forward(broker *b, const bjob *j);
void route_note(broker *b, int wi, const int32_t *ids, uint32_t n, const int32_t *more, uint32_t n_more);
void route_free(broker *b);

#endif
