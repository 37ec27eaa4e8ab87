/* The stages' table of jobs by slot (stage.h, tp_slots). */
#include "tokpipe/stage.h"

#include <stdlib.h>
#include <string.h>

int tp_slots_init(tp_slots *t, int capacity, size_t size)
{
    t->e = calloc(capacity > 0 ? (size_t)capacity : 1, size);
    t->size = size;
    t->capacity = t->e ? capacity : 0;
    return t->e ? 0 : TP_ENOMEM;
}

void tp_slots_free(tp_slots *t)
{
    free(t->e);
    t->e = NULL;
    t->capacity = 0;
}

void *tp_slots_at(const tp_slots *t, int i)
{
    return t->e + (size_t)i * t->size;
}

void *tp_slots_find(const tp_slots *t, uint32_t slot)
{
    for (int i = 0; i < t->capacity; i++) {
        tp_slot *s = tp_slots_at(t, i);
        if (s->used && s->slot == slot)
            return s;
    }
    return NULL;
}

void *tp_slots_open(const tp_slots *t, uint32_t slot, bool *reopen)
{
    void *j = tp_slots_find(t, slot);
    *reopen = j != NULL;
    for (int i = 0; !j && i < t->capacity; i++) {
        tp_slot *s = tp_slots_at(t, i);
        if (!s->used)
            j = s;
    }
    return j;
}

void tp_slots_take(void *entry, uint32_t slot)
{
    tp_slot *s = entry;
    s->used = true;
    s->slot = slot;
}
