"""An independent NumPy reference for the tests' GGUF files (`tiny_gguf`): it reads a file back
with `gguf.GGUFReader` + `gguf.quants.dequantize` and runs the forward pass in float64, as
llama.cpp runs each architecture (interleaved RoPE on llama's permuted rows, halves otherwise),
so it shares no code, and no Q/K convention, with the loader under test. Against llama.cpp
itself on float32 files it agrees to a few 1e-4 of the largest logit (the loader's README).
"""

from __future__ import annotations

import numpy as np

from tiny_gguf import EPS, HEADS, KV_HEADS, LLAMA_ROWS, THETA


def check_logits(model, path, ids, tol: float) -> None:
    """`model`'s logits on `ids` (in float32) within `tol` of the reference's largest logit, and
    the reference's argmax at every position."""
    import mlx.core as mx

    got = np.array(model(mx.array([ids])).astype(mx.float32))[0]
    ref = reference_logits(path, ids)
    assert np.abs(got - ref).max() <= tol * np.abs(ref).max()
    assert (got.argmax(-1) == ref.argmax(-1)).all()


def reference_weights(path) -> dict[str, np.ndarray]:
    """Every tensor of the file as float64, (rows, cols), via gguf's reader and dequantizer."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    out = {}
    for t in reader.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type)
        out[t.name] = np.asarray(a, dtype=np.float64).reshape(tuple(int(d) for d in reversed(t.shape)))
    return out


def reference_logits(path, tokens) -> np.ndarray:
    """Float64 NumPy forward pass of the GGUF at `path` on `tokens`: (len(tokens), vocab)."""
    import gguf

    arch = bytes(gguf.GGUFReader(str(path)).fields["general.architecture"].parts[-1]).decode()
    if arch == "gpt-oss":
        return gpt_oss_logits(path, tokens)
    W = reference_weights(path)
    for key in [k for k in W if k.endswith("attn_qkv.weight")]:  # phi3: split as llama.cpp does
        qkv = W.pop(key)
        head_dim = qkv.shape[0] // (HEADS + 2 * KV_HEADS)
        p = key.removesuffix("attn_qkv.weight")
        W[p + "attn_q.weight"], W[p + "attn_k.weight"], W[p + "attn_v.weight"] = np.split(
            qkv, [HEADS * head_dim, (HEADS + KV_HEADS) * head_dim])
        W[p + "ffn_gate.weight"], W[p + "ffn_up.weight"] = np.split(W[p + "ffn_up.weight"], 2)
    head_dim = W["blk.0.attn_q.weight"].shape[0] // HEADS
    n = len(tokens)
    x = W["token_embd.weight"][np.asarray(tokens)]
    pos = np.arange(n)[:, None]
    fields = gguf.GGUFReader(str(path)).fields

    def value(key, default=None):
        return fields[key].parts[-1][0] if key in fields else default

    # the first `rd` dims of a head rotate (Phi-4-mini: 3/4); LongRoPE's long factors, as llama.cpp
    # takes them with a context past the original one, and its attention factor on cos and sin
    rd = int(value(f"{arch}.rope.dimension_count", head_dim))
    factors = W.get("rope_freqs.weight", W.get("rope_factors_long.weight", 1.0))
    inv = THETA ** (-np.arange(0, rd, 2) / rd) / factors
    mscale = float(value(f"{arch}.rope.scaling.attn_factor", 1.0))
    angles = pos * inv
    scaling = fields.get(f"{arch}.rope.scaling.type")
    if scaling is not None and bytes(scaling.parts[-1]).decode() == "yarn":  # the attention factor times YaRN's
        angles, magnitude = yarn(angles, rd, THETA, float(value(f"{arch}.rope.scaling.factor")),
                                 int(value(f"{arch}.rope.scaling.original_context_length")))
        mscale *= magnitude
    cos, sin = mscale * np.cos(angles), mscale * np.sin(angles)  # (n, rd/2)

    def norm(v, w):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + EPS) * w

    def rope_interleaved(v):  # (n, heads, hd): rotate pairs (2i, 2i+1), llama.cpp's "normal" mode
        a, b = v[..., 0::2], v[..., 1::2]
        c, s = cos[:, None, :], sin[:, None, :]
        out = np.empty_like(v)
        out[..., 0::2] = a * c - b * s
        out[..., 1::2] = a * s + b * c
        return out

    def rope_halves(v):  # rotate pairs (i, i + rd/2): llama.cpp's "NEOX" mode, qwen2's and qwen3's
        half = rd // 2
        a, b = v[..., :half], v[..., half:rd]
        c, s = cos[:, None, :], sin[:, None, :]
        return np.concatenate([a * c - b * s, a * s + b * c, v[..., rd:]], axis=-1)

    rope = rope_interleaved if arch in LLAMA_ROWS else rope_halves

    def project(h, p, part, heads):
        out = h @ W[p + f"attn_{part}.weight"].T + W.get(p + f"attn_{part}.bias", 0.0)
        qk_norm = W.get(p + f"attn_{part}_norm.weight")
        if qk_norm is not None and qk_norm.size == out.shape[-1]:  # OLMo 2: the whole projection normed
            out = norm(out, qk_norm)
        out = out.reshape(n, heads, head_dim)
        if qk_norm is not None and qk_norm.size == head_dim:  # qwen3: each head normed before RoPE
            out = norm(out, qk_norm)
        return out

    mask = np.triu(np.full((n, n), -np.inf), 1)
    layers = 1 + max(int(k.split(".")[1]) for k in W if k.startswith("blk."))
    gemma = arch in ("gemma", "gemma2", "gemma3")  # GELU (tanh), a scaled input; 2 and 3 windows too
    windowed = arch in ("gemma2", "gemma3")

    # llama.cpp's Gemma 2: a window on the even layers, tanh caps on attention scores and logits
    attn_cap, final_cap = value("gemma2.attn_logit_softcapping"), value("gemma2.final_logit_softcapping")
    used = int(value(f"{arch}.expert_used_count", 0))
    # Granite's scales: of the embeddings, of what each block adds, of attention scores, of logits
    x = x * float(value(f"{arch}.embedding_scale", 1.0))
    residual = float(value(f"{arch}.residual_scale", 1.0))
    if gemma:
        x = x * np.sqrt(x.shape[-1])
    if windowed:  # llama.cpp's Gemma 3: a window on 5 layers in 6, their RoPE base 10,000
        window = int(value(f"{arch}.attention.sliding_window"))
        local = mask + np.where(np.subtract.outer(np.arange(n), np.arange(n)) >= window, -np.inf, 0.0)
        base_local = 10000.0 if arch == "gemma3" else THETA
        inv_local = base_local ** (-np.arange(0, head_dim, 2) / head_dim)
        cos_local, sin_local = np.cos(pos * inv_local), np.sin(pos * inv_local)
        cos_global, sin_global = cos, sin
    for i in range(layers):
        p = f"blk.{i}."
        sliding = (arch == "gemma3" and (i + 1) % 6 != 0) or (arch == "gemma2" and i % 2 == 0)
        if windowed:
            cos, sin = (cos_local, sin_local) if sliding else (cos_global, sin_global)
        h = norm(x, W[p + "attn_norm.weight"]) if p + "attn_norm.weight" in W else x
        # SmolLM3: no RoPE in every 4th layer (llama.cpp's n_no_rope_layer_step)
        rotate = rope if not (arch == "smollm3" and (i + 1) % 4 == 0) else (lambda v: v)
        q = rotate(project(h, p, "q", HEADS))
        k = rotate(project(h, p, "k", KV_HEADS))
        v = (h @ W[p + "attn_v.weight"].T + W.get(p + "attn_v.bias", 0.0)).reshape(n, KV_HEADS, head_dim)
        rep = HEADS // KV_HEADS
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) * float(value(f"{arch}.attention.scale", head_dim**-0.5))
        if attn_cap:
            scores = attn_cap * np.tanh(scores / attn_cap)
        scores = scores + (local if sliding else mask)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(n, HEADS * head_dim)
        out = attn @ W[p + "attn_output.weight"].T
        post = W.get(p + "post_attention_norm.weight")
        x = x + (norm(out, post) if post is not None else out * residual)
        h = norm(x, W[p + "ffn_norm.weight"]) if p + "ffn_norm.weight" in W else x

        def mlp(h, gate, up, down):
            g = h @ gate.T
            act = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3))) if gemma else g / (1 + np.exp(-g))
            return (act * (h @ up.T)) @ down.T

        if p + "ffn_gate_inp.weight" in W:  # llama.cpp's mixtures: softmax router, top k, weights summed
            logits = h @ W[p + "ffn_gate_inp.weight"].T
            probs = np.exp(logits - logits.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            top = np.argsort(-probs, axis=-1)[:, :used]
            weight = np.take_along_axis(probs, top, -1)
            if arch != "qwen2moe":  # to 1 (Mixtral's and Qwen3's), Qwen2's as they are
                weight /= weight.sum(-1, keepdims=True)
            out = np.zeros_like(h)
            for row in range(n):
                for e, wt in zip(top[row], weight[row]):
                    out[row] += wt * mlp(h[row], *(W[p + f"ffn_{k}_exps.weight"][e] for k in ("gate", "up", "down")))
            if p + "ffn_gate_inp_shexp.weight" in W:
                shared = mlp(h, *(W[p + f"ffn_{k}_shexp.weight"] for k in ("gate", "up", "down")))
                out += shared / (1 + np.exp(-(h @ W[p + "ffn_gate_inp_shexp.weight"])))[:, None]
        else:
            out = mlp(h, W[p + "ffn_gate.weight"], W[p + "ffn_up.weight"], W[p + "ffn_down.weight"])
        post = W.get(p + "post_ffw_norm.weight")
        x = x + (norm(out, post) if post is not None else out * residual)
    head = W.get("output.weight", W["token_embd.weight"])
    logits = norm(x, W["output_norm.weight"]) @ head.T / float(value(f"{arch}.logit_scale", 1.0))
    return final_cap * np.tanh(logits / final_cap) if final_cap else logits


def yarn(angles: np.ndarray, dims: int, base: float, factor: float, original: int):
    """ggml's `rope_yarn` with llama.cpp's defaults (betas 32 and 1, extrapolation mix 1): each
    pair's angle (`angles`, (n, dims / 2), unscaled) between itself (fast pairs) and itself over
    `factor` (slow ones), ramped between the corrected dims; and the scale of cos and sin."""
    def corr_dim(rotations):  # ggml_rope_yarn_corr_dim
        return dims * np.log(original / (rotations * 2 * np.pi)) / (2 * np.log(base))

    low, high = max(0.0, np.floor(corr_dim(32.0))), min(dims - 1.0, np.ceil(corr_dim(1.0)))
    ramp = 1 - np.clip((np.arange(dims // 2) - low) / max(0.001, high - low), 0, 1)  # 1: extrapolate
    return angles / factor * (1 - ramp) + angles * ramp, 1 + 0.1 * np.log(factor)


def gpt_oss_logits(path, tokens) -> np.ndarray:
    """llama.cpp's gpt-oss (`llm_build_openai_moe_iswa`) in float64: RMS norms, Q/K/V/O with
    biases, NEOX RoPE with YaRN (ggml's `rope_yarn`: corrected dims, ramp, mscale on cos and
    sin), attention whose softmax has one more logit per head (its sink) and a window of
    `sliding_window` keys on the even layers, then the norm named post_attention_norm, a router
    with a bias whose top k logits are softmaxed, and experts with biases and the clamped SwiGLU
    (alpha 1.702, limit 7)."""
    import gguf

    fields = gguf.GGUFReader(str(path)).fields

    def value(key):
        return fields[f"gpt-oss.{key}"].parts[-1][0]

    W = reference_weights(path)
    n = len(tokens)
    heads, kv_heads = int(value("attention.head_count")), int(value("attention.head_count_kv"))
    head_dim = W["blk.0.attn_q.weight"].shape[0] // heads
    base, factor = float(value("rope.freq_base")), float(value("rope.scaling.factor"))
    original, window = int(value("rope.scaling.original_context_length")), int(value("attention.sliding_window"))
    used, eps = int(value("expert_used_count")), float(value("attention.layer_norm_rms_epsilon"))

    i = np.arange(head_dim // 2)
    theta, mscale = yarn(np.arange(n)[:, None] * base ** (-2 * i / head_dim), head_dim, base, factor, original)
    cos, sin = mscale * np.cos(theta)[:, None, :], mscale * np.sin(theta)[:, None, :]

    def rope(v):  # NEOX: pairs (j, j + head_dim / 2)
        a, b = v[..., : head_dim // 2], v[..., head_dim // 2:]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)

    def norm(v, w):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * w

    def linear(h, name):
        return h @ W[name + ".weight"].T + W[name + ".bias"]

    ago = np.subtract.outer(np.arange(n), np.arange(n))
    x = W["token_embd.weight"][np.asarray(tokens)]
    layers = 1 + max(int(k.split(".")[1]) for k in W if k.startswith("blk."))
    for layer in range(layers):
        p = f"blk.{layer}."
        h = norm(x, W[p + "attn_norm.weight"])
        q = rope(linear(h, p + "attn_q").reshape(n, heads, head_dim))
        k = rope(linear(h, p + "attn_k").reshape(n, kv_heads, head_dim))
        v = linear(h, p + "attn_v").reshape(n, kv_heads, head_dim)
        k, v = np.repeat(k, heads // kv_heads, axis=1), np.repeat(v, heads // kv_heads, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(head_dim)
        hidden = (ago < 0) | ((ago >= window) if layer % 2 == 0 else False)
        scores = np.where(hidden, -np.inf, scores)
        sink = W[p + "attn_sinks.weight"].reshape(heads, 1, 1) * np.ones((1, n, 1))
        scores = np.concatenate([scores, sink], axis=-1)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs = (probs / probs.sum(-1, keepdims=True))[..., :n]  # the sink takes its share, then goes
        x = x + linear(np.einsum("hqk,khd->qhd", probs, v).reshape(n, heads * head_dim), p + "attn_output")
        h = norm(x, W[p + "post_attention_norm.weight"])
        router = linear(h, p + "ffn_gate_inp")
        out = np.zeros_like(h)
        for row in range(n):
            top = np.argsort(-router[row])[:used]
            weight = np.exp(router[row, top] - router[row, top].max())
            for e, wt in zip(top, weight / weight.sum()):
                def expert(part, v):
                    return v @ W[p + f"ffn_{part}_exps.weight"][e].T + W[p + f"ffn_{part}_exps.bias"][e]
                gate = np.minimum(expert("gate", h[row]), 7.0)
                up = np.clip(expert("up", h[row]), -7.0, 7.0)
                out[row] += wt * expert("down", gate / (1 + np.exp(-1.702 * gate)) * (up + 1))
        x = x + out
    return norm(x, W["output_norm.weight"]) @ W["output.weight"].T
