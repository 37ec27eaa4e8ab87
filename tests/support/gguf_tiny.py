"""A tiny, independent GGUF v3 reader and a numpy float64 reference forward
for the llama / Llama 3 / Mixtral / qwen2 / qwen3 / phi3 / qwen3moe / gemma2 / gemma3 / qwen35 / qwen35moe / gpt-oss architectures, written from the GGUF spec and
the models' published definitions (not from tokpipe's C code): the test
oracle for tokpipe's GGUF writer, loader and forward pass."""
import math
import struct

import numpy as np

SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}
NP_TYPES = {0: np.float32, 1: np.float16}


class Reader:
    def __init__(self, data):
        self.d = data
        self.o = 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.d, self.o)[0]
        self.o += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.d[self.o:self.o + n]
        if len(s) != n:
            raise ValueError("truncated string")
        self.o += n
        return s.decode("utf-8", errors="surrogateescape")

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take("<I"), self.take("<Q")
            return [self.value(et) for _ in range(n)]
        return self.take(SCALARS[t])


class Gguf:
    """A GGUF v3 file's header: kv (metadata) and kv_types, tensors as
    [(name, dims, type, offset from data_start)], alignment, data_start,
    and buf, the whole file."""

    def __init__(self, path):
        with open(path, "rb") as f:
            self.buf = f.read()
        if self.buf[:4] != b"GGUF" or struct.unpack_from("<I", self.buf, 4)[0] != 3:
            raise ValueError("not GGUF v3")
        self.version = 3
        r = Reader(self.buf)
        r.o = 8
        n_t, n_kv = r.take("<Q"), r.take("<Q")
        self.kv, self.kv_types = {}, {}
        for _ in range(n_kv):
            k = r.string()
            t = r.take("<I")
            if k in self.kv:
                raise ValueError("duplicate key " + k)
            self.kv_types[k] = t
            self.kv[k] = r.value(t)
        self.tensors = []
        for _ in range(n_t):
            name = r.string()
            nd = r.take("<I")
            ne = [r.take("<Q") for _ in range(nd)]
            self.tensors.append((name, ne, r.take("<I"), r.take("<Q")))
        self.alignment = self.kv.get("general.alignment", 32)
        self.data_start = (r.o + self.alignment - 1) // self.alignment * self.alignment


def read_gguf(path):
    """(metadata dict, {name: (type, ne list, offset in file, nbytes)}, alignment, raw bytes, metadata types)."""
    g = Gguf(path)
    tensors = {}
    for name, ne, t, off in g.tensors:
        count = math.prod(ne)
        size = {0: 4, 1: 2}.get(t, 0) * count
        tensors[name] = (t, ne, g.data_start + off, size)
    return g.kv, tensors, g.alignment, g.buf, g.kv_types


def write_tensor(f, tensors, name, array):
    """Overwrite F32 tensor `name` (from read_gguf's tensors) in the open
    file f with array (its size must match)."""
    import numpy as np
    _, _, off, size = tensors[name]
    data = np.ascontiguousarray(array, dtype="<f4").tobytes()
    assert len(data) == size, name
    f.seek(off)
    f.write(data)


class Model:
    """Weights as float64 numpy arrays shaped [rows, cols] (ggml ne reversed)."""

    def __init__(self, path):
        self.meta, info, _, data, _ = read_gguf(path)
        self.w = {}
        for name, (t, ne, off, size) in info.items():
            a = np.frombuffer(data, dtype=NP_TYPES[t], count=math.prod(ne), offset=off)
            self.w[name] = a.astype(np.float64).reshape(list(reversed(ne)))
        m = self.meta
        self.arch = m["general.architecture"]
        p = self.arch + "."
        self.dim = m[p + "embedding_length"]
        self.n_layers = m[p + "block_count"]
        self.n_heads = m[p + "attention.head_count"]
        self.n_kv = m.get(p + "attention.head_count_kv", self.n_heads)
        self.eps = m.get(p + "attention.layer_norm_rms_epsilon", 1e-5)
        self.theta = m.get(p + "rope.freq_base", 10000.0)
        # the head size: attention.key_length where given (Qwen3: 128 with
        # dim / heads 64), else dim / heads
        self.hs = m.get(p + "attention.key_length", self.dim // self.n_heads)
        # llama.cpp: LLAMA_ROPE_TYPE_NORM for llama (Q/K rows permuted by the
        # converter so adjacent pairs rotate), NEOX (halves) for qwen2 and qwen3.
        self.neox = self.arch in ("qwen2", "qwen3", "phi3", "qwen3moe", "gemma2", "gemma3", "qwen35", "qwen35moe",
                                  "gpt-oss")
        # Qwen 3.5 (HF's modeling_qwen3_5 / Qwen3-Next): partial RoPE over the
        # first rope.dimension_count elements of a head; Gated DeltaNet
        # layers unless (l + 1) % full_attention_interval == 0
        self.rot = m.get(p + "rope.dimension_count", self.hs)
        self.hybrid = self.arch in ("qwen35", "qwen35moe")
        if self.hybrid:
            self.interval = m.get(p + "full_attention_interval", 4)
            self.ssm_hd = m[p + "ssm.state_size"]
            self.ssm_kh = m[p + "ssm.group_count"]
            self.ssm_vh = m[p + "ssm.time_step_rank"]
        # Gemma 2 / 3 (gemma_pytorch, HF's modeling_gemma2/3, llama.cpp's
        # load_hparams): embeddings times sqrt(dim); Q scaled by
        # query_pre_attn_scalar^-0.5 (head_dim, or dim / heads for the 27B:
        # 46 / 62 blocks); a sliding window on layers i % 2 == 0 (gemma2) or
        # i % 6 != 5 (gemma3, which needs the key, and turns those layers with
        # base 10000 unscaled); soft-capping tanh(x / c) * c of scores
        # (gemma2, default 50) and final logits (gemma2 default 30)
        self.gemma = self.arch in ("gemma2", "gemma3")
        self.window, self.local_theta, self.attn_cap, self.final_cap = 0, None, 0.0, 0.0
        self.q_scale = 1 / math.sqrt(self.hs)
        if self.gemma:
            big = {"gemma2": 46, "gemma3": 62}[self.arch]
            if self.n_layers == big:
                self.q_scale = 1 / math.sqrt(self.dim // self.n_heads)
        if self.arch == "gemma2":
            self.window = m.get(p + "attention.sliding_window", 4096)
            self.sliding = lambda l: l % 2 == 0
            self.attn_cap = m.get(p + "attn_logit_softcapping", 50.0)
            self.final_cap = m.get(p + "final_logit_softcapping", 30.0)
        elif self.arch == "gemma3":
            self.window = m.get(p + "attention.sliding_window", 0)
            self.sliding = lambda l: l % 6 != 5
            self.local_theta = 10000.0
            self.final_cap = m.get(p + "final_logit_softcapping", 0.0)
        # gpt-oss (OpenAI's reference model.py; HF's modeling_gpt_oss): every
        # other layer (i % 2 == 0) sees the last sliding_window positions; a
        # learned sink logit per head joins each softmax; YaRN RoPE
        self.oss = self.arch == "gpt-oss"
        if self.oss:
            self.window = m[p + "attention.sliding_window"]
            self.sliding = lambda l: l % 2 == 0
        self.yarn = None
        if m.get(p + "rope.scaling.type") == "yarn":
            self.yarn = (m[p + "rope.scaling.factor"], m.get(p + "rope.scaling.original_context_length"),
                         m.get(p + "rope.scaling.yarn_beta_fast", 32.0), m.get(p + "rope.scaling.yarn_beta_slow", 1.0))
        # experts (Mixtral's llama, qwen3moe): softmax over all of them, the
        # top expert_used_count renormalised to sum 1 (the published
        # MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock with norm_topk_prob)
        self.n_expert = m.get(p + "expert_count", 0)
        self.n_used = m.get(p + "expert_used_count", 0)
        self.freq_div = np.ones(self.rot // 2)
        # LongRoPE (Phi-3.5, Phi-4-mini; llama.cpp's get_rope_factors): a
        # context past original_context_length takes the long factors (what
        # `tokpipe run` serves is the model's whole context), else the short;
        # cos and sin times rope.scaling.attn_factor
        self.rope_attn = m.get(p + "rope.scaling.attn_factor", 1.0)
        self.longrope = None
        if "rope_factors_long.weight" in self.w:
            self.longrope = (self.w["rope_factors_long.weight"].copy(), self.w["rope_factors_short.weight"].copy())
            orig = m.get(p + "rope.scaling.original_context_length", m[p + "context_length"])
            self.freq_div = self.longrope[0 if m[p + "context_length"] > orig else 1]
        if "rope_freqs.weight" in self.w:
            self.freq_div = self.w["rope_freqs.weight"].copy()
        elif m.get(p + "rope.scaling.type") == "linear":   # positions slowed by the factor
            self.freq_div = np.full(self.rot // 2, m.get(p + "rope.scaling.factor", 1.0))
        elif m.get(p + "rope.scaling.type") == "llama3":
            self.freq_div = llama3_divisors(self.hs, self.theta, m.get(p + "rope.scaling.factor", 8.0),
                                            m.get(p + "rope.scaling.low_freq_factor", 1.0),
                                            m.get(p + "rope.scaling.high_freq_factor", 4.0),
                                            m.get(p + "rope.scaling.original_context_length", 8192))

    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos, neox, theta=None, freq_div=None):
        """x: [T, heads, hs]; rotate by pos * theta^(-2i/hs) / divisor_i
        (partial RoPE: the first rot elements, i over rot / 2)."""
        if self.rot != self.hs:
            r = self.rot
            div = self.freq_div if freq_div is None else freq_div
            inv = self.theta ** (-2.0 * np.arange(r // 2) / r) / div
            ang = np.outer(pos, inv)[:, None, :]
            c, s = np.cos(ang) * self.rope_attn, np.sin(ang) * self.rope_attn
            a, b = x[..., :r // 2], x[..., r // 2:r]
            return np.concatenate([a * c - b * s, a * s + b * c, x[..., r:]], axis=-1)
        half = self.hs // 2
        theta = self.theta if theta is None else theta
        freq_div = self.freq_div if freq_div is None else freq_div
        inv = theta ** (-2.0 * np.arange(half) / self.hs) / freq_div
        mscale = self.rope_attn
        if self.yarn:
            inv, ymscale = yarn(inv, self.hs, theta, *self.yarn)
            mscale *= ymscale
        ang = np.outer(pos, inv)[:, None, :]
        c, s = np.cos(ang) * mscale, np.sin(ang) * mscale
        if neox:
            a, b = x[..., :half], x[..., half:]
            return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * c - b * s
        out[..., 1::2] = a * s + b * c
        return out

    def moe(self, h, b, renorm=True, top=None, ties_high=False, shexp=True, shexp_gate=True):
        """The mixture of experts of block prefix b on rows h [T, dim];
        equal probabilities take the lower expert first (ties_high: the
        higher, for a test that it matters). Qwen 3.5 MoE (HF's
        Qwen3NextSparseMoeBlock): a shared expert every token takes, its
        output times sigmoid(h . shared_expert_gate) added to the routed
        sum (shexp=False leaves it out, shexp_gate=False ungated)."""
        w = self.w
        top = self.n_used if top is None else top
        lg = h @ w[b + "ffn_gate_inp.weight"].T  # [T, n_expert]
        p = np.exp(lg - lg.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        gate, up, down = (w[b + n + "_exps.weight"] for n in ("ffn_gate", "ffn_up", "ffn_down"))
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            # stable: equal probabilities keep the lower index first
            order = range(self.n_expert - 1, -1, -1) if ties_high else range(self.n_expert)
            chosen = sorted(order, key=lambda e: -p[t, e])[:top]
            ws = p[t, chosen] / (p[t, chosen].sum() if renorm else 1.0)
            for e, we in zip(chosen, ws):
                g, u = gate[e] @ h[t], up[e] @ h[t]
                out[t] += we * (down[e] @ (g / (1 + np.exp(-g)) * u))
        if shexp and b + "ffn_gate_inp_shexp.weight" in w:
            g, u = h @ w[b + "ffn_gate_shexp.weight"].T, h @ w[b + "ffn_up_shexp.weight"].T
            y = ((g / (1 + np.exp(-g))) * u) @ w[b + "ffn_down_shexp.weight"].T
            if shexp_gate:
                y = y / (1 + np.exp(-(h @ w[b + "ffn_gate_inp_shexp.weight"])))[:, None]
            out += y
        return out

    def moe_oss(self, h, b, softmax_all=False, plain_swiglu=False):
        """gpt-oss's experts: router logits plus its bias, the top k (ties:
        the lower index) softmaxed among themselves (softmax_all: their
        shares of the softmax over all experts, for a test that it matters); each
        expert's gate and up with their biases through swiglu_oai (the gate
        at most 7, the up within +-7, g * sigmoid(1.702 g) * (u + 1);
        plain_swiglu: SiLU(g) * u), down plus its bias."""
        w = self.w
        lg = h @ w[b + "ffn_gate_inp.weight"].T + w[b + "ffn_gate_inp.bias"]
        gate, up, down = (w[b + n + "_exps.weight"] for n in ("ffn_gate", "ffn_up", "ffn_down"))
        gb, ub, db = (w[b + n + "_exps.bias"] for n in ("ffn_gate", "ffn_up", "ffn_down"))
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            chosen = sorted(range(self.n_expert), key=lambda e: -lg[t, e])[:self.n_used]
            if softmax_all:
                p = np.exp(lg[t] - lg[t].max())
                ws = p[chosen] / p.sum()
            else:
                z = np.exp(lg[t, chosen] - lg[t, chosen].max())
                ws = z / z.sum()
            for e, we in zip(chosen, ws):
                g, u = gate[e] @ h[t] + gb[e], up[e] @ h[t] + ub[e]
                if plain_swiglu:
                    a = g / (1 + np.exp(-g)) * u
                else:
                    g, u = np.minimum(g, 7.0), np.clip(u, -7.0, 7.0)
                    a = g / (1 + np.exp(-1.702 * g)) * (u + 1)
                out[t] += we * (down[e] @ a + db[e])
        return out

    def hybrid_ffn(self, h, b, renorm, top, ties_high, shexp, shexp_gate):
        """Qwen 3.5's FFN: SwiGLU, or qwen35moe's experts."""
        w = self.w
        if self.n_expert:
            return self.moe(h, b, renorm, top, ties_high, shexp, shexp_gate)
        g, u = h @ w[b + "ffn_gate.weight"].T, h @ w[b + "ffn_up.weight"].T
        return ((g / (1 + np.exp(-g))) * u) @ w[b + "ffn_down.weight"].T

    def deltanet(self, h, b, gate_norm=True, delta=True):
        """A Gated DeltaNet layer of block prefix b on rows h [T, dim] of one
        sequence from its start (HF's Qwen3NextGatedDeltaNet with
        torch_recurrent_gated_delta_rule): the causal depthwise conv over
        q, k, v, SiLU, q and k L2-normed, q / sqrt(head), per value head
        S = e^g S + k (beta (v - S^T k))^T, o = S^T q, RMSNorm(o) * silu(z).
        Value head h reads key head h % key heads (llama.cpp's repeat).
        gate_norm=False leaves out silu(z), delta=False adds k v^T
        without subtracting S^T k (for tests that they matter)."""
        w, T = self.w, h.shape[0]
        hd, kh, vh = self.ssm_hd, self.ssm_kh, self.ssm_vh
        kd = hd * kh
        mixed = h @ w[b + "attn_qkv.weight"].T  # [T, conv]
        z = h @ w[b + "attn_gate.weight"].T
        beta = 1 / (1 + np.exp(-(h @ w[b + "ssm_beta.weight"].T)))
        alpha = h @ w[b + "ssm_alpha.weight"].T + w[b + "ssm_dt.bias"]
        g = np.log1p(np.exp(alpha)) * w[b + "ssm_a"]  # softplus, times -exp(A_log)
        kern = w[b + "ssm_conv1d.weight"]  # [conv, K]
        K = kern.shape[1]
        padded = np.concatenate([np.zeros((K - 1, mixed.shape[1])), mixed])
        conv = np.stack([(padded[t:t + K] * kern.T).sum(axis=0) for t in range(T)])
        conv = conv / (1 + np.exp(-conv))
        q, k, v = conv[:, :kd], conv[:, kd:2 * kd], conv[:, 2 * kd:]
        q, k, v = q.reshape(T, kh, hd), k.reshape(T, kh, hd), v.reshape(T, vh, hd)
        l2 = lambda a: a / np.maximum(np.sqrt((a * a).sum(axis=-1, keepdims=True)), self.eps)
        q, k = l2(q) / math.sqrt(hd), l2(k)
        out = np.empty((T, vh, hd))
        for hv in range(vh):
            S = np.zeros((hd, hd))
            for t in range(T):
                qt, kt = q[t, hv % kh], k[t, hv % kh]
                S = S * np.exp(g[t, hv])
                d = (v[t, hv] - (S.T @ kt if delta else 0)) * beta[t, hv]
                S = S + np.outer(kt, d)
                out[t, hv] = S.T @ qt
        o = self.rmsnorm(out, w[b + "ssm_norm.weight"])
        if gate_norm:
            zz = z.reshape(T, vh, hd)
            o = o * (zz / (1 + np.exp(-zz)))
        return o.reshape(T, vh * hd) @ w[b + "ssm_out.weight"].T

    def logits(self, ids, neox=None, qk_norm=True, up_first=False, window=True, local_theta=True,
               post_norm=True, gelu=True, softcap=True, renorm=True, top=None, ties_high=False, sinks=True,
               yarn=True, softmax_all=False, plain_swiglu=False, attn_gate=True, gate_norm=True, delta=True,
               all_attention=False, shexp=True, shexp_gate=True, hidden=False):
        """Logits at every position of ids (causal), [T, vocab]. qk_norm=False
        leaves out Qwen3's per-head RMSNorm of Q and K, up_first=True reads
        Phi-3's fused gate/up the wrong way round; for Gemma window=False
        lets every layer see the whole context, local_theta=False turns the
        sliding layers with the global base, post_norm=False leaves out the
        norms after attention and FFN, gelu=False gates with SiLU,
        softcap=False leaves out the soft-capping; for experts renorm=False
        leaves the top-k weights as the softmax gave them, top=N takes N
        experts instead of expert_used_count (for tests that they matter);
        for gpt-oss sinks=False leaves out the attention sinks, yarn=False
        the YaRN scaling, softmax_all / plain_swiglu as moe_oss says;
        shexp=False leaves qwen35moe's shared expert out, shexp_gate=False
        adds it without its sigmoid gate. hidden=True: the hidden states
        after the final norm instead, [T, dim] (what an embedding pools)."""
        saved = self.yarn
        if not yarn:
            self.yarn = None
        try:
            return self._logits(ids, neox, qk_norm, up_first, window, local_theta, post_norm, gelu, softcap, renorm,
                                top, ties_high, sinks, softmax_all, plain_swiglu, attn_gate, gate_norm, delta,
                                all_attention, shexp, shexp_gate, hidden)
        finally:
            self.yarn = saved

    def _logits(self, ids, neox, qk_norm, up_first, window, local_theta, post_norm, gelu, softcap, renorm, top,
                ties_high, sinks, softmax_all, plain_swiglu, attn_gate, gate_norm, delta, all_attention, shexp,
                shexp_gate, hidden):
        neox = self.neox if neox is None else neox
        w, T, hs = self.w, len(ids), self.hs
        x = w["token_embd.weight"][ids]
        if self.gemma:
            x = x * math.sqrt(self.dim)
        pos = np.arange(T)
        group = self.n_heads // self.n_kv
        mask = np.triu(np.full((T, T), -np.inf), 1)
        # a key at p0 is hidden from a query at p1 when p1 - p0 >= window
        far = np.where(pos[:, None] - pos[None, :] >= max(self.window, 1), -np.inf, 0.0)
        for l in range(self.n_layers):
            b = "blk.%d." % l
            slides = self.window > 0 and self.sliding(l)
            theta, div = None, None
            if slides and self.local_theta and local_theta:
                theta, div = self.local_theta, np.ones(hs // 2)
            h = self.rmsnorm(x, w[b + "attn_norm.weight"])
            if self.hybrid and (l + 1) % self.interval != 0:
                x = x + self.deltanet(h, b, gate_norm, delta)
                h = self.rmsnorm(x, w[b + "post_attention_norm.weight"])
                x = x + self.hybrid_ffn(h, b, renorm, top, ties_high, shexp, shexp_gate)
                continue
            gates = None
            if self.hybrid:
                # Qwen 3.5's gated attention: per head its query, then its gate
                qg = (h @ w[b + "attn_q.weight"].T).reshape(T, self.n_heads, 2, hs)
                q, gates = qg[:, :, 0, :].reshape(T, -1), qg[:, :, 1, :].reshape(T, -1)
                k, v = (h @ w[b + n + ".weight"].T for n in ("attn_k", "attn_v"))
            elif b + "attn_qkv.weight" in w:
                # Phi-3: one matrix, Q's rows then K's then V's
                qkv = h @ w[b + "attn_qkv.weight"].T
                nq, nk = self.n_heads * hs, self.n_kv * hs
                q, k, v = qkv[:, :nq], qkv[:, nq:nq + nk], qkv[:, nq + nk:]
            else:
                q, k, v = (h @ w[b + n + ".weight"].T + w.get(b + n + ".bias", 0.0)
                           for n in ("attn_q", "attn_k", "attn_v"))
            q, k = q.reshape(T, self.n_heads, hs), k.reshape(T, self.n_kv, hs)
            if qk_norm and b + "attn_q_norm.weight" in w:
                # Qwen3: each head of Q and K RMS-normed over its hs elements, before RoPE
                q = self.rmsnorm(q, w[b + "attn_q_norm.weight"])
                k = self.rmsnorm(k, w[b + "attn_k_norm.weight"])
            q = self.rope(q, pos, neox, theta, div)
            k = self.rope(k, pos, neox, theta, div)
            v = v.reshape(T, self.n_kv, hs)
            out = np.empty((T, self.n_heads, hs))
            for hd in range(self.n_heads):
                kv = hd // group
                sc = q[:, hd, :] * self.q_scale @ k[:, kv, :].T
                if self.attn_cap and softcap:
                    sc = np.tanh(sc / self.attn_cap) * self.attn_cap
                sc = sc + mask + (far if slides and window else 0.0)
                if self.oss and sinks:
                    # the sink: one more logit in each row's softmax, weighing no value
                    sink = w[b + "attn_sinks.weight"][hd]
                    mx = np.maximum(sc.max(axis=1, keepdims=True), sink)
                    e = np.exp(sc - mx)
                    sc = e / (e.sum(axis=1, keepdims=True) + np.exp(sink - mx))
                else:
                    sc = np.exp(sc - sc.max(axis=1, keepdims=True))
                    sc /= sc.sum(axis=1, keepdims=True)
                out[:, hd, :] = sc @ v[:, kv, :]
            out = out.reshape(T, self.n_heads * hs)
            if gates is not None and attn_gate:
                out = out / (1 + np.exp(-gates))
            a = out @ w[b + "attn_output.weight"].T + w.get(b + "attn_output.bias", 0.0)
            if self.oss:
                # the converter's post_attention_norm is the FFN's input norm
                x = x + a
                x = x + self.moe_oss(self.rmsnorm(x, w[b + "post_attention_norm.weight"]), b, softmax_all,
                                     plain_swiglu)
                continue
            if self.hybrid:
                x = x + a
                h = self.rmsnorm(x, w[b + "post_attention_norm.weight"])
                x = x + self.hybrid_ffn(h, b, renorm, top, ties_high, shexp, shexp_gate)
                continue
            if post_norm and b + "post_attention_norm.weight" in w:
                a = self.rmsnorm(a, w[b + "post_attention_norm.weight"])
            x = x + a
            h = self.rmsnorm(x, w[b + "ffn_norm.weight"])
            if self.n_expert:
                x = x + self.moe(h, b, renorm, top, ties_high)
                continue
            if b + "ffn_gate.weight" in w:
                g, u = h @ w[b + "ffn_gate.weight"].T, h @ w[b + "ffn_up.weight"].T
            else:
                # Phi-3: ffn_up holds the gate's rows, then the up projection's
                gu = h @ w[b + "ffn_up.weight"].T
                ff = gu.shape[1] // 2
                g, u = gu[:, :ff], gu[:, ff:]
                if up_first:
                    g, u = u, g
            if self.gemma and gelu:
                # GELU, tanh approximation
                act = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
            else:
                act = g / (1 + np.exp(-g))
            f = (act * u) @ w[b + "ffn_down.weight"].T
            if post_norm and b + "post_ffw_norm.weight" in w:
                f = self.rmsnorm(f, w[b + "post_ffw_norm.weight"])
            x = x + f
        x = self.rmsnorm(x, w["output_norm.weight"])
        if hidden:
            return x
        out = x @ w.get("output.weight", w["token_embd.weight"]).T
        if self.final_cap and softcap:
            out = np.tanh(out / self.final_cap) * self.final_cap
        return out


def yarn(inv, hs, theta, factor, orig, beta_fast, beta_slow):
    """YaRN (Peng et al. 2023) as llama.cpp applies it (ggml's rope_yarn):
    pair j's frequency blends its own (extrapolation) and 1 / factor of it
    (interpolation) by a ramp that is 1 below the correction dimension of
    beta_fast rotations in orig positions (floored) and 0 above that of
    beta_slow (ceiled); cos and sin scaled by 1 + 0.1 ln factor."""
    def corr(rot):
        return hs * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(theta))
    lo, hi = max(0.0, math.floor(corr(beta_fast))), min(hs - 1.0, math.ceil(corr(beta_slow)))
    j = np.arange(hs // 2)
    ramp = 1 - np.clip((j - lo) / max(0.001, hi - lo), 0, 1)
    return inv / factor * (1 - ramp) + inv * ramp, 1 + 0.1 * math.log(factor)


def embedding(model, ids, pooling):
    """The pooled, L2-normalized embedding of ids: pooling "mean", "last"
    or "cls" over the final-normed hidden states (float64)."""
    h = model.logits(ids, hidden=True)
    v = h.mean(axis=0) if pooling == "mean" else h[-1] if pooling == "last" else h[0]
    return v / np.linalg.norm(v)


def llama3_divisors(hs, theta, factor, low, high, orig):
    """Meta's Llama 3.1 rope scaling, as 1 / (its frequency multiplier)."""
    out = []
    for i in range(hs // 2):
        freq = theta ** (-2.0 * i / hs)
        wavelen = 2 * math.pi / freq
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out)


def read_dump(path, vocab):
    """Records of tokpipe run --dump-logits: [(context ids, logits)]."""
    with open(path, "rb") as f:
        data = f.read()
    out, o = [], 0
    while o < len(data):
        n = struct.unpack_from("<i", data, o)[0]
        ids = list(struct.unpack_from("<%di" % n, data, o + 4))
        o += 4 + 4 * n
        out.append((ids, np.frombuffer(data, dtype=np.float32, count=vocab, offset=o).astype(np.float64)))
        o += 4 * vocab
    return out
