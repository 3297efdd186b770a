"""`mlxspec bench`: vanilla vs speculative (vs mlx-lm) tokens/s on a prompt suite, interleaved.

    mlxspec bench                                   # demo pair, 8 prompts x 64 tokens
    mlxspec bench --full --num-draft auto,1,2,4,8 --drafter ngram,model --json out.json
    mlxspec bench --drafter ngram --tree auto,off   # draft trees vs chains side by side

Exits with status 1 when a greedy output differs from vanilla beyond a near-tie (a bug).
"""

from __future__ import annotations

import argparse

from ..errors import InvalidArgumentError
from . import argtypes
from .modelargs import add_model_args

DEFAULT_MAX_TOKENS = 64


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="measure whether speculation pays on this machine",
                              description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("--prompts", metavar="FILE.jsonl", help="your own suite: one JSON object per line with "
                   "'prompt' and optional 'id', 'category' (default: the builtin suite)")
    p.add_argument("--full", action="store_true", help="all 24 builtin prompts (default: 8 covering every category; a --prompts file always runs in full)")
    p.add_argument("--limit", type=int, default=None, help="run only the first N selected prompts")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help=f"tokens per run (default {DEFAULT_MAX_TOKENS})")
    p.add_argument("--temperature", default="0", help="a value or comma list, e.g. 0,0.7 (default 0)")
    p.add_argument("--num-draft", default="auto", help="draft lengths, e.g. auto,1,2,4 (default auto)")
    p.add_argument("--drafter", default=None, help="drafters, e.g. ngram,model (default: the pair's)")
    p.add_argument("--tree", default="auto", help="draft trees: auto (the cost model sizes them), off "
                   "(chains only) or a node cap; a comma list compares them, e.g. auto,off (default auto)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed, the same for every run (default 0)")
    p.add_argument("--no-peer", action="store_true", help="skip mlx-lm's speculative decoding")
    p.add_argument("--json", metavar="PATH", help="write the full results as JSON")
    p.add_argument("--csv", metavar="PATH", help="write one row per run as CSV")
    p.add_argument("--plot", metavar="PATH.png", help="write charts (needs matplotlib)")
    p.set_defaults(func=run)


def parse_list(text: str, what: str, convert) -> list:
    """Comma list -> values; InvalidArgumentError naming the option and the bad item."""
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    if not items:
        raise InvalidArgumentError(f"--{what} needs at least one value, got {text!r}")
    out = []
    for x in items:
        try:
            out.append(convert(x))
        except (ValueError, argparse.ArgumentTypeError):
            raise InvalidArgumentError(f"--{what}: {x!r} is not valid") from None
    return out


def run(args) -> int:
    from rich.console import Console

    from ..bench.report import report_console
    from ..bench.prompts import builtin_suite, load_prompts, select

    if args.max_tokens < 1:
        raise InvalidArgumentError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    temps = parse_list(args.temperature, "temperature", argtypes.non_negative)
    ks = parse_list(args.num_draft, "num-draft", argtypes.num_draft)
    trees = parse_list(args.tree, "tree", argtypes.tree)
    drafters = parse_list(args.drafter, "drafter", str) if args.drafter else None
    suite = load_prompts(args.prompts) if args.prompts else builtin_suite()  # fail before loading models
    prompts = select(suite, full=args.full or bool(args.prompts), limit=args.limit)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise InvalidArgumentError("--plot needs matplotlib, which is not installed: pip install matplotlib") from None

    from . import modelargs

    err = Console(stderr=True)
    with err.status("loading models"):
        engine = modelargs.load_engine(args)
    code = bench_engine(engine, prompts, args, temps=temps, ks=ks, drafters=drafters, trees=trees, err=err,
                        out=report_console(), prompts_source=args.prompts or "builtin")
    return code


def bench_engine(engine, prompts, args, *, temps, ks, drafters, err, out, prompts_source, trees=("auto",)) -> int:
    """Everything after loading: curve, interleaved runs with a progress bar, report and files."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from ..bench.report import mismatch_line, pair_info, print_report, to_json, write_csv, write_json
    from ..bench.runner import run_bench, settings_for
    from ..calibration import apply_prior, calibration_path, curve_for

    settings = settings_for(engine, drafters=drafters, num_drafts=ks, peer=not args.no_peer, trees=trees)
    with err.status("verify-cost curve"):
        ratios, source = curve_for(engine)
    apply_prior(engine, ratios)
    err.print(f"verify-cost curve: {source}" + (f" ({calibration_path()})" if source == "calibration file" else
                                                " (run `mlxspec calibrate` to save a finer one)" if ratios else ""))

    total = len(prompts) * len(temps) * len(settings)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task("bench", total=total)

        def on_run(rec):
            bar.update(task, advance=1, description=f"{rec.prompt_id} {rec.mode}")

        result = run_bench(engine, prompts, max_tokens=args.max_tokens, temperatures=temps, num_drafts=ks,
                           drafters=drafters, seed=args.seed, peer=not args.no_peer, trees=trees, on_run=on_run,
                           on_mismatch=lambda rec: err.print(mismatch_line(rec)))

    used = list(dict.fromkeys(s.drafter for s in result.settings if s.mode == "speculative"))
    curve = {"source": source, "path": str(calibration_path()) if source == "calibration file" else None, "ratios": {str(j): r for j, r in sorted(ratios.items())} if ratios else None}
    doc = to_json(result, pair=pair_info(engine, used), curve=curve, prompts_source=prompts_source)
    print_report(doc, out)
    if args.json:
        write_json(doc, args.json)
        err.print(f"wrote {args.json}")
    if args.csv:
        write_csv(result, args.csv)
        err.print(f"wrote {args.csv}")
    if args.plot:
        from ..bench.plot import write_plot

        write_plot(doc, args.plot)
        err.print(f"wrote {args.plot}")
    return 1 if doc["summary"]["mismatches"] else 0
