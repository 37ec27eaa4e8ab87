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
    tp_client_args a = {0};
    const char *job = NULL;
    tp_err err = {0};
    for (int i = 1; i < argc; i++) {
        int rc = tp_client_parse_arg(&a, argc, argv, &i, &err);
        if (rc < 0)
            return fprintf(stderr, "tokpipe cancel: %s\n", err.msg), 2;
        if (rc)
            continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            return fputs(usage_text, stdout), 0;
        if (!job && argv[i][0] != '-')
            job = argv[i];
        else
            return fprintf(stderr, "tokpipe cancel: unknown argument '%s'\n%s", argv[i], usage_text), 2;
    }
    if (!job || !tp_job_id_valid(job, strlen(job)))
        return fprintf(stderr, "tokpipe cancel: %s\n%s", job ? "not a job id" : "JOB is required", usage_text), 2;
    tp_client *c = NULL;
    tp_recv r = {0};
    tp_msg m;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_CANCEL);
    m.jobref.job_id = tp_str_of(job);
    int rc = tp_client_open(&a, true, false, &c, &err);
    if (!rc)
        rc = tp_client_call(c, &m, &r, &err);
    if (!rc) {
        uint32_t st = r.m.status;
        if (st == TP_ST_OK)
            printf("%s: cancelled\n", job);
        else if (st == TP_ST_CONFLICT)
            printf("%s: already finished\n", job);
        else
            rc = tp_err_set(&err, TP_ENOTFOUND, "%s: %u %.*s", job, st, (int)r.m.error.len,
                            r.m.error.ptr ? r.m.error.ptr : "");
    }
    if (rc)
        fprintf(stderr, "tokpipe cancel: %s\n", err.msg);
    tp_recv_free(&r);
    tp_client_free(c);
    return rc ? 1 : 0;
}
