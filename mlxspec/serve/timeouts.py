"""Clients that connect and stall are disconnected.

uvicorn closes a keep-alive connection that stays idle after an answer, but it waits without end
for a request head that never completes: a few thousand such connections (a "slowloris") exhaust
the process's open files, and nobody else is served. Here a client has `seconds` from connecting,
or from the end of its previous answer, to send a whole request head; the app gives it as long
between two pieces of a body (`body.read_json`). Nothing bounds an answer: once its head has come, a
request may wait in the queue and stream for as long as it takes.
"""

from __future__ import annotations

import asyncio
from typing import Optional

from uvicorn.protocols.http.h11_impl import H11Protocol


def head_timeout_protocol(seconds: float) -> type:
    """uvicorn's h11 protocol, closing connections whose request head takes longer than `seconds`."""
    return type("HeadTimeoutH11Protocol", (HeadTimeoutH11Protocol,), {"seconds": seconds})


class HeadTimeoutH11Protocol(H11Protocol):
    seconds = 30.0

    _timer: Optional[asyncio.TimerHandle] = None
    _waiting_after = None  # the cycle (request) after which a new head is awaited; None: the first

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm(None)

    def handle_events(self) -> None:
        super().handle_events()
        if self._timer is not None and self.cycle is not self._waiting_after:  # a new request's head came
            self._disarm()

    def on_response_complete(self) -> None:
        self._arm(self.cycle)  # first: a pipelined request that is already here disarms it at once
        super().on_response_complete()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, after) -> None:
        self._disarm()
        self._waiting_after = after
        if self.seconds > 0:
            self._timer = self.loop.call_later(self.seconds, self._expire)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        if not self.transport.is_closing():
            self.transport.close()
