"""`mlxspec chat`: type a message, watch the same target answer twice, speculative and vanilla.

The UI thread never runs a model. A thread worker loads the engines, another runs each turn
(see worker.py / race.py); both only post messages, and widgets change in the handlers below.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, replace
from typing import Callable, Optional

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Footer, Input, Static

from mlxspec.errors import InvalidArgumentError
from mlxspec.prompts import unread_template_note
from mlxspec.reasoning import chat_starts_inside, thinking_markers
from mlxspec.stats import plural

from . import clipboard
from .commands import HELP, CommandError, Settings, run_command
from .conversation import SPEC, VANILLA, Conversation, Saved, answer_part, read_saved
from .info import PairInfo, describe
from .messages import EngineReady, LoadFailed, Settle, StatsUpdated, TokensAdded, TurnFinished
from .screens import ErrorScreen, LoadingScreen
from .widgets import AnswerPane, ChatHistory, PairHeader, PromptInput
from .worker import TurnRequest, on_own_thread, run_turn


SETTLE_TIMEOUT = 1.0  # seconds the worker waits for the screen at most


CONFIRM_SECONDS = 10.0  # Ctrl-Q or Ctrl-L pressed again within this acts (when turns are not saved)


class ChatApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "mlxspec chat"
    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+c", "interrupt", "Stop", show=False, priority=True),
        Binding("ctrl+t", "toggle_colour", "Colours", priority=True),
        Binding("ctrl+l", "clear_key", "Clear", priority=True),
        Binding("ctrl+q", "quit", "Quit", priority=True),
        Binding("pageup", "scroll_chat(-1)", "Scroll chat", show=False),  # the history never takes focus
        Binding("pagedown", "scroll_chat(1)", "Scroll chat", show=False),
    ]

    def __init__(self, engine=None, *, vanilla_engine=None, loader: Optional[Callable[[], object]] = None,
                 loading_label: str = "the models", sequential: bool = False, settings: Settings = Settings(),
                 colour: bool = True, info: Optional[PairInfo] = None, seed: Optional[int] = None,
                 resume: Optional[Saved] = None):
        super().__init__()
        if engine is None and loader is None:
            raise ValueError("[ChatApp] give an engine or a loader")
        self._engine, self._vanilla, self._loader = engine, vanilla_engine, loader
        self.loading_label = loading_label
        self.sequential, self.settings, self.colour, self.info, self.seed = sequential, settings, colour, info, seed
        self.engines: dict = {}
        self.conversation = Conversation(settings.system)
        self._resume = resume  # a saved conversation to go on with, shown once the engines are ready
        self.cancel = threading.Event()
        self.busy = False
        # An answer was taken back (/retry, /undo): the next turn's prompt lookup first forgets it,
        # or that turn's drafts could copy an answer the conversation no longer holds
        self._forget = False
        self.saved_turns = 0  # turns /save wrote (or /load read): the others are lost by clearing or quitting
        self._armed = (None, 0.0)  # a key that asked to be pressed again, and when (`_confirmed`)

    # -- layout ---------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield PairHeader(self.info)
        history = ChatHistory()
        history.border_title = "Chat"
        yield history
        with Horizontal(id="race"):
            yield AnswerPane("Speculative", speculative=True, colour=self.colour, id="speculative")
            yield AnswerPane("Vanilla", speculative=False, id="vanilla")
        yield Static("", id="verdict")
        yield PromptInput(placeholder="Type a message and press Enter · /help for commands", id="prompt")
        yield Footer()

    def on_mount(self) -> None:
        if self._engine is not None:
            self.post_message(EngineReady(self._engine, self._vanilla))
        else:
            self.query_one("#prompt", Input).disabled = True
            self.push_screen(LoadingScreen(self.loading_label))
            self._load()

    def check_action(self, action: str, parameters) -> Optional[bool]:
        """Chat keys only mean something once the engines are ready (not on the loading/error screens)."""
        if action == "interrupt" and isinstance(self.screen, LoadingScreen):
            return True  # Ctrl-C while loading quits, as a terminal user expects
        if action in ("stop", "interrupt", "toggle_colour", "clear", "clear_key"):
            return bool(self.engines) and not isinstance(self.screen, (LoadingScreen, ErrorScreen))
        return True

    def pane(self, side: str) -> AnswerPane:
        return self.query_one(f"#{side}", AnswerPane)

    # -- loading --------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="load")
    def _load(self) -> None:
        temps = sorted({0.0, float(self.settings.temperature)})
        try:
            engine = on_own_thread(_load_evaluated, self._loader, temps, self._loading_step)
        except Exception as e:  # shown on the error screen, not as a traceback
            self.post_message(LoadFailed(_readable(e), _what_now(e)))
        else:
            self.post_message(EngineReady(engine))

    def _loading_step(self, label: str) -> None:
        """From the loader thread: say what loading is doing now."""
        def show():
            if isinstance(self.screen, LoadingScreen):
                self.screen.set_step(label)
        self.call_from_thread(show)

    def on_engine_ready(self, message: EngineReady) -> None:
        engine = message.engine
        self.engines = {SPEC: engine, VANILLA: message.vanilla_engine or engine.fork()}
        self.conversation.markers = thinking_markers(getattr(engine, "tokenizer", None))
        for side in (SPEC, VANILLA):
            self.pane(side).markers = self.conversation.markers
        self.info = self.info or describe(engine)
        self.query_one(PairHeader).set_info(self.info)
        loading = self.screen if isinstance(self.screen, LoadingScreen) else None
        if loading is not None:
            early = loading.query_one("#early", PromptInput)
            self.pop_screen()
        self.refresh_bindings()
        if self._resume is not None:
            self.take_up(self._resume)
            self._resume = None
        note = getattr(engine, "head_note", None)  # set by mlxspec.load, only with a head; the header may cut it short
        if note:
            self.notice(f"note: the EAGLE head was {note}, so it may draft less often right here (the answers "
                        f"are the target's all the same; /drafter ngram drafts without it)")
        prompt = self.query_one("#prompt", PromptInput)
        prompt.disabled = False
        prompt.focus()
        if loading is not None:  # what was typed while loading: in the box, and sent if Enter was pressed
            early.hand_over(prompt)
            if loading.queued:
                prompt.post_message(Input.Submitted(prompt, prompt.value))

    def on_load_failed(self, message: LoadFailed) -> None:
        screen = ErrorScreen(message.detail, message.hint)
        self.switch_screen(screen) if isinstance(self.screen, LoadingScreen) else self.push_screen(screen)

    # -- sending --------------------------------------------------------------------------
    @on(Input.Submitted, "#prompt")
    async def send(self, event: Input.Submitted) -> None:
        # The text Enter sent is event.value: keys typed after it may be in the box already.
        box = self.query_one("#prompt", PromptInput)
        text = box.message(event.value).strip()
        if not text:
            box.take(event.value)  # blanks only: nothing to send, nothing worth keeping
            return
        first = text.split()[0].lower()
        waits = first in ("/clear", "/load", "/retry", "/undo")  # commands that need the answer stopped
        if self.busy and (waits or not text.startswith("/")):
            # The line stays in the box, to send once the answer is done (or stopped).
            self.notice(f"still answering: press Esc to stop it first, then Enter to "
                        f"{first[1:] if waits else 'send your message'}", error=True)
            return
        box.take(event.value)
        if text.startswith("/"):
            await self.command(text)
        else:
            await self.start_turn(text)

    def _show_drafter(self) -> None:
        """The header names who drafts the next answer, and its weights."""
        if self.info is not None and self.engines:
            d = describe(self.engines[SPEC], drafter=self.settings.drafter)
            if (d.draft, d.draft_weights_bytes) != (self.info.draft, self.info.draft_weights_bytes):
                self.info = replace(self.info, draft=d.draft, draft_weights_bytes=d.draft_weights_bytes)
                self.query_one(PairHeader).set_info(self.info)

    async def start_turn(self, text: str) -> None:
        self._show_drafter()  # a /drafter sent during the last answer
        # busy before the first await: clearing the panes yields to the event loop, and a key
        # or a test that looks in between must already see this turn as under way
        self.busy, self.cancel = True, threading.Event()
        self.query_one(ChatHistory).add_user(text)
        messages = {side: self.conversation.messages(side, text) for side in (SPEC, VANILLA)}
        inside = self._starts_inside(messages[SPEC])
        for side in (SPEC, VANILLA):
            self.pane(side).inside = inside
        await self._clear_race(reading=True)
        s = self.settings
        request = TurnRequest(
            user=text, messages=messages,
            temperature=s.temperature, max_tokens=s.max_tokens, num_draft=s.num_draft, drafter=s.drafter,
            tree=s.tree, lookup=s.lookup, sequential=self.sequential, seed=self.seed,
            template_kwargs=s.template_kwargs, forget=self._forget)
        self._forget = False
        self._generate(request, self.cancel)

    @work(thread=True, exclusive=True, group="generate")
    def _generate(self, request: TurnRequest, cancel: threading.Event) -> None:
        on_own_thread(run_turn, request, self.engines, cancel, self.post_message, self._settle)

    def _settle(self) -> None:
        """From the worker: return once what it posted is drawn (or after a second: a closing app)."""
        done = threading.Event()
        self.post_message(Settle(done))
        done.wait(SETTLE_TIMEOUT)

    def on_settle(self, message: Settle) -> None:
        self.call_after_refresh(message.done.set)

    async def on_tokens_added(self, message: TokensAdded) -> None:
        await self.pane(message.side).add(message.pieces)

    def on_stats_updated(self, message: StatsUpdated) -> None:
        self._show_stats(message.side, message.stats)

    def _show_stats(self, side: str, stats) -> None:
        self.pane(side).set_stats(stats)
        self.query_one(PairHeader).set_stats(side, stats)

    async def _clear_race(self, reading: bool = False) -> None:
        """Empty both panes and the verdict line (`reading`: a turn starts by reading its prompt)."""
        for side in (SPEC, VANILLA):
            await self.pane(side).reset(reading)
        self.query_one("#verdict", Static).update("")

    def _starts_inside(self, messages) -> bool:
        """Whether the template opens a thinking block at the end of these messages' prompt."""
        markers = self.conversation.markers
        return markers is not None and chat_starts_inside(messages, self.engines[SPEC].tokenizer, markers,
                                                          template_kwargs=self.settings.template_kwargs)

    async def on_turn_finished(self, message: TurnFinished) -> None:
        self.busy = False
        turn = message.turn
        for side, answer in turn.answers.items():
            self._show_stats(side, answer.stats)
            await self.pane(side).finish()
        history = self.query_one(ChatHistory)
        if message.error:
            history.add_notice(f"generation failed: {message.error}", error=True)
        produced = any(a.from_draft for a in turn.answers.values())  # one flag per generated token
        if produced or not message.error:
            # Partial answers stay in the conversation; a message stopped before any answer does
            # not (the next turn would answer it with an empty reply in between).
            if produced:
                self.conversation.turns.append(turn)
            history.add_turn(turn, self.conversation.markers)
            self.query_one("#verdict", Static).update(Text(turn.verdict()))

    # -- actions --------------------------------------------------------------------------
    def action_stop(self) -> None:
        if self.busy and not self.cancel.is_set():
            self.cancel.set()  # the worker checks it after every step and closes both streams
            # A step, or a 512-token chunk of a long prompt, ends first: seconds on a slow CPU.
            self.query_one("#verdict", Static).update("stopping…")

    async def action_interrupt(self) -> None:
        """Ctrl-C: copy the text selected with the mouse, as Textual's own Ctrl-C does; else stop the
        answer, as Esc does; with none running, say how to quit instead; while loading (nothing to
        stop, nothing to lose), quit."""
        selected = getattr(self.screen, "get_selected_text", lambda: None)()
        if isinstance(self.screen, LoadingScreen):
            await self.action_quit()
        elif selected:
            how = clipboard.copy(self, selected)
            self.screen.clear_selection()
            self.notice(f"copied the selected text ({plural(len(selected), 'character')}) {how}")
        elif self.busy:
            self.action_stop()
        else:
            self.notice("nothing to stop: Ctrl-Q quits (select text with the mouse first, and Ctrl-C copies it)")

    def _confirmed(self, key: str, does: str) -> bool:
        """A single key that would lose turns not saved acts on its second press within
        CONFIRM_SECONDS (one press of a terminal habit, Ctrl-L to redraw say, must not drop the
        conversation); with nothing unsaved, on the first."""
        unsaved = len(self.conversation.turns) - self.saved_turns
        armed, at = self._armed
        if unsaved <= 0 or (armed == key and time.monotonic() - at < CONFIRM_SECONDS):
            self._armed = (None, 0.0)
            return True
        self._armed = (key, time.monotonic())
        self.notice(f"{key} again {does}: {plural(unsaved, 'turn')} of this conversation "
                    f"{'is' if unsaved == 1 else 'are'} not saved (/save PATH keeps them)", error=True)
        return False

    async def action_quit(self) -> None:
        if not self._confirmed("Ctrl-Q", "quits"):
            return
        self.cancel.set()  # else the process outlives its screen until the answer is done
        await super().action_quit()

    def on_unmount(self) -> None:
        self.cancel.set()  # however the app ends

    async def action_toggle_colour(self) -> None:
        self.colour = not self.colour
        await self.pane(SPEC).set_colour(self.colour)

    async def action_clear_key(self) -> None:
        if self.busy or self._confirmed("Ctrl-L", "clears it"):
            await self.action_clear()  # (which says to stop the answer first)

    async def action_clear(self) -> None:
        if self.busy:
            self.notice("stop the answer first (Esc), then clear", error=True)
            return
        self.conversation.clear()
        self.saved_turns = 0
        for engine in self.engines.values():
            engine.reset()
        self.query_one(ChatHistory).clear()
        await self._clear_race()
        self.notice("conversation cleared")

    # -- slash commands -------------------------------------------------------------------
    async def command(self, line: str) -> None:
        drafters = list(self.engines[SPEC].drafters) if self.engines else []
        try:
            outcome = run_command(line, self.settings, drafters=drafters)
        except CommandError as e:
            self.notice(str(e), error=True)
            return
        drafter_changed = outcome.settings.drafter != self.settings.drafter
        variables = outcome.settings.template_kwargs or {}
        new = [name for name in variables if variables[name] != (self.settings.template_kwargs or {}).get(name)]
        self.settings = outcome.settings
        self.conversation.system = outcome.settings.system
        reply = outcome.reply
        if unread := unread_template_note(self.engines[SPEC].tokenizer, new) if self.engines else "":
            reply += f" ({unread})"
        if drafter_changed and self.busy:  # the running answer keeps its drafter, and the header says so
            reply += " (from the next answer on)"
        elif drafter_changed:
            self._show_drafter()
        if reply and outcome.action != "clear":  # clearing says itself whether it did
            self.query_one(ChatHistory).add_notice(reply, from_its_top=outcome.reply == HELP)
        if outcome.action == "clear":
            await self.action_clear()
        elif outcome.action == "save":
            self.save(outcome.argument)
        elif outcome.action == "load":
            await self.load(outcome.argument)
        elif outcome.action in ("retry", "undo"):
            await self.take_back(outcome.action)
        elif outcome.action == "copy":
            self.copy_answer()
        elif outcome.action == "stats":
            self.notice(self.conversation.summary())

    def copy_answer(self) -> None:
        """/copy: the last answer, whole (without its reasoning), on the clipboard."""
        if not self.conversation.turns:
            self.notice("/copy: no answer to copy yet", error=True)
            return
        text = answer_part(self.conversation.turns[-1].answers[SPEC].text, self.conversation.markers).strip()
        how = clipboard.copy(self, text)
        self.notice(f"copied the last answer ({plural(len(text), 'character')}) {how}")

    async def take_back(self, how: str) -> None:
        """/retry: race the last turn's message again, with the settings now, in place of its
        answers; /undo: take the last turn out and give its message back to the box. Either way
        the turn stays in the history, struck out (the engines answer the shorter conversation
        from the prefix their caches share with it)."""
        if not self.conversation.turns:  # (while answering, `send` keeps the line in the box)
            self.notice(f"/{how}: no answered turn to take back yet", error=True)
            return
        number = len(self.conversation.turns)
        turn = self.conversation.turns.pop()
        self.saved_turns = min(self.saved_turns, len(self.conversation.turns))  # a retried turn is not saved
        self.query_one(ChatHistory).take_back(turn)
        self._forget = True
        if how == "undo":
            self.query_one("#prompt", PromptInput).put_back(turn.user)
            await self._clear_race()  # the panes showed the race taken back
            self.notice(f"took back turn {number}: its message is in the box, to edit and send (Enter)")
            return
        self.notice(self._retry_note(number))
        await self.start_turn(turn.user)

    def _retry_note(self, number: int) -> str:
        """What /retry says: the settings the race runs with, and where a drafter looks up, that it
        forgets the answer it replaces (prompt lookup keeps earlier histories, and a speedup from
        copying the old answer would measure that memory, not the drafter)."""
        s = self.settings
        drafter = s.drafter or self.engines[SPEC].default_drafter
        how = ", ".join([f"drafter {drafter}", "greedy" if s.temperature == 0 else f"T={s.temperature:g}",
                         f"draft length {'auto' if s.num_draft is None else s.num_draft}"])
        note = f"racing turn {number} again ({how}); the struck-out race above leaves the conversation"
        if drafter == "ngram" or (drafter in ("model", "eagle") and s.lookup is not False):
            note += "; prompt lookup forgets its answer, so drafts cannot copy it"
        return note

    def save(self, path: str) -> None:
        info = self.info
        try:
            js, md = self.conversation.save(path, settings=self.settings.as_dict(),
                                            pair=asdict(info) if info else None,
                                            pair_line=info.line() if info else "")
        except OSError as e:
            where = f" {e.filename}" if e.filename else ""
            self.notice(f"/save {path}: could not write{where} ({e.strerror or e}); nothing was changed",
                        error=True)
            return
        except InvalidArgumentError as e:  # a folder, not a file name
            self.notice(f"/save {path}: {e}", error=True)
            return
        self.saved_turns = len(self.conversation.turns)
        self.notice(f"saved {js} and {md}")

    async def load(self, path: str) -> None:
        """/load: go on with a saved conversation in place of this one."""
        if self.busy:
            self.notice("stop the answer first (Esc), then load", error=True)
            return
        try:
            saved = read_saved(path)
        except InvalidArgumentError as e:  # this conversation stays as it was
            self.notice(f"/load {path}: {e}", error=True)
            return
        await self._clear_race()
        self.take_up(saved)

    def take_up(self, saved: Saved) -> None:
        """Make `saved` the conversation: its turns in the history, its system prompt, and the next
        message answered after them (the engines reuse whatever prefix their caches share with it)."""
        self.conversation.turns[:] = saved.turns
        self.saved_turns = len(saved.turns)
        self.conversation.system = saved.system
        self.settings = replace(self.settings, system=saved.system)
        history = self.query_one(ChatHistory)
        history.clear()
        for turn in saved.turns:
            history.add_user(turn.user)
            history.add_turn(turn, self.conversation.markers)
        said = f"loaded {plural(len(saved.turns), 'turn')} from {saved.path}"
        if saved.system:
            said += f", with the system prompt {saved.system!r}"
        then = saved.pair.get("target")
        if then and self.info is not None and then != self.info.target:
            said += f"; its answers came from {then}, the next ones from {self.info.target}"
        self.notice(said + "; the settings are this session's (/help)")

    def action_scroll_chat(self, pages: int) -> None:
        history = self.query_one(ChatHistory)
        history.scroll_page_down(animate=False) if pages > 0 else history.scroll_page_up(animate=False)

    def notice(self, text: str, *, error: bool = False) -> None:
        self.query_one(ChatHistory).add_notice(text, error=error)


def _load_evaluated(loader, temperatures=(0.0,), step=lambda label: None):
    """Load, evaluate the weights on this thread (lazy arrays must not outlive its streams), then
    warm up: every pass length compiles here, behind the loading screen, not in the first turn,
    and the cost model starts from this device's timings."""
    import mlx.core as mx

    engine = loader()
    mx.eval(engine.target_model.parameters())
    if engine.draft_model is not None:
        mx.eval(engine.draft_model.parameters())
    step("Compiling and timing each pass length (once per load)…")
    engine.warmup(temperatures=temperatures)
    return engine


def _what_now(e: Exception) -> str:
    """The error screen's hint for a failed load: a model not fetched yet needs the network, not
    another name."""
    from mlxspec.errors import ModelNotFoundError
    from mlxspec.loading.resolve import NotCachedError

    if isinstance(e, NotCachedError):
        return "Fetch it as said above (with network access), then start the chat again."
    if isinstance(e, ModelNotFoundError):
        return "Check the model names (mlxspec models lists them) and try again."
    return "The line above says what went wrong."


def _readable(e: Exception) -> str:
    from mlxspec.errors import MlxSpecError

    return str(e) if isinstance(e, MlxSpecError) else f"{type(e).__name__}: {e}"


def make_app(engine=None, *, vanilla_engine=None, sequential: bool = False, temperature: float = 0.0,
             max_tokens: int = 256, num_draft=None, drafter: Optional[str] = None, tree=None,
             lookup: Optional[bool] = None, system: str = "", colour: bool = True,
             loader: Optional[Callable[[], object]] = None, loading_label: str = "the models",
             info: Optional[PairInfo] = None, seed: Optional[int] = None,
             template_kwargs: Optional[dict] = None, resume: Optional[Saved] = None) -> ChatApp:
    """Build the chat app around `engine` (speculative side) and `vanilla_engine` (default: engine.fork()).

    Pass `loader` instead of `engine` to load in a worker behind a loading screen. `num_draft`:
    None or "auto" lets the cost model choose; `tree` and `lookup` as `Engine.generate`'s (None: the
    engine's); `info` overrides what the header says about the pair; `template_kwargs`: the chat
    template's variables, as `Engine.generate`'s chat_template_kwargs; `resume`: a conversation
    `/save` wrote (`conversation.read_saved`), shown and continued once the engines are ready.
    """
    settings = Settings(temperature=temperature, max_tokens=max_tokens,
                        num_draft=None if num_draft in (None, "auto") else int(num_draft),
                        drafter=drafter, tree=tree, lookup=lookup, system=system, template_kwargs=template_kwargs)
    return ChatApp(engine, vanilla_engine=vanilla_engine, loader=loader, loading_label=loading_label,
                   sequential=sequential, settings=settings, colour=colour, info=info, seed=seed, resume=resume)
