"""Measure the shipped EAGLE head against the demo target, through mlxspec's own engine.

    python scripts/eval_eagle.py [--suite held-out|bench|FILE.jsonl] [--prompts 32] [--max-tokens 64] [--k 4] [--json FILE]

Greedy: the engine decodes each chat-formatted prompt with `drafter="eagle"` and a fixed
draft length k, so every round is real (the head drafts on its own predicted features, the
target verifies, both caches roll back):
    acceptance       = accepted / drafted
    judged acceptance = accepted / drafts the target judged (those after a rejection are not):
                       the per-token rate (EAGLE's alpha), also per draft step
    tokens per pass  = generated tokens / target passes
  the last two with a 95 % interval from a bootstrap over prompts (a prompt's drafts are
  not independent draws: counting them so understates the spread about 2x)
T = 0.7, exact: along each greedy output, one target pass gives p at every position and one
head pass over the target's real features gives the head's first-step q there;
    sum_x min(p, q)  = the probability that rejection sampling accepts a first draft token
                       (the engine's race accepts a little less: README, Seeds).
T = 0.7, sampled: the engine decodes at T = 0.7 with the same k; accepted / drafted there
(the race's matches) includes the later, harder draft steps.
Greedy first step, teacher-forced, from the same head pass: how often the head's top token
(top 5) is the target's, how many of the target's tokens its draft vocabulary holds, and how
often its top token would be right with the target's whole vocabulary instead.
Step times (median, one token after a prompt, the engine's precision): a target step, and a
head step (embedding + fc + decoder layer + norm + draft-vocabulary logits + argmax).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import mlxspec  # noqa: F401  (first: it picks MLX's CPU BLAS before mlx.core binds one, see mlxspec/blas.py)
import mlx.core as mx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT)]
from mlxspec.training.draft_prompts import SUITE_HELP, chat_ids, eval_suite  # noqa: E402
from mlxspec.training.train_common import non_negative_int, positive_float, positive_int, run_main, unwritable_folder  # noqa: E402
from mlxspec.bench.interval import ratio_interval  # noqa: E402
from compare_eagle import FIGURES, ROW_KEYS  # noqa: E402  (what a prompt's row holds, and each figure from it)
from mlxspec.loading import demo  # noqa: E402
from mlxspec.sampling import SamplingParams, probabilities  # noqa: E402

HEAD = ROOT / "mlxspec" / "data" / "smollm2-eagle"


def first_step_overlap(engine, ids, out, temperature: float, count=None):
    """sum_x min(p, q) at every output position, q = the head's first draft step on real features.
    `count`: called with the head's rows, row i predicting out[i] (greedy agreement, `Agreement`)."""
    seq = ids + out
    engine.reset()
    target, drafter = engine.target, engine.drafters["eagle"]
    logits = target.forward(seq[:-1])  # (n-1, V): row t predicts seq[t+1]
    feats = drafter.head.lift(target.hidden_since(0))  # (n-1, H): real entries' features
    h = drafter.teacher_forced(mx.array(seq[1:], dtype=mx.uint32), feats)  # row j predicts f[j+1]
    params = SamplingParams(temperature)
    start = len(ids) - 1  # row of the first output token
    p = probabilities(logits[start:], params)  # rows predicting out[0..]
    # The head's row j-1 predicts f[j], whose logits predict seq[j+1]: align with target row j.
    rows = h[start - 1 : -1]
    q = probabilities(drafter._full(drafter.logits(rows).astype(mx.float32)), params)
    if count is not None:  # with the target's own top probability (T = 1) at each row
        count(rows, mx.max(mx.softmax(logits[start:].astype(mx.float32), axis=-1), axis=-1))
    engine.reset()
    return mx.sum(mx.minimum(p, q), axis=-1).tolist()


def steps(counts: list, k: int) -> list:
    """A stats list by draft step (as long as the longest round judged), padded to k."""
    return list(counts) + [0] * (k - len(counts))


CONFIDENCE = (0.3, 0.5, 0.7, 0.9)  # bucket edges of the target's top probability


def confidence_bucket(p: float) -> str:
    """'a-b': the bucket of CONFIDENCE's edges that holds p (0-0.3, ..., 0.9-1)."""
    edges = (0.0, *CONFIDENCE, 1.0)
    i = sum(p >= e for e in CONFIDENCE)
    return f"{edges[i]:g}-{edges[i + 1]:g}"


class Agreement:
    """Greedy first-step agreement along outputs: the target's whole output matrix and the draft
    vocabulary are read once, then each prompt's head rows are counted, also by how sure the
    target was (its top probability), which shows where the head's misses are."""

    def __init__(self, drafter):
        from mlxspec.backbone import output_rows

        self.drafter = drafter
        self.whole = output_rows(drafter.target.model, mx.arange(drafter.vocab))
        self.vocab = set(drafter.draft_ids.tolist()) if drafter.draft_ids is not None else None

    def count(self, rows, out, sure=None) -> dict:
        """Row i of `rows` predicts out[i] (the first, out[0], follows the prompt: skipped);
        `sure[i]`: the target's top probability there."""
        d = self.drafter
        top5 = mx.argsort(-d.logits(rows[1:]).astype(mx.float32), axis=-1)[:, :5]
        if d.draft_ids is not None:
            top5 = mx.take(d.draft_ids, top5)
        full = mx.argmax(rows[1:] @ self.whole.T, axis=-1)
        c = dict.fromkeys(("positions", "top1", "top5", "in_vocab", "top1_full"), 0)
        c["by_confidence"] = {}
        sure = sure[1:].tolist() if sure is not None else [None] * (len(out) - 1)
        for t, five, f, p in zip(out[1:], top5.tolist(), full.tolist(), sure):
            c["positions"] += 1
            c["top1"] += five[0] == t
            if p is not None:
                b = c["by_confidence"].setdefault(confidence_bucket(p), [0, 0])
                b[0] += 1
                b[1] += five[0] == t
            c["top5"] += t in five
            c["in_vocab"] += self.vocab is None or t in self.vocab
            c["top1_full"] += f == t
        return c


def by_confidence(rows) -> dict:
    """Prompts' `Agreement.count` buckets merged: {bucket: {"share": of the positions, "top1": the
    head's agreement there}}."""
    merged = {}
    for r in rows:
        for b, (n, hit) in r["by_confidence"].items():
            m = merged.setdefault(b, [0, 0])
            m[0] += n
            m[1] += hit
    n = max(sum(m[0] for m in merged.values()), 1)
    return {b: {"share": m[0] / n, "top1": m[1] / max(m[0], 1)} for b, m in sorted(merged.items())}


def step_times(engine, ids, reps: int):
    """(target step, head step) medians in seconds, one token after `ids`."""
    target, drafter = engine.target, engine.drafters["eagle"]
    engine.reset()
    target.prefill(ids[:-1])
    drafter.prefill(ids)
    tt, th = [], []
    for i in range(reps + 2):
        t0 = time.perf_counter()
        mx.eval(target.forward([ids[-1]]))
        tt.append(time.perf_counter() - t0)
        target.rollback(1)
        d = drafter.propose(ids, 1, SamplingParams(), 0)
        mx.eval(d.tokens)
        f = mx.zeros((1, 1, drafter.out_weight.shape[1]), dtype=drafter.out_weight.dtype)
        t0 = time.perf_counter()
        h = drafter.head_step(d.tokens.reshape(1, 1), f)
        mx.eval(mx.argmax(drafter.logits(h[0, 0])))
        th.append(time.perf_counter() - t0)
        drafter._trim(1)
    engine.reset()
    return statistics.median(tt[2:]), statistics.median(th[2:])


def summary(res: dict, head: str) -> str:
    """eval_eagle's figures as a person reads them (the --json file has them all, per prompt too)."""
    lo, hi = res["judged_acceptance_interval"]
    tlo, thi = res["tokens_per_target_pass_interval"]
    lines = [
        f"head {head} on {res['suite']}: {res['prompts']} prompts x {res['max_tokens']} tokens, "
        f"k = {res['k']}, lookup {res['lookup']}",
        f"  per token (judged acceptance)  {res['judged_acceptance']:.3f}  (95 % over prompts {lo:.3f}-{hi:.3f})",
        f"    by draft step                {' '.join(f'{a:.2f}' for a in res['step_acceptance'])}",
        f"  tokens per target pass         {res['tokens_per_target_pass']:.2f}   (95 % {tlo:.2f}-{thi:.2f})",
        f"  accepted / drafted             {res['acceptance']:.3f}  ({res['drafted']} drafted)",
        f"  first step, teacher-forced     top-1 {res['first_step_top1']:.3f}, top-5 {res['first_step_top5']:.3f}; "
        f"the draft vocabulary holds {res['draft_vocab_coverage']:.3f} of the target's tokens",
        f"  T = {res['temperature']:g}                        first step sum min(p, q) "
        f"{res['first_step_sum_min_pq']:.3f}; sampled accepted / drafted {res['sampled_acceptance']:.3f}",
        f"  head step / target step        {res['head_step_ms']:.2f} / {res['target_step_ms']:.2f} ms "
        f"= {100 * res['head_over_target']:.1f} %",
    ]
    if len(res["per_kind"]) > 1:
        lines.append("  by kind: per token, tokens per pass")
        lines += [f"    {kind:28s} {f['judged_acceptance']:.3f}  {f['tokens_per_pass']:.2f}"
                  for kind, f in res["per_kind"].items()]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", "--gguf", dest="target", metavar="REF",
                   help="the head's target: a GGUF, an MLX folder or a Hugging Face repo id already in the cache "
                        "(default: the demo GGUF in the mlxspec cache)")
    p.add_argument("--head", default=str(HEAD), help="head folder (default: the shipped one)")
    p.add_argument("--adapter-path", metavar="PATH", default=None,
                   help="a fine-tuned adapter folder (mlx_lm.lora's) on the target, as mlxspec --adapter-path")
    p.add_argument("--seed", type=non_negative_int, default=0, help="prompt seed used by the training scripts (default 0)")
    p.add_argument("--held-out", type=positive_int, default=32, help="held-out prompts in the training scripts (default 32)")
    p.add_argument("--suite", default="held-out", metavar="held-out|bench|FILE.jsonl", help=SUITE_HELP)
    p.add_argument("--prompts", type=positive_int, default=32, help="prompts of the suite to decode (default 32)")
    p.add_argument("--max-tokens", type=positive_int, default=64, help="tokens decoded per prompt (default 64)")
    p.add_argument("--k", type=positive_int, default=4, help="draft length of every round (default 4)")
    p.add_argument("--temperature", type=positive_float, default=0.7,
                   help="of the sampled pass, whose first step's sum min(p, q) is reported (default 0.7)")
    p.add_argument("--reps", type=positive_int, default=20, help="timed steps (default 20)")
    p.add_argument("--lookup", choices=("on", "off"), default="on",
                   help="chains copy where the text repeats (the engine's default, on), or the head drafts "
                        "alone (off); at a fixed k no round is handed to prompt lookup either way")
    p.add_argument("--json", metavar="FILE", help="write every figure here, with a row per prompt "
                   "(scripts/compare_eagle.py compares two such files); the screen shows a summary")
    args = p.parse_args(argv)
    if args.json:  # said now, not after minutes of decoding
        why = "is a folder" if Path(args.json).is_dir() else unwritable_folder(Path(args.json).resolve().parent)
        if why:
            p.error(f"--json {args.json}: {why}")
    import mlxspec

    target = args.target or str(demo.gguf_path())
    engine = mlxspec.load(target, "none", drafter="eagle", head=args.head, download=False,
                          adapter_path=args.adapter_path)
    tok = engine.tokenizer
    suite = eval_suite(args.suite, args.held_out, args.seed)
    engine.warmup(temperatures=(0.0, args.temperature))
    rows, overlap = [], []
    agreement = Agreement(engine.drafters["eagle"])
    t0 = time.time()
    lookup = args.lookup == "on"
    suite = suite[: args.prompts]
    for i, ex in enumerate(suite):
        ids = chat_ids(tok, ex["prompt"])
        g = engine.generate(ids, max_tokens=args.max_tokens, num_draft=args.k, drafter="eagle", lookup=lookup)
        s = engine.generate(ids, max_tokens=args.max_tokens, num_draft=args.k, drafter="eagle",
                            temperature=args.temperature, seed=i, lookup=lookup)
        counts = {}
        ov = first_step_overlap(engine, ids, g.tokens, args.temperature,
                                lambda r, sure: counts.update(agreement.count(r, g.tokens, sure)))
        overlap += ov
        rows.append({"kind": ex["kind"], "drafted": g.stats.drafted, "accepted": g.stats.accepted,
                     "reached": steps(g.stats.step_reached, args.k), "step_acc": steps(g.stats.step_accepted, args.k),
                     "tokens": g.stats.tokens, "passes": g.stats.rounds, "t_drafted": s.stats.drafted,
                     "t_accepted": s.stats.accepted, "overlap_sum": sum(ov), "overlap_n": len(ov), **counts})
        print(f"[{i + 1}/{len(suite)}] {ex['kind']:13s} greedy acceptance {g.stats.accepted / max(g.stats.drafted, 1):.2f}"
              f" (judged {g.stats.judged_acceptance:.2f})"
              f" tokens/pass {g.stats.tokens / g.stats.rounds:.2f}; T={args.temperature} sampled "
              f"{s.stats.accepted / max(s.stats.drafted, 1):.2f}, sum min(p,q) {sum(ov) / len(ov):.2f} "
              f"({time.time() - t0:.0f}s)", flush=True)
    ids = chat_ids(tok, suite[0]["prompt"])
    t_target, t_head = step_times(engine, ids, args.reps)

    def total(key):
        return sum(r[key] for r in rows)

    def judged(rs):
        reached = [sum(r["reached"][i] for r in rs) for i in range(args.k)]
        acc = [sum(r["step_acc"][i] for r in rs) for i in range(args.k)]
        return sum(acc) / max(sum(reached), 1), [a / max(n, 1) for a, n in zip(acc, reached)]

    res = {"suite": args.suite, "prompts": len(rows), "lookup": args.lookup, "max_tokens": args.max_tokens, "k": args.k,
           "acceptance": total("accepted") / total("drafted"), "drafted": total("drafted"),
           "judged_acceptance": judged(rows)[0], "step_acceptance": judged(rows)[1],
           "tokens_per_target_pass": total("tokens") / total("passes"),
           # 95 % over prompts (their drafts succeed and fail together), see mlxspec.bench.interval
           "judged_acceptance_interval": ratio_interval([FIGURES["judged acceptance"](r) for r in rows]),
           "tokens_per_target_pass_interval": ratio_interval([FIGURES["tokens per pass"](r) for r in rows]),
           "temperature": args.temperature, "sampled_acceptance": total("t_accepted") / max(total("t_drafted"), 1),
           "first_step_sum_min_pq": sum(overlap) / len(overlap), "positions": len(overlap),
           "first_step_top1": total("top1") / total("positions"),
           "first_step_top5": total("top5") / total("positions"),
           "draft_vocab_coverage": total("in_vocab") / total("positions"),
           "first_step_top1_full_vocab": total("top1_full") / total("positions"),
           "first_step_top1_by_confidence": by_confidence(rows),
           "target_step_ms": 1e3 * t_target, "head_step_ms": 1e3 * t_head, "head_over_target": t_head / t_target,
           "per_kind": {}}
    for kind in sorted({r["kind"] for r in rows}):
        rs = [r for r in rows if r["kind"] == kind]
        n = max(sum(r["positions"] for r in rs), 1)
        res["per_kind"][kind] = {"acceptance": sum(r["accepted"] for r in rs) / max(sum(r["drafted"] for r in rs), 1),
                                 "judged_acceptance": judged(rs)[0],
                                 "tokens_per_pass": sum(r["tokens"] for r in rs) / sum(r["passes"] for r in rs),
                                 "first_step_top1": sum(r["top1"] for r in rs) / n,
                                 "draft_vocab_coverage": sum(r["in_vocab"] for r in rs) / n,
                                 "first_step_top1_by_confidence": by_confidence(rs)}
    print(summary(res, args.head))
    if args.json:
        # With the rows per prompt, so two heads measured on one suite compare paired (compare_eagle.py).
        res["rows"] = [{key: r[key] for key in ROW_KEYS} for r in rows]
        Path(args.json).resolve().parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
        print(f"every figure, and a row per prompt: {args.json}")


if __name__ == "__main__":
    run_main(main, "interrupted")
