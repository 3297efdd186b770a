"""Greedy output check: is a differing output a numerical near-tie or a bug?

At temperature 0 speculative decoding must reproduce plain decoding token for token. Batched
verification computes the same logits with a different reduction order, so where the
target's top two tokens are within float noise the argmax may flip; after that the texts
legitimately diverge. So only the first diverging position is judged: the target is run on
prompt + the common prefix, and if its log-probs of the two candidate tokens differ by less
than `tol` (default 1e-3) the difference is excused as a near-tie. Anything else is a bug.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import mlx.core as mx

NEAR_TIE_TOL = 1e-3  # log-prob gap below which two tokens count as tied


@dataclass
class GreedyCheck:
    identical: bool  # the two token sequences are equal
    position: Optional[int] = None  # first index (in generated tokens) where they differ
    expected: Optional[int] = None  # the reference's token there (None: the reference ended)
    got: Optional[int] = None  # the candidate's token there (None: the candidate ended)
    logprob_gap: Optional[float] = None  # |log p(expected) - log p(got)| under the target
    near_tie: bool = False  # the difference is excused (gap < tol)

    @property
    def ok(self) -> bool:
        """True when the outputs agree or differ only after a near-tie."""
        return self.identical or self.near_tie


def first_divergence(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    """Index of the first differing token, len(shorter) if one is a strict prefix, None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def next_token_logprobs(model, ids: List[int]) -> mx.array:
    """Log-probabilities (float32, shape (V,)) of the token after `ids`, from a cache-free forward."""
    logits = model(mx.array(ids, dtype=mx.uint32)[None])[0, -1].astype(mx.float32)
    return logits - mx.logsumexp(logits)


def check_greedy(model, prompt_ids: List[int], reference: Sequence[int], candidate: Sequence[int], *,
                 tol: float = NEAR_TIE_TOL) -> GreedyCheck:
    """Compare a candidate's greedy output with the reference (vanilla) output.

    Args:
        model: the target model (called as `model(ids[None]) -> logits`).
        prompt_ids: the prompt's token ids, as both generations saw them.
        reference: the vanilla output tokens.
        candidate: the speculative (or peer) output tokens.
        tol: log-prob gap under which the first difference is a near-tie. Default 1e-3.

    Returns:
        A GreedyCheck; `.ok` is False for a difference that is not a near-tie (including one
        output ending where the other goes on: that is never a float-noise effect).
    """
    pos = first_divergence(reference, candidate)
    if pos is None:
        return GreedyCheck(identical=True)
    exp = reference[pos] if pos < len(reference) else None
    got = candidate[pos] if pos < len(candidate) else None
    if exp is None or got is None:
        return GreedyCheck(False, pos, exp, got)
    lp = next_token_logprobs(model, list(prompt_ids) + list(reference[:pos]))
    gap = abs(float(lp[exp]) - float(lp[got]))
    return GreedyCheck(False, pos, exp, got, gap, gap < tol)
