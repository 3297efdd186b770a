"""The target's curve: lengths never timed are interpolated, and timings are learnt at the host's pace."""

import pytest

from mlxspec.estimate import STALL
from mlxspec.target_curve import TargetCurve


def test_unmeasured_lengths_are_interpolated_and_extrapolated():
    c = TargetCurve()
    c.observe(1, 1.0)
    c.observe(3, 2.0)
    assert c.verify_seconds(2) == pytest.approx(1.5)
    assert c.verify_seconds(5) == pytest.approx(3.0)


def test_a_round_of_1_from_a_faster_spell_does_not_stand_in_for_todays_plain_step():
    curve = TargetCurve()
    for _ in range(3):
        curve.observe(2, 1.5)
        curve.observe_plain(1.2)
    assert curve.plain_seconds() == 1.2  # V(1) only interpolated
    for _ in range(3):
        curve.observe(1, 1.0)
    assert curve.plain_seconds() == 1.0  # a round of 1 timed after the step's latest sample
    for _ in range(3):
        curve.observe_plain(1.25)  # the host slowed since
    assert curve.plain_seconds() == pytest.approx(1.25)  # today's step at today's pace, not V(1)


def test_a_length_cheaper_than_the_others_is_learnt_while_they_are_timed_too():
    """Against the pace, a length's own change shows only beside the others: timed with them,
    V(3) learns its new cost and the pace stays."""
    curve = TargetCurve()
    for j in (1, 2, 3):
        for _ in range(3):
            curve.observe(j, 1.0)
    for _ in range(9):
        for j, s in ((1, 1.0), (2, 1.0), (3, 0.8)):
            curve.observe(j, s)
    assert curve.pace == pytest.approx(1.0)
    assert curve.verify_seconds(3) == pytest.approx(0.8) and curve.verify_seconds(2) == pytest.approx(1.0)


def test_a_stall_does_not_move_the_pace():
    curve = TargetCurve()
    for _ in range(5):
        curve.observe_plain(1.0)
    curve.observe_plain(20.0)  # a first-use compile
    assert curve.pace == 1.0 and curve.plain_seconds() == 1.0


def _warmed_at(context, v, plain):
    """A curve timed at `context` positions, as warm-up leaves it (and a loop's rounds confirm)."""
    curve = TargetCurve()
    curve.at_context(context)
    for _ in range(5):  # settled, and the pace read from them
        for j, s in v.items():
            curve.observe(j, s)
        if plain is not None:
            curve.observe_plain(plain)
    return curve


def test_a_far_longer_context_reads_the_pace_before_learning_new_lengths():
    """The 2-core CPU's case: after 3,000 positions every pass took 1.7-2.3x as long as after 64.
    The first timing of a length never timed there has nothing to be read against, so it is not
    learnt; the plain step, timed before, gives the pace at once; a new length is then learnt at
    that pace. Before, it was learnt at the old pace (1.7x too dear) and then scaled by the new
    one again: V(6) read 1.7 x 1.7 its cost, and the head stopped drafting lengths it paid at."""
    curve = _warmed_at(32, {1: 1.0, 2: 1.2, 3: 1.4}, 1.0)
    guess = curve.verify_seconds(6)
    curve.at_context(3000)
    assert curve.pace_open
    curve.observe(6, 2.9)  # never timed: no pace yet to learn it at
    assert curve.age(6) is None and curve.verify_seconds(6) == pytest.approx(guess)
    curve.observe_plain(1.7)
    assert not curve.pace_open and curve.pace == pytest.approx(1.7)
    assert curve.plain_seconds() == pytest.approx(1.7)
    curve.observe(6, 2.9)
    assert curve.verify_seconds(6) == pytest.approx(2.9)  # its own cost, not 1.7 x 2.9
    assert curve.verify_seconds(2) == pytest.approx(1.7 * 1.2)


def test_a_step_never_timed_waits_for_the_pace_too():
    curve = _warmed_at(32, {1: 1.0, 2: 1.2}, None)
    curve.at_context(3000)
    curve.observe_plain(1.7)  # nothing to read it against
    assert curve.pace_open and curve.plain.value() is None
    curve.observe(2, 2.4)
    assert curve.pace == pytest.approx(2.0)
    curve.observe_plain(1.7)
    assert curve.plain.value() == pytest.approx(1.7 / 2.0)


def test_a_chat_growing_turn_by_turn_keeps_its_pace():
    curve = _warmed_at(32, {1: 1.0, 2: 1.2}, 1.0)
    for n in range(300, 6000, 300):  # each turn a few hundred positions longer
        curve.at_context(n)
        assert not curve.pace_open, n
        curve.observe_plain(1.0 + n / 10000)
    assert len(curve._ratios) == 5  # never forgotten
    curve.at_context(100)  # a new, short conversation after 5,700 positions
    assert curve.pace_open


def test_the_first_pace_after_a_jump_is_no_stall():
    curve = _warmed_at(100, {1: 1.0, 2: 1.2}, 1.0)
    curve.at_context(1000)  # 10x the positions: a pass may take up to 4 x 10 x its estimate and count
    curve.observe_plain(45.0)  # a first-use compile
    assert curve.pace_open and curve.pace == 1.0
    curve.observe_plain(1.3)
    curve.observe_plain(1.35)
    assert curve.pace == pytest.approx(1.3)  # the least of the first samples: stalls only slow one down
    curve.observe_plain(1.4)
    assert curve.pace == pytest.approx(1.35)  # then their median, as before


def test_a_context_slowing_passes_past_the_stall_bar_still_sets_the_pace():
    """Passes 5x dearer after 20x the positions: above the stall bar (STALL x the old pace), yet
    the context's growth explains them, so the first timing sets the new pace."""
    assert 5.0 > STALL
    curve = _warmed_at(100, {1: 1.0, 2: 1.2}, 1.0)
    curve.at_context(2000)
    curve.observe_plain(5.0)
    assert not curve.pace_open and curve.pace == pytest.approx(5.0)
    curve.at_context(100)  # back to short requests: no growth, the usual bar
    curve.observe_plain(STALL * 5.0 * 1.5)  # a compile stall
    assert curve.pace_open


def test_calibrated_curve_is_scaled_from_the_nearest_timed_length():
    c = TargetCurve(prior_ratios={1: 1.0, 2: 1.1, 3: 1.2, 4: 3.0, 5: 3.1})
    c.observe(1, 0.2)
    assert c.verify_seconds(4) == pytest.approx(0.6)
    c.observe(3, 0.3)  # slower than the curve said: lengths near 3 follow the measurement
    assert c.verify_seconds(4) == pytest.approx(0.3 * 3.0 / 1.2)
    c.prior_ratios = {1: 1.0, 3: 1.5, 4: 2.0}  # a new prior replaces the cached interpolations
    assert c.verify_seconds(4) == pytest.approx(0.3 * 2.0 / 1.5)


def test_a_pass_timed_at_zero_seconds_teaches_nothing():
    curve = TargetCurve()
    curve.add_verify(2, 0.0)
    curve.add_verify(2, -1e-3)
    assert curve.measured() == {}


def test_a_long_conversation_s_longer_turns_keep_the_pace():
    """Past a few thousand positions a turn of 600 more (JUMP_TOKENS or over, but by less than
    JUMP_RATIO) barely changes what a pass reads: the pace stays. From 300 to 1,000 it does not."""
    curve = _warmed_at(4000, {1: 1.0, 2: 1.2}, 1.0)
    for n in (4600, 5200, 5800):
        curve.at_context(n)
        assert not curve.pace_open, n
    curve = _warmed_at(300, {1: 1.0, 2: 1.2}, 1.0)
    curve.at_context(1000)
    assert curve.pace_open


def test_a_confirmed_length_is_no_longer_warm_up_s():
    curve = TargetCurve()
    curve.observe(2, 1.0, trusted=True)
    assert curve.provisional(2)
    curve.touch(2)
    assert not curve.provisional(2) and curve.age(2) == 0


def test_guesses_follow_the_plain_step_when_it_moves():
    """Lengths never timed are guessed from the plain step (standing in for V(1)); when the step's
    estimate moves by more than a tenth, the guesses are made again from it."""
    curve = TargetCurve(prior_slope=0.5)
    for _ in range(3):
        curve.observe_plain(1.0)
    assert curve.verify_base(3) == pytest.approx(2.0)  # 1 + 0.5 x 2
    for _ in range(9):
        curve.plain.add(0.5, curve.now)  # the step got faster (at pace 1)
    assert curve.plain_base() == pytest.approx(0.5)
    assert curve.verify_base(3) == pytest.approx(1.0)


def test_past_the_longest_timed_length_a_noisy_dip_is_no_discount():
    """Timings that fall from one length to the next (noise) do not make longer passes cheaper."""
    c = TargetCurve()
    c.observe(2, 1.2)
    c.observe(3, 1.0)
    assert c.verify_seconds(6) == pytest.approx(1.0)


@pytest.mark.parametrize("compiles", [True, False])
def test_only_a_first_use_that_compiles_is_unsure_and_never_warm_ups(compiles):
    """Warm-up compiled its lengths: their loop timings are sure. On a CPU nothing compiles per
    shape, so a first use's timing is as good as any and prices the lengths beyond it."""
    curve = TargetCurve(first_use_compiles=compiles)
    for j in (1, 2, 3):
        curve.observe(j, 1e-3 * j, trusted=True)
    curve.observe(2, 2.5e-3)  # the loop's first timing of a length warm-up compiled
    curve.observe(4, 9e-3)  # a length warm-up did not run: its first use
    assert not curve.unsure(2) and curve.unsure(4) == compiles
    # V(6) continues the slope of the last two lengths that price it: V(2)-V(3), or V(3)-V(4).
    assert curve.verify_seconds(6) == pytest.approx(3e-3 + 3 * 0.5e-3 if compiles else 9e-3 + 2 * 6e-3)
    curve.observe(4, 4e-3)
    assert not curve.unsure(4) and curve.verify_seconds(4) == pytest.approx(4e-3)


def test_guesses_cached_before_the_plain_step_moved_are_made_again():
    """As above, with V(1)'s guess read (so cached) before the step moved: the step moving is what
    makes the guesses again, not a length read for the first time since."""
    c = TargetCurve()
    c.observe_plain(5e-3)
    assert c.verify_base(1) == pytest.approx(5e-3) and c.verify_base(4) == pytest.approx(12.5e-3)
    c.observe_plain(2.5e-3)  # (fewer than 3 samples: the estimate is their minimum)
    assert c.verify_base(1) == pytest.approx(2.5e-3) and c.verify_base(4) == pytest.approx(6.25e-3)
