"""The target's log-probabilities of the tokens it emits (OpenAI's `logprobs`), and its top choices.

They are computed on the device in the pass that picks the tokens and read with it, so asking
for them adds no wait. They are the model's own: the log-softmax of the target's raw logits,
before temperature, top-k/p and min-p, as mlx-lm and vLLM report them. Every emitted token
is the token its row chose (a greedy argmax or a position-keyed sample, which accepted
drafts equal).
"""

from __future__ import annotations

import math
import re
from typing import List, Optional, Tuple

import mlx.core as mx

from .errors import InvalidArgumentError, shown

MAX_TOP = 20  # top choices per token, as OpenAI's top_logprobs allows
MOST_TOP = 1000  # what the engine gives (llama.cpp's n_probs asks for more than OpenAI's)

TokenLogprob = Tuple[float, List[Tuple[int, float]]]  # (the token's, its row's best (id, logprob), best first)


def row_logprobs(rows: mx.array, tokens: mx.array, top: int) -> Tuple[mx.array, mx.array, mx.array]:
    """rows (S, V) logits, tokens (S,) -> (log p(token) per row (S,), the `top` best ids (S, top),
    their log p (S, top)); lazy."""
    x = rows.astype(mx.float32)
    lp = x - mx.logsumexp(x, axis=-1, keepdims=True)  # (S, V)
    top = min(top, x.shape[-1])  # (llama.cpp's n_probs may ask for more than a small vocabulary has)
    chosen = mx.take_along_axis(lp, tokens.astype(mx.int32)[:, None], axis=-1)[:, 0]
    if top <= 0:
        empty = mx.zeros((rows.shape[0], 0), mx.int32)
        return chosen, empty, empty.astype(mx.float32)
    ids = mx.argpartition(-lp, kth=top - 1, axis=-1)[:, :top]  # (S, top), unordered
    return chosen, ids, mx.take_along_axis(lp, ids, axis=-1)


def read_rows(lp: Optional[tuple], rows: List[int]) -> Optional[List[TokenLogprob]]:
    """The host's copy of the chosen rows of `row_logprobs`' output, top choices best first; a
    token of no probability is no choice (rows after the sampling filters have many)."""
    if lp is None:
        return None
    chosen, ids, vals = (a.tolist() for a in lp)
    return [(chosen[r], sorted(((i, v) for i, v in zip(ids[r], vals[r]) if v > -math.inf), key=lambda iv: -iv[1]))
            for r in rows]


PromptLogprob = Tuple[int, Optional[float], List[Tuple[int, float]]]  # (token, its log p or None, best choices)


class PromptScorer:
    """The target's log-probability of each prompt token given the ones before it (vLLM's
    `prompt_logprobs`, OpenAI's `echo` with `logprobs`), taken from the prefill that feeds
    ids[:-1]: row r of that feed predicts ids[r + 1]. The first token has none."""

    def __init__(self, ids: List[int], top: int):
        self.ids, self.top = list(ids), top
        self._chunks: list = []  # per prefill chunk, row_logprobs' (lazy, then evaluated) output

    def rows(self, start: int, logits: mx.array) -> tuple:
        """`Sequence.prefill`'s hook: the logprobs of the chunk fed from ids[start] on."""
        n = logits.shape[0]
        lp = row_logprobs(logits, mx.array(self.ids[start + 1 : start + 1 + n]), self.top)
        self._chunks.append(lp)
        return lp

    def read(self) -> List[PromptLogprob]:
        """[(ids[0], None, [])] then (token, log p, best choices) per later token, once fed."""
        out: List[PromptLogprob] = [(self.ids[0], None, [])]
        for lp in self._chunks:
            for lp_top in read_rows(lp, range(lp[0].shape[0])):
                out.append((self.ids[len(out)],) + lp_top)
        return out


def is_top_count(n, most: int = MAX_TOP) -> bool:
    """Whether `n` is a count of top choices per token: an integer in 0..most."""
    return not isinstance(n, bool) and isinstance(n, int) and 0 <= n <= most


def check_logprobs(logprobs, name: str = "logprobs") -> Optional[int]:
    """None (off), or how many top choices to give per token, 0..MOST_TOP (0: the token's own only)."""
    if logprobs is None:
        return None
    if not is_top_count(logprobs, MOST_TOP):
        raise InvalidArgumentError(f"{name} must be None (off) or an integer in 0..{MOST_TOP} (top choices per "
                                   f"token besides its own), got {shown(logprobs)}")
    return logprobs


def _byte_decoder() -> dict:
    """GPT-2's byte-level alphabet (printable stand-ins for the 256 bytes) -> the bytes."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    return chars


BYTE_DECODER = _byte_decoder()
_HEX_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def token_bytes(tokenizer, token: int) -> bytes:
    """The bytes a token stands for, also when they are part of a character (OpenAI's `bytes`):
    from its vocabulary piece (byte-level BPE's stand-ins, SentencePiece's `<0xNN>` and `▁`),
    else from decoding it alone."""
    text = tokenizer.decode([token])
    if "\ufffd" not in text:
        return text.encode()
    piece = tokenizer.convert_ids_to_tokens(token) if hasattr(tokenizer, "convert_ids_to_tokens") else None
    if isinstance(piece, str):
        hex_byte = _HEX_BYTE.fullmatch(piece)
        if hex_byte:
            return bytes([int(hex_byte.group(1), 16)])
        if piece and all(c in BYTE_DECODER for c in piece):
            return bytes(BYTE_DECODER[c] for c in piece)
    return text.encode()
