"""KV caches that roll back in O(1), also after a sliding window has wrapped.

Both kinds follow mlx-lm's duck-typed cache interface (`update_and_fetch`, `offset`,
`make_mask`, `state`, `meta_state`, `trim`, `is_trimmable`, `nbytes`, `empty`, `size`),
so unmodified mlx-lm model code runs on them.

`WindowKVCache(window, keep, headroom)` gives each query at absolute position q exactly
the keys mlx-lm's vanilla one-token decoding gives it: positions 0..keep-1 plus the
`window - keep` most recent positions up to q. It stores them in a ring of
`window - keep + headroom` slots behind `keep` fixed slots: the `headroom` extra slots
keep the entries a rollback may need again (a rejected draft never overwrote them), and
the attention mask, built from each slot's absolute position, hides whatever a query
must not see (stale entries, entries outside the window). A multi-token chunk sees the
same per-query window as single steps, unlike mlx-lm's `RotatingKVCache`.
"""

from __future__ import annotations

from typing import Any, List, Optional

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache, RotatingKVCache

from .errors import CacheRollbackError, IncompatibleModelsError, InvalidArgumentError

__all__ = ["GrowingKVCache", "WindowKVCache", "make_cache"]


class GrowingKVCache(KVCache):
    """mlx-lm's growing cache: trimming just moves `offset` back (stale rows are sliced off)."""

    def can_trim(self, n: int) -> bool:
        return 0 <= n <= self.offset

    # -- trees (see mlxspec.tree) ---------------------------------------------------------
    def key_positions(self, N: int) -> np.ndarray:
        """Absolute position of each key column an N-token write will return."""
        return np.arange(self.offset + N, dtype=np.int64)

    def span(self, window_size: Optional[int]):
        """(keys visible to a query or None for all, leading positions always visible)."""
        return window_size, 0

    def stored(self, end: int):
        """(keys, values, absolute position of each column) of positions 0..end-1, for a reader
        outside the model (`drafters.context`)."""
        return self.keys[..., :end, :], self.values[..., :end, :], np.arange(end, dtype=np.int64)

    def move(self, src: List[int], dst: List[int]) -> None:
        """Copy the entries at positions `src` to positions `dst` (within what was written)."""
        _copy_entries(self, np.asarray(src), np.asarray(dst))


class WindowKVCache:
    """Sliding-window cache with O(1) rollback of up to `headroom` tokens past the newest write.

    Args:
        window: keys visible to a query, its own included (mlx-lm's `max_size`).
        keep: leading positions always visible (attention sinks; mlx-lm uses 4 for
            `max_kv_size`, 0 for a model's own sliding-window layers).
        headroom: extra ring slots; writes of up to `headroom` tokens go in place, and a
            rollback may undo up to `headroom` tokens past the newest position written.
    """

    step = 256

    def __init__(self, window: int, keep: int = 0, headroom: int = 16):
        if not isinstance(window, int) or window <= keep or window < 1:
            raise InvalidArgumentError(
                f"[WindowKVCache] window must be an integer > keep ({keep}), got {window!r}"
            )
        if headroom < 1:
            raise InvalidArgumentError(f"[WindowKVCache] headroom must be >= 1, got {headroom}")
        self.window, self.keep, self.headroom = window, keep, headroom
        self.ring = window - keep + headroom  # ring slots behind the `keep` fixed ones
        self.capacity = keep + self.ring
        self.keys = self.values = None
        self.offset = 0  # tokens in the sequence (absolute position of the next token)
        self._hi = -1  # newest position ever written (rolled-back entries stay until overwritten)
        self._pos = np.full(0, -1, np.int64)  # absolute position held by each slot, -1 = empty
        self._used = 0  # slots in use (prefix of the buffer)
        self._pending = None  # layout computed by make_mask for the next write

    # -- layout ---------------------------------------------------------------------------
    def _slots(self, positions: np.ndarray) -> np.ndarray:
        return np.where(positions < self.keep, positions, self.keep + (positions - self.keep) % self.ring)

    def _layout(self, S: int):
        """(slot positions seen by the chunk, slots written, positions written, in-place?)."""
        start = self.offset
        new_pos = np.arange(start, start + S, dtype=np.int64)
        if S <= self.headroom:
            pos = self._pos.copy()
            slots = self._slots(new_pos)
            need = int(slots.max()) + 1
            if need > pos.size:
                pos = np.concatenate([pos, np.full(need - pos.size, -1, np.int64)])
            pos[slots] = new_pos
            used = max(self._used, need)
            return pos[:used], slots, new_pos, True
        # A long chunk (prefill): attend over [old slots, new keys], then keep what fits.
        old = self._pos[: self._used].copy()
        old[old >= start] = -1  # rolled-back entries: the chunk rewrites those positions
        return np.concatenate([old, new_pos]), None, new_pos, False

    def _mask(self, pos: np.ndarray, S: int, window_size: Optional[int]):
        window = min(self.window, window_size) if window_size else self.window
        q = np.arange(self.offset, self.offset + S, dtype=np.int64)[:, None]
        p = pos[None, :]
        visible = (p >= 0) & (p <= q) & ((p < self.keep) | (p > q - (window - self.keep)))
        return visible

    def make_mask(self, N: int, window_size: Optional[int] = None, return_array: bool = False):
        layout = self._layout(N)
        self._pending = (self.offset, N, layout)
        visible = self._mask(layout[0], N, window_size)
        if N == 1 and not return_array and visible.all():
            return None
        return mx.array(visible)

    # -- update ---------------------------------------------------------------------------
    def _grow(self, need: int, like_k: mx.array, like_v: mx.array):
        have = 0 if self.keys is None else self.keys.shape[2]
        if need <= have:
            return
        size = min(self.capacity, ((need + self.step - 1) // self.step) * self.step)
        B, H, _, Dk = like_k.shape
        Dv = like_v.shape[3]
        new_k = mx.zeros((B, H, size - have, Dk), like_k.dtype)
        new_v = mx.zeros((B, H, size - have, Dv), like_v.dtype)
        if self.keys is None:
            self.keys, self.values = new_k, new_v
        else:
            self.keys = mx.concatenate([self.keys, new_k], axis=2)
            self.values = mx.concatenate([self.values, new_v], axis=2)
        self._pos = np.concatenate([self._pos, np.full(size - have, -1, np.int64)])

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        S = keys.shape[2]
        pending, self._pending = self._pending, None
        if pending is not None and pending[:2] == (self.offset, S):
            pos, slots, new_pos, in_place = pending[2]
        else:
            pos, slots, new_pos, in_place = self._layout(S)
        if in_place:
            self._grow(int(slots.max()) + 1, keys, values)
            # Slots of consecutive positions form at most three runs (keep, ring, wrap).
            self._write_gather(slots, np.arange(slots.size), keys, values)
            self._pos[slots] = new_pos
            self._used = pos.size
            out = (self.keys[..., : self._used, :], self.values[..., : self._used, :])
        else:
            out_k = mx.concatenate([self.keys[..., : self._used, :], keys], axis=2) if self._used else keys
            out_v = mx.concatenate([self.values[..., : self._used, :], values], axis=2) if self._used else values
            # Store what later queries can still need: positions < keep and the last `ring`.
            keep_mask = (new_pos < self.keep) | (new_pos >= new_pos[-1] + 1 - self.ring)
            idx = np.nonzero(keep_mask)[0]
            slots = self._slots(new_pos[idx])
            self._grow(int(slots.max()) + 1, keys, values)
            order = np.argsort(slots, kind="stable")
            idx, slots = idx[order], slots[order]
            self._write_gather(slots, idx, keys, values)
            self._pos[slots] = new_pos[idx]
            self._used = max(self._used, int(slots.max()) + 1)
            out = (out_k, out_v)
        self.offset += S
        self._hi = max(self._hi, self.offset - 1)
        return out

    def _write_gather(self, slots: np.ndarray, idx: np.ndarray, keys: mx.array, values: mx.array):
        # Runs where both slot and source index are consecutive become slice copies.
        i, n = 0, slots.size
        while i < n:
            j = i + 1
            while j < n and slots[j] == slots[j - 1] + 1 and idx[j] == idx[j - 1] + 1:
                j += 1
            a, b, s = int(slots[i]), int(slots[j - 1]) + 1, int(idx[i])
            self.keys[..., a:b, :] = keys[..., s : s + (b - a), :]
            self.values[..., a:b, :] = values[..., s : s + (b - a), :]
            i = j

    # -- trees (see mlxspec.tree) ---------------------------------------------------------
    def key_positions(self, N: int) -> np.ndarray:
        """Absolute position held by each key column an N-token write will return (-1: empty)."""
        return self._layout(N)[0]

    def span(self, window_size: Optional[int]):
        """(keys visible to a query, leading positions always visible)."""
        return (min(self.window, window_size) if window_size else self.window), self.keep

    def stored(self, end: int):
        """(keys, values, absolute position of each column, -1 for an empty slot) of every slot in
        use, for a reader outside the model (`drafters.context`); its mask hides positions >= end."""
        return self.keys[..., : self._used, :], self.values[..., : self._used, :], self._pos[: self._used].copy()

    def move(self, src: List[int], dst: List[int]) -> None:
        """Copy the entries at positions `src` to positions `dst`, all among the newest written
        (so within the ring's headroom: no live entry is overwritten)."""
        _copy_entries(self, self._slots(np.asarray(src)), self._slots(np.asarray(dst)))

    # -- rollback -------------------------------------------------------------------------
    def can_trim(self, n: int) -> bool:
        """True when the keys the next query would need after trimming n are still stored."""
        if n < 0 or n > self.offset:
            return False
        new = self.offset - n
        if new <= self.keep:
            return True  # the next query needs only the fixed `keep` slots, never overwritten
        oldest_needed = max(new - (self.window - self.keep) + 1, self.keep)  # the next query's oldest ring key
        oldest_stored = self._hi - self.ring + 1
        return oldest_needed >= oldest_stored

    def is_trimmable(self) -> bool:
        return True

    def start_at(self, position: int) -> None:
        """Make an empty cache continue a sequence at `position`: its keys of earlier positions
        are absent (a drafter restarting where its inputs begin, `drafters.eagle`)."""
        if self.offset or self._used:
            raise ValueError("[WindowKVCache] start_at needs an empty cache")
        self.offset, self._hi = position, position - 1

    def trim(self, n: int) -> int:
        n = min(self.offset, n)
        if not self.can_trim(n):
            raise CacheRollbackError(
                f"[WindowKVCache] cannot roll back {n} tokens: the window needs entries already "
                f"overwritten (at most {self.headroom} tokens past the newest write can be undone)"
            )
        self.offset -= n
        if self.offset <= self.keep:  # back within the fixed slots: the ring starts over (a new prompt),
            self._hi = self.offset - 1  # or every later rollback would be judged by the old request's writes
        self._pending = None
        return n

    # -- mlx-lm interface -----------------------------------------------------------------
    def size(self) -> int:
        return min(self.offset, self.window)

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes

    @property
    def state(self):
        if self.keys is None:
            return []
        return self.keys, self.values

    @state.setter
    def state(self, v):
        self.keys, self.values = v

    @property
    def meta_state(self):
        return tuple(map(str, (self.window, self.keep, self.headroom, self.offset, self._hi, self._used)))

def _copy_entries(cache, src: np.ndarray, dst: np.ndarray) -> None:
    """keys/values[..., dst, :] = keys/values[..., src, :], gathered before any write; runs of
    consecutive destinations become slice writes."""
    if not src.size:
        return
    idx = mx.array(src.astype(np.int32))
    k, v = mx.take(cache.keys, idx, axis=2), mx.take(cache.values, idx, axis=2)
    i, n = 0, dst.size
    while i < n:
        j = i + 1
        while j < n and dst[j] == dst[j - 1] + 1:
            j += 1
        a, b = int(dst[i]), int(dst[j - 1]) + 1
        cache.keys[..., a:b, :] = k[..., i:j, :]
        cache.values[..., a:b, :] = v[..., i:j, :]
        i = j


def check_max_kv_size(max_kv_size) -> Optional[int]:
    """None (no window) or an int >= 5; InvalidArgumentError otherwise."""
    if max_kv_size is not None and (isinstance(max_kv_size, bool) or not isinstance(max_kv_size, int) or max_kv_size < 5):
        raise InvalidArgumentError(f"max_kv_size must be an integer >= 5 (4 tokens are always kept), got {max_kv_size!r}")
    return max_kv_size


def make_cache(model, *, max_kv_size: Optional[int] = None, headroom: int = 16) -> List[Any]:
    """Per-layer rollback-capable caches following the model's own `make_cache()` choice.

    A layer's `KVCache` becomes a `GrowingKVCache` (or a `WindowKVCache(max_kv_size, keep=4)`
    when `max_kv_size` is set, like mlx-lm's vanilla decoding); a layer's own
    `RotatingKVCache(max_size=W, keep=K)` becomes `WindowKVCache(W, K)`. Any other kind
    (recurrent/SSM state, chunked attention) cannot roll back: IncompatibleModelsError.
    """
    check_max_kv_size(max_kv_size)
    base = model.make_cache() if hasattr(model, "make_cache") else [KVCache() for _ in model.layers]
    out = []
    for i, c in enumerate(base):
        if type(c) is KVCache:
            out.append(WindowKVCache(max_kv_size, 4, headroom) if max_kv_size else GrowingKVCache())
        elif type(c) is RotatingKVCache:
            out.append(WindowKVCache(c.max_size, c.keep, headroom))
        else:
            raise IncompatibleModelsError(
                f"layer {i} of {type(model).__module__.split('.')[-1]} uses {type(c).__name__}, which "
                f"cannot roll back rejected draft tokens; speculative decoding supports attention "
                f"layers with KVCache or RotatingKVCache only"
            )
    return out

