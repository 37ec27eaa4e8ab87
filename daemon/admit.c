/* Admission and queues: a new job is tokenized (TOKENIZE at the least
 * loaded tokenize worker) unless it came as ids, then waits its turn
 * (first come, first served) for a forward, sample and stop worker with
 * room; admitting it fits its max_tokens to the context and pins it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admit.h"
#include "guess.h"
#include "choose.h"
#include "log.h"
#include "outbox.h"
#include "pin.h"
#include "registry.h"
#include "route.h"
#include "tokpipe/rand.h"
#include "tokpipe/zwire.h"

static void dispatch_tokenize(broker *b, bjob *j)
{
    bool suspect = jobs_suspect(j);
    int wi = choose_tokenize(b, suspect);
    if (wi < 0)
        return;
    tp_msg m;
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_TOKENIZE);
    m.task = j->tok_task = out_task(b);
    m.tokenize.slot = j->slot;
    m.tokenize.text = (tp_str){j->prompt_text, j->prompt_len};
    m.tokenize.add_bos = true;
    m.tokenize.parse_special = j->parse_special;
    m.tokenize.messages = j->messages;
    m.tokenize.n_messages = j->n_messages;
    m.tokenize.tools = j->tools;
    if (j->reasoning_effort[0])
        m.tokenize.reasoning_effort = tp_str_of(j->reasoning_effort);
    if (out_worker(b, wi, &m))
        return;   /* it is marked gone: lost at the next safe point, the prompt goes elsewhere */
    j->tok_worker = wi;
    b->workers[wi].tok_inflight++;
    b->workers[wi].tok_suspect = suspect;
    if (suspect)
        blog("job %s: tokenize continues on worker %s after a lost worker, alone", j->id, b->workers[wi].instance);
}

/* A rendered conversation ends when the model ends its turn: the
 * template's end-of-turn ids join the job's stop ids (once each). */
static int chat_add_stop_ids(bjob *j, const tp_m_tokenized *t)
{
    tp_params *p = &j->params;
    /* the stop ids' block also holds logit_bias (front.c copy_request):
     * build the grown block whole and move the bias along */
    size_t nb = p->logit_bias.n, ni = p->n_stop_token_ids + t->n_stop_ids + 1;
    int32_t *ids = malloc((ni + 2 * nb) * sizeof *ids);
    if (!ids)
        return TP_ENOMEM;
    if (p->n_stop_token_ids)
        memcpy(ids, p->stop_token_ids, p->n_stop_token_ids * sizeof *ids);
    if (nb) {
        memcpy(ids + ni, p->logit_bias.ids, nb * sizeof *ids);
        memcpy(ids + ni + nb, p->logit_bias.values, nb * sizeof(float));
        p->logit_bias.ids = ids + ni;
        p->logit_bias.values = (float *)(void *)(ids + ni + nb);
    }
    free(p->stop_token_ids);
    p->stop_token_ids = ids;
    for (size_t i = 0; i < t->n_stop_ids; i++) {
        bool have = false;
        for (size_t k = 0; k < p->n_stop_token_ids && !have; k++)
            have = ids[k] == t->stop_ids[i];
        if (!have)
            ids[p->n_stop_token_ids++] = t->stop_ids[i];
    }
    p->set |= TP_P_STOP_TOKEN_IDS;   /* sent to the stop stage only when marked set */
    return 0;
}

/* Does msg start with field name f followed by ':' or '[' (a field path)? */
static bool field_prefix(tp_str msg, const char *f)
{
    size_t n = strlen(f);
    return msg.len > n && !memcmp(msg.ptr, f, n) && (msg.ptr[n] == ':' || msg.ptr[n] == '[');
}

void admit_on_tokenized(broker *b, int wi, const tp_msg *m)
{
    bjob *j = jobs_by_slot(&b->jt, m->tokenized.slot);
    if (!j || j->state != J_TOKENIZE || j->tok_task != m->task || j->tok_worker != wi)
        return;   /* late reply for a cancelled or re-queued job */
    registry_tok_done(b, wi);
    j->tok_worker = -1;
    jobs_progress(j, TP_SI_TOKENIZE);
    if (m->status == TP_ST_TOO_LARGE) {
        /* the prompt (a conversation as the template renders it) is past
         * what one prompt may be: the client's error, found after the ACK,
         * as a prompt past the context is; the message names the field */
        char why[TP_ERR_MSG_MAX];
        snprintf(why, sizeof why, "%.*s", (int)m->error.len, m->error.ptr);
        j->rejected = TP_CODE_PROMPT_SIZE;
        pin_fail(b, j, why);
        return;
    }
    if (m->status != TP_ST_OK) {
        char why[TP_ERR_MSG_MAX];
        /* a conversation the template cannot render is the request's fault and its
         * message already names the field (PROTOCOL.md: the error starts with
         * `messages: ` or `tools`); anything else is the tokenize stage's */
        bool names_field = field_prefix(m->error, "messages") || field_prefix(m->error, "tools");
        snprintf(why, sizeof why, "%s%.*s", names_field ? "" : "tokenize: ", (int)m->error.len, m->error.ptr);
        pin_fail(b, j, why);
        return;
    }
    const bworker *model = registry_model(b);
    uint32_t seq_len = model ? model->seq_len : 0;
    /* truncate_prompt_tokens keeps the last N ids (vLLM's rule) */
    size_t n = m->tokenized.ids.n, skip = 0;
    if ((j->params.set & TP_P_TRUNCATE_PROMPT) && n > (size_t)j->params.truncate_prompt_tokens)
        skip = n - (size_t)j->params.truncate_prompt_tokens;
    n -= skip;
    if (n == 0 || (seq_len && n >= seq_len)) {
        char why[160];
        snprintf(why, sizeof why, "%s: %zu tokens, the model's context holds %u", j->n_messages ? "messages" : "prompt",
                 n, seq_len);
        /* FINISH says so with both counts and its own code, before any TOKEN */
        j->n_prompt = (uint32_t)n;
        j->rejected = n ? TP_CODE_CONTEXT : NULL;
        j->context_refused = n ? seq_len : 0;
        pin_fail(b, j, why);
        return;
    }
    j->prompt = malloc(n * sizeof *j->prompt);
    if (!j->prompt) {
        pin_fail(b, j, "broker out of memory");
        return;
    }
    memcpy(j->prompt, (const char *)m->tokenized.ids.data + skip * sizeof *j->prompt, n * sizeof *j->prompt);
    j->n_prompt = (uint32_t)n;
    if (j->n_messages && m->tokenized.n_stop_ids && chat_add_stop_ids(j, &m->tokenized)) {
        pin_fail(b, j, "broker out of memory");
        return;
    }
    jobs_drop_request(j);
    j->state = J_ADMIT;
}

/* Pin j to a forward, sample and stop worker; false if one is missing. */
static bool admit(broker *b, bjob *j)
{
    int f = route_forward(b, j);
    if (f < 0)
        return false;
    int s = choose_sample(b, f);
    int t = choose_stop(b);
    if (s < 0 || t < 0)
        return false;
    const bworker *fw = &b->workers[f];
    /* The context window bounds what can be generated: past it the job
     * ends as `length`, as if max_tokens were smaller (tokpipe run does the
     * same, so both give the same tokens). */
    if (j->n_prompt >= fw->seq_len) {
        char why[128];
        snprintf(why, sizeof why, "prompt: %u tokens, the model's context holds %u", j->n_prompt, fw->seq_len);
        j->rejected = TP_CODE_CONTEXT;
        j->context_refused = fw->seq_len;
        pin_fail(b, j, why);
        return true;
    }
    int32_t room = (int32_t)(fw->seq_len - j->n_prompt);
    if (j->params.max_tokens > room)
        j->params.max_tokens = room;
    if (j->params.min_tokens > j->params.max_tokens)
        j->params.min_tokens = j->params.max_tokens;
    /* a sampler rebuilt after a loss must draw what the lost one would
     * have: the job's random stream needs a seed that outlives the worker */
    if (!(j->params.set & TP_P_SEED)) {
        j->params.seed = tp_random_u64();
        j->params.set |= TP_P_SEED;
    }
    guess_init(b, j);
    j->state = J_RUNNING;
    j->phase = P_READY;
    j->t_start_wall = tp_wall_us();
    pin_forward(b, j, f);
    route_note(b, f, j->prompt, j->n_prompt, NULL, 0);
    pin_sample(b, j, s);
    pin_stop(b, j, t);
    return true;
}

void admit_start(broker *b, bjob *j)
{
    j->state = j->prompt ? J_ADMIT : J_TOKENIZE;
    if (j->state == J_TOKENIZE)
        dispatch_tokenize(b, j);
}

void admit_waiting(broker *b)
{
    for (;;) {
        bjob *first = NULL;
        for (uint32_t i = 0; i < b->jt.cap; i++) {
            bjob *j = &b->jt.jobs[i];
            if (j->state == J_TOKENIZE && j->tok_worker < 0)
                dispatch_tokenize(b, j);
            if (j->state == J_ADMIT && (!first || j->seqno < first->seqno))
                first = j;
        }
        if (!first || !admit(b, first))
            return;
    }
}
