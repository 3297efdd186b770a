"""The chat TUI driven through the Pilot, on tiny random models."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import threading
from dataclasses import replace

import pytest
from textual.events import Paste
from textual.widgets import Markdown, Static

import tiny
from tests.tui_helpers import async_test, send, tiny_engine, until, wait_idle
from tui import make_app
from tui.conversation import SPEC, VANILLA
from tui.screens import ErrorScreen, LoadingScreen
from tui.widgets import ChatHistory
from tui.widgets.pane import DRAFT_STYLE, TARGET_STYLE

RATE = re.compile(r"\d+(\.\d+)? tok/s")
SIZE = (120, 40)


def stats_line(app, side) -> str:
    return str(app.pane(side).query_one(".stats", Static).render())


def history_entries(app) -> list:
    return list(app.query_one(ChatHistory).query(Static))


def history_text(app) -> str:
    return "\n".join(str(s.render()) for s in history_entries(app))


def verdict(app) -> str:
    return str(app.query_one("#verdict", Static).render())


@async_test
async def test_a_message_fills_both_panes_with_rates_and_a_verdict():
    app = make_app(tiny_engine(), max_tokens=24)
    async with app.run_test(size=SIZE) as pilot:
        assert not RATE.search(stats_line(app, SPEC))  # nothing measured yet
        await send(app, pilot, "hello")
        spec, van = app.pane(SPEC), app.pane(VANILLA)
        assert spec.text and van.text
        assert spec.text == van.text  # greedy: speculative decoding is lossless
        for side in (SPEC, VANILLA):
            assert RATE.search(stats_line(app, side)), stats_line(app, side)
        assert "accepted" in stats_line(app, SPEC) and "tok/pass" in stats_line(app, SPEC)
        assert re.search(r" · last (lookup )?(draft|tree) \d+$", stats_line(app, SPEC)), stats_line(app, SPEC)
        assert "accepted" not in stats_line(app, VANILLA)
        assert re.search(r"speedup \d+\.\d\d×", verdict(app)) and "identical" in verdict(app)
        (turn,) = app.conversation.turns
        assert turn.answers[SPEC].stats.tokens == turn.answers[VANILLA].stats.tokens == 24
        assert "hello" in history_text(app) and "speedup" in history_text(app)


@async_test
async def test_multi_turn_prefills_only_new_tokens_on_both_sides():
    app = make_app(tiny_engine(), max_tokens=8)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "first message")
        await send(app, pilot, "second")
        first, second = app.conversation.turns
        for side in (SPEC, VANILLA):
            s = second.answers[side].stats
            assert s.prompt_tokens > first.answers[side].stats.prompt_tokens
            assert s.prefilled_tokens < s.prompt_tokens / 2, (side, s)
        msgs = app.conversation.messages(SPEC, "third")
        assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant", "user"]


@async_test
async def test_escape_stops_a_long_generation_and_the_next_message_works():
    app = make_app(tiny_engine(), max_tokens=100_000)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "go on forever", wait=False)
        for _ in range(500):  # until both panes show something
            await asyncio.sleep(0.02)
            if app.pane(SPEC).text and app.pane(VANILLA).text:
                break
        assert app.busy
        await pilot.press("escape")
        await wait_idle(app, pilot, timeout=10)
        (turn,) = app.conversation.turns
        assert turn.stopped and "stopped" in verdict(app)
        assert 0 < turn.answers[SPEC].stats.tokens < 4000
        assert app.pane(SPEC).text  # the partial answer stays on screen
        await send(app, pilot, "/maxtokens 6")
        await send(app, pilot, "and now?")
        assert len(app.conversation.turns) == 2, history_text(app)
        last = app.conversation.turns[-1]
        assert not last.stopped and last.answers[VANILLA].finish_reason in ("length", "stop")
        assert 0 < last.answers[VANILLA].stats.tokens <= 6
        # The stop cut the two at different points (whenever Esc landed), but both continue the
        # conversation the history shows, so their greedy answers are equal.
        assert last.same_history and last.answers[SPEC].text == last.answers[VANILLA].text


@async_test
async def test_escape_during_a_long_prompt_stops_before_its_first_token():
    engine = tiny_engine()
    app = make_app(engine, max_tokens=24)
    engine.target.prefill_step = 4
    gate = engine.target.model = tiny.GatedPrefill(engine.target.model, 4)
    async with app.run_test(size=SIZE) as pilot:
        gate.armed = True
        await send(app, pilot, "a long message " * 8, wait=False)
        for _ in range(500):
            await asyncio.sleep(0.02)
            if gate.entered.is_set():
                break
        assert gate.entered.is_set() and app.busy
        assert "reading the prompt" in stats_line(app, SPEC)  # not only "— tok/s" for seconds
        await pilot.press("escape")
        await asyncio.sleep(0.1)
        assert "stopping" in verdict(app)  # said at once: the chunk in progress still ends first
        gate.release.set()  # the chunk in progress finishes; the prompt's other chunks are never fed
        await wait_idle(app, pilot, timeout=10)
        assert app.conversation.turns == []  # a message with no answer is left out of the conversation
        assert len(engine.target.tokens) == 4  # one chunk of the prompt fed, the rest never
        assert "(stopped before its first token; left out of the conversation)" in history_text(app)
        assert verdict(app) == "stopped before the first token (nothing to compare)"
        assert "reading" not in stats_line(app, SPEC)
        gate.armed = False
        await send(app, pilot, "/maxtokens 6")
        await send(app, pilot, "and now?")
        (last,) = app.conversation.turns
        assert not last.stopped and 0 < last.answers[SPEC].stats.tokens <= 6
        assert [m["content"] for m in app.conversation.messages(SPEC)] == ["and now?", last.answers[SPEC].text]


@async_test
async def test_a_turn_is_busy_from_enter_not_only_once_the_panes_are_cleared():
    # Clearing the panes awaits the event loop; a key (Esc, a second Enter) or a caller that
    # waits for the turn must already see it as under way, or it would read the previous turn.
    app = make_app(tiny_engine(), max_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        seen = []
        clear = app._clear_race

        async def slow_clear(**kwargs):
            seen.append(app.busy)
            await asyncio.sleep(0.2)
            await clear(**kwargs)

        app._clear_race = slow_clear
        app.query_one("#prompt").value = "hello"
        await pilot.press("enter")
        await pilot.pause()
        assert seen == [True]
        await wait_idle(app, pilot)
        assert len(app.conversation.turns) == 1


@async_test
async def test_ctrl_c_stops_too():
    app = make_app(tiny_engine(), max_tokens=100_000)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "long", wait=False)
        await asyncio.sleep(0.3)
        await pilot.press("ctrl+c")
        await wait_idle(app, pilot, timeout=10)
        assert app.conversation.turns[-1].stopped
        assert app.is_running
        await pilot.press("ctrl+c")  # nothing runs: it says how to quit, and quits nothing
        await pilot.pause()
        assert "Ctrl-Q quits" in history_text(app) and app.is_running


@async_test
async def test_slash_commands_change_settings_and_bad_ones_explain():
    app = make_app(tiny_engine(), max_tokens=8)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "/temp 0.7")
        assert app.settings.temperature == 0.7
        for bad in ("/temp warm", "/temp -1", "/draft 99", "/draft x", "/drafter foo", "/drafter", "/maxtokens 0",
                    "/nope"):
            await send(app, pilot, bad)
        assert app.settings.temperature == 0.7 and app.settings.num_draft is None
        text = history_text(app)
        assert "/temp: expected a finite number >= 0, got 'warm'" in text
        assert "/draft: expected 'auto' or an integer in 0..32, got '99'" in text
        assert "/maxtokens: expected an integer >= 1, got '0'" in text
        assert "/drafter needs one of ngram, model, got 'foo'" in text  # the ones this pair has
        assert "/drafter needs one of ngram, model (drafting now: the pair default)" in text
        assert "unknown command '/nope'" in text
        await send(app, pilot, "/temp 0")
        await send(app, pilot, "/draft 2")
        await send(app, pilot, "/drafter ngram")
        await send(app, pilot, "/maxtokens 12")
        await send(app, pilot, "/system be brief")
        assert (app.settings.num_draft, app.settings.drafter, app.settings.max_tokens) == (2, "ngram", 12)
        assert app.conversation.system == "be brief"
        await send(app, pilot, "hello")
        spec = app.conversation.turns[-1].answers[SPEC].stats
        assert spec.drafter == "ngram" and spec.tokens == 12 and spec.last_k <= 2
        await send(app, pilot, "/draft auto")
        await send(app, pilot, "/drafter model")
        assert app.settings.num_draft is None and app.settings.drafter == "model"
        await send(app, pilot, "/help")
        assert "/maxtokens N" in history_text(app)


@async_test
async def test_drafter_model_without_a_draft_model_is_refused():
    app = make_app(tiny_engine(draft=False), max_tokens=8)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "/drafter model")
        assert app.settings.drafter is None
        assert "this chat loaded no draft model (--draft)" in history_text(app)
        await send(app, pilot, "/drafter eagle")
        assert app.settings.drafter is None
        assert "this chat loaded no EAGLE head (--head)" in history_text(app)


@async_test
async def test_save_writes_json_and_markdown(tmp_path):
    app = make_app(tiny_engine(), max_tokens=10)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "/system you are terse")
        await send(app, pilot, "what is MLX?")
        await send(app, pilot, f"/save {tmp_path / 'chat'}")
    data = json.loads((tmp_path / "chat.json").read_text())
    (turn,) = data["turns"]
    assert data["system"] == "you are terse" and turn["user"] == "what is MLX?"
    for side in (SPEC, VANILLA):
        assert turn[side]["text"] and turn[side]["stats"]["tokens"] == 10
        assert turn[side]["stats"]["tokens_per_second"] > 0
    assert turn["identical"] is True and turn["speedup"] > 0
    md = (tmp_path / "chat.md").read_text()
    assert "what is MLX?" in md and "tok/s" in md
    # each turn says its own drafter and temperature, and an answer cut at the token limit says so
    drafter = turn[SPEC]["stats"]["drafter"]
    assert f"_greedy · drafter {drafter}_" in md and drafter != "none"
    assert "### Speculative (cut at the token limit)" in md and "### Vanilla (cut at the token limit)" in md


@async_test
async def test_save_to_an_unwritable_place_says_so(tmp_path):
    app = make_app(tiny_engine(), max_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, f"/save {tmp_path / 'missing' / 'dir' / 'chat'}")
        assert "could not write" in history_text(app) and app.is_running
        for folder in (".", "/", "~", f"{tmp_path}/", str(tmp_path)):  # a folder names no file
            await send(app, pilot, f"/save {folder}")
            assert f"'{folder}' is a folder: give a file name in it" in history_text(app).splitlines()[-1]
            await send(app, pilot, f"/load {folder}")
            assert f"'{folder}' is a folder" in history_text(app).splitlines()[-1] and app.is_running
    assert list(tmp_path.iterdir()) == []


@async_test
async def test_a_failed_save_leaves_the_earlier_one_whole(tmp_path):
    """/save writes PATH.md and PATH.json both or neither: where the .md cannot be written (a
    folder in its place here; a full disk alike), the earlier save's .json is not overwritten,
    and the message names the file."""
    app = make_app(tiny_engine(), max_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "what is MLX?")
        await send(app, pilot, f"/save {tmp_path / 'chat'}")
        before = (tmp_path / "chat.json").read_text()
        (tmp_path / "chat.md").unlink()
        (tmp_path / "chat.md").mkdir()
        await send(app, pilot, "and speculative decoding?")
        await send(app, pilot, f"/save {tmp_path / 'chat'}")
        last = history_text(app).splitlines()[-1]
        assert f"could not write {tmp_path / 'chat.md'}" in last and "nothing was changed" in last
        assert app.is_running
    assert (tmp_path / "chat.json").read_text() == before and len(json.loads(before)["turns"]) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.json", "chat.md"]


@async_test
async def test_a_saved_conversation_loads_and_goes_on_as_if_never_left(tmp_path):
    """/load in a fresh app: the history shows the saved turns, and the next answer is the one
    the first app gave after them (greedy): the model read the saved turns."""
    first = make_app(tiny_engine(), max_tokens=12)
    async with first.run_test(size=SIZE) as pilot:
        await send(first, pilot, "/system be terse")
        await send(first, pilot, "what is MLX?")
        await send(first, pilot, f"/save {tmp_path / 'chat'}")
        await send(first, pilot, "and speculative decoding?")
        went_on = first.conversation.turns[-1].answers[SPEC].text
    resumed = make_app(tiny_engine(), max_tokens=12)
    async with resumed.run_test(size=SIZE) as pilot:
        await send(resumed, pilot, "something else first")
        await send(resumed, pilot, f"/load {tmp_path / 'chat.md'}")  # the Markdown's name finds the JSON
        (turn,) = resumed.conversation.turns
        assert turn.user == "what is MLX?" and resumed.settings.system == "be terse"
        shown = history_text(resumed)
        assert "something else first" not in shown and "what is MLX?" in shown and turn.verdict() in shown
        assert "loaded 1 turn from" in shown and "'be terse'" in shown
        await send(resumed, pilot, "and speculative decoding?")
        assert resumed.conversation.turns[-1].answers[SPEC].text == went_on != ""
        await send(resumed, pilot, f"/save {tmp_path / 'again'}")  # a loaded turn saves as it was saved
    again, before = (json.loads((tmp_path / name).read_text()) for name in ("again.json", "chat.json"))
    assert again["turns"][0] == before["turns"][0]
    (tmp_path / "other.json").write_text(json.dumps(dict(before, pair=dict(before["pair"], target="another-model"))))
    third = make_app(tiny_engine(), max_tokens=4)
    async with third.run_test(size=SIZE) as pilot:
        await send(third, pilot, f"/load {tmp_path / 'other'}")
        assert f"its answers came from another-model, the next ones from {third.info.target}" in history_text(third)


@async_test
async def test_a_file_load_cannot_read_leaves_the_conversation_as_it_was(tmp_path):
    (tmp_path / "notjson.json").write_text("{ nope")
    (tmp_path / "other.json").write_text(json.dumps({"turns": [{"user": "hi"}]}))
    answer = {"text": "a", "from_draft": [True], "finish_reason": "stop"}
    turn = {"user": "u", SPEC: answer, VANILLA: dict(answer, text="b")}
    damaged = {"draft": dict(turn, **{SPEC: dict(answer, from_draft=5)}),
               "finish": dict(turn, **{SPEC: dict(answer, finish_reason="done")}),
               "rounding": dict(turn, divergence={"divergence": "rounding"}),  # no tokens: the verdict reads them
               "unclassified": dict(turn, divergence={"divergence": "unclassified", "tokens": 3}),
               "kind": dict(turn, divergence={"divergence": "maybe"})}
    for name, t in damaged.items():
        (tmp_path / f"{name}.json").write_text(json.dumps({"turns": [t]}))
    app = make_app(tiny_engine(), max_tokens=6)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "hello")
        for path, says in ((tmp_path / "none", "cannot read the saved conversation"),
                           (tmp_path / "notjson", "not JSON"),
                           (tmp_path / "other", "turn 1 has no speculative answer text"),
                           (tmp_path / "draft", "turn 1's speculative from_draft is not a list of true/false"),
                           (tmp_path / "finish", "turn 1's speculative finish_reason is not stop, length or null"),
                           *((tmp_path / name, "turn 1's divergence is not one the chat writes")
                             for name in ("rounding", "unclassified", "kind"))):
            await send(app, pilot, f"/load {path}")
            assert says in history_text(app).splitlines()[-1]
            assert [t.user for t in app.conversation.turns] == ["hello"]
        await send(app, pilot, "/load")
        assert "/load needs the path" in history_text(app)


def test_chat_resume_reads_the_file_before_the_ui_starts(monkeypatch, tmp_path, capsys):
    import tui
    from mlxspec.cli import main

    made = {}
    monkeypatch.setattr("mlxspec.commands.chat._on_a_terminal", lambda: True)
    monkeypatch.setattr(tui, "make_app", lambda **kw: made.update(kw))
    assert main(["chat", "--resume", str(tmp_path / "missing")]) == 1
    assert "cannot read the saved conversation" in capsys.readouterr().err and not made
    saved = {"system": "s", "turns": [{"user": "u", SPEC: {"text": "a"}, VANILLA: {"text": "a"}}]}
    (tmp_path / "c.json").write_text(json.dumps(saved))
    with pytest.raises(AttributeError):  # (the stand-in app has no run())
        main(["chat", "--resume", str(tmp_path / "c"), "--system", "t"])
    assert [t.user for t in made["resume"].turns] == ["u"] and made["resume"].system == "t"  # --system wins


@async_test
async def test_clear_forgets_the_conversation_and_resets_the_caches():
    app = make_app(tiny_engine(), max_tokens=6)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "one")
        await pilot.press("ctrl+l")  # a terminal habit (redraw) must not drop unsaved turns: it asks first
        await pilot.pause()
        assert len(app.conversation.turns) == 1
        assert "Ctrl-L again clears it: 1 turn of this conversation is not saved" in history_text(app)
        await pilot.press("ctrl+l")
        await pilot.pause()
        assert app.conversation.turns == [] and app.pane(SPEC).text == ""
        await send(app, pilot, "one")
        for side in (SPEC, VANILLA):
            s = app.conversation.turns[0].answers[side].stats
            assert s.prefilled_tokens == s.prompt_tokens  # nothing reused after the reset


@async_test
async def test_colour_toggle_switches_between_token_spans_and_markdown():
    app = make_app(tiny_engine(), max_tokens=24)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "hello")
        pane = app.pane(SPEC)
        coloured, markdown = pane.query_one(".coloured", Static), pane.query_one(Markdown)
        assert coloured.display and not markdown.display
        styles = {str(span.style) for span in pane._coloured().spans}
        drafted = app.conversation.turns[0].answers[SPEC].from_draft
        assert (DRAFT_STYLE in styles) == any(drafted) and TARGET_STYLE in styles
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert markdown.display and not coloured.display
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert coloured.display


@async_test
async def test_sequential_mode_fills_both_panes():
    app = make_app(tiny_engine(), max_tokens=16, sequential=True)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "hello")
        assert app.pane(SPEC).text == app.pane(VANILLA).text != ""
        assert "identical" in verdict(app)


@async_test
async def test_loading_in_a_worker_then_chatting():
    engine = tiny_engine()
    app = make_app(loader=lambda: engine, max_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(200):
            await asyncio.sleep(0.02)
            if app.engines:
                break
        await pilot.pause()
        assert app.engines[SPEC] is engine and app.engines[VANILLA] is not engine
        await send(app, pilot, "hi")
        assert app.pane(VANILLA).text


def loading_until_released():
    """An app whose models load once `release` is set: (app, release)."""
    import threading

    release = threading.Event()
    return make_app(loader=lambda: release.wait(10) and tiny_engine(), max_tokens=4), release


@async_test
async def test_a_message_typed_while_loading_is_sent_once_the_models_are_ready():
    app, release = loading_until_released()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, LoadingScreen)
        await pilot.press(*"hello there", "enter")
        await pilot.press(*"more")  # after Enter: not part of it
        await pilot.pause()
        early = app.screen.query_one("#early")
        assert app.screen.queued and early.disabled and early.value == "hello there"
        release.set()
        await until(lambda: app.conversation.turns, 20, "the queued message was not sent", 0.02)
        await wait_idle(app, pilot)
        (turn,) = app.conversation.turns
        assert turn.user == "hello there" and app.pane(VANILLA).text
        assert app.query_one("#prompt").value == "" and "hello there" in history_text(app)


@async_test
async def test_text_typed_while_loading_waits_in_the_box_unsent():
    app, release = loading_until_released()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press(*"half a thought")  # typed, not sent
        app.screen.query_one("#early").post_message(Paste("line one\nline two"))
        await pilot.pause()
        release.set()
        await until(lambda: app.engines, 20, "the models did not load", 0.02)
        await pilot.pause()
        prompt = app.query_one("#prompt")
        assert prompt.value == "half a thought[pasted text #1: 2 lines]" and prompt.has_focus
        assert prompt.message(prompt.value) == "half a thoughtline one\nline two"  # the paste came along
        assert not app.conversation.turns and not app.busy
        await pilot.press(*"!")  # the cursor is at its end
        assert prompt.value.endswith("lines]!")


@async_test
async def test_ctrl_c_while_loading_quits():
    app, release = loading_until_released()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, LoadingScreen)
        await pilot.press("ctrl+c")
        await pilot.pause()
        quitting = app._exit  # asked to exit (run_test's own exit comes only after this block)
        release.set()
    assert quitting


@async_test
async def test_a_failed_load_shows_a_readable_error_screen():
    def loader():
        raise FileNotFoundError("no such model: 'nope/missing'")

    app = make_app(loader=loader)
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(200):
            await asyncio.sleep(0.02)
            if isinstance(app.screen, ErrorScreen):
                break
        assert isinstance(app.screen, ErrorScreen)
        detail = str(app.screen.query_one("#error-detail", Static).render())
        assert "no such model: 'nope/missing'" in detail and "Traceback" not in detail
        hint = str(app.screen.query_one("#error-hint", Static).render())
        assert hint == "The line above says what went wrong. Press q to quit."
        await pilot.press("q")
    assert app.return_code == 1  # mlxspec chat exits with it


@pytest.mark.parametrize("error, hint", [
    ("not cached", "Fetch it as said above (with network access), then start the chat again."),
    ("not found", "Check the model names (mlxspec models lists them) and try again."),
])
@async_test
async def test_a_failed_load_says_what_to_do_about_it(error, hint):
    from mlxspec.errors import ModelNotFoundError
    from mlxspec.loading.resolve import NotCachedError

    def loader():
        if error == "not cached":
            raise NotCachedError("'a/b' is not in the Hugging Face cache; run `mlxspec pull a/b`", "offline", "a/b")
        raise ModelNotFoundError("model 'nope' not found")

    app = make_app(loader=loader)
    async with app.run_test(size=SIZE) as pilot:
        # (the screen is current before its widgets are mounted: wait for the hint itself)
        await until(lambda: isinstance(app.screen, ErrorScreen) and app.screen.query("#error-hint"), 10,
                    "no error screen with its hint", 0.02)
        assert str(app.screen.query_one("#error-hint", Static).render()) == f"{hint} Press q to quit."
        await pilot.press("q")


def test_chat_command_options():
    from mlxspec.cli import build_parser

    args = build_parser().parse_args(["chat", "--target", "t", "--draft", "d", "--temperature", "0.5",
                                      "--max-tokens", "9", "--max-kv-size", "512", "--sequential", "--num-draft", "3"])
    assert (args.target, args.draft, args.temperature, args.max_tokens, args.max_kv_size, args.sequential,
            args.num_draft) == ("t", "d", 0.5, 9, 512, True, 3)
    args = build_parser().parse_args(["chat"])
    assert args.pair is None and args.num_draft is None and args.temperature == 0.0
    for bad in (["--temperature", "-1"], ["--max-tokens", "0"], ["--num-draft", "99"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["chat", *bad])
    with pytest.raises(SystemExit):  # refused when parsed, before anything loads
        build_parser().parse_args(["chat", "--pair", "demo", "--target", "x"])


def test_chat_options_reach_the_loader_and_the_first_turn(monkeypatch):
    """--tree, --lookup and --seed start the chat as /tree, /lookup would set it; the models load as
    every command loads them (a pair's draft replaced by --draft)."""
    import tui
    from mlxspec.cli import build_parser
    from mlxspec.commands import modelargs

    made, loaded = {}, {}

    class App:
        return_code = 0

        def run(self):
            made["engine"] = made["loader"]()

    def make_app(**kw):
        made.update(kw)
        return App()

    monkeypatch.setattr(tui, "make_app", make_app)
    monkeypatch.setattr("mlxspec.commands.chat._on_a_terminal", lambda: True)  # (pytest's stdout is none)
    monkeypatch.setattr("mlxspec.commands.chat._check_references", lambda args: None)  # ("h" is no head)
    monkeypatch.setattr("mlxspec.loading.load", lambda *a, **k: loaded.update(args=a, kw=k) or "engine")
    args = build_parser().parse_args(["chat", "--pair", "demo", "--draft", "ngram", "--tree", "3", "--lookup", "off",
                                      "--seed", "5", "--head", "h", "--drafter", "ngram", "--max-kv-size", "64"])
    assert args.func(args) == 0 and made["engine"] == "engine"
    assert (made["tree"], made["lookup"], made["seed"], made["drafter"]) == (3, False, 5, "ngram")
    assert loaded["args"] == ("demo", "ngram")
    assert {k: loaded["kw"][k] for k in ("tree", "head", "max_kv_size", "drafter")} == \
        {"tree": 3, "head": "h", "max_kv_size": 64, "drafter": "ngram"}
    assert modelargs.DEFAULT_PAIR == "demo"
    monkeypatch.undo()
    settings = tui.make_app(tiny_engine(), tree=3, lookup=False).settings
    assert (settings.tree, settings.lookup) == (3, False)
    for bad in (["--tree", "0"], ["--lookup", "maybe"], ["--seed", "-1"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["chat", *bad])
    args = build_parser().parse_args(["chat", "--draft", "none"])  # the speculative side would not draft
    with pytest.raises(SystemExit):
        args.func(args)


@async_test
async def test_after_a_stopped_turn_a_difference_is_explained_not_flagged():
    app = make_app(tiny_engine(), max_tokens=100_000)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "long", wait=False)
        while not (app.pane(SPEC).text and app.pane(VANILLA).text):
            await asyncio.sleep(0.02)
        await pilot.press("escape")
        await wait_idle(app, pilot, timeout=10)
        await send(app, pilot, "/maxtokens 6")
        await send(app, pilot, "next")
        assert len(app.conversation.turns) == 2, history_text(app)
        turn = app.conversation.turns[-1]
        # however far each side got before Esc, both answer the conversation the history shows
        assert turn.same_history
        assert "DIFFER" not in verdict(app) and "as expected" not in verdict(app)


def test_both_sides_continue_the_conversation_the_history_shows():
    """A stopped turn cuts the two sides at different tokens (and a rounding near-tie can part
    them): the next prompt is still one, with the speculative answer the history shows, so the
    race compares the two on the same work."""
    from tui.conversation import Answer, Conversation, Turn

    conv = Conversation("be brief")
    conv.turns.append(Turn("count", {SPEC: Answer(text="1, 2, 3, 4, 5"), VANILLA: Answer(text="1, 2, 3, 4,")},
                           stopped=True))
    conv.turns.append(Turn("again", {SPEC: Answer(text="Hello! I am"), VANILLA: Answer(text="Hello.")}))
    spec, van = conv.messages(SPEC, "next"), conv.messages(VANILLA, "next")
    assert spec == van
    assert [m["content"] for m in spec if m["role"] == "assistant"] == ["1, 2, 3, 4, 5", "Hello! I am"]


@async_test
async def test_a_message_sent_while_answering_stays_in_the_box_and_clear_waits(tmp_path):
    app = make_app(tiny_engine(), max_tokens=100_000)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "long", wait=False)
        assert app.busy
        prompt = app.query_one("#prompt")
        prompt.value = "my next question"
        await pilot.press("enter")
        await pilot.pause()
        assert prompt.value == "my next question"  # not thrown away
        assert "still answering" in history_text(app)
        for line in ("/clear", f"/load {tmp_path / 'x'}", "/retry", "/undo"):  # these need the answer stopped: kept too
            prompt.value = line
            await pilot.press("enter")
            await pilot.pause()
            assert prompt.value == line and history_text(app).splitlines()[-1].endswith(line.split()[0][1:])
        text = history_text(app)
        assert "then Enter to clear" in text and "conversation cleared" not in text
        await pilot.press("escape")
        await wait_idle(app, pilot, timeout=10)
        assert len(app.conversation.turns) == 1  # the turn was kept, not cleared
        await send(app, pilot, "/clear")
        assert app.conversation.turns == []


@async_test
async def test_quitting_during_an_answer_stops_it():
    app = make_app(tiny_engine(), max_tokens=100_000)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "long", wait=False)
        while not app.pane(SPEC).text:
            await asyncio.sleep(0.02)
        await pilot.press("ctrl+q")
        await pilot.pause()
        assert app.cancel.is_set()  # the worker stops at its next step: the process does not outlive its screen


@async_test
async def test_quitting_with_turns_not_saved_asks_for_a_second_press(tmp_path, monkeypatch):
    """Ctrl-Q quits at once with nothing to lose; with turns /save has not written, on a second
    press within CONFIRM_SECONDS (a press long after the first asks again)."""
    import tui.app as tui_app

    app = make_app(tiny_engine(), max_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "one")
        await pilot.press("ctrl+q")
        await pilot.pause()
        assert app.is_running and "Ctrl-Q again quits: 1 turn of this conversation is not saved" in \
            history_text(app)
        monkeypatch.setattr(tui_app, "CONFIRM_SECONDS", 0.0)  # the first press has expired
        await pilot.press("ctrl+q")
        await pilot.pause()
        assert app.is_running
    monkeypatch.setattr(tui_app, "CONFIRM_SECONDS", 10.0)
    app = make_app(tiny_engine(), max_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "one")
        await send(app, pilot, f"/save {tmp_path / 'chat'}")  # saved: nothing to lose
        await pilot.press("ctrl+q")
        await pilot.pause()
        assert not app.is_running
    app = make_app(tiny_engine(), max_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "one")
        await pilot.press("ctrl+q")
        await pilot.press("ctrl+q")
        await pilot.pause()
        assert not app.is_running


@async_test
async def test_a_15_row_terminal_keeps_the_input_box_on_screen():
    app = make_app(tiny_engine(), max_tokens=40)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "/help")
        await send(app, pilot, "hello there")  # a verdict and stats lines, which wrap when narrow
        await pilot.resize_terminal(60, 15)
        await pilot.pause()
        for widget in ("#prompt", "#verdict"):
            region = app.query_one(widget).region
            assert region.height > 0 and region.bottom <= 15, (widget, region)


def test_command_names_and_values_ignore_case_and_stray_words_are_refused():
    from tui.commands import CommandError, Settings, run_command

    assert run_command("/drafter Eagle", Settings(), drafters=["ngram", "eagle"]).settings.drafter == "eagle"
    for line in ("/clear now", "/help me"):
        with pytest.raises(CommandError, match="takes no argument"):
            run_command(line, Settings(), drafters=["ngram"])


def test_a_difference_after_a_sampled_turn_does_not_blame_a_stop():
    from tui.conversation import Answer, Turn

    turn = Turn("q", {SPEC: Answer(text="a"), VANILLA: Answer(text="b")}, same_history=False)
    assert "stopped or parted by rounding" in turn.verdict()


@async_test
async def test_sampled_turns_without_a_seed_write_the_same_text_on_both_sides():
    """No --seed: each turn draws one seed for both sides, so speculation samples vanilla's text,
    the verdict says so, and the next turn starts from equal histories."""
    app = make_app(tiny_engine(), max_tokens=16)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "/temp 1.0")
        await send(app, pilot, "first")
        await send(app, pilot, "second")
        first, second = app.conversation.turns
        for turn in (first, second):
            assert turn.temperature == 1.0 and turn.same_history and turn.identical
            assert turn.answers[SPEC].stats.tokens > 0
        assert first.answers[SPEC].text != second.answers[SPEC].text  # (a fresh seed per turn)
        assert "sampled (T=1) outputs identical" in verdict(app)
        assert sum(t.answers[SPEC].stats.drafted for t in (first, second)) > 0


def header_lines(app) -> list:
    """The chat header's lines as the screen shows them (cut at its width)."""
    from textual.geometry import Region

    from tui.widgets import PairHeader

    header = app.query_one(PairHeader)
    return [s.text.strip() for s in header.render_lines(Region(0, 0, header.size.width, header.size.height))]


@async_test
async def test_the_header_keeps_its_memory_line_in_a_narrow_terminal():
    app = make_app(tiny_engine(), max_tokens=4)
    async with app.run_test(size=(60, 30)) as pilot:
        await pilot.pause()
        lines = header_lines(app)
        assert lines[0].startswith("mlxspec chat") and lines[1].startswith("memory"), lines


def shown_lines(app, entry) -> range:
    """The lines of a history entry that show now, counted from its first (0)."""
    history = app.query_one(ChatHistory)
    top, height = history.scroll_offset.y, history.scrollable_content_region.height
    first = entry.virtual_region.y
    return range(max(top, first) - first, min(top + height, first + entry.virtual_region.height) - first)


@async_test
async def test_on_an_80x24_screen_help_shows_from_its_top_and_pageup_scrolls_the_chat():
    app = make_app(tiny_engine(), max_tokens=4)
    async with app.run_test(size=(80, 24)) as pilot:
        await send(app, pilot, "hello")
        await send(app, pilot, "/help")
        await pilot.pause()
        entries = history_entries(app)
        you, help_ = entries[0], entries[-1]
        assert "/temp T" in str(help_.render()) and help_.virtual_region.height > 10
        assert 0 in shown_lines(app, help_) and len(shown_lines(app, help_)) < 10  # its top, on a short screen
        for _ in range(20):
            await pilot.press("pagedown")
        await pilot.pause()
        assert help_.virtual_region.height - 1 in shown_lines(app, help_)  # its last line
        for _ in range(20):  # a page is the 3 lines the history has here
            await pilot.press("pageup")
        await pilot.pause()
        assert 0 in shown_lines(app, you)  # back to the first message
        assert app.query_one("#prompt").has_focus  # the keys scrolled the history from the message box


@async_test
async def test_what_comes_after_help_shows_at_the_bottom_again():
    """/help scrolls to its own top; the next notice and turn must not land out of sight below it."""
    app = make_app(tiny_engine(), max_tokens=4)
    async with app.run_test(size=(80, 24)) as pilot:
        await send(app, pilot, "/help")
        await send(app, pilot, "/drafter bogus")
        await pilot.pause()
        error = history_entries(app)[-1]
        assert "bogus" in str(error.render())
        assert error.virtual_region.height - 1 in shown_lines(app, error)  # its last line shows
        await send(app, pilot, "hello")
        await pilot.pause()
        verdict = history_entries(app)[-1]
        assert verdict.virtual_region.height - 1 in shown_lines(app, verdict)


@async_test
async def test_a_long_message_is_shortened_in_the_history_not_in_the_conversation():
    app = make_app(tiny_engine(), max_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "word " * 200)
        assert app.conversation.turns[-1].user == ("word " * 200).strip()
        assert "… (999 characters)" in history_text(app) and "word " * 60 not in history_text(app)


@async_test
async def test_the_memory_line_keeps_the_last_answer_s_figures_while_the_next_runs():
    """A running answer's statistics carry no memory figures (they are read when it ends): the
    header keeps the last ones instead of showing KV 0 B and no peak."""
    app = make_app(tiny_engine(), max_tokens=6)
    async with app.run_test(size=(160, 30)) as pilot:
        await pilot.pause()
        assert "peak —" in header_lines(app)[1]  # nothing measured yet
        await send(app, pilot, "first")
        measured = header_lines(app)[1]
        assert "peak —" not in measured and " KV 0 B" not in measured, measured
        app.settings = replace(app.settings, max_tokens=100_000)
        await send(app, pilot, "second", wait=False)
        while len(app.pane(SPEC).text) < 20:
            await asyncio.sleep(0.02)
        assert header_lines(app)[1] == measured
        await pilot.press("escape")
        await wait_idle(app, pilot, timeout=10)


@async_test
async def test_a_narrow_header_cuts_the_long_names_not_the_precision_and_device():
    from tui.widgets import PairHeader

    app = make_app(tiny_engine(), max_tokens=4)
    async with app.run_test(size=(80, 30)) as pilot:
        await pilot.pause()
        header = app.query_one(PairHeader)
        long = replace(header.info, target="someone/a-target-with-a-long-name + adapter pirate", precision="bfloat16",
                       device="CPU, OpenBLAS", draft="EAGLE head (trained for the target without adapter pirate)")
        header.set_info(long)
        await pilot.pause()
        line = header_lines(app)[0]
        assert "bfloat16 · CPU, OpenBLAS · target someone/" in line and "draft EAGLE" not in line, line
        await pilot.resize_terminal(200, 30)  # wide enough: the pair first, as it reads
        await pilot.pause()
        line = header_lines(app)[0]
        assert line.endswith("· bfloat16 · CPU, OpenBLAS") and "target someone/" in line.split("·")[0], line


@async_test
async def test_the_header_names_who_drafts_and_weighs_its_weights(tmp_path):
    from tui.stats_view import format_bytes
    from tiny import make_eagle_head

    base = tiny_engine()
    head = make_eagle_head(base.target_model, tmp_path / "head")
    engine = tiny_engine(eagle_head=head, drafter="eagle")
    assert 0 < engine.eagle_weights_bytes != engine.draft_weights_bytes

    def header_text(app):
        return " ".join(header_lines(app))

    app = make_app(engine, max_tokens=4)
    async with app.run_test(size=(160, 30)) as pilot:
        await pilot.pause()
        assert "draft EAGLE head" in header_text(app)
        assert f"draft {format_bytes(engine.eagle_weights_bytes)}" in header_text(app)  # the head's, not the model's
        await send(app, pilot, "/drafter model")
        await pilot.pause()
        assert f"draft {format_bytes(engine.draft_weights_bytes)}" in header_text(app)
        await send(app, pilot, "/drafter ngram")
        await pilot.pause()
        assert "draft ngram drafter" in header_text(app) and ", draft " not in header_text(app)
    app = make_app(engine, max_tokens=100_000)
    async with app.run_test(size=(160, 30)) as pilot:  # during an answer: the answer keeps its drafter
        await send(app, pilot, "long", wait=False)
        while not app.pane(SPEC).text:
            await asyncio.sleep(0.02)
        await send(app, pilot, "/drafter ngram", wait=False)
        await pilot.pause()
        assert "draft EAGLE head" in header_text(app) and "(from the next answer on)" in history_text(app)
        await pilot.press("escape")
        await wait_idle(app, pilot, timeout=10)
        assert app.conversation.turns[-1].answers[SPEC].stats.drafter == "eagle"
        app.settings = replace(app.settings, max_tokens=4)
        await send(app, pilot, "next")
        assert "draft ngram drafter" in header_text(app)
        assert app.conversation.turns[-1].answers[SPEC].stats.drafter == "ngram"


@async_test
async def test_a_head_trained_under_another_adapter_is_said_in_full_in_the_history(tmp_path):
    from tiny import make_eagle_head

    head = make_eagle_head(tiny_engine().target_model, tmp_path / "head")
    note = "trained for the target without adapter pirate"
    for said in (note, None):
        engine = tiny_engine(eagle_head=head, drafter="eagle")
        engine.head_note = said  # what mlxspec.load sets (tests/test_adapters.py checks that)
        app = make_app(engine, max_tokens=4)
        async with app.run_test(size=(80, 30)) as pilot:  # too narrow for the header to hold the note
            await pilot.pause()
            assert (f"the EAGLE head was {note}" in history_text(app).replace("\n", " ")) == (said is not None)


@async_test
async def test_the_header_says_when_the_kv_cache_is_quantized():
    from mlxspec import Engine

    target = tiny.make_llama(1, heads=2, kv_heads=1, tie_embeddings=False)  # head dimension 32
    engine = Engine(target, tiny.make_tokenizer(), drafter="ngram", kv_bits=4, kv_group_size=32, quantized_kv_start=0)
    app = make_app(engine, max_tokens=4)
    async with app.run_test(size=(160, 30)) as pilot:
        await pilot.pause()
        assert "(4-bit from 0 tokens)" in " ".join(header_lines(app))


def test_tree_and_lookup_commands():
    from tui.commands import CommandError, Settings, run_command

    s = Settings()
    assert run_command("/tree OFF", s, drafters=["ngram"]).settings.tree == "off"
    assert run_command("/tree 4", s, drafters=["ngram"]).settings.tree == 4
    assert run_command("/tree auto", s, drafters=["ngram"]).settings.tree == "auto"
    assert run_command("/lookup off", s, drafters=["ngram"]).settings.lookup is False
    for line, says in (("/tree 0", "'auto', 'off' or an integer in 1..32"),
                       ("/tree x", "'auto', 'off' or an integer"), ("/lookup maybe", "'on' or 'off'"),
                       ("/temp nan", "finite number"), ("/draft -1", "0..32")):
        with pytest.raises(CommandError, match=says):
            run_command(line, s, drafters=["ngram"])


@async_test
async def test_tree_and_lookup_reach_the_speculative_side():
    engine = tiny_engine()
    seen = []
    real = engine.stream

    def stream(*a, **kw):
        seen.append({k: kw.get(k) for k in ("tree", "lookup", "speculative")})
        return real(*a, **kw)

    engine.stream = stream
    app = make_app(engine, max_tokens=6)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "/tree off")
        await send(app, pilot, "/lookup off")
        await send(app, pilot, "hello")
    assert {"tree": "off", "lookup": False, "speculative": True} in seen


@async_test
async def test_a_conversation_past_the_context_says_the_chat_s_remedies():
    from mlxspec import Engine
    from tiny import make_llama, make_tokenizer

    target = make_llama(3)
    target.args.max_position_embeddings = 48
    app = make_app(Engine(target, make_tokenizer()), max_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "x" * 60)  # its chat-formatted prompt alone is past 48 tokens
        text = history_text(app)
        assert "no longer fits the model" in text and "/clear" in text and "--max-kv-size" in text
        await send(app, pilot, "/clear")
        await send(app, pilot, "hi")
        assert len(app.conversation.turns) == 1  # a new conversation fits again


def test_a_later_turn_sees_the_answer_without_its_reasoning():
    from mlxspec import harmony
    from tui.conversation import answer_part

    think = ("<think>", "</think>")
    assert answer_part("<think>sum</think>\n\nIt is 4.", think) == "It is 4."
    assert answer_part("sum it</think>It is 4.", think) == "It is 4."  # the template opened the block
    assert answer_part("It is 4.", think) == answer_part("It is 4.", None) == "It is 4."
    said = "<|channel|>analysis<|message|>Add.<|end|><|start|>assistant<|channel|>final<|message|>It is 4."
    assert answer_part(said, harmony.MARKERS) == "It is 4."
    assert answer_part(said, None) == said


def harmony_engine():
    """An engine whose model, asked "What is 2 + 2?", answers in harmony (analysis, then final)."""
    from mlxspec.engine import Engine
    from mlxspec.prompts import encode_prompt
    from test_harmony import ANSWER, VOCAB, harmony_tokenizer

    tok = harmony_tokenizer()
    model = tiny.ScriptedModel(vocab=VOCAB)
    model.say(tok.encode(ANSWER, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|return|>")],
              len(encode_prompt([{"role": "user", "content": "What is 2 + 2?"}], tok, VOCAB)))
    return Engine(model, tok, drafter="ngram")


@pytest.mark.parametrize("kind", ["harmony", "think"])
@async_test
async def test_a_thinking_model_s_reasoning_shows_dimmed_above_its_answer(kind):
    """The Markdown view splits as the server does: reasoning dimmed above, the answer below,
    the headers and markers in neither; the coloured view keeps every token; the history shows
    the answer."""
    from test_reasoning import scripted_thinker

    # the think model's template opens the block: the app reads that from the prompt
    engine = harmony_engine() if kind == "harmony" else scripted_thinker("Add them.</think>It is 4.")
    app = make_app(engine, max_tokens=200)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "What is 2 + 2?")
        for side in (VANILLA, SPEC):
            pane = app.pane(side)
            reasoning = pane.query_one(".reasoning", Static)
            if side == SPEC:  # coloured: the raw tokens, no split
                assert pane.colour and not reasoning.display and "Add them." in str(pane._coloured())
                await pilot.press("ctrl+t")
                await pilot.pause()
            assert pane.reasoning == "Add them." and reasoning.display
            assert pane.query_one(Markdown).source == "It is 4."
        assert "model It is 4." in history_text(app) and "Add them" not in history_text(app)


@async_test
async def test_a_gpt_oss_chat_keeps_its_analysis_out_of_the_next_turn():
    """The pane shows what the model wrote; the next turn's messages hold its final channel only
    (gpt-oss's template would otherwise render harmony's headers inside the content)."""
    from mlxspec import harmony
    from test_harmony import ANSWER

    app = make_app(harmony_engine(), max_tokens=200)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "What is 2 + 2?")
        assert app.conversation.markers == harmony.MARKERS
        assert app.pane(SPEC).text == ANSWER
        assert app.conversation.messages(SPEC, "And 3 + 3?")[1] == {"role": "assistant", "content": "It is 4."}


@async_test
async def test_template_variables_reach_both_sides_and_the_split():
    """--chat-template-args: a template that opens the thinking block only when told to; both
    sides' prompts are rendered with it (the scripted model answers only that prompt) and the
    panes split inside the block it opened."""
    from mlxspec.engine import Engine
    from mlxspec.prompts import encode_prompt
    from test_reasoning import ASK, THINKING, VOCAB as THINK_VOCAB

    template = tiny.CHAT_TEMPLATE + "{% if add_generation_prompt and think %}<think>\n{% endif %}"
    tok = tiny.make_tokenizer(template, added=THINKING)
    model = tiny.ScriptedModel(vocab=THINK_VOCAB)
    model.say(tok.encode("Add them.</think>It is 4.", add_special_tokens=False) + [tiny.SPECIALS.index("<|im_end|>")],
              len(encode_prompt(ASK, tok, THINK_VOCAB, template_kwargs={"think": True})))
    app = make_app(Engine(model, tok, drafter="ngram"), max_tokens=200, template_kwargs={"think": True})
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, ASK[0]["content"])
        for side in (VANILLA, SPEC):
            pane = app.pane(side)
            if pane.colour:
                await pilot.press("ctrl+t")
                await pilot.pause()
            assert pane.reasoning == "Add them." and pane.query_one(Markdown).source == "It is 4."


@async_test
async def test_a_template_variable_the_model_does_not_read_is_said_to_change_nothing():
    app = make_app(tiny_engine(), max_tokens=4)  # tiny's template reads messages and add_generation_prompt only
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "/effort high")
        assert "reasoning effort set to high (this model's chat template does not read reasoning_effort: it " \
               "changes nothing)" in history_text(app)
        await send(app, pilot, '/template {"add_generation_prompt_x": 1, "messages_y": 2}')
        assert "does not read add_generation_prompt_x, messages_y: they change nothing" in history_text(app)
        await send(app, pilot, "/effort")  # clearing one sets nothing new: no note
        assert history_text(app).count("does not read") == 2


def test_unread_template_variables_are_those_the_template_never_names():
    from types import SimpleNamespace

    from mlxspec.prompts import unread_template_variables

    tok = SimpleNamespace(chat_template="{% if enable_thinking %}<think>{% endif %}")
    assert unread_template_variables(tok, ["enable_thinking", "reasoning_effort"]) == ["reasoning_effort"]
    named = SimpleNamespace(chat_template={"default": "{{ a }}", "tool_use": "{{ b }}"})
    assert unread_template_variables(named, ["a", "b", "c"]) == ["c"]
    assert unread_template_variables(SimpleNamespace(chat_template=None), ["a"]) == []  # unknown: no claim


def test_template_and_effort_commands():
    from tui.commands import CommandError, Settings, run_command

    s = run_command('/template {"enable_thinking": false, "Name": "X"}', Settings(), drafters=["ngram"]).settings
    assert s.template_kwargs == {"enable_thinking": False, "Name": "X"}  # the JSON's case kept
    s = run_command("/effort HIGH", s, drafters=["ngram"]).settings
    assert s.template_kwargs == {"enable_thinking": False, "Name": "X", "reasoning_effort": "high"}
    assert run_command("/template", s, drafters=["ngram"]).settings.template_kwargs is None
    # new variables keep the effort /effort set (it is its own command), unless they set it
    out = run_command('/template {"enable_thinking": true}', s, drafters=["ngram"])
    assert out.settings.template_kwargs == {"enable_thinking": True, "reasoning_effort": "high"}
    assert "reasoning effort high kept" in out.reply
    out = run_command('/template {"reasoning_effort": "low"}', s, drafters=["ngram"])
    assert out.settings.template_kwargs == {"reasoning_effort": "low"}
    # /effort alone clears the effort only
    s = run_command("/effort", s, drafters=["ngram"]).settings
    assert s.template_kwargs == {"enable_thinking": False, "Name": "X"}
    out = run_command("/effort", Settings(), drafters=["ngram"])
    assert out.settings.template_kwargs is None and out.reply.startswith("no reasoning effort is set")
    for line, says in (("/template [1]", "JSON object of template variables"), ("/template {", "JSON object"),
                       ("/effort extreme", "/effort needs one of none, minimal, low")):
        with pytest.raises(CommandError, match=re.escape(says)):
            run_command(line, s, drafters=["ngram"])


@async_test
async def test_effort_reaches_the_next_turn_s_prompt():
    """/effort changes the variable the template reads, from the next turn on: the scripted model
    answers only the prompt rendered with it."""
    from mlxspec.engine import Engine
    from mlxspec.prompts import encode_prompt

    tok = tiny.make_tokenizer(tiny.CHAT_TEMPLATE.replace("{% for m", "Reasoning: {{ reasoning_effort }}\n{% for m"))
    model = tiny.ScriptedModel()
    ask = [{"role": "user", "content": "hi"}]
    model.say(tok.encode("Hello there.", add_special_tokens=False) + [tiny.SPECIALS.index("<|im_end|>")],
              len(encode_prompt(ask, tok, tiny.VOCAB, template_kwargs={"reasoning_effort": "high"})))
    app = make_app(Engine(model, tok, drafter="ngram"), max_tokens=40, colour=False)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "/effort high")
        await send(app, pilot, "hi")
        for side in (VANILLA, SPEC):
            assert app.pane(side).query_one(Markdown).source == "Hello there."


@async_test
async def test_a_multi_line_paste_is_sent_whole():
    """Textual's Input keeps only a paste's first line; the chat keeps all of it (shown as a
    marker in the one-line box) and sends it where it was pasted."""
    from textual import events

    app = make_app(tiny_engine(), max_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.query_one("#prompt")
        prompt.value = "Summarize: "
        prompt.cursor_position = len(prompt.value)
        prompt.post_message(events.Paste("- apples\r\n- bananas\n- cherries\n"))
        await pilot.pause()
        assert prompt.value == "Summarize: [pasted text #1: 3 lines]"
        prompt.insert_text_at_cursor(" thanks")
        prompt.post_message(events.Paste("one line only\n"))  # a single line goes in as typed
        await pilot.pause()
        assert prompt.value.endswith(" thanks" + "one line only")
        await pilot.press("enter")
        await wait_idle(app, pilot)
        sent = app.conversation.turns[-1].user
        assert sent == "Summarize: - apples\n- bananas\n- cherries thanksone line only"
        assert "cherries" in history_text(app)
        prompt.post_message(events.Paste("a\nb"))  # the next message starts a new count
        await pilot.pause()
        assert prompt.value == "[pasted text #1: 2 lines]"


@async_test
async def test_keys_typed_right_after_enter_stay_in_the_box():
    """The app reads a message after the box has taken later keys (typed fast, or sent by a
    terminal multiplexer): the message is what Enter sent, and the later keys wait in the box."""
    from textual.widgets import Input

    app = make_app(tiny_engine(), max_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.query_one("#prompt")
        prompt.value = "/temp 0" + "Hello there"  # "Hello there" typed before the app read "/temp 0"
        prompt.post_message(Input.Submitted(prompt, "/temp 0"))
        await pilot.pause()
        assert prompt.value == "Hello there" and "temperature" in history_text(app).lower()
        assert "expected" not in history_text(app)  # "/temp 0Hello there" would have been refused
        prompt.value = "hi" + " and more"
        prompt.post_message(Input.Submitted(prompt, "hi"))
        await wait_idle(app, pilot)
        assert app.conversation.turns[-1].user == "hi" and prompt.value == " and more"
        await pilot.press("up")
        assert prompt.value == "hi"  # what was sent is what Up recalls


@async_test
async def test_up_and_down_recall_what_was_sent_pastes_and_all():
    from textual import events

    app = make_app(tiny_engine(), max_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.query_one("#prompt")
        await pilot.press("up")
        assert prompt.value == ""  # nothing sent yet: nothing to recall
        prompt.post_message(events.Paste("a\nb"))
        await pilot.pause()
        await pilot.press("enter")
        await wait_idle(app, pilot)
        for line in ("/temp 0", "/temp 0", "hello"):  # the same line twice in a row is kept once
            await send(app, pilot, line)
        prompt.value = "half written"
        shown = []
        for key in ("up", "up", "up", "up", "down", "down", "down", "down"):
            await pilot.press(key)
            shown.append(prompt.value)
        assert shown == ["hello", "/temp 0", "[pasted text #1: 2 lines]", "[pasted text #1: 2 lines]",
                         "/temp 0", "hello", "half written", "half written"]
        for key in ("up", "up", "up"):
            await pilot.press(key)
        await pilot.press("enter")  # a recalled paste is sent whole again
        await wait_idle(app, pilot)
        assert app.conversation.turns[-1].user == "a\nb" and prompt.value == ""


@async_test
async def test_the_markdown_view_keeps_the_answer_s_line_breaks():
    """A poem without blank lines stays one line per line in the Markdown view (CommonMark would
    join its lines with spaces), as in the coloured view and the saved text."""
    app = make_app(tiny_engine(), max_tokens=4)
    async with app.run_test(size=SIZE) as pilot:
        pane = app.pane(VANILLA)
        await pane.add([("In the sea,\nwhere stars are\n\nA new verse", False)])
        await pilot.pause()
        paragraphs = [str(p.render()) for p in pane.query_one(Markdown).query("MarkdownParagraph")]
        assert paragraphs == ["In the sea,\nwhere stars are", "A new verse"]


def test_the_saved_markdown_renders_an_answer_s_line_breaks_and_keeps_its_code():
    from markdown_it import MarkdownIt

    from tui.conversation import Answer, Conversation, Turn

    poem = "In the sea,\nwhere stars are\n\n```python\nx = 1  \ny = 2\n```\nThe end"
    conv = Conversation()
    conv.turns.append(Turn("a poem", {SPEC: Answer(text=poem), VANILLA: Answer(text=poem)}))
    tokens = MarkdownIt("commonmark").parse(conv.to_markdown())
    breaks = [t.children for t in tokens if t.type == "inline" and "In the sea," in t.content]
    assert breaks and all("hardbreak" in [c.type for c in children] for children in breaks)
    code = [t.content for t in tokens if t.type == "fence"]
    assert code == ["x = 1  \ny = 2\n"] * 2  # the code exactly as written


def test_a_speedup_over_a_few_tokens_is_flagged_as_noise():
    from tui.conversation import Answer, Turn
    from tui.stats_view import StatsView

    def turn(n):
        return Turn("q", {SPEC: Answer(text="a", stats=StatsView(tokens=n, tokens_per_second=20.0)),
                          VANILLA: Answer(text="a", stats=StatsView(tokens=n, tokens_per_second=16.0))})

    assert turn(8).verdict().startswith("speedup 1.25× (20.0 vs 16.0 tok/s) · 8 tokens: too few to time well ·")
    assert "too few" not in turn(16).verdict()


def struck(app) -> list:
    return [str(e.render()) for e in history_entries(app) if e.has_class("taken-back")]


@async_test
async def test_retry_races_the_last_turn_again_in_its_place_with_the_settings_now():
    app = make_app(tiny_engine(), max_tokens=16)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "/retry")
        assert "/retry: no answered turn to take back yet" in history_text(app) and not app.conversation.turns
        await send(app, pilot, "first")
        await send(app, pilot, "second")
        (_, old) = app.conversation.turns
        assert old.answers[SPEC].stats.drafter == "model"
        await send(app, pilot, "/drafter ngram")
        forgot, forget = [], app.engines[SPEC].forget_beyond
        app.engines[SPEC].forget_beyond = lambda *a, **k: forgot.append((threading.current_thread(), forget(*a, **k)))
        await send(app, pilot, "/retry")
        # prompt lookup first forgot the answer taken back, on the engines' thread, not the event loop's
        assert len(forgot) == 1 and forgot[0][0] is not threading.main_thread()
        first, new = app.conversation.turns
        assert new is not old and new.user == "second" and new.answers[SPEC].stats.drafter == "ngram"
        # greedy: another drafter, the same answer on both sides, from caches that held the old one
        for side in (SPEC, VANILLA):
            assert new.answers[side].tokens == old.answers[side].tokens and len(old.answers[side].tokens) == 16, side
            assert new.answers[side].text == old.answers[side].text, side
        assert new.identical
        # the old race stays in sight, struck out: its message, answer and verdict; nothing else
        taken = struck(app)
        assert len(taken) == 3 and taken[0].endswith("second") and "speedup" in taken[2], taken
        assert ("racing turn 2 again (drafter ngram, greedy, draft length auto); the struck-out race above leaves "
                "the conversation; prompt lookup forgets its answer, so drafts cannot copy it") in history_text(app)
        await send(app, pilot, "/retry now")
        assert "/retry takes no argument, got 'now'" in history_text(app) and len(struck(app)) == 3
        await send(app, pilot, "/drafter model")
        await send(app, pilot, "/lookup off")
        await send(app, pilot, "/retry")
        said = [line for line in history_text(app).splitlines() if line.startswith("racing turn 2")][-1]
        assert said == "racing turn 2 again (drafter model, greedy, draft length auto); the struck-out race above " \
                       "leaves the conversation"  # the model drafts alone: it holds no earlier answer
        assert app.conversation.turns[-1].answers[SPEC].tokens == old.answers[SPEC].tokens and len(struck(app)) == 6
        assert len(forgot) == 2  # (what lookup held then depends on what the cost model drafted: test_lookup.py)


@async_test
async def test_undo_gives_the_last_message_back_to_edit_and_the_next_turn_answers_without_it(tmp_path):
    app = make_app(tiny_engine(), max_tokens=12)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "first")
        after_first = app.conversation.turns[0].answers[SPEC].text
        prompt = app.query_one("#prompt")
        prompt.post_message(Paste("line one\nline two"))
        await pilot.pause()
        await pilot.press("enter")
        await wait_idle(app, pilot)
        await send(app, pilot, f"/save {tmp_path / 'chat'}")
        assert app.saved_turns == 2
        prompt.value = "/undo"
        await pilot.press("enter")
        await until(lambda: prompt.value == "[pasted text #1: 2 lines]", 10, "the message did not come back", 0.01)
        (kept,) = app.conversation.turns
        assert kept.answers[SPEC].text == after_first and app.saved_turns == 1
        assert "took back turn 2: its message is in the box" in history_text(app)
        assert len(struck(app)) == 3
        asked = []
        forget = app.engines[SPEC].forget_beyond
        app.engines[SPEC].forget_beyond = lambda prompt, **k: asked.append(prompt) or forget(prompt, **k)
        prompt.insert_text_at_cursor(" and three")
        await pilot.press("enter")
        await wait_idle(app, pilot)
        # prompt lookup first forgot what the new turn's prompt does not hold (the turn undone), once
        assert [m[-1]["content"] for m in asked] == ["line one\nline two and three"]
        first, edited = app.conversation.turns
        assert edited.user == "line one\nline two and three" and edited.identical
        # what the new turn answered: the first turn, then the edited message (the undone one is gone)
        said = [m["content"] for m in app.conversation.messages(SPEC)]
        assert said[:3] == ["first", after_first, "line one\nline two and three"] and len(said) == 4
        assert app.saved_turns == 1  # the edited turn is not in the saved file: quitting asks twice
        await send(app, pilot, "next")
        assert len(asked) == 1  # a turn after it takes nothing back: nothing to forget


@async_test
async def test_ctrl_c_copies_text_selected_with_the_mouse_and_copy_the_last_answer(monkeypatch):
    from textual.selection import Selection

    from tui import clipboard

    monkeypatch.setattr(clipboard, "tools", lambda: [])  # the terminal's copy alone, on any machine
    app = make_app(tiny_engine(), max_tokens=12)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "/copy")
        assert "/copy: no answer to copy yet" in history_text(app) and app.clipboard == ""
        await send(app, pilot, "rivers")
        entry = next(e for e in history_entries(app) if str(e.render()) == "you rivers")
        app.screen.selections = {entry: Selection(None, None)}  # as a mouse drag over it leaves them
        await pilot.pause()
        await pilot.press("ctrl+c")
        await pilot.pause()
        assert app.clipboard == "you rivers" and app.is_running and not app.screen.selections
        assert "copied the selected text (10 characters) through the terminal" in history_text(app)
        await pilot.press("ctrl+c")  # nothing selected, nothing running: as before
        await pilot.pause()
        assert "nothing to stop: Ctrl-Q quits" in history_text(app)
        await send(app, pilot, "/copy")
        answer = app.conversation.turns[-1].answers[SPEC].text.strip()
        assert app.clipboard == answer and f"copied the last answer ({len(answer)} character" in history_text(app)
        await send(app, pilot, "/copy all")
        assert "/copy takes no argument" in history_text(app)


@pytest.mark.parametrize("platform, env, tool", [("darwin", {}, "pbcopy"), ("linux", {"WAYLAND_DISPLAY": "w"}, "wl-copy"),
                                                  ("linux", {"DISPLAY": ":0"}, "xclip")])
def test_the_desktop_s_clipboard_tool_copies_too(monkeypatch, tmp_path, platform, env, tool):
    """The terminal's copy (OSC 52) does not reach the clipboard in macOS's Terminal or GNOME's:
    the desktop's own tool does, where there is one."""
    from tui import clipboard

    fake = tmp_path / tool
    fake.write_text(f"#!/bin/sh\n{shutil.which('cat')} > {tmp_path / 'copied'}\n")
    fake.chmod(0o755)
    monkeypatch.setattr(clipboard.sys, "platform", platform)
    for name in ("DISPLAY", "WAYLAND_DISPLAY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PATH", str(tmp_path))  # this tool alone

    class App:
        def copy_to_clipboard(self, text):
            self.osc52 = text

    app = App()
    assert clipboard.copy(app, "héllo\nworld") == f"with {tool}"
    assert (tmp_path / "copied").read_text(encoding="utf-8") == "héllo\nworld" and app.osc52 == "héllo\nworld"
    fake.write_text("#!/bin/sh\nexit 1\n")  # the tool failing: the terminal's copy is what went out, and is said
    assert clipboard.copy(app, "x").startswith("through the terminal")
    for name in env:  # no display (over SSH, say): the terminal's copy alone
        monkeypatch.delenv(name)
    assert platform == "darwin" or clipboard.copy(app, "x").startswith("through the terminal")


def test_the_summary_adds_up_the_race_over_the_conversation():
    from tui.conversation import Answer, Conversation, Turn
    from tui.stats_view import StatsView

    def turn(text, spec, vanilla, temperature=0.0, other=None, divergence=None):
        (tokens, seconds, drafted, rate, drafter), (v_tokens, v_seconds) = spec, vanilla
        s = StatsView(tokens=tokens, seconds=seconds, tokens_per_second=tokens / seconds, drafted=drafted,
                      acceptance_rate=rate, drafter=drafter)
        v = StatsView(tokens=v_tokens, seconds=v_seconds, tokens_per_second=v_tokens / v_seconds)
        return Turn("q", {SPEC: Answer(text=text, stats=s), VANILLA: Answer(text=other or text, stats=v)},
                    temperature=temperature, divergence=divergence)

    conv = Conversation()
    assert conv.summary() == "no turns yet"
    conv.turns += [turn("a", (100, 2.0, 80, 0.5, "eagle"), (100, 5.0)),  # 2.5x
                   turn("b", (50, 2.5, 40, 0.25, "eagle"), (50, 2.0), temperature=0.7),  # 0.8x
                   turn("c", (30, 1.0, 0, 0.0, "ngram"), (30, 1.5), other="d",  # 1.5x, parted at a near-tie
                        divergence={"divergence": "rounding", "tokens": 3})]
    assert conv.summary().splitlines() == [
        "3 turns (2 greedy, 1 sampled)",
        "speculative: 180 tokens in 5.5 s, 32.7 tok/s",
        "vanilla: 180 tokens in 8.5 s, 21.2 tok/s",
        "speedup 1.55× over all tokens; per turn median 1.50×, from 0.80× to 2.50×",
        "outputs identical in 2 of 3, 1 more up to rounding",
        "drafted by eagle (2), ngram (1); accepted 42% of 120 drafts"]
    conv.turns[2].divergence = None
    assert "outputs identical in 2 of 3, 1 differ (see their verdicts)" in conv.summary()
    md = conv.to_markdown()
    assert md.endswith("\n".join(f"- {line}" for line in conv.summary().splitlines()) + "\n")
    assert "## Summary" in md


@async_test
async def test_stats_sums_up_the_conversation_in_the_chat():
    app = make_app(tiny_engine(), max_tokens=16)
    async with app.run_test(size=SIZE) as pilot:
        await send(app, pilot, "/stats")
        assert history_text(app).endswith("no turns yet")
        await send(app, pilot, "hello")
        await send(app, pilot, "again")
        await send(app, pilot, "/stats")
        text = history_text(app)
        assert "2 turns (2 greedy)" in text and "speculative: 32 tokens in" in text and "vanilla: 32 tokens" in text
        assert "outputs identical in 2 of 2" in text and re.search(r"per turn median \d+\.\d\d×", text)
