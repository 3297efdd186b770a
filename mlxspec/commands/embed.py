"""`mlxspec embed TEXT...`: the target's embeddings of texts, as JSON lines or a similarity table."""

from __future__ import annotations

import argparse
import json
import sys
import time

from ..choices import POOLINGS
from ..errors import InvalidArgumentError
from ..stats import plural
from . import modelargs
from .modelargs import add_model_args

SHOWN = 40  # characters of each text the similarity table shows


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "embed", help="embed texts with the target's hidden states (as the server's /v1/embeddings)",
        description=(
            "Print the target's embedding of each TEXT (its final hidden states pooled, then normalized: what\n"
            "`mlxspec serve` answers on /v1/embeddings), one JSON line each: {\"index\", \"tokens\", \"embedding\"}.\n"
            "With --similarity, a table of the texts' cosine similarities instead. A generative model was not\n"
            "trained for this (see the README); a model trained for embeddings gives its own.\n"
            "Without --pair or --target the offline 'demo' pair's target is used."),
        epilog=("examples:\n  mlxspec embed --similarity 'How do I sort a list?' 'Order a list' 'Rain in Paris'\n"
                "  mlxspec embed --file docs.txt > vectors.jsonl          # one input per line\n"
                "  mlxspec embed --target Qwen3-Embedding-0.6B --pooling last 'a query'"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("texts", metavar="TEXT", nargs="*", help="a text to embed ('-' reads lines from stdin, one input "
                                                             "each)")
    add_model_args(p, window=False, head=False, drafter=False, draft=False)
    p.add_argument("--file", metavar="PATH", default=None,
                   help="also embed each non-empty line of PATH, one input each, after the TEXTs (default: none)")
    p.add_argument("--pooling", choices=POOLINGS, default="mean",
                   help="'mean' over every token (llama.cpp's for generative models) or 'last', the last token's "
                        "(what decoder-based embedding models are trained for) (default: mean)")
    p.add_argument("--normalize", type=_norm, default=2, metavar="P",
                   help="llama.cpp's --embd-normalize: 2 unit length, -1 none, 0 max absolute in the int16 range, "
                        "1 taxicab, P > 2 the P-norm (default: 2)")
    p.add_argument("--truncate", action="store_true",
                   help="cut a text past the model's context to its first tokens (default: refuse it)")
    p.add_argument("--similarity", action="store_true",
                   help="print the cosine similarity of every two texts as a table, not the vectors (default: the "
                        "vectors, as JSON lines)")
    p.set_defaults(func=run, _parser=p)


def _norm(text: str) -> int:
    try:
        p = int(text)
    except ValueError:
        p = None
    if p is None or p < -1:
        raise argparse.ArgumentTypeError(f"must be an integer >= -1 (-1 none, 0 max absolute, 1 taxicab, 2 "
                                         f"euclidean, P > 2 the P-norm), got {text!r}")
    return p


def _texts(args) -> list:
    texts = []
    for text in args.texts:
        texts += [line for line in sys.stdin.read().splitlines() if line.strip()] if text == "-" else [text]
    if args.file is not None:
        try:
            with open(args.file, encoding="utf-8") as f:
                texts += [line.rstrip("\n") for line in f if line.strip()]
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidArgumentError(f"--file {args.file}: cannot read it as UTF-8 text ({e})") from None
    if not texts:
        raise InvalidArgumentError("nothing to embed: give one or more TEXTs, '-' (lines from stdin) or --file PATH")
    return texts


def run(args) -> int:
    texts = _texts(args)  # read before loading (seconds): a missing file is said at once
    engine = modelargs.load_engine(args, draft="none", drafter="none")
    info = engine.target_info
    print(f"target {info.ref} ({info.weights_bytes / 2**20:.0f} MiB {info.dtype}), {args.pooling} pooling",
          file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    out = engine.embed(texts, pooling=args.pooling, normalize=args.normalize, truncate=args.truncate)
    seconds = time.perf_counter() - t0
    vectors = out.vectors.tolist()
    if args.similarity:
        print(_table(texts, vectors))
    else:
        for i, (n, vector) in enumerate(zip(out.tokens, vectors)):
            print(json.dumps({"index": i, "tokens": n, "embedding": vector}))
    total = sum(out.tokens)
    print(f"embedded {plural(len(texts), 'text')} ({plural(total, 'token')}) in {seconds:.2f} s, "
          f"{total / max(seconds, 1e-9):.0f} tokens/s, {len(vectors[0])} dimensions", file=sys.stderr)
    return 0


def _table(texts: list, vectors: list) -> str:
    """Cosine similarities, the texts numbered down the side and across the top."""
    import numpy as np

    v = np.array(vectors, dtype=np.float64)
    v /= np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-30)  # cosine whatever --normalize did
    sims = v @ v.T
    lines = ["      " + "".join(f"{j + 1:>7}" for j in range(len(texts)))]
    for i, text in enumerate(texts):
        shown = text if len(text) <= SHOWN else text[:SHOWN - 1] + "…"
        lines.append(f"{i + 1:>5} " + "".join(f"{s:7.3f}" for s in sims[i]) + f"   {shown}")
    return "\n".join(lines)
