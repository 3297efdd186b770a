"""Penalties on repeated tokens, row by row of a speculative pass.

- OpenAI's presence and frequency penalties: token j's logit drops by `frequency * c[j] +
  presence * (c[j] > 0)`, c[j] counting j among the tokens generated before that position (the
  answer so far, not the prompt).
- mlx-lm's repetition penalty: the logits of the tokens among the last `context` ones (prompt
  included) are divided by it where positive and multiplied where negative.
- DRY (`mlxspec.dry`): the token that would extend a repeat loses a logit growing with its length.

In a pass, row i follows the drafts before it, so its counts and its window include
`drafts[:i]`: every row gets the penalties plain decoding would give it there, and output stays
the penalised target's whatever drafts. A plain step chained before its predecessor is read
counts that predecessor's token on the device (DRY reads the tokens on the host: with it, plain
steps are not chained).
"""

from __future__ import annotations

from typing import Callable, List, Optional

import mlx.core as mx
import numpy as np

from .dry import Dry
from .errors import InvalidArgumentError, shown

LIMIT = 2.0  # OpenAI's range for presence and frequency: -2 to 2
CONTEXT = 20  # mlx-lm's repetition_context_size


def check_penalty(value, name: str) -> float:
    """A presence or frequency penalty in [-2, 2] (None is 0)."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not -LIMIT <= value <= LIMIT:
        raise InvalidArgumentError(f"{name} must be a number in [-2, 2] (0 disables it), got {shown(value)}")
    return float(value)


def check_repetition(penalty, context) -> tuple:
    """(penalty or None, context): mlx-lm's repetition_penalty (> 0; None, 0 or 1: off) and the
    tokens it looks back over (an integer >= 1)."""
    if penalty is not None and (isinstance(penalty, bool) or not isinstance(penalty, (int, float))
                                or not 0 <= penalty < float("inf")):
        raise InvalidArgumentError(f"repetition_penalty must be a number > 0 (1 or 0 disables it), got {shown(penalty)}")
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise InvalidArgumentError(f"repetition_context_size must be an integer >= 1, got {shown(context)}")
    return (None if penalty in (None, 0, 1) else float(penalty)), context


class Penalties:
    """One generation's counts of its tokens, and each pass's penalties."""

    def __init__(self, vocab_size: int, presence: float = 0.0, frequency: float = 0.0,
                 repetition: Optional[float] = None, context: int = CONTEXT, dry: Optional[Dry] = None):
        self.presence, self.frequency, self.vocab_size = presence, frequency, vocab_size
        self.repetition, self.context, self.dry = repetition, context, dry
        self._seen = np.zeros(0, dtype=np.int64)  # the history as DRY last read it, as an array
        self._row = mx.zeros((vocab_size,), dtype=mx.float32)  # the answer's counts so far, on the device

    def rows(self, history: List[int], drafts: List[int], pending: Optional[mx.array] = None) -> Callable:
        """A function of a pass's logits (1, 1 + len(drafts), V) that applies the penalties of each
        row. `history`: every token so far, prompt included; `pending`: a chained plain step's
        predecessor, its (1,) lazy token, after `history`."""
        S = len(drafts) + 1
        additive = None
        if self.presence or self.frequency:
            counts = self._row if pending is None else self._row.at[pending.astype(mx.int32)].add(1.0)
            c = mx.broadcast_to(counts, (S, self.vocab_size))
            if drafts:  # row i also counts drafts[:i]
                r = [i for i in range(1, S) for _ in range(i)]
                t = [drafts[j] for i in range(1, S) for j in range(i)]
                c = c.at[mx.array(r), mx.array(t)].add(1.0)
            additive = -(self.frequency * c + self.presence * (c > 0))
        if self.dry is not None:
            if pending is not None:
                raise ValueError("[penalties] DRY reads every token on the host: plain steps are not chained with it")
            dry = self._dry(history, drafts)
            if dry is not None:
                additive = dry if additive is None else additive + dry
        seen = None
        if self.repetition is not None:
            tail = history[-self.context:]
            windows = [(tail + drafts[:i])[-(self.context - (pending is not None)):] for i in range(S)]
            r = mx.array([i for i, w in enumerate(windows) for _ in w], dtype=mx.int32)
            t = mx.array([tok for w in windows for tok in w], dtype=mx.int32)
            if pending is not None:  # (only plain steps are chained: one row)
                r = mx.concatenate([r, mx.zeros((1,), mx.int32)])
                t = mx.concatenate([t, pending.astype(mx.int32)])
            seen = mx.zeros((S, self.vocab_size), dtype=mx.float32).at[r, t].add(1.0) > 0 if t.size else None
        penalty = self.repetition

        def apply(logits: mx.array) -> mx.array:
            if seen is not None:
                logits = mx.where(seen, mx.where(logits < 0, logits * penalty, logits / penalty), logits)
            return logits if additive is None else logits + additive

        return apply

    def _dry(self, history: List[int], drafts: List[int]) -> Optional[mx.array]:
        """DRY's (1 + len(drafts), V) additive penalties, row i after drafts[:i]; None: none."""
        last_n = self.dry.last_n
        tail = self._array(history)
        tail = tail[-last_n:] if last_n > 0 else tail
        both = np.concatenate([tail, np.asarray(drafts, dtype=np.int64)])
        rows, tokens, amounts = [], [], []
        for i in range(len(drafts) + 1):
            for token, amount in self.dry.penalties(both[:len(tail) + i]).items():
                rows.append(i)
                tokens.append(token)
                amounts.append(-amount)
        if not rows:
            return None
        out = mx.zeros((len(drafts) + 1, self.vocab_size), dtype=mx.float32)
        return out.at[mx.array(rows), mx.array(tokens)].add(mx.array(amounts, dtype=mx.float32))

    def _array(self, history: List[int]) -> np.ndarray:
        """`history` as an int64 array, converting only what was appended since the last call (a
        generation's history only grows; a list of 100k ids takes milliseconds to convert whole)."""
        n = len(self._seen)
        if len(history) < n or (n and history[n - 1] != self._seen[-1]):  # not an extension: start over
            self._seen = np.asarray(history, dtype=np.int64)
        elif len(history) > n:
            self._seen = np.concatenate([self._seen, np.asarray(history[n:], dtype=np.int64)])
        return self._seen

    def commit(self, tokens: List[int]) -> None:
        """Count generated tokens."""
        if tokens and (self.presence or self.frequency):  # (lazy: evaluated with the next pass)
            self._row = self._row.at[mx.array(tokens, dtype=mx.int32)].add(1.0)
