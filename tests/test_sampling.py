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
