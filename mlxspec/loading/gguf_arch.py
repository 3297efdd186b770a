"""What a GGUF's architecture is in mlx-lm: its model type, its `ModelArgs` from the file's
metadata (with what llama.cpp fixes that the file does not say), and its tensors' names.

Architectures (`general.architecture`): llama (Llama 2/3, Mistral, TinyLlama, SmolLM2; with
experts, Mixtral), smollm3, granite, olmo2, qwen2, qwen3, qwen2moe, qwen3moe, gemma
(`mlxspec.models.gemma`: mlx-lm's with the tanh GELU), gemma2 (`mlxspec.models.gemma2`: mlx-lm's
with its sliding window), gemma3, phi3 and gpt-oss (its experts' MXFP4 kept as MLX's "mxfp4").
"""

from __future__ import annotations

import math
import re

import mlx.core as mx

from .. import models
from ..errors import IncompatibleModelsError

# GGUF architecture -> mlx-lm model type (`models.module` finds its module). Mistral-style and
# SmolLM2 files say "llama".
MODULES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma": "gemma", "gemma2": "gemma2",
           "gemma3": "gemma3_text",
           "phi3": "phi3", "qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "smollm3": "smollm3",
           "granite": "granite", "olmo2": "olmo2", "gpt-oss": "gpt_oss"}
LLAMA_ROWS = ("llama", "mixtral", "smollm3", "granite")  # model types whose Q/K rows llama.cpp permutes
SUPPORTED_ARCHITECTURES = tuple(MODULES)
# Model types whose model builds its RoPE from `rope_scaling` (mlx-lm's `initialize_rope`; the
# mixtures through `mlxspec.models.scaled_rope`), the same on every layer; Gemma 1 and 2 would run it unscaled.
YARN_TYPES = ("llama", "qwen2", "qwen3", "granite", "olmo2", "gpt_oss", "mixtral", "qwen2_moe", "qwen3_moe")
LINEAR_TYPES = YARN_TYPES + ("smollm3", "gemma3_text", "phi3")  # Gemma 3: its global layers, as llama.cpp

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",  # qwen3
    "attn_k_norm": "self_attn.k_norm",
}
# OLMo 2 norms only after attention and after the MLP (and Q, K as wholes: qwen3's names).
_OLMO2_BLOCK_NAMES = {**_BLOCK_NAMES, "post_attention_norm": "post_attention_layernorm",
                      "post_ffw_norm": "post_feedforward_layernorm"}
# Gemma 2 and 3 norm each side of attention and of the MLP; llama.cpp calls the one before the MLP ffn_norm.
_GEMMA_BLOCK_NAMES = {
    **_BLOCK_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# A mixture's router and experts (each stacked: experts x rows x cols); Qwen2's also a shared expert.
_MOE_NAMES = {
    "ffn_gate_inp": "gate", "ffn_gate_exps": "switch_mlp.gate_proj", "ffn_up_exps": "switch_mlp.up_proj",
    "ffn_down_exps": "switch_mlp.down_proj", "ffn_gate_inp_shexp": "shared_expert_gate",
    "ffn_gate_shexp": "shared_expert.gate_proj", "ffn_up_shexp": "shared_expert.up_proj",
    "ffn_down_shexp": "shared_expert.down_proj",
}
_QWEN_MOE_BLOCK_NAMES = {**_BLOCK_NAMES, **{k: f"mlp.{v}" for k, v in _MOE_NAMES.items()}}
_MIXTRAL_BLOCK_NAMES = {**_BLOCK_NAMES, **{k: f"block_sparse_moe.{v}" for k, v in _MOE_NAMES.items()}}
# gpt-oss: biases on Q, K, V, O, the router and the experts; a sink per head; the norm before the
# MLP is the file's post_attention_norm (HF's and mlx-lm's name); its experts are `experts`, its router `router`.
_GPT_OSS_BLOCK_NAMES = {**_BLOCK_NAMES, "post_attention_norm": "post_attention_layernorm",
                        "attn_sinks": "self_attn.sinks", "ffn_gate_inp": "mlp.router",
                        "ffn_gate_exps": "mlp.experts.gate_proj", "ffn_up_exps": "mlp.experts.up_proj",
                        "ffn_down_exps": "mlp.experts.down_proj"}
_BARE = ("self_attn.sinks",)  # parameters of their own, not a layer's `.weight`
MIXTURES = ("qwen2_moe", "qwen3_moe", "mixtral", "gpt_oss")
_PER_EXPERT = re.compile(r"blk\.\d+\.ffn_(gate|up|down)\.\d+\.weight$")
# Phi-3 keeps Q, K and V in one matrix, and the MLP's gate and up in another (gate first).
_PHI3_BLOCK_NAMES = {**_BLOCK_NAMES, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|scales|biases|bias)$")
_GLOBAL = re.compile(r"(\w+)\.(weight|scales|biases|bias)$")


def model_args_from_metadata(metadata: dict, tensor_names, rope_factors: dict | None = None):
    """mlx-lm `ModelArgs` of the file's architecture (`args.model_type`: its module is
    `mlxspec.models.module(model_type)`) from GGUF metadata (keys `<arch>.*`). `rope_factors`:
    the file's LongRoPE tensors (`rope_factors_long.weight`, `rope_factors_short.weight`), if any.

    Raises:
        IncompatibleModelsError: the architecture is not one of SUPPORTED_ARCHITECTURES, has
            experts where it should not (or none where it should), or uses partial rotary
            embeddings (Phi-3's family may).
    """
    arch = str(metadata.get("general.architecture", "?"))
    if arch not in SUPPORTED_ARCHITECTURES:
        raise IncompatibleModelsError(
            f"GGUF architecture {arch!r} is not supported; supported: "
            f"{list(SUPPORTED_ARCHITECTURES)} (Llama, Mistral-style and SmolLM2 files say 'llama'; "
            "SmolLM3 'smollm3'; Qwen2 and Qwen2.5 'qwen2'; Qwen3 'qwen3'; Gemma and CodeGemma 'gemma'; "
            "Gemma 2 'gemma2'; Gemma 3 'gemma3'; "
            "Phi-3, Phi-3.5 and Phi-4-mini 'phi3'; Granite 3 'granite'; OLMo 2 'olmo2'; Mixtral 'llama' with "
            "experts; Qwen1.5-MoE and Qwen2-57B 'qwen2moe'; Qwen3's MoE 'qwen3moe'; gpt-oss 'gpt-oss')"
        )

    def get(key, default=None):
        value = metadata.get(f"{arch}.{key}", default)
        return value.item() if isinstance(value, mx.array) else value

    def need(key, kind, default=None):
        """`{arch}.{key}` as a positive `kind` (int or float); what is wrong with it, said."""
        value = get(key, default)
        try:
            number = kind(value)
        except (TypeError, ValueError):
            number = None
        if number is None or not number > 0:
            said = "is missing" if value is None else f"is {value!r}"
            wanted = "an integer >= 1" if kind is int else "a number > 0"
            raise IncompatibleModelsError(f"GGUF metadata {arch}.{key} {said}; {wanted} is needed")
        return number

    names = set(tensor_names)
    experts = int(get("expert_count", 0) or 0)
    model_type = "mixtral" if arch == "llama" and experts else MODULES[arch]
    if model_type in MIXTURES and not experts:
        raise IncompatibleModelsError(f"GGUF metadata {arch}.expert_count is missing; a {arch} file needs it")
    if model_type not in MIXTURES and experts:
        raise IncompatibleModelsError(f"a {arch} GGUF with {experts} experts is not supported; mixtures of "
                                      "experts are read from llama (Mixtral), qwen2moe, qwen3moe and gpt-oss files")
    if any(_PER_EXPERT.match(n) for n in names):
        raise IncompatibleModelsError("this GGUF stores each expert in its own tensor (blk.N.ffn_gate.E.weight, "
                                      "the layout before llama.cpp merged them in 2024); convert or download a "
                                      "current file")
    heads = need("attention.head_count", int)
    hidden = need("embedding_length", int)
    head_dim = need("attention.key_length", int, hidden // heads)
    rope_dims = need("rope.dimension_count", int, head_dim)
    if rope_dims != head_dim and arch != "phi3":
        raise IncompatibleModelsError(
            f"partial rotary embeddings (rope dims {rope_dims} of head dim {head_dim}) are not supported"
        )
    rope_scaling = None
    scaling = get("rope.scaling.type")
    if scaling == "linear" and model_type in LINEAR_TYPES:
        rope_scaling = {"type": "linear", "factor": need("rope.scaling.factor", float)}
    elif scaling == "yarn" and model_type in YARN_TYPES:
        rope_scaling = _yarn(get, need, arch)
    elif scaling not in (None, "none"):  # run unscaled, it would answer with garbage past a short context
        raise IncompatibleModelsError(f"GGUF rope scaling {scaling!r} is not supported for {arch}; 'linear' and "
                                      "'yarn' are for llama (Mixtral too), qwen2, qwen3, their mixtures, granite, "
                                      "olmo2 and gpt-oss files, and 'linear' for smollm3, gemma3 and phi3 ones")
    # llama.cpp scales cos and sin by it whatever the scaling; YaRN and Phi-3's LongRoPE read it here
    magnitude = get("rope.scaling.attn_factor")
    if magnitude is not None and scaling != "yarn" and arch != "phi3" and not math.isclose(float(magnitude), 1.0):
        raise IncompatibleModelsError(f"the GGUF sets {arch}.rope.scaling.attn_factor to {float(magnitude):.6g} with "
                                      f"{'no' if scaling in (None, 'none') else repr(scaling)} RoPE scaling; only 1 is "
                                      "supported there (YaRN files and Phi-3's LongRoPE ones may set it)")
    tokens = metadata.get("tokenizer.ggml.tokens")
    vocab = get("vocab_size") or (len(tokens) if tokens is not None else None)
    if vocab is None:
        raise IncompatibleModelsError(f"GGUF metadata has neither {arch}.vocab_size nor tokenizer.ggml.tokens")
    args = dict(
        model_type=model_type,
        hidden_size=hidden,
        num_hidden_layers=need("block_count", int),
        intermediate_size=need("feed_forward_length", int),
        num_attention_heads=heads,
        num_key_value_heads=need("attention.head_count_kv", int, heads),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        vocab_size=int(vocab),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling,
        max_position_embeddings=int(get("context_length", 4096)),
        tie_word_embeddings="output.weight" not in names,
    )
    if experts:  # llama.cpp's choices: Qwen3's and Mixtral's top-k weights sum to 1, Qwen2's do not
        expert_ffn = need("expert_feed_forward_length", int, args["intermediate_size"])
        args.update(num_experts=experts, num_local_experts=experts, moe_intermediate_size=expert_ffn,
                    num_experts_per_tok=need("expert_used_count", int), norm_topk_prob=True,
                    decoder_sparse_step=1, mlp_only_layers=[])
        if arch == "qwen2moe":
            args.update(shared_expert_intermediate_size=need("expert_shared_feed_forward_length", int))
    # SmolLM3: llama with no RoPE in every 4th layer (mlx-lm's, llama.cpp's)
    if model_type in ("llama", "smollm3", "olmo2"):
        args.update(head_dim=head_dim, attention_bias="blk.0.attn_q.bias" in names)
    elif arch in ("qwen3", "qwen3moe", "gemma"):  # Gemma 1, CodeGemma: a head dim of its own (7B: 256)
        args.update(head_dim=head_dim)
    elif arch == "gpt-oss":  # a window on every other layer, the first included (llama.cpp's and mlx-lm's)
        args.update(head_dim=head_dim, sliding_window=need("attention.sliding_window", int),
                    intermediate_size=args["moe_intermediate_size"])
    elif arch == "gemma2":
        # llama.cpp's fixed Gemma 2 choices: the query scale is hidden / heads for the 46-layer 27B
        # (as its HF config says), the head dim otherwise; the caps default to Gemma 2's, as there
        args.update(head_dim=head_dim, sliding_window=need("attention.sliding_window", int),
                    query_pre_attn_scalar=hidden // heads if args["num_hidden_layers"] == 46 else head_dim,
                    attn_logit_softcapping=need("attn_logit_softcapping", float, 50.0),
                    final_logit_softcapping=need("final_logit_softcapping", float, 30.0))
    elif arch == "gemma3":
        if (get("final_logit_softcapping", 0) or 0) > 0:
            raise IncompatibleModelsError("a gemma3 GGUF with final logit soft-capping is not supported")
        layers = args["num_hidden_layers"]
        # llama.cpp's fixed Gemma 3 choices: local layers' RoPE base 10,000, one global layer in 6,
        # and the query scale of Gemma's reference code (hidden / heads for the 62-layer 27B)
        args.update(head_dim=head_dim, rope_local_base_freq=10000.0, sliding_window_pattern=6,
                    sliding_window=need("attention.sliding_window", int),
                    query_pre_attn_scalar=hidden // heads if layers == 62 else head_dim)
    elif head_dim != hidden // heads:  # qwen2's, qwen2_moe's, mixtral's and phi3's mlx-lm models derive it
        raise IncompatibleModelsError(f"a {arch} GGUF whose head dim ({head_dim}) is not hidden / heads "
                                      f"({hidden} / {heads}) is not supported")
    elif arch == "granite":  # IBM's four scales (embeddings, residuals, attention scores, logits)
        args.update(embedding_multiplier=float(get("embedding_scale", 1.0)),
                    residual_multiplier=float(get("residual_scale", 1.0)),
                    attention_multiplier=float(get("attention.scale", 0.0) or head_dim**-0.5),
                    logits_scaling=float(get("logit_scale", 1.0)),
                    attention_bias="blk.0.attn_q.bias" in names, mlp_bias="blk.0.ffn_up.bias" in names)
    elif arch == "phi3":  # Phi-4-mini rotates 3/4 of each head
        args.update(original_max_position_embeddings=int(get("rope.scaling.original_context_length",
                                                              args["max_position_embeddings"])),
                    partial_rotary_factor=rope_dims / head_dim)
        factors = rope_factors or {}
        if (long := factors.get("rope_factors_long.weight")) is not None:
            args["rope_scaling"] = _longrope(long, factors.get("rope_factors_short.weight", long),
                                             get("rope.scaling.attn_factor"), rope_dims,
                                             args["max_position_embeddings"], args["original_max_position_embeddings"])
    built = models.module(model_type).ModelArgs.from_dict(args)
    # mlx-lm's mixtral and qwen2_moe args drop the trained context; the engine bounds prompts by it
    built.max_position_embeddings = args["max_position_embeddings"]
    return built


def _yarn(get, need, arch: str) -> dict:
    """mlx-lm's `rope_scaling` for a YaRN file (Qwen2.5 and Qwen3 stretched to 128k, gpt-oss), as
    llama.cpp runs these architectures: the file's factor and original context, betas 32 and 1,
    and cos and sin scaled by `rope.scaling.attn_factor` (1 unless the file says) times
    1 + 0.1 ln(factor). llama.cpp reads the `rope.scaling.yarn_*` keys (betas, an attention
    factor, an extrapolation mix) for other architectures only; with them in a qwen3 file it gives
    the logits it gives without them, so they are not read here either (checked against it)."""
    factor = need("rope.scaling.factor", float)
    scale = float(get("rope.scaling.attn_factor", 1.0)) * (1 + 0.1 * math.log(factor))
    if factor <= 1:  # no YaRN magnitude to scale (mlx-lm's then scales nothing)
        raise IncompatibleModelsError(f"the GGUF's YaRN factor {arch}.rope.scaling.factor is {factor:g}; "
                                      "a factor above 1 is needed")
    # mlx-lm's YaRN multiplies by (0.1 mscale ln(factor) + 1) / (0.1 mscale_all_dim ln(factor) + 1)
    return {"type": "yarn", "factor": factor,
            "original_max_position_embeddings": need("rope.scaling.original_context_length", int),
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": (scale - 1) / (0.1 * math.log(factor)),
            "mscale_all_dim": 0.0}


def _longrope(long: mx.array, short: mx.array, attn_factor, rope_dims: int, context: int, original: int) -> dict:
    """mlx-lm's `rope_scaling` for Phi-3's LongRoPE (128k Phi-3, Phi-3.5, Phi-4-mini), which runs as
    mlx-lm runs these models from their own files: the long factors at every length (llama.cpp
    takes them when its context exceeds the original one, else the short ones), and the
    attention factor mlx-lm derives from the two contexts, which must be the file's (llama.cpp's
    converter computes it so)."""
    if long.size != rope_dims // 2 or short.size != rope_dims // 2:
        raise IncompatibleModelsError(f"the GGUF's LongRoPE factors have {long.size} and {short.size} values; "
                                      f"{rope_dims // 2} (half the rotated dims) are needed")
    ours = math.sqrt(1 + math.log(context / original) / math.log(original)) if context > original else 1.0
    if attn_factor is not None and not math.isclose(float(attn_factor), ours, rel_tol=1e-5):
        raise IncompatibleModelsError(f"the GGUF's LongRoPE attention factor {float(attn_factor):.6g} is not the "
                                      f"{ours:.6g} mlx-lm derives from its contexts ({context} / {original}); "
                                      "such a file is not supported")
    return {"type": "longrope", "long_factor": long.astype(mx.float32).tolist(),
            "short_factor": short.astype(mx.float32).tolist()}


def mlx_weights(path, tensors: dict, model_type: str) -> dict:
    """The file's tensors under the names mlx-lm's `model_type` model gives them.

    Raises:
        IncompatibleModelsError: a tensor has no place in such a model (the message lists those that do).
    """
    block_names = _GEMMA_BLOCK_NAMES if model_type in ("gemma2", "gemma3_text") else {
        "phi3": _PHI3_BLOCK_NAMES, "qwen2_moe": _QWEN_MOE_BLOCK_NAMES, "qwen3_moe": _QWEN_MOE_BLOCK_NAMES,
        "mixtral": _MIXTRAL_BLOCK_NAMES, "olmo2": _OLMO2_BLOCK_NAMES,
        "gpt_oss": _GPT_OSS_BLOCK_NAMES}.get(model_type, _BLOCK_NAMES)
    return {_mlx_name(path, k, block_names): v for k, v in tensors.items()}


def _mlx_name(path, name: str, block_names: dict) -> str:
    if m := _BLOCK.match(name):
        i, part, kind = m.groups()
        if part in block_names:
            if block_names[part] in _BARE and kind == "weight":
                return f"model.layers.{i}.{block_names[part]}"
            return f"model.layers.{i}.{block_names[part]}.{kind}"
    elif (m := _GLOBAL.match(name)) and m.group(1) in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[m.group(1)]}.{m.group(2)}"
    raise IncompatibleModelsError(
        f"{path}: tensor {name!r} has no place in the model; known tensors are "
        f"{sorted(_GLOBAL_NAMES)} and blk.N.{{{', '.join(block_names)}}}"
    )
