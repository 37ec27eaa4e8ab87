/* Job table: a fixed array (slot = index) plus an id -> slot hash (jobs.h).
 *
 * Finished jobs keep their slot until their TTL ends, so a slot number is
 * not reused while late worker messages about it may still arrive. */
#include "jobs.h"

#include <stdlib.h>
#include <string.h>

#include "tokpipe/zwire.h"

static uint32_t fnv(const char *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

int jobs_init(bjobs *t, int max_active, tp_err *err)
{
    /* active jobs plus finished ones kept for STATUS */
    t->cap = (uint32_t)max_active * 4 + 64;
    t->hash_cap = 1;
    while (t->hash_cap < t->cap * 2)
        t->hash_cap <<= 1;
    t->jobs = calloc(t->cap, sizeof *t->jobs);
    t->hash = calloc(t->hash_cap, sizeof *t->hash);
    if (!t->jobs || !t->hash)
        return tp_err_set(err, TP_ENOMEM, "job table: out of memory for %u jobs", t->cap);
    return 0;
}

static void job_clear(bjob *j)
{
    free(j->params.stop);
    free(j->params.stop_token_ids);
    free(j->stop_buf);
    free(j->prompt_text);
    free(j->messages);
    free(j->prompt);
    free(j->out);
    free(j->cands);
    free(j->close_error);
    free(j->gbnf);
    free(j->text);
    free(j->shown);
    free(j->matched_buf);
    free(j->job_error);
    joblp_free(j);
    joblp_cand_free(j);
    jobfields_free(j);
    memset(j, 0, sizeof *j);
}

void jobs_free(bjobs *t)
{
    for (uint32_t i = 0; t->jobs && i < t->cap; i++)
        job_clear(&t->jobs[i]);
    free(t->jobs);
    free(t->hash);
    t->jobs = NULL;
    t->hash = NULL;
}

static uint32_t *hash_slot(bjobs *t, const char *id, size_t len)
{
    uint32_t mask = t->hash_cap - 1;
    for (uint32_t h = fnv(id, len) & mask;; h = (h + 1) & mask) {
        uint32_t v = t->hash[h];
        if (!v)
            return &t->hash[h];
        const bjob *j = &t->jobs[v - 1];
        if (strlen(j->id) == len && !memcmp(j->id, id, len))
            return &t->hash[h];
    }
}

bjob *jobs_find(bjobs *t, const char *id, size_t len)
{
    if (len > TP_PROTO_MAX_JOB_ID)
        return NULL;
    uint32_t v = *hash_slot(t, id, len);
    return v ? &t->jobs[v - 1] : NULL;
}

bjob *jobs_by_slot(bjobs *t, uint32_t slot)
{
    if (slot >= t->cap || t->jobs[slot].state == J_FREE)
        return NULL;
    return &t->jobs[slot];
}

/* Backward-shift deletion keeps linear probing chains intact. */
static void hash_remove(bjobs *t, const char *id)
{
    uint32_t mask = t->hash_cap - 1;
    uint32_t *p = hash_slot(t, id, strlen(id));
    if (!*p)
        return;
    uint32_t i = (uint32_t)(p - t->hash);
    t->hash[i] = 0;
    for (uint32_t k = (i + 1) & mask; t->hash[k]; k = (k + 1) & mask) {
        uint32_t v = t->hash[k];
        const char *kid = t->jobs[v - 1].id;
        uint32_t home = fnv(kid, strlen(kid)) & mask;
        /* move v back to i if its home is not in (i, k] cyclically */
        bool in_range = i <= k ? (home > i && home <= k) : (home > i || home <= k);
        if (!in_range) {
            t->hash[i] = v;
            t->hash[k] = 0;
            i = k;
        }
    }
}

/* A free entry; when the table is full, the oldest finished job goes. */
static bjob *free_entry(bjobs *t)
{
    bjob *oldest = NULL;
    for (uint32_t i = 0; i < t->cap; i++) {
        bjob *j = &t->jobs[i];
        if (j->state == J_FREE)
            return j;
        if (j->state == J_FINISHED && (!oldest || j->done_ms < oldest->done_ms))
            oldest = j;
    }
    if (oldest)
        jobs_release(t, oldest);
    return oldest;
}

bjob *jobs_new(bjobs *t, const char *id, size_t len)
{
    bjob *j = free_entry(t);
    if (!j)
        return NULL;
    uint32_t slot = (uint32_t)(j - t->jobs);
    memset(j, 0, sizeof *j);
    memcpy(j->id, id, len);
    j->id[len] = '\0';
    j->slot = slot;
    j->state = J_ADMIT;
    j->fwd = j->smp = j->stp = j->dft = j->tok_worker = j->close_stp = -1;
    j->pending = j->acc_for_sampler = -1;
    j->last_seq = -1;
    j->seqno = t->next_seqno++;
    *hash_slot(t, j->id, len) = slot + 1;
    t->n_active++;
    return j;
}

void jobs_release(bjobs *t, bjob *j)
{
    if (j->state == J_FREE)
        return;
    if (j->state != J_FINISHED)
        t->n_active--;
    hash_remove(t, j->id);
    job_clear(j);
}

void jobs_expire(bjobs *t, int64_t now, int64_t ttl_ms)
{
    for (uint32_t i = 0; i < t->cap; i++) {
        bjob *j = &t->jobs[i];
        if (j->state == J_FINISHED && now - j->done_ms >= ttl_ms)
            jobs_release(t, j);
    }
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t nc = *cap ? *cap : 64;
    while (nc < need)
        nc *= 2;
    void *n = realloc(*p, nc * elem);
    if (!n)
        return TP_ENOMEM;
    *p = n;
    *cap = nc;
    return 0;
}

int jobs_append_text(bjob *j, const char *s, size_t n)
{
    if (n == 0)
        return 0;
    /* whole deltas only, so the kept text stays valid UTF-8 */
    if (j->text_cut || j->text_len + n > TP_PROTO_MAX_TEXT) {
        j->text_cut += n;
        return 0;
    }
    if (grow((void **)&j->text, &j->text_cap, j->text_len + n + 1, 1))
        return TP_ENOMEM;
    memcpy(j->text + j->text_len, s, n);
    j->text_len += n;
    j->text[j->text_len] = '\0';
    return 0;
}

int jobs_append_out(bjob *j, int32_t id)
{
    size_t cap = j->cap_out;
    if (grow((void **)&j->out, &cap, (size_t)j->n_out + 1, sizeof *j->out))
        return TP_ENOMEM;
    j->cap_out = (uint32_t)cap;
    j->out[j->n_out++] = id;
    return 0;
}

int jobs_append_cand(bjob *j, int32_t id)
{
    size_t cap = j->cap_cands;
    if (grow((void **)&j->cands, &cap, (size_t)j->n_cand + 1, sizeof *j->cands))
        return TP_ENOMEM;
    j->cap_cands = (uint32_t)cap;
    j->cands[j->n_cand++] = id;
    return 0;
}

void jobs_drop_request(bjob *j)
{
    free(j->prompt_text);
    j->prompt_text = NULL;
    free(j->messages);
    j->messages = NULL;
    j->n_messages = 0;
    j->tools = (tp_str){0};
}

bool jobs_suspect(const bjob *j)
{
    return j->suspect;
}

void jobs_progress(bjob *j, int si)
{
    if (j->loss_stage == si) {
        j->losses = 0;
        j->suspect = false;
    }
}

uint64_t jobs_text_total(const bjob *j)
{
    return j->text_len + j->text_cut;
}

/* The ids of one TOKEN event, at its index. An index past what was shown
 * (the events of a lost stop worker) is filled from the verdicts. */
static int append_shown(bjob *j, uint32_t index, tp_raw ids)
{
    if (index < j->n_shown)
        j->n_shown = index;
    size_t need = (size_t)index + ids.n;
    if (grow((void **)&j->shown, &j->cap_shown, need ? need : 1, sizeof *j->shown))
        return TP_ENOMEM;
    for (; j->n_shown < index; j->n_shown++)
        j->shown[j->n_shown] = j->n_shown < j->n_out ? j->out[j->n_shown] : -1;
    tp_raw_copy(j->shown + j->n_shown, ids, 4);
    j->n_shown += ids.n;
    return 0;
}

static void count_trigger(bjobcounts *s, const tp_matched *m)
{
    if (m->kind == TP_MATCHED_NONE)
        return;
    size_t klen = m->kind == TP_MATCHED_STR ? (m->str.len > 48 ? 48 : m->str.len) : 0;
    for (size_t i = 0; i < s->n_triggers; i++) {
        struct btrigger *t = &s->triggers[i];
        if (t->key.kind == m->kind &&
            (m->kind == TP_MATCHED_ID ? t->key.id == m->id
                                      : t->key.str.len == klen && !memcmp(t->str, m->str.ptr, klen) &&
                                            t->truncated == (m->str.len > 48))) {
            t->count++;
            return;
        }
    }
    if (s->n_triggers == sizeof s->triggers / sizeof s->triggers[0]) {
        s->triggers_other++;
        return;
    }
    struct btrigger *t = &s->triggers[s->n_triggers++];
    memset(t, 0, sizeof *t);
    t->key.kind = m->kind;
    t->key.id = m->id;
    memcpy(t->str, m->kind == TP_MATCHED_STR ? m->str.ptr : "", klen);
    t->key.str.len = klen;
    t->truncated = m->kind == TP_MATCHED_STR && m->str.len > 48;
    t->count = 1;
}

void jobs_mark_finished(bjobs *t, bjob *j)
{
    if (j->state == J_FINISHED)
        return;
    j->state = J_FINISHED;
    j->done_ms = tp_now_ms();
    t->n_active--;
    joblp_cand_free(j);   /* no candidate is sent to a stop worker again */
    if (j->rejected) {
        /* the client's error, found after the ACK: a rejected request,
         * not a job that failed (PROTOCOL.md, jobs_rejected) */
        t->c.jobs_rejected++;
    } else {
        t->c.jobs_finished++;
    }
    /* what subscribers were sent is the result: after a lost stop worker
     * the verdicts may have run ahead of the events that were published */
    if (j->shown) {
        j->n_out = 0;
        for (size_t i = 0; i < j->n_shown; i++)
            jobs_append_out(j, j->shown[i]);
    } else if (!j->shown && j->n_tok_ids < j->n_out) {
        j->n_out = j->n_tok_ids;
    }
    t->c.tokens_generated += j->n_out;
    if (j->reason > 0 && j->reason < TP_REASON_COUNT && !j->rejected)
        t->c.finish[j->reason]++;
    count_trigger(&t->c, &j->matched);
    if (!j->rejected)
        metrics_on_finish(&t->metrics, &j->timings);
    /* the request copies and the running view are no longer needed:
     * STATUS of a finished job answers the verdicts' tokens */
    jobs_drop_request(j);
    free(j->shown);
    j->shown = NULL;
    j->n_shown = j->cap_shown = 0;
}

static void record_finish(bjobs *t, bjob *j, const tp_m_finish *f)
{
    jobs_append_text(j, f->text.ptr, f->text.len);
    jobfields_on_finish(j, f);
    j->reason = f->reason;
    j->timings = f->timings;
    if (f->matched.kind == TP_MATCHED_STR && (j->matched_buf = malloc(f->matched.str.len + 1))) {
        memcpy(j->matched_buf, f->matched.str.ptr, f->matched.str.len);
        j->matched_buf[f->matched.str.len] = '\0';
        j->matched = (tp_matched){.kind = TP_MATCHED_STR, .str = {j->matched_buf, f->matched.str.len}};
    } else if (f->matched.kind == TP_MATCHED_ID) {
        j->matched = f->matched;
    }
    if (f->job_error.len && (j->job_error = malloc(f->job_error.len + 1))) {
        memcpy(j->job_error, f->job_error.ptr, f->job_error.len);
        j->job_error[f->job_error.len] = '\0';
    }
    j->result_ready = true;
    /* a running job ends when its workers let go of it (sched.c) */
    if (j->state != J_RUNNING)
        jobs_mark_finished(t, j);
}

/* Should an event from a stop worker reach subscribers? Not when its job
 * already ended, nor when its seq was already forwarded: after a lost stop
 * worker its replacement continues at the first seq the broker did not
 * see, and an event of the lost one still on its way (or of one that was
 * stopped and runs again) carries the same content as the replacement's,
 * so whichever comes first is forwarded and the other dropped: each seq
 * reaches subscribers exactly once. */
bool jobs_event_from_pinned(bjobs *t, const tp_msg *ev)
{
    if (ev->cmd != TP_CMD_TOKEN && ev->cmd != TP_CMD_FINISH)
        return false;
    const tp_str *id = ev->cmd == TP_CMD_TOKEN ? &ev->token.job_id : &ev->finish.job_id;
    const bjob *j = jobs_find(t, id->ptr, id->len);
    uint64_t pin = ev->cmd == TP_CMD_TOKEN ? ev->token.pin : ev->finish.pin;
    return j && j->stop_pin && pin == j->stop_pin;
}

bool jobs_event_wanted(bjobs *t, const tp_msg *ev)
{
    if (ev->cmd != TP_CMD_TOKEN && ev->cmd != TP_CMD_FINISH)
        return true;
    const tp_str *id = ev->cmd == TP_CMD_TOKEN ? &ev->token.job_id : &ev->finish.job_id;
    bjob *j = jobs_find(t, id->ptr, id->len);
    if (!j)
        return true;
    uint32_t seq = ev->cmd == TP_CMD_TOKEN ? ev->token.seq : ev->finish.seq;
    return !(j->state == J_FINISHED || j->result_ready || (int64_t)seq <= j->last_seq);
}

static int64_t note_recovered(bjobs *t, bjob *j)
{
    if (!j->recover_t0)
        return -1;
    uint64_t ms = (uint64_t)(tp_now_ms() - j->recover_t0);
    t->c.recovery_n++;
    t->c.recovery_ms_sum += ms;
    if (ms > t->c.recovery_ms_max)
        t->c.recovery_ms_max = ms;
    j->recover_t0 = 0;
    return (int64_t)ms;
}

int64_t jobs_on_event(bjobs *t, const tp_msg *ev, const bjob **job)
{
    if (ev->cmd != TP_CMD_TOKEN && ev->cmd != TP_CMD_FINISH)
        return -1;
    const tp_str *id = ev->cmd == TP_CMD_TOKEN ? &ev->token.job_id : &ev->finish.job_id;
    bjob *j = jobs_find(t, id->ptr, id->len);
    if (!j || j->state == J_FINISHED || j->result_ready)
        return -1;
    *job = j;
    int64_t resumed = note_recovered(t, j);
    if (ev->cmd == TP_CMD_TOKEN) {
        j->last_seq = ev->token.seq;
        j->n_tok_ids += (uint32_t)ev->token.ids.n;
        jobs_append_text(j, ev->token.text.ptr, ev->token.text.len);
        append_shown(j, ev->token.index, ev->token.ids);
        joblp_on_token(j, &ev->token);
        jobfields_on_token(j, &ev->token);
        metrics_on_token(&t->metrics, &j->t_last_token_us, ev->token.ids.n);
        return resumed;
    }
    j->last_seq = ev->finish.seq;
    record_finish(t, j, &ev->finish);
    return resumed;
}

bool jobs_own_finish(const bjob *j, int reason, const char *error, tp_msg *ev)
{
    if (j->result_ready || j->state == J_FINISHED || j->state == J_FREE)
        return false;
    uint64_t now = tp_wall_us();
    tp_msg_init(ev, TP_FAM_EVT, TP_CMD_FINISH);
    tp_m_finish *f = &ev->finish;
    f->job_id = tp_str_of(j->id);
    f->seq = (uint32_t)(j->last_seq + 1);
    f->reason = reason;
    f->job_error = tp_str_of(reason == TP_REASON_ERROR ? (error ? error : "error") : NULL);
    f->prompt_tokens = j->n_prompt;
    f->cached_tokens = j->cached;
    f->draft_tokens = j->spec.drafted < UINT32_MAX ? (uint32_t)j->spec.drafted : UINT32_MAX;
    f->draft_accepted = j->spec.accepted < UINT32_MAX ? (uint32_t)j->spec.accepted : UINT32_MAX;
    f->completion_tokens = j->n_tok_ids;   /* the ids subscribers were sent, exactly */
    f->text_len = jobs_text_total(j);
    f->timings.queue_us = j->t_start_wall > j->t_submit_wall ? j->t_start_wall - j->t_submit_wall : 0;
    f->timings.total_us = now > j->t_submit_wall ? now - j->t_submit_wall : 0;
    if (j->params.set & TP_P_SEED)
        f->set |= TP_ACK_SEED, f->seed = j->params.seed;
    f->error_code = tp_str_of(j->rejected);
    if (j->context_refused)
        f->context_length = j->context_refused;
    return true;
}
