"""What the header says about the pair: names, drafter, precision, device."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PairInfo:
    name: str  # pair name, e.g. "demo", or "custom"
    target: str
    draft: str  # draft model name, or "ngram drafter"
    precision: str
    device: str
    target_weights_bytes: int = 0
    draft_weights_bytes: int = 0
    kv_cache: str = ""  # the target's KV quantization (--kv-bits), e.g. "4-bit from 5000 tokens"; "": none

    def line(self) -> str:
        return f"{self.name}: {self.target} ← {self.draft} · {self.precision} · {self.device}"


def describe(engine, *, name: str = None, drafter: str = None) -> PairInfo:
    """Read what `mlxspec.load` attached (pair_name, target_info, draft_info) or fall back to the
    models. `drafter`: who drafts on the speculative side (default: the engine's default); the
    draft's weights are that drafter's (the head's for "eagle", none for "ngram")."""
    drafter = drafter or engine.default_drafter
    target = _label(getattr(engine, "target_info", None)) or _model_label(engine.target_model)
    adapter = getattr(getattr(engine, "target_info", None), "adapter", None)
    if adapter:  # the answers are the adapted target's
        target += f" + adapter {Path(adapter).name}"
    draft_bytes = 0
    if engine.draft_model is not None and drafter == "model":
        draft = _label(getattr(engine, "draft_info", None)) or _model_label(engine.draft_model)
        draft_bytes = engine.draft_weights_bytes
    elif drafter == "eagle":
        draft, draft_bytes = "EAGLE head", engine.eagle_weights_bytes
        if getattr(engine, "head_note", None):  # trained under another adapter: a slow race is not a mystery
            draft += f" ({engine.head_note})"
    else:
        draft = f"{drafter} drafter"
    quant = getattr(engine, "kv_quant", None)
    return PairInfo(
        name=name or getattr(engine, "pair_name", None) or "custom",
        target=target, draft=draft, precision=_precision(engine.target_model), device=_device(),
        target_weights_bytes=engine.target_weights_bytes, draft_weights_bytes=draft_bytes,
        kv_cache=f"{quant.bits}-bit from {quant.start} tokens" if quant is not None else "",
    )


def _label(info) -> str:
    if info is None:
        return ""
    if isinstance(info, dict):
        return str(info.get("name") or info.get("ref") or info.get("repo") or "")
    for attr in ("name", "ref", "repo"):
        if getattr(info, attr, None):
            return str(getattr(info, attr))
    return str(info)


def _model_label(model) -> str:
    args = getattr(model, "args", None)
    kind = getattr(args, "model_type", None) or type(model).__module__.rsplit(".", 1)[-1]
    layers = getattr(args, "num_hidden_layers", None)
    hidden = getattr(args, "hidden_size", None)
    return f"{kind} {layers}L×{hidden}" if layers and hidden else str(kind)


def _precision(model) -> str:
    bits = next((m.bits for _, m in model.named_modules() if hasattr(m, "bits")), None)
    if bits:
        return f"{bits}-bit"
    from mlx.utils import tree_flatten

    params = tree_flatten(model.parameters())
    return str(params[0][1].dtype).rsplit(".", 1)[-1] if params else "?"


def _device() -> str:
    from mlxspec import blas
    from mlxspec.device import backend

    gpu = {"metal": "Metal GPU", "cuda": "CUDA GPU"}.get(backend())
    if gpu:
        return gpu
    # On the CPU the BLAS decides the speed (the reference BLAS is several times slower): say which.
    name = blas.info()["name"]
    return f"CPU, {blas.label(name)}" if name in ("openblas", "blis", "reference") else "CPU"
