"""A fine-tuned adapter on the target (`mlx_lm.lora`'s output folder), applied as mlx-lm applies it.

`mlx_lm.lora` saves `adapter_config.json` and `adapters.safetensors`; `mlx_lm.generate
--adapter-path` wraps the target's linears in LoRA (or DoRA) layers and loads them, unfused.
`apply_adapter` does the same through mlx-lm's own `load_adapters`, so the adapted target is
the model mlx-lm runs, and speculative decoding stays lossless against it (a draft model or
head trained for the base target still drafts; it may be right less often). What mlx-lm leaves
unchecked is checked first: the folder's two files, the config's kind, and that the file holds
every tensor the config implies (a missing DoRA magnitude would silently change the model).

`fuse_adapter` then folds those layers into the weights they wrap, as `mlx_lm.fuse` does: each
adapted linear is one matmul again instead of three (the demo target with LoRA on 16 layers, on
a 2-core CPU: unfused 0.92x the base target's plain decoding, fused 1.02x; the README has the
figures. Where a pass is launch-bound, as on a GPU, the extra small kernels should cost more).
The output is then the fused model's: its float sums round otherwise than the unfused layers'
(greedy text may part from mlx-lm's unfused at a near-tie), and quantized layers are quantized
again after the fold, as `mlx_lm.fuse` does.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Optional

from ..errors import IncompatibleModelsError, InvalidArgumentError, MlxSpecError, ModelNotFoundError, one_line, shown

CONFIG, WEIGHTS = "adapter_config.json", "adapters.safetensors"
KINDS = ("lora", "dora", "full")  # adapter_config.json's fine_tune_type (mlx-lm's; lora when absent)
LEAVES = ("lora_a", "lora_b", "m")  # the parameters a LoRA / DoRA layer adds


def adapter_folder(path) -> Path:
    """`path` checked as an adapter folder (it exists and holds both files), before any model loads."""
    if not isinstance(path, (str, Path)) or not str(path).strip():
        raise InvalidArgumentError(f"adapter_path must be a folder written by mlx_lm.lora, got {shown(path)}")
    folder = Path(path).expanduser()
    if not folder.is_dir():
        what = "is a file" if folder.exists() else "does not exist"
        raise ModelNotFoundError(f"the adapter folder {folder} {what}: give the folder mlx_lm.lora wrote "
                                 f"(holding {CONFIG} and {WEIGHTS})")
    missing = [name for name in (CONFIG, WEIGHTS) if not (folder / name).is_file()]
    if missing:
        raise ModelNotFoundError(f"the adapter folder {folder} has no {' and no '.join(missing)}: an mlx_lm.lora "
                                 f"adapter folder holds {CONFIG} and {WEIGHTS}")
    return folder


def adapter_digest(path) -> str:
    """The adapter's config and weights, hashed (10 hex digits): a head trained for the adapted
    target names its adapter by it (`scripts/train_eagle.py --adapter-path`)."""
    h = hashlib.sha1()
    for name in (CONFIG, WEIGHTS):
        h.update((Path(path).expanduser() / name).read_bytes())
    return h.hexdigest()[:10]


def head_mismatch(trained_under: Optional[dict], path) -> Optional[str]:
    """How the adapter a head was trained under (its config's `training.adapter`, {name, digest};
    None: the base target) differs from the one on the target (`path`; None: none), in words;
    None when they are the same. The head still drafts losslessly, only less often right."""
    trained_under = trained_under if isinstance(trained_under, dict) else None  # a hand-edited config's
    if not trained_under and path is None:
        return None
    if path is None:
        return f"trained under adapter {trained_under.get('name')}, which this target lacks"
    name = Path(path).expanduser().name
    if not trained_under:
        return f"trained for the target without adapter {name}"
    if trained_under.get("digest") == adapter_digest(path):
        return None
    if trained_under.get("name") == name:
        return f"trained under another adapter named {name} (its weights or config differ)"
    return f"trained under adapter {trained_under.get('name')}, not this {name}"


def read_config(folder: Path) -> dict:
    """adapter_config.json, with its kind and (for LoRA / DoRA) its layer count checked."""
    try:
        config = json.loads((folder / CONFIG).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MlxSpecError(f"{folder / CONFIG} is not readable JSON: {one_line(e)}") from None
    if not isinstance(config, dict):
        raise MlxSpecError(f"{folder / CONFIG} must hold a JSON object, got {shown(config)}")
    kind = config.get("fine_tune_type", "lora")
    if kind not in KINDS:
        raise MlxSpecError(f"{folder / CONFIG}: fine_tune_type must be one of {', '.join(KINDS)}, got {shown(kind)}")
    if kind != "full":
        layers, params = config.get("num_layers"), config.get("lora_parameters")
        if isinstance(layers, bool) or not isinstance(layers, int) or not isinstance(params, dict):
            raise MlxSpecError(f"{folder / CONFIG}: a {kind} adapter needs num_layers (an integer, -1 for all) and "
                               f"lora_parameters (an object with rank and scale), got num_layers {shown(layers)} "
                               f"and lora_parameters {shown(params)}")
    return config


def apply_adapter(model, path) -> str:
    """Apply the adapter in `path` to `model` in place, as `mlx_lm.load(..., adapter_path=path)` does.
    Returns what it was, e.g. "LoRA rank 8 on 16 layers".

    Raises:
        ModelNotFoundError: the folder or one of its files is missing.
        MlxSpecError: its config is unreadable or not an adapter's.
        IncompatibleModelsError: it was trained for another model (names and shapes that differ).
    """
    from mlx.utils import tree_flatten
    from mlx_lm.tuner.utils import load_adapters

    folder = adapter_folder(path)
    config = read_config(folder)
    kind = config.get("fine_tune_type", "lora")
    try:
        load_adapters(model, str(folder))
    except ValueError as e:  # mlx-lm lists the tensors that do not fit this model
        raise IncompatibleModelsError(f"the adapter in {folder} was not trained for this target: "
                                      f"{_short(str(e))}") from None
    except Exception as e:  # a layer kind it cannot wrap, a config key it lacks, an unreadable file
        raise MlxSpecError(f"cannot apply the adapter in {folder}: {type(e).__name__}: {one_line(e)}") from None
    if kind == "full":
        return "full fine-tune"
    import mlx.core as mx

    stored = set(mx.load(str(folder / WEIGHTS)))
    added = [name for name, _ in tree_flatten(model.parameters()) if name.rsplit(".", 1)[-1] in LEAVES]
    lacking = [name for name in added if name not in stored]
    if lacking:
        raise IncompatibleModelsError(
            f"the adapter in {folder} lacks {len(lacking)} of the {len(added)} tensors its {CONFIG} puts on this "
            f"target (num_layers {config['num_layers']}), e.g. {lacking[0]}: it was trained for another model or "
            f"with another config")
    layers = len({name.split(".layers.", 1)[1].split(".", 1)[0] for name in added if ".layers." in name})
    rank = config["lora_parameters"].get("rank")
    return f"{'DoRA' if kind == 'dora' else 'LoRA'}{f' rank {rank}' if rank else ''} on {layers} layers"


def fuse_adapter(model) -> str:
    """Fold the LoRA / DoRA layers `apply_adapter` put on `model` into the weights they wrap, in
    place (`mlx_lm.fuse`'s way); returns how, for the adapter's description: "fused", "fused and
    re-quantized" where quantized layers were folded, or "" when there was nothing to fold (a full
    fine-tune's weights are the target's own)."""
    from mlx.utils import tree_unflatten

    from .precision import quantized_layers

    wrapped = [(name, m) for name, m in model.named_modules() if callable(getattr(m, "fuse", None))]
    if not wrapped:
        return ""
    quantized = any(isinstance(getattr(m, "linear", getattr(m, "embedding", None)), quantized_layers())
                    for _, m in wrapped)
    model.update_modules(tree_unflatten([(name, m.fuse()) for name, m in wrapped]))
    return "fused and re-quantized" if quantized else "fused"


def _short(message: str, lines: int = 4) -> str:
    """mlx-lm's list of misfits in one line: the first few, and how many more."""
    rows = [r.strip() for r in message.splitlines()[1:] if r.strip()]
    if not rows:
        return one_line(message)
    more = f"; and {len(rows) - lines} more" if len(rows) > lines else ""
    return "; ".join(rows[:lines]) + more
