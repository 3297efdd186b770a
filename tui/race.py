"""Race two token streams on one thread, so they never compete for the device.

Interleaved mode: one speculative round (its events run up to the round's target token,
the only one with from_draft=False), then vanilla steps until vanilla's compute time
catches up with speculative's, and so on. Both panes fill together while each side's
tokens/s counts only its own compute time. Sequential mode: speculative to the end, then
vanilla. The cancel event is checked after every step; the generators are always closed.

Each loop keeps its next pass in flight on the device while it yields (that is how it stays
as fast as mlx-lm). At a switch the side that stops waits for that pass (`mx.synchronize`)
on its own clock, so the other side's first step does not pay for it; the wait is added to
that side's `stats.seconds` too (the loop times only its own steps, and the pass it left in
flight is its work: uncounted, the speculative side, which switches after every round, read
1.46x as 1.58x).

`between()` runs at each switch, when neither side has a pass in flight (and after every slice
once only one side is left): the one place the caller may draw what it was given. Drawing
beside a timed step slowed that side (measured: a chat whose two sides did the same work read
about 1.08x faster speculation, 1.00x with nothing drawn).
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Dict, Iterator, List, Optional, Tuple

from .conversation import SPEC, VANILLA


class _Side:
    def __init__(self, gen):
        self.gen = gen
        self.spent = 0.0  # seconds inside next(), prompt processing included
        self.done = False
        self.stats = None  # the generation's GenerationStats (every event carries the same object)

    def step(self):
        """The next event, or None when the stream is exhausted."""
        t = time.perf_counter()
        try:
            ev = next(self.gen)
        except StopIteration:
            self.done = True
            return None
        finally:
            self.spent += time.perf_counter() - t
        self.stats = ev.stats
        if ev.finish_reason:
            self.done = True
        return ev

    def pause(self) -> None:
        """Wait for this side's in-flight pass before the other side runs, on this side's clock."""
        import mlx.core as mx

        t = time.perf_counter()
        mx.synchronize()
        waited = time.perf_counter() - t
        self.spent += waited
        if self.stats is not None:
            self.stats.seconds += waited


def race(streams: Dict[str, Iterator], *, cancel: threading.Event, sequential: bool = False,
         between: Optional[Callable[[], object]] = None) -> Iterator[Tuple[str, List]]:
    """Yield (side, events) slices from `streams[SPEC]` and `streams[VANILLA]` until both end or
    `cancel` is set; call `between()` where nothing is being timed (see the module's doc)."""
    spec, van = _Side(streams[SPEC]), _Side(streams[VANILLA])
    idle = between or (lambda: None)
    try:
        while not (spec.done and van.done) and not cancel.is_set():
            if not spec.done:
                batch = []
                while not spec.done and not cancel.is_set():
                    ev = spec.step()
                    if ev is None:
                        break
                    batch.append(ev)
                    if not ev.from_draft:  # a round ends with the one token the target chose itself
                        break
                if not sequential:
                    spec.pause()
                if batch:
                    yield SPEC, batch
                idle()
                if sequential:
                    continue
            # vanilla steps until its compute time catches up (all of them once speculative is done)
            while not van.done and not cancel.is_set() and (spec.done or van.spent < spec.spent):
                ev = van.step()
                if ev is not None:
                    yield VANILLA, [ev]
                if spec.done:
                    idle()
            if not spec.done:
                van.pause()
                idle()
    finally:
        for gen in streams.values():
            gen.close()  # the engines stay consistent and usable
