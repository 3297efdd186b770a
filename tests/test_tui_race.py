"""The interleaving race and the turn worker, without the UI."""

from __future__ import annotations

import threading
import types

from mlxspec.stats import GenerationStats, TokenEvent
from tests.tui_helpers import tiny_engine
from tui.conversation import SPEC, VANILLA, Conversation
from tui.messages import StatsUpdated, TokensAdded, TurnFinished
from tui.race import race
from tui.stats_view import StatsView
from tui.worker import TurnRequest, run_turn


class VirtualClock:
    """The race's clock, advanced only by the fake streams' 'compute': no test depends on the machine's load."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


CLOCK = VirtualClock()


def fake_stream(rounds, seconds_per_round, log):
    """Rounds of (accepted drafts + 1 target token), each taking seconds_per_round of 'compute'."""
    stats = GenerationStats()
    try:
        for r, n_accepted in enumerate(rounds):
            CLOCK.t += seconds_per_round
            for i in range(n_accepted + 1):
                last = r == len(rounds) - 1 and i == n_accepted
                yield TokenEvent(0, "x", i < n_accepted, r, n_accepted, stats, "length" if last else None)
    finally:
        log.append("closed")


def test_interleaving_alternates_rounds_with_vanilla_catch_up(monkeypatch):
    import tui.race

    monkeypatch.setattr(tui.race, "time", types.SimpleNamespace(perf_counter=CLOCK))
    log = []
    spec = fake_stream([3] * 6, 0.02, log)  # 6 rounds, 4 tokens each, 20 ms per round
    van = fake_stream([0] * 24, 0.01, log)  # 24 plain steps, 10 ms each
    slices = list(race({SPEC: spec, VANILLA: van}, cancel=threading.Event()))
    assert slices[0][0] == SPEC and all(len(evs) == 4 for side, evs in slices if side == SPEC)
    sides = [side for side, _ in slices]
    first_half = sides[: len(sides) // 2]
    assert VANILLA in first_half and SPEC in sides[len(sides) // 2:]  # both fill together
    # between speculative rounds vanilla takes about two 10 ms steps (as much time), not all of them
    runs = "".join("s" if s == SPEC else "v" for s in sides).rstrip("v").split("s")
    assert max(len(run) for run in runs) <= 4, sides
    assert sum(len(evs) for side, evs in slices if side == VANILLA) == 24
    assert log == ["closed", "closed"]


def test_sequential_runs_speculative_to_the_end_first():
    log = []
    slices = list(race({SPEC: fake_stream([1] * 3, 0, log), VANILLA: fake_stream([0] * 4, 0, log)},
                       cancel=threading.Event(), sequential=True))
    sides = [side for side, _ in slices]
    assert sides == [SPEC] * 3 + [VANILLA] * 4


def test_cancel_stops_within_a_step_and_closes_both_streams():
    log = []
    cancel = threading.Event()
    out = []
    for side, evs in race({SPEC: fake_stream([2] * 100, 0, log), VANILLA: fake_stream([0] * 300, 0, log)},
                          cancel=cancel):
        out.append(side)
        if len(out) == 3:
            cancel.set()
    assert len(out) == 3 and log == ["closed", "closed"]


def test_run_turn_posts_deltas_stats_and_one_final_message():
    engine = tiny_engine()
    engines = {SPEC: engine, VANILLA: engine.fork()}
    posted = []
    req = TurnRequest("hi", {s: Conversation().messages(s, "hi") for s in (SPEC, VANILLA)}, max_tokens=12)
    turn = run_turn(req, engines, threading.Event(), posted.append)
    assert isinstance(posted[-1], TurnFinished) and posted[-1].error is None
    assert not any(isinstance(m, TurnFinished) for m in posted[:-1])
    for side in (SPEC, VANILLA):
        text = "".join(t for m in posted if isinstance(m, TokensAdded) and m.side == side for t, _ in m.pieces)
        assert text == turn.answers[side].text and len(turn.answers[side].from_draft) == 12
        assert isinstance(turn.answers[side].stats, StatsView)
    assert turn.identical and turn.speedup > 0


def test_run_turn_reports_an_engine_error_instead_of_raising():
    engine = tiny_engine(draft=False)
    posted = []
    req = TurnRequest("hi", {s: [{"role": "user", "content": "hi"}] for s in (SPEC, VANILLA)}, drafter="model")
    run_turn(req, {SPEC: engine, VANILLA: engine.fork()}, threading.Event(), posted.append)
    assert "drafter 'model' is not available" in posted[-1].error


def test_stats_updates_for_the_same_side_merge():
    a, b, c = StatsUpdated(SPEC, StatsView(tokens=1)), StatsUpdated(SPEC, StatsView(tokens=2)), StatsUpdated(VANILLA, StatsView())
    assert a.can_replace(b) and not a.can_replace(c)
    assert not a.can_replace(TokensAdded(SPEC, ()))
