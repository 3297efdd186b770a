"""End to end: speculative sampling emits the target's own distribution.

A 12-token vocabulary keeps the joint law of the first two generated tokens small (144
cells), so it can be computed exactly from the target and compared with the engine's
empirical law. Tolerance: 4x the expected total-variation of N draws from the true law.
"""

import math

import mlx.core as mx
import numpy as np
import pytest

import tiny
from mlxspec import Engine
from mlxspec.sampling import SamplingParams, probabilities

VOCAB = 12
PROMPT = [3, 7, 1, 3, 7]  # the tail [3, 7] recurs: the n-gram drafter proposes too
N = 1500


def law(rows, params):
    """The law of a sampled position: with XTC, the mixture of its rows with and without it (it
    fires with probability xtc_probability, independently at each position)."""
    p = np.array(probabilities(rows, params), dtype=np.float64)
    if not params.xtc:
        return p
    fired = np.array(probabilities(rows, params, mx.ones(rows.shape[:-1], dtype=mx.bool_)), dtype=np.float64)
    return (1 - params.xtc_probability) * p + params.xtc_probability * fired


def exact_joint(model, params, prompt=PROMPT):
    first = law(model(mx.array([prompt]))[0, -1], params)
    batch = mx.array([prompt + [t] for t in range(VOCAB)])
    second = law(model(batch)[:, -1], params)
    return first[:, None] * second  # (t1, t2)


SAMPLERS = ("temperature", "top_p", "top_k", "min_p", "typical_p", "xtc_probability", "xtc_threshold", "top_n_sigma")


@pytest.mark.parametrize("params,drafter", [
    (SamplingParams(0.8, top_p=0.9, top_k=8), "model"),
    (SamplingParams(1.0, min_p=0.05), "ngram"),
    (SamplingParams(1.0, typical_p=0.7), "model"),
    (SamplingParams(1.2, top_n_sigma=1.0), "ngram"),
    (SamplingParams(1.0, xtc_probability=0.6, xtc_threshold=0.08), "model"),
    (SamplingParams(0.9, top_k=10, xtc_probability=0.5, xtc_threshold=0.1), "ngram"),
])
def test_first_two_tokens_follow_the_target(params, drafter):
    target = tiny.make_llama(5, vocab_size=VOCAB, hidden=32)
    draft = tiny.make_llama(6, vocab_size=VOCAB, hidden=16, layers=1)
    if params.typical_p < 1 or params.xtc or params.top_n_sigma > 0:  # it changes the law, or the test shows nothing
        plain = law(target(mx.array([PROMPT]))[0, -1], SamplingParams(params.temperature, top_k=params.top_k))
        assert 0.5 * np.abs(law(target(mx.array([PROMPT]))[0, -1], params) - plain).sum() > 0.05
    assert_first_two_follow_the_target(Engine(target, None, draft, drafter=drafter, num_draft=2), target, params)


def assert_first_two_follow_the_target(engine, target, params):
    """N seeded runs of 2 tokens from PROMPT: their empirical joint law is the target's, within 4x
    the expected total variation of N draws; and the runs did draft."""
    joint = exact_joint(target, params)
    counts = np.zeros((VOCAB, VOCAB))
    drafted = 0
    for seed in range(N):
        r = engine.generate(PROMPT, max_tokens=2, seed=seed, **{k: getattr(params, k) for k in SAMPLERS})
        counts[r.tokens[0], r.tokens[1]] += 1
        drafted += r.stats.drafted
    assert drafted > 0
    emp = counts / N
    tv = 0.5 * np.abs(emp - joint).sum()
    tol = 4 * 0.5 * np.sqrt(joint * (1 - joint) / N).sum()
    assert tv <= tol, f"TV {tv:.4f} > {tol:.4f}"


@pytest.mark.parametrize("drafter", ["ngram", "model", "eagle"])
@pytest.mark.parametrize("num_draft", [3, None])
@pytest.mark.parametrize("filters", [{}, {"typical_p": 0.8, "xtc_probability": 0.5}])
def test_seeded_speculation_samples_the_plain_tokens(num_draft, drafter, filters, tmp_path):
    """Every draft is checked against the token plain decoding would sample at that position (the
    race's noise is keyed by seed, position and token), and a model drafter races its q with that
    same noise, so a seed gives the same text with and without speculation, whatever drafted and
    whatever the draft lengths were. XTC's coin is keyed by seed and position too."""
    model = tiny.make_llama(seed=5, vocab_size=VOCAB, hidden=32)
    kw = {"ngram": {}, "model": {"draft_model": tiny.make_llama(6, vocab_size=VOCAB, hidden=16, layers=1)},
          "eagle": {"eagle_head": tiny.make_eagle_head(model, tmp_path, seed=7)}}[drafter]
    engine = Engine(model, None, drafter=drafter, **kw)
    prompt = PROMPT * 4
    params = dict(max_tokens=32, temperature=0.9, top_p=0.95, **filters)
    drafted = accepted = 0
    for seed in range(4):
        plain = engine.generate(prompt, speculative=False, seed=seed, **params).tokens
        spec = engine.generate(prompt, num_draft=num_draft, seed=seed, **params)
        assert spec.tokens == plain, seed
        drafted, accepted = drafted + spec.stats.drafted, accepted + spec.stats.accepted
    if num_draft is not None:
        assert drafted > 0 and accepted > 0  # the comparison covered verified drafts, kept and not
        assert accepted < drafted


@pytest.mark.parametrize("drafter", ["model", "eagle"])
@pytest.mark.parametrize("filters", [{}, {"typical_p": 0.9, "xtc_probability": 0.5, "xtc_threshold": 0.05}])
def test_a_drafter_with_the_targets_law_has_every_sampled_draft_accepted(drafter, filters, tmp_path):
    """The coupling: a drafter whose q is the target's p (the target's copy, or a head built from
    its one layer that attends to its keys) runs the very race the target runs at each
    position, so at a temperature its drafts are all accepted, as greedy drafts of a copy are.
    A drafter racing with other noise would match about sum p^2 of the time. With XTC, only a
    drafter that tosses the target's coin at each position keeps that."""
    model = tiny.make_llama(seed=5, vocab_size=VOCAB, hidden=32, layers=1)
    kw = {"model": {"draft_model": tiny.make_llama(seed=5, vocab_size=VOCAB, hidden=32, layers=1)},
          "eagle": {"eagle_head": tiny.make_eagle_head(model, tmp_path, copy=True, context="target")}}[drafter]
    engine = Engine(model, None, drafter=drafter, num_draft=3, **kw)
    drafted = accepted = 0
    for seed in range(6):
        s = engine.generate(PROMPT, max_tokens=24, temperature=1.0, seed=seed, **filters).stats
        drafted, accepted = drafted + s.drafted, accepted + s.accepted
    assert drafted >= 6 * 3 * 5 and accepted == drafted


@pytest.mark.parametrize("drafter", ["ngram", "model", "eagle"])
@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "top_k": 4}, {"temperature": 1.5, "mirostat": 2,
                                                                              "mirostat_tau": 2.0}])
def test_post_sampling_logprobs_are_the_rows_the_tokens_were_drawn_from(drafter, sampling, tmp_path):
    """With post_sampling_probs, each token's logprob and its top choices are of the processed row it
    was drawn from, drafted or not: the same as plain decoding's, the top choices only tokens of
    some mass (top_k's four), summing to 1; greedy, the chosen token's 0 alone."""
    model = tiny.make_llama(seed=5, vocab_size=VOCAB, hidden=32)
    kw = {"ngram": {}, "model": {"draft_model": tiny.make_llama(6, vocab_size=VOCAB, hidden=16, layers=1)},
          "eagle": {"eagle_head": tiny.make_eagle_head(model, tmp_path, seed=7)}}[drafter]
    engine = Engine(model, None, drafter=drafter, **kw)
    options = dict(max_tokens=24, logprobs=6, post_sampling_probs=True, seed=2, **sampling)
    spec = engine.generate(PROMPT * 4, num_draft=3, **options)
    plain = engine.generate(PROMPT * 4, speculative=False, **options)
    assert spec.tokens == plain.tokens and spec.stats.drafted > 0
    tol = tiny.float32_tol(1e-4) * 10
    for lp, want, top, want_top in zip(spec.logprobs, plain.logprobs, spec.top_logprobs, plain.top_logprobs):
        assert abs(lp - want) <= tol and [i for i, _ in top] == [i for i, _ in want_top]
        assert math.isclose(sum(math.exp(v) for _, v in top), 1.0, rel_tol=1e-4) or len(top) == 6
        if not sampling:
            assert lp == 0.0 and len(top) == 1
        elif "top_k" in sampling:
            assert len(top) == 4
