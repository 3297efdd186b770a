"""The cost model picks k = argmax E(k) / T(k), falling back to plain decoding."""

import pytest

from mlxspec.costmodel import CostModel


def trained(v, c, alpha, rounds=200, free=False):
    m = CostModel(k_max=8, draft_is_free=free)
    for j, s in v.items():
        m.observe_verify(j, s)
    m.observe_draft(1, c)
    for _ in range(rounds):  # a rounds of 4 drafts with ~alpha acceptance
        m.observe_acceptance(10, round(10 * alpha) if alpha < 1 else 10)
    return m


def test_expected_tokens_formula():
    m = CostModel()
    m.counts[""] = [3.0, 1.0]  # alpha = 0.75
    assert m.expected_tokens(0) == pytest.approx(1.0)
    assert m.expected_tokens(3) == pytest.approx((1 - 0.75 ** 4) / 0.25)


def test_plain_decoding_when_verification_is_expensive():
    # CPU-like: verify cost grows linearly (quantized matmul), decent acceptance.
    m = trained({j: 0.1 * j for j in range(1, 10)}, 0.01, 0.6)
    assert m.choose() == 0


def test_long_drafts_when_verification_is_flat():
    # GPU-like: verifying 9 tokens costs about one step; a cheap, accurate draft.
    m = trained({j: 0.1 + 0.002 * j for j in range(1, 10)}, 0.005, 0.9)
    assert m.choose() >= 5


def test_choice_is_the_argmax_of_expected_speed():
    m = trained({j: 0.1 + 0.03 * (j - 1) for j in range(1, 10)}, 0.01, 0.7)
    k = m.choose()
    speeds = [m.speed(i) for i in range(9)]
    assert speeds[k] == max(speeds)
    assert m.choose(k_cap=1) in (0, 1)


def test_unmeasured_lengths_are_interpolated_and_extrapolated():
    m = CostModel()
    m.observe_verify(1, 1.0)
    m.observe_verify(3, 2.0)
    assert m.verify_seconds(2) == pytest.approx(1.5)
    assert m.verify_seconds(5) == pytest.approx(3.0)


def test_first_round_times_a_plain_step():
    assert CostModel().choose() == 0


def test_calibrated_curve_is_scaled_from_the_nearest_timed_length():
    m = CostModel(prior_ratios={1: 1.0, 2: 1.1, 3: 1.2, 4: 3.0, 5: 3.1})
    m.observe_verify(1, 0.2)
    assert m.verify_seconds(4) == pytest.approx(0.6)
    m.observe_verify(3, 0.3)  # slower than the curve said: lengths near 3 follow the measurement
    assert m.verify_seconds(4) == pytest.approx(0.3 * 3.0 / 1.2)


def test_calibrated_draft_cost_is_used_until_measured():
    m = CostModel(draft_is_free=False, prior_draft_ratio=0.5)
    m.observe_verify(1, 1.0)
    m.observe_verify(2, 1.0)
    m.counts[""] = [9.0, 1.0]
    assert m.speed(1) == pytest.approx(m.expected_tokens(1) / (0.5 + 1.0))
    m.observe_draft(1, 0.1)
    assert m.speed(1) == pytest.approx(m.expected_tokens(1) / (0.1 + 1.0))


def test_acceptance_is_kept_per_kind():
    m = trained({j: 0.1 + 0.02 * (j - 1) for j in range(1, 10)}, 0.0, 0.5, free=True)
    for _ in range(50):
        m.observe_acceptance(4, 4, kind="n3")
        m.observe_acceptance(4, 0, kind="n1")
    assert m.alpha_of("n3") > 0.9 > 0.1 > m.alpha_of("n1")
    assert m.choose(8, kind="n3") > m.choose(8, kind="n1") == 0


def test_new_request_weakens_but_keeps_acceptance_estimates():
    m = CostModel()
    for _ in range(40):
        m.observe_acceptance(4, 4, kind="n3")
    before = m.alpha_of("n3")
    m.new_request()
    assert 0.5 < m.alpha_of("n3") < before
    for _ in range(4):  # a few failing rounds now move the estimate a lot
        m.observe_acceptance(2, 0, kind="n3")
    assert m.alpha_of("n3") < 0.6


def test_model_drafter_probes_back_off_while_they_fail():
    m = trained({j: 0.1 * j for j in range(1, 10)}, 0.05, 0.1)
    probes = [i for i in range(400) if m.choose(8) == 1]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert probes and gaps == sorted(gaps) and gaps[-1] == 128


def test_drafting_needs_a_margin_over_plain_decoding():
    m = CostModel(draft_is_free=True)
    m.observe_verify(1, 1.0)
    m.observe_verify(2, 1.0)
    m.counts[""] = [3.0, 97.0]  # a = 0.03: one draft would win only 3%, inside the 5% margin
    assert m.choose(1) == 0
