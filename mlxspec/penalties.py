"""OpenAI's presence and frequency penalties, row by row of a speculative pass.

The logit of token j at a position drops by `frequency * c[j] + presence * (c[j] > 0)`, where
c[j] counts j among the tokens generated before that position (OpenAI's definition: the answer
so far, not the prompt). In a pass, row i follows the drafts before it, so its counts are the
committed ones plus `drafts[:i]`: every row gets the penalties plain decoding would give it
there, and output stays the penalised target's whatever drafts. A plain step chained before its
predecessor is read counts that predecessor's token on the device.
"""

from __future__ import annotations

from typing import List, Optional

import mlx.core as mx

from .errors import InvalidArgumentError, shown

LIMIT = 2.0  # OpenAI's range: -2 to 2


def check_penalty(value, name: str) -> float:
    """A penalty in [-2, 2] (None is 0)."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not -LIMIT <= value <= LIMIT:
        raise InvalidArgumentError(f"{name} must be a number in [-2, 2] (0 disables it), got {shown(value)}")
    return float(value)


class Penalties:
    """One generation's counts of its tokens, and the penalty rows of each pass."""

    def __init__(self, presence: float, frequency: float, vocab_size: int):
        self.presence, self.frequency, self.vocab_size = presence, frequency, vocab_size
        self._row = mx.zeros((vocab_size,), dtype=mx.float32)  # the committed counts, on the device

    def rows(self, drafts: List[int], pending: Optional[mx.array] = None) -> mx.array:
        """(1 + len(drafts), V) float32 to add to a pass's logits (negative: penalties). `pending`:
        a plain step's lazy token, counted before every row (a chained step's predecessor)."""
        counts = self._row
        if pending is not None:
            counts = counts.at[pending.astype(mx.int32)].add(1.0)
        c = mx.broadcast_to(counts, (len(drafts) + 1, self.vocab_size))
        if drafts:  # row i also counts drafts[:i]
            r = [i for i in range(1, len(drafts) + 1) for _ in range(i)]
            t = [drafts[j] for i in range(1, len(drafts) + 1) for j in range(i)]
            c = c.at[mx.array(r), mx.array(t)].add(1.0)
        return -(self.frequency * c + self.presence * (c > 0))

    def commit(self, tokens: List[int]) -> None:
        """Count generated tokens."""
        if tokens:  # (lazy: evaluated with the next pass, which needs it)
            self._row = self._row.at[mx.array(tokens, dtype=mx.int32)].add(1.0)
