"""Side leaves for a model drafter's chain: the tree a model or feature head grows for free.

A model drafter computes a whole distribution at every chain step. Where its top token is
unsure, its runners-up are the likeliest other tokens there, so each becomes a leaf beside
that step (a child of the step's parent). Leaves are ranked as EAGLE-2 ranks its nodes, by
the drafter's own probability of the path to them: the product of the chain's probabilities
above the leaf times the leaf's own. They cost no drafting, only rows of the verify pass;
`treeplan.widen` keeps those that pay for their rows on this device.

Leaves only: a side token's own continuation would need drafter steps over a tree-masked
cache, and the first wrong chain step is where a side branch pays most.

Such a tree is read on the host before its pass (its shape depends on the probabilities), and
the device waits meanwhile. A fixed-shape tree does not: the chain plus the runner-up of each
of its first m steps (EAGLE-1's and Medusa's static trees), drafted and verified on the device
like a chain (`static_parents`, `runner_up`). It is the one shape sampled rounds grow: their
chain is the drafter's race winners and a leaf the runner-up of its step's race
(`sampling.sample_race_two`), so the shape is still known before drafting.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import mlx.core as mx

from .base import Draft, depth_first

RUNNERS_UP = 4  # side candidates read per chain step
MIN_P = 1e-3  # a candidate the drafter gives less than this is not worth a row


def runners_up(logits: mx.array, m: int = RUNNERS_UP) -> Tuple[mx.array, mx.array]:
    """(N,) float32 logits -> the m+1 likeliest ids (m+1,) and their probabilities, best first (lazy)."""
    probs = mx.softmax(logits, axis=-1)
    m = min(m, probs.shape[-1] - 1)
    ids = mx.argpartition(-probs, kth=m)[: m + 1]
    p = probs[ids]
    order = mx.argsort(-p)
    return ids[order], p[order]


def static_parents(k: int, m: int) -> List[int]:
    """A chain of k nodes, then one leaf beside each of its first m steps (a child of that step's parent)."""
    return list(range(-1, k - 1)) + [d - 1 for d in range(min(m, k))]


def runner_up(logits: mx.array, top: mx.array) -> mx.array:
    """The likeliest id other than `top` (the argmax of these (N,) logits), lazily."""
    two = mx.argpartition(-logits, kth=1)[:2]
    return mx.where(two[0] == top, two[1], two[0])


def beside(tok: mx.array, own: mx.array, other: mx.array) -> mx.array:
    """A fixed-shape tree's side leaf beside a chain step whose token is `tok`: the drafter's
    runner-up there (`other`), or its own token `own` where the chain took a copy's instead
    (`chaincopy`), so the drafter's choice is still verified."""
    return other if tok is own else mx.where(tok == own, other, own)


def grow(chain: Sequence[int], candidates: Sequence[Tuple[Sequence[int], Sequence[float]]], size: int,
         kind: str = "") -> Draft:
    """The chain plus at most size - len(chain) side leaves, depth-first with the chain first.

    Args:
        chain: the drafter's greedy tokens, one per step.
        candidates: per step, (ids, probabilities) of its likeliest tokens (`runners_up`, read).
        size: most nodes in all.
    Each leaf's score is its share of what the step's chain token left, p / (1 - p_chain):
    `treeplan.reach` multiplies it by the learned rate at which a side branch matches.
    """
    k = len(chain)
    sides = []  # (drafter's probability of the path to the leaf, depth, token, score)
    reach = 1.0
    for d, (ids, ps) in enumerate(candidates[:k]):
        p_chain = next((p for t, p in zip(ids, ps) if t == chain[d]), 0.0)
        rest = max(1.0 - p_chain, 1e-6)
        sides += [(reach * p, d, t, min(p / rest, 1.0)) for t, p in zip(ids, ps) if t != chain[d] and p >= MIN_P]
        reach *= p_chain
    sides.sort(key=lambda s: -s[0])
    tokens, parents, scores = list(chain), list(range(-1, k - 1)), [1.0] * k
    for _, d, t, score in sides[: max(size - k, 0)]:
        tokens.append(t)
        parents.append(d - 1)
        scores.append(score)
    return depth_first(Draft(tokens, kind=kind, parents=parents, scores=scores))


def read_tree(tokens: List[mx.array], candidates: List[Tuple[mx.array, mx.array]], size: int,
              ids_map=None) -> Draft:
    """One wait for a chain drafted on the device and its steps' runners-up, then `grow`.
    `ids_map` maps the candidates' ids to the target's (a reduced draft vocabulary)."""
    if ids_map is not None:
        candidates = [(mx.take(ids_map, i), p) for i, p in candidates]
    mx.eval(tokens, candidates)
    chain = [int(t.item()) for t in tokens]
    read = [(i.tolist(), p.astype(mx.float32).tolist()) for i, p in candidates]
    return grow(chain, read, size)
