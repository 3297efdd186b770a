"""Parked conversations: what a new request would throw away, kept for when its owner comes back.

The engine's caches hold one history, and a request rolls them back to the prefix it shares
with it. A client that interleaves conversations (an editor's chat beside its title or
autocomplete requests, an agent's sub-tasks) would then prefill each conversation again at
every switch. With `size` > 0, a request that would discard at least MIN_PARK cached tokens,
and more than half of them, first parks a copy of them (the target's caches and features,
and the draft model's), and a request that shares a longer prefix with a parked history
than with the live one swaps that history in (the live one is parked in its place). At most `size` histories are parked,
holding at most `max_bytes` together when that is set; the least recently used leave first,
and one that is a prefix of another is dropped.

Only which tokens get prefilled changes, never what any pass computes: a parked state is
the caches exactly as those passes left them. So greedy outputs are the same with or without
it, and sampled ones are drawn from the same distribution (the same sample where the drafts
are the same: a feature head that starts over behind a window may draft otherwise).
"""

from __future__ import annotations

from typing import Dict, List, Optional

from .sequence import SeqState, Sequence, shared_prefix

MIN_PARK = 64  # cached tokens a request must be about to discard (or a history must hold) to be worth parking


class PromptCache:
    """Up to `size` parked histories for one engine (0: none, the engine's caches only), of at
    most `max_bytes` together (None: no bound but `size`)."""

    def __init__(self, size: int = 0, max_bytes: Optional[int] = None):
        self.size, self.max_bytes = size, max_bytes
        self.parked: List[Dict[str, SeqState]] = []  # least recently used first
        self.evicted = 0  # histories dropped to make room (`size` or `max_bytes`): a server's metrics say it

    def clear(self) -> None:
        self.parked = []

    @property
    def nbytes(self) -> int:
        """Memory the parked histories hold."""
        return sum(state.nbytes for slot in self.parked for state in slot.values())

    def recall(self, engine, ids: List[int]) -> None:
        """Before a request for `ids`: swap in the parked history sharing most of it, if it shares
        more than the live caches, and park what the request would otherwise discard."""
        target = engine.target
        if self.size <= 0:  # nothing is ever parked
            return
        seqs = _sequences(engine)
        for seq in seqs.values():
            if seq.dirty:  # half-written by an interrupted pass: never kept (its sync would rebuild it too)
                seq.reset()
        live = target.common_prefix(ids)
        shared = [shared_prefix(slot["target"].tokens, ids) for slot in self.parked]
        best = max(range(len(shared)), key=shared.__getitem__, default=None)
        if best is not None and shared[best] > live:
            slot = self.parked.pop(best)
            self.park({name: seq.take_state() for name, seq in seqs.items()})
            for name, seq in seqs.items():
                if name in slot:
                    seq.put_state(slot[name])
            _forget_features(engine)  # a feature head's entries were made from the other history
            live = shared[best]
        # Only when the request keeps less than half of it: another conversation, not the same one
        # with its last answer regenerated or a late turn edited (those copies would push whole
        # conversations out).
        if len(target.tokens) - live >= max(MIN_PARK, len(target.tokens) / 2):
            self.park({name: seq.copy_state() for name, seq in seqs.items()})

    def set_aside(self, engine) -> None:
        """Before a request that computes its prompt whole (`prompt_logprobs`): park the live
        histories as they are, none taken back, and start the target's caches empty."""
        if self.size > 0 and not engine.target.dirty:
            self.park({name: seq.take_state() for name, seq in _sequences(engine).items()})
        engine.target.reset()
        _forget_features(engine)  # a feature head's entries were made from that history

    def park(self, slot: Dict[str, SeqState]) -> None:
        """Keep `slot` (a history's states by sequence name), the most recently used."""
        tokens = slot["target"].tokens
        if len(tokens) < MIN_PARK:
            return
        # a parked history that is a prefix of this one is covered by it
        self.parked = [s for s in self.parked if shared_prefix(s["target"].tokens, tokens) < len(s["target"].tokens)]
        self.parked.append(slot)
        over = max(0, len(self.parked) - self.size)
        del self.parked[:over]
        self.evicted += over
        while self.max_bytes is not None and self.parked and self.nbytes > self.max_bytes:
            del self.parked[0]
            self.evicted += 1


def _forget_features(engine) -> None:
    """Reset the drafters whose entries come from the target's history (a feature head's)."""
    for d in engine.drafters.values():
        if getattr(d, "target", None) is engine.target:
            d.reset()


def _sequences(engine) -> Dict[str, Sequence]:
    """The sequences that hold a history: the target's, and the draft model's when there is one."""
    seqs = {"target": engine.target}
    model = engine.drafters.get("model")
    if model is not None:
        model.settle()  # its last round's drafts written into its token list
        seqs["model"] = model.seq
    return seqs

