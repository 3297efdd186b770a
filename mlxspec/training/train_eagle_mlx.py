"""train_eagle.py's stages on MLX, for any target mlxspec loads (`--target REF`): training,
export and the stages' order (the answers and features: eagle_mlx_data.py).

A Hugging Face repo id, an MLX folder (quantized or not) or a GGUF, on a Mac's GPU, an NVIDIA
GPU (MLX's CUDA backend) or a CPU; no PyTorch. The head is mlxspec's own `EagleHead`, trained
with eagle_objective.py and exported as is. Shards, vocabulary, run tags and the export format
are train_eagle.py's own; only the stages' insides differ.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from ..files import save_safetensors, staged
from . import eagle_objective as obj
from .eagle_card import training_record, write_card
from .eagle_data import check_work, feature_layers, load_features, stage_vocab
from .eagle_mlx_data import gen_dir, load_target, stage_generate, target_config
from .eagle_training import (TimeBudget, epoch_batches, head_config, init_head, note_checkpoint, padded_batch,
                            reads_target, run_tag, say_data, say_other_runs, settle_draft_vocab, split_context,
                            tapped_layers, train_steps, widened, wider_mlp, window_config)
from . import train_common
from . import train_draft
from .train_common import log

# Families whose decoder block is llama's (names, shapes and computation), so the head can
# start from the target's last layer; qwen2's attention biases are left out. Others start random.
LLAMA_BLOCKS = ("llama", "mistral", "qwen2")


# ---------------------------------------------------------------- stage 4: train

def float_block(block) -> dict:
    """A block's parameters by name, quantized linears dequantized (float32)."""
    from mlxspec.loading.precision import dequantized_weight

    flat = dict(tree_flatten(block.parameters()))
    for name, m in block.named_modules():
        if isinstance(m, nn.QuantizedLinear):
            flat[f"{name}.weight"] = dequantized_weight(m)
            flat.pop(f"{name}.scales"), flat.pop(f"{name}.biases", None)
    return {k: v.astype(mx.float32) for k, v in flat.items()}


def init_from_target(head, model) -> None:
    """Start the head from the target's last layers and final norm where its blocks are llama's
    (the same feature space); other families' heads start from random weights."""
    family = model.args.model_type
    if family not in LLAMA_BLOCKS:
        log(f"{family} blocks are not llama's: the head's layers start from random weights")
        return

    for mine, theirs in zip(head.layers, model.model.layers[-len(head.layers):]):
        have = float_block(theirs)
        want = dict(tree_flatten(mine.parameters()))
        if wider_mlp(have, want):  # --intermediate above the target's: start as its layer
            have = {k: mx.array(v) for k, v in widened(have, want).items()}
        mine.load_weights([(k, have[k]) for k, v in want.items() if k in have and have[k].shape == v.shape],
                          strict=False)
    head.norm.weight = model.model.norm.weight.astype(mx.float32)


def make_head(cfg: dict, vocab_size: int):
    from mlx_lm.models.llama import ModelArgs

    from mlxspec.drafters.eagle_files import LAYER_FIELDS
    from mlxspec.drafters.eagle_head import EagleHead

    layer = {k: cfg[k] for k in LAYER_FIELDS}
    head = EagleHead(ModelArgs(model_type="llama", num_hidden_layers=cfg.get("num_layers", 1),
                               vocab_size=vocab_size, **layer), taps=len(cfg.get("feature_layers") or []),
                     context=cfg.get("context", "head"))
    head.set_dtype(mx.float32)
    return head


def batch_arrays(batch, model, noise: float, key, answers_only: bool = True, context: bool = False):
    """eagle_training.padded_batch as MLX arrays: embeddings of x[j+1], input features (noised),
    targets f[j+1], loss weights (1.0 where the loss applies); with `context`, also the target's
    last-layer (keys, values) from the batch's tapped rows (`eagle_objective.context_kv`)."""

    ctx = None
    if context:
        rows, batch = split_context(batch)
        ctx = obj.context_kv(model, mx.array(rows))
    tok, feat, tgt, mask = padded_batch(batch, answers_only)
    feat = mx.array(feat)
    if noise:
        scale = mx.sqrt(mx.mean(feat * feat))
        feat = feat + mx.random.uniform(-1.0, 1.0, feat.shape, key=key) * noise * scale
    emb = model.model.embed_tokens(mx.array(tok)).astype(mx.float32)
    out = (emb, feat, mx.array(tgt), mx.array(mask.astype(np.float32)))
    return (*out, ctx) if context else out


def optimizer(lr: float):
    """eagle_torch.py's AdamW (0.9, 0.95, no weight decay); MLX's leaves out Adam's bias
    correction unless asked, which shrinks the first steps' updates (about 0.45x at step 1)."""
    return optim.AdamW(learning_rate=lr, betas=[0.9, 0.95], weight_decay=0.0, bias_correction=True)


def run_batch(args, rows, model, noise: float, key):
    """`batch_arrays` for this run: (embeddings, features, targets, weights, context or None)."""
    out = batch_arrays(rows, model, noise, key, args.loss_on == "answers", context=reads_target(args))
    return out if reads_target(args) else (*out, None)


def evaluate(head, model, w_draft, held, args):
    from mlxspec.backbone import logit_map

    tot, agree, n = 0.0, np.zeros(args.unroll), 0
    for b in range(0, len(held), args.batch):
        emb, feat, tgt, w, ctx = run_batch(args, held[b:b + args.batch], model, 0.0, None)
        loss, a = obj.loss(head, emb, feat, tgt, w, w_draft, steps=args.unroll, first=obj.first_loss_entry(w),
                           unroll_weight=args.unroll_weight, ce_weight=args.ce_weight, context=ctx,
                           post=logit_map(model))
        k = w.sum().item()
        tot += loss.item() * k
        agree += np.array(a)
        n += k
    return tot / max(n, 1), [round(float(a) / max(n, 1), 4) for a in agree]


def _save(path: Path, arrays: dict, meta: dict) -> None:
    # Both written whole first, then renamed back to back: an interruption cannot leave one
    # checkpoint's weights beside another's step count (short of the instant between the renames).
    with staged(path, path.with_suffix(".json")) as [tmp, tmpj]:
        save_safetensors(tmp, arrays)
        tmpj.write_text(json.dumps(meta))


def stage_train(args, work: Path, train, held, vocab, model, cfg) -> Path:
    """The head trained as eagle_torch.stage_train trains it, in MLX; returns its final file."""
    from mlxspec.backbone import logit_map, output_rows
    from .train_common import lr_scale

    tag = run_tag(args, train) + "-mlx"
    final, ckpt = work / f"head_final-{tag}.safetensors", work / f"head_ckpt-{tag}.safetensors"
    if final.exists() and final.with_suffix(".json").exists():
        return final
    mx.random.seed(args.seed)
    head = make_head(cfg, len(vocab))
    init = getattr(args, "init_head", None)
    if init:  # continue the --init head (its shape and vocabulary are this run's)
        head.load_weights([(k, mx.array(v)) for k, v in init["weights"].items()], strict=True)
        log(f"continuing {init['folder']} (weights {init['digest']})")
    else:
        init_from_target(head, model)
    w_draft = output_rows(model, mx.array(vocab)).astype(mx.float32)  # (N, H)
    post = logit_map(model)  # Gemma 2's cap, Granite's or Cohere's scale: the laws are the target's
    nparams = sum(v.size for _, v in tree_flatten(head.parameters()))
    say_data(train, held, nparams, args)
    opt = optimizer(args.lr)
    total, warm = train_steps(len(train), args)
    step, elapsed, history, epoch, in_epoch = 0, 0.0, [], 0, 0
    if ckpt.exists() and ckpt.with_suffix(".json").exists():
        meta = train_common.read_work(ckpt.with_suffix(".json"), lambda p: json.loads(p.read_text()))
        saved = train_common.read_work(ckpt, lambda p: mx.load(str(p)))
        head.load_weights([(k[5:], v) for k, v in saved.items() if k.startswith("head.")], strict=True)
        opt.state = tree_unflatten([(k[4:], v) for k, v in saved.items() if k.startswith("opt.")])
        step, elapsed, history, epoch, in_epoch = (meta[k] for k in ("step", "elapsed", "history", "epoch", "in_epoch"))
        total = meta.get("total", total)  # a run cut by --train-minutes resumes to its cut
        log(f"resumed at step {step}/{total}")
    else:
        say_other_runs(ckpt, args)

    def held_out(at: int, when: str) -> None:  # measured, kept for the card's rows, and said
        vl, va = evaluate(head, model, w_draft, held, args)
        history.append({"step": at, "held_loss": round(vl, 5), "held_top1": va})
        log(f"held-out {when}: loss {vl:.4f}, top-1 per step {' '.join(map(str, va))}")

    if not history:
        held_out(0, "before training")

    def step_loss(emb, feat, tgt, w, first, ctx):
        return obj.loss(head, emb, feat, tgt, w, w_draft, steps=args.unroll, first=first,
                        unroll_weight=args.unroll_weight, ce_weight=args.ce_weight, context=ctx, post=post)

    loss_and_grad = nn.value_and_grad(head, step_loss)
    budget = TimeBudget(args.train_minutes, step) if args.train_minutes else None
    t0 = time.time() - elapsed
    run = [0.0, np.zeros(args.unroll), 0.0]
    while step < total:
        order = epoch_batches(train, args.batch, random.Random(args.seed * 7919 + epoch))  # replayable on resume
        for b in order[in_epoch:]:
            if step >= total:
                break
            opt.learning_rate = args.lr * lr_scale(step, total, warm)
            emb, feat, tgt, w, ctx = run_batch(args, [train[i] for i in b], model, args.noise,
                                               mx.random.key(args.seed * 1000003 + step))
            (loss, agree), grads = loss_and_grad(emb, feat, tgt, w, obj.first_loss_entry(w), ctx)
            grads, _ = optim.clip_grad_norm(grads, 0.5)
            opt.update(head, grads)
            mx.eval(head.parameters(), opt.state, loss, agree)
            step += 1
            in_epoch += 1
            total = budget.total(step, total, warm) if budget else total
            k = w.sum().item()
            run = [run[0] + loss.item() * k, run[1] + np.array(agree), run[2] + k]
            if step % 20 == 0 or step == total:
                el = time.time() - t0
                tops = " ".join(f"{a / max(run[2], 1):.3f}" for a in run[1])
                log(f"step {step}/{total} loss {run[0] / max(run[2], 1):.4f} top-1 per step {tops} "
                    f"eta {el / step * (total - step) / 60:.1f} min")
                run = [0.0, np.zeros(args.unroll), 0.0]
            if step % args.ckpt_every == 0 or step == total:
                held_out(step, f"after step {step}")
                arrays = {**{f"head.{k}": v for k, v in tree_flatten(head.parameters())},
                          **{f"opt.{k}": v for k, v in tree_flatten(opt.state)}}
                _save(ckpt, arrays, {"step": step, "elapsed": time.time() - t0, "history": history,
                                     "epoch": epoch, "in_epoch": in_epoch, "total": total})
                note_checkpoint(ckpt, args, step, total)
        epoch, in_epoch = epoch + 1, 0
    _save(final, dict(tree_flatten(head.parameters())),
          {"cfg": cfg, "train_seconds": time.time() - t0, "steps": total, "sequences": len(train),
           "entries": sum(len(t[0]) - 1 for t in train), "history": history,
           "init": init["lineage"] if init else None})
    return final


# ---------------------------------------------------------------- stage 5: export

def stage_export(args, final: Path, vocab, model, name: str) -> None:
    from mlxspec.device import backend
    from mlxspec.drafters.eagle import load_head, save_head

    meta = train_common.read_work(final.with_suffix(".json"), lambda p: json.loads(p.read_text()))
    cfg = meta["cfg"]
    head = make_head(cfg, len(vocab))
    head.load_weights(list(train_common.read_work(final, lambda p: mx.load(str(p))).items()), strict=True)
    # the adapted target's head: which adapter (a folder's name, its digest)
    adapter = {"adapter": {"name": Path(args.adapter_path).name, "digest": args.adapter_digest}} \
        if args.adapter_path else {}
    maker = getattr(args, "made_by", "scripts/train_eagle.py --target")
    record = training_record(args, meta, maker, backend=backend(), **adapter)
    out = Path(args.out)
    save_head(out, head, mx.array(vocab), model, name=name, extra={**window_config(args), "training": record},
              feature_layers=cfg.get("feature_layers") or [])
    load_head(out, model)  # the folder must load against the target it was made for
    write_card(out, record, args.target, meta["history"])
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    log(f"exported {out}: {size / 1e6:.1f} MB; training took {meta['train_seconds'] / 60:.1f} min")


# ---------------------------------------------------------------- main

def main(args) -> None:
    """train_eagle.py's stages for --target (its parsed arguments)."""
    from mlxspec.device import backend
    from mlxspec.loading.adapters import adapter_digest

    random.seed(args.seed)
    work, t0 = Path(args.work), time.time()
    log(f"loading {args.target} (MLX, {backend()})")
    model, tok, name = load_target(args.target, args.adapter_path)  # first: a target not found leaves no folder
    work.mkdir(parents=True, exist_ok=True)
    prompts = train_draft.stage_prompts(args, work)
    prompts.update(train_draft.logged_prompt_files(args.prompt_file))
    args.adapter_digest = adapter_digest(args.adapter_path) if args.adapter_path else None  # read once
    check_work(work, args, gen_dir(work, model, args.adapter_digest).name, named=args.target)  # by its fingerprint
    tcfg = target_config(model)
    args.vocab_size, args.intermediate = tcfg["vocab_size"], args.intermediate or tcfg["intermediate_size"]
    args.init_head = init_head(args.init, args.target, Path(args.out)) if args.init else None
    if args.init_head:  # the continued head reads what it was trained on
        args.feature_layers = ",".join(map(str, args.init_head["feature_layers"])) or "final"
        args.context = args.init_head["context"]
    settle_draft_vocab(args)
    args.layers = feature_layers(args.feature_layers, tcfg["num_hidden_layers"])
    layers = tapped_layers(args, tcfg["num_hidden_layers"])
    shards = stage_generate(args, work, prompts, model, tok, layers)
    log(f"generate done: {len(shards)} shards ({time.time() - t0:.0f}s so far)")
    if args.stop_after in ("generate", "layers"):
        return
    train, held = load_features(shards, layers)
    if not train or not held:
        raise SystemExit(f"no {'train' if not train else 'held-out'} answers to train on: give prompts "
                         "(--prompts N templated ones, --prompt-file FILE) and --held-out N >= 1")
    vocab = stage_vocab(args, work, train)
    final = stage_train(args, work, train, held, vocab, model, head_config(args, tcfg))
    log(f"train done ({time.time() - t0:.0f}s so far)")
    if args.stop_after == "train":
        return
    stage_export(args, final, vocab, model, name)
    log(f"export done: {args.out} ({time.time() - t0:.0f}s in all)")

