"""`mlxspec train-eagle`: an EAGLE head trained for a target, in MLX (mlxspec/training/)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers) -> None:
    from ..training import eagle_args  # light: no NumPy or MLX until the run

    p = subparsers.add_parser("train-eagle", help="train an EAGLE head for your own target (resumable, offline)",
                              description=eagle_args.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    eagle_args.add_arguments(p, pytorch=False)
    p.set_defaults(func=lambda args: run(p, args))


def run(p: argparse.ArgumentParser, args) -> int:
    from ..training import eagle_args, train_common

    eagle_args.check(p, args)
    from ..training import train_eagle

    train_common.log(f"work folder {args.work} (the stages' results: a rerun resumes from them)")
    try:
        status = train_eagle.run(args) or 0
    except KeyboardInterrupt:
        print(f"\n{train_common.RESUMES}", file=sys.stderr)
        return 130
    except SystemExit as e:  # the stages' own refusals (a work folder made otherwise, no answers): one line
        if isinstance(e.code, str):
            print(f"mlxspec train-eagle: error: {e.code}", file=sys.stderr)
            return 1
        raise
    except OSError as e:
        if e.errno not in train_common.FULL_DISK:
            raise
        print(f"mlxspec train-eagle: error: {train_common.full_disk(e, args.work)}", file=sys.stderr)
        return 1
    if args.stop_after == "export":
        train_common.log(next_steps(args))
    return status


def next_steps(args) -> str:
    """What to do with the exported head, and what the work folder costs on disk."""
    import shlex

    from ..training.train_common import sized

    adapter = f" --adapter-path {shlex.quote(args.adapter_path)}" if args.adapter_path else ""
    size = sum(f.stat().st_size for f in Path(args.work).rglob("*") if f.is_file())
    how = (f"mlxspec generate --pair {shlex.quote(args.pair)} \"PROMPT\"" if args.pair else
           f"mlxspec generate --target {shlex.quote(args.target)}{adapter} --head {shlex.quote(args.out)} \"PROMPT\" "
           "(or --pair NAME next time: a pair of your models.toml naming it)")
    return (f"draft with it: {how}. The work folder {args.work} holds {sized(size)} of answers and features, "
            "which a rerun (more epochs, --init) reuses: delete it when you are done")
