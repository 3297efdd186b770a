"""Kernel-vs-reference comparisons and test cases, shared by the tests and scripts/verify_metal.py.

A comparison returns a `Verdict`. What counts as agreement:
  * softmax: finite, non-negative, masked entries exactly 0; the kept set equals the
    reference's except at entries that sit on a threshold within rounding (the reference's
    own float32 error there is measured, not assumed); kept values match the float64 truth
    for the kernel's kept set to 1e-5 and the reference to its measured error.
  * verify: n_accepted equal; next_token equal, or both tokens separated only by CDF
    boundaries within 1e-6 of u * total (plus the reference's measured cumsum error there);
    the token is always < V and has positive weight.
  * greedy: exactly equal.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ..sampling import SamplingParams
from ..sampling import probabilities as probabilities_reference
from ..verify import verify_with_uniforms as verify_reference


@dataclass
class Verdict:
    ok: bool
    max_error: float = 0.0  # largest |kernel - reference| (softmax) or 0
    excused: int = 0  # differences explained by rounding at a boundary
    detail: str = ""


def _np(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32) if a.dtype in (mx.bfloat16, mx.float16) else a)


def compare_probabilities(kernel_out: mx.array, logits: mx.array, params: SamplingParams) -> Verdict:
    a = _np(kernel_out).reshape(-1, logits.shape[-1]).astype(np.float64)
    r = _np(probabilities_reference(logits, params)).reshape(a.shape).astype(np.float64)
    if a.shape != r.shape or not np.all(np.isfinite(a)) or np.any(a < 0):
        return Verdict(False, detail=f"kernel output not a probability array (shape {a.shape}, finite {np.isfinite(a).all()})")
    max_error = float(np.abs(a - r).max())
    if params.greedy:
        ok = np.array_equal(a, r)
        return Verdict(ok, max_error, detail="" if ok else "greedy one-hot rows differ")
    x = logits.astype(mx.float32)
    shifted = x - mx.max(x, axis=-1, keepdims=True)
    z = _np(shifted / params.temperature).reshape(a.shape).astype(np.float64)
    e = np.exp(z - z.max(-1, keepdims=True))
    p64 = e / e.sum(-1, keepdims=True)  # exact softmax of the scaled logits
    r0 = _np(mx.softmax(shifted / params.temperature, axis=-1, precise=True)).reshape(a.shape)
    excused = 0
    for row in range(a.shape[0]):
        ka, kr = a[row] > 0, r[row] > 0
        diff = np.flatnonzero(ka != kr)
        if diff.size:
            near = _near_threshold(p64[row], r0[row], params)
            if not near[diff].all():
                j = diff[~near[diff]][0]
                return Verdict(False, max_error, detail=f"row {row}: entry {j} kept by {'kernel' if ka[j] else 'reference'} "
                                                         f"only, not at a threshold (p={p64[row, j]:.6g})")
            excused += diff.size
        # Kernel vs the float64 truth for its own kept set.
        truth = np.where(ka, p64[row], 0.0)
        truth /= truth.sum()
        if not np.allclose(a[row], truth, rtol=1e-5, atol=1e-12):
            k = np.abs(a[row] - truth).argmax()
            return Verdict(False, max_error, detail=f"row {row}: entry {k} = {a[row, k]:.8g}, exact {truth[k]:.8g}")
        # Kernel vs reference where both keep: the reference's float32 sums are off by
        # up to ~V * 2^-24 relative on big rows; allow what it is measured to be off by.
        both = ka & kr
        ref_err = np.abs(r[row] - np.where(kr, p64[row], 0) / np.where(kr, p64[row], 0).sum())[both]
        rel = (ref_err / np.maximum(r[row][both], 1e-30)).max(initial=0.0)
        shift = p64[row][ka ^ kr].sum() / max(p64[row][both].sum(), 1e-30)
        if not np.allclose(a[row][both], r[row][both], rtol=2e-5 + 2 * rel + 2 * shift, atol=1e-12):
            return Verdict(False, max_error, detail=f"row {row}: kept values differ beyond the reference's own error")
    return Verdict(True, max_error, excused)


def _near_threshold(p64: np.ndarray, r0: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Entries whose keep/drop decision is within rounding of a top-k / top-p / min-p threshold."""
    near = np.zeros(p64.shape, bool)
    V = p64.size
    if 0 < params.top_k < V:
        t = np.sort(p64)[-params.top_k]
        near |= np.abs(p64 - t) <= 1e-5 * t
    if params.min_p > 0:
        t = params.min_p * p64.max()
        near |= np.abs(p64 - t) <= 1e-5 * t
    if params.top_p < 1:
        order = np.argsort(-p64, kind="stable")
        s = p64[order]
        before = np.cumsum(s) - s
        # Ties: the mass strictly above an entry is the `before` of the first of its tie group.
        first = np.r_[0, np.flatnonzero(np.diff(s) != 0) + 1]
        group = np.searchsorted(first, np.arange(V), side="right") - 1
        above = before[first][group]
        rs = np.sort(r0)[::-1]
        ref_before = np.cumsum(rs, dtype=np.float32) - rs  # the reference's float32 cumsum
        err = np.abs(ref_before.astype(np.float64) - before)
        near_sorted = np.abs(above - params.top_p) <= 2e-6 + 2 * err
        near[order] |= near_sorted
    return near


def weights_sampled(target: np.ndarray, draft: np.ndarray, n: int) -> np.ndarray:
    """The row the reference draws the next token from (residual, bonus row, or p)."""
    p = target[n]
    q = draft[n] if n < draft.shape[0] else np.zeros_like(p)
    w = np.maximum(p - q, 0).astype(np.float32)
    return w if w.sum() > 0 else p


def compare_verify(kernel_out: mx.array, target: mx.array, draft: mx.array, tokens: mx.array,
                   uniforms: mx.array) -> Verdict:
    ka = [int(v) for v in np.array(kernel_out).tolist()]
    kr = [int(v) for v in np.array(verify_reference(target, draft, tokens, uniforms)).tolist()]
    V = target.shape[-1]
    if ka[0] != kr[0]:
        return Verdict(False, detail=f"n_accepted {ka[0]} != reference {kr[0]}")
    w = weights_sampled(np.array(target), np.array(draft).reshape(-1, V), kr[0])
    if not (0 <= ka[1] < V) or (w[ka[1]] <= 0 and w.any()):
        return Verdict(False, detail=f"token {ka[1]} outside the support (V={V})")
    # The kernel's token must be the inverse CDF of the exact (float64) CDF to within 1e-6.
    u = float(np.array(uniforms)[-1])
    c64 = np.cumsum(w.astype(np.float64))
    c64 /= c64[-1] if c64[-1] > 0 else 1.0
    j = ka[1]
    if w.any() and not (c64[j] > u - 1e-6 and (j == 0 or c64[j - 1] <= u + 1e-6)):
        return Verdict(False, detail=f"token {j} is not the inverse CDF of u={u:.9g} (cdf[{j}]={c64[j]:.9g})")
    if ka[1] == kr[1]:
        return Verdict(True)
    # Different tokens: only where u sits on the boundaries between them, within 1e-6 plus
    # the reference's own float32 cumsum error there (sequential: ~V * 2^-24 on big rows).
    cref = np.array(mx.cumsum(mx.array(w))).astype(np.float64)
    cref /= cref[-1]
    between = np.arange(*sorted((ka[1], kr[1])))
    tol = 1e-6 + np.abs(cref[between] - c64[between])
    if np.all(np.abs(cref[between] - u) <= tol):
        return Verdict(True, excused=1, detail=f"token {ka[1]} vs reference {kr[1]}: u on the CDF boundary "
                                                f"within 1e-6 + the reference's cumsum error ({tol.max():.1e})")
    return Verdict(False, detail=f"token {ka[1]} != reference {kr[1]} (u={u:.9g}, reference cdf[{between[0]}]="
                                 f"{cref[between[0]]:.9g}, exact {c64[between[0]]:.9g})")


# ---- cases ------------------------------------------------------------------------------

PARAM_SETS = [
    SamplingParams(0.0),
    SamplingParams(1.0),
    SamplingParams(0.7, top_k=20),
    SamplingParams(1.0, top_p=0.9),
    SamplingParams(1.0, min_p=0.05),
    SamplingParams(1.3, top_k=50, top_p=0.8, min_p=0.02),
]


def softmax_cases(V: int, rng: np.random.Generator, *, rows: int = 2):
    """(name, logits, params) with peaked rows, ties, masked (-inf) entries and three dtypes."""
    base = rng.normal(size=(rows, V)).astype(np.float32) * 3
    ties = np.round(base)  # many equal values: thresholds land inside tie groups
    masked = base.copy()
    masked[:, rng.random(V) < 0.3] = -np.inf
    for i, params in enumerate(PARAM_SETS):
        dtype = (mx.float32, mx.float16, mx.bfloat16)[i % 3]
        yield f"random/{str(dtype).split('.')[-1]}", mx.array(base).astype(dtype), params
    yield "ties", mx.array(ties), SamplingParams(1.0, top_k=7, top_p=0.5)
    yield "ties/greedy", mx.array(ties), SamplingParams(0.0)
    yield "masked", mx.array(masked), SamplingParams(0.8, top_p=0.95, min_p=0.01)


def _probs(rng, rows, V, *, tail=0, scale=2.0):
    x = rng.normal(size=(rows, V)) * scale
    if tail:
        x[:, V - tail:] = -np.inf
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def verify_cases(V: int, k: int, rng: np.random.Generator):
    """(name, target (k+1,V), draft (k,V), tokens (k,), uniforms (k+1,)) covering the branches."""
    def draw(q):  # tokens sampled from the draft rows
        return np.array([rng.choice(V, p=row / row.sum(dtype=np.float64)) for row in q], np.int32).reshape(k)

    u = lambda: rng.random(k + 1).astype(np.float32)  # noqa: E731
    p, q = _probs(rng, k + 1, V), _probs(rng, k, V)
    yield "random", p, q, draw(q), u()
    yield "all accepted", p, p[:k].copy(), draw(p[:k]), u()
    zero_p = p.copy()
    x = rng.integers(0, V, k).astype(np.int32)
    zero_p[np.arange(k), x] = 0  # p(x) = 0: every draft token is rejected
    zero_p /= zero_p.sum(-1, keepdims=True)
    yield "none accepted", zero_p, q, x, u()
    tail = max(1, V // 3)
    pt, qt = _probs(rng, k + 1, V, tail=tail), _probs(rng, k, V, tail=tail)
    yield "zero-mass tail", pt, qt, draw(qt), np.r_[u()[:k], np.float32(1 - 2**-24)]
    same = p.copy()
    same[np.arange(k), x] = 0
    same /= same.sum(-1, keepdims=True)
    yield "no residual mass", same, same[:k].copy(), x, u()
    tie = np.full((k + 1, V), 1.0 / V, np.float32)
    yield "ties", tie, np.full((k, V), 1.0 / V, np.float32), draw(np.full((k, V), 1.0 / V)), u()


def greedy_cases(V: int, k: int, rng: np.random.Generator):
    """(name, rows (k+1,V), tokens (k,)): all match, first mismatch at j, tied maxima."""
    rows = rng.normal(size=(k + 1, V)).astype(np.float32)
    arg = rows.argmax(-1).astype(np.int32)
    yield "all match", mx.array(rows), arg[:k]
    j = int(rng.integers(0, k)) if k else 0
    tok = arg[:k].copy()
    if k:
        tok[j] = (tok[j] + 1) % V
    yield f"mismatch at {j}", mx.array(rows).astype(mx.bfloat16), tok
    tied = np.round(rows)
    yield "tied maxima", mx.array(tied).astype(mx.float16), tied.argmax(-1).astype(np.int32)[:k]
