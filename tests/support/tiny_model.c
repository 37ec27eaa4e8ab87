/* A tiny_llama checkpoint loaded as a tp_model (tiny_model.h). */
#include "tiny_model.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

tp_model *tiny_model_load(const float *ck, size_t size)
{
    tp_model *m = NULL;
    tp_err e;
    if (tp_model_from_memory(ck, size, &m, &e))
        fail_msg("tiny model of %zu bytes does not load: %s", size, e.msg);
    return m;
}

tp_model *tiny_model_new(const tiny_shape *s, unsigned seed, float scale, float **ck)
{
    size_t size;
    *ck = tiny_llama_build(s, seed, scale, &size);
    if (!*ck)
        fail_msg("tiny model %dx%d: out of memory", s->dim, s->hidden);
    return tiny_model_load(*ck, size);
}
