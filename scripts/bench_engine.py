"""Engine benchmark: vanilla vs speculative tokens/s, measured side by side in one run, interleaved.

    python scripts/bench_engine.py                    # the tiny pair built in code
    python scripts/bench_engine.py --pair demo        # also the demo pair (needs its weights)

For each pair: every prompt runs vanilla, then each speculative drafter at auto k (the cost
model's choice), with caches reset between runs; printed per prompt with the chosen-k
histogram. Figures are tokens generated / seconds after prompt processing.
"""

from __future__ import annotations

import argparse
import statistics

from _tiny_pair import load


def bench_pair(name, engine, *, max_tokens: int, limit: int) -> None:
    from mlxspec.bench.prompts import builtin_suite, select
    from mlxspec.bench.runner import run_bench

    drafters = [d for d in ("ngram", "model") if d in engine.drafters]
    prompts = select(builtin_suite(), full=False, limit=limit)
    res = run_bench(engine, prompts, max_tokens=max_tokens, drafters=drafters, peer=False)
    print(f"\n== {name}: {len(prompts)} prompts x {max_tokens} tokens, auto k, greedy ==")
    print(f"{'prompt':22} {'vanilla':>8} " + " ".join(f"{d + ' tok/s':>12} {'x':>5}" for d in drafters)
          + "  chosen k (k:rounds)")
    ratios = {d: [] for d in drafters}
    for p in prompts:
        runs = {(r.mode, r.drafter): r for r in res.runs if r.prompt_id == p.id}
        van = runs[("vanilla", None)].tokens_per_second
        cells, hists = [], []
        for d in drafters:
            r = runs[("speculative", d)]
            ratios[d].append(r.tokens_per_second / van)
            cells.append(f"{r.tokens_per_second:12.1f} {r.tokens_per_second / van:5.2f}")
            hists.append(f"{d}[" + " ".join(f"{k}:{v}" for k, v in r.k_histogram.items()) + "]")
        print(f"{p.id:22} {van:8.1f} " + " ".join(cells) + "  " + " ".join(hists))
    med = {d: statistics.median(v) for d, v in ratios.items()}
    bad = sum(1 for r in res.runs if r.matches_vanilla is False)
    print("median speedup: " + ", ".join(f"{d} {m:.2f}x" for d, m in med.items())
          + f"; greedy mismatches: {bad}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", action="append", default=[], help="also bench this pair (repeatable), e.g. demo")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--limit", type=int, default=6)
    args = ap.parse_args()
    for pair in [None, *args.pair]:
        try:
            name, engine = load(pair)
        except Exception as e:  # the demo pair may be unavailable (no loader or weights): say so, go on
            print(f"\n== {pair}: skipped ({type(e).__name__}: {e})")
            continue
        bench_pair(name, engine, max_tokens=args.max_tokens, limit=args.limit)


if __name__ == "__main__":
    main()
