"""Model-choosing options shared by `bench` and `calibrate` (not a command itself)."""

from __future__ import annotations

from ..errors import InvalidArgumentError

DEFAULT_PAIR = "demo"


def add_model_args(p) -> None:
    p.add_argument("--pair", help=f"a models.toml pair name (default: {DEFAULT_PAIR!r} unless --target is given)")
    p.add_argument("--target", help="target model: a folder, a .gguf file or a Hugging Face repo id")
    p.add_argument("--draft", help="draft model reference, or 'ngram' / 'none' (default: the pair's draft)")
    p.add_argument("--dtype", choices=["auto", "quantized", "bfloat16", "float16", "float32"], default=None,
                   help="precision of both models (default: the backend's default)")
    p.add_argument("--max-kv-size", type=int, default=None, help="KV window in tokens (default: unbounded)")
    p.add_argument("--head", default=None, help="EAGLE head folder or builtin:NAME for the target (default: the pair's)")


def load_engine(args, **kw):
    """`mlxspec.load` for the parsed options; the loader is imported only here (it pulls in MLX)."""
    if args.pair and args.target:
        raise InvalidArgumentError(f"give --pair or --target, not both (got --pair {args.pair!r} --target {args.target!r})")
    import mlxspec

    ref = args.pair or args.target or DEFAULT_PAIR
    return mlxspec.load(ref, args.draft, dtype=args.dtype, max_kv_size=args.max_kv_size,
                        head=getattr(args, "head", None), **kw)
