"""A cost is a robust estimate: the minimum while few, then the median, with stalls held back unless they repeat."""

import pytest

from mlxspec.estimate import Estimate


def test_loop_timings_replace_warm_ups_which_a_median_would_keep():
    e = Estimate()
    for s in (1.3, 1.25):
        e.add(s, provisional=True)
    assert e.provisional and e.value() == 1.25
    e.add(1.05)  # the loop's first timing replaces warm-up's instead of sitting beside them
    assert not e.provisional and e.value() == 1.05
    e.add(1.2, provisional=True)  # a later warm-up (a new pair) joins the loop's, as any timing
    assert not e.provisional and len(e) == 2
    e = Estimate()
    e.add(1.0, provisional=True)
    assert not e.add(9.0) and e.value() == 1.0  # a stall is still held back, not a replacement
    assert not e.add(9.5)
    e.add(8.0)  # the third in a row: a new regime of the three, with warm-up's timing gone
    assert list(e.samples) == [9.0, 9.5, 8.0] and not e.provisional and e.value() == 9.0


def test_estimate_is_the_minimum_while_few_then_the_median():
    e = Estimate()
    e.add(5.0)
    e.add(1.0)
    assert e.value() == 1.0  # a first sample that was a stall does not survive a second one
    for x in (1.2, 0.9, 1.1):
        e.add(x)
    assert e.value() == pytest.approx(1.1)


def test_a_stall_is_held_back_unless_it_repeats():
    e = Estimate()
    for _ in range(5):
        e.add(1.0)
    assert not e.add(100.0) and e.value() == 1.0
    e.add(1.0)
    assert e.value() == 1.0
    # A lasting change (a longer context, a busier machine) is accepted after it repeats.
    results = [e.add(10.0) for _ in range(8)]
    assert results[:2] == [False, False] and all(results[2:]) and e.value() == 10.0


def test_a_run_of_stalls_taken_for_a_new_regime_is_undone_when_the_old_level_returns():
    e = Estimate()
    for _ in range(5):
        e.add(1.0)
    assert [e.add(x) for x in (90.0, 40.0, 150.0)] == [False, False, True]  # three in a row: a "regime"
    assert e.value() == 90.0
    e.add(1.1)  # back at the old level: they were stalls (a stall only ever slows a sample down)
    assert e.value() == pytest.approx(1.0)
    for x in (90.0, 40.0, 150.0, 80.0):  # a regime that its next sample confirms stays
        e.add(x)
    e.add(1.0)
    assert e.value() > 40.0


def test_a_first_sample_far_over_its_guess_is_held_back():
    e = Estimate()
    assert not e.add(50.0, guess=1.0) and e.value() is None
    assert e.add(1.2, guess=1.0) and e.value() == 1.2
    e2 = Estimate()
    assert [e2.add(50.0, guess=1.0) for _ in range(3)] == [False, False, True]  # it repeats: it is the cost


def test_settled_only_when_timed_thrice_by_the_loop_and_not_between_levels():
    e = Estimate()
    for s in (1.0, 1.0):
        e.add(s)
    assert not e.settled()  # two samples: the minimum, not yet a median
    e.add(1.0)
    assert e.settled()
    e.add(9.0)
    assert not e.settled()  # a stall held back: the next sample says whether it was one
    e.add(1.0)
    assert e.settled()
    for _ in range(3):
        e.add(9.0)  # the third in a row is taken for a new level...
    assert e.value() == 9.0 and not e.settled()  # ...not settled until one of its own confirms it
    e.add(9.0)
    assert e.settled()
    w = Estimate()
    for _ in range(3):
        w.add(1.0, provisional=True)
    assert not w.settled()  # warm-up's


def test_an_estimate_left_untimed_is_replaced_by_a_lower_timing_only():
    """`fresh_after`: an estimate nothing re-timed for that many rounds (it kept its drafter from
    drafting) gives way to a lower sample at once; a higher one is an ordinary sample."""
    e = Estimate()
    for i in range(5):
        e.add(0.8, i)
    e.add(1.0, 50, fresh_after=20)
    assert e.value() == 0.8  # one higher sample among five lower ones
    e = Estimate()
    for i in range(5):
        e.add(0.8, i)
    e.add(0.5, 50, fresh_after=20)
    assert e.value() == 0.5 and len(e) == 1
    e.add(0.5, 51, fresh_after=20)  # re-timed since: no longer stale, an ordinary sample
    assert len(e) == 2


def test_a_replaced_estimate_forgets_the_level_before_it():
    """An estimate replaced for staleness starts over: the level a run of stalls replaced long ago
    is not brought back by the next fast sample."""
    e = Estimate()
    for i in range(3):
        e.add(1.0, i)
    for i in range(3, 6):
        e.add(9.0, i)  # taken for a new level; the old one is kept until one of its own confirms it
    e.add(3.0, 60, fresh_after=20)
    e.add(0.5, 61)
    assert e.value() == 0.5 and len(e) == 2
