"""Verification of a round of k draft tokens against the target: the reference.

Leviathan et al. / Chen et al. rejection sampling, on *processed* distributions:
  p = target row i (the target's distribution for position i), q = draft row i.
  Draft token x_i is accepted with probability min(1, p(x_i) / q(x_i)); tested as
  u_i * q(x_i) < p(x_i), which also covers q(x_i) = 0 (accept iff p(x_i) > 0).
  At the first rejection j the next token is drawn from norm(max(0, p_j - q_j));
  when all k are accepted it is drawn from the target's row k (the bonus token).
The output is then distributed exactly as the target alone would sample.

Greedy is the one-hot case (accept while x_i == argmax p_i, next = argmax of the first
mismatching row). All positions are decided on the device; the caller reads two ints once
per round. The fused Metal kernel in `mlxspec.kernels` must equal `verify_with_uniforms`.
"""

from __future__ import annotations

import mlx.core as mx

from .errors import InvalidArgumentError
from .sampling import sample_rows

# Index drawn from unnormalised non-negative weights (V,) with a uniform u in [0, 1).
sample_inverse_cdf = sample_rows


def verify_with_uniforms(target_probs: mx.array, draft_probs: mx.array, draft_tokens: mx.array,
                         uniforms: mx.array) -> mx.array:
    """Device-side verification. Shapes: (k+1, V), (k, V), (k,), (k+1,) -> int32 [n_accepted, next_token].

    uniforms[:k] decide acceptance; uniforms[k] draws the next token.
    """
    k = draft_tokens.shape[0]
    if k == 0:
        return mx.stack([mx.array(0, mx.int32), sample_inverse_cdf(target_probs[0], uniforms[0])])
    rows = mx.arange(k)
    p_x = target_probs[rows, draft_tokens]  # (k,)
    q_x = draft_probs[rows, draft_tokens]  # (k,)
    accepted = uniforms[:k] * q_x < p_x  # (k,)
    # n = number of leading accepts: position of the first reject, k if none.
    n = mx.sum(mx.cumprod(accepted.astype(mx.int32))).astype(mx.int32)
    # Residual of the rejected row; the target's row k (bonus) when all were accepted.
    q_pad = mx.concatenate([draft_probs, mx.zeros((1, draft_probs.shape[-1]), draft_probs.dtype)])
    p_n = mx.take(target_probs, n, axis=0)
    q_n = mx.take(q_pad, n, axis=0)
    residual = mx.maximum(p_n - q_n, 0.0)
    # p == q up to rounding leaves no residual mass: then p itself is the right law.
    residual = mx.where(mx.sum(residual) > 0, residual, p_n)
    return mx.stack([n, sample_inverse_cdf(residual, uniforms[k])])


def verify_greedy(target_tokens: mx.array, draft_tokens: mx.array) -> mx.array:
    """Greedy fast path: target argmax tokens (k+1,) vs draft tokens (k,) -> [n_accepted, next_token]."""
    k = draft_tokens.shape[0]
    match = (target_tokens[:k] == draft_tokens).astype(mx.int32)
    n = mx.sum(mx.cumprod(match)).astype(mx.int32) if k else mx.array(0, mx.int32)
    return mx.stack([n, mx.take(target_tokens, n).astype(mx.int32)])


def verify(target_probs: mx.array, draft_probs: mx.array, draft_tokens, *, key=None) -> tuple[int, int]:
    """Decide a round: returns (n_accepted, next_token).

    Args:
        target_probs: (k+1, V) processed target probabilities (row i predicts position i).
        draft_probs: (k, V) processed draft probabilities the draft tokens were sampled from.
        draft_tokens: (k,) draft token ids (mx.array or list of ints).
        key: optional `mx.random.key`; None draws from MLX's global random state.
    """
    target_probs = mx.array(target_probs)
    draft_probs = mx.array(draft_probs)
    draft_tokens = mx.array(draft_tokens, dtype=mx.int32).reshape(-1)
    k = draft_tokens.shape[0]
    if target_probs.ndim != 2 or target_probs.shape[0] != k + 1:
        raise InvalidArgumentError(f"target_probs must have shape (k+1, V) = ({k + 1}, V), got {target_probs.shape}")
    V = target_probs.shape[1]
    if k and (draft_probs.ndim != 2 or draft_probs.shape != (k, V)):
        raise InvalidArgumentError(f"draft_probs must have shape (k, V) = ({k}, {V}), got {draft_probs.shape}")
    if k == 0:
        draft_probs = mx.zeros((0, V), mx.float32)
    uniforms = mx.random.uniform(shape=(k + 1,), key=key)
    out = verify_with_uniforms(target_probs, draft_probs, draft_tokens, uniforms)
    n, nxt = out.tolist()
    return int(n), int(nxt)
