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
    rc = tp_client_cmd_call(&c, TP_CMD_CANCEL, 0);
    if (!rc) {
        const tp_msg *r = &c.reply.m;
        if (r->status == TP_ST_OK)
            printf("%s: cancelled\n", c.job);
        else if (r->status == TP_ST_CONFLICT)
            printf("%s: already finished\n", c.job);
        else
            rc = tp_err_set(&c.err, TP_ENOTFOUND, "%s: %u %.*s", c.job, r->status, (int)r->error.len,
                            r->error.ptr ? r->error.ptr : "");
    }
    return tp_client_cmd_done(&c, rc);
}
