"""Screens shown instead of the chat: while loading, and when loading failed."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Footer, LoadingIndicator, Static


class LoadingScreen(Screen):
    def __init__(self, what: str):
        super().__init__()
        self.what = what

    def compose(self) -> ComposeResult:
        with Vertical(id="loading-box"):
            yield Static(Text(f"Loading {self.what}…", style="bold"), id="loading-label")
            yield LoadingIndicator()
            yield Static("The first run may take a while; Ctrl-Q quits.", classes="hint", id="loading-step")
        yield Footer()

    def set_step(self, label: str) -> None:
        self.query_one("#loading-step", Static).update(f"{label} Ctrl-Q quits.")


class ErrorScreen(Screen):
    BINDINGS = [Binding("q,escape", "quit", "Quit")]

    def __init__(self, detail: str):
        super().__init__()
        self.detail = detail

    def compose(self) -> ComposeResult:
        with Vertical(id="error-box"):
            yield Static(Text("Could not start the chat", style="bold red"))
            yield Static(Text(self.detail), id="error-detail")
            yield Static("Check the model names (mlxspec models lists them) and try again. Press q to quit.",
                         classes="hint")
        yield Footer()

    def action_quit(self) -> None:
        self.app.exit(return_code=1)  # the command failed
