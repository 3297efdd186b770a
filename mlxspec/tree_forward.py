"""One pass of an unmodified mlx-lm model over a token tree.

mlx-lm attention layers take everything position-dependent from their cache: the mask
from `cache.make_mask` (through `create_attention_mask`) and the RoPE offset from
`cache.offset`. A tree pass hands each layer a `TreeView` of its cache whose mask is the
tree's ancestor mask (`mlxspec.tree.mask`) and whose offset is one position per fed row
(its depth), so the model's own projections, norms, RoPE variant and attention run as
they are. `mx.fast.rope` accepts one offset per batch entry but not per row, so the first
tree pass gives each attention's `rope` a subclass of its own class that moves the rows into
the batch axis when it is given one offset per row and otherwise is the original module.
"""

from __future__ import annotations

from typing import List

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from . import tree
from .retype import override_call


def _rows_call(call, x, offset, kwargs):
    """`call` (a RoPE module's own __call__) on a (1, H, L, D) input with one offset per row."""
    rows = mx.swapaxes(x, 0, -2)  # (L, H, 1, D): each row its own batch entry
    try:
        out = call(rows, offset=offset, **kwargs)
    except (TypeError, ValueError):  # a variant that does arithmetic on the offset: one offset per call
        pos = np.asarray(offset).tolist()
        out = mx.concatenate([call(rows[i : i + 1], offset=int(p), **kwargs) for i, p in enumerate(pos)])
    return mx.swapaxes(out, 0, -2)


def _per_row(rope, call, x, offset=0, **kwargs):
    """A RoPE module's call that also accepts one offset per row; otherwise the module's own."""
    if isinstance(offset, mx.array) and offset.ndim == 1 and x.shape[0] == 1 and x.shape[-2] > 1:
        return _rows_call(call, x, offset, kwargs)
    return call(x, offset=offset, **kwargs)


def ensure_token_rope(model) -> None:
    """Let every `rope` submodule of `model` take one offset per row, once (`_per_row`, through
    a subclass of its own class: module names and isinstance checks stay; a no-op for scalar
    offsets)."""
    if getattr(model, "_token_rope", False):
        return
    for _, m in model.named_modules():
        rope = m.get("rope")
        if isinstance(rope, nn.Module):
            override_call(rope, _per_row, "_mlxspec_token_rope")
    model._token_rope = True


class TreeView:
    """A layer's cache as a tree pass sees it: tree mask, per-row offsets, writes passed through."""

    def __init__(self, cache, positions: mx.array, depth: np.ndarray, anc: np.ndarray):
        self.cache = cache
        self.offset = positions  # (rows,) int32: what the layer's RoPE reads
        self._depth, self._anc = depth, anc

    def make_mask(self, N: int, window_size=None, return_array: bool = False):
        window, keep = self.cache.span(window_size)
        return tree.mask(self.cache.key_positions(N), self.cache.offset, self._depth, self._anc, window, keep)

    def update_and_fetch(self, keys, values):
        return self.cache.update_and_fetch(keys, values)

    def __getattr__(self, name):  # state, nbytes, ... of the real cache
        return getattr(self.cache, name)


def views(caches: List, parents) -> List[TreeView]:
    """Views of `caches` for a pass over the root plus nodes with these `parents` (see mlxspec.tree)."""
    depth = tree.depths(parents)
    anc = tree.ancestors(parents)
    offset = caches[0].offset
    positions = mx.array((offset + depth).astype(np.int32))
    return [TreeView(c, positions, depth, anc) for c in caches]
