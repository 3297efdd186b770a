"""Copying inside a model drafter's greedy chain: where the text repeats, take what followed.

A small drafter misses most where the target copies: an identifier, a number or a phrase
from the prompt or its own earlier answer, whose tokens the draft vocabulary may not even
hold. Prompt lookup (`NgramDrafter.copy`) finds where the history's tail occurred before and
what followed it. At each step of a greedy chain the copy's token replaces the drafter's top
token when the chain still follows the copy and the drafter is less sure of its top token
than copies that long are right. It all stays on the device (no read per step), and greedy
verification keeps the output the target's whatever is proposed. Sampled chains never copy:
their q must be the drafter's.
"""

from __future__ import annotations

from typing import Tuple

import mlx.core as mx

MIN_COPY = 2  # shorter matches are right about a fifth of the time: never worth the drafter's token
# How often a copy's next token was the target's, by match length (2, 3, 4-5, 6+), along the
# greedy answers of 84 prompts never trained on (public, templated, the bench suite; 1,209 positions
# with a match of 2 or more): 0.50, 0.61, 0.71, 0.88. The demo's EAGLE head's own top token
# was right 0.48-0.53 of the time at those positions.
PRECISION = ((6, 0.88), (4, 0.71), (3, 0.61), (2, 0.50))


def precision(match: int) -> float:
    """How often a copy after a match of `match` tokens is right (0 below MIN_COPY)."""
    return next((p for n, p in PRECISION if match >= n), 0.0)


@mx.compile
def _blend(head_token, logits, copy_token, bar, following):
    # One compiled call: every op costs host time per step, as in `rounds._argmax_checked`.
    p_top = mx.exp(mx.max(logits) - mx.logsumexp(logits))
    token = mx.where(following & (p_top < bar), copy_token, head_token)
    return token, following & (token == copy_token)


def blend(head_token: mx.array, logits: mx.array, copy_token: int, match: int,
          following: mx.array) -> Tuple[mx.array, mx.array]:
    """One chain step, lazily: (the token, whether the chain still follows the copy).

    `head_token` is the drafter's top token (the target's id) from (N,) float32 `logits`;
    `copy_token` what the copy proposes after a match of `match` tokens, valid while
    `following` (every earlier step took the copy's token)."""
    return _blend(head_token, logits, mx.array(copy_token, dtype=head_token.dtype),
                  mx.array(precision(match), dtype=mx.float32), following)
