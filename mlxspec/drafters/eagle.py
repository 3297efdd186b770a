"""Feature-level drafting (EAGLE, Li et al. 2024): a small head reads the target's own hidden states.

The head continues the target's last hidden state instead of re-deriving it from tokens:
entry j of its sequence is `fc(concat(embed(x[j+1]), f[j]))`, where f[j] is the target's
final hidden state at position j (after the final norm, what `backbone.split_model` returns)
and x[j+1] the token that followed; a llama decoder layer (EAGLE's one, or `num_layers` in
the config) with its own KV cache and a norm turn it into a prediction of f[j+1], whose
logits come from the target's own output head (`lm_head`, or the tied embedding) restricted
to a draft vocabulary (the target's most frequent tokens; tokens outside it are never proposed). Drafting k tokens runs the head
k times, each step on the feature the previous step predicted.

An EAGLE-3-style head reads the outputs of a few of the target's layers instead (a low, a
middle and a high one, `feature_layers` in its config, `backbone.tapped`): `fc_layers` turns
them into the feature of a real entry, while drafted entries still read the head's own
prediction. The target then keeps those outputs instead of its final hidden states.

Entries before the last committed token use the target's real features (read from the
target's `Sequence(keep_hidden=True)`); entries made while drafting hold predicted
features, so the next `propose` rolls them back and feeds the real ones instead. A head whose
config says `context: "target"` keeps none of that: it attends to the target's own last-layer
keys and values and keeps only the current round's entries (`context.py`).
Greedy drafts are the head's argmax; sampled drafts come with their q, so the verify
round's rejection rule keeps the output distribution the target's.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import mlx.core as mx

from .. import kernels
from ..backbone import LogitMap, logit_map, output_rows
from ..cache import make_cache
from ..sampling import SamplingParams, position_keys, sample_race, sample_race_two, xtc_fires
from ..sequence import shared_prefix
from . import chaincopy
from .context import ContextCache
from .base import Draft
from .eagle_files import head_window, load_head, save_head, target_vocab
from .eagle_head import EagleHead
from .model import power_of_two_chunks
from .ngram import NgramDrafter
from .sidetree import beside, read_tree, runner_up, runners_up, static_parents

# The head (`eagle_head.py`) and its files (`eagle_files.py`) are imported from here too.
__all__ = ["EagleDrafter", "EagleHead", "FEED_WHOLE", "head_window", "load_head", "save_head"]

# Most real entries fed in one head call: a round's catch-up (its accepted drafts and the
# target's token) is one call, not a power-of-two split; warm-up runs each size up to it.
FEED_WHOLE = 16

# One compiled call per greedy step: on a GPU a head this small runs at the host's pace, and
# every op costs the host time (as in `rounds._argmax_checked`). One per logit map (most
# targets have none), made at first use.
_TOPS = {}


def _tops(post: Optional[LogitMap]):
    """(full, mapped) compiled top-token calls whose logits go through `post` as the target's do."""
    if post not in _TOPS:
        def top_full(h: mx.array, w: mx.array):
            logits = (h @ w.T)[0].astype(mx.float32)
            logits = logits if post is None else post(logits)
            return logits, mx.argmax(logits)

        def top_mapped(h: mx.array, w: mx.array, ids: mx.array):
            logits, local = top_full(h, w)
            return logits, local, mx.take(ids, local)

        _TOPS[post] = (mx.compile(top_full), mx.compile(top_mapped))
    return _TOPS[post]


# -- the drafter --------------------------------------------------------------------------------

class EagleDrafter:
    """Drafts k tokens with an EAGLE head over the target's features, on the device.

    Args:
        head, draft_ids: from `load_head`.
        target: the engine's target `Sequence`, built with keep_hidden=True.
        max_kv_size, headroom: the head's cache, like the target's (a window wraps the same way).
        window: the head's own window (its config's, `head_window`), where it is narrower than
            the target's: it then attends to its latest `window` entries and the first 4 only.
    """

    name = "eagle"
    uses_model = True

    def __init__(self, head: EagleHead, draft_ids: Optional[mx.array], target, *, max_kv_size: Optional[int],
                 headroom: int, prefill_step: int = 512, copier: Optional[NgramDrafter] = None,
                 window: Optional[int] = None):
        if not target.keep_hidden:
            raise ValueError("[eagle] the target Sequence must keep hidden states (keep_hidden=True)")
        self.head, self.draft_ids, self.target = head, draft_ids, target
        self.embed = target.model.model.embed_tokens
        self.vocab = target_vocab(target.model)
        ids = draft_ids if draft_ids is not None else mx.arange(self.vocab)
        self.out_weight = output_rows(target.model, ids)  # (N, H): the target's own output rows
        self.race_ids = ids.astype(mx.uint32)  # what keys a sampled step's noise (`sampling.sample_race`)
        mx.eval(self.out_weight, self.race_ids)
        # The target's cap or scale after those rows (Gemma 2, Granite, Cohere): q is then the
        # law the target's own head would give these features, and a greedy chain's confidence
        # (`chaincopy.blend`) reads probabilities on the target's scale.
        self.post = logit_map(target.model)
        self._top_full, self._top_mapped = _tops(self.post)
        # The target's window bounds the features it keeps for the head; the head's own window only
        # its cache (a request may roll back past it, and the head then feeds again from them).
        self.target_window = max_kv_size
        if window is not None and not self.reads_target:  # the narrower of the two windows
            max_kv_size = window if max_kv_size is None else min(max_kv_size, window)
        self.max_kv_size, self.headroom, self.prefill_step = max_kv_size, headroom, prefill_step
        self.copying = True  # chains copy where the text repeats (`chaincopy`); the loop sets it per request
        # The engine's n-gram drafter, whose index of the history its lookup rounds keep anyway. Its
        # owner resets it: a copy depends on the current history alone, never on what it archived.
        self.copier = copier if copier is not None else NgramDrafter()
        self.reset()

    @property
    def reads_target(self) -> bool:
        """Whether the head attends to the target's last-layer keys (`context`), keeping only a round's entries."""
        return self.head.context == "target"

    def reset(self) -> None:
        # A head that reads the target's context builds its one-round cache in `_feed`.
        self.caches = [] if self.reads_target else make_cache(self.head, max_kv_size=self.max_kv_size,
                                                             headroom=self.headroom)
        self.covered: List[int] = []  # x[0..m]: the tokens whose m real entries the cache holds
        self.drafted = 0  # entries after them made while drafting (predicted features)
        # The history `covered` was taken from: the loop's only grows within a request, so
        # `covered` is still its prefix and need not be compared (a long history's compare and
        # copy would cost every round).
        self._history = None
        self.own = chaincopy.OwnRate()  # how often its sampled chains' own tokens stood (copying's guard)

    def arrays(self) -> list:
        """What it keeps between rounds, for `Engine.materialize` (its features stay with the target)."""
        return [c.state for c in self.caches]

    @property
    def kv_bytes(self) -> int:
        return sum(c.nbytes for c in self.caches)

    # -- one head step on rows: the building block (trees reuse it) ------------------------------
    def head_step(self, tokens: mx.array, features: mx.array, mask=None) -> mx.array:
        """Feed (B, S) tokens x[j+1] with (B, S, H) features f[j]; returns (B, S, H) predicted f[j+1]."""
        return self.head(self.embed(tokens.astype(mx.uint32)), features, self.caches, mask)

    def logits(self, features: mx.array) -> mx.array:
        """(..., H) features -> (..., N) logits over the draft vocabulary (float32 where the
        target maps its logits, else the features' dtype)."""
        logits = features @ self.out_weight.T
        return logits if self.post is None else self.post(logits.astype(mx.float32))

    # -- keeping the cache on the committed history ---------------------------------------------
    @property
    def entries(self) -> int:
        return max(len(self.covered) - 1, 0)

    def _trim(self, n: int) -> None:
        if n <= 0:
            return
        if all(c.can_trim(n) for c in self.caches):
            for c in self.caches:
                c.trim(n)
        else:
            self.caches = make_cache(self.head, max_kv_size=self.max_kv_size, headroom=self.headroom)
            self.covered = []

    def _sync(self, history: List[int]) -> int:
        """Roll back drafted and stale entries; returns how many real entries to keep (leaving >= 1 to feed)."""
        if self.reads_target:  # its entries last one round: `_feed` starts the next afresh
            self.drafted = 0
            return 0
        self._trim(self.drafted)
        self.drafted = 0
        limit = min(len(self.covered), len(history) - 1)  # entries need x[j+1]: at most len - 1 of them
        common = limit if history is self._history else min(shared_prefix(self.covered, history), limit)
        keep = max(min(common - 1, len(history) - 2), 0)  # feed at least the last entry again
        self._trim(self.entries - keep)
        del self.covered[keep + 1 if keep else 0:]
        return self.entries

    def _feed(self, history: List[int], upto: int, *, chunked: bool = False) -> Optional[mx.array]:
        """Feed real entries self.entries .. upto-1; returns the last predicted feature (1, H).

        Up to FEED_WHOLE entries in one head call (each call costs the host its ops, and a GPU
        runs a head this small at the host's pace; warm-up runs every such size), longer feeds
        in power-of-two chunks (few shapes to compile); `chunked` (prompts) first evaluates
        prefill_step-sized chunks one by one."""
        if self.reads_target:
            return self._feed_context(history, upto)
        start = self.entries
        if upto <= start:
            return None
        if start < self.target.first_hidden:
            # Behind a window the target keeps only the features the head's window can read
            # (below). A head that starts over (a rollback its window cannot undo) starts where
            # they begin: its window then lacks the first positions' keys, so its drafts may
            # differ slightly; the target's check keeps the output exact.
            start = self.target.first_hidden
            self.caches = make_cache(self.head, max_kv_size=self.max_kv_size, headroom=self.headroom)
            for c in self.caches:
                c.start_at(start)
            if upto <= start:
                return None
        feats = self.head.lift(self.target.hidden_since(start)[: upto - start])  # (n, H): f[start .. upto-1]
        toks = mx.array(history[start + 1 : upto + 1], dtype=mx.uint32)
        out, i = None, 0
        sizes = [self.prefill_step] * ((upto - start) // self.prefill_step) if chunked else []
        rest = (upto - start) - sum(sizes)
        if rest:  # none when the whole chunks covered it (a multiple of prefill_step)
            sizes += [rest] if rest <= FEED_WHOLE else power_of_two_chunks(rest)
        for n in sizes:
            out = self.head_step(toks[None, i : i + n], feats[None, i : i + n])
            if chunked:
                mx.eval([c.state for c in self.caches])
            i += n
        # The target's features stay with it (its rollbacks drop them): a later request that shares
        # a prefix rolls the head back to it and needs them again, without re-running the target.
        # Behind the target's window, only those a rollback can reach: the window plus the rollback room
        # (twice: the head's and the target's) bound them, so a long stream does not grow.
        # `covered` is a prefix of `history` here (`_sync` kept only what agrees): extend it
        del self.covered[upto + 1:]
        self.covered.extend(history[len(self.covered): upto + 1])
        self._history = history
        if self.target_window:
            self.target.release_hidden(upto - self.target_window - 2 * self.headroom)
        return out[0, -1:]

    def _feed_context(self, history: List[int], upto: int) -> Optional[mx.array]:
        """A head that reads the target's context feeds one real entry, the last: x[upto] (which the
        target has not run) with f[upto-1], at position upto, over the target's keys below it."""
        if upto < 1:
            return None
        feats = self.head.lift(self.target.hidden_since(upto - 1)[:1])
        self.caches = [ContextCache(self.target.caches[-1], end=upto, start=upto)]
        out = self.head_step(mx.array(history[upto : upto + 1], dtype=mx.uint32)[None], feats[None])
        if self.max_kv_size:  # it reads one feature a round, the last: older ones only after a rollback
            self.target.release_hidden(upto - 1 - 2 * self.headroom)
        return out[0, -1:]

    def teacher_forced(self, tokens: mx.array, features: mx.array) -> mx.array:
        """Every entry's first draft step at once, as if each were the round's first: (S,) tokens
        x[j+1] and (S, H) features f[j] -> (S, H) predicted f[j+1]. The target must hold
        positions 0..S-1 (a head that reads them sees those below its entry; an EAGLE head's own
        cache restarts from this sequence)."""
        self.reset()
        if not self.reads_target:
            return self.head_step(tokens[None], features[None])[0]
        c = ContextCache(self.target.caches[-1], end=tokens.shape[0], start=1)
        c.diagonal = True
        self.caches = [c]
        out = self.head_step(tokens[None], features[None])[0]
        self.reset()
        return out

    def prefill(self, history: List[int]) -> None:
        """Bring the cache up to the prompt, all but its last entry (the first `propose` feeds that)."""
        if self.reads_target:  # nothing to bring up: the target's cache is the context
            return
        self._sync(history)
        self._feed(history, len(history) - 2, chunked=True)

    # -- drafting -------------------------------------------------------------------------------
    def propose(self, history, k, params: SamplingParams, seed: int) -> Draft:
        return self._draft(history, k, params, seed)

    def propose_tree(self, history, depth, size, params: SamplingParams, seed: int) -> Draft:
        """The greedy chain of `depth` tokens plus side leaves from the head's runners-up, at
        most `size` nodes (`sidetree`); deterministic candidates, read on the host."""
        return self._draft(history, depth, SamplingParams(temperature=0.0), seed, size=size)

    def propose_static_tree(self, history, depth, leaves, params: SamplingParams, seed: int) -> Draft:
        """The chain of `depth` tokens plus the runner-up of each of its first `leaves` steps as
        side leaves (`sidetree.static_parents`): a fixed shape, so the tokens stay on the device,
        unread, like a chain's. Greedy: the head's second likeliest token; sampled: its race's
        runner-up with the target's noise (`sampling.sample_race_two`)."""
        return self._draft(history, depth, params, seed, static=leaves)

    def _draft(self, history, k, params: SamplingParams, seed: int, size: int = 0, static: int = 0) -> Draft:
        if k <= 0 or len(history) < 2:
            return Draft([])
        self._sync(history)
        h = self._feed(history, len(history) - 1)  # (1, H): predicted f[n-1], n = len(history)
        start = len(history)  # absolute position of the first draft token
        keys = None if params.greedy else position_keys(seed, mx.arange(start, start + k))
        copying = chaincopy.Round(self.copier, history, k, on=self.copying, greedy=params.greedy, own=self.own)
        tokens, side, own = [], [], []
        for i in range(k):
            if i:
                h = self.head_step(tokens[-1].reshape(1, 1), h[None])[0]
            if params.greedy:
                logits, local, top = self._top(h)
                tok = copying.greedy(i, top, logits)
                if size:
                    side.append(runners_up(logits))
                elif i < static:
                    side.append(self._leaf(tok, top, runner_up(logits, local)))
            else:
                # The target's own race at this position, run on q over the draft vocabulary
                # (the target's ids key the noise; tokens outside it have q = 0 and never win
                # it, though a copy may propose them).
                q = kernels.probabilities(self.logits(h[0]).astype(mx.float32), params,  # (N,)
                                          xtc_fires(params, keys[i : i + 1]), self.race_ids)
                if i < static:  # with the race's runner-up, the side leaf beside this step
                    local, other = sample_race_two(q[None], keys[i : i + 1], self.race_ids)[0]
                else:
                    local = sample_race(q[None], keys[i : i + 1], self.race_ids)[0]
                tok = (local if self.draft_ids is None else mx.take(self.draft_ids, local)).astype(mx.int32)
                own.append(tok)
                winner = tok
                tok = copying.sampled(i, winner, q, local)
                if i < static:
                    side.append(self._leaf(tok, winner, other))
            tok = tok.astype(mx.int32)
            mx.async_eval(tok)  # the device starts on this step while the host builds the next
            tokens.append(tok)
        self.drafted = k - 1
        if size:
            return read_tree(tokens, side, size, ids_map=self.draft_ids)
        chain = mx.stack(tokens)
        copying.expect(start, own, chain)
        if side:  # the fixed-shape tree, still on the device
            return Draft(mx.concatenate([chain, mx.stack(side).astype(mx.int32)]),
                         parents=static_parents(k, len(side)))
        return Draft(chain)

    def _leaf(self, tok: mx.array, own: mx.array, other: mx.array) -> mx.array:
        """A fixed-shape tree's side leaf beside a chain step: the head's runner-up there (`other`,
        in the draft vocabulary), or its own token `own` where the chain took a copy's instead."""
        return beside(tok, own, other if self.draft_ids is None else mx.take(self.draft_ids, other))

    def _top(self, h: mx.array) -> Tuple[mx.array, mx.array, mx.array]:
        """(1, H) feature -> ((N,) float32 logits, their argmax, its id in the target's vocabulary)."""
        if self.draft_ids is None:
            logits, local = self._top_full(h, self.out_weight)
            return logits, local, local
        return self._top_mapped(h, self.out_weight, self.draft_ids)

    def _full(self, logits: mx.array) -> mx.array:
        """Draft-vocabulary logits (..., N) -> target-vocabulary logits (..., V), -inf outside."""
        if self.draft_ids is None:
            return logits
        full = mx.full((*logits.shape[:-1], self.vocab), -mx.inf, dtype=logits.dtype)
        ids = mx.broadcast_to(self.draft_ids, logits.shape)
        return mx.put_along_axis(full, ids, logits, axis=-1)
