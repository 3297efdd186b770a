"""Model-choosing options shared by the commands that load models (not a command itself)."""

from __future__ import annotations

from ..choices import DEFAULT_KV_GROUP_SIZE, DEFAULT_QUANTIZED_KV_START, DRAFTERS, DTYPES, KV_BITS, KV_GROUP_SIZES
from ..errors import InvalidArgumentError
from .argtypes import count, folder, kv_window, num_draft, on_off, reference, tree

DEFAULT_PAIR = "demo"


def add_model_args(p, *, window: bool = True, head: bool = True, drafter: bool = True, draft: bool = True) -> None:
    """--pair/--target/--draft/--dtype, and --max-kv-size, the KV quantization flags, --head and
    --draft unless the command has no use for them; `drafter`: whether the command has --drafter,
    which --draft's help names."""
    src = p.add_mutually_exclusive_group()  # argparse says "not allowed with" at parse time
    src.add_argument("--pair", metavar="NAME", type=reference,
                     help=f"a models.toml pair name, see `mlxspec models` (default: {DEFAULT_PAIR!r} unless --target "
                          f"is given)")
    src.add_argument("--target", metavar="REF", type=reference,
                     help="target model: a folder, a .gguf file, a Hugging Face repo id, or one GGUF file "
                          "of a repo as owner/name:QUANT, e.g. :Q4_K_M (default: the pair's target)")
    if draft:
        p.add_argument("--draft", metavar="REF", type=reference,
                       help="draft model reference, or 'ngram' / 'none' (default: the pair's draft; a model given here "
                            "replaces it" + (" and drafts, unless --drafter says otherwise)" if drafter else ")"))
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="weights precision of both models: keep quantized or dequantize (default: auto, per device)")
    p.add_argument("--adapter-path", metavar="PATH", type=folder, default=None,
                   help="a fine-tuned adapter folder written by mlx_lm.lora (adapter_config.json, "
                        "adapters.safetensors), applied to the target as mlx-lm's --adapter-path applies it: the "
                        "output is the adapted target's; the draft and head draft as they are (default: the pair's "
                        "adapter, if it names one)")
    p.add_argument("--fuse-adapter", action="store_true",
                   help="fold the adapter into the target's weights at load, as mlx_lm.fuse does: decoding runs about "
                        "as fast as the base target's (unfused, each adapted linear adds two small matmuls); the "
                        "output is the fused model's, which may part from mlx-lm's unfused at a near-tie (quantized "
                        "layers are quantized again) (default: off)")
    if window:
        p.add_argument("--max-kv-size", type=kv_window, default=None, metavar="W", help="KV window in tokens (default: unbounded)")
        p.add_argument("--kv-bits", type=int, choices=KV_BITS, default=None, metavar="B",
                       help=f"quantize the target's KV cache to B bits ({', '.join(map(str, KV_BITS))}) once the "
                            f"context reaches --quantized-kv-start tokens, as mlx-lm's --kv-bits: less memory for "
                            f"long contexts; greedy text may then part from plain decoding's at near-ties, as in "
                            f"bfloat16 (see the README); not with --max-kv-size (default: full precision)")
        p.add_argument("--kv-group-size", type=int, choices=KV_GROUP_SIZES, default=DEFAULT_KV_GROUP_SIZE,
                       metavar="G", help=f"values sharing a scale with --kv-bits ({', '.join(map(str, KV_GROUP_SIZES))}; "
                                         f"default: {DEFAULT_KV_GROUP_SIZE})")
        p.add_argument("--quantized-kv-start", type=count, default=DEFAULT_QUANTIZED_KV_START, metavar="N",
                       help=f"context length from which --kv-bits quantizes the cache; 0: from the first token "
                            f"(default: {DEFAULT_QUANTIZED_KV_START}, as mlx-lm)")
    if head:
        p.add_argument("--head", metavar="REF", default=None,
                       help="EAGLE head folder or builtin:NAME trained for the target; a head given here drafts, "
                            "unless --drafter or --draft says otherwise (default: the pair's, if it names one)")


def add_drafting_args(p, *, none: bool = True, per_request: bool = False) -> None:
    """--drafter/--num-draft/--tree/--lookup, as `Engine.generate` takes them. `none`: --drafter may
    be none (a chat always drafts on its speculative side); `per_request`: a server's defaults."""
    when = " when a request gives none" if per_request else ""
    p.add_argument("--drafter", choices=[d for d in DRAFTERS if none or d != "none"], default=None,
                   help="who drafts: the draft model, the EAGLE head (--head or the pair's), the n-gram drafter"
                        + (" or nobody" if none else "") + " (default: the pair's drafter on this backend, see "
                        "`mlxspec models`; else the draft model if there is one, else ngram)")
    p.add_argument("--num-draft", type=num_draft, default=None, metavar="auto|N",
                   help=f"tokens drafted per round{when}: auto (default: the cost model picks) or a fixed number "
                        "in 0..32, 0 decoding plainly")
    p.add_argument("--tree", type=tree, default=None, metavar="auto|off|N",
                   help=f"draft trees{when}: auto (default: the cost model sizes them), off (chains only), or at "
                        "most N drafted tokens a round")
    p.add_argument("--lookup", type=on_off, default=None, metavar="on|off",
                   help=f"with the draft model or the EAGLE head{when}: on (default) hands the rounds where the "
                        "text repeats to prompt lookup, and the model's or head's chains copy there; off: the model "
                        "drafts alone")


def drafting_options(args) -> dict:
    """`add_drafting_args`'s flags as the keywords `load` and the engine take (no lookup unless given:
    the engine's default)."""
    return dict(drafter=args.drafter, num_draft=args.num_draft, tree=args.tree,
                **({} if args.lookup is None else {"lookup": args.lookup == "on"}))


def drafting_notes(args) -> list:
    """Drafting flags that the chosen --drafter makes moot: said, not silently ignored."""
    notes = []
    moot = [f for f, v in (("--num-draft", args.num_draft), ("--tree", args.tree), ("--lookup", args.lookup))
            if v is not None]
    if args.drafter == "none" and moot:
        notes.append(f"--drafter none: nothing drafts, so {' and '.join(moot)} "
                     f"{'changes' if len(moot) == 1 else 'change'} nothing")
    elif args.drafter == "ngram" and args.lookup is not None:
        notes.append("--lookup sets a model drafter's (model, eagle) lookup rounds; with --drafter ngram every "
                     "round is a lookup, so it changes nothing")
    if getattr(args, "head", None) is not None and args.drafter in ("ngram", "none"):
        notes.append(f"--head is not loaded: --drafter {args.drafter} drafts without it (--drafter eagle uses it)")
    return notes


def add_template_args(p, *, per_request: bool = False) -> None:
    """--chat-template-args and --reasoning-effort: variables for the chat template, as the
    server's chat_template_kwargs and reasoning_effort give them (`template_options` reads them);
    `per_request`: a server's, which a request's own win over."""
    from ..reasoning import EFFORTS
    from .argtypes import template_args

    if per_request:
        variables = ("variables for the chat template of every chat request, as mlx-lm's server takes them, "
                     "e.g. '{\"enable_thinking\": false}' for Qwen3 (a request's chat_template_kwargs win) "
                     "(default: none)")
        effort = ("reasoning effort for requests that set no reasoning_effort (gpt-oss: low, medium, high; "
                  "the template variable of that name; --chat-template-args wins) (default: the template's own)")
    else:
        variables = ("variables for the chat template, e.g. '{\"enable_thinking\": false}' for Qwen3 to answer "
                     "without thinking (default: none)")
        effort = ("how long a reasoning model thinks (gpt-oss: low, medium, high), the template variable "
                  "reasoning_effort; --chat-template-args wins (default: the template's own)")
    p.add_argument("--chat-template-args", type=template_args, default=None, metavar="JSON", help=variables)
    p.add_argument("--reasoning-effort", choices=EFFORTS, default=None, help=effort)


def template_options(args) -> dict | None:
    """`add_template_args`'s flags as `Engine.generate`'s chat_template_kwargs (None: none given)."""
    kwargs = {} if args.reasoning_effort is None else {"reasoning_effort": args.reasoning_effort}
    kwargs.update(args.chat_template_args or {})
    return kwargs or None


def add_distributed_arg(p) -> None:
    """`--distributed`: for `generate`, `bench` and `serve` (see `quiet_unless_main`)."""
    p.add_argument("--distributed", action="store_true",
                   help="shard the target over the ranks started by `mlx.launch` (e.g. `mlx.launch --hosts "
                        "mac1,mac2 -- mlxspec ... --distributed`; `--backend ring -n 2` on one machine); "
                        "every rank runs the command, only rank 0 prints or writes files (default: off, one process)")


def quiet_unless_main(engine, args=None) -> bool:
    """On ranks other than 0, silence stdout/stderr and drop output files; True on rank 0.

    The other ranks run the same command in lockstep (every target pass is collective); their
    output would repeat rank 0's. The watchdog and the error that ends a command (`cli.main`) still
    reach the real stderr.
    """
    coord = getattr(engine, "coord", None)
    if coord is None or coord.is_main:
        return True
    import os
    import sys

    sys.stdout = sys.stderr = open(os.devnull, "w")
    for name in ("json", "csv", "plot"):
        if args is not None and getattr(args, name, None):
            setattr(args, name, None)
    return False


def load_engine(args, **kw):
    """`mlxspec.load` for the parsed options; the loader is imported only here (it pulls in MLX)."""
    if args.pair and args.target:
        raise InvalidArgumentError(f"give --pair or --target, not both (got --pair {args.pair!r} --target {args.target!r})")
    from ..loading import load

    check_pair(args)
    ref = args.pair or args.target or DEFAULT_PAIR
    kw.setdefault("distributed", getattr(args, "distributed", False))
    draft = kw.pop("draft", getattr(args, "draft", None))
    return load(ref, draft, dtype=args.dtype, max_kv_size=getattr(args, "max_kv_size", None),
                head=getattr(args, "head", None), adapter_path=args.adapter_path,
                fuse_adapter=getattr(args, "fuse_adapter", False), **kv_options(args), **kw)


def check_pair(args) -> None:
    """--pair names a pair of models.toml (`load` would take any model reference, and its error
    would say so rather than list the pairs)."""
    from ..errors import ModelNotFoundError
    from ..loading.registry import pairs
    from ..loading.resolve import did_you_mean

    if args.pair and args.pair not in (known := pairs()):
        raise ModelNotFoundError(f"--pair {args.pair!r} is not a pair in models.toml; pairs: {', '.join(known)} "
                                 f"(`mlxspec models` describes them; --target takes any model)"
                                 + did_you_mean(args.pair))


def kv_options(args) -> dict:
    """The KV quantization flags as `load`'s keywords (none for a command without them)."""
    if getattr(args, "kv_bits", None) is None:
        return {}
    return dict(kv_bits=args.kv_bits, kv_group_size=args.kv_group_size, quantized_kv_start=args.quantized_kv_start)
