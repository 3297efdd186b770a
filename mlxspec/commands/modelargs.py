"""Model-choosing options shared by `bench` and `calibrate` (not a command itself)."""

from __future__ import annotations

from ..errors import InvalidArgumentError

DEFAULT_PAIR = "demo"


def add_model_args(p) -> None:
    p.add_argument("--pair", metavar="NAME", help=f"a models.toml pair name (default: {DEFAULT_PAIR!r} unless --target is given)")
    p.add_argument("--target", metavar="REF", help="target model: a folder, a .gguf file or a Hugging Face repo id (default: the pair's target)")
    p.add_argument("--draft", metavar="REF", help="draft model reference, or 'ngram' / 'none' (default: the pair's draft)")
    p.add_argument("--dtype", choices=["auto", "quantized", "bfloat16", "float16", "float32"], default=None,
                   help="precision of both models (default: the backend's default)")
    p.add_argument("--max-kv-size", type=int, default=None, metavar="W", help="KV window in tokens (default: unbounded)")


def load_engine(args, **kw):
    """`mlxspec.load` for the parsed options; the loader is imported only here (it pulls in MLX)."""
    if args.pair and args.target:
        raise InvalidArgumentError(f"give --pair or --target, not both (got --pair {args.pair!r} --target {args.target!r})")
    import mlxspec

    ref = args.pair or args.target or DEFAULT_PAIR
    return mlxspec.load(ref, args.draft, dtype=args.dtype, max_kv_size=args.max_kv_size, **kw)
