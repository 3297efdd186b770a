"""Train and held-out prompt files from public, permissively licensed instruction sets.

    python scripts/public_prompts.py --gsm8k-train train.jsonl --gsm8k-test test.jsonl \
        --gpteacher GPTeacher/ --train public-train.jsonl --eval public-eval.jsonl
    python scripts/train_eagle.py ... --prompt-file public-train.jsonl
    python scripts/eval_eagle.py --suite public-eval.jsonl --prompts 48

Templated prompts teach a head the templates' answers: the shipped head's first draft step
agreed with the target 0.59 of the time on held-out templated prompts and 0.37 on the bench
suite's hand-written ones. These sources are written like a user's requests (only the prompts
are used; the target writes every answer itself):
  - GSM8K (github.com/openai/grade-school-math, MIT): grade-school math word problems.
    Train prompts come from its train split, held-out ones from its test split.
  - GPTeacher (github.com/teknium1/GPTeacher, MIT): Codegen/codegen-instruct.json (write,
    explain, fix or port code, in many languages), Roleplay/roleplay-simple-deduped-roleplay-
    instruct.json (answers in a role: advice, descriptions, stories) and seedprompts.jsonl
    (self-instruct's 175 hand-written seed tasks, Apache-2.0).
An item's "input" (code, a passage, a situation) follows its instruction after a blank line.
Each kind's held-out prompts are drawn first (seeded) and no train prompt repeats one's text.
The same inputs and seed give the same files.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mlxspec.training.draft_prompts import write_jsonl  # noqa: E402

GPTEACHER = {  # kind -> file inside a GPTeacher checkout
    "code": "Codegen/codegen-instruct.json",
    "roleplay": "Roleplay/roleplay-simple-deduped-roleplay-instruct.json",
    "seed-task": "seedprompts.jsonl",
}


def _json_items(path: Path, what: str) -> list:
    """A JSON array or JSONL file's objects; a clear error for a missing or malformed file."""
    if not path.is_file():
        raise SystemExit(f"{what}: {path} is not a file")
    text = path.read_text(encoding="utf-8")
    try:
        items = json.loads(text) if text.lstrip().startswith("[") else [
            json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as e:
        raise SystemExit(f"{what}: {path} is neither a JSON array nor JSON lines ({e.msg}, line {e.lineno})")
    if not all(isinstance(x, dict) for x in items):
        raise SystemExit(f"{what}: {path} must hold JSON objects")
    return items


def gsm8k(path: Path, what: str) -> list:
    """GSM8K lines {"question", "answer"} -> the questions."""
    items = _json_items(path, what)
    if not all(isinstance(x.get("question"), str) for x in items):
        raise SystemExit(f'{what}: {path}: every line needs a "question" string (GSM8K\'s format)')
    return [q for q in (x["question"].strip() for x in items) if q]  # a blank question asks nothing


def instruction(item: dict) -> str:
    """An Alpaca-format item ({"instruction", "input"}, or self-instruct's seed task with its first
    instance's input) as one user message."""
    text = (item.get("instruction") or "").strip()
    extra = item.get("input")
    if extra is None and item.get("instances"):
        extra = item["instances"][0].get("input")
    extra = (extra or "").strip()
    return f"{text}\n\n{extra}" if extra else text


def gpteacher(root: Path) -> dict:
    """{kind: [prompt]} from a GPTeacher checkout."""
    out = {}
    for kind, rel in GPTEACHER.items():
        items = _json_items(root / rel, "--gpteacher")
        out[kind] = [p for p in map(instruction, items) if p]
    return out


def build(sources: dict, counts: dict, held_out: int, seed: int, held_source: dict = None):
    """(train rows, held-out rows) of {"kind", "prompt"}: per kind `held_out` prompts drawn first
    (from held_source[kind] where given, e.g. a test split), then up to counts[kind] train prompts
    whose text is not held out. Duplicates within a kind are dropped."""
    rng = random.Random(seed)
    train, held = [], []
    for kind in sorted(sources):
        pool = list(dict.fromkeys(sources[kind]))  # distinct, in file order
        rng.shuffle(pool)
        hpool = list(dict.fromkeys((held_source or {}).get(kind, [])))
        if hpool:
            rng.shuffle(hpool)
            h = hpool[:held_out]
        else:
            h, pool = pool[:held_out], pool[held_out:]
        seen = set(h)
        t = [p for p in pool if p not in seen][: counts.get(kind, len(pool))]
        held += [{"kind": kind, "prompt": p} for p in h]
        train += [{"kind": kind, "prompt": p} for p in t]
    rng.shuffle(train)
    # Generation pads a batch to its longest prompt: neighbours of similar length waste little.
    train.sort(key=lambda r: len(r["prompt"]))
    return train, held


def parse_counts(spec: str, kinds) -> dict:
    """"code=1200,math=1000" -> {kind: n}; kinds not named take all their prompts."""
    out = {}
    for part in filter(None, (s.strip() for s in spec.split(","))):
        kind, _, n = part.partition("=")
        if kind not in kinds or not n.isdigit():
            raise SystemExit(f"--take {part!r}: expected KIND=N with KIND one of {sorted(kinds)} and N >= 0")
        out[kind] = int(n)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gsm8k-train", type=Path, help="GSM8K's grade_school_math/data/train.jsonl")
    p.add_argument("--gsm8k-test", type=Path, help="GSM8K's test.jsonl: held-out math prompts come from it")
    p.add_argument("--gpteacher", type=Path, help="a GPTeacher checkout (its Codegen, Roleplay and seed prompts)")
    p.add_argument("--take", default="", help="train prompts per kind, e.g. math=1000,code=1200 (default: all)")
    p.add_argument("--held-out", type=int, default=24, help="held-out prompts per kind (default 24)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train", type=Path, required=True, help="the train prompt file to write (JSONL)")
    p.add_argument("--eval", type=Path, required=True, help="the held-out prompt file to write (JSONL)")
    args = p.parse_args(argv)
    if Path(args.train).resolve() == Path(args.eval).resolve():
        p.error(f"--train and --eval are the same file ({args.train}): the held-out prompts would replace the "
                "train prompts; give two files")
    if args.held_out < 1:
        raise SystemExit(f"--held-out {args.held_out}: must be at least 1")
    sources, held_source = {}, {}
    if args.gsm8k_train:
        sources["math"] = gsm8k(args.gsm8k_train, "--gsm8k-train")
    if args.gsm8k_test:
        if not args.gsm8k_train:
            raise SystemExit("--gsm8k-test needs --gsm8k-train (the test split only gives held-out prompts)")
        held_source["math"] = gsm8k(args.gsm8k_test, "--gsm8k-test")
    if args.gpteacher:
        sources.update(gpteacher(args.gpteacher))
    if not sources:
        raise SystemExit("no source given: pass --gsm8k-train and/or --gpteacher")
    train, held = build(sources, parse_counts(args.take, sources), args.held_out, args.seed, held_source)
    write_jsonl(args.train, train)
    write_jsonl(args.eval, held)
    by = lambda rows: ", ".join(f"{k} {sum(r['kind'] == k for r in rows)}" for k in sorted(sources))  # noqa: E731
    print(f"{args.train}: {len(train)} train prompts ({by(train)})")
    print(f"{args.eval}: {len(held)} held-out prompts ({by(held)})")


if __name__ == "__main__":
    main()
