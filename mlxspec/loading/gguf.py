"""Load a GGUF into mlx-lm's model of its kind (which kinds, and their names: `gguf_arch`).

Quantized tensors stay quantized when the model is kept quantized, each layer with the bits
of its own tensor (SmolLM2's demo file: Q8_0 embedding, Q4_1 elsewhere):
- files of Q4_0 / Q4_1 / Q8_0 / F32 / F16 / BF16 only are read by `mx.load`, which returns
  the quantized ones as MLX affine triples (`weight` packed uint32, `scales`, `biases`;
  group size 32) that map one-to-one onto `nn.QuantizedLinear` / `nn.QuantizedEmbedding`;
- any other file (K-quants: Q4_K_M, Q5_K_S, ...) is read here, tensor by tensor from the
  memory-mapped file, because `mx.load` would expand it all to float16 first. Q4_0-Q5_1,
  Q8_0, Q4_K and Q5_K become the same triples bit for bit (`gguf_blocks`), MXFP4 (gpt-oss's
  experts) MLX's "mxfp4" pairs (`weight`, `scales`), bit for bit too; types whose
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

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from .. import models
from ..errors import MlxSpecError, one_line
from .gguf_arch import LLAMA_ROWS, mlx_weights, model_args_from_metadata
from .gguf_blocks import AFFINE, as_affine, as_float, as_mxfp4
from .gguf_header import SPLIT_PART, read_header, read_tensor_table

FLOAT_TYPES = ("F32", "F16", "BF16")
MX_LOAD_TYPES = FLOAT_TYPES + ("Q4_0", "Q4_1", "Q8_0")  # what mx.load keeps as stored
EXACT_TYPES = tuple(AFFINE) + ("MXFP4",)  # kept quantized bit for bit (MXFP4 in MLX's "mxfp4" mode)
REQUANTIZED_BITS = 8  # types with no exact MLX form, when kept quantized
GROUP_SIZE = 32  # MLX's groups; every ggml type kept as stored has groups of 32
PROGRESS_BYTES = 2**30  # files read tensor by tensor this large show a progress bar


def supported_types() -> tuple[str, ...]:
    """Every ggml tensor type this loader reads: floats, those `gguf_blocks` rewrites, and those
    `gguf`'s dequantizer knows (its registry is private: without it, the first two)."""
    from gguf import GGMLQuantizationType, quants

    dequantized = getattr(quants, "_type_traits", {})
    ours = MX_LOAD_TYPES + tuple(t for t in AFFINE if t not in MX_LOAD_TYPES)
    return ours + tuple(t.name for t in GGMLQuantizationType if t in dequantized and t.name not in ours)


def requantized(types: dict[str, str]) -> list[str]:
    """The ggml types among `types` held at REQUANTIZED_BITS (not bit for bit) when kept quantized."""
    return sorted({t for t in types.values() if t not in FLOAT_TYPES + EXACT_TYPES})


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
    """The file's tensors, one at a time from its memory map (see the module docstring); a file
    of PROGRESS_BYTES or more shows a progress bar on a terminal (decoding takes a while)."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from tqdm.auto import tqdm

    data = np.memmap(path, dtype=np.uint8, mode="r")
    tensors = {}
    bar = tqdm(total=len(data), unit="B", unit_scale=True, unit_divisor=1024, desc=f"reading {path.name}",
               leave=False, disable=None if len(data) >= PROGRESS_BYTES else True)  # None: a terminal only
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
        elif float_dtype is not None or len(shape) < 2:
            exact = mx.array(as_float(raw, t.type_name, rows, cols))
            added[t.name] = exact.reshape(shape).astype(float_dtype or mx.float16)
        elif t.type_name == "MXFP4":  # MLX's own mode (experts stacked alike): no biases, the scale bytes as stored
            weight, scales = as_mxfp4(raw, rows, cols)
            added = {t.name: mx.array(weight).reshape(*shape[:-1], -1),
                     base + ".scales": mx.array(scales).reshape(*shape[:-1], -1)}
        else:  # a matrix, or a mixture's experts stacked (experts, rows, cols): each row quantized alike
            if t.type_name in AFFINE:
                weight, scales, biases, _ = as_affine(raw, t.type_name, rows, cols)
                weight, scales, biases = mx.array(weight), mx.array(scales), mx.array(biases)
            else:
                exact = mx.array(as_float(raw, t.type_name, rows, cols))
                weight, scales, biases = mx.quantize(exact, group_size=GROUP_SIZE, bits=REQUANTIZED_BITS)
            weight, scales, biases = (a.reshape(*shape[:-1], -1) for a in (weight, scales, biases))
            # float16 scales and biases, as mx.load gives them (Q4_0-Q8_0 store them so): half the
            # bytes of float32; for K-quants d * sc rounds by 2^-12 at most
            added = {t.name: weight, base + ".scales": scales.astype(mx.float16),
                     base + ".biases": biases.astype(mx.float16)}
        mx.eval(list(added.values()))  # so at most one tensor's float32 is ever held
        tensors.update(added)
        bar.update(end - t.offset)
    bar.close()
    return tensors


def _float_tensor(raw, type_name: str) -> mx.array:
    import numpy as np

    if type_name == "BF16":
        return mx.array(np.asarray(raw).view(np.uint16)).view(mx.bfloat16)
    return mx.array(np.asarray(raw).view(np.float32 if type_name == "F32" else np.float16))


def load_gguf_model(path: str | Path, float_dtype=None):
    """Build mlx-lm's model of the file's kind (`gguf_arch`) from a GGUF file, keeping quantized tensors quantized
    (or, given `float_dtype`, decoding those `mx.load` cannot keep straight to it: see `read_gguf`).

    Returns:
        `(model, metadata, types)`: the evaluated model, the GGUF metadata dict (for the
        tokenizer) and `{gguf tensor name: ggml type}`.

    Raises:
        MlxSpecError / IncompatibleModelsError: see `read_gguf`, `gguf_arch`; also when the
            model lacks a tensor.
    """
    tensors, metadata, types = read_gguf(path, float_dtype)
    factors = {k: tensors.pop(k) for k in ("rope_factors_long.weight", "rope_factors_short.weight") if k in tensors}
    args = model_args_from_metadata(metadata, tensors, factors)
    rope_freqs = tensors.pop("rope_freqs.weight", None)
    gemma = args.model_type in ("gemma", "gemma2", "gemma3_text")
    weights = mlx_weights(path, tensors, args.model_type)
    if args.model_type in LLAMA_ROWS:  # llama.cpp permutes only llama's rows (qwen's RoPE rotates halves)
        _unpermute_qk(weights, args)
    for k in [k for k in weights if k.endswith("shared_expert_gate.weight")]:  # a vector in the file
        weights[k] = weights[k].reshape(1, -1)
    if gemma:  # llama.cpp's converter stores Gemma's norms as 1 + w; mlx-lm's norm adds the 1 itself
        weights = {k: v - 1 if k.endswith("norm.weight") else v for k, v in weights.items()}

    model = models.module(args.model_type).Model(args)
    if hasattr(model, "sanitize"):  # e.g. Gemma 3 drops its output layer when the embedding is tied
        weights = model.sanitize(weights)
    layers = [k[: -len(".scales")] for k in weights if k.endswith(".scales")]
    quantized = {  # each quantized layer's bits (uint32 words per group of 32) and mode (MXFP4: no biases)
        p: {"group_size": GROUP_SIZE, "bits": weights[p + ".weight"].shape[-1] // weights[p + ".scales"].shape[-1],
            "mode": "affine" if p + ".biases" in weights else "mxfp4"}
        for p in layers
    }
    nn.quantize(model, class_predicate=lambda p, m: quantized.get(p, False))
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        # mlx lists every weight missing or extra: the first few say enough
        raise MlxSpecError(f"{path}: the tensors do not fit a {args.model_type} model: {one_line(e)}") from None
    if rope_freqs is not None:
        _use_rope_freqs(model, args, rope_freqs)
    mx.eval(model.parameters())
    return model, metadata, types


def _unpermute_qk(weights: dict, args) -> None:
    """Undo llama.cpp's per-head row permutation of q_proj / k_proj, in place."""
    head_dim = getattr(args, "head_dim", None) or args.hidden_size // args.num_attention_heads
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
