"""Processed probabilities: each filter against a direct NumPy statement of its rule."""

import mlx.core as mx
import numpy as np
import pytest

from mlxspec.sampling import SamplingParams, probabilities


def np_probs(logits, t, top_k=0, top_p=1.0, min_p=0.0):
    z = logits / t
    p = np.exp(z - z.max())
    p /= p.sum()
    keep = np.ones_like(p, bool)
    if top_k:
        keep &= p >= np.sort(p)[-top_k]
    if top_p < 1:
        s = np.sort(p)[::-1]
        before = np.cumsum(s) - s
        keep &= p >= s[before < top_p].min()
    if min_p:
        keep &= p >= min_p * p.max()
    q = np.where(keep, p, 0)
    return q / q.sum()


@pytest.mark.parametrize("t,top_k,top_p,min_p", [
    (1.0, 0, 1.0, 0.0), (0.7, 5, 1.0, 0.0), (1.3, 0, 0.8, 0.0), (0.9, 0, 1.0, 0.1),
    (0.6, 10, 0.9, 0.05), (2.0, 1, 1.0, 0.0), (1.0, 0, 0.01, 0.0),
])
def test_filters_match_numpy(t, top_k, top_p, min_p):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 50)).astype(np.float32) * 3
    got = np.array(probabilities(mx.array(logits), SamplingParams(t, top_p, top_k, min_p)))
    for row, g in zip(logits, got):
        np.testing.assert_allclose(g, np_probs(row.astype(np.float64), t, top_k, top_p, min_p), atol=1e-6)
        assert abs(g.sum() - 1) < 1e-5


def test_greedy_is_one_hot_first_index_on_ties():
    logits = mx.array([[1.0, 3.0, 3.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    p = np.array(probabilities(logits, SamplingParams(0.0)))
    assert p.tolist() == [[0, 1, 0, 0], [1, 0, 0, 0]]


def test_ties_at_threshold_are_kept():
    logits = mx.array([[2.0, 1.0, 1.0, 1.0, 0.0]])
    p = np.array(probabilities(logits, SamplingParams(1.0, top_k=2)))[0]
    assert (p[:4] > 0).all() and p[4] == 0


@pytest.mark.parametrize("t", [1e-30, 1e-40, 5e-45, 1e-46, 1e-300])  # the last two round to 0 in float32
def test_tiny_temperature_is_the_argmax_not_nan(t):
    # logits / 1e-40 overflows float32; the row must still be the T -> 0 limit: the argmax,
    # ties sharing the mass.
    logits = mx.array([[1.0, 30.0, 3.0, 30.0], [-2.0, 0.5, 0.4, -50.0]])
    p = np.array(probabilities(logits, SamplingParams(t)))
    assert np.isfinite(p).all()
    np.testing.assert_allclose(p, [[0, 0.5, 0, 0.5], [0, 1, 0, 0]], atol=1e-7)


@pytest.mark.parametrize("top_p", [1e-300, 1e-45, 1e-8])
def test_top_p_below_every_mass_keeps_the_top_token(top_p):
    # 1e-300 rounds to 0 in float32: the smallest kept set must still hold the top token.
    logits = mx.array(np.random.default_rng(1).normal(size=(3, 40)).astype(np.float32))
    p = np.array(probabilities(logits, SamplingParams(1.0, top_p=top_p)))
    assert np.isfinite(p).all()
    np.testing.assert_array_equal(p, np.eye(40)[np.argmax(np.array(logits), -1)])


@pytest.mark.parametrize("field,value", [
    ("temperature", 10 ** 400), ("temperature", -(10 ** 400)), ("top_p", 10 ** 400), ("min_p", -(10 ** 400)),
    ("temperature", float("nan")), ("top_p", float("nan")), ("min_p", float("nan")), ("temperature", "0.7"),
    ("temperature", True), ("top_p", True), ("min_p", False),
], ids=lambda v: v if isinstance(v, str) else repr(v)[:12])
def test_out_of_range_numbers_are_invalid_arguments(field, value):
    from mlxspec.errors import InvalidArgumentError
    with pytest.raises(InvalidArgumentError, match=field) as e:
        SamplingParams(**{field: value})
    assert len(str(e.value)) < 120  # a 400-digit number is not echoed back whole
