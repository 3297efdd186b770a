"""A model plus its KV caches plus the exact tokens those caches hold.

Keeping the token list beside the caches is what makes every path safe: a new request
syncs to its tokens by rolling back to the common prefix (or rebuilding when the window
no longer holds it), and a forward pass interrupted half-way marks the caches dirty so
the next sync rebuilds them instead of reading half-written layers.
"""

from __future__ import annotations

from typing import List, Optional

import mlx.core as mx

from .cache import make_cache


class Sequence:
    def __init__(self, model, *, max_kv_size: Optional[int], headroom: int, prefill_step: int = 512):
        self.model = model
        self.max_kv_size = max_kv_size
        self.headroom = headroom
        self.prefill_step = prefill_step
        self.reset()

    def reset(self) -> None:
        """Fresh caches, no tokens."""
        self.caches = make_cache(self.model, max_kv_size=self.max_kv_size, headroom=self.headroom)
        self.tokens: List[int] = []
        self._dirty = False

    def sync(self, tokens: List[int]) -> List[int]:
        """Make the caches hold a prefix of `tokens`; return the tokens still to feed (at least 1)."""
        if self._dirty:
            self.reset()
        limit = min(len(self.tokens), len(tokens) - 1)  # always leave one token to feed
        if self.tokens == tokens[: len(self.tokens)]:  # the usual case each round: one C-level compare
            common = limit
        else:
            common = 0
            while common < limit and self.tokens[common] == tokens[common]:
                common += 1
        excess = len(self.tokens) - common
        if excess:
            if all(c.can_trim(excess) for c in self.caches):
                self.rollback(excess)
            else:
                self.reset()
                common = 0
        return list(tokens[common:])

    def forward(self, tokens: List[int]) -> mx.array:
        """Feed tokens; returns the logits of every fed position (S, V), not yet evaluated."""
        self._dirty = True  # until the caches and self.tokens agree again
        logits = self.model(mx.array(tokens, dtype=mx.uint32)[None], cache=self.caches)[0]
        self.tokens.extend(tokens)
        self._dirty = False
        return logits

    def prefill(self, tokens: List[int]) -> None:
        """Feed tokens in chunks, evaluating each (no logits kept)."""
        for i in range(0, len(tokens), self.prefill_step):
            chunk = tokens[i : i + self.prefill_step]
            self._dirty = True
            self.model(mx.array(chunk, dtype=mx.uint32)[None], cache=self.caches)
            mx.eval([c.state for c in self.caches])
            self.tokens.extend(chunk)
            self._dirty = False

    def rollback(self, n: int) -> None:
        if n <= 0:
            return
        for c in self.caches:
            c.trim(n)
        del self.tokens[-n:]

    @property
    def kv_bytes(self) -> int:
        return sum(c.nbytes for c in self.caches)
