/* Jobs' results as the integration tests compare them (job_results.h). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "job_results.h"

tp_m_stats_reply jr_stats(harness *h)
{
    tp_m_stats_reply s;
    if (harness_stats(h, &s))
        fail_msg("STATS: no reply");
    return s;
}

/* STATUS of id: its state; for a finished job the fields `tokpipe run
 * --json` prints (and its error), as one JSON line (malloc'd) in *json. */
int jr_status_json(harness *h, const char *id, char **json)
{
    tp_msg m, r;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_STATUS);
    m.jobref.job_id = tp_str_of(id);
    tp_zmsg z;
    if (harness_call(h, &m, &z, &r))
        fail_msg("STATUS %s: no reply", id);
    if (r.status != TP_ST_OK)
        fail_msg("STATUS %s: status %u %.*s", id, r.status, (int)r.error.len, r.error.ptr);
    const tp_m_status_reply *st = &r.status_reply;
    int state = st->state;
    if (json && state == TP_STATE_FINISHED) {
        char *text = strndup(st->text.ptr ? st->text.ptr : "", st->text.len);
        int32_t *ids = malloc((st->tokens.n ? st->tokens.n : 1) * sizeof *ids);
        assert_true(text && ids);
        for (size_t i = 0; i < st->tokens.n; i++)
            ids[i] = tp_raw_i32(st->tokens, i);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "text", text);
        cJSON_AddItemToObject(o, "tokens", cJSON_CreateIntArray(ids, (int)st->tokens.n));
        cJSON_AddStringToObject(o, "finish_reason", tp_reason_name(st->reason));
        cJSON_AddNumberToObject(o, "prompt_tokens", st->prompt_tokens);
        cJSON_AddNumberToObject(o, "completion_tokens", st->completion_tokens);
        if (st->reason == TP_REASON_ERROR) {
            char *err = strndup(st->job_error.ptr ? st->job_error.ptr : "", st->job_error.len);
            cJSON_AddStringToObject(o, "error", err);
            free(err);
        }
        *json = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        free(text);
        free(ids);
    }
    tp_msg_clear(&r);
    tp_zmsg_close(&z);
    return state;
}

char *jr_wait_result(harness *h, const char *id, int timeout_ms)
{
    char *json = NULL;
    for (int waited = 0; jr_status_json(h, id, &json) != TP_STATE_FINISHED; waited += 20) {
        if (waited > timeout_ms)
            fail_msg("job %s did not finish within %d ms (log in %s)", id, timeout_ms, h->dir);
        harness_sleep_ms(20);
    }
    return json;
}

/* What `tokpipe run` gives for prompt in one process, in jr_status_json's shape. */
char *jr_run_json(const harness *h, const char *prompt, int max_tokens)
{
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd,
             "%s/tokpipe run --model %s/stories260K.bin --tokenizer %s/tok512.bin --json --prompt '%s' "
             "--temperature 0 --max-tokens %d 2>/dev/null",
             h->bin, h->models, h->models, prompt, max_tokens);
    if (harness_sh(cmd, &out) != 0)
        fail_msg("tokpipe run failed: %s", out ? out : "");
    cJSON *all = cJSON_Parse(out);
    if (!all)
        fail_msg("tokpipe run printed no JSON: %s", out);
    const char *fields[] = {"text", "tokens", "finish_reason", "prompt_tokens", "completion_tokens"};
    cJSON *o = cJSON_CreateObject();
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        cJSON_AddItemToObject(o, fields[i], cJSON_Duplicate(cJSON_GetObjectItem(all, fields[i]), 1));
    char *json = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    cJSON_Delete(all);
    free(out);
    return json;
}
