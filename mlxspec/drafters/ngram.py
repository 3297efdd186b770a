"""Prompt-lookup drafting: no model, proposes what followed the last time the context's tail occurred."""

from __future__ import annotations

from typing import Dict, List, Tuple

from .base import Draft


class NgramDrafter:
    """Continuation of the most recent earlier occurrence of the last n tokens, n = max_n..1,
    extended periodically where it reaches the end of the history.

    The index maps each n-gram to the end of its latest occurrence and is extended
    incrementally as the history grows (rebuilt when a new history does not extend it).
    """

    name = "ngram"
    uses_model = False

    def __init__(self, max_n: int = 3, min_n: int = 1):
        self.max_n, self.min_n = max_n, min_n
        self.reset()

    def reset(self) -> None:
        self._hist: List[int] = []
        self._index: Dict[Tuple[int, ...], int] = {}
        self._indexed = 0  # n-grams ending at positions < _indexed are in the index

    def _extend(self, history: List[int]) -> None:
        n_old = len(self._hist)
        if history[:n_old] != self._hist:
            self.reset()
            n_old = 0
        self._hist.extend(history[n_old:])  # only the new tokens: this runs every round
        # Index n-grams ending strictly before the last token: the tail itself must not match itself.
        end_limit = len(history) - 1
        for end in range(self._indexed + 1, end_limit + 1):
            for n in range(self.min_n, self.max_n + 1):
                if end - n >= 0:
                    self._index[tuple(history[end - n : end])] = end
        self._indexed = max(self._indexed, end_limit)

    def propose(self, history, k, params=None, seed=0) -> Draft:
        if k <= 0 or len(history) < 2:
            return Draft([])
        self._extend(history)
        for n in range(self.max_n, self.min_n - 1, -1):
            if len(history) < n + 1:
                continue
            end = self._index.get(tuple(history[-n:]))
            if end is not None:
                # What followed the match; past the end of the history the text repeats with
                # period len - end (a loop, a table row), so the proposal continues the cycle.
                period = len(history) - end
                return Draft([history[end + i % period] for i in range(k)], kind=f"n{n}")
        return Draft([])
