/* The OpenAI endpoints as the bridge sees them (gw_api): /v1/completions
 * and /v1/chat/completions answer in render.c's bodies and "data: {...}"
 * SSE chunks ended by "data: [DONE]"; their requests are oai.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gw.h"

static char *oai_stream_error(int status, const char *message, const char *param)
{
    char *j = gw_error_json(status, message, param);
    size_t n = j ? strlen(j) + 32 : 0;
    char *s = j ? malloc(n) : NULL;
    if (s)
        snprintf(s, n, "data: %s\n\ndata: [DONE]\n\n", j);
    free(j);
    return s;
}

static char *oai_text(gw_call *c, const char *model, size_t i, const char *text, size_t len, size_t lp_from,
                      size_t lp_to)
{
    return gw_chunk_sse(c, model, i, text, len, lp_from, lp_to, false);
}

static char *oai_reasoning(gw_call *c, const char *model, size_t i, const char *s, size_t len)
{
    return gw_delta_sse(c, model, i, s, len);
}

static char *oai_call(gw_call *c, const char *model, size_t i, size_t k, const char *id, size_t id_len,
                      const char *name, size_t name_len, const char *args, size_t args_len)
{
    return gw_call_sse(c, model, i, k, id, id_len, name, name_len, args, args_len);
}

static char *oai_finish(gw_call *c, const char *model, size_t i)
{
    return gw_chunk_sse(c, model, i, NULL, 0, 0, 0, true);
}

/* stream_options.include_usage: a usage chunk before [DONE] */
static char *oai_close(gw_call *c, const char *model)
{
    char *u = c->oreq.include_usage ? gw_usage_sse(c, model) : NULL;
    size_t n = (u ? strlen(u) : 0) + 16;
    char *s = (u || !c->oreq.include_usage) ? malloc(n) : NULL;
    if (s)
        snprintf(s, n, "%sdata: [DONE]\n\n", u ? u : "");
    free(u);
    return s;
}

static int decode_completions(const char *body, size_t len, oai_request *out, oai_error *e)
{
    return oai_decode(OAI_COMPLETIONS, body, len, out, e);
}

static int decode_chat(const char *body, size_t len, oai_request *out, oai_error *e)
{
    return oai_decode(OAI_CHAT, body, len, out, e);
}

const gw_api gw_api_completions = {
    .path = "/v1/completions",
    .endpoint = GW_EP_COMPLETIONS,
    .decode = decode_completions,
    .id_prefix = "cmpl-",
    .error = gw_error_json_code,
    .stream_error = oai_stream_error,
    .param = oai_param_of_field,
    .body = gw_completion_json,
    .text = oai_text,
    .reasoning = oai_reasoning,
    .call = oai_call,
    .finish = oai_finish,
    .close = oai_close,
};

const gw_api gw_api_chat = {
    .path = "/v1/chat/completions",
    .endpoint = GW_EP_CHAT,
    .decode = decode_chat,
    .id_prefix = "chatcmpl-",
    .error = gw_error_json_code,
    .stream_error = oai_stream_error,
    .param = oai_param_of_field,
    .body = gw_completion_json,
    .text = oai_text,
    .reasoning = oai_reasoning,
    .call = oai_call,
    .finish = oai_finish,
    .close = oai_close,
};
