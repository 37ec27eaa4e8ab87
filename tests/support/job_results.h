/* Jobs' results as the integration tests compare them: a finished job's
 * STATUS and `tokpipe run --json` for the same prompt, each as one JSON
 * line of the fields both print (text, tokens, finish_reason, counts; a
 * failed job's error too). Failures end the test (cmocka). */
#ifndef TOKPIPE_TESTS_JOB_RESULTS_H
#define TOKPIPE_TESTS_JOB_RESULTS_H

#include "daemon_harness.h"

/* STATS of the harness's daemon. */
tp_m_stats_reply jr_stats(harness *h);
/* STATUS of id: its state; for a finished job *json (malloc'd, may be NULL
 * to skip) gets the JSON line. */
int jr_status_json(harness *h, const char *id, char **json);
/* Poll STATUS until id finishes (at most timeout_ms); its JSON line. */
char *jr_wait_result(harness *h, const char *id, int timeout_ms);
/* `tokpipe run` greedy on stories260K for prompt, the same fields. */
char *jr_run_json(const harness *h, const char *prompt, int max_tokens);

#endif
