"""Float32 references for greedy checks: rounding divergences vs bugs, and weights restored exactly."""

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten

import tiny
from mlxspec import Engine, loop, reference
from mlxspec.bench.neartie import check_greedy
from mlxspec.reference import (ROUNDING_ULPS, float32_weights, judge, rounding_bound, ulp, working_dtype)

PROMPT = [5, 6, 7, 8, 9, 10, 5, 6, 7, 11, 12]


def params(model) -> dict:
    return dict(tree_flatten(model.parameters()))


def greedy_pair(target, draft, *, max_tokens=12, **kw):
    """(vanilla tokens, speculative tokens) for PROMPT."""
    vanilla = Engine(target, None).generate(PROMPT, max_tokens=max_tokens, speculative=False).tokens
    spec = Engine(target, None, draft, **kw).generate(PROMPT, max_tokens=max_tokens).tokens
    return vanilla, spec


def test_ulp_and_bound_follow_the_dtype():
    assert ulp(20.0, mx.bfloat16) == 0.125 and ulp(-20.0, mx.bfloat16) == 0.125  # 8 significant bits
    assert ulp(16.0, mx.bfloat16) == 0.125 and ulp(15.9, mx.bfloat16) == 0.0625
    assert ulp(20.0, mx.float16) == 2 ** -6  # 11 bits
    assert rounding_bound(mx.bfloat16, 20.0) == ROUNDING_ULPS * 0.125
    assert rounding_bound(mx.float32, 20.0) == 1e-3  # float32 keeps the float-noise near-tie rule


def test_a_tf32_reference_widens_the_bound_by_its_own_rounding(monkeypatch):
    """MLX's CUDA backend multiplies float32 in TF32 (11 bits): the reference rounds, and so can float32 runs."""
    monkeypatch.setattr(reference, "float32_matmul_roundoff", lambda: 2.0 ** -11)
    tf32 = ulp(20.0, mx.float32, bits=11)
    assert tf32 == ulp(20.0, mx.float16) == 2 ** -6  # TF32 and float16 share 11 significant bits
    assert rounding_bound(mx.float32, 20.0) == ROUNDING_ULPS * tf32 > 1e-3
    assert rounding_bound(mx.float32, 0.01) == 1e-3  # small logits: the float-noise rule still holds
    assert rounding_bound(mx.bfloat16, 20.0) == ROUNDING_ULPS * (0.125 + tf32)


def test_working_dtype_is_the_least_precise_float_parameter():
    assert working_dtype(tiny.make_llama(0)) == mx.float32
    assert working_dtype(tiny.make_llama(0, dtype=mx.bfloat16)) == mx.bfloat16
    q = tiny.make_llama(0, dtype=mx.float16)
    nn.quantize(q, group_size=32, bits=4)
    assert working_dtype(q) == mx.float16  # quantized: the dtype of the scales and activations


def test_float32_weights_restores_the_very_same_arrays_even_after_an_error():
    model = tiny.make_llama(0, dtype=mx.bfloat16)
    before = params(model)
    with pytest.raises(RuntimeError, match="inside"):
        with float32_weights(model):
            assert {v.dtype for v in params(model).values()} == {mx.float32}
            raise RuntimeError("inside")
    after = params(model)
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)


def test_quantized_layers_keep_their_packed_weights_and_compute_in_float32():
    model = tiny.make_llama(0, dtype=mx.float16)
    nn.quantize(model, group_size=32, bits=4)
    before = params(model)
    ids = mx.array([PROMPT])
    with float32_weights(model):
        inside = params(model)
        assert all(inside[k] is before[k] for k in before if before[k].dtype == mx.uint32)  # packed: untouched
        assert {v.dtype for k, v in inside.items() if before[k].dtype != mx.uint32} == {mx.float32}
        assert model(ids).dtype == mx.float32
    assert all(params(model)[k] is before[k] for k in before) and model(ids).dtype == mx.float16


def test_a_float32_copy_that_does_not_fit_leaves_the_divergence_unclassified():
    model = tiny.make_llama(0, dtype=mx.bfloat16)
    before = params(model)
    j = judge(model, PROMPT, 3, 4, max_extra_bytes=1024)
    assert j.kind == "unclassified" and "float32 copy" in j.reason and j.float32_gap is None
    assert all(params(model)[k] is before[k] for k in before)


@pytest.mark.parametrize("self_draft", [True, False])
def test_a_one_ulp_near_tie_is_a_rounding_divergence(self_draft):
    """bfloat16: the verify pass ties where one-row steps do not; float32 ranks the pair within one ulp."""
    tie_at = len(PROMPT) + 2  # the row predicting the fourth generated token
    model = tiny.RoundingModel(tie_at)
    draft = model if self_draft else tiny.RoundingModel(255)  # its own tie lies beyond this run
    vanilla, spec = greedy_pair(model, draft, num_draft=2)
    c = check_greedy(model, PROMPT, vanilla, spec)
    assert c.position == 3 and (c.expected, c.got) == (model.A, model.B)
    assert c.divergence == "rounding" and c.ok and c.near_tie
    j = c.judgement
    assert j.working_dtype == "bfloat16" and j.float32_gap == pytest.approx(0.09375)  # 0.75 ulp at 20
    assert 0 < j.float32_gap < ulp(j.logit_magnitude, mx.bfloat16) <= j.bound
    assert c.logprob_gap == 0.0  # in bfloat16 the full pass sees an exact tie
    assert vanilla[:3] == spec[:3] and vanilla[4:] == spec[4:]


def test_the_same_model_in_float32_does_not_diverge():
    model = tiny.RoundingModel(len(PROMPT) + 2, dtype=mx.float32)
    vanilla, spec = greedy_pair(model, model, num_draft=2)
    assert vanilla == spec and check_greedy(model, PROMPT, vanilla, spec).divergence is None


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float32])
def test_a_verifier_that_accepts_a_non_argmax_draft_is_a_bug(monkeypatch, dtype):
    target = tiny.make_llama(1, dtype=dtype)
    draft = tiny.make_llama(2, layers=1, hidden=32, dtype=dtype)
    monkeypatch.setattr(loop, "read", tiny.accept_every_draft)
    vanilla, spec = greedy_pair(target, draft, num_draft=3)
    assert vanilla != spec
    c = check_greedy(target, PROMPT, vanilla, spec)
    assert c.divergence == "bug" and not c.ok and not c.near_tie
    assert c.judgement.working_dtype == str(dtype).rsplit(".", 1)[-1]
    assert c.judgement.float32_gap > c.judgement.bound


def test_the_window_is_judged_as_the_engine_saw_it():
    """A windowed engine's divergence is judged through the same window (chunked reference pass)."""
    model = tiny.make_llama(1)
    ids = list(range(20, 60))
    with_window = judge(model, ids, 3, 4, max_kv_size=16)
    without = judge(model, ids, 3, 4)
    assert with_window.float32_gap != pytest.approx(without.float32_gap, abs=1e-4)
