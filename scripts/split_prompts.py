"""Split a JSONL prompt file into train prompts and held-out prompts that share nothing with them.

    python scripts/split_prompts.py chat-prompts.jsonl --held-out 48 --by topic --train chat-train.jsonl --eval chat-eval.jsonl
    python scripts/split_prompts.py code-prompts.jsonl --held-out 48 --by source --train code-train.jsonl --eval code-eval.jsonl
    python scripts/train_eagle.py ... --prompt-file chat-train.jsonl --prompt-file code-train.jsonl
    python scripts/eval_eagle.py --suite chat-eval.jsonl --prompts 48

A held-out prompt measures a head only if nothing like it was trained on. With --by FIELD the
split is by that field's value, not by line: --held-out values are drawn (seeded), one prompt
of each is held out, and every other prompt with a held-out value is dropped, so no training
prompt shows the same function (code_prompts.py's "source") or the same subject (chat_prompts.py's
"topic") as a held-out one. Lines are copied as they are; the same input and seed give the same files.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mlxspec.training.draft_prompts import write_jsonl  # noqa: E402


def split(lines: list, held_out: int, by: str = None, seed: int = 0):
    """(train, held out) of parsed JSON lines: `held_out` distinct values of `by` (each line its own
    value when None), one line of each held out; lines sharing a held-out value are in neither."""
    if by is not None:
        missing = [n for n, x in enumerate(lines, 1) if by not in x]
        if missing:
            raise SystemExit(f"--by {by}: line {missing[0]} has no {by!r} field ({len(missing)} lines lack it)")
    keys = list(range(len(lines))) if by is None else [json.dumps(x[by]) for x in lines]
    values = sorted(set(keys))
    if not 0 < held_out < len(values):
        raise SystemExit(f"--held-out {held_out}: must be at least 1 and below the {len(values)} distinct "
                         f"{'lines' if by is None else repr(by) + ' values'} of the file")
    chosen = set(random.Random(seed).sample(values, held_out))
    first = {}
    for i, k in enumerate(keys):
        if k in chosen:
            first.setdefault(k, i)
    train = [x for x, k in zip(lines, keys) if k not in chosen]
    return train, [lines[i] for i in sorted(first.values())]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", help="a JSONL prompt file (one JSON object per line)")
    p.add_argument("--held-out", type=int, required=True, help="how many prompts to hold out")
    p.add_argument("--by", metavar="FIELD", help="hold out by this field's value (e.g. topic, source), not by line")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train", required=True, help="where the train prompts go")
    p.add_argument("--eval", required=True, help="where the held-out prompts go")
    args = p.parse_args(argv)
    src = Path(args.input)
    if not src.is_file():
        p.error(f"{src}: no such file")
    lines = []
    for n, text in enumerate(src.read_text(encoding="utf-8").splitlines(), 1):
        if text.strip():
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                raise SystemExit(f"{src}, line {n}: not JSON ({e.msg})")
            if not isinstance(obj, dict):
                raise SystemExit(f"{src}, line {n}: each line must be a JSON object")
            lines.append(obj)
    train, held = split(lines, args.held_out, args.by, args.seed)
    write_jsonl(Path(args.train), train)
    write_jsonl(Path(args.eval), held)
    print(f"{len(held)} held out -> {args.eval}; {len(train)} to train on -> {args.train}; "
          f"{len(lines) - len(train) - len(held)} dropped (they share a held-out {args.by or 'line'})")


if __name__ == "__main__":
    main()
