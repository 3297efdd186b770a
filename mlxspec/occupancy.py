"""Which thread is inside an engine's generation loop now: a second thread gets a clear error.

An engine's caches hold one conversation. Two threads stepping them at once would interleave
their passes, and MLX cannot evaluate on one thread the lazy arrays another thread built ("There
is no Stream(cpu, 1) in current thread", then an abort at exit). A stream suspended between two
events holds nothing: a request from any thread may then overtake it, as a later request on the
same thread does.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

from .errors import EngineBusyError

BUSY = ("this engine is generating in another thread ({thread}); an engine runs one generation at a "
        "time: wait for that one to end, or give each thread its own engine (engine.fork(), which "
        "shares the weights)")


class Occupancy:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.thread: Optional[threading.Thread] = None  # the thread inside the loop now

    def try_enter(self, then: Optional[Callable[[], None]] = None) -> bool:
        """Take the engine for this thread unless another live thread holds it; `then` runs while
        taking it (ending an open stream), so no thread can see the engine taken but not yet ended."""
        me = threading.current_thread()
        with self._lock:
            held = self.thread
            if held is not None and held is not me and held.is_alive():
                return False
            if then is not None:  # first: if it fails, the engine is not left held by this thread
                then()
            self.thread = me
            return True

    def enter(self, then: Optional[Callable[[], None]] = None) -> None:
        """`try_enter`, or EngineBusyError naming the thread that holds the engine."""
        if not self.try_enter(then):
            held = self.thread
            raise EngineBusyError(BUSY.format(thread=held.name if held is not None else "ended"))

    def leave(self) -> None:
        if self.thread is threading.current_thread():
            self.thread = None
