"""How far figures over a few prompts can be trusted: intervals that count prompts, not runs.

The bench's speedups are medians of per-prompt ratios over 8 or 24 prompts, and prompts
differ far more than runs of one prompt do. The sign-test interval needs no assumption on
their spread: with n independent values, the median of the population they come from lies
between the j-th smallest and the j-th largest with probability
1 - 2 P(Binomial(n, 1/2) < j). The narrowest such pair that reaches the level is reported,
with the coverage it actually has (order statistics move in steps: 8 values give 99.2 % or
93.0 %, nothing between).

Pooled rates (a per-token acceptance: accepted over judged drafts) get a bootstrap over
prompts instead (`ratio_interval`).
"""

from __future__ import annotations

import statistics
from math import comb
from typing import Dict, Iterable, Optional, Sequence, Tuple

LEVEL = 0.95


def sign_coverage(n: int, j: int) -> float:
    """P(x(j) <= median <= x(n+1-j)) for n continuous i.i.d. values (1 <= j <= n/2 rounded up)."""
    below = sum(comb(n, i) for i in range(j)) / 2**n  # fewer than j values under the median
    return 1.0 - 2.0 * below


def median_interval(xs: Iterable[float], level: float = LEVEL) -> Optional[Tuple[float, float, float]]:
    """(low, high, coverage): the narrowest order-statistic interval for the median whose coverage is
    at least `level`, or (min, max, its lower coverage) where n values cannot reach it. None for n < 2."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    v = sorted(xs)
    n = len(v)
    if n < 2:
        return None
    j = 1
    while j + 1 <= (n + 1) // 2 and sign_coverage(n, j + 1) >= level:
        j += 1
    return v[j - 1], v[n - j], sign_coverage(n, j)


def per_prompt(values: Sequence[Tuple[object, float]]) -> list:
    """One value per prompt: the median of its repeats. Repeats of one prompt are not independent
    draws of the suite, so the interval counts each prompt once."""
    groups: Dict[object, list] = {}
    for key, x in values:
        groups.setdefault(key, []).append(x)
    return [statistics.median(xs) for xs in groups.values()]


def ratio_interval(pairs: Sequence[Tuple[float, float]], level: float = LEVEL, draws: int = 4000,
                   seed: int = 0) -> Optional[Tuple[float, float]]:
    """Percentile bootstrap over prompts of sum(num) / sum(den), from one (num, den) per prompt.

    A per-token acceptance pools every draft of a prompt, but drafts of one prompt succeed and
    fail together (its kind, its repeats), so resampling drafts as if independent understates
    the spread (about 2x on the demo head's public prompts). Resampling whole prompts does not.
    None for fewer than 2 prompts."""
    import numpy as np

    a = np.asarray(pairs, dtype=np.float64).reshape(-1, 2)
    idx = _resampled_prompts(len(a), level, draws, seed)
    if idx is None:
        return None
    r, ok = _pooled_ratios(a, idx)
    return _percentiles(r[ok], level)


def paired_difference_interval(a: Sequence[Tuple[float, float]], b: Sequence[Tuple[float, float]],
                               level: float = LEVEL, draws: int = 4000, seed: int = 0) -> Optional[Tuple[float, float]]:
    """Percentile bootstrap over prompts of ratio(b) - ratio(a), where a[i] and b[i] are the same
    prompt under two settings (two heads on one suite) and ratio = sum(num) / sum(den).

    Both sides are resampled with the same prompts: what makes a prompt easy for one head makes it
    easy for the other, so the difference varies far less than either rate, and two separate
    intervals that overlap say little. None for fewer than 2 prompts."""
    import numpy as np

    x = np.asarray(a, dtype=np.float64).reshape(-1, 2)
    y = np.asarray(b, dtype=np.float64).reshape(-1, 2)
    idx = _resampled_prompts(len(x), level, draws, seed)
    if len(x) != len(y):
        raise ValueError(f"paired figures need the same prompts on both sides, got {len(x)} and {len(y)}")
    if idx is None:
        return None
    (rx, okx), (ry, oky) = _pooled_ratios(x, idx), _pooled_ratios(y, idx)
    return _percentiles((ry - rx)[okx & oky], level)


def _resampled_prompts(n: int, level: float, draws: int, seed: int):
    """(draws, n) prompt indices drawn with replacement, one bootstrap sample of the suite per row;
    None for fewer than 2 prompts."""
    import numpy as np

    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    return np.random.default_rng(seed).integers(0, n, size=(draws, n)) if n >= 2 else None


def _pooled_ratios(a, idx):
    """sum(num) / sum(den) of each bootstrap sample, and where it is defined (den > 0)."""
    import numpy as np

    num, den = a[idx, 0].sum(1), a[idx, 1].sum(1)
    ok = den > 0
    return num / np.where(ok, den, 1.0), ok


def _percentiles(x, level: float) -> Tuple[float, float]:
    import numpy as np

    return float(np.quantile(x, (1 - level) / 2)), float(np.quantile(x, (1 + level) / 2))
