/* tokpipe watch: print the events tokpiped publishes, for every job or one. */
#include "tools.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "evfmt.h"
#include "tokpipe/zwire.h"

const char cmd_watch_summary[] = "print TOKEN/FINISH events of all jobs, or of one job";

static const char usage_text[] =
    "usage: tokpipe watch [JOB] [--prefix] [--json] [--count N] [--idle MS] [connection options]\n"
    "\n"
    "Subscribes to the daemon's events and prints one line per event:\n"
    "  JOB #SEQ token [ids] \"text\"\n"
    "  JOB #SEQ finish REASON matched=M prompt=N completion=N text_len=N queue_us ttft_us total_us\n"
    "With JOB, only that job's events are shown and watch exits after its FINISH,\n"
    "at once if the job already finished, or with status 1 if tokpiped restarted\n"
    "and lost it (with --prefix: every job whose id starts with JOB, until\n"
    "interrupted). The broker's heartbeats are followed: a silent (dead, hung) or\n"
    "restarted tokpiped is reported on stderr.\n"
    "  --json      one JSON object per event instead\n"
    "  --count N   exit after N events\n"
    "  --idle MS   exit (status 0) after MS without any event\n"
    "exit status: 0 ok, 1 the daemon is unreachable or lost the job, 2 bad usage.\n\n" TP_CLIENT_ARGS_HELP;

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

static bool one_job(const wopts *o)
{
    return o->job && !o->prefix;
}

/* STATUS of the watched job: its state (TP_STATE_UNKNOWN for 404) and
 * last_seq; a negative error when the broker does not answer. */
static int job_state(tp_client *c, const char *job, int64_t *last_seq, tp_err *err)
{
    tp_msg m;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_STATUS);
    m.jobref.job_id = tp_str_of(job);
    tp_recv r;
    int rc = tp_client_call(c, &m, &r, err);
    if (rc)
        return rc;
    int state = r.m.cmd == TP_CMD_STATUS_REPLY && r.m.status == TP_ST_OK ? r.m.status_reply.state : TP_STATE_UNKNOWN;
    *last_seq = state == TP_STATE_UNKNOWN ? -1 : r.m.status_reply.last_seq;
    tp_recv_free(&r);
    return state;
}

/* Before the first event of one job: a finished job has no events left
 * (exit at once), a running one continues after last_seq. */
static int look_first(const wopts *o, tp_client *c, uint32_t *next_seq, bool *done, tp_err *err)
{
    int64_t last = -1;
    int st = job_state(c, o->job, &last, err);
    if (st < 0)
        return st;
    if (st == TP_STATE_FINISHED) {
        fprintf(stderr, "tokpipe watch: %s already finished; `tokpipe status %s` has its result\n", o->job, o->job);
        *done = true;
    } else if (st == TP_STATE_RUNNING && last >= 0) {
        fprintf(stderr, "tokpipe watch: %s is running: its events from seq %lld on (`tokpipe status %s` has the text "
                "so far)\n", o->job, (long long)last + 1, o->job);
        *next_seq = (uint32_t)(last + 1);
    } else if (st == TP_STATE_UNKNOWN) {
        fprintf(stderr, "tokpipe watch: %s is not known to tokpiped (yet): waiting for its events\n", o->job);
    }
    return 0;
}

/* Heartbeat news: said on stderr; a watched job a restarted broker does
 * not know is over (an error). */
static int on_news(const wopts *o, tp_client *c, int news, tp_err *err)
{
    const tp_client_live *l = tp_client_liveness(c);
    if (news == TP_NEXT_SILENT)
        fprintf(stderr, "tokpipe watch: no heartbeat from tokpiped on %s for %lld ms (one is due every %u ms): "
                "it may be down or hung; still listening\n", tp_client_events(c), (long long)l->silent_ms,
                l->interval_ms);
    else if (news == TP_NEXT_ALIVE)
        fprintf(stderr, "tokpipe watch: tokpiped heartbeats again (none for %lld ms)\n", (long long)l->silent_ms);
    if (news != TP_NEXT_RESTARTED)
        return 0;
    fprintf(stderr, "tokpipe watch: tokpiped restarted (incarnation %016llx, was %016llx): the old broker's jobs are "
            "gone\n", (unsigned long long)l->incarnation, (unsigned long long)l->prev_incarnation);
    if (!one_job(o))
        return 0;
    int64_t last;
    int st = job_state(c, o->job, &last, err);
    if (st == TP_STATE_UNKNOWN)
        return tp_err_set(err, TP_ENOTFOUND, "%s was lost: the restarted tokpiped does not know it", o->job);
    return st < 0 ? st : 0;
}

static int show(const wopts *o, const tp_msg *m, uint32_t *next_seq)
{
    uint32_t seq = event_seq(m);
    if (one_job(o) && seq > *next_seq)
        fprintf(stderr, "tokpipe watch: %s: events lost (got seq %u, expected %u); "
                "`tokpipe status %s` has the whole result\n", o->job, seq, *next_seq, o->job);
    *next_seq = seq + 1;
    if (o->json)
        evfmt_print_line(stdout, evfmt_event(m)), fflush(stdout);
    else
        print_text(m);
    return 0;
}

static int watch(const wopts *o, tp_client *c, tp_err *err)
{
    long seen = 0;
    uint32_t next_seq = 0;   /* one exact job: seq expected next, to report lost events */
    bool done = false;
    int rc = one_job(o) ? look_first(o, c, &next_seq, &done, err) : 0;
    int64_t idle_end = o->idle_ms ? tp_now_ms() + o->idle_ms : -1;
    while (!rc && !done) {
        int left = idle_end < 0 ? -1 : idle_end > tp_now_ms() ? (int)(idle_end - tp_now_ms()) : 0;
        tp_recv ev;
        rc = tp_client_next_event(c, left, &ev, err);
        if (rc == TP_NEXT_TIMEOUT)
            return 0;   /* --idle */
        if (rc > 0) {
            rc = on_news(o, c, rc, err);
            continue;
        }
        if (rc < 0)
            return rc;
        if (is_watched_job(o, &ev.m)) {
            show(o, &ev.m, &next_seq);
            done = (one_job(o) && ev.m.cmd == TP_CMD_FINISH) || (o->count && ++seen >= o->count);
            idle_end = o->idle_ms ? tp_now_ms() + o->idle_ms : -1;
        }
        tp_recv_free(&ev);
    }
    return rc;
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
    rc = tp_client_open(&o.a, one_job(&o), true, &c, &err);
    if (!rc)
        rc = tp_client_subscribe(c, o.job ? o.job : "", &err);
    if (!rc)   /* last: its first heartbeat shows the job subscription is in force */
        rc = tp_client_subscribe_heartbeat(c, &err);
    if (!rc)
        rc = tp_client_wait_events_ready(c, &err);
    if (!rc)
        rc = watch(&o, c, &err);
    if (rc)
        fprintf(stderr, "tokpipe watch: %s\n", err.msg);
    tp_client_free(c);
    return rc ? 1 : 0;
}
