"""The tiny pair the bench scripts use when no real pair is asked for (built in code, no downloads)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def tiny_pair():
    """A 4-layer, 256-wide random llama target and, as draft, a 1-layer 64-wide one; byte tokenizer."""
    from tiny import make_llama, make_tokenizer

    from mlxspec.engine import Engine

    target = make_llama(0, layers=4, hidden=256, heads=8, kv_heads=2)
    draft = make_llama(1, layers=1, hidden=64)
    return Engine(target, make_tokenizer(), draft, drafter="ngram")


def load(pair):
    """The tiny pair for None, else `mlxspec.load(pair)`."""
    if pair is None:
        return "tiny", tiny_pair()
    import mlxspec

    return pair, mlxspec.load(pair)


if __name__ == "__main__":  # imported, never run: say so rather than exit 0 having done nothing
    raise SystemExit("scripts/_tiny_pair.py is imported by bench_engine.py, bench_overhead.py and bench_serve.py, and is no command of its own: run one of those (--help)")
