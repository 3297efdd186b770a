"""Messages the worker threads post to the app. Widgets change only in their handlers."""

from __future__ import annotations

from dataclasses import dataclass
import threading
from typing import Any, Optional, Tuple

from textual.message import Message

from .conversation import Turn
from .stats_view import StatsView

Piece = Tuple[str, bool]  # (text, from_draft)


@dataclass
class EngineReady(Message):
    """The loader worker built the engines."""

    engine: Any
    vanilla_engine: Any = None


@dataclass
class LoadFailed(Message):
    """The loader worker failed; `detail` is a readable explanation, not a traceback, and `hint`
    what to do about it."""

    detail: str
    hint: str


@dataclass
class TokensAdded(Message):
    """New text for one pane (a delta: never merged with other deltas)."""

    side: str  # "speculative" | "vanilla"
    pieces: Tuple[Piece, ...]


@dataclass
class StatsUpdated(Message):
    """Live statistics for one pane; a newer update for the same side replaces a queued one."""

    side: str
    stats: StatsView

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, StatsUpdated) and message.side == self.side


@dataclass
class TurnFinished(Message):
    """Both sides are done (finished, stopped, or failed with `error`)."""

    turn: Turn
    error: Optional[str] = None


@dataclass
class Settle(Message):
    """The worker waits for `done` before it times more work: the app sets it once the messages
    posted before this one are handled and the screen has repainted, so drawing them never runs
    beside a side's timed steps (on a shared CPU it slowed whichever side ran then)."""

    done: threading.Event
