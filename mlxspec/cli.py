"""`mlxspec` command line: one sub-command per module in `mlxspec/commands/`.

Each command module defines `register(subparsers)`, which adds its parser and sets
`func` (called with the parsed args, returning an exit status). Modules import heavy
dependencies inside `func`, so `mlxspec --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# Order shown in --help.
COMMANDS = ["generate", "chat", "serve", "embed", "bench", "calibrate", "train_eagle", "models", "pull"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlxspec",
        description=(
            "Lossless speculative decoding on MLX. A small drafter (an EAGLE head reading the "
            "target's features, a draft model, or an n-gram drafter) proposes tokens, the target "
            "verifies them in one pass; the output is the target's own (greedy: "
            "token for token, up to rounding at near-ties in low precision; sampled: the same "
            "distribution)."
        ),
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"mlxspec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"mlxspec.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"mlxspec.commands.{name}":
                continue  # command not built yet
            raise
        module.register(sub)
    return parser


def parser_args(parser: argparse.ArgumentParser, argv) -> argparse.Namespace:
    """`parse_args`, but an unknown option is reported with the sub-command's usage, not the
    top-level one (argparse leaves those to the top-level parser)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        command = subparsers.choices.get(getattr(args, "command", None) or "", parser)
        hints = _hints(extra, args)
        command.error(f"unrecognized arguments: {' '.join(extra)}" + (f" ({'; '.join(hints)})" if hints else ""))
    return args


# mlx-lm's flags (mlx_lm.generate, mlx_lm.server) that are spelt otherwise here
MLX_LM_FLAGS = {
    "--model": "mlx-lm's --model is --target REF here (a Hugging Face repo, a folder or a GGUF), or --pair NAME "
               "for a curated pair (mlxspec models)",
    "--prompt": "the prompt is the positional argument here: mlxspec generate \"TEXT\"",
    "-p": "the prompt is the positional argument here: mlxspec generate \"TEXT\"",
    "--draft-model": "mlx-lm's --draft-model is --draft REF here",
    "--num-draft-tokens": "mlx-lm's --num-draft-tokens is --num-draft N here",
    "--ignore-chat-template": "mlx-lm's --ignore-chat-template is --no-chat-template here",
}


def _hints(extra: list, args: argparse.Namespace) -> list:
    """What the unrecognized arguments were probably meant as."""
    hints, words, value = [], [], False
    for arg in extra:
        hint = MLX_LM_FLAGS.get(arg.split("=", 1)[0])
        if hint and hint not in hints:
            hints.append(hint)
        if not arg.startswith("-") and not value:
            words.append(arg)
        value = bool(hint) and "=" not in arg  # the word after such a flag is its value, not more prompt
    if getattr(args, "command", None) == "chat" and "--distributed" in extra:
        hints.append("chat does not shard its target, since it races two engines in one process; generate, bench "
                     "and serve take --distributed")
    if getattr(args, "command", None) == "generate" and words:
        prompt = getattr(args, "prompt", None)
        hints.append("the prompt is one argument: quote it")
        from .loading.registry import pairs

        try:
            known = pairs()
        except Exception:  # a broken user models.toml is reported where it is used, not in a hint
            known = {}
        if prompt in known:
            hints.append(f"to choose the pair {prompt}, use --pair {prompt}")
    return hints


def _warning_line(message, category, filename, lineno, line=None) -> str:
    """A warning as one line for people at a terminal, not Python's file:line and source line."""
    return f"warning: {message}\n"


def main(argv: list[str] | None = None) -> int:
    import warnings

    from .errors import MlxSpecError

    warnings.formatwarning = _warning_line

    command = "mlxspec"
    try:
        parser = build_parser()
        args = parser_args(parser, argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        command = f"mlxspec {args.command}"
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader that left shows here, not as a traceback at the interpreter's exit
        return status
    except MlxSpecError as e:
        from .commands.wording import for_command_line

        print(f"{command}: error: {for_command_line(str(e))}", file=_errors())
        return 1
    except BrokenPipeError:  # the reader left (`mlxspec models | head`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit flush cannot raise again
        return 141  # 128 + SIGPIPE
    except OSError as e:
        # A folder it cannot use (MLXSPEC_HOME read-only, a path through a file), or output to a
        # full disk (`> /dev/full`): what and where, not a traceback.
        from .paths import cache_dir

        where = f": {e.filename}" if e.filename else ""
        home = str(cache_dir())
        hint = (f" (mlxspec keeps its files in {home}; set MLXSPEC_HOME to a folder it can write)"
                if str(e.filename or "").startswith(home) else "")
        print(f"{command}: error: {e.strerror or e}{where}{hint}", file=_errors())
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=_errors())
        return 130


def _errors():
    """Where an error line goes: stderr, or the real one where a rank other than 0 silenced it
    (`modelargs.quiet_unless_main`): what ended a rank must still be seen."""
    return sys.__stderr__ if getattr(sys.stderr, "name", None) == os.devnull else sys.stderr


if __name__ == "__main__":
    sys.exit(main())
