"""Statistical tests of rejection-sampling verification.

For fixed target rows p_0..p_k and draft rows q_0..q_{k-1}, with drafts x_i ~ q_i:
  * the token emitted at position j, given the round reached j, is distributed as p_j;
  * the round reaches position j with probability prod_{i<j} sum(min(p_i, q_i)).
Tolerances come from the sample size: the expected total-variation distance of an
empirical distribution from N draws is at most 0.5 * sum_i sqrt(p_i (1 - p_i) / N); we
allow 4x that (and 4 binomial standard deviations for rates).
"""

import math

import mlx.core as mx
import numpy as np
import pytest

from mlxspec import verify as V
from mlxspec.errors import InvalidArgumentError

N = 40_000


def run_rounds(p, q, n=N, seed=0, fn=V.verify_with_uniforms):
    """Simulate n rounds: draft tokens sampled from q, verified against p. Returns (drafts, n_acc, next)."""
    key = mx.random.key(seed)
    kx, ku = mx.random.split(key)
    k = q.shape[0]
    logq = mx.log(mx.maximum(q, 1e-30))
    if k:
        X = mx.random.categorical(logq[None], shape=(n, k), key=kx).astype(mx.int32)
    else:
        X = mx.zeros((n, 0), mx.int32)
    U = mx.random.uniform(shape=(n, k + 1), key=ku)
    out = mx.vmap(lambda x, u: fn(p, q, x, u))(X, U)
    return np.array(X), np.array(out[:, 0]), np.array(out[:, 1])


def emitted_at(j, X, n_acc, nxt):
    """Token emitted at position j for rounds that reached it (n_acc >= j)."""
    reached = n_acc >= j
    tok = np.where(n_acc[reached] > j, X[reached, j] if j < X.shape[1] else -1, nxt[reached])
    return tok


def tv_tolerance(p, n):
    p = np.asarray(p, dtype=np.float64)
    return 4 * 0.5 * np.sum(np.sqrt(p * (1 - p) / max(n, 1))) + 1e-9


def check_distribution(p, q, seed=0, fn=V.verify_with_uniforms):
    p, q = mx.array(p, dtype=mx.float32), mx.array(q, dtype=mx.float32)
    k, Vn = q.shape[0], p.shape[1]
    X, n_acc, nxt = run_rounds(p, q, seed=seed, fn=fn)
    assert (nxt >= 0).all() and (nxt < Vn).all()
    pn, qn = np.array(p, dtype=np.float64), np.array(q, dtype=np.float64)
    reach = 1.0
    for j in range(k + 1):
        toks = emitted_at(j, X, n_acc, nxt)
        rate = toks.size / N
        sd = math.sqrt(max(reach * (1 - reach), 1e-12) / N)
        assert abs(rate - reach) <= 4 * sd + 1e-9, f"position {j}: reached {rate:.4f}, expected {reach:.4f}"
        if toks.size >= 2000:
            emp = np.bincount(toks, minlength=Vn) / toks.size
            tv = 0.5 * np.abs(emp - pn[j]).sum()
            assert tv <= tv_tolerance(pn[j], toks.size), f"position {j}: TV {tv:.4f} from the target"
        if j < k:
            reach *= np.minimum(pn[j], qn[j]).sum()


def rows(seed, k, v, scale=1.5):
    rng = np.random.default_rng(seed)
    def soft(z):
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    return soft(rng.normal(size=(k + 1, v)) * scale), soft(rng.normal(size=(k, v)) * scale)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_random_rows_match_target(k):
    p, q = rows(k, k, 12)
    check_distribution(p, q, seed=k)


def test_uniform_draft():
    p, _ = rows(1, 3, 10)
    q = np.full((3, 10), 0.1)
    check_distribution(p, q, seed=11)


def test_equal_draft_accepts_everything():
    p, _ = rows(2, 4, 10)
    _, n_acc, _ = run_rounds(mx.array(p, dtype=mx.float32), mx.array(p[:4], dtype=mx.float32))
    assert (n_acc == 4).mean() > 0.999  # only float rounding of p/q can reject
    check_distribution(p, p[:4], seed=12)


def test_opposite_draft():
    # The draft puts its mass exactly where the target has little: acceptance is rare but exact.
    p = np.array([[0.7, 0.2, 0.1, 0.0]] * 3)
    q = np.array([[0.0, 0.1, 0.2, 0.7]] * 2)
    check_distribution(p, q, seed=13)


def test_zero_mass_draft_entries_and_target_tail():
    # Zero-mass tail at the end of the vocabulary in the target: never emitted.
    p = np.zeros((3, 9)); p[:, :5] = [0.3, 0.3, 0.2, 0.1, 0.1]
    q = np.zeros((2, 9)); q[:, 2:] = 1 / 7
    check_distribution(p, q, seed=14)
    X, n_acc, nxt = run_rounds(mx.array(p, dtype=mx.float32), mx.array(q, dtype=mx.float32))
    assert (nxt < 5).all()


def test_wrong_rule_is_detected():
    """The acceptance rule of seeds 001/004 (accept when p/q > 0.5) is biased: this suite must catch it."""
    def wrong(p, q, x, u):
        k = x.shape[0]
        ratio = p[mx.arange(k), x] / q[mx.arange(k), x]
        acc = ratio > 0.5
        n = mx.sum(mx.cumprod(acc.astype(mx.int32))).astype(mx.int32)
        return mx.stack([n, V.sample_inverse_cdf(mx.take(p, n, axis=0), u[k])])

    p, q = rows(5, 2, 8)
    with pytest.raises(AssertionError):
        check_distribution(p, q, seed=15, fn=wrong)


def test_greedy_is_the_one_hot_case():
    rng = np.random.default_rng(3)
    for _ in range(50):
        k = int(rng.integers(1, 6))
        tgt = rng.integers(0, 5, size=k + 1)
        drafts = np.where(rng.random(k) < 0.7, tgt[:k], rng.integers(0, 5, size=k))
        p = np.eye(5)[tgt]
        q = np.eye(5)[drafts]
        n, nxt = V.verify(mx.array(p), mx.array(q), drafts.tolist())
        g = V.verify_greedy(mx.array(tgt, dtype=mx.int32), mx.array(drafts, dtype=mx.int32)).tolist()
        expect = next((i for i in range(k) if drafts[i] != tgt[i]), k)
        assert (n, nxt) == (expect, int(tgt[expect])) == tuple(g)


def test_verify_api_reproducible_with_global_seed_and_key():
    p, q = rows(7, 3, 16)
    drafts = [1, 2, 3]
    mx.random.seed(42)
    a = [V.verify(p, q, drafts) for _ in range(20)]
    mx.random.seed(42)
    b = [V.verify(p, q, drafts) for _ in range(20)]
    assert a == b
    key = mx.random.key(5)
    assert V.verify(p, q, drafts, key=key) == V.verify(p, q, drafts, key=key)


def test_verify_rejects_bad_shapes():
    p, q = rows(1, 2, 6)
    with pytest.raises(InvalidArgumentError, match="target_probs"):
        V.verify(p[:2], q, [0, 1])
    with pytest.raises(InvalidArgumentError, match="draft_probs"):
        V.verify(p, q[:, :4], [0, 1])


def test_inverse_cdf_never_lands_in_zero_tail():
    w = mx.array([0.0, 0.5, 0.5, 0.0, 0.0])
    for u in [0.0, 0.25, 0.5, 0.999999, 1.0 - 1e-9]:
        t = int(V.sample_inverse_cdf(w, mx.array(u)).item())
        assert t in (1, 2)


def test_a_draft_the_target_gives_no_mass_is_rejected_whatever_the_uniform():
    """q(x) = p(x) = 0 (a draft token outside both supports, as a filter or grammar leaves it):
    u * q(x) < p(x) is false even at u = 0, so the round stops there and draws from the residual."""
    p = mx.array([[0.0, 0.6, 0.4], [0.5, 0.5, 0.0]])
    q = mx.array([[0.0, 0.4, 0.6]])
    for u in (0.0, 0.5):
        n, nxt = V.verify_with_uniforms(p, q, mx.array([0]), mx.array([u, 0.1])).tolist()
        assert n == 0 and nxt == 1  # the residual max(p - q, 0) is all on token 1


def test_a_rejection_with_no_residual_mass_draws_from_the_target_row():
    """p == q leaves max(p - q, 0) = 0; a rejection there (u = 1 exactly) draws from p itself."""
    p = mx.array([[0.25, 0.75, 0.0], [1.0, 0.0, 0.0]])
    for u_next, want in ((0.1, 0), (0.9, 1)):
        n, nxt = V.verify_with_uniforms(p, p[:1], mx.array([1]), mx.array([1.0, u_next])).tolist()
        assert (n, nxt) == (0, want)
