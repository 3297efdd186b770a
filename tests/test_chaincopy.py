"""Copying inside model drafters' chains: the EAGLE head's and the draft model's (`mlxspec.drafters.chaincopy`)."""

import mlx.core as mx
import pytest

from mlxspec import Engine
from mlxspec.drafters import chaincopy
from mlxspec.sampling import SamplingParams
# The tiny target and the random head (every third id its draft vocabulary) of the EAGLE tests.
from test_eagle import drafter_for, random_head, target  # noqa: F401
from test_engine import assert_same_greedy, reference

GREEDY = SamplingParams()
# The tail [5, 6, 7] recurs: what followed it (8, 9, 10, 11) is the copy, from a match of
# 7 tokens (the whole period). The random head's draft vocabulary is every third id, so it can
# never propose 8, 10 or 11 itself.
CYCLE = [5, 6, 7, 8, 9, 10, 11]
HISTORY = CYCLE * 3 + [5, 6, 7]
COPY = [8, 9, 10, 11]


def ready(target, head, history, copying=True):
    """An EAGLE drafter whose target has been fed `history` (all but its last token)."""
    seq, d = drafter_for(target, head)
    seq.prefill(history[:-1])
    d.copying = copying
    return d


def test_precision_grows_with_the_match_and_shorter_ones_never_copy():
    assert chaincopy.precision(0) == chaincopy.precision(chaincopy.MIN_COPY - 1) == 0.0
    got = [chaincopy.precision(n) for n in range(chaincopy.MIN_COPY, 12)]
    assert got == sorted(got) and 0 < got[0] and got[-1] < 1


def test_blend_copies_only_where_the_head_is_less_sure_and_the_chain_still_follows():
    head = mx.array(3, dtype=mx.int32)
    sure = mx.array([0.0, 0.0, 0.0, 10.0])  # top probability 0.9997
    flat = mx.zeros((4,))  # 0.25
    yes, no = mx.array(True), mx.array(False)
    tok, follows = chaincopy.blend(head, flat, 7, 6, yes)
    assert (tok.item(), follows.item()) == (7, True)
    tok, follows = chaincopy.blend(head, sure, 7, 6, yes)  # the head is surer than any copy
    assert (tok.item(), follows.item()) == (3, False)
    tok, follows = chaincopy.blend(head, flat, 7, 6, no)  # an earlier step left the copy
    assert (tok.item(), follows.item()) == (3, False)
    tok, follows = chaincopy.blend(head, flat, 3, 6, no)  # the head says what the copy says, but too late
    assert (tok.item(), follows.item()) == (3, False)


def test_a_greedy_chain_copies_tokens_the_head_cannot_propose(target, random_head):
    copied = ready(target, random_head, HISTORY).propose(HISTORY, 4, GREEDY, 0).tokens.tolist()
    own = ready(target, random_head, HISTORY, False).propose(HISTORY, 4, GREEDY, 0).tokens.tolist()
    assert copied == COPY
    assert all(t % 3 == 0 for t in own)  # its draft vocabulary


def test_without_a_repeat_the_chain_is_the_heads(target, random_head):
    history = [5, 6, 7, 8, 9, 10, 11, 12, 13]
    with_copy = ready(target, random_head, history).propose(history, 4, GREEDY, 0).tokens.tolist()
    assert ready(target, random_head, history, False).propose(history, 4, GREEDY, 0).tokens.tolist() == with_copy


def test_blend_sampled_copies_where_the_heads_q_of_its_winner_is_below_the_copys_precision():
    head, yes, no = mx.array(3, dtype=mx.int32), mx.array(True), mx.array(False)
    bar = chaincopy.precision(6)
    tok, follows = chaincopy.blend_sampled(head, mx.array(bar - 0.01), 7, 6, yes, 0.5)
    assert (tok.item(), follows.item()) == (7, True)
    tok, follows = chaincopy.blend_sampled(head, mx.array(bar + 0.01), 7, 6, yes, 0.5)
    assert (tok.item(), follows.item()) == (3, False)
    tok, follows = chaincopy.blend_sampled(head, mx.array(0.01), 7, 6, no, 0.5)  # an earlier step left the copy
    assert (tok.item(), follows.item()) == (3, False)
    tok, follows = chaincopy.blend_sampled(head, mx.array(0.01), 7, 1, yes, 0.5)  # a match too short to copy
    assert (tok.item(), follows.item()) == (3, False)
    # A drafter whose own sampled drafts stand more often than the copy would: it keeps its token
    tok, follows = chaincopy.blend_sampled(head, mx.array(0.01), 7, 6, yes, bar + 0.01)
    assert (tok.item(), follows.item()) == (3, False)
    tok, follows = chaincopy.blend_sampled(head, mx.array(0.01), 3, 6, yes, bar + 0.01)  # it says the copy's
    assert (tok.item(), follows.item()) == (3, True)


def test_own_rate_counts_the_judged_steps_of_the_drafters_own_tokens():
    rate = chaincopy.OwnRate()
    assert rate.rate == 0.5  # the prior
    history = [1, 2, 3]
    # own [4, 5, 6, 7], proposed [4, 9, 6, 7] (a copy at the second step); the target said 4, 9, 8:
    # steps 1-3 were judged (the third proposal was rejected); own hit at the first only
    rate.expect(history, 3, mx.array([4, 5, 6, 7]), mx.array([4, 9, 6, 7]))
    history += [4, 9, 8]
    rate.settle(history)
    d = chaincopy.OwnRate.DECAY
    assert rate.hits == pytest.approx(1 * d + 1) and rate.judged == pytest.approx(2 * d + 3)
    rate.expect(history, 6, mx.array([1, 1]), mx.array([1, 1]))
    rate.settle(list(history) + [1, 1])  # another request's history: nothing counted
    assert rate.judged == pytest.approx(2 * d + 3)
    rate.settle(history + [1])  # nothing pending any more
    assert rate.judged == pytest.approx(2 * d + 3)


class Copier:
    """Prompt lookup's answer, fixed: a match of `match` tokens followed by `copy`."""

    def __init__(self, match, copy):
        self.match, self.tokens = match, copy

    def copy(self, history, k):
        return self.match, self.tokens[:k]


def test_a_chain_that_follows_the_copy_trusts_it_more_at_each_step():
    """Each step a chain follows the copy makes the match one token longer, so its bar rises:
    a drafter 55 % sure keeps its own token after a match of 2 (right 50 %) but not after 3."""
    unsure = mx.log(mx.array([0.55, 0.45]))
    assert chaincopy.precision(2) < 0.55 < chaincopy.precision(3)
    r = chaincopy.Round(Copier(2, [7, 8]), [1, 2], 2, on=True, greedy=True, own=chaincopy.OwnRate())
    assert r.greedy(0, mx.array(7, dtype=mx.int32), unsure).item() == 7  # the drafter agrees with the copy
    assert r.greedy(1, mx.array(3, dtype=mx.int32), unsure).item() == 8  # now a match of 3: the copy wins
    r = chaincopy.Round(Copier(2, [7, 8]), [1, 2], 2, on=True, greedy=True, own=chaincopy.OwnRate())
    assert r.greedy(0, mx.array(3, dtype=mx.int32), unsure).item() == 3  # at a match of 2 the drafter keeps its own


def test_a_sampled_round_first_settles_the_last_round_s_drafts():
    rate = chaincopy.OwnRate()
    history = [1, 2, 3]
    rate.expect(history, 3, mx.array([4, 5]), mx.array([4, 5]))
    history += [4, 5, 6]
    chaincopy.Round(Copier(0, []), history, 2, on=True, greedy=False, own=rate)
    d = chaincopy.OwnRate.DECAY
    assert rate.hits == pytest.approx(d + 2) and rate.judged == pytest.approx(2 * d + 2)  # both were the target's


def test_a_sampled_chain_copies_tokens_its_race_cannot_propose(target, random_head):
    params = SamplingParams(temperature=0.8)
    for seed in range(4):
        copied = ready(target, random_head, HISTORY).propose(HISTORY, 4, params, seed).tokens.tolist()
        own = ready(target, random_head, HISTORY, False).propose(HISTORY, 4, params, seed).tokens.tolist()
        assert copied == COPY  # the random head is far less sure of any token than a copy of 7
        assert all(t % 3 == 0 for t in own)  # its race, over its draft vocabulary


def test_without_a_repeat_a_sampled_chain_is_the_heads_race(target, random_head):
    params = SamplingParams(temperature=0.8)
    history = [5, 6, 7, 8, 9, 10, 11, 12, 13]
    for seed in range(4):
        with_copy = ready(target, random_head, history).propose(history, 4, params, seed).tokens.tolist()
        assert ready(target, random_head, history, False).propose(history, 4, params, seed).tokens.tolist() == with_copy


def test_a_fixed_shape_trees_side_leaf_is_the_heads_top_where_the_chain_copied(target, random_head):
    head_top = ready(target, random_head, HISTORY, False).propose(HISTORY, 1, GREEDY, 0).tokens.tolist()[0]
    tree = ready(target, random_head, HISTORY).propose_static_tree(HISTORY, 4, 1, GREEDY, 0)
    assert tree.tokens.tolist() == COPY + [head_top]
    assert tree.parents == [-1, 0, 1, 2, -1]


def test_a_sampled_fixed_shape_trees_side_leaves_are_the_heads_race_winners_where_the_chain_copied(target,
                                                                                                  random_head):
    params = SamplingParams(temperature=0.8)
    for seed in range(4):
        own = ready(target, random_head, HISTORY, False).propose(HISTORY, 2, params, seed).tokens.tolist()
        tree = ready(target, random_head, HISTORY).propose_static_tree(HISTORY, 2, 2, params, seed)
        t = tree.tokens.tolist()
        assert t[:3] == COPY[:2] + own[:1]  # where the copy took a step, the head's winner stands beside it
        assert t[3] != COPY[1] and t[3] % 3 == 0  # (the second step's race follows the copied first token)
        assert tree.parents == [-1, 0, -1, 0]
        # Without the copy, the chain is the race's winners and the leaves its runners-up.
        alone = ready(target, random_head, HISTORY, False).propose_static_tree(HISTORY, 2, 2, params, seed).tokens.tolist()
        assert alone[:2] == own and alone[2] != own[0] and alone[3] != own[1] and alone[2] % 3 == 0


@pytest.mark.parametrize("window", [None, 16])
def test_copying_stays_lossless_and_lets_a_poor_head_draft_repeats(target, random_head, window):
    prompt = HISTORY
    caches = None
    if window is not None:
        from mlx_lm.models.cache import RotatingKVCache
        caches = [RotatingKVCache(max_size=window, keep=4) for _ in target.layers]
    ref = reference(target, prompt, 48, caches)
    e = Engine(target, None, eagle_head=random_head, drafter="eagle", num_draft=4, max_kv_size=window)
    on = e.generate(prompt, max_tokens=48)
    off = e.generate(prompt, max_tokens=48, lookup=False)
    assert_same_greedy(target, prompt, on.tokens, ref, max_kv_size=window)
    assert off.tokens == on.tokens
    # The tiny target falls into loops, which copies follow and the random head does not.
    assert on.stats.accepted > off.stats.accepted


def test_sampled_copying_keeps_the_seeded_text_and_lets_a_poor_head_draft_repeats(target, random_head):
    """At a temperature the target's race decides every token with the same noise, so copies
    change which drafts stand, never the text; where the tiny target loops, more stand."""
    e = Engine(target, None, eagle_head=random_head, drafter="eagle", num_draft=4)
    params = dict(max_tokens=48, temperature=0.5)
    on_accepted = off_accepted = 0
    for seed in range(3):
        plain = e.generate(HISTORY, speculative=False, seed=seed, **params).tokens
        on = e.generate(HISTORY, seed=seed, **params)
        off = e.generate(HISTORY, seed=seed, lookup=False, **params)
        assert on.tokens == off.tokens == plain, seed
        on_accepted, off_accepted = on_accepted + on.stats.accepted, off_accepted + off.stats.accepted
    assert on_accepted > off_accepted


# -- a draft model's chains copy by the same rule ------------------------------------------------

@pytest.fixture(scope="module")
def flat_draft():
    """A draft model unsure of every token (its output head scaled down): any copy beats it."""
    import tiny

    d = tiny.make_llama(7, layers=1, hidden=32, tie_embeddings=False)
    d.lm_head.weight = d.lm_head.weight * 1e-3
    return d


def model_drafter(draft, copying=True):
    from mlxspec.drafters.model import ModelDrafter

    d = ModelDrafter(draft, target_vocab=draft.args.vocab_size, max_kv_size=None, headroom=5)
    d.copying = copying
    return d


def test_a_draft_models_greedy_chain_copies_where_it_is_unsure(flat_draft):
    assert model_drafter(flat_draft).propose(HISTORY, 4, GREEDY, 0).tokens.tolist() == COPY
    own = model_drafter(flat_draft, False).propose(HISTORY, 4, GREEDY, 0).tokens.tolist()
    assert own != COPY
    # A fixed-shape tree keeps the drafter's own top token beside the copied step.
    tree = model_drafter(flat_draft).propose_static_tree(HISTORY, 4, 1, GREEDY, 0)
    assert tree.tokens.tolist() == COPY + own[:1] and tree.parents == [-1, 0, 1, 2, -1]
    history = [5, 6, 7, 8, 9, 10, 11, 12, 13]  # nothing recurs: the chain is the drafter's
    assert (model_drafter(flat_draft).propose(history, 4, GREEDY, 0).tokens.tolist()
            == model_drafter(flat_draft, False).propose(history, 4, GREEDY, 0).tokens.tolist())


def test_a_draft_models_sampled_chain_copies_and_keeps_its_winner_as_the_leaf(flat_draft):
    params = SamplingParams(temperature=0.8)
    for seed in range(4):
        assert model_drafter(flat_draft).propose(HISTORY, 4, params, seed).tokens.tolist() == COPY
        own = model_drafter(flat_draft, False).propose(HISTORY, 2, params, seed).tokens.tolist()
        tree = model_drafter(flat_draft).propose_static_tree(HISTORY, 2, 1, params, seed).tokens.tolist()
        assert tree == COPY[:2] + own[:1]


def test_a_draft_models_copying_stays_lossless_and_drafts_repeats(target, flat_draft):  # noqa: F811
    """Greedy and seeded sampled text equal plain decoding's whatever the chain copies; where the
    tiny target loops, copies stand that the unsure draft's own tokens never would."""
    e = Engine(target, None, flat_draft, drafter="model", num_draft=4)
    plain = Engine(target, drafter="none")
    for params in (dict(), dict(temperature=0.5, seed=1), dict(temperature=0.5, seed=2)):
        want = plain.generate(HISTORY, max_tokens=48, **params).tokens
        on = e.generate(HISTORY, max_tokens=48, **params)
        off = e.generate(HISTORY, max_tokens=48, lookup=False, **params)
        assert on.tokens == off.tokens == want, params
        assert on.stats.accepted > off.stats.accepted, params


@pytest.mark.parametrize("drafter", ["model", "eagle"])
def test_warm_up_compiles_the_copy_step_a_reply_uses(target, random_head, flat_draft, drafter,  # noqa: F811
                                                     monkeypatch):
    """`_blend` compiles per width of the drafter's logits and dtype of its token: warm-up runs the
    very one a greedy reply's copying chain calls, so no reply compiles it."""
    seen = []
    monkeypatch.setattr(chaincopy, "_blend", lambda head, logits, *a, _o=chaincopy._blend:
                        seen.append((logits.shape, head.dtype)) or _o(head, logits, *a))
    kw = dict(draft_model=flat_draft) if drafter == "model" else dict(eagle_head=random_head)
    e = Engine(target, None, drafter=drafter, num_draft=4, **kw)
    e.warmup()
    warmed = set(seen)
    seen.clear()
    e.generate(HISTORY, max_tokens=24)
    assert seen and set(seen) <= warmed, (seen, warmed)
