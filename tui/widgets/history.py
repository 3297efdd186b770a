"""The chat history above the input: your messages, short answers, verdicts and notices."""

from __future__ import annotations

from typing import List, Optional, Tuple

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from ..conversation import SPEC, Turn, answer_part

PREVIEW = 240  # characters of each message and answer kept in the history (the panes show answers in full)


class ChatHistory(VerticalScroll):
    can_focus = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._asked: List[Static] = []  # the entry of the message being answered
        self._shown: List[Tuple[Turn, List[Static]]] = []  # each turn shown, with its entries

    def on_mount(self) -> None:
        self.anchor()

    def add_user(self, text: str) -> None:
        if len(text) > PREVIEW:  # a long paste: the model reads it whole, /save keeps it whole
            text = text[:PREVIEW] + f"… ({len(text):,} characters)"
        entry = self._add(Text.assemble(("you ", "bold"), text), "user")
        self._asked = [entry] if entry is not None else []

    def add_turn(self, turn: Turn, markers=None) -> None:
        """The turn's answer (without its reasoning, where `markers` say where that is) and verdict."""
        answer = answer_part(turn.answers[SPEC].text, markers).strip()
        if len(answer) > PREVIEW:
            answer = answer[:PREVIEW] + "…"
        empty = "(stopped before its first token; left out of the conversation)" if turn.stopped else "(empty)"
        entries = self._asked + [self._add(Text.assemble(("model ", "bold"), answer or empty), "answer"),
                                 self._add(Text(turn.verdict()), "verdict")]
        self._shown.append((turn, [e for e in entries if e is not None]))

    def take_back(self, turn: Turn) -> None:
        """Strike out `turn`'s message, answer and verdict: /retry or /undo took it out of the
        conversation, and it stays in sight to compare with what comes next."""
        for shown, entries in self._shown:
            if shown is turn:
                for entry in entries:
                    entry.add_class("taken-back")

    def add_notice(self, text: str, *, error: bool = False, from_its_top: bool = False) -> None:
        """`from_its_top`: scrolled so the notice's first line shows (a long one, as /help's, on a
        short screen), not its last."""
        entry = self._add(Text(text), "error" if error else "notice")
        if entry is not None and from_its_top:  # this releases the anchor: `_add` sets it again
            self.call_after_refresh(self.scroll_to_widget, entry, top=True, animate=False)

    def clear(self) -> None:
        self.remove_children()
        self._asked, self._shown = [], []

    def _add(self, text: Text, kind: str) -> Optional[Static]:
        if not self.is_attached:  # a turn that ends while the app quits has no screen left to show it on
            return None
        entry = Static(text, classes=f"entry {kind}")
        self.anchor()  # what is added shows, also after a scroll (yours, or /help's to its top)
        self.mount(entry)
        return entry
