"""The exponential race that picks every sampled token (`mlxspec.sampling.race`): its law, its
noise, and that a position's token depends on nothing but its row, the seed and the position."""

import math

import mlx.core as mx
import numpy as np

from mlxspec.sampling import position_keys, race, race_noise, sample_race, sample_race_two

# Chi-square critical values at P = 1e-3 by degrees of freedom.
CHI2_999 = {1: 10.83, 3: 16.27, 4: 18.47}


def raced(p, n, seed=0, start=0):
    """Tokens picked at positions start .. start+n-1 for the same row p."""
    rows = mx.broadcast_to(mx.array(p, dtype=mx.float32), (n, len(p)))
    return np.array(sample_race(rows, position_keys(seed, mx.arange(start, start + n))))


def test_each_token_wins_with_its_probability_and_zero_mass_never():
    p = np.array([0.1, 0.0, 0.35, 0.05, 0.2, 0.3])
    n = 60_000
    counts = np.bincount(raced(p, n), minlength=len(p))
    assert counts[1] == 0
    live = p > 0
    chi2 = float((((counts - n * p) ** 2)[live] / (n * p[live])).sum())
    assert chi2 < CHI2_999[4], (chi2, counts)


def test_an_unlikely_token_keeps_its_small_share():
    """p = 1e-3 against 0.999: the race's noise is precise where an unlikely token wins (small
    exponentials), so its count is binomial(n, 1e-3); 4 sigma."""
    n = 200_000
    wins = int((raced([0.999, 0.001], n, seed=3) == 1).sum())
    sd = math.sqrt(n * 1e-3 * (1 - 1e-3))
    assert abs(wins - n * 1e-3) < 4 * sd, wins


def test_the_noise_is_exponential_and_independent():
    n_pos, n_ids = 400, 250
    e = np.array(race_noise(11, mx.arange(n_pos), mx.arange(n_ids)), dtype=np.float64)
    flat = np.sort(e.ravel())
    n = flat.size
    # Kolmogorov-Smirnov against Exp(1): D < 1.95 / sqrt(n) at P = 1e-3.
    cdf = 1.0 - np.exp(-flat)
    d = max(np.max(np.arange(1, n + 1) / n - cdf), np.max(cdf - np.arange(n) / n))
    assert d < 1.95 / math.sqrt(n), d
    # Neighbouring tokens and neighbouring positions are uncorrelated: |r| < 4 / sqrt(pairs).
    for a, b in ((e[:, :-1], e[:, 1:]), (e[:-1], e[1:])):
        r = np.corrcoef(a.ravel(), b.ravel())[0, 1]
        assert abs(r) < 4 / math.sqrt(a.size), r
    # Other seeds give other numbers.
    assert not np.allclose(e, np.array(race_noise(12, mx.arange(n_pos), mx.arange(n_ids))))


def test_a_positions_token_depends_on_its_row_the_seed_and_the_position_only():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.full(300, 0.3), size=5).astype(np.float32)
    together = np.array(sample_race(mx.array(p), position_keys(9, [40, 41, 42, 43, 44])))
    alone = [int(sample_race(mx.array(p[i:i + 1]), position_keys(9, [40 + i]))[0]) for i in range(5)]
    assert together.tolist() == alone
    # The fused call is the race on `race_noise`.
    assert together.tolist() == np.array(race(mx.array(p), race_noise(9, mx.arange(40, 45), mx.arange(300)))).tolist()


def test_a_race_over_part_of_the_vocabulary_is_the_whole_race_with_zeros_elsewhere():
    """A drafter with a smaller vocabulary races over its columns, keyed by their ids in the
    target's vocabulary: the winner is the whole row's, with zero mass outside."""
    rng = np.random.default_rng(1)
    ids = np.arange(2, 300, 3)
    q = rng.dirichlet(np.full(len(ids), 0.5), size=8).astype(np.float32)
    full = np.zeros((8, 300), np.float32)
    full[:, ids] = q
    keys = position_keys(5, mx.arange(100, 108))
    part = np.array(sample_race(mx.array(q), keys, mx.array(ids)))
    assert ids[part].tolist() == np.array(sample_race(mx.array(full), keys)).tolist()


def test_the_races_runner_up_follows_its_law_and_its_winner_is_sample_races():
    """The runner-up (a sampled tree's side leaf) is x with probability sum over y != x of
    p(y) p(x) / (1 - p(y)): x comes second when y arrives first and x first among the rest."""
    p = np.array([0.4, 0.3, 0.2, 0.1, 0.0])
    n = 60_000
    rows = mx.broadcast_to(mx.array(p, dtype=mx.float32), (n, len(p)))
    keys = position_keys(7, mx.arange(n))
    two = np.array(sample_race_two(rows, keys))
    assert two[:, 0].tolist() == np.array(sample_race(rows, keys)).tolist()
    assert (two[:, 0] != two[:, 1]).all()
    second = np.bincount(two[:, 1], minlength=len(p))
    assert second[4] == 0  # zero mass never comes second while two tokens have mass
    law = np.array([sum(p[y] * p[x] / (1 - p[y]) for y in range(4) if y != x) for x in range(4)])
    assert abs(law.sum() - 1) < 1e-12
    chi2 = float(((second[:4] - n * law) ** 2 / (n * law)).sum())
    assert chi2 < CHI2_999[3], (chi2, second, n * law)
    # Over part of the vocabulary, keyed by the target's ids, as a drafter with fewer ids races.
    ids = mx.array([3, 10, 11, 40, 41], dtype=mx.uint32)
    part = np.array(sample_race_two(rows[:200], keys[:200], ids))
    full = np.zeros((200, 50), np.float32)
    full[:, np.array(ids)] = p
    assert np.array(ids)[part].tolist() == np.array(sample_race_two(mx.array(full), keys[:200])).tolist()
