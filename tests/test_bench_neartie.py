"""Near-tie logic on a fake target whose logits the test controls."""

import math

import mlx.core as mx
import pytest
from bench_helpers import FakeTarget

from mlxspec.bench.neartie import NEAR_TIE_TOL, check_greedy, first_divergence
from mlxspec.sampling import race_noise

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


def test_a_sampled_divergence_is_judged_on_the_races_scores():
    """At a temperature both paths ranked the two tokens by z / T - log E, with the noise E the
    seed fixes at that position: a logit gap the noise cancels is a tie, and a logit tie that the
    noise breaks is a bug (the speculative path took the token that lost the race)."""
    T, seed = 0.8, 5
    e = race_noise(seed, [len(PROMPT)], mx.arange(V))[0].tolist()  # the first output token's position
    shift = T * (math.log(e[2]) - math.log(e[3]))  # what the noise adds to z2 - z3, in logits
    assert abs(shift) > 10 * NEAR_TIE_TOL
    tie = FakeTarget(V, {3: logits_with(t2=1.0 + shift, t3=1.0)})
    c = check_greedy(tie, PROMPT, [2], [3], temperature=T, seed=seed)
    assert c.divergence == "rounding" and c.judgement.float32_gap == pytest.approx(0.0, abs=1e-5)
    flat = FakeTarget(V, {3: logits_with(t2=1.0, t3=1.0)})
    assert check_greedy(flat, PROMPT, [2], [3]).divergence == "rounding"  # greedy: a tie
    sampled = check_greedy(flat, PROMPT, [2], [3], temperature=T, seed=seed)
    assert sampled.divergence == "bug" and sampled.judgement.float32_gap == pytest.approx(-shift, abs=1e-5)
    with pytest.raises(ValueError, match="seed"):
        check_greedy(flat, PROMPT, [2], [3], temperature=T)
