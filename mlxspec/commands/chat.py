"""`mlxspec chat`: a terminal chat that races speculative and vanilla decoding side by side."""

from __future__ import annotations

from ..choices import DTYPES
from .argtypes import kv_window, non_negative, num_draft, positive, reference


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "chat", help="chat TUI racing speculative against vanilla decoding",
        description="Type a message; the same target answers twice, side by side, once speculative and once "
                    "vanilla, with live tokens/s, acceptance and a speedup verdict. Defaults to the demo pair.")
    p.add_argument("--pair", metavar="NAME", type=reference, help="a named pair (default: demo)")
    p.add_argument("--target", metavar="REF", type=reference, help="target model (instead of --pair)")
    p.add_argument("--draft", metavar="REF", type=reference, help="draft model for --target")
    p.add_argument("--drafter", choices=["model", "eagle", "ngram"],
                   help="who drafts (default: the pair's drafter on this backend, else the draft model if any, "
                        "else ngram); eagle needs a head")
    p.add_argument("--head", metavar="REF", help="EAGLE head folder (or builtin:NAME) for the target (default: the pair's)")
    p.add_argument("--num-draft", metavar="auto|N", type=num_draft, default=None,
                   help="draft length: auto (cost model, default) or a fixed N")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="weights precision: keep quantized or dequantize (default: auto, per device)")
    p.add_argument("--temperature", type=non_negative, default=0.0, metavar="T", help="0 = greedy (default)")
    p.add_argument("--max-tokens", type=positive, default=256, metavar="N", help="answer length limit (default 256)")
    p.add_argument("--max-kv-size", type=kv_window, default=None, metavar="W", help="sliding KV window (default: none)")
    p.add_argument("--system", default="", metavar="TEXT", help="system prompt")
    p.add_argument("--sequential", action="store_true",
                   help="run speculative to the end, then vanilla (default: interleave so both panes fill together)")
    p.add_argument("--no-colour", dest="colour", action="store_false", help="start with Markdown, not token colours")
    p.set_defaults(func=run, _parser=p)


def run(args) -> int:
    if args.pair and (args.target or args.draft):
        args._parser.error("give either --pair NAME or --target REF [--draft REF], not both")
    if args.draft and not args.target:
        args._parser.error("--draft needs --target")
    ref = args.target or args.pair or "demo"
    label = (f"{ref} + {args.draft}" if args.draft else ref) if args.target else f"the {ref} pair"

    def loader():
        from mlxspec.errors import MlxSpecError

        try:
            from mlxspec.loading import load
        except ImportError as e:
            raise MlxSpecError(f"model loading is not available in this install ({e})") from None
        return load(ref, args.draft, dtype=args.dtype, drafter=args.drafter, max_kv_size=args.max_kv_size,
                    num_draft=args.num_draft, head=args.head)

    from tui import make_app

    app = make_app(loader=loader, loading_label=label, sequential=args.sequential, temperature=args.temperature,
                   max_tokens=args.max_tokens, num_draft=args.num_draft, drafter=args.drafter,
                   system=args.system, colour=args.colour)
    app.run()
    return app.return_code or 0
