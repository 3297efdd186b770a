"""The generation loop's own cost: host time per round, and plain decoding against mlx-lm.

    python scripts/bench_loop.py                 # free model + tiny random llamas
    python scripts/bench_loop.py --repeats 7 --tokens 256

1. A model that costs nothing (no layers; logits are one row gathered from a table, so
   the next token is a fixed function of the last) shows the loop's host time: per token
   in plain decoding (mlxspec `Engine` vs mlx-lm `generate_step`) and per round with the
   n-gram drafter on a periodic sequence it predicts perfectly (k = 4 and 8).
2. Tiny random llamas (2 and 4 layers): plain decoding through `Engine` vs `generate_step`.

Everything is interleaved (A B A B ...), warmed up, and reported as medians; the ratios
are per repeat, so slow drift hits both sides alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: F401  (first: it picks MLX's CPU BLAS before mlx.core binds one, see mlxspec/blas.py)
import mlx.core as mx  # noqa: E402

V = 256
PERIOD = 97  # the free model's text: t -> (t + 1) % PERIOD, so n-gram drafts are always right


class FreeModel:
    """An mlx-lm-shaped model with no layers: logits = table[token], next token (t + 1) % PERIOD."""

    layers: list = []

    def __init__(self):
        nxt = (mx.arange(V) + 1) % PERIOD
        self.table = mx.where(mx.arange(V)[None, :] == nxt[:, None], 10.0, 0.0).astype(mx.float32)
        mx.eval(self.table)
        self.args = type("Args", (), {"vocab_size": V, "max_position_embeddings": 1 << 20})()

    def __call__(self, inputs, cache=None, **kw):
        return self.table[inputs]

    def parameters(self):
        return {"table": self.table}

    def make_cache(self):
        return []


def time_engine(engine, prompt, n, **kw):
    """(seconds inside the loop, rounds, host CPU seconds of this thread) of one generation of n tokens."""
    c0 = time.thread_time()
    r = engine.generate(prompt, max_tokens=n, **kw)
    cpu = time.thread_time() - c0
    assert len(r.tokens) == n, (len(r.tokens), n)
    return r.stats.seconds, r.stats.rounds, cpu


def time_generate_step(model, prompt, n):
    """(seconds for tokens 2..n, n - 1, host CPU seconds of this thread) of mlx-lm's plain decoding."""
    from mlx_lm.generate import generate_step

    gen = generate_step(mx.array(prompt), model, max_tokens=n)
    next(gen)  # the first token comes out of prompt processing, as the engine's prompt time
    t0, c0 = time.perf_counter(), time.thread_time()
    for _ in gen:
        pass
    return time.perf_counter() - t0, n - 1, time.thread_time() - c0


def interleave(fns, repeats):
    """Run each fn once per repeat, in turn; returns {name: [result, ...]}."""
    out = {name: [] for name in fns}
    for name, fn in fns.items():  # warm-up
        fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            out[name].append(fn())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    import tiny

    from mlxspec.engine import Engine

    n = args.tokens
    free = FreeModel()
    prompt = list(range(10, 40))
    eng = Engine(free, None, drafter="ngram")
    res = interleave({
        "engine plain": lambda: time_engine(eng, prompt, n, speculative=False),
        "generate_step": lambda: time_generate_step(free, prompt, n),
        "ngram k=4": lambda: time_engine(eng, prompt, n, num_draft=4),
        "ngram k=8": lambda: time_engine(eng, prompt, n, num_draft=8),
    }, args.repeats)
    print(f"free model (no device work), {n} tokens, {args.repeats} repeats, MLX {mx.__version__} "
          f"on {mx.default_device()}")
    print(f"  {'':14} {'wall us/round':>14} {'wall us/token':>14} {'host CPU us/round':>18}")
    for name, rows in res.items():
        per_round = statistics.median(s / r for s, r, _ in rows)
        per_tok = statistics.median(s / r for s, r, _ in rows) if name == "generate_step" else \
            statistics.median(s / n for s, _, _ in rows)
        cpu = statistics.median(c / r for _, r, c in rows)
        print(f"  {name:14} {per_round * 1e6:14.1f} {per_tok * 1e6:14.1f} {cpu * 1e6:18.1f}")
    ratio = statistics.median((g[0] / g[1]) / (e[0] / n) for e, g in zip(res["engine plain"], res["generate_step"]))
    print(f"  plain Engine / generate_step tokens/s: {ratio:.3f}")

    for layers, hidden in ((2, 64), (4, 256)):
        model = tiny.make_llama(0, layers=layers, hidden=hidden, heads=8 if hidden > 64 else 4)
        eng = Engine(model, None, drafter="none")
        res = interleave({
            "engine": lambda: time_engine(eng, prompt, n, speculative=False)[0] / n,
            "generate_step": lambda: time_generate_step(model, prompt, n)[0] / (n - 1),
        }, args.repeats)
        ratios = [g / e for e, g in zip(res["engine"], res["generate_step"])]
        print(f"tiny llama L{layers} H{hidden}: Engine {1 / statistics.median(res['engine']):8.1f} tok/s, "
              f"generate_step {1 / statistics.median(res['generate_step']):8.1f} tok/s, "
              f"ratio {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")


if __name__ == "__main__":
    main()
