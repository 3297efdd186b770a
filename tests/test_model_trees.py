"""Trees from model drafters: the greedy chain plus runners-up as side leaves (drafters.sidetree).

Unit tests of the tree's shape and sizing, then the engine with a draft model and with an
EAGLE head on a flat target curve (a device where rows are nearly free, so side leaves pay):
greedy output equals plain decoding, also with a window that wraps, and side leaves are
accepted (the cache compaction moved entries) in those runs; both for fixed-shape trees
(drafted and verified on the device) and for trees the host reads to pick leaves.
"""

import mlx.core as mx
import pytest
from mlx_lm.models.cache import RotatingKVCache

import tiny
from mlxspec import Engine, loop, treeplan
from mlxspec.drafters import Draft
from mlxspec.costmodel import STALE_ROUNDS, CostModel
from mlxspec.target_curve import TargetCurve
from mlxspec.drafters.sidetree import MIN_P, grow, runner_up, runners_up, static_parents
from mlxspec.sequence import Sequence
from test_engine import assert_same_greedy, reference
from test_engine_trees import flat_curve

PROMPT = [5, 6, 7, 8, 9, 10, 5, 6, 7, 11, 12]


def cands(*steps):
    return [([t for t, _ in s], [p for _, p in s]) for s in steps]


def test_grow_puts_the_chain_first_and_ranks_leaves_by_path_probability():
    # Step 0 is sure (0.9), step 1 unsure (0.4): 30's path probability 0.9 * 0.3 = 0.27 beats
    # 20's 0.06 and 40's 0.9 * 0.4 * 0.1 = 0.036; 21 is under MIN_P.
    steps = cands([(1, 0.9), (20, 0.06), (21, MIN_P / 2)], [(2, 0.4), (30, 0.3), (31, 0.2)],
                  [(3, 0.4), (40, 0.1)])
    d = grow([1, 2, 3], steps, size=5)
    assert d.tokens[:3] == [1, 2, 3] and d.parents[:3] == [-1, 0, 1]
    side = {t: (par, s) for t, par, s in zip(d.tokens[3:], d.parents[3:], d.scores[3:])}
    assert set(side) == {30, 31}  # the two best leaves; 20 (0.06) and 40 (0.036) lose to 31 (0.18)
    assert side[30][0] == 0 and side[30][1] == pytest.approx(0.3 / 0.6)  # beside step 1: child of node 0
    everything = grow([1, 2, 3], steps, size=50)
    assert 21 not in everything.tokens and len(everything) == 3 + 4
    assert everything.parents[everything.tokens.index(20)] == -1  # beside step 0: a child of the root


def test_grow_depth_first_keeps_every_parent_before_its_children():
    d = grow([1, 2, 3], cands([(1, 0.5), (9, 0.5)], [(2, 0.5), (8, 0.5)], [(3, 0.5), (7, 0.5)]), size=6)
    assert all(p < i for i, p in enumerate(d.parents))
    assert d.tokens[:3] == [1, 2, 3]


def test_runners_up_are_the_top_ids_best_first():
    logits = mx.array([0.0, 3.0, 1.0, 2.0, -1.0])
    ids, p = runners_up(logits, m=2)
    assert ids.tolist() == [1, 3, 2]
    assert p.tolist() == pytest.approx(mx.softmax(logits)[mx.array([1, 3, 2])].tolist())


def sized(slope: float) -> CostModel:
    curve = TargetCurve(prior_slope=slope)
    for _ in range(3):
        curve.observe(1, 1.0, trusted=True)
        curve.observe_plain(1.0)
    m = CostModel(curve)
    m.observe_draft(4, 0.2)
    for _ in range(8):
        m.observe_acceptance(4, 2)
    return m


def test_widen_keeps_the_chain_and_adds_leaves_only_where_rows_are_cheap():
    d = grow([1, 2, 3, 4], cands([(1, 0.5), (9, 0.4)], [(2, 0.5), (8, 0.4)], [(3, 0.5)], [(4, 0.5)]), size=8)
    flat = treeplan.widen(d, sized(0.01), 15)
    assert flat.tokens[:4] == [1, 2, 3, 4] and len(flat) == 6 and flat.parents is not None
    steep = treeplan.widen(d, sized(1.0), 15)
    assert steep.tokens == [1, 2, 3, 4] and steep.parents is None
    assert len(treeplan.widen(d, sized(0.01), 5)) == 5  # the cap counts every node
    odd = grow([1, 2, 3], cands([(1, 0.5), (9, 0.4)], [(2, 0.5), (8, 0.4)], [(3, 0.5), (7, 0.4)]), size=6)
    assert treeplan.widen(odd, sized(1.0), 15).tokens == [1, 2, 3]  # a chain of odd length: no leaf taken for a step
    wide = treeplan.widen(odd, sized(0.01), 15)
    assert wide.tokens[:3] == [1, 2, 3] and wide.parents[:3] == [-1, 0, 1] and len(wide) > 3


def test_a_chain_stays_unread_where_no_leaf_could_pay():
    assert treeplan.could_widen(sized(0.01), 4, 15)
    assert not treeplan.could_widen(sized(1.0), 4, 15)
    assert not treeplan.could_widen(sized(0.01), 15, 15)  # no node left for a leaf


def test_a_tree_rounds_drafting_cost_counts_drafter_steps_not_leaves():
    m = sized(0.0)  # V(j) = 1 s for every j; drafting 0.05 s a step (sized's warm-up)
    m.curve.observe(9, 1.0, trusted=True)  # timed: a round at a length never timed would time it instead
    m.observe_round(8, 1.0 + 4 * 0.05, drafted=4)  # 4 steps and 4 free leaves
    assert m.draft_seconds() == pytest.approx(0.05)
    assert m.read_seconds() == pytest.approx(0.0)


def test_reading_a_trees_drafts_is_its_own_cost_not_the_draft_cost():
    # Chain rounds have taught c = 0.05; tree rounds also wait 1 s for the drafts to be read.
    m = sized(0.0)
    m.curve.observe(9, 1.0, trusted=True)
    m.curve.observe(5, 1.0, trusted=True)
    for _ in range(5):
        m.observe_round(4, 1.0 + 4 * 0.05)
        m.observe_round(8, 1.0 + 4 * 0.05 + 1.0, drafted=4)
    assert m.draft_seconds() == pytest.approx(0.05)  # the old rule made it (0.2 + 1.0) / 4 = 0.3
    assert m.read_seconds() == pytest.approx(1.0)
    # Rows are free here, but the read is not. Half of every draft is accepted: a chain of 4
    # yields 1.94 tokens in 1.2 s; 11 side leaves at best 0.125 each add 1.375 tokens, for 1 s.
    assert not treeplan.could_widen(m, 4, 15)
    for _ in range(STALE_ROUNDS):  # plain steps: the read is not timed again while leaves stay off...
        m.curve.observe_plain(1.0)
    assert treeplan.could_widen(m, 4, 15)  # ...until its timing is stale: the next tree round re-times it
    m.observe_round(8, 1.0 + 4 * 0.05 + 1.0, drafted=4)  # still 1 s
    assert m.read_seconds() == pytest.approx(1.0) and not treeplan.could_widen(m, 4, 15)
    m.read = type(m.read)()
    assert treeplan.could_widen(m, 4, 15)  # the same rows with nothing to read: leaves pay


def test_a_tree_round_faster_than_the_curve_corrects_v():
    # V(9) was timed high (an outlier: 3 plain steps); tree rounds of 9 rows from 4 head steps
    # take 1.6 s, less than that V alone: V must come down (else 9 rows look dear for good and
    # are never re-timed), and the read costs nothing.
    m = sized(0.0)
    m.curve.observe(9, 3.0, trusted=True)
    m.curve.observe(5, 1.0, trusted=True)
    for _ in range(5):
        m.observe_round(4, 1.0 + 4 * 0.05)  # chains teach c = 0.05
    for _ in range(5):
        m.observe_round(8, 1.6, drafted=4)
    assert m.read_seconds() == pytest.approx(0.0)
    assert m.curve.verify_seconds(9) == pytest.approx(1.6 - 4 * 0.05)
    assert m.draft_seconds() == pytest.approx(0.05)


def test_read_rounds_and_chain_rounds_do_not_walk_v_and_c_apart():
    # A replay of the H100: read rounds whose widening kept the chain alone (k = 1, nothing of
    # their own to pay) lowered V(2) by c whenever they beat V(2) + c, and chain rounds then took
    # c as the round less that V: with the rounds' noise the two walked apart (V(2) 11.6 -> 10.6
    # ms, c 0.3 -> 2.2) and k = 1 looked better than k = 2. Here V(2) = 1 and c = 0.05, c's
    # estimate starts high (0.3, a slower spell's), and every round takes 1.05.
    curve = TargetCurve(prior_slope=0.0)
    for _ in range(3):
        curve.observe_plain(0.95)
        curve.observe(2, 1.0, trusted=True)
        curve.observe(3, 1.0, trusted=True)
    m = CostModel(curve)
    for _ in range(3):
        m.observe_draft(1, 0.3)
    for _ in range(20):
        m.observe_round(1, 1.05, drafted=1)  # read, no side leaf
        m.observe_round(1, 1.05)  # a chain of 1
    assert m.curve.verify_seconds(2) == pytest.approx(1.0)  # 0.95 before: 1.05 - 0.3, up to the plain step
    assert m.draft_seconds() == pytest.approx(0.05)  # 0.1 before
    assert m.read_seconds() == pytest.approx(0.0)
    # So a chain of 2 is priced at what it costs (1.1 s; 1.2 before), and at a third of drafts
    # accepted it beats a chain of 1 (before, the chain of 1 won).
    m.counts[""] = [10.0, 20.0]
    assert m.choose(2) == 2


def test_static_shape_and_runner_up():
    assert static_parents(4, 2) == [-1, 0, 1, 2, -1, 0]  # leaves beside steps 0 and 1
    assert static_parents(2, 5) == [-1, 0, -1, 0]  # at most one leaf per step
    logits = mx.array([0.0, 3.0, 1.0, 2.0, -1.0])
    assert runner_up(logits, mx.array(1)).item() == 3
    tied = mx.array([0.0, 2.0, 2.0, 1.0])  # a tie: whichever of the two argmax picked, the other
    assert {runner_up(tied, mx.array(1)).item(), runner_up(tied, mx.array(2)).item()} == {1, 2}


def test_static_leaves_pay_for_rows_only():
    m = sized(0.0)  # half of every draft accepted; rows free, nothing read
    assert treeplan.static_leaves(m, 4, 8) == 4
    assert treeplan.static_leaves(m, 4, 6) == 2  # at most 6 nodes
    assert treeplan.static_leaves(m, 4, 4) == 0
    m.read.add(10.0, m.curve.now)  # a read tree's read costs a static tree nothing
    assert treeplan.static_leaves(m, 4, 8) == 4
    dear = sized(0.5)  # each row costs half a step: a leaf worth at most 0.125 tokens does not pay
    assert treeplan.static_leaves(dear, 4, 8) == 0


def test_static_trees_learn_their_own_side_rate():
    m = sized(0.05)  # each row costs a twentieth of a step
    tree = Draft([1, 2, 9], parents=[-1, 0, -1])  # step 0 failed, its runner-up matched
    for _ in range(20):
        treeplan.observe(m, tree, [2], static=True)
    assert m.alpha_of(treeplan.static_kind(""), prior=treeplan.SIDE_PRIOR) > 0.9
    assert m.alpha_of(treeplan.side_kind(""), prior=treeplan.SIDE_PRIOR) == pytest.approx(0.25)
    assert treeplan.static_leaves(m, 4, 8) > 0
    for _ in range(40):
        treeplan.observe(m, tree, [], static=True)  # now it never matches: no static leaves
    assert treeplan.static_leaves(m, 4, 8) == 0


def test_a_static_tree_round_teaches_its_own_cost_not_the_draft_cost():
    # The H100's case: a fixed-shape tree's pass (its ancestor mask) cost 19 ms where a chain's of
    # the same length cost 12.6, and the difference went to c, per head step: c rose from 0.9 ms
    # to 13, chains looked dear, and the head stopped drafting for several prompts.
    m = sized(0.0)
    m.curve.observe(5, 1.0, trusted=True)
    m.curve.observe(7, 1.0, trusted=True)
    for _ in range(5):
        m.observe_round(4, 1.0 + 4 * 0.1)  # chains teach c = 0.1
        m.observe_round(6, 1.0 + 4 * 0.1 + 0.5, drafted=4, static=True)
    assert m.draft_seconds() == pytest.approx(0.1)
    assert m.static_seconds() == pytest.approx(0.5) and m.read_seconds() == 0.0
    # Side leaves that match half the time pay for their rows (rows are free here), not for a pass
    # half a step dearer: at alpha 0.5 four of them add 0.47 tokens to a chain of 4's 1.94 in 1.4 s.
    for i in range(40):
        treeplan.observe(m, Draft([1, 2, 9], parents=[-1, 0, -1]), [2] if i % 2 else [], static=True)
    assert m.alpha_of(treeplan.static_kind(""), prior=treeplan.SIDE_PRIOR) == pytest.approx(0.5, abs=0.05)
    m.counts[""] = [10.0, 10.0]
    assert treeplan.static_leaves(m, 4, 8) == 0
    m.static = type(m.static)()
    assert treeplan.static_leaves(m, 4, 8) > 0  # the same leaves in a pass that costs a chain's
    # A static round is no read tree, whatever `read`'s default says for rounds with `drafted`.
    m.observe_round(6, 1.0 + 4 * 0.1 + 0.5, drafted=4, static=True)
    assert m.read_seconds() == 0.0 and m.static_seconds() > 0


# -- the engine --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def target():
    return tiny.make_llama(1, layers=1, tie_embeddings=False)


@pytest.fixture(scope="module")
def draft():
    # The target with a noisy output head: often right, and where it is not, the target's token
    # is often among its runners-up (a random model would agree with it nowhere).
    d = tiny.make_llama(1, layers=1, tie_embeddings=False)
    mx.random.seed(5)
    w = d.lm_head.weight
    d.lm_head.weight = w + 0.6 * mx.std(w) * mx.random.normal(w.shape)
    return d


@pytest.fixture(scope="module")
def tied():
    return tiny.make_llama(1, layers=1)  # the head's logits use the target's tied embedding


@pytest.fixture(scope="module")
def head(tied, tmp_path_factory):
    # The target's own layer with a noisy fc: right often enough, with the target's token close.
    return tiny.make_eagle_head(tied, tmp_path_factory.mktemp("head"), seed=4, copy=True, noise=0.05)


@pytest.fixture(params=["static", "read"])
def shape(request, monkeypatch):
    """Which trees a model drafter grows: fixed-shape ones first (the default), or read ones only.
    Returns the calls made to each proposer, to check the run used the trees it was meant to."""
    from mlxspec.drafters.eagle import EagleDrafter
    from mlxspec.drafters.model import ModelDrafter

    monkeypatch.setattr(loop, "STATIC_TREES", request.param == "static")
    calls = {"static": 0, "read": 0, "kind": request.param}
    for cls in (EagleDrafter, ModelDrafter):
        for name, key in (("propose_static_tree", "static"), ("propose_tree", "read")):
            orig = getattr(cls, name)

            def spy(self, *a, _orig=orig, _key=key, **kw):
                calls[_key] += 1
                return _orig(self, *a, **kw)

            monkeypatch.setattr(cls, name, spy)
    return calls


def used_only(shape):
    other = "read" if shape["kind"] == "static" else "static"
    return shape[shape["kind"]] > 0 and shape[other] == 0


@pytest.fixture
def paths(monkeypatch):
    """Every accepted tree path, as the target's cache compaction saw it."""
    seen = []
    keep = Sequence.keep_path

    def spy(self, start, path):
        seen.append(list(path))
        return keep(self, start, path)

    monkeypatch.setattr(Sequence, "keep_path", spy)
    return seen


def through_a_side_leaf(seen):
    # Depth-first with the chain first: a path off the chain is not 0, 1, 2, ...
    return any(p != list(range(len(p))) for p in seen)


@pytest.mark.parametrize("max_kv", [None, 16])
def test_model_drafter_trees_equal_plain_decoding(target, draft, paths, shape, max_kv):
    cache = None if max_kv is None else [RotatingKVCache(max_size=max_kv, keep=4) for _ in target.layers]
    ref = reference(target, PROMPT, 60, cache)
    e = flat_curve(Engine(target, None, draft, drafter="model", max_kv_size=max_kv))
    r = e.generate(PROMPT, max_tokens=60)
    assert r.stats.tree_rounds > 0, "no tree was verified"
    assert through_a_side_leaf(paths), "no side leaf was accepted"
    assert used_only(shape), shape
    assert_same_greedy(target, PROMPT, r.tokens, ref, max_kv_size=max_kv)
    again = e.generate(PROMPT + r.tokens[:5], max_tokens=30)  # the compacted caches serve a second turn
    assert again.tokens == Engine(target, drafter="none", max_kv_size=max_kv).generate(
        PROMPT + r.tokens[:5], max_tokens=30).tokens


@pytest.mark.parametrize("max_kv", [None, 16])
def test_eagle_trees_equal_plain_decoding(tied, head, paths, shape, max_kv):
    plain = Engine(tied, drafter="none", max_kv_size=max_kv).generate(PROMPT, max_tokens=60)
    e = flat_curve(Engine(tied, None, eagle_head=head, drafter="eagle", max_kv_size=max_kv))
    r = e.generate(PROMPT, max_tokens=60)
    assert r.stats.tree_rounds > 0
    assert through_a_side_leaf(paths)
    assert used_only(shape), shape
    assert r.tokens == plain.tokens
    assert e.generate(PROMPT, max_tokens=60, tree="off").tokens == plain.tokens


@pytest.mark.parametrize("drafter", ["model", "eagle"])
def test_sampled_rounds_verify_fixed_shape_trees_of_the_races_runners_up(target, draft, tied, head, paths, shape,
                                                                         drafter):
    """At a temperature every node is checked against the target's own race (the same noise), so
    a tree of the drafter's race winners and each step's runner-up gives the seeded text plain
    decoding gives. Read trees stay greedy: sampled rounds then keep the chain. (No lookup rounds:
    their n-gram trees are sampled too, and every tree here is the drafter's.)"""
    model = target if drafter == "model" else tied
    kw = dict(drafter="model", draft_model=draft) if drafter == "model" else dict(drafter="eagle", eagle_head=head)
    e = flat_curve(Engine(model, None, **kw))
    params = dict(max_tokens=40, temperature=0.8, lookup=False)
    trees = 0
    for seed in range(3):
        plain = Engine(model, drafter="none").generate(PROMPT, seed=seed, max_tokens=40, temperature=0.8).tokens
        r = e.generate(PROMPT, seed=seed, **params)
        assert r.tokens == plain, seed
        assert e.generate(PROMPT, seed=seed, tree="off", **params).tokens == plain
        trees += r.stats.tree_rounds
    if shape["kind"] == "static":
        assert trees > 0 and shape["static"] > 0
        assert through_a_side_leaf(paths), "no runner-up was accepted"
    else:
        assert trees == 0 and shape["read"] == 0


@pytest.mark.parametrize("drafter", ["model", "eagle"])
def test_a_fixed_draft_length_verifies_chains_of_it(target, draft, tied, head, drafter):
    """`num_draft` fixes k: the drafter's chain of k, never a tree the cost model would widen it into."""
    model = target if drafter == "model" else tied
    kw = dict(drafter="model", draft_model=draft) if drafter == "model" else dict(drafter="eagle", eagle_head=head)
    r = flat_curve(Engine(model, None, num_draft=3, **kw)).generate(PROMPT, max_tokens=40, lookup=False)
    assert r.tokens == Engine(model, drafter="none").generate(PROMPT, max_tokens=40).tokens
    assert r.stats.tree_rounds == 0 and max(r.stats.k_histogram) == 3
