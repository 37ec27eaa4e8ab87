/* The HTTP side: libmicrohttpd with one internal epoll thread. Requests
 * that need the broker become gw_calls for the bridge thread and their
 * connection is suspended until the bridge resumes it (gw.h). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <microhttpd.h>

#include "gw.h"

#define SSE_BLOCK 65536

/* The APIs, by path. */
const gw_api *const gw_apis[] = {&gw_api_completions, &gw_api_chat, &gw_api_messages, &gw_api_count_tokens,
                                  &gw_api_responses, &gw_api_embeddings, NULL};

/* Per-connection request state (MHD's con_cls). */
typedef struct conn_state {
    tp_buf body;          /* limited to http.max_body_bytes; err: refused */
    gw_call *call;        /* once handed to the bridge */
    gw_endpoint ep;       /* what the URL names (for /metrics) */
    const gw_api *api;    /* its API (errors in its shape); NULL: OpenAI's shape */
} conn_state;

void gw_call_unref(gw_call *c)
{
    if (--c->refs > 0)
        return;
    oai_request_free(&c->oreq);
    free(c->body);
    tp_buf_free(&c->out);
    free(c);
}

int gw_submit_call(gw *g, gw_call *c)
{
    pthread_mutex_lock(&g->lock);
    if (g->stopping) {
        pthread_mutex_unlock(&g->lock);
        return -1;
    }
    c->refs++;
    if (g->inbox_tail)
        g->inbox_tail->next = c;
    else
        g->inbox = c;
    g->inbox_tail = c;
    pthread_mutex_unlock(&g->lock);
    uint64_t one = 1;
    ssize_t r = write(g->wake_fd, &one, sizeof one);
    (void)r;
    return 0;
}

static void count_status(gw *g, gw_endpoint ep, int status)
{
    int k = status / 100;
    if (k >= 2 && k <= 5) {
        pthread_mutex_lock(&g->lock);
        g->counters.requests[ep][k]++;
        pthread_mutex_unlock(&g->lock);
    }
}

/* Queue a complete response; takes body (NULL: out of memory -> 500). */
static enum MHD_Result send_body(gw *g, struct MHD_Connection *conn, const conn_state *st, int status, char *body,
                                 const char *ctype, int retry_after, const char *allow)
{
    if (!body) {
        status = 500;
        body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":500}}");
        ctype = "application/json";
        if (!body)
            return MHD_NO;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (retry_after > 0) {
        char v[16];
        snprintf(v, sizeof v, "%d", retry_after);
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, v);
    }
    if (allow)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    if (status == 401)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    count_status(g, st->ep, status);
    return ret;
}

/* An error in the shape of the API the URL names. */
static enum MHD_Result send_error(gw *g, struct MHD_Connection *conn, const conn_state *st, int status,
                                  const char *msg, const char *param, const char *allow)
{
    char *body = st->api ? st->api->error(status, msg, param, NULL) : gw_error_json(status, msg, param);
    return send_body(g, conn, st, status, body, "application/json", 0, allow);
}

/* SSE bytes as the bridge makes them: suspend while there are none. */
static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    gw_call *c = cls;
    ssize_t n;
    pthread_mutex_lock(&c->g->lock);
    size_t avail = c->out.len - c->out_off;
    if (avail) {
        n = (ssize_t)(avail < max ? avail : max);
        memcpy(buf, c->out.data + c->out_off, (size_t)n);
        c->out_off += (size_t)n;
        if (c->out_off == c->out.len) {
            tp_buf_reset(&c->out);
            c->out_off = 0;
        }
    } else if (c->out_done) {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        c->suspended = true;
        MHD_suspend_connection(c->conn);
        n = 0;
    }
    pthread_mutex_unlock(&c->g->lock);
    return n;
}

static void sse_free(void *cls)
{
    gw_call *c = cls;
    gw *g = c->g;
    pthread_mutex_lock(&g->lock);
    gw_call_unref(c);
    pthread_mutex_unlock(&g->lock);
}

/* The bridge resumed the connection: answer with what it wrote. */
static enum MHD_Result answer_call(gw *g, struct MHD_Connection *conn, const conn_state *st, gw_call *c)
{
    pthread_mutex_lock(&g->lock);
    int status = c->status;
    char *body = c->body;
    c->body = NULL;
    const char *ctype = c->content_type;
    int retry = c->retry_after;
    bool stream = status == 200 && !body && c->oreq.stream;
    if (stream)
        c->refs++;   /* the response's reader holds one */
    pthread_mutex_unlock(&g->lock);
    if (!status) {   /* spurious resume: wait on */
        pthread_mutex_lock(&g->lock);
        c->suspended = true;
        MHD_suspend_connection(conn);
        pthread_mutex_unlock(&g->lock);
        return MHD_YES;
    }
    if (!stream)
        return send_body(g, conn, st, status, body, ctype, retry, NULL);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK, sse_reader, c, sse_free);
    if (!r) {
        sse_free(c);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");   /* nginx: pass events at once */
    enum MHD_Result ret = MHD_queue_response(conn, 200, r);
    MHD_destroy_response(r);
    count_status(g, st->ep, 200);
    return ret;
}

/* Authorization: Bearer KEY (OpenAI's clients) or x-api-key: KEY
 * (Anthropic's), on every endpoint. */
static bool authorized(gw *g, struct MHD_Connection *conn)
{
    if (!g->api_keys)
        return true;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (h && !strncasecmp(h, "Bearer ", 7)) {
        h += 7;
        while (*h == ' ')
            h++;
    } else {
        h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "x-api-key");
    }
    if (!h)
        return false;
    for (size_t i = 0; i < g->n_api_keys; i++) {
        /* compare every byte whatever the first difference: no timing hint */
        const char *k = g->api_keys[i];
        size_t kl = strlen(k), hl = strlen(h);
        unsigned diff = (unsigned)(kl != hl);
        for (size_t j = 0; j < kl; j++)
            diff |= (unsigned char)k[j] ^ (unsigned char)(j < hl ? h[j] : 0);
        if (!diff)
            return true;
    }
    return false;
}

static int64_t unix_now(void)
{
    return (int64_t)time(NULL);
}

static enum MHD_Result start_call(gw *g, struct MHD_Connection *conn, conn_state *st, gw_call_kind kind,
                                  oai_request *oreq)
{
    gw_call *c = calloc(1, sizeof *c);
    if (!c) {
        if (oreq)
            oai_request_free(oreq);
        return send_error(g, conn, st, 500, "gateway: out of memory", NULL, NULL);
    }
    c->g = g;
    c->kind = kind;
    c->api = st->api;
    if (oreq)
        c->oreq = *oreq;
    c->created = unix_now();
    c->conn = conn;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    c->client_fd = ci ? ci->connect_fd : -1;
    c->watch_fd = true;
    c->refs = 1;   /* this connection's */
    pthread_mutex_lock(&g->lock);
    c->no = ++g->next_call_no;
    pthread_mutex_unlock(&g->lock);
    snprintf(c->id, sizeof c->id, "%s%llx%06llx", c->api ? c->api->id_prefix : "",
             (unsigned long long)c->created, (unsigned long long)c->no);
    if (gw_submit_call(g, c)) {
        gw_call_unref(c);
        return send_error(g, conn, st, 503, "the gateway is shutting down", NULL, NULL);
    }
    st->call = c;
    pthread_mutex_lock(&g->lock);
    g->open_calls++;
    pthread_mutex_unlock(&g->lock);
    /* suspended before the bridge can resume it: it resumes only under
     * gw.lock with suspended set */
    pthread_mutex_lock(&g->lock);
    if (!c->status) {
        c->suspended = true;
        MHD_suspend_connection(conn);
        pthread_mutex_unlock(&g->lock);
        return MHD_YES;
    }
    pthread_mutex_unlock(&g->lock);
    return answer_call(g, conn, st, c);
}

/* A job-making endpoint: its API's decoder, then the bridge. */
static enum MHD_Result completions(gw *g, struct MHD_Connection *conn, conn_state *st)
{
    if (st->body.err) {
        char msg[96];
        snprintf(msg, sizeof msg, "the request body is larger than http.max_body_bytes (%d)",
                 g->cfg->http_max_body_bytes);
        return send_error(g, conn, st, 413, msg, NULL, NULL);
    }
    oai_request oreq;
    oai_error e;
    if (st->api->decode_in ? st->api->decode_in(g, tp_buf_str(&st->body), st->body.len, &oreq, &e)
                           : st->api->decode(tp_buf_str(&st->body), st->body.len, &oreq, &e))
        return send_error(g, conn, st, e.status, e.message, e.param, NULL);
    if (oreq.logprobs && !g->tok) {
        char msg[sizeof e.message];
        snprintf(msg, sizeof msg, "logprobs: the gateway cannot read the model's vocabulary for token texts (%s)",
                 g->tok_error ? g->tok_error : "none loaded");
        oai_request_free(&oreq);
        return send_error(g, conn, st, 501, msg, "logprobs", NULL);
    }
    return start_call(g, conn, st, GW_CALL_COMPLETION, &oreq);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)version;
    gw *g = cls;
    conn_state *st = *con_cls;
    if (!st) {
        st = calloc(1, sizeof *st);
        if (!st)
            return MHD_NO;
        tp_buf_init(&st->body, (size_t)g->cfg->http_max_body_bytes);
        *con_cls = st;
        return MHD_YES;
    }
    if (*upload_data_size) {
        tp_buf_add(&st->body, upload_data, *upload_data_size);   /* past the limit: err, answered 413 */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (st->call)
        return answer_call(g, conn, st, st->call);

    st->ep = GW_EP_OTHER;
    for (int ep = 0; ep < GW_EP_OTHER; ep++)
        if (!strcmp(url, gw_endpoint_name((gw_endpoint)ep)))
            st->ep = (gw_endpoint)ep;
    st->api = NULL;
    for (size_t i = 0; gw_apis[i]; i++)
        if (!strcmp(url, gw_apis[i]->path))
            st->api = gw_apis[i];
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    bool v1 = !strncmp(url, "/v1/", 4);
    if (v1 && !authorized(g, conn))
        return send_error(g, conn, st, 401,
                          "a valid API key is needed (Authorization: Bearer KEY, or x-api-key: KEY)", NULL, NULL);
    if (!strncmp(url, "/v1/responses/", 14) && url[14]) {   /* a stored response */
        st->ep = GW_EP_RESPONSES;
        st->api = &gw_api_responses;
        int status;
        char *body = gw_responses_stored(g, method, url + 14, &status);
        return send_body(g, conn, st, status, body, "application/json", 0,
                         status != 405 ? NULL : strchr(url + 14, '/') ? "GET" : "GET, DELETE");
    }
    if (st->api) {
        if (!post)
            return send_error(g, conn, st, 405, "use POST", NULL, "POST");
        return completions(g, conn, st);
    }
    if (st->ep == GW_EP_MODELS || st->ep == GW_EP_HEALTH || st->ep == GW_EP_METRICS) {
        if (!get && strcmp(method, "HEAD"))
            return send_error(g, conn, st, 405, "use GET", NULL, "GET, HEAD");
        if (st->ep == GW_EP_MODELS)
            return send_body(g, conn, st, 200, gw_models_json(g->model_name, g->started), "application/json", 0,
                             NULL);
        return start_call(g, conn, st, st->ep == GW_EP_HEALTH ? GW_CALL_HEALTH : GW_CALL_METRICS, NULL);
    }
    char msg[160];
    snprintf(msg, sizeof msg, "no such endpoint: %s %.100s", method, url);
    return send_error(g, conn, st, 404, msg, NULL, NULL);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)conn;
    (void)toe;
    gw *g = cls;
    conn_state *st = *con_cls;
    if (!st)
        return;
    if (st->call) {
        pthread_mutex_lock(&g->lock);
        st->call->http_done = true;
        st->call->suspended = false;
        g->open_calls--;
        gw_call_unref(st->call);
        pthread_mutex_unlock(&g->lock);
        uint64_t one = 1;   /* the bridge cancels what still runs */
        ssize_t r = write(g->wake_fd, &one, sizeof one);
        (void)r;
    }
    tp_buf_free(&st->body);
    free(st);
    *con_cls = NULL;
}

int gw_server_start(gw *g, tp_err *err)
{
    g->started = unix_now();
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g->cfg->http_port)};
    if (inet_pton(AF_INET, g->cfg->http_listen, &a.sin_addr) != 1)
        return tp_err_set(err, TP_EINVAL, "http.listen: '%s' is not an IPv4 address", g->cfg->http_listen);
    g->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                                  MHD_USE_ERROR_LOG,
                              0, NULL, NULL, on_request, g, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&a,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)g->cfg->http_max_connections,
                              MHD_OPTION_CONNECTION_TIMEOUT, 300u, MHD_OPTION_NOTIFY_COMPLETED, on_completed, g,
                              MHD_OPTION_END);
    if (!g->mhd)
        return tp_err_set(err, TP_EIO, "cannot listen on %s:%d (in use, or not an address of this host)",
                          g->cfg->http_listen, g->cfg->http_port);
    return 0;
}

void gw_server_stop(gw *g)
{
    if (g->mhd)
        MHD_stop_daemon(g->mhd);
    g->mhd = NULL;
}
