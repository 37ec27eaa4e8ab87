/* libFuzzer target for the sampler: parameters, vocabulary, prompt, ban list
 * and logits (NaN and infinities included) all come from the input. Checks
 * the contract, not just memory safety: a sampled token is in range, never
 * banned before min_tokens, never a -inf/NaN logit while a finite one
 * exists, the same on a repeated call, the logits left unchanged, an id
 * with a logit bias of -100 never picked, and the pick's logprobs (raw or
 * processed) <= 0 with the alternatives ranked. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "tokpipe/sampler.h"

struct in {
    const uint8_t *d;
    size_t n;
};

static uint8_t byte(struct in *in)
{
    if (!in->n)
        return 0;
    in->n--;
    return *in->d++;
}

static float unit(struct in *in) { return byte(in) / 200.0f; } /* a bit past 1: invalid too */

static float logit(struct in *in)
{
    uint8_t b = byte(in);
    if (b == 255)
        return NAN;
    if (b == 254)
        return -INFINITY;
    if (b == 253)
        return INFINITY;
    return (float)b / 8.0f - 16.0f;
}

/* logprobs of the pick: <= 0, alternatives ranked, at most n_top. */
static void check_logprobs(tp_sampler *s, const float *logits, int32_t t, size_t n_top, int mode)
{
    tp_logprob top[8];
    float lp;
    size_t n = 99;
    if (tp_sampler_logprobs(s, logits, mode ? TP_LOGPROBS_PROCESSED : TP_LOGPROBS_RAW, t, n_top, &lp, top, &n, NULL))
        return;
    if (n > n_top || lp > 1e-5f || isnan(lp))
        abort();
    for (size_t k = 0; k < n; k++)
        if (top[k].logprob > 1e-5f || (k && top[k].logprob > top[k - 1].logprob))
            abort();
}

static void check_step(tp_sampler *s, const tp_sampler_params *p, const float *logits, int v, size_t n_top, int mode)
{
    float copy[64];
    memcpy(copy, logits, sizeof *logits * v);
    int32_t t, again;
    int rc = tp_sampler_sample(s, logits, &t, NULL);
    if (memcmp(copy, logits, sizeof *logits * v))
        abort();
    if (rc)
        return;
    if (t < 0 || t >= v || tp_sampler_sample(s, logits, &again, NULL) || again != t)
        abort();
    bool banned = false;
    for (size_t k = 0; k < p->n_ban; k++)
        banned |= p->ban_ids[k] == t;
    if (banned && tp_sampler_n_accepted(s) < (size_t)p->min_tokens)
        abort();
    for (size_t k = 0; k < p->n_bias; k++)   /* a bias of -100 bans outright */
        if (p->bias_ids[k] == t && p->bias_values[k] <= -100.0f)
            abort();
    if (!(logits[t] > -INFINITY)) {
        for (int i = 0; i < v; i++) /* only allowed if nothing finite was allowed */
            if (isfinite(logits[i]) && p->repetition_penalty == 1.0f &&
                p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f && !p->n_ban && !p->n_bias)
                abort();
    }
    check_logprobs(s, logits, t, n_top, mode);
    tp_sampler_accept(s, t, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct in in = {data, size};
    int v = 1 + byte(&in) % 64;
    tp_sampler_params p = tp_sampler_params_default();
    p.temperature = unit(&in) * 2.0f - 0.1f;
    p.top_k = (int)byte(&in) % 70 - 2;
    p.top_p = unit(&in);
    p.min_p = unit(&in) - 0.05f;
    p.repetition_penalty = unit(&in) * 2.0f;
    p.presence_penalty = unit(&in) * 4.5f - 2.2f;
    p.frequency_penalty = unit(&in) * 4.5f - 2.2f;
    p.penalty_window = (int)byte(&in) % 20 - 1;
    p.seed = byte(&in);
    p.min_tokens = (int)byte(&in) % 10 - 1;
    int32_t ban[4], prompt[16];
    p.n_ban = byte(&in) % 5;
    for (size_t k = 0; k < p.n_ban; k++)
        ban[k] = (int32_t)byte(&in) % (v + 1); /* v itself is out of range */
    p.ban_ids = ban;
    size_t n_prompt = byte(&in) % 17;
    for (size_t k = 0; k < n_prompt; k++)
        prompt[k] = (int32_t)byte(&in) % v;
    uint8_t typ = byte(&in);
    p.typical_p = typ < 128 ? 1.0f : (float)(typ - 128) / 120.0f; /* 0 and past 1: invalid too */
    int32_t bias_ids[3];
    float bias_values[3];
    p.n_bias = byte(&in) % 4;
    for (size_t k = 0; k < p.n_bias; k++) {
        bias_ids[k] = (int32_t)byte(&in) % (v + 1);
        bias_values[k] = ((float)byte(&in) - 128.0f) * 0.8f; /* [-102.4, 101.6]: some out of range */
    }
    p.bias_ids = bias_ids;
    p.bias_values = bias_values;
    uint8_t lpb = byte(&in);
    size_t n_top = lpb % 9;
    int mode = lpb >= 128;
    tp_sampler *s = NULL;
    if (tp_sampler_new(&p, v, prompt, n_prompt, &s, NULL) != 0)
        return 0;
    float logits[64];
    for (int step = 0; step < 8 && in.n; step++) {
        for (int i = 0; i < v; i++)
            logits[i] = logit(&in);
        check_step(s, &p, logits, v, n_top, mode);
    }
    tp_sampler_free(s);
    return 0;
}
