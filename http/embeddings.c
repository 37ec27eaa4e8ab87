/* OpenAI's embeddings: POST /v1/embeddings.
 *
 * Each input (a string, or a list of token ids) is one tokpipe job
 * submitted with SUBMIT `embed`: the forward stage runs its prompt and
 * pools the hidden states after the final norm (the pooling the GGUF's
 * pooling_type names; last token when it names none; tokpipe's `pooling`
 * field picks mean, last or cls), the broker ends the job there and its
 * FINISH carries the vector. The inputs are decoded as /v1/completions'
 * prompt by oai.c (so the limits and refusals are its, naming `input`);
 * jobs of one request, like those of several, share the forward stage's
 * steps. The vector is L2-normalized (as OpenAI's, and llama.cpp server's
 * default); `dimensions` keeps its first N values and normalizes again
 * (Matryoshka truncation, as Qwen3-Embedding and OpenAI's v3 models take
 * it), N at most the model's width. encoding_format base64: the
 * little-endian float32 bytes, base64. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gw.h"

/* what the response needs of the request: {"base64": bool, "dimensions": N} */
static int decode_embeddings(const char *body, size_t len, oai_request *out, oai_error *e)
{
    memset(out, 0, sizeof *out);
    memset(e, 0, sizeof *e);
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root)
        return oai_fail(e, 400, NULL, "the request body is not valid JSON");
    cJSON *req = cJSON_CreateObject(), *state = cJSON_CreateObject();
    const char *pool = "model";
    int rc = 0;
    const cJSON *input = NULL;
    if (!cJSON_IsObject(root))
        rc = oai_fail(e, 400, NULL, "the request body must be a JSON object");
    for (const cJSON *f = rc ? NULL : root->child; f && !rc; f = f->next) {
        const char *k = f->string;
        if (!strcmp(k, "input")) {
            input = f;
        } else if (!strcmp(k, "model") || !strcmp(k, "user")) {
            if (!cJSON_IsNull(f))
                cJSON_AddItemToObject(req, k, cJSON_Duplicate(f, 1));
        } else if (!strcmp(k, "encoding_format")) {
            if (!cJSON_IsNull(f) && !(cJSON_IsString(f) && (!strcmp(f->valuestring, "float") ||
                                                             !strcmp(f->valuestring, "base64"))))
                rc = oai_fail(e, 400, k, "encoding_format: expected float or base64");
            else
                cJSON_AddBoolToObject(state, "base64", cJSON_IsString(f) && !strcmp(f->valuestring, "base64"));
        } else if (!strcmp(k, "dimensions")) {
            if (!cJSON_IsNull(f) && (!cJSON_IsNumber(f) || f->valuedouble != floor(f->valuedouble) ||
                                     f->valuedouble < 1 || f->valuedouble > 1 << 20))
                rc = oai_fail(e, 400, k, "dimensions: expected an integer >= 1");
            else if (!cJSON_IsNull(f))
                cJSON_AddNumberToObject(state, "dimensions", f->valuedouble);
        } else if (!strcmp(k, "pooling")) {   /* tokpipe's: the model's own unless asked */
            static const char *const pools[] = {"mean", "last", "cls", "model"};
            size_t i = 0;
            while (cJSON_IsString(f) && i < 4 && strcmp(pools[i], f->valuestring))
                i++;
            if (!cJSON_IsString(f) || i == 4)
                rc = oai_fail(e, 400, k, "pooling: expected mean, last, cls or model");
            else
                pool = pools[i];
        } else {
            rc = oai_fail(e, 400, k, "%s: unknown field", k);
        }
    }
    if (!rc && !input)
        rc = oai_fail(e, 400, "input", "input: required");
    if (!rc) {
        cJSON_AddItemToObject(req, "prompt", cJSON_Duplicate(input, 1));
        cJSON_AddNumberToObject(req, "max_tokens", 1);   /* the job ends after its prompt */
    }
    char *text = rc ? NULL : cJSON_PrintUnformatted(req);
    char *st = rc ? NULL : cJSON_PrintUnformatted(state);
    cJSON_Delete(root);
    cJSON_Delete(req);
    cJSON_Delete(state);
    if (!rc && (!text || !st))
        rc = oai_fail(e, 500, NULL, "out of memory");
    if (!rc && oai_decode(OAI_COMPLETIONS, text, strlen(text), out, e)) {
        if (!strncmp(e->param, "prompt", 6)) {   /* "prompt[2]" -> "input[2]" */
            char p[sizeof e->param];
            snprintf(p, sizeof p, "input%s", e->param + 6);
            memcpy(e->param, p, sizeof p);
        }
        if (!strncmp(e->message, "prompt", 6)) {
            char m[sizeof e->message];
            snprintf(m, sizeof m, "input%s", e->message + 6);
            memcpy(e->message, m, sizeof m);
        }
        rc = -1;
    }
    free(text);
    if (rc) {
        free(st);
        return -1;
    }
    out->api_state = st;
    out->embed = pool;
    return 0;
}

static cJSON *state_of(const gw_call *c)
{
    cJSON *s = c->oreq.api_state ? cJSON_Parse(c->oreq.api_state) : NULL;
    return s ? s : cJSON_CreateObject();
}

static size_t dims_of(const gw_call *c, size_t n)
{
    cJSON *s = state_of(c);
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(s, "dimensions");
    size_t k = cJSON_IsNumber(d) ? (size_t)d->valuedouble : n;
    cJSON_Delete(s);
    return k;
}

static int emb_refuse(const gw_call *c, char *msg, size_t msg_cap, char *param, size_t param_cap)
{
    for (size_t i = 0; i < c->n_ch; i++) {
        size_t n = c->ch[i].n_embd, k = dims_of(c, n);
        if (!n) {
            snprintf(msg, msg_cap, "job %s finished without an embedding (a worker that cannot pool?)",
                     c->ch[i].job_id);
            snprintf(param, param_cap, "%s", "");
            return 500;
        }
        if (k > n) {
            snprintf(msg, msg_cap, "dimensions: %zu, the model's embeddings have %zu", k, n);
            snprintf(param, param_cap, "%s", "dimensions");
            return 400;
        }
    }
    return 0;
}

static char *base64(const unsigned char *p, size_t n)
{
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *s = malloc((n + 2) / 3 * 4 + 1), *o = s;
    for (size_t i = 0; s && i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        *o++ = a[v >> 18 & 63];
        *o++ = a[v >> 12 & 63];
        *o++ = i + 1 < n ? a[v >> 6 & 63] : '=';
        *o++ = i + 2 < n ? a[v & 63] : '=';
    }
    if (s)
        *o = '\0';
    return s;
}

/* The first k values of v, L2-normalized (a zero vector stays zero). */
static void normalized(const float *v, size_t k, float *out)
{
    double ss = 0;
    for (size_t j = 0; j < k; j++)
        ss += (double)v[j] * v[j];
    double s = ss > 0 ? 1.0 / sqrt(ss) : 0.0;
    for (size_t j = 0; j < k; j++)
        out[j] = (float)(v[j] * s);
}

static char *emb_body(const gw_call *c, const char *model)
{
    cJSON *s = state_of(c);
    bool b64 = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "base64"));
    cJSON_Delete(s);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    uint64_t tokens = 0;
    bool oom = !o || !data;
    for (size_t i = 0; i < c->n_ch && !oom; i++) {
        const gw_choice *ch = &c->ch[i];
        size_t k = dims_of(c, ch->n_embd);
        float *v = malloc((k ? k : 1) * sizeof *v);
        cJSON *d = cJSON_CreateObject();
        if (!v || !d) {
            free(v);
            cJSON_Delete(d);
            oom = true;
            break;
        }
        normalized(ch->embd, k, v);
        cJSON_AddItemToArray(data, d);
        cJSON_AddStringToObject(d, "object", "embedding");
        cJSON_AddNumberToObject(d, "index", (double)ch->prompt);
        if (b64) {
            /* little-endian float32, as OpenAI's clients decode it (x86 and arm64 are) */
            char *t = base64((const unsigned char *)v, k * sizeof *v);
            oom = !t || !cJSON_AddStringToObject(d, "embedding", t);
            free(t);
        } else {
            cJSON *a = cJSON_AddArrayToObject(d, "embedding");
            for (size_t j = 0; a && j < k; j++)
                cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v[j]));
            oom = !a;
        }
        free(v);
        tokens += ch->prompt_tokens;
    }
    cJSON_AddStringToObject(o, "model", model);
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)tokens);
    cJSON_AddNumberToObject(u, "total_tokens", (double)tokens);
    char *out = oom ? NULL : cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return out;
}

static char *emb_stream_error(int status, const char *message, const char *param)
{
    return gw_error_json(status, message, param);   /* never streamed: the decoder takes no stream */
}

static void emb_param(const char *field, char *out, size_t cap)
{
    char f[128];
    oai_param_of_field(field, f, sizeof f);
    if (!strncmp(f, "prompt", 6))
        snprintf(out, cap, "input%s", f + 6);
    else
        snprintf(out, cap, "%s", f);
}

static char *emb_error(int status, const char *message, const char *param, const char *code)
{
    char p[64], m[TP_PROTO_MAX_ERROR + 160];
    emb_param(param ? param : "", p, sizeof p);
    snprintf(m, sizeof m, "%s%s", strncmp(message, "prompt", 6) ? "" : "input",
             strncmp(message, "prompt", 6) ? message : message + 6);
    return gw_error_json_code(status, m, p, code);
}

const gw_api gw_api_embeddings = {
    .path = "/v1/embeddings",
    .endpoint = GW_EP_EMBEDDINGS,
    .decode = decode_embeddings,
    .id_prefix = "emb-",
    .error = emb_error,
    .stream_error = emb_stream_error,
    .param = emb_param,
    .body = emb_body,
    .refuse = emb_refuse,
};
