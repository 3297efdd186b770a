"""Copying inside a model drafter's greedy chain: where the text repeats, take what followed.

A small drafter misses most where the target copies: an identifier, a number or a phrase
from the prompt or its own earlier answer, whose tokens the draft vocabulary may not even
hold. Prompt lookup (`NgramDrafter.copy`) finds where the history's tail occurred before and
what followed it. At each step of a greedy chain the copy's token replaces the drafter's top
token when the chain still follows the copy and the drafter is less sure of its top token
than copies that long are right. It all stays on the device (no read per step), and greedy
verification keeps the output the target's whatever is proposed. Sampled chains copy by the
same rule, with the drafter's probability of its race winner as its sureness, while its own
sampled drafts stand less often than the copy would (`OwnRate`): the target's race decides every
token with the same noise (`sampling.race`), so a copied token is kept exactly when it is the
target's own sample, and nothing is lost. (That guard on greedy chains too cost the demo's
EAGLE head 0.006 of its per-token rate on the bench suite, so greedy chains have none: a
drafter right even where it is unsure, such as the target as its own draft, can be overruled.)
"""

from __future__ import annotations

from typing import Tuple

import mlx.core as mx

MIN_COPY = 2  # shorter matches are right about a fifth of the time: never worth the drafter's token
# How often a copy's next token was the target's, by match length (2, 3, 4-5, 6+), along the
# greedy answers of 84 prompts never trained on (public, templated, the bench suite; 1,209 positions
# with a match of 2 or more): 0.50, 0.61, 0.71, 0.88. The demo's EAGLE head's own top token
# was right 0.48-0.53 of the time at those positions. A sampled chain uses the same bars: at
# T = 0.7 they beat copying always on held-out public prompts and trailed it a little on the
# bench suite (README, "Lookup rounds for model drafters").
PRECISION = ((6, 0.88), (4, 0.71), (3, 0.61), (2, 0.50))


def precision(match: int) -> float:
    """How often a copy after a match of `match` tokens is right (0 below MIN_COPY)."""
    return next((p for n, p in PRECISION if match >= n), 0.0)


def _take(head_token, sure, copy_token, bar, following):
    token = mx.where(following & (sure < bar), copy_token, head_token)
    return token, following & (token == copy_token)


# One compiled call each: every op costs host time per step, as in `rounds._argmax_checked`.
@mx.compile
def _blend(head_token, logits, copy_token, bar, following):
    return _take(head_token, mx.exp(mx.max(logits) - mx.logsumexp(logits)), copy_token, bar, following)


_blend_sampled = mx.compile(_take)


def blend(head_token: mx.array, logits: mx.array, copy_token: int, match: int,
          following: mx.array) -> Tuple[mx.array, mx.array]:
    """One chain step, lazily: (the token, whether the chain still follows the copy).

    `head_token` is the drafter's top token (the target's id) from (N,) float32 `logits`;
    `copy_token` what the copy proposes after a match of `match` tokens, valid while
    `following` (every earlier step took the copy's token)."""
    return _blend(head_token, logits, mx.array(copy_token, dtype=head_token.dtype),
                  mx.array(precision(match), dtype=mx.float32), following)


def blend_sampled(head_token: mx.array, q_head: mx.array, copy_token: int, match: int,
                  following: mx.array, own_rate: float) -> Tuple[mx.array, mx.array]:
    """`blend` for a sampled chain: `head_token` is the drafter's race winner (the target's id)
    and `q_head` its probability under the drafter's q at the request's temperature. The copy's
    token replaces it by the same rule (while the chain follows the copy and q_head is below the
    copy's precision), and only while the drafter's own sampled drafts have been the target's
    less often than that (`own_rate`, `OwnRate`): a drafter whose q is close to the target's p
    wins the target's race with it even where q is flat, and no copy should stand in its way.
    Lossless whatever it proposes: the target's own race (`sampling.race`, the same noise)
    decides every token."""
    bar = precision(match)  # a bar of 0 takes nothing (q is never below it) but still tracks the copy
    return _blend_sampled(head_token, q_head, mx.array(copy_token, dtype=head_token.dtype),
                          mx.array(bar if own_rate < bar else 0.0, dtype=mx.float32), following)


class Round:
    """One chain's copying, step by step: what prompt lookup (`copier`, the engine's n-gram
    drafter) proposes after the history's tail, and whether the chain still follows it. A
    drafter makes one per drafted chain and passes each step's own token through `greedy` or
    `sampled`; off (`on` False), both give the drafter's token back. `own` is the drafter's
    `OwnRate`: a sampled round settles the last round's drafts first and `expect`s its own."""

    def __init__(self, copier, history: list, k: int, *, on: bool, greedy: bool, own: "OwnRate"):
        self.on, self.own, self.history = on, own, history
        self.match, self.copy = copier.copy(history, k) if on else (0, [])
        self.following = mx.array(True)
        if on and not greedy:
            own.settle(history)

    def greedy(self, i: int, top: mx.array, logits: mx.array) -> mx.array:
        """Step i's token: the drafter's `top` (the argmax of its (N,) float32 `logits`, the
        target's id) or the copy's (`blend`)."""
        if i >= len(self.copy):  # (below MIN_COPY, blend keeps the drafter's token and tracks the copy)
            return top
        tok, self.following = blend(top, logits, self.copy[i], self.match + i, self.following)
        return tok

    def sampled(self, i: int, winner: mx.array, q: mx.array, local: mx.array) -> mx.array:
        """Step i's token: the drafter's race `winner` (the target's id; `local` its index in the
        drafter's (N,) law `q`) or the copy's (`blend_sampled`)."""
        if i >= len(self.copy):
            return winner
        tok, self.following = blend_sampled(winner, mx.take(q, local), self.copy[i], self.match + i,
                                            self.following, self.own.rate)
        return tok

    def expect(self, start: int, own: list, chain: mx.array) -> None:
        """A sampled round's own race winners and the chain it proposed from position `start`."""
        if self.on and own:
            self.own.expect(self.history, start, mx.stack(own), chain)


class OwnRate:
    """How often a drafter's own sampled drafts (its race winners, before a copy replaced any)
    were the target's tokens, at the steps the target judged: exponentially weighted counts
    from a prior of 1 in 2. `expect` a round's drafts, `settle` them against the history that
    came back (the next round's): the read is of arrays the round already computed."""

    DECAY = 0.95  # about the last 20 rounds count

    def __init__(self):
        self.hits, self.judged = 1.0, 2.0
        self._pending = None

    @property
    def rate(self) -> float:
        return self.hits / self.judged

    def expect(self, history: list, start: int, own: mx.array, proposed: mx.array) -> None:
        """The drafter's own tokens and the ones it proposed for positions start.. of `history`."""
        pair = mx.stack([own, proposed])
        mx.async_eval(pair)  # computed beside the round's pass: `settle` then reads without waiting
        self._pending = (history, start, pair)

    def settle(self, history: list) -> None:
        """Count the pending round's judged steps, if `history` is the one it drafted for (the
        loop's grows in place within a request; another request's drafts are dropped)."""
        if self._pending is None:
            return
        drafted_for, start, pair = self._pending
        self._pending = None
        got = history[start:]
        if drafted_for is not history or not got:
            return
        own, proposed = pair.tolist()
        hits = judged = 0
        for o, p, g in zip(own, proposed, got):  # judged up to and with the first rejected draft
            judged += 1
            hits += o == g
            if p != g:
                break
        self.hits = self.hits * self.DECAY + hits
        self.judged = self.judged * self.DECAY + judged
