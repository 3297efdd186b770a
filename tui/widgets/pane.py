"""One side of the race: the streamed answer (Markdown, or coloured tokens) and its live stats line."""

from __future__ import annotations

from typing import List, Tuple

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Markdown, Static

from ..stats_view import StatsView

DRAFT_STYLE = "bold green"  # accepted draft tokens: the target only confirmed them
TARGET_STYLE = "yellow"  # tokens the target produced itself
LEGEND = Text.assemble(("■ accepted draft", DRAFT_STYLE), "  ", ("■ target", TARGET_STYLE))


class AnswerPane(Vertical):
    """Streams one answer. Colouring (speculative pane only) renders rich Text with a span per token."""

    def __init__(self, title: str, *, speculative: bool, colour: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.border_title = title
        self.speculative = speculative
        self.colour = colour and speculative
        self.pieces: List[Tuple[str, bool]] = []

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="body"):
            yield Markdown(classes="markdown")
            yield Static(classes="coloured")
        if self.speculative:
            yield Static(LEGEND, classes="legend")
        yield Static("— tok/s", classes="stats")

    def on_mount(self) -> None:
        self._show_mode()

    @property
    def text(self) -> str:
        return "".join(t for t, _ in self.pieces)

    async def add(self, pieces) -> None:
        body = self.query_one(".body", VerticalScroll)
        follow = body.is_vertical_scroll_end  # keep following the answer unless the user scrolled up
        self.pieces.extend(pieces)
        if self.colour:
            self.query_one(".coloured", Static).update(self._coloured())
        else:
            await self.query_one(Markdown).append("".join(t for t, _ in pieces))
        if follow:
            body.scroll_end(animate=False)

    async def reset(self) -> None:
        self.pieces = []
        self.query_one(".stats", Static).update("— tok/s")
        self.query_one(".coloured", Static).update("")
        await self.query_one(Markdown).update("")

    async def set_colour(self, on: bool) -> None:
        if not self.speculative:
            return
        self.colour = on
        self._show_mode()
        if on:
            self.query_one(".coloured", Static).update(self._coloured())
        else:
            await self.query_one(Markdown).update(self.text)

    def set_stats(self, stats: StatsView) -> None:
        self.query_one(".stats", Static).update(stats.line(self.speculative))

    def _show_mode(self) -> None:
        self.query_one(Markdown).display = not self.colour
        self.query_one(".coloured", Static).display = self.colour

    def _coloured(self) -> Text:
        t = Text()
        for piece, from_draft in self.pieces:
            t.append(piece, style=DRAFT_STYLE if from_draft else TARGET_STYLE)
        return t
