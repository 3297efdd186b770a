"""Several passes of the bench suite in one process: does speculation keep paying after the first?

    python scripts/bench_passes.py --pair demo --passes 2 --drafter ngram,model [--limit N] [--json out.json]

The engine warms up once (`Engine.warmup`), then each pass runs every setting on every prompt,
interleaved, as `mlxspec bench` does. Printed per pass: each drafter's median speedup over
plain decoding by category (per-prompt ratios), acceptance, tokens per target pass, and the
greedy check. A cost model that locked itself out after the first pass (the bug this guards
against) shows as ~1.00x and 1.00 tokens per pass in pass 2.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def summarise(result) -> dict:
    """{drafter: {category: {speedup, accept, tokens_per_pass}}} plus mismatches, from one pass."""
    runs = result.runs
    vanilla = {(r.prompt_id, r.temperature): r for r in runs if r.mode == "vanilla"}
    cells = defaultdict(lambda: defaultdict(list))
    mismatches = defaultdict(int)
    for r in runs:
        if r.mode != "speculative":
            continue
        v = vanilla[(r.prompt_id, r.temperature)]
        label = f"{r.drafter} k={r.num_draft}"
        cells[label][r.category].append((r.tokens_per_second / v.tokens_per_second, r.acceptance_rate,
                                         r.tokens_per_target_pass))
        cells[label]["ALL"].append(cells[label][r.category][-1])
        mismatches[label] += r.matches_vanilla is False
    out = {}
    for label, cats in cells.items():
        out[label] = {c: {"speedup": statistics.median(x[0] for x in v), "accept": statistics.median(x[1] for x in v),
                          "tokens_per_pass": statistics.median(x[2] for x in v), "prompts": len(v)}
                      for c, v in cats.items()}
        out[label]["mismatches"] = mismatches[label]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="demo")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--drafter", default="ngram,model")
    ap.add_argument("--limit", type=int, default=None, help="prompts per pass (default: the full suite)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import mlxspec
    from mlxspec.bench.prompts import builtin_suite, select
    from mlxspec.bench.runner import run_bench
    from mlxspec.device import describe

    engine = mlxspec.load(args.pair)
    t = time.perf_counter()
    warm = engine.warmup()
    print(f"device: {describe()}  warm-up {time.perf_counter() - t:.1f} s; V(j) ms: "
          + " ".join(f"{j}:{1e3 * s:.2f}" for j, s in sorted(warm["curve"].items())), flush=True)
    prompts = select(builtin_suite(), full=args.limit is None, limit=args.limit)
    drafters = [d for d in args.drafter.split(",") if d]
    doc = {"device": describe(), "passes": []}
    for i in range(args.passes):
        t = time.perf_counter()
        result = run_bench(engine, prompts, max_tokens=args.max_tokens, drafters=drafters, peer=False, warmup=i == 0)
        s = summarise(result)
        doc["passes"].append(s)
        print(f"\npass {i + 1} ({len(prompts)} prompts x {args.max_tokens} tokens, {time.perf_counter() - t:.0f} s)")
        for label, cats in s.items():
            print(f"  {label}: greedy mismatches {cats['mismatches']}")
            for c, e in cats.items():
                if c != "mismatches":
                    print(f"    {c:<12} {e['speedup']:.2f}x  accept {e['accept']:.2f}  tok/pass {e['tokens_per_pass']:.2f}"
                          f"  ({e['prompts']} prompts)")
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
