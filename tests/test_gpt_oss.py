"""gpt-oss MLX models (mlx-lm's `gpt_oss`: experts, attention sinks, windowed and full layers)
decode losslessly through the engine's caches: plain decoding is mlx-lm's, and chains and trees,
of the n-gram drafter and of an EAGLE head, give plain decoding's tokens."""

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

import tiny
from mlxspec import Engine
from test_engine_trees import flat_curve

PROMPT = [5, 6, 7, 8, 9, 10, 5, 6, 7, 11, 12] * 3  # 33 tokens: past the window (6) many times


@pytest.fixture(scope="module")
def model():
    return tiny.make_gpt_oss(0)


def test_plain_decoding_is_mlx_lms(model):
    plain = Engine(model, None).generate(PROMPT, max_tokens=40, speculative=False).tokens
    theirs = [int(t) for t, _ in generate_step(mx.array(PROMPT), model, max_tokens=40)]
    assert plain == theirs


@pytest.mark.parametrize("drafter", ["ngram", "eagle"])
def test_chains_and_trees_decode_plainly(model, drafter, tmp_path):
    plain = Engine(model, None).generate(PROMPT, max_tokens=40, speculative=False).tokens
    head = tiny.make_eagle_head(model, tmp_path, seed=3) if drafter == "eagle" else None
    chain = Engine(model, None, eagle_head=head, drafter=drafter, num_draft=4, tree="off")
    trees = flat_curve(Engine(model, None, eagle_head=head, drafter=drafter))
    for engine in (chain, trees):
        r = engine.generate(PROMPT, max_tokens=40)
        assert r.tokens == plain and r.stats.drafted > 0
    assert r.stats.tree_rounds > 0, "no tree was verified"
