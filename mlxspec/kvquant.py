"""A quantized KV cache that rolls back, and when a sequence switches to it (mlx-lm's --kv-bits).

mlx-lm stores keys and values as `mx.quantize` triples (packed ints, scales, biases) once a
cache holds `quantized_kv_start` tokens, and its attention then reads them with
`quantized_matmul`. Each token's entries are quantized on their own (the groups run along
the head dimension), so quantizing on write or all at once stores the same numbers.

What a query reads then depends only on its position: below `start` full-precision keys, from
`start` on every key quantized. `mlxspec.sequence.Sequence` switches exactly when a pass would
first feed position `start` (a pass that spans it runs as two, and rolling back across it
restores the full-precision caches), and the loop keeps a round's drafts on one side of it.
A rollback below `start` once later passes were committed rebuilds the cache instead.

So speculative and plain decoding compute every position alike, but not bit for bit: a key a
float ulp from a rounding boundary of the quantization grid lands on either side depending on
the shape of the pass that computed it, and that moves logits far more than float rounding
does (`reference.judge_quantized_kv`). Greedy texts can then part where the two best tokens
are close, as they can in bfloat16; each is the target's own output with this cache (which
plain decoding, fed in other chunks, does not reproduce either). Sampling stays exact in law.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import QuantizedKVCache

from .choices import DEFAULT_KV_GROUP_SIZE, DEFAULT_QUANTIZED_KV_START, KV_BITS, KV_GROUP_SIZES
from .errors import InvalidArgumentError, shown

__all__ = ["KVQuant", "QuantizedGrowingKVCache", "kv_quant", "quant_share", "quantize_cache"]


class KVQuant(NamedTuple):
    """How a sequence's full-attention caches are quantized (see `kv_quant`)."""

    bits: int
    group_size: int
    start: int  # the first position whose query reads quantized keys

    def room(self, position: int) -> Optional[int]:
        """Positions a pass starting at `position` may feed without crossing `start` (None: any)."""
        return self.start - position if position < self.start else None


def kv_quant(kv_bits, kv_group_size=DEFAULT_KV_GROUP_SIZE, quantized_kv_start=DEFAULT_QUANTIZED_KV_START, *,
             model=None, max_kv_size=None) -> Optional[KVQuant]:
    """Check mlx-lm's three KV-quantization settings (all three, also without `kv_bits`); None when
    `kv_bits` is None (no quantization).

    Raises:
        InvalidArgumentError: a value out of range, a group size the model's head dimension does
            not divide, a sliding window (`max_kv_size`), or a model whose attention has sinks
            (quantized attention cannot add them).
    """
    # The two settings kv_bits qualifies are checked without it too: a typo in them is said, not ignored.
    if isinstance(kv_group_size, bool) or kv_group_size not in KV_GROUP_SIZES:
        raise InvalidArgumentError(f"kv_group_size must be one of {', '.join(map(str, KV_GROUP_SIZES))}, got "
                                   f"{shown(kv_group_size)}")
    if isinstance(quantized_kv_start, bool) or not isinstance(quantized_kv_start, int) or quantized_kv_start < 0:
        raise InvalidArgumentError(f"quantized_kv_start must be an integer >= 0 (the context length from which the "
                                   f"KV cache is quantized), got {shown(quantized_kv_start)}")
    if kv_bits is None:
        return None
    if isinstance(kv_bits, bool) or kv_bits not in KV_BITS:
        raise InvalidArgumentError(f"kv_bits must be one of {', '.join(map(str, KV_BITS))} (bits per cached key "
                                   f"and value), got {shown(kv_bits)}")
    if max_kv_size is not None:
        raise InvalidArgumentError(f"kv_bits cannot be combined with max_kv_size (got max_kv_size={max_kv_size}): a "
                                   f"quantized cache grows; drop one of the two (mlx-lm refuses the pair too)")
    if model is not None:
        _check_model(model, kv_group_size)
    return KVQuant(kv_bits, kv_group_size, quantized_kv_start)


def quant_share(quant: Optional[KVQuant]) -> float:
    """Bytes a quantized entry takes per byte of a 16-bit one (its scale and bias included)."""
    return 1.0 if quant is None else (quant.bits + 32 / quant.group_size) / 16


def _check_model(model, group_size: int) -> None:
    for name, m in model.named_modules():
        if "sinks" in m:
            raise InvalidArgumentError(f"kv_bits is not available for this model: its attention ({name}) has sinks, "
                                       f"which quantized attention cannot add; run it without kv_bits")
    dims = {_head_dim(a) for a in _attentions(model)} - {None}
    bad = sorted(d for d in dims if d % group_size)
    if bad:
        ok = [g for g in KV_GROUP_SIZES if all(d % g == 0 for d in dims)]
        raise InvalidArgumentError(f"kv_group_size {group_size} does not divide this model's head dimension "
                                   f"({', '.join(map(str, bad))}); allowed here: {', '.join(map(str, ok)) or 'none'}")


def _attentions(model) -> List:
    layers = getattr(getattr(model, "model", model), "layers", None) or getattr(model, "layers", [])
    return [a for a in (getattr(layer, "self_attn", None) for layer in layers) if a is not None]


def _head_dim(attn) -> Optional[int]:
    for name in ("head_dim", "k_head_dim"):
        if isinstance(getattr(attn, name, None), int):
            return getattr(attn, name)
    k = getattr(attn, "k_proj", None)
    heads = getattr(attn, "n_kv_heads", None) or getattr(attn, "num_key_value_heads", None)
    w = getattr(k, "weight", None)
    if isinstance(heads, int) and w is not None:  # rows are outputs, never packed by quantization
        return w.shape[0] // heads
    return None


class QuantizedGrowingKVCache(QuantizedKVCache):
    """mlx-lm's quantized cache, plus what mlxspec's rollback and trees ask of a cache.

    `floor`: positions below it were computed from full-precision keys; a rollback below it is
    refused (`can_trim`), so the sequence rebuilds instead.

    A pass of DENSE_ROWS rows or more (a prompt chunk, a verify pass) reads a dequantized copy of
    the layer's keys and values through MLX's fused attention: mlx-lm's quantized attention
    materialises every score, which made a 512-token prompt chunk 3.5x slower on a CPU. It reads
    the same stored numbers. The copy lives for one layer's attention; the cache stays packed.
    One-row steps keep mlx-lm's `quantized_matmul` path, which reads the packed words only."""

    DENSE_ROWS = 2

    def __init__(self, group_size: int, bits: int, floor: int = 0):
        self._dense = False
        super().__init__(group_size=group_size, bits=bits)
        self.floor = floor

    @property
    def bits(self) -> int:
        # mlx-lm's attention asks `hasattr(cache, "bits")` to pick its quantized path: absent for
        # a pass that was handed dequantized keys.
        if self._dense:
            raise AttributeError("bits")
        return self._bits

    @bits.setter
    def bits(self, v: int) -> None:
        self._bits = v

    def update_and_fetch(self, keys, values):
        n, prev = keys.shape[2], self.offset
        qk = mx.quantize(keys, group_size=self.group_size, bits=self._bits)
        qv = mx.quantize(values, group_size=self.group_size, bits=self._bits)
        if self.keys is None or prev + n > self.keys[0].shape[2]:
            size = (prev + n + self.step - 1) // self.step * self.step
            self.keys, self.values = _grown(self.keys, qk, prev, size), _grown(self.values, qv, prev, size)
        self.offset += n
        for stored, new in ((self.keys, qk), (self.values, qv)):
            for s, x in zip(stored, new):
                s[..., prev : self.offset, :] = x
        self._dense = n >= self.DENSE_ROWS
        if self._dense:
            return self._dequantized(self.offset)
        return self.keys_and_values()

    def can_trim(self, n: int) -> bool:
        return 0 <= n <= self.offset - self.floor

    # -- trees and readers outside the model (as `cache.GrowingKVCache`) ---------------------------
    def key_positions(self, N: int) -> np.ndarray:
        return np.arange(self.offset + N, dtype=np.int64)

    def span(self, window_size):
        return window_size, 0

    def stored(self, end: int):
        """(keys, values, positions) of positions 0..end-1, dequantized (a drafter reads them)."""
        return (*self._dequantized(end), np.arange(end, dtype=np.int64))

    def _dequantized(self, end: int):
        """(keys, values) of positions 0..end-1 in the dtype they were written in."""
        return tuple(mx.dequantize(*(x[..., :end, :] for x in t), group_size=self.group_size, bits=self._bits)
                     for t in (self.keys, self.values))

    def move(self, src: List[int], dst: List[int]) -> None:
        if not src:
            return
        idx = mx.array(np.asarray(src, dtype=np.int32))
        for t in (self.keys, self.values):
            taken = [mx.take(x, idx, axis=2) for x in t]  # all gathered before any write
            for x, y in zip(t, taken):
                for i, d in enumerate(dst):
                    x[..., d : d + 1, :] = y[..., i : i + 1, :]

    @property
    def state(self):  # arrays only, as `Engine.materialize` evaluates them
        if self.keys is None:
            return []
        k, v = self.keys_and_values()
        return (*k, *v)

    @state.setter
    def state(self, v):
        self.keys, self.values = tuple(v[:3]), tuple(v[3:])

    @property
    def meta_state(self):
        return tuple(map(str, (self.offset, self.group_size, self._bits, self.floor)))


def _grown(old, new, used: int, size: int):
    """A triple of buffers `size` positions long holding `old`'s first `used` positions."""
    out = []
    for i, x in enumerate(new):
        buf = mx.zeros((*x.shape[:2], size, x.shape[3]), dtype=x.dtype)
        if old is not None and used:
            buf[..., :used, :] = old[i][..., :used, :]
        out.append(buf)
    return tuple(out)


def quantize_cache(cache, quant: KVQuant) -> QuantizedGrowingKVCache:
    """A growing full-precision cache's entries, quantized (as if written quantized); positions
    below its offset stay out of reach of a rollback."""
    q = QuantizedGrowingKVCache(quant.group_size, quant.bits, floor=cache.offset)
    if cache.offset:
        k, v = cache.keys[..., : cache.offset, :], cache.values[..., : cache.offset, :]
        q.update_and_fetch(k, v)
    return q
