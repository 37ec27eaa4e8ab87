/* tokpipe info: what the daemon serves (INFO): the model's vocabulary,
 * context, BOS/EOS/end-of-generation ids, special tokens, chat template,
 * weight type, and the broker's limits. */
#include "tools.h"

#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "evfmt.h"

const char cmd_info_summary[] = "print the daemon's model (vocabulary, context, special tokens) and limits";

static const char usage_text[] =
    "usage: tokpipe info [--json] [connection options]\n"
    "\n"
    "Asks tokpiped (INFO) what a producer needs before it submits: model id,\n"
    "vocabulary size, context length (prompt + completion tokens), BOS/EOS ids,\n"
    "the ids that end generation, the special tokens, whether the model has a\n"
    "chat template, its weight type, and the broker's limits (max_tokens, stop\n"
    "strings, logit_bias entries, top_logprobs, ...).\n"
    "  --json   one JSON object with the INFO_REPLY keys instead\n"
    "exit status: 0 ok, 1 daemon unreachable, 2 bad usage.\n\n" TP_CLIENT_ARGS_HELP;

static cJSON *ids_array(const int32_t *ids, size_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

static cJSON *info_json(const tp_m_info_reply *r)
{
    cJSON *o = cJSON_CreateObject();
    char *mid = strndup(r->model_id.ptr ? r->model_id.ptr : "", r->model_id.len);
    cJSON_AddStringToObject(o, "model_id", mid ? mid : "");
    free(mid);
    cJSON_AddNumberToObject(o, "vocab_size", r->vocab_size);
    cJSON_AddNumberToObject(o, "context_length", r->context_length);
    cJSON_AddNumberToObject(o, "bos_id", r->bos_id);
    cJSON_AddNumberToObject(o, "eos_id", r->eos_id);
    cJSON_AddItemToObject(o, "eog_ids", ids_array(r->eog_ids, r->n_eog_ids));
    cJSON *sp = cJSON_AddArrayToObject(o, "special_tokens");
    tp_str *pieces = r->special_ids.n ? malloc(r->special_ids.n * sizeof *pieces) : NULL;
    /* decoding checked the frames */
    if (pieces && !tp_proto_special_split(r->special_ids, r->special_text, pieces, NULL))
        for (size_t i = 0; i < r->special_ids.n; i++) {
            cJSON *e = cJSON_CreateObject();
            char *p = strndup(pieces[i].ptr, pieces[i].len);
            cJSON_AddNumberToObject(e, "id", tp_raw_i32(r->special_ids, i));
            cJSON_AddStringToObject(e, "piece", p ? p : "");
            free(p);
            cJSON_AddItemToArray(sp, e);
        }
    free(pieces);
    cJSON_AddBoolToObject(o, "chat_template", r->chat_template);
    char *wt = strndup(r->weight_type.ptr ? r->weight_type.ptr : "", r->weight_type.len);
    cJSON_AddStringToObject(o, "weight_type", wt ? wt : "");
    free(wt);
    cJSON *l = cJSON_AddObjectToObject(o, "limits");
    const tp_m_info_limits *x = &r->limits;
    cJSON_AddNumberToObject(l, "max_tokens", x->max_tokens);
    cJSON_AddNumberToObject(l, "max_prompt_bytes", x->max_prompt_bytes);
    cJSON_AddNumberToObject(l, "max_stop_strings", x->max_stop_strings);
    cJSON_AddNumberToObject(l, "max_stop_len", x->max_stop_len);
    cJSON_AddNumberToObject(l, "max_stop_ids", x->max_stop_ids);
    cJSON_AddNumberToObject(l, "max_penalty_window", x->max_penalty_window);
    cJSON_AddNumberToObject(l, "max_concurrent_jobs", x->max_concurrent_jobs);
    cJSON_AddNumberToObject(l, "max_logit_bias", x->max_logit_bias);
    cJSON_AddNumberToObject(l, "max_top_logprobs", x->max_top_logprobs);
    cJSON_AddNumberToObject(l, "max_grammar_bytes", x->max_grammar_bytes);
    cJSON_AddNumberToObject(l, "max_grammar_rules", x->max_grammar_rules);
    cJSON_AddNumberToObject(l, "max_grammar_compile_ms", x->max_grammar_compile_ms);
    cJSON_AddNumberToObject(l, "max_schema_bytes", x->max_schema_bytes);
    cJSON_AddNumberToObject(l, "max_schema_depth", x->max_schema_depth);
    return o;
}

static void print_human(const cJSON *o)
{
    for (const cJSON *it = o->child; it; it = it->next) {
        if (cJSON_IsObject(it)) {
            for (const cJSON *k = it->child; k; k = k->next)
                printf("%s.%s: %.0f\n", it->string, k->string, cJSON_GetNumberValue(k));
        } else if (!strcmp(it->string, "special_tokens")) {
            printf("special_tokens:");
            for (const cJSON *e = it->child; e; e = e->next) {
                /* quoted: pieces may hold newlines or spaces (llama2.c's "\n<s>\n") */
                char *piece = cJSON_PrintUnformatted(cJSON_GetObjectItem(e, "piece"));
                printf(" %.0f=%s", cJSON_GetNumberValue(cJSON_GetObjectItem(e, "id")), piece ? piece : "?");
                free(piece);
            }
            printf("\n");
        } else {
            char *v = cJSON_IsString(it) ? NULL : cJSON_PrintUnformatted(it);
            printf("%s: %s\n", it->string, v ? v : cJSON_GetStringValue(it));
            free(v);
        }
    }
}

int cmd_info(int argc, char **argv)
{
    tp_client_cmd c = {.name = "info", .usage = usage_text, .json_flag = "--json"};
    int rc = tp_client_cmd_parse(&c, argc, argv);
    if (rc >= 0)
        return rc;
    rc = tp_client_cmd_call(&c, TP_CMD_INFO, TP_CMD_INFO_REPLY);
    if (!rc) {
        cJSON *j = info_json(&c.reply.m.info_reply);
        if (c.json)
            evfmt_print_line(stdout, j);
        else {
            print_human(j);
            cJSON_Delete(j);
        }
    }
    return tp_client_cmd_done(&c, rc);
}
