/* Starting a program (proc.h). */
#include "tokpipe/proc.h"

#include <signal.h>
#include <stddef.h>

void tp_proc_on_quit(void (*on_quit)(int))
{
    struct sigaction sa = {0};
    sa.sa_handler = on_quit;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
}
