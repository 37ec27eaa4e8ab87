/* tokpiped's top floor: the sockets and the one poll loop (broker.c).
 *
 * The daemon is built in floors, each with its header; every file calls
 * only the floors under it and includes only their headers (both checked
 * by tests/layers_test.py), top to bottom:
 *
 *   broker.c    the sockets and the one poll loop; the only file that sends:
 *               it drains the outbox the floors below fill
 *   front.c     producer requests (SUBMIT, CANCEL, STATUS, STATS, INFO)
 *   sched.c     one scheduling pass (recover, admit, steps) and the
 *               dispatch of stage results
 *   admit.c     admission and queues: tokenize dispatch, first pinning
 *   step.c      the step cycle: building STEPs, consuming results
 *   recover.c   lost workers: moving and replaying jobs, poison jobs
 *   pin.c       pinning a job to workers and letting go; how a job ends
 *   choose.c    worker choice
 *   registry.c, info.c, spawn.c, metrics.c   workers, model facts,
 *               worker processes, latency histograms
 *   outbox.c, log.c, jobs.c (+ joblp.c)      messages waiting to be sent,
 *               the log, the job table (jobs.h: pure data)
 *
 * One thread, one poll loop. Events from stop workers arrive on the XSUB
 * socket, are recorded into the job table (for STATUS) and forwarded
 * verbatim to subscribers on the XPUB socket. */
#ifndef TOKPIPED_BROKER_H
#define TOKPIPED_BROKER_H

#include "state.h"

int broker_init(broker *b, tp_config *cfg, tp_err *err);
int broker_run(broker *b);
void broker_free(broker *b);

#endif
