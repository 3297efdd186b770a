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


def test_cli_prints_and_saves(home, monkeypatch, capsys):
    eng = tiny_engine()
    monkeypatch.setattr(modelargs, "load_engine", lambda args, **kw: eng)
    assert cli.main(["calibrate", "--max-j", "3", "--prefix", "4", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "V(j)/V(1)" in out and "drafter model" in out
    doc = json.loads((home / "calibration.json").read_text())
    assert list(doc["models"]) == [cal.model_key(eng.target_model)]
    assert cli.main(["calibrate", "--max-j", "2", "--prefix", "4", "--repeats", "1", "--no-save"]) == 0
    assert len(json.loads((home / "calibration.json").read_text())["models"][cal.model_key(eng.target_model)]["ratios"]) == 3
