"""Predicted Outputs' speed: answers with and without a `prediction`, on one engine, interleaved
prompt by prompt, after a warm-up.

    python scripts/bench_prediction.py [--pair demo] [--max-tokens 160] [--reps 2] [--all]

The prompts are the bench suite's code edits (and any --prompts file's prompts with a ``` block).
The prediction an editor would send is the code as it stands (the prompt's ``` block). Beside it:
the answer itself, from a first plain run (a regenerated answer: the ceiling), and another
prompt's code (a prediction that does not help: it must not cost). With --all, every prompt of
the suite, predicted by its own answer and by another prompt's. Prints tokens per second and
tokens per target pass per mode, each mode's median per-prompt ratio to plain decoding, and checks
that every greedy output equals plain decoding's.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time

import mlxspec
from mlxspec.bench.prompts import builtin_suite, load_prompts

BLOCK = re.compile(r"```[a-z]*\n(.*?)```", re.S)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="demo", help="the pair to load (default demo)")
    ap.add_argument("--prompts", help="a bench prompts file (default: the built-in suite's code edits)")
    ap.add_argument("--max-tokens", type=int, default=160, help="tokens per answer (default 160)")
    ap.add_argument("--reps", type=int, default=2, help="passes over the prompts, interleaved (default 2)")
    ap.add_argument("--all", action="store_true", help="every prompt, predicted by its answer and by another's")
    args = ap.parse_args()
    suite = load_prompts(args.prompts) if args.prompts else builtin_suite()
    if args.all:
        prompts = [(p.messages(), None) for p in suite]
    else:
        prompts = [(p.messages(), m.group(1)) for p in suite
                   if (args.prompts or p.category == "code-edit") and (m := BLOCK.search(p.prompt))]
    if not prompts:
        raise SystemExit("no prompt has a ``` block to predict the answer from")
    engine = mlxspec.load(args.pair)
    engine.warmup()  # as the server and `mlxspec bench` do: every pass shape compiled, the cost curve timed
    drafters = [engine.default_drafter] + (["ngram"] if engine.default_drafter != "ngram" else [])
    # the plain answers: the reference every mode must equal, and the ceiling's prediction
    answers = []
    for messages, _ in prompts:
        engine.reset()
        answers.append(engine.generate(messages, max_tokens=args.max_tokens, speculative=False))
    modes = [("plain", dict(speculative=False), None)]
    for d in drafters:
        modes += [(f"{d}, no prediction", dict(drafter=d), None)]
        if not args.all:
            modes += [(f"{d}, the code as it stands", dict(drafter=d), "code")]
        modes += [(f"{d}, the answer itself", dict(drafter=d), "answer"),
                  (f"{d}, another prompt's {'answer' if args.all else 'code'}", dict(drafter=d), "other")]
    print(f"{args.pair}: {len(prompts)} prompts x {args.max_tokens} tokens, {args.reps} reps, interleaved; "
          f"drafters {', '.join(drafters)}")

    def run(i, mode):
        _, kw, what = mode
        other = (i + 1) % len(prompts)
        prediction = {"code": prompts[i][1], "answer": answers[i].text, None: None,
                      "other": answers[other].text if args.all else prompts[other][1]}[what]
        engine.reset()  # as `mlxspec bench`: no run copies from an earlier one's caches or lookup corpus
        return engine.generate(prompts[i][0], max_tokens=args.max_tokens, prediction=prediction, **kw)

    t = time.perf_counter()
    for i in range(len(prompts)):  # warm-up: every mode once, untimed
        for mode in modes:
            run(i, mode)
    print(f"warm-up {time.perf_counter() - t:.0f} s")
    speed = {m[0]: [] for m in modes}
    passes = {m[0]: [0, 0] for m in modes}
    for rep in range(args.reps):
        for i in range(len(prompts)):
            order = modes if (rep + i) % 2 == 0 else modes[::-1]
            for mode in order:
                r = run(i, mode)
                if r.tokens != answers[i].tokens:
                    raise SystemExit(f"{mode[0]}: prompt {i} differs from plain decoding")
                speed[mode[0]].append((i, r.stats.tokens_per_second))
                passes[mode[0]][0] += r.stats.tokens
                passes[mode[0]][1] += r.stats.rounds
    print("every greedy output equals plain decoding's")
    plain = {}
    for i, v in speed["plain"]:
        plain.setdefault(i, []).append(v)
    print(f"{'mode':36} {'tok/s':>7} {'vs plain':>9} {'tokens/pass':>12}")
    for name, runs in speed.items():
        ratios = [v / statistics.mean(plain[i]) for i, v in runs]
        tok, rounds = passes[name]
        print(f"{name:36} {statistics.mean(v for _, v in runs):7.1f} {statistics.median(ratios):8.2f}x "
              f"{tok / rounds:12.2f}")


if __name__ == "__main__":
    main()
