/* Brute-force reference for the stop stage (DESIGN.md §3), for tests only.
 *
 * Deliberately simple and independent of workers/stop: every step rebuilds
 * the whole generated text, scans it from the start for stop strings, finds
 * stop-prefix suffixes by comparing every suffix with every stop, and decodes
 * UTF-8 by computing code points (not the Table 3-7 state machine). Chunks
 * are the difference between the decodings of successive published
 * prefixes; the oracle itself checks that each is an extension of the last. */
#ifndef TP_TEST_STOP_ORACLE_H
#define TP_TEST_STOP_ORACLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokpipe/stop.h"

typedef struct oracle_piece {
    const uint8_t *bytes;
    size_t len;
    int32_t id;
} oracle_piece;

#define ORACLE_MAX_STEPS 256

typedef struct oracle_result {
    bool invalid;                  /* the config is rejected */
    size_t steps;                  /* candidates consumed (the last one finished the job, if any) */
    char *chunk[ORACLE_MAX_STEPS + 1];   /* per step, malloc'd; [steps] = cancel release */
    size_t chunk_len[ORACLE_MAX_STEPS + 1];
    bool accepted[ORACLE_MAX_STEPS];
    char *text;                    /* malloc'd final text */
    size_t text_len;
    tp_finish_reason finish;
    int matched_stop;              /* index into cfg->stop of the first equal string, or -1 */
    int32_t matched_id;            /* or -1 */
    int32_t completion_tokens;
    bool retracted;                /* a published prefix was not a prefix of a later one */
} oracle_result;

/* Run pieces[0..n) (n <= ORACLE_MAX_STEPS) through cfg; a job that has not
 * finished when the pieces run out is cancelled. Free with oracle_free. */
void oracle_run(const tp_stop_config *cfg, const oracle_piece *pieces, size_t n, oracle_result *r);
void oracle_free(oracle_result *r);

/* Python-style bytes.decode("utf-8", "replace") by code points; returns a
 * malloc'd buffer and its length in *out_len. */
char *oracle_utf8_replace(const uint8_t *b, size_t n, size_t *out_len);

#endif
