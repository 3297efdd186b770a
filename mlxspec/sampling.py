"""Logits -> processed probabilities (temperature, top-k, top-p, min-p, typical-p, top-n-sigma, XTC).

Target and draft rows go through the *same* function, so a drafter's race (below) and the
target's compare like with like. Order: temperature, then top-k, top-p, min-p, typical-p and
top-n-sigma, each a threshold on the temperature-scaled probabilities (top-n-sigma's, on their
logits, is the same whatever the temperature), then renormalisation, then XTC on
what is left. Where typical-p keeps no token the others keep, the likeliest one stays.
Ties at a threshold are kept (a threshold is a value, not a rank), which a
one-pass GPU kernel can reproduce exactly. Temperature 0 is greedy: a one-hot row at the argmax
(the first index on ties), which no filter changes. With mirostat (`mlxspec.mirostat`) the rows
are the temperature-scaled ones, which it truncates with its running threshold.

XTC ("exclude top choices", as mlx-lm and llama.cpp have it) fires at a position with
probability `xtc_probability`; where it fires, every token above `xtc_threshold` but the least
likely of them is dropped (the tokens in `xtc_special`, newline and EOS, never are). Whether it
fires is a hash of the seed and the position, like the race's noise: a function of the position,
so plain decoding and every round see the same distribution there, and speculation stays lossless.

Randomness is keyed by position: the token at absolute position o is picked by an
exponential race (`race`) whose noise is a hash of (seed, o, token id), so a seeded
generation draws the same numbers for the same position whatever rounds the positions fell
in. A model drafter races its own q with the target's noise, so its drafts, like an
n-gram's, are checked by sampling the target and comparing: plain decoding and every
drafter give the very same tokens for a seed, whatever draft lengths the cost model picked.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import operator
from dataclasses import dataclass
from typing import Dict, List, Optional

import mlx.core as mx

from .errors import InvalidArgumentError, shown


# float32's smallest normal number. A smaller temperature rounds to a denormal (which a GPU may
# flush to 0) or to 0 where the logits are divided, and the row to NaN; below it, the row is
# already the T -> 0 limit (the argmax, ties sharing the mass), so it is raised to it.
TINY_TEMPERATURE = 1.1754944e-38


# SamplingParams' numbers, each with the Python type it keeps (`validate` takes these keywords)
_NUMBERS = (("temperature", float), ("top_p", float), ("top_k", operator.index), ("min_p", float),
            ("typical_p", float), ("xtc_probability", float), ("xtc_threshold", float),
            ("mirostat", operator.index), ("mirostat_tau", float), ("mirostat_eta", float), ("top_n_sigma", float))


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # in (0, 1]; 1 disables
    top_k: int = 0  # >= 0; 0 disables
    min_p: float = 0.0  # in [0, 1); 0 disables
    typical_p: float = 1.0  # in (0, 1]; 1 disables
    xtc_probability: float = 0.0  # in [0, 1]; 0 disables
    xtc_threshold: float = 0.1  # in [0, 0.5]
    xtc_special: tuple = ()  # token ids XTC never drops (the engine's newline and EOS)
    mirostat: int = 0  # 0 off, 1 or 2: llama.cpp's versions (`mlxspec.mirostat`), in place of the filters
    mirostat_tau: float = 5.0  # the surprise it aims at, in bits
    mirostat_eta: float = 0.1  # how fast its threshold moves
    top_n_sigma: float = 0.0  # > 0: keep the logits within that many standard deviations of the top; <= 0 disables

    def __post_init__(self):
        validate(**{key: getattr(self, key) for key, _ in _NUMBERS})
        # Python's own numbers from numpy's (np.float32(0.7)): an mx array divided by a numpy
        # scalar would become numpy's
        for key, kind in _NUMBERS:
            object.__setattr__(self, key, kind(getattr(self, key)))
        object.__setattr__(self, "xtc_special", tuple(int(t) for t in self.xtc_special))  # (a list, shared as JSON)
        if 0 < self.temperature < TINY_TEMPERATURE:  # the same T -> 0 limit, in numbers float32 has
            object.__setattr__(self, "temperature", TINY_TEMPERATURE)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def fused(self) -> bool:
        """Whether the fused kernel computes these rows whole: it applies temperature, top-k, top-p
        and min-p, not typical-p, top-n-sigma, XTC or mirostat."""
        return self.typical_p == 1.0 and self.top_n_sigma <= 0.0 and not self.xtc and not self.mirostat

    @property
    def mirostat_on(self) -> bool:
        """Whether mirostat samples (it takes the filters' place)."""
        return self.mirostat != 0 and not self.greedy

    @property
    def xtc(self) -> bool:
        """Whether XTC may fire (sampling with a positive xtc_probability, and no mirostat)."""
        return self.xtc_probability > 0.0 and not self.greedy and not self.mirostat


def validate(temperature, top_p, top_k, min_p, typical_p=1.0, xtc_probability=0.0, xtc_threshold=0.1, mirostat=0,
             mirostat_tau=5.0, mirostat_eta=0.1, top_n_sigma=0.0) -> None:
    """Raise InvalidArgumentError naming the bad value and the allowed range."""
    t, p, m = _real(temperature), _real(top_p), _real(min_p)
    if t is None or not 0.0 <= t < math.inf:  # NaN fails every comparison
        raise InvalidArgumentError(f"temperature must be a finite number >= 0 (0 = greedy), got {shown(temperature)}")
    if p is None or not 0.0 < p <= 1.0:
        raise InvalidArgumentError(f"top_p must be in (0, 1] (1 disables it), got {shown(top_p)}")
    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 0:
        raise InvalidArgumentError(f"top_k must be an integer >= 0 (0 disables it), got {shown(top_k)}")
    if m is None or not 0.0 <= m < 1.0:
        raise InvalidArgumentError(f"min_p must be in [0, 1) (0 disables it), got {shown(min_p)}")
    typical, xp, xt = _real(typical_p), _real(xtc_probability), _real(xtc_threshold)
    if typical is None or not 0.0 < typical <= 1.0:
        raise InvalidArgumentError(f"typical_p must be in (0, 1] (1 disables it), got {shown(typical_p)}")
    if xp is None or not 0.0 <= xp <= 1.0:
        raise InvalidArgumentError(f"xtc_probability must be in [0, 1] (0 disables XTC), got {shown(xtc_probability)}")
    if xt is None or not 0.0 <= xt <= 0.5:  # above 0.5 no two tokens can pass it: XTC would never drop one
        raise InvalidArgumentError(f"xtc_threshold must be in [0, 0.5], got {shown(xtc_threshold)}")
    if isinstance(mirostat, bool) or not isinstance(mirostat, numbers.Integral) or mirostat not in (0, 1, 2):
        raise InvalidArgumentError(f"mirostat must be 0 (off), 1 or 2 (its version), got {shown(mirostat)}")
    sigma = _real(top_n_sigma)
    if sigma is None or not -math.inf < sigma < math.inf:
        raise InvalidArgumentError(f"top_n_sigma must be a finite number (> 0: how many standard deviations of the "
                                   f"logits below the top are kept; 0 or less disables it), got {shown(top_n_sigma)}")
    for name, value in (("mirostat_tau", mirostat_tau), ("mirostat_eta", mirostat_eta)):
        x = _real(value)
        if x is None or not 0.0 <= x < math.inf:
            raise InvalidArgumentError(f"{name} must be a finite number >= 0, got {shown(value)}")


def _real(value):
    """`value` as a float (an int too large for one becomes +-inf), or None if it is not a number
    (True is no temperature, though Python counts it as 1)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):  # numpy's scalars too
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _fmix32(h: mx.array) -> mx.array:
    # MurmurHash3's finaliser: full avalanche on uint32 (arithmetic wraps modulo 2^32).
    h = h ^ (h >> 16)
    h = h * mx.array(0x85EBCA6B, dtype=mx.uint32)
    h = h ^ (h >> 13)
    h = h * mx.array(0xC2B2AE35, dtype=mx.uint32)
    return h ^ (h >> 16)


# The largest float32 below 1: a uniform is capped there so that every exponential is finite.
_BELOW_ONE = 1.0 - 2.0**-24


def race_noise(seed: int, positions, ids: mx.array) -> mx.array:
    """Exponential(1) variates (len(positions), len(ids)), float32: one per (position, token id),
    keyed by the seed, the absolute position and the token's id in the target's vocabulary.

    `race` with these picks the token of a position; `sample_race` does both in one call.

    Args:
        seed: any integer >= 0 (64 bits are used).
        positions: an int array or list of absolute positions.
        ids: (N,) token ids: mx.arange(V) for a whole row, or a drafter's smaller vocabulary.
    """
    return _noise(position_keys(seed, positions), ids.astype(mx.uint32))


def _noise(h: mx.array, ids: mx.array) -> mx.array:
    h = h[:, None]
    x = ids[None, :] * mx.array(0x85EBCA77, dtype=mx.uint32)
    # Two keyed rounds: within a row the map from id to hash is a bijection (no two tokens share
    # a number), and rows of different positions are not permutations of each other.
    h = _fmix32(_fmix32(x ^ h) + (h ^ mx.array(0x165667B1, dtype=mx.uint32)))
    # E = -log(1 - v), v in (0, 1) with float32's relative precision near 0, where a small
    # exponential (an unlikely token's win) needs it. Below 2^-8 a cubic (error < 2^-26 relative)
    # stands in for log1p, which costs 3x log on a CPU; above, 1 - v rounds by at most 2^-25,
    # which moves E's distribution function by as little.
    v = mx.minimum((h.astype(mx.float32) + 0.5) * (1.0 / 2.0**32), _BELOW_ONE)
    return mx.where(v < 2.0**-8, v * (1.0 + v * (0.5 + v * (1.0 / 3.0))), -mx.log(1.0 - v))


def race(probs: mx.array, noise: mx.array) -> mx.array:
    """One index per row of `probs` (..., V): the token whose exponential arrives first, int32 (...).

    With independent Exponential(1) variates E, argmax p(x) / E(x) is x with probability p(x) /
    sum(p) (an exponential race, the Gumbel-max trick in other clothes); zero-mass tokens never
    win. Keying E by (seed, position, token) makes the token of a position a function of its
    row and the seed alone: plain decoding, a speculative round and a drafter racing its own q
    with the same E all pick by one rule, so a draft stands exactly when it is the target's own
    sample, and a seeded run gives plain decoding's tokens whatever was drafted. The price
    against Leviathan rejection sampling: a model draft matches with probability a little
    below sum min(p, q) (measured on the demo pair at T = 0.7: 0.587 against 0.608).
    """
    return mx.argmax(probs / noise, axis=-1).astype(mx.int32)


@mx.compile
def _race_rows(probs: mx.array, h: mx.array, ids: mx.array) -> mx.array:
    # One compiled call: on a GPU the noise's dozen elementwise ops fuse into one kernel.
    return race(probs, _noise(h, ids))


def position_keys(seed: int, positions) -> mx.array:
    """The per-position keys of `sample_race` (uint32, one per absolute position), made once for a
    round: a hash of the position and the seed, whose 64 bits are all used."""
    pos = mx.array(positions, dtype=mx.uint32) if not isinstance(positions, mx.array) else positions.astype(mx.uint32)
    lo, hi = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
    h = _fmix32(pos * mx.array(0x9E3779B9, dtype=mx.uint32) + mx.array(lo, dtype=mx.uint32))
    return _fmix32(h ^ mx.array(hi ^ 0x27D4EB2F, dtype=mx.uint32))


def sample_race(probs: mx.array, keys: mx.array, ids: Optional[mx.array] = None) -> mx.array:
    """`race(probs, race_noise(...))` in one compiled call: rows (R, N) of probabilities, `keys` (R,)
    from `position_keys`, `ids` (N,) the token ids of the columns (None: 0..N-1) -> int32 (R,)
    column indices."""
    return _race_rows(probs, keys, _column_ids(probs, ids))


@mx.compile
def _race_two_rows(probs: mx.array, h: mx.array, ids: mx.array) -> mx.array:
    scores = probs / _noise(h, ids)
    first = mx.argmax(scores, axis=-1)
    cols = mx.arange(scores.shape[-1])
    second = mx.argmax(mx.where(cols == first[..., None], -1.0, scores), axis=-1)
    return mx.stack([first, second], axis=-1).astype(mx.int32)


def sample_race_two(probs: mx.array, keys: mx.array, ids: Optional[mx.array] = None) -> mx.array:
    """`sample_race`'s winner and the race's runner-up (the second-largest p(x) / E(x)): int32
    (R, 2) column indices. A drafter's runner-up is its next guess at the target's sample where
    its winner is not it (a side leaf of a sampled tree, `drafters.sidetree`)."""
    return _race_two_rows(probs, keys, _column_ids(probs, ids))


def _column_ids(probs: mx.array, ids: Optional[mx.array]) -> mx.array:
    """The uint32 token ids that key the noise of `probs`' columns (None: 0..N-1)."""
    ids = _all_ids(probs.shape[-1]) if ids is None else ids
    return ids if ids.dtype == mx.uint32 else ids.astype(mx.uint32)


@functools.lru_cache(maxsize=8)
def _all_ids(n: int) -> mx.array:
    # Made once per vocabulary size: a step should not launch an arange of 150k ids.
    ids = mx.arange(n, dtype=mx.uint32)
    mx.eval(ids)
    return ids


def sample_rows(probs: mx.array, u: mx.array) -> mx.array:
    """One index per row of `probs` (..., V) by inverse CDF with uniforms `u` (...): int32 (...).

    The first index whose cumulative mass exceeds u * total; never an index in a zero-mass
    tail (rounding could otherwise land there).
    """
    cdf = cumsum_precise(probs)
    total = cdf[..., -1:]
    idx = mx.sum(cdf <= u[..., None] * total, axis=-1).astype(mx.int32)
    V = probs.shape[-1]
    last_nonzero = (V - 1) - mx.argmax((probs > 0)[..., ::-1], axis=-1).astype(mx.int32)
    return mx.minimum(idx, last_nonzero)


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


# A request's sampling fields, as `Engine.stream` and the server name them, and their defaults: the
# parameters' own (xtc_special is the engine's, never a request's).
REQUEST_FIELDS = {f.name: f.default for f in dataclasses.fields(SamplingParams) if f.name != "xtc_special"}

BIAS_LIMIT = 100.0  # OpenAI's range for logit_bias; -100 bans a token outright


def check_logit_bias(bias, vocab_size: Optional[int]) -> Optional[Dict[int, float]]:
    """OpenAI's `logit_bias`: {token id (an int or its decimal string): a number in [-100, 100]},
    added to the target's logits before sampling (and before greedy's argmax). None or {} is None.
    `vocab_size` None: the ids' range is not checked (a server's schema, before the engine)."""
    if bias is None:
        return None
    if not isinstance(bias, dict):
        raise InvalidArgumentError(f"logit_bias must be an object {{token id: bias in [-100, 100]}}, got {shown(bias)}")
    out = {}
    for key, value in bias.items():
        try:
            token = int(key) if not isinstance(key, bool) and (isinstance(key, int) or str(key).strip().isdigit()) \
                else None
        except ValueError:
            token = None
        if token is None or token < 0 or vocab_size is not None and token >= vocab_size:
            where = "integers >= 0" if vocab_size is None else f"in [0, {vocab_size})"
            raise InvalidArgumentError(f"logit_bias keys must be token ids ({where}), got {shown(key)}")
        v = _real(value)
        if v is None or not -BIAS_LIMIT <= v <= BIAS_LIMIT:
            raise InvalidArgumentError(f"logit_bias[{key}] must be a number in [-100, 100], got {shown(value)}")
        out[token] = v
    return out or None


def banned(bias: Optional[Dict[int, float]]) -> List[int]:
    """The tokens a checked logit_bias bans outright (-100)."""
    return [int(t) for t, v in (bias or {}).items() if v <= -BIAS_LIMIT]


def bias_row(bias: Dict[int, float], vocab_size: int) -> mx.array:
    """The (V,) float32 row a request's logit_bias adds to every row of logits; -100 is -inf, a ban
    whatever the logits (OpenAI: "should result in a ban")."""
    ids = mx.array([int(t) for t in bias], dtype=mx.int32)  # (a request shared as JSON has string keys)
    values = mx.array([-math.inf if v <= -BIAS_LIMIT else v for v in bias.values()], dtype=mx.float32)
    row = mx.zeros((vocab_size,), dtype=mx.float32).at[ids].add(values)
    mx.eval(row)
    return row


_XTC_SALT = 0x5851F42D  # keys the XTC coin apart from the race's noise of any token id


def xtc_fires(params: SamplingParams, keys: mx.array) -> Optional[mx.array]:
    """Whether XTC fires at each position of `keys` (R,) from `position_keys`: bool (R,), True with
    probability xtc_probability; None where XTC is off. A function of the seed and the position only."""
    if not params.xtc:
        return None
    h = _fmix32(keys.astype(mx.uint32) ^ mx.array(_XTC_SALT, dtype=mx.uint32))
    return (h.astype(mx.float32) + 0.5) * (1.0 / 2.0**32) < params.xtc_probability


def probabilities(logits: mx.array, params: SamplingParams, fires: Optional[mx.array] = None,
                  ids: Optional[mx.array] = None) -> mx.array:
    """Rows of logits (..., V) -> float32 probabilities (..., V) after all processing.

    `fires`: XTC's coin per row (`xtc_fires`, broadcast against the rows' leading shape); None: XTC
    is not applied. `ids`: the token ids of the columns (a drafter's smaller vocabulary), for the
    tokens XTC keeps; None: column j is token j."""
    logits = logits.astype(mx.float32)
    if params.greedy:
        idx = mx.argmax(logits, axis=-1, keepdims=True)
        return (mx.arange(logits.shape[-1]) == idx).astype(mx.float32)
    # The maximum first, then the temperature: logits / 1e-40 would overflow to inf (and the row to
    # NaN), while (logits - max) / t only reaches -inf, which the softmax maps to 0.
    shifted = logits - mx.max(logits, axis=-1, keepdims=True)
    scaled = shifted / params.temperature
    probs = mx.softmax(scaled, axis=-1, precise=True)
    if params.mirostat:  # it truncates in their place (`mlxspec.mirostat`), with its running threshold
        return probs
    keep = None
    if params.top_k > 0 and params.top_k < probs.shape[-1]:
        kth = mx.sort(probs, axis=-1)[..., -params.top_k][..., None]
        keep = probs >= kth
    if params.top_p < 1.0:
        s = mx.sort(probs, axis=-1)[..., ::-1]  # descending
        before = cumsum_precise(s) - s  # mass strictly before each sorted entry
        # Value of the entry at which the mass first reaches top_p: the smallest kept value.
        cut = mx.min(mx.where(before < params.top_p, s, mx.inf), axis=-1, keepdims=True)
        cut = mx.minimum(cut, s[..., :1])  # the top entry always stays: a top_p under float32's range rounds to 0
        k2 = probs >= cut
        keep = k2 if keep is None else keep & k2
    if params.min_p > 0.0:
        k3 = probs >= params.min_p * mx.max(probs, axis=-1, keepdims=True)
        keep = k3 if keep is None else keep & k3
    if params.typical_p < 1.0:
        k4 = _typical(probs, params.typical_p)
        keep = k4 if keep is None else keep & k4
    if params.top_n_sigma > 0.0:
        k5 = _within_sigmas(scaled, params.top_n_sigma)
        keep = k5 if keep is None else keep & k5
    if params.typical_p < 1.0 and keep is not k4:
        # Every other filter keeps the likeliest token, and typical-p may drop it: where they have
        # no token in common (a NaN row else), the likeliest stays, as llama.cpp's chain (top-n-sigma
        # and top-k before typical-p, at least one token kept) would leave it.
        top = probs >= mx.max(probs, axis=-1, keepdims=True)
        keep = keep | (top & ~mx.any(keep, axis=-1, keepdims=True))
    if keep is not None:
        probs = mx.where(keep, probs, 0.0)
        probs = probs / mx.sum(probs, axis=-1, keepdims=True)
    if fires is not None:
        probs = _exclude_top_choices(probs, params, fires, ids)
    return probs


def _typical(probs: mx.array, mass: float) -> mx.array:
    """Locally typical sampling's keep mask (Meister et al. 2022, as Hugging Face and llama.cpp
    have it): tokens by |-log p - H| ascending, H the row's entropy, until their mass reaches `mass`;
    ties with the last one kept stay too."""
    logp = mx.log(probs)  # -inf where p = 0: its distance is inf, never kept before a real token
    entropy = -mx.sum(mx.where(probs > 0, probs * logp, 0.0), axis=-1, keepdims=True)
    distance = mx.abs(-logp - entropy)
    order = mx.argsort(distance, axis=-1)
    sorted_distance = mx.take_along_axis(distance, order, axis=-1)
    reached = cumsum_precise(mx.take_along_axis(probs, order, axis=-1))  # the mass up to each, inclusive
    last = mx.minimum(mx.sum(reached < mass, axis=-1, keepdims=True), probs.shape[-1] - 1)
    return distance <= mx.take_along_axis(sorted_distance, last, axis=-1)


def _within_sigmas(scaled: mx.array, n: float) -> mx.array:
    """Top-n-sigma's keep mask (Tang et al. 2024, as llama.cpp has it): the logits at least the top
    one less n standard deviations of them (the -inf ones, banned, left out of the deviation)."""
    live = scaled > -mx.inf
    count = mx.maximum(mx.sum(live, axis=-1, keepdims=True), 1)
    mean = mx.sum(mx.where(live, scaled, 0.0), axis=-1, keepdims=True) / count
    std = mx.sqrt(mx.sum(mx.where(live, (scaled - mean) ** 2, 0.0), axis=-1, keepdims=True) / count)
    return scaled >= mx.max(scaled, axis=-1, keepdims=True) - n * std


def _exclude_top_choices(probs: mx.array, params: SamplingParams, fires: mx.array,
                         ids: Optional[mx.array]) -> mx.array:
    """XTC where `fires`: of the tokens above the threshold, all but the least likely are dropped
    (nothing is when fewer than two pass it), except `params.xtc_special`; renormalised."""
    least = mx.min(mx.where(probs > params.xtc_threshold, probs, mx.inf), axis=-1, keepdims=True)
    drop = probs > least
    if params.xtc_special:
        cols = _all_ids(probs.shape[-1]) if ids is None else ids.astype(mx.uint32)
        special = mx.array(params.xtc_special, dtype=mx.uint32)
        drop = drop & ~mx.any(cols[:, None] == special[None, :], axis=-1)
    drop = drop & fires.reshape(*fires.shape, *([1] * (probs.ndim - fires.ndim)))
    kept = mx.where(drop, 0.0, probs)
    return kept / mx.sum(kept, axis=-1, keepdims=True)
