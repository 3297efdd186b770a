"""A head's folder: config.json (its decoder layer's shape, the target it was trained for) and
model.safetensors, written whole or not at all; read back only into the target it fits, with an
`IncompatibleModelsError` naming what differs otherwise."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.llama import ModelArgs

from ..backbone import hidden_size, layers_fit
from ..errors import IncompatibleModelsError, ModelNotFoundError, shown
from ..files import save_safetensors, staged
from .context import check_context
from .eagle_head import EagleHead

FINGERPRINT_ROWS = 64  # embedding rows whose norms identify a target (spread over the vocabulary)
FINGERPRINT_RTOL = 0.03  # 4-bit quantization moves a row's norm by well under 1 %; another model by far more


# -- the target's identity ----------------------------------------------------------------------

def embedding_fingerprint(target_model) -> List[float]:
    """Norms of FINGERPRINT_ROWS embedding rows spread over the vocabulary (float32, any precision)."""
    emb = target_model.model.embed_tokens
    V = target_vocab(target_model)
    ids = mx.array([(i * V) // FINGERPRINT_ROWS for i in range(FINGERPRINT_ROWS)], dtype=mx.uint32)
    rows = emb(ids).astype(mx.float32)  # dequantized rows whatever the storage
    return [round(float(v), 5) for v in mx.sqrt(mx.sum(rows * rows, axis=-1)).tolist()]


def target_vocab(target_model) -> int:
    return int(target_model.model.embed_tokens.weight.shape[0])


# -- files --------------------------------------------------------------------------------------

CONTEXTS = ("head", "target")  # what a head attends to for the positions the target has run
LAYER_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "rms_norm_eps", "rope_theta", "max_position_embeddings")


def save_head(path, head: EagleHead, draft_ids: Optional[mx.array], target_model, *, name: str = "",
              dtype=mx.float16, extra: Optional[dict] = None, feature_layers: Sequence[int] = ()) -> None:
    """Write a head folder: config.json (layer shape, the target's identity) + model.safetensors.

    Args:
        path: the folder (created).
        head, draft_ids: the head and its draft vocabulary (None: the target's whole vocabulary).
        target_model: the target it was trained for (its vocabulary, hidden size, fingerprint are recorded).
        name: the target's name, for error messages. dtype: weights' storage. Default float16.
        extra: more config keys (training facts).
        feature_layers: the target layers (0-based) whose outputs the head reads, one per
            `head.taps`; empty: the final hidden state.
    """
    if len(feature_layers) != head.taps:
        raise ValueError(f"the head reads {head.taps} layers' outputs but feature_layers names {len(feature_layers)}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    weights = {k: v.astype(dtype) for k, v in tree_flatten(head.parameters())}
    if draft_ids is not None:
        weights["draft_ids"] = draft_ids.astype(mx.int32)
    cfg = {"model_type": "eagle_head",
           "layer": {k: getattr(head.args, k) for k in LAYER_FIELDS},
           "num_layers": len(head.layers),
           "feature_layers": [int(i) for i in feature_layers],
           **({"context": "target"} if head.context == "target" else {}),
           "draft_vocab_size": None if draft_ids is None else int(draft_ids.shape[0]),
           "target": {"name": name, "vocab_size": target_vocab(target_model), "hidden_size": hidden_size(target_model),
                      "embedding_fingerprint": embedding_fingerprint(target_model)},
           **(extra or {})}
    # Both files are written whole beside the old ones first, then renamed, config last: an
    # interruption leaves the old head or the new one, short of the instant between two renames
    # (and a failed write, a full disk say, leaves no staged file behind).
    with staged(path / "model.safetensors", path / "config.json") as [weights_file, config_file]:
        save_safetensors(weights_file, weights)
        config_file.write_text(json.dumps(cfg, indent=1) + "\n", encoding="utf-8")


# -- loading ------------------------------------------------------------------------------------

# what to do about a damaged head (a locally trained one; a shipped one comes back with mlxspec)
REWRITE = ("write the head again (scripts/train_eagle.py with the run's --work folder only exports it again; a "
           "shipped head comes back when mlxspec is reinstalled)")


def head_config(path) -> dict:
    """A head folder's config.json, checked to be a head's: cheap, so a loader says a folder that
    is no head (or a damaged one) before the minutes of loading a target.

    Raises:
        ModelNotFoundError: a file is missing, config.json is no JSON or no head's.
    """
    path = Path(path)
    cfg_path = path / "config.json"
    for f in (cfg_path, path / "model.safetensors"):
        if not f.is_file():
            raise ModelNotFoundError(f"[eagle] {f} is missing; a head folder holds config.json and model.safetensors "
                                     f"(as scripts/train_eagle.py writes it)")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelNotFoundError(f"[eagle] {cfg_path} is not valid JSON ({e}); {REWRITE}") from e
    if not isinstance(cfg, dict) or cfg.get("model_type") != "eagle_head":
        kind = cfg.get("model_type") if isinstance(cfg, dict) else f"a JSON {type(cfg).__name__}"
        raise ModelNotFoundError(f"[eagle] {cfg_path} has model_type {kind!r}, expected 'eagle_head'")
    return cfg


def load_head(path, target_model, coord=None) -> Tuple[EagleHead, Optional[mx.array], dict]:
    """Load a head folder (config.json + model.safetensors) trained for `target_model`.

    Returns (head in the target's float dtype, draft vocabulary ids (N,) int32 or None for the
    full vocabulary, config). `coord`: the engine's `Coordinator`, when the target is sharded
    (a head that reads the target's last layer needs it in this process).

    Raises:
        ModelNotFoundError: the folder or one of its files is missing or unreadable.
        IncompatibleModelsError: the head was trained for another target (vocabulary size,
            hidden size or embedding fingerprint differ) or its weights have the wrong shapes.
    """
    path = Path(path)
    V = target_vocab(target_model)
    cfg_path, w_path = path / "config.json", path / "model.safetensors"
    cfg = head_config(path)
    try:
        weights = mx.load(str(w_path))
    except (OSError, ValueError, RuntimeError) as e:
        raise ModelNotFoundError(f"[eagle] cannot read the head's weights {w_path}: {e}; {REWRITE}") from e
    target = cfg.get("target")
    _check_target(target if isinstance(target, dict) else {}, target_model, path)
    depth = cfg.get("num_layers", 1)  # heads written before deeper ones existed have one layer
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
        raise IncompatibleModelsError(f"[eagle] num_layers {depth!r} in {cfg_path} must be a whole number >= 1")
    args = _layer_args(cfg.get("layer"), depth, V, cfg_path)
    taps = cfg.get("feature_layers") or []
    n = len(target_model.model.layers)
    if not isinstance(taps, list) or not layers_fit(taps, n):
        raise IncompatibleModelsError(
            f"[eagle] feature_layers {taps!r} in {cfg_path} do not fit the target's {n} layers "
            f"(allowed: distinct indices 0..{n - 1}, or [] for its final hidden state)")
    context = cfg.get("context", "head")
    if context not in CONTEXTS:
        raise IncompatibleModelsError(f"[eagle] context {context!r} in {cfg_path} must be one of {', '.join(CONTEXTS)}")
    if context == "target":
        if depth != 1 or taps:
            raise IncompatibleModelsError(
                f"[eagle] a head with context 'target' in {cfg_path} must have one decoder layer and read the "
                f"final hidden state (num_layers 1, feature_layers []), got {depth} and {taps}")
        check_context(args, target_model, coord)
    head_window(cfg, cfg_path)
    head = EagleHead(args, taps=len(taps), context=context)
    draft_ids = weights.pop("draft_ids", None)
    want = dict(tree_flatten(head.parameters()))
    missing = sorted(set(want) - set(weights))
    extra = sorted(set(weights) - set(want))
    wrong = sorted(f"{k}: {tuple(weights[k].shape)} != {tuple(v.shape)}" for k, v in want.items()
                   if k in weights and weights[k].shape != v.shape)
    if missing or extra or wrong:
        raise IncompatibleModelsError(
            f"[eagle] the weights in {w_path} do not fit the head its config describes: missing {missing[:4]}, "
            f"unexpected {extra[:4]}, wrong shapes {wrong[:4]}")
    if draft_ids is not None and (draft_ids.ndim != 1 or draft_ids.size == 0
                                  or int(mx.max(draft_ids).item()) >= V
                                  or int(mx.min(draft_ids).item()) < 0):  # they index the target's rows
        raise IncompatibleModelsError(
            f"[eagle] draft_ids in {w_path} must be a 1-D list of ids in 0..{V - 1} (the "
            f"target's vocabulary), got shape {tuple(draft_ids.shape)}")
    head.load_weights(list(weights.items()))
    dtype = target_model.model.norm.weight.dtype  # the engine's float precision
    head.set_dtype(dtype)
    mx.eval(head.parameters())
    return head, (draft_ids.astype(mx.int32) if draft_ids is not None else None), cfg


def head_window(cfg: dict, cfg_path="config.json") -> Optional[int]:
    """The config's `window`: how many of its latest entries (plus the first 4) the head's own
    cache keeps and attends to, or None (absent or null: all of them). A head trained on short
    sequences drafts worse the further back it attends (the demo head's model card, "Long
    conversations"); a head that reads the target's cache keeps none of its own to window."""
    w = cfg.get("window")
    if w is None:
        return None
    if isinstance(w, bool) or not isinstance(w, int) or w < 5:
        raise IncompatibleModelsError(f"[eagle] window {w!r} in {cfg_path} must be a whole number >= 5 (the head's "
                                      f"latest entries it attends to, 4 first ones kept besides) or null (all)")
    if cfg.get("context", "head") == "target":
        raise IncompatibleModelsError(f"[eagle] a head with context 'target' in {cfg_path} keeps no cache of its own "
                                      f"to window: drop its window {w}")
    return w


def _layer_args(layer, depth: int, vocab: int, cfg_path: Path) -> ModelArgs:
    """llama ModelArgs for the head's decoder layer(s) from the config's "layer" object (what
    `save_head` writes: LAYER_FIELDS), or IncompatibleModelsError saying what in it is wrong."""
    if not isinstance(layer, dict):
        raise IncompatibleModelsError(f"[eagle] {cfg_path} needs a \"layer\" object (the decoder layer's llama "
                                      f"settings {', '.join(LAYER_FIELDS)}), got {shown(layer)}")
    optional = ("head_dim", "max_position_embeddings")  # null: llama's own default
    whole = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
             "max_position_embeddings")
    missing = [k for k in LAYER_FIELDS if k not in layer and k not in optional]
    unknown = sorted(set(layer) - set(LAYER_FIELDS))
    bad = [k for k, v in layer.items() if k in LAYER_FIELDS and not (v is None and k in optional) and (
        isinstance(v, bool) or not isinstance(v, int if k in whole else (int, float)) or not v > 0)]
    if missing or unknown or bad:
        raise IncompatibleModelsError(
            f"[eagle] \"layer\" in {cfg_path} is not a decoder layer's settings: missing {missing}, unknown "
            f"{unknown}, not positive ({'whole ' if any(k in whole for k in bad) else ''}numbers) {bad}")
    if layer["num_attention_heads"] % layer["num_key_value_heads"]:
        raise IncompatibleModelsError(f"[eagle] \"layer\" in {cfg_path}: num_attention_heads must be a multiple of "
                                      f"num_key_value_heads, got {layer['num_attention_heads']} and "
                                      f"{layer['num_key_value_heads']}")
    return ModelArgs(model_type="llama", num_hidden_layers=depth, vocab_size=vocab, **layer)


def _check_target(t: dict, target_model, path: Path) -> None:
    """IncompatibleModelsError naming what differs between the head's recorded target and this one."""
    diffs = []
    V, H = target_vocab(target_model), hidden_size(target_model)
    if t.get("vocab_size") != V:
        diffs.append(f"vocabulary size {t.get('vocab_size')} vs the target's {V}")
    if t.get("hidden_size") != H:
        diffs.append(f"hidden size {t.get('hidden_size')} vs the target's {H}")
    if not diffs:
        want = t.get("embedding_fingerprint") or []
        have = embedding_fingerprint(target_model)
        bad = [i for i, (a, b) in enumerate(zip(want, have)) if abs(a - b) > FINGERPRINT_RTOL * max(abs(a), 1e-6)]
        if len(want) != len(have) or bad:
            diffs.append(f"embedding fingerprint ({len(bad) if want else 'no'} of {len(have)} row norms differ "
                         f"by more than {FINGERPRINT_RTOL:.0%})")
    if diffs:
        name = t.get("name", "another model")
        raise IncompatibleModelsError(f"[eagle] the head in {path} was trained for {name}, not this target: "
                                      + "; ".join(diffs))
