"""The EAGLE head's training objective in MLX: teacher-forced and unrolled drafting steps.

The same objective as scripts/train_eagle.py's PyTorch `losses`, on mlxspec's own `EagleHead`
(so a trained head is exported as is). Entry j of a sequence reads the token x[j+1] and a
feature, and predicts f[j+1]:
  step 0   every entry reads the target's real f[j] (teacher forcing, with input noise);
  step s   entry j reads what step s-1 predicted for position j, and attends as drafting step
           s+1 does: the real entries up to j-s, then the entries steps 1..s made at
           j-s+1 .. j, the last being itself (`unroll_mask`).
Loss per step: smooth-L1(predicted f[j+1], f[j+1]) + ce_weight x cross-entropy to the target's
own next-token distribution (softmax of f[j+1] @ W^T over the draft vocabulary), on the
entries `weights` selects; step s is weighted unroll_weight**s.
"""

from __future__ import annotations

from typing import List, Tuple

import mlx.core as mx
import mlx.nn as nn
import numpy as np


def unroll_mask(L: int, s: int) -> mx.array:
    """(L, (s+1) L) boolean: which keys entry j of unrolled step s sees (step 0: causal)."""
    vis = [np.tril(np.ones((L, L), dtype=bool), -s)]
    for t in range(1, s + 1):  # step t's entry at j - (s - t)
        vis.append(np.tril(np.roll(np.eye(L, dtype=bool), -(s - t), axis=1)))
    return mx.array(np.concatenate(vis, axis=1))


def block_pass(blk, x: mx.array, past: List[Tuple[mx.array, mx.array]], mask: mx.array):
    """One llama block over (B, L, H) entries at positions 0..L-1, also seeing earlier passes'
    keys/values (`past`) through `mask`; returns (output, this pass's (keys, values))."""
    a = blk.self_attn
    B, L, _ = x.shape
    h = blk.input_layernorm(x)
    q = a.q_proj(h).reshape(B, L, a.n_heads, -1).transpose(0, 2, 1, 3)  # (B, nh, L, d)
    k = a.k_proj(h).reshape(B, L, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
    v = a.v_proj(h).reshape(B, L, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
    q, k = a.rope(q), a.rope(k)
    ks = mx.concatenate([p[0] for p in past] + [k], axis=2) if past else k
    vs = mx.concatenate([p[1] for p in past] + [v], axis=2) if past else v
    o = mx.fast.scaled_dot_product_attention(q, ks, vs, scale=a.scale, mask=mask)
    x = x + a.o_proj(o.transpose(0, 2, 1, 3).reshape(B, L, -1))
    return x + blk.mlp(blk.post_attention_layernorm(x)), (k, v)


def unrolled(head, emb: mx.array, feat: mx.array, steps: int) -> List[mx.array]:
    """Predicted features (B, L, H) of each step 0..steps-1 (`feat`: real features, already lifted)."""
    L = emb.shape[1]
    past, preds = [], []
    for s in range(steps):
        if s == 0:
            f_in = feat
        else:  # entry j reads the feature the previous step predicted for position j
            f_in = mx.concatenate([feat[:, :1], mx.stop_gradient(preds[-1][:, :-1])], axis=1)
        x = head.fc(mx.concatenate([emb, f_in], axis=-1))
        m = unroll_mask(L, s)
        kvs = []
        for i, blk in enumerate(head.layers):
            x, kv = block_pass(blk, x, [p[i] for p in past], m)
            kvs.append(kv)
        past.append(kvs)
        preds.append(head.norm(x))
    return preds


def smooth_l1(d: mx.array) -> mx.array:
    a = mx.abs(d)
    return mx.where(a < 1.0, 0.5 * d * d, a - 0.5)


def loss(head, emb, feat, tgt, weights, w_draft, *, steps: int, unroll_weight: float, ce_weight: float):
    """(loss, per-step top-1 agreement counts (steps,)) for one padded batch.

    Args:
        emb: (B, L, H) the target's embeddings of x[j+1]. feat: (B, L, F) real inputs (the final
            hidden state f[j], or tapped layers' outputs, which `head.lift` projects).
        tgt: (B, L, H) f[j+1]. weights: (B, L) 1.0 where the loss applies, else 0.
        w_draft: (N, H) the target's output rows of the draft vocabulary.
    """
    p_t = mx.stop_gradient(mx.softmax(tgt @ w_draft.T, axis=-1))  # the target's next-token law
    top_t = mx.argmax(p_t, axis=-1)
    n = mx.maximum(weights.sum(), 1.0)
    total, agree = mx.array(0.0), []
    for s, pred in enumerate(unrolled(head, emb, head.lift(feat), steps)):
        logq = nn.log_softmax(pred @ w_draft.T, axis=-1)
        reg = (smooth_l1(pred - tgt).mean(-1) * weights).sum() / n
        ce = (-(p_t * logq).sum(-1) * weights).sum() / n
        total = total + (reg + ce_weight * ce) * unroll_weight ** s
        agree.append(((mx.argmax(logq, axis=-1) == top_t) * weights).sum())
    return total, mx.stack(agree)
