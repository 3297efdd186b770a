"""Weights precision at load time: keep quantized, or dequantize to a float dtype.

`dtype` values:
  None / "auto"  the backend's default, DEFAULTS below;
  "quantized"    keep the weights as stored (quantized layers stay quantized);
  "bfloat16", "float16", "float32"
                 dequantize every quantized layer (`mx.dequantize`, QuantizedLinear ->
                 Linear, QuantizedEmbedding -> Embedding) and cast all float parameters.

Defaults come from `scripts/measure_precision.py` (figures in `mlxspec/loading/README.md`):
on Metal, quantized (memory bandwidth bound, fewer bytes win); on the CPU backend,
bfloat16 -- verifying 5 tokens costs ~1.2x one token there, against ~4x when quantized,
and cheap multi-token passes are what speculative decoding needs.
"""

from __future__ import annotations

import mlx.core as mx

from ..errors import InvalidArgumentError

DTYPES = ("auto", "quantized", "bfloat16", "float16", "float32")
DEFAULTS = {"metal": "quantized", "cpu": "bfloat16"}


def backend() -> str:
    """"metal" when MLX runs on a Metal GPU, else "cpu"."""
    return "metal" if mx.metal.is_available() else "cpu"


def resolve_dtype(dtype: str | None) -> str:
    """The concrete choice for `dtype` (None / "auto" -> this backend's default).

    Raises:
        InvalidArgumentError: `dtype` is not one of DTYPES.
    """
    if dtype is None or dtype == "auto":
        return DEFAULTS[backend()]
    if dtype not in DTYPES:
        raise InvalidArgumentError(f"[load] dtype must be one of {DTYPES} or None, got {dtype!r}")
    return dtype


def apply_dtype(model, dtype: str | None):
    """Set `model`'s precision in place (see the module docstring); returns the concrete choice."""
    choice = resolve_dtype(dtype)
    if choice == "quantized":
        return choice
    from mlx_lm.utils import dequantize_model

    dequantize_model(model)
    model.set_dtype(getattr(mx, choice))
    mx.eval(model.parameters())
    return choice
