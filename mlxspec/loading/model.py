"""Load one model and its tokenizer from a reference: `load_model(ref) -> (model, tokenizer, info)`."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from ..errors import MlxSpecError, one_line
from ..modelmeta import declared_vocab, weights_bytes
from .ondisk import config_context
from .precision import apply_dtype, auto_dtype_for, resolve_dtype
from .resolve import Resolved, resolve_model


@dataclass(frozen=True)
class ModelInfo:
    ref: str  # the reference as given
    source: str  # "demo", "builtin", "local" or "hub"
    format: str  # "gguf" or "mlx"
    path: str  # the file or folder loaded
    quantization: str  # how the weights are stored, e.g. "GGUF Q4_1 (token_embd Q8_0)"
    dtype: str  # precision applied at load: "quantized", "bfloat16", ...
    weights_bytes: int  # bytes of the parameters in memory after load
    vocab_size: int | None  # logit width
    context_length: int | None  # trained context, tokens
    kv_bytes_per_token: int | None  # KV cache bytes one token costs (all layers), as loaded
    sharding: str = "none"  # how the model is split over distributed ranks (see mlxspec.shard)
    adapter: str | None = None  # the fine-tuned adapter's folder applied to it (mlxspec.loading.adapters)
    adapter_kind: str | None = None  # what that adapter is, e.g. "LoRA rank 8 on 16 layers"


def load_model(ref: str | Path, *, dtype: str | None = None, download: bool = True, lazy: bool = False,
               adapter_path: str | Path | None = None, fuse_adapter: bool = False, draft: bool = False):
    """Resolve `ref` (see `mlxspec.loading.resolve`) and load model + tokenizer.

    Args:
        ref: a pair name (its target), "demo:<name>", a folder, a .gguf file or a repo id.
        dtype: None/"auto", "quantized", "bfloat16", "float16" or "float32"
            (see `mlxspec.loading.precision`). Default: None (the backend's default).
        download: fetch what is not cached. Default: True.
        lazy: leave an MLX folder's weights unread until evaluated (so a shard reads only its
            part). Default: False.
        adapter_path: an `mlx_lm.lora` adapter folder to apply after the precision, unfused, as
            mlx-lm's `load(..., adapter_path=...)` does. Default: None.
        fuse_adapter: fold that adapter into the weights (`adapters.fuse_adapter`). Default: False.
        draft: `ref` is a draft (its not-found error may suggest "none" or "ngram"). Default: False.

    Returns:
        `(model, tokenizer, info)`: an mlx-lm model, an mlx-lm `TokenizerWrapper`, a `ModelInfo`.

    Raises:
        ModelNotFoundError, MlxSpecError, IncompatibleModelsError, InvalidArgumentError.
    """
    res = resolve_model(ref, download=download, draft=draft)
    if res.format == "gguf":
        dtype = gguf_dtype(res.path, dtype)
        model, tokenizer, quant, context = _load_gguf(res, dtype)
    else:
        model, tokenizer, quant, context = _load_mlx(res, lazy=lazy)
    applied = apply_dtype(model, dtype)
    adapter_kind = None
    if adapter_path is not None:
        from .adapters import apply_adapter

        adapter_kind = apply_adapter(model, adapter_path)
        if fuse_adapter:
            from .adapters import fuse_adapter as fuse

            how = fuse(model)
            adapter_kind += f", {how}" if how else ""
    info = ModelInfo(
        ref=str(ref), source=res.source, format=res.format, path=str(res.path), quantization=quant,
        dtype=applied, weights_bytes=weights_bytes(model), vocab_size=declared_vocab(model),
        context_length=context, kv_bytes_per_token=_kv_bytes_per_token(model),
        adapter=None if adapter_path is None else str(adapter_path), adapter_kind=adapter_kind,
    )
    return model, tokenizer, info


def gguf_dtype(path, dtype: str | None) -> str:
    """The concrete precision for the GGUF at `path` (None / "auto": see `precision.auto_dtype`),
    chosen before the file is read, so a file read tensor by tensor is decoded straight to it."""
    if dtype not in (None, "auto"):
        return resolve_dtype(dtype)
    from .gguf import tensor_table

    try:
        count = sum(math.prod(t.shape) for t in tensor_table(path))
    except MlxSpecError:
        return resolve_dtype(None)  # the load that follows says what is wrong with the file
    return auto_dtype_for(lambda itemsize: count * itemsize)


def _load_gguf(res: Resolved, dtype: str):
    from .gguf import load_gguf_model, requantized
    from .gguf_tokenizer import tokenizer_from_gguf

    try:
        model, metadata, types = load_gguf_model(res.path, None if dtype == "quantized" else getattr(mx, dtype))
        tokenizer = tokenizer_from_gguf(metadata)
    except MlxSpecError as e:  # said of the file (a target and a draft are two)
        named = "" if str(res.path) in str(e) else f"{res.path}: "
        again = " (`mlxspec pull demo --force` fetches it again)" if res.source == "demo" else ""
        if not (named or again):
            raise
        raise type(e)(f"{named}{e}{again}") from None
    except Exception as e:  # metadata a reader could not use (a key missing, a value of another kind)
        raise MlxSpecError(f"{res.path}: its metadata does not describe a model this loader can build "
                           f"({type(e).__name__}: {one_line(e)})") from None
    matrices = {n: t for n, t in types.items() if not n.endswith("norm.weight")}
    main = Counter(matrices.values()).most_common(1)[0][0] if matrices else "?"
    roles: dict[str, list[str]] = {}  # role -> its types other than the main one (Q4_K_M mixes two in ffn_down)
    for n, t in matrices.items():
        kinds = roles.setdefault(re.sub(r"^blk\.\d+\.", "", n.removesuffix(".weight")), [])
        if t != main and t not in kinds:
            kinds.append(t)
    odd = ", ".join(f"{r} {'/'.join(kinds)}" for r, kinds in roles.items() if kinds)
    quant = f"GGUF {main}" + (f" ({odd})" if odd else "")
    if dtype == "quantized" and (held := requantized(types)):
        quant += f"; {', '.join(held)} held as 8-bit"
    return model, tokenizer, quant, model.args.max_position_embeddings


def _load_mlx(res: Resolved, *, lazy: bool = False):
    from mlx_lm.utils import load_config, load_model as mlx_load_model
    from mlx_lm.utils import load_tokenizer

    from .. import models

    try:
        kind = load_config(res.path).get("model_type")
        classes = {}
        if kind in models.OURS:  # mlx-lm's module for it is not the reference model (mlxspec.models)
            ours = models.module(kind)
            classes["get_model_classes"] = lambda config: (ours.Model, ours.ModelArgs)
        model, config = mlx_load_model(res.path, lazy=lazy, **classes)
        tokenizer = load_tokenizer(res.path, eos_token_ids=config.get("eos_token_id"))
    except Exception as e:  # mlx-lm's and transformers' errors, in one line naming the folder
        raise MlxSpecError(f"cannot load the model in {res.path}: {type(e).__name__}: {one_line(e)}") from None
    q = config.get("quantization")
    if q:
        quant = f"MLX {q.get('bits')}-bit, group {q.get('group_size')}"
    else:
        quant = str(config.get("torch_dtype") or config.get("dtype") or "float")
    return model, tokenizer, quant, config_context(config)


def _kv_bytes_per_token(model) -> int | None:
    # Estimate from the args of a standard decoder; None for layouts it cannot see.
    args = getattr(model, "args", None)
    layers = getattr(args, "num_hidden_layers", None)
    heads = getattr(args, "num_attention_heads", None)
    kv = getattr(args, "num_key_value_heads", None) or heads
    if not (layers and heads and kv):
        return None
    head_dim = getattr(args, "head_dim", None) or args.hidden_size // heads
    # Activations (hence K and V) take the widest float dtype among the parameters.
    size = max((v.dtype.size for _, v in tree_flatten(model.parameters()) if mx.issubdtype(v.dtype, mx.floating)),
               default=2)
    return int(2 * layers * kv * head_dim * size)
