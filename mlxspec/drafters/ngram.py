"""Prompt-lookup drafting: no model, proposes what followed the context's tail where it occurred before.

A chain continues the most recent earlier occurrence of the last n tokens (n = max_n..1) in
the current history, extended periodically where it reaches the end of the history. A tree
(SuffixDecoding-style) merges the continuations of *every* occurrence of that suffix, in
the history and in earlier histories (previous requests, earlier turns that a re-rendered
chat template no longer extends), into a trie: the chain is its first branch and the other
branches come with their frequencies, how many occurrences continued that way.

A request may bring a prediction of its answer (`predict`, OpenAI's Predicted Outputs): its
chains then continue the prediction where the answer's tail matches it (its start, before the
answer has a token), unless the history's own match looks better (`_predicted_first`). Among
the prediction's occurrences of the tail, the one that matches furthest back wins, then the
one nearest after the last used: an edited file is written in order.
"""

from __future__ import annotations

import bisect
from typing import Callable, Dict, List, Optional, Tuple

from .base import Draft, depth_first

SEP = -1  # between histories in the corpus: no n-gram or continuation crosses it
MAX_CORPUS = 1 << 17  # tokens of earlier histories kept (the oldest are dropped past this)
MAX_OCCURRENCES = 16  # most recent occurrences of a suffix merged into a tree
SIDE_DEPTH = 8  # levels of the other occurrences' continuations merged (the chain goes deeper)
# A max_n match is labelled by how far it really extends back: along the bench suite's greedy
# answers, chains from matches of exactly 3 tokens had their first token right 63 % of the time
# (2.5 of 8 tokens on average), of 4-7 tokens 75 % (3.6), of 8 or more 94 % (5.8). Copying
# (an edit of the prompt's code) gives long matches; a phrase that recurs, short ones.
EXTENT_KINDS = (8, 4)  # extents that get kinds of their own, longest first
PREDICTED_REACH = 16  # how far back a match in the prediction is compared with the answer
PREDICTED_NEAR = 32  # occurrences of the tail in the prediction weighed, those nearest the last used


class NgramDrafter:
    """Chains and trees from earlier occurrences of the history's last n tokens.

    The index maps each n-gram to the ends of its occurrences (oldest first) in a corpus of
    earlier histories followed by the current one; it is extended incrementally as the
    history grows. A history that does not extend the current one starts a new one (the old
    stays in the corpus for trees).
    """

    name = "ngram"
    uses_model = False

    def __init__(self, max_n: int = 3, min_n: int = 1):
        self.max_n, self.min_n = max_n, min_n
        # kind -> expected acceptance (the engine's cost model for this drafter): where both the
        # prediction and the history match, the kind that has been accepted more drafts
        self.judge: Optional[Callable[[str], float]] = None
        self.reset()

    def reset(self) -> None:
        self.predict(None)
        self._corpus: List[int] = []  # earlier histories, each followed by SEP, then the current one
        self._base = 0  # where the current history starts in the corpus
        self._index: Dict[Tuple[int, ...], List[int]] = {}
        self._indexed = 0  # n-grams ending at corpus positions < _indexed are in the index
        self._history = None  # the history last indexed: the loop's only grows, so it need not be compared

    def forget_beyond(self, prompt: List[int]) -> bool:
        """Drop the current history's tokens past what it shares with `prompt` (the next request's)
        from the corpus and the index, as if they had never been seen: turns taken back from a
        conversation, whose answers drafts would otherwise copy. Returns whether it dropped any."""
        held = self._corpus[self._base:]
        shared = next((i for i, (a, b) in enumerate(zip(held, prompt)) if a != b), min(len(held), len(prompt)))
        if shared == len(held):
            return False
        cut = self._base + shared
        del self._corpus[cut:]
        for key in list(self._index):
            ends = self._index[key]
            while ends and ends[-1] >= cut:  # (each list is in corpus order: the dropped ends are last)
                ends.pop()
            if not ends:
                del self._index[key]
        self._indexed = min(self._indexed, cut - 1)
        return True

    def predict(self, tokens: Optional[List[int]], start: int = 0) -> None:
        """This request's predicted answer (token ids), or None; `start`: where the answer starts
        in the histories to come (the prompt's length)."""
        self._predicted = list(tokens) if tokens else None
        self._answer_start, self._predicted_at = start, 0
        self._predicted_index: Dict[Tuple[int, ...], List[int]] = {}
        for end in range(1, len(self._predicted or ())):  # n-grams followed by a token, as the history's
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self._predicted_index.setdefault(tuple(self._predicted[end - n:end]), []).append(end)

    def _from_prediction(self, history) -> Optional[Tuple[int, int]]:
        """(extent, end): the prediction's best occurrence of the history's tail, `extent` tokens
        of it matching (at most PREDICTED_REACH), continued from `end`; (0, 0) before the answer
        has a token; None without a prediction or a match."""
        p = self._predicted
        if p is None:
            return None
        if len(history) <= self._answer_start:
            return 0, 0
        for n in range(self.max_n, self.min_n - 1, -1):
            ends = self._predicted_index.get(tuple(history[-n:])) if len(history) >= n else None
            if not ends:
                continue
            i = bisect.bisect_left(ends, self._predicted_at)
            best = None
            for end in ends[max(0, i - PREDICTED_NEAR // 4): i + PREDICTED_NEAR]:
                extent = _reach(p, end, history, n, PREDICTED_REACH)
                key = (extent, end >= self._predicted_at, -abs(end - self._predicted_at))
                if best is None or key > best[0]:
                    best = key, end
            return best[0][0], best[1]
        return None

    def _predicted_chain(self, end: int, k: int) -> List[int]:
        self._predicted_at = end
        return self._predicted[end:end + k]

    @staticmethod
    def _predicted_kind(extent: int) -> str:
        """"p0" at the answer's start, "p1".."p3", "p4" (4-7 tokens match), "p8" (8 or more)."""
        return "p" + str(_bucket(extent, extent))

    def _extend(self, history: List[int]) -> None:
        n_old = len(self._corpus) - self._base
        grown = history is self._history and len(history) >= n_old
        if not grown and history[:n_old] != self._corpus[self._base :]:
            if len(self._corpus) + len(history) > MAX_CORPUS:
                self.reset()
            else:  # keep the old history for trees; the new one starts after a separator
                self._corpus.append(SEP)
                self._indexed = len(self._corpus)
                self._base = len(self._corpus)
            n_old = 0
        self._corpus.extend(history[n_old:])  # only the new tokens: this runs every round
        self._history = history
        # Index n-grams ending strictly before the last token: the tail itself must not match itself.
        end_limit = len(self._corpus) - 1
        c = self._corpus
        for end in range(max(self._indexed + 1, self._base + 1), end_limit + 1):
            for n in range(self.min_n, self.max_n + 1):
                if end - n >= self._base:
                    self._index.setdefault(tuple(c[end - n : end]), []).append(end)
        self._indexed = max(self._indexed, end_limit)

    def _match(self, history) -> Optional[Tuple[int, int, bool]]:
        """(n, end of the latest occurrence, in the current history?) for the longest suffix seen before."""
        archived = None
        for n in range(self.max_n, self.min_n - 1, -1):
            if len(history) < n + 1:
                continue
            ends = self._index.get(tuple(history[-n:]))
            if ends:
                if ends[-1] >= self._base:
                    return n, ends[-1], True
                archived = archived or (n, ends[-1], False)
        return archived

    def _extent(self, history, n: int, end: int, top: int = EXTENT_KINDS[0]) -> int:
        """How far back (at most `top`) the occurrence ending at `end` matches the history's tail,
        given that its last n tokens do."""
        # History tokens are never SEP, so the walk stops at the start of the occurrence's history.
        return _reach(self._corpus, end, history, n, top) if n == self.max_n else n

    def _kind(self, n: int, extent: int, current: bool) -> str:
        """"n{n}" ("a{n}" for an earlier history); a max_n match that extends further back
        (`extent`, `_extent`'s) is "n4" (4-7 tokens) or "n8" (8 or more): its continuation is
        likelier to hold."""
        return ("n" if current else "a") + str(_bucket(extent, n) if n == self.max_n else n)

    def _current(self, history) -> Optional[Tuple[int, int]]:
        """Index the history, then (n, end) of its longest tail seen earlier in itself (`_match`),
        or None."""
        self._extend(history)
        m = self._match(history)
        return m[:2] if m is not None and m[2] else None

    def copy(self, history, k: int, top: int = EXTENT_KINDS[0]) -> Tuple[int, List[int]]:
        """(match length, continuation): how many tokens (at most `top`) of the history's tail
        recur earlier in it, and the k tokens that followed there (`propose`'s chain); (0, [])
        where nothing recurs. A model drafter's chain weighs its own steps against this copy."""
        m = self._current(history) if k > 0 and len(history) >= 2 else None
        predicted = self._predicted_first(history, m) if k > 0 else None
        if predicted is not None:
            return min(predicted[0], top), self._predicted_chain(predicted[1], k)
        if m is None:
            return 0, []
        n, end = m
        return self._extent(history, n, end, top), self._chain(end, k)

    def propose(self, history, k, params=None, seed=0) -> Draft:
        m = self._current(history) if k > 0 and len(history) >= 2 else None
        predicted = self._predicted_first(history, m) if k > 0 else None
        if predicted is not None:
            return Draft(self._predicted_chain(predicted[1], k), kind=self._predicted_kind(predicted[0]))
        if m is None:
            return Draft([])
        n, end = m
        return Draft(self._chain(end, k), kind=self._kind(n, self._extent(history, n, end), True))

    def _predicted_first(self, history, m: Optional[Tuple[int, int]]) -> Optional[Tuple[int, int]]:
        """The prediction's (extent, end) when it has a token to propose there, unless the history's
        own match `m` ((n, end) or None) looks better: its kind has been accepted more (`judge`),
        or as much and it matches further back (text that repeats itself, a loop, may follow
        itself better than a prediction; an unrelated prediction matches short). At the answer's
        start, the prediction's start."""
        predicted = self._from_prediction(history)
        if predicted is None or predicted[1] >= len(self._predicted):
            return None
        if m is None or not predicted[0]:
            return predicted
        extent = self._extent(history, *m, top=PREDICTED_REACH)
        if self.judge is None:
            return predicted if predicted[0] >= extent else None
        ours = (self.judge(self._predicted_kind(predicted[0])), predicted[0])
        theirs = (self.judge(self._kind(m[0], extent, True)), extent)
        return predicted if ours >= theirs else None

    def _chain(self, end: int, k: int) -> List[int]:
        # What followed the match; past the end of the history the text repeats with period
        # len - end (a loop, a table row), so the proposal continues the cycle.
        c, stop = self._corpus, len(self._corpus)
        period = stop - end
        if end >= self._base:
            return [c[end + i % period] for i in range(k)]
        out = []
        for i in range(k):  # an earlier history: its continuation up to its end
            if end + i >= stop or c[end + i] == SEP:
                break
            out.append(c[end + i])
        return out

    def propose_tree(self, history, depth: int, size: int, params=None, seed=0) -> Draft:
        """A tree of at most `size` nodes and `depth` levels, depth-first with the chain first.

        Its first branch is what `propose` would give (a chain of `depth`), or the latest
        continuation in an earlier history when the current one has no match. The other
        branches are the continuations of other occurrences, the most frequent first; each
        node's score is the fraction of the occurrences below its parent that continue
        through it (`Draft.scores`). Kind: `_kind`'s ("n{n}", "n4", "n8"; "a..." for an earlier
        history only). With a prediction that wins (`_predicted_first`), its chain is the first
        branch and every occurrence's continuation a side one; its kind "p...".
        """
        if depth <= 0 or size <= 0 or len(history) < 2:
            return Draft([])
        self._extend(history)
        m = self._match(history)
        predicted = self._predicted_first(history, m[:2] if m is not None and m[2] else None)
        if predicted is not None:  # the prediction's chain first, every occurrence's beside it
            chain, kind, end = self._predicted_chain(predicted[1], depth), self._predicted_kind(predicted[0]), None
        elif m is None:
            return Draft([])
        else:
            n, end, current = m
            chain, kind = self._chain(end, depth), self._kind(n, self._extent(history, n, end), current)
        ends = self._index[tuple(history[-m[0]:])][-MAX_OCCURRENCES:] if m is not None else []
        # A trie of continuations: node -> {token: child}, with how many occurrences pass through.
        trie = {"count": 0, "kids": {}}
        for e in ends:
            if e == end:
                continue
            node = trie
            for i in range(min(depth, SIDE_DEPTH)):
                if e + i >= len(self._corpus) or self._corpus[e + i] == SEP:
                    break
                tok = self._corpus[e + i]
                node = node["kids"].setdefault(tok, {"count": 0, "kids": {}})
                node["count"] += 1
        return _flatten(chain, trie, size, kind=kind)


def _reach(seq: List[int], end: int, history, n: int, top: int) -> int:
    """How far back (at most `top`) `seq[:end]` matches the history's tail, given that its last n
    tokens do."""
    extent = n
    while extent < top and end - extent > 0 and extent < len(history) and seq[end - extent - 1] == history[-extent - 1]:
        extent += 1
    return extent


def _bucket(extent: int, below: int) -> int:
    """The kind a match of `extent` tokens counts as: 8 (8 or more), 4 (4-7), else `below`."""
    return next((e for e in EXTENT_KINDS if extent >= e), below)


def _flatten(chain: List[int], trie: dict, size: int, *, kind: str) -> Draft:
    """The chain, then the trie's other branches best-first by frequency, emitted depth-first."""
    tokens, parents, scores = list(chain), list(range(-1, len(chain) - 1)), [1.0] * len(chain)
    # Walk the trie along the chain: at chain node d the trie's other kids are side branches.
    frontier = []  # (share of all occurrences, share under its parent, parent index, trie node, token)
    everyone = sum(k["count"] for k in trie["kids"].values()) or 1
    node, parent = trie, -1
    for d in range(len(chain) + 1):
        total = sum(k["count"] for k in node["kids"].values()) or 1
        for tok, kid in node["kids"].items():
            if d < len(chain) and tok == chain[d]:
                continue
            frontier.append((kid["count"] / everyone, kid["count"] / total, parent, kid, tok))
        if d == len(chain) or chain[d] not in node["kids"]:
            break
        node, parent = node["kids"][chain[d]], d
    while frontier and len(tokens) < size:
        frontier.sort(key=lambda f: f[0])
        _, cond, par, kid, tok = frontier.pop()
        tokens.append(tok)
        parents.append(par)
        scores.append(cond)
        i = len(tokens) - 1
        total = sum(k["count"] for k in kid["kids"].values()) or 1
        for t, k in kid["kids"].items():
            frontier.append((k["count"] / everyone, k["count"] / total, i, k, t))
    return depth_first(Draft(tokens[:size], kind=kind, parents=parents[:size], scores=scores[:size]))
