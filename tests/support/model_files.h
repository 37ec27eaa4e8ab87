/* Test support: read a file from TP_MODELS into a malloc'ed buffer (so
 * ASan sees reads past a truncated copy). */
#ifndef TP_TEST_MODEL_FILES_H
#define TP_TEST_MODEL_FILES_H

#include <stddef.h>

/* Returns a malloc'ed copy of $TP_MODELS/name (caller frees) or NULL. */
void *model_file_read(const char *name, size_t *size);

/* Full path of $TP_MODELS/name in a static-free caller buffer. */
void model_file_path(const char *name, char *buf, size_t cap);

#endif
