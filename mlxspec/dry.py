"""DRY ("don't repeat yourself"): llama.cpp's, KoboldCpp's and text-generation-webui's penalty on
the token that would extend a repeat.

At a position whose text so far ends with a sequence that appeared before, the token that
followed it there loses `multiplier * base ** (n - allowed_length)` of its logit, n the length
of the repeat (at most 50), where n >= allowed_length. A sequence breaker (a token whose text
holds one of the breaker strings: newline, ":", '"' and "*" by default) ends a repeat: repeats
never run across one, and none is ever penalised. The look-back is the last `last_n` tokens,
prompt included (-1: all of them).

It reads only the tokens before a position, so each row of a speculative pass is penalised as
plain decoding would penalise it there (`penalties.Penalties.rows`), and output stays the
penalised target's whatever drafts. The matching runs on the host (NumPy over the look-back).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

from .errors import InvalidArgumentError, shown

BREAKERS = ("\n", ":", "\"", "*")  # llama.cpp's and text-generation-webui's defaults
BASE, ALLOWED_LENGTH, LAST_N = 1.75, 2, -1
LONGEST = 50  # repeats are measured up to this length (text-generation-webui's cap: base ** n stays finite)
MAX_BREAKERS, MAX_BREAKER_CHARS = 32, 40  # (llama.cpp caps a breaker at 40 characters)
MAX_PENALTY = 1e9  # a logit this far down is never sampled: more would only risk inf - inf
# The request fields (llama.cpp's names, `Engine.stream`'s keywords) and their defaults
FIELDS = {"dry_multiplier": 0.0, "dry_base": BASE, "dry_allowed_length": ALLOWED_LENGTH,
          "dry_penalty_last_n": LAST_N, "dry_sequence_breakers": None}


@dataclass(frozen=True)
class Dry:
    multiplier: float
    base: float = BASE
    allowed_length: int = ALLOWED_LENGTH
    last_n: int = LAST_N
    breaking: Optional[np.ndarray] = None  # (V,) bool: the sequence breakers among the token ids

    def penalties(self, context: Sequence[int]) -> Dict[int, float]:
        """{token: what its logit loses} at the position after `context` (every token before it)."""
        c = np.asarray(context, dtype=np.int64)
        c = c[-self.last_n:] if self.last_n > 0 else c
        n = len(c)
        if n < 2 or self._breaks(c[-1:])[0]:
            return {}
        ends = np.nonzero(c[:-1] == c[-1])[0]  # earlier occurrences of the last token
        ends = ends[~self._breaks(c[ends + 1])]  # (a breaker after one is never penalised)
        length = np.ones(len(ends), dtype=np.int64)
        alive = np.ones(len(ends), dtype=bool)
        for m in range(1, min(LONGEST, n)):
            before = c[n - 1 - m]  # the token m before the last
            if self._breaks(before[None])[0]:
                break
            starts = ends - m
            alive &= (starts >= 0) & (c[np.maximum(starts, 0)] == before)
            if not alive.any():
                break
            length += alive
        out: Dict[int, float] = {}
        for token, k in zip(c[ends + 1].tolist(), length.tolist()):
            if k >= self.allowed_length and k > out.get(token, 0):
                out[token] = k
        return {t: min(self.multiplier * self.base ** (k - self.allowed_length), MAX_PENALTY) for t, k in out.items()}

    def _breaks(self, tokens: np.ndarray) -> np.ndarray:
        if self.breaking is None:
            return np.zeros(len(tokens), dtype=bool)
        inside = tokens < len(self.breaking)
        return np.where(inside, self.breaking[np.minimum(tokens, len(self.breaking) - 1)], False)


def breaking_tokens(texts: Sequence[str], breakers: Sequence[str]) -> np.ndarray:
    """(len(texts),) bool: the tokens whose text holds a breaker string (as llama.cpp reads a
    single token: a token that spells part of one, and the tokens after it, is not one)."""
    return np.array([any(b in t for b in breakers) for t in texts], dtype=bool)


def _number(value, name: str, ok, allowed: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(float(value)):
        raise InvalidArgumentError(f"{name} must be {allowed}, got {shown(value)}")
    return float(value)


def _integer(value, name: str, low: int, allowed: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidArgumentError(f"{name} must be {allowed}, got {shown(value)}")
    return value


def check_breakers(breakers) -> List[str]:
    """DRY's sequence breakers: a list of strings, or text-generation-webui's and TabbyAPI's one
    string of them in JSON (`"\\n", ":"`, with or without the brackets); a string that is no such
    list is one breaker ("\\n" itself). None: the defaults; an empty list, or "[]": none."""
    if breakers is None:
        return list(BREAKERS)
    if isinstance(breakers, str):
        text = breakers.strip()
        try:
            listed = json.loads(text if text.startswith("[") else f"[{text}]") if text else None
        except ValueError:
            listed = None
        breakers = listed if isinstance(listed, list) else [breakers]
    if not isinstance(breakers, list) or not all(isinstance(b, str) and b for b in breakers):
        raise InvalidArgumentError(f"dry_sequence_breakers must be a list of non-empty strings, got "
                                   f"{shown(breakers)}")
    if len(breakers) > MAX_BREAKERS or any(len(b) > MAX_BREAKER_CHARS for b in breakers):
        raise InvalidArgumentError(f"dry_sequence_breakers takes at most {MAX_BREAKERS} strings of at most "
                                   f"{MAX_BREAKER_CHARS} characters each, got {shown(breakers)}")
    return breakers


def check_dry(dry_multiplier, dry_base, dry_allowed_length, dry_penalty_last_n,
              dry_sequence_breakers) -> Optional[dict]:
    """DRY's settings (`FIELDS`), checked, as a request holds them (JSON: a sharded target's ranks
    share it); None when it is off (multiplier 0, or a look-back of 0 tokens)."""
    multiplier = _number(dry_multiplier, "dry_multiplier", lambda x: 0 <= x < math.inf,
                         "a number >= 0 (0 disables DRY)")
    base = _number(dry_base, "dry_base", lambda x: 1 <= x < math.inf, "a number >= 1")
    allowed = _integer(dry_allowed_length, "dry_allowed_length", 1, "an integer >= 1 (the longest repeat let be)")
    last_n = _integer(dry_penalty_last_n, "dry_penalty_last_n", -1,
                      "an integer >= -1 (the tokens looked back over; -1 all of them, 0 disables DRY)")
    breakers = check_breakers(dry_sequence_breakers)
    if multiplier == 0 or last_n == 0:
        return None
    return {"multiplier": multiplier, "base": base, "allowed_length": allowed, "last_n": last_n, "breakers": breakers}
