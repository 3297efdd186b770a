"""Screens shown instead of the chat: while loading, and when loading failed."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Footer, Input, LoadingIndicator, Static

from .widgets.prompt import PromptInput


class LoadingScreen(Screen):
    """Loading, with a box for the first message: what is typed there goes to the chat's box when
    the models are ready, and is sent then if Enter was pressed (`queued`)."""

    def __init__(self, what: str):
        super().__init__()
        self.what = what
        self.queued = False

    def compose(self) -> ComposeResult:
        with Vertical(id="loading-box"):
            yield Static(Text(f"Loading {self.what}…", style="bold"), id="loading-label")
            yield LoadingIndicator()
            yield Static("The first run may take a while; Ctrl-Q quits.", classes="hint", id="loading-step")
        yield PromptInput(placeholder="Type your first message; Enter sends it once the models are ready",
                          id="early")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#early", PromptInput).focus()

    @on(Input.Submitted, "#early")
    def queue(self, event: Input.Submitted) -> None:
        if not event.value.strip():
            return
        self.queued = True
        event.input.disabled = True  # kept as sent: nothing typed after Enter would go with it
        event.input.border_subtitle = "sent once the models are ready"

    def set_step(self, label: str) -> None:
        self.query_one("#loading-step", Static).update(f"{label} Ctrl-Q quits.")


class ErrorScreen(Screen):
    BINDINGS = [Binding("q,escape", "quit", "Quit")]

    def __init__(self, detail: str, hint: str):
        super().__init__()
        self.detail, self.hint = detail, hint

    def compose(self) -> ComposeResult:
        with Vertical(id="error-box"):
            yield Static(Text("Could not start the chat", style="bold red"))
            yield Static(Text(self.detail), id="error-detail")
            yield Static(Text(f"{self.hint} Press q to quit."), classes="hint", id="error-hint")
        yield Footer()

    def action_quit(self) -> None:
        self.app.exit(return_code=1)  # the command failed
