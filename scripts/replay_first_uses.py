"""Engines not warmed up, on a virtual H100 clock: the cost model with and without doubting first uses.

    python scripts/replay_first_uses.py                    # the bench suite, 24 prompts x 64 tokens, 2 passes
    python scripts/replay_first_uses.py --suite code-edit  # code edits predicted by their own answers, 160 tokens
    python scripts/replay_first_uses.py --first-use 3      # each length's first pass 3x its cost

The real target runs on this machine, but the loop's clock (`loop.time`, `warmup.time`) is
virtual: each pass charges what the demo target's rounds cost on an H100 (a pipelined plain step
of 6.15 ms; rounds of 2 and 3 tokens 1.10x and 1.18x of it, 4 or more 1.6x plus 0.02x a token),
and each length's first pass `--first-use` times that, as a GPU compiling its kernels. Two
engines run the same requests interleaved, n-gram drafting, neither warmed: one whose curve
doubts a length timed only at its first use (`TargetCurve.first_use_compiles`, as on a GPU), one
that takes it at its word (as before it did). Prints each one's median speed against plain
decoding and tokens per target pass, and the passes' costs as each priced them at the end
against their true costs. Every answer is checked against plain decoding's.

A model of an H100, not a measurement: the drafts and their acceptance are real, the time is not.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import types
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlxspec import loop, warmup  # noqa: E402

PLAIN = 6.15e-3  # the H100's pipelined plain step for the demo target, seconds
BLOCK = re.compile(r"```[a-z]*\n(.*?)```", re.S)


def cost(n: int) -> float:
    """A pass of n tokens (a prompt's chunk for n > 16), in seconds."""
    ratio = 1.0 if n == 1 else 1.10 if n == 2 else 1.18 if n == 3 else 1.6 + 0.02 * (min(n, 16) - 4)
    return PLAIN * (ratio + 0.05 * max(0, n - 16))


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class H100Passes:
    """The target's model, each pass charging `cost` to `clock` (`first_use` times it at a length's first)."""

    def __init__(self, model, clock: Clock, first_use: float):
        self.model, self.clock, self.first_use, self.seen = model, clock, first_use, set()

    def __call__(self, inputs, cache=None, **kw):
        out = self.model(inputs, cache=cache, **kw)
        n = inputs.shape[1]
        self.clock.t += cost(n) * (self.first_use if n not in self.seen else 1.0)
        self.seen.add(n)
        return out

    def __getattr__(self, name):
        return getattr(self.model, name)


def replay(make_engine: Callable, jobs: List[Tuple[object, Optional[str], List[int], int]], reps: int,
           first_use: float) -> Dict[bool, dict]:
    """Runs `jobs` (prompt, prediction, plain decoding's tokens, max_tokens) `reps` times on two fresh
    engines, without and with doubting first uses, interleaved. Returns per setting the
    per-request speeds against plain decoding (virtual), tokens per pass, {j: (priced, timed, true)}
    for every length the loop timed, and the lengths still unsure (timed only at their first use)."""
    clock = Clock()
    fake = types.SimpleNamespace(perf_counter=clock)
    saved = loop.time, warmup.time
    loop.time = warmup.time = fake
    try:
        engines = {}
        for doubt in (False, True):
            e = make_engine()
            e.target.model = H100Passes(e.target.model, clock, first_use)
            e.curve.first_use_compiles = doubt
            engines[doubt] = e
        out = {doubt: {"speed": [], "tokens_per_pass": []} for doubt in engines}
        for rep in range(reps):
            for i, (prompt, prediction, plain, max_tokens) in enumerate(jobs):
                for doubt in (False, True) if (rep + i) % 2 == 0 else (True, False):
                    t0 = clock.t
                    r = engines[doubt].generate(prompt, max_tokens=max_tokens, prediction=prediction)
                    if r.tokens != plain:
                        raise AssertionError(f"an answer differs from plain decoding's (job {i}, pass {rep})")
                    out[doubt]["speed"].append(len(r.tokens) * PLAIN / (clock.t - t0))
                    out[doubt]["tokens_per_pass"].append(r.stats.tokens / r.stats.rounds)
        for doubt, e in engines.items():
            curve = e.curve
            # (priced, timed, true) seconds: an unsure length is priced below its timing where others say so
            out[doubt]["curve"] = {j: (curve.verify_seconds(j), t * curve.pace, cost(j))
                                   for j, t in sorted(curve.measured().items())}
            out[doubt]["unsure"] = {j for j in curve.measured() if curve.unsure(j)}
        return out
    finally:
        loop.time, warmup.time = saved


def demo_jobs(suite: str, max_tokens: Optional[int]) -> Tuple[Callable, list]:
    import mlxspec
    from mlxspec.bench.prompts import builtin_suite

    ref = mlxspec.load("demo")
    jobs = []
    for p in builtin_suite():
        if suite == "code-edit" and p.category != "code-edit":
            continue
        n = max_tokens or (160 if suite == "code-edit" else 64)
        plain = ref.generate(p.messages(), max_tokens=n, speculative=False)
        jobs.append((p.messages(), plain.text if suite == "code-edit" else None, plain.tokens, n))
    return (lambda: mlxspec.load("demo", drafter="ngram")), jobs


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", choices=("bench", "code-edit"), default="bench",
                    help="the bench suite's prompts, or its code edits predicted by their own answers")
    ap.add_argument("--reps", type=int, default=2, help="passes over the prompts (default 2)")
    ap.add_argument("--max-tokens", type=int, help="tokens per answer (default 64; 160 for code edits)")
    ap.add_argument("--first-use", type=float, default=1.8,
                    help="a length's first pass against its cost (default 1.8, as V(5) on an H100)")
    args = ap.parse_args(argv)
    if args.reps < 1 or args.first_use < 1 or (args.max_tokens is not None and args.max_tokens < 1):
        ap.error("--reps and --max-tokens must be >= 1, --first-use >= 1 (a first pass is never faster)")
    make, jobs = demo_jobs(args.suite, args.max_tokens)
    out = replay(make, jobs, args.reps, args.first_use)
    for doubt, name in ((False, "first uses taken at their word"), (True, "first uses doubted (as on a GPU now)")):
        r = out[doubt]
        print(f"{name}: {statistics.median(r['speed']):.2f}x plain decoding (median of {len(r['speed'])}), "
              f"{statistics.median(r['tokens_per_pass']):.2f} tokens per pass")
        print("  V(j) priced / true, ms: " + "  ".join(f"{j}:{v * 1e3:.1f}/{t * 1e3:.1f}"
                                                        for j, (v, _, t) in r["curve"].items() if j <= 16))


if __name__ == "__main__":
    main()
