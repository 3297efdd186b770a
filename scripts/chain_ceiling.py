"""How fast could greedy chains be with this drafter, on a device's cost curve? Fixed k, an oracle, gates.

    python scripts/chain_ceiling.py --suite bench --prompts 24 --max-tokens 64 --curve h100
    python scripts/chain_ceiling.py --suite held-out --prompts 32 --curve 1,1.13,1.13,1.7 --step 0.0485
    python scripts/chain_ceiling.py --load chains.jsonl --curve flat     # re-simulate saved chains

Along each prompt's greedy answer (plain decoding), at every position the drafter drafts its
longest chain (--depth; a feature head's with the engine's copy blend, as its greedy rounds
draft) and the head's top probability at each step is kept. A greedy chain of k is the first
k tokens of the longest one, so one pass of drafting gives every policy's round exactly:
decoding is then replayed round by round, each round costing V(k + 1) + k x (a head step),
in units of a plain step, and yielding its accepted tokens plus the target's own.

Policies: every fixed k; the oracle, which drafts exactly the tokens that will be accepted
(nothing when the first would fail); hindsight, the fastest sequence of k's (at most --depth)
for each answer, by dynamic programming over its positions, which no chain policy can beat
(on a curve with steps a round may do better to stop short of what would be accepted); and
confidence gates, which read the head's drafts on the host and cut the chain where the
product of its top probabilities falls under tau, paying `--read` for the wait (the best
tau over a small grid, so an optimistic figure). Ratios are to plain decoding, the median
over prompts and over all tokens ("all").

Curves (V(j) for a pass of j rows, in plain steps): "h100" as measured on an H100 through
MLX's CUDA backend with the demo's 4-bit weights (passes of 2-3 rows 1.13, of 4 or more
1.7, a head step 0.0485), "flat" (1.13 + 0.01 per row past 2), "cpu" (1 + 0.125 per row
past 1, a head step 0.06: this 2-core x86 CPU with OpenBLAS in float32), or values for
j = 1, 2, ... (the last repeats), also as the "verify cost V(j)/V(1)" line `mlxspec bench`
prints for your device. `--check N` also decodes the first N prompts through the
engine at a fixed k = --check-k and compares its tokens per pass with the replay's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT)]
from mlxspec.training.train_common import non_negative_float, non_negative_int, positive_int, run_main  # noqa: E402

CURVES = {"h100": ([1.0, 1.13, 1.13, 1.7], 0.0485), "flat": ([1.0] + [1.13 + 0.01 * i for i in range(16)], 0.0485),
          "cpu": ([1.0 + 0.125 * i for i in range(17)], 0.06)}
TAUS = (0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5)

Record = Dict  # one draft start: "chain" (drafted ids), "p" (head's top probability per step), "truth"
Policy = Callable[[Record], Tuple[int, bool]]  # -> (k, whether the host read the drafts first)


def accepted(rec: Record, k: int) -> int:
    """How many of the first k drafted tokens greedy verification accepts."""
    n = 0
    for a, b in zip(rec["chain"][:k], rec["truth"]):
        if a != b:
            break
        n += 1
    return n


def pass_cost(curve: Sequence[float], rows: int) -> float:
    """V(rows) in plain steps; rows past the curve's end cost its last value."""
    return curve[min(rows, len(curve)) - 1]


def walk(recs: Sequence[Record], policy: Policy, curve: Sequence[float], step: float,
         read: float = 0.0) -> Tuple[int, float, int, int, int]:
    """Decode one answer round by round under `policy`: (tokens, cost, passes, judged drafts, accepted)."""
    j, tokens, cost, passes, judged, hits = 0, 0, 0.0, 0, 0, 0
    while j < len(recs):
        k, reads = policy(recs[j])
        k = min(k, len(recs) - j - 1, len(recs[j]["chain"]))  # the last token is the target's own
        n = accepted(recs[j], k)
        cost += pass_cost(curve, k + 1) + (k * step + (read if reads else 0.0) if k else 0.0)
        tokens, j, passes = tokens + n + 1, j + n + 1, passes + 1
        judged, hits = judged + min(n + 1, k), hits + n
    return tokens, cost, passes, judged, hits


def figures(walks: Sequence[Tuple[int, float, int, int, int]]) -> Dict:
    """{"median": median over answers of tokens per cost, "all": over all tokens,
    "tokens_per_pass", "per_token": accepted / judged drafts (a chain's drafts up to and including
    its first rejection: EAGLE's alpha)}."""
    tokens, cost, passes, judged, hits = (sum(w[i] for w in walks) for i in range(5))
    return {"median": statistics.median(w[0] / w[1] for w in walks), "all": tokens / cost,
            "tokens_per_pass": tokens / max(passes, 1), "per_token": hits / judged if judged else 0.0}


def replay(answers: Sequence[Sequence[Record]], policy: Policy, curve: Sequence[float], step: float,
           read: float = 0.0) -> Dict:
    """Every answer decoded under `policy` (`walk`); costs in plain steps; `figures` of them all."""
    return figures([walk(recs, policy, curve, step, read) for recs in answers])


def hindsight(answers: Sequence[Sequence[Record]], curve: Sequence[float], step: float, depth: int) -> Dict:
    """The fastest choice of k (at most `depth`) at every round of every answer, knowing what each
    round will accept; the same figures as `replay`."""
    walks = []
    for recs in answers:
        L = len(recs)
        least, pick = [0.0] * (L + 1), [0] * L  # least[j]: the least cost from position j to the end
        for j in range(L - 1, -1, -1):
            least[j], pick[j] = min((pass_cost(curve, k + 1) + k * step + least[j + accepted(recs[j], k) + 1], k)
                                    for k in range(min(depth, L - j - 1, len(recs[j]["chain"])) + 1))
        ks = {id(r): k for r, k in zip(recs, pick)}
        walks.append(walk(recs, lambda rec: (ks[id(rec)], False), curve, step))
    return figures(walks)


def fixed(k: int) -> Policy:
    return lambda rec: (k, False)


def oracle(rec: Record) -> Tuple[int, bool]:
    return accepted(rec, len(rec["chain"])), False


def gate(tau: float, longest: int) -> Policy:
    """At most `longest` drafts, cut where the product of the head's top probabilities falls under tau."""
    def policy(rec):
        prod, k = 1.0, 0
        for p in rec["p"][:longest]:
            prod *= p
            if prod < tau:
                break
            k += 1
        return k, True
    return policy


def parse_curve(text: str) -> Tuple[List[float], Optional[float]]:
    """A named curve (its own head step), comma-separated V(1), V(2), ..., or the line `mlxspec bench`
    prints ("1:1.00  2:1.25  3:1.40"; head step from --step)."""
    if text in CURVES:
        return CURVES[text]
    try:
        if ":" in text:
            pairs = sorted((int(j), float(v)) for j, v in (item.split(":") for item in text.replace(",", " ").split()))
            if [j for j, _ in pairs] != list(range(1, len(pairs) + 1)):
                raise ValueError("rows must run 1, 2, 3, ...")
            values = [v for _, v in pairs]
        else:
            values = [float(v) for v in text.split(",")]
    except ValueError:
        raise SystemExit(f"--curve {text!r}: use one of {', '.join(CURVES)}, numbers like 1,1.13,1.7, or "
                         f"mlxspec bench's line like '1:1.00 2:1.25 3:1.40'")
    if not values or any(v <= 0 for v in values):
        raise SystemExit(f"--curve {text!r}: every V(j) must be a positive number (or use one of {', '.join(CURVES)})")
    return values, None


def report(answers, curve, step, read, depth) -> List[str]:
    lines = [f"{'policy':34s} {'median':>7s} {'all':>7s} {'tokens/pass':>11s} {'per token':>9s}"]

    def row(name, r):
        lines.append(f"{name:34s} {r['median']:7.3f} {r['all']:7.3f} {r['tokens_per_pass']:11.2f} {r['per_token']:9.3f}")

    for k in range(depth + 1):
        row(f"fixed k = {k}", replay(answers, fixed(k), curve, step))
    row("oracle", replay(answers, oracle, curve, step))
    row("hindsight (no policy does better)", hindsight(answers, curve, step, depth))
    for r in sorted({0.0, read}):
        best = max(((replay(answers, gate(t, m), curve, step, r), t, m) for t in TAUS for m in range(1, depth + 1)),
                   key=lambda x: x[0]["all"])
        row(f"gate, read {r:g}: tau {best[1]:g}, k <= {best[2]}", best[0])
    return lines


def collect(args) -> List[dict]:
    import mlxspec
    import mlx.core as mx
    from mlxspec.training.draft_prompts import chat_ids, eval_suite
    from mlxspec.drafters import chaincopy
    from mlxspec.loading import demo

    engine = mlxspec.load(args.target or str(demo.gguf_path()), "none", drafter="eagle", head=args.head,
                          download=False, adapter_path=args.adapter_path)
    target, d = engine.target, engine.drafters["eagle"]
    out = []
    t0 = time.time()
    suite = eval_suite(args.suite, 32, 0)[: args.prompts]
    for i, ex in enumerate(suite):
        ids = chat_ids(engine.tokenizer, ex["prompt"])
        seq = ids + list(engine.generate(ids, max_tokens=args.max_tokens, num_draft=0).tokens)
        engine.reset()
        target.forward(seq[:-1])  # keeps every position's feature
        d.reset()
        d.copier.reset()
        recs = []
        for n in range(len(ids), len(seq)):  # a round after the history seq[:n]
            history = seq[:n]
            d._sync(history)
            h = d._feed(history, n - 1)
            match, copy = d.copier.copy(history, args.depth)
            following = mx.array(True)
            toks, ps = [], []
            for s in range(args.depth):  # as `EagleDrafter._draft` drafts a greedy chain, reading each step
                if s:
                    h = d.head_step(toks[-1].reshape(1, 1), h[None])[0]
                logits, _, tok = d._top(h)
                if s < len(copy):
                    tok, following = chaincopy.blend(tok, logits, copy[s], match + s, following)
                toks.append(tok.astype(mx.int32))
                ps.append(mx.exp(mx.max(logits) - mx.logsumexp(logits)))
            mx.eval(toks, ps)
            d.drafted = args.depth - 1
            recs.append({"chain": [int(t.item()) for t in toks], "p": [round(float(p.item()), 4) for p in ps],
                         "truth": seq[n : n + args.depth]})
        out.append({"kind": ex["kind"], "recs": recs})
        print(f"[{i + 1}/{args.prompts}] {ex['kind']:13s} {len(seq) - len(ids)} tokens ({time.time() - t0:.0f}s)",
              file=sys.stderr, flush=True)
    if args.check:
        check(engine, args, suite, out)
    return out


def check(engine, args, suite, answers) -> None:
    """Tokens per pass through the engine at a fixed k against the replay's, per prompt."""
    from mlxspec.training.draft_prompts import chat_ids

    for ex, a in zip(suite[: args.check], answers):
        ids = chat_ids(engine.tokenizer, ex["prompt"])
        g = engine.generate(ids, max_tokens=args.max_tokens, num_draft=args.check_k, drafter="eagle", lookup=True)
        r = replay([a["recs"]], fixed(args.check_k), [1.0], 0.0)
        print(f"check k = {args.check_k}: engine {g.stats.tokens / g.stats.rounds:.3f} tokens per pass, "
              f"replay {r['tokens_per_pass']:.3f}", file=sys.stderr)


def load(path: str) -> List[dict]:
    """Chains written by --save; a clear error for a missing or foreign file."""
    try:
        answers = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line]
        if not answers or not all(a["recs"] and all({"chain", "p", "truth"} <= set(r) for r in a["recs"])
                                  for a in answers):
            raise ValueError("no answers, or records without chain, p and truth")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"--load {path}: not chains written by --save ({e})")
    return answers


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", "--gguf", dest="target", metavar="REF", help="default: the demo GGUF in the mlxspec cache")
    p.add_argument("--head", default=str(ROOT / "mlxspec" / "data" / "smollm2-eagle"), help="default: the shipped head")
    p.add_argument("--adapter-path", metavar="PATH", default=None,
                   help="a fine-tuned adapter folder (mlx_lm.lora's) on the target, as mlxspec --adapter-path")
    from mlxspec.training.draft_prompts import SUITE_HELP

    p.add_argument("--suite", default="bench", metavar="held-out|bench|FILE.jsonl", help=SUITE_HELP)
    p.add_argument("--prompts", type=positive_int, default=24, help="prompts of the suite (default 24)")
    p.add_argument("--max-tokens", type=positive_int, default=64, help="tokens of the target's answer per prompt (default 64)")
    p.add_argument("--depth", type=positive_int, default=8, help="longest chain drafted at each position (default 8)")
    p.add_argument("--curve", default="h100", help="h100, flat, cpu, or V(1),V(2),... in plain steps (default h100)")
    p.add_argument("--step", type=non_negative_float,
                   help="a head step, in plain steps (default: the named curve's, else 0.05)")
    p.add_argument("--read", type=non_negative_float, default=0.05,
                   help="what reading the drafts first costs, in plain steps (default 0.05)")
    p.add_argument("--save", help="write the chains here (JSON lines)")
    p.add_argument("--load", help="replay chains saved by --save instead of drafting")
    p.add_argument("--check", type=non_negative_int, default=0,
                   help="decode this many prompts through the engine as a check (default 0)")
    p.add_argument("--check-k", type=positive_int, default=4, help="draft length of that check (default 4)")
    args = p.parse_args(argv)
    if args.save and not Path(args.save).resolve().parent.is_dir():  # said now, not after the drafting
        raise SystemExit(f"--save {args.save}: the folder {Path(args.save).resolve().parent} does not exist")
    curve, own_step = parse_curve(args.curve)
    step = args.step if args.step is not None else (own_step if own_step is not None else 0.05)
    if args.load:
        answers = load(args.load)
        depth = min(len(r["chain"]) for a in answers for r in a["recs"])
    else:
        answers, depth = collect(args), args.depth
        if args.save:
            Path(args.save).write_text("".join(json.dumps(a) + "\n" for a in answers), encoding="utf-8")
    shown = ", ".join(f"{v:.3g}" for v in curve[:6]) + (", ..." if len(curve) > 6 else "")
    print(f"{len(answers)} answers, {sum(len(a['recs']) for a in answers)} tokens; V(1..) = {shown} plain steps, "
          f"a head step {step:g}")
    print("\n".join(report([a["recs"] for a in answers], curve, step, args.read, depth)))


if __name__ == "__main__":
    run_main(main, "interrupted")
