"""Token trees in a target pass: the ancestor-only mask, positions by depth, and cache compaction.

A pass over a tree feeds the root (the last committed token) and then the N candidate nodes,
parents before children (Medusa's and SpecInfer's tree buffers): "fed row" 0 is the root and
row i+1 is node i. Row r sits at position `offset + depth(r)`, and attends to the committed
keys its window allows plus its own ancestors in the tree (itself included), so every row
computes exactly what a sequential pass along its root-to-row path would.

The caches write the fed rows at consecutive positions, as if the tree were a chain. After
the round, `compact` moves the accepted path's entries to the positions that path occupies
(offset+1, offset+2, ...) and rolls the rest back: O(path length) copies, none at all when
the path follows first children in a depth-first layout (the drafters put their main chain
first, so the common outcome costs nothing).
"""

from __future__ import annotations

from typing import List, Sequence as Seq

import mlx.core as mx
import numpy as np


def fed_parents(parents: Seq[int]) -> np.ndarray:
    """Parent of every fed row (root first): -1 for the root, parent+1 for node i."""
    return np.concatenate([[-1], np.asarray(parents, dtype=np.int64) + 1])


def depths(parents: Seq[int]) -> np.ndarray:
    """Depth of every fed row (the root is 0, a child of the root 1, ...)."""
    par = fed_parents(parents)
    d = np.zeros(par.size, np.int64)
    for r in range(1, par.size):
        d[r] = d[par[r]] + 1
    return d


def ancestors(parents: Seq[int]) -> np.ndarray:
    """(N+1, N+1) bool: [r, s] is True when fed row s is row r or one of its ancestors."""
    par = fed_parents(parents)
    n = par.size
    anc = np.eye(n, dtype=bool)
    for r in range(1, n):
        anc[r] |= anc[par[r]]
    return anc


def mask(key_pos: np.ndarray, offset: int, depth: np.ndarray, anc: np.ndarray, window, keep: int) -> mx.array:
    """(rows, keys) bool mask for a tree pass.

    Args:
        key_pos: absolute position held by each key column the cache will return (-1: empty).
        offset: position of the root (the cache's offset before the pass).
        depth, anc: from `depths` and `ancestors`.
        window: keys visible to a query, its own included (None: unlimited).
        keep: leading positions that stay visible whatever the window (attention sinks).
    """
    n = depth.size
    q = offset + depth[:, None]  # (rows, 1) each row's position
    p = key_pos[None, :]  # (1, keys)
    node = p - offset  # fed row written at that position, for the tree's own columns
    in_tree = (node >= 0) & (node < n)
    rows = np.arange(n)[:, None]
    is_anc = np.where(in_tree, anc[rows, np.clip(node, 0, n - 1)], False)
    vpos = np.where(in_tree, offset + depth[np.clip(node, 0, n - 1)], p)  # where that key really sits
    visible = (p >= 0) & ((p < offset) | is_anc) & (vpos <= q)
    if window is not None:
        visible &= (vpos < keep) | (vpos > q - (window - keep))
    return mx.array(visible)


def moves(path: Seq[int]) -> tuple[List[int], List[int]]:
    """(source rows, destination rows) that put the accepted path's rows right after the root."""
    src, dst = [], []
    for k, i in enumerate(path):
        if i + 1 != k + 1:
            src.append(i + 1)
            dst.append(k + 1)
    return src, dst


def compact(caches, start: int, fed: int, path: Seq[int]) -> None:
    """After a pass that fed `fed` rows from position `start`, keep the root and the accepted
    `path` (node indices, root-to-leaf) at start, start+1, ...; roll the other rows back."""
    src, dst = moves(path)
    if src:
        for c in caches:
            c.move([start + s for s in src], [start + d for d in dst])
    rest = fed - 1 - len(path)
    if rest:
        for c in caches:
            c.trim(rest)
