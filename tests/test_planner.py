"""The planner's decisions, on stub drafters and cost models: what each drafter is asked for, and
which guesses reach the cost models. Output never depends on them (the loop's tests check that);
these choices decide only speed, so the loop's tests cannot see them go wrong."""

from types import SimpleNamespace

import numpy as np
import pytest

from mlxspec import planner as planner_mod
from mlxspec.drafters import Draft
from mlxspec.planner import Planner
from mlxspec.sampling import SamplingParams

GREEDY = SamplingParams(0.0, 1.0, 0, 0.0)
SAMPLED = SamplingParams(0.7, 1.0, 0, 0.0)
PROMPT = [1, 2, 3, 4]


class StubDrafter:
    """Proposes `tokens` (as many as asked for), recording each request's k."""

    def __init__(self, tokens, *, uses_model: bool, kind: str = "k"):
        self.tokens, self.uses_model, self.kind, self.asked = list(tokens), uses_model, kind, []

    def propose(self, hist, k, params, seed):
        self.asked.append(k)
        return Draft(self.tokens[:k], kind=self.kind)


class StubCost:
    """Chooses `k` (capped), recording each cap; `probe`: its choice is a probe; `speeds`: tokens/s by k."""

    def __init__(self, k: int, *, probe: bool = False, speeds=None, verify=0.01):
        self.k, self.probe, self.speeds, self.caps = k, probe, speeds or {}, []
        self.probing = self.exploring = False
        self.curve = SimpleNamespace(verify_seconds=lambda j: verify)

    def choose(self, k_cap, kind=""):
        self.caps.append(k_cap)
        self.probing = self.probe
        return min(self.k, k_cap)

    def speed(self, k, kind=""):
        return self.speeds.get(k)


def make(drafters, costs, *, name, companion=None, max_tokens=100, context=None, longest=8, params=GREEDY,
         hist_extra=(), **kw):
    target = SimpleNamespace(pass_room=lambda first: None)
    engine = SimpleNamespace(target=target, drafters=drafters, costs=costs, context=context)
    hist = PROMPT + list(hist_extra)
    return Planner(engine, PROMPT, hist, params, 0, name=name, k_fixed=None, tree=0, companion=companion,
                   longest=longest, max_tokens=max_tokens, **kw)


def test_room_is_what_max_tokens_and_the_context_leave():
    p = make({"none": StubDrafter([], uses_model=False)}, {"none": StubCost(0)}, name="none", max_tokens=10,
             context=20, hist_extra=[9] * 3)
    assert p.room() == 7  # 10 - 3 committed
    p.hist.extend([9] * 5)
    assert p.room() == 2
    p = make({"none": StubDrafter([], uses_model=False)}, {"none": StubCost(0)}, name="none", max_tokens=100,
             context=20, hist_extra=[9] * 3)
    assert p.room() == 20 - 7


def test_early_the_model_sizes_the_round_after_the_pending_step():
    """One token is in flight: the round after it may draft at most room - 2 (its own token and
    the pending one come first), and no more than the longest a round may verify."""
    model, cost = StubDrafter([7, 8, 9], uses_model=True), StubCost(3)
    p = make({"m": model}, {"m": cost}, name="m", max_tokens=10)
    assert p.decide_early() == (False, None, 3)
    assert cost.caps == [8]  # min(10 - 2, longest 8)
    p = make({"m": model}, {"m": StubCost(3)}, name="m", max_tokens=6)
    p.decide_early()
    assert p.cost.caps == [4]


def test_a_greedy_probe_is_a_guess_of_the_pending_token():
    """When the model's cost model only wants a probe, greedy decoding chains a plain step and
    the drafter's first token is kept as the guess, checked when that token is read."""
    model = StubDrafter([7, 8], uses_model=True)
    p = make({"m": model}, {"m": StubCost(1, probe=True)}, name="m")
    assert p.decide_early() == (True, (7, "", "m"), 0)
    assert model.asked == [1]
    sampled = make({"m": StubDrafter([7, 8], uses_model=True)}, {"m": StubCost(1, probe=True)}, name="m",
                   params=SAMPLED)
    assert sampled.decide_early() == (False, None, 1)  # sampled rounds keep k = 1 probes


def test_early_a_lookup_drafts_when_the_model_would_not():
    """The model would draft nothing: its companion looks up k_cap + 1 tokens (its first is its
    guess of the token in flight) and sizes the round after it from the rest."""
    model, lookup = StubDrafter([5], uses_model=True), StubDrafter([7, 8, 9, 10], uses_model=False, kind="copy")
    costs = {"m": StubCost(0), "ngram": StubCost(2)}
    p = make({"m": model, "ngram": lookup}, costs, name="m", companion="ngram", max_tokens=10)
    assert p.decide_early() == (False, None, 0)  # read first: the lookup drafts; the model's k is 0
    assert lookup.asked == [9] and costs["ngram"].caps == [3]  # 4 proposed, the first is the pending token's guess
    costs = {"m": StubCost(0), "ngram": StubCost(0)}
    p = make({"m": model, "ngram": lookup}, costs, name="m", companion="ngram")
    assert p.decide_early() == (True, (7, "copy", "ngram"), 0)  # nothing pays: a plain step, the lookup's guess


def test_a_free_drafter_that_drafts_nothing_leaves_its_guess():
    lookup = StubDrafter([7, 8], uses_model=False, kind="copy")
    p = make({"ngram": lookup}, {"ngram": StubCost(0)}, name="ngram")
    assert p.plan() == (0, Draft([7, 8], kind="copy"), (7, "copy", "ngram"), "ngram")
    k, draft, shadow, src = make({"ngram": lookup}, {"ngram": StubCost(2)}, name="ngram").plan()
    assert (k, shadow) == (2, None) and draft.tokens == [7, 8]


def test_a_free_drafter_s_whole_proposal_is_cut_to_its_k_when_drafted():
    """`plan` carries the whole lookup (with several ranks, rank 0's k may be longer); the pass
    verifies the k chosen, not the rest."""
    lookup = StubDrafter([7, 8, 9, 10], uses_model=False, kind="copy")
    p = make({"ngram": lookup}, {"ngram": StubCost(2)}, name="ngram")
    step = p.plan()
    assert step[0] == 2 and step[1].tokens == [7, 8, 9, 10]
    d = p.draft(step)
    assert d.draft.tokens == [7, 8] and d.draft.kind == "copy" and d.mask is None and not d.forced


def test_a_round_is_no_longer_than_the_longest_warmed_up():
    cost = StubCost(15)
    p = make({"m": StubDrafter([1] * 15, uses_model=True)}, {"m": cost}, name="m", longest=5)
    assert p.plan()[0] == 5 and cost.caps == [5]


def test_the_lookup_drafts_a_round_where_it_is_expected_faster():
    model, lookup = StubDrafter([5, 6, 7], uses_model=True), StubDrafter([7, 8, 9], uses_model=False)
    costs = {"m": StubCost(3, speeds={3: 100.0}), "ngram": StubCost(3, speeds={3: 150.0})}
    p = make({"m": model, "ngram": lookup}, costs, name="m", companion="ngram")
    assert p.plan()[3] == "ngram"
    costs["ngram"].speeds = {3: 50.0}
    k, draft, probe, src = p.plan()
    assert (k, draft, src) == (3, None, "m")
    assert probe == (7, "k", "ngram")  # the losing lookup's first token still teaches its cost model
    costs["ngram"].speeds, costs["m"].exploring = {3: 150.0}, True
    costs["m"].choose = lambda k_cap, kind="": 3  # (keeps `exploring` set)
    assert p.plan()[3] == "m"  # a round that re-times the model's costs is not given away


def test_a_tree_s_speed_counts_the_target_s_own_token(monkeypatch):
    monkeypatch.setattr(planner_mod.treeplan, "reach", lambda draft, cost: [0.5, 0.25])
    p = make({"ngram": StubDrafter([], uses_model=False)}, {"ngram": StubCost(0, verify=0.01)}, name="ngram")
    tree = Draft([7, 8], parents=[-1, 0])
    assert p.free_speed((2, tree, None, "ngram")) == pytest.approx((1 + 0.75) / 0.01)


def test_a_grammar_s_forced_tokens_leave_room_for_the_pass_s_own():
    """A pass verifies its drafts and adds the target's token: forced tokens fill at most room - 1."""
    forced = list(range(10, 20))
    constraint = SimpleNamespace(allowed=lambda tokens: len(tokens), forced=lambda: forced,
                                 rows=lambda tokens: np.ones((len(tokens) + 1, 8), bool))  # every row allows
    p = make({"m": StubDrafter([], uses_model=True)}, {"m": StubCost(0)}, name="m", max_tokens=4,
             constraint=constraint)
    draft, _, was_forced = p.constrain(Draft([1, 2]))
    assert was_forced and draft.tokens == [10, 11, 12]
