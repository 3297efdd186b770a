"""`mlxspec calibrate`: measuring, saving and loading the verify-cost curve (MLXSPEC_HOME in a tmp dir)."""

import json

import pytest
from bench_helpers import tiny_engine
from tiny import make_llama

from mlxspec import calibration as cal
from mlxspec import cli
from mlxspec.commands import modelargs
from mlxspec.errors import MlxSpecError


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))
    return tmp_path


@pytest.fixture
def steady(monkeypatch):
    """Timings of a quiet machine (each pass 10 % dearer than the one shorter): the CLI tests
    below are about files and words, and a tiny model's microsecond passes on a busy CI machine
    are as likely to look disturbed (`implausible`) as not."""
    def timed(model, *, max_j=cal.MAX_J, **kw):
        return {j: 1e-3 * (1 + 0.1 * (j - 1)) for j in range(1, max_j + 1)}

    monkeypatch.setattr(cal, "measure_verify_seconds", timed)


def test_home_follows_the_environment(home):
    assert cal.calibration_path() == home / "calibration.json"


def test_round_trip(home):
    eng = tiny_engine()
    assert cal.load_prior(eng.target_model) is None
    entry = cal.calibrate(eng.target_model, eng.draft_model, max_j=4, prefix=8, repeats=1)
    assert set(entry["ratios"]) == {"1", "2", "3", "4"} and entry["ratios"]["1"] == 1.0
    assert set(entry["draft_cost"]) == {"ngram", "model"} and entry["draft_cost"]["model"] > 0
    path = cal.save(entry)
    assert path == home / "calibration.json"
    prior = cal.load_prior(eng.target_model)
    assert prior == {int(j): r for j, r in entry["ratios"].items()}
    assert all(isinstance(j, int) and isinstance(r, float) for j, r in prior.items())


def test_entries_are_per_model_and_backend(home, monkeypatch):
    a, b = make_llama(0, layers=2), make_llama(0, layers=3)
    assert cal.model_key(a) != cal.model_key(b)
    assert cal.model_key(a) == cal.model_key(make_llama(5, layers=2))  # same architecture and size
    cal.save(cal.calibrate(a, max_j=2, prefix=4, repeats=1))
    cal.save(cal.calibrate(b, max_j=3, prefix=4, repeats=1))
    assert len(cal.load_prior(a)) == 2 and len(cal.load_prior(b)) == 3  # saving b kept a
    monkeypatch.setattr(cal, "backend", lambda: "metal")
    assert cal.model_key(a).endswith("/metal") and cal.load_prior(a) is None
    monkeypatch.setattr(cal, "backend", lambda: "cpu")
    assert len(cal.load_prior(a)) == 2  # this BLAS's curve
    monkeypatch.setattr(cal.blas, "info", lambda: {"name": "some-other-blas", "path": None, "note": ""})
    assert cal.model_key(a).endswith("/cpu+some-other-blas") and cal.load_prior(a) is None


def test_a_corrupt_file_is_no_prior_but_a_clear_error_to_save(home):
    (home / "calibration.json").write_text("{not json")
    with pytest.warns(UserWarning, match="cannot read"):
        assert cal.load_prior(make_llama(0)) is None
    with pytest.raises(MlxSpecError, match="delete it"):
        cal.save({"key": "x", "ratios": {"1": 1.0}})


def test_bench_uses_the_saved_curve(home):
    eng = tiny_engine()
    cal.save(cal.calibrate(eng.target_model, max_j=3, prefix=4, repeats=1))
    ratios, source = cal.curve_for(eng)
    assert source == "calibration file" and set(ratios) == {1, 2, 3}
    cal.apply_prior(eng, ratios)
    assert eng.curve.prior_ratios == ratios


def test_cli_prints_and_saves(home, steady, monkeypatch, capsys):
    eng = tiny_engine()
    monkeypatch.setattr(modelargs, "load_engine", lambda args, **kw: eng)
    assert cli.main(["calibrate", "--max-j", "3", "--prefix", "4", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "V(j)/V(1)" in out and "drafter model" in out
    doc = json.loads((home / "calibration.json").read_text())
    assert list(doc["models"]) == [cal.model_key(eng.target_model)]
    assert cli.main(["calibrate", "--max-j", "2", "--prefix", "4", "--repeats", "1", "--no-save"]) == 0
    assert len(json.loads((home / "calibration.json").read_text())["models"][cal.model_key(eng.target_model)]["ratios"]) == 3


def test_cli_refuses_passes_past_the_context(home, monkeypatch, capsys):
    from mlxspec.modelmeta import context_length

    eng = tiny_engine()
    monkeypatch.setattr(modelargs, "load_engine", lambda args, **kw: eng)
    context = context_length(eng.target_model)
    assert cli.main(["calibrate", "--max-j", "4", "--prefix", str(context - 3), "--repeats", "1"]) == 1
    assert f"past the target's context of {context} tokens: use --prefix {context - 4} or less" in \
        capsys.readouterr().err
    assert not (home / "calibration.json").exists()


def _saved_entry(model, **changes) -> dict:
    entry = cal.calibrate(model, max_j=3, prefix=4, repeats=1)
    entry.update(changes)
    return entry


@pytest.mark.parametrize("damage", [
    {"draft_cost": 0.08, "draft_key": "x"},  # a number where a table belongs
    {"ratios": {"1": 0, "2": 1.2}},  # a zero ratio (was a ZeroDivisionError mid-generation)
    {"ratios": {"1": 1.0, "2": float("nan")}},
    {"ratios": {"1": 1.0, "2": -3}},
    {"ratios": {"2": 1.2}},  # no length 1
    {"ratios": ["1", "2"]},
])
def test_a_damaged_entry_is_ignored_with_a_warning_and_engines_still_load(home, damage):
    from mlxspec import Engine

    eng = tiny_engine()
    cal.save(_saved_entry(eng.target_model, **damage))
    with pytest.warns(UserWarning, match="mlxspec calibrate") if "ratios" in damage else _nothing():
        ratios, draft = cal.priors_for(eng.target_model, eng.draft_model)
    assert draft is None and (ratios is None or "ratios" not in damage)
    with pytest.warns(UserWarning) if "ratios" in damage else _nothing():
        e = Engine(eng.target_model, None, eng.draft_model)
    assert e.generate([1, 2, 3], max_tokens=4).stats.tokens == 4


def test_an_entry_that_is_not_a_table_is_ignored(home):
    eng = tiny_engine()
    (home / "calibration.json").write_text(json.dumps({"format": 1, "models": {cal.model_key(eng.target_model): [1]}}))
    assert cal.priors_for(eng.target_model, eng.draft_model) == (None, None)


def _nothing():
    import contextlib

    return contextlib.nullcontext()


def test_engine_cost_prior_is_checked():
    from mlxspec import Engine
    from mlxspec.errors import InvalidArgumentError

    target = make_llama(0)
    for bad, why in (({1: 1.0, 2: 0.0}, "finite and > 0"), ({2: 1.2}, "no length 1"), ("fast", "cost_prior must map")):
        with pytest.raises(InvalidArgumentError, match=why):
            Engine(target, None, None, cost_prior=bad)
    e = Engine(target, None, None, cost_prior={1: 1.0, 2: 1.1})
    with pytest.raises(InvalidArgumentError, match="finite and > 0"):
        e.set_cost_prior({1: 1.0, 3: float("inf")})


def test_calibrate_replaces_an_unreadable_file_and_says_so_before_measuring(home, steady, monkeypatch, capsys):
    eng = tiny_engine()
    monkeypatch.setattr(modelargs, "load_engine", lambda args, **kw: eng)
    (home / "calibration.json").write_text("{ broken")
    assert cli.main(["calibrate", "--max-j", "2", "--prefix", "4", "--repeats", "1"]) == 0
    err = capsys.readouterr().err
    assert "not a readable calibration file" in err and "calibration.json.bad" in err
    assert (home / "calibration.json.bad").read_text() == "{ broken"
    assert len(cal.load_prior(eng.target_model)) == 2


def test_an_earlier_unreadable_file_kept_aside_is_never_overwritten(home, steady, monkeypatch, capsys):
    eng = tiny_engine()
    monkeypatch.setattr(modelargs, "load_engine", lambda args, **kw: eng)
    (home / "calibration.json.bad").write_text("first")
    (home / "calibration.json").write_text("second")
    assert cli.main(["calibrate", "--max-j", "2", "--prefix", "4", "--repeats", "1"]) == 0
    assert "kept beside it, as calibration.json.bad.2" in capsys.readouterr().err
    assert (home / "calibration.json.bad").read_text() == "first"
    assert (home / "calibration.json.bad.2").read_text() == "second"


def test_a_curve_where_more_tokens_cost_less_is_said_and_not_saved(home, monkeypatch, capsys):
    """A pass over 3 tokens timed at 0.75 of a pass over 2 (0.90 of one token's) was disturbed (a busy machine): it
    is said, exit status 1, and the curve saved before stays."""
    assert cal.implausible({"ratios": {"1": 1.0, "2": 1.1, "3": 1.2, "4": 1.3}}) == []
    assert cal.implausible({"ratios": {"1": 1.0, "2": 0.9, "3": 1.05}}) == []  # within noise
    assert cal.implausible({"ratios": {"1": 1.0, "2": 1.2, "3": 0.9, "4": 1.3}}) == ["V(3)/V(1) 0.90 after V(2)/V(1) 1.20"]
    assert cal.implausible({"ratios": {"1": 1.0, "2": 0.5}}) == ["V(2)/V(1) 0.50 after V(1)/V(1) 1.00"]
    # against the dearest shorter pass, not the last one
    assert cal.implausible({"ratios": {"1": 1.0, "2": 1.5, "3": 1.0, "4": 1.1}}) == [
        "V(3)/V(1) 1.00 after V(2)/V(1) 1.50", "V(4)/V(1) 1.10 after V(2)/V(1) 1.50"]
    eng = tiny_engine()
    monkeypatch.setattr(modelargs, "load_engine", lambda args, **kw: eng)
    (home / "calibration.json").write_text('{"models": {}}')
    disturbed = {1: 1e-3, 2: 1.2e-3, 3: 0.9e-3}
    monkeypatch.setattr(cal, "measure_verify_seconds", lambda model, *, max_j=3, **kw: {
        j: disturbed[j] for j in range(1, max_j + 1)})
    assert cli.main(["calibrate", "--max-j", "3", "--prefix", "4", "--repeats", "1"]) == 1
    err = capsys.readouterr().err
    assert "V(3)/V(1) 0.90 after V(2)/V(1)" in err and "Not saved" in err
    assert (home / "calibration.json").read_text() == '{"models": {}}'
    assert cli.main(["calibrate", "--max-j", "3", "--prefix", "4", "--repeats", "1", "--no-save"]) == 0


def test_a_damaged_saved_curve_is_ignored_naming_the_file(home):
    eng = tiny_engine()
    cal.save(_saved_entry(eng.target_model, ratios={"1": 1.0, "2": "abc"}))
    with pytest.warns(UserWarning, match=rf"ignoring the saved calibration of this model in {home / 'calibration.json'}"):
        assert cal.load_prior(eng.target_model) is None


def test_calibrating_again_without_the_draft_keeps_its_saved_cost(home):
    eng = tiny_engine()
    cal.save(cal.calibrate(eng.target_model, eng.draft_model, max_j=2, prefix=4, repeats=1))
    _, before = cal.priors_for(eng.target_model, eng.draft_model)
    cal.save(cal.calibrate(eng.target_model, None, max_j=3, prefix=4, repeats=1))  # e.g. --draft ngram
    ratios, after = cal.priors_for(eng.target_model, eng.draft_model)
    assert len(ratios) == 3 and after == before and after > 0


def test_an_unwritable_home_is_a_readable_error(home, monkeypatch):
    import os

    if os.geteuid() == 0:  # root writes anywhere: make the folder a file instead
        monkeypatch.setenv("MLXSPEC_HOME", str(home / "afile" / "sub"))
        (home / "afile").write_text("")
    else:
        home.chmod(0o500)
    try:
        with pytest.raises(MlxSpecError, match="cannot write .*calibration.json.*--no-save"):
            cal.save({"key": "x", "ratios": {"1": 1.0}, "draft_cost": {}})
    finally:
        home.chmod(0o700)


def test_two_saves_at_once_lose_nothing(home):
    import threading

    errors = []

    def saver(i):
        try:
            for n in range(30):
                cal.save({"key": f"k{i}", "ratios": {"1": 1.0}, "draft_cost": {}, "n": n})
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            errors.append(e)

    threads = [threading.Thread(target=saver, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert not list(home.glob("*.tmp"))
    json.loads((home / "calibration.json").read_text())  # whole, never half-written


def test_calibrate_max_j_is_bounded_and_it_has_no_window_or_head_flags(capsys):
    for argv in (["calibrate", "--max-j", "34"], ["calibrate", "--head", "x"], ["calibrate", "--max-kv-size", "8"]):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2
    assert "1..33" in capsys.readouterr().err


def test_an_unreadable_calibration_file_is_said_when_an_engine_starts_without_it(home, capsys):
    eng = tiny_engine()
    (home / "calibration.json").write_text("{ broken")
    with pytest.warns(UserWarning, match=r"cannot read .*calibration.json.*delete it.*starts from its guess") as said:
        assert cal.priors_for(eng.target_model) == (None, None)
        assert cal.curve_for(eng, measure=False) == (None, "none")  # the bench reads it again: said once
    assert len(said) == 1
    # at a terminal: one line, not Python's file:line and source line
    assert cli._warning_line("the message", UserWarning, "engine.py", 129) == "warning: the message\n"
