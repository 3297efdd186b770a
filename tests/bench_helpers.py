"""Tiny engines and a fake target for the bench and calibration tests (no downloads)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from tiny import make_llama, make_tokenizer

from mlxspec.bench.prompts import BenchPrompt
from mlxspec.engine import Engine

PROMPTS = [
    BenchPrompt("p-chat", "chat", "Say hello."),
    BenchPrompt("p-edit", "code-edit", "Repeat: def f(x): return x + 1"),
]


def bench_cli_json(monkeypatch, tmp_path, *argv, engine=None) -> dict:
    """`mlxspec bench ARGV --json` on a tiny engine (no loading, a fresh MLXSPEC_HOME): its JSON."""
    import json

    from mlxspec import cli
    from mlxspec.commands import modelargs

    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path / "home"))
    eng = engine or tiny_engine()
    monkeypatch.setattr(modelargs, "load_engine", lambda args, **kw: eng)
    out = tmp_path / "bench.json"
    assert cli.main(["bench", *argv, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def tiny_engine(*, draft: bool = True) -> Engine:
    """A 2-layer llama target; the draft (when asked) is a 1-layer llama on the same tokenizer."""
    target = make_llama(0, layers=2, hidden=64)
    d = make_llama(1, layers=1, hidden=32, heads=2, kv_heads=1) if draft else None
    return Engine(target, make_tokenizer(), d)


class FakeTarget(nn.Module):
    """A 'model' whose next-token logits are chosen by the test: logits[len(ids)] -> (V,) list.

    Positions not in the table get all-zero logits. Records every id sequence it was called on.
    It has no parameters, so its working dtype is float32.
    """

    def __init__(self, vocab: int, table: dict):
        super().__init__()
        self.vocab, self.table, self.calls = vocab, table, []

    def __call__(self, ids, cache=None):
        seq = ids[0].tolist()
        self.calls.append(seq)
        rows = [self.table.get(i + 1, [0.0] * self.vocab) for i in range(len(seq))]
        return mx.array(rows, dtype=mx.float32)[None]
