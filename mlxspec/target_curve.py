"""The target's costs on this device, V(j) for passes of j tokens and the pipelined step P,
shared by every drafter of an engine (`costmodel.CostModel` keeps each drafter's own).

Costs are kept at the host's pace (`TargetCurve.pace`): a host's speed drifts, and moves every
cost alike (on an H100 a third from one request to the next), so each timing first tells the
pace, the median of the last few timings over their settled estimates, and then teaches its own
estimate only what the pace does not explain. Choices compare costs, so they never mix two
spells of the host: before, a slower spell's rounds charged their whole excess to the draft
cost and stopped drafting where it paid. The price: a length whose cost changes alone is learnt
only while most timings are of other lengths (a run of one length reads as the host's pace).
Every pass also reads the keys of the positions before it, so a request far longer or shorter
than the last (`TargetCurve.at_context`) starts a new pace: on this project's 2-core CPU a pass
of one row took 1.7x as long after 3,000 positions as after 64, and a request there, timed at
the old pace, had its new lengths learnt 1.7x too dear and then scaled by the new pace again.

A length never timed is interpolated from the timed ones (or a calibration curve). Warm-up's
timings seed the curve until the loop's own replace them. Where a length's first pass compiles
its kernels (a GPU's), a length the loop timed only once, at that first use, is *unsure*: a
moderate stall is not held back as one (on an H100 an engine not warmed timed V(5) once, at 18
ms, while it compiled; every longer length, priced by continuing that slope, looked too dear to
be tried, so none was re-timed, and the engine drafted 2 tokens a round where a warmed one
drafted 15). Other lengths are not priced from an unsure one, and its own price is the lower of
its timing and what the other lengths predict, so a round that could pay there re-times it (its
second timing replaces the first where lower; `CostModel.observe_round` teaches it V, not the
draft cost). On a CPU nothing compiles per shape: a first timing is as good as any, and pricing
new lengths without it made the head try a chain of each longer length in turn.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Dict, Optional

from .estimate import STALL, Estimate

PACE_N = 5  # the pace is the median of this many timings over their estimates
# A pass's context this much longer or shorter than the one the pace was read at (by JUMP_TOKENS
# and by a factor of JUMP_RATIO) starts a new pace; a chat's turns of ordinary length never do.
JUMP_TOKENS, JUMP_RATIO = 512, 1.5


class TargetCurve:
    """The target's costs on this device: V(j) for rounds of j fed tokens, and the pipelined step P."""

    def __init__(self, *, prior_ratios: Optional[Dict[int, float]] = None, prior_slope: float = 0.5,
                 first_use_compiles: bool = False):
        self._interp: Dict[int, Optional[float]] = {}
        self.prior_ratios = prior_ratios  # V(j)/V(1), e.g. from `mlxspec calibrate`
        self.prior_slope = prior_slope  # V(j)/V(1) = 1 + slope*(j-1) when nothing better is known
        self.v: Dict[int, Estimate] = {}
        self.plain = Estimate()
        self.now = 0  # rounds observed (the clock of `Estimate.when`)
        self._known: Optional[Dict[int, float]] = None  # cache of measured(); None = recompute
        self._anchor: Optional[float] = None  # the plain step time the cached guesses were made with
        # The host's pace: seconds now per second of the estimates, which are kept at pace 1. A
        # host's speed drifts (a third from one request to the next on an H100) and moves every
        # cost alike, so a timing first moves the pace and teaches its own estimate only what the
        # pace does not explain; choices, which compare costs, then never mix two spells.
        self.pace = 1.0
        self._ratios: deque = deque(maxlen=PACE_N)
        self.context: Optional[int] = None  # positions before the passes timed next (`at_context`)
        self.pace_context: Optional[int] = None  # the context the pace was last read at
        # The pace is being read anew (`at_context`): no timing is learnt until one gives it.
        self.pace_open = False
        self._growth = 1.0  # after a jump, how much longer the context got (the first sample's stall bar)
        self._fresh = False  # since the jump, fewer than 3 pace samples: the pace is their minimum
        self._unsure: set = set()  # lengths whose one sample is their first use's (maybe compiling)
        self.first_use_compiles = first_use_compiles  # a GPU's: a length's first pass builds its kernels

    @property
    def prior_ratios(self) -> Dict[int, float]:
        return self._prior

    @prior_ratios.setter
    def prior_ratios(self, ratios: Optional[Dict[int, float]]) -> None:
        self._prior = dict(ratios or {})
        self._interp = {}  # cache of verify_seconds() for unmeasured lengths

    def observe(self, j: int, seconds: float, *, trusted: bool = False) -> None:
        """A round (not pipelined) whose target pass fed j tokens took `seconds`; `trusted` for
        timings known to be free of first-use compilation (warm-up's).

        Warm-up's timings are provisional: the loop's first timing of the length replaces them.
        On an H200 warm-up timed passes of 1-3 tokens 20-30 % above what the loop measured
        later, and as 2 of the 9 samples a median keeps they would have outvoted the loop's
        corrections for hundreds of rounds, with the lengths looking too dear to be drafted.
        """
        self.now += 1
        if seconds <= 0:
            return
        if not trusted and not self.pace_sample(seconds, self.v.get(j)):
            return  # no pace to learn it at yet
        self.add_verify(j, seconds / self.pace, trusted=trusted)

    def add_verify(self, j: int, x: float, *, trusted: bool = False) -> None:
        """Teach V(j) a timing `x` at pace 1 (already divided by the pace)."""
        if x <= 0:
            # No pass is free. A round's time less a drafting estimate that exceeds it (a slow draft
            # step, before the plain step's floor is known) says nothing about V, and V = 0 would
            # make a free drafter's rounds cost nothing.
            return
        e = self.v.get(j)
        first_use = e is None  # (every length timed, or held back as a stall, has its estimate)
        if e is None:
            e = self.v[j] = Estimate()
        # A first sample is judged against what the other lengths predict.
        guess = self.verify_base(j) if not len(e) and not trusted else None
        if e.add(x, self.now, provisional=trusted, guess=guess):
            if first_use and not trusted and self.first_use_compiles:
                self._unsure.add(j)
            else:
                self._unsure.discard(j)
            self._known, self._interp = None, {}

    def at_context(self, n: int) -> None:
        """The passes timed next attend to `n` positions before their own. Far from where the pace
        was read (JUMP_TOKENS and JUMP_RATIO), its samples are forgotten and it is read anew
        (`pace_open`): the next timing of work timed before sets it, and timings of work never
        timed are not learnt until then (at the old pace they would be learnt as dear as the
        context made them, and then scaled by the new pace again)."""
        self.context = n
        ref = self.pace_context
        if ref is None:
            self.pace_context = n
        elif abs(n - ref) >= JUMP_TOKENS and max(n, ref) >= JUMP_RATIO * max(1, min(n, ref)):
            self._ratios.clear()
            self.pace_open, self._fresh = True, True
            self._growth = max(1.0, n / max(1, ref))
            self.pace_context = n

    def pace_sample(self, seconds: float, e: Optional[Estimate]) -> bool:
        """A timing of the work `e` prices at pace 1: a pace sample where `e` is settled (while the
        pace is read anew, where it was timed at all). A stall's is no pace (a first-use compile
        slows one round, not the host). False while there is no pace to learn timings at."""
        if e is None or not len(e) or not (self.pace_open or e.settled()):
            return not self.pace_open
        expected = e.value()
        bar = STALL * self.pace * (self._growth if self.pace_open else 1.0)
        if not expected or seconds <= 0 or seconds > bar * expected:
            return not self.pace_open
        self._ratios.append(seconds / expected)
        if self._fresh and len(self._ratios) < 3:
            self.pace = min(self._ratios)  # stalls only slow a sample down, as in `Estimate`
        else:
            self._fresh = False
            self.pace = statistics.median(self._ratios)
        self.pace_open = False
        if self.context is not None:
            self.pace_context = self.context
        return True

    def touch(self, j: int) -> None:
        """V(j) was confirmed, not re-timed (a model drafter's round was no faster than it)."""
        e = self.v.get(j)
        if e is not None and len(e):
            e.when = self.now
            e.provisional = False

    def unsure(self, j: int) -> bool:
        """V(j)'s one timing is its first use's, which may have compiled kernels (not warmed)."""
        return j in self._unsure

    def provisional(self, j: int) -> bool:
        """V(j) is warm-up's timing, not yet confirmed by a round of the loop."""
        e = self.v.get(j)
        return e is not None and e.provisional

    def observe_plain(self, seconds: float) -> None:
        """A pipelined plain step took `seconds` (the period between two reads)."""
        self.now += 1
        if seconds <= 0:  # hidden behind a slow consumer (its time is not the pass's): no timing
            return
        if self.pace_sample(seconds, self.plain):
            self.plain.add(seconds / self.pace, self.now)

    def measured(self) -> Dict[int, float]:
        """{j: V(j)} for the lengths timed so far, at pace 1."""
        if self._known is None:
            self._known = {j: e.value() for j, e in sorted(self.v.items()) if len(e)}
        return self._known

    def age(self, j: int) -> Optional[int]:
        """Rounds since V(j) was last timed; None when never."""
        e = self.v.get(j)
        return None if e is None or not len(e) else self.now - e.when

    def plain_seconds(self) -> Optional[float]:
        """Seconds per token of plain decoding: the pipelined step, else a round of 1."""
        p = self.plain_base()
        return None if p is None else p * self.pace

    def plain_base(self) -> Optional[float]:
        """The plain step at pace 1."""
        p = self.plain.value()
        v1 = self.verify_base(1)
        if p is None or v1 is None:
            return v1 if p is None else p
        # A round of 1 is never faster than a pipelined step timed at the same time; one timed
        # before the step's latest sample may be from a faster spell of the host's.
        age = self.age(1)  # None: V(1) is only interpolated (from p among others)
        return p if p <= v1 or age is None or age > self.now - self.plain.when else v1

    def verify_seconds(self, j: int) -> Optional[float]:
        """Measured or interpolated V(j) at the host's pace now; None before any round was timed."""
        v = self.verify_base(j)
        return None if v is None else v * self.pace

    def verify_base(self, j: int) -> Optional[float]:
        """V(j) at pace 1 (`pace` times it is today's).

        Unmeasured lengths are interpolated from the measured ones, with the pipelined plain
        step standing in for V(1) when it is cheaper: it is the pass without the host's
        bubble, so the guess is optimistic by one bubble and the first round at that length,
        which includes it, then measures it.
        """
        known = self.measured()
        if j in known and j not in self._unsure:
            return known[j]
        p = self.plain.value()
        if p is not None and (self._anchor is None or abs(p - self._anchor) > 0.1 * self._anchor):
            self._anchor, self._interp = p, {}  # refresh the cached guesses when the step time moved
        if j not in self._interp:
            guess = self._interpolate(j, self._anchors(known))
            if j in known:  # unsure: the lower of its one timing (maybe a compile's) and what the others predict
                guess = known[j] if guess is None else min(known[j], guess)
            self._interp[j] = guess
        return self._interp[j]

    def _anchors(self, known: Dict[int, float]) -> Dict[int, float]:
        """The timings other lengths are priced from, at pace 1: the measured ones but the unsure
        (while any other is known), the pipelined step standing in for V(1) when cheaper."""
        sure = {x: t for x, t in known.items() if x not in self._unsure}
        if sure or self._anchor is not None:
            known = sure
        if self._anchor is not None and self._anchor < known.get(1, float("inf")):
            known = {**known, 1: self._anchor}
        return known

    def _interpolate(self, j: int, known: Dict[int, float]) -> Optional[float]:
        if not known:
            return None
        if j in known:  # V(1), when the plain step stands in for it
            return known[j]
        if j in self.prior_ratios:  # scale the calibrated curve from the nearest timed length
            m = min(known, key=lambda x: abs(x - j))
            if m in self.prior_ratios:
                return known[m] * self.prior_ratios[j] / self.prior_ratios[m]
        lo = max((x for x in known if x < j), default=None)
        hi = min((x for x in known if x > j), default=None)
        ratio = lambda x: 1.0 + self.prior_slope * (x - 1)  # noqa: E731
        if lo is None:  # shorter than every timed length
            return known[hi] * ratio(j) / ratio(hi)
        if hi is not None:
            t = (j - lo) / (hi - lo)
            return known[lo] + t * (known[hi] - known[lo])
        xs = sorted(known)
        if len(xs) >= 2:  # longer than every timed length: continue the last slope
            a, b = xs[-2], xs[-1]
            return known[b] + max(0.0, (known[b] - known[a]) / (b - a)) * (j - b)
        return known[lo] * ratio(j) / ratio(lo)
