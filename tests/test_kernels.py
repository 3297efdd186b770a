"""The fused kernels (run through the CPU harness) against the references, and the dispatcher."""

import shutil
import time

import mlx.core as mx
import numpy as np
import pytest

from mlxspec import kernels
from mlxspec import verify as reference
from mlxspec.kernels import compare, softmax, verify
from mlxspec.kernels.emulator import EmulatedKernel
from mlxspec.sampling import SamplingParams, probabilities

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the kernel harness needs g++")

SOFTMAX = EmulatedKernel(**softmax.SPEC)
SAMPLE = EmulatedKernel(**verify.SAMPLE_SPEC)
GREEDY = EmulatedKernel(**verify.GREEDY_SPEC)


def _check(verdict):
    assert verdict.ok, verdict.detail


# ---- softmax --------------------------------------------------------------------------------

@needs_gxx
@pytest.mark.parametrize("V", [100, 8193])
def test_softmax_small_vocab_all_cases(V):
    rng = np.random.default_rng(V)
    for name, logits, params in compare.softmax_cases(V, rng, rows=3):
        _check(compare.compare_probabilities(softmax.launch(SOFTMAX, logits, params), logits, params))


@needs_gxx
@pytest.mark.parametrize("V,params", [
    (49152, SamplingParams(0.9, top_p=0.95)),
    (151936, SamplingParams(1.3, top_k=50, top_p=0.8, min_p=0.02)),
    (262144, SamplingParams(0.0)),
    (262144, SamplingParams(1.0, top_k=40, top_p=0.9)),
])
def test_softmax_big_vocab(V, params):
    logits = mx.array(np.random.default_rng(V).normal(size=(1, V)).astype(np.float32) * 3).astype(mx.bfloat16)
    _check(compare.compare_probabilities(softmax.launch(SOFTMAX, logits, params), logits, params))


@needs_gxx
def test_softmax_masked_entries_are_exactly_zero_and_batch_shape_kept():
    logits = mx.array(np.random.default_rng(0).normal(size=(2, 3, 500)).astype(np.float32))
    params = SamplingParams(1.0, top_k=5)
    out = softmax.launch(SOFTMAX, logits, params)
    assert out.shape == (2, 3, 500) and out.dtype == mx.float32
    assert ((out > 0).sum(-1) == 5).all()
    ref = probabilities(logits, params)
    assert mx.array_equal(out == 0, ref == 0)
    assert mx.allclose(out, ref, rtol=1e-5, atol=1e-7)


@needs_gxx
def test_softmax_top_k_keeps_ties_at_the_threshold():
    logits = mx.array([[3.0, 2.0, 2.0, 2.0, 1.0, 0.0]])
    out = softmax.launch(SOFTMAX, logits, SamplingParams(1.0, top_k=2))
    assert (np.array(out)[0] > 0).tolist() == [True, True, True, True, False, False]


@needs_gxx
def test_softmax_tiny_temperature_is_the_argmax_like_the_reference():
    logits = mx.array([[1.0, 30.0, 3.0, 30.0], [-2.0, 0.5, 0.4, -50.0]])
    for t in (1e-30, 1e-40):
        out = softmax.launch(SOFTMAX, logits, SamplingParams(t))
        np.testing.assert_array_equal(np.array(out), np.array(probabilities(logits, SamplingParams(t))))
        np.testing.assert_array_equal(np.array(out), [[0, 0.5, 0, 0.5], [0, 1, 0, 0]])


# ---- verification ---------------------------------------------------------------------------

@needs_gxx
@pytest.mark.parametrize("k", range(0, 9))
def test_verify_small_vocab(k):
    rng = np.random.default_rng(100 + k)
    for V in (100, 8193):
        for name, p, q, x, u in compare.verify_cases(V, k, rng):
            p, q, x, u = map(mx.array, (p, q, x, u))
            _check(compare.compare_verify(verify.launch_sample(SAMPLE, p, q, x, u), p, q, x, u))


@needs_gxx
@pytest.mark.parametrize("V,k", [(49152, 8), (151936, 3), (262144, 2)])
def test_verify_big_vocab(V, k):
    rng = np.random.default_rng(V)
    for name, p, q, x, u in compare.verify_cases(V, k, rng):
        if name in ("random", "zero-mass tail", "no residual mass"):
            p, q, x, u = map(mx.array, (p, q, x, u))
            _check(compare.compare_verify(verify.launch_sample(SAMPLE, p, q, x, u), p, q, x, u))


@needs_gxx
def test_verify_never_returns_a_token_in_the_zero_mass_tail():
    V, k = 1000, 2
    rng = np.random.default_rng(5)
    p = compare._probs(rng, k + 1, V, tail=400)
    for u_last in (0.0, 0.5, 1 - 2**-24, 1.0 - 1e-9):
        # u = 1 with q = p rejects x_0; the residual has no mass, so the token is drawn from p.
        u = mx.array(np.r_[np.ones(k, np.float32), np.float32(u_last)])
        out = verify.launch_sample(SAMPLE, mx.array(p), mx.array(p[:k]), mx.array(np.zeros(k, np.int32)), u).tolist()
        assert 0 <= out[1] < V - 400


@needs_gxx
def test_verify_statistically_matches_the_reference_law():
    # Many uniforms on one small row: kernel and reference tokens agree (or are excused).
    V, k = 37, 1
    rng = np.random.default_rng(9)
    p, q = compare._probs(rng, k + 1, V), compare._probs(rng, k, V)
    x = mx.array([int(np.argmax(q[0]))], mx.int32)
    for _ in range(50):
        u = mx.array(rng.random(k + 1).astype(np.float32))
        _check(compare.compare_verify(verify.launch_sample(SAMPLE, mx.array(p), mx.array(q), x, u),
                                      mx.array(p), mx.array(q), x, u))


@needs_gxx
@pytest.mark.parametrize("V,k", [(100, 1), (100, 8), (8193, 5), (151936, 3)])
def test_greedy_equals_reference_exactly(V, k):
    rng = np.random.default_rng(V + k)
    for name, rows, x in compare.greedy_cases(V, k, rng):
        x = mx.array(x)
        assert verify.launch_greedy(GREEDY, rows, x).tolist() == verify.verify_greedy_rows_reference(rows, x).tolist(), name


# ---- dispatcher -----------------------------------------------------------------------------

def test_backend_selection(monkeypatch):
    monkeypatch.delenv(kernels.ENV, raising=False)
    expected = "metal" if kernels.METAL_AVAILABLE and mx.default_device().type == mx.gpu else "reference"
    assert kernels.backend_name() == expected
    monkeypatch.setenv(kernels.ENV, "reference")
    assert kernels.backend_name() == "reference"
    monkeypatch.setenv(kernels.ENV, "fast")
    with pytest.raises(ValueError, match="MLXSPEC_KERNELS must be one of"):
        kernels.backend_name()
    monkeypatch.setenv(kernels.ENV, "metal")
    if kernels.METAL_AVAILABLE:
        assert kernels.backend_name() == "metal"
    else:
        with pytest.raises(kernels.KernelUnavailableError, match="Metal is not available"):
            kernels.backend_name()


def test_reference_path_is_the_reference(monkeypatch):
    monkeypatch.setenv(kernels.ENV, "reference")
    rng = np.random.default_rng(1)
    logits = mx.array(rng.normal(size=(2, 300)).astype(np.float32))
    params = SamplingParams(0.8, top_p=0.9)
    assert mx.array_equal(kernels.probabilities(logits, params), probabilities(logits, params))
    p, q, x, u = map(mx.array, next(compare.verify_cases(300, 3, rng))[1:])
    assert kernels.verify_with_uniforms(p, q, x, u).tolist() == reference.verify_with_uniforms(p, q, x, u).tolist()
    tokens = mx.argmax(p, axis=-1).astype(mx.int32)
    assert kernels.verify_greedy(tokens, x).tolist() == reference.verify_greedy(tokens, x).tolist()
    assert kernels.verify_greedy(p, x).tolist() == reference.verify_greedy(tokens, x).tolist()


def test_dispatch_adds_only_a_cheap_branch(monkeypatch):
    monkeypatch.delenv(kernels.ENV, raising=False)
    n = 2000
    t = time.perf_counter()
    for _ in range(n):
        kernels.backend_name()
    per_call = (time.perf_counter() - t) / n
    assert per_call < 20e-6, f"backend selection costs {per_call * 1e6:.1f} µs per call"
