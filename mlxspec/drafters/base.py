"""The drafter protocol: propose up to k tokens that continue the committed history.

A drafter only proposes; the engine verifies, commits, and tells nobody anything else:
a drafter that needs state (a model's KV cache) syncs it to the history it is given at
the next `propose`, so a rejected or abandoned round needs no callback. That keeps the
interface small enough for tree or head-based drafters later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Protocol

import mlx.core as mx

from ..sampling import SamplingParams


@dataclass
class Draft:
    tokens: List[int]  # proposed continuation, length <= k (may be empty)
    probs: Optional[mx.array] = None  # (len, V) processed probabilities they were sampled from; None = deterministic (one-hot)
    kind: str = ""  # label of the proposal's reliability class (acceptance is estimated per kind)


class Drafter(Protocol):
    name: str  # "model", "ngram", "none"
    uses_model: bool  # True when proposing costs forward passes (the cost model measures it)

    def propose(self, history: List[int], k: int, params: SamplingParams, key: Optional[mx.array], *,
                min_confidence: float = 0.0) -> Draft:
        """Up to k tokens continuing `history` (prompt + committed output); a drafter that knows its
        confidence may stop after a token it gives less than `min_confidence`."""
        ...

    def reset(self) -> None:
        """Forget all state (a fresh engine's drafter)."""
        ...


class NoDrafter:
    """Plain decoding: proposes nothing, so every round is one target step."""

    name = "none"
    uses_model = False

    def propose(self, history, k, params, key, *, min_confidence=0.0) -> Draft:
        return Draft([])

    def reset(self) -> None:
        pass
