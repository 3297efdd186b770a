"""How much of a proposed tree to verify, and what a verified tree teaches the cost model.

Each node's acceptance probability ("reach") is estimated from per-kind rates the cost model
learns: a node that is its parent's first child (a chain step) is accepted with probability
alpha times its drafter score; a later sibling only when the first child failed and a side
branch then matched, with a separately learned rate beta, shared by the side siblings in
proportion to their scores. The chain's estimates are exactly the chain's own (alpha^d), so
a tree only adds nodes whose expected tokens pay for the longer pass: on a device where V(j)
grows steeply the plan stays a chain (or plain decoding).
"""

from __future__ import annotations

import heapq
from typing import List

from .costmodel import CostModel
from .drafters import Draft
from .drafters.sidetree import RUNNERS_UP

SIDE_PRIOR = (1.0, 3.0)  # Beta prior of beta: a side branch matches a quarter of the time until measured


def side_kind(kind: str) -> str:
    return kind + "/side"


def static_kind(kind: str) -> str:
    """A fixed-shape tree's runner-up leaves (`sidetree.static_parents`) match at their own rate:
    they are every step's second choice, not the leaves a read tree picks by probability."""
    return kind + "/static"


def reach(draft: Draft, cost: CostModel) -> List[float]:
    """Estimated acceptance probability of every node of a tree draft (parents before children)."""
    alpha = min(cost.alpha_of(draft.kind), 0.999)
    beta = cost.alpha_of(side_kind(draft.kind), prior=SIDE_PRIOR)
    scores = draft.scores or [1.0] * len(draft)
    first = {}  # parent -> its first child
    out = []
    for i, par in enumerate(draft.parents):
        base = 1.0 if par < 0 else out[par]
        if first.setdefault(par, i) == i:
            out.append(base * alpha * scores[i])
        else:
            out.append(base * (1.0 - alpha) * beta * scores[i])
    return out


def plan(draft: Draft, cost: CostModel, cap: int) -> Draft:
    """The best part of a tree draft to verify (at most `cap` nodes): a tree, a chain, or empty."""
    if not len(draft) or cap <= 0:
        return Draft([], kind=draft.kind)
    if draft.parents is None:
        return Draft(draft.tokens[: cost.choose(min(cap, len(draft)), kind=draft.kind)], kind=draft.kind)
    r = reach(draft, cost)
    order = best_first(draft.parents, r)[:cap]
    m = cost.choose_nodes([r[i] for i in order])
    return subtree(draft, sorted(order[:m]))


def widen(draft: Draft, cost: CostModel, cap: int) -> Draft:
    """A model drafter's tree (`drafters.sidetree`): its chain, already drafted at the length the
    cost model chose, plus the side leaves whose rows pay for a longer pass (best reach first;
    at most `cap` nodes in all, so a chain at the cost model's longest still gets leaves where
    rows are cheap). The chain alone when none pay."""
    if draft.parents is None:
        return draft
    k = 0
    while k < len(draft) and draft.parents[k] == k - 1:
        k += 1
    r = reach(draft, cost)
    sides = sorted(range(k, len(draft)), key=lambda i: -r[i])[: max(cap - k, 0)]
    m = cost.choose_widening(k, 1.0 + sum(r[:k]), [r[i] for i in sides])
    return subtree(draft, list(range(k)) + sorted(sides[:m]))


def could_widen(cost: CostModel, k: int, cap: int, kind: str = "") -> bool:
    """Whether side leaves could pay beside a chain of k even at best (every leaf as likely as a
    side branch at the root ever is), reading the drafts on the host included. Otherwise the
    model drafter keeps its chain on the device, unread, and the round is enqueued without
    waiting for the drafts."""
    alpha = min(cost.alpha_of(kind), 0.999)
    best = (1.0 - alpha) * cost.alpha_of(side_kind(kind), prior=SIDE_PRIOR)
    n = min(cap - k, RUNNERS_UP * k)
    return n > 0 and cost.choose_widening(k, cost.expected_tokens(k, kind), [best] * n,
                                          extra=cost.read_seconds()) > 0


def static_leaves(cost: CostModel, k: int, cap: int, kind: str = "") -> int:
    """How many of a chain of k's first steps should carry their runner-up as a side leaf in a
    fixed-shape tree (at most `cap` nodes in all); 0: the chain alone. Nothing is read, so the
    leaves pay for their rows and for what a tree's pass costs beyond a chain's of its length
    (`CostModel.static_seconds`). The leaf beside step d is tried when its parent was accepted
    and step d was not, and then matches at the learned static rate."""
    m = min(k, cap - k)
    if m <= 0:
        return 0
    alpha = min(cost.alpha_of(kind), 0.999)
    beta = cost.alpha_of(static_kind(kind), prior=SIDE_PRIOR)
    reach = [alpha ** d * (1.0 - alpha) * beta for d in range(m)]
    return cost.choose_widening(k, cost.expected_tokens(k, kind), reach, extra=cost.static_seconds())


def best_first(parents: List[int], r: List[float]) -> List[int]:
    """Nodes by decreasing reach, each after its parent and its earlier siblings, so that every
    prefix is a tree in which a first child stays a first child."""
    kids = {}
    for i, par in enumerate(parents):
        kids.setdefault(par, []).append(i)
    nxt_sibling = {}
    for sibs in kids.values():
        for a, b in zip(sibs, sibs[1:]):
            nxt_sibling[a] = b
    ready = [(-r[kids[-1][0]], kids[-1][0])] if -1 in kids else []
    order = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(i)
        for j in (kids.get(i, [None])[0], nxt_sibling.get(i)):
            if j is not None:
                heapq.heappush(ready, (-r[j], j))
    return order


def subtree(draft: Draft, keep: List[int]) -> Draft:
    """The nodes `keep` (ascending, closed under parents) as a draft; a chain when it has no branch."""
    new = {old: j for j, old in enumerate(keep)}
    parents = [new[draft.parents[i]] if draft.parents[i] >= 0 else -1 for i in keep]
    tokens = [draft.tokens[i] for i in keep]
    if parents == list(range(-1, len(keep) - 1)):
        return Draft(tokens, kind=draft.kind)
    scores = [draft.scores[i] for i in keep] if draft.scores else None
    return Draft(tokens, kind=draft.kind, parents=parents, scores=scores)


def observe(cost: CostModel, draft: Draft, path: List[int], static: bool = False) -> None:
    """Learn alpha and beta from the walk through a verified tree (`path`: accepted nodes);
    `static`: a fixed-shape tree's (its side leaves' rate is learned apart, `static_kind`)."""
    sides = static_kind(draft.kind) if static else side_kind(draft.kind)
    kids = {}
    for i, par in enumerate(draft.parents):
        kids.setdefault(par, []).append(i)
    a_ok = a_fail = 0
    at = -1
    for step in range(len(path) + 1):
        children = kids.get(at, [])
        nxt = path[step] if step < len(path) else None
        if children:
            if nxt == children[0]:
                a_ok += 1
            else:
                a_fail += 1
                if len(children) > 1:
                    cost.observe_acceptance(1, float(nxt is not None), sides, prior=SIDE_PRIOR)
        if nxt is None:
            break
        at = nxt
    cost.observe_acceptance(a_ok + a_fail, a_ok, draft.kind)
