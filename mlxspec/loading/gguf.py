"""Load a GGUF (llama: Llama, Mistral-style, SmolLM2; qwen2; qwen3; gemma2; gemma3; phi3) into mlx-lm's model of its kind
(Gemma 2: `mlxspec.models.gemma2`, mlx-lm's with its sliding window).

Quantized tensors stay quantized when the model is kept quantized, each layer with the bits
of its own tensor (SmolLM2's demo file: Q8_0 embedding, Q4_1 elsewhere):
- files of Q4_0 / Q4_1 / Q8_0 / F32 / F16 / BF16 only are read by `mx.load`, which returns
  the quantized ones as MLX affine triples (`weight` packed uint32, `scales`, `biases`;
  group size 32) that map one-to-one onto `nn.QuantizedLinear` / `nn.QuantizedEmbedding`;
- any other file (K-quants: Q4_K_M, Q5_K_S, ...) is read here, tensor by tensor from the
  memory-mapped file, because `mx.load` would expand it all to float16 first. Q4_0-Q5_1,
  Q8_0, Q4_K and Q5_K become the same triples bit for bit (`gguf_blocks`); types whose
  groups are 16 wide (Q6_K, Q3_K, Q2_K) or codebooks (IQ*) have no such form and are held
  at 8 bits in groups of 32, requantized from their exact values: close to the file's
  weights, not equal to them.
When the model will run in a float dtype anyway (`float_dtype`), every tensor is decoded
straight to it instead, through float32, where every ggml type's values are exact.

llama.cpp's converter permutes the rows of the Q and K projections (per head, from HF's
"rotate half" layout to interleaved pairs); we undo it so mlx-lm's non-traditional RoPE is
right. Rows are output features, so a permutation of rows applies to the packed weight,
its scales and its biases alike.
"""

from __future__ import annotations

import re
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from .. import models
from ..errors import IncompatibleModelsError, MlxSpecError, one_line
from .gguf_blocks import AFFINE, as_affine, as_float
from .gguf_header import SPLIT_PART, read_header, read_tensor_table

FLOAT_TYPES = ("F32", "F16", "BF16")
MX_LOAD_TYPES = FLOAT_TYPES + ("Q4_0", "Q4_1", "Q8_0")  # what mx.load keeps as stored
REQUANTIZED_BITS = 8  # types with no exact MLX form, when kept quantized
# GGUF architecture -> mlx-lm model type (`models.module` finds its module). Mistral-style and
# SmolLM2 files say "llama".
MODULES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2", "gemma3": "gemma3_text",
           "phi3": "phi3"}
SUPPORTED_ARCHITECTURES = tuple(MODULES)
GROUP_SIZE = 32  # MLX's groups; every ggml type kept as stored has groups of 32

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
# Gemma 2 and 3 norm each side of attention and of the MLP; llama.cpp calls the one before the MLP ffn_norm.
_GEMMA_BLOCK_NAMES = {
    **_BLOCK_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# Phi-3 keeps Q, K and V in one matrix, and the MLP's gate and up in another (gate first).
_PHI3_BLOCK_NAMES = {**_BLOCK_NAMES, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|scales|biases|bias)$")
_GLOBAL = re.compile(r"(\w+)\.(weight|scales|biases|bias)$")


def supported_types() -> tuple[str, ...]:
    """Every ggml tensor type this loader reads: floats, those `gguf_blocks` rewrites, and those
    `gguf`'s dequantizer knows (its registry is private: without it, the first two)."""
    from gguf import GGMLQuantizationType, quants

    dequantized = getattr(quants, "_type_traits", {})
    ours = MX_LOAD_TYPES + tuple(t for t in AFFINE if t not in MX_LOAD_TYPES)
    return ours + tuple(t.name for t in GGMLQuantizationType if t in dequantized and t.name not in ours)


def requantized(types: dict[str, str]) -> list[str]:
    """The ggml types among `types` held at REQUANTIZED_BITS (not bit for bit) when kept quantized."""
    return sorted({t for t in types.values() if t not in FLOAT_TYPES and t not in AFFINE})


def read_gguf(path: str | Path, float_dtype=None) -> tuple[dict, dict, dict[str, str]]:
    """Read a GGUF file: `(tensors, metadata, {tensor name: ggml type})`.

    Args:
        float_dtype: an `mx` float dtype the model will be dequantized to anyway: tensors this
            module reads itself are decoded straight to it. None: keep them quantized.

    Raises:
        MlxSpecError: the file is unreadable or truncated, or holds a tensor type no reader
            here knows (the message names the tensor and its type).
    """
    path = Path(path)
    if not path.is_file():
        raise MlxSpecError(f"GGUF file {path} does not exist")
    parts = gguf_parts(path)
    types = {t.name: t.type_name for part in parts for t in read_tensor_table(part)}
    known = supported_types()
    bad = {n: t for n, t in types.items() if t not in known}
    if bad:
        listed = ", ".join(f"{n} ({t})" for n, t in list(bad.items())[:4])
        kinds = sorted(set(bad.values()))
        raise MlxSpecError(
            f"{path}: tensor type(s) {kinds} are not supported, e.g. {listed}; supported "
            f"types are {list(known)}"
        )
    if len(parts) == 1 and all(t in MX_LOAD_TYPES for t in types.values()):
        try:
            tensors, metadata = mx.load(str(path), format="gguf", return_metadata=True)  # also x.GGUF
        except (RuntimeError, ValueError) as e:
            raise MlxSpecError(f"cannot load GGUF {path}: {e}") from e
        return tensors, metadata, types
    metadata, tensors = None, {}
    for part in parts:  # a split file's metadata is its first part's; each part holds some tensors
        part_metadata, infos = read_header(part)
        if metadata is None:
            metadata = part_metadata
            said = metadata.get("split.count")
            if said is not None and int(said.item()) != len(parts):
                raise MlxSpecError(f"{part} says its GGUF is split in {int(said.item())}, its name says {len(parts)}")
        tensors.update(_read_tensors(part, infos, float_dtype))
    return tensors, metadata, types


def gguf_parts(path: str | Path) -> list[Path]:
    """The files of the GGUF at `path`: `[path]`, or every part of a split file (llama.cpp's
    `NAME-00001-of-00003.gguf`), first to last, whichever part `path` names.

    Raises:
        MlxSpecError: a part is missing (`read_gguf` checks the first part's `split.count`).
    """
    path = Path(path)
    m = SPLIT_PART.match(path.name)
    if not m:
        return [path]
    prefix, _, count = m.groups()
    n = int(count)
    parts = [path.with_name(f"{prefix}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]
    if missing := [p.name for p in parts if not p.is_file()]:
        raise MlxSpecError(f"{path} is part {int(m.group(2))} of a GGUF split in {n}, and {len(missing)} "
                           f"part(s) are missing beside it: {', '.join(missing[:4])}; download every part")
    return parts


def tensor_table(path: str | Path) -> list:
    """The tensor table (`gguf_header.TensorInfo`s) of the GGUF at `path`, over all its parts."""
    return [t for part in gguf_parts(path) for t in read_tensor_table(part)]


def _read_tensors(path: Path, infos, float_dtype) -> dict:
    """The file's tensors, one at a time from its memory map (see the module docstring)."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    data = np.memmap(path, dtype=np.uint8, mode="r")
    tensors = {}
    for t in infos:
        added = {}
        cols, rows = t.shape[0], int(np.prod(t.shape[1:], dtype=np.int64))
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType[t.type_name]]
        if cols % block:
            raise MlxSpecError(f"{path}: tensor {t.name} has rows of {cols}, not a whole number of "
                               f"{t.type_name} blocks of {block}")
        end = t.offset + rows * cols // block * size
        if end > len(data):
            raise MlxSpecError(f"{path} is truncated: tensor {t.name} ends at byte {end} of "
                               f"{len(data)}; download it again")
        raw = data[t.offset:end]
        base = t.name.removesuffix(".weight")
        shape = tuple(reversed(t.shape))
        if t.type_name in FLOAT_TYPES:
            array = _float_tensor(raw, t.type_name).reshape(shape)
            added[t.name] = array.astype(float_dtype) if float_dtype is not None else array
        elif float_dtype is not None or len(shape) != 2:
            exact = mx.array(as_float(raw, t.type_name, rows, cols))
            added[t.name] = exact.reshape(shape).astype(float_dtype or mx.float16)
        else:
            if t.type_name in AFFINE:
                weight, scales, biases, _ = as_affine(raw, t.type_name, rows, cols)
                weight, scales, biases = mx.array(weight), mx.array(scales), mx.array(biases)
            else:
                exact = mx.array(as_float(raw, t.type_name, rows, cols))
                weight, scales, biases = mx.quantize(exact, group_size=GROUP_SIZE, bits=REQUANTIZED_BITS)
            # float16 scales and biases, as mx.load gives them (Q4_0-Q8_0 store them so): half the
            # bytes of float32; for K-quants d * sc rounds by 2^-12 at most
            added = {t.name: weight, base + ".scales": scales.astype(mx.float16),
                     base + ".biases": biases.astype(mx.float16)}
        mx.eval(list(added.values()))  # so at most one tensor's float32 is ever held
        tensors.update(added)
    return tensors


def _float_tensor(raw, type_name: str) -> mx.array:
    import numpy as np

    if type_name == "BF16":
        return mx.array(np.asarray(raw).view(np.uint16)).view(mx.bfloat16)
    return mx.array(np.asarray(raw).view(np.float32 if type_name == "F32" else np.float16))


def model_args_from_metadata(metadata: dict, tensor_names):
    """mlx-lm `ModelArgs` of the file's architecture (`args.model_type` names its module:
    `mlx_lm.models.llama`, `.qwen2`, `.qwen3`, `.gemma3_text`, `.phi3`, or `mlxspec.models.gemma2`)
    from GGUF metadata (keys `<arch>.*`).

    Raises:
        IncompatibleModelsError: the architecture is not one of SUPPORTED_ARCHITECTURES, is a
            mixture of experts, or uses partial rotary embeddings.
    """
    arch = str(metadata.get("general.architecture", "?"))
    if arch not in SUPPORTED_ARCHITECTURES:
        raise IncompatibleModelsError(
            f"GGUF architecture {arch!r} is not supported; supported: "
            f"{list(SUPPORTED_ARCHITECTURES)} (Llama, Mistral-style and SmolLM2 files say 'llama'; "
            "Qwen2 and Qwen2.5 'qwen2'; Qwen3 'qwen3'; Gemma 2 'gemma2'; Gemma 3 'gemma3'; Phi-3 'phi3')"
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

    if (get("expert_count", 0) or 0) > 0:
        raise IncompatibleModelsError(
            f"mixture-of-experts GGUF ({get('expert_count')} experts) is not supported; "
            "only dense models are"
        )
    heads = need("attention.head_count", int)
    hidden = need("embedding_length", int)
    head_dim = need("attention.key_length", int, hidden // heads)
    rope_dims = need("rope.dimension_count", int, head_dim)
    if rope_dims != head_dim:
        raise IncompatibleModelsError(
            f"partial rotary embeddings (rope dims {rope_dims} of head dim {head_dim}) are not supported"
        )
    names = set(tensor_names)
    rope_scaling = None
    scaling = get("rope.scaling.type")
    if scaling == "linear":
        rope_scaling = {"type": "linear", "factor": need("rope.scaling.factor", float)}
    elif scaling not in (None, "none"):  # run unscaled, it would answer with garbage past a short context
        raise IncompatibleModelsError(f"GGUF rope scaling {scaling!r} is not supported; only 'linear' is")
    tokens = metadata.get("tokenizer.ggml.tokens")
    vocab = get("vocab_size") or (len(tokens) if tokens is not None else None)
    if vocab is None:
        raise IncompatibleModelsError(f"GGUF metadata has neither {arch}.vocab_size nor tokenizer.ggml.tokens")
    args = dict(
        model_type=MODULES[arch],
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
    if arch == "llama":
        args.update(head_dim=head_dim, attention_bias="blk.0.attn_q.bias" in names)
    elif arch == "qwen3":
        args.update(head_dim=head_dim)
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
    elif head_dim != hidden // heads:  # qwen2's and phi3's mlx-lm models derive it
        raise IncompatibleModelsError(f"a {arch} GGUF whose head dim ({head_dim}) is not hidden / heads "
                                      f"({hidden} / {heads}) is not supported")
    elif arch == "phi3":
        if {"rope_factors_long.weight", "rope_factors_short.weight"} & names:
            # llama.cpp picks the short or long factors by context size, mlx-lm always the long ones
            raise IncompatibleModelsError("a phi3 GGUF with LongRoPE factors (the 128k Phi-3 and Phi-3.5 "
                                          "files) is not supported; the 4k Phi-3 files are")
        args.update(original_max_position_embeddings=int(get("rope.scaling.original_context_length",
                                                              args["max_position_embeddings"])))
    return models.module(MODULES[arch]).ModelArgs.from_dict(args)


def load_gguf_model(path: str | Path, float_dtype=None):
    """Build mlx-lm's model (llama, qwen2, qwen3, gemma3_text, phi3; our gemma2) from a GGUF file, keeping quantized tensors quantized
    (or, given `float_dtype`, decoding those `mx.load` cannot keep straight to it: see `read_gguf`).

    Returns:
        `(model, metadata, types)`: the evaluated model, the GGUF metadata dict (for the
        tokenizer) and `{gguf tensor name: ggml type}`.

    Raises:
        MlxSpecError / IncompatibleModelsError: see `read_gguf`, `model_args_from_metadata`;
            also when a tensor has no place in the model or the model lacks one.
    """
    tensors, metadata, types = read_gguf(path, float_dtype)
    args = model_args_from_metadata(metadata, tensors)
    rope_freqs = tensors.pop("rope_freqs.weight", None)
    gemma = args.model_type in ("gemma2", "gemma3_text")
    names = _GEMMA_BLOCK_NAMES if gemma else {"phi3": _PHI3_BLOCK_NAMES}.get(args.model_type, _BLOCK_NAMES)
    weights = {_mlx_name(path, k, names): v for k, v in tensors.items()}
    if args.model_type == "llama":  # llama.cpp permutes only llama's rows (qwen's RoPE rotates halves)
        _unpermute_qk(weights, args)
    if gemma:  # llama.cpp's converter stores Gemma's norms as 1 + w; mlx-lm's norm adds the 1 itself
        weights = {k: v - 1 if k.endswith("norm.weight") else v for k, v in weights.items()}

    model = models.module(args.model_type).Model(args)
    if hasattr(model, "sanitize"):  # e.g. Gemma 3 drops its output layer when the embedding is tied
        weights = model.sanitize(weights)
    bits = {
        k[: -len(".scales")]: weights[k[: -len(".scales")] + ".weight"].shape[-1] // v.shape[-1]
        for k, v in weights.items()
        if k.endswith(".scales")
    }
    nn.quantize(
        model,
        class_predicate=lambda p, m: {"group_size": GROUP_SIZE, "bits": bits[p]} if p in bits else False,
    )
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        # mlx lists every weight missing or extra: the first few say enough
        raise MlxSpecError(f"{path}: the tensors do not fit a {args.model_type} model: {one_line(e)}") from None
    if rope_freqs is not None:
        _use_rope_freqs(model, args, rope_freqs)
    mx.eval(model.parameters())
    return model, metadata, types


def _mlx_name(path, name: str, block_names: dict) -> str:
    if m := _BLOCK.match(name):
        i, part, kind = m.groups()
        if part in block_names:
            return f"model.layers.{i}.{block_names[part]}.{kind}"
    elif (m := _GLOBAL.match(name)) and m.group(1) in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[m.group(1)]}.{m.group(2)}"
    raise IncompatibleModelsError(
        f"{path}: tensor {name!r} has no place in the model; known tensors are "
        f"{sorted(_GLOBAL_NAMES)} and blk.N.{{{', '.join(block_names)}}}"
    )


def _unpermute_qk(weights: dict, args) -> None:
    """Undo llama.cpp's per-head row permutation of q_proj / k_proj, in place."""
    head_dim = args.head_dim
    for i in range(args.num_hidden_layers):
        for proj, n_heads in (("q_proj", args.num_attention_heads), ("k_proj", args.num_key_value_heads)):
            prefix = f"model.layers.{i}.self_attn.{proj}."
            for kind in ("weight", "scales", "biases", "bias"):
                if (w := weights.get(prefix + kind)) is not None:
                    # GGUF row (h, j, k) holds HF row (h, k, j): (heads, hd/2, 2, ...) -> (heads, 2, hd/2, ...)
                    weights[prefix + kind] = (
                        w.reshape(n_heads, head_dim // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
                    )


class FreqsRoPE(nn.Module):
    """RoPE with explicit per-pair periods (llama 3.x GGUFs store the scaling as `rope_freqs`)."""

    def __init__(self, dims: int, periods: mx.array):
        super().__init__()
        self.dims = dims
        self._periods = periods  # underscore: not a parameter

    def __call__(self, x, offset=0):
        return mx.fast.rope(x, self.dims, traditional=False, base=None, scale=1.0, offset=offset,
                            freqs=self._periods)


def _use_rope_freqs(model, args, rope_freqs: mx.array) -> None:
    # llama.cpp: theta_i = pos * base^(-2i/d) / rope_freqs[i]  ->  period_i = base^(2i/d) * rope_freqs[i]
    d = getattr(args, "head_dim", None) or args.hidden_size // args.num_attention_heads
    periods = (args.rope_theta ** (mx.arange(0, d, 2, dtype=mx.float32) / d)) * rope_freqs.astype(mx.float32)
    for layer in model.model.layers:
        layer.self_attn.rope = FreqsRoPE(d, periods)
