"""The RoPE a config's `rope_scaling` asks for, for mlx-lm models that build a plain one whatever
it says (Mixtral, Qwen2-MoE, Qwen3-MoE): with YaRN (Qwen3-30B-A3B stretched to 128k, as Qwen's
model card says to) or linear scaling they ran unscaled, which past the original context is
another model. HF transformers and llama.cpp scale them; `rebuild` gives each attention the
RoPE mlx-lm's dense models build from the same settings (`initialize_rope`). Configs saved by
transformers 5 nest the base and the scaling under `rope_parameters`, which mlx-lm's dense Qwen3
reads and these did not (Qwen3-MoE's then failed to load, wanting `rope_theta`): `nested_rope`
lifts them out."""

from __future__ import annotations

from mlx_lm.models.rope_utils import initialize_rope


def nested_rope(params: dict) -> dict:
    """A config with transformers 5's `rope_parameters` given the keys these models read:
    `rope_theta`, and `rope_scaling` unless the RoPE is the plain one."""
    nested = params.get("rope_parameters")
    if not isinstance(nested, dict):
        return params
    params = dict(params)
    if params.get("rope_theta") is None and "rope_theta" in nested:
        params["rope_theta"] = nested["rope_theta"]
    if params.get("rope_scaling") is None and nested.get("rope_type", nested.get("type", "default")) != "default":
        params["rope_scaling"] = nested
    return params


def rebuild(model, args) -> None:
    """Replace each layer's plain RoPE with the scaled one `args.rope_scaling` names (a no-op without one)."""
    if not getattr(args, "rope_scaling", None):
        return
    for layer in model.model.layers:
        plain = layer.self_attn.rope
        layer.self_attn.rope = initialize_rope(plain.dims, args.rope_theta, plain.traditional,
                                               args.rope_scaling, getattr(args, "max_position_embeddings", None))
