/* tokpipe run: in-process generation for one or more prompts.
 *
 * The same stages the daemon spreads over processes — tokenize, batched
 * forward, sample, detokenize/stop — called directly in one loop. All
 * prompts run as one batch: each step advances every unfinished job (prompt
 * chunks and decode tokens together), so the output of a prompt does not
 * depend on the others (the forward pass and the samplers are batch
 * invariant). It is the reference the pipeline's output is compared with. */
#include "evfmt.h"
#include "genopts.h"
#include "tools.h"
#include "tokpipe/buf.h"
#include "tokpipe/rand.h"
#include "tokpipe/toolcall.h"
#include "tokpipe/chat_template.h"
#include "tokpipe/load.h"
#include "tokpipe/detok.h"
#include "tokpipe/stage.h"
#include "tokpipe/forward.h"
#include "tokpipe/glazy.h"
#include "tokpipe/grammar.h"
#include "tokpipe/model.h"
#include "tokpipe/sampler.h"
#include "tokpipe/draft.h"
#include "tokpipe/spec.h"
#include "tokpipe/stop.h"
#include "tokpipe/tokenizer.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char cmd_run_summary[] = "generate in-process (no daemon) for one or more prompts";

_Static_assert(sizeof(int) == sizeof(int32_t), "ids are passed as int and int32_t alike");

/* Tokens one step may carry; prompts longer than this are fed in chunks. */
#define RUN_STEP_TOKENS 512
#define RUN_MAX_EOS 32 /* model end ids + the vocabulary's end-of-generation ids */

typedef struct run_args {
    const char *model;
    const char *tokenizer;
    int threads;
    tp_fwd_kernel kernel;
    tp_kv_type kv_type;
    const char *dump_logits;
    const char *chat_template;
    bool kv_stats;       /* --kv-stats */
    genopts gen;
} run_args;

typedef struct run_job {
    const char *prompt;
    int32_t *ids;        /* prompt ids, then accepted ids: the sequence */
    size_t n_prompt;
    size_t n_ids;
    size_t n_fed;        /* ids already in the KV cache */
    int seq;             /* forward sequence, -1 once closed */
    tp_sampler *sampler;
    tp_detok *detok;
    tp_stop *stop;
    bool done;
    tp_stop_step last;   /* the finishing step */
    size_t context;      /* nonzero: max_tokens was lowered to fit this context */
    int32_t max_tokens;  /* the stop stage's (the context's room included) */
    /* --logprobs: per accepted token its logprob and top_n alternatives */
    float *lp;
    tp_logprob *top;
    int top_n;
    tp_gmatch *gm;       /* --grammar / --json-schema / --json-mode / a tool call: the position */
    tp_glazy *lazy;      /* --tool-choice auto: gm applies from the call's marker on */
    /* chat jobs: content, thinking and tool calls apart, as the stop stage does */
    tp_tcsplit *split;
    tp_buf content;
    /* --speculative: this step's verify item is ids[n_ids - 1] and the
     * guesses (spec_tok), its logits one row per position (spec_rows) */
    tp_spec spec;
    int32_t spec_tok[TP_SPEC_MAX_DRAFT + 1];
    int n_guess;
    float *spec_rows;
    /* --speculative draft: its sequence in the draft model, whose first
     * draft_fed positions are the job's ids */
    int dseq;
    size_t draft_fed;
} run_job;

typedef struct run_ctx {
    tp_loaded files;     /* the model, its vocabulary and (for --message) its template */
    tp_model *model;     /* files' */
    tp_tokenizer *tok;   /* files' */
    tp_forward *fwd;
    run_job *jobs;
    size_t n_jobs;
    int vocab;
    bool stream;         /* one prompt, plain text: print chunks as they come */
    FILE *dump;          /* --dump-logits, or NULL */
    char *gbnf;          /* the jobs' grammar, or NULL */
    const char *gtrigger; /* static: it applies from this text on (tool_choice auto), or NULL */
    tp_gcache *gc;
    uint64_t *gmask;
    float *mrow;         /* the logits under the mask */
    tp_spec_mode spec;   /* --speculative */
    int spec_n_max;
    bool kv_stats;       /* --kv-stats: what follows, printed at the end */
    size_t kv_peak, kv_last; /* most KV bytes the sequences held after a step; after the last one */
    long kv_peak_pos, kv_last_pos; /* positions they held then */
    tp_model *draft_model;   /* --draft-model (--speculative draft) */
    tp_forward *draft;       /* ... its KV: a sequence per job */
} run_ctx;

static void usage(FILE *out)
{
    fputs("usage: tokpipe run --model FILE [--tokenizer FILE] --prompt TEXT [--prompt TEXT ...]\n"
          "                   [generation options]\n\n"
          "Generates in this process, all prompts as one batch, and prints each\n"
          "continuation (streamed when there is one prompt) or, with --json, one JSON\n"
          "line per prompt in the order given.\n\n"
          "  --model FILE             llama2.c checkpoint or GGUF (F32, F16, BF16, Q8_0, Q4_0, Q4_1,\n"
          "                           Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, MXFP4; architectures below)\n"
          "  --tokenizer FILE         llama2.c tokenizer.bin or a GGUF with a vocabulary\n"
          "                           (default: the model's own, for GGUF models)\n"
          "  --threads N              compute threads, 1-256; 0 (the default) = one per CPU this\n"
          "                           process may run on (sched_getaffinity); output is the same\n"
          "                           for any count\n"
          "  --kernel NAME            matmul kernel: invariant (default, batch invariant) or openblas\n"
          "                           (faster at large batches, not batch invariant; see forward.h)\n"
          "  --kv-type TYPE           KV cache: f32 (default, exact) or f16 (half the memory and\n"
          "                           attention traffic; logits move by the rounding)\n"
          "  --dump-logits FILE       for checking a model against a reference: for every sampled\n"
          "                           position write the context and its logits to FILE as\n"
          "                           int32 n, int32 ids[n], float32 logits[vocab] (little endian)\n"
          "  --chat-template FILE     template for --message/--messages (default: the GGUF\n"
          "                           tokenizer's or model's tokenizer.chat_template)\n"
          "  --kv-stats               print to stderr the KV cache memory the sequences held after\n"
          "                           the last step (and at most), per position of context\n"
          "                           (sliding layers keep only their window, DeltaNet layers none)\n",
          out);
    char names[256];
    tp_model_arch_names(names, sizeof names);
    fprintf(out, "GGUF architectures: %s\n", names);
    genopts_print_help(out);
}

static int parse_args(int argc, char **argv, run_args *a, tp_err *err)
{
    memset(a, 0, sizeof *a);
    a->threads = 0;
    genopts_init(&a->gen);
    for (int i = 1; i < argc; i++) {
        int rc = genopts_parse_one(&a->gen, argc, argv, &i, err);
        if (rc < 0)
            return rc;
        if (rc == 1)
            continue;
        const char *f = argv[i];
        if (!strcmp(f, "--kv-stats")) {
            a->kv_stats = true;
            continue;
        }
        if ((!strcmp(f, "--model") || !strcmp(f, "--tokenizer") || !strcmp(f, "--threads") ||
             !strcmp(f, "--kernel") || !strcmp(f, "--kv-type") || !strcmp(f, "--dump-logits") ||
             !strcmp(f, "--chat-template")) &&
            i + 1 >= argc)
            return tp_err_set(err, TP_EINVAL, "%s needs a value", f);
        if (!strcmp(f, "--model"))
            a->model = argv[++i];
        else if (!strcmp(f, "--tokenizer"))
            a->tokenizer = argv[++i];
        else if (!strcmp(f, "--dump-logits"))
            a->dump_logits = argv[++i];
        else if (!strcmp(f, "--chat-template"))
            a->chat_template = argv[++i];
        else if (!strcmp(f, "--threads")) {
            const char *v = argv[++i];
            char *end;
            long n = strtol(v, &end, 10);
            if (!*v || *end || n < 0 || n > TP_FORWARD_MAX_THREADS)
                return tp_err_set(err, TP_EINVAL, "--threads: '%s' is not a number of threads in 0..%d", v,
                                  TP_FORWARD_MAX_THREADS);
            a->threads = (int)n;
        }
        else if (!strcmp(f, "--kernel")) {
            if ((rc = tp_fwd_kernel_parse(argv[++i], &a->kernel, err)))
                return rc;
        } else if (!strcmp(f, "--kv-type")) {
            if ((rc = tp_kv_type_parse(argv[++i], &a->kv_type, err)))
                return rc;
        } else
            return tp_err_set(err, TP_EINVAL, "unknown option '%s' (see tokpipe run --help)", f);
    }
    if (!a->model)
        return tp_err_set(err, TP_EINVAL, "--model FILE is required");
    return genopts_check_prompt(&a->gen, err);
}

static int load_engine(run_ctx *c, const run_args *a, tp_err *err)
{
    tp_load_spec ls = {.model = a->model, .tokenizer = a->tokenizer, .chat_template = a->chat_template,
                       .tokenizer_opt = "--tokenizer FILE", .template_opt = "--chat-template FILE",
                       .what = TP_LOAD_MODEL | TP_LOAD_TOKENIZER | (a->gen.n_messages ? TP_LOAD_TEMPLATE : 0)};
    int rc = tp_load(&ls, &c->files, err);
    if (rc)
        return rc;
    c->model = c->files.model;
    c->tok = c->files.tok;
    c->vocab = tp_model_get_config(c->model)->vocab_size;
    rc = tp_forward_new(c->model, a->gen.n_messages ? 1 : (int)a->gen.n_prompts, 0, RUN_STEP_TOKENS, &c->fwd, err);
    if (rc == 0)
        rc = tp_forward_set_threads(c->fwd, a->threads ? a->threads : tp_forward_default_threads(), err);
    if (rc == 0)
        rc = tp_forward_set_kv_type(c->fwd, a->kv_type, err);
    if (rc == 0 && a->kernel != TP_FWD_KERNEL_INVARIANT)
        rc = tp_forward_set_kernel(c->fwd, a->kernel, err);
    return rc;
}

static void stop_config(const run_ctx *c, const genopts *g, size_t room, const int32_t *eos,
                        size_t n_eos, tp_stop_config *sc)
{
    memset(sc, 0, sizeof *sc);
    sc->stop = g->stops;
    sc->n_stop = g->n_stops;
    sc->stop_ids = g->stop_ids;
    sc->n_stop_ids = g->n_stop_ids;
    sc->eos_ids = eos;
    sc->n_eos_ids = n_eos;
    sc->ignore_eos = g->ignore_eos;
    sc->min_tokens = g->min_tokens;
    /* The context window bounds what can be generated: past it the job ends
     * as `length`, like a max_tokens that was smaller. */
    sc->max_tokens = g->max_tokens >= 1 && (size_t)g->max_tokens > room ? (int32_t)room
                                                                         : g->max_tokens;
    sc->include_stop_str_in_output = g->include_stop;
    sc->vocab_size = c->vocab;
}

/* The finish detail of a length finish: which limit ended the job. */
static const char *length_detail(const run_job *j)
{
    size_t done = j->n_prompt + (size_t)tp_stop_completion_tokens(j->stop);
    return j->context && done >= j->context ? "context" : "max_tokens";
}

static tp_sampler_params sampler_params(const genopts *g, const int32_t *ban, size_t n_ban)
{
    tp_sampler_params p = tp_sampler_params_default();
    p.temperature = g->temperature;
    p.top_k = g->top_k;
    p.top_p = g->top_p;
    p.min_p = g->min_p;
    p.repetition_penalty = g->repetition_penalty;
    p.presence_penalty = g->presence_penalty;
    p.frequency_penalty = g->frequency_penalty;
    p.penalty_window = g->penalty_window;
    p.seed = g->seed;
    p.min_tokens = g->min_tokens;
    p.ban_ids = ban;
    p.n_ban = n_ban;
    p.typical_p = g->typical_p;
    p.bias_ids = g->bias_ids;
    p.bias_values = g->bias_values;
    p.n_bias = g->n_bias;
    return p;
}

/* Tokenize the prompt and build the job's sampler, detokenizer and stop
 * state; every parameter error names its field. */
static int job_init(run_ctx *c, run_job *j, const char *prompt, const genopts *g, bool chat, tp_err *err)
{
    int seq_len = tp_model_get_config(c->model)->seq_len;
    memset(j, 0, sizeof *j);
    j->prompt = prompt;
    j->seq = -1;
    j->ids = malloc(sizeof *j->ids * (size_t)seq_len);
    if (!j->ids)
        return tp_err_set(err, TP_ENOMEM, "out of memory for a %d-token sequence", seq_len);
    /* the tokenizer and the forward pass take int ids; the sequence is
     * int32_t for the wire: the same type here (asserted below) */
    /* Tokenize in full (a prompt longer than the context is counted, not
     * cut), then keep the last truncate_prompt_tokens as the daemon does. */
    size_t n = 0, cap = strlen(prompt) + 3; /* BOS, EOS or a dummy-prefix space, every byte a token */
    int *all = malloc(sizeof *all * cap);
    if (!all)
        return tp_err_set(err, TP_ENOMEM, "out of memory for the prompt's tokens");
    unsigned flags = chat ? TP_ENCODE_SPECIAL : TP_ENCODE_ADD_SPECIAL | (g->parse_special ? TP_ENCODE_SPECIAL : 0);
    int rc = tp_tokenizer_encode_ex(c->tok, prompt, strlen(prompt), flags, all, cap, &n, err);
    size_t skip = g->truncate_prompt_tokens > 0 && n > (size_t)g->truncate_prompt_tokens
                      ? n - (size_t)g->truncate_prompt_tokens : 0;
    n -= skip;
    if (rc == 0 && n >= (size_t)seq_len) {
        free(all);
        return tp_err_set(err, TP_ERANGE, "prompt '%.40s': %zu tokens, the model's context holds %d "
                          "(context_length_exceeded)", prompt, n, seq_len);
    }
    if (rc == 0)
        memcpy(j->ids, all + skip, n * sizeof *all);
    free(all);
    if (rc)
        return rc;
    if (n == 0) /* a vocabulary without add_bos_token and an empty prompt */
        return tp_err_set(err, TP_EINVAL, "prompt '%.40s' encodes to no tokens", prompt);
    j->n_prompt = j->n_ids = n;

    /* the model's end ids and every end-of-generation id of the vocabulary
     * end a job as eos, and min_tokens bans all of them */
    const int *model_eos;
    int n_model_eos = tp_model_eos_ids(c->model, &model_eos);
    int eos_int[RUN_MAX_EOS];
    int n_eos = tp_tokenizer_merge_eog(c->tok, model_eos, n_model_eos, eos_int, RUN_MAX_EOS);
    int32_t ban[RUN_MAX_EOS + GENOPTS_MAX_STOPS];
    size_t n_ban = 0;
    for (int i = 0; i < n_eos && !g->ignore_eos; i++)
        ban[n_ban++] = eos_int[i];
    for (size_t i = 0; i < g->n_stop_ids; i++)
        ban[n_ban++] = g->stop_ids[i];
    int32_t eos[RUN_MAX_EOS];
    for (int i = 0; i < n_eos; i++)
        eos[i] = eos_int[i];

    tp_stop_config sc;
    stop_config(c, g, (size_t)seq_len - n, eos, (size_t)n_eos, &sc);
    /* a stop string naming a control token stops on the token too, as in
     * the stop stage */
    size_t lens[GENOPTS_MAX_STOPS];
    int32_t stop_ids[2 * GENOPTS_MAX_STOPS];
    for (size_t i = 0; i < g->n_stops; i++)
        lens[i] = strlen(g->stops[i]);
    memcpy(stop_ids, g->stop_ids, g->n_stop_ids * sizeof *stop_ids);
    sc.stop_ids = stop_ids;
    sc.n_stop_ids = g->n_stop_ids +
                    tp_detok_control_stops(c->tok, g->stops, lens, g->n_stops, stop_ids + g->n_stop_ids);
    if (n + (size_t)sc.max_tokens >= (size_t)seq_len)
        j->context = (size_t)seq_len;
    j->max_tokens = sc.max_tokens;
    if (g->logprobs) {
        size_t most = (size_t)sc.max_tokens;
        j->top_n = g->top_logprobs;
        j->lp = malloc(sizeof *j->lp * (most ? most : 1));
        size_t cells = most * (size_t)j->top_n > 0 ? most * (size_t)j->top_n : 1;
        j->top = malloc(sizeof *j->top * cells);
        if (!j->lp || !j->top)
            return tp_err_set(err, TP_ENOMEM, "out of memory for logprobs");
    }
    tp_spec_init(&j->spec, c->spec != TP_SPEC_OFF ? c->spec_n_max : 0);
    if (c->spec != TP_SPEC_OFF &&
        !(j->spec_rows = malloc(sizeof *j->spec_rows * (size_t)(c->spec_n_max + 1) * (size_t)c->vocab)))
        return tp_err_set(err, TP_ENOMEM, "out of memory for the verify step's logits");
    tp_sampler_params sp = sampler_params(g, ban, n_ban);
    if (c->gc && (rc = tp_gcache_matcher(c->gc, c->gbnf, strlen(c->gbnf), &j->gm, err)))
        return rc;
    if (c->gtrigger && (rc = tp_glazy_new(j->gm, c->gtrigger, strlen(c->gtrigger), &j->lazy, err)))
        return rc;
    if ((rc = tp_stop_new(&sc, &j->stop, err)) ||
        (rc = tp_sampler_new(&sp, c->vocab, j->ids, n, &j->sampler, err)) ||
        (rc = tp_detok_new(c->tok, j->ids[n - 1], &j->detok, err)) ||
        (rc = tp_forward_seq_open(c->fwd, &j->seq, err)) ||
        (c->draft && (rc = tp_forward_seq_open(c->draft, &j->dseq, err))))
        return rc;
    return 0;
}

static void job_free(run_job *j)
{
    free(j->ids);
    free(j->lp);
    free(j->top);
    free(j->spec_rows);
    tp_sampler_free(j->sampler);
    tp_detok_free(j->detok);
    tp_stop_free(j->stop);
    tp_tcsplit_free(j->split);
    tp_glazy_free(j->lazy);
    tp_buf_free(&j->content);
}

/* Content the splitter released: kept for the result, streamed. */
static int put_content(run_ctx *c, run_job *j, const char *s, size_t n)
{
    if (!n)
        return 0;
    if (tp_buf_add(&j->content, s, n))
        return TP_ENOMEM;
    if (c->stream) {
        fwrite(s, 1, n, stdout);
        fflush(stdout);
    }
    return 0;
}

static void job_finish(run_ctx *c, run_job *j, const tp_stop_step *st)
{
    j->done = true;
    j->last = *st;
    tp_forward_seq_close(c->fwd, j->seq);
    j->seq = -1;
}

/* One candidate through sample -> detokenize -> stop. */
static int job_decide(run_ctx *c, run_job *j, const float *logits, const genopts *g, tp_err *err)
{
    int32_t cand;
    tp_stop_step st;
    if (c->dump) {
        int32_t n = (int32_t)j->n_ids;
        if (fwrite(&n, 4, 1, c->dump) != 1 || fwrite(j->ids, 4, j->n_ids, c->dump) != j->n_ids ||
            fwrite(logits, sizeof *logits, (size_t)c->vocab, c->dump) != (size_t)c->vocab)
            return tp_err_set(err, TP_EIO, "--dump-logits: write failed");
    }
    /* the grammar's mask before every selection step, as the sample stage */
    const float *row = logits;
    int rc = 0;
    tp_gmatch *gm = j->lazy ? tp_glazy_active(j->lazy) : j->gm;
    if (gm && !(rc = tp_gmatch_mask(gm, c->gmask, err))) {
        tp_grammar_apply_mask(c->gmask, logits, c->mrow, c->vocab);
        row = c->mrow;
    }
    if (!rc)
        rc = tp_sampler_sample(j->sampler, row, &cand, err);
    float lp = NAN;
    size_t k = (size_t)tp_stop_completion_tokens(j->stop), n_top = 0;
    tp_logprob top[TP_SAMPLER_MAX_TOP_LOGPROBS];
    /* the same call the sample stage makes, before the candidate is decided */
    if (rc == 0 && j->lp &&
        (rc = tp_sampler_logprobs(j->sampler, g->lp_processed ? row : logits,
                                  g->lp_processed ? TP_LOGPROBS_PROCESSED : TP_LOGPROBS_RAW, cand,
                                  (size_t)j->top_n, &lp, top, &n_top, err)))
        return rc;
    if (rc) {
        fprintf(stderr, "tokpipe run: prompt '%.40s': %s\n", j->prompt ? j->prompt : "(messages)", err->msg);
        tp_stop_fail(j->stop, &st);
    } else {
        size_t n;
        const uint8_t *b = tp_detok_bytes(j->detok, cand, &n, err);
        if (!b || (rc = tp_stop_feed(j->stop, cand, b, n, &st)))
            return b ? rc : err->code;
        if (st.accepted) {
            if (j->lp) {
                j->lp[k] = lp;
                for (int t = 0; t < j->top_n; t++)
                    j->top[k * (size_t)j->top_n + (size_t)t] = (size_t)t < n_top ? top[t]
                                                                                  : (tp_logprob){-1, -INFINITY};
            }
            j->ids[j->n_ids++] = cand;
            if ((rc = tp_sampler_accept(j->sampler, cand, err)) ||
                (rc = tp_detok_accept(j->detok, cand, err)))
                return rc;
            if (j->lazy && (rc = tp_glazy_accept(j->lazy, cand, err)))
                return rc;
            if (j->gm && !j->lazy)
                tp_gmatch_accept(j->gm, cand, NULL);
        }
    }
    if (j->split) {
        const char *t, *r;
        size_t tn, rn;
        int32_t id = st.accepted ? cand : -1;
        rc = st.finish != TP_FINISH_NONE ? tp_tcsplit_finish_token(j->split, id, st.chunk, st.chunk_len, &t, &tn, &r, &rn)
                                         : tp_tcsplit_feed_token(j->split, id, st.chunk, st.chunk_len,
                                                                 tp_stop_held_bytes(j->stop), &t, &tn, &r, &rn);
        if (rc || (rc = put_content(c, j, t, tn)))
            return tp_err_set(err, rc, "out of memory");
    } else if (c->stream && st.chunk_len) {
        fwrite(st.chunk, 1, st.chunk_len, stdout);
        fflush(stdout);
    }
    /* a grammar with no continuation ends the job, as in the stop stage
     * (which ends the splitter there too) */
    if (j->gm && !j->lazy && st.finish == TP_FINISH_NONE && tp_gmatch_done(j->gm) && !tp_stop_end(j->stop, &st)) {
        if (j->split) {
            const char *t, *r;
            size_t tn, rn;
            if ((rc = tp_tcsplit_finish(j->split, st.chunk, st.chunk_len, &t, &tn, &r, &rn)) ||
                (rc = put_content(c, j, t, tn)))
                return tp_err_set(err, rc, "out of memory");
        } else if (c->stream && st.chunk_len) {
            fwrite(st.chunk, 1, st.chunk_len, stdout);
            fflush(stdout);
        }
    }
    if (st.finish != TP_FINISH_NONE)
        job_finish(c, j, &st);
    return 0;
}

/* How many guesses job j verifies in this step (0: none), written after
 * its last token into spec_tok: prompt lookup over its own tokens, as
 * many as the controller asks for and the job, its slot and the step's
 * budget can still take. */
static int plan_guesses(run_ctx *c, run_job *j, int decoding, int budget)
{
    j->n_guess = 0;
    /* (not on a hybrid model: its recurrent state cannot roll back past a
     * step's start, tp_forward_seq_truncate) */
    if (c->spec == TP_SPEC_OFF || j->n_ids - j->n_fed != 1 || tp_model_get_config(c->model)->full_attn_interval > 0)
        return 0;
    /* room: tokens the job may still accept after this step's own one,
     * positions its slot still has (and the draft model's, which holds
     * all guesses but the last), and the step's budget */
    long left = (long)j->max_tokens - tp_stop_completion_tokens(j->stop) - 1;
    long slot = (long)tp_forward_max_positions(c->fwd) - (long)j->n_ids;
    long room = left < slot ? left : slot;
    if (c->draft && room > (long)tp_forward_max_positions(c->draft) - (long)j->n_ids + 1)
        room = (long)tp_forward_max_positions(c->draft) - (long)j->n_ids + 1;
    if (room > budget - 1)
        room = budget - 1;
    int k = tp_spec_want(&j->spec, decoding, room > 0 ? (int)room : 0);
    if (k <= 0)
        return 0;
    j->spec_tok[0] = j->ids[j->n_ids - 1];
    if (c->spec == TP_SPEC_NGRAM) {
        j->n_guess = (int)tp_ngram_guess(j->ids, j->n_ids, (size_t)k, j->spec_tok + 1);
        return j->n_guess;
    }
    /* the draft model, fed the job's ids it does not hold yet */
    int32_t guesses[TP_SPEC_MAX_DRAFT];
    int got = 0;
    tp_draft_item it = {.seq_id = j->dseq, .pos = (int)j->draft_fed, .tokens = j->ids + j->draft_fed,
                        .n_tokens = (int)(j->n_ids - j->draft_fed), .k = k};
    tp_err e;
    if (tp_draft_propose(c->draft, &it, 1, guesses, &got, &e) || got == 0) {
        j->draft_fed = 0;   /* (a failed step: from the start next time) */
        return 0;
    }
    j->draft_fed = j->n_ids;
    memcpy(j->spec_tok + 1, guesses, (size_t)got * sizeof *guesses);
    j->n_guess = got;
    return j->n_guess;
}

/* Build one step: every running job's unfed ids (a decode token, or the
 * next prompt chunk), within the step's token budget; a speculating job's
 * decode token comes with its guesses, one verify item. */
static int plan_step(run_ctx *c, tp_fwd_item *items, float **rows, run_job **owner)
{
    int n = 0, budget = RUN_STEP_TOKENS, decoding = 0;
    for (size_t i = 0; i < c->n_jobs; i++)
        decoding += !c->jobs[i].done && c->jobs[i].n_ids - c->jobs[i].n_fed == 1;
    for (size_t i = 0; i < c->n_jobs && budget > 0; i++) {
        run_job *j = &c->jobs[i];
        if (j->done)
            continue;
        if (plan_guesses(c, j, decoding, budget) > 0) {
            items[n] = (tp_fwd_item){.seq_id = j->seq, .pos = (int)j->n_fed, .tokens = (const int *)j->spec_tok,
                                     .n_tokens = 1 + j->n_guess};
            rows[n] = j->spec_rows;
            owner[n++] = j;
            budget -= 1 + j->n_guess;
            continue;
        }
        int want = (int)(j->n_ids - j->n_fed);
        int take = want < budget ? want : budget;
        items[n] = (tp_fwd_item){.seq_id = j->seq, .pos = (int)j->n_fed,
                                 .tokens = (const int *)&j->ids[j->n_fed], .n_tokens = take,
                                 .skip_logits = take < want};
        rows[n] = NULL;
        owner[n++] = j;
        budget -= take;
    }
    return n;
}

/* A verify step's outcome: position i is sampled (and stop-checked) from
 * row i exactly as a plain step would, while every earlier position's
 * sampled token equalled its guess, so row i's context is the job's own;
 * the first token that differs is kept too. Guesses past it are rolled
 * back from the KV. */
static int job_verify(run_ctx *c, run_job *j, const genopts *g, tp_err *err)
{
    int rc = 0, taken = 0;
    j->n_fed++; /* the job's own last token */
    for (int i = 0; i <= j->n_guess && rc == 0; i++) {
        size_t before = j->n_ids;
        rc = job_decide(c, j, j->spec_rows + (size_t)i * (size_t)c->vocab, g, err);
        if (rc || j->done || i == j->n_guess || j->n_ids == before || j->ids[j->n_ids - 1] != j->spec_tok[1 + i])
            break;
        taken++;
        j->n_fed++; /* the guess is the job's token: its KV stays */
    }
    tp_spec_result(&j->spec, j->n_guess, taken);
    if (c->draft)   /* the draft model fed its guesses but the last: those taken are the job's */
        j->draft_fed += (size_t)(taken < j->n_guess - 1 ? taken : j->n_guess - 1);
    if (rc == 0 && !j->done && tp_forward_seq_truncate(c->fwd, j->seq, (int)j->n_fed))
        rc = tp_err_set(err, TP_ESTATE, "rolling sequence %d back to %zu failed", j->seq, j->n_fed);
    return rc;
}

/* --kv-stats: the KV the open sequences hold now, kept when the most. */
static void kv_sample(run_ctx *c)
{
    tp_fwd_kv_stats st;
    tp_forward_kv_stats(c->fwd, &st);
    long pos = 0;
    for (size_t i = 0; i < c->n_jobs; i++)
        if (c->jobs[i].seq >= 0)
            pos += tp_forward_seq_length(c->fwd, c->jobs[i].seq);
    if (st.held_bytes >= c->kv_peak) {
        c->kv_peak = st.held_bytes;
        c->kv_peak_pos = pos;
    }
    c->kv_last = st.held_bytes;
    c->kv_last_pos = pos;
}

static void kv_print(const run_ctx *c)
{
    tp_fwd_kv_stats st;
    tp_forward_kv_stats(c->fwd, &st);
    fprintf(stderr, "tokpipe run: kv held after the last step %zu bytes at %ld positions (%.1f a position), "
            "at most %zu bytes at %ld; a page of 16 positions %zu bytes, a window part %zu bytes (window %d)\n",
            c->kv_last, c->kv_last_pos, c->kv_last_pos ? (double)c->kv_last / (double)c->kv_last_pos : 0.0,
            c->kv_peak, c->kv_peak_pos, st.page_bytes, st.part_bytes, st.window);
}

static int generate(run_ctx *c, const genopts *g, tp_err *err)
{
    tp_fwd_item *items = calloc(c->n_jobs, sizeof *items);
    run_job **owner = calloc(c->n_jobs, sizeof *owner);
    float **rows = calloc(c->n_jobs, sizeof *rows);
    float *logits = malloc(sizeof *logits * c->n_jobs * (size_t)c->vocab);
    int rc = 0;
    if (!items || !owner || !rows || !logits)
        rc = tp_err_set(err, TP_ENOMEM, "out of memory for %zu jobs", c->n_jobs);
    int n;
    while (rc == 0 && (n = plan_step(c, items, rows, owner)) > 0) {
        if ((rc = tp_forward_step_verify(c->fwd, items, n, logits, c->spec ? rows : NULL, err)))
            break;
        if (c->kv_stats)
            kv_sample(c);
        for (int i = 0; i < n && rc == 0; i++) {
            if (rows[i]) {
                rc = job_verify(c, owner[i], g, err);
                continue;
            }
            owner[i]->n_fed += (size_t)items[i].n_tokens;
            if (!items[i].skip_logits)
                rc = job_decide(c, owner[i], logits + (size_t)i * (size_t)c->vocab, g, err);
        }
    }
    free(items);
    free(owner);
    free(rows);
    free(logits);
    return rc;
}

/* "logprobs": [{"id", "logprob", "top": [{"id", "logprob"}, ...]}, ...]:
 * one per completion token (generate --json prints the same). -inf is
 * written as null (JSON has no infinities). */
static cJSON *lp_number(float v)
{
    return isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull();
}

static void print_logprobs(cJSON *o, const run_job *j)
{
    cJSON *arr = cJSON_AddArrayToObject(o, "logprobs");
    for (size_t i = 0; i + j->n_prompt < j->n_ids; i++) {
        cJSON *e = cJSON_CreateObject(), *top = cJSON_CreateArray();
        cJSON_AddNumberToObject(e, "id", j->ids[j->n_prompt + i]);
        cJSON_AddItemToObject(e, "logprob", lp_number(j->lp[i]));
        for (int t = 0; t < j->top_n; t++) {
            const tp_logprob *x = &j->top[i * (size_t)j->top_n + (size_t)t];
            if (x->id < 0)
                continue;
            cJSON *a = cJSON_CreateObject();
            cJSON_AddNumberToObject(a, "id", x->id);
            cJSON_AddItemToObject(a, "logprob", lp_number(x->logprob));
            cJSON_AddItemToArray(top, a);
        }
        cJSON_AddItemToObject(e, "top", top);
        cJSON_AddItemToArray(arr, e);
    }
}

/* The answer: the content when the job's output was split, else all of it. */
static const char *job_text(const run_job *j, size_t *len)
{
    if (j->split) {
        *len = j->content.len;
        return tp_buf_str(&j->content);
    }
    return tp_stop_text(j->stop, len);
}

static void print_split(cJSON *o, const run_job *j)
{
    size_t rl;
    const char *r = tp_tcsplit_reasoning(j->split, &rl);
    if (rl)
        cJSON_AddItemToObject(o, "reasoning_content", evfmt_str((tp_str){r, rl}));
    const tp_tc_call *tc;
    size_t n = tp_tcsplit_calls(j->split, &tc);
    tp_tool_call calls[TP_PROTO_MAX_TOOL_CALLS];
    for (size_t i = 0; i < n && i < TP_PROTO_MAX_TOOL_CALLS; i++)
        calls[i] = (tp_tool_call){tp_str_of(tc[i].id), tp_str_of(tc[i].name), {tc[i].arguments, tc[i].arguments_len}};
    if (n)
        cJSON_AddItemToObject(o, "tool_calls", evfmt_tool_calls(calls, n < TP_PROTO_MAX_TOOL_CALLS ? n : TP_PROTO_MAX_TOOL_CALLS));
}

static void print_json(const run_job *j, const genopts *g)
{
    cJSON *o = cJSON_CreateObject();
    size_t len;
    const char *text = job_text(j, &len);
    if (j->prompt)
        cJSON_AddStringToObject(o, "prompt", j->prompt);
    else
        cJSON_AddNullToObject(o, "prompt");
    cJSON_AddItemToObject(o, "text", evfmt_str((tp_str){text, len}));
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens");
    for (size_t i = j->n_prompt; i < j->n_ids; i++)
        cJSON_AddItemToArray(toks, cJSON_CreateNumber(j->ids[i]));
    const tp_tc_call *tc;
    /* a job that ended for its calls says so, as an OpenAI gateway does
     * (tp_finish_reason numbers as the wire's reasons) */
    bool called = j->split && tp_reason_ends_in_calls((int)j->last.finish, tp_tcsplit_calls(j->split, &tc),
                                                      !tp_tcsplit_calls_whole(j->split));
    cJSON_AddStringToObject(o, "finish_reason", called ? "tool_calls" : tp_finish_reason_name(j->last.finish));
    if (j->last.finish == TP_FINISH_LENGTH)
        cJSON_AddStringToObject(o, "finish_detail", length_detail(j));
    if (j->last.finish == TP_FINISH_EOS && j->gm && !j->lazy && tp_gmatch_accepting(j->gm))
        cJSON_AddStringToObject(o, "finish_detail", "grammar");
    if (j->gm && !j->lazy) {
        bool whole = tp_gmatch_complete(j->gm, (const uint8_t *)text, len, j->last.finish == TP_FINISH_STOP_STRING);
        cJSON_AddBoolToObject(o, "grammar_complete", whole);
    }
    if (j->last.matched_str) {
        char *m = strndup(j->last.matched_str, j->last.matched_len);
        cJSON_AddStringToObject(o, "matched", m ? m : "");
        free(m);
    } else if (j->last.matched_id >= 0) {
        cJSON_AddNumberToObject(o, "matched", j->last.matched_id);
    } else {
        cJSON_AddNullToObject(o, "matched");
    }
    cJSON_AddNumberToObject(o, "prompt_tokens", (double)j->n_prompt);
    /* run computes every prompt in full (no reuse: nothing is cached
     * across invocations); the field is there to match generate --json */
    cJSON_AddNumberToObject(o, "cached_tokens", 0);
    cJSON_AddNumberToObject(o, "completion_tokens", tp_stop_completion_tokens(j->stop));
    /* written as digits: a u64 does not fit cJSON's doubles */
    char seed[24];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)g->seed);
    cJSON_AddRawToObject(o, "seed", seed);
    if (j->spec.n_max) {
        cJSON_AddNumberToObject(o, "draft_tokens", (double)j->spec.drafted);
        cJSON_AddNumberToObject(o, "draft_accepted", (double)j->spec.accepted);
    }
    if (j->lp)
        print_logprobs(o, j);
    if (j->split)
        print_split(o, j);
    evfmt_print_line(stdout, o);
}

static void print_results(const run_ctx *c, const genopts *g)
{
    for (size_t i = 0; i < c->n_jobs; i++) {
        const run_job *j = &c->jobs[i];
        if (g->json) {
            print_json(j, g);
        } else if (!c->stream) {
            size_t len;
            const char *text = job_text(j, &len);
            fwrite(text, 1, len, stdout);
            fputc('\n', stdout);
        }
    }
    if (c->stream)
        fputc('\n', stdout);
    fflush(stdout);
}

/* The engine the jobs' grammar (c->gbnf) is matched with. */
static int grammar_init(run_ctx *c, tp_err *err)
{
    const int *model_eos;
    int n_model_eos = tp_model_eos_ids(c->model, &model_eos);
    int eos[RUN_MAX_EOS];
    int n_eos = tp_tokenizer_merge_eog(c->tok, model_eos, n_model_eos, eos, RUN_MAX_EOS);
    int rc = tp_gcache_new(c->tok, eos, n_eos, NULL, NULL, 1, &c->gc, err);
    if (rc)
        return rc;
    c->gmask = malloc(tp_gmask_words(c->vocab) * sizeof *c->gmask);
    c->mrow = malloc((size_t)c->vocab * sizeof *c->mrow);
    if (!c->gmask || !c->mrow)
        return tp_err_set(err, TP_ENOMEM, "out of memory");
    return 0;
}

/* The special token (control, user-defined or unknown) whose piece is
 * text: what the broker finds among the special tokens a worker's READY
 * lists (the same ones, by the same rule, in the same order), so that a
 * call grammar is the same here and through the daemon (a tp_gnames find). */
static int find_special(void *ctx, const char *text, size_t len)
{
    const tp_tokenizer *tok = ctx;
    for (int id = 0; id < tp_tokenizer_vocab_size(tok); id++) {
        int t = tp_tokenizer_token_type(tok, id);
        size_t n;
        const char *p = tp_tokenizer_piece(tok, id, &n);
        if (!(t == TP_TOKEN_CONTROL || t == TP_TOKEN_USER_DEFINED || t == TP_TOKEN_UNKNOWN) || !p ||
            n > TP_PROTO_MAX_NAME || !tp_proto_utf8_valid(p, n))
            continue;
        if (n == len && !memcmp(p, text, len))
            return id;
    }
    return -1;
}

/* --tool-choice as the broker admits it: required / a named function hold
 * the output to a call from its first token, auto from the call's marker
 * on (where it can: else free, never an error), none leaves it free. */
static int tool_grammar(run_ctx *c, const tp_tokenize_stage *st, const genopts *g, tp_err *err)
{
    const char *tc = g->tool_choice ? g->tool_choice : "auto";
    if (!g->tools.ptr || !strcmp(tc, "none") || c->gbnf)
        return 0;
    tp_tc_syntax syn;
    tp_tokenize_stage_syntax(st, &syn);
    bool named = !strcmp(tc, "function"), lazy = !named && strcmp(tc, "required");
    if (lazy && !tp_toolcall_trigger(syn.family))
        return 0;
    tp_gnames names = {c->vocab, find_special, c->tok};
    tp_err e;
    tp_tcg_from from = lazy ? TP_TCG_LAZY : syn.thinks && syn.think_open ? TP_TCG_AFTER_THINK : TP_TCG_FIRST;
    int rc = tp_toolcall_grammar(syn.family, g->tools.ptr, g->tools.len, named ? g->tool_choice_name : NULL,
                                 !g->one_call, from, &names, NULL, &c->gbnf, &e);
    if (rc && lazy)
        return rc == TP_ENOMEM ? tp_err_set(err, rc, "out of memory") : 0;
    if (rc)
        return tp_err_set(err, rc, "--tool-choice: %s", e.msg);
    c->gtrigger = tp_toolcall_grammar_trigger(syn.family, from);
    return grammar_init(c, err);
}

/* --message/--messages: render with the chat template exactly as the
 * tokenize stage does (same code), and stop on its end-of-turn ids too. */
static int chat_job_init(run_ctx *c, const run_args *a, tp_err *err)
{
    tp_tokenize_stage *st = NULL;
    char *text = NULL;
    genopts *g = malloc(sizeof *g);
    int rc = g ? tp_tokenize_stage_new(c->tok, &st, err) : tp_err_set(err, TP_ENOMEM, "out of memory");
    if (!rc && !c->files.tmpl)
        rc = tp_err_set(err, TP_EINVAL, "--message/--messages: %s", c->files.template_why);
    if (!rc) {
        rc = tp_tokenize_stage_set_chat(st, c->files.tmpl, c->files.bos_text, c->files.eos_text, NULL, err);
        c->files.tmpl = NULL;   /* the stage's now */
    }
    size_t len = 0;
    if (!rc)
        rc = tp_tokenize_stage_render(st, a->gen.messages, a->gen.n_messages, a->gen.tools, a->gen.reasoning_effort,
                                      &text, &len, err);
    if (!rc)
        rc = tool_grammar(c, st, &a->gen, err);
    if (!rc) {
        *g = a->gen;
        g->messages_json = NULL;
        const int32_t *end;
        int n_end = tp_tokenize_stage_turn_end_ids(st, &end);
        for (int k = 0; k < n_end && g->n_stop_ids < GENOPTS_MAX_STOPS; k++)
            g->stop_ids[g->n_stop_ids++] = end[k];
        rc = job_init(c, &c->jobs[0], text, g, true, err);
        c->jobs[0].prompt = NULL;   /* text is freed below; --json prints "prompt": null */
    }
    if (!rc) {
        /* what the broker asks of the stop stage for a chat job */
        tp_tc_syntax syn;
        tp_tokenize_stage_syntax(st, &syn);
        bool none = a->gen.tool_choice && !strcmp(a->gen.tool_choice, "none");
        tp_tcsplit_opts so = {.tools = a->gen.tools.ptr && !none, .reasoning = true, .parallel = !a->gen.one_call,
                              .id_seed = tp_random_u64()};
        if (!(rc = tp_tcsplit_new(&syn, &so, &c->jobs[0].split, err)))
            tp_tcsplit_controls(c->jobs[0].split, c->tok);
    }
    free(text);
    free(g);
    tp_tokenize_stage_free(st);
    return rc;
}

/* --speculative draft: --draft-model, refused unless its vocabulary is
 * the model's, with a sequence per job as the model's forward has. */
static int load_draft(run_ctx *c, const run_args *a, tp_err *err)
{
    const char *path = a->gen.draft_model;
    if (!path)
        return tp_err_set(err, TP_EINVAL, "--speculative draft: no draft model (--draft-model FILE)");
    tp_err e;
    int rc = tp_model_load(path, &c->draft_model, &e);
    if (rc)
        return tp_err_set(err, rc, "--draft-model %s: %s", path, e.msg);
    if ((rc = tp_draft_check(c->vocab, c->draft_model, path, err)) ||
        (rc = tp_forward_new(c->draft_model, tp_forward_kv_slots(c->fwd), 0, RUN_STEP_TOKENS, &c->draft, err)))
        return rc;
    return tp_forward_set_threads(c->draft, tp_forward_threads(c->fwd), err);
}

static int run_all(run_ctx *c, const run_args *a, tp_err *err)
{
    int rc = load_engine(c, a, err);
    if (rc)
        return rc;
    c->spec = (tp_spec_mode)a->gen.spec_mode;
    c->spec_n_max = a->gen.spec_n_max ? a->gen.spec_n_max : TP_SPEC_DEFAULT_N_MAX;
    c->kv_stats = a->kv_stats;
    if (c->spec == TP_SPEC_DRAFT && (rc = load_draft(c, a, err)))
        return rc;
    if (c->spec != TP_SPEC_OFF && a->kernel != TP_FWD_KERNEL_INVARIANT)
        return tp_err_set(err, TP_EINVAL, "--speculative: needs the invariant kernel (its output would "
                          "depend on the step's shape with --kernel openblas)");
    if ((rc = genopts_gbnf(&a->gen, &c->gbnf, err)))
        return rc;
    if (c->gbnf && (rc = grammar_init(c, err)))
        return rc;
    c->jobs = calloc(a->gen.n_prompts + 1, sizeof *c->jobs);
    if (!c->jobs)
        return tp_err_set(err, TP_ENOMEM, "out of memory for %zu jobs", a->gen.n_prompts);
    if (a->gen.n_messages) {
        c->n_jobs = 1;
        if ((rc = chat_job_init(c, a, err)))
            return rc;
    }
    for (size_t i = 0; i < a->gen.n_prompts; i++) {
        c->n_jobs = i + 1; /* counted before init so a half-built job is freed too */
        if ((rc = job_init(c, &c->jobs[i], a->gen.prompts[i], &a->gen, false, err)))
            return rc;
    }
    c->stream = c->n_jobs == 1 && !a->gen.json;
    if (a->dump_logits && !(c->dump = fopen(a->dump_logits, "wb")))
        return tp_err_set(err, TP_EIO, "--dump-logits: cannot create %s", a->dump_logits);

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if ((rc = generate(c, &a->gen, err)))
        return rc;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    print_results(c, &a->gen);

    long tokens = 0;
    for (size_t i = 0; i < c->n_jobs; i++)
        tokens += tp_stop_completion_tokens(c->jobs[i].stop);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    fprintf(stderr, "tokpipe run: %zu prompt(s), %ld tokens in %.3f s (%.1f tokens/s)\n",
            c->n_jobs, tokens, s, s > 0 ? (double)tokens / s : 0.0);
    if (c->kv_stats)
        kv_print(c);
    return 0;
}

int cmd_run(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
    run_args a;
    tp_err err;
    tp_err_clear(&err);
    if (parse_args(argc, argv, &a, &err)) {
        fprintf(stderr, "tokpipe run: %s\n", err.msg);
        genopts_free(&a.gen);
        return 2;
    }
    run_ctx c = {0};
    int rc = run_all(&c, &a, &err);
    if (c.dump && fclose(c.dump) && !rc)
        rc = tp_err_set(&err, TP_EIO, "--dump-logits: writing %s failed", a.dump_logits);
    if (rc)
        fprintf(stderr, "tokpipe run: %s\n", err.msg);
    for (size_t i = 0; i < c.n_jobs; i++) {
        tp_gcache_release(c.gc, c.jobs[i].gm);
        job_free(&c.jobs[i]);
    }
    free(c.jobs);
    tp_gcache_free(c.gc);
    free(c.gbnf);
    free(c.gmask);
    free(c.mrow);
    tp_forward_free(c.fwd);
    tp_forward_free(c.draft);
    tp_model_free(c.draft_model);
    tp_loaded_free(&c.files);
    genopts_free(&a.gen);
    return rc ? 1 : 0;
}
