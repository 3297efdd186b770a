"""Logits -> processed probabilities (temperature, top-k, top-p, min-p).

Target and draft rows go through the *same* function, so rejection sampling compares
like with like. Order: temperature, then top-k, top-p and min-p, each a threshold on the
temperature-scaled probabilities, then renormalisation. Ties at a threshold are kept
(a threshold is a value, not a rank), which a one-pass GPU kernel can reproduce exactly.
Temperature 0 is greedy: a one-hot row at the argmax (the first index on ties).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx

from .errors import InvalidArgumentError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # in (0, 1]; 1 disables
    top_k: int = 0  # >= 0; 0 disables
    min_p: float = 0.0  # in [0, 1); 0 disables

    def __post_init__(self):
        validate(self.temperature, self.top_p, self.top_k, self.min_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def validate(temperature, top_p, top_k, min_p) -> None:
    """Raise InvalidArgumentError naming the bad value and the allowed range."""
    if not isinstance(temperature, (int, float)) or math.isnan(temperature) or temperature < 0 or math.isinf(temperature):
        raise InvalidArgumentError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if not isinstance(top_p, (int, float)) or math.isnan(top_p) or not (0.0 < top_p <= 1.0):
        raise InvalidArgumentError(f"top_p must be in (0, 1] (1 disables it), got {top_p!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise InvalidArgumentError(f"top_k must be an integer >= 0 (0 disables it), got {top_k!r}")
    if not isinstance(min_p, (int, float)) or math.isnan(min_p) or not (0.0 <= min_p < 1.0):
        raise InvalidArgumentError(f"min_p must be in [0, 1) (0 disables it), got {min_p!r}")


def cumsum_precise(x: mx.array, block: int = 256) -> mx.array:
    """Cumulative sum over the last axis, in blocks: float32 error ~(block + V/block) ulp, not ~V ulp.

    A plain float32 cumsum over 150k entries drifts by ~1e-3, enough to bias sampling.
    """
    V = x.shape[-1]
    if V <= block:
        return mx.cumsum(x, axis=-1)
    pad = -V % block
    xb = mx.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)]).reshape(*x.shape[:-1], -1, block)
    inner = mx.cumsum(xb, axis=-1)
    totals = inner[..., -1]
    offsets = mx.cumsum(totals, axis=-1) - totals
    return (inner + offsets[..., None]).reshape(*x.shape[:-1], -1)[..., :V]


def probabilities(logits: mx.array, params: SamplingParams) -> mx.array:
    """Rows of logits (..., V) -> float32 probabilities (..., V) after all processing."""
    logits = logits.astype(mx.float32)
    if params.greedy:
        idx = mx.argmax(logits, axis=-1, keepdims=True)
        return (mx.arange(logits.shape[-1]) == idx).astype(mx.float32)
    probs = mx.softmax(logits / params.temperature, axis=-1, precise=True)
    keep = None
    if params.top_k > 0 and params.top_k < probs.shape[-1]:
        kth = mx.sort(probs, axis=-1)[..., -params.top_k][..., None]
        keep = probs >= kth
    if params.top_p < 1.0:
        s = mx.sort(probs, axis=-1)[..., ::-1]  # descending
        before = cumsum_precise(s) - s  # mass strictly before each sorted entry
        # Value of the entry at which the mass first reaches top_p: the smallest kept value.
        cut = mx.min(mx.where(before < params.top_p, s, mx.inf), axis=-1, keepdims=True)
        k2 = probs >= cut
        keep = k2 if keep is None else keep & k2
    if params.min_p > 0.0:
        k3 = probs >= params.min_p * mx.max(probs, axis=-1, keepdims=True)
        keep = k3 if keep is None else keep & k3
    if keep is not None:
        probs = mx.where(keep, probs, 0.0)
        probs = probs / mx.sum(probs, axis=-1, keepdims=True)
    return probs
