/* The integration tests' one yardstick: the daemon gives, line for line,
 * what `tokpipe run --json` computes in one process. */
#ifndef TESTS_RUN_COMPARE_H
#define TESTS_RUN_COMPARE_H

#include <stddef.h>

#include "daemon_harness.h"

/* Run each group of `tokpipe generate` arguments at once (one process per
 * group, so their jobs share the batch) against the started daemon h,
 * stop h (it must exit 0), then run each group through `tokpipe run --json
 * RUN_MODEL GROUP` and compare (compare_run_lines). run_model names the
 * model for tokpipe run ("--model M [--tokenizer T]"); what prefixes the
 * failure messages. Fails the test on any difference. */
void daemon_equals_run(harness *h, const char *const *groups, size_t n, int timeout_ms, const char *run_model,
                       const char *what);

/* The JSON lines of generate (got) and run (want), one per prompt: text,
 * tokens, finish_reason, prompt_tokens and completion_tokens equal, and at
 * least one line. */
void compare_run_lines(const char *what, const char *got, const char *want);

#endif
