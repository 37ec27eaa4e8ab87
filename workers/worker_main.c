/* bin/tokpipe-worker: serves one or more pipeline stages for the broker.
 *
 * Runtime (Paranoid Pirate / MDP worker): connect a DEALER to the broker's
 * backend, send READY, wait for WELCOME, then serve tasks; heartbeat when
 * idle; when the broker is silent for `liveness` intervals or says
 * DISCONNECT, drop every slot's state, reconnect on a new socket with
 * exponential backoff and register again. The stop stage's events go out on
 * a PUB socket connected to the broker's publish endpoint. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tokpipe/chat_template.h"
#include "tokpipe/load.h"
#include "tokpipe/toolcall.h"
#include "tokpipe/rand.h"
#include "tokpipe/config.h"
#include "tokpipe/draft.h"
#include "tokpipe/ggml_types.h"
#include "tokpipe/model.h"
#include "tokpipe/stage.h"
#include "tokpipe/grammar.h"
#include "tokpipe/isa.h"
#include "tokpipe/proc.h"
#include "tokpipe/tokenizer.h"
#include "tokpipe/zsec.h"
#include "tokpipe/zwire.h"

#define TP_WORKER_MAX_EOS 32
#define POISON_MAX_MARKED 16

/* Test hook (tests/it_poison.c), off unless $TP_TEST_POISON is set to
 * STAGE:ACTION:AT:MARK. It makes this worker hang (ACTION `hang`: answer
 * nothing, heartbeats included, until SIGTERM) or crash (`crash`: SIGKILL
 * itself) on the message that brings a marked job to AT, every time, as a
 * job that breaks a stage at some point of its sequence would:
 *   forward  a job whose prompt's first chunk holds token id MARK, on the
 *            STEP whose item would take its sequence past AT positions;
 *   stop     a job whose id contains MARK, on the STOP_STEP with its
 *            candidate number AT (0 = the first; replayed ones count). */
typedef struct poison_hook {
    int si;                          /* TP_SI_FORWARD or TP_SI_STOP; -1: off */
    bool crash;
    uint32_t at;
    int32_t token;                   /* forward's MARK */
    char id_part[TP_PROTO_MAX_JOB_ID + 1];   /* stop's MARK */
    struct {
        uint32_t slot, index;        /* stop: candidates of the job seen so far */
    } marked[POISON_MAX_MARKED];
    int n_marked;
} poison_hook;

typedef struct worker {
    tp_config cfg;
    tp_zsec_client sec;              /* CURVE client keys (security.*) */
    unsigned stages;                 /* 1u << TP_SI_* */
    char instance[TP_PROTO_MAX_NAME + 1];
    tp_model *model;
    tp_tokenizer *tok;
    int eos[TP_WORKER_MAX_EOS];      /* the model's end ids and the vocabulary's end-of-generation ids */
    int n_eos;
    tp_tokenize_stage *tokenize;
    tp_forward_stage *forward;
    tp_sample_stage *sample;
    tp_stop_stage *stop;
    tp_model *draft_model;           /* the draft stage's (speculative.draft_model) */
    tp_draft_stage *draft;
    void *zctx, *dealer, *pub;
    int attempt;                     /* connections tried: odd ones go to standby.peer_back, if set */
    uint64_t incarnation;
    int heartbeat_ms, liveness;
    int64_t last_recv, last_send;
    uint64_t progress;
    volatile sig_atomic_t *quit;
    bool chat_template;                     /* a tokenize stage with a usable chat template */
    tp_tc_family tool_family;               /* its tool-call syntax (READY: the broker builds call grammars) */
    bool think_open;                        /* ... whose generation prompt opens the thinking */
    int32_t *sp_ids;                        /* READY's special tokens, built at the first READY */
    unsigned char *sp_text;                 /* ... and their pieces (tp_proto_special_split) */
    size_t n_sp, sp_text_len;
    bool sp_built;
    poison_hook poison;                     /* tests only: $TP_TEST_POISON */
} worker;

static volatile sig_atomic_t g_quit;

static void on_signal(int sig)
{
    (void)sig;
    g_quit = 1;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: tokpipe-worker --stage tokenize|forward|sample|stop|draft[,...] [--config FILE] [--instance NAME]\n"
            "\n"
            "Serve one or more pipeline stages for tokpiped: connect to the broker's backend\n"
            "endpoint (from the config), register, and process tasks until SIGTERM/SIGINT.\n"
            "Several stages in one process (e.g. forward,sample) skip a hop. The draft stage\n"
            "(speculative decoding's guesses) runs speculative.draft_model, alone in its process.\n"
            "\n"
            "  --stage LIST     stages to serve, joined by ',' or ':', optional .N suffix (required;\n"
            "                   --stages is the same)\n"
            "  --config FILE    configuration (default %s; missing default = built-in defaults)\n"
            "  --instance NAME  name shown in the broker's logs (default STAGE.PID)\n"
            "  --help           this text\n"
            "\n"
            "Exit status: 0 after SIGTERM/SIGINT, 2 bad flags or configuration, 3 the model or its\n"
            "vocabulary cannot be loaded (tokpiped stops restarting a worker that keeps exiting 2 or 3).\n",
            TP_CONFIG_DEFAULT_PATH);
}

/* ---- io callbacks for the stage glue ----------------------------------- */

static int io_reply(void *ctx, const tp_msg *m)
{
    worker *w = ctx;
    tp_err e;
    int rc = tp_zsend_msg(w->dealer, NULL, 0, m, &e);
    if (rc)
        fprintf(stderr, "tokpipe-worker %s: reply %s: %s\n", w->instance, tp_cmd_name(m->family, m->cmd), e.msg);
    else
        w->last_send = tp_now_ms();
    return rc == TP_EIO ? 0 : rc;   /* a lost reply is the broker's timeout to handle */
}

static int io_publish(void *ctx, const tp_msg *m)
{
    worker *w = ctx;
    tp_err e;
    tp_wire wire;
    int rc = tp_proto_encode(m, &wire, &e);
    if (rc) {
        fprintf(stderr, "tokpipe-worker %s: event: %s\n", w->instance, e.msg);
        return 0;
    }
    /* PUB never blocks: at the high-water mark it drops, which the
     * subscriber sees as a seq gap (and the broker's STATUS covers). */
    tp_zsend(w->pub, NULL, 0, &wire, 0);
    tp_wire_free(&wire);
    return 0;
}

/* ---- setup --------------------------------------------------------------- */

/* The chat template for SUBMIT messages (tp_load's: model.chat_template
 * if set, else the vocabulary's or model's own tokenizer.chat_template);
 * without one, messages are refused and the reason says what to set. The
 * stage takes the template; the stop stage reads its tool-call syntax. */
static int load_chat(worker *w, tp_loaded *ld, tp_err *err)
{
    tp_chat_template *t = ld->tmpl;
    if (t) {
        tp_tc_syntax syn;
        tp_toolcall_syntax(t, ld->bos_text, ld->eos_text, &syn);
        if (w->stop)
            tp_stop_stage_set_syntax(w->stop, &syn);
        w->tool_family = syn.family;
        w->think_open = syn.thinks && syn.think_open;
    }
    w->chat_template = w->tokenize && t != NULL;   /* for INFO: SUBMIT messages can be used */
    if (!w->tokenize)
        return 0;
    ld->tmpl = NULL;
    return tp_tokenize_stage_set_chat(w->tokenize, t, ld->bos_text, ld->eos_text, ld->template_why, err);
}

/* The draft stage: speculative.draft_model, refused unless its
 * vocabulary is the target model's (w->model). It serves no other stage:
 * its READY speaks for the draft model. */
static int load_draft(worker *w, tp_err *err)
{
    const tp_config *c = &w->cfg;
    if (w->stages != (1u << TP_SI_DRAFT))
        return tp_err_set(err, TP_EINVAL, "--stage: the draft stage runs its own model and fuses with no other stage");
    if (!*c->spec_draft_model)
        return tp_err_set(err, TP_EINVAL, "the draft stage needs speculative.draft_model (none is configured)");
    tp_err e;
    int rc = tp_model_load(c->spec_draft_model, &w->draft_model, &e);
    if (rc)
        return tp_err_set(err, rc, "speculative.draft_model %s: %s", c->spec_draft_model, e.msg);
    if ((rc = tp_draft_check(tp_model_get_config(w->model)->vocab_size, w->draft_model, c->spec_draft_model, err)))
        return rc;
    return tp_draft_stage_new(w->draft_model, c->kv_slots, 0, c->max_batch_tokens, c->forward_threads, &w->draft,
                              err);
}

/* model.tokenizer: a llama2.c tokenizer.bin, or any GGUF file that embeds a
 * vocabulary (the model file itself for GGUF models). The draft stage
 * loads its own model beside the target's (whose vocabulary it must
 * share). */
static int load_files(worker *w, tp_loaded *ld, tp_err *err)
{
    const tp_config *c = &w->cfg;
    bool text = w->stages & ((1u << TP_SI_TOKENIZE) | (1u << TP_SI_STOP));
    tp_load_spec ls = {.model = c->model_path, .tokenizer = c->tokenizer_path,
                       .chat_template = c->chat_template_path, .what = TP_LOAD_MODEL};
    if (text)
        ls.what |= TP_LOAD_TOKENIZER | TP_LOAD_TEMPLATE;
    else if (w->stages & (1u << TP_SI_SAMPLE))
        ls.what |= TP_LOAD_TOKENIZER_IF_ANY; /* a sampler without one only refuses grammar jobs */
    int rc = tp_load(&ls, ld, err);
    if (rc)
        return rc;
    w->model = ld->model;
    w->tok = ld->tok;
    ld->model = NULL;
    ld->tok = NULL;
    if (!w->tok && (w->stages & (1u << TP_SI_SAMPLE))) {
        /* a GGUF model's vocabulary names its end-of-generation ids, which
         * the sampler needs too (min_tokens bans them) */
        if (tp_model_get_format(w->model) == TP_MODEL_GGUF)
            return tp_err_set(err, TP_EINVAL, "%s", ld->tokenizer_why);
        fprintf(stderr, "tokpipe-worker %s: no vocabulary for grammars (%s)\n", w->instance, ld->tokenizer_why);
    }
    return 0;
}

/* The stages this worker runs, over the model and vocabulary loaded. */
static int build_stages(worker *w, tp_loaded *ld, tp_err *err)
{
    const tp_config *c = &w->cfg;
    const tp_model_config *mc = tp_model_get_config(w->model);
    int rc;
    if ((w->stages & (1u << TP_SI_TOKENIZE)) && (rc = tp_tokenize_stage_new(w->tok, &w->tokenize, err)))
        return rc;
    const int *model_eos;
    int n_model_eos = tp_model_eos_ids(w->model, &model_eos);
    w->n_eos = tp_tokenizer_merge_eog(w->tok, model_eos, n_model_eos, w->eos, TP_WORKER_MAX_EOS);
    const int *eos = w->eos;
    int n_eos = w->n_eos;
    if ((w->stages & (1u << TP_SI_SAMPLE)) &&
        (rc = tp_sample_stage_new(c->max_concurrent_jobs, mc->vocab_size, eos, n_eos, &w->sample, err)))
        return rc;
    if (w->sample) {
        tp_grammar_limits gl;
        tp_gengine_limits el;
        tp_grammar_limits_from_config(c, &gl, &el);
        tp_sample_stage_set_grammar(w->sample, w->tok, &gl, &el);
    }
    if ((w->stages & (1u << TP_SI_FORWARD)) &&
        (rc = tp_forward_stage_new(w->model, c->kv_slots, c->kv_max_pos, c->max_batch_tokens, c->forward_threads,
                                   &w->forward, err)))
        return rc;
    if (w->forward && (rc = tp_forward_stage_set_kv_type(w->forward, (tp_kv_type)c->kv_type, err)))
        return rc;
    if (w->forward && (!c->prefix_cache || c->prefix_cache_extra_mb)) {
        /* after kv_type: a page's size depends on it */
        double extra = (double)c->prefix_cache_extra_mb * 1e6 / (double)tp_forward_stage_page_bytes(w->forward);
        if (extra > TP_FORWARD_MAX_EXTRA_PAGES)
            extra = TP_FORWARD_MAX_EXTRA_PAGES;
        if ((rc = tp_forward_stage_set_prefix_cache(w->forward, c->prefix_cache, (int)extra, err)))
            return rc;
    }
    if (w->forward && c->forward_kernel != TP_FWD_KERNEL_INVARIANT) {
        if ((rc = tp_forward_stage_set_kernel(w->forward, (tp_fwd_kernel)c->forward_kernel, err)))
            return rc;
        fprintf(stderr, "tokpipe-worker %s: forward kernel %s (not batch invariant)\n", w->instance,
                tp_fwd_kernel_name((tp_fwd_kernel)c->forward_kernel));
    }
    if (w->forward && w->sample)
        tp_forward_stage_set_sampler(w->forward, w->sample);
    if (w->stages & (1u << TP_SI_STOP)) {
        tp_stop_stage_limits lim = {c->max_concurrent_jobs, c->max_stop_strings, c->max_stop_len};
        if ((rc = tp_stop_stage_new(w->tok, eos, n_eos, &lim, &w->stop, err)))
            return rc;
        tp_grammar_limits gl;
        tp_gengine_limits el;
        tp_grammar_limits_from_config(c, &gl, &el);
        tp_stop_stage_set_grammar_limits(w->stop, &gl, &el);
    }
    return w->tokenize || w->stop ? load_chat(w, ld, err) : 0;
}

static int load_stages(worker *w, tp_err *err)
{
    tp_loaded ld;
    int rc = load_files(w, &ld, err);
    if (rc)
        return rc;
    if (w->stages & (1u << TP_SI_DRAFT)) {
        tp_loaded_free(&ld);
        return load_draft(w, err);
    }
    rc = build_stages(w, &ld, err);
    tp_loaded_free(&ld);
    return rc;
}

static void free_stages(worker *w)
{
    tp_tokenize_stage_free(w->tokenize);
    tp_forward_stage_free(w->forward);
    tp_sample_stage_free(w->sample);
    tp_stop_stage_free(w->stop);
    tp_draft_stage_free(w->draft);
    tp_model_free(w->draft_model);
    tp_tokenizer_free(w->tok);
    tp_model_free(w->model);
    free(w->sp_ids);
    free(w->sp_text);
    w->sp_ids = NULL, w->sp_text = NULL;
    w->n_sp = w->sp_text_len = 0;
    w->sp_built = false;
}

/* READY's special tokens: every control, user-defined and unknown token
 * whose piece a grammar can name (UTF-8, at most TP_PROTO_MAX_NAME bytes),
 * as many as the vocabulary has. -1 when out of memory. */
static int build_specials(worker *w)
{
    if (w->sp_built || !w->tok)
        return 0;
    int vocab = tp_tokenizer_vocab_size(w->tok);
    size_t n = 0, bytes = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int id = 0; id < vocab; id++) {
            int t = tp_tokenizer_token_type(w->tok, id);
            size_t len;
            const char *piece = tp_tokenizer_piece(w->tok, id, &len);
            if (!((t == TP_TOKEN_CONTROL || t == TP_TOKEN_USER_DEFINED || t == TP_TOKEN_UNKNOWN) && piece &&
                  len <= TP_PROTO_MAX_NAME && tp_proto_utf8_valid(piece, len)))
                continue;
            if (pass == 1) {
                w->sp_ids[w->n_sp++] = id;
                w->sp_text[w->sp_text_len++] = (unsigned char)len;
                memcpy(w->sp_text + w->sp_text_len, piece, len);
                w->sp_text_len += len;
            }
            n++, bytes += 1 + len;
        }
        if (pass == 0) {
            free(w->sp_ids);
            free(w->sp_text);
            w->sp_ids = malloc((n + 1) * sizeof *w->sp_ids);
            w->sp_text = malloc(bytes + 1);
            if (!w->sp_ids || !w->sp_text)
                return -1;
        }
    }
    w->sp_built = true;
    return 0;
}

static void reset_stages(worker *w)
{
    if (w->forward)
        tp_forward_stage_reset(w->forward);
    if (w->sample)
        tp_sample_stage_reset(w->sample);
    if (w->stop)
        tp_stop_stage_reset(w->stop);
    if (w->draft)
        tp_draft_stage_reset(w->draft);
}

static void set_common_opts(worker *w, void *s)
{
    int linger = w->cfg.linger_ms, hwm = w->cfg.sndhwm;
    int64_t maxmsg = w->cfg.max_msg_bytes;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
}

static int send_ready(worker *w)
{
    tp_msg m;
    tp_msg_init(&m, TP_FAM_WRK, TP_CMD_READY);
    tp_m_ready *r = &m.ready;
    /* a draft worker speaks for its draft model: the broker checks its
     * vocabulary against the target's */
    const tp_model *model = w->draft ? w->draft_model : w->model;
    const tp_model_config *mc = tp_model_get_config(model);
    r->stages = w->stages;
    r->instance = tp_str_of(w->instance);
    r->incarnation = w->incarnation;
    r->capacity = w->forward ? (uint32_t)tp_forward_stage_kv_slots(w->forward)
                  : w->draft ? (uint32_t)tp_draft_stage_kv_slots(w->draft)
                             : (uint32_t)w->cfg.max_concurrent_jobs;
    r->heartbeat_ms = (uint32_t)w->cfg.heartbeat_ms;
    r->model_id = tp_str_of(tp_model_identity(model));
    if (r->model_id.len > TP_PROTO_MAX_MODEL_ID)
        r->model_id.len = TP_PROTO_MAX_MODEL_ID;
    r->vocab_size = (uint32_t)mc->vocab_size;
    r->bos_id = w->tok ? tp_tokenizer_bos_id(w->tok) : 1;
    r->eos_id = w->tok ? tp_tokenizer_eos_id(w->tok) : 2;
    r->seq_len = w->forward ? (uint32_t)tp_forward_stage_max_positions(w->forward)
                 : w->draft ? (uint32_t)tp_draft_stage_max_positions(w->draft)
                            : (uint32_t)mc->seq_len;
    r->max_batch_tokens = w->forward ? (uint32_t)tp_forward_stage_max_batch_tokens(w->forward) : 0;
    /* For INFO: the ids that end generation (the stop stage's set), the
     * weights' type (the first layer's FFN, the bulk of a model whose
     * matrices mix types) and the special tokens. */
    int32_t eog32[TP_WORKER_MAX_EOS];
    for (int i = 0; i < w->n_eos; i++)
        eog32[i] = w->eos[i];
    r->eog_ids = eog32;
    r->n_eog_ids = (size_t)w->n_eos;
    const tp_model_weights *mw = tp_model_get_weights(model);
    const tp_layer_weights *l0 = mw && mw->layers ? &mw->layers[0] : NULL;
    const tp_ggml_type_info *wt = l0 ? tp_ggml_type(l0->w1_exps ? l0->w1_exps[0].type : l0->m.w1.type) : NULL;
    r->weight_type = tp_str_of(wt ? wt->name : "");
    r->chat_template = w->chat_template;
    if (w->chat_template)
        r->tool_syntax = tp_str_of(tp_tc_family_name(w->tool_family));
    r->think_open = w->chat_template && w->think_open;
    if (build_specials(w))
        fprintf(stderr, "tokpipe-worker %s: READY: out of memory for the special tokens\n", w->instance);
    if (w->sp_built && w->n_sp) {
        r->special_ids = (tp_raw){w->sp_ids, w->n_sp};
        r->special_text = (tp_raw){w->sp_text, w->sp_text_len};
    }
    tp_err e;
    int rc = tp_zsend_msg(w->dealer, NULL, 0, &m, &e);
    if (rc)
        fprintf(stderr, "tokpipe-worker %s: READY: %s\n", w->instance, e.msg);
    w->last_send = tp_now_ms();
    return rc;
}

static void send_simple(worker *w, uint8_t cmd, const char *reason)
{
    tp_msg m;
    tp_msg_init(&m, TP_FAM_WRK, cmd);
    if (cmd == TP_CMD_HEARTBEAT) {
        m.heartbeat.progress = w->progress;
    } else {
        m.disconnect.reason = tp_str_of(reason);
    }
    tp_err e;
    tp_zsend_msg(w->dealer, NULL, 0, &m, &e);
    w->last_send = tp_now_ms();
}

/* ---- the poison test hook (poison_hook) -------------------------------------- */

/* $TP_TEST_POISON into h; 0, or -1 when it is set but malformed. */
static int poison_parse(poison_hook *h, const char *spec)
{
    memset(h, 0, sizeof *h);
    h->si = -1;
    if (!spec || !*spec)
        return 0;
    char stage[16], action[16], mark[TP_PROTO_MAX_JOB_ID + 1];
    unsigned at;
    if (sscanf(spec, "%15[^:]:%15[^:]:%u:%64s", stage, action, &at, mark) != 4)
        return -1;
    h->si = !strcmp(stage, "forward") ? TP_SI_FORWARD : !strcmp(stage, "stop") ? TP_SI_STOP : -1;
    h->crash = !strcmp(action, "crash");
    h->at = at;
    h->token = (int32_t)atoi(mark);
    snprintf(h->id_part, sizeof h->id_part, "%s", mark);
    return h->si < 0 || (!h->crash && strcmp(action, "hang")) ? -1 : 0;
}

static int poison_find(const poison_hook *h, uint32_t slot)
{
    for (int i = 0; i < h->n_marked; i++)
        if (h->marked[i].slot == slot)
            return i;
    return -1;
}

static void poison_unmark(poison_hook *h, uint32_t slot)
{
    int i = poison_find(h, slot);
    if (i >= 0)
        h->marked[i] = h->marked[--h->n_marked];
}

static void poison_mark(poison_hook *h, uint32_t slot, uint32_t index)
{
    if (poison_find(h, slot) < 0 && h->n_marked < POISON_MAX_MARKED)
        h->marked[h->n_marked++].slot = slot;
    int i = poison_find(h, slot);
    if (i >= 0)
        h->marked[i].index = index;
}

/* Does m bring a marked job to the hook's point? Marks jobs as it goes. */
static bool poison_due(poison_hook *h, const tp_msg *m)
{
    if (h->si == TP_SI_FORWARD) {
        if (m->cmd == TP_CMD_SEQ_OPEN || m->cmd == TP_CMD_SEQ_CLOSE)
            poison_unmark(h, m->slot.slot);
        if (m->cmd != TP_CMD_STEP)
            return false;
        size_t off = 0;
        for (uint32_t i = 0; i < m->step.n; i++) {
            uint32_t slot = tp_raw_u32(m->step.slots, i), pos = tp_raw_u32(m->step.pos, i);
            uint32_t nt = tp_raw_u32(m->step.ntok, i);
            for (uint32_t k = 0; pos == 0 && k < nt; k++)
                if (tp_raw_i32(m->step.tokens, off + k) == h->token)
                    poison_mark(h, slot, 0);
            off += nt;
            if (poison_find(h, slot) >= 0 && pos + nt > h->at)
                return true;
        }
        return false;
    }
    if (m->cmd == TP_CMD_STOP_OPEN) {
        poison_unmark(h, m->stop_open.slot);
        if (m->stop_open.job_id.len && memmem(m->stop_open.job_id.ptr, m->stop_open.job_id.len, h->id_part,
                                              strlen(h->id_part)))
            poison_mark(h, m->stop_open.slot, (uint32_t)m->stop_open.replay.n);
    } else if (m->cmd == TP_CMD_STOP_CLOSE) {
        poison_unmark(h, m->stop_close.slot);
    } else if (m->cmd == TP_CMD_STOP_STEP) {
        for (uint32_t i = 0; i < m->stop_step.n; i++) {
            int k = poison_find(h, tp_raw_u32(m->stop_step.slots, i));
            if (k >= 0 && h->marked[k].index++ >= h->at)
                return true;
        }
    }
    return false;
}

/* The hook fires: crash, or hang until told to quit (the message is then
 * dropped unanswered). */
static void poison_fire(worker *w, const tp_msg *m)
{
    fprintf(stderr, "tokpipe-worker %s: TP_TEST_POISON: %s on %s\n", w->instance, w->poison.crash ? "crash" : "hang",
            tp_cmd_name(TP_FAM_WRK, m->cmd));
    if (w->poison.crash)
        raise(SIGKILL);
    while (!*w->quit)
        pause();
}

/* ---- serving ------------------------------------------------------------- */

enum { SERVE_AGAIN, SERVE_RECONNECT, SERVE_QUIT };

static int dispatch(worker *w, const tp_msg *m)
{
    tp_stage_io io = {io_reply, io_publish, w};
    if (w->poison.si >= 0 && poison_due(&w->poison, m)) {
        poison_fire(w, m);
        return 0;
    }
    int rc = TP_ENOTFOUND;
    if (rc == TP_ENOTFOUND && w->tokenize)
        rc = tp_tokenize_stage_handle(w->tokenize, m, &io);
    if (rc == TP_ENOTFOUND && w->forward)
        rc = tp_forward_stage_handle(w->forward, m, &io);
    if (rc == TP_ENOTFOUND && w->sample)
        rc = tp_sample_stage_handle(w->sample, m, &io);
    if (rc == TP_ENOTFOUND && w->stop)
        rc = tp_stop_stage_handle(w->stop, m, &io);
    if (rc == TP_ENOTFOUND && w->draft)
        rc = tp_draft_stage_handle(w->draft, m, &io);
    if (rc == TP_ENOTFOUND)
        fprintf(stderr, "tokpipe-worker %s: %s is not for a stage served here; ignored\n", w->instance,
                tp_cmd_name(TP_FAM_WRK, m->cmd));
    else if (rc == 0)
        w->progress++;
    return rc == TP_ENOTFOUND ? 0 : rc;
}

/* Handle one message from the broker. */
static int on_message(worker *w, tp_zmsg *z, bool *welcomed)
{
    tp_msg m;
    tp_err e;
    tp_err_clear(&e);
    int rc = tp_proto_decode(TP_FAM_WRK, z->f, z->n, &m, &e);
    int out = SERVE_AGAIN;
    if (rc) {
        fprintf(stderr, "tokpipe-worker %s: dropped a malformed message: %s\n", w->instance, e.msg);
    } else if (m.cmd == TP_CMD_WELCOME) {
        *welcomed = true;
        if (m.welcome.heartbeat_ms)
            w->heartbeat_ms = (int)m.welcome.heartbeat_ms;
        if (m.welcome.liveness)
            w->liveness = (int)m.welcome.liveness;
    } else if (m.cmd == TP_CMD_DISCONNECT) {
        fprintf(stderr, "tokpipe-worker %s: broker says DISCONNECT (%.*s)\n", w->instance,
                (int)m.disconnect.reason.len, m.disconnect.reason.ptr);
        out = SERVE_RECONNECT;
    } else if (m.cmd == TP_CMD_HEARTBEAT) {
        /* liveness was refreshed by the receipt itself */
    } else if (!*welcomed) {
        fprintf(stderr, "tokpipe-worker %s: %s before WELCOME; ignored\n", w->instance, tp_cmd_name(TP_FAM_WRK, m.cmd));
    } else if (dispatch(w, &m)) {
        fprintf(stderr, "tokpipe-worker %s: out of memory handling %s\n", w->instance, tp_cmd_name(TP_FAM_WRK, m.cmd));
        out = SERVE_QUIT;
    }
    tp_msg_clear(&m);
    return out;
}

/* One connection: READY, then serve until the broker is lost or we quit. */
static int serve_connection(worker *w)
{
    w->dealer = zmq_socket(w->zctx, ZMQ_DEALER);
    if (!w->dealer)
        return SERVE_QUIT;
    set_common_opts(w, w->dealer);
    /* a standby pair: one broker at a time, the other when this one is
     * lost or passive (it says DISCONNECT) */
    const char *ep = *w->cfg.peer_back && (w->attempt & 1) ? w->cfg.peer_back : w->cfg.ep_back;
    if (tp_zsec_client_apply(&w->sec, w->dealer, ep, NULL) || zmq_connect(w->dealer, ep)) {
        fprintf(stderr, "tokpipe-worker %s: connect %s: %s\n", w->instance, ep, zmq_strerror(errno));
        zmq_close(w->dealer);
        w->dealer = NULL;
        return SERVE_QUIT;
    }
    w->incarnation = tp_random_u64();
    send_ready(w);
    w->last_recv = tp_now_ms();
    bool welcomed = false;
    int out = SERVE_AGAIN;
    while (out == SERVE_AGAIN && !*w->quit) {
        int64_t now = tp_now_ms();
        if (now - w->last_recv > (int64_t)w->heartbeat_ms * w->liveness) {
            fprintf(stderr, "tokpipe-worker %s: broker silent for %d ms; reconnecting\n", w->instance,
                    (int)(now - w->last_recv));
            out = SERVE_RECONNECT;
            break;
        }
        if (welcomed && now - w->last_send >= w->heartbeat_ms)
            send_simple(w, TP_CMD_HEARTBEAT, NULL);
        zmq_pollitem_t it = {w->dealer, 0, ZMQ_POLLIN, 0};
        long wait = w->heartbeat_ms - (long)(tp_now_ms() - w->last_send);
        if (wait < 1)
            wait = 1;
        if (zmq_poll(&it, 1, wait) < 0)
            continue;   /* EINTR: the loop condition sees the signal */
        while (out == SERVE_AGAIN && (it.revents & ZMQ_POLLIN)) {
            tp_zmsg z;
            if (tp_zmsg_recv(w->dealer, &z, ZMQ_DONTWAIT) < 0)
                break;
            w->last_recv = tp_now_ms();
            out = on_message(w, &z, &welcomed);
            tp_zmsg_close(&z);
        }
    }
    if (*w->quit && welcomed)
        send_simple(w, TP_CMD_DISCONNECT, "worker shutting down");
    zmq_close(w->dealer);
    w->dealer = NULL;
    reset_stages(w);
    return *w->quit ? SERVE_QUIT : out;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int run(worker *w)
{
    w->zctx = zmq_ctx_new();
    w->pub = w->stop ? zmq_socket(w->zctx, ZMQ_PUB) : NULL;
    if (w->pub) {
        set_common_opts(w, w->pub);
        if (tp_zsec_client_apply(&w->sec, w->pub, w->cfg.ep_publish, NULL) ||
            zmq_connect(w->pub, w->cfg.ep_publish)) {
            fprintf(stderr, "tokpipe-worker %s: connect %s: %s\n", w->instance, w->cfg.ep_publish,
                    zmq_strerror(errno));
            return 1;
        }
        /* both brokers of a standby pair: the one the job is pinned to
         * keeps its events, the other refuses them */
        if (*w->cfg.peer_publish && (tp_zsec_client_apply(&w->sec, w->pub, w->cfg.peer_publish, NULL) ||
                                     zmq_connect(w->pub, w->cfg.peer_publish))) {
            fprintf(stderr, "tokpipe-worker %s: connect %s: %s\n", w->instance, w->cfg.peer_publish,
                    zmq_strerror(errno));
            return 1;
        }
    }
    int backoff = w->cfg.reconnect_init_ms;
    int rc = 0;
    for (;;) {
        int64_t t0 = tp_now_ms();
        int r = serve_connection(w);
        if (r == SERVE_QUIT)
            break;
        /* a connection that lived a while resets the backoff */
        if (tp_now_ms() - t0 > 10 * (int64_t)w->heartbeat_ms)
            backoff = w->cfg.reconnect_init_ms;
        if (*w->cfg.peer_back && (++w->attempt & 1))
            continue;   /* the other broker of the pair at once; the backoff after both */
        for (int slept = 0; slept < backoff && !g_quit; slept += 50)
            sleep_ms(50);
        if (g_quit)
            break;
        backoff = backoff * 2 > w->cfg.reconnect_max_ms ? w->cfg.reconnect_max_ms : backoff * 2;
    }
    if (w->pub)
        zmq_close(w->pub);
    zmq_ctx_term(w->zctx);
    return rc;
}

/* ---- main ------------------------------------------------------------------ */

static int parse_args(worker *w, int argc, char **argv, const char **config, const char **stages)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        const char **dst = !strcmp(a, "--config") ? config
                         : !strcmp(a, "--stage") || !strcmp(a, "--stages") ? stages
                         : NULL;
        if (!dst && strcmp(a, "--instance")) {
            fprintf(stderr, "tokpipe-worker: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "tokpipe-worker: %s needs a value\n", a);
            return 2;
        }
        if (dst)
            *dst = argv[++i];
        else
            snprintf(w->instance, sizeof w->instance, "%s", argv[++i]);
    }
    if (!*stages) {
        fprintf(stderr, "tokpipe-worker: --stage is required\n");
        usage(stderr);
        return 2;
    }
    return -1;
}

int main(int argc, char **argv)
{
    /* first thing: a SIGTERM while the config or the model loads must end
     * the worker cleanly, not by the default action */
    tp_proc_on_quit(on_signal);
    static worker w;
    const char *config = NULL, *stages = NULL;
    int pr = parse_args(&w, argc, argv, &config, &stages);
    if (pr >= 0)
        return pr;
    tp_err e;
    tp_err_clear(&e);
    /* systemd instance names cannot hold ',': accept "forward:sample.0"
     * (':' joins stages, a ".N" suffix numbers instances) */
    char list[128];
    snprintf(list, sizeof list, "%s", stages);
    for (char *p = list; *p; p++)
        if (*p == ':')
            *p = ',';
    char *dot = strrchr(list, '.');
    if (dot && dot[1] && strspn(dot + 1, "0123456789") == strlen(dot + 1))
        *dot = '\0';
    if (tp_config_parse_stages(list, &w.stages, &e)) {
        fprintf(stderr, "tokpipe-worker: --stage: %s\n", e.msg);
        return 2;
    }
    int rc = tp_config_find(config, &w.cfg, &config, &e);
    if (rc || (rc = tp_zsec_client_load(&w.cfg, &w.sec, &e))) {
        fprintf(stderr, "tokpipe-worker: %s\n", e.msg);
        tp_config_free(&w.cfg);
        return 2;
    }
    if (!*w.instance)
        snprintf(w.instance, sizeof w.instance, "%.40s.%d", stages, (int)getpid());
    if (poison_parse(&w.poison, getenv("TP_TEST_POISON"))) {
        fprintf(stderr, "tokpipe-worker: TP_TEST_POISON: want STAGE:hang|crash:AT:MARK (forward or stop)\n");
        tp_config_free(&w.cfg);
        return 2;
    }
    if ((w.poison.si == TP_SI_FORWARD && !(w.stages & TP_STAGE_FORWARD)) ||
        (w.poison.si == TP_SI_STOP && !(w.stages & TP_STAGE_STOP)))
        w.poison.si = -1;   /* the hook is for another stage's workers */
    w.heartbeat_ms = w.cfg.heartbeat_ms;
    w.liveness = w.cfg.liveness;
    w.quit = &g_quit;
    /* OpenBLAS (forward_kernel: openblas) starts its threads when loaded:
     * they must not take the signals meant for the main thread. */
    sigset_t sigs, old;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, &old);
    rc = load_stages(&w, &e);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) {
        fprintf(stderr, "tokpipe-worker %s: %s\n", w.instance, e.msg);
        free_stages(&w);
        tp_config_free(&w.cfg);
        return TP_EXIT_BAD_MODEL;
    }
    /* the kernels' level says nothing of the bits (isa.h: every level gives
     * the portable path's), but it does of the speed */
    fprintf(stderr, "tokpipe-worker %s: serving %s, broker %s, kernels %s\n", w.instance, stages, w.cfg.ep_back,
            tp_isa_name(tp_isa_active()));
    rc = g_quit ? 0 : run(&w);
    free_stages(&w);
    tp_config_free(&w.cfg);
    return rc;
}
