/* tokpipe watch: print the events tokpiped publishes, for every job or one. */
#include "tools.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "evfmt.h"

const char cmd_watch_summary[] = "print TOKEN/FINISH events of all jobs, or of one job";

static const char usage_text[] =
    "usage: tokpipe watch [JOB] [--prefix] [--json] [--count N] [--idle MS] [connection options]\n"
    "\n"
    "Subscribes to the daemon's events and prints one line per event:\n"
    "  JOB #SEQ token [ids] \"text\"\n"
    "  JOB #SEQ finish REASON matched=M prompt=N completion=N text_len=N queue_us ttft_us total_us\n"
    "With JOB, only that job's events are shown and watch exits after its FINISH\n"
    "(with --prefix: every job whose id starts with JOB, until interrupted).\n"
    "  --json      one JSON object per event instead\n"
    "  --count N   exit after N events\n"
    "  --idle MS   exit (status 0) after MS without any event\n"
    "exit status: 0 ok, 1 the daemon is unreachable, 2 bad usage.\n\n" TP_CLIENT_ARGS_HELP;

typedef struct wopts {
    tp_client_args a;
    const char *job;
    bool prefix, json;
    long count, idle_ms;
} wopts;

static int parse_long(const char *flag, const char *v, long *out, tp_err *err)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < 1)
        return tp_err_set(err, TP_EINVAL, "%s: '%s' is not a positive integer", flag, v);
    *out = x;
    return 0;
}

static int parse(wopts *o, int argc, char **argv, tp_err *err)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int rc = tp_client_parse_arg(&o->a, argc, argv, &i, err);
        if (rc < 0)
            return rc;
        if (rc)
            continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            return 1;
        if (!strcmp(a, "--prefix"))
            o->prefix = true;
        else if (!strcmp(a, "--json"))
            o->json = true;
        else if (!strcmp(a, "--count") || !strcmp(a, "--idle")) {
            if (i + 1 >= argc)
                return tp_err_set(err, TP_EINVAL, "%s needs a value", a);
            if ((rc = parse_long(a, argv[++i], !strcmp(a, "--count") ? &o->count : &o->idle_ms, err)))
                return rc;
        } else if (a[0] != '-' && !o->job) {
            if (!tp_job_id_valid(a, strlen(a)) && !(o->prefix && !*a))
                return tp_err_set(err, TP_EINVAL, "'%s' is not a job id", a);
            o->job = a;
        } else
            return tp_err_set(err, TP_EINVAL, "unknown argument '%s'", a);
    }
    return 0;
}

static void print_text(const tp_msg *m)
{
    cJSON *e = evfmt_event(m);
    char *text = cJSON_PrintUnformatted(cJSON_GetObjectItem(e, "text"));
    if (m->cmd == TP_CMD_TOKEN) {
        char *ids = cJSON_PrintUnformatted(cJSON_GetObjectItem(e, "ids"));
        printf("%.*s #%u token %s %s\n", (int)m->token.job_id.len, m->token.job_id.ptr, m->token.seq,
               ids ? ids : "", text ? text : "");
        free(ids);
    } else {
        const tp_m_finish *f = &m->finish;
        char *matched = cJSON_PrintUnformatted(cJSON_GetObjectItem(e, "matched"));
        printf("%.*s #%u finish %s matched=%s text=%s prompt=%u completion=%u text_len=%llu queue_us=%llu "
               "ttft_us=%llu total_us=%llu%s%.*s\n",
               (int)f->job_id.len, f->job_id.ptr, f->seq, tp_reason_name(f->reason), matched ? matched : "",
               text ? text : "", f->prompt_tokens, f->completion_tokens, (unsigned long long)f->text_len,
               (unsigned long long)f->timings.queue_us, (unsigned long long)f->timings.ttft_us,
               (unsigned long long)f->timings.total_us, f->job_error.ptr ? " error=" : "",
               (int)f->job_error.len, f->job_error.ptr ? f->job_error.ptr : "");
        free(matched);
    }
    free(text);
    cJSON_Delete(e);
    fflush(stdout);
}

static bool is_watched_job(const wopts *o, const tp_msg *m)
{
    if (!o->job || o->prefix)
        return true;
    return m->topic.len == strlen(o->job) && !memcmp(m->topic.ptr, o->job, m->topic.len);
}

static uint32_t event_seq(const tp_msg *m)
{
    return m->cmd == TP_CMD_TOKEN ? m->token.seq : m->finish.seq;
}

static int watch(const wopts *o, tp_client *c, tp_err *err)
{
    long seen = 0;
    uint32_t next_seq = 0;   /* one exact job: seq expected next, to report lost events */
    for (;;) {
        tp_recv ev;
        int rc = tp_client_next_event(c, o->idle_ms ? (int)o->idle_ms : -1, &ev, err);
        if (rc)
            return rc < 0 ? rc : 0;
        bool last = false;
        if (is_watched_job(o, &ev.m)) {
            if (o->job && !o->prefix && event_seq(&ev.m) != next_seq)
                fprintf(stderr, "tokpipe watch: %s: events lost (got seq %u, expected %u); "
                        "`tokpipe status %s` has the whole result\n", o->job, event_seq(&ev.m), next_seq, o->job);
            next_seq = event_seq(&ev.m) + 1;
            if (o->json)
                evfmt_print_line(stdout, evfmt_event(&ev.m)), fflush(stdout);
            else
                print_text(&ev.m);
            last = (o->job && !o->prefix && ev.m.cmd == TP_CMD_FINISH) || (o->count && ++seen >= o->count);
        }
        tp_recv_free(&ev);
        if (last)
            return 0;
    }
}

int cmd_watch(int argc, char **argv)
{
    wopts o;
    tp_err err = {0};
    memset(&o, 0, sizeof o);
    int rc = parse(&o, argc, argv, &err);
    if (rc == 1)
        return fputs(usage_text, stdout), 0;
    if (rc < 0) {
        fprintf(stderr, "tokpipe watch: %s\n%s", err.msg, usage_text);
        return 2;
    }
    tp_client *c = NULL;
    rc = tp_client_open(&o.a, false, true, &c, &err);
    if (!rc)
        rc = tp_client_subscribe(c, o.job ? o.job : "", &err);
    if (!rc)
        rc = tp_client_wait_events_ready(c, &err);
    if (!rc)
        rc = watch(&o, c, &err);
    if (rc)
        fprintf(stderr, "tokpipe watch: %s\n", err.msg);
    tp_client_free(c);
    return rc ? 1 : 0;
}
