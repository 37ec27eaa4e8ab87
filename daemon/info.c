/* INFO: what a producer needs to know before it submits — the model's
 * vocabulary, context, BOS/EOS and end-of-generation ids, special tokens,
 * chat template presence, weight type — and the broker's limits.
 *
 * The model facts come from the workers' READY (registry.c passes each one
 * here); the optional ones (eog_ids, special tokens, chat_template,
 * weight_type) are kept from the latest READY that carried any (one from a
 * worker with the vocabulary wins over a forward-only one), so a
 * worker build that learns more about its model only has to send more keys
 * in READY. */
#include <stdlib.h>
#include <string.h>

#include "info.h"
#include "log.h"
#include "registry.h"
#include "tokpipe/grammar.h"
#include "tokpipe/sampler.h"
#include "tokpipe/toolcall.h"

struct binfo {
    int32_t *eog, *special;
    size_t n_eog, n_special;
    tp_str *pieces;          /* point into text */
    unsigned char *text;     /* READY's special_text, as INFO_REPLY sends it on */
    size_t text_len;
    bool chat_template;
    tp_tc_family tool_family;   /* the template's tool-call syntax (TP_TC_NONE: none or unknown) */
    bool think_open;            /* its generation prompt opens the thinking */
    char weight_type[TP_PROTO_MAX_NAME + 1];
    bool from_vocab;         /* from a worker that holds the vocabulary */
    int32_t bos, eos;        /* its BOS / EOS (a forward-only worker guesses 1 / 2) */
};

void info_free(broker *b)
{
    if (!b->info)
        return;
    free(b->info->eog);
    free(b->info->special);
    free(b->info->pieces);
    free(b->info->text);
    free(b->info);
    b->info = NULL;
}

void info_on_ready(broker *b, const tp_m_ready *r)
{
    if ((!r->n_eog_ids && !r->special_ids.n && !r->chat_template && !r->weight_type.len) ||
        r->stages == TP_STAGE_DRAFT)
        return;   /* (a draft worker's READY speaks for the draft model) */
    /* a worker with the vocabulary (tokenize, stop) knows the end ids and
     * special tokens; a forward-only one only the model file's */
    bool vocab = r->stages & (TP_STAGE_TOKENIZE | TP_STAGE_STOP);
    if (b->info && b->info->from_vocab && !vocab)
        return;
    struct binfo *in = calloc(1, sizeof *in);
    size_t n_sp = r->special_ids.n;
    if (in) {
        in->eog = malloc((r->n_eog_ids + 1) * sizeof *in->eog);
        in->special = malloc((n_sp + 1) * sizeof *in->special);
        in->pieces = calloc(n_sp + 1, sizeof *in->pieces);
        in->text = malloc(r->special_text.n + 1);
    }
    if (!in || !in->eog || !in->special || !in->pieces || !in->text) {
        if (in) {
            free(in->eog), free(in->special), free(in->pieces), free(in->text);
            free(in);
        }
        blog("INFO: out of memory for the model's special tokens");
        return;
    }
    memcpy(in->eog, r->eog_ids, r->n_eog_ids * sizeof *in->eog);
    in->n_eog = r->n_eog_ids;
    for (size_t i = 0; i < n_sp; i++)
        in->special[i] = tp_raw_i32(r->special_ids, i);
    in->n_special = n_sp;
    if (r->special_text.n)
        memcpy(in->text, r->special_text.data, r->special_text.n);
    in->text_len = r->special_text.n;
    /* checked when READY was decoded: cannot fail */
    tp_proto_special_split((tp_raw){in->special, n_sp}, (tp_raw){in->text, in->text_len}, in->pieces, NULL);
    /* only a tokenize worker loads the template: one that has it says so */
    in->chat_template = r->chat_template || (b->info && b->info->chat_template);
    in->tool_family = b->info ? b->info->tool_family : TP_TC_NONE;
    in->think_open = r->tool_syntax.ptr ? r->think_open : b->info && b->info->think_open;
    for (int f = 0; r->tool_syntax.ptr && f < TP_TC_COUNT; f++)
        if (r->tool_syntax.len == strlen(tp_tc_family_name((tp_tc_family)f)) &&
            !memcmp(r->tool_syntax.ptr, tp_tc_family_name((tp_tc_family)f), r->tool_syntax.len))
            in->tool_family = (tp_tc_family)f;
    size_t wl = r->weight_type.len < TP_PROTO_MAX_NAME ? r->weight_type.len : TP_PROTO_MAX_NAME;
    memcpy(in->weight_type, r->weight_type.ptr ? r->weight_type.ptr : "", wl);
    in->weight_type[wl] = '\0';
    in->from_vocab = vocab;
    in->bos = r->bos_id, in->eos = r->eos_id;
    if (!wl && b->info)   /* a worker without the weights: keep what one with them said */
        memcpy(in->weight_type, b->info->weight_type, sizeof in->weight_type);
    info_free(b);
    b->info = in;
    /* admission checked token references against the old names */
    memset(&b->gmemo, 0, sizeof b->gmemo);
}

bool info_think_open(const broker *b)
{
    return b->info && b->info->think_open;
}

tp_tc_family info_tool_family(const broker *b)
{
    return b->info ? b->info->tool_family : TP_TC_NONE;
}

static int find_special(void *ctx, const char *text, size_t len)
{
    const struct binfo *in = ctx;
    for (size_t i = 0; in && i < in->n_special; i++)
        if (in->pieces[i].len == len && !memcmp(in->pieces[i].ptr, text, len))
            return in->special[i];
    return -1;
}

void info_gnames(const broker *b, tp_gnames *out)
{
    const bworker *m = registry_model(b);
    *out = (tp_gnames){m ? (int)m->vocab : 0, find_special, b->info};
}

static uint32_t u32_of(int v)
{
    return v > 0 ? (uint32_t)v : 0;
}

void info_reply(broker *b, uint64_t req, tp_msg *r)
{
    tp_msg_init(r, TP_FAM_JOB, TP_CMD_INFO_REPLY);
    r->req = req;
    r->status = TP_ST_OK;
    tp_m_info_reply *o = &r->info_reply;
    const bworker *m = registry_model(b);
    o->model_id = tp_str_of(m ? m->model_id : "");
    o->vocab_size = m ? m->vocab : 0;
    o->bos_id = b->info && b->info->from_vocab ? b->info->bos : m ? m->bos : -1;
    o->eos_id = b->info && b->info->from_vocab ? b->info->eos : m ? m->eos : -1;
    /* the context is the forward workers' (a tokenize-only READY says 0) */
    for (int i = 0; i < B_MAX_WORKERS; i++)
        if (b->workers[i].live && (b->workers[i].stages & TP_STAGE_FORWARD) && b->workers[i].seq_len)
            o->context_length = b->workers[i].seq_len;
    if (b->info) {
        o->eog_ids = b->info->eog, o->n_eog_ids = b->info->n_eog;
        if (b->info->n_special) {
            o->special_ids = (tp_raw){b->info->special, b->info->n_special};
            o->special_text = (tp_raw){b->info->text, b->info->text_len};
        }
        o->chat_template = b->info->chat_template;
        o->weight_type = tp_str_of(b->info->weight_type);
    } else if (m && m->eos >= 0) {
        /* a READY without eog_ids: EOS is the one we know (encode only reads it) */
        o->eog_ids = (int32_t *)(uintptr_t)&m->eos, o->n_eog_ids = 1;
    }
    const tp_config *c = b->cfg;
    o->limits = (tp_m_info_limits){
        .max_tokens = u32_of(c->max_tokens_limit),
        .max_prompt_bytes = u32_of(c->max_prompt_bytes),
        .max_stop_strings = u32_of(c->max_stop_strings),
        .max_stop_len = u32_of(c->max_stop_len),
        .max_stop_ids = u32_of(c->max_stop_ids),
        .max_penalty_window = u32_of(c->max_penalty_window),
        .max_concurrent_jobs = u32_of(c->max_concurrent_jobs),
        .max_logit_bias = TP_PROTO_MAX_LOGIT_BIAS,
        .max_top_logprobs = TP_SAMPLER_MAX_TOP_LOGPROBS,
        .max_grammar_bytes = u32_of(c->grammar_max_bytes),
        .max_grammar_rules = u32_of(c->grammar_max_rules),
        .max_grammar_compile_ms = u32_of(c->grammar_max_compile_ms),
        .max_schema_bytes = u32_of(c->schema_max_bytes),
        .max_schema_depth = u32_of(c->schema_max_depth),
    };
}
