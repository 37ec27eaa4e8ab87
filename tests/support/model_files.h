/* Test support: read a file from TP_MODELS into a malloc'ed buffer (so
 * ASan sees reads past a truncated copy). */
#ifndef TP_TEST_MODEL_FILES_H
#define TP_TEST_MODEL_FILES_H

#include <stddef.h>
#include <stdint.h>

#include "tokpipe/model.h"
#include "tokpipe/synth.h"

/* Returns a malloc'ed copy of $TP_MODELS/name (caller frees) or NULL. */
void *model_file_read(const char *name, size_t *size);

/* Full path of $TP_MODELS/name in a static-free caller buffer. */
void model_file_path(const char *name, char *buf, size_t cap);

/* A random model of o's architecture and options (its vocabulary from
 * $TP_MODELS' llama SPM vocab when o.vocab_from is NULL) of shape
 * ("64x2x4x2"...) from seed, written to a temporary file and loaded (the
 * file is gone, the mapping stays); fails the test (cmocka) naming the
 * error otherwise. The caller frees the model. */
tp_model *synth_model_load(tp_synth_gguf o, const char *shape, uint64_t seed);

#endif
