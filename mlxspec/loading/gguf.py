"""Load a llama-family GGUF (llama, Mistral-style, SmolLM2) into mlx-lm's `llama.Model`.

`mx.load(path, return_metadata=True)` returns Q4_0 / Q4_1 / Q8_0 tensors as MLX affine
quantized triples (`weight` packed uint32, `scales`, `biases`; group size 32), which map
one-to-one onto `nn.QuantizedLinear` / `nn.QuantizedEmbedding`, so the weights stay
quantized: each layer gets the bits of its own tensor (SmolLM2's embedding is Q8_0, the
rest Q4_1). F32 / F16 / BF16 tensors load as they are.

llama.cpp's converter permutes the rows of the Q and K projections (per head, from HF's
"rotate half" layout to interleaved pairs); we undo it so mlx-lm's non-traditional RoPE is
right. Rows are output features, so a permutation of rows applies to the packed weight,
its scales and its biases alike.

Other tensor types (K-quants, Q5_x, IQ*) are refused rather than silently expanded to
float16 (which `mx.load` would do).
"""

from __future__ import annotations

import re
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..errors import IncompatibleModelsError, MlxSpecError, one_line
from .gguf_header import read_tensor_table

SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0")
SUPPORTED_ARCHITECTURES = ("llama",)
GROUP_SIZE = 32  # every GGUF type mx.load keeps quantized has blocks of 32

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
}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|scales|biases|bias)$")
_GLOBAL = re.compile(r"(\w+)\.(weight|scales|biases|bias)$")


def read_gguf(path: str | Path) -> tuple[dict, dict, dict[str, str]]:
    """Read a GGUF file: `(tensors, metadata, {tensor name: ggml type})`.

    Raises:
        MlxSpecError: the file is unreadable or truncated, or holds a tensor type other
            than SUPPORTED_TYPES (the message names the tensor and its type).
    """
    path = Path(path)
    if not path.is_file():
        raise MlxSpecError(f"GGUF file {path} does not exist")
    table = read_tensor_table(path)
    types = {t.name: t.type_name for t in table}
    bad = {n: t for n, t in types.items() if t not in SUPPORTED_TYPES}
    if bad:
        listed = ", ".join(f"{n} ({t})" for n, t in list(bad.items())[:4])
        kinds = sorted(set(bad.values()))
        raise MlxSpecError(
            f"{path}: tensor type(s) {kinds} are not supported, e.g. {listed}; supported "
            f"types are {list(SUPPORTED_TYPES)} (use a Q4_0, Q4_1, Q8_0 or F16 GGUF)"
        )
    try:
        tensors, metadata = mx.load(str(path), format="gguf", return_metadata=True)  # also x.GGUF
    except (RuntimeError, ValueError) as e:
        raise MlxSpecError(f"cannot load GGUF {path}: {e}") from e
    return tensors, metadata, types


def model_args_from_metadata(metadata: dict, tensor_names) -> "llama.ModelArgs":  # noqa: F821
    """mlx-lm `llama.ModelArgs` from GGUF metadata (keys `<arch>.*`).

    Raises:
        IncompatibleModelsError: the architecture is not llama-family, is a mixture of
            experts, or uses partial rotary embeddings.
    """
    from mlx_lm.models import llama

    arch = str(metadata.get("general.architecture", "?"))
    if arch not in SUPPORTED_ARCHITECTURES:
        raise IncompatibleModelsError(
            f"GGUF architecture {arch!r} is not supported; supported: "
            f"{list(SUPPORTED_ARCHITECTURES)} (llama, Mistral-style and SmolLM2 files say 'llama')"
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
            "only dense llama-family models are"
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
    return llama.ModelArgs(
        model_type="llama",
        hidden_size=hidden,
        num_hidden_layers=need("block_count", int),
        intermediate_size=need("feed_forward_length", int),
        num_attention_heads=heads,
        num_key_value_heads=need("attention.head_count_kv", int, heads),
        head_dim=head_dim,
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        vocab_size=int(vocab),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling,
        max_position_embeddings=int(get("context_length", 4096)),
        attention_bias="blk.0.attn_q.bias" in names,
        tie_word_embeddings="output.weight" not in names,
    )


def load_gguf_model(path: str | Path):
    """Build mlx-lm's `llama.Model` from a GGUF file, keeping quantized tensors quantized.

    Returns:
        `(model, metadata, types)`: the evaluated model, the GGUF metadata dict (for the
        tokenizer) and `{gguf tensor name: ggml type}`.

    Raises:
        MlxSpecError / IncompatibleModelsError: see `read_gguf`, `model_args_from_metadata`;
            also when a tensor has no place in the model or the model lacks one.
    """
    from mlx_lm.models import llama

    tensors, metadata, types = read_gguf(path)
    args = model_args_from_metadata(metadata, tensors)
    rope_freqs = tensors.pop("rope_freqs.weight", None)
    weights = {_mlx_name(path, k): v for k, v in tensors.items()}
    _unpermute_qk(weights, args)

    model = llama.Model(args)
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
        raise MlxSpecError(f"{path}: the tensors do not fit a llama model: {one_line(e)}") from None
    if rope_freqs is not None:
        _use_rope_freqs(model, args, rope_freqs)
    mx.eval(model.parameters())
    return model, metadata, types


def _mlx_name(path, name: str) -> str:
    if m := _BLOCK.match(name):
        i, part, kind = m.groups()
        if part in _BLOCK_NAMES:
            return f"model.layers.{i}.{_BLOCK_NAMES[part]}.{kind}"
    elif (m := _GLOBAL.match(name)) and m.group(1) in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[m.group(1)]}.{m.group(2)}"
    raise IncompatibleModelsError(
        f"{path}: tensor {name!r} has no place in a llama model; known tensors are "
        f"{sorted(_GLOBAL_NAMES)} and blk.N.{{{', '.join(_BLOCK_NAMES)}}}"
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
    d = args.head_dim
    periods = (args.rope_theta ** (mx.arange(0, d, 2, dtype=mx.float32) / d)) * rope_freqs.astype(mx.float32)
    for layer in model.model.layers:
        layer.self_attn.rope = FreqsRoPE(d, periods)
