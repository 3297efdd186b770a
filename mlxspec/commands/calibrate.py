"""`mlxspec calibrate`: measure this device's verify-cost curve V(j) and save it in the mlxspec cache."""

from __future__ import annotations

import argparse

from .argtypes import positive
from .modelargs import add_model_args


def pass_length(s: str) -> int:
    """The longest pass the engine verifies: MAX_DRAFT drafts + 1 token."""
    from ..prompts import MAX_DRAFT

    n = positive(s)
    if n > MAX_DRAFT + 1:
        raise argparse.ArgumentTypeError(f"expected an integer in 1..{MAX_DRAFT + 1} (the longest pass the engine "
                                         f"verifies), got {s!r}")
    return n


def register(subparsers) -> None:
    from ..calibration import MAX_J, PREFIX, REPEATS

    p = subparsers.add_parser("calibrate", help="measure the target's verify-cost curve on this device",
                              description=__doc__)
    # the curve is timed without a window; a head is not timed; the drafter plays no part
    add_model_args(p, window=False, head=False, drafter=False)
    p.add_argument("--max-j", type=pass_length, default=MAX_J, metavar="J",
                   help=f"longest pass timed, tokens, at most 33 (default {MAX_J})")
    p.add_argument("--prefix", type=positive, default=PREFIX, metavar="N", help=f"KV tokens before each pass (default {PREFIX})")
    p.add_argument("--repeats", type=positive, default=REPEATS, metavar="N", help=f"timings per length, median kept (default {REPEATS})")
    p.add_argument("--no-save", action="store_true", help="print the curve without saving it")
    p.set_defaults(func=run)


def run(args) -> int:
    from rich.console import Console

    from ..bench.report import report_console
    from . import modelargs

    err = Console(stderr=True)
    with err.status("loading models"):
        engine = modelargs.load_engine(args)
    return calibrate_engine(engine, args, out=report_console(), err=err)


def calibrate_engine(engine, args, *, out, err) -> int:
    from rich.table import Table

    from ..calibration import bad_copy, calibrate, calibration_path, implausible, save, unreadable

    from ..errors import InvalidArgumentError
    from ..modelmeta import context_length

    for role, model in (("target", engine.target_model), ("draft", engine.draft_model)):
        context = context_length(model) if model is not None else None
        if context is not None and args.prefix + args.max_j > context:  # timed past it, the passes mean nothing
            raise InvalidArgumentError(f"--prefix {args.prefix} and --max-j {args.max_j} time passes up to position "
                                       f"{args.prefix + args.max_j}, past the {role}'s context of {context} tokens: "
                                       f"use --prefix {context - args.max_j} or less")
    broken = False if args.no_save else bool(unreadable())
    if broken:  # said before minutes of timing, not after
        err.print(f"warning: {calibration_path()} is not a readable calibration file; this calibration "
                  f"replaces it (the old one is kept beside it, as {bad_copy(calibration_path()).name})")
    with err.status("timing target passes"):
        entry = calibrate(engine.target_model, engine.draft_model, max_j=args.max_j, prefix=args.prefix,
                          repeats=args.repeats)
    t = Table(title=f"Verify cost on {entry['backend']} {entry['device']} ({entry['key']})")
    for col in ("j", "seconds", "V(j)/V(1)", "per token"):
        t.add_column(col, justify="right")
    for j, s in entry["seconds"].items():
        r = entry["ratios"][j]
        t.add_row(j, f"{s * 1e3:.2f} ms", f"{r:.2f}", f"{r / int(j):.2f}")
    out.print(t)
    for name, c in entry["draft_cost"].items():
        out.print(f"drafter {name}: {c:.3f} target steps per drafted token")
    out.print("(an EAGLE head is not timed here: the engine times its steps as it drafts)")
    disturbed = implausible(entry)
    if disturbed:  # more tokens never cost less: something else ran beside the timing
        err.print(f"warning: this curve has timings no pass can have ({'; '.join(disturbed)}): more tokens never "
                  f"cost less, so something disturbed the timing (another process?). "
                  + ("Run `mlxspec calibrate` again on an idle machine." if args.no_save else
                     "Not saved (the saved curve, if any, stays): run `mlxspec calibrate` again on an idle machine."))
    if args.no_save:
        return 0
    if disturbed:
        return 1
    path = save(entry, replace_unreadable=broken)
    err.print(f"saved to {path}")
    return 0
