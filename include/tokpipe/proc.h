/* Starting a program the way every tokpipe program starts. */
#ifndef TOKPIPE_PROC_H
#define TOKPIPE_PROC_H

/* First thing in main: from here on SIGTERM and SIGINT call on_quit (which
 * only sets a flag or writes to a pipe: they ask for a clean exit,
 * whatever phase of startup they hit), and a write to a closed socket or
 * pipe is an error, not the end. SA_RESTART keeps a blocking read (a
 * config on a slow filesystem or a pipe) or waitpid from failing with
 * EINTR; poll-based waits return early anyway and see the flag. The two
 * signals are unblocked in case the parent blocked them across exec. */
void tp_proc_on_quit(void (*on_quit)(int));

#endif
