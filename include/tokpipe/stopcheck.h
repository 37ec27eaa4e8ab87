/* The offline stop harness behind `tokpipe stopcheck`: one JSON case in, one
 * JSON result out, run through the real stop stage (tp_stop, tp_detok).
 *
 * Input: a JSON object with
 *   "pieces": [ "text" | {"text": "..."} | {"hex": "e4b8"}, optional "id": int ]
 *             (a piece without id gets id 1000 + its index), or, when a
 *             tokenizer is given, "tokens": [ids] (+ optional
 *             "prompt_last_id", default BOS: the leading-space context);
 *   "stop": [strings], "stop_token_ids": [ints], "eos_token_id": int or
 *   [ints] (default in tokens mode: the tokenizer's EOS), "ignore_eos",
 *   "include_stop_str_in_output": bool, "min_tokens", "max_tokens": int,
 *   "trace": bool (adds "steps": per candidate its id, bytes (hex),
 *   accepted, chunk, bytes held back (hex) and finish).
 * In tokens mode the default eos ids are the vocabulary's end-of-generation
 * set, and a stop string naming a control token ("</s>") also stops on that
 * token as a stop id, as the stop stage does (tp_detok_control_stops).
 * Unknown fields are errors (a misspelt "stops" must not pass silently).
 * Running out of pieces before a finish means the job was cancelled.
 * Output: {"chunks": [non-empty deltas], "text", "finish_reason", "matched":
 * string | id | null, "completion_tokens"} or {"error": "message"}. */
#ifndef TOKPIPE_STOPCHECK_H
#define TOKPIPE_STOPCHECK_H

#include <stdbool.h>
#include <stddef.h>

#include "tokpipe/stop.h"
#include "tokpipe/tokenizer.h"

/* Run one case (len bytes of JSON, need not be NUL-terminated). tok may be
 * NULL (then "tokens" is an error). If stats is not NULL the job's counters
 * are merged into it. Returns a malloc'd NUL-terminated single-line JSON
 * object (caller frees) and sets *failed when it is an {"error": ...}
 * object; NULL only when out of memory. */
char *tp_stopcheck_case(const char *json, size_t len, const tp_tokenizer *tok, tp_stop_stats *stats,
                        bool *failed);

/* The counters as one JSON object (finish reasons by name, byte counters,
 * triggers as [{"string"|"id": ..., "count": n}]). Caller frees; NULL when
 * out of memory. */
char *tp_stop_stats_json(const tp_stop_stats *stats);

#endif
