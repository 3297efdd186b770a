"""One side of the race: the streamed answer (Markdown, or coloured tokens) and its live stats line.

A thinking model's reasoning (its `<think>` block, gpt-oss's analysis channel) shows dimmed above
the answer's Markdown, split as the server splits it; the coloured view shows every token as
the model wrote it."""

from __future__ import annotations

from typing import List, Optional, Tuple

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Markdown, Static

from mlxspec.reasoning import make_splitter, split_whole

from ..stats_view import StatsView

def chat_markdown():
    """Textual's Markdown parser with every line break kept: a model's poem or list without blank
    lines would otherwise run together (CommonMark joins soft breaks with a space), unlike the
    coloured view and the saved text. Chat UIs show newlines as written, as GitHub comments do."""
    from markdown_it import MarkdownIt

    def hard_breaks(state) -> None:
        for token in state.tokens:
            for child in token.children or ():
                if child.type == "softbreak":
                    child.type = "hardbreak"

    md = MarkdownIt("gfm-like")
    md.core.ruler.push("chat_hard_breaks", hard_breaks)
    return md


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
        self.markers: Optional[Tuple[str, str]] = None  # the model's thinking markers (the app sets them)
        self.inside = False  # this turn starts inside a block its template opened (the app sets it)
        self.reasoning = ""
        self._splitter = None
        self._done = False

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="body"):
            yield Static(classes="reasoning")
            yield Markdown(classes="markdown", parser_factory=chat_markdown)
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
        reasoning, answer = self._split("".join(t for t, _ in pieces))
        self._think(reasoning)
        if self.colour:
            self.query_one(".coloured", Static).update(self._coloured())
        elif answer:
            await self.query_one(Markdown).append(answer)
        if follow:
            body.scroll_end(animate=False)

    async def finish(self) -> None:
        """The answer is done: what the splitter held back (a marker's possible start) is shown."""
        if self._splitter is None:
            return
        reasoning, answer = self._splitter.finish()
        self._splitter, self._done = None, True
        self._think(reasoning)
        if answer and not self.colour:
            await self.query_one(Markdown).append(answer)

    async def reset(self, reading: bool = False) -> None:
        """Empty for a new turn (which starts inside a thinking block its template opened where
        the app set `inside`); `reading`: the turn's prompt is being read (a long one takes
        seconds before the first token: say so, not only "— tok/s")."""
        self.pieces, self.reasoning, self._done = [], "", False
        self._splitter = make_splitter(self.markers, self.inside) if self.markers is not None else None
        self._think("")
        self.query_one(".stats", Static).update("— tok/s · reading the prompt…" if reading else "— tok/s")
        self.query_one(".coloured", Static).update("")
        await self.query_one(Markdown).update("")

    def parts(self) -> Tuple[str, str]:
        """(reasoning, answer) of what has been shown so far, split afresh (while the answer
        streams, what could still be a marker's start is held back, as the live split holds it)."""
        if self.markers is None:
            return "", self.text
        splitter = make_splitter(self.markers, self.inside)
        return split_whole(splitter, self.text) if self._done else splitter.feed(self.text)

    def _split(self, text: str) -> Tuple[str, str]:
        return self._splitter.feed(text) if self._splitter is not None else ("", text)

    def _think(self, more: str) -> None:
        self.reasoning += more
        shown = self.query_one(".reasoning", Static)
        shown.display = bool(self.reasoning) and not self.colour
        if more or not self.reasoning:
            shown.update(Text(self.reasoning.strip("\n"), style="dim italic"))

    async def set_colour(self, on: bool) -> None:
        if not self.speculative:
            return
        self.colour = on
        self._show_mode()
        if on:
            self.query_one(".coloured", Static).update(self._coloured())
        else:
            reasoning, answer = self.parts()
            self.reasoning = ""
            self._think(reasoning)
            await self.query_one(Markdown).update(answer)

    def set_stats(self, stats: StatsView) -> None:
        self.query_one(".stats", Static).update(stats.line(self.speculative))

    def _show_mode(self) -> None:
        self.query_one(Markdown).display = not self.colour
        self.query_one(".coloured", Static).display = self.colour
        self.query_one(".reasoning", Static).display = bool(self.reasoning) and not self.colour

    def _coloured(self) -> Text:
        t = Text()
        for piece, from_draft in self.pieces:
            t.append(piece, style=DRAFT_STYLE if from_draft else TARGET_STYLE)
        return t
