/* Test support: a tiny_llama checkpoint loaded as a tp_model, the setup
 * the forward and model tests share (kept apart from tiny_llama.c, whose
 * reference forward stays independent of workers/forward). */
#ifndef TP_TEST_TINY_MODEL_H
#define TP_TEST_TINY_MODEL_H

#include "tiny_llama.h"
#include "tokpipe/model.h"

/* The model tp_model_from_memory makes of checkpoint ck of size bytes
 * (tiny_llama_build's buffer, perhaps edited since): it borrows ck, so free
 * ck after tp_model_free. Fails the running cmocka test, with the loader's
 * message, when ck does not load. */
tp_model *tiny_model_load(const float *ck, size_t size);

/* tiny_llama_build(s, seed, scale) loaded with tiny_model_load; the
 * checkpoint goes to *ck (caller frees, after tp_model_free). */
tp_model *tiny_model_new(const tiny_shape *s, unsigned seed, float scale, float **ck);

#endif
