/* Batched Llama forward pass with a fixed per-sequence KV cache pool.
 *
 * One tp_forward_step() advances any mix of sequences: decode steps (one
 * token) and prompt chunks (prefill, many tokens) in the same call. All
 * tokens of the call go through one matmul per weight matrix, so each
 * weight is read once per step. With the default kernel results are batch
 * invariant: a sequence's logits are bit-identical whatever else is in the
 * call, and feeding a prompt in chunks gives the same bits as feeding it at
 * once or token by token (the kernel's per-element accumulation order never
 * depends on the batch; see workers/forward/kernels.h). The opt-in OpenBLAS
 * kernel gives that up (tp_forward_set_kernel).
 *
 * Why not OpenBLAS by default (measured here, OpenBLAS 0.3.21): sgemm gives
 * a row different bits depending on how many rows are in the call, and
 * sgemv differs from sgemm, so a sequence's tokens would depend on its batch
 * mates. The default matmuls (TP_FWD_KERNEL_INVARIANT) use a packed AVX-512
 * kernel instead (equal to fmaf() over k in order; scalar fallback without
 * AVX-512), which also streams weights faster than sgemv at batch 1, and
 * OPENBLAS_CORETYPE does not matter to it. OpenBLAS is an explicit opt-in
 * (tp_forward_set_kernel, TP_FWD_KERNEL_OPENBLAS) that trades batch
 * invariance for OpenBLAS's sgemm; see there.
 *
 * Single-threaded until tp_forward_set_threads asks for more: a pool of
 * compute threads that sleep while idle (never spin: spinning pools
 * collapsed on this machine, research/limits.md 0.1), splitting every
 * matmul by output rows and attention by (token, head), so the bits never
 * depend on the thread count. A tp_forward is not thread-safe; the
 * tp_model it reads may be shared. */
#ifndef TOKPIPE_FORWARD_H
#define TOKPIPE_FORWARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokpipe/error.h"
#include "tokpipe/isa.h"
#include "tokpipe/model.h"

typedef struct tp_forward tp_forward;

/* One sequence's share of a step. */
typedef struct tp_fwd_item {
    int seq_id;        /* from tp_forward_seq_open */
    int pos;           /* position of tokens[0]: 0..the sequence's length
                        * (less than the length rewinds: later positions are
                        * overwritten, as for a retry) */
    const int *tokens; /* n_tokens ids in [0, vocab) */
    int n_tokens;      /* >= 1 */
    bool skip_logits;  /* true: no logits (e.g. a non-final prefill chunk) */
} tp_fwd_item;

/* An item's embedding (pool: TP_POOL_* of model.h, NONE: none): the hidden
 * states after the final norm, pooled into pooled[dim] (caller-owned):
 * MEAN adds each of the item's tokens' (the caller keeps the count and
 * divides), CLS writes position 0's when the item holds it, LAST writes
 * the item's last token's. */
typedef struct tp_fwd_pool {
    int pool;
    float *pooled;
} tp_fwd_pool;

/* Pack the model's weights for the kernel and allocate the KV pool:
 * kv_slots sequences of up to max_pos positions each (0 = the model's
 * seq_len), and scratch for up to max_batch_tokens tokens per step. The
 * model must outlive the tp_forward. Memory: a packed copy of the F32
 * weight matrices and, with AVX-512 VNNI, a repacked copy ("panel", as
 * big as the file's) of the integer-typed ones; F16/BF16 are read in
 * place from the model's mmap (workers/forward/quant.h). The file's pages
 * of copied matrices are given back (tp_model_drop_pages). Plus the KV
 * pool: 2 * kv_slots * n_kv_layers * max_pos * kv_dim values (max_pos
 * rounded up to 16; n_kv_layers: the layers that keep every position, not
 * DeltaNet or sliding ones), and the sliding layers' window parts
 * (tp_fwd_kv_stats: about W + max_batch_tokens positions a slot), floats until tp_forward_set_kv_type picks halves, mapped
 * lazily (pages never written cost no memory), in pages of 16 positions
 * that also hold the prefix cache (tp_forward_seq_reuse; on by default).
 * *out is owned by the caller (tp_forward_free). */
int tp_forward_new(const tp_model *model, int kv_slots, int max_pos, int max_batch_tokens,
                   tp_forward **out, tp_err *err);

void tp_forward_free(tp_forward *f);

/* Claim a free KV slot for a new sequence (length 0). TP_EFULL if every
 * slot is in use. */
int tp_forward_seq_open(tp_forward *f, int *seq_id, tp_err *err);

/* Release a sequence's slot. TP_ENOTFOUND if seq_id is not open. */
int tp_forward_seq_close(tp_forward *f, int seq_id);

/* Roll an open sequence back to its first len positions (0..its length):
 * the rejected positions of a verify step. Pages wholly past len are let
 * go at once (a cached one stays in the cache); the next step feeds from
 * len. TP_ENOTFOUND if seq_id is not open, TP_EINVAL for a len outside
 * 0..the length, for any len but the length on a hybrid model
 * (full_attn_interval > 0: its recurrent state cannot go back), and on a
 * model with sliding layers for a len (other than 0) whose window reaches
 * back before the window of the last step's first position: those keys
 * were let go (tp_forward_kv_stats). A len at or after the last step's
 * start is always fine. */
int tp_forward_seq_truncate(tp_forward *f, int seq_id, int len);

/* Current length (positions filled) of an open sequence, or -1. */
int tp_forward_seq_length(const tp_forward *f, int seq_id);

/* Prefix cache. The KV pool is cut into pages of 16 positions; a sequence
 * holds a table of pages. Every page a sequence fills completely is kept,
 * keyed by its tokens and the page before it (a hash chain over full
 * pages), and stays after the sequence closes, until its memory is needed
 * for a new page: then the least recently used page no sequence holds is
 * given up. A cached page is shared by reference (never copied, never
 * written) by every sequence whose tokens match.
 *
 * tp_forward_seq_reuse: sequence seq_id (of length pos) is about to be
 * fed tokens[0..n_tokens) at pos. Takes the longest run of those tokens
 * that completes cached pages after the sequence's current ones (a partly
 * filled last page is swapped for a cached page holding the same tokens
 * there and more), leaving at least the last token to be computed when
 * keep_last (the caller wants its logits). Returns how many tokens were
 * taken (maybe 0): the sequence's length is now pos + that, and the
 * caller feeds only the rest. Exact: with the invariant kernel (and only
 * then is the cache used) a position's keys and values depend only on the
 * tokens up to it, never on chunking, batch, thread count or which
 * sequence computed them, so the logits that follow are bit-identical to
 * computing every position. 0 whenever the conditions do not hold (cache
 * off, OpenBLAS kernel, pos not the sequence's length, a sequence whose
 * earlier full pages are not all cached, fewer tokens than complete the
 * next page). A hit ends only where the next query has what it reads:
 * on a hybrid model the DeltaNet state there, with sliding layers the
 * window parts of the cached pages its window reaches (tp_fwd_kv_stats). */
int tp_forward_seq_reuse(tp_forward *f, int seq_id, int pos, const int *tokens, int n_tokens, bool keep_last);

/* Do open sequences a and b both have length pos (a multiple of 16) and
 * hold the same cached pages for it? Then tokens fed to one at pos and
 * later offered to the other (tp_forward_seq_reuse) are taken from the
 * cache: jobs with a common prefix that arrive together share one
 * computation of it. False when the cache is not in use. */
bool tp_forward_seq_same_pages(const tp_forward *f, int a, int b, int pos);

/* Positions per KV page: one block of the key layout (16 positions per
 * vector load), and the granularity of prefix hits (whole pages). */
#define TP_KV_PAGE 16

/* Most pages tp_forward_set_prefix_cache may add beyond the slots' own. */
#define TP_FORWARD_MAX_EXTRA_PAGES (1 << 24)

/* Turn the cache on or off, and give it extra_pages pages (16 positions of
 * every layer each, tp_forward_page_bytes) beyond the kv_slots * max_pos
 * positions of the pool (0: the cache lives in the pool's free pages
 * only; off: extra_pages is ignored). Re-maps the pool, dropping what was
 * cached; only while no sequence is open (TP_ESTATE), TP_EINVAL outside
 * 0..TP_FORWARD_MAX_EXTRA_PAGES, TP_ENOMEM if the new pool cannot be
 * mapped (the old one stays). */
int tp_forward_set_prefix_cache(tp_forward *f, bool on, int extra_pages, tp_err *err);
bool tp_forward_prefix_cache(const tp_forward *f);

/* Bytes of one page: keys and values of 16 positions in every layer that
 * keeps them (a DeltaNet layer keeps none), its window part included. */
size_t tp_forward_page_bytes(const tp_forward *f);

/* KV memory. A page holds the layers that keep every position; on a model
 * with sliding-window layers (swa_window W less than max_pos) those
 * layers' keys and values are a page's "window part", kept apart: a
 * sequence keeps the parts only of the pages that a query at or after
 * its last step's first position q can still see (positions from
 * q - W + 1 on; so after a long prompt and decode, about W + 16
 * positions, plus the last step's length), and lets the earlier ones go
 * for other sequences' use. Steps going back before q are refused (see
 * tp_forward_step). The parts are a pool of their own, big enough for
 * every slot's window, a step of max_batch_tokens and the prefix cache's
 * extra pages; a cached page keeps a part nobody needs only until that
 * memory is wanted, and a prefix hit is cut where a part it would need
 * is gone (tp_forward_seq_reuse). Logits are the same bits either way. */
typedef struct tp_fwd_kv_stats {
    size_t held_bytes;   /* KV held by open sequences now: their pages (a shared one once) and the parts they keep */
    size_t pool_bytes;   /* pages and parts as mapped (lazily: untouched memory costs nothing) */
    size_t page_bytes;   /* keys and values of 16 positions of the layers that keep every position */
    size_t part_bytes;   /* the same of the sliding layers (0: no parts) */
    uint32_t pages_held, pages_total;
    uint32_t parts_held, parts_total;
    int window;          /* W when the sliding layers' KV is in parts, else 0 */
} tp_fwd_kv_stats;

void tp_forward_kv_stats(const tp_forward *f, tp_fwd_kv_stats *out);

/* Bytes of KV one open sequence holds: its pages, shared ones too, and
 * the parts it keeps; 0 when seq_id is not open. */
size_t tp_forward_seq_kv_bytes(const tp_forward *f, int seq_id);

typedef struct tp_fwd_prefix_stats {
    bool enabled;
    uint64_t lookups;        /* tp_forward_seq_reuse calls that could take pages */
    uint64_t hits;           /* of those, calls that took at least one */
    uint64_t hit_tokens;     /* positions taken from the cache */
    uint64_t prefill_tokens; /* prompt positions asked for (taken + computed): the hit rate's base */
    uint64_t evictions;      /* cached pages given up for new ones */
    uint32_t pages_total, pages_used, pages_cached;
    uint32_t page_tokens;    /* 16 */
    size_t page_bytes;
} tp_fwd_prefix_stats;

void tp_forward_prefix_stats(const tp_forward *f, tp_fwd_prefix_stats *out);

/* Advance n_items sequences (each at most once per call). logits (may be
 * NULL when every item skips them) receives, in row i, the vocab_size
 * logits after the last token of items[i]; rows of skipped items are left
 * untouched. Every item is validated before any work: an unknown or
 * repeated seq_id, a bad token id, a gap in positions, more than
 * max_batch_tokens tokens in total, or a sequence that would run past its
 * slot's max_pos (TP_EFULL) fails the whole call with a message naming the
 * item, and no sequence changes. On success each sequence's length becomes
 * pos + n_tokens. With sliding layers a pos before the sequence's last
 * step's first position may be refused (TP_EINVAL): 0 and anything from
 * that position on are always fine (tp_fwd_kv_stats). */
int tp_forward_step(tp_forward *f, const tp_fwd_item *items, int n_items, float *logits, tp_err *err);

/* tp_forward_step with verify items (speculative decoding, tokpipe/spec.h).
 * all_logits may be NULL (then it is tp_forward_step); else all_logits[i]
 * non-NULL makes item i a verify item: it receives n_tokens rows of
 * vocab_size logits, row j the ones after tokens[j], each bit-identical to
 * what feeding the tokens one step at a time gives; the item's row of
 * logits is then not written and its skip_logits is ignored. Only with the
 * invariant kernel and not on a hybrid model (TP_EINVAL otherwise). */
int tp_forward_step_verify(tp_forward *f, const tp_fwd_item *items, int n_items, float *logits,
                           float *const *all_logits, tp_err *err);

/* tp_forward_step, and item i's embedding as pools[i] says (pools NULL:
 * none). TP_ENOMEM when a pooling could not get its scratch. */
int tp_forward_step_pooled(tp_forward *f, const tp_fwd_item *items, int n_items, float *logits,
                           const tp_fwd_pool *pools, tp_err *err);

/* Both: verify items as tp_forward_step_verify's all says, embeddings as
 * tp_forward_step_pooled's pools says (either NULL). */
int tp_forward_step_full(tp_forward *f, const tp_fwd_item *items, int n_items, float *logits,
                         float *const *all, const tp_fwd_pool *pools, tp_err *err);

/* Most compute threads one tp_forward runs. */
#define TP_FORWARD_MAX_THREADS 256

/* Use n_threads compute threads, 1 (the default of a new tp_forward) up to
 * TP_FORWARD_MAX_THREADS, counting the caller's: n_threads - 1 helper
 * threads are started (and any previous ones stopped). With the invariant
 * kernel every matmul of a step, the classifier included and batch-1 decode
 * too, is split by output rows (panel groups of 64 rows), attention by
 * (token, head) and SwiGLU by elements; a job too small to pay for waking
 * a thread uses fewer. Rows are claimed from a shared counter, so a thread
 * that wakes late (its core busy elsewhere) leaves its share to the others
 * instead of holding the step up.
 * Logits stay bit-identical to 1 thread. Idle helpers sleep in the kernel
 * (futex), so threads beyond the free cores cost only when work overlaps.
 * With the OpenBLAS kernel it is OpenBLAS's own thread count instead (see
 * tp_forward_set_kernel). TP_EINVAL outside the range, TP_ENOMEM if a
 * thread or its scratch cannot be had (the old count stays). */
int tp_forward_set_threads(tp_forward *f, int n_threads, tp_err *err);
int tp_forward_threads(const tp_forward *f);

/* The vector level this forward's kernels run (isa.h: tp_isa_active() when
 * it was made; TP_ISA_PORTABLE after tp_forward_use_scalar_for_tests).
 * Every level gives the same bits. */
tp_isa tp_forward_isa(const tp_forward *f);

/* The thread count to use when none is configured: the CPUs this process's
 * affinity mask allows (sched_getaffinity; e.g. taskset or systemd's
 * CPUAffinity=), at most TP_FORWARD_MAX_THREADS. */
int tp_forward_default_threads(void);

/* Matmul backend of the weight matrices (attention, norms, RoPE and SwiGLU
 * are the same code either way).
 *
 * TP_FWD_KERNEL_INVARIANT (the default): the packed kernel above; logits are
 * bit-identical whatever else is in the step and however a prompt is
 * chunked.
 *
 * TP_FWD_KERNEL_OPENBLAS: each weight matrix of a step (wq, wk, wv, wo, w1,
 * w3, w2 of every layer, and the classifier) is ONE cblas_sgemm over all
 * the step's token rows, reading the model's own row-major weights;
 * cblas_sgemv when the step has exactly one row. What it gives up: batch
 * invariance. OpenBLAS blocks the sum over k differently for different row
 * counts (and sgemv differs from sgemm), so a sequence's logits differ in
 * the last bits with the batch it runs in and with how its prompt is
 * chunked; where two logits nearly tie, greedy or seeded sampling may then
 * pick a different token than the same job run alone, and the rest of that
 * job diverges. Logits stay within float rounding of the invariant kernel.
 * When it pays: only at large batches, and only with OpenBLAS's AVX-512
 * kernels, i.e. OPENBLAS_CORETYPE=SkylakeX in the environment before
 * libopenblas is loaded (it picks its kernels once, at load; without it its
 * own detection may choose the AVX2 Haswell kernels, about half the sgemm
 * speed: limits.md section 2). Measured here (make bench, 0.3.21 SkylakeX,
 * stories15M/110M shapes, paired samples on a shared 2-vCPU machine) it did
 * not beat the invariant kernel anywhere on 1 thread: 0.35-0.55x at batch
 * 1 (sgemv) and 8, 0.6x at 32, 0.7-0.8x at 64 and 128 rows and on a
 * 128-token prefill; on 2 threads 0.7-1.0x at 32-128 rows, with a 128-token
 * prefill of stories15M up to 1.2x.
 * sgemm gains least per row below about 32 rows (limits.md section 4) and
 * keeps gaining up to 256 (section 6b), so it is a choice for batches well
 * past 64 tokens on both cores, re-measured on the target machine.
 *
 * Only for models whose matrices are all F32: TP_EINVAL otherwise.
 *
 * OpenBLAS is loaded (dlopen of libopenblas.so.0, kept for the life of the
 * process) at the first opt-in, not linked: its pthread pool starts at load
 * with signals unblocked and would steal signals from programs that handle
 * them on a signalfd. So OPENBLAS_CORETYPE may also be set by the process
 * itself any time before its first opt-in, and the pool's threads inherit
 * the caller's signal mask (opt in before starting to handle signals, or
 * with them blocked). TP_ENOTFOUND if the library cannot be loaded.
 *
 * OpenBLAS's thread count is process-wide: every OpenBLAS step sets it to
 * tp_forward_threads() (1 or 2) first, so a second OpenBLAS user in the
 * process sees that count too. With 2, OpenBLAS's own pthread pool (whose
 * thread spins about 0.1 s after each call before it sleeps, competing with
 * anything else on the second core) does the splitting, not this
 * library's passive helper thread. The opt-in also allocates a logits
 * buffer of min(kv_slots, max_batch_tokens) rows of vocab_size floats, so
 * that the classifier stays one call when some items skip logits.
 * TP_EINVAL for an unknown value, TP_ENOMEM if that buffer cannot be had
 * (the kernel is then unchanged). */
typedef enum tp_fwd_kernel { TP_FWD_KERNEL_INVARIANT = 0, TP_FWD_KERNEL_OPENBLAS = 1 } tp_fwd_kernel;

int tp_forward_set_kernel(tp_forward *f, tp_fwd_kernel k, tp_err *err);
tp_fwd_kernel tp_forward_kernel(const tp_forward *f);

/* The core OpenBLAS reports (openblas_get_corename, e.g. "SkylakeX" or
 * "Haswell"), or NULL while this instance never opted in. */
const char *tp_forward_blas_core(const tp_forward *f);

/* "invariant" or "openblas" (for config files and command lines). */
const char *tp_fwd_kernel_name(tp_fwd_kernel k);

/* Parse such a name; TP_EINVAL naming the bad value otherwise. */
int tp_fwd_kernel_parse(const char *name, tp_fwd_kernel *out, tp_err *err);

/* Element type of the KV cache. TP_KV_F32 (the default) is exact. TP_KV_F16
 * stores keys and values as IEEE half (rounded to nearest even once, when
 * stored): half the KV memory and half the bytes attention reads per
 * position, which is what long contexts and big batches are bound by.
 * Logits move by the rounding (at most 0.023 from f32's on stories260K,
 * whose 252 greedy ids stay equal;
 * tests/test_forward.c) and stay batch and chunked-prefill invariant: every
 * token of a step reads its sequence's keys back from the cache, its own
 * chunk's included, so what it sees never depends on the batch. */
typedef enum tp_kv_type { TP_KV_F32 = 0, TP_KV_F16 = 1 } tp_kv_type;

/* Re-allocate the KV pool for type t; only while no sequence is open
 * (TP_ESTATE otherwise). TP_EINVAL for an unknown type, TP_ENOMEM if the
 * new pool cannot be mapped (the old one stays). */
int tp_forward_set_kv_type(tp_forward *f, tp_kv_type t, tp_err *err);
tp_kv_type tp_forward_kv_type(const tp_forward *f);

/* "f32" or "f16" (config files and command lines), and back; TP_EINVAL
 * naming a bad name. */
const char *tp_kv_type_name(tp_kv_type t);
int tp_kv_type_parse(const char *name, tp_kv_type *out, tp_err *err);

int tp_forward_max_positions(const tp_forward *f);
int tp_forward_max_batch_tokens(const tp_forward *f);
int tp_forward_kv_slots(const tp_forward *f);
const tp_model *tp_forward_model(const tp_forward *f);

#endif
