"""The chat history above the input: your messages, short answers, verdicts and notices."""

from __future__ import annotations

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from ..conversation import SPEC, Turn, answer_part

PREVIEW = 240  # characters of each answer kept in the history (the panes show it in full)


class ChatHistory(VerticalScroll):
    can_focus = False

    def on_mount(self) -> None:
        self.anchor()

    def add_user(self, text: str) -> None:
        self._add(Text.assemble(("you ", "bold"), text), "user")

    def add_turn(self, turn: Turn, markers=None) -> None:
        """The turn's answer (without its reasoning, where `markers` say where that is) and verdict."""
        answer = answer_part(turn.answers[SPEC].text, markers).strip()
        if len(answer) > PREVIEW:
            answer = answer[:PREVIEW] + "…"
        empty = "(stopped before its first token; left out of the conversation)" if turn.stopped else "(empty)"
        self._add(Text.assemble(("model ", "bold"), answer or empty), "answer")
        self._add(Text(turn.verdict()), "verdict")

    def add_notice(self, text: str, *, error: bool = False) -> None:
        self._add(Text(text), "error" if error else "notice")

    def clear(self) -> None:
        self.remove_children()

    def _add(self, text: Text, kind: str) -> None:
        if self.is_attached:  # a turn that ends while the app quits has no screen left to show it on
            self.mount(Static(text, classes=f"entry {kind}"))
