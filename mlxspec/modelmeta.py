"""Facts about a loaded mlx-lm model that the engine, the loader and the calibration share."""

from __future__ import annotations

from typing import Optional

import mlx.core as mx
from mlx.utils import tree_flatten

from .errors import InvalidArgumentError


def check_model(name: str, model) -> None:
    """Raise InvalidArgumentError unless `model` can run (a name or path given to `Engine`
    instead of a model would fail later as "'str' object is not callable")."""
    if not callable(model):
        hint = f"; to load one by name or path, use mlxspec.load({model!r})" if isinstance(model, str) else ""
        raise InvalidArgumentError(f"{name} must be an mlx-lm model (as mlx_lm.load returns), "
                                   f"got {type(model).__name__}{hint}")


def weights_bytes(model) -> int:
    """Bytes held by the model's parameters (packed weights, scales and biases included)."""
    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


def declared_vocab(model) -> Optional[int]:
    """The vocabulary (logit) width its args declare (also under `text_config`), or None."""
    args = getattr(model, "args", None)
    width = getattr(args, "vocab_size", None)
    if width is None:
        text = getattr(args, "text_config", None) or {}
        width = text.get("vocab_size") if isinstance(text, dict) else getattr(text, "vocab_size", None)
    return int(width) if width else None


def logit_width(model) -> int:
    """The declared vocabulary width, else the width of one forward pass's logits."""
    return declared_vocab(model) or int(model(mx.array([[0]], dtype=mx.uint32)).shape[-1])


def context_length(model) -> Optional[int]:
    """The trained context its args declare, or None."""
    n = getattr(getattr(model, "args", None), "max_position_embeddings", None)
    return n if isinstance(n, int) and n > 0 else None


def matmul_precision(model) -> str:
    """What its weights multiply in: "quantized" when any are (their `scales`), else the float
    dtype of its weights ("float32", "bfloat16", "float16")."""
    params = tree_flatten(model.parameters())
    if any(name.endswith(".scales") for name, _ in params):
        return "quantized"
    dtype = next((v.dtype for name, v in params if name.endswith("weight") and mx.issubdtype(v.dtype, mx.floating)),
                 mx.float32)
    return str(dtype).split(".")[-1]
