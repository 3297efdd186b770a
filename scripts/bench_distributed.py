"""Plain vs speculative decoding over a target sharded on two (or more) ranks.

    mlx.launch --backend ring -n 2 -- python scripts/bench_distributed.py --shape tiny
    mlx.launch --backend ring -n 2 -- python scripts/bench_distributed.py --shape demo
    mlx.launch --hosts mac1,mac2 -- python scripts/bench_distributed.py --shape demo

Every rank runs the same requests (the passes are collective); rank 0 prints one JSON object:
  - `collective`: median seconds of one decision all-sum (2 + size int64s) and of one
    all-sum of a (1, 1, hidden) activation (what every sharded layer pays per pass);
  - `runs`: per mode, tokens/s, tokens per target pass, rounds, and decision seconds per round:
    "plain" (the engine, no drafter), "ngram" (speculative, automatic k) and, for the demo
    shape, "model" (its 2-layer draft), all on a copy-heavy prompt, greedy; plus
    "mlx-lm plain" (mlx-lm's pipelined `stream_generate` over the same sharded model);
  - `drafter`: seconds of a model drafter's k-token proposal against one all-sum of k ints,
    the two ways to give every rank the drafts (replicate the drafter, or broadcast its tokens).
Shapes: "tiny" is a random 2-layer llama (hidden 64); "demo" loads the demo pair sharded
(`mlxspec.load("demo", distributed=True)`).
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
PARAGRAPH = ("The committee met on Tuesday to review the budget. It approved the new library, postponed the "
             "road repairs, and asked the treasurer for a revised estimate by the end of the month.")
PROMPT = f"Repeat the following text exactly, twice:\n\n{PARAGRAPH}"


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def build(shape: str):
    if shape == "demo":
        import mlxspec

        return mlxspec.load("demo", distributed=True)
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny import make_llama, make_tokenizer

    from mlxspec import Engine
    from mlxspec.shard import shard_model

    group = mx.distributed.init()
    target = make_llama(0)
    shard_model(target, group)
    return Engine(target, make_tokenizer(), make_llama(0, layers=1), draft_tokenizer=make_tokenizer(), group=group)


def mlx_lm_plain(engine, max_tokens: int) -> dict:
    from mlx_lm.generate import stream_generate

    ids = engine.tokenizer.encode(engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=False), add_special_tokens=False)
    last = None
    for last in stream_generate(engine.target_model, engine.tokenizer, ids, max_tokens=max_tokens):
        pass
    return {"tokens": last.generation_tokens, "tokens_per_second": last.generation_tps, "tokens_per_pass": 1.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=["tiny", "demo"], default="tiny")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2, help="runs per mode; the best is reported (default 2)")
    args = ap.parse_args()

    engine = build(args.shape)
    coord = engine.coord
    hidden = engine.target_model.args.hidden_size
    act = mx.zeros((1, 1, hidden), dtype=mx.bfloat16 if args.shape == "demo" else mx.float32)
    collective = {
        "decision_seconds": median_seconds(lambda: coord.decide([0, 4]), 30),
        "activation_all_sum_seconds": median_seconds(
            lambda: mx.eval(mx.distributed.all_sum(act, group=coord.group)), 30),
    }
    messages = [{"role": "user", "content": PROMPT}]
    modes = {"plain": dict(speculative=False), "ngram": dict(drafter="ngram")}
    if engine.draft_model is not None:
        modes["model"] = dict(drafter="model")
    runs = {}
    engine.generate(messages, max_tokens=8)  # first-use compilation, every rank alike
    for name, options in modes.items():
        best = None
        for _ in range(args.repeats):
            engine.reset()
            before = (coord.decisions, coord.decision_seconds)
            s = engine.generate(messages, max_tokens=args.max_tokens, **options).stats
            decisions = coord.decisions - before[0]
            row = {"tokens": s.tokens, "tokens_per_second": s.tokens_per_second,
                   "tokens_per_pass": s.tokens_per_target_pass, "rounds": s.rounds,
                   "accepted": s.accepted, "drafted": s.drafted,
                   "decision_seconds_per_round": (coord.decision_seconds - before[1]) / max(decisions, 1)}
            if best is None or row["tokens_per_second"] > best["tokens_per_second"]:
                best = row
        runs[name] = best
    runs["mlx-lm plain"] = mlx_lm_plain(engine, args.max_tokens)

    drafter = None
    if "model" in engine.drafters:
        from mlxspec.sampling import SamplingParams

        d = engine.drafters["model"]
        history = engine.tokenizer.encode(PROMPT)
        k = 4

        def propose():  # the steady state: the drafter already holds the history
            d.propose(history, k, SamplingParams(), 0).tokens.tolist()

        propose()
        drafter = {"k": k, "replicated_propose_seconds": median_seconds(propose, 5),
                   "broadcast_k_ints_seconds": median_seconds(lambda: coord.decide([0] * k), 30)}
    if coord.is_main:
        print(json.dumps({"shape": args.shape, "ranks": coord.size, "sharding": getattr(
            getattr(engine, "target_info", None), "sharding", "tensor"), "collective": collective,
            "runs": runs, "speedup_ngram_vs_plain": runs["ngram"]["tokens_per_second"] / runs["plain"][
                "tokens_per_second"], "drafter": drafter}, indent=1))


if __name__ == "__main__":
    main()
