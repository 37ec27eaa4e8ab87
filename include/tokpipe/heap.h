/* A binary heap over an array the caller owns, for any element type: one
 * implementation, instantiated per type so the comparison inlines (the
 * tokenizers' merge loops pop one per merge).
 *
 *   TP_HEAP_DEFINE(static, pairs, struct pair, pair_first, const struct sym *)
 *
 * defines pairs_push(heap, &n, item, ctx) and pairs_pop(heap, &n, ctx):
 * heap has room for one more item (the caller grows it), n counts its
 * items; first(a, b, ctx) is true when *a comes out before *b. Equal
 * items come out in no promised order: make first a total order when
 * the order matters. */
#ifndef TOKPIPE_HEAP_H
#define TOKPIPE_HEAP_H

#include <stddef.h>

#define TP_HEAP_DEFINE(scope, name, T, first, Ctx)                                                            \
    scope void name##_push(T *heap, size_t *n, T item, Ctx ctx)                                              \
    {                                                                                                         \
        size_t i = (*n)++;                                                                                    \
        while (i > 0) {                                                                                       \
            size_t up = (i - 1) / 2;                                                                          \
            if (!first(&item, &heap[up], ctx))                                                                \
                break;                                                                                        \
            heap[i] = heap[up];                                                                               \
            i = up;                                                                                           \
        }                                                                                                     \
        heap[i] = item;                                                                                       \
    }                                                                                                         \
    scope T name##_pop(T *heap, size_t *n, Ctx ctx)                                                          \
    {                                                                                                         \
        T top = heap[0], last = heap[--(*n)];                                                                 \
        size_t i = 0, m = *n;                                                                                 \
        for (;;) {                                                                                            \
            size_t c = 2 * i + 1;                                                                             \
            if (c >= m)                                                                                       \
                break;                                                                                        \
            if (c + 1 < m && first(&heap[c + 1], &heap[c], ctx))                                              \
                c++;                                                                                          \
            if (!first(&heap[c], &last, ctx))                                                                 \
                break;                                                                                        \
            heap[i] = heap[c];                                                                                \
            i = c;                                                                                            \
        }                                                                                                     \
        if (m)                                                                                                \
            heap[i] = last;                                                                                   \
        return top;                                                                                           \
    }

#endif
