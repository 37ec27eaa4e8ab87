/* tokpipe chat: a conversation in the terminal, through the daemon (the
 * config's endpoints, CURVE as any client) or in this process (--model).
 *
 * The whole history goes back every turn as OpenAI messages, rendered by the
 * model's chat template (the daemon's tokenize worker, or here the same
 * tokenize stage code), so the daemon's prefix cache serves the part it has
 * seen. Thinking is shown apart (dimmed on a terminal, on stderr when stdout
 * is not one, or hidden); tool calls are shown as calls. Ctrl-C while a
 * reply streams cancels that job and returns to the prompt; Ctrl-C at the
 * prompt or end of input ends the command. With stdin a terminal the line
 * is read with libedit (editing and history), else plain lines, so it can be
 * scripted. */
#include "tools.h"

#include <cjson/cJSON.h>
#include <editline/readline.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "evfmt.h"
#include "genopts.h"
#include "tokpipe/load.h"
#include "tokpipe/buf.h"
#include "tokpipe/chat_template.h"
#include "tokpipe/detok.h"
#include "tokpipe/forward.h"
#include "tokpipe/model.h"
#include "tokpipe/rand.h"
#include "tokpipe/sampler.h"
#include "tokpipe/stage.h"
#include "tokpipe/stop.h"
#include "tokpipe/tokenizer.h"
#include "tokpipe/toolcall.h"

const char cmd_chat_summary[] = "a conversation in the terminal (through the daemon, or --model in process)";

#define CHAT_STEP_TOKENS 512   /* prompt tokens one forward step takes (as `run`) */
#define CHAT_MAX_EOS 32
#define CHAT_IDLE_MS 1000      /* no event for this long: ask STATUS */
#define DIM "\033[2m"
#define BOLD_OFF "\033[0m"

static const char usage_text[] =
    "usage: tokpipe chat [--model FILE [--tokenizer FILE]] [--template FILE] [options]\n"
    "\n"
    "A conversation: type a line, the reply streams; the history goes back with\n"
    "every turn, rendered by the model's chat template. Without --model it runs\n"
    "through tokpiped (the connection options below; the daemon's model and\n"
    "template); with --model it generates in this process.\n"
    "\n"
    "  --model FILE        generate in process with this model (no daemon)\n"
    "  --tokenizer FILE    its vocabulary, when the model file has none\n"
    "  --template FILE     the chat template (a .jinja file or a GGUF), when the model\n"
    "                      has none or to use another (in process)\n"
    "  --messages FILE     start from this conversation (OpenAI messages JSON)\n"
    "  --system TEXT       a system message first\n"
    "  --tools FILE        offer these tools (an OpenAI tools array); calls are shown\n"
    "  --hide-thinking     do not show the model's thinking\n"
    "  --verbose           a status line after every reply (tokens, cached, tokens/s)\n"
    "                      (on a terminal it is always shown)\n"
    "  --show-prompt       in process: each turn's rendered prompt on stderr, between\n"
    "                      a line '--- prompt ---' and a line '--- end ---'\n"
    "\n"
    "At the prompt: a line ending in \\ goes on on the next line;\n"
    "  /reset           forget the conversation (the system message stays)\n"
    "  /system TEXT     set the system message\n"
    "  /save FILE       write the conversation as OpenAI messages JSON\n"
    "  /load FILE       read one (the shape --messages reads)\n"
    "  /help            this list\n"
    "Ctrl-C while a reply streams cancels it; Ctrl-C at the prompt or Ctrl-D ends.\n"
    "\n";

static const char commands_help[] =
    "/reset  /system TEXT  /save FILE  /load FILE  /help; a trailing \\ continues the line;\n"
    "Ctrl-C cancels a reply, Ctrl-C at the prompt or Ctrl-D ends\n";

/* What one reply came to. */
typedef struct reply {
    tp_buf content;
    tp_buf reasoning;
    cJSON *tool_calls;      /* OpenAI's shape, or NULL */
    const char *reason;     /* finish reason name */
    char error[256];
    uint32_t prompt_tokens, cached_tokens, completion_tokens;
    bool cancelled;
} reply;

typedef struct chat {
    genopts g;               /* sampling flags, --tools, --messages */
    tp_client_args a;
    const char *model_path, *tok_path, *template_path, *system;
    bool hide_thinking, verbose, show_prompt, tty_in, tty_out;
    cJSON *history;          /* the messages (role, content, tool_calls, ...) */
    char *tools;             /* --tools text, or NULL */
    size_t tools_len;
    int sigfd;               /* read end of the interrupt pipe */
    unsigned turn;
    bool at_line_start;      /* stdout: nothing printed since the last newline */
    /* in process */
    tp_loaded files;         /* the model, its vocabulary and its template */
    tp_model *model;         /* files' */
    tp_tokenizer *tok;       /* files' */
    tp_forward *fwd;
    tp_tokenize_stage *st;
    int vocab;
    /* through the daemon */
    tp_client *c;
    char id_prefix[48];
} chat;

/* ---- Ctrl-C ------------------------------------------------------------- */

/* Self-pipe for SIGINT while a reply streams (see cmd_generate.c: a thread a
 * library started may take the signal, so a signalfd is not enough). The
 * write end is set once before the handler is installed. */
static int interrupt_pipe_w = -1;

static void on_sigint(int sig)
{
    (void)sig;
    int saved = errno;
    if (write(interrupt_pipe_w, "!", 1) < 0) {
        /* full: an interrupt is already pending */
    }
    errno = saved;
}

static void catch_sigint(bool on)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on ? on_sigint : SIG_DFL;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

static bool interrupted(int fd)
{
    struct pollfd p = {fd, POLLIN, 0};
    return poll(&p, 1, 0) == 1;
}

static void drain(int fd)
{
    char b[64];
    while (read(fd, b, sizeof b) > 0) {
    }
}

/* ---- output ------------------------------------------------------------- */

static void out_text(chat *ch, const char *s, size_t n)
{
    if (!n)
        return;
    fwrite(s, 1, n, stdout);
    fflush(stdout);
    ch->at_line_start = s[n - 1] == '\n';
}

static void out_thinking(chat *ch, const char *s, size_t n)
{
    if (!n || ch->hide_thinking)
        return;
    if (ch->tty_out) {
        fputs(DIM, stdout);
        out_text(ch, s, n);
        fputs(BOLD_OFF, stdout);
        fflush(stdout);
    } else {
        fwrite(s, 1, n, stderr);
        fflush(stderr);
    }
}

static void end_line(chat *ch)
{
    if (!ch->at_line_start)
        out_text(ch, "\n", 1);
}

static void show_calls(chat *ch, const cJSON *calls)
{
    const cJSON *c;
    cJSON_ArrayForEach(c, calls) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(f, "arguments");
        end_line(ch);
        printf("[tool call] %s(%s)\n", cJSON_IsString(nm) ? nm->valuestring : "?",
               cJSON_IsString(args) ? args->valuestring : "");
        ch->at_line_start = true;
    }
    fflush(stdout);
}

/* ---- the conversation --------------------------------------------------- */

static cJSON *message(const char *role, const char *content, size_t len)
{
    cJSON *m = cJSON_CreateObject();
    char *s = strndup(content, len);
    if (!m || !s) {
        cJSON_Delete(m);
        free(s);
        return NULL;
    }
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", s);
    free(s);
    return m;
}

/* Set (or with text NULL, drop) the leading system message. */
static int set_system(chat *ch, const char *text)
{
    cJSON *first = cJSON_GetArrayItem(ch->history, 0);
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(first, "role");
    if (cJSON_IsString(role) && !strcmp(role->valuestring, "system"))
        cJSON_DeleteItemFromArray(ch->history, 0);
    if (!text)
        return 0;
    cJSON *m = message("system", text, strlen(text));
    return m && cJSON_InsertItemInArray(ch->history, 0, m) ? 0 : TP_ENOMEM;
}

/* The history as genopts turns (what both paths send), in *g (freed by the
 * caller with genopts_free). */
static int conversation(chat *ch, genopts *g, tp_err *err)
{
    genopts_init(g);
    cJSON *o = cJSON_CreateObject();
    if (!o || !cJSON_AddItemReferenceToObject(o, "messages", ch->history)) {
        cJSON_Delete(o);
        return tp_err_set(err, TP_ENOMEM, "out of memory");
    }
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!text)
        return tp_err_set(err, TP_ENOMEM, "out of memory");
    int rc = genopts_conversation(g, text, strlen(text), err);
    free(text);
    if (!rc && ch->tools)
        g->tools = (tp_str){ch->tools, ch->tools_len};
    return rc;
}

/* Read a conversation file into the history (the shape --messages reads:
 * [turns] or {"messages": [turns], ...}), checked by genopts first. */
static int load_file(chat *ch, const char *path, tp_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return tp_err_set(err, TP_EIO, "%s: %s", path, strerror(errno));
    tp_buf b = {0};
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        tp_buf_add(&b, chunk, n);
    fclose(f);
    genopts probe;
    genopts_init(&probe);
    int rc = genopts_conversation(&probe, tp_buf_str(&b), b.len, err);
    genopts_free(&probe);
    cJSON *j = rc ? NULL : cJSON_ParseWithLength(tp_buf_str(&b), b.len);
    tp_buf_free(&b);
    if (rc)
        return rc;
    cJSON *msgs = cJSON_IsArray(j) ? j : cJSON_DetachItemFromObjectCaseSensitive(j, "messages");
    if (!cJSON_IsArray(msgs)) {
        cJSON_Delete(j);
        if (msgs != j)
            cJSON_Delete(msgs);
        return tp_err_set(err, TP_EINVAL, "%s: no messages array", path);
    }
    if (msgs != j)
        cJSON_Delete(j);
    cJSON_Delete(ch->history);
    ch->history = msgs;
    return 0;
}

static int save_file(chat *ch, const char *path, tp_err *err)
{
    char *text = cJSON_Print(ch->history);
    if (!text)
        return tp_err_set(err, TP_ENOMEM, "out of memory");
    FILE *f = fopen(path, "wb");
    int rc = 0;
    if (!f || fputs(text, f) < 0 || fputc('\n', f) < 0)
        rc = tp_err_set(err, TP_EIO, "%s: %s", path, strerror(errno));
    if (f && fclose(f) && !rc)
        rc = tp_err_set(err, TP_EIO, "%s: %s", path, strerror(errno));
    free(text);
    return rc;
}

/* ---- in process ----------------------------------------------------------- */

static int engine_open(chat *ch, tp_err *err)
{
    tp_load_spec ls = {.model = ch->model_path, .tokenizer = ch->tok_path, .chat_template = ch->template_path,
                       .tokenizer_opt = "--tokenizer FILE", .template_opt = "--template FILE",
                       .what = TP_LOAD_MODEL | TP_LOAD_TOKENIZER | TP_LOAD_TEMPLATE_REQUIRED};
    int rc = tp_load(&ls, &ch->files, err);
    if (rc)
        return rc;
    ch->model = ch->files.model;
    ch->tok = ch->files.tok;
    ch->vocab = tp_model_get_config(ch->model)->vocab_size;
    if ((rc = tp_tokenize_stage_new(ch->tok, &ch->st, err)))
        return rc;
    rc = tp_tokenize_stage_set_chat(ch->st, ch->files.tmpl, ch->files.bos_text, ch->files.eos_text, NULL, err);
    ch->files.tmpl = NULL; /* the stage's now */
    if (rc)
        return rc;
    if ((rc = tp_forward_new(ch->model, 1, 0, CHAT_STEP_TOKENS, &ch->fwd, err)))
        return rc;
    return tp_forward_set_threads(ch->fwd, tp_forward_default_threads(), err);
}

static void engine_close(chat *ch)
{
    tp_forward_free(ch->fwd);
    tp_tokenize_stage_free(ch->st);
    tp_loaded_free(&ch->files);
}

/* One turn's job: the same stages as `tokpipe run --messages`. */
typedef struct local_job {
    int32_t *ids;
    size_t n_ids, n_prompt, n_fed;
    int seq;
    tp_sampler *sampler;
    tp_detok *detok;
    tp_stop *stop;
    tp_tcsplit *split;
} local_job;

static void local_free(chat *ch, local_job *j)
{
    if (j->seq >= 0)
        tp_forward_seq_close(ch->fwd, j->seq);
    free(j->ids);
    tp_sampler_free(j->sampler);
    tp_detok_free(j->detok);
    tp_stop_free(j->stop);
    tp_tcsplit_free(j->split);
}

static int local_show(chat *ch, reply *r, const char *t, size_t tn, const char *th, size_t rn)
{
    if (rn) {
        if (tp_buf_add(&r->reasoning, th, rn))
            return TP_ENOMEM;
        out_thinking(ch, th, rn);
    }
    if (tn) {
        if (r->reasoning.len && !r->content.len && !ch->hide_thinking)
            end_line(ch);
        if (tp_buf_add(&r->content, t, tn))
            return TP_ENOMEM;
        out_text(ch, t, tn);
    }
    return 0;
}

static int local_turn(chat *ch, const genopts *conv, reply *r, tp_err *err)
{
    const genopts *g = &ch->g;
    char *text = NULL;
    size_t len = 0;
    int rc = tp_tokenize_stage_render(ch->st, conv->messages, conv->n_messages, conv->tools, (tp_str){NULL, 0}, &text,
                                      &len, err);
    if (rc)
        return rc;
    if (ch->show_prompt) {
        fputs("--- prompt ---\n", stderr);
        fwrite(text, 1, len, stderr);
        fputs("\n--- end ---\n", stderr);
        fflush(stderr);
    }
    int seq_len = tp_model_get_config(ch->model)->seq_len;
    local_job j = {.seq = -1};
    size_t cap = len + 3 > (size_t)seq_len ? len + 3 : (size_t)seq_len;
    int *all = malloc(sizeof *all * cap);
    j.ids = malloc(sizeof *j.ids * (size_t)seq_len);
    if (!all || !j.ids) {
        free(all);
        free(text);
        local_free(ch, &j);
        return tp_err_set(err, TP_ENOMEM, "out of memory");
    }
    size_t n = 0;
    rc = tp_tokenizer_encode_ex(ch->tok, text, len, TP_ENCODE_SPECIAL, all, cap, &n, err);
    free(text);
    if (!rc && n >= (size_t)seq_len)
        rc = tp_err_set(err, TP_ERANGE, "the conversation is %zu tokens, the model's context holds %d: /reset",
                        n, seq_len);
    if (!rc && !n)
        rc = tp_err_set(err, TP_EINVAL, "the conversation renders to no tokens");
    for (size_t i = 0; !rc && i < n; i++)
        j.ids[i] = all[i];
    free(all);
    j.n_ids = j.n_prompt = n;
    r->prompt_tokens = (uint32_t)n;

    const int *model_eos;
    int n_model_eos = tp_model_eos_ids(ch->model, &model_eos);
    int eos_int[CHAT_MAX_EOS];
    int n_eos = tp_tokenizer_merge_eog(ch->tok, model_eos, n_model_eos, eos_int, CHAT_MAX_EOS);
    int32_t eos[CHAT_MAX_EOS], ban[CHAT_MAX_EOS + GENOPTS_MAX_STOPS * 2];
    int32_t stop_ids[GENOPTS_MAX_STOPS * 2];
    size_t n_ban = 0, n_stop_ids = 0;
    for (int i = 0; i < n_eos; i++) {
        eos[i] = eos_int[i];
        if (!g->ignore_eos)
            ban[n_ban++] = eos_int[i];
    }
    for (size_t i = 0; i < g->n_stop_ids; i++)
        stop_ids[n_stop_ids++] = g->stop_ids[i];
    const int32_t *end;
    int n_end = tp_tokenize_stage_turn_end_ids(ch->st, &end);
    for (int k = 0; k < n_end && n_stop_ids < GENOPTS_MAX_STOPS * 2; k++)
        stop_ids[n_stop_ids++] = end[k];
    for (size_t i = 0; i < n_stop_ids; i++)
        ban[n_ban++] = stop_ids[i];
    size_t room = (size_t)seq_len - n;
    tp_stop_config sc = {0};
    sc.stop = g->stops;
    sc.n_stop = g->n_stops;
    sc.stop_ids = stop_ids;
    sc.n_stop_ids = n_stop_ids;
    sc.eos_ids = eos;
    sc.n_eos_ids = (size_t)n_eos;
    sc.ignore_eos = g->ignore_eos;
    sc.min_tokens = g->min_tokens;
    sc.max_tokens = g->max_tokens >= 1 && (size_t)g->max_tokens > room ? (int32_t)room : g->max_tokens;
    sc.include_stop_str_in_output = g->include_stop;
    sc.vocab_size = ch->vocab;
    tp_sampler_params sp = tp_sampler_params_default();
    sp.temperature = g->temperature, sp.top_k = g->top_k, sp.top_p = g->top_p, sp.min_p = g->min_p;
    sp.repetition_penalty = g->repetition_penalty, sp.presence_penalty = g->presence_penalty;
    sp.frequency_penalty = g->frequency_penalty, sp.penalty_window = g->penalty_window;
    sp.seed = (g->given & (1u << GO_SEED)) ? g->seed + ch->turn : tp_random_u64();
    sp.min_tokens = g->min_tokens, sp.ban_ids = ban, sp.n_ban = n_ban, sp.typical_p = g->typical_p;
    sp.bias_ids = g->bias_ids, sp.bias_values = g->bias_values, sp.n_bias = g->n_bias;
    tp_tc_syntax syn;
    tp_tokenize_stage_syntax(ch->st, &syn);
    tp_tcsplit_opts so = {.tools = ch->tools != NULL, .reasoning = true, .parallel = true,
                          .id_seed = tp_random_u64()};
    if (!rc && !(rc = tp_stop_new(&sc, &j.stop, err)) &&
        !(rc = tp_sampler_new(&sp, ch->vocab, j.ids, n, &j.sampler, err)) &&
        !(rc = tp_detok_new(ch->tok, j.ids[n - 1], &j.detok, err)) &&
        !(rc = tp_tcsplit_new(&syn, &so, &j.split, err)) && !(rc = tp_forward_seq_open(ch->fwd, &j.seq, err))) {
        tp_tcsplit_controls(j.split, ch->tok);
        /* the forward pass's prefix cache keeps the pages of the turns
         * before (exact: the same logits as computing them again) */
        int took = tp_forward_seq_reuse(ch->fwd, j.seq, 0, (const int *)j.ids, (int)n, true);
        j.n_fed = took > 0 ? (size_t)took : 0;
        r->cached_tokens = (uint32_t)j.n_fed;
    }

    float *logits = rc ? NULL : malloc(sizeof *logits * (size_t)ch->vocab);
    if (!rc && !logits)
        rc = tp_err_set(err, TP_ENOMEM, "out of memory");
    tp_stop_step st = {0};
    while (!rc && st.finish == TP_FINISH_NONE) {
        if (interrupted(ch->sigfd)) {
            r->cancelled = true;
            break;
        }
        int want = (int)(j.n_ids - j.n_fed), take = want < CHAT_STEP_TOKENS ? want : CHAT_STEP_TOKENS;
        tp_fwd_item it = {.seq_id = j.seq, .pos = (int)j.n_fed, .tokens = (const int *)&j.ids[j.n_fed],
                          .n_tokens = take, .skip_logits = take < want};
        if ((rc = tp_forward_step(ch->fwd, &it, 1, logits, err)))
            break;
        j.n_fed += (size_t)take;
        if (it.skip_logits)
            continue;
        int32_t cand;
        if ((rc = tp_sampler_sample(j.sampler, logits, &cand, err)))
            break;
        size_t bn;
        const uint8_t *b = tp_detok_bytes(j.detok, cand, &bn, err);
        if (!b) {
            rc = err->code;
            break;
        }
        if ((rc = tp_stop_feed(j.stop, cand, b, bn, &st)))
            break;
        if (st.accepted) {
            j.ids[j.n_ids++] = cand;
            if ((rc = tp_sampler_accept(j.sampler, cand, err)) || (rc = tp_detok_accept(j.detok, cand, err)))
                break;
        }
        const char *t, *th;
        size_t tn, rn;
        int32_t id = st.accepted ? cand : -1;
        rc = st.finish != TP_FINISH_NONE
                 ? tp_tcsplit_finish_token(j.split, id, st.chunk, st.chunk_len, &t, &tn, &th, &rn)
                 : tp_tcsplit_feed_token(j.split, id, st.chunk, st.chunk_len, tp_stop_held_bytes(j.stop), &t, &tn,
                                         &th, &rn);
        if (rc || (rc = local_show(ch, r, t, tn, th, rn))) {
            rc = tp_err_set(err, TP_ENOMEM, "out of memory");
            break;
        }
    }
    free(logits);
    if (!rc && !r->cancelled) {
        r->completion_tokens = (uint32_t)tp_stop_completion_tokens(j.stop);
        r->reason = tp_finish_reason_name(st.finish);
        const tp_tc_call *tc;
        size_t nc = tp_tcsplit_calls(j.split, &tc);
        if (nc) {
            r->tool_calls = cJSON_CreateArray();
            for (size_t i = 0; i < nc; i++) {
                cJSON *c = cJSON_CreateObject(), *f = cJSON_CreateObject();
                char *args = strndup(tc[i].arguments, tc[i].arguments_len);
                cJSON_AddStringToObject(c, "id", tc[i].id);
                cJSON_AddStringToObject(c, "type", "function");
                cJSON_AddStringToObject(f, "name", tc[i].name);
                cJSON_AddStringToObject(f, "arguments", args ? args : "");
                free(args);
                cJSON_AddItemToObject(c, "function", f);
                cJSON_AddItemToArray(r->tool_calls, c);
            }
            r->reason = "tool_calls";
        }
    }
    local_free(ch, &j);
    return rc;
}

/* ---- through the daemon ---------------------------------------------------- */

static void fill_params(const genopts *g, tp_params *p, tp_str *stops, uint64_t seed)
{
    memset(p, 0, sizeof *p);
    /* only what the command line gave: the rest takes the daemon's defaults */
    static const struct {
        genopt_flag flag;
        uint32_t bit;
    } sent[] = {
        {GO_MAX_TOKENS, TP_P_MAX_TOKENS}, {GO_MIN_TOKENS, TP_P_MIN_TOKENS}, {GO_TEMPERATURE, TP_P_TEMPERATURE},
        {GO_TOP_P, TP_P_TOP_P}, {GO_TOP_K, TP_P_TOP_K}, {GO_MIN_P, TP_P_MIN_P},
        {GO_REPETITION_PENALTY, TP_P_REPETITION_PENALTY}, {GO_PRESENCE_PENALTY, TP_P_PRESENCE_PENALTY},
        {GO_FREQUENCY_PENALTY, TP_P_FREQUENCY_PENALTY}, {GO_PENALTY_WINDOW, TP_P_PENALTY_WINDOW},
    };
    for (size_t i = 0; i < sizeof sent / sizeof *sent; i++)
        if (g->given & (1u << sent[i].flag))
            p->set |= sent[i].bit;
    if (g->ignore_eos)
        p->set |= TP_P_IGNORE_EOS;
    if (g->include_stop)
        p->set |= TP_P_INCLUDE_STOP;
    p->max_tokens = g->max_tokens, p->min_tokens = g->min_tokens, p->temperature = g->temperature;
    p->top_p = g->top_p, p->top_k = g->top_k, p->min_p = g->min_p;
    p->repetition_penalty = g->repetition_penalty, p->presence_penalty = g->presence_penalty;
    p->frequency_penalty = g->frequency_penalty, p->penalty_window = g->penalty_window;
    p->ignore_eos = g->ignore_eos, p->include_stop_str_in_output = g->include_stop;
    p->set |= TP_P_SEED;
    p->seed = seed;
    for (size_t i = 0; i < g->n_stops; i++)
        stops[i] = tp_str_of(g->stops[i]);
    if (g->n_stops)
        p->set |= TP_P_STOP, p->stop = stops, p->n_stop = g->n_stops;
    if (g->n_stop_ids)
        p->set |= TP_P_STOP_TOKEN_IDS, p->stop_token_ids = (int32_t *)g->stop_ids, p->n_stop_token_ids = g->n_stop_ids;
    if (g->given & (1u << GO_TYPICAL_P))
        p->set |= TP_P_TYPICAL_P, p->typical_p = g->typical_p;
    if (g->n_bias)
        p->set |= TP_P_LOGIT_BIAS,
            p->logit_bias = (tp_logit_bias){(int32_t *)g->bias_ids, (float *)g->bias_values, g->n_bias};
}

static int daemon_open(chat *ch, tp_err *err)
{
    int rc = tp_client_open(&ch->a, true, true, &ch->c, err);
    uint32_t r = (uint32_t)tp_random_u64();
    snprintf(ch->id_prefix, sizeof ch->id_prefix, "chat-%d-%08x-", (int)getpid(), r);
    /* one subscription for every turn's job, proved in force by the heartbeat */
    if (!rc)
        rc = tp_client_subscribe(ch->c, ch->id_prefix, err);
    if (!rc)
        rc = tp_client_subscribe_heartbeat(ch->c, err);
    if (!rc)
        rc = tp_client_wait_events_ready(ch->c, err);
    if (!rc)
        tp_client_set_interrupt_fd(ch->c, ch->sigfd);
    return rc;
}

static int daemon_cancel(chat *ch, const char *id, tp_err *err)
{
    tp_msg m;
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_CANCEL);
    m.jobref.job_id = tp_str_of(id);
    tp_client_set_interrupt_fd(ch->c, -1);
    tp_recv rr;
    int rc = tp_client_call(ch->c, &m, &rr, err);
    if (!rc)
        tp_recv_free(&rr);
    tp_client_set_interrupt_fd(ch->c, ch->sigfd);
    return rc;
}

static void finish_from(reply *r, const tp_m_finish *f)
{
    r->reason = tp_reason_name(f->reason);
    r->prompt_tokens = f->prompt_tokens;
    r->cached_tokens = f->cached_tokens;
    r->completion_tokens = f->completion_tokens;
    snprintf(r->error, sizeof r->error, "%.*s", (int)f->job_error.len, f->job_error.ptr ? f->job_error.ptr : "");
    if (f->n_tool_calls) {
        r->tool_calls = evfmt_tool_calls(f->tool_calls, f->n_tool_calls);
        r->reason = "tool_calls";
    }
}

static int daemon_turn(chat *ch, const genopts *conv, reply *r, tp_err *err)
{
    char id[TP_PROTO_MAX_JOB_ID + 1];
    snprintf(id, sizeof id, "%s%u", ch->id_prefix, ch->turn);
    tp_msg m;
    tp_str stops[GENOPTS_MAX_STOPS];
    tp_msg_init(&m, TP_FAM_JOB, TP_CMD_SUBMIT);
    m.submit.job_id = tp_str_of(id);
    m.submit.messages = (tp_chat_msg *)conv->messages;
    m.submit.n_messages = conv->n_messages;
    m.submit.tools = conv->tools;
    uint64_t seed = (ch->g.given & (1u << GO_SEED)) ? ch->g.seed + ch->turn : tp_random_u64();
    fill_params(&ch->g, &m.submit.params, stops, seed);
    tp_recv ack;
    int rc = tp_client_call(ch->c, &m, &ack, err);
    if (rc)
        return rc;
    if (ack.m.cmd != TP_CMD_ACK || ack.m.status != TP_ST_OK)
        rc = tp_err_set(err, TP_EIO, "tokpiped refused the turn (%u): %.*s", ack.m.status, (int)ack.m.error.len,
                        ack.m.error.ptr ? ack.m.error.ptr : "");
    tp_recv_free(&ack);
    uint32_t next = 0;
    bool done = false;
    while (!rc && !done) {
        tp_recv ev;
        int got = tp_client_next_event(ch->c, CHAT_IDLE_MS, &ev, err);
        if (got == TP_ESTATE && interrupted(ch->sigfd)) {   /* Ctrl-C */
            r->cancelled = true;
            return daemon_cancel(ch, id, err);
        }
        if (got < 0)
            return got;
        if (got == TP_NEXT_EVENT) {
            const tp_msg *e = &ev.m;
            tp_str jid = e->cmd == TP_CMD_TOKEN ? e->token.job_id : e->finish.job_id;
            if (jid.len == strlen(id) && !memcmp(jid.ptr, id, jid.len)) {
                uint32_t seq = e->cmd == TP_CMD_TOKEN ? e->token.seq : e->finish.seq;
                if (seq != next)
                    rc = tp_err_set(err, TP_EIO, "events of the reply were lost (seq %u, expected %u)", seq, next);
                next = seq + 1;
                if (e->cmd == TP_CMD_TOKEN) {
                    if (!rc && (rc = local_show(ch, r, e->token.text.ptr, e->token.text.len, e->token.reasoning.ptr,
                                                e->token.reasoning.len)))
                        rc = tp_err_set(err, TP_ENOMEM, "out of memory");
                } else {
                    if (!rc && (rc = local_show(ch, r, e->finish.text.ptr, e->finish.text.len, NULL, 0)))
                        rc = tp_err_set(err, TP_ENOMEM, "out of memory");
                    finish_from(r, &e->finish);
                    done = true;
                }
            }
            tp_recv_free(&ev);
        } else if (got == TP_NEXT_RESTARTED) {
            rc = tp_err_set(err, TP_EIO, "tokpiped restarted: the reply is lost (the conversation is kept; ask again)");
        }
    }
    return rc;
}

/* ---- the loop -------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* One line of input without its newline (malloc'd), NULL at end of input. */
static char *read_line(chat *ch, const char *prompt)
{
    if (ch->tty_in) {
        char *l = readline(prompt);
        if (l && *l)
            add_history(l);
        return l;
    }
    char *l = NULL;
    size_t cap = 0;
    ssize_t n = getline(&l, &cap, stdin);
    if (n < 0) {
        free(l);
        return NULL;
    }
    while (n > 0 && (l[n - 1] == '\n' || l[n - 1] == '\r'))
        l[--n] = 0;
    return l;
}

/* A whole input: lines ending in a backslash go on on the next line. */
static char *read_input(chat *ch)
{
    tp_buf b = {0};
    const char *prompt = "> ";
    for (;;) {
        char *l = read_line(ch, prompt);
        if (!l) {
            if (!b.len) {
                tp_buf_free(&b);
                return NULL;
            }
            break;
        }
        size_t n = strlen(l);
        bool more = n && l[n - 1] == '\\';
        tp_buf_add(&b, l, more ? n - 1 : n);
        free(l);
        if (!more)
            break;
        tp_buf_add(&b, "\n", 1);
        prompt = ". ";
    }
    char *s = strndup(tp_buf_str(&b), b.len);
    tp_buf_free(&b);
    return s;
}

static void status_line(chat *ch, const reply *r, double secs)
{
    if (!ch->verbose && !ch->tty_out)
        return;
    double tps = secs > 0 ? r->completion_tokens / secs : 0;
    fprintf(stderr, "%s[%u prompt tokens, %u cached, %u generated in %.2f s, %.1f tokens/s, %s]%s\n",
            ch->tty_out ? DIM : "", r->prompt_tokens, r->cached_tokens, r->completion_tokens, secs, tps,
            r->reason ? r->reason : "?", ch->tty_out ? BOLD_OFF : "");
}

/* One turn: the user's text joins the history, the reply streams, and the
 * assistant's turn joins it too (a cancelled or failed turn leaves the
 * history as it was). */
static int turn(chat *ch, const char *text, tp_err *err)
{
    cJSON *user = message("user", text, strlen(text));
    if (!user || !cJSON_AddItemToArray(ch->history, user)) {
        cJSON_Delete(user);
        return tp_err_set(err, TP_ENOMEM, "out of memory");
    }
    genopts conv;
    int rc = conversation(ch, &conv, err);
    reply r = {0};
    ch->turn++;
    ch->at_line_start = true;
    drain(ch->sigfd);
    catch_sigint(true);
    double t0 = now_s();
    if (!rc)
        rc = ch->model ? local_turn(ch, &conv, &r, err) : daemon_turn(ch, &conv, &r, err);
    double secs = now_s() - t0;
    catch_sigint(false);
    drain(ch->sigfd);
    genopts_free(&conv);
    if (r.tool_calls)
        show_calls(ch, r.tool_calls);
    end_line(ch);
    if (!rc && !r.cancelled && r.error[0])
        rc = tp_err_set(err, TP_EIO, "the reply failed: %s", r.error);
    if (rc || r.cancelled) {
        cJSON_DeleteItemFromArray(ch->history, cJSON_GetArraySize(ch->history) - 1);
        if (r.cancelled)
            fprintf(stderr, "[cancelled]\n");
    } else {
        cJSON *a = message("assistant", tp_buf_str(&r.content), r.content.len);
        if (a && r.tool_calls) {
            cJSON_AddItemToObject(a, "tool_calls", r.tool_calls);
            r.tool_calls = NULL;
        }
        if (!a || !cJSON_AddItemToArray(ch->history, a)) {
            cJSON_Delete(a);
            rc = tp_err_set(err, TP_ENOMEM, "out of memory");
        }
        status_line(ch, &r, secs);
    }
    cJSON_Delete(r.tool_calls);
    tp_buf_free(&r.content);
    tp_buf_free(&r.reasoning);
    return rc;
}

/* A /command: 1 handled, 0 not one. */
static int command(chat *ch, const char *line)
{
    tp_err err;
    tp_err_clear(&err);
    const char *arg = strchr(line, ' ');
    size_t n = arg ? (size_t)(arg - line) : strlen(line);
    while (arg && *arg == ' ')
        arg++;
    if (arg && !*arg)
        arg = NULL;
#define IS(s) (n == strlen(s) && !memcmp(line, s, n))
    if (IS("/help")) {
        fputs(commands_help, stdout);
    } else if (IS("/reset")) {
        const cJSON *first = cJSON_GetArrayItem(ch->history, 0);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(first, "role");
        cJSON *keep = cJSON_IsString(role) && !strcmp(role->valuestring, "system") ? cJSON_Duplicate(first, 1) : NULL;
        cJSON_Delete(ch->history);
        ch->history = cJSON_CreateArray();
        if (keep)
            cJSON_AddItemToArray(ch->history, keep);
        fprintf(stderr, "[conversation reset]\n");
    } else if (IS("/system")) {
        if (set_system(ch, arg))
            fprintf(stderr, "tokpipe chat: out of memory\n");
        else
            fprintf(stderr, arg ? "[system message set]\n" : "[system message dropped]\n");
    } else if (IS("/save") || IS("/load")) {
        if (!arg)
            fprintf(stderr, "tokpipe chat: %.*s needs a FILE\n", (int)n, line);
        else if ((IS("/save") ? save_file(ch, arg, &err) : load_file(ch, arg, &err)))
            fprintf(stderr, "tokpipe chat: %.*s: %s\n", (int)n, line, err.msg);
        else
            fprintf(stderr, "[%s %d messages %s %s]\n", IS("/save") ? "saved" : "loaded",
                    cJSON_GetArraySize(ch->history), IS("/save") ? "to" : "from", arg);
    } else {
        return 0;
    }
#undef IS
    return 1;
}

static int parse(chat *ch, int argc, char **argv, tp_err *err)
{
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "--help") || !strcmp(f, "-h"))
            return 1;
        int rc = genopts_parse_one(&ch->g, argc, argv, &i, err);
        if (rc == 0)
            rc = tp_client_parse_arg(&ch->a, argc, argv, &i, err);
        if (rc < 0)
            return rc;
        if (rc == 1)
            continue;
        if (!strcmp(f, "--hide-thinking")) {
            ch->hide_thinking = true;
            continue;
        }
        if (!strcmp(f, "--verbose")) {
            ch->verbose = true;
            continue;
        }
        if (!strcmp(f, "--show-prompt")) {
            ch->show_prompt = true;
            continue;
        }
        bool valued = !strcmp(f, "--model") || !strcmp(f, "--tokenizer") || !strcmp(f, "--template") ||
                      !strcmp(f, "--system");
        if (!valued)
            return tp_err_set(err, TP_EINVAL, "unknown argument '%s' (see tokpipe chat --help)", f);
        if (i + 1 >= argc)
            return tp_err_set(err, TP_EINVAL, "%s needs a value", f);
        const char *v = argv[++i];
        if (!strcmp(f, "--model"))
            ch->model_path = v;
        else if (!strcmp(f, "--tokenizer"))
            ch->tok_path = v;
        else if (!strcmp(f, "--template"))
            ch->template_path = v;
        else
            ch->system = v;
    }
    if (ch->g.n_prompts)
        return tp_err_set(err, TP_EINVAL, "--prompt: chat reads the turns from its input");
    if (ch->g.grammar || ch->g.json_schema || ch->g.json_mode)
        return tp_err_set(err, TP_EINVAL, "--grammar/--json-schema/--json-mode: not for a conversation");
    if (ch->g.json || ch->g.logprobs)
        return tp_err_set(err, TP_EINVAL, "--json/--logprobs: not for a conversation");
    if ((ch->tok_path || ch->template_path || ch->show_prompt) && !ch->model_path)
        return tp_err_set(err, TP_EINVAL, "--tokenizer/--template/--show-prompt: only with --model (the daemon renders "
                          "with its own template)");
    return 0;
}

/* The --messages conversation (and its tools) as the first history. */
static int initial_history(chat *ch, tp_err *err)
{
    ch->history = cJSON_CreateArray();
    if (!ch->history)
        return tp_err_set(err, TP_ENOMEM, "out of memory");
    if (ch->g.tools.ptr) {
        if (!(ch->tools = strndup(ch->g.tools.ptr, ch->g.tools.len)))
            return tp_err_set(err, TP_ENOMEM, "out of memory");
        ch->tools_len = ch->g.tools.len;
    }
    if (ch->g.n_messages) {
        /* rebuild the turns as JSON, the shape /save writes */
        for (size_t i = 0; i < ch->g.n_messages; i++) {
            const tp_chat_msg *m = &ch->g.messages[i];
            char role[64];
            snprintf(role, sizeof role, "%.*s", (int)m->role.len, m->role.ptr);
            cJSON *j = message(role, m->content.ptr ? m->content.ptr : "", m->content.len);
            if (!j)
                return tp_err_set(err, TP_ENOMEM, "out of memory");
            if (m->name.ptr) {
                char *s = strndup(m->name.ptr, m->name.len);
                cJSON_AddStringToObject(j, "name", s ? s : "");
                free(s);
            }
            if (m->tool_call_id.ptr) {
                char *s = strndup(m->tool_call_id.ptr, m->tool_call_id.len);
                cJSON_AddStringToObject(j, "tool_call_id", s ? s : "");
                free(s);
            }
            if (m->n_tool_calls)
                cJSON_AddItemToObject(j, "tool_calls", evfmt_tool_calls(m->tool_calls, m->n_tool_calls));
            cJSON_AddItemToArray(ch->history, j);
        }
    }
    if (ch->system && set_system(ch, ch->system))
        return tp_err_set(err, TP_ENOMEM, "out of memory");
    return 0;
}

int cmd_chat(int argc, char **argv)
{
    chat ch;
    memset(&ch, 0, sizeof ch);
    ch.sigfd = -1;
    genopts_init(&ch.g);
    tp_err err;
    tp_err_clear(&err);
    int prc = parse(&ch, argc, argv, &err);
    if (prc == 1) {
        fputs(usage_text, stdout);
        genopts_print_help(stdout);
        fputs(TP_CLIENT_ARGS_HELP, stdout);
        genopts_free(&ch.g);
        return 0;
    }
    if (prc) {
        fprintf(stderr, "tokpipe chat: %s\n", err.msg);
        genopts_free(&ch.g);
        return 2;
    }
    ch.tty_in = isatty(STDIN_FILENO);
    ch.tty_out = isatty(STDOUT_FILENO);
    int p[2];
    int rc = pipe2(p, O_CLOEXEC | O_NONBLOCK) ? tp_err_set(&err, TP_EIO, "pipe: %s", strerror(errno)) : 0;
    if (!rc) {
        ch.sigfd = p[0];
        interrupt_pipe_w = p[1];
    }
    if (!rc)
        rc = initial_history(&ch, &err);
    if (!rc)
        rc = ch.model_path ? engine_open(&ch, &err) : daemon_open(&ch, &err);
    if (!rc && ch.tty_in)
        fprintf(stderr, "tokpipe chat: %s. /help for commands, Ctrl-D to end.\n",
                ch.model_path ? ch.model_path : tp_client_front(ch.c));
    while (!rc) {
        char *in = read_input(&ch);
        if (!in)
            break;
        if (in[0] == '/' && command(&ch, in)) {
            free(in);
            continue;
        }
        if (!in[strspn(in, " \t\n")]) {
            free(in);
            continue;
        }
        rc = turn(&ch, in, &err);
        free(in);
        /* at a terminal a failed turn is said and the conversation goes on;
         * a script stops at it (exit status 1) */
        if (rc && ch.tty_in) {
            fprintf(stderr, "tokpipe chat: %s\n", err.msg);
            rc = 0;
        }
    }
    if (rc)
        fprintf(stderr, "tokpipe chat: %s\n", err.msg);
    if (ch.tty_in && !rc)
        fputc('\n', stderr);
    cJSON_Delete(ch.history);
    free(ch.tools);
    tp_client_free(ch.c);
    engine_close(&ch);
    genopts_free(&ch.g);
    if (ch.sigfd >= 0) {
        close(p[0]);
        close(p[1]);
    }
    return rc ? 1 : 0;
}
