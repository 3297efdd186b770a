"""A small MLX model as drafter, with its own rollback cache in the same process."""

from __future__ import annotations

from typing import List, Optional

import mlx.core as mx

from .. import kernels
from ..sampling import SamplingParams, position_keys, sample_race, sample_race_two, xtc_fires
from ..sequence import Sequence
from . import chaincopy
from .base import Draft
from .ngram import NgramDrafter
from .sidetree import beside, read_tree, runner_up, runners_up, static_parents


def power_of_two_chunks(n: int) -> List[int]:
    """n as a sum of powers of two, largest first (37 -> [32, 4, 1])."""
    return [1 << b for b in range(n.bit_length() - 1, -1, -1) if n >> b & 1]


class ModelDrafter:
    """Drafts k tokens autoregressively from a draft model, entirely on the device.

    Each draft token feeds the next step as a lazy array, so proposing k tokens needs no
    host read: the engine reads the drafts together with the verification result. The
    cache is synced to the committed history at each `propose`: the previous round's draft
    values are settled from the (by then evaluated) draft array, rejected drafts roll back,
    and tokens the draft has not seen (plain rounds in between) are fed in power-of-two
    chunks, so catching up uses a handful of shapes that `Engine.warmup` compiles once.

    Its chains copy where the text repeats (`chaincopy`, as an EAGLE head's do): `copier` is the
    engine's n-gram drafter, whose index of the history its lookup rounds keep anyway.
    """

    name = "model"
    uses_model = True

    def __init__(self, model, *, target_vocab: int, max_kv_size: Optional[int], headroom: int,
                 copier: Optional[NgramDrafter] = None):
        self.model = model
        self.target_vocab = target_vocab
        self.seq = Sequence(model, max_kv_size=max_kv_size, headroom=headroom)
        self.copying = True  # chains copy where the text repeats (`chaincopy`); the loop sets it per request
        self.copier = copier if copier is not None else NgramDrafter()
        self.reset()

    def reset(self) -> None:
        self.seq.reset()
        self._drafted = None  # (first position, lazy (k-1,) tokens fed as drafts) of the last round
        # The history last synced to, and its length then: the loop's history only grows within a
        # request, so the next sync to the same list need not compare what it held (a long
        # history's compare costs every round).
        self._history, self._synced = None, 0
        self.own = chaincopy.OwnRate()  # how often its sampled chains' own tokens stood (copying's guard)

    def _sync(self, history: List[int]) -> List[int]:
        known = self._synced if history is self._history else 0
        todo = self.seq.sync(history, known)
        self._history, self._synced = history, len(history) - len(todo)
        return todo

    def arrays(self) -> list:
        """What it keeps between rounds, for `Engine.materialize`."""
        return [self.seq.arrays(), self._drafted]

    def prefill(self, history: List[int]) -> None:
        """Bring the cache up to history[:-1] (prompt processing)."""
        self.settle()
        todo = self._sync(history)
        self.seq.prefill(todo[:-1])

    def settle(self) -> None:
        """Write the last round's draft values into the cache's token list (they are evaluated by now)."""
        if self._drafted is not None:
            start, arr = self._drafted
            self._drafted = None
            if start + arr.shape[0] <= len(self.seq.tokens):
                self.seq.settle(start, arr.tolist())

    def _fit(self, logits: mx.array) -> mx.array:
        # Draft and target may pad their embeddings differently: compare over the target's width.
        V = logits.shape[-1]
        if V > self.target_vocab:
            return logits[..., : self.target_vocab]
        if V < self.target_vocab:
            pad = mx.full((*logits.shape[:-1], self.target_vocab - V), -mx.inf, logits.dtype)
            return mx.concatenate([logits, pad], axis=-1)
        return logits

    def catch_up(self, history: List[int]) -> mx.array:
        """Feed what the cache lacks of `history`; returns the logits after its last token."""
        self.settle()
        feed = self._sync(history)
        i = 0
        for n in power_of_two_chunks(len(feed)):
            logits = self.seq.forward(feed[i : i + n])
            i += n
        return logits[-1]

    def propose(self, history, k, params: SamplingParams, seed: int) -> Draft:
        return self._draft(history, k, params, seed)

    def propose_tree(self, history, depth, size, params: SamplingParams, seed: int) -> Draft:
        """The greedy chain of `depth` tokens plus side leaves, at most `size` nodes (`sidetree`).
        Deterministic candidates (the engine uses these read trees at temperature 0 only); the
        host reads the draft, since the tree's shape depends on it."""
        return self._draft(history, depth, SamplingParams(temperature=0.0), seed, size=size)

    def propose_static_tree(self, history, depth, leaves, params: SamplingParams, seed: int) -> Draft:
        """The chain of `depth` tokens plus the runner-up of each of its first `leaves` steps
        (`sidetree.static_parents`): a fixed shape, left on the device like a chain. Greedy: the
        second likeliest token; sampled: the race's runner-up (`sampling.sample_race_two`)."""
        return self._draft(history, depth, params, seed, static=leaves)

    def _draft(self, history, k, params: SamplingParams, seed: int, size: int = 0, static: int = 0) -> Draft:
        """k tokens drafted on the device; with `size`, also a tree of them and their runners-up
        (read); with `static`, the runners-up of the first `static` steps (left on the device)."""
        if k <= 0:
            return Draft([])
        logits = self.catch_up(history)
        start = len(history)  # absolute position of the first draft token
        keys = None if params.greedy else position_keys(seed, mx.arange(start, start + k))
        copying = chaincopy.Round(self.copier, history, k, on=self.copying, greedy=params.greedy, own=self.own)
        tokens, side, own = [], [], []
        for i in range(k):
            if i:
                logits = self.seq.forward(tokens[-1].reshape(1))[-1]
            logits = self._fit(logits.astype(mx.float32))
            if params.greedy:
                top = mx.argmax(logits).astype(mx.int32)
                tok = copying.greedy(i, top, logits)
                if size:
                    side.append(runners_up(logits))
                elif i < static:
                    side.append(beside(tok, top, runner_up(logits, top).astype(mx.int32)))
            else:
                # The target's own race at this position, run on q (`sampling.race`): the draft
                # is what the target samples whenever q ranks the winner as p does.
                q = kernels.probabilities(logits, params, xtc_fires(params, keys[i : i + 1]))[None]
                if i < static:  # with the race's runner-up, the side leaf beside this step
                    winner, other = sample_race_two(q, keys[i : i + 1])[0]
                else:
                    winner = sample_race(q, keys[i : i + 1])[0]
                winner = winner.astype(mx.int32)
                own.append(winner)
                tok = copying.sampled(i, winner, q[0], winner)
                if i < static:
                    side.append(beside(tok, winner, other.astype(mx.int32)))
            mx.async_eval(tok)  # the device starts on this step while the host builds the next
            tokens.append(tok)
        drafts = mx.stack(tokens)
        if k > 1:
            self._drafted = (start, drafts[: k - 1])
        if size:
            return read_tree(tokens, side, size)
        copying.expect(start, own, drafts)
        if side:
            return Draft(mx.concatenate([drafts, mx.stack(side)]), parents=static_parents(k, len(side)))
        return Draft(drafts)
