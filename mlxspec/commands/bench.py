"""`mlxspec bench`: vanilla vs speculative (vs mlx-lm) tokens/s on a prompt suite, interleaved.

    mlxspec bench                                   # demo pair, 8 prompts x 64 tokens
    mlxspec bench --full --num-draft auto,1,2,4,8 --drafter ngram,model --json out.json
    mlxspec bench --check                           # exit 1 if an output shows a bug
    mlxspec bench --synthetic qwen2.5-7b --synthetic-draft qwen2.5-0.5b   # no download: random 4-bit weights
    mlxspec bench --drafter ngram --tree auto,off   # draft trees vs chains side by side
    mlxspec bench --drafter eagle --lookup on,off   # the head with and without its lookup companion

Greedy checks: at temperature 0 every output is compared with vanilla's. At the first
differing token the target recomputes that position in float32 (outside the timing) and
the divergence is classified: "rounding" when float32 ranks the two tokens like the
speculative path, or their float32 gap is within what the working dtype's rounding allows
at that logit magnitude (bfloat16/float16: a few ulps; float32: 1e-3); "bug" otherwise;
"unclassified" when a float32 copy of the weights would not fit in memory. With --kv-bits
the target itself, run in several shapes (context chunkings, verify-pass widths), is the
reference: "rounding" when one shape ranks the two tokens like the speculative path, or the
shapes alone move their gap by at least its size. Bugs print a loud line; rounding divergences are counted. With --check the exit status is 1 when there
is a bug (rounding divergences never fail it); without it, 0. Sampled outputs (--temperature
above 0) are checked the same way: with the bench's --seed every sampled token is the winner
of a race whose noise the seed and the position fix, which drafters run too, so a speculative
output is vanilla's, token for token, and a divergence is judged on the race's scores (mlx-lm
samples otherwise: its sampled runs are not compared).

What "identical" means, per precision: with float32 weights speculative greedy output is
plain decoding's, token for token. With bfloat16, float16 or quantized weights it is
identical up to rounding: a verify pass over k+1 rows sums in another order than one-row
steps, so where the two best logits are within a few ulps the argmax may flip and the texts
part from there (demo pair on a CPU in bfloat16: 0 flips in 2,304 greedy tokens compared;
the rate depends on the device, and the bench counts them). Those are the "rounding" divergences counted
here, never bugs. (MLX's CUDA backend multiplies float32 in TF32, so there float32 rounds too.)

Warm-up, before any timed run: one `engine.warmup()` covers vanilla and every speculative
setting (every verify length, plain steps, model drafters, at each temperature; its timings
seed the cost model), and mlx-lm's speculation runs untimed on the first prompt at each of
its verify lengths, so first-use compilation is never timed. Warm-up seconds are reported
per setting ("warm-up s", JSON `warmup_seconds`), apart from the timed runs.
"""

from __future__ import annotations

import argparse
import os

from ..errors import InvalidArgumentError
from . import argtypes
from .modelargs import add_distributed_arg, add_model_args

DEFAULT_MAX_TOKENS = 64


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="measure whether speculation pays on this machine",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    add_distributed_arg(p)
    p.add_argument("--prompts", metavar="FILE.jsonl", help="your own suite: one JSON object per line with "
                   "'prompt' (or 'messages', a whole conversation in OpenAI's chat format ending with the turn to "
                   "answer) and optional 'id', 'category' (default: the builtin suite)")
    p.add_argument("--full", action="store_true", help="all 24 builtin prompts (default: 8 covering every category; a --prompts file always runs in full)")
    p.add_argument("--limit", type=argtypes.positive, default=None, metavar="N", help="run only the first N selected prompts")
    p.add_argument("--max-tokens", type=argtypes.positive, default=DEFAULT_MAX_TOKENS, metavar="N",
                   help=f"tokens per run (default {DEFAULT_MAX_TOKENS})")
    # The comma lists are read by argparse too: a bad value exits 2 with the usage, as a bad flag does.
    p.add_argument("--temperature", type=comma_list(argtypes.non_negative), default="0", metavar="T[,T...]",
                   help="a value or comma list, e.g. 0,0.7 (default 0)")
    p.add_argument("--num-draft", type=comma_list(argtypes.num_draft), default="auto", metavar="K[,K...]",
                   help="draft lengths, e.g. auto,1,2,4 (default auto)")
    p.add_argument("--drafter", type=comma_list(_drafter_name), default=None, metavar="NAME[,NAME...]",
                   help="drafters, a comma list, e.g. ngram,model (default: the "
                   "pair's default drafter on this device, and its draft model too when it has one)")
    p.add_argument("--tree", type=comma_list(argtypes.tree), default="auto", metavar="TREE[,TREE...]",
                   help="draft trees: auto (the cost model sizes them), off "
                   "(chains only) or a node cap; a comma list compares them, e.g. auto,off (default auto)")
    p.add_argument("--lookup", type=comma_list(argtypes.on_off), default="on", metavar="on|off[,...]",
                   help="a model drafter's (model, eagle) lookup companion: on (rounds where prompt lookup is "
                   "expected to draft faster go to it; the model's or head's chains also copy where the text "
                   "repeats) or off (the model drafts alone); a comma list compares them, e.g. on,off (default on)")
    p.add_argument("--seed", type=argtypes.seed, default=0, help="sampling seed, the same for every run (default 0)")
    p.add_argument("--no-peer", action="store_true", help="skip mlx-lm's speculative decoding (always skipped "
                   "with --max-kv-size, where it cannot roll back a wrapped window, and for models with "
                   "sliding-window layers, whose caches it cannot trim)")
    p.add_argument("--check", action="store_true", help="exit with status 1 when an output (greedy, or sampled "
                   "with the --seed) differs from vanilla by a bug (a divergence float32 does not explain as "
                   "rounding)")
    p.add_argument("--json", metavar="PATH", type=argtypes.data_path, help="write the full results as JSON ('-': "
                   "to stdout, the report then going to stderr)")
    p.add_argument("--csv", metavar="PATH", type=argtypes.data_path, help="write one row per run as CSV ('-': to "
                   "stdout, the report then going to stderr)")
    p.add_argument("--plot", metavar="PATH.png", type=argtypes.output_path, help="write charts (needs matplotlib)")
    from ..bench.synthetic import SHAPES

    shapes = ", ".join(SHAPES)
    p.add_argument("--synthetic", metavar="SHAPE", help="measure the loop on a random-weight 4-bit model of this "
                   f"shape instead of a pair, nothing downloaded: V(j) for j=1..16, host time per round, plain "
                   f"decoding vs mlx-lm's generate_step, n-gram speculation (shapes: {shapes}). Acceptance on "
                   "random weights means nothing: it compares loops, not drafts")
    p.add_argument("--synthetic-draft", metavar="SHAPE", help="with --synthetic: a draft of this shape, to compare "
                   "speculation at k=3 with mlx-lm's speculative decoding on the same draft, and the cost model's k")
    p.add_argument("--repeats", type=argtypes.positive, default=None, metavar="N",
                   help="passes over the prompts, each speculative run paired with the vanilla run of its own "
                   "pass and the medians taken over every pair: steadier per-category figures on a noisy "
                   "machine, at N times the time (default 1); with --synthetic: interleaved repetitions "
                   "(default 5)")
    p.set_defaults(func=run)
    p.set_defaults(bench_defaults=vars(p.parse_args([])))  # what --synthetic refuses when changed


def comma_list(convert):
    """An argparse type: comma list -> values, each read by `convert`; the error names the bad item."""
    def parse(text: str) -> list:
        items = [x.strip() for x in str(text).split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"needs at least one value, got {text!r}")
        out = []
        for x in items:
            try:
                out.append(convert(x))
            except (ValueError, argparse.ArgumentTypeError) as e:  # the converter's message says what is allowed
                raise argparse.ArgumentTypeError(f"{x!r} is not valid: {e}") from None
        return list(dict.fromkeys(out))  # "0,0.0" or "2,02" run once: a repeat would pool its runs twice
    return parse


def _drafter_name(name: str) -> str:
    """Known before loading; whether the pair has that drafter is checked once it is loaded."""
    if name not in ("ngram", "model", "eagle"):
        raise ValueError("expected ngram, model or eagle (vanilla decoding always runs beside them)")
    return name


def run(args) -> int:
    from rich.console import Console

    from ..bench.report import STDOUT, report_console
    from ..bench.prompts import builtin_suite, load_prompts, select

    if args.synthetic or args.synthetic_draft:
        return run_synthetic(args)
    temps, ks, trees, lookups, drafters = args.temperature, args.num_draft, args.tree, args.lookup, args.drafter
    named = _files(args)
    for i, (flag, path) in enumerate(named):
        for other, second in named[i + 1:]:
            if os.path.abspath(path) == os.path.abspath(second):
                raise InvalidArgumentError(f"{flag} and {other} name the same file {path!r}: one would overwrite "
                                           f"the other; give each its own")
    suite = load_prompts(args.prompts) if args.prompts else builtin_suite()  # fail before loading models
    prompts = select(suite, full=args.full or bool(args.prompts), limit=args.limit)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise InvalidArgumentError("--plot needs matplotlib, which is not installed: pip install matplotlib") from None

    from ..distributed import is_distributed, launched_rank
    from . import modelargs

    err = Console(stderr=True)
    if not err.is_terminal and launched_rank() == 0:  # a log gets lines, not a spinner; one rank says it
        err.print("loading models…")
    with err.status("loading models"):
        engine = modelargs.load_engine(args)
    if is_distributed(engine):
        modelargs.quiet_unless_main(engine, args)
        err = Console(stderr=True)  # rebound to the (possibly silenced) stderr
        args.no_peer = True  # mlx-lm's loop decides on each rank alone: its passes would not line up
    code = bench_engine(engine, prompts, args, temps=temps, ks=ks, drafters=drafters, trees=trees, lookups=lookups, err=err,
                        out=report_console(stderr=STDOUT in (args.json, args.csv)),
                        prompts_source=args.prompts or "builtin")
    return code


def _files(args) -> list:
    """The files asked for, as (flag, path), in the order they are written."""
    return [(flag, path) for flag, path in (("--json", args.json), ("--csv", args.csv), ("--plot", args.plot)) if path]


# What --synthetic reads; any other option changed from its default is refused there.
SYNTHETIC_OWN = {"command", "func", "bench_defaults", "synthetic", "synthetic_draft", "max_tokens", "repeats", "json",
                 "pair", "target", "draft"}


def run_synthetic(args) -> int:
    """`--synthetic SHAPE [--synthetic-draft SHAPE]`: see `mlxspec.bench.loopbench`."""
    from rich.console import Console

    from ..device import is_gpu

    from ..bench.loopbench import print_synthetic, run_synthetic as measure
    from ..bench.report import STDOUT, report_console, write_json
    from ..bench.synthetic import check_shape

    if not args.synthetic:
        raise InvalidArgumentError("--synthetic-draft needs --synthetic SHAPE (the target's shape)")
    if args.pair or args.target or args.draft:
        raise InvalidArgumentError("--synthetic builds its own random models: drop --pair/--target/--draft")
    defaults = getattr(args, "bench_defaults", {})
    moot = [f"--{dest.replace('_', '-')}" for dest, default in defaults.items()
            if dest not in SYNTHETIC_OWN and getattr(args, dest, default) != default]
    if moot:
        raise InvalidArgumentError(f"--synthetic runs its own fixed settings on random weights and does not take "
                                   f"{', '.join(moot)}: drop {'it' if len(moot) == 1 else 'them'} (it takes "
                                   f"--synthetic-draft, --max-tokens, --repeats and --json)")
    check_shape(args.synthetic)
    if args.synthetic_draft:
        check_shape(args.synthetic_draft)
    err = Console(stderr=True)
    if not is_gpu():
        err.print("note: on a CPU, MLX multiplies 4-bit weights row by row (no BLAS), so a pass over j tokens "
                  "costs about j one-token passes and this takes minutes even for the smallest shape; the "
                  "synthetic bench is meant for GPUs", soft_wrap=True, highlight=False)
    if err.is_terminal:
        with err.status("synthetic bench") as status:
            doc = measure(args.synthetic, args.synthetic_draft, max_tokens=args.max_tokens,
                          repeats=args.repeats or 5, progress=lambda label: status.update(label))
    else:  # a log gets a line per step, not a spinner it cannot show
        doc = measure(args.synthetic, args.synthetic_draft, max_tokens=args.max_tokens, repeats=args.repeats or 5,
                      progress=lambda label: err.print(f"bench: {label}", soft_wrap=True, highlight=False))
    print_synthetic(doc, report_console(stderr=args.json == STDOUT))
    if args.json:
        write_json(doc, args.json)
        if args.json != STDOUT:
            err.print(f"wrote {args.json}")
    return 0


class ProgressLines:
    """The progress bar's news as plain lines, for stderr that is no terminal (a CI log, a file):
    one line at most every `every` seconds, and one at the end."""

    def __init__(self, console, total: int, every: float = 10.0):
        import time

        self.console, self.total, self.every, self.clock = console, total, every, time.monotonic
        self.done = 0
        self.restart()

    def restart(self) -> None:
        """Time from now: the warm-up before the first run is no run's pace."""
        self.start = self.last = self.clock()

    def advance(self, what: str) -> None:
        self.done += 1
        now = self.clock()
        if self.done < self.total and now - self.last < self.every:
            return
        self.last = now
        elapsed = now - self.start
        left = elapsed / self.done * (self.total - self.done)
        eta = f", about {left:.0f} s left" if self.done < self.total else f" in {elapsed:.0f} s"
        self.console.print(f"bench: {self.done}/{self.total} runs ({what}){eta}", soft_wrap=True, highlight=False)


def bench_engine(engine, prompts, args, *, temps, ks, drafters, err, out, prompts_source, trees=("auto",),
                 lookups=("on",)) -> int:
    """Everything after loading: curve, interleaved runs with a progress bar, report and files."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from ..bench.report import STDOUT, mismatch_line, pair_info, print_report, to_json, write_csv, write_json
    from ..bench.runner import peer_blocker, run_bench, run_tokens, settings_for
    from ..calibration import apply_prior, calibration_path, curve_for

    tokens = run_tokens(engine, prompts, args.max_tokens)
    settings = settings_for(engine, drafters=drafters, num_drafts=ks, peer=not args.no_peer, trees=trees,
                            lookups=lookups, tokens=tokens)
    speculative = [x for x in settings if x.mode == "speculative"]
    if "off" in lookups and not any(x.lookup == "off" for x in speculative):
        err.print("note: --lookup off changes nothing here: only a model drafter (model, eagle) has a lookup "
                  "companion to turn off", soft_wrap=True, highlight=False)
    if len(trees) > 1 and len({x.tree for x in speculative}) < len(trees):
        err.print("note: --tree compares nothing here: these settings draft chains only (a drafter without trees, "
                  "or a fixed --num-draft), so each runs once", soft_wrap=True, highlight=False)
    if getattr(engine, "head_note", None) and any(x.drafter == "eagle" for x in speculative):  # not a mystery
        err.print(f"note: the head {engine.head_ref} was {engine.head_note}, so it may draft less often right "
                  f"here (scripts/train_eagle.py --adapter-path trains one for an adapted target in minutes: "
                  f"README, 'Feature-level drafting')", soft_wrap=True, highlight=False)
    if not args.no_peer and engine.draft_model is not None and (why := peer_blocker(engine, tokens)):
        err.print(f"mlx-lm's speculative decoding is left out: {why}")
    ratios, source = curve_for(engine, measure=False)  # a saved curve, if any; the warm-up times V(j) anyway
    apply_prior(engine, ratios)

    repeats = getattr(args, "repeats", None) or 1
    total = repeats * len(prompts) * len(temps) * len(settings)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    log = None if err.is_terminal else ProgressLines(err, total)  # a pipe or a file: plain lines
    # Compiling every pass shape takes seconds on a CPU and minutes on a GPU's first process: say so.
    warming = "warming up: every pass shape compiles once, untimed"
    with Progress(*columns, console=err, transient=True, disable=log is not None) as bar:
        task = bar.add_task(f"{warming}; the bar counts the {total} timed runs after it", total=total)
        if log is not None:
            err.print(f"bench: {warming}…", soft_wrap=True, highlight=False)

        def on_warmup(seconds):
            bar.update(task, description="bench")
            if log is not None:
                err.print(f"bench: warmed up in {seconds:.1f} s", soft_wrap=True, highlight=False)
                log.restart()

        def on_run(rec):
            what = f"{rec.prompt_id} {rec.mode}" + (f" (pass {rec.repeat + 1}/{repeats})" if repeats > 1 else "")
            bar.update(task, advance=1, description=what)
            if log is not None:
                log.advance(what)

        result = run_bench(engine, prompts, max_tokens=args.max_tokens, temperatures=temps, num_drafts=ks,
                           drafters=drafters, seed=args.seed, peer=not args.no_peer, trees=trees, lookups=lookups,
                           on_run=on_run, repeats=repeats, on_warmup=on_warmup,
                           on_mismatch=lambda rec: err.print(mismatch_line(rec)))

    used = list(dict.fromkeys(s.drafter for s in result.settings if s.mode == "speculative"))
    # The cost models' prior: a `mlxspec calibrate` curve if one was saved (said here, since the
    # warm-up's own V(j) is what the report shows when there is one)
    prior = str(calibration_path()) if source == "calibration file" else None
    if result.curve:  # what the cost model started from: the warm-up's V(j), on this device, this run
        ratios, source = {j: v / result.curve[1] for j, v in result.curve.items()}, "warm-up"
    curve = {"source": source, "path": prior if source == "calibration file" else None,
             "ratios": {str(j): r for j, r in sorted(ratios.items())} if ratios else None, "prior": prior}
    doc = to_json(result, pair=pair_info(engine, used), curve=curve, prompts_source=prompts_source)
    print_report(doc, out)
    if prior:
        out.print(f"the cost models started from the calibration file {prior} (mlxspec calibrate)", soft_wrap=True,
                  highlight=False)
    if len(result.runs) < result.planned_runs:  # Ctrl-C: what ran whole is shown, and no file holds less than asked
        unwritten = [flag for flag, _ in _files(args)]
        out.print(f"interrupted: the figures above cover {len(result.runs)} of the {result.planned_runs} runs "
                  f"planned (each prompt's runs under every setting, or none of them)"
                  + (f"; {', '.join(unwritten)} not written" if unwritten else ""), soft_wrap=True, highlight=False)
        return 130

    def write_plot(doc, path):
        from ..bench.plot import write_plot as plot

        plot(doc, path)

    failed = False
    writers = {"--json": (write_json, doc), "--csv": (write_csv, result), "--plot": (write_plot, doc)}
    for flag, path in _files(args):
        write, what = writers[flag]
        try:
            write(what, path)
        except OSError as e:  # the folder was checked at the start; it can still fail now: say which file
            err.print(f"mlxspec bench: error: cannot write {flag} {path}: {e.strerror or e}", soft_wrap=True,
                      highlight=False, markup=False)
            failed = True
            continue
        if path != STDOUT:
            err.print(f"wrote {path}", soft_wrap=True, highlight=False)
    return 1 if failed or (args.check and doc["summary"]["bugs"]) else 0
