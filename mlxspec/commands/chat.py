"""`mlxspec chat`: a terminal chat that races speculative and vanilla decoding side by side."""

from __future__ import annotations

import sys

from ..errors import InvalidArgumentError
from .argtypes import non_negative, positive, seed
from . import modelargs
from .modelargs import DEFAULT_PAIR, add_drafting_args, add_model_args, add_template_args


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "chat", help="chat TUI racing speculative against vanilla decoding",
        description="Type a message; the same target answers twice, side by side, once speculative and once "
                    "vanilla, with live tokens/s, acceptance and a speedup verdict. Defaults to the demo pair.")
    add_model_args(p)
    add_drafting_args(p, none=False)
    p.add_argument("--seed", type=seed, default=None,
                   help="random seed for sampled answers: both sides and every turn draw with it (default: "
                        "none, a fresh seed per turn, shared by both sides); either way the two sides write "
                        "the same text (README: Seeds)")
    p.add_argument("--temperature", type=non_negative, default=0.0, metavar="T", help="0 = greedy (default)")
    p.add_argument("--max-tokens", type=positive, default=256, metavar="N", help="answer length limit (default 256)")
    p.add_argument("--system", default="", metavar="TEXT", help="system prompt")
    p.add_argument("--resume", metavar="PATH", help="go on with a conversation /save wrote (PATH.json): its turns "
                                                    "and system prompt (--system replaces it); the settings are "
                                                    "this session's")
    add_template_args(p)
    p.add_argument("--sequential", action="store_true",
                   help="run speculative to the end, then vanilla (default: interleave so both panes fill together)")
    p.add_argument("--no-colour", dest="colour", action="store_false", help="start with Markdown, not token colours")
    p.set_defaults(func=run, _parser=p)


def run(args) -> int:
    if args.draft == "none":
        args._parser.error("--draft none leaves the speculative side nothing to draft with; give a draft model, "
                           "ngram, or leave it out for the pair's")
    if not _on_a_terminal():  # the full-screen UI would write escape codes into the file and wait for keys
        raise InvalidArgumentError("mlxspec chat is a full-screen terminal app, and its stdin or stdout is not a "
                                   "terminal; for answers in a script or a file use `mlxspec generate` (or "
                                   "`mlxspec serve`)")
    _check_references(args)
    resume = None
    if args.resume is not None:  # read before the UI starts: a bad file is one line here
        from tui.conversation import read_saved

        resume = read_saved(args.resume)
        resume.system = args.system or resume.system
    ref = args.target or args.pair or DEFAULT_PAIR
    label = (f"{ref} + {args.draft}" if args.draft else ref) if args.target else f"the {ref} pair"

    drafting = modelargs.drafting_options(args)

    def loader():
        return modelargs.load_engine(args, **drafting)

    from tui import make_app

    app = make_app(loader=loader, loading_label=label, sequential=args.sequential, temperature=args.temperature,
                   max_tokens=args.max_tokens, system=args.system, colour=args.colour, seed=args.seed,
                   template_kwargs=modelargs.template_options(args), resume=resume, **drafting)
    app.run()
    return app.return_code or 0


def _on_a_terminal() -> bool:
    return sys.stdin.isatty() and sys.stdout.isatty()


def _check_references(args) -> None:
    """The models named resolve to files, before the UI starts: a bad reference is one line here,
    not a screen. Cheap: nothing is loaded, and nothing fetched (what is not cached yet the loader
    fetches behind its loading screen)."""
    from ..choices import WEIGHTLESS_DRAFTERS
    from ..loading.resolve import NotCachedError, resolve_model

    modelargs.check_pair(args)
    for ref in (args.target or args.pair or DEFAULT_PAIR, args.draft, args.head):
        if ref is None or ref in WEIGHTLESS_DRAFTERS:
            continue
        try:
            resolve_model(ref, download=False)
        except NotCachedError:
            pass
