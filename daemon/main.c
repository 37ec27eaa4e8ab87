/* bin/tokpiped: the broker daemon. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "broker.h"
#include "tokpipe/proc.h"
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

int main(int argc, char **argv)
{
    tp_proc_on_quit(on_signal);
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
    tp_config cfg;
    tp_err e;
    tp_err_clear(&e);
    int rc = tp_config_find(config, &cfg, &config, &e);
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
