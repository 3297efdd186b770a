"""The drafter protocol: propose up to k tokens that continue the committed history.

A drafter only proposes; the engine verifies, commits, and tells nobody anything else:
a drafter that needs state (a model's KV cache) syncs it to the history it is given at
the next `propose`, so a rejected or abandoned round needs no callback. That keeps the
interface small enough for tree or head-based drafters.

A draft is a chain or a tree (`parents`: the one-branch tree is the chain). Trees come from
an optional `propose_tree(history, depth, size, params, seed)`: nodes depth-first, the
drafter's best chain first (so the usual outcome needs no cache moves), and a score per node
(its drafter's confidence given its parent) that the engine uses to prune the tree. A model
or feature-head drafter's tree is its greedy chain plus its runners-up at each step as side
leaves, ranked EAGLE-2-style by its own probability of reaching them (`sidetree`).

Drafts may stay on the device: `Draft.tokens` is a list of ints (a free drafter) or a lazy
int array (a model drafter), which the engine reads together with the verification result.
A draft is a function of the history and the seed: a model drafter at a temperature races
its q with the target's position-keyed noise (`mlxspec.sampling.race`), so the engine checks
every draft by comparing it with the target's own sample, and never touches MLX's global
random state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Protocol, Union

import mlx.core as mx

from ..sampling import SamplingParams


@dataclass
class Draft:
    tokens: Union[List[int], mx.array]  # proposed continuation, length <= k (may be empty); ints or a lazy (k,) int array
    kind: str = ""  # label of the proposal's reliability class (acceptance is estimated per kind)
    parents: Optional[List[int]] = None  # a tree: parents[i] is node i's parent (-1: the root); None = a chain
    scores: Optional[List[float]] = None  # a tree: each node's drafter confidence given its parent, in [0, 1]

    def __len__(self) -> int:
        return len(self.tokens) if isinstance(self.tokens, list) else int(self.tokens.shape[0])


class Drafter(Protocol):
    name: str  # "model", "ngram", "none"
    uses_model: bool  # True when proposing costs forward passes (the cost model measures it)

    def propose(self, history: List[int], k: int, params: SamplingParams, seed: int) -> Draft:
        """Up to k tokens continuing `history` (prompt + committed output). The first proposed token is
        for absolute position len(history); `seed` keys any sampling (see `mlxspec.sampling`)."""
        ...

    def reset(self) -> None:
        """Forget all state (a fresh engine's drafter)."""
        ...


class NoDrafter:
    """Plain decoding: proposes nothing, so every round is one target step."""

    name = "none"
    uses_model = False

    def propose(self, history, k, params, seed) -> Draft:
        return Draft([])

    def reset(self) -> None:
        pass


def depth_first(d: Draft) -> Draft:
    """A tree draft's nodes reordered depth-first, children in their original order (so the
    chain, each node's first child, stays first: the usual outcome moves no cache entries)."""
    kids: Dict[int, List[int]] = {}
    for i, p in enumerate(d.parents):
        kids.setdefault(p, []).append(i)
    order, stack = [], list(reversed(kids.get(-1, [])))
    while stack:
        i = stack.pop()
        order.append(i)
        stack.extend(reversed(kids.get(i, [])))
    new = {old: j for j, old in enumerate(order)}
    return Draft([d.tokens[i] for i in order], kind=d.kind,
                 parents=[new[d.parents[i]] if d.parents[i] >= 0 else -1 for i in order],
                 scores=[d.scores[i] for i in order])
