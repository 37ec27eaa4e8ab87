/* tokpipe status JOB: ask tokpiped about one job (kept for finished_ttl_ms
 * after it finished). */
#include "tools.h"

#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "evfmt.h"

const char cmd_status_summary[] = "show a job's state and text so far, or its result once finished";

static const char usage_text[] =
    "usage: tokpipe status JOB [--json] [connection options]\n"
    "\n"
    "Prints the job's state (queued, running, finished), token counts and the\n"
    "text so far (what a subscriber has been sent: never text the stop check still\n"
    "holds back); once finished, the finish reason, matched stop, timings and the\n"
    "final text.\n"
    "  --json   one JSON object instead: status, job_id, state, prompt_tokens,\n"
    "           completion_tokens, last_seq, text, text_len, tokens (ids so far)\n"
    "           [, reasoning_content][, tool_calls] (so far, for a chat job);\n"
    "           finished: also finish_reason, matched, queue_us, ttft_us, total_us\n"
    "           [, job_error]\n"
    "exit status: 0 known job, 1 unknown/expired job or daemon unreachable, 2 bad usage.\n\n" TP_CLIENT_ARGS_HELP;

static void print_human(const tp_msg *m)
{
    const tp_m_status_reply *s = &m->status_reply;
    bool done = s->state == TP_STATE_FINISHED;
    printf("job %.*s: %s\n", (int)s->job_id.len, s->job_id.ptr, tp_state_name(s->state));
    printf("prompt_tokens %u, completion_tokens %u, last_seq %lld\n", s->prompt_tokens, s->completion_tokens,
           (long long)s->last_seq);
    cJSON *j = evfmt_status(m);
    char *text = cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "text"));
    if (done) {
        char *matched = cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "matched"));
        printf("finish_reason %s, matched %s\n", tp_reason_name(s->reason), matched ? matched : "null");
        printf("queue_us %llu, ttft_us %llu, total_us %llu\n", (unsigned long long)s->timings.queue_us,
               (unsigned long long)s->timings.ttft_us, (unsigned long long)s->timings.total_us);
        if (s->job_error.ptr)
            printf("error: %.*s\n", (int)s->job_error.len, s->job_error.ptr);
        free(matched);
    }
    if (s->text_len > s->text.len)
        printf("(the daemon keeps the first %zu of %llu bytes)\n", s->text.len, (unsigned long long)s->text_len);
    printf("%s %s\n", done ? "text:" : "text so far:", text ? text : "\"\"");
    free(text);
    static const char *const split_keys[] = {"reasoning_content", "tool_calls"};
    for (size_t k = 0; k < 2; k++) {
        char *v = cJSON_PrintUnformatted(cJSON_GetObjectItem(j, split_keys[k]));
        if (v)
            printf("%s: %s\n", split_keys[k], v);
        free(v);
    }
    cJSON_Delete(j);
}

int cmd_status(int argc, char **argv)
{
    tp_client_cmd c = {.name = "status", .usage = usage_text, .json_flag = "--json", .takes_job = true};
    int rc = tp_client_cmd_parse(&c, argc, argv);
    if (rc >= 0)
        return rc;
    rc = tp_client_cmd_call(&c, TP_CMD_STATUS, 0);
    const tp_msg *r = &c.reply.m;
    if (!rc && r->cmd == TP_CMD_STATUS_REPLY && r->status == TP_ST_OK) {
        if (c.json)
            evfmt_print_line(stdout, evfmt_status(r));
        else
            print_human(r);
    } else if (!rc) {
        rc = tp_err_set(&c.err, TP_ENOTFOUND, "job %s: %u %.*s", c.job, r->status, (int)r->error.len,
                        r->error.ptr ? r->error.ptr : "unknown job");
    }
    return tp_client_cmd_done(&c, rc);
}
