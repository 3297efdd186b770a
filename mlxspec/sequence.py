"""A model plus its KV caches plus the exact tokens those caches hold.

Keeping the token list beside the caches is what makes every path safe: a new request
syncs to its tokens by rolling back to the common prefix (or rebuilding when the window
no longer holds it), and a forward pass interrupted half-way marks the caches dirty so
the next sync rebuilds them instead of reading half-written layers.

A pipelined loop feeds a token before its value is on the host (a lazy `mx.array`): its
place in `tokens` holds None until `settle` writes the value. None never equals a real
token, so a sync before settling rolls the unsettled tokens back rather than trusting them.

With `keep_hidden=True` every pass also keeps the backbone's final hidden states (the
features a feature-level drafter reads), computed in the same pass as the logits; with
`hidden_layers` it keeps the outputs of those blocks instead (`backbone.tapped`).

With `kv_quant` (`mlxspec.kvquant`) its growing caches become quantized ones when a pass would
first feed position `kv_quant.start`; a pass across that position runs as two.
"""

from __future__ import annotations

import copy
from typing import Callable, List, NamedTuple, Optional, Sequence as Seq, Tuple, Union

import mlx.core as mx

from .cache import GrowingKVCache, make_cache
from .errors import CacheRollbackError
from .kvquant import KVQuant, QuantizedGrowingKVCache, quantize_cache

Tokens = Union[Seq[int], mx.array]


class SeqState(NamedTuple):
    """What a `Sequence` holds for one history: its caches, their tokens, the kept features."""

    caches: list
    tokens: List[Optional[int]]
    hidden: List[Tuple[int, mx.array]]

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.caches) + sum(rows.nbytes for _, rows in self.hidden)


def shared_prefix(a: List, b: List, start: int = 0) -> int:
    """Length of the longest common prefix of two token lists whose first `start` tokens are
    known to agree (they are not compared again)."""
    n = min(len(a), len(b))
    lo = min(start, n)
    if a[lo:n] == b[lo:n]:  # the usual case: one C-level compare
        return n
    # They part in [lo, hi): halve that at C speed (a Python loop over a long history would cost
    # a millisecond per 30,000 tokens, every round), then walk the last few tokens.
    hi = n
    while hi - lo > 32:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    while a[lo] == b[lo]:
        lo += 1
    return lo


class Sequence:
    def __init__(self, model, *, max_kv_size: Optional[int], headroom: int, prefill_step: int = 512,
                 keep_hidden: bool = False, hidden_layers: Seq[int] = (), kv_quant: Optional[KVQuant] = None):
        self.model = model
        self.kv_quant = kv_quant
        self.max_kv_size = max_kv_size
        self.headroom = headroom
        self.prefill_step = prefill_step
        self.keep_hidden = keep_hidden
        if keep_hidden:
            from .backbone import split_model, tapped

            self._backbone, self._head = split_model(model)
            self._taps = tapped(model, hidden_layers) if hidden_layers else None
        self.reset()

    def reset(self) -> None:
        """Fresh caches, no tokens."""
        self.caches = make_cache(self.model, max_kv_size=self.max_kv_size, headroom=self.headroom)
        self.tokens: List[Optional[int]] = []
        self._hidden: List[Tuple[int, mx.array]] = []  # (first position, (n, H) rows), in order
        self._dirty = False
        self._quantized = False  # the caches switched to quantized ones (`kv_quant`)
        self._before_switch = None  # the caches as they were then, until no rollback can reach back

    def arrays(self) -> list:
        """What it keeps between passes (cache states, kept features), for `Engine.materialize`."""
        return [[c.state for c in self.caches], self._hidden]

    # -- whole states (`mlxspec.prompt_cache` parks them) -----------------------------------------
    @property
    def dirty(self) -> bool:
        """A pass was interrupted half-way: the caches may not match `tokens` (the next sync rebuilds them)."""
        return self._dirty

    def common_prefix(self, tokens: List[int]) -> int:
        """How many leading `tokens` the caches hold (0 when a pass was interrupted)."""
        return 0 if self._dirty else shared_prefix(self.tokens, tokens)

    def take_state(self) -> "SeqState":
        """Hand over the caches, tokens and kept features; the sequence starts afresh."""
        state = SeqState(self.caches, self.tokens, self._hidden)
        self.reset()
        return state

    def copy_state(self) -> "SeqState":
        """A copy of the state that later passes and rollbacks here leave alone (the caches'
        arrays are updated in place, so they are copied; kept features are never changed in place)."""
        caches = copy.deepcopy(self.caches)
        mx.eval([c.state for c in caches])  # now, not when first read: until then it would pin the originals
        return SeqState(caches, list(self.tokens), list(self._hidden))

    def put_state(self, state: "SeqState") -> None:
        """Take up a state `take_state` or `copy_state` gave (of a sequence over the same model)."""
        self.caches, self.tokens, self._hidden = state.caches, state.tokens, state.hidden
        self._dirty = False
        self._quantized = any(isinstance(c, QuantizedGrowingKVCache) for c in self.caches)
        self._before_switch = None

    def sync(self, tokens: List[int], known: int = 0) -> List[int]:
        """Make the caches hold a prefix of `tokens`; return the tokens still to feed (at least 1).
        `known`: how many leading tokens the caller knows the caches still share with `tokens`
        (a history that only grew since the last sync); they are not compared again."""
        if self._dirty:
            self.reset()
        common = shared_prefix(self.tokens, tokens, min(known, len(self.tokens)))
        common = min(common, len(tokens) - 1)  # always leave one token to feed
        excess = len(self.tokens) - common
        if excess:
            if all(c.can_trim(excess) for c in self.caches):
                self.rollback(excess)
            else:
                self.reset()
                common = 0
        return list(tokens[common:])

    def _run(self, ids: mx.array, caches=None) -> mx.array:
        """One pass over ids (S,) at the current position -> logits (1, S, V); keeps hidden rows if asked."""
        caches = self.caches if caches is None else caches
        if not self.keep_hidden:
            return self.model(ids[None], cache=caches)
        if self._taps is None:
            h = kept = self._backbone(ids[None], caches)  # (1, S, H)
        else:
            h, kept = self._taps(ids[None], caches)  # (1, S, H), (1, S, layers * H)
        self._hidden.append((len(self.tokens), kept[0]))
        return self._head(h)

    def forward(self, tokens: Tokens, *, batched: bool = False) -> mx.array:
        """Feed tokens (ints, or a lazy int array whose values `settle` fills in later); returns the
        logits of every fed position, (S, V) or with `batched` (1, S, V), not yet evaluated."""
        lazy = isinstance(tokens, mx.array)
        if lazy:
            ids = tokens if tokens.dtype == mx.uint32 else tokens.astype(mx.uint32)
        else:
            ids = mx.array(tokens, dtype=mx.uint32)
        self._dirty = True  # until the caches and self.tokens agree again
        parts = []
        for lo, hi in self._spans(ids.shape[0]):
            parts.append(self._run(ids[lo:hi]))
            self.tokens.extend([None] * (hi - lo) if lazy else tokens[lo:hi])
        self._dirty = False
        logits = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=1)
        return logits if batched else logits[0]

    # -- the switch to a quantized cache (`kv_quant`) ----------------------------------------------
    def pass_room(self, position: int) -> Optional[int]:
        """Positions a pass starting at `position` can feed before the switch to a quantized
        cache (None: no switch ahead)."""
        return None if self.kv_quant is None else self.kv_quant.room(position)

    def _switch(self) -> Optional[int]:
        """Before a pass: quantize the caches if it starts at or past the switch; returns the
        positions it may feed before the switch (None: any number)."""
        if self.kv_quant is None:
            return None
        if self._quantized:
            if len(self.tokens) > self.kv_quant.start:  # a round's rollback no longer reaches the switch
                self._before_switch = None
            return None
        room = self.kv_quant.room(len(self.tokens))
        if room is None:
            self._before_switch = self.caches
            self.caches = [quantize_cache(c, self.kv_quant) if type(c) is GrowingKVCache else c for c in self.caches]
            self._quantized = True
        return room

    def _unswitch(self, end: int) -> None:
        """Roll back to `end`, below the switch of the pass being undone: the full-precision
        caches (not written since) take over again, cut to `end`."""
        for i, (c, old) in enumerate(zip(self.caches, self._before_switch)):
            if c is not old:
                old.trim(old.offset - end)
                self.caches[i] = old
            else:
                c.trim(c.offset - end)
        self._quantized, self._before_switch = False, None

    def _spans(self, n: int):
        """(lo, hi) parts of an n-token pass, split where the caches switch (the caller feeds each
        part and extends `tokens` before asking for the next)."""
        room = self._switch()
        if room is None or n <= room:
            yield 0, n
            return
        yield 0, room
        self._switch()
        yield room, n

    def forward_tree(self, tokens: Tokens, parents: Seq[int]) -> mx.array:
        """Feed a token tree: tokens[0] is the root (the next token of the sequence), tokens[i+1]
        node i, whose parent is node parents[i] (-1: the root). Returns logits (1, 1+N, V),
        row r computed as a sequential pass along the path to row r would (see mlxspec.tree).
        The caches hold all rows until `keep_path` keeps one path."""
        from .tree import depths as tree_depths
        from .tree_forward import ensure_token_rope, views

        ensure_token_rope(self.model)
        lazy = isinstance(tokens, mx.array)
        ids = (tokens if tokens.dtype == mx.uint32 else tokens.astype(mx.uint32)) if lazy else mx.array(tokens, dtype=mx.uint32)
        room = self._switch()
        if room is not None and int(tree_depths(parents).max()) >= room:  # rows cannot be split like a chain's
            raise ValueError(f"a tree fed at position {len(self.tokens)} would cross the KV cache's quantization "
                             f"switch at {self.kv_quant.start}; the loop keeps trees to {room - 1} levels there")
        self._dirty = True
        logits = self._run(ids, views(self.caches, parents))
        self.tokens.extend([None] * ids.shape[0] if lazy else tokens)
        self._dirty = False
        return logits

    def keep_path(self, start: int, path: Seq[int]) -> None:
        """After `forward_tree` fed its root at `start`: keep the root and the nodes of `path`
        (root-to-leaf) at start, start+1, ...; roll back every other node."""
        from .tree import compact

        fed = len(self.tokens) - start
        compact(self.caches, start, fed, path)
        kept = [self.tokens[start + 1 + i] for i in path]
        del self.tokens[start + 1 :]
        self.tokens.extend(kept)
        if self._hidden and self._hidden[-1][0] == start:
            rows = self._hidden[-1][1]
            self._hidden[-1] = (start, rows[mx.array([0] + [1 + i for i in path])])

    def settle(self, start: int, values: Seq[int]) -> None:
        """Write the values of lazily fed tokens at positions start, start+1, ..."""
        self.tokens[start : start + len(values)] = values

    def prefill(self, tokens: List[int], stop: Optional[Callable[[], bool]] = None,
                rows: Optional[Callable[[int, mx.array], object]] = None) -> bool:
        """Feed tokens in chunks, evaluating each (no logits kept). `stop` is asked before each
        chunk; when it says so, the feeding ends there (the caches hold the chunks fed so far,
        consistently) and this returns False. `rows(start, logits)`: given each chunk's logits
        (S, V) and where it starts in `tokens`; what it returns is evaluated with the chunk
        (otherwise the logits are never computed)."""
        i = 0
        while i < len(tokens):
            if stop is not None and stop():
                return False
            room = self._switch()
            chunk = tokens[i : i + min(self.prefill_step, room or self.prefill_step)]
            self._dirty = True
            if self.keep_hidden:
                logits = self._run(mx.array(chunk, dtype=mx.uint32))
                kept = [self._hidden[-1][1]]
            else:
                logits = self.model(mx.array(chunk, dtype=mx.uint32)[None], cache=self.caches)
                kept = []
            mx.eval([c.state for c in self.caches], kept, rows(i, logits[0]) if rows is not None else [])
            self.tokens.extend(chunk)
            self._dirty = False
            i += len(chunk)
        return True

    def rollback(self, n: int) -> None:
        if n <= 0:
            return
        end = len(self.tokens) - n
        if self._quantized and end < self.kv_quant.start:
            if self._before_switch is None:
                raise CacheRollbackError(f"cannot roll back to position {end}, below the KV cache's quantization "
                                         f"switch at {self.kv_quant.start}, once later passes were committed")
            self._unswitch(end)
        else:
            for c in self.caches:
                c.trim(n)
        del self.tokens[-n:]
        if self._hidden:
            self._trim_hidden(len(self.tokens))

    # -- hidden states (keep_hidden=True) ---------------------------------------------------------
    def _trim_hidden(self, end: int) -> None:
        # Chunks are contiguous and in order: drop or cut them from the end (O(chunks removed)).
        h = self._hidden
        while h and h[-1][0] >= end:
            h.pop()
        if h and h[-1][0] + h[-1][1].shape[0] > end:
            start, rows = h[-1]
            h[-1] = (start, rows[: end - start])

    def hidden_since(self, pos: int) -> mx.array:
        """Kept hidden states of positions pos .. len(tokens)-1, shape (n, H), or (n, layers * H)
        with `hidden_layers` (lazy).

        Raises:
            ValueError: the sequence does not keep hidden states, or rows before `pos` were
                released with `release_hidden`.
        """
        if not self.keep_hidden:
            raise ValueError("this Sequence was built with keep_hidden=False")
        end = len(self.tokens)
        parts = []
        first = None  # first position the kept chunks reach back to
        for start, rows in reversed(self._hidden):  # from the newest: a drafter asks for recent rows
            if start + rows.shape[0] <= pos:
                break
            parts.append(rows[max(0, pos - start):])
            first = start
            if start <= pos:
                break
        if first is not None and first > pos:
            raise ValueError(f"hidden states before position {first} were released; asked from {pos}")
        if not parts:
            if pos >= end:
                return mx.zeros((0, self._hidden[-1][1].shape[-1] if self._hidden else 0))
            raise ValueError(f"no hidden states kept from position {pos}")
        return parts[0] if len(parts) == 1 else mx.concatenate(parts[::-1], axis=0)

    def release_hidden(self, before: int) -> None:
        """Forget hidden rows of positions < before (a drafter will not read them again). Whole
        chunks only (a pass's or a prompt chunk's rows): a slice of one would keep its buffer."""
        h = self._hidden
        n = 0
        while n < len(h) and h[n][0] + h[n][1].shape[0] <= before:
            n += 1
        if n:
            del h[:n]

    @property
    def first_hidden(self) -> int:
        """The first position whose hidden row is kept (len(tokens) when none is)."""
        return self._hidden[0][0] if self._hidden else len(self.tokens)

    @property
    def kv_bytes(self) -> int:
        return sum(c.nbytes for c in self.caches)
