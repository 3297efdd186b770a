"""EAGLE heads for targets whose logits are their linear head's output mapped once more: soft-capped
(Gemma 2), divided (Granite) or multiplied (Cohere). The engine splits them exactly, a head drafts
for them losslessly, and its law is the one the target's own head gives its features."""

import mlx.core as mx
import numpy as np
import pytest

import tiny
from mlxspec import Engine
from mlxspec.backbone import LogitMap, logit_map, split_model
from mlxspec.drafters.eagle import EagleDrafter, load_head
from mlxspec.sampling import SamplingParams, probabilities, race, race_noise
from mlxspec.sequence import Sequence
from test_engine_sampling import VOCAB as SAMPLING_VOCAB, assert_first_two_follow_the_target
from test_engine_trees import flat_curve

PROMPT = [5, 6, 7, 8, 9, 10, 5, 6, 7, 11, 12]

FAMILIES = {
    "gemma2": (lambda **kw: tiny.make_gemma2(1, **kw), LogitMap("softcap", 3.0)),
    "granite": (lambda **kw: tiny.make_granite(2, **kw), LogitMap("divide", 0.25)),
    "cohere": (lambda **kw: tiny.make_cohere(3, **kw), LogitMap("multiply", 0.5)),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    make, want = FAMILIES[request.param]
    return request.param, make(), want


@pytest.fixture(scope="module")
def head(family, tmp_path_factory):
    name, target, _ = family
    return tiny.make_eagle_head(target, tmp_path_factory.mktemp(name), seed=4,
                                draft_ids=list(range(0, tiny.VOCAB, 2)))


def test_the_split_head_is_the_models_own_logits(family):
    """Backbone + the mapped head give exactly the model's logits; the map is the family's, and it
    changes them (so a plain linear head would not do)."""
    name, target, want = family
    assert logit_map(target) == want
    backbone, head = split_model(target)
    x = mx.array([PROMPT])
    h = backbone(x)
    assert mx.array_equal(head(h), target(x)).item()
    linear = target.lm_head(h) if "lm_head" in target else target.model.embed_tokens.as_linear(h)
    assert not mx.allclose(linear, target(x), atol=1e-3).item()


def test_plain_families_have_no_map():
    assert logit_map(tiny.make_llama(1, layers=1)) is None
    assert logit_map(tiny.make_gemma3(1)) is None


@pytest.mark.parametrize("num_draft", [None, 4])
def test_greedy_matches_plain_decoding(family, head, num_draft):
    _, target, _ = family
    plain = Engine(target, None).generate(PROMPT, max_tokens=40, speculative=False)
    e = Engine(target, None, eagle_head=head, drafter="eagle", num_draft=num_draft)
    r = e.generate(PROMPT, max_tokens=40)
    assert r.tokens == plain.tokens and r.stats.drafter == "eagle"
    if num_draft:  # fixed k: every round drafts
        assert r.stats.drafted > 0


def test_greedy_trees_match_plain_decoding(family, head):
    _, target, _ = family
    plain = Engine(target, None).generate(PROMPT, max_tokens=40, speculative=False)
    r = flat_curve(Engine(target, None, eagle_head=head, drafter="eagle")).generate(PROMPT, max_tokens=40)
    assert r.tokens == plain.tokens
    assert r.stats.tree_rounds > 0, "no tree was verified"


def test_the_heads_law_is_the_targets_law_of_its_features(family, head):
    """The drafter maps its output rows' logits as the target maps its own: fed the target's own
    features, its draft logits are the target's logits of the draft vocabulary."""
    _, target, want = family
    loaded, ids, _ = load_head(head, target)
    seq = Sequence(target, max_kv_size=None, headroom=8, keep_hidden=True)
    drafter = EagleDrafter(loaded, ids, seq, max_kv_size=None, headroom=8)
    backbone, split = split_model(target)
    f = backbone(mx.array([PROMPT]))[0]  # (S, H): the target's features
    got = drafter.logits(f).astype(mx.float32)
    ref = split(f)[:, ids]
    # The same dot products summed in another order (the draft rows are gathered), then the map.
    assert mx.allclose(got, ref, atol=tiny.float32_tol() * float(mx.abs(ref).max()), rtol=0).item()
    if want.kind == "softcap":
        assert float(mx.abs(got).max()) <= want.value
    # The greedy step's compiled call maps them too, and takes the same top token.
    logits, local, top = drafter._top(f[-1:])
    assert mx.allclose(logits, got[-1], atol=tiny.float32_tol() * float(mx.abs(ref).max()), rtol=0).item()
    assert top.item() == ids[int(mx.argmax(got[-1]).item())].item()


@pytest.mark.parametrize("name", list(FAMILIES))
def test_sampling_follows_the_target(name, tmp_path):
    """The first two sampled tokens follow the target's exact law with the head's q."""
    make, _ = FAMILIES[name]
    t = make(vocab_size=SAMPLING_VOCAB, hidden=32)
    head = tiny.make_eagle_head(t, tmp_path, seed=7, draft_ids=list(range(1, SAMPLING_VOCAB, 2)))
    params = SamplingParams(0.9, top_p=0.95)
    assert_first_two_follow_the_target(Engine(t, None, eagle_head=head, drafter="eagle", num_draft=2), t, params)


def test_sampled_drafts_race_on_the_mapped_law(tmp_path):
    """At T = 1 a sampled draft races on the softmax of the mapped logits: its most likely token is
    no more likely than the cap allows (a plain head would put nearly all of q on it), and the
    drafts are that race's winners."""
    t = tiny.make_gemma2(5, cap=1.0)
    head = tiny.make_eagle_head(t, tmp_path, seed=8)
    loaded, ids, _ = load_head(head, t)
    seq = Sequence(t, max_kv_size=None, headroom=8, keep_hidden=True)
    drafter = EagleDrafter(loaded, ids, seq, max_kv_size=None, headroom=8)
    seq.prefill(PROMPT[:-1])
    params = SamplingParams(1.0)
    firsts = [drafter.propose(PROMPT, 3, params, seed).tokens.tolist()[0] for seed in range(16)]
    drafter._sync(PROMPT)
    q = probabilities(drafter.logits(drafter._feed(PROMPT, len(PROMPT) - 1)[0]).astype(mx.float32), params)
    # Logits within [-1, 1]: no token's probability exceeds e^2 times another's.
    assert float(mx.max(q)) <= np.exp(2.0) * float(mx.min(q)) * (1 + 1e-4)
    vocab = mx.arange(q.shape[-1])  # (this head drafts over the whole vocabulary)
    assert firsts == [int(race(q[None], race_noise(seed, [len(PROMPT)], vocab))[0].item()) for seed in range(16)]
