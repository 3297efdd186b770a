"""scripts/tree_tokens_per_pass.py's greedy check: divergences judged as the bench judges them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from test_draft_model import demo_gguf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import tree_tokens_per_pass  # noqa: E402

PROMPT = {"kind": "code", "prompt": "Write a Python function that returns the sum of a list."}


def _run(tmp_path):
    suite = tmp_path / "one.jsonl"
    suite.write_text(json.dumps(PROMPT) + "\n")
    out = tmp_path / "out.json"
    tree_tokens_per_pass.main(["--suite", str(suite), "--prompts", "1", "--caps", "8", "--max-tokens", "12",
                               "--json", str(out)])
    return json.loads(out.read_text())


@pytest.mark.demo
@pytest.mark.slow
def test_counts_passes_and_equal_outputs(tmp_path):
    demo_gguf()
    res = _run(tmp_path)
    for key in ("off", "8"):
        row = res[key]
        assert row["identical"] == "1/1" and row["divergences"] == {}
        assert 1.0 <= row["tokens_per_pass"] <= 5.0  # a chain of 4 commits at most 5 per pass
    assert res["off"]["tree_rounds"] == 0


@pytest.mark.demo
@pytest.mark.slow
def test_a_divergence_beyond_rounding_fails_the_run(tmp_path, monkeypatch):
    demo_gguf()
    from mlxspec.bench import neartie
    from mlxspec.reference import BUG, Judgement

    def bug(model, prompt_ids, reference, candidate, **kw):
        return neartie.GreedyCheck(False, 0, reference[0], reference[0] + 1, 5.0, False,
                                   Judgement(BUG, "float32", 5.0, 20.0, 1e-3, "made up for the test"))

    monkeypatch.setattr(neartie, "check_greedy", bug)
    with pytest.raises(SystemExit, match="beyond rounding"):
        _run(tmp_path)
    res = json.loads((tmp_path / "out.json").read_text())
    assert res["off"]["divergences"] == {"bug": 1} and res["off"]["identical"] == "0/1"
