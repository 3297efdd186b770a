"""Typical-p, top-n-sigma and XTC: each against a direct NumPy statement of its rule (Hugging Face's
TypicalLogitsWarper; llama.cpp's top-n-sigma sampler; mlx-lm's apply_xtc), and XTC's coin keyed by
seed and position."""

import math

import mlx.core as mx
import numpy as np
import pytest

from mlxspec.errors import InvalidArgumentError
from mlxspec.sampling import SamplingParams, position_keys, probabilities, sample_race, xtc_fires

from test_sampling import np_probs


def np_typical(p, mass):
    """Hugging Face's rule: tokens by |-log p - H| ascending; keep through the first whose
    cumulative mass reaches `mass`, and every token as close to H as that one."""
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = np.log(p)
        entropy = -np.nansum(np.where(p > 0, p * logp, 0.0))
        distance = np.abs(-logp - entropy)
    order = np.argsort(distance, kind="stable")
    last = min(int((np.cumsum(p[order]) < mass).sum()), len(p) - 1)
    keep = distance <= distance[order][last]
    q = np.where(keep, p, 0.0)
    return q / q.sum()


def np_xtc(p, threshold, special=()):
    """mlx-lm's apply_xtc where it fires: every token above the threshold but the least likely of
    them is dropped, the special ones kept."""
    above = p[p > threshold]
    if len(above) < 2:
        return p
    drop = p > above.min()
    drop[list(special)] = False
    q = np.where(drop, 0.0, p)
    return q / q.sum()


ROWS = np.random.default_rng(0).normal(size=(4, 60)).astype(np.float32) * 2.5


@pytest.mark.parametrize("t,mass,top_k", [(1.0, 0.9, 0), (0.7, 0.5, 0), (1.3, 0.2, 0), (1.0, 0.95, 12),
                                          (1.0, 1e-6, 0)])
def test_typical_p_matches_numpy(t, mass, top_k):
    got = np.array(probabilities(mx.array(ROWS), SamplingParams(t, top_k=top_k, typical_p=mass)))
    for row, g in zip(ROWS, got):
        p = np_probs(row.astype(np.float64), t, top_k)  # top-k's zeros are never typical
        want = np_typical(p, mass) if not top_k else np_typical(np_probs(row.astype(np.float64), t), mass)
        if top_k:  # both filters judge the same temperature-scaled row; what both keep stays
            want = np.where((want > 0) & (p > 0), np_probs(row.astype(np.float64), t), 0.0)
            want /= want.sum()
        np.testing.assert_allclose(g, want, atol=1e-6)
        assert (g > 0).sum() < len(g)  # the filter dropped something: the test shows it
    assert abs(got.sum(-1) - 1).max() < 1e-5


def test_typical_p_keeps_a_token_near_the_entropy_over_the_likeliest():
    # One token at 0.3, a hundred at 0.007: H is 3.83 nats, the tail's surprise 4.96, the top's
    # 1.20: the tail is closer to typical, and a small mass keeps it (ties and all), not the top.
    p = np.array([0.3] + [0.7 / 100] * 100)
    got = np.array(probabilities(mx.array(np.log(p).astype(np.float32)), SamplingParams(1.0, typical_p=0.3)))
    assert got[0] == 0 and got[1:].sum() == pytest.approx(1.0, abs=1e-6)


def np_top_n_sigma(logits, t, n):
    """llama.cpp's top-n-sigma on the logits (-inf ones left out of the mean and deviation), then
    the softmax at temperature t of what is kept."""
    live = logits[np.isfinite(logits)]
    keep = logits >= live.max() - n * live.std()
    z = np.where(keep, logits / t, -np.inf)
    q = np.exp(z - z.max())
    return q / q.sum()


@pytest.mark.parametrize("t,n", [(1.0, 1.0), (0.5, 1.0), (1.5, 0.3), (1.0, 2.5)])
def test_top_n_sigma_matches_llama_cpp_whatever_the_temperature(t, n):
    rows = ROWS.copy()
    rows[1, :7] = -np.inf  # banned tokens (a logit_bias of -100) count in neither the mean nor the deviation
    got = np.array(probabilities(mx.array(rows), SamplingParams(t, top_n_sigma=n)))
    for row, g in zip(rows, got):
        want = np_top_n_sigma(row.astype(np.float64), t, n)
        np.testing.assert_allclose(g, want, atol=1e-6)
        assert 1 <= (g > 0).sum() < len(g)


@pytest.mark.parametrize("threshold,special", [(0.1, ()), (0.05, (3, 7)), (0.02, ()), (0.5, ())])
def test_xtc_where_it_fires_matches_numpy(threshold, special):
    params = SamplingParams(1.0, xtc_probability=1.0, xtc_threshold=threshold, xtc_special=special)
    fires = mx.array([True, False, True, True])
    got = np.array(probabilities(mx.array(ROWS), params, fires))
    for row, g, fired in zip(ROWS, got, fires.tolist()):
        p = np_probs(row.astype(np.float64), 1.0)
        np.testing.assert_allclose(g, np_xtc(p, threshold, special) if fired else p, atol=1e-6)


def test_xtc_keeps_the_least_likely_above_the_threshold_and_keys_specials_by_token_id():
    p = np.array([0.05, 0.4, 0.25, 0.2, 0.1])
    logits = mx.array(np.log(p).astype(np.float32))
    params = SamplingParams(1.0, xtc_probability=1.0, xtc_threshold=0.15)
    got = np.array(probabilities(logits, params, mx.array([True])))
    np.testing.assert_allclose(got, [0.05 / 0.35, 0, 0, 0.2 / 0.35, 0.1 / 0.35], atol=1e-6)
    # a drafter's smaller vocabulary: column 1 is token 40, which is special and stays
    special = SamplingParams(1.0, xtc_probability=1.0, xtc_threshold=0.15, xtc_special=(40,))
    got = np.array(probabilities(logits, special, mx.array([True]), mx.array([9, 40, 11, 12, 13])))
    np.testing.assert_allclose(got, np.array([0.05, 0.4, 0, 0.2, 0.1]) / 0.75, atol=1e-6)


def test_xtc_leaves_greedy_alone():
    params = SamplingParams(0.0, xtc_probability=1.0, xtc_threshold=0.0)
    assert xtc_fires(params, position_keys(0, [0, 1])) is None
    assert xtc_fires(SamplingParams(1.0), position_keys(0, [0])) is None


def test_xtc_fires_at_its_rate_independently_of_positions_and_seeds():
    n, rate = 40_000, 0.3
    params = SamplingParams(1.0, xtc_probability=rate)
    a = np.array(xtc_fires(params, position_keys(11, mx.arange(n))))
    b = np.array(xtc_fires(params, position_keys(12, mx.arange(n))))
    sd = math.sqrt(rate * (1 - rate) / n)
    assert abs(a.mean() - rate) < 5 * sd and abs(b.mean() - rate) < 5 * sd
    both = (a & b).mean()  # independent seeds: rate^2 of positions fire in both
    assert abs(both - rate**2) < 5 * math.sqrt(rate**2 * (1 - rate**2) / n)
    again = np.array(xtc_fires(params, position_keys(11, mx.arange(n))))
    assert (again == a).all()  # a function of seed and position


def test_xtc_coin_is_not_the_races_noise():
    # Sampling a row with the coin: the marginal over positions is the mixture of the row with
    # and without XTC. A coin correlated with the race's noise would bias it.
    n = 30_000
    p = np.array([0.35, 0.3, 0.2, 0.1, 0.05])
    logits = mx.array(np.tile(np.log(p).astype(np.float32), (n, 1)))
    params = SamplingParams(1.0, xtc_probability=0.5, xtc_threshold=0.15)
    keys = position_keys(5, mx.arange(n))
    tokens = np.array(sample_race(probabilities(logits, params, xtc_fires(params, keys)), keys))
    fired = np_xtc(p, 0.15)
    want = 0.5 * p + 0.5 * fired
    got = np.bincount(tokens, minlength=5) / n
    np.testing.assert_array_less(np.abs(got - want), 5 * np.sqrt(want * (1 - want) / n) + 1e-12)


@pytest.mark.parametrize("field,value,allowed", [
    ("typical_p", 0.0, r"in \(0, 1\]"), ("typical_p", 1.5, r"in \(0, 1\]"), ("typical_p", "0.5", r"in \(0, 1\]"),
    ("xtc_probability", -0.1, r"in \[0, 1\]"), ("xtc_probability", float("nan"), r"in \[0, 1\]"),
    ("xtc_threshold", 0.6, r"in \[0, 0.5\]"), ("xtc_threshold", True, r"in \[0, 0.5\]"),
    ("top_n_sigma", float("inf"), "a finite number"), ("top_n_sigma", "1", "a finite number"),
])
def test_bad_values_are_said_with_their_range(field, value, allowed):
    with pytest.raises(InvalidArgumentError, match=f"{field} must be {allowed}"):
        SamplingParams(1.0, **{field: value})


@pytest.mark.parametrize("other", [{"top_k": 1}, {"top_n_sigma": 0.1}, {"min_p": 0.5}, {"top_p": 0.05}])
def test_where_typical_p_keeps_nothing_the_others_keep_the_likeliest_token_stays(other):
    # One token at 0.13, fifty at 0.017: typical-p 0.5 keeps only the tail, each filter beside it
    # only the top. Their intersection is empty: the row would be 0 / 0 (NaN, then any token,
    # one a grammar bans included) without the likeliest kept.
    row = np.array([[2.0] + [0.0] * 50, [0.0] * 25 + [2.0] + [0.0] * 25], np.float32)
    alone = np.array(probabilities(mx.array(row), SamplingParams(1.0, typical_p=0.5)))
    assert alone[0, 0] == 0 and alone[1, 25] == 0  # typical-p alone drops the top
    got = np.array(probabilities(mx.array(row), SamplingParams(1.0, typical_p=0.5, **other)))
    np.testing.assert_array_equal(got, np.eye(51, dtype=np.float32)[[0, 25]])
    keys = position_keys(3, [0, 1])
    assert np.array(sample_race(mx.array(got), keys)).tolist() == [0, 25]


def test_where_typical_p_and_the_others_share_tokens_only_those_stay():
    # the same row with a top-k wide enough to reach the tail's ties: their common tokens, as before
    row = np.array([2.0] + [0.0] * 50, np.float32)
    got = np.array(probabilities(mx.array(row), SamplingParams(1.0, typical_p=0.5, top_k=5)))
    p = np_probs(row.astype(np.float64), 1.0)
    np.testing.assert_allclose(got, np_typical(p, 0.5), atol=1e-6)
