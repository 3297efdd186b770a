"""The next pass of one request: plain, a chain or a tree, from which drafter, decided on what
the host knows.

Whether the next pass may be a pipelined plain step (`mlxspec.loop`) is decided one token
behind (`decide_early`): a model drafter asks its cost model; a free drafter (n-gram) looks up a
proposal on the history so far, whose first token is its guess of the token in flight. If
drafting would pay, the loop reads first and drafts on the exact history (`plan`, the one bubble
a verify round cannot avoid); if not, the guess is checked when the token arrives, a free
acceptance probe.

A model drafter (a draft model, a feature head) has a free companion, prompt lookup (the
n-gram drafter): where the text repeats itself (code edits, quotes, lists) a lookup drafts
better than a small model and costs no drafting. Each round both are judged by their own
cost models and the faster expected one drafts; each pass then teaches its own drafter's
model. Which one drafts depends only on the history and past rounds, so greedy output and
the sampled distribution stay the target's.

A step is (k, draft or None, shadow, source drafter): k is the draft's length (a tree's node
count); a model drafter's draft is made when the pass is enqueued (`draft`); the shadow is a
guess (token, kind, drafter) of the pass's first token, checked for free when it is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import mlx.core as mx

from . import treeplan
from .drafters import Draft
from .prompts import MAX_DRAFT
from .sampling import SamplingParams
from .tree import depths


@dataclass
class Drafted:
    """What a pass verifies, made on the exact history when it is enqueued."""
    draft: Draft
    mask: Optional[mx.array]  # the grammar's masks of its rows, if a grammar constrains the request
    added: object  # what its rows add to the logits (`Planner.shaping`)
    drafted: Optional[int] = None  # a model drafter's steps, when fewer than the draft (a tree's side leaves)
    read_first: bool = False  # a tree whose drafts the host read before the pass
    static: bool = False  # a fixed-shape tree, drafted on the device
    forced: bool = False  # the grammar's forced tokens, not the drafter's


class Planner:
    """Plans the passes of one request on `engine` over `hist` (the committed history, which the
    loop extends in place). `tree`: most nodes of a tree round (0: chains only); `companion`: a
    model drafter's free companion (None: the drafter drafts every round it drafts); `longest`:
    the most drafts a round the cost model sizes may verify. `constraint`, `penalties`, `bias`,
    `ban` and `min_tokens` shape the rows as `mlxspec.loop._generate` documents."""

    def __init__(self, engine, ids: List[int], hist: List[int], params: SamplingParams, seed: int, *, name: str,
                 k_fixed: Optional[int], tree: int, companion: Optional[str], longest: int, max_tokens: int,
                 constraint=None, penalties=None, bias: Optional[mx.array] = None, ban: Optional[mx.array] = None,
                 min_tokens: int = 0, static_trees: bool = True):
        self.engine, self.target = engine, engine.target
        self.prompt_len, self.hist, self.params, self.seed = len(ids), hist, params, seed
        self.name, self.drafter, self.cost = name, engine.drafters[name], engine.costs[name]
        self.k_fixed, self.companion, self.longest = k_fixed, companion, longest
        self.max_tokens, self.context = max_tokens, engine.context
        self.constraint, self.penalties = constraint, penalties
        self.bias, self.ban, self.min_tokens = bias, ban, min_tokens
        # (each row of a tree would need its own path's grammar state, penalties or mirostat threshold)
        self.tree = min(tree, longest) if constraint is None and penalties is None and not params.mirostat_on else 0
        # A model drafter's tree: its chain plus runners-up (`drafters.sidetree`). Fixed-shape trees at
        # any temperature (sampled: its race's winners, each step's runner-up beside them,
        # `sampling.sample_race_two`); trees whose leaves are picked by probability, greedy only.
        from_model = bool(self.tree) and self.drafter.uses_model and k_fixed is None
        self.model_trees = from_model and params.greedy and hasattr(self.drafter, "propose_tree")
        self.static_trees = from_model and static_trees and hasattr(self.drafter, "propose_static_tree")

    def room(self) -> int:
        """Tokens the request may still commit: max_tokens, and the model's context."""
        r = self.max_tokens - (len(self.hist) - self.prompt_len)
        return r if self.context is None else min(r, self.context - len(self.hist))

    def before_switch(self, first: int) -> int:
        """Drafts a round that feeds from position `first` may carry without crossing the point
        where the target's KV cache turns quantized (`mlxspec.kvquant`): a tree's rows, unlike a
        chain's, cannot be fed as two passes there."""
        r = self.target.pass_room(first)
        return MAX_DRAFT if r is None else r - 1

    def decide_early(self):
        """Before reading a plain step: (chain a plain step?, guess of its token, a model drafter's k).

        Judged on the chain alone (a tree adds branches to it): when the chain would not pay, a
        tree on a device where it could is not tried either, which keeps this early call cheap.
        A guess is (token, kind, the drafter that made it)."""
        name, k_fixed, hist = self.name, self.k_fixed, self.hist
        if name == "none" or k_fixed == 0:
            return True, None, None
        if k_fixed is not None:
            return False, None, None
        k_cap = min(self.room() - 2, self.longest, self.before_switch(len(hist)))  # the round after the pending step
        src, probe = name, None
        if self.drafter.uses_model:
            k, probe = self.probe_instead(self.cost.choose(k_cap))
            if k or self.companion is None:
                return k == 0, probe, k
            src = self.companion  # the model would not draft: would a lookup?
        proposal = self.engine.drafters[src].propose(hist, k_cap + 1, self.params, self.seed)
        model_k = 0 if src != name else None
        if not len(proposal):
            return True, probe, model_k
        k = self.engine.costs[src].choose(len(proposal) - 1, kind=proposal.kind) if len(proposal) > 1 else 0
        return k == 0, probe or ((proposal.tokens[0], proposal.kind, src) if k == 0 else None), model_k

    def probe_instead(self, k: int) -> tuple:
        """(k, guess) for a model drafter's chosen k. When the cost model only wants a probe and
        decoding is greedy, the probe verifies nothing: the drafter's first token is a guess of
        the token the next pass gives, checked when that arrives (what a k = 1 round would
        learn, for one drafting step), and k becomes 0. Sampled rounds keep k = 1 probes. A
        sampled guess would be as informative (the drafter's race winner is the target's sample
        exactly when a k = 1 round would accept it, `sampling.race`), but measured slower: on a
        CPU at T = 0.7, three bench runs each way, the draft model made 0.92-0.96x plain decoding
        with guesses against 0.96-1.03x with k = 1 probes, which keep a token when they hold."""
        if not (k and self.cost.probing and self.params.greedy):
            return k, None
        d = self.drafter.propose(self.hist, 1, self.params, self.seed)
        return (0, (d.tokens[0], "", self.name)) if len(d) else (k, None)

    def free_plan(self, src: str, k_cap: int) -> tuple:
        """A free drafter's next pass on the exact history: a chain cut to what pays (the whole
        proposal travels with k: with several ranks, rank 0's k may be longer) or, with trees
        on, a tree pruned to what pays; its first token is the shadow guess when nothing is
        drafted (a free acceptance probe)."""
        d, c = self.engine.drafters[src], self.engine.costs[src]
        if self.tree and hasattr(d, "propose_tree"):  # (never with several ranks: see Engine.stream)
            proposal = d.propose_tree(self.hist, k_cap, k_cap + self.tree, self.params, self.seed)
            draft = treeplan.plan(proposal, c, self.tree)
            k = len(draft)
        else:
            draft = proposal = d.propose(self.hist, k_cap, self.params, self.seed)
            k = c.choose(len(proposal), kind=proposal.kind) if len(proposal) else 0
        shadow = (proposal.tokens[0], proposal.kind, src) if len(proposal) and not k else None
        return k, draft, shadow, src

    def plan(self, model_k: Optional[int] = None) -> tuple:
        """The next step, decided on the exact committed history; `model_k`: a model drafter's k,
        already chosen (`decide_early`)."""
        name, k_fixed, cost, companion = self.name, self.k_fixed, self.cost, self.companion
        k_cap = min(self.room() - 1, MAX_DRAFT, self.before_switch(len(self.hist) - 1))
        if name == "none" or k_cap <= 0:
            return 0, None, None, name
        if k_fixed is not None:
            return min(k_fixed, k_cap), None, None, name
        k_cap = min(k_cap, self.longest)
        if k_cap <= 0:
            return 0, None, None, name
        if not self.drafter.uses_model:
            return self.free_plan(name, k_cap)
        if model_k is not None:  # decided before the last read (`decide_early`)
            k, guess = min(model_k, k_cap), None
        else:
            k, guess = self.probe_instead(cost.choose(k_cap))
        if companion is None:
            return k, None, guess, name
        free = self.free_plan(companion, k_cap)
        # A round that re-times the model's costs (`CostModel._explore`) is not given away: on a GPU
        # lookup drafts nearly every round (two free drafts cost what one does there), and a stale
        # draft cost would never be re-timed (an H100's head drafted one round in six prompts).
        if free[0] and (not k or (not cost.exploring and self.free_speed(free) > (cost.speed(k) or 0.0))):
            return free
        # Its first token still teaches the lookup's model beside the model's round (a free
        # probe): a companion that stopped learning once it lost could never win again.
        probe = guess or free[2] or ((free[1].tokens[0], free[1].kind, companion) if free[0] else None)
        return k, None, probe, name

    def free_speed(self, step: tuple) -> float:
        """Expected tokens per second of a free drafter's planned pass (0 when unknown)."""
        k, draft, _, src = step
        c = self.engine.costs[src]
        if draft.parents is None:
            return c.speed(k, draft.kind) or 0.0
        v = c.curve.verify_seconds(k + 1)
        return (1.0 + sum(treeplan.reach(draft, c))) / v if v else 0.0

    def draft(self, step: tuple) -> Drafted:
        """What the step's pass verifies, made now on the exact history."""
        k, draft, _, _ = step
        hist, params, seed, drafter, cost = self.hist, self.params, self.seed, self.drafter, self.cost
        drafted, read_first, static = None, False, False
        if draft is None and k and (self.model_trees or self.static_trees) and not cost.exploring:
            # The chain plus runners-up as side leaves, where their rows pay. First the
            # fixed-shape tree, drafted and verified on the device like a chain; else (greedy) the
            # tree whose leaves are picked by probability, which the host must read first. Not for a
            # round that re-times a pass length (`CostModel._explore`): side leaves would make its
            # pass longer than the one it is to time, which would stay warm-up's guess.
            m = treeplan.static_leaves(cost, k, self.tree) if self.static_trees else 0
            if m:
                draft, drafted, static = drafter.propose_static_tree(hist, k, m, params, seed), k, True
            elif self.model_trees and treeplan.could_widen(cost, k, self.tree):
                proposal = drafter.propose_tree(hist, k, k + self.tree, params, seed)
                draft, drafted, read_first = treeplan.widen(proposal, cost, self.tree), k, True
        if draft is None:  # a model (or a fixed k) drafts the same tokens on every rank: same history, same seed
            draft = drafter.propose(hist, k, params, seed) if k else Draft([])
        elif draft.parents is None and len(draft) != k:  # a chain proposal, cut to (rank 0's) k
            draft = Draft(draft.tokens[:k], kind=draft.kind)
        mask, forced = None, False
        if self.constraint is not None:
            draft, mask, forced = self.constrain(draft)
        if self.penalties is not None and not isinstance(draft.tokens, list):
            draft = Draft(draft.tokens.tolist(), kind=draft.kind)
        return Drafted(draft, mask, self.shaping(draft, mask=mask), drafted, read_first, static, forced)

    def shaping(self, draft: Draft, pending: Optional[mx.array] = None, mask: Optional[mx.array] = None):
        """What a pass adds to its logits before the target's choice: the request's logit_bias,
        min_tokens' ban on the rows that come before it, and the penalties (`rounds` takes an
        array to add, or a function of the logits). `pending`: a chained step's predecessor;
        `mask`: the grammar's rows, where one that allows nothing but an ending lifts the ban (the
        grammar is complete: the answer ends there, shorter than min_tokens, as it must)."""
        added = self.bias
        # rows still before min_tokens
        early = self.min_tokens - (len(self.hist) - self.prompt_len) - (pending is not None)
        if self.ban is not None and early > 0:
            # a row's position: a chain's is its index, a tree's its node's depth (side leaves come
            # after the chain, so a shallow node may sit at a high index)
            at = mx.arange(len(draft) + 1) if draft.parents is None else mx.array(depths(draft.parents))
            rows = at[:, None] < early
            if mask is not None:
                rows = rows & mx.any(mask & (self.ban == 0), axis=-1, keepdims=True)
            added = mx.where(rows, self.ban, 0.0) + (0.0 if added is None else added)
        if self.penalties is None:
            return added
        adjust = self.penalties.rows(self.hist, draft.tokens, pending)  # (a list: the pass read its drafts)
        return adjust if added is None else (lambda logits: adjust(logits + added))

    def constrain(self, draft: Draft) -> tuple:
        """(the draft on the host, its rows' masks, whether it is the grammar's forced tokens).

        A draft is cut before what the grammar refuses (the target, masked, could not sample it);
        when speculating, a draft that does not begin with the tokens the grammar forces next
        becomes them (as many as a pass may verify)."""
        constraint = self.constraint
        tokens = draft.tokens if isinstance(draft.tokens, list) else draft.tokens.tolist()
        forced = False
        tokens = tokens[:constraint.allowed(tokens)]
        if self.name != "none" and self.k_fixed != 0:
            ff = constraint.forced()[:max(0, min(self.room() - 1, self.longest))]
            if ff and tokens[:len(ff)] != ff:
                tokens, forced = ff, True
        mask = constraint.rows(tokens)
        return Draft(tokens[:mask.shape[0] - 1], kind=draft.kind), mask, forced
