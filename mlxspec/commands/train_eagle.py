"""`mlxspec train-eagle`: an EAGLE head trained for a target, in MLX (mlxspec/training/)."""

from __future__ import annotations

import argparse
import sys


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
        return train_eagle.run(args) or 0
    except KeyboardInterrupt:
        print(f"\n{train_common.RESUMES}", file=sys.stderr)
        return 130
    except SystemExit as e:  # the stages' own refusals (a work folder made otherwise, no answers): one line
        if isinstance(e.code, str):
            print(f"mlxspec train-eagle: error: {e.code}", file=sys.stderr)
            return 1
        raise
