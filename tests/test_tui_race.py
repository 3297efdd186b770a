"""The interleaving race and the turn worker, without the UI."""

from __future__ import annotations

import re
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


def rounding_turn(monkeypatch=None):
    """One greedy turn on a bfloat16 RoundingModel whose near-tie lies at the third answer token."""
    import mlx.core as mx

    from mlxspec.engine import Engine
    from mlxspec.prompts import encode_prompt
    from tests.tiny import VOCAB, RoundingModel, accept_every_draft, make_tokenizer

    tok = make_tokenizer()
    messages = Conversation().messages(SPEC, "hi")
    model = RoundingModel(len(encode_prompt(messages, tok, VOCAB)) + 1, vocab=VOCAB)
    draft = model
    if monkeypatch is not None:  # a wrong verifier, accepting drafts that are never the argmax
        from mlxspec import loop

        monkeypatch.setattr(loop, "read", accept_every_draft)
        draft = RoundingModel(255, vocab=VOCAB)
        draft.terms = mx.roll(model.terms, 1, axis=-1)  # always proposes the token after the target's argmax
    engine = Engine(model, tok, draft, num_draft=2)
    req = TurnRequest("hi", {s: messages for s in (SPEC, VANILLA)}, max_tokens=6)
    return run_turn(req, {SPEC: engine, VANILLA: engine.fork()}, threading.Event(), lambda m: None)


def test_a_rounding_divergence_reads_identical_up_to_rounding():
    turn = rounding_turn()
    assert turn.answers[SPEC].text != turn.answers[VANILLA].text and len(turn.answers[SPEC].tokens) == 6
    d = turn.divergence
    assert (d["divergence"], d["position"], d["tokens"]) == ("rounding", 2, 4)  # tokens 2..5 of the answer
    assert "bfloat16 ulp" in d["reason"]
    assert "greedy outputs identical up to rounding (4 tokens)" in turn.verdict() and "DIFFER" not in turn.verdict()
    conversation = Conversation()
    conversation.turns.append(turn)
    assert conversation.as_dict()["turns"][0]["divergence"] == d  # /save keeps the classification


def test_a_bug_still_reads_differ(monkeypatch):
    turn = rounding_turn(monkeypatch)
    assert turn.divergence["divergence"] == "bug" and "greedy outputs DIFFER from character" in turn.verdict()


def test_an_unclassified_divergence_says_why():
    turn = rounding_turn()
    turn.divergence = {"divergence": "unclassified", "position": 2, "tokens": 4,
                       "reason": "no float32 reference: a float32 copy of the weights needs 900 MiB"}
    assert "differ from character" in turn.verdict() and "unclassified: no float32 reference" in turn.verdict()


def test_the_wait_for_a_pass_left_in_flight_counts_on_its_side(monkeypatch):
    """The loop times its own steps; the pass it leaves in flight at a switch is waited for in
    `pause`, outside them: that wait is the side's work and its tok/s (stats.seconds) includes
    it, so each side's figure is its whole compute, as the race's clock has it."""
    import mlx.core as mx

    import tui.race

    monkeypatch.setattr(tui.race, "time", types.SimpleNamespace(perf_counter=CLOCK))

    def in_flight():  # the pass left in flight finishes 5 ms after the switch
        CLOCK.t += 0.005

    monkeypatch.setattr(mx, "synchronize", in_flight)

    def timed_stream(rounds, seconds_per_round):  # as the loop times: its steps only
        stats = GenerationStats()
        for r, n_accepted in enumerate(rounds):
            CLOCK.t += seconds_per_round
            stats.seconds += seconds_per_round
            for i in range(n_accepted + 1):
                last = r == len(rounds) - 1 and i == n_accepted
                yield TokenEvent(0, "x", i < n_accepted, r, n_accepted, stats, "length" if last else None)

    spec, van = timed_stream([3] * 6, 0.02), timed_stream([0] * 24, 0.01)
    seen = {}
    for side, evs in race({SPEC: spec, VANILLA: van}, cancel=threading.Event()):
        seen[side] = evs[-1].stats
    spec_pauses = 6  # one after each round: vanilla is still running then
    assert abs(seen[SPEC].seconds - (6 * 0.02 + spec_pauses * 0.005)) < 1e-9
    van_pauses = round((seen[VANILLA].seconds - 24 * 0.01) / 0.005)
    assert van_pauses >= 5 and abs(seen[VANILLA].seconds - (24 * 0.01 + van_pauses * 0.005)) < 1e-9


def test_between_runs_only_where_no_side_is_timed(monkeypatch):
    """The caller draws in `between()`: at each switch of sides (after the side that stops has
    waited for its pass), never in the middle of a side's run, where drawing would be on its
    clock; once one side is done, after each slice of the other."""
    import tui.race

    monkeypatch.setattr(tui.race, "time", types.SimpleNamespace(perf_counter=CLOCK))
    monkeypatch.setattr(tui.race._Side, "pause", lambda self: log.append("pause"))
    log = []
    spec = fake_stream([3] * 4, 0.02, [])  # 4 rounds of 20 ms
    van = fake_stream([0] * 24, 0.01, [])  # 24 steps of 10 ms: 2 after each of the first 3 rounds
    for side, evs in race({SPEC: spec, VANILLA: van}, cancel=threading.Event(),
                          between=lambda: log.append("between")):
        log.append(side)
    text = " ".join(log)
    # while both run: speculative's round (paused before it is handed over), between; then
    # vanilla's steps, its pause, between; alone, vanilla draws after each step
    both = rf"(pause {SPEC} between( {VANILLA})+ pause between )+"
    alone = rf"( {VANILLA} between)+"
    assert re.fullmatch(both + rf"pause {SPEC} between" + alone, text), text
    assert text.count(f"{VANILLA} between") == 24 - 3 * 2, text


def test_run_turn_waits_for_the_screen_after_each_flush():
    """Every batch of pane updates is followed by `settle()` before the race goes on (drawing off
    both sides' clocks); the turn's last message comes after the last one."""
    engine = tiny_engine()
    log = []
    req = TurnRequest("hi", {s: Conversation().messages(s, "hi") for s in (SPEC, VANILLA)}, max_tokens=12)
    run_turn(req, {SPEC: engine, VANILLA: engine.fork()}, threading.Event(), log.append,
             settle=lambda: log.append("settle"))
    assert "settle" in log and isinstance(log[-1], TurnFinished) and log[-2] == "settle"
    groups = " ".join("s" if m == "settle" else "m" for m in log[:-1]).split("s")
    assert all(g.strip() for g in groups[:-1])  # no settle without something posted before it
