/* make bench: the HTTP gateway's cost. 32 concurrent streaming clients on
 * tokpipe-http (POST /v1/completions, "stream": true, one SSE event per
 * text delta) against the same 32 jobs submitted straight over ZeroMQ to
 * the same daemon, on a random stories15M-shaped model (`tokpipe mkmodel`).
 * Both run greedy, ignore_eos, the same prompt ids and max_tokens, in the
 * same minute, alternating; each figure is a median of SAMPLES, and the
 * ratio is the median of the per-pair ratios (robust to the load of a
 * shared machine drifting between pairs). Reports
 * aggregate tokens/s and time to first token (p50, p99: first event with
 * text over HTTP, first TOKEN event over ZeroMQ), and the HTTP / ZeroMQ
 * throughput ratio.
 *
 * The HTTP client here only writes a fixed request and timestamps the
 * "data: " events in the byte stream (HTTP/1.0, so the gateway sends the
 * body unchunked and closes): it measures, it does not parse HTTP. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "support/bdaemon.h"
#include "support/rand.h"
#include "support/timing.h"

#define JOBS 32
#define PROMPT_LEN 16
#define MAX_TOKENS 64
#define SAMPLES 5

typedef struct res {
    double tok_s, ttft_p50, ttft_p99;   /* ms */
} res;

static int32_t prompts[JOBS][PROMPT_LEN];

static double pct(double *v, int n, double p)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return v[(int)(p * (n - 1) + 0.5)];
}

/* ---- over HTTP ------------------------------------------------------------ */

typedef struct hclient {
    int fd;
    char req[2048];
    size_t req_len, sent;
    double first;      /* first event with text */
    bool done;
    char *body;        /* the stream, kept to read usage at the end */
    size_t len, cap;
} hclient;

static int connect_port(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

static int http_run(int port, bool quiet, res *out)
{
    static hclient c[JOBS];
    double t0 = bench_now();
    for (int j = 0; j < JOBS; j++) {
        hclient *h = &c[j];
        free(h->body);
        memset(h, 0, sizeof *h);
        char body[1024];
        int n = snprintf(body, sizeof body, "{\"prompt\":[");
        for (int k = 0; k < PROMPT_LEN; k++)
            n += snprintf(body + n, sizeof body - (size_t)n, "%s%d", k ? "," : "", prompts[j][k]);
        n += snprintf(body + n, sizeof body - (size_t)n,
                      "],\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true,\"stream\":true,"
                      "\"stream_options\":{\"include_usage\":true}}",
                      MAX_TOKENS);
        h->req_len = (size_t)snprintf(h->req, sizeof h->req,
                                      "POST /v1/completions HTTP/1.0\r\nHost: bench\r\nContent-Type: "
                                      "application/json\r\nContent-Length: %d\r\n\r\n%s",
                                      n, body);
        if ((h->fd = connect_port(port)) < 0)
            return -1;
    }
    int open = JOBS;
    while (open) {
        struct pollfd p[JOBS];
        for (int j = 0; j < JOBS; j++)
            p[j] = (struct pollfd){c[j].done ? -1 : c[j].fd,
                                   (short)(c[j].sent < c[j].req_len ? POLLOUT : POLLIN), 0};
        if (poll(p, JOBS, 20000) <= 0) {
            if (!quiet)
                fprintf(stderr, "bench_http: stalled (%d streams open)\n", open);
            return -1;
        }
        double t = bench_now();
        for (int j = 0; j < JOBS; j++) {
            hclient *h = &c[j];
            if (!p[j].revents || h->done)
                continue;
            if (h->sent < h->req_len) {
                ssize_t w = write(h->fd, h->req + h->sent, h->req_len - h->sent);
                if (w > 0)
                    h->sent += (size_t)w;
                continue;
            }
            char buf[65536];
            ssize_t r = read(h->fd, buf, sizeof buf);
            if (r <= 0) {
                h->done = true;
                close(h->fd);
                open--;
                continue;
            }
            if (h->len + (size_t)r + 1 > h->cap) {
                h->cap = (h->len + (size_t)r + 1) * 2;
                h->body = realloc(h->body, h->cap);
                if (!h->body)
                    return -1;
            }
            memcpy(h->body + h->len, buf, (size_t)r);
            h->len += (size_t)r;
            h->body[h->len] = '\0';
            for (const char *q = h->body; !h->first && (q = strstr(q, "\"text\":\"")); q += 8)
                if (q[8] != '"')
                    h->first = t;   /* the first event carrying text */
        }
    }
    double t_end = bench_now();
    double ttft[JOBS];
    long total = 0;
    for (int j = 0; j < JOBS; j++) {
        const char *u = strstr(c[j].body ? c[j].body : "", "\"completion_tokens\":");
        if (!u || !c[j].first) {
            if (!quiet)
                fprintf(stderr, "bench_http: stream %d ended without usage: %.200s\n", j, c[j].body ? c[j].body : "");
            return -1;
        }
        total += atol(u + 20);
        ttft[j] = (c[j].first - t0) * 1e3;
    }
    out->tok_s = (double)total / (t_end - t0);
    out->ttft_p50 = pct(ttft, JOBS, 0.5);
    out->ttft_p99 = pct(ttft, JOBS, 0.99);
    return 0;
}

/* ---- over ZeroMQ ----------------------------------------------------------- */

typedef struct zacc {
    double first[JOBS];   /* first TOKEN event */
    long total;           /* completion tokens, from FINISH */
} zacc;

static void on_event(void *ctx, int j, const tp_msg *ev, double t)
{
    zacc *a = ctx;
    if (ev->cmd == TP_CMD_TOKEN && !a->first[j])
        a->first[j] = t;
    if (ev->cmd == TP_CMD_FINISH)
        a->total += ev->finish.completion_tokens;
}

static int zmq_run(bench_daemon *d, const char *prefix, res *out)
{
    double t0 = bench_now();
    zacc a = {{0}, 0};
    for (int j = 0; j < JOBS; j++)
        if (bench_daemon_submit(d, prefix, j, prompts[j], PROMPT_LEN, MAX_TOKENS))
            return -1;
    if (bench_daemon_events(d, prefix, JOBS, 20000, on_event, &a))
        return -1;
    double t_end = bench_now(), ttft[JOBS];
    for (int j = 0; j < JOBS; j++)
        ttft[j] = (a.first[j] - t0) * 1e3;
    out->tok_s = (double)a.total / (t_end - t0);
    out->ttft_p50 = pct(ttft, JOBS, 0.5);
    out->ttft_p99 = pct(ttft, JOBS, 0.99);
    return 0;
}

static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) || getsockname(s, (struct sockaddr *)&a, &l))
        return -1;
    close(s);
    return ntohs(a.sin_port);
}

static int cmp_tok(const void *a, const void *b)
{
    return bench_cmp_double(&((const res *)a)->tok_s, &((const res *)b)->tok_s);
}

int main(void)
{
    const char *bin = getenv("BIN") ? getenv("BIN") : "bin";
    char dir[] = "/tmp/tpbench-http-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    char cmd[1024], cfg[256], front[256], events[256];
    snprintf(cmd, sizeof cmd,
             "%s/tokpipe mkmodel --shape stories15M --seed 1 --out %s/m.bin --tokenizer-out %s/tok.bin --quiet", bin,
             dir, dir);
    if (system(cmd) != 0)
        return fprintf(stderr, "bench_http: mkmodel failed\n"), 1;
    uint64_t x = 88172645463325252ull;
    for (int j = 0; j < JOBS; j++) {
        bench_random_ids(&x, prompts[j], PROMPT_LEN);
        prompts[j][0] = 1;   /* BOS */
    }
    int port = free_port();
    snprintf(cfg, sizeof cfg, "%s/c.yaml", dir);
    FILE *f = fopen(cfg, "w");
    if (!f || port < 0)
        return 1;
    fprintf(f, "runtime_dir: %s/rt\nmodel:\n  path: %s/m.bin\n  tokenizer: %s/tok.bin\nkv:\n  slots: 64\n"
               "workers:\n  binary: %s/tokpipe-worker\nhttp:\n  port: %d\n",
            dir, dir, dir, bin, port);
    fclose(f);
    snprintf(front, sizeof front, "ipc://%s/rt/front.sock", dir);
    snprintf(events, sizeof events, "ipc://%s/rt/events.sock", dir);
    bench_daemon d;
    if (bench_daemon_start(&d, bin, cfg, front, events)) {
        fprintf(stderr, "bench_http: the daemon did not come up\n");
        bench_daemon_stop(&d);
        return 1;
    }
    /* the HTTP jobs' events would otherwise queue up on the SUB socket
     * between samples and be read inside the next ZeroMQ measurement */
    bench_daemon_subscribe(&d, "bz");
    /* the gateway is up when a warm-up completion comes back through it */
    res r;
    int ok = -1;
    for (int i = 0; i < 600 && ok; i++) {
        usleep(100000);
        ok = http_run(port, true, &r);
    }
    if (ok) {
        fprintf(stderr, "bench_http: the gateway did not come up\n");
        bench_daemon_stop(&d);
        return 1;
    }
    usleep(200000);   /* the new subscription settles */
    res h[SAMPLES], q[SAMPLES];
    double ratio[SAMPLES], tratio[SAMPLES];
    int rc = 0;
    for (int s = 0; s < SAMPLES && !rc; s++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "bz%d", s);
        rc = zmq_run(&d, prefix, &q[s]) || http_run(port, false, &h[s]);
        if (!rc) {
            ratio[s] = h[s].tok_s / q[s].tok_s;
            tratio[s] = h[s].ttft_p50 / q[s].ttft_p50;
        }
    }
    if (!rc) {
        qsort(h, SAMPLES, sizeof h[0], cmp_tok);
        qsort(q, SAMPLES, sizeof q[0], cmp_tok);
        res hm = h[SAMPLES / 2], qm = q[SAMPLES / 2];
        printf("bench_http: stories15M-shaped random model, %d concurrent streams, prompt %d, %d tokens each, "
               "greedy; medians of %d\n",
               JOBS, PROMPT_LEN, MAX_TOKENS, SAMPLES);
        printf("  %-22s %8.0f tok/s  TTFT p50 %7.2f p99 %7.2f ms\n", "ZeroMQ (SUBMIT + SUB)", qm.tok_s, qm.ttft_p50,
               qm.ttft_p99);
        printf("  %-22s %8.0f tok/s  TTFT p50 %7.2f p99 %7.2f ms\n", "HTTP SSE (tokpipe-http)", hm.tok_s,
               hm.ttft_p50, hm.ttft_p99);
        printf("  HTTP / ZeroMQ: tokens/s ratio %.2f, TTFT p50 ratio %.2f (medians of per-pair ratios)\n",
               bench_median(ratio, SAMPLES), bench_median(tratio, SAMPLES));
    }
    bench_daemon_stop(&d);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        return 1;
    return rc ? 1 : 0;
}
