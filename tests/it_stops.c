/* Process story: stop-string, stop-id, EOS and max-token finishes seen by a
 * subscriber of the real daemon match the offline `tokpipe stopcheck`
 * semantics exactly — the same chunks, final text, reason, matched stop and
 * completion count.
 *
 * How: for each constrained job C the test also runs U, the same job
 * without stop strings (same seed, sampling, stop ids, min_tokens). U
 * samples exactly what C samples up to C's finish, so U's tokens (plus the
 * id that finished U, if any) are the candidates C saw; stopcheck replays
 * them with C's stop settings and must publish what the subscriber got. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <cJSON.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/daemon_harness.h"

static const int32_t prompt[] = {1, 403, 407, 261, 378};   /* "Once upon a time" */

typedef struct jparams {
    double temperature;
    uint64_t seed;
    int max_tokens, min_tokens;
    const char *stop[4];
    int n_stop;
    int32_t stop_ids[4];
    int n_ids;
    bool ignore_eos, include;
} jparams;

typedef struct jresult {
    int32_t ids[600];
    int n_ids;
    cJSON *chunks;          /* array of non-empty deltas */
    char text[8192];
    size_t text_len;
    int reason;
    char matched_str[256];
    int32_t matched_id;     /* -1 none */
    uint32_t completion;
} jresult;

static void pack_params(msgpack_packer *pk, const jparams *p)
{
    msgpack_pack_map(pk, 8);
    msgpack_pack_str_with_body(pk, "temperature", 11);
    msgpack_pack_double(pk, p->temperature);
    msgpack_pack_str_with_body(pk, "seed", 4);
    msgpack_pack_uint64(pk, p->seed);
    msgpack_pack_str_with_body(pk, "max_tokens", 10);
    msgpack_pack_int(pk, p->max_tokens);
    msgpack_pack_str_with_body(pk, "min_tokens", 10);
    msgpack_pack_int(pk, p->min_tokens);
    msgpack_pack_str_with_body(pk, "stop", 4);
    msgpack_pack_array(pk, (size_t)p->n_stop);
    for (int i = 0; i < p->n_stop; i++)
        msgpack_pack_str_with_body(pk, p->stop[i], strlen(p->stop[i]));
    msgpack_pack_str_with_body(pk, "stop_token_ids", 14);
    msgpack_pack_array(pk, (size_t)p->n_ids);
    for (int i = 0; i < p->n_ids; i++)
        msgpack_pack_int(pk, p->stop_ids[i]);
    msgpack_pack_str_with_body(pk, "ignore_eos", 10);
    p->ignore_eos ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
    msgpack_pack_str_with_body(pk, "include_stop_str_in_output", 26);
    p->include ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
}

static void on_event(const tp_msg *ev, jresult *r)
{
    if (ev->cmd == TP_CMD_TOKEN) {
        for (size_t i = 0; i < ev->token.ids.n && r->n_ids < 600; i++)
            r->ids[r->n_ids++] = tp_raw_i32(ev->token.ids, i);
    }
    const tp_str *t = ev->cmd == TP_CMD_TOKEN ? &ev->token.text : &ev->finish.text;
    if (t->len) {
        char *s = strndup(t->ptr, t->len);
        cJSON_AddItemToArray(r->chunks, cJSON_CreateString(s));
        free(s);
        assert_true(r->text_len + t->len < sizeof r->text);
        memcpy(r->text + r->text_len, t->ptr, t->len);
        r->text_len += t->len;
    }
    if (ev->cmd == TP_CMD_FINISH) {
        r->reason = ev->finish.reason;
        r->completion = ev->finish.completion_tokens;
        r->matched_id = ev->finish.matched.kind == TP_MATCHED_ID ? ev->finish.matched.id : -1;
        if (ev->finish.matched.kind == TP_MATCHED_STR)
            snprintf(r->matched_str, sizeof r->matched_str, "%.*s", (int)ev->finish.matched.str.len,
                     ev->finish.matched.str.ptr);
    }
}

/* Submit one job with prompt ids and collect its events until FINISH. */
static void run_job(harness *h, void *sub, const char *id, const jparams *p, jresult *r)
{
    memset(r, 0, sizeof *r);
    r->chunks = cJSON_CreateArray();
    r->matched_id = -1;
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2);
    msgpack_pack_str_with_body(&pk, "job_id", 6);
    msgpack_pack_str_with_body(&pk, id, strlen(id));
    msgpack_pack_str_with_body(&pk, "params", 6);
    pack_params(&pk, p);
    uint8_t c = TP_CMD_SUBMIT;
    tp_frame f[4] = {{"JOB1", 4}, {&c, 1}, {sb.data, sb.size}, {prompt, sizeof prompt}};
    tp_zmsg z;
    assert_int_equal(harness_raw_call(h, f, 4, &z, 3000), 0);
    tp_msg ack;
    tp_err e;
    assert_int_equal(tp_proto_decode(TP_FAM_JOB, z.f, z.n, &ack, &e), 0);
    if (ack.status != TP_ST_OK)
        fail_msg("job %s rejected: %.*s", id, (int)ack.error.len, ack.error.ptr);
    tp_msg_clear(&ack);
    tp_zmsg_close(&z);
    msgpack_sbuffer_destroy(&sb);
    int64_t seq = -1;
    for (;;) {
        zmq_pollitem_t it = {sub, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 10000) <= 0)
            fail_msg("job %s: no FINISH within 10 s", id);
        tp_zmsg_recv(sub, &z, 0);
        tp_msg ev;
        assert_int_equal(tp_proto_decode(TP_FAM_EVT, z.f, z.n, &ev, &e), 0);
        if (ev.cmd == TP_CMD_HEARTBEAT) {   /* "" takes the broker's heartbeats too */
            tp_msg_clear(&ev);
            tp_zmsg_close(&z);
            continue;
        }
        const tp_str *jid = ev.cmd == TP_CMD_TOKEN ? &ev.token.job_id : &ev.finish.job_id;
        bool mine = jid->len == strlen(id) && !memcmp(jid->ptr, id, jid->len);
        bool fin = ev.cmd == TP_CMD_FINISH;
        if (mine) {
            uint32_t s = ev.cmd == TP_CMD_TOKEN ? ev.token.seq : ev.finish.seq;
            if ((int64_t)s != seq + 1)
                fail_msg("job %s: event seq %u after %lld", id, s, (long long)seq);
            seq = s;
            on_event(&ev, r);
        }
        tp_msg_clear(&ev);
        tp_zmsg_close(&z);
        if (mine && fin)
            return;
    }
}

static cJSON *stopcheck_case(const jparams *p, const jresult *u)
{
    cJSON *c = cJSON_CreateObject();
    cJSON *toks = cJSON_AddArrayToObject(c, "tokens");
    for (int i = 0; i < u->n_ids; i++)
        cJSON_AddItemToArray(toks, cJSON_CreateNumber(u->ids[i]));
    if (u->matched_id >= 0)   /* the candidate that finished U */
        cJSON_AddItemToArray(toks, cJSON_CreateNumber(u->matched_id));
    cJSON_AddNumberToObject(c, "prompt_last_id", prompt[4]);
    cJSON *stop = cJSON_AddArrayToObject(c, "stop");
    for (int i = 0; i < p->n_stop; i++)
        cJSON_AddItemToArray(stop, cJSON_CreateString(p->stop[i]));
    cJSON *ids = cJSON_AddArrayToObject(c, "stop_token_ids");
    for (int i = 0; i < p->n_ids; i++)
        cJSON_AddItemToArray(ids, cJSON_CreateNumber(p->stop_ids[i]));
    cJSON *eos = cJSON_AddArrayToObject(c, "eos_token_id");   /* the model's: BOS and EOS end a story */
    cJSON_AddItemToArray(eos, cJSON_CreateNumber(1));
    cJSON_AddItemToArray(eos, cJSON_CreateNumber(2));
    cJSON_AddBoolToObject(c, "ignore_eos", p->ignore_eos);
    cJSON_AddBoolToObject(c, "include_stop_str_in_output", p->include);
    cJSON_AddNumberToObject(c, "min_tokens", p->min_tokens);
    cJSON_AddNumberToObject(c, "max_tokens", p->max_tokens);
    return c;
}

static void expect_equal_json(const char *what, const char *field, cJSON *got, cJSON *want)
{
    char *a = cJSON_PrintUnformatted(got), *b = cJSON_PrintUnformatted(want);
    if (!a || !b || strcmp(a, b))
        fail_msg("%s: %s differs\n subscriber: %s\n  stopcheck: %s", what, field, a ? a : "(none)", b ? b : "(none)");
    free(a);
    free(b);
}

static void compare(const char *what, const jresult *c, cJSON *want)
{
    if (cJSON_GetObjectItem(want, "error"))
        fail_msg("%s: stopcheck error %s", what, cJSON_GetObjectItem(want, "error")->valuestring);
    expect_equal_json(what, "chunks", c->chunks, cJSON_GetObjectItem(want, "chunks"));
    char *text = strndup(c->text, c->text_len);
    cJSON *t = cJSON_CreateString(text);
    expect_equal_json(what, "text", t, cJSON_GetObjectItem(want, "text"));
    cJSON_Delete(t);
    free(text);
    cJSON *reason = cJSON_CreateString(tp_reason_name(c->reason));
    expect_equal_json(what, "finish_reason", reason, cJSON_GetObjectItem(want, "finish_reason"));
    cJSON_Delete(reason);
    cJSON *m = c->matched_str[0] ? cJSON_CreateString(c->matched_str)
             : c->matched_id >= 0 ? cJSON_CreateNumber(c->matched_id)
                                  : cJSON_CreateNull();
    expect_equal_json(what, "matched", m, cJSON_GetObjectItem(want, "matched"));
    cJSON_Delete(m);
    cJSON *n = cJSON_CreateNumber(c->completion);
    expect_equal_json(what, "completion_tokens", n, cJSON_GetObjectItem(want, "completion_tokens"));
    cJSON_Delete(n);
}

static void subscriber_sees_stopcheck_semantics(void **state)
{
    (void)state;
    harness h;
    assert_int_equal(harness_start(&h, false, NULL), 0);
    void *sub = harness_subscribe(&h, "");
    /* U0: a plain sampled run to pick stops that will fire */
    jparams base = {.temperature = 0.9, .seed = 5, .max_tokens = 60};
    jresult u0;
    run_job(&h, sub, "probe", &base, &u0);
    assert_true(u0.text_len > 30 && u0.n_ids > 8);
    char mid[8], early[4];
    snprintf(mid, sizeof mid, "%.5s", u0.text + 12);      /* ends mid-text, likely inside a token */
    snprintf(early, sizeof early, "%.2s", u0.text + 2);   /* ends inside the min_tokens text */

    jparams cases[] = {
        {.temperature = 0.9, .seed = 5, .max_tokens = 60, .stop_ids = {u0.ids[6]}, .n_ids = 1},
        {.temperature = 0.9, .seed = 5, .max_tokens = 60, .stop = {mid}, .n_stop = 1},
        {.temperature = 0.9, .seed = 5, .max_tokens = 60, .stop = {mid}, .n_stop = 1, .include = true},
        {.temperature = 0.9, .seed = 5, .max_tokens = 60, .min_tokens = 8, .stop = {early}, .n_stop = 1},
        {.temperature = 0.8, .seed = 9, .max_tokens = 80, .stop = {"the ", "a b", "Lily", "xyzzy"}, .n_stop = 4},
        {.temperature = 1.0, .seed = 1, .max_tokens = 7},
        {.temperature = 0, .max_tokens = 400},
        {.temperature = 1.0, .seed = 21, .max_tokens = 300, .stop = {"\n"}, .n_stop = 1},
        {.temperature = 1.0, .seed = 8, .max_tokens = 40, .ignore_eos = true, .stop = {"."}, .n_stop = 1},
    };
    size_t n = sizeof cases / sizeof cases[0];
    jresult *cr = calloc(n, sizeof *cr), *ur = calloc(n, sizeof *ur);
    char path[256];
    snprintf(path, sizeof path, "%s/cases.jsonl", h.dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (size_t i = 0; i < n; i++) {
        char id[32];
        snprintf(id, sizeof id, "c%zu", i);
        run_job(&h, sub, id, &cases[i], &cr[i]);
        jparams up = cases[i];
        up.n_stop = 0;
        up.include = false;
        snprintf(id, sizeof id, "u%zu", i);
        run_job(&h, sub, id, &up, &ur[i]);
        cJSON *c = stopcheck_case(&cases[i], &ur[i]);
        char *line = cJSON_PrintUnformatted(c);
        fprintf(f, "%s\n", line);
        free(line);
        cJSON_Delete(c);
    }
    fclose(f);
    zmq_close(sub);
    char cmd[1400], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s/tokpipe stopcheck --tokenizer %s/tok512.bin < %s", h.bin, h.models, path);
    assert_int_equal(harness_sh(cmd, &out), 0);
    assert_int_equal(harness_stop(&h), 0);
    char *line = out;
    int reasons = 0;
    for (size_t i = 0; i < n; i++) {
        char *nl = strchr(line, '\n');
        assert_non_null(nl);
        cJSON *want = cJSON_ParseWithLength(line, (size_t)(nl - line));
        assert_non_null(want);
        char what[32];
        snprintf(what, sizeof what, "case %zu", i);
        compare(what, &cr[i], want);
        reasons |= 1 << cr[i].reason;
        cJSON_Delete(want);
        cJSON_Delete(cr[i].chunks);
        cJSON_Delete(ur[i].chunks);
        line = nl + 1;
    }
    cJSON_Delete(u0.chunks);
    free(out);
    free(cr);
    free(ur);
    /* the cases really exercised stop strings, stop ids and lengths */
    assert_true(reasons & (1 << TP_REASON_STOP_STRING));
    assert_true(reasons & (1 << TP_REASON_STOP_TOKEN));
    assert_true(reasons & (1 << TP_REASON_LENGTH));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(subscriber_sees_stopcheck_semantics),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
