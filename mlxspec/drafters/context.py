"""A head that attends to the target's own last-layer keys and values (as GLIDE does, Du et al. 2024).

An EAGLE head keeps keys and values of its own for every position the target has run, made
from (token, feature) pairs. A `context: "target"` head reads the target's last layer's
instead, straight from the target's cache (read, never written), and keeps only the current
round's entries: the token the target chose but has not run yet, then the drafted ones. Its
decoder layer starts as the target's last layer, whose queries were made for exactly those
keys; the target's keys are exact where the head's own were its estimate of them.

`ContextCache` gives the head's decoder layer mlx-lm's cache interface over
[the target's keys of positions < end, the round's own entries], with a mask that keeps the
target's window (a `WindowKVCache`'s `keep` + recent positions) for both parts.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx
import numpy as np

from ..cache import GrowingKVCache
from ..errors import IncompatibleModelsError


class ContextCache:
    """The head's cache for one round (or one teacher-forced pass) of a `context: "target"` head.

    Args:
        target_cache: the target's last layer's cache (`GrowingKVCache` or `WindowKVCache`).
        end: the target's positions the head may see are those below `end` (entries past it,
            e.g. a rejected draft not yet rolled back, are hidden).
        start: the absolute position of the head's first own entry (its RoPE offset).
    """

    def __init__(self, target_cache, end: int, start: int):
        self.target, self.end, self.start = target_cache, end, start
        self.own = GrowingKVCache()
        self.diagonal = False  # teacher forcing: of its own entries, a query sees only itself

    @property
    def offset(self) -> int:
        return self.start + self.own.offset

    def _target(self):
        """(keys, values, absolute position of each column (-1: empty)) stored by the target's cache."""
        return self.target.stored(self.end)

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        k, v = self.own.update_and_fetch(keys, values)
        tk, tv, _ = self._target()
        return mx.concatenate([tk, k], axis=2), mx.concatenate([tv, v], axis=2)

    def make_mask(self, N: int, window_size: Optional[int] = None, return_array: bool = False):
        """Which of [target keys, own entries after this write] each of the next N queries sees;
        None when it is all of them."""
        window, keep = self.target.span(window_size)
        if window is None and N == 1 and not self.diagonal and not return_array:
            return None  # every target key is below end <= the query, every own entry before it
        q = self.offset + np.arange(N, dtype=np.int64)[:, None]
        pt = self._target()[2][None, :]
        po = self.start + np.arange(self.own.offset + N, dtype=np.int64)[None, :]
        vt = (pt >= 0) & (pt < self.end) & (pt < q)
        vo = (po == q) if self.diagonal else (po <= q)
        if window is not None:
            vt &= (pt < keep) | (pt > q - (window - keep))
            vo &= (po < keep) | (po > q - (window - keep))
        vis = np.concatenate([vt, vo], axis=1)
        return None if vis.all() and not return_array else mx.array(vis)

    # -- the rest of the interface the engine reads ------------------------------------------
    @property
    def state(self):
        return self.own.state

    @property
    def nbytes(self) -> int:
        return self.own.nbytes

    def can_trim(self, n: int) -> bool:
        return self.own.can_trim(n)

    def trim(self, n: int) -> int:
        return self.own.trim(n)


def check_context(head_args, target_model, coord=None) -> None:
    """IncompatibleModelsError unless this process holds the target's last layer's whole cache
    in the shape the head's attention reads (its KV heads and head size)."""
    if coord is not None and coord.active and getattr(target_model.model, "pipeline_size", 1) > 1:
        raise IncompatibleModelsError(
            "[eagle] this head attends to the target's last-layer keys and values, but the target runs as "
            "a pipeline over several processes and its last layer is on another one; use a head trained "
            "with --context head")
    attn = target_model.model.layers[-1].self_attn
    theirs = (getattr(attn, "n_kv_heads", None), getattr(attn, "head_dim", None))
    mine = (head_args.num_key_value_heads, head_args.head_dim or head_args.hidden_size // head_args.num_attention_heads)
    if theirs[0] is not None and theirs[0] != mine[0] or theirs[1] is not None and theirs[1] != mine[1]:
        raise IncompatibleModelsError(
            f"[eagle] this head attends to the target's last-layer keys and values with {mine[0]} KV heads of "
            f"size {mine[1]}, but this process holds {theirs[0]} of size {theirs[1]} (a target sharded by "
            f"heads, or another target); use a head trained with --context head")
