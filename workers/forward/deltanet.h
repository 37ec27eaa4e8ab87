/* Private to the forward stage (and its tests): the Gated DeltaNet layers
 * of hybrid models (qwen35, model/arch_qwen35.c) and their state per
 * sequence, as llama.cpp's qwen35.cpp and build_delta_net_autoregressive
 * (HF's torch_recurrent_gated_delta_rule) compute it. For token t of a
 * sequence, from the layer's projections of its normed input:
 *
 *   x = silu(conv1d(the last conv_kernel qkv_mixed rows, ssm_conv1d))
 *       (the conv state holds the sequence's previous conv_kernel - 1
 *       rows, zeros at its start)
 *   q, k = x's key heads, each L2-normalised (x / max(|x|, eps)); q times
 *       1 / sqrt(head_dim); v = x's value heads. Value head h reads key
 *       head h % k_heads (llama.cpp's ggml_repeat of q and k)
 *   g = softplus(alpha_h + ssm_dt_h) * ssm_a_h;  beta = sigmoid(beta_h)
 *   S_h = e^g S_h;  S_h += k (beta (v - S_h^T k))^T;  o_h = S_h^T q
 *       (S_h [head_dim (k)][head_dim (v)], zeros at the start)
 *   out_h = RMSNorm(o_h, ssm_norm) * silu(z_h)
 *
 * EXACT BY CONSTRUCTION. Only the recurrent (token by token) form is
 * computed: a prompt's tokens go through it one after the other whatever
 * the chunking, each sum in a fixed order (plain C, the same on every
 * vector path; -ffp-contract=off), so prefill in chunks, decode, batch
 * mates and the thread count (the pool splits by (sequence, value head),
 * each unit running its tokens in order) change no bit. e^x is vexp.h's;
 * softplus's log is libm's log1p in double, rounded to float.
 *
 * STATE. Per KV slot and DeltaNet layer: the conv state and S. A step's
 * item starts at its sequence's length (continuing), at 0 (the state
 * starts again from zeros), or at the previous step's start (a retried
 * step: the state saved at that start comes back). Others cannot be
 * rebuilt without the tokens (tp_deltanet_can_start). */
#ifndef TOKPIPE_FORWARD_DELTANET_H
#define TOKPIPE_FORWARD_DELTANET_H

#include <stdbool.h>

#include "tokpipe/isa.h"
#include "tokpipe/model.h"
#include "pool.h"

/* positions per cache page (forward.h's TP_KV_PAGE) */
#define TP_DN_PAGE 16

typedef struct tp_deltanet tp_deltanet;

/* State for kv_slots sequences of a hybrid model (c->full_attn_interval
 * > 0) and scratch for steps of max_tokens; *out NULL (and 0) for other
 * models. TP_ENOMEM. */
int tp_deltanet_new(const tp_model_config *c, int kv_slots, int max_tokens, tp_deltanet **out);

/* Accepts NULL. */
void tp_deltanet_free(tp_deltanet *dn);

/* Whether slot's state can be had at pos when the sequence has length len
 * (pos == len, pos == 0, or the start of the slot's last step). */
bool tp_deltanet_can_start(const tp_deltanet *dn, int slot, int pos, int len);

/* Before a step's item (after tp_deltanet_can_start): bring slot's state
 * to pos and remember it as the step's start. */
void tp_deltanet_start(tp_deltanet *dn, int slot, int pos, int len);

/* A new sequence in slot: zero state, no step to go back to. */
void tp_deltanet_reset(tp_deltanet *dn, int slot);

/* The row width of the projections tp_deltanet_layer reads: conv_dim
 * (wqkv_lin), value_dim (wz), v_heads (wbeta), v_heads (walpha). */
int tp_deltanet_proj_width(const tp_deltanet *dn);

/* Scratch [max_tokens][tp_deltanet_proj_width] for the caller's
 * projections, and [max_tokens][value_dim] for the output. */
float *tp_deltanet_proj(tp_deltanet *dn);
float *tp_deltanet_out(tp_deltanet *dn);

/* Layer l (recurrent) over a step's n_tok tokens, token t of sequence
 * tok_slot[t] (a sequence's tokens contiguous and in position order),
 * from tp_deltanet_proj's rows into tp_deltanet_out's; the states move
 * on, on at most max_threads threads of pool. */
void tp_deltanet_layer(tp_deltanet *dn, tp_pool *pool, int max_threads, const tp_layer_weights *lw, int l,
                       const int *tok_slot, const int *tok_pos, int n_tok);

/* PREFIX CACHE SNAPSHOTS. A step keeps, per sequence, the state after
 * the last page boundary it crosses (a position p with (p + 1) % page ==
 * 0); tp_deltanet_keep then files it under the cache page that ends
 * there, and a prefix hit that ends at such a page restores it
 * (tp_deltanet_restore): exactly the state a cold run has there, since
 * the state after a position depends only on the tokens up to it.
 * Snapshots take at most budget bytes (the KV pool's size): past that a
 * page gets none (its prefix is computed again). */

/* n_pages cache pages, snapshots of at most budget bytes; drops every
 * snapshot (the pool was mapped again). TP_ENOMEM. */
int tp_deltanet_pages(tp_deltanet *dn, int n_pages, size_t budget);

/* Cache page `page` now holds other positions: its snapshot goes. */
void tp_deltanet_page_drop(tp_deltanet *dn, int page);

/* After a step: the position (a multiple of page) slot's state was kept
 * at in this step, or -1. */
int tp_deltanet_kept_at(const tp_deltanet *dn, int slot);

/* File slot's kept state under cache page `page` (which ends there). */
void tp_deltanet_keep(tp_deltanet *dn, int slot, int page);

/* Whether page has a snapshot; restore it into slot's state. */
bool tp_deltanet_has(const tp_deltanet *dn, int page);
void tp_deltanet_restore(tp_deltanet *dn, int slot, int page);

/* The vector level of the state's passes (tp_isa_active() when made; the
 * forward's own, which its tests may lower): every level, the same bits. */
void tp_deltanet_set_isa(tp_deltanet *dn, tp_isa isa);

#endif
