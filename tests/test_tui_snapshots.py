"""Snapshots of the chat screen with deterministic content (fixed pair info, injected answers)."""

from __future__ import annotations

from tests.tui_helpers import tiny_engine
from tui import make_app
from tui.conversation import SPEC, VANILLA, Answer, Turn
from tui.info import PairInfo
from tui.messages import StatsUpdated, TokensAdded, TurnFinished
from tui.stats_view import StatsView

SIZE = (110, 34)
INFO = PairInfo(name="demo", target="SmolLM2-135M-Instruct", draft="ngram drafter", precision="q4_1",
                device="Metal GPU", target_weights_bytes=100 * 2**20)
ANSWER = [("Speculative ", False), ("decoding ", True), ("drafts ", True), ("tokens", False), (" and the ", True),
          ("**target** ", False), ("checks them.", True)]
SPEC_STATS = StatsView(tokens=7, tokens_per_second=212.5, acceptance_rate=0.8, tokens_per_target_pass=2.33,
                       last_k=3, drafted=5, prompt_tokens=20, prefilled_tokens=20, seconds=0.033,
                       peak_memory_bytes=150 * 2**20, target_kv_bytes=2 * 2**20, drafter="ngram")
VAN_STATS = StatsView(tokens=7, tokens_per_second=121.4, prompt_tokens=20, prefilled_tokens=20, seconds=0.058,
                      peak_memory_bytes=140 * 2**20, target_kv_bytes=2 * 2**20)


def app():
    return make_app(tiny_engine(), info=INFO)


async def steady_cursor(pilot):
    """The prompt's cursor blinks every 0.5 s: a slow run would snapshot it off. Keep it on."""
    pilot.app.query_one("#prompt").cursor_blink = False
    await pilot.pause()


async def inject_answer(pilot):
    """What the worker would post for one turn, with fixed numbers."""
    await steady_cursor(pilot)
    a = pilot.app
    a.query_one("#prompt").value = ""
    a.query_one("ChatHistory").add_user("What is speculative decoding?")
    text = "".join(t for t, _ in ANSWER)
    answers = {SPEC: Answer(text, [d for _, d in ANSWER], "stop", SPEC_STATS),
               VANILLA: Answer(text, [False] * len(ANSWER), "stop", VAN_STATS)}
    for side, stats in ((SPEC, SPEC_STATS), (VANILLA, VAN_STATS)):
        a.post_message(TokensAdded(side, tuple(ANSWER if side == SPEC else [(t, False) for t, _ in ANSWER])))
        a.post_message(StatsUpdated(side, stats))
    a.busy = True
    a.post_message(TurnFinished(Turn("What is speculative decoding?", answers)))
    await pilot.pause()
    await pilot.pause()


def test_start_screen(snap_compare):
    assert snap_compare(app(), terminal_size=SIZE, run_before=steady_cursor)


def test_after_an_answer_coloured(snap_compare):
    assert snap_compare(app(), terminal_size=SIZE, run_before=inject_answer)


def test_after_an_answer_markdown(snap_compare):
    async def run_before(pilot):
        await inject_answer(pilot)
        await pilot.press("ctrl+t")
        await pilot.pause()

    assert snap_compare(app(), terminal_size=SIZE, run_before=run_before)
