/* tokpipe cancel JOB: cancel a queued or running job (idempotent). */
#include "tools.h"

#include <stdio.h>
#include <string.h>

#include "client.h"

const char cmd_cancel_summary[] = "cancel a job (its subscribers get FINISH cancelled)";

static const char usage_text[] =
    "usage: tokpipe cancel JOB [connection options]\n"
    "\n"
    "Asks tokpiped to cancel the job: subscribers then receive FINISH with reason\n"
    "cancelled and the text published so far. Cancelling a finished job changes\n"
    "nothing.\n"
    "exit status: 0 cancelled or already finished, 1 unknown job or daemon unreachable,\n"
    "2 bad usage.\n\n" TP_CLIENT_ARGS_HELP;

int cmd_cancel(int argc, char **argv)
{
    tp_client_cmd c = {.name = "cancel", .usage = usage_text, .takes_job = true};
    int rc = tp_client_cmd_parse(&c, argc, argv);
    if (rc >= 0)
        return rc;
    tp_err err = {0};
    tp_recv r = {0};
    tp_msg m;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_CANCEL);
    m.jobref.job_id = tp_str_of(c.job);
    rc = tp_client_cmd_call(&c, &m, 0, &r, &err);
    if (!rc) {
        uint32_t st = r.m.status;
        if (st == TP_ST_OK)
            printf("%s: cancelled\n", c.job);
        else if (st == TP_ST_CONFLICT)
            printf("%s: already finished\n", c.job);
        else
            rc = tp_err_set(&err, TP_ENOTFOUND, "%s: %u %.*s", c.job, st, (int)r.m.error.len,
                            r.m.error.ptr ? r.m.error.ptr : "");
    }
    return tp_client_cmd_done(&c, rc, &err, &r);
}
