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
import numpy as np

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


# -- trees ---------------------------------------------------------------------------------------
# A tree of N candidates: tokens[i] is node i's token and parents[i] its parent's index (-1: a
# child of the root, the last committed token). Target row 0 predicts the root's successor and
# row i+1 node i's. Siblings are tried in index order.


def _tree_children(parents, n: int):
    children = [[] for _ in range(n + 1)]  # children[0]: the root's; children[i+1]: node i's
    for i, par in enumerate(parents):
        if not -1 <= par < i:
            raise InvalidArgumentError(f"parents[{i}] must be in [-1, {i - 1}] (a parent precedes its children), got {par}")
        children[par + 1].append(i)
    return children


def verify_tree(p, tokens, parents, q=None, *, key=None) -> tuple[list, int]:
    """Lossless multi-candidate verification of a token tree: returns (path, next_token).

    At each accepted node the children are tried in order against a residual r, which
    starts as the node's target row p. A child x drawn from q (its row of `q`; one-hot at
    its token when `q` is None, a deterministic candidate) is accepted with probability
    min(1, r(x) / q(x)); on rejection r becomes norm(max(r - q, 0)) and the next sibling is
    tried (SpecInfer's rule for siblings drawn independently from q; for one-hot q it
    removes x from r). When no child is accepted the next token is drawn from r. The first
    output token is then distributed as p[0], and after an accepted node i the next as p[i+1].

    Args:
        p: (N+1, V) target probabilities (row 0 at the root, row i+1 after node i).
        tokens: (N,) node tokens.
        parents: (N,) parent indices, -1 for children of the root; a parent precedes its children.
        q: None (deterministic candidates) or (N, V), q[i] the distribution node i was drawn from.
        key: optional `mx.random.key`; None draws from MLX's global random state.

    Returns:
        (path, next_token): accepted node indices root-to-leaf, and the token after them.
    """
    p = _host(p)
    tokens = [int(t) for t in _host(tokens).reshape(-1)]
    parents = [int(x) for x in _host(parents).reshape(-1)]
    n = len(tokens)
    if len(parents) != n:
        raise InvalidArgumentError(f"tokens and parents must have the same length, got {n} and {len(parents)}")
    if p.ndim != 2 or p.shape[0] != n + 1:
        raise InvalidArgumentError(f"p must have shape (N+1, V) = ({n + 1}, V), got {p.shape}")
    if q is not None:
        q = _host(q)
        if q.shape != (n, p.shape[1]):
            raise InvalidArgumentError(f"q must have shape (N, V) = ({n}, {p.shape[1]}), got {q.shape}")
    u = np.asarray(mx.random.uniform(shape=(n + 1,), key=key), dtype=np.float64)
    return verify_tree_with_uniforms(p, tokens, parents, q, u)


def verify_tree_with_uniforms(p: np.ndarray, tokens, parents, q, u) -> tuple[list, int]:
    """`verify_tree` with its N+1 uniforms given: u[i] decides node i, u[N] draws the next token."""
    children = _tree_children(parents, len(tokens))
    path, row = [], 0
    while True:
        r = p[row].copy()
        for c in children[row]:
            x = tokens[c]
            if q is None:  # one-hot q: accept with probability r(x), else remove x
                if u[c] * r.sum() < r[x]:
                    break
                r[x] = 0.0
            else:
                qc = q[c]
                if u[c] * qc[x] * r.sum() < r[x]:
                    break
                rest = np.maximum(r / r.sum() - qc, 0.0)
                r = rest if rest.sum() > 0 else r  # r == q up to rounding: r itself is the law
        else:
            return path, _draw(r, u[-1])
        path.append(c)
        row = c + 1


def _host(x) -> np.ndarray:
    # float64 on the host: a tree is a handful of rows, and bfloat16 has no numpy dtype.
    if isinstance(x, mx.array):
        x = x.astype(mx.float32) if mx.issubdtype(x.dtype, mx.floating) else x
    return np.asarray(x, dtype=np.float64)


def _draw(weights: np.ndarray, u: float) -> int:
    cdf = np.cumsum(weights)
    i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    return min(i, int(np.flatnonzero(weights > 0)[-1]))


def walk_tree(row_tokens, tokens, parents) -> tuple[list, int]:
    """Follow the target's own token for every row through the tree: returns (path, next_token).

    `row_tokens[r]` is the token the target chose at row r (its argmax, or a sample drawn with
    the position-keyed uniform of the row's depth). Greedy verification is this walk on the
    argmax rows: the longest path matching the target at every step. For deterministic
    candidates it is also lossless sampling: a child is followed with probability p(x), as
    `verify_tree` accepts it, and the token that leaves the tree is the target's own sample.
    """
    children = _tree_children(parents, len(tokens))
    path, row = [], 0
    while True:
        t = row_tokens[row]
        c = next((c for c in children[row] if tokens[c] == t), None)
        if c is None:
            return path, t
        path.append(c)
        row = c + 1
