"""scripts/compare_eagle.py: two heads' eval_eagle.py runs compared prompt by prompt."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import compare_eagle  # noqa: E402


def _row(kind, acc, reached, tokens, passes, top1=10, positions=20):
    return {"kind": kind, "drafted": sum(reached), "accepted": sum(acc), "reached": reached, "step_acc": acc,
            "tokens": tokens, "passes": passes, "t_drafted": 8, "t_accepted": 4,
            "overlap_sum": 10.0, "overlap_n": 20, "positions": positions, "top1": top1}


def _doc(rows):
    return {"suite": "p.jsonl", "prompts": len(rows), "max_tokens": 48, "k": 4, "lookup": "off",
            "temperature": 0.7, "rows": rows}


def test_differences_are_pooled_per_figure_and_per_kind():
    a = _doc([_row("math", [4, 2, 1, 0], [8, 4, 2, 1], 24, 16), _row("code", [6, 4, 2, 1], [8, 6, 4, 2], 30, 12)])
    b = _doc([_row("math", [5, 3, 1, 0], [8, 5, 3, 1], 24, 15), _row("code", [6, 5, 3, 2], [8, 6, 5, 3], 30, 11)])
    res = compare_eagle.compare(a, b)
    j = res["all"]["judged acceptance"]
    assert j["a"] == pytest.approx(20 / 35) and j["b"] == pytest.approx(25 / 39)
    assert j["difference"] == pytest.approx(25 / 39 - 20 / 35)
    lo, hi = j["interval"]
    assert lo <= hi
    assert res["all"]["tokens per pass"]["b"] == pytest.approx(54 / 26)
    assert res["per_kind"]["math"]["tokens per pass"]["difference"] == pytest.approx(24 / 15 - 24 / 16)
    assert res["per_kind"]["code"]["judged acceptance"]["interval"] is None  # one prompt


def test_runs_of_different_settings_or_prompts_are_refused(tmp_path):
    a = _doc([_row("math", [1], [2], 4, 3), _row("code", [1], [2], 4, 3)])
    with pytest.raises(ValueError, match="k 4 against 2"):
        compare_eagle.compare(a, {**a, "k": 2})
    with pytest.raises(ValueError, match="order or kind"):
        compare_eagle.compare(a, {**a, "rows": a["rows"][::-1]})
    other = {**a, "rows": [a["rows"][0], {**a["rows"][1], "tokens": 5}]}
    with pytest.raises(ValueError, match="differ in length on 1 prompt.*#2"):
        compare_eagle.compare(a, other)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({k: v for k, v in a.items() if k != "rows"}))
    with pytest.raises(SystemExit, match="no per-prompt rows"):
        compare_eagle.main([str(old), str(old)])
    with pytest.raises(SystemExit, match="no such file"):
        compare_eagle.main([str(tmp_path / "missing.json"), str(old)])
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(SystemExit, match="not eval_eagle.py's JSON"):
        compare_eagle.main([str(tmp_path / "bad.json"), str(old)])


def test_the_command_prints_and_writes_the_comparison(tmp_path, capsys):
    a = _doc([_row("math", [4, 2], [8, 4], 24, 16), _row("math", [3, 1], [8, 3], 20, 14)])
    b = _doc([_row("math", [5, 2], [8, 5], 24, 15), _row("math", [4, 2], [8, 4], 20, 13)])
    pa, pb, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    compare_eagle.main([str(pa), str(pb), "--json", str(out)])
    text = capsys.readouterr().out
    assert "judged acceptance" in text and "95 %" in text
    assert json.loads(out.read_text())["all"]["tokens per pass"]["b"] == pytest.approx(44 / 28)
