"""Bench suites of long conversations, written by the target itself.

    python scripts/long_chats.py --suite public-eval.jsonl --lengths 1000,3000 --out long
    mlxspec bench --prompts long-3000.jsonl --drafter eagle

Short prompts say nothing about a drafter deep into a chat: a head trained on a prompt plus
128 answer tokens may draft far worse after thousands of its own cache entries (the shipped
head's `window` is the answer to that). This script builds the conversation the way a chat
grows: the target answers the suite's odd-numbered prompts one after another, greedy, each
answer at most --answer-tokens long, until the conversation passes the longest length asked
for. For each length L, the newest turns that fit in L tokens are the history, and each
final request (the suite's even-numbered prompts, --finals per kind, kinds in turn) follows
them: one line per final, `{"id", "category": its kind, "messages"}`, in OUT-L.jsonl.
The same suite, target and arguments give the same files (greedy answers).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import mlxspec  # noqa: F401  (first: it picks MLX's CPU BLAS before mlx.core binds one, see mlxspec/blas.py)

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT)]

from mlxspec.training.draft_prompts import eval_suite  # noqa: E402
from mlxspec.training.train_common import run_main  # noqa: E402
from mlxspec.prompts import encode_prompt  # noqa: E402


def positive_list(text: str) -> list:
    try:
        values = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of token counts, e.g. 1000,3000; got {text!r}")
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"token counts must be >= 1, got {text!r}")
    return values


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="demo", metavar="REF", help="the target (a pair or a model; default demo)")
    p.add_argument("--suite", required=True, metavar="FILE.jsonl|bench",
                   help="prompts with kinds, as eval_eagle.py reads them (e.g. public_prompts.py's held-out "
                   "file); odd-numbered ones build the history, even-numbered ones are the finals")
    p.add_argument("--lengths", type=positive_list, default=[1000, 3000],
                   help="history lengths in tokens, a comma list (default 1000,3000)")
    p.add_argument("--finals", type=positive, default=3, help="final requests per kind (default 3)")
    p.add_argument("--answer-tokens", type=positive, default=160, help="longest history answer (default 160)")
    p.add_argument("--out", required=True, metavar="PREFIX", help="writes PREFIX-L.jsonl for each length L")
    return p.parse_args(argv)


def finals_by_kind(prompts: list, per_kind: int) -> list:
    """Up to `per_kind` prompts of each kind, kinds in the order first seen."""
    kinds = list(dict.fromkeys(e["kind"] for e in prompts))
    return [e for k in kinds for e in [x for x in prompts if x["kind"] == k][:per_kind]]


def newest_turns(history: list, fits) -> list:
    """The longest tail of whole (user, assistant) turns for which `fits(tail)` holds."""
    for start in range(0, len(history), 2):
        if fits(history[start:]):
            return history[start:]
    return []


def main(argv=None) -> int:
    args = parse_args(argv)
    prompts = eval_suite(args.suite)
    history_prompts, finals = prompts[1::2], finals_by_kind(prompts[0::2], args.finals)
    if not history_prompts:
        raise SystemExit(f"--suite {args.suite}: needs at least 2 prompts (odd ones build the history)")
    engine = mlxspec.load(args.target, download=False)
    engine.warmup()
    tok = engine.tokenizer

    def ids_of(messages):
        return encode_prompt(messages, tok, engine.vocab_size)

    history, longest, size = [], max(args.lengths), 0
    for n, e in enumerate(history_prompts, 1):
        asked = history + [{"role": "user", "content": e["prompt"]}]
        answer = engine.generate(ids_of(asked), max_tokens=args.answer_tokens)
        history = asked + [{"role": "assistant", "content": answer.text.strip()}]
        size = len(ids_of(history[:-1])) + answer.stats.tokens
        print(f"history: {n} turns, {size} tokens", file=sys.stderr, flush=True)
        if size > longest:
            break
    else:
        print(f"the suite's {len(history_prompts)} history prompts give {size} tokens, short of {longest}: "
              "the longer files hold the whole history", file=sys.stderr)
    probe = {"role": "user", "content": finals[0]["prompt"]}
    for length in args.lengths:
        tail = newest_turns(history, lambda t: len(ids_of(t + [probe])) <= length)
        path = Path(f"{args.out}-{length}.jsonl")
        with path.open("w", encoding="utf-8") as f:
            for i, e in enumerate(finals):
                messages = tail + [{"role": "user", "content": e["prompt"]}]
                f.write(json.dumps({"id": f"{e['kind']}-{i}", "category": e["kind"], "messages": messages},
                                   ensure_ascii=False) + "\n")
        print(f"wrote {path}: {len(finals)} requests after {len(tail) // 2} turns "
              f"({len(ids_of(tail + [probe]))} tokens with the first)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_main(main, "interrupted")
