"""The message box: one line, but a paste of several lines is kept whole.

Textual's Input keeps only the first line of a paste, which silently dropped the rest of a
pasted list or code block. Here a multi-line paste shows as one marker, `[pasted text #n: k
lines]`, and `message()` puts the pasted text back in its place when the message is sent.
"""

from __future__ import annotations

from typing import Dict

from textual import events
from textual.widgets import Input


class PromptInput(Input):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._pastes: Dict[str, str] = {}

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

    def message(self) -> str:
        """The box's text with every paste marker still in it replaced by what was pasted."""
        value = self.value
        for marker, text in self._pastes.items():
            value = value.replace(marker, text)
        return value

    def clear(self) -> None:
        super().clear()
        self._pastes.clear()
