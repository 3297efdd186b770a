"""The EAGLE head's training objective in MLX: teacher-forced and unrolled drafting steps.

The same objective as mlxspec/training/eagle_torch.py's PyTorch `losses`, on mlxspec's own `EagleHead`
(so a trained head is exported as is). Entry j of a sequence reads the token x[j+1] and a
feature, and predicts f[j+1]:
  step 0   every entry reads the target's real f[j] (teacher forcing, with input noise);
  step s   entry j reads what step s-1 predicted for position j, and attends as drafting step
           s+1 does: the real entries up to j-s, then the entries steps 1..s made at
           j-s+1 .. j, the last being itself (`step_mask`).
Loss per step: smooth-L1(predicted f[j+1], f[j+1]) + ce_weight x cross-entropy to the target's
own next-token distribution (softmax of f[j+1] @ W^T over the draft vocabulary), on the
entries `weights` selects; step s is weighted unroll_weight**s. Entries before the loss's
first one (a prompt) are context: step 0 computes only their keys and values, later steps
nothing (`window_starts`), the same loss for about three quarters of the work.
A head that reads the target's context (--context target) attends to the target's last-layer
keys and values of positions 0..j-s instead of its own real entries, and sees of step 0 only
its entry j-s (`context_mask`); entry j sits at token x[j+1]'s position, j+1.
"""

from __future__ import annotations

from typing import List, Tuple

import mlx.core as mx
import mlx.nn as nn
from .eagle_training import context_mask, first_loss_entry, step_mask, window_starts  # noqa: F401  (numpy, shared)


def context_kv(model, rows: mx.array) -> Tuple[mx.array, mx.array]:
    """The target's last layer's keys and values at positions 0..L-1, as its cache holds them, from
    that layer's (B, L, H) inputs (tapped): its own attention writes them into a cache, so biases,
    key norms and RoPE are the target's whatever its family."""
    from mlx_lm.models.cache import KVCache

    layer = model.model.layers[-1]
    cache = KVCache()
    L = rows.shape[1]
    causal = mx.arange(L)[:, None] >= mx.arange(L)[None]  # an array: Gemma 2's attention takes no "causal"
    layer.self_attn(layer.input_layernorm(rows.astype(model.model.norm.weight.dtype)), mask=causal, cache=cache)
    k, v = cache.keys[..., :L, :], cache.values[..., :L, :]
    return mx.stop_gradient(k.astype(mx.float32)), mx.stop_gradient(v.astype(mx.float32))


def block_pass(blk, x: mx.array, past: List[Tuple[mx.array, mx.array]], mask: mx.array,
               offset: int = 0, start: int = 0):
    """One llama block over (B, L, H) entries at positions offset.., also seeing earlier passes'
    keys/values (`past`) through `mask`; returns (output of entries start.., this pass's (keys,
    values) of all L). Entries before `start` only lend their keys and values."""
    a = blk.self_attn
    B, L, _ = x.shape
    h = blk.input_layernorm(x)
    q = a.q_proj(h[:, start:]).reshape(B, L - start, a.n_heads, -1).transpose(0, 2, 1, 3)  # (B, nh, L', d)
    k = a.k_proj(h).reshape(B, L, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
    v = a.v_proj(h).reshape(B, L, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
    q, k = a.rope(q, offset=offset + start), a.rope(k, offset=offset)
    ks = mx.concatenate([p[0] for p in past] + [k], axis=2) if past else k
    vs = mx.concatenate([p[1] for p in past] + [v], axis=2) if past else v
    o = mx.fast.scaled_dot_product_attention(q, ks, vs, scale=a.scale, mask=mask)
    x = x[:, start:] + a.o_proj(o.transpose(0, 2, 1, 3).reshape(B, L - start, -1))
    return x + blk.mlp(blk.post_attention_layernorm(x)), (k, v)


def unrolled(head, emb: mx.array, feat: mx.array, steps: int, first: int = 0, context=None) -> List[mx.array]:
    """Predicted features of each step 0..steps-1 (`feat`: real features, already lifted): step
    s's (B, L - starts[s], H) for entries starts[s].. (`window_starts(first, steps)`; all L
    when `first` is 0). `context`: the target's last-layer (keys, values) (`context_kv`)."""
    L = emb.shape[1]
    starts = window_starts(first, steps)
    past, preds = ([[context]] if context is not None else []), []
    shift = 1 if context is not None else 0
    for s, w in enumerate(starts):
        if s == 0:
            e_in, f_in = emb, feat
        elif w == 0:  # entry j reads the feature the previous step predicted for position j
            e_in, f_in = emb, mx.concatenate([feat[:, :1], mx.stop_gradient(preds[-1][:, :-1])], axis=1)
        else:
            prev = starts[s - 1]
            e_in, f_in = emb[:, w:], mx.stop_gradient(preds[-1][:, w - 1 - prev: L - 1 - prev])
        x = head.fc(mx.concatenate([e_in, f_in], axis=-1))
        m = mx.array(context_mask(L, s, starts) if context is not None else step_mask(L, s, starts))
        # step 0 feeds every entry, as the keys and values of the context; its last layer
        # computes only the window's queries (earlier layers' outputs are the next one's input)
        full = mx.array(step_mask(L, 0, [0])) if s == 0 and w and len(head.layers) > 1 else m
        kvs = []
        for i, blk in enumerate(head.layers):
            last = i == len(head.layers) - 1
            start = w if s == 0 and last else 0
            x, kv = block_pass(blk, x, [p[i] for p in past], m if last else full, (w if s else 0) + shift, start)
            kvs.append(kv)
        past.append(kvs)
        preds.append(head.norm(x))
    return preds


def smooth_l1(d: mx.array) -> mx.array:
    a = mx.abs(d)
    return mx.where(a < 1.0, 0.5 * d * d, a - 0.5)


def loss(head, emb, feat, tgt, weights, w_draft, *, steps: int, unroll_weight: float, ce_weight: float,
         first: int = 0, context=None, post=None):
    """(loss, per-step top-1 agreement counts (steps,)) for one padded batch.

    Args:
        emb: (B, L, H) the target's embeddings of x[j+1]. feat: (B, L, F) real inputs (the final
            hidden state f[j], or tapped layers' outputs, which `head.lift` projects).
        tgt: (B, L, H) f[j+1]. weights: (B, L) 1.0 where the loss applies, else 0.
        w_draft: (N, H) the target's output rows of the draft vocabulary.
        first: no entry before it has loss (`first_loss_entry(weights)`): entries before the
            steps' windows are computed only as context. 0 computes everything.
        context: for a head that reads the target's context, its (keys, values) (`context_kv`).
        post: the target's cap or scale after its output rows (`backbone.logit_map`), applied to
            both laws as the drafter applies it; None: none.
    """
    def logits(x):
        z = x @ w_draft.T
        return z if post is None else post(z)

    starts = window_starts(first, steps)
    tgt, weights = tgt[:, starts[0]:], weights[:, starts[0]:]
    p_t = mx.stop_gradient(mx.softmax(logits(tgt), axis=-1))  # the target's next-token law
    top_t = mx.argmax(p_t, axis=-1)
    n = mx.maximum(weights.sum(), 1.0)
    total, agree = mx.array(0.0), []
    for s, pred in enumerate(unrolled(head, emb, head.lift(feat), steps, first, context)):
        d = starts[s] - starts[0]
        logq = nn.log_softmax(logits(pred), axis=-1)
        reg = (smooth_l1(pred - tgt[:, d:]).mean(-1) * weights[:, d:]).sum() / n
        ce = (-(p_t[:, d:] * logq).sum(-1) * weights[:, d:]).sum() / n
        total = total + (reg + ce_weight * ce) * unroll_weight ** s
        agree.append(((mx.argmax(logq, axis=-1) == top_t[:, d:]) * weights[:, d:]).sum())
    return total, mx.stack(agree)

