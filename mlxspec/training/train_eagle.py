"""`mlxspec train-eagle` (and scripts/train_eagle.py): an EAGLE head trained for a target by
self-distillation, offline. The flags and what each stage does: eagle_args.py (`--help`);
--target's stages: train_eagle_mlx.py; --gguf's (PyTorch): eagle_data.py and eagle_torch.py.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from . import eagle_args, train_common, train_draft
from .eagle_args import check_out
from .eagle_data import (check_work, feature_layers, llama_gguf, load_features, stage_generate,
                         stage_layers, stage_vocab, target_config, target_digest)
from .eagle_torch import stage_train
from .eagle_card import training_record, write_card
from .eagle_training import init_head, settle_draft_vocab, tapped_layers, window_config
from .train_common import log


# ------------------------------------------------- stage 5: export (stages 2-3: eagle_data.py; 4: eagle_torch.py)

def stage_export(args, final: Path, vocab) -> None:
    import mlx.core as mx
    import torch
    from mlx_lm.models.llama import ModelArgs

    from mlxspec.drafters.eagle import EagleHead, load_head, save_head
    from mlxspec.loading.model import load_model

    ck = train_common.read_work(final, lambda p: torch.load(p, weights_only=False))
    target, _, _ = load_model(str(args.gguf), download=False)  # mlxspec's own loading path
    cfg = dict(ck["cfg"])
    layers = cfg.pop("feature_layers", [])
    depth = cfg.pop("num_layers", 1)
    context = cfg.pop("context", "head")
    head = EagleHead(ModelArgs(model_type="llama", num_hidden_layers=depth, vocab_size=len(vocab), **cfg),
                     taps=len(layers), context=context)
    head.load_weights([(k, mx.array(v.float().numpy())) for k, v in ck["head"].items()], strict=True)
    # float32 (the default) is not written: earlier heads' configs stay as they were
    precision = {"precision": ck["precision"]} if ck.get("precision", "float32") != "float32" else {}
    record = training_record(args, ck, "scripts/train_eagle.py", **precision)
    out = Path(args.out)
    save_head(out, head, mx.array(vocab), target, name=Path(args.gguf).stem,
              extra={**window_config(args), "training": record}, feature_layers=layers)
    load_head(out, target)  # the shipped folder must load against the target it was made for
    write_card(out, record, str(args.gguf), ck["history"])
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    log(f"exported {out}: {size / 1e6:.1f} MB; training took {ck['train_seconds'] / 60:.1f} min")


# ---------------------------------------------------------------- main

def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=eagle_args.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    eagle_args.add_arguments(p)
    args = p.parse_args(argv)
    eagle_args.check(p, args)
    return args


def main(argv=None):
    return run(parse_args(argv))


def run(args):
    """Every stage up to --stop-after, for arguments `parse_args` (or the command's parser) checked;
    then the --pair, if one is asked for."""
    entry = eagle_args.pair_entry(args)
    if entry:  # (imports MLX: only then, since --gguf's stages import torch first)
        from mlxspec.loading import registry

        registry.own_pair_state(entry)  # refused now, not after the hours of work
    if args.target:
        from . import train_eagle_mlx

        train_eagle_mlx.main(args)
    else:
        run_pytorch(args)
    if entry and args.stop_after == "export":
        added = registry.add_own_pair(entry)
        log(f"pair {entry['name']!r} {'added to' if added else 'already in'} {registry.user_pairs_path()}")


def run_pytorch(args) -> None:
    """The stages with --gguf: the target in PyTorch (eagle_data.py, eagle_torch.py)."""
    work, t0 = train_common.start(args)
    digest = target_digest(Path(args.gguf))  # the whole file read once
    llama_gguf(Path(args.gguf))
    check_out(args, digest)
    check_work(work, args, f"{Path(args.gguf).name} sha256:{digest}")
    prompts = train_draft.stage_prompts(args, work)
    prompts.update(train_draft.logged_prompt_files(args.prompt_file))
    args.init_head = init_head(args.init, Path(args.gguf), Path(args.out)) if args.init else None
    if args.init_head:  # the continued head reads what it was trained on
        args.feature_layers = ",".join(map(str, args.init_head["feature_layers"])) or "final"
        args.context = args.init_head["context"]
    tcfg = target_config(Path(args.gguf))
    args.vocab_size, args.intermediate = tcfg["vocab_size"], args.intermediate or tcfg["intermediate_size"]
    settle_draft_vocab(args)
    # --feature-layers resolved against the target once; the train stage reads args.layers
    args.layers = feature_layers(args.feature_layers, tcfg["num_hidden_layers"])
    layers = tapped_layers(args, tcfg["num_hidden_layers"])
    shards = stage_generate(args, work, prompts, layers)
    log(f"generate done: {len(shards)} shards ({time.time() - t0:.0f}s so far)")
    if args.stop_after == "generate":
        return
    if layers:
        stage_layers(args, shards, layers)
        log(f"layers done: the outputs of target layers {layers} ({time.time() - t0:.0f}s so far)")
    if args.stop_after == "layers":
        return
    train, held = load_features(shards, layers)
    vocab = stage_vocab(args, work, train)
    final = stage_train(args, work, train, held, vocab)
    log(f"train done ({time.time() - t0:.0f}s so far)")
    if args.stop_after == "train":
        return
    stage_export(args, final, vocab)
    log(f"export done: {args.out} ({time.time() - t0:.0f}s in all)")

