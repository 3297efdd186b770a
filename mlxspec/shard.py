"""Split a target model over an `mx.distributed` group, in place.

mlx-lm models shard themselves: `model.shard(group)` (tensor parallelism: every rank holds
1/N of each attention and MLP matrix, two all-sums per layer) and, in some architectures,
`model.model.pipeline(group)` (each rank runs a contiguous block of layers). `shard_model`
picks, in mlx-lm's own order of preference:

1. tensor parallelism, when the model has `shard` and its attention heads divide by N;
2. pipeline parallelism, when the model has `model.pipeline`;
3. tensor parallelism of the MLPs only, when the model has `shard` but its heads do not
   divide (SmolLM2-135M has 9 query and 3 KV heads: `shard` would cut heads in half). The
   attention stays replicated; every layer's MLP is split, one all-sum per layer.

Anything else raises `IncompatibleModelsError` naming the model.
"""

from __future__ import annotations

import mlx.core as mx

from .errors import IncompatibleModelsError

MLP_PROJECTIONS = (("gate_proj", "all-to-sharded"), ("up_proj", "all-to-sharded"), ("down_proj", "sharded-to-all"))


def model_name(model) -> str:
    """The mlx-lm architecture of a model, e.g. "llama"."""
    return getattr(model, "model_type", None) or type(model).__module__.rsplit(".", 1)[-1]


def shard_model(model, group: "mx.distributed.Group") -> str:
    """Shard `model` over `group` in place; returns how: "tensor", "pipeline", "tensor-mlp" or "none" (size 1).

    Raises:
        IncompatibleModelsError: the model supports no sharding that fits `group.size()`.
    """
    n = group.size()
    if n == 1:
        return "none"
    args = getattr(model, "args", None)
    heads = getattr(args, "num_attention_heads", None)
    kv_heads = getattr(args, "num_key_value_heads", None) or heads
    if hasattr(model, "shard") and heads and heads % n == 0 and kv_heads % n == 0:
        model.shard(group)
        return "tensor"
    whys = []
    if hasattr(model, "shard"):
        whys.append(f"its {heads} attention heads ({kv_heads} KV) do not divide by {n} ranks")
    if hasattr(getattr(model, "model", None), "pipeline"):
        layers = len(model.model.layers)
        if layers >= n:
            model.model.pipeline(group)
            return "pipeline"
        whys.append(f"its {layers} layer{' is' if layers == 1 else 's are'} too few to pipeline over {n} ranks")
    if hasattr(model, "shard"):  # the MLPs alone, which the others could not place
        mlp_why = _shard_mlps(model, group)
        if mlp_why is True:
            return "tensor-mlp"
        whys.append(mlp_why)
    why = ", ".join(whys[:-1]) + " and " + whys[-1] if whys else "it has neither `shard` nor `model.pipeline`"
    raise IncompatibleModelsError(
        f"the target {model_name(model)} cannot be sharded over {n} ranks: {why}; use a model whose mlx-lm "
        f"class supports tensor parallelism (llama, qwen2, mistral, ...) or pipelining")


def _shard_mlps(model, group):
    """Tensor-parallel MLPs (attention replicated): True, or why not (a string)."""
    from mlx.nn.layers.distributed import shard_linear

    n = group.size()
    layers = getattr(getattr(model, "model", None), "layers", None) or []
    mlps = [getattr(layer, "mlp", None) for layer in layers]
    if not mlps or not all(m is not None and all(hasattr(m, p) for p, _ in MLP_PROJECTIONS) for m in mlps):
        return "its MLPs are not gate/up/down projections"
    for m in mlps:  # the MLP's inner size must split into N equal parts (whole quantization groups)
        group_size = getattr(m.down_proj, "group_size", None) or 1
        if _inner_dims(m.down_proj) % (n * group_size):
            unit = f" quantization groups of {group_size}" if group_size > 1 else ""
            return f"its MLPs' inner size {_inner_dims(m.down_proj)} does not split into {n} equal parts{unit}"
    for m in mlps:
        for proj, how in MLP_PROJECTIONS:
            setattr(m, proj, shard_linear(getattr(m, proj), how, group=group))
    return True


def _inner_dims(linear) -> int:
    # Quantized weights pack 32 // bits values into each uint32 column.
    bits = getattr(linear, "bits", None)
    return linear.weight.shape[-1] * (32 // bits if bits else 1)
