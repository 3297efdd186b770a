"""Output check: is a differing output a rounding divergence or a bug?

At temperature 0 speculative decoding must reproduce plain decoding token for token, and with
a seed at any temperature too (every sampled token is a race whose noise the seed and the
position fix, `mlxspec.sampling.race`, and which drafters run too); where
the target's two best tokens are within rounding of each other, the argmax may flip between
a verify pass and a one-row step, and after that the texts legitimately part. So only the
first diverging position is judged, by `mlxspec.reference.judge`: the target recomputes that
position in float32 and the two candidates are compared there against the rounding the
working dtype allows (float32: the old 1e-3 near-tie rule). The working-dtype log-prob gap
is kept beside it as `logprob_gap`. A sampled divergence is judged on the race's scores: the
logit gap less T times the two tokens' log-noise gap (`mlxspec.reference.judge`'s `noise_gap`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence

import mlx.core as mx

from ..reference import BUG, NEAR_TIE_TOL, ROUNDING, Judgement, judge, next_token_logits
from ..sampling import race_noise

__all__ = ["GreedyCheck", "NEAR_TIE_TOL", "check_greedy", "first_divergence", "next_token_logprobs"]


@dataclass
class GreedyCheck:
    identical: bool  # the two token sequences are equal
    position: Optional[int] = None  # first index (in generated tokens) where they differ
    expected: Optional[int] = None  # the reference's token there (None: the reference ended)
    got: Optional[int] = None  # the candidate's token there (None: the candidate ended)
    logprob_gap: Optional[float] = None  # |log p(expected) - log p(got)| under the target in its working dtype
    near_tie: bool = False  # the difference is excused: a rounding divergence
    judgement: Optional[Judgement] = None  # the float32 evidence (None when identical or one output ended)

    @property
    def divergence(self) -> Optional[str]:
        """None (identical), "rounding", "bug" or "unclassified" (no float32 reference could run)."""
        if self.identical:
            return None
        return self.judgement.kind if self.judgement is not None else BUG

    @property
    def ok(self) -> bool:
        """True when the outputs agree or differ only after a rounding divergence."""
        return self.identical or self.divergence == ROUNDING


def first_divergence(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    """Index of the first differing token, len(shorter) if one is a strict prefix, None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def next_token_logprobs(model, ids: List[int]) -> mx.array:
    """Log-probabilities (float32, shape (V,)) of the token after `ids`, in the model's working dtype."""
    logits = next_token_logits(model, list(ids))
    return logits - mx.logsumexp(logits)


def check_greedy(model, prompt_ids: List[int], reference: Sequence[int], candidate: Sequence[int], *,
                 max_kv_size: Optional[int] = None, max_extra_bytes: Optional[int] = None,
                 kv_quant=None, temperature: float = 0.0, seed: Optional[int] = None) -> GreedyCheck:
    """Compare a candidate's greedy (or seeded sampled) output with the reference (vanilla) output.

    Args:
        model: the target model (called as `model(ids[None]) -> logits`).
        prompt_ids: the prompt's token ids, as both generations saw them.
        reference: the vanilla output tokens.
        candidate: the speculative (or peer) output tokens.
        max_kv_size: the engine's KV window, so the judged position sees what the engine saw. Default None.
        max_extra_bytes: memory allowed for the float32 copy (`reference.float32_weights`). Default: its own.
        kv_quant: the engine's KV quantization (`mlxspec.kvquant.KVQuant`), so the judged position
            reads the cache the engine read. Default None.
        temperature, seed: of sampled outputs (temperature alone: no top-k, top-p or min-p, whose
            thresholds rounding could move too), both generated with this seed. Default greedy.

    Returns:
        A GreedyCheck; `.divergence` classifies a difference. One output ending where the other
        goes on is a bug: with the same max_tokens that is never a rounding effect.
    """
    pos = first_divergence(reference, candidate)
    if pos is None:
        return GreedyCheck(identical=True)
    exp = reference[pos] if pos < len(reference) else None
    got = candidate[pos] if pos < len(candidate) else None
    if exp is None or got is None:
        return GreedyCheck(False, pos, exp, got)
    context = list(prompt_ids) + list(reference[:pos])
    z = next_token_logits(model, context, max_kv_size=max_kv_size, kv_quant=kv_quant)
    gap = abs(float(z[exp]) - float(z[got]))  # log-softmax shifts both alike: the logit gap is the log-prob gap
    noise_gap = 0.0
    if temperature > 0:  # the race's noise at that position (its absolute index in the sequence)
        if seed is None:
            raise ValueError("a sampled output is checked with the seed both outputs were drawn with; got seed=None")
        e = race_noise(seed, [len(context)], mx.array([exp, got]))[0].tolist()
        noise_gap = temperature * (math.log(e[0]) - math.log(e[1]))
    j = judge(model, context, exp, got, max_kv_size=max_kv_size, max_extra_bytes=max_extra_bytes, kv_quant=kv_quant,
              noise_gap=noise_gap)
    return GreedyCheck(False, pos, exp, got, gap, j.kind == ROUNDING, j)
