/* bin/tokpiped: the broker daemon. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "broker.h"
#include "spawn.h"

static volatile sig_atomic_t g_quit;

static void on_signal(int sig)
{
    (void)sig;
    g_quit = 1;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: tokpiped [--config FILE] [--no-spawn]\n"
            "\n"
            "The tokpipe broker: binds the producer (front), worker (back), event (events)\n"
            "and stop-stage publish endpoints from the config, admits and schedules jobs\n"
            "over the registered stage workers, and republishes TOKEN/FINISH events.\n"
            "By default it also starts and supervises the configured tokpipe-worker\n"
            "processes, and the HTTP gateway tokpipe-http when http.enabled is true.\n"
            "SIGTERM/SIGINT: stop accepting jobs, drain running ones (up to\n"
            "shutdown.drain_timeout_ms), stop the workers and the gateway, exit 0. It\n"
            "refuses to start (exit 1) when another process listens on one of its ipc\n"
            "endpoints.\n"
            "\n"
            "  --config FILE  configuration (default %s if present, else built-in defaults)\n"
            "  --no-spawn     run the broker alone; workers are started separately (systemd)\n"
            "  --help         this text\n",
            TP_CONFIG_DEFAULT_PATH);
}

/* First thing in main: from here on SIGTERM/SIGINT only ask for a clean
 * exit, whatever phase of startup they hit. SA_RESTART keeps a blocking
 * read (a config on a slow filesystem or a pipe) or waitpid from failing
 * with EINTR; poll-based waits return early anyway and see the flag. The
 * signals are unblocked in case the parent blocked them across exec. */
static void install_signals(void)
{
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
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

int main(int argc, char **argv)
{
    install_signals();
    const char *config = NULL;
    bool spawn = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--no-spawn")) {
            spawn = false;
        } else if (!strcmp(argv[i], "--config") && i + 1 < argc) {
            config = argv[++i];
        } else {
            fprintf(stderr, "tokpiped: unknown or incomplete option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!config && access(TP_CONFIG_DEFAULT_PATH, R_OK) == 0)
        config = TP_CONFIG_DEFAULT_PATH;
    tp_config cfg;
    tp_err e;
    tp_err_clear(&e);
    int rc = config ? tp_config_load(config, &cfg, &e) : tp_config_defaults(&cfg, &e) || tp_config_resolve(&cfg, &e);
    if (rc) {
        fprintf(stderr, "tokpiped: %s\n", e.msg);
        return 2;
    }
    if (g_quit) {   /* asked to stop before anything was bound or started */
        fprintf(stderr, "tokpiped: stopped during startup\n");
        tp_config_free(&cfg);
        return 0;
    }
    static broker b;   /* large (worker table); zero-initialised */
    b.quit = &g_quit;
    b.config_path = config;
    rc = broker_init(&b, &cfg, &e);
    if (!rc && spawn)
        rc = spawn_init(&b, &e);
    if (rc) {
        fprintf(stderr, "tokpiped: %s\n", e.msg);
        broker_free(&b);
        tp_config_free(&cfg);
        return 1;
    }
    rc = broker_run(&b);
    broker_free(&b);
    tp_config_free(&cfg);
    return rc;
}
