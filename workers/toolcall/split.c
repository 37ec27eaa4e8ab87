/* The splitter: output text in, content / reasoning deltas and, at the
 * end, parsed calls out. States: the start (thinking may open), thinking,
 * the content's start (a call may open the output), content, and a call
 * region (held to the end, then parsed). */
#include <stdlib.h>
#include <string.h>

#include "tc_internal.h"

enum { S_START, S_THINK, S_CONTENT_START, S_CONTENT, S_CALLS };

struct tp_tcsplit {
    tp_tc_syntax syn;
    tp_tcsplit_opts o;
    const tc_family_def *fam;
    const char *think_open, *think_close;
    int state;
    bool thought;            /* a thinking part ended: the answer's leading space goes */
    tcbuf pend;              /* fed, not yet classified */
    tcbuf out_content, out_reasoning;   /* this call's deltas */
    tcbuf reasoning;         /* all of it */
    tc_out calls;
    uint64_t rng;
};

const tc_family_def *tc_family(tp_tc_family f)
{
    static const tc_family_def *const table[TP_TC_COUNT] = {
        [TP_TC_GENERIC] = &tc_generic,           [TP_TC_HERMES] = &tc_hermes,
        [TP_TC_LLAMA3] = &tc_llama3,             [TP_TC_MISTRAL] = &tc_mistral,
        [TP_TC_FUNCTIONARY_V31] = &tc_functionary_v31, [TP_TC_FUNCTIONARY_V32] = &tc_functionary_v32,
        [TP_TC_COMMAND_R7B] = &tc_command_r7b,   [TP_TC_COMMAND_R_PLUS] = &tc_command_r_plus,
        [TP_TC_DEEPSEEK_R1] = &tc_deepseek_r1,   [TP_TC_FIREFUNCTION_V2] = &tc_firefunction_v2,
    };
    return f > TP_TC_NONE && f < TP_TC_COUNT ? table[f] : NULL;
}

const char *tp_tc_family_name(tp_tc_family f)
{
    const tc_family_def *d = tc_family(f);
    return d ? d->name : "none";
}

const char *tp_toolcall_trigger(tp_tc_family f)
{
    const tc_family_def *d = tc_family(f);
    return d && d->markers && !d->json_at_start && !d->recipient_first ? d->markers[0] : NULL;
}

int tp_tcsplit_new(const tp_tc_syntax *syn, const tp_tcsplit_opts *o, tp_tcsplit **out, tp_err *err)
{
    tp_tcsplit *s = calloc(1, sizeof *s);
    if (!s)
        return tp_err_set(err, TP_ENOMEM, "tool calls: out of memory");
    s->syn = *syn;
    s->o = *o;
    s->fam = o->tools ? tc_family(syn->family) : NULL;
    if (syn->family == TP_TC_COMMAND_R7B) {
        s->think_open = "<|START_THINKING|>";
        s->think_close = "<|END_THINKING|>";
    } else {
        s->think_open = "<think>";
        s->think_close = "</think>";
    }
    s->rng = o->id_seed ^ 0x9E3779B97F4A7C15ull;
    s->state = S_START;
    *out = s;
    return 0;
}

void tp_tcsplit_free(tp_tcsplit *s)
{
    if (!s)
        return;
    tcb_free(&s->pend);
    tcb_free(&s->out_content);
    tcb_free(&s->out_reasoning);
    tcb_free(&s->reasoning);
    for (size_t i = 0; i < s->calls.n_calls; i++)
        tc_call_release(&s->calls.calls[i]);
    free(s->calls.calls);
    tcb_free(&s->calls.content);
    free(s);
}

/* Drop the first n bytes of pend. */
static void consume(tp_tcsplit *s, size_t n)
{
    if (!n)
        return;
    memmove(s->pend.s, s->pend.s + n, s->pend.len - n);
    s->pend.len -= n;
    if (s->pend.s)
        s->pend.s[s->pend.len] = 0;
}

static void emit_reasoning(tp_tcsplit *s, size_t n)
{
    tcb_put(&s->out_reasoning, s->pend.s, n);
    tcb_put(&s->reasoning, s->pend.s, n);
    consume(s, n);
}

static void emit_content(tp_tcsplit *s, size_t n)
{
    tcb_put(&s->out_content, s->pend.s, n);
    consume(s, n);
}

/* Bytes at the end of s[0..n) that are a proper prefix of lit (0 none). */
static size_t tail_prefix(const char *s, size_t n, const char *lit)
{
    size_t k = strlen(lit);
    for (size_t m = k - 1 < n ? k - 1 : n; m > 0; m--)
        if (!memcmp(s + n - m, lit, m))
            return m;
    return 0;
}

/* Is s[0..n) a prefix of lit (so more text may still make it lit)? */
static bool prefix_of(const char *s, size_t n, const char *lit)
{
    size_t k = strlen(lit);
    return n < k && !memcmp(s, lit, n);
}

/* The content's earliest marker (opens calls) or strip text (dropped). */
static const char *earliest(const tp_tcsplit *s, const char *p, size_t n, size_t *mlen, bool *strip)
{
    const char *best = NULL;
    for (int pass = 0; pass < 2; pass++) {
        const char *const *list = !s->fam ? NULL : pass ? s->fam->strip : s->fam->markers;
        for (; list && *list; list++) {
            const char *at = tc_find(p, n, *list);
            if (at && (!best || at < best)) {
                best = at;
                *mlen = strlen(*list);
                *strip = pass == 1;
            }
        }
    }
    return best;
}

static size_t held_tail(const tp_tcsplit *s, const char *p, size_t n)
{
    size_t hold = 0;
    for (int pass = 0; pass < 2; pass++) {
        const char *const *list = !s->fam ? NULL : pass ? s->fam->strip : s->fam->markers;
        for (; list && *list; list++) {
            size_t t = tail_prefix(p, n, *list);
            if (t > hold)
                hold = t;
        }
    }
    return hold;
}

/* Advance the state machine over pend; at_end: no more text comes. */
static void run(tp_tcsplit *s, bool at_end)
{
    for (;;) {
        const char *p = s->pend.s ? s->pend.s : "";
        size_t n = s->pend.len;
        switch (s->state) {
        case S_START: {
            if (!s->o.reasoning || !s->syn.thinks) {
                s->state = S_CONTENT_START;
                break;
            }
            if (s->syn.think_open) {
                s->state = S_THINK;
                break;
            }
            size_t w = tc_ws(p, n);
            if (!at_end && prefix_of(p + w, n - w, s->think_open))
                return;   /* may still open the thinking */
            if (tc_starts(p + w, n - w, s->think_open)) {
                consume(s, w + strlen(s->think_open));
                s->state = S_THINK;
            } else {
                s->state = S_CONTENT_START;
            }
            break;
        }
        case S_THINK: {
            const char *c = tc_find(p, n, s->think_close);
            if (!c) {
                emit_reasoning(s, at_end ? n : n - tail_prefix(p, n, s->think_close));
                return;
            }
            emit_reasoning(s, (size_t)(c - p));
            consume(s, strlen(s->think_close));
            s->thought = true;
            s->state = S_CONTENT_START;
            break;
        }
        case S_CONTENT_START: {
            /* wait past leading space only where it matters: it goes after
             * thinking, and a call may open the output */
            if (!s->thought && (!s->fam || (!s->fam->json_at_start && !s->fam->recipient_first))) {
                s->state = S_CONTENT;
                break;
            }
            size_t w = tc_ws(p, n);
            if (w == n && !at_end)
                return;
            if (s->thought) {
                consume(s, w);
                p = s->pend.s ? s->pend.s : "";
                n = s->pend.len;
                w = 0;
            }
            if (!s->fam) {
                s->state = S_CONTENT;
                break;
            }
            if (s->fam->recipient_first) {
                const char *nl = memchr(p, '\n', n);
                if (!nl && !at_end)
                    return;
                if (nl && nl - p == 3 && !memcmp(p, "all", 3)) {
                    consume(s, 4);
                    s->state = S_CONTENT;
                } else {
                    s->state = S_CALLS;
                }
                break;
            }
            if (s->fam->json_at_start && w < n && p[w] == '{') {
                consume(s, w);
                s->state = S_CALLS;
                break;
            }
            s->state = S_CONTENT;
            break;
        }
        case S_CONTENT: {
            size_t mlen = 0;
            bool strip = false;
            const char *m = earliest(s, p, n, &mlen, &strip);
            if (!m) {
                emit_content(s, at_end ? n : n - held_tail(s, p, n));
                return;
            }
            emit_content(s, (size_t)(m - p));
            if (strip) {
                consume(s, mlen);
                break;
            }
            s->state = S_CALLS;
            break;
        }
        case S_CALLS:
            return;   /* held to the end */
        }
    }
}

static int take(tp_tcsplit *s, const char **content, size_t *content_len, const char **reasoning,
                size_t *reasoning_len)
{
    if (s->pend.oom || s->out_content.oom || s->out_reasoning.oom || s->reasoning.oom || s->calls.oom)
        return TP_ENOMEM;
    *content = s->out_content.len ? s->out_content.s : "";
    *content_len = s->out_content.len;
    *reasoning = s->out_reasoning.len ? s->out_reasoning.s : "";
    *reasoning_len = s->out_reasoning.len;
    return 0;
}

int tp_tcsplit_feed(tp_tcsplit *s, const char *text, size_t len, const char **content, size_t *content_len,
                    const char **reasoning, size_t *reasoning_len)
{
    s->out_content.len = s->out_reasoning.len = 0;
    tcb_put(&s->pend, text, len);
    if (!s->pend.oom)
        run(s, false);
    return take(s, content, content_len, reasoning, reasoning_len);
}

static char id_char(tp_tcsplit *s)
{
    static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    /* splitmix64: the seed is fresh per job, the ids only need to differ */
    uint64_t z = (s->rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return al[z % 62];
}

static int set_ids(tp_tcsplit *s)
{
    for (size_t i = 0; i < s->calls.n_calls; i++) {
        int k = s->fam->id_len;
        size_t pre = k ? 0 : 5;
        size_t len = pre + (size_t)(k ? k : 24);
        char *id = malloc(len + 1);
        if (!id)
            return TP_ENOMEM;
        memcpy(id, "call_", pre);
        for (size_t c = pre; c < len; c++)
            id[c] = id_char(s);
        id[len] = 0;
        s->calls.calls[i].id = id;
    }
    return 0;
}

int tp_tcsplit_finish(tp_tcsplit *s, const char *text, size_t len, const char **content, size_t *content_len,
                      const char **reasoning, size_t *reasoning_len)
{
    s->out_content.len = s->out_reasoning.len = 0;
    tcb_put(&s->pend, text, len);
    run(s, true);
    if (s->state == S_CALLS && s->pend.len) {
        tc_out o = {0};
        int rc = s->fam->parse(s->pend.s, s->pend.len, &o);
        if (rc || o.oom) {
            /* not calls after all: what was held is the model's text */
            emit_content(s, s->pend.len);
            for (size_t i = 0; i < o.n_calls; i++)
                tc_call_release(&o.calls[i]);
            free(o.calls);
        } else {
            tcb_put(&s->out_content, o.content.s, o.content.len);
            consume(s, s->pend.len);
            if (!s->o.parallel)
                while (o.n_calls > 1)
                    tc_call_release(&o.calls[--o.n_calls]);
            s->calls.calls = o.calls;
            s->calls.n_calls = o.n_calls;
            if (set_ids(s))
                s->calls.oom = true;
        }
        tcb_free(&o.content);
    }
    return take(s, content, content_len, reasoning, reasoning_len);
}

size_t tp_tcsplit_calls(const tp_tcsplit *s, const tp_tc_call **calls)
{
    *calls = s->calls.calls;
    return s->calls.n_calls;
}

const char *tp_tcsplit_reasoning(const tp_tcsplit *s, size_t *len)
{
    *len = s->reasoning.len;
    return s->reasoning.len ? s->reasoning.s : "";
}
