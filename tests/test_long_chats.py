"""scripts/long_chats.py: bench suites of long conversations the target writes itself."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from bench_helpers import tiny_engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import long_chats  # noqa: E402

from mlxspec.bench.prompts import load_prompts  # noqa: E402
from mlxspec.prompts import encode_prompt  # noqa: E402


@pytest.fixture
def suite(tmp_path):
    f = tmp_path / "suite.jsonl"
    kinds = ["code", "code", "math", "math"] * 4
    f.write_text("".join(json.dumps({"kind": k, "prompt": f"{k} question {i}"}) + "\n" for i, k in enumerate(kinds)))
    return f


def test_each_length_gets_the_newest_whole_turns_that_fit(monkeypatch, tmp_path, suite):
    engine = tiny_engine(draft=False)
    monkeypatch.setattr(long_chats.mlxspec, "load", lambda *a, **k: engine)
    out = tmp_path / "long"
    assert long_chats.main(["--suite", str(suite), "--lengths", "120,200", "--finals", "2",
                            "--answer-tokens", "12", "--out", str(out)]) == 0
    short, long = load_prompts(f"{out}-120.jsonl"), load_prompts(f"{out}-200.jsonl")
    # finals: the even-numbered prompts, 2 per kind, kinds in turn; never a history prompt
    assert [p.prompt for p in long] == ["code question 0", "code question 4", "math question 2", "math question 6"]
    assert [p.category for p in long] == ["code", "code", "math", "math"]
    for suite_ in (short, long):
        histories = {json.dumps(p.messages()[:-1]) for p in suite_}
        assert len(histories) == 1  # every final follows the same history
    hist_short, hist_long = short[0].messages()[:-1], long[0].messages()[:-1]
    assert len(hist_long) > len(hist_short) >= 2 and hist_long[-len(hist_short):] == hist_short  # newest turns
    assert [m["role"] for m in hist_long] == ["user", "assistant"] * (len(hist_long) // 2)
    assert all(m["content"].startswith(("code question", "math question")) for m in hist_long[0::2])
    assert {int(m["content"].split()[-1]) % 2 for m in hist_long[0::2]} == {1}  # odd-numbered prompts
    for limit, suite_ in ((120, short), (200, long)):
        first = suite_[0].messages()
        assert len(encode_prompt(first, engine.tokenizer, engine.vocab_size)) <= limit
        one_more = long[0].messages()[:-1][-(len(first) + 1):]  # a turn more, where the history has one
        if len(one_more) > len(first) - 1:
            assert len(encode_prompt(one_more + first[-1:], engine.tokenizer, engine.vocab_size)) > limit


def test_bad_lengths_are_refused(capsys):
    for bad in ("0", "a,b", ","):
        with pytest.raises(SystemExit):
            long_chats.parse_args(["--suite", "x", "--out", "y", "--lengths", bad])
        assert "--lengths" in capsys.readouterr().err
