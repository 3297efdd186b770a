"""Mirostat: its truncations against a NumPy port of llama.cpp's samplers, a generation against a
sampler that runs it one position at a time, and speculation that keeps plain decoding's tokens."""

import math

import mlx.core as mx
import numpy as np
import pytest

import tiny
from mlxspec import Engine
from mlxspec.errors import InvalidArgumentError
from mlxspec.mirostat import truncated
from mlxspec.sampling import SamplingParams, position_keys, probabilities, sample_race

VOCAB = 12


def llama_cpp_v2(p, mu):
    """llama_sampler_mirostat_v2_apply's truncation: sorted, cut at the first token whose surprise
    passes mu (at least one kept), renormalised."""
    order = np.argsort(-p, kind="stable")
    size = next((i for i, x in enumerate(p[order]) if -math.log2(x) > mu), len(p)) if len(p) else 0
    keep = order[: max(size, 1)]
    q = np.zeros_like(p)
    q[keep] = p[keep]
    near = np.min(np.abs(-np.log2(p) - mu)) < 1e-4  # a cut float32's rounding of mu could move
    return q / q.sum(), near


def llama_cpp_v1(p, mu, m=100):
    """llama_sampler_mirostat_apply's truncation: s_hat from the m likeliest, then the top k."""
    order = np.argsort(-p, kind="stable")
    s = p[order]
    num = den = 0.0
    for i in range(min(m - 1, len(p) - 1)):
        t_i = math.log((i + 2) / (i + 1))
        b_i = math.log(s[i] / s[i + 1])
        num += t_i * b_i
        den += t_i * t_i
    s_hat = num / den
    eps = s_hat - 1
    k = (eps * 2**mu / (1 - len(p) ** -eps)) ** (1 / s_hat)
    keep = order[: max(int(k), 1)]
    q = np.zeros_like(p)
    q[keep] = p[keep]
    near = 1 <= k < len(p) and abs(k - round(k)) < 1e-4 * k  # a k float32 could round to the next integer
    return q / q.sum(), near


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("seed", range(6))
def test_truncation_matches_llama_cpp(version, seed):
    rng = np.random.default_rng(seed)
    V = [50, 400, 3000][seed % 3]
    logits = (rng.standard_normal((4, V)) * rng.uniform(1, 4)).astype(np.float32)
    p = np.array(probabilities(mx.array(logits), SamplingParams(1.0)), dtype=np.float64)
    mus = np.array([1.0, 4.0, 7.5, 12.0], dtype=np.float32)
    got = np.array(truncated(mx.array(p.astype(np.float32)), mx.array(mus), SamplingParams(1.0, mirostat=version)))
    ref = llama_cpp_v1 if version == 1 else llama_cpp_v2
    kept, exact = [], 0
    for row, g, mu in zip(p, got, mus):
        want, near = ref(row, float(mu))
        kept.append((want > 0).sum())
        if near:  # at a boundary float32 cannot tell apart: one token more or less
            assert np.sum((g > 0) != (want > 0)) <= 1
            continue
        np.testing.assert_allclose(g, want, atol=1e-5)
        exact += 1
    assert len(set(kept)) > 1 and exact >= 3  # the thresholds cut differently, and away from boundaries


def test_v2_keeps_a_token_whose_surprise_is_exactly_mu():
    """llama.cpp cuts where the surprise passes mu: one equal to it stays (0.25 at mu = 2 bits,
    exact in float32)."""
    p = mx.array([[0.5, 0.25, 0.25, 0.0], [0.5, 0.25, 0.25, 0.0]])
    got = truncated(p, mx.array([2.0, 1.5]), SamplingParams(1.0, mirostat=2))
    assert got.tolist() == [[0.5, 0.25, 0.25, 0.0], [1.0, 0.0, 0.0, 0.0]]


def reference(model, prompt, n, params, seed):
    """Mirostat one position at a time, every row computed from scratch: mu from 2 tau, each token
    the race's winner in the truncated row, mu moved by its surprise."""
    ids, mu = list(prompt), 2 * params.mirostat_tau
    for _ in range(n):
        p = probabilities(model(mx.array([ids]))[0, -1:], params)
        q = truncated(p, mx.array([mu], dtype=mx.float32), params)
        token = sample_race(q, position_keys(seed, [len(ids)])).item()
        mu = mu - params.mirostat_eta * (-math.log2(q[0, token].item()) - params.mirostat_tau)
        ids.append(token)
    return ids[len(prompt):]


@pytest.mark.parametrize("version", [1, 2])
def test_plain_decoding_is_mirostat_position_by_position(version):
    model = tiny.make_llama(seed=5, vocab_size=VOCAB, hidden=32)
    engine = Engine(model, None, drafter="ngram")
    # (at T = 2 the rows are flat enough that a tenth of a bit of tau changes the answers)
    params = SamplingParams(2.0, mirostat=version, mirostat_tau=2.5, mirostat_eta=0.3)
    prompt = [3, 7, 1, 3, 7]
    differs = 0
    for seed in range(3):
        want = reference(model, prompt, 20, params, seed)
        got = engine.generate(prompt, max_tokens=20, temperature=2.0, seed=seed, speculative=False,
                              mirostat=version, mirostat_tau=2.5, mirostat_eta=0.3).tokens
        assert got == want, seed
        differs += got != engine.generate(prompt, max_tokens=20, temperature=2.0, seed=seed, speculative=False).tokens
    assert differs  # mirostat changed the samples


@pytest.mark.parametrize("drafter", ["ngram", "model", "eagle"])
@pytest.mark.parametrize("version", [1, 2])
def test_speculation_keeps_plain_decoding_s_tokens(drafter, version, tmp_path):
    """Row i of a pass starts from the mu its drafts would leave, and the loop keeps the mu after the
    last committed token: every drafter gives plain decoding's tokens, automatic k included."""
    model = tiny.make_llama(seed=5, vocab_size=VOCAB, hidden=32)
    kw = {"ngram": {}, "model": {"draft_model": tiny.make_llama(6, vocab_size=VOCAB, hidden=16, layers=1)},
          "eagle": {"eagle_head": tiny.make_eagle_head(model, tmp_path, seed=7)}}[drafter]
    engine = Engine(model, None, drafter=drafter, **kw)
    options = dict(max_tokens=32, temperature=2.0, mirostat=version, mirostat_tau=2.5, mirostat_eta=0.3)
    drafted = accepted = 0
    for seed in range(4):
        plain = engine.generate(PROMPT, speculative=False, seed=seed, **options).tokens
        for k in (3, None):
            spec = engine.generate(PROMPT, num_draft=k, seed=seed, **options)
            assert spec.tokens == plain, (seed, k)
            drafted, accepted = drafted + spec.stats.drafted, accepted + spec.stats.accepted
    assert drafted > 0 and 0 < accepted < drafted


PROMPT = [3, 7, 1, 3, 7] * 4


@pytest.mark.parametrize("field,value,says", [
    ("mirostat", 3, "0 \\(off\\), 1 or 2"), ("mirostat", True, "0 \\(off\\), 1 or 2"), ("mirostat", 1.5, "1 or 2"), ("mirostat", 2.0, "1 or 2"),
    ("mirostat_tau", -1, "finite number >= 0"), ("mirostat_eta", float("inf"), "finite number >= 0"),
])
def test_bad_settings_are_said(field, value, says):
    with pytest.raises(InvalidArgumentError, match=f"{field} must be.*{says}"):
        SamplingParams(1.0, **{field: value})
