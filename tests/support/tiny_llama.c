#include "tiny_llama.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

size_t tiny_llama_floats(const tiny_shape *s)
{
    size_t d = s->dim, L = s->layers, h = s->hidden, V = s->vocab, hs = d / s->heads;
    size_t kvd = hs * s->kv_heads;
    size_t n = V * d + L * d + L * d * d + 2 * L * d * kvd + L * d * d + L * d + 3 * L * h * d + d +
               (size_t)s->seq_len * hs;
    return n + (s->separate_classifier ? V * d : 0);
}

static float uniform(uint64_t *st)
{
    *st ^= *st << 13; *st ^= *st >> 7; *st ^= *st << 17;
    return (float)((*st >> 40) / (double)(1 << 24));
}

float *tiny_llama_build(const tiny_shape *s, unsigned seed, float scale, size_t *size)
{
    size_t nf = tiny_llama_floats(s);
    float *buf = malloc(28 + nf * 4);
    if (!buf)
        return NULL;
    int32_t hdr[7] = {s->dim, s->hidden, s->layers, s->heads, s->kv_heads,
                      s->separate_classifier ? -s->vocab : s->vocab, s->seq_len};
    memcpy(buf, hdr, 28);
    uint64_t st = 0x9e3779b97f4a7c15ull ^ seed;
    float *w = buf + 7;
    for (size_t i = 0; i < nf; i++)
        w[i] = (2 * uniform(&st) - 1) * scale;
    /* RMSNorm weights near 1 so activations keep a sane size. */
    size_t d = s->dim, L = s->layers, V = s->vocab, hs = d / s->heads, kvd = hs * s->kv_heads;
    float *rms_att = w + V * d, *rms_ffn = rms_att + L * d + 2 * L * d * d + 2 * L * d * kvd;
    float *rms_final = rms_ffn + L * d + 3 * L * d * s->hidden;
    for (size_t i = 0; i < L * d; i++) {
        rms_att[i] += 1.0f;
        rms_ffn[i] += 1.0f;
    }
    for (size_t i = 0; i < d; i++)
        rms_final[i] += 1.0f;
    *size = 28 + nf * 4;
    return buf;
}

/* y[r] = sum_k W[r][k] x[k], W row-major float, in double. */
static void mv(double *y, const float *W, const double *x, int rows, int cols)
{
    for (int r = 0; r < rows; r++) {
        double a = 0;
        for (int k = 0; k < cols; k++)
            a += (double)W[(size_t)r * cols + k] * x[k];
        y[r] = a;
    }
}

static void norm(double *o, const double *x, const float *w, int n)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    ss = 1.0 / sqrt(ss / n + 1e-5);
    for (int i = 0; i < n; i++)
        o[i] = w[i] * x[i] * ss;
}

static void rotate(double *v, int n, int hs, int pos)
{
    for (int i = 0; i < n; i += 2) {
        double freq = pow(10000.0, -(double)(i % hs) / hs), a = pos * freq;
        double v0 = v[i], v1 = v[i + 1];
        v[i] = v0 * cos(a) - v1 * sin(a);
        v[i + 1] = v0 * sin(a) + v1 * cos(a);
    }
}

void tiny_llama_reference(const float *ck, const int *tokens, int n, double *logits)
{
    const int32_t *hdr = (const int32_t *)ck;
    int d = hdr[0], hid = hdr[1], L = hdr[2], H = hdr[3], KV = hdr[4], V = abs(hdr[5]), S = hdr[6];
    int hs = d / H, kvd = hs * KV;
    const float *emb = ck + 7, *p = emb + (size_t)V * d;
    const float *rms_att = p; p += (size_t)L * d;
    const float *wq = p; p += (size_t)L * d * d;
    const float *wk = p; p += (size_t)L * d * kvd;
    const float *wv = p; p += (size_t)L * d * kvd;
    const float *wo = p; p += (size_t)L * d * d;
    const float *rms_ffn = p; p += (size_t)L * d;
    const float *w1 = p; p += (size_t)L * hid * d;
    const float *w2 = p; p += (size_t)L * hid * d;
    const float *w3 = p; p += (size_t)L * hid * d;
    const float *rms_f = p; p += d;
    p += (size_t)S * hs;
    const float *wcls = hdr[5] < 0 ? p : emb;

    double *x = calloc(d, 8), *xb = calloc(d, 8), *q = calloc(d, 8), *o = calloc(d, 8);
    double *h1 = calloc(hid, 8), *h3 = calloc(hid, 8), *att = calloc(n, 8);
    double *K = calloc((size_t)L * n * kvd, 8), *Vc = calloc((size_t)L * n * kvd, 8);
    for (int t = 0; t < n; t++) {
        for (int i = 0; i < d; i++)
            x[i] = emb[(size_t)tokens[t] * d + i];
        for (int l = 0; l < L; l++) {
            double *kt = K + ((size_t)l * n + t) * kvd, *vt = Vc + ((size_t)l * n + t) * kvd;
            norm(xb, x, rms_att + (size_t)l * d, d);
            mv(q, wq + (size_t)l * d * d, xb, d, d);
            mv(kt, wk + (size_t)l * d * kvd, xb, kvd, d);
            mv(vt, wv + (size_t)l * d * kvd, xb, kvd, d);
            rotate(q, d, hs, t);
            rotate(kt, kvd, hs, t);
            for (int h = 0; h < H; h++) {
                int g = h / (H / KV);
                double mx = -1e300, sum = 0;
                for (int u = 0; u <= t; u++) {
                    double s = 0;
                    for (int i = 0; i < hs; i++)
                        s += q[h * hs + i] * K[((size_t)l * n + u) * kvd + g * hs + i];
                    att[u] = s / sqrt(hs);
                    mx = att[u] > mx ? att[u] : mx;
                }
                for (int u = 0; u <= t; u++)
                    sum += att[u] = exp(att[u] - mx);
                for (int i = 0; i < hs; i++) {
                    double a = 0;
                    for (int u = 0; u <= t; u++)
                        a += att[u] / sum * Vc[((size_t)l * n + u) * kvd + g * hs + i];
                    xb[h * hs + i] = a;
                }
            }
            mv(o, wo + (size_t)l * d * d, xb, d, d);
            for (int i = 0; i < d; i++)
                x[i] += o[i];
            norm(xb, x, rms_ffn + (size_t)l * d, d);
            mv(h1, w1 + (size_t)l * hid * d, xb, hid, d);
            mv(h3, w3 + (size_t)l * hid * d, xb, hid, d);
            for (int i = 0; i < hid; i++)
                h1[i] = h1[i] / (1 + exp(-h1[i])) * h3[i];
            mv(o, w2 + (size_t)l * hid * d, h1, d, hid);
            for (int i = 0; i < d; i++)
                x[i] += o[i];
        }
    }
    norm(xb, x, rms_f, d);
    mv(logits, wcls, xb, V, d);
    free(x); free(xb); free(q); free(o); free(h1); free(h3); free(att); free(K); free(Vc);
}
