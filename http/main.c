/* bin/tokpipe-http: the OpenAI-compatible HTTP gateway in front of tokpiped. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "gw.h"
#include "tokpipe/load.h"

#define SHUTDOWN_FLUSH_MS 5000   /* at most this long for open answers to go out */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: tokpipe-http [--config FILE] [--listen ADDR] [--port N]\n"
            "\n"
            "The OpenAI-compatible HTTP gateway of tokpipe: POST /v1/completions and\n"
            "/v1/chat/completions (streamed with Server-Sent Events when \"stream\": true),\n"
            "GET /v1/models, GET /health and GET /metrics (Prometheus). It is a producer and\n"
            "subscriber of tokpiped (the config's endpoints.front and endpoints.events);\n"
            "tokpiped starts it itself when the config has http.enabled: true.\n"
            "SIGTERM/SIGINT: cancel the jobs of open requests, answer them 503, exit 0.\n"
            "\n"
            "  --config FILE  configuration (default %s if present, else built-in defaults);\n"
            "                 the http section sets address, port, API keys, model name\n"
            "  --listen ADDR  IPv4 address to bind (overrides http.listen)\n"
            "  --port N       TCP port (overrides http.port)\n"
            "  --help         this text\n",
            TP_CONFIG_DEFAULT_PATH);
}

/* The API key file: one key per line, '#' comments and blank lines skipped.
 * A file others can read is refused, as for the CURVE secret keys. */
static int load_keys(gw *g, const char *path, tp_err *err)
{
    struct stat sb;
    if (stat(path, &sb))
        return tp_err_set(err, TP_EIO, "http.api_key_file: %s: %s", path, strerror(errno));
    if (sb.st_mode & S_IROTH)
        return tp_err_set(err, TP_EINVAL, "http.api_key_file: %s is readable by others (chmod o-r)", path);
    FILE *f = fopen(path, "r");
    if (!f)
        return tp_err_set(err, TP_EIO, "http.api_key_file: %s: %s", path, strerror(errno));
    char line[1024];
    int rc = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        char *s = line;
        while (*s == ' ' || *s == '\t')
            s++;
        size_t n = strcspn(s, " \t\r\n");
        if (!n || *s == '#')
            continue;
        s[n] = '\0';
        char **k = realloc(g->api_keys, (g->n_api_keys + 1) * sizeof *k);
        char *d = strdup(s);
        if (!k || !d) {
            free(d);
            if (k)
                g->api_keys = k;
            rc = tp_err_set(err, TP_ENOMEM, "out of memory");
            break;
        }
        g->api_keys = k;
        g->api_keys[g->n_api_keys++] = d;
    }
    fclose(f);
    if (!rc && !g->n_api_keys)
        rc = tp_err_set(err, TP_EINVAL, "http.api_key_file: %s holds no key", path);
    return rc;
}

/* "../shared/models/stories260K.bin" -> "stories260K" */
static char *default_model_name(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char *s = strdup(base[0] ? base : "tokpipe");
    char *dot = s ? strrchr(s, '.') : NULL;
    if (dot && dot != s)
        *dot = '\0';
    return s;
}

int main(int argc, char **argv)
{
    const char *config = NULL, *listen = NULL;
    long port = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--config") && i + 1 < argc) {
            config = argv[++i];
        } else if (!strcmp(argv[i], "--listen") && i + 1 < argc) {
            listen = argv[++i];
        } else if (!strcmp(argv[i], "--port") && i + 1 < argc) {
            char *end;
            port = strtol(argv[++i], &end, 10);
            if (*end || port < 1 || port > 65535) {
                fprintf(stderr, "tokpipe-http: --port: '%s' is not a port in [1, 65535]\n", argv[i]);
                return TP_EXIT_BAD_CONFIG;
            }
        } else {
            fprintf(stderr, "tokpipe-http: unknown or incomplete option '%s'\n", argv[i]);
            usage(stderr);
            return TP_EXIT_BAD_CONFIG;
        }
    }
    /* every thread started from here on inherits the mask: only sigwait
     * below takes SIGTERM/SIGINT */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    tp_config cfg;
    tp_err e;
    tp_err_clear(&e);
    int rc = tp_config_find(config, &cfg, &config, &e);
    if (rc) {
        fprintf(stderr, "tokpipe-http: %s\n", e.msg);
        return TP_EXIT_BAD_CONFIG;
    }
    if (listen) {
        free(cfg.http_listen);
        cfg.http_listen = strdup(listen);
    }
    if (port)
        cfg.http_port = (int)port;
    static gw g;
    g.cfg = &cfg;
    char *model = cfg.http_model_name && cfg.http_model_name[0] ? strdup(cfg.http_model_name)
                                                                  : default_model_name(cfg.model_path);
    g.model_name = model;
    pthread_mutex_init(&g.lock, NULL);
    g.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    g.responses = gw_rstore_new((size_t)cfg.http_responses_max_count, (size_t)cfg.http_responses_max_bytes);
    rc = !cfg.http_listen || !model || !g.responses ? tp_err_set(&e, TP_ENOMEM, "out of memory")
         : g.wake_fd < 0           ? tp_err_set(&e, TP_EIO, "eventfd: %s", strerror(errno))
                                   : 0;
    /* token texts for logprobs: the vocabulary the workers read (model.tokenizer,
     * else the one inside the model file). Without it the gateway still
     * serves everything else; logprobs requests are refused saying why. */
    tp_tokenizer *tok = NULL;
    char tok_error[TP_ERR_MSG_MAX] = "";
    if (!rc) {
        tp_err te;
        tp_err_clear(&te);
        tp_load_spec ls = {.model = cfg.model_path, .tokenizer = cfg.tokenizer_path, .what = TP_LOAD_TOKENIZER};
        tp_loaded ld;
        if (tp_load(&ls, &ld, &te)) {
            snprintf(tok_error, sizeof tok_error, "%s", te.msg);
            fprintf(stderr, "tokpipe-http: logprobs unavailable: %s\n", te.msg);
        } else {
            tok = ld.tok;
            ld.tok = NULL;
            tp_loaded_free(&ld);
        }
        g.tok = tok;
        g.tok_error = tok_error;
    }
    bool bad_keys = false;
    if (!rc && cfg.http_api_key_file[0])
        bad_keys = (rc = load_keys(&g, cfg.http_api_key_file, &e)) != 0;
    pthread_t bridge;
    bool bridge_started = false;
    if (!rc) {
        rc = pthread_create(&bridge, NULL, gw_bridge_main, &g);
        bridge_started = rc == 0;
        if (rc)
            rc = tp_err_set(&e, TP_EIO, "pthread_create: %s", strerror(rc));
    }
    if (!rc)
        rc = gw_server_start(&g, &e);
    int status = 0;
    if (rc) {
        fprintf(stderr, "tokpipe-http: %s\n", e.msg);
        /* a bad key file or address fails every start the same way (tokpiped
         * gives up after a few); a port in use may free up (1: respawn) */
        status = e.code == TP_EINVAL || bad_keys ? TP_EXIT_BAD_CONFIG : 1;
    } else {
        fprintf(stderr, "tokpipe-http: serving http://%s:%d/v1 (model %s) for tokpiped at %s\n", cfg.http_listen,
                cfg.http_port, model, cfg.ep_front);
        sd_notify(0, "READY=1");
        int sig;
        sigwait(&set, &sig);
        sd_notify(0, "STOPPING=1");
    }
    /* The bridge answers every open call (503) and resumes its connection
     * before it returns, so none is suspended when MHD stops. */
    g.quit = 1;
    uint64_t one = 1;
    if (write(g.wake_fd, &one, sizeof one) < 0 && g.wake_fd >= 0)
        fprintf(stderr, "tokpipe-http: wake: %s\n", strerror(errno));
    if (bridge_started)
        pthread_join(bridge, NULL);
    /* let the last answers (a long stream's queued events) reach their
     * clients before MHD closes the sockets */
    for (int waited = 0; g.mhd && waited < SHUTDOWN_FLUSH_MS; waited += 20) {
        pthread_mutex_lock(&g.lock);
        int open = g.open_calls;
        pthread_mutex_unlock(&g.lock);
        if (!open)
            break;
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    gw_server_stop(&g);
    for (size_t i = 0; i < g.n_api_keys; i++)
        free(g.api_keys[i]);
    free(g.api_keys);
    free(model);
    tp_tokenizer_free(tok);
    gw_rstore_free(g.responses);
    if (g.wake_fd >= 0)
        close(g.wake_fd);
    tp_config_free(&cfg);
    return status;
}
