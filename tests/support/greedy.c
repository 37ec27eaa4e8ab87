#include "greedy.h"

#include <stdint.h>

int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

void seeded_prompt(int *p, int n, unsigned seed, int vocab)
{
    uint32_t s = seed * 2654435761u + 7;
    for (int i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        p[i] = 1 + (int)((s >> 8) % (uint32_t)(vocab - 1));
    }
}
