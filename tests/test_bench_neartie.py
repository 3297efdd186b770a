"""Near-tie logic on a fake target whose logits the test controls."""

import pytest
from bench_helpers import FakeTarget

from mlxspec.bench.neartie import NEAR_TIE_TOL, check_greedy, first_divergence

V = 8
PROMPT = [1, 2, 3]


def logits_with(**vals):
    row = [0.0] * V
    for k, v in vals.items():
        row[int(k[1:])] = v
    return row


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_identical_outputs_need_no_model_call():
    fake = FakeTarget(V, {})
    c = check_greedy(fake, PROMPT, [4, 5], [4, 5])
    assert c.identical and c.ok and fake.calls == []


def test_exact_tie_is_excused_and_judged_at_the_common_prefix():
    # Context = prompt + [4] (5 tokens): tokens 5 and 6 have equal logits there.
    fake = FakeTarget(V, {4: logits_with(t5=3.0, t6=3.0)})
    c = check_greedy(fake, PROMPT, [4, 5, 7], [4, 6, 1])
    assert fake.calls == [PROMPT + [4]] * 2  # the working dtype's pass, then the float32 reference
    assert (c.position, c.expected, c.got) == (1, 5, 6)
    assert c.logprob_gap == pytest.approx(0.0, abs=1e-6)
    assert c.near_tie and c.ok and not c.identical and c.divergence == "rounding"
    assert c.judgement.working_dtype == "float32" and c.judgement.float32_gap == pytest.approx(0.0, abs=1e-6)


def test_gap_just_under_the_tolerance_is_a_tie_and_just_over_is_not():
    under = FakeTarget(V, {3: logits_with(t2=1.0, t3=1.0 - 0.5 * NEAR_TIE_TOL)})
    assert check_greedy(under, PROMPT, [2], [3]).ok
    over = FakeTarget(V, {3: logits_with(t2=1.0, t3=1.0 - 2 * NEAR_TIE_TOL)})
    assert not check_greedy(over, PROMPT, [2], [3]).ok


def test_big_gap_is_a_mismatch():
    fake = FakeTarget(V, {3: logits_with(t2=5.0, t3=1.0)})
    c = check_greedy(fake, PROMPT, [2, 2], [3, 3])
    assert not c.ok and not c.near_tie and c.divergence == "bug"
    assert c.position == 0 and c.logprob_gap == pytest.approx(4.0, abs=1e-4)


def test_an_output_that_ends_early_is_a_mismatch():
    c = check_greedy(FakeTarget(V, {}), PROMPT, [2, 3], [2])
    assert not c.ok and c.position == 1 and c.got is None and c.divergence == "bug"
