"""Mirostat (Basu et al. 2021), versions 1 and 2 as llama.cpp (and so Ollama) samples them.

Mirostat keeps the answer's surprise near a target `tau` (bits) with a running threshold mu
(2 * tau at the start). At each position the temperature-scaled distribution is truncated (v2:
the tokens whose surprise -log2 p is at most mu; v1: the top k, k from a Zipf fit of the 100
likeliest tokens and mu), renormalised and sampled; then mu moves by `eta` times the sampled
token's surprise under it minus tau. As in llama.cpp, it replaces top-k, top-p, min-p, typical-p
and XTC (they are not applied with it).

mu is a function of the tokens before a position, so mirostat stays lossless under speculation:
row i of a pass uses the mu that the drafts before it would leave if they are accepted (where
one is not, the rows after it are not used), computed on the device. Each row also gives the mu
after its own sampled token; the loop keeps the one after the last token it commits. A tree's
rows would each need their own path's mu: rounds draft chains with mirostat.
"""

from __future__ import annotations

import math
from typing import Optional

import mlx.core as mx

from .sampling import SamplingParams, sample_race

ZIPF_TOKENS = 100  # v1 fits its exponent on this many likeliest tokens (llama.cpp's m)


def initial_mu(params: SamplingParams) -> Optional[mx.array]:
    """A generation's first mu (twice the target surprise, as llama.cpp starts), or None without mirostat."""
    return mx.array(2.0 * params.mirostat_tau, dtype=mx.float32) if params.mirostat_on else None


def truncated(probs: mx.array, mu: mx.array, params: SamplingParams) -> mx.array:
    """Rows (S, V) of temperature-scaled probabilities and their mu (S,) -> the rows mirostat samples
    from: truncated (never below the likeliest token) and renormalised."""
    mu = mu[:, None]
    if params.mirostat == 2:
        keep = probs >= mx.power(2.0, -mu)  # surprise -log2 p at most mu
    else:
        ranked = mx.sort(probs, axis=-1)[:, ::-1]
        m = min(ZIPF_TOKENS, probs.shape[-1])
        i = mx.arange(m - 1, dtype=mx.float32)
        t = mx.log((i + 2) / (i + 1))
        b = mx.log(ranked[:, : m - 1] / ranked[:, 1:m])
        b = mx.where(mx.isfinite(b), b, 0.0)  # (tokens of no mass, past the live ones)
        s_hat = mx.sum(t * b, axis=-1, keepdims=True) / mx.sum(t * t)
        eps = s_hat - 1
        vocab = float(probs.shape[-1])
        k = mx.power(eps * mx.power(2.0, mu) / (1 - mx.power(vocab, -eps)), 1 / s_hat)
        k = mx.where(mx.isfinite(k), mx.floor(k), vocab)
        k = mx.clip(k, 1, vocab).astype(mx.int32)
        kth = mx.take_along_axis(ranked, k - 1, axis=-1)
        keep = probs >= kth
    keep = keep | (probs >= mx.max(probs, axis=-1, keepdims=True))
    kept = mx.where(keep, probs, 0.0)
    return kept / mx.sum(kept, axis=-1, keepdims=True)


def _after(q: mx.array, tokens: mx.array, mu: mx.array, params: SamplingParams) -> mx.array:
    """mu after sampling `tokens` (S,) from rows `q` (S, V) with thresholds `mu` (S,)."""
    p = mx.take_along_axis(q, tokens.astype(mx.int32)[:, None], axis=-1)[:, 0]
    return mu - params.mirostat_eta * (-mx.log2(p) - params.mirostat_tau)


def sample(probs: mx.array, mu: mx.array, drafts, keys: mx.array, params: SamplingParams):
    """A pass's tokens by mirostat: rows (1 + k, V) of temperature-scaled probabilities, `mu` the
    threshold before row 0, `drafts` the k tokens fed after it (a list or an array), `keys` the
    rows' positions' (`sampling.position_keys`). Returns (the sampled token of every row (S,) int32,
    the rows the tokens were drawn from (S, V), the mu after each row's sampled token (S,))."""
    S = probs.shape[0]
    drafts = drafts.astype(mx.int32) if isinstance(drafts, mx.array) else mx.array(list(drafts), dtype=mx.int32)
    mus = [mu.reshape(1)]
    for i in range(S - 1):  # the mu each row starts from, were the drafts before it accepted
        row = truncated(probs[i : i + 1], mus[-1], params)
        mus.append(_after(row, drafts[i : i + 1], mus[-1], params))
    mu_rows = mx.concatenate(mus)
    mu_rows = mx.where(mx.isnan(mu_rows), -math.inf, mu_rows)  # (a draft of no mass: the rows after it are unused)
    q = truncated(probs, mu_rows, params)
    tokens = sample_race(q, keys)
    return tokens, q, _after(q, tokens, mu_rows, params)
