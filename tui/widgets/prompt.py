"""The message box: one line, but a paste of several lines is kept whole; Up and Down recall
what was sent, as a shell's line editor does.

Textual's Input keeps only the first line of a paste, which silently dropped the rest of a
pasted list or code block. Here a multi-line paste shows as one marker, `[pasted text #n: k
lines]`, and `message()` puts the pasted text back in its place when the message is sent.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from textual import events
from textual.binding import Binding
from textual.widgets import Input

KEPT = 500  # lines Up can go back to


class PromptInput(Input):
    BINDINGS = [Binding("up", "recall(-1)", "Previous", show=False),
                Binding("down", "recall(1)", "Next", show=False)]

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("select_on_focus", False)  # focus comes back to go on typing, not to overwrite
        super().__init__(*args, **kwargs)
        self._pastes: Dict[str, str] = {}
        self._sent: List[Tuple[str, Dict[str, str]]] = []  # (the box's text, its pastes), oldest first
        self._at: Optional[int] = None  # the line recalled now; None: a new one being written
        self._draft: Tuple[str, Dict[str, str]] = ("", {})  # the new one, while older ones are shown

    def take(self, submitted: str) -> None:
        """Enter sent `submitted` (the box's text when it was pressed): keep it for Up (not twice in
        a row; the next Up starts from it), and leave in the box only what was typed after Enter,
        while the app read the message (keys typed fast, or pasted, after it)."""
        line = (submitted, dict(self._pastes))
        if submitted.strip() and (not self._sent or self._sent[-1] != line):
            self._sent = self._sent[-(KEPT - 1):] + [line]
        self._at = None
        rest = self.value[len(submitted):] if self.value.startswith(submitted) else ""
        if rest:
            self.value = rest  # the pastes stay: markers in it still name theirs, new ones count on
            self.cursor_position = len(rest)
        else:
            self.clear()

    def put_back(self, message: str) -> None:
        """Show `message` (one sent before: /undo gives it back) in the box, to edit and send again,
        before anything typed since; one of several lines shows as a paste, and is sent whole."""
        if "\n" in message:
            marker = f"[pasted text #{len(self._pastes) + 1}: {message.count(chr(10)) + 1} lines]"
            self._pastes[marker] = message
            message = marker
        self._at = None
        self.value = message + self.value
        self.cursor_position = len(message)

    def hand_over(self, to: "PromptInput") -> None:
        """Give `to` this box's text, its pastes and its cursor (the loading screen's box to the chat's)."""
        to.value, to._pastes = self.value, dict(self._pastes)
        to.cursor_position = self.cursor_position

    def action_recall(self, step: int) -> None:
        """Up (-1): the line sent before the one shown; Down (+1): the one after, and past the
        newest, what was being written."""
        if self._at is None:
            if step > 0 or not self._sent:
                return
            self._draft, self._at = (self.value, dict(self._pastes)), len(self._sent)
        at = self._at + step
        if at < 0:
            return
        self._at = at if at < len(self._sent) else None
        value, pastes = self._sent[at] if self._at is not None else self._draft
        self._pastes = dict(pastes)
        self.value = value
        self.cursor_position = len(value)

    def _on_paste(self, event: events.Paste) -> None:
        text = event.text.replace("\r\n", "\n").replace("\r", "\n")
        if "\n" not in text.strip("\n"):
            return  # one line (a trailing newline aside): Input's own handler runs next
        lines = text.strip("\n").count("\n") + 1
        marker = f"[pasted text #{len(self._pastes) + 1}: {lines} lines]"
        self._pastes[marker] = text.strip("\n")
        if self.selection.is_empty:
            self.insert_text_at_cursor(marker)
        else:
            self.replace(marker, *self.selection)
        event.prevent_default()  # not Input's handler too (it would add the first line)
        event.stop()

    def message(self, value: str) -> str:
        """`value` (the box's text when Enter was pressed) with every paste marker still in it
        replaced by what was pasted."""
        for marker, text in self._pastes.items():
            value = value.replace(marker, text)
        return value

    def clear(self) -> None:
        super().clear()
        self._pastes.clear()
