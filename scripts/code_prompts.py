"""Varied code and documentation prompts from this machine's Python standard library (offline, seeded).

    python scripts/code_prompts.py --n 1536 --out code-prompts.jsonl
    python scripts/train_eagle.py ... --prompt-file code-prompts.jsonl

Templated prompts repeat their own few code tasks; these carry real code and real prose (the
standard library's functions and docstrings) inside the kinds of request users send: edit,
explain, test or port this function; summarise this documentation. The target answers them
itself during training, so nothing of the library's text ends up in a head but the target's
own features. The same Python version and seed give the same file.
"""

from __future__ import annotations

import argparse
import ast
import functools
import random
import sys
import sysconfig
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mlxspec.training.draft_prompts import write_jsonl  # noqa: E402

EDIT = [  # (kind, request): the function follows in a fenced block
    ("code-edit", "Add type hints to every parameter and the return value of this function. "
                  "Return the complete code."),
    ("code-edit", "Add a clear docstring to this function and return the full function."),
    ("code-edit", "Rename the variable `{old}` to `{new}` everywhere in this function and return the full "
                  "edited code."),
    ("code-edit", "Rewrite this function so that it is easier to read, without changing what it does."),
    ("code-edit", "Add a comment above each step of this function explaining what it does."),
    ("code-edit", "Remove the docstring and comments from this function and return the rest unchanged."),
    ("code", "Explain what this Python function does, step by step."),
    ("code", "Write pytest unit tests for this function."),
    ("code", "Translate this Python function into JavaScript."),
    ("code", "What is the time complexity of this function? Explain briefly."),
    ("code", "Review this function: point out anything that could go wrong and suggest improvements."),
    ("code", "Give an example of calling this function, and show what it returns."),
]
SUMMARY = [
    "Summarise the following documentation in three sentences.",
    "Give a two-sentence summary of the text below.",
    "Summarise the main points of this text as a short bulleted list.",
    "Explain the following documentation in plain words, as if to a beginner.",
    "What is the text below about? Answer in one paragraph.",
]
NEW_NAMES = ["result", "items", "value", "total", "count", "data", "current", "index", "text", "output",
             "entry", "buffer", "parts", "names", "found"]


def stdlib_files() -> list:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = ("test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "turtledemo", "ensurepip")
    return sorted(p for p in root.rglob("*.py") if not set(p.relative_to(root).parts) & set(skip))


@functools.lru_cache(maxsize=1)
def harvest(files: tuple, max_lines: int = 30):
    """(functions [(code, local names, where)], docstrings [(text, where)]) of the files that parse;
    where = "path/in/stdlib.py:name", what a prompt records as its "source"."""
    funcs, docs = [], []
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in files:
        rel = path.relative_to(root).as_posix()
        try:
            src = path.read_text(encoding="utf-8")
            tree = ast.parse(src)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = None
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.Module, ast.ClassDef)):
                doc = ast.get_docstring(node)
                if doc and 300 <= len(doc) <= 1500 and ">>>" not in doc:
                    docs.append((doc, f"{rel}:{getattr(node, 'name', '<module>')}"))
            if isinstance(node, ast.FunctionDef) and 5 <= node.end_lineno - node.lineno + 1 <= max_lines:
                if node.col_offset:  # methods lose their class; keep top-level functions
                    continue
                if lines is None:  # ast.get_source_segment re-splits the file on every call; bytes split
                    lines = src.encode("utf-8").splitlines(keepends=True)  # as ast counts lines, offsets are bytes
                body = lines[node.lineno - 1:node.end_lineno]
                seg = b"".join(body[:-1] + [body[-1][:node.end_col_offset]]).decode("utf-8")
                names = sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name)
                                and isinstance(n.ctx, ast.Store) and len(n.id) > 1})
                funcs.append((seg, names, f"{rel}:{node.name}"))
    return funcs, docs


def make_code_prompts(n: int, seed: int) -> list:
    """n distinct {"kind", "prompt", "source"} from the standard library, the same for the same (n, seed,
    Python); "source" names the function or docstring ("path.py:name"), so `split_prompts.py --by source`
    can hold out prompts whose code no training prompt shows."""
    funcs, docs = harvest(tuple(stdlib_files()))
    if not funcs or not docs:
        raise SystemExit("no standard-library sources found to build prompts from")
    rng = random.Random(seed)
    seen, out = set(), []
    limit = 50 * n  # a small library cannot loop forever on duplicates
    while len(out) < n and limit:
        limit -= 1
        if rng.random() < 0.25:
            ask = rng.choice(SUMMARY)
            doc, where = rng.choice(docs)
            kind, text = "summarization", f"{ask}\n\n{doc}"
        else:
            code, names, where = rng.choice(funcs)
            kind, ask = rng.choice(EDIT)
            if "{old}" in ask:
                if not names:
                    continue
                old = rng.choice(names)
                ask = ask.format(old=old, new=rng.choice([m for m in NEW_NAMES if m not in names]))
            text = f"{ask}\n\n```python\n{code}\n```"
        if text not in seen:
            seen.add(text)
            out.append({"kind": kind, "prompt": text, "source": where})
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=1536, help="how many prompts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="the JSONL file to write (train_eagle.py --prompt-file)")
    args = p.parse_args(argv)
    if args.n < 1:
        p.error("--n must be at least 1")
    prompts = make_code_prompts(args.n, args.seed)
    out = Path(args.out)
    write_jsonl(out, prompts)
    kinds = {k: sum(x["kind"] == k for x in prompts) for k in sorted({x["kind"] for x in prompts})}
    print(f"{len(prompts)} prompts from Python {sys.version.split()[0]}'s standard library -> {out} "
          f"({', '.join(f'{k} {v}' for k, v in kinds.items())})")


if __name__ == "__main__":
    main()
