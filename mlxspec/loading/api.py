"""`load(target, draft)`: resolve, load, check compatibility, build the `Engine`."""

from __future__ import annotations

import logging
import os
import warnings
from contextlib import contextmanager
from pathlib import Path

import mlx.core as mx

from ..choices import DEFAULT_KV_GROUP_SIZE, DEFAULT_QUANTIZED_KV_START, WEIGHTLESS_DRAFTERS
from ..device import backend
from ..errors import IncompatibleModelsError, InvalidArgumentError, ModelNotFoundError, shown
from .model import load_model
from .precision import resolve_dtype
from .resolve import NotCachedError, resolve_model, resolve_pair

log = logging.getLogger("mlxspec.loading")
KV_TOKENS_FOR_WARNING = 4096  # tokens of KV counted in the memory check when max_kv_size is None
# mlx-lm's names (speculative generation's) for what `load` takes under its own
MLX_LM_NAMES = {"draft_model": "draft", "num_draft_tokens": "num_draft"}


def load(target: str, draft: str | None = None, *, dtype: str | None = None, drafter=None,
         max_kv_size: int | None = None, num_draft=None, tree=None, head: str | None = None, distributed: bool = False,
         lookup: bool | None = None, prompt_cache_size: int = 0, prompt_cache_bytes: int | None = None,
         kv_bits: int | None = None, kv_group_size: int = DEFAULT_KV_GROUP_SIZE,
         quantized_kv_start: int = DEFAULT_QUANTIZED_KV_START, adapter_path: str | os.PathLike | None = None,
         fuse_adapter: bool = False, **kw):
    """Load a target (and a draft) and return a ready `mlxspec.engine.Engine`.

    Args:
        target: a models.toml pair name (gives target and draft), "demo:<name>", a model
            folder, a .gguf file or a Hugging Face repo id.
        draft: a model reference, or "ngram" / "none" (no draft model). Default: None (the
            pair's draft when `target` is a pair name, else no draft model).
        dtype: precision of both models: None/"auto", "quantized", "bfloat16", "float16",
            "float32". Default: None (the backend's default, see `mlxspec.loading.precision`).
        drafter: "ngram", "model", "eagle", "none", or None. Default: None ("ngram"
            or "none" when the draft says so; "model" when `draft` names a model; "eagle" when
            `head` is given; else the pair's default on this backend, `drafter` in models.toml;
            otherwise the engine drafts with the draft model).
        head: an EAGLE head ("builtin:<name>" or a folder) trained for the target. Default: None
            (the pair's head when `target` names a pair that has one). A head given here drafts
            (`drafter` "eagle") unless `drafter` or `draft` says otherwise. Not loaded when `drafter`
            is "ngram" or "none": the target's passes then keep no hidden states.
        max_kv_size: KV window passed to the engine. Default: None (grow without bound).
        num_draft: passed to the engine ("auto", an int or None). Default: None.
        tree: draft trees: None/"auto" (default), "off" or a cap on a round's drafts (see `Engine`).
        lookup: whether a model drafter may hand rounds to prompt lookup (see `Engine`). Default:
            None (the engine's default, True).
        prompt_cache_size: earlier conversations whose caches are kept for when they come back
            (see `Engine`). Default: 0.
        prompt_cache_bytes: bytes those may hold together (see `Engine`). Default: None (no bound).
        kv_bits, kv_group_size, quantized_kv_start: quantize the target's KV cache to kv_bits
            (2-8) in groups of kv_group_size once the context reaches quantized_kv_start tokens,
            as mlx-lm does (see `Engine`). Default: None, 64, 5000 (no quantization).
        adapter_path: a fine-tuned adapter folder written by `mlx_lm.lora` (adapter_config.json and
            adapters.safetensors), applied to the target as `mlx_lm.load(..., adapter_path=...)`
            applies it, unfused; the output is then the adapted target's. The draft and head are
            used as they are (trained for the base target, they may draft less well). A target
            sharded over several ranks takes it fused only (`fuse_adapter`). Default: None (the
            pair's `adapter`, when `target` names a pair that has one).
        fuse_adapter: fold that adapter into the target's weights at load, as `mlx_lm.fuse` does:
            decoding runs about as fast as the base target's (unfused, each adapted linear adds two
            small matmuls), and the output is the fused model's (float sums rounded otherwise, so
            greedy text may part from mlx-lm's unfused at a near-tie; quantized layers quantized
            again). Default: False (the pair's `fuse_adapter`, when its adapter is the one applied).
        distributed: join the `mx.distributed` group this process was launched in (`mlx.launch`)
            and shard the target over it (tensor-parallel or pipeline, see `mlxspec.shard`); the
            draft is loaded whole on every rank. Every rank must then make the same calls (or
            follow rank 0 with `Engine.follow()`); only rank 0 should print or serve. In a
            process not launched that way the group has one rank and nothing is sharded.
            Default: False.
        **kw: `download` (bool, default True) -- fetch models that are not cached.

    Returns:
        An `Engine` with attributes `target_info`, `draft_info` (ModelInfo or None), `head_ref`
        (the EAGLE head's reference, or None), `head_note` (how the adapter the head was trained
        under differs from the target's, in words, or None) and `pair_name` (str or None).

    Raises:
        ModelNotFoundError, IncompatibleModelsError, InvalidArgumentError, MlxSpecError
        (DistributedError when the ranks' weights or tokenizers differ, or one failed to load).
    """
    from ..cache import check_max_kv_size
    from ..kvquant import kv_quant
    from ..compat import check_tokenizers

    download = kw.pop("download", True)
    if kw:
        hints = "".join(f" (mlx-lm's {k} is {MLX_LM_NAMES[k]}= here)" for k in sorted(kw) if k in MLX_LM_NAMES)
        raise InvalidArgumentError(f"[load] unknown keyword argument{'s' if len(kw) > 1 else ''} {sorted(kw)}"
                                   f"{hints}; allowed: {', '.join(_keywords())}")
    from ..prompts import (check_drafter, check_lookup, check_num_draft, check_prompt_cache_bytes,
                           check_prompt_cache_size, check_tree)

    # Before minutes of loading, by the engine's own rules (it checks them again).
    if not isinstance(target, (str, os.PathLike)) or not str(target).strip():
        raise InvalidArgumentError(f"[load] target must be a pair name or a model reference (a folder, a .gguf "
                                   f"file or a repo id), got {shown(target)}")
    resolve_dtype(dtype)
    check_max_kv_size(max_kv_size)
    quant = kv_quant(kv_bits, kv_group_size, quantized_kv_start, max_kv_size=max_kv_size)
    check_prompt_cache_size(prompt_cache_size)
    check_prompt_cache_bytes(prompt_cache_bytes)
    check_num_draft(num_draft)
    check_tree(tree)
    if lookup is not None:
        check_lookup(lookup)
    if drafter is not None:
        check_drafter(drafter)
    pair = resolve_pair(target)
    target_ref = pair.target if pair else target
    draft_ref = draft if draft is not None else (pair.draft if pair else None)
    asked = drafter or (draft if draft in WEIGHTLESS_DRAFTERS else None)  # a weightless drafter asked for here
    if drafter is None and head is not None and draft is None:  # a head given here drafts, as a draft does
        drafter = "eagle"
    # The pair's default drafter, unless one is asked for or a draft given here replaces the pair's.
    pair_default = pair.drafter_on(backend()) if drafter is None and pair and draft is None else ""
    if draft_ref in WEIGHTLESS_DRAFTERS:
        drafter = drafter or draft_ref
        draft_ref = None
    if drafter == "model" and draft_ref is None:
        raise InvalidArgumentError(
            "[load] drafter='model' needs a draft model: pass draft=<model reference> or a pair whose draft is a model"
        )
    head_ref = head if head is not None else (pair.head if pair and pair.head else None)
    if adapter_path is None and pair and pair.adapter:  # the pair's fine-tuned target
        adapter_path, fuse_adapter = pair.adapter, fuse_adapter or pair.fuse_adapter
    if drafter == "eagle" and head_ref is None:
        raise InvalidArgumentError(
            "[load] drafter='eagle' needs a head: pass head=<folder or builtin:name> or a pair that names one")
    if asked in ("ngram", "none"):  # asked for here: the draft model and head would go unused
        draft_ref = head_ref = None
    for role, ref in (("target", target_ref), ("draft", draft_ref)):
        _refuse_a_head(role, ref)
    with _pull_by_pair(pair):
        head_path = _head_folder(head_ref, download) if head_ref is not None else None  # before minutes of loading
    if adapter_path is not None:
        from .adapters import adapter_folder, read_config

        read_config(adapter_folder(adapter_path))  # before minutes of loading
    elif fuse_adapter:
        raise InvalidArgumentError("[load] fuse_adapter=True, but there is no adapter to fuse: give "
                                   "adapter_path=<folder>, or a pair that names one")

    group = None
    if distributed:
        from ..distributed import TIMEOUT_ENV, check_timeout, init_group

        if os.environ.get(TIMEOUT_ENV):  # said before the load, not after it
            check_timeout(os.environ[TIMEOUT_ENV])
        group = init_group()
        if group.size() == 1:  # not started by mlx.launch: say so rather than look sharded
            warnings.warn("--distributed (distributed=True) is set, but this process is the only rank "
                          "(mx.distributed found no group: start every rank with mlx.launch, e.g. `mlx.launch "
                          "--hosts mac1,mac2 -- mlxspec ... --distributed`); the whole target runs here")
    with _pull_by_pair(pair):
        if group is not None and group.size() > 1:
            from .sharded import load_sharded

            if adapter_path is not None and not fuse_adapter:  # LoRA layers would wrap the sharded linears
                raise InvalidArgumentError(f"[load] adapter_path={str(adapter_path)!r} cannot be applied unfused to a "
                                           f"target sharded over {group.size()} ranks; fold it into the weights "
                                           f"before they are sharded (fuse_adapter=True)")

            settings = {"--dtype": dtype, "--max-kv-size": max_kv_size, "--drafter": drafter,
                        "--kv-bits": [kv_bits, kv_group_size, quantized_kv_start] if kv_bits is not None else None}
            target_model, tokenizer, target_info, draft_model, draft_tokenizer, draft_info = load_sharded(
                target_ref, draft_ref, group=group, dtype=dtype, download=download, settings=settings, head=head_path,
                adapter=adapter_path)
        else:
            group = None
            target_model, tokenizer, target_info = load_model(target_ref, dtype=dtype, download=download,
                                                              adapter_path=adapter_path, fuse_adapter=fuse_adapter)
            draft_model = draft_tokenizer = draft_info = None
            if draft_ref is not None:
                draft_model, draft_tokenizer, draft_info = load_model(draft_ref, dtype=dtype, download=download,
                                                                      draft=True)
    if pair_default:  # the pair's default here; its draft model stays loaded and selectable
        # A head drafting over several ranks was never measured: those keep the n-gram drafter.
        drafter = "ngram" if pair_default == "eagle" and group is not None else pair_default
    if draft_model is not None:
        try:
            check_tokenizers(tokenizer, draft_tokenizer)
        except IncompatibleModelsError as e:  # which two files
            raise IncompatibleModelsError(f"the draft {draft_ref} cannot draft for the target {target_ref}: {e}") \
                from None
    _report_memory(target_info, draft_info, max_kv_size, quant)

    from ..engine import Engine

    engine = Engine(target_model, tokenizer, draft_model, draft_tokenizer=draft_tokenizer, drafter=drafter,
                    max_kv_size=max_kv_size, num_draft=num_draft, **({"group": group} if group else {}),
                    **({"tree": tree} if tree is not None else {}),
                    **({"lookup": lookup} if lookup is not None else {}),
                    prompt_cache_size=prompt_cache_size, prompt_cache_bytes=prompt_cache_bytes,
                    kv_bits=kv_bits, kv_group_size=kv_group_size, quantized_kv_start=quantized_kv_start,
                    **({"eagle_head": head_path} if head_path is not None else {}))
    engine.target_info = target_info
    engine.draft_info = draft_info
    engine.head_ref = head_ref if head_path is not None else None
    # A head trained under another adapter (or none) than the target's drafts right less often:
    # said on the load line, so a slow head is not a mystery (`scripts/train_eagle.py --adapter-path`).
    engine.head_note = None
    if engine.eagle is not None:
        from .adapters import head_mismatch

        training = engine.eagle[2].get("training")
        engine.head_note = head_mismatch(training.get("adapter") if isinstance(training, dict) else None, adapter_path)
    engine.pair_name = pair.name if pair else None
    return engine


@contextmanager
def _pull_by_pair(pair):
    """A model of `pair` not cached yet: the message says `mlxspec pull PAIR` (every model of it)."""
    try:
        yield
    except NotCachedError as e:
        if pair is None:
            raise
        raise e.for_pair(pair) from None


def _is_head(folder: Path) -> bool:
    """Whether `folder` holds an EAGLE head, by its config.json; False for anything else (no folder,
    no config, not JSON: resolving it says what is wrong)."""
    import json

    try:
        return json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type") == "eagle_head"
    except (OSError, ValueError, AttributeError):
        return False


def _refuse_a_head(role: str, ref) -> None:
    """An EAGLE head given as a model is said as such before minutes of loading (mlx-lm would say
    "Model type eagle_head not supported" after them). Only local folders are looked at: cheap."""
    from .resolve import builtin_folder

    if ref is None:
        return
    ref = str(ref)
    if _is_head(builtin_folder(ref) or Path(ref).expanduser()):
        raise InvalidArgumentError(
            f"[load] {role}={ref!r} is an EAGLE head, not a {role} model: pass it as head={ref!r} (drafter='eagle' "
            f"drafts with it)" + ("" if role == "draft" else ", with the target it was trained for as target"))


def _keywords() -> list[str]:
    """Every keyword `load` takes, in its signature's order, and those **kw reads."""
    import inspect

    named = [n for n, p in inspect.signature(load).parameters.items()
             if n != "target" and p.kind is not p.VAR_KEYWORD]
    return named + ["download"]


def _report_memory(target_info, draft_info, max_kv_size, quant=None) -> int:
    """Log the weights sizes; warn when weights + KV exceed Metal's recommended working set."""
    from ..kvquant import quant_share

    total = target_info.weights_bytes + (draft_info.weights_bytes if draft_info else 0)
    log.info("weights: target %.1f MB, draft %s", target_info.weights_bytes / 1e6,
             f"{draft_info.weights_bytes / 1e6:.1f} MB" if draft_info else "none")
    tokens = max_kv_size or KV_TOKENS_FOR_WARNING
    for info in (target_info, draft_info):
        if info is not None and info.kv_bytes_per_token:
            full = tokens if quant is None or info is draft_info else min(tokens, quant.start)
            total += info.kv_bytes_per_token * (full + (tokens - full) * quant_share(quant))
    if mx.metal.is_available():
        device_info = getattr(mx, "device_info", None) or mx.metal.device_info
        limit = device_info().get("max_recommended_working_set_size")
        if limit and total > limit:
            warnings.warn(
                f"target + draft weights + KV for {tokens} tokens need ~{total / 2**30:.1f} GiB, more than "
                f"this GPU's recommended working set ({limit / 2**30:.1f} GiB); expect swapping. "
                "Use a smaller pair or a smaller max_kv_size.",
                ResourceWarning, stacklevel=3,
            )
    return total


def _head_folder(ref: str, download: bool):
    """An EAGLE head's folder; ModelNotFoundError in a head's terms (not a model's) when there is none."""
    from ..drafters.eagle_files import head_config
    from .resolve import BUILTIN, BUILTIN_DIR

    folder = Path(ref).expanduser()
    if not folder.is_dir():
        try:
            folder = resolve_model(ref, download=download).path
        except NotCachedError:  # there, but not fetched yet: its message says how
            raise
        except ModelNotFoundError as e:
            shipped = ", ".join(sorted(BUILTIN + p.name for p in BUILTIN_DIR.iterdir() if _is_head(p)))
            found = f"; {e}" if folder.exists() else ""  # a file that is there, but no head
            raise ModelNotFoundError(
                f"EAGLE head {ref!r} not found: give a head folder (config.json + model.safetensors, as "
                f"scripts/train_eagle.py writes it) or a shipped one ({shipped}){found}") from None
    head_config(folder)  # a folder that is there but is no head, or a damaged one, said in a head's terms
    return folder
