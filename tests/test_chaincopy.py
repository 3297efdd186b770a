"""Copying inside the EAGLE head's greedy chains (`mlxspec.drafters.chaincopy`)."""

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


def test_sampled_chains_never_copy(target, random_head):
    params = SamplingParams(temperature=0.8)
    a = ready(target, random_head, HISTORY).propose(HISTORY, 4, params, 7)
    b = ready(target, random_head, HISTORY, False).propose(HISTORY, 4, params, 7)
    assert a.tokens.tolist() == b.tokens.tolist()
    assert a.tokens.tolist()[:len(COPY)] != COPY  # (the greedy chain copies these)


def test_a_fixed_shape_trees_side_leaf_is_the_heads_top_where_the_chain_copied(target, random_head):
    head_top = ready(target, random_head, HISTORY, False).propose(HISTORY, 1, GREEDY, 0).tokens.tolist()[0]
    tree = ready(target, random_head, HISTORY).propose_static_tree(HISTORY, 4, 1, GREEDY, 0)
    assert tree.tokens.tolist() == COPY + [head_top]
    assert tree.parents == [-1, 0, 1, 2, -1]


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
