"""Sizing a draft tree: chains where V(j) grows steeply, branches where passes are flat."""

import pytest

from mlxspec import costmodel, treeplan
from mlxspec.costmodel import CostModel
from mlxspec.target_curve import TargetCurve
from mlxspec.drafters import Draft

# A chain of 6 with a frequent branch at the root and one under the first node.
TREE = Draft([1, 2, 3, 4, 5, 6, 7, 8, 9], kind="n3", parents=[-1, 0, 1, 2, 3, 4, -1, 6, 0],
             scores=[1.0] * 6 + [0.9, 1.0, 0.8])


def model(slope: float, alpha_obs=(6, 2), side_obs=(6, 2)) -> CostModel:
    curve = TargetCurve(prior_slope=slope)
    for _ in range(3):
        curve.observe(1, 1.0, trusted=True)
        curve.observe_plain(1.0)
    m = CostModel(curve, draft_is_free=True)
    for _ in range(8):
        m.observe_acceptance(alpha_obs[0] + alpha_obs[1], alpha_obs[0], "n3")
        for s in range(side_obs[0]):
            m.observe_acceptance(1, 1.0, "n3/side", prior=treeplan.SIDE_PRIOR)
        for s in range(side_obs[1]):
            m.observe_acceptance(1, 0.0, "n3/side", prior=treeplan.SIDE_PRIOR)
    return m


def test_steep_curve_keeps_a_chain_or_nothing():
    d = treeplan.plan(TREE, model(0.5), 15)
    assert d.parents is None  # a chain (possibly empty)


def test_flat_curve_verifies_branches():
    d = treeplan.plan(TREE, model(0.02), 15)
    assert d.parents is not None and len(d) > 6


def test_best_first_keeps_parents_and_earlier_siblings_first():
    r = treeplan.reach(TREE, model(0.02))
    order = treeplan.best_first(TREE.parents, r)
    assert sorted(order) == list(range(len(TREE)))
    for pos, i in enumerate(order):
        par = TREE.parents[i]
        assert par < 0 or order.index(par) < pos
        sibs = [j for j, p in enumerate(TREE.parents) if p == par]
        assert all(order.index(s) < pos for s in sibs if s < i)


def test_observe_learns_alpha_and_side_rates():
    m = CostModel(TargetCurve(), draft_is_free=True)
    a0, b0 = m.alpha_of("n3"), m.alpha_of("n3/side", prior=treeplan.SIDE_PRIOR)
    for _ in range(10):
        treeplan.observe(m, TREE, [6])  # the chain failed at once, the root's branch matched, then failed
    assert m.alpha_of("n3") < a0 and m.alpha_of("n3/side", prior=treeplan.SIDE_PRIOR) > b0
    # A cold side rate starts pessimistic, and a new request pulls it back toward what the side
    # branches did over the requests so far (the prior and these 10 matches, forgotten slowly),
    # not to 1/2.
    learnt = m.alpha_of("n3/side", prior=treeplan.SIDE_PRIOR)
    m.new_request(keep=0.0)
    d, w = costmodel.LONG_DECAY, costmodel.LONG_PRIOR / sum(treeplan.SIDE_PRIOR)
    s = w * treeplan.SIDE_PRIOR[0] * d ** 10 + sum(d ** i for i in range(10))
    f = w * treeplan.SIDE_PRIOR[1] * d ** 10
    assert m.alpha_of("n3/side", prior=treeplan.SIDE_PRIOR) == pytest.approx(s / (s + f))
    assert b0 < s / (s + f) and m.alpha_of("n3/side", prior=treeplan.SIDE_PRIOR) < learnt


class Rates:
    """A cost model's acceptance rates only: alpha for chain steps, beta for side branches."""

    def __init__(self, alpha: float, beta: float):
        self.alpha, self.beta = alpha, beta

    def alpha_of(self, kind, prior=None):
        return self.beta if kind.endswith("/side") else self.alpha


def test_reach_multiplies_down_the_tree():
    """A first child is reached when its parent is and the step holds (alpha x its score); a
    later sibling only when the first child failed and the side branch then matched
    ((1 - alpha) x beta x its score)."""
    r = treeplan.reach(TREE, Rates(0.8, 0.5))
    assert r[:3] == pytest.approx([0.8, 0.64, 0.512])
    assert r[6] == pytest.approx(0.2 * 0.5 * 0.9)  # the root's second child
    assert r[7] == pytest.approx(r[6] * 0.8)  # its own first child
    assert r[8] == pytest.approx(0.8 * 0.2 * 0.5 * 0.8)  # node 0's second child


def test_a_certain_chain_still_leaves_its_side_branches_a_chance():
    """An estimated alpha of 1 (a long run of hits) is held below 1: a side branch's reach stays
    positive, so one that would pay is not ruled out for good."""
    r = treeplan.reach(TREE, Rates(1.0, 0.5))
    assert r[6] > 0 and r[0] < 1


def test_a_subtree_keeps_the_scores_of_the_nodes_it_keeps():
    sub = treeplan.subtree(TREE, [0, 1, 6, 8])
    assert sub.tokens == [1, 2, 7, 9] and sub.parents == [-1, 0, -1, 0]
    assert sub.scores == [1.0, 1.0, 0.9, 0.8]
    chain = treeplan.subtree(TREE, [0, 1, 2])
    assert chain.parents is None and chain.tokens == [1, 2, 3]  # no branch: a chain


def test_a_first_childs_reach_carries_its_own_score():
    """A chain step's reach is its parent's x alpha x its drafter score; no score given counts as 1."""
    d = Draft([1, 2, 3], kind="n3", parents=[-1, 0, -1], scores=[0.5, 0.4, 0.9])
    assert treeplan.reach(d, Rates(0.8, 0.5)) == pytest.approx([0.4, 0.4 * 0.8 * 0.4, 0.2 * 0.5 * 0.9])
    bare = Draft([1, 2, 3], kind="n3", parents=[-1, 0, -1])
    assert treeplan.reach(bare, Rates(0.8, 0.5)) == pytest.approx([0.8, 0.64, 0.1])


def test_a_plan_never_passes_its_cap():
    flat = model(0.02)
    assert len(treeplan.plan(TREE, flat, 15)) > 6
    assert [len(treeplan.plan(TREE, flat, cap)) for cap in (0, 1, 2, 5)] == [0, 1, 2, 5]
    chain = Draft([1, 2, 3, 4, 5, 6], kind="n3")
    assert len(treeplan.plan(chain, flat, 6)) == 6 and len(treeplan.plan(chain, flat, 2)) == 2
    assert len(treeplan.plan(Draft([], kind="n3"), flat, 15)) == 0


def test_best_first_takes_the_likeliest_ready_node_next():
    r = treeplan.reach(TREE, Rates(0.8, 0.5))  # the chain 0.8 ... 0.26, then 0.09 (6), 0.072 (7), 0.064 (8)
    assert treeplan.best_first(TREE.parents, r) == [0, 1, 2, 3, 4, 5, 6, 7, 8]
    low_chain = treeplan.reach(TREE, Rates(0.3, 0.9))  # side branches now beat the chain's deeper steps
    assert treeplan.best_first(TREE.parents, low_chain) == [0, 6, 7, 1, 8, 2, 3, 4, 5]  # (6 waits for 0, 8 for 1)


def test_observe_counts_every_chain_step_walked():
    """A walk down the chain's first children three times, then past its end: 3 accepted of 4
    tried, learnt exactly as the cost model's own observation of those counts; no side rate moves."""
    walked, direct = CostModel(TargetCurve(), draft_is_free=True), CostModel(TargetCurve(), draft_is_free=True)
    side = walked.alpha_of("n3/side", prior=treeplan.SIDE_PRIOR)
    treeplan.observe(walked, TREE, [0, 1, 2])
    direct.observe_acceptance(4, 3, "n3")
    assert walked.alpha_of("n3") == direct.alpha_of("n3") != CostModel(TargetCurve()).alpha_of("n3")
    assert walked.alpha_of("n3/side", prior=treeplan.SIDE_PRIOR) == side
