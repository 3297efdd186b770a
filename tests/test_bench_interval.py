"""The sign-test interval of the bench's median speedups: exact coverage, and what the bench reports."""

from __future__ import annotations

import math
import random

import pytest

from mlxspec.bench.interval import median_interval, per_prompt, sign_coverage


@pytest.mark.parametrize("n, j, want", [(8, 1, 1 - 2 / 256), (8, 2, 1 - 2 * 9 / 256), (2, 1, 0.5), (5, 1, 1 - 2 / 32)])
def test_sign_coverage_is_the_binomial_sum(n, j, want):
    assert sign_coverage(n, j) == pytest.approx(want)


@pytest.mark.parametrize("n", [2, 3, 5, 6, 8, 9, 24, 25, 100])
def test_the_narrowest_pair_that_reaches_the_level(n):
    xs = [float(i) for i in range(n)][::-1]  # unsorted on purpose
    lo, hi, cover = median_interval(xs)
    j = int(lo) + 1
    assert hi == n - j  # symmetric order statistics: the j-th smallest and the j-th largest
    assert cover == pytest.approx(sign_coverage(n, j))
    if sign_coverage(n, 1) >= 0.95:
        assert cover >= 0.95
        assert j + 1 > (n + 1) // 2 or sign_coverage(n, j + 1) < 0.95  # one step narrower falls short
    else:
        assert (lo, hi) == (0.0, n - 1.0)  # too few values: the whole range, with the coverage it has


def test_too_few_values_and_bad_levels():
    assert median_interval([]) is None and median_interval([1.3]) is None
    with pytest.raises(ValueError, match="level"):
        median_interval([1.0, 2.0], level=1.0)


def test_the_stated_coverage_holds_on_a_skewed_law():
    # Lognormal per-prompt speedups (median exp(0.2)): over many suites of 24 prompts the interval
    # holds the median as often as it says, within 4 binomial standard errors.
    rng, trials, n, truth = random.Random(0), 4000, 24, math.exp(0.2)
    hits, cover = 0, None
    for _ in range(trials):
        lo, hi, cover = median_interval([math.exp(rng.gauss(0.2, 0.4)) for _ in range(n)])
        hits += lo <= truth <= hi
    se = math.sqrt(cover * (1 - cover) / trials)
    assert abs(hits / trials - cover) < 4 * se


def test_repeats_of_a_prompt_count_once():
    assert sorted(per_prompt([("a", 1.0), ("b", 2.0), ("a", 3.0), ("b", 5.0), ("b", 4.0)])) == [2.0, 4.0]


def test_the_summary_and_the_report_give_the_interval(monkeypatch, tmp_path):
    from bench_helpers import bench_cli_json
    from rich.console import Console

    from mlxspec.bench.report import print_report

    doc = bench_cli_json(monkeypatch, tmp_path, "--limit", "3", "--max-tokens", "4", "--drafter", "ngram",
                         "--no-peer", "--repeats", "2")
    van = {(r["repeat"], r["prompt_id"]): r["tokens_per_second"] for r in doc["runs"] if r["mode"] == "vanilla"}
    by_prompt = {}
    for r in doc["runs"]:
        if r["mode"] == "speculative":
            by_prompt.setdefault(r["prompt_id"], []).append(r["tokens_per_second"] / van[r["repeat"], r["prompt_id"]])
    medians = sorted(sum(v) / 2 for v in by_prompt.values())  # two passes each: their mean is their median
    s = doc["summary"]
    lo, hi, cover = s["speedup_vs_vanilla_interval"]
    assert len(medians) == 3 and (lo, hi) == pytest.approx((medians[0], medians[-1]))
    assert cover == pytest.approx(sign_coverage(3, 1))  # three prompts, not six runs
    assert s["speedup_vs_mlx_lm_interval"] is None  # no peer ran
    row = next(r for r in s["settings"] if r["mode"] == "speculative")
    assert row["speedup_vs_vanilla_interval"] == s["speedup_vs_vanilla_interval"]
    assert next(r for r in s["settings"] if r["mode"] == "vanilla")["speedup_vs_vanilla_interval"] is None
    console = Console(record=True, width=300)
    print_report(doc, console)
    text = console.export_text()
    assert "its 75% interval" in text and "over the 3 prompts" in text and f"{lo:.2f}-{hi:.2f}x vanilla" in text


def _clustered(rng, n, a=0.55, spread=0.12):
    """n prompts: each drafts 40-120 tokens accepted at its own rate around a."""
    out = []
    for _ in range(n):
        d = rng.randint(40, 120)
        p = min(max(rng.gauss(a, spread), 0.02), 0.98)
        out.append((sum(rng.random() < p for _ in range(d)), d))
    return out


def test_ratio_interval_matches_the_delta_method_on_many_prompts():
    import numpy as np

    from mlxspec.bench.interval import ratio_interval

    pairs = np.array(_clustered(random.Random(1), 400), dtype=float)
    r = pairs[:, 0].sum() / pairs[:, 1].sum()
    resid = pairs[:, 0] - r * pairs[:, 1]
    se = math.sqrt((resid ** 2).sum() * len(pairs) / (len(pairs) - 1)) / pairs[:, 1].sum()  # the ratio's delta method
    lo, hi = ratio_interval([tuple(p) for p in pairs])
    assert lo < r < hi
    # 4,000 draws estimate a 95 % width to about 3 %; the normal approximation holds at 400 prompts.
    assert (hi - lo) / (2 * 1.96 * se) == pytest.approx(1.0, abs=0.08)
    # Counting drafts as independent (binomial) gives a far narrower, wrong interval here.
    assert 1.96 * math.sqrt(r * (1 - r) / pairs[:, 1].sum()) < 0.6 * (hi - r)


def test_ratio_interval_covers_as_stated():
    from mlxspec.bench.interval import ratio_interval

    rng, trials, hits = random.Random(2), 300, 0
    truth = 0.55  # the mean rate; prompt lengths are independent of rates, so the pooled ratio targets it
    for t in range(trials):
        lo, hi = ratio_interval(_clustered(rng, 48), draws=1000, seed=t)
        hits += lo <= truth <= hi
    # A percentile bootstrap over 48 prompts covers a little under 95 %; 4 binomial standard errors.
    assert abs(hits / trials - 0.95) < 4 * math.sqrt(0.95 * 0.05 / trials)
    assert ratio_interval([(3, 5)]) is None


def _paired(rng, n, shift, a=0.55, spread=0.12):
    """n prompts drafted by two heads: each prompt has its own rate, the second head's is shift
    higher on every prompt, and each head's drafts there are its own draws."""
    x, y = [], []
    for _ in range(n):
        d = rng.randint(40, 120)
        p = rng.gauss(a, spread)
        for out, q in ((x, p), (y, p + shift)):
            q = min(max(q, 0.02), 0.98)
            out.append((sum(rng.random() < q for _ in range(d)), d))
    return x, y


def test_paired_difference_interval_covers_as_stated():
    from mlxspec.bench.interval import paired_difference_interval

    rng, trials, hits = random.Random(3), 300, 0
    for t in range(trials):
        lo, hi = paired_difference_interval(*_paired(rng, 48, 0.03), draws=1000, seed=t)
        hits += lo <= 0.03 <= hi
    # The same 4 binomial standard errors as the single rate's coverage test.
    assert abs(hits / trials - 0.95) < 4 * math.sqrt(0.95 * 0.05 / trials)


def test_paired_difference_interval_is_narrower_than_the_rates_it_compares():
    from mlxspec.bench.interval import paired_difference_interval, ratio_interval

    x, y = _paired(random.Random(4), 96, 0.03)
    lo, hi = paired_difference_interval(x, y)
    xl, xh = ratio_interval(x)
    # The prompts' spread (sd 0.12) cancels in the difference; only the drafts' own noise is left.
    assert hi - lo < 0.6 * (xh - xl)
    assert lo > 0  # a 0.03 shift on 96 prompts of about 80 drafts each is well resolved
    with pytest.raises(ValueError, match="same prompts"):
        paired_difference_interval(x, y[:-1])
    assert paired_difference_interval(x[:1], y[:1]) is None
