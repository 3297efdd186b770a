"""Compare two heads measured on one suite by scripts/eval_eagle.py --json, prompt by prompt.

    python scripts/eval_eagle.py --suite public-eval.jsonl --prompts 96 --max-tokens 48 --json a.json
    python scripts/eval_eagle.py --suite public-eval.jsonl --prompts 96 --max-tokens 48 --head NEW --json b.json
    python scripts/compare_eagle.py a.json b.json

Greedy outputs are the target's whatever the head, so both runs decode the same tokens and each
prompt is a pair. The difference of each pooled rate (b - a) gets a 95 % bootstrap interval that
resamples prompts on both sides at once (mlxspec.bench.interval.paired_difference_interval):
far narrower than comparing the two runs' own intervals, since a prompt that is easy for one
head is easy for the other.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlxspec.bench.interval import paired_difference_interval  # noqa: E402

# One prompt's row, as eval_eagle.py --json writes it
ROW_KEYS = ("kind", "drafted", "accepted", "reached", "step_acc", "tokens", "passes", "t_drafted", "t_accepted",
            "overlap_sum", "overlap_n", "positions", "top1")
# figure: (numerator, denominator) of one prompt's row (eval_eagle.py's intervals read the same)
FIGURES = {
    "judged acceptance": lambda r: (sum(r["step_acc"]), sum(r["reached"])),
    "tokens per pass": lambda r: (r["tokens"], r["passes"]),
    "acceptance": lambda r: (r["accepted"], r["drafted"]),
    "first step top-1": lambda r: (r["top1"], r["positions"]),
    "T sampled acceptance": lambda r: (r["t_accepted"], r["t_drafted"]),
    "T first step sum min(p, q)": lambda r: (r["overlap_sum"], r["overlap_n"]),
}
MATCH = ("suite", "prompts", "max_tokens", "k", "lookup", "temperature")


def load(path: str) -> dict:
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SystemExit(f"{path}: no such file; write it with scripts/eval_eagle.py --json {path}")
    except json.JSONDecodeError as e:
        raise SystemExit(f"{path}: not eval_eagle.py's JSON ({e})")
    if "rows" not in doc:
        raise SystemExit(f"{path}: no per-prompt rows; rerun scripts/eval_eagle.py with --json (it writes them now)")
    return doc


def compare(a: dict, b: dict) -> dict:
    """{figure: {"a", "b", "difference", "interval"}} overall and {kind: {...}} per kind."""
    differ = [key for key in MATCH if a.get(key) != b.get(key)]
    if differ:
        raise ValueError("the two runs measured different things: "
                         + ", ".join(f"{key} {a.get(key)!r} against {b.get(key)!r}" for key in differ))
    if [r["kind"] for r in a["rows"]] != [r["kind"] for r in b["rows"]]:
        raise ValueError("the two runs' prompts differ in order or kind")
    # Greedy outputs are the target's whatever the head: a different length means another target
    # or another engine precision, and the prompts are no longer pairs.
    apart = [i for i, (x, y) in enumerate(zip(a["rows"], b["rows"])) if x["tokens"] != y["tokens"]]
    if apart:
        raise ValueError(f"the greedy outputs differ in length on {len(apart)} prompt(s), the first #{apart[0] + 1}: "
                         "were both runs of the same target, in the same precision?")

    def table(ra, rb):
        out = {}
        for name, f in FIGURES.items():
            pa, pb = [f(r) for r in ra], [f(r) for r in rb]
            sa, sb = sum(p[1] for p in pa), sum(p[1] for p in pb)
            if not sa or not sb:
                continue
            va, vb = sum(p[0] for p in pa) / sa, sum(p[0] for p in pb) / sb
            out[name] = {"a": va, "b": vb, "difference": vb - va, "interval": paired_difference_interval(pa, pb)}
        return out

    kinds = sorted({r["kind"] for r in a["rows"]})
    return {"all": table(a["rows"], b["rows"]),
            "per_kind": {k: table([r for r in a["rows"] if r["kind"] == k], [r for r in b["rows"] if r["kind"] == k])
                         for k in kinds}}


def show(res: dict, a_name: str, b_name: str) -> None:
    def lines(t, indent=""):
        for name, v in t.items():
            iv = v["interval"]
            span = f"95 % {iv[0]:+.3f} to {iv[1]:+.3f}" if iv else "one prompt: no interval"
            print(f"{indent}{name:28s} {v['a']:.3f} -> {v['b']:.3f}  {v['difference']:+.3f}  ({span})")

    print(f"a = {a_name}\nb = {b_name}")
    lines(res["all"])
    for kind, t in res["per_kind"].items():
        print(f"{kind}:")
        lines({key: t[key] for key in ("judged acceptance", "tokens per pass") if key in t}, "  ")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", help="eval_eagle.py --json of the first head (the baseline)")
    p.add_argument("b", help="eval_eagle.py --json of the second head, same suite and settings")
    p.add_argument("--json", help="write the comparison here")
    args = p.parse_args(argv)
    try:
        res = compare(load(args.a), load(args.b))
    except ValueError as e:
        raise SystemExit(f"compare_eagle: {e}")
    show(res, args.a, args.b)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
