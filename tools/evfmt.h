/* JSON and text renderings of protocol messages shared by the client
 * commands (watch, status, stats). */
#ifndef TOKPIPE_TOOLS_EVFMT_H
#define TOKPIPE_TOOLS_EVFMT_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "tokpipe/protocol.h"

/* A JSON string of s (bytes copied; a NUL inside ends it, as in C). */
cJSON *evfmt_str(tp_str s);

/* matched as a JSON string, number or null. */
cJSON *evfmt_matched(const tp_matched *m);

/* An array of the int32 ids in r. */
cJSON *evfmt_ids(tp_raw r);

/* Calls as OpenAI's message tool_calls: [{"id", "type": "function",
 * "function": {"name", "arguments"}}, ...]. */
cJSON *evfmt_tool_calls(const tp_tool_call *c, size_t n);

/* A TOKEN or FINISH event as one JSON object:
 *   {"event":"token","job_id","seq","index","ids":[...],"text"[,"reasoning"][,"tool_calls"]}
 *   (a token's tool_calls: call deltas, arguments the next fragment)
 *   {"event":"finish","job_id","seq","reason","matched","text","prompt_tokens",
 *    "completion_tokens","text_len","queue_us","ttft_us","total_us"[,"error"]
 *    [,"reasoning_content"][,"tool_calls"]} */
cJSON *evfmt_event(const tp_msg *m);

/* The logprobs of ids (one lp row each), as `tokpipe run --json` writes
 * them: [{"id", "logprob", "top": [{"id", "logprob"}, ...]}, ...] (-inf and
 * NaN as null, padding ids -1 left out). NULL when lp has no frames. */
cJSON *evfmt_logprobs(tp_raw ids, const tp_lp_cols *lp);

/* A STATUS_REPLY as JSON: status, job_id, state, counts; for a known job
 * the text, text_len and tokens so far (the final ones once finished); when
 * finished also finish_reason, matched, job_error and timings. */
cJSON *evfmt_status(const tp_msg *m);

/* A STATS_REPLY as JSON (every counter; workers and finish as objects,
 * stop_triggers as [{"matched", "count", "truncated"}]). */
cJSON *evfmt_stats(const tp_msg *m);

/* Print j unformatted on one line and free it. */
void evfmt_print_line(FILE *out, cJSON *j);

#endif
