"""Does the bench measure what a user gets? Bench-reported vs bare speculative tokens/s.

    python scripts/bench_overhead.py [--pair demo] [--repeats 3]

For each prompt, alternately: (a) the bench runner's speculative run (reported tokens/s),
(b) the same generation called directly on the engine, timed with a wall clock around
`engine.generate` minus its prompt processing. Both start from a reset cache, both at
auto k with the pair's default drafter. Prints the median of each and their ratio; the
bench should be within 5% of bare.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _tiny_pair import load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default=None, help="a pair name (default: the tiny pair built in code)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from mlxspec.bench.prompts import builtin_suite, select
    from mlxspec.bench.runner import run_bench
    from mlxspec.prompts import encode_prompt

    name, engine = load(args.pair)
    prompts = select(builtin_suite(), full=False, limit=args.limit)
    kw = dict(max_tokens=args.max_tokens, temperature=0.0, seed=0, num_draft="auto")
    run_bench(engine, prompts[:1], max_tokens=8, peer=False)  # warm-up
    bench_tps, bare_tps = [], []
    for _ in range(args.repeats):
        for p in prompts:
            res = run_bench(engine, [p], max_tokens=args.max_tokens, peer=False, warmup=False)
            bench_tps += [r.tokens_per_second for r in res.runs if r.mode == "speculative"]
            ids = encode_prompt(p.messages(), engine.tokenizer, engine.vocab_size)
            engine.reset()
            t0 = time.perf_counter()
            out = engine.generate(ids, **kw)
            wall = time.perf_counter() - t0 - out.stats.prompt_seconds
            bare_tps.append(len(out.tokens) / wall)
    b, r = statistics.median(bench_tps), statistics.median(bare_tps)
    print(f"{name}: {len(prompts)} prompts x {args.repeats} repeats x {args.max_tokens} tokens, "
          f"{engine.default_drafter} auto k")
    print(f"  bench-reported speculative tok/s (median): {b:8.1f}")
    print(f"  bare engine.generate tok/s (median):       {r:8.1f}")
    print(f"  bench / bare: {b / r:.3f} ({'within' if abs(b / r - 1) <= 0.05 else 'OUTSIDE'} 5%)")


if __name__ == "__main__":
    main()
