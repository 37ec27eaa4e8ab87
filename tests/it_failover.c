/* Process story: a dead worker costs no job. 32 concurrent jobs (greedy and
 * seeded, with stop strings and max_tokens) run while workers of every
 * stage are killed (SIGKILL) at random moments, the daemon respawning
 * them; each stage's only worker is killed once (the respawn path) and
 * one worker is stopped (SIGSTOP) past the heartbeat timeout, then resumed.
 * Every round's stream, seen by a subscriber, must equal the undisturbed
 * round's: no error, no TOKEN missing or repeated, seq contiguous, the same
 * ids, text, finish reason and counts, completion_tokens equal to the ids
 * the TOKEN events carried. The kill schedule comes from a printed seed
 * (TP_FAILOVER_SEED replays one). Recovery latency (loss -> the job's next
 * event, from the broker's log) is printed as p50 / p99.
 * A signal only counts when it hits a worker the broker had registered (a
 * respawned process may not have sent READY yet, and killing it costs the
 * broker no registration): an action waits for such a victim, and a hung
 * worker is resumed only once the broker has declared it lost, so that
 * STATS workers_lost is at least the number of signals sent, on any
 * machine speed. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "support/daemon_harness.h"
#include "tokpipe/config.h"

#define N_JOBS 32
#define MAX_IDS 512
#define MAX_TEXT 8192
/* hang detectors, not speed limits: an ASan build on a loaded 2-CPU
 * machine is many times slower than a quiet -O2 one */
#define ROUND_TIMEOUT_MS 180000
#define LOST_TIMEOUT_MS 30000
#define BACK_TIMEOUT_MS 60000

static const char *const prompts[] = {"Once upon a time", "The cat sat", "Lily and Ben", "One day, a little bird",
                                      "Tom had a red ball", "The sun was", "Mom said", "A big dog"};

typedef struct jres {
    int32_t ids[MAX_IDS];
    uint32_t n_ids;
    char text[MAX_TEXT];
    size_t text_len;
    int64_t next_seq;
    int64_t t_ev[MAX_IDS + 2];   /* when each event arrived (ms, test clock) */
    int reason;
    uint32_t completion, prompt_tokens;
    uint64_t text_total;
    char matched[64];
    char error[256];
    bool done;
} jres;

/* Job i's request: even greedy, odd seeded; stop strings and max_tokens vary. */
static void submit_job(harness *h, const char *id, int i)
{
    static const char *const stops[4][2] = {{" dog", NULL}, {"!", " sad"}, {"Tom said", NULL}, {NULL, NULL}};
    tp_str st[2];
    size_t ns = 0;
    for (int k = 0; k < 2; k++)
        if (stops[i % 4][k])
            st[ns++] = tp_str_of(stops[i % 4][k]);
    tp_msg m, r;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_SUBMIT);
    m.submit.job_id = tp_str_of(id);
    m.submit.prompt = tp_str_of(prompts[i % 8]);
    tp_params *p = &m.submit.params;
    p->set = TP_P_MAX_TOKENS | TP_P_TEMPERATURE | (ns ? TP_P_STOP : 0);
    p->max_tokens = 120 + (i * 37) % 200;
    p->temperature = i % 2 ? 0.9 : 0;
    if (i % 2) {
        p->set |= TP_P_SEED;
        p->seed = 1000 + (uint64_t)i;
    }
    p->stop = st;
    p->n_stop = ns;
    tp_zmsg z;
    if (harness_call(h, &m, &z, &r))
        fail_msg("SUBMIT %s: no reply", id);
    if (r.status != TP_ST_OK)
        fail_msg("SUBMIT %s: status %u %.*s", id, r.status, (int)r.error.len, r.error.ptr);
    tp_msg_clear(&r);
    tp_zmsg_close(&z);
}

/* One event of job res: checks the stream's shape as it goes. */
static void take_event(const char *jid, jres *res, const tp_msg *ev)
{
    if (res->done)
        fail_msg("job %s: an event after its FINISH", jid);
    uint32_t seq = ev->cmd == TP_CMD_TOKEN ? ev->token.seq : ev->finish.seq;
    if ((int64_t)seq != res->next_seq)
        fail_msg("job %s: event seq %u, want %lld (%s)", jid, seq, (long long)res->next_seq,
                 (int64_t)seq < res->next_seq ? "repeated" : "missing");
    if (res->next_seq < MAX_IDS + 2)
        res->t_ev[res->next_seq] = tp_now_ms();
    res->next_seq++;
    const tp_str *t = ev->cmd == TP_CMD_TOKEN ? &ev->token.text : &ev->finish.text;
    if (res->text_len + t->len < MAX_TEXT) {
        memcpy(res->text + res->text_len, t->ptr, t->len);
        res->text_len += t->len;
    }
    if (ev->cmd == TP_CMD_TOKEN) {
        if (ev->token.index != res->n_ids)
            fail_msg("job %s: TOKEN index %u after %u ids", jid, ev->token.index, res->n_ids);
        for (size_t k = 0; k < ev->token.ids.n && res->n_ids < MAX_IDS; k++)
            res->ids[res->n_ids++] = tp_raw_i32(ev->token.ids, k);
        return;
    }
    const tp_m_finish *f = &ev->finish;
    res->done = true;
    res->reason = f->reason;
    res->completion = f->completion_tokens;
    res->prompt_tokens = f->prompt_tokens;
    res->text_total = f->text_len;
    snprintf(res->error, sizeof res->error, "%.*s", (int)f->job_error.len, f->job_error.ptr ? f->job_error.ptr : "");
    if (f->matched.kind == TP_MATCHED_STR)
        snprintf(res->matched, sizeof res->matched, "s:%.*s", (int)f->matched.str.len, f->matched.str.ptr);
    else if (f->matched.kind == TP_MATCHED_ID)
        snprintf(res->matched, sizeof res->matched, "i:%d", f->matched.id);
    if (res->completion != res->n_ids)
        fail_msg("job %s: FINISH completion_tokens %u, the TOKEN events carried %u ids", jid, res->completion,
                 res->n_ids);
    if (res->text_total != res->text_len)
        fail_msg("job %s: FINISH text_len %llu, the events carried %zu bytes", jid,
                 (unsigned long long)res->text_total, res->text_len);
}

/* What the broker's log says of worker process pid: 1 registered (its
 * last registration is live), 0 not (not yet, or lost since), -1 the log
 * does not name it. *n_lost (may be NULL) = the losses logged since it
 * started. The daemon names a spawned worker "STAGES.N" and logs "started
 * worker NAME (pid P)", then "worker NAME registered" / "worker NAME lost";
 * a respawn reuses the name, so only lines after pid's start count. */
static int reg_state(const harness *h, pid_t pid, int *n_lost)
{
    char path[256], line[1024], started[48], name[96] = "", who[112];
    snprintf(path, sizeof path, "%s/tokpiped.log", h->dir);
    snprintf(started, sizeof started, " (pid %d)", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int state = -1, lost = 0;
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "started worker ");
        const char *q = p ? strstr(p, started) : NULL;
        if (q && q[strlen(started)] == '\n') {
            int len = (int)(q - (p + 15));
            snprintf(name, sizeof name, "%.*s", len < 95 ? len : 95, p + 15);
            snprintf(who, sizeof who, "worker %s ", name);
            state = 0;
            lost = 0;
            continue;
        }
        if (!name[0] || !(p = strstr(line, who)) || (p > line && p[-1] != ' '))
            continue;
        p += strlen(who);
        if (!strncmp(p, "registered", 10))
            state = 1;
        else if (!strncmp(p, "lost", 4)) {
            state = 0;
            lost++;
        }
    }
    fclose(f);
    if (n_lost)
        *n_lost = lost;
    return state;
}

typedef struct action {
    int at_ms;          /* after the round's last SUBMIT */
    int sig;            /* SIGKILL or SIGSTOP (SIGCONT follows after hold_ms) */
    const char *stage;
    int hold_ms;
} action;

/* Kill -> next event of the jobs the broker moved (client side), over the
 * whole test. */
static long long lat[4096];
static int n_lat;

/* For each job the broker's log says it moved in round tag: the time from
 * the kill that interrupted its stream to its next event (the kill inside
 * its longest wait). */
static void collect_latency(const harness *h, const char *tag, const jres *res, const int64_t *kills, int n_kills)
{
    char path[256], line[1024], want[48];
    snprintf(path, sizeof path, "%s/tokpiped.log", h->dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    bool moved[N_JOBS] = {false};
    snprintf(want, sizeof want, "job %s-", tag);
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, want);
        if (p && strstr(line, "continues on")) {
            int i = atoi(p + strlen(want));
            if (i >= 0 && i < N_JOBS)
                moved[i] = true;
        }
    }
    fclose(f);
    for (int i = 0; i < N_JOBS && n_lat < 4096; i++) {
        long long best = -1;
        for (int k = 0; moved[i] && k < n_kills; k++)
            for (int64_t e = 1; e < res[i].next_seq && e < MAX_IDS + 2; e++)
                if (res[i].t_ev[e - 1] < kills[k] && res[i].t_ev[e] >= kills[k] && res[i].t_ev[e] - kills[k] > best)
                    best = res[i].t_ev[e] - kills[k];
        if (best >= 0)
            lat[n_lat++] = best;
    }
}

/* Run one round of N_JOBS jobs (ids "<tag>-<i>"), doing acts meanwhile;
 * fills res[]. Every act is done, each on a worker the broker had
 * registered (it waits for one, the stream drained meanwhile), a stopped
 * one resumed only after the broker logged it lost: returns how many
 * registrations the acts cost the broker (one each). */
static int run_round(harness *h, const char *tag, jres *res, const action *acts, int n_acts, unsigned *rng)
{
    char prefix[32];
    snprintf(prefix, sizeof prefix, "%s-", tag);
    void *sub = harness_subscribe(h, prefix);
    memset(res, 0, N_JOBS * sizeof *res);
    for (int i = 0; i < N_JOBS; i++) {
        char id[48];
        snprintf(id, sizeof id, "%s-%d", tag, i);
        submit_job(h, id, i);
    }
    int64_t t0 = tp_now_ms();
    int next_act = 0, done = 0, n_kills = 0, n_lost_before = 0;
    int64_t kills[8], last_look = -1000;
    bool said_wait = false;
    pid_t stopped = 0;
    int64_t cont_at = 0;
    while (done < N_JOBS || stopped) {
        int64_t t = tp_now_ms() - t0;
        if (t > ROUND_TIMEOUT_MS)
            fail_msg("round %s: %d of %d jobs finished within %d ms (log in %s)", tag, done, N_JOBS,
                     ROUND_TIMEOUT_MS, h->dir);
        /* the log is read at most every 20 ms while an act waits */
        if (next_act < n_acts && t >= acts[next_act].at_ms && !stopped && t - last_look >= 20) {
            const action *a = &acts[next_act];
            pid_t pids[8], reg[8];
            int n = harness_children_serving(h, a->stage, pids, 8), nr = 0;
            for (int k = 0; k < n; k++)
                if (reg_state(h, pids[k], NULL) == 1)
                    reg[nr++] = pids[k];
            last_look = t;
            if (nr > 0) {
                pid_t victim = reg[rand_r(rng) % (unsigned)nr];
                printf("# round %s: %s to a registered %s worker (pid %d, one of %d) at %d ms\n", tag,
                       a->sig == SIGKILL ? "SIGKILL" : "SIGSTOP", a->stage, (int)victim, nr, (int)t);
                if (a->sig == SIGSTOP)
                    reg_state(h, victim, &n_lost_before);
                kill(victim, a->sig);
                next_act++;
                said_wait = false;
                if (n_kills < 8)
                    kills[n_kills++] = tp_now_ms();
                if (a->sig == SIGSTOP) {
                    stopped = victim;
                    cont_at = tp_now_ms() + a->hold_ms;
                }
            } else if (!said_wait) {
                printf("# round %s: no registered %s worker at %d ms (respawning); waiting for one\n", tag,
                       a->stage, (int)t);
                said_wait = true;
            }
        }
        if (stopped && tp_now_ms() >= cont_at) {
            /* resumed before the broker gave up on it, it would just go on:
             * the story is a worker the broker declared lost coming back */
            int n_lost = 0;
            reg_state(h, stopped, &n_lost);
            if (n_lost > n_lost_before) {
                kill(stopped, SIGCONT);
                printf("# round %s: SIGCONT to pid %d (the broker declared it lost)\n", tag, (int)stopped);
                stopped = 0;
            } else if (tp_now_ms() - cont_at > LOST_TIMEOUT_MS) {
                kill(stopped, SIGCONT);
                fail_msg("round %s: pid %d stopped %d ms, the broker did not declare it lost (log in %s)", tag,
                         (int)stopped, (int)(tp_now_ms() - cont_at), h->dir);
            } else {
                cont_at = tp_now_ms() + 20;
            }
        }
        zmq_pollitem_t it = {sub, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 5) <= 0)
            continue;
        tp_zmsg z;
        while (tp_zmsg_recv(sub, &z, ZMQ_DONTWAIT) >= 0) {
            tp_msg ev;
            tp_err e;
            if (tp_proto_decode(TP_FAM_EVT, z.f, z.n, &ev, &e))
                fail_msg("round %s: undecodable event: %s", tag, e.msg);
            if (ev.cmd == TP_CMD_TOKEN || ev.cmd == TP_CMD_FINISH) {
                const tp_str *jid = ev.cmd == TP_CMD_TOKEN ? &ev.token.job_id : &ev.finish.job_id;
                char id[64];
                snprintf(id, sizeof id, "%.*s", (int)jid->len, jid->ptr);
                int i = atoi(id + strlen(prefix));
                if (i < 0 || i >= N_JOBS)
                    fail_msg("round %s: event of an unknown job %s", tag, id);
                take_event(id, &res[i], &ev);
                done += ev.cmd == TP_CMD_FINISH;
            }
            tp_msg_clear(&ev);
            tp_zmsg_close(&z);
        }
    }
    if (next_act < n_acts)
        fail_msg("round %s: its jobs finished before act %d of %d (a %s signal) found a registered worker (log in "
                 "%s)", tag, next_act + 1, n_acts, acts[next_act].stage, h->dir);
    zmq_close(sub);
    collect_latency(h, tag, res, kills, n_kills);
    /* a late event (a repeated TOKEN or FINISH) would show in the next
     * round's prefix only if ids collided: they do not, so check here */
    for (int i = 0; i < N_JOBS; i++)
        if (res[i].reason == TP_REASON_ERROR)
            fail_msg("round %s: job %d ended in error: %s", tag, i, res[i].error);
    return n_kills;
}

static void expect_same(const char *tag, const jres *want, const jres *got)
{
    for (int i = 0; i < N_JOBS; i++) {
        const jres *a = &want[i], *b = &got[i];
        if (a->n_ids != b->n_ids || memcmp(a->ids, b->ids, a->n_ids * sizeof *a->ids))
            fail_msg("round %s, job %d: %u ids, the undisturbed run %u (or they differ)", tag, i, b->n_ids, a->n_ids);
        if (a->text_len != b->text_len || memcmp(a->text, b->text, a->text_len))
            fail_msg("round %s, job %d: text '%.*s', undisturbed '%.*s'", tag, i, (int)b->text_len, b->text,
                     (int)a->text_len, a->text);
        if (a->reason != b->reason || a->completion != b->completion || a->prompt_tokens != b->prompt_tokens ||
            strcmp(a->matched, b->matched) || a->next_seq != b->next_seq)
            fail_msg("round %s, job %d: finish %d/%u/%s/%lld events, undisturbed %d/%u/%s/%lld", tag, i, b->reason,
                     b->completion, b->matched, (long long)b->next_seq, a->reason, a->completion, a->matched,
                     (long long)a->next_seq);
    }
}

static int cmp_ll(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

/* p50 / p99 of the broker's "stream resumed N ms after" log lines. */
static void report_latency(const harness *h)
{
    if (n_lat) {
        qsort(lat, (size_t)n_lat, sizeof *lat, cmp_ll);
        printf("# kill -> the moved jobs' next event (client side), %d jobs: p50 %lld ms, p99 %lld ms, max %lld ms\n",
               n_lat, lat[n_lat / 2], lat[(n_lat * 99) / 100 < n_lat ? (n_lat * 99) / 100 : n_lat - 1],
               lat[n_lat - 1]);
        n_lat = 0;
    }
    char path[256], line[1024];
    snprintf(path, sizeof path, "%s/tokpiped.log", h->dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    long long v[4096];
    int n = 0;
    while (n < 4096 && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "stream resumed ");
        long long ms;
        if (p && sscanf(p, "stream resumed %lld ms", &ms) == 1)
            v[n++] = ms;
    }
    fclose(f);
    if (!n)
        return;
    qsort(v, (size_t)n, sizeof *v, cmp_ll);
    printf("# recovery latency (loss -> the job's next event), %d recovered jobs: p50 %lld ms, p99 %lld ms, "
           "max %lld ms\n",
           n, v[n / 2], v[(n * 99) / 100 < n ? (n * 99) / 100 : n - 1], v[n - 1]);
}

/* STATS once the broker counts at least want workers lost: a killed
 * worker is lost when the broker notices (its connection closing, or its
 * heartbeats stopping), which on a loaded machine may come after its
 * respawn registered. The last STATS read if it never does; 0 or -1. */
static int stats_after_losses(harness *h, int want, tp_m_stats_reply *s)
{
    int64_t end = tp_now_ms() + LOST_TIMEOUT_MS;
    for (;;) {
        if (harness_stats(h, s))
            return -1;
        if (s->workers_lost >= (uint64_t)want || tp_now_ms() > end)
            return 0;
        struct timespec ts = {0, 20 * 1000000};
        nanosleep(&ts, NULL);
    }
}

static unsigned seed_from_env(void)
{
    const char *s = getenv("TP_FAILOVER_SEED");
    unsigned seed = s && *s ? (unsigned)strtoul(s, NULL, 10) : (unsigned)time(NULL) ^ (unsigned)getpid();
    printf("# kill schedule seed %u (TP_FAILOVER_SEED=%u replays it)\n", seed, seed);
    return seed;
}

#define HB "heartbeat:\n  interval_ms: 100\n  liveness: 5\n"

static void jobs_stream_on_unchanged_while_workers_of_every_stage_die(void **state)
{
    (void)state;
    unsigned rng = seed_from_env();
    harness h;
    if (harness_start(&h, false,
                      "  tokenize: 2\n  forward: 2\n  sample: 2\n  stop: 2\n  respawn_init_ms: 100\n" HB
                      "recovery:\n  deadline_ms: 30000\n"))
        fail_msg("daemon did not start");
    static jres ref[N_JOBS], got[N_JOBS];
    run_round(&h, "ref", ref, NULL, 0, &rng);
    int hit = 0;   /* registrations the signals cost the broker */
    const char *stages[] = {"forward", "sample", "stop", "tokenize"};
    for (int round = 0; round < 3; round++) {
        action acts[3];
        int prev = 0;
        for (int k = 0; k < 3; k++) {
            prev += 20 + (int)(rand_r(&rng) % 120);
            /* each round kills forward, sample and stop once, in a random order */
            acts[k] = (action){prev, SIGKILL, stages[(round + k) % 3], 0};
        }
        if (round == 2)   /* and a tokenize worker while prompts arrive */
            acts[0] = (action){(int)(rand_r(&rng) % 5), SIGKILL, "tokenize", 0};
        char tag[16];
        snprintf(tag, sizeof tag, "k%d", round);
        hit += run_round(&h, tag, got, acts, 3, &rng);
        expect_same(tag, ref, got);
        /* the killed workers are back before the next round */
        for (int si = 0; si < TP_SI_DRAFT; si++) /* no draft model here: no draft workers */
            if (harness_wait_stage(&h, si, 2, BACK_TIMEOUT_MS))
                fail_msg("stage %d did not get its workers back (log in %s)", si, h.dir);
    }
    tp_m_stats_reply s;
    assert_int_equal(stats_after_losses(&h, hit, &s), 0);
    printf("# workers lost %llu; jobs recovered: forward %llu, sample %llu, stop %llu, tokenize %llu; mean %.1f ms, "
           "max %llu ms\n",
           (unsigned long long)s.workers_lost, (unsigned long long)s.recovered[TP_SI_FORWARD],
           (unsigned long long)s.recovered[TP_SI_SAMPLE], (unsigned long long)s.recovered[TP_SI_STOP],
           (unsigned long long)s.recovered[TP_SI_TOKENIZE],
           s.recovery_count ? (double)s.recovery_ms_total / (double)s.recovery_count : 0.0,
           (unsigned long long)s.recovery_ms_max);
    if (hit != 9 || s.workers_lost < (uint64_t)hit)
        fail_msg("%d signals hit registered workers (want 9), STATS counts %llu workers lost", hit,
                 (unsigned long long)s.workers_lost);
    assert_int_equal(s.finish[TP_REASON_ERROR], 0);
    report_latency(&h);
    assert_int_equal(harness_stop(&h), 0);
}

static void jobs_ride_out_the_respawn_of_each_stages_only_worker_and_a_hung_one(void **state)
{
    (void)state;
    unsigned rng = seed_from_env();
    harness h;
    if (harness_start(&h, false, "  respawn_init_ms: 100\n" HB "recovery:\n  deadline_ms: 30000\n"))
        fail_msg("daemon did not start");
    static jres ref[N_JOBS], got[N_JOBS];
    run_round(&h, "ref", ref, NULL, 0, &rng);
    int hit = 0;   /* registrations the signals cost the broker */
    const char *stages[] = {"forward", "sample", "stop"};
    for (int k = 0; k < 3; k++) {
        action a = {30 + (int)(rand_r(&rng) % 150), SIGKILL, stages[k], 0};
        char tag[16];
        snprintf(tag, sizeof tag, "o%d", k);
        hit += run_round(&h, tag, got, &a, 1, &rng);
        expect_same(tag, ref, got);
        for (int si = 0; si < TP_SI_DRAFT; si++) /* no draft model here: no draft workers */
            if (harness_wait_stage(&h, si, 1, BACK_TIMEOUT_MS))
                fail_msg("stage %d did not get its worker back (log in %s)", si, h.dir);
    }
    /* hung workers: lost after 500 ms of silence, resumed after 900 ms, when
     * they answer what they held (a stop worker publishes its events) on a
     * registration the broker dropped, then drop their state and register
     * again: the stop stage, and another one at random */
    const char *hung[] = {"stop", stages[rand_r(&rng) % 2]};
    for (int k = 0; k < 2; k++) {
        action a = {30 + (int)(rand_r(&rng) % 100), SIGSTOP, hung[k], 900};
        char tag[16];
        snprintf(tag, sizeof tag, "hung%d", k);
        hit += run_round(&h, tag, got, &a, 1, &rng);
        expect_same(tag, ref, got);
        for (int si = 0; si < TP_SI_DRAFT; si++) /* no draft model here: no draft workers */
            if (harness_wait_stage(&h, si, 1, BACK_TIMEOUT_MS))
                fail_msg("stage %d did not get its worker back (log in %s)", si, h.dir);
    }
    tp_m_stats_reply s;
    assert_int_equal(stats_after_losses(&h, hit, &s), 0);
    if (hit != 5 || s.workers_lost < (uint64_t)hit)
        fail_msg("%d signals hit registered workers (want 5), STATS counts %llu workers lost", hit,
                 (unsigned long long)s.workers_lost);
    assert_int_equal(s.finish[TP_REASON_ERROR], 0);
    report_latency(&h);
    assert_int_equal(harness_stop(&h), 0);
}

/* Fused forward,sample workers: a job moving to another one takes its
 * sampler along (the new worker samples in process). */
static void jobs_of_a_killed_fused_forward_sample_worker_go_on_at_the_other_one(void **state)
{
    (void)state;
    unsigned rng = seed_from_env();
    harness h;
    if (harness_start(&h, false,
                      "  forward: 2\n  sample: 2\n  stop: 1\n  respawn_init_ms: 100\n  fuse: [\"forward,sample\"]\n" HB))
        fail_msg("daemon did not start");
    static jres ref[N_JOBS], got[N_JOBS];
    run_round(&h, "ref", ref, NULL, 0, &rng);
    int hit = 0;   /* registrations the signals cost the broker */
    for (int round = 0; round < 2; round++) {
        action acts[2] = {{20 + (int)(rand_r(&rng) % 100), SIGKILL, "forward,sample", 0},
                          {150 + (int)(rand_r(&rng) % 100), SIGKILL, round ? "stop" : "forward,sample", 0}};
        char tag[16];
        snprintf(tag, sizeof tag, "f%d", round);
        hit += run_round(&h, tag, got, acts, 2, &rng);
        expect_same(tag, ref, got);
        if (harness_wait_stage(&h, TP_SI_FORWARD, 2, BACK_TIMEOUT_MS) || harness_wait_stage(&h, TP_SI_STOP, 1, BACK_TIMEOUT_MS))
            fail_msg("the workers did not come back (log in %s)", h.dir);
    }
    tp_m_stats_reply s;
    assert_int_equal(stats_after_losses(&h, hit, &s), 0);
    if (hit != 4 || s.workers_lost < (uint64_t)hit)
        fail_msg("%d signals hit registered workers (want 4), STATS counts %llu workers lost", hit,
                 (unsigned long long)s.workers_lost);
    assert_int_equal(s.finish[TP_REASON_ERROR], 0);
    assert_int_equal(harness_stop(&h), 0);
}

/* Run `tokpipe generate` for one long seeded prompt; when kill_after > 0
 * bytes were printed, SIGKILL tokpiped and start it again. Returns what
 * generate printed (malloc'd); its exit status in *status; *late (may be
 * NULL) is set when the job had finished before the broker was killed (a
 * loaded machine read the bytes late), so nothing was tested. */
static char *generate_across_restart(harness *h, size_t kill_after, int *status, bool *late)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s/tokpipe generate --config %s --timeout 20000 --prompt 'Once upon a time' --max-tokens 400 "
             "--ignore-eos --temperature 0.9 --seed 7 --stop ' moon' 2>%s/generate.err",
             h->bin, h->config, h->dir);
    FILE *p = popen(cmd, "r");
    if (!p)
        fail_msg("popen: tokpipe generate");
    size_t len = 0, cap = 1 << 16;
    char *out = malloc(cap);
    assert_non_null(out);
    bool killed = false;
    int c;
    while ((c = fgetc(p)) != EOF) {
        if (len + 1 < cap)
            out[len++] = (char)c;
        if (kill_after && !killed && len >= kill_after) {
            killed = true;
            /* the job must still run when the broker dies: freeze its forward
             * worker (no token more), then look (the bytes were read when
             * the test got the CPU, maybe after the job's end) */
            pid_t fwd = harness_child_serving(h, "forward");
            if (fwd > 0)
                kill(fwd, SIGSTOP);
            tp_m_stats_reply s;
            if (late)
                *late = harness_stats(h, &s) || s.jobs_active == 0;
            kill(h->pid, SIGKILL);
            waitpid(h->pid, NULL, 0);
            if (fwd > 0)   /* stopped, it would never act on the dead broker's SIGTERM */
                kill(fwd, SIGKILL);
            printf("# tokpiped killed after %zu bytes printed%s; starting it again\n", len,
                   late && *late ? " (its job had already finished)" : "");
            if (harness_spawn_daemon(h, false, NULL) || harness_wait_workers(h, 20000))
                fail_msg("tokpiped did not start again (log in %s)", h->dir);
        }
    }
    out[len] = '\0';
    *status = pclose(p);
    if (kill_after && !killed)
        fail_msg("generate printed only %zu bytes: the job ended before the broker could be killed", len);
    return out;
}

static void generate_goes_on_after_the_broker_restarts_printing_the_undisturbed_text(void **state)
{
    (void)state;
    harness h;
    if (harness_start(&h, false, "  respawn_init_ms: 100\n" HB))
        fail_msg("daemon did not start");
    int st;
    char *want = generate_across_restart(&h, 0, &st, NULL);
    assert_int_equal(st, 0);
    if (strlen(want) < 200)
        fail_msg("the undisturbed generation is too short for this test: '%s'", want);
    bool late = true;
    char *got = NULL;
    for (int attempt = 0; late && attempt < 5; attempt++) {
        free(got);
        got = generate_across_restart(&h, 40, &st, &late);
    }
    if (late)
        fail_msg("5 times the job finished before 40 bytes of it were read: the machine is too loaded");
    char errpath[256], *err = NULL;
    snprintf(errpath, sizeof errpath, "cat %s/generate.err", h.dir);
    harness_sh(errpath, &err);
    if (st != 0 || strcmp(got, want))
        fail_msg("generate across a broker restart: status %d\n got: '%s'\nwant: '%s'\nstderr: %s", st, got, want,
                 err ? err : "");
    if (!err || !strstr(err, "submitting it again"))
        fail_msg("generate did not say it resubmitted the job: %s", err ? err : "");
    free(err);
    free(got);
    free(want);
    assert_int_equal(harness_stop(&h), 0);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(jobs_stream_on_unchanged_while_workers_of_every_stage_die),
        cmocka_unit_test(jobs_ride_out_the_respawn_of_each_stages_only_worker_and_a_hung_one),
        cmocka_unit_test(jobs_of_a_killed_fused_forward_sample_worker_go_on_at_the_other_one),
        cmocka_unit_test(generate_goes_on_after_the_broker_restarts_printing_the_undisturbed_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
