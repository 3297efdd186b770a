"""Tree rounds in the generation loop: greedy and seeded sampling equal plain decoding.

On this CPU the cost model keeps trees small or off, so these tests stand in for a device
where a pass over many tokens costs what one does: the shared target curve is made flat,
and every proposal's tree is then verified whole.
"""

import pytest

import tiny
from mlxspec import Engine
from mlxspec.errors import InvalidArgumentError

# Repeated n-grams with different continuations: the n-gram drafter proposes branches.
PROMPT = [5, 6, 7, 8, 9, 5, 6, 7, 11, 12, 5, 6, 7, 8, 13, 5, 6, 7, 11, 9, 5, 6, 7]


def flat_curve(engine):
    """Verification as cheap for any number of tokens as for one, and drafting free: trees always pay."""
    engine.curve.verify_seconds = lambda j: 1.0
    engine.curve.plain_seconds = lambda: 1.0
    for cost in engine.costs.values():
        cost.observe_draft(1, 0.0)
    return engine


def check_chains_and_trees_decode_plainly(model, tokenizer, *, max_kv_size=None, max_tokens=40):
    """Greedy chains (fixed k = 3) and whole trees (`flat_curve`) give `model` plain decoding's
    tokens on PROMPT, with drafts made and trees verified: for models of other architectures."""
    plain = Engine(model, tokenizer, None, drafter="none", max_kv_size=max_kv_size)
    plain = plain.generate(PROMPT, max_tokens=max_tokens)
    chain = Engine(model, tokenizer, None, drafter="ngram", num_draft=3, tree="off", max_kv_size=max_kv_size)
    trees = flat_curve(Engine(model, tokenizer, None, drafter="ngram", max_kv_size=max_kv_size))
    for engine in (chain, trees):
        r = engine.generate(PROMPT, max_tokens=max_tokens)
        assert r.tokens == plain.tokens and r.stats.drafted > 0
    assert r.stats.tree_rounds > 0, "no tree was verified"


@pytest.fixture(scope="module")
def target():
    return tiny.make_llama(1)


@pytest.mark.parametrize("max_kv", [None, 16])
def test_greedy_trees_equal_plain_decoding(target, max_kv):
    plain = Engine(target, drafter="ngram", max_kv_size=max_kv).generate(PROMPT, max_tokens=60, speculative=False)
    e = flat_curve(Engine(target, drafter="ngram", max_kv_size=max_kv))
    r = e.generate(PROMPT, max_tokens=60)
    assert r.stats.tree_rounds > 0, "no tree was verified"
    assert r.tokens == plain.tokens
    again = e.generate(PROMPT + r.tokens[:5], max_tokens=30)  # a second turn reuses the compacted caches
    ref = Engine(target, drafter="ngram", max_kv_size=max_kv).generate(PROMPT + r.tokens[:5], max_tokens=30,
                                                                        speculative=False)
    assert again.tokens == ref.tokens


def test_gemma3_sliding_layers_with_trees():
    model = tiny.make_gemma3(5, sliding_window=6)
    plain = Engine(model, drafter="ngram").generate(PROMPT, max_tokens=40, speculative=False)
    r = flat_curve(Engine(model, drafter="ngram")).generate(PROMPT, max_tokens=40)
    assert r.stats.tree_rounds > 0
    assert r.tokens == plain.tokens


def test_seeded_sampling_with_trees_equals_plain_decoding(target):
    # Deterministic candidates are checked by the target's own position-keyed samples, so a
    # seeded run gives plain decoding's very tokens whatever the tree looked like.
    kw = dict(max_tokens=50, temperature=0.8, top_k=20, seed=7)
    plain = Engine(target, drafter="ngram").generate(PROMPT, speculative=False, **kw)
    r = flat_curve(Engine(target, drafter="ngram")).generate(PROMPT, **kw)
    assert r.stats.tree_rounds > 0
    assert r.tokens == plain.tokens


def test_tree_off_and_caps(target):
    off = flat_curve(Engine(target, drafter="ngram")).generate(PROMPT, max_tokens=30, tree="off").stats
    assert off.tree_rounds == 0 and off.drafted > 0
    e = flat_curve(Engine(target, drafter="ngram"))
    capped = e.generate(PROMPT, max_tokens=30, tree=5).stats
    assert capped.tree_rounds > 0 and max(capped.tree_histogram) <= 5
    with pytest.raises(InvalidArgumentError, match="tree"):
        e.generate(PROMPT, tree="wide")
    with pytest.raises(InvalidArgumentError, match="tree"):
        Engine(target, drafter="ngram", tree=0)


@pytest.mark.parametrize("shaping", [dict(repetition_penalty=1.3),
                                     dict(temperature=0.8, mirostat=2, mirostat_tau=4.0, seed=3)])
def test_rows_shaped_by_the_path_so_far_are_verified_as_chains_not_trees(target, shaping):
    """Penalties and mirostat shape each row by the tokens before it, which a tree's branches do not
    share: such requests verify chains (longer than one token where drafts pay), never trees."""
    plain = Engine(target, drafter="ngram").generate(PROMPT, max_tokens=40, speculative=False, **shaping)
    r = flat_curve(Engine(target, drafter="ngram")).generate(PROMPT, max_tokens=40, **shaping)
    assert r.tokens == plain.tokens
    assert r.stats.tree_rounds == 0 and max(r.stats.k_histogram) > 1
