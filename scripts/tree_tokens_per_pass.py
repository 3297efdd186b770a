"""Tokens per target pass, chain vs tree, as if rows of a pass were free (a GPU's flat V(j)).

    python scripts/tree_tokens_per_pass.py [--drafter eagle] [--chain 4] [--caps 8,16] [--prompts 6]
    python scripts/tree_tokens_per_pass.py --suite bench --prompts 24 --caps 8 --lookup on,off
    python scripts/tree_tokens_per_pass.py --prompts 12 --caps 8 --shapes static,read
    python scripts/tree_tokens_per_pass.py --suite bench --prompts 24 --caps 8 --temperature 0.7

On a CPU the cost model rightly keeps chains (a pass over 9 rows costs ~4x one), so
`mlxspec bench --tree auto,off` cannot show what trees would do on a GPU. This script makes
the target curve flat (every pass costs the same) and the chain a fixed length, then decodes
the held-out training prompts (or --suite) greedily with trees off and with each node cap,
and with a model drafter's lookup companion on and/or off (`--lookup`), and its fixed-shape
or read trees (`--shapes`). Tokens per target pass depend only on the drafts and the
target's tokens, not on the device, so they carry over; multiply by V(chain + 1) / V(nodes + 1)
measured on the device for its speedup.
Greedy output is checked against plain decoding; a difference is judged as the bench judges
it (a rounding divergence at a near-tie, or a bug: then the script exits with status 1).
With --temperature, prompt i is sampled with seed i and checked against plain decoding's
sample with that seed the same way (the race makes them the same tokens); a model drafter's
trees are then fixed-shape ones (its race winners and their runners-up), whatever --shapes says.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT)]
from mlxspec.training.draft_prompts import SUITE_HELP, chat_ids, eval_suite  # noqa: E402
from mlxspec.training.train_common import run_main  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", default="demo", help="models.toml pair (default: demo)")
    p.add_argument("--drafter", default="eagle", choices=["eagle", "model", "ngram"], help="default: eagle")
    p.add_argument("--chain", type=int, default=4, help="longest chain (default 4)")
    p.add_argument("--caps", default="8,16", help="tree node caps to compare with chains (default 8,16)")
    p.add_argument("--prompts", type=int, default=6, help="prompts of the suite (default 6)")
    p.add_argument("--suite", default="held-out", metavar="held-out|bench|FILE.jsonl", help=SUITE_HELP)
    p.add_argument("--lookup", default="on", help="lookup companion: on, off, or on,off to compare (default on)")
    p.add_argument("--shapes", default="static",
                   help="a model drafter's trees: static (fixed-shape trees first, the engine's default), read "
                        "(leaves picked by probability, read on the host), or static,read to compare")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampled decoding at this temperature, prompt i with seed i, checked against plain "
                        "decoding with the same seed (default 0: greedy)")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    import mlxspec
    from mlxspec.commands.argtypes import on_off
    from mlxspec.commands.bench import comma_list

    try:
        lookups = comma_list(on_off)(args.lookup)  # as `mlxspec bench --lookup` reads it
    except argparse.ArgumentTypeError as e:
        p.error(f"--lookup: {e}")
    shapes = [x.strip() for x in args.shapes.split(",") if x.strip()]
    if not shapes or set(shapes) - {"static", "read"}:
        p.error(f"--shapes {args.shapes!r}: a comma list of static and read")
    from mlxspec import loop
    from mlxspec.bench.neartie import check_greedy

    engine = mlxspec.load(args.pair, drafter=args.drafter)
    engine.curve.verify_seconds = lambda j: 1.0  # flat: every node pays for its row
    engine.curve.plain_seconds = lambda: 1.0
    for cost in engine.costs.values():  # and drafting free: the figures depend only on the drafts.
        # Pinned, not observed once: the rounds' own timings would replace an observation, and on
        # a busy machine (a head step timed at 0.2 s beside a training run) they shortened the chains.
        cost.draft_seconds = cost.read_seconds = cost.static_seconds = lambda: 0.0
    engine.costs[args.drafter].k_max = engine.costs["ngram"].k_max = args.chain
    tok = engine.tokenizer
    prompts = [chat_ids(tok, ex["prompt"]) for ex in eval_suite(args.suite)[: args.prompts]]
    T = args.temperature
    sampled = {"temperature": T} if T > 0 else {}
    seed = (lambda i: {"seed": i}) if T > 0 else (lambda i: {})
    plain = [engine.generate(ids, max_tokens=args.max_tokens, speculative=False, **sampled, **seed(i)).tokens
             for i, ids in enumerate(prompts)]
    out, bugs = {}, 0
    for lk in lookups:
        # keys: the tree setting ("off", "8"), with "/lookup=on|off" when both are compared
        tag = "" if len(lookups) == 1 else f"/lookup={lk}"
        runs = [("off", "")] + [(int(c), sh) for c in args.caps.split(",") for sh in shapes]
        for tree, shape in runs:
            loop.STATIC_TREES = shape != "read"
            key = f"{tree}{'/' + shape if len(shapes) > 1 and shape else ''}{tag}"
            tokens = passes = nodes = trees = same = by_lookup = 0
            kinds = collections.Counter()  # divergences by kind: rounding, bug, unclassified
            for i, (ids, ref) in enumerate(zip(prompts, plain)):
                # Fresh caches and drafters: n-gram trees also copy earlier histories, and an earlier
                # run of the same prompt would hand them its answer.
                engine.reset()
                r = engine.generate(ids, max_tokens=args.max_tokens, tree=tree, lookup=lk == "on", **sampled, **seed(i))
                s = r.stats
                tokens, passes, nodes, trees = tokens + s.tokens, passes + s.rounds, nodes + s.drafted, trees + s.tree_rounds
                by_lookup += s.lookup_rounds
                check = check_greedy(engine.target_model, ids, ref, r.tokens, max_kv_size=engine.max_kv_size,
                                     temperature=T, seed=i if T > 0 else None)
                same += check.identical
                if not check.identical:
                    kinds[check.divergence] += 1
                bugs += not check.ok
            out[key] = row = {"tokens_per_pass": tokens / passes, "nodes_per_pass": nodes / passes,
                                         "tree_rounds": trees, "lookup_rounds": by_lookup, "passes": passes,
                                         "identical": f"{same}/{len(prompts)}", "divergences": dict(kinds)}
            chain = out[f"off{tag}"]
            print(f"tree={tree!s:4s} {shape:6s} lookup={lk:3s} tokens/pass {row['tokens_per_pass']:.2f}  nodes/pass "
                  f"{row['nodes_per_pass']:.1f}  tree rounds {trees}/{passes}  lookup rounds {by_lookup}  "
                  f"{'sampled' if T > 0 else 'greedy'} identical {row['identical']}"
                  + "".join(f", {n} {kind}" for kind, n in sorted(kinds.items()))
                  + (f"  ({row['tokens_per_pass'] / chain['tokens_per_pass']:.2f}x the chain's)" if tree != "off" else ""),
                  flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"drafter": args.drafter, "chain": args.chain, "temperature": T, **out},
                                              indent=1) + "\n")
    if bugs:
        sys.exit(f"{bugs} {'sampled' if T > 0 else 'greedy'} output(s) differ from plain decoding beyond rounding")


if __name__ == "__main__":
    run_main(main, "interrupted")
