/* The schedule's one pass, and where stage results go. A pass first moves
 * the jobs that lost a worker (recover.c), then admits waiting jobs in
 * order (admit.c), then sends the steps that are due (step.c); it runs
 * after every result, request and tick. */
#include "sched.h"
#include "admit.h"
#include "drafting.h"
#include "log.h"
#include "recover.h"
#include "step.h"
#include "tokpipe/zwire.h"

void sched_run(broker *b)
{
    recover_run(b, tp_now_ms());   /* jobs that lost a worker before new ones */
    admit_waiting(b);
    step_run(b);
}

void sched_on_result(broker *b, int wi, const tp_msg *m)
{
    switch (m->cmd) {
    case TP_CMD_TOKENIZED:
        admit_on_tokenized(b, wi, m);
        break;
    case TP_CMD_STEP_RESULT:
    case TP_CMD_EMBEDDED:
    case TP_CMD_SAMPLED:
    case TP_CMD_VERDICTS:
    case TP_CMD_RESULT:
        step_on_result(b, wi, m);
        break;
    case TP_CMD_DRAFTED:
        if (b->workers[wi].stages & TP_STAGE_DRAFT) {
            drafting_on_result(b, wi, m);
            break;
        }
        __attribute__((fallthrough));   /* only a draft worker drafts */
    default:
        b->stats.malformed_back++;
        blog("worker %s sent %s, which workers do not send", b->workers[wi].instance, tp_cmd_name(TP_FAM_WRK, m->cmd));
        return;
    }
    sched_run(b);
}
