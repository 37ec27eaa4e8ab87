/* bench_forward's baseline: one token of one sequence at a time, the
 * algorithm of llama2.c's run.c (Karpathy), written again here (not copied)
 * and built the way its authors build it for speed (`make runomp`: -Ofast
 * -march=native with OpenMP, i.e. -O3 -ffast-math), with its two OpenMP
 * loops: matmul rows and attention heads. Its own Makefile rule gives this
 * file those flags; the rest of tokpipe is built at -O2 without fast-math.
 *
 * Plain types only (no tokpipe headers), so the bench fills it from
 * whatever the model loader holds. Not for tests: fast-math reorders sums. */
#ifndef TOKPIPE_BENCH_LLAMA2C_RUN_H
#define TOKPIPE_BENCH_LLAMA2C_RUN_H

typedef struct l2c_weights {
    int dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size;
    float rope_theta, norm_eps;
    const float *token_embedding; /* [vocab][dim] */
    const float *rms_final;       /* [dim] */
    const float *wcls;            /* [vocab][dim] */
    /* per layer, [n_layers] pointers each; row-major [out][in] */
    const float **rms_att, **rms_ffn, **wq, **wk, **wv, **wo, **w1, **w2, **w3;
} l2c_weights;

typedef struct l2c l2c;

/* State for one sequence of up to max_pos positions; w is borrowed. NULL
 * when out of memory. */
l2c *l2c_new(const l2c_weights *w, int max_pos);
void l2c_free(l2c *s);

/* OpenMP threads of the two parallel loops (omp_set_num_threads). */
void l2c_set_threads(int n);

/* The OpenMP wait policy in force ("passive", "active" or "(default)"). */
const char *l2c_wait_policy(void);

/* Run token at pos (0 <= pos < max_pos); returns the vocab_size logits
 * (owned by s, valid until the next call). */
const float *l2c_forward(l2c *s, int token, int pos);

#endif
