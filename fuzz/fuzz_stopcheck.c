/* libFuzzer target over the stopcheck harness input: any bytes as one case
 * line, with the small real vocabulary ($TP_MODELS/tok512.bin) loaded so
 * "tokens" cases run too. Checks, beyond the sanitizers, that the answer is
 * always one JSON object and that a result's chunks concatenate to its
 * text. */
#include <cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/stopcheck.h"

static tp_tokenizer *tok;   /* loaded once; the fuzzer's process is its main */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *dir = getenv("TP_MODELS");
    char path[1024];
    snprintf(path, sizeof path, "%s/tok512.bin", dir ? dir : "../shared/models");
    if (tp_tokenizer_load(path, 0, &tok, NULL)) tok = NULL;   /* pieces mode only */
    return 0;
}

static void check_result(const char *out, size_t n_in)
{
    cJSON *o = cJSON_Parse(out);
    if (!o || !cJSON_IsObject(o)) abort();
    const cJSON *chunks = cJSON_GetObjectItemCaseSensitive(o, "chunks");
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(o, "text");
    const cJSON *done = cJSON_GetObjectItemCaseSensitive(o, "completion_tokens");
    if (!chunks || !cJSON_IsString(text) || !cJSON_IsNumber(done)) abort();
    size_t pos = 0, len = strlen(text->valuestring);
    const cJSON *c;
    cJSON_ArrayForEach(c, chunks) {
        size_t k = strlen(c->valuestring);
        if (k == 0 || pos + k > len || memcmp(text->valuestring + pos, c->valuestring, k)) abort();
        pos += k;
    }
    if (pos != len || done->valuedouble < 0 || done->valuedouble > (double)n_in) abort();
    cJSON_Delete(o);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tp_stop_stats stats = {0};
    bool failed;
    char *out = tp_stopcheck_case((const char *)data, size, tok, &stats, &failed);
    if (!out) return 0;
    if (failed) {
        cJSON *o = cJSON_Parse(out);
        if (!cJSON_GetObjectItemCaseSensitive(o, "error")) abort();
        cJSON_Delete(o);
    } else {
        check_result(out, size);
    }
    free(out);
    free(tp_stop_stats_json(&stats));
    return 0;
}
