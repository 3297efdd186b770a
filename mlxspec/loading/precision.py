"""Weights precision at load time: keep quantized, or dequantize to a float dtype.

`dtype` values:
  None / "auto"  the backend's default, DEFAULTS below (on the CPU, models whose float
                 weights would exceed a quarter of RAM stay quantized);
  "quantized"    keep the weights as stored (quantized layers stay quantized);
  "bfloat16", "float16", "float32"
                 dequantize every quantized layer (`mx.dequantize`, QuantizedLinear ->
                 Linear, QuantizedEmbedding -> Embedding, a mixture's QuantizedSwitchLinear
                 -> SwitchLinear) and cast all float parameters.

Defaults come from `scripts/measure_precision.py` (figures in `mlxspec/loading/README.md`):
on a GPU (Metal, or MLX's CUDA backend), quantized (memory bandwidth bound, fewer bytes
win, and the quantized matmul has a many-rows kernel for verify passes); on the CPU
backend, float32 when mlxspec loaded an optimised BLAS for MLX (`mlxspec.blas`: one token
1.8x and five tokens 2.8x faster than bfloat16, verifying 5 tokens ~1.7x one), else
bfloat16 -- with MLX's bundled reference BLAS verifying 5 tokens costs ~2.1-2.7x one token
in bfloat16 against ~4x quantized or float32, and cheap multi-token passes are what
speculative decoding needs.
"""

from __future__ import annotations

import mlx.core as mx

from .. import blas
from ..choices import DTYPES
from ..device import backend
from ..errors import InvalidArgumentError

DEFAULTS = {"metal": "quantized", "cuda": "quantized", "cpu": "bfloat16"}
AUTO_MEMORY_FRACTION = 0.25  # "auto" dequantizes only models whose float weights fit in this share of RAM


def quantized_layers():
    """The quantized layer classes this module dequantizes (mlx's, and mlx-lm's experts)."""
    import mlx.nn as nn
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear

    return nn.QuantizedLinear, nn.QuantizedEmbedding, QuantizedSwitchLinear


def default_dtype() -> str:
    """This backend's default precision, before any memory check."""
    if backend() == "cpu" and blas.fast():
        return "float32"
    return DEFAULTS[backend()]


def auto_dtype(model) -> str:
    """The backend's default for `model`; on the CPU, fall back from float32 to bfloat16, then to
    quantized, while the float weights would take more than AUTO_MEMORY_FRACTION of physical memory."""
    return auto_dtype_for(lambda itemsize: dequantized_bytes(model, itemsize))


def auto_dtype_for(float_bytes) -> str:
    """`auto_dtype` for a model not built yet: `float_bytes(itemsize)` is what its weights would
    take as floats of `itemsize` bytes."""
    choice = default_dtype()
    budget = AUTO_MEMORY_FRACTION * physical_memory()
    if choice == "float32" and float_bytes(4) > budget:
        choice = "bfloat16"
    if choice != "quantized" and float_bytes(2) > budget:
        return "quantized"
    return choice


def dequantized_bytes(model, itemsize: int) -> int:
    """Bytes of the model's parameters if every weight were a float of `itemsize` bytes."""
    from mlx.utils import tree_flatten

    total = 0
    for _, m in model.named_modules():
        if isinstance(m, quantized_layers()):
            total += m.weight.size * 32 // m.bits * itemsize
    quantized = ("weight", "scales", "biases")
    for name, v in tree_flatten(model.parameters()):
        if not (name.endswith(quantized) and _owner_is_quantized(model, name)):
            total += v.size * itemsize
    return total


def _owner_is_quantized(model, name: str) -> bool:
    owner = model
    for part in name.split(".")[:-1]:
        owner = owner[int(part)] if isinstance(owner, list) else owner[part]
    return isinstance(owner, quantized_layers())


def physical_memory() -> int:
    """Bytes of RAM (unified memory on Apple Silicon)."""
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def resolve_dtype(dtype: str | None) -> str:
    """The concrete choice for `dtype` (None / "auto" -> this backend's default).

    Raises:
        InvalidArgumentError: `dtype` is not one of DTYPES.
    """
    if dtype is None or dtype == "auto":
        return default_dtype()
    if dtype not in DTYPES:
        raise InvalidArgumentError(f"[load] dtype must be one of {DTYPES} or None, got {dtype!r}")
    return dtype


def apply_dtype(model, dtype: str | None):
    """Set `model`'s precision in place (see the module docstring); returns the concrete choice."""
    choice = auto_dtype(model) if dtype in (None, "auto") else resolve_dtype(dtype)
    if choice == "quantized":
        return choice
    dequantize(model, getattr(mx, choice))
    model.set_dtype(getattr(mx, choice))
    mx.eval(model.parameters())
    return choice


def dequantize(model, dtype) -> None:
    """Replace QuantizedLinear / QuantizedEmbedding / QuantizedSwitchLinear by Linear / Embedding /
    SwitchLinear, in place.

    The product scale * q + bias is formed in float32 and rounded once to `dtype`
    (float16 scales would otherwise round it to float16 first).
    """
    import mlx.nn as nn
    from mlx.utils import tree_unflatten
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear

    replaced = []
    for name, m in model.named_modules():
        if not isinstance(m, quantized_layers()):
            continue
        w = dequantized_weight(m).astype(dtype)
        if isinstance(m, nn.QuantizedEmbedding):
            new = nn.Embedding(*w.shape)
        elif isinstance(m, QuantizedSwitchLinear):  # (experts, out, in)
            new = SwitchLinear(w.shape[2], w.shape[1], w.shape[0], bias="bias" in m)
        else:
            new = nn.Linear(w.shape[1], w.shape[0], bias="bias" in m)
        if "bias" in m:
            new.bias = m.bias
        new.weight = w
        replaced.append((name, new))
    if replaced:
        model.update_modules(tree_unflatten(replaced))


def dequantized_weight(m) -> mx.array:
    """A quantized layer's weight (`quantized_layers`) in float32, scale * q + bias formed in
    float32 (float16 scales would otherwise round it to float16 first)."""
    biases = m.get("biases")
    return mx.dequantize(m.weight, m.scales.astype(mx.float32),
                         None if biases is None else biases.astype(mx.float32),
                         group_size=m.group_size, bits=m.bits, mode=m.mode)
