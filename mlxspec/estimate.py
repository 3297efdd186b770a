"""A robust running duration: the median of the last few timings, with stalls held back.

A sample several times the estimate is held back as a stall (first-use compilation, a
preempted thread) unless it repeats; a run of three taken for a new level is undone when the
next sample is back at the old one (stalls only ever slow a sample down).
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Optional

STALL = 4.0  # a sample this many times the estimate is a stall (until it repeats)


class Estimate:
    """A robust running duration: median of the last `n` samples, minimum while fewer than 3."""

    def __init__(self, n: int = 9):
        self.samples: deque = deque(maxlen=n)
        self.held: list = []  # consecutive samples held back as stalls
        self.before: Optional[list] = None  # the samples a new regime replaced, until one of its own confirms it
        self.when = -1  # round of the latest accepted sample
        self.provisional = False  # every sample came from warm-up: the first of the loop's replaces them
        self._value: Optional[float] = None  # cached; None = recompute

    def add(self, seconds: float, now: int = 0, *, provisional: bool = False, guess: Optional[float] = None,
            fresh_after: Optional[int] = None) -> bool:
        """Record a sample; returns False when it was held back as a stall. `provisional`:
        a warm-up timing, which the first later (loop) sample replaces. `guess`: what a first
        sample should be near (a first sample over STALL times it is held back too).
        `fresh_after`: an estimate no sample came to for this many rounds is replaced by a
        lower one (a slower spell's, or stalls', that kept itself from being re-timed)."""
        est = self.value()
        bar = est if est is not None else guess
        if bar is not None and seconds > STALL * bar:
            if len(self.held) < 2:
                self.held.append(seconds)
                return False
            # The third in a row is no stall but a new regime: forget the old one, unless the next
            # sample is back at its level (first-use compiles on a GPU come in runs of rounds).
            if est is not None:
                self.before = list(self.samples)
                self.samples.clear()
                self.samples.extend(self.held)
        elif self.before is not None and est is not None and seconds * STALL < est:
            # Back at the old level: the "regime" was a run of stalls, since a stall only ever
            # slows a sample down. Without this, a draft cost taken from such a run would keep its
            # drafter from drafting, so from ever being timed again.
            self.samples.clear()
            self.samples.extend(self.before)
            self.before = None
        elif self.provisional and not provisional:
            self.samples.clear()
        elif fresh_after is not None and est is not None and now - self.when >= fresh_after and seconds < est:
            self.samples.clear()
            self.before = None
        else:
            self.before = None  # a sample at the new regime's level confirms it
        self.held = []
        self.provisional = provisional and (self.provisional or not self.samples)
        self.samples.append(seconds)
        self.when = now
        self._value = None
        return True

    def value(self) -> Optional[float]:
        if self._value is None and self.samples:
            xs = sorted(self.samples)
            self._value = xs[0] if len(xs) < 3 else statistics.median(xs)
        return self._value

    def __len__(self) -> int:
        return len(self.samples)

    def settled(self) -> bool:
        """Timed at least 3 times in the loop, and not mid-way to a new level: a timing's ratio to
        it is the host's pace, not the estimate's own error."""
        return len(self.samples) >= 3 and not self.provisional and self.before is None and not self.held
