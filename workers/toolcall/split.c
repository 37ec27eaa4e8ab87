/* The splitter: output text in, content / reasoning deltas and, at the
 * end, parsed calls out. States: the start (thinking may open), thinking,
 * the content's start (a call may open the output), content, and a call
 * region (held to the end, then parsed). */
#include <stdlib.h>
#include <string.h>

#include "tc_internal.h"
#include "tokpipe/tokenizer.h"

enum { S_START, S_THINK, S_CONTENT_START, S_CONTENT, S_CALLS };

struct tp_tcsplit {
    tp_tc_syntax syn;
    tp_tcsplit_opts o;
    const tc_family_def *fam;
    const tc_family_def *frame;  /* a family whose frame is stripped with or without tools (channels) */
    const char *think_open, *think_close;
    int state;
    bool thought;            /* a thinking part ended: the answer's leading space goes */
    tp_buf pend;             /* fed, not yet classified */
    tp_buf out_content, out_reasoning;  /* this call's deltas */
    tp_buf reasoning;        /* all of it */
    tc_out calls;
    bool cut;                /* finish kept the streamed calls as they stood: one is not whole */
    uint64_t rng;
    /* streaming: the scan of the call region (pend, from its marker), the
     * calls found so far and this feed's deltas */
    tc_scan scan;
    struct ann {
        char *id, *name;
        size_t args_off, have;   /* the arguments' bytes in pend so far */
        size_t sent;             /* of them, released in deltas */
        bool no_args;            /* its call closed without arguments: they are {} */
        bool emitted;            /* its first delta went out */
    } *ann;
    size_t n_ann, cap_ann;
    tp_tc_delta *deltas;
    size_t n_deltas, cap_deltas;
    bool oom;
    /* control tokens that are pieces of the syntax, read as their text */
    int32_t ctl_id[8];
    const char *ctl_text[8];
    size_t n_ctl;
    /* A control-token marker lands where it was generated: after the text
     * bytes before it, some of which the stop check may still hold. fed
     * counts the text bytes given so far; a marker waits in mk until fed
     * reaches its place. */
    uint64_t fed;
    struct marker {
        uint64_t at;
        const char *text;
    } mk[8];
    size_t n_mk;
};

const char *tp_tc_family_name(tp_tc_family f)
{
    const tc_family_def *d = tc_family(f);
    return d ? d->name : "none";
}

int tp_tcsplit_new(const tp_tc_syntax *syn, const tp_tcsplit_opts *o, tp_tcsplit **out, tp_err *err)
{
    tp_tcsplit *s = calloc(1, sizeof *s);
    if (!s)
        return tp_err_set(err, TP_ENOMEM, "tool calls: out of memory");
    s->syn = *syn;
    s->o = *o;
    s->fam = o->tools ? tc_family(syn->family) : NULL;
    const tc_family_def *fam = tc_family(syn->family);
    s->think_open = fam && fam->think_open ? fam->think_open : "<think>";
    s->think_close = fam && fam->think_close ? fam->think_close : "</think>";
    s->frame = o->tools ? s->fam : fam && fam->channels ? fam : NULL;
    s->rng = o->id_seed ^ 0x9E3779B97F4A7C15ull;
    s->state = S_START;
    *out = s;
    return 0;
}

void tp_tcsplit_free(tp_tcsplit *s)
{
    if (!s)
        return;
    tp_buf_free(&s->pend);
    tp_buf_free(&s->out_content);
    tp_buf_free(&s->out_reasoning);
    tp_buf_free(&s->reasoning);
    for (size_t i = 0; i < s->calls.n_calls; i++)
        tc_call_release(&s->calls.calls[i]);
    free(s->calls.calls);
    tp_buf_free(&s->calls.content);
    for (size_t i = 0; i < s->n_ann; i++) {
        free(s->ann[i].id);
        free(s->ann[i].name);
    }
    free(s->ann);
    free(s->deltas);
    free(s);
}

/* Drop the first n bytes of pend. */
static void consume(tp_tcsplit *s, size_t n)
{
    if (!n)
        return;
    memmove(s->pend.data, s->pend.data + n, s->pend.len - n);
    s->pend.len -= n;
    if (s->pend.data)
        s->pend.data[s->pend.len] = 0;
}

static void emit_reasoning(tp_tcsplit *s, size_t n)
{
    tp_buf_add(&s->out_reasoning, s->pend.data, n);
    tp_buf_add(&s->reasoning, s->pend.data, n);
    consume(s, n);
}

static void emit_content(tp_tcsplit *s, size_t n)
{
    tp_buf_add(&s->out_content, s->pend.data, n);
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
        const char *const *list = pass ? (s->frame ? s->frame->strip : NULL) : s->fam ? s->fam->markers : NULL;
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
        const char *const *list = pass ? (s->frame ? s->frame->strip : NULL) : s->fam ? s->fam->markers : NULL;
        for (; list && *list; list++) {
            size_t t = tail_prefix(p, n, *list);
            if (t > hold)
                hold = t;
        }
    }
    return hold;
}

/* Does a marker still to come begin at p (p[0..n) a proper prefix of it)?
 * Seen whole, a marker wins over strip text at the same byte (harmony's
 * "<|start|>assistant" opens a call when " to=" follows it): in pieces the
 * strip text must wait until the marker is ruled out. */
static bool marker_may_follow(const tp_tcsplit *s, const char *p, size_t n)
{
    for (const char *const *l = s->fam ? s->fam->markers : NULL; l && *l; l++)
        if (prefix_of(p, n, *l))
            return true;
    return false;
}

/* Advance the state machine over pend; at_end: no more text comes. */
static void run(tp_tcsplit *s, bool at_end)
{
    for (;;) {
        const char *p = s->pend.data ? s->pend.data : "";
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
                p = s->pend.data ? s->pend.data : "";
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
            if (!m && at_end && s->frame && s->frame->channels) {
                /* a framed output cut inside a header (a length finish
                 * after <|start|>): the header's start is no content */
                size_t cut = 0;
                for (const char *const *l = s->frame->strip; l && *l; l++) {
                    size_t t = tail_prefix(p, n, *l);
                    cut = t > cut ? t : cut;
                }
                emit_content(s, n - cut);
                consume(s, cut);
                return;
            }
            if (!m) {
                emit_content(s, at_end ? n : n - held_tail(s, p, n));
                return;
            }
            emit_content(s, (size_t)(m - p));
            if (strip && !at_end && marker_may_follow(s, m, n - (size_t)(m - p)))
                return;
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
    if (s->pend.err || s->out_content.err || s->out_reasoning.err || s->reasoning.err || s->calls.oom || s->oom)
        return TP_ENOMEM;
    *content = s->out_content.len ? s->out_content.data : "";
    *content_len = s->out_content.len;
    *reasoning = s->out_reasoning.len ? s->out_reasoning.data : "";
    *reasoning_len = s->out_reasoning.len;
    return 0;
}

static char id_char(tp_tcsplit *s);

static char *new_id(tp_tcsplit *s)
{
    int k = s->fam->id_len;
    size_t pre = k ? 0 : 5;
    size_t len = pre + (size_t)(k ? k : 24);
    char *id = malloc(len + 1);
    if (!id)
        return NULL;
    memcpy(id, "call_", pre);
    for (size_t c = pre; c < len; c++)
        id[c] = id_char(s);
    id[len] = 0;
    return id;
}

static void add_delta(tp_tcsplit *s, size_t index, const char *id, const char *name, bool first, const char *args,
                      size_t n)
{
    if (s->n_deltas == s->cap_deltas) {
        size_t cap = s->cap_deltas ? s->cap_deltas * 2 : 4;
        tp_tc_delta *d = realloc(s->deltas, cap * sizeof *d);
        if (!d) {
            s->oom = true;
            return;
        }
        s->deltas = d;
        s->cap_deltas = cap;
    }
    s->deltas[s->n_deltas++] = (tp_tc_delta){index, id, name, first, n ? args : "", n};
}

/* Scan the held call region on from where the last scan stopped: a call
 * whose name became whole is announced, new argument bytes counted; emit:
 * they go out as deltas now (at finish they go out from the final calls). */
static void stream_calls(tp_tcsplit *s, bool emit)
{
    tc_scan_call c;
    while (!s->oom && tc_stream_scan(s->fam, s->pend.data, s->pend.len, s->o.parallel, &s->scan, &c)) {
        if (c.index == s->n_ann) {
            size_t nl = c.name_len;
            char *name = c.name_json ? tc_json_string(s->pend.data + c.name_off, c.name_len, &nl)
                                     : strndup(s->pend.data + c.name_off, c.name_len);
            if (name && !tc_valid_name(name, nl)) {
                free(name);
                s->scan.phase = TC_SCAN_DONE;   /* the parser will not take it: leave it to finish */
                return;
            }
            if (s->n_ann == s->cap_ann) {
                size_t cap = s->cap_ann ? s->cap_ann * 2 : 4;
                struct ann *a = realloc(s->ann, cap * sizeof *a);
                if (a) {
                    s->ann = a;
                    s->cap_ann = cap;
                }
            }
            char *id = name ? new_id(s) : NULL;
            if (!id || s->n_ann == s->cap_ann) {
                free(name);
                free(id);
                s->oom = true;
                return;
            }
            s->ann[s->n_ann++] = (struct ann){.id = id, .name = name};
        }
        struct ann *a = &s->ann[c.index];
        if (c.has_args) {
            a->args_off = c.args_off;
            a->have = c.args_len;
        }
        a->no_args = c.args_done && !c.has_args;
        if (emit && (!a->emitted || a->have > a->sent)) {
            add_delta(s, c.index, a->id, a->name, !a->emitted, s->pend.data + a->args_off + a->sent, a->have - a->sent);
            a->emitted = true;
            a->sent = a->have;
        }
        if (!c.done)
            return;
    }
}

int tp_tcsplit_controls(tp_tcsplit *s, const struct tp_tokenizer *tok)
{
    const char *pieces[8];
    size_t n = s->fam ? tp_toolcall_control_pieces(s->syn.family, pieces, 8) : 0;
    s->n_ctl = 0;
    for (size_t i = 0; i < n; i++) {
        int id = tp_tokenizer_control_id(tok, pieces[i], strlen(pieces[i]));
        if (id >= 0) {
            s->ctl_id[s->n_ctl] = id;
            s->ctl_text[s->n_ctl++] = pieces[i];
        }
    }
    return (int)s->n_ctl;
}

int tp_tcsplit_feed(tp_tcsplit *s, const char *text, size_t len, const char **content, size_t *content_len,
                    const char **reasoning, size_t *reasoning_len)
{
    return tp_tcsplit_feed_token(s, -1, text, len, 0, content, content_len, reasoning, reasoning_len);
}

/* Text bytes into pend, each waiting marker placed at its byte: never
 * inside a character (a held unfinished sequence may be published as
 * U+FFFD, longer than its raw bytes). */
static void put_text(tp_tcsplit *s, const char *text, size_t len)
{
    if (len == 0)
        text = ""; /* a marker token comes with no text: NULL + 0 is undefined */
    size_t i = 0;
    while (s->n_mk && s->mk[0].at <= s->fed + (len - i)) {
        size_t k = s->mk[0].at > s->fed ? (size_t)(s->mk[0].at - s->fed) : 0;
        while (i + k < len && ((unsigned char)text[i + k] & 0xC0) == 0x80)
            k++;
        tp_buf_add(&s->pend, text + i, k);
        tp_buf_puts(&s->pend, s->mk[0].text);
        i += k;
        s->fed += k;
        memmove(s->mk, s->mk + 1, --s->n_mk * sizeof *s->mk);
    }
    tp_buf_add(&s->pend, text + i, len - i);
    s->fed += len - i;
}

static const char *control_text(const tp_tcsplit *s, int32_t id)
{
    for (size_t i = 0; id >= 0 && i < s->n_ctl; i++)
        if (s->ctl_id[i] == id)
            return s->ctl_text[i];
    return NULL;
}

int tp_tcsplit_feed_token(tp_tcsplit *s, int32_t id, const char *text, size_t len, size_t held,
                          const char **content, size_t *content_len, const char **reasoning, size_t *reasoning_len)
{
    tp_buf_reset(&s->out_content);
    tp_buf_reset(&s->out_reasoning);
    s->n_deltas = 0;
    put_text(s, text, len);
    const char *mt = control_text(s, id);
    /* (8 markers waiting on one held stop prefix: no model writes that;
     * the ninth goes in at once) */
    if (mt && (held || s->n_mk) && s->n_mk < sizeof s->mk / sizeof *s->mk)
        s->mk[s->n_mk++] = (struct marker){s->fed + held, mt};
    else if (mt)
        tp_buf_puts(&s->pend, mt);
    if (!s->pend.err) {
        run(s, false);
        if (s->state == S_CALLS)
            stream_calls(s, true);
    }
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

/* The parsed calls o continue what was streamed: each call that went out
 * is there, under its name, its arguments starting with the bytes sent. */
static bool continues(const tp_tcsplit *s, const tc_out *o)
{
    for (size_t k = 0; k < s->n_ann; k++) {
        const struct ann *a = &s->ann[k];
        if (!a->emitted)
            continue;
        if (k >= o->n_calls)
            return false;
        const tp_tc_call *c = &o->calls[k];
        if (strcmp(c->name, a->name) || c->arguments_len < a->sent ||
            memcmp(c->arguments, s->pend.data + a->args_off, a->sent))
            return false;
    }
    return true;
}

/* What streamed, as the final calls: the text broke the syntax (or
 * stopped) after a call went out, and a call once out stays one. */
static void streamed_calls(tp_tcsplit *s, tc_out *o)
{
    for (size_t k = 0; k < s->n_ann; k++) {
        const struct ann *a = &s->ann[k];
        if (tc_add_call(o, a->name, strlen(a->name), a->no_args ? NULL : a->have ? s->pend.data + a->args_off : "",
                        a->have))
            o->oom = true;
    }
}

static void drop_calls(tc_out *o)
{
    for (size_t i = 0; i < o->n_calls; i++)
        tc_call_release(&o->calls[i]);
    free(o->calls);
    o->calls = NULL;
    o->n_calls = o->cap_calls = 0;
}

int tp_tcsplit_finish(tp_tcsplit *s, const char *text, size_t len, const char **content, size_t *content_len,
                      const char **reasoning, size_t *reasoning_len)
{
    return tp_tcsplit_finish_token(s, -1, text, len, content, content_len, reasoning, reasoning_len);
}

int tp_tcsplit_finish_token(tp_tcsplit *s, int32_t id, const char *text, size_t len, const char **content,
                            size_t *content_len, const char **reasoning, size_t *reasoning_len)
{
    tp_buf_reset(&s->out_content);
    tp_buf_reset(&s->out_reasoning);
    s->n_deltas = 0;
    put_text(s, text, len);
    /* a marker still waiting came after text a stop string cut */
    s->n_mk = 0;
    const char *mt = control_text(s, id);
    if (mt)
        tp_buf_puts(&s->pend, mt);
    run(s, true);
    if (s->state == S_CALLS && s->pend.len) {
        stream_calls(s, false);
        bool streamed = s->n_ann && s->ann[0].emitted;
        tc_out o = {0};
        int rc = s->fam->parse(s->pend.data, s->pend.len, &o);
        if (!rc && !o.oom && !s->o.parallel)
            while (o.n_calls > 1)
                tc_call_release(&o.calls[--o.n_calls]);
        if ((rc || o.oom || !continues(s, &o)) && streamed) {
            drop_calls(&o);
            tp_buf_reset(&o.content);
            o.oom = false;
            streamed_calls(s, &o);
            s->cut = true;
            rc = 0;
        }
        if (rc || o.oom) {
            /* not calls after all: what was held is the model's text */
            emit_content(s, s->pend.len);
            drop_calls(&o);
        } else {
            tp_buf_add(&s->out_content, o.content.data, o.content.len);
            s->calls.calls = o.calls;
            s->calls.n_calls = o.n_calls;
            for (size_t k = 0; k < o.n_calls; k++) {
                tp_tc_call *c = &o.calls[k];
                bool out = k < s->n_ann && s->ann[k].emitted;
                c->id = k < s->n_ann ? strdup(s->ann[k].id) : new_id(s);
                if (!c->id) {
                    s->calls.oom = true;
                    break;
                }
                size_t sent = out ? s->ann[k].sent : 0;
                if (!out || c->arguments_len > sent)
                    add_delta(s, k, c->id, c->name, !out, c->arguments + sent, c->arguments_len - sent);
            }
            tp_buf_reset(&s->pend);
        }
        tp_buf_free(&o.content);
    }
    return take(s, content, content_len, reasoning, reasoning_len);
}

size_t tp_tcsplit_deltas(const tp_tcsplit *s, const tp_tc_delta **deltas)
{
    *deltas = s->deltas;
    return s->n_deltas;
}

size_t tp_tcsplit_calls(const tp_tcsplit *s, const tp_tc_call **calls)
{
    *calls = s->calls.calls;
    return s->calls.n_calls;
}

bool tp_tcsplit_calls_whole(const tp_tcsplit *s)
{
    return !s->cut;
}

const char *tp_tcsplit_reasoning(const tp_tcsplit *s, size_t *len)
{
    *len = s->reasoning.len;
    return s->reasoning.len ? s->reasoning.data : "";
}
