"""Train the demo draft model for SmolLM2-135M-Instruct by self-distillation (CPU, offline).

    python scripts/train_draft.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf --work WORKDIR --seed 0

Stages (each cached under --work, so a rerun skips what is finished):
  1. prompts   instruction prompts from templates (draft_prompts.py), split by prompt,
               plus every --prompt-file's (JSONL, as train_eagle.py reads them), all trained on
  2. generate  the target's own answers to the chat-formatted prompts, greedy and T=0.7,
               batched with left padding and a KV cache; each answer position keeps the
               target's top-k log-probabilities (the soft labels)
  3. train     a small llama (the target's tokenizer, PCA-initialised tied embedding) trained
               with cross-entropy to the target's top-k distributions on the answer tokens
  4. export    an mlx-lm folder: 8-bit MLX weights, config, the GGUF's tokenizer + chat template

PyTorch is used only here (never by mlxspec at run time); threads are capped at --threads.
Stage 2 is in draft_answers.py; what the training scripts share, in train_common.py and
torch_target.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import time
from pathlib import Path

import numpy as np

from .draft_answers import PAD, load_generated, stage_generate
from .draft_prompts import PROMPT_FILE_HELP, make_prompts, prompt_files, split
from . import train_common
from .train_common import GEN_BATCH, log, lr_scale, positive_int, read_work


# ---------------------------------------------------------------- stage 1: prompts

def stage_prompts(args, work: Path) -> dict:
    path = work / f"prompts-{args.seed}-{args.prompts}-{args.held_out}.json"
    if path.exists():
        return read_work(path, lambda p: json.loads(p.read_text()))
    prompts = make_prompts(args.prompts + args.held_out, args.seed)
    train, held = split(prompts, args.held_out)
    data = {"train": train, "held_out": held}
    from mlxspec.files import write_atomic

    write_atomic(path, json.dumps(data, indent=1))  # whole or absent: a later run trusts it because it exists
    log(f"prompts: {len(train)} train, {len(held)} held out")
    return data


def logged_prompt_files(paths) -> dict:
    """draft_prompts.prompt_files, saying what each file gave."""
    files = {}
    for path in paths or []:
        (key, prompts), = prompt_files([path]).items()
        files[key] = prompts
        log(f"prompt file {path}: {len(prompts)} prompts ({key})")
    return files


# ---------------------------------------------------------------- stage 3: train (stage 2: draft_answers.py)

def draft_config(args, target: dict) -> dict:
    """The draft's mlx-lm / transformers llama config: its own shape (the flags), and what it
    shares with the target (`target_tokens`: the vocabulary, special tokens, context and rope)."""
    return {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "hidden_size": args.hidden, "num_hidden_layers": args.layers, "intermediate_size": args.intermediate,
        "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads,
        "head_dim": args.hidden // args.heads, "rms_norm_eps": 1e-5, **target,
        "tie_word_embeddings": True, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
    }


def target_tokens(gguf: Path) -> dict:
    """What a draft shares with its target, from the GGUF's header: the vocabulary size (its
    embedding's rows), the special tokens' ids (no padding id: the end's, as the demo's has),
    the context length and the rope base (the demo target's: 49,152, 1/2/2, 8,192, 100,000).
    Imports mlxspec: call it after torch."""
    from mlxspec.loading.gguf_header import read_header

    meta, tensors = read_header(gguf)
    arch = meta.get("general.architecture", "llama")
    rows = next(t.shape[-1] for t in tensors if t.name == "token_embd.weight")

    def number(key, default, kind=int):
        return kind(meta[key].item()) if key in meta else default
    eos = number("tokenizer.ggml.eos_token_id", 2)
    return {"vocab_size": rows, "bos_token_id": number("tokenizer.ggml.bos_token_id", 1), "eos_token_id": eos,
            "pad_token_id": number("tokenizer.ggml.padding_token_id", eos),
            "max_position_embeddings": number(f"{arch}.context_length", 8192),
            "rope_theta": number(f"{arch}.rope.freq_base", 10000.0, float)}


def target_embedding(gguf: Path, *, output: bool = False) -> np.ndarray:
    """The target's token embedding (V, H), dequantized straight from the GGUF.

    output=True: the output head's weights instead, `output.weight` where the GGUF has one
    (untied embeddings), else the same tied embedding."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    tensors = {t.name: t for t in GGUFReader(gguf).tensors}
    t = tensors.get("output.weight") if output else None
    t = t if t is not None else tensors["token_embd.weight"]
    return dequantize(t.data, t.tensor_type).astype(np.float32)


def pca_embedding(emb: np.ndarray, width: int) -> np.ndarray:
    """Project the target's embedding onto its top `width` principal directions (uncentred).

    E ~ U S V^T; E V_k keeps the dot products that the target's tied head computes in that
    subspace, so the draft starts with a meaningful vocabulary geometry.
    """
    gram = emb.T.astype(np.float64) @ emb  # (576, 576)
    w, v = np.linalg.eigh(gram)
    top = v[:, np.argsort(w)[::-1][:width]]  # (576, width)
    return (emb @ top).astype(np.float32)


def examples(rows, max_len: int):
    """(input ids, first answer position, answer ids, top-k ids, top-k log-probs) per answer."""
    out = []
    for r in rows:
        p, a = r["prompt"], r["answer"]
        n = min(len(a), max_len - len(p))
        if n <= 0:
            continue
        ids = np.concatenate([p, a[: n - 1]]).astype(np.int64)
        out.append((ids, len(p) - 1, r["topid"][:n].astype(np.int64), r["toplp"][:n].astype(np.float32)))
    return out


def batch_loss(model, batch, *, train: bool = True):
    """Cross-entropy to the target's renormalised top-k distribution on answer positions.

    Returns (loss, top-1 agreements, positions): top-1 agreement = draft argmax == target argmax.
    """
    import torch

    B, L = len(batch), max(len(b[0]) for b in batch)
    ids = torch.full((B, L), PAD, dtype=torch.long)
    rows, cols, tid, tlp = [], [], [], []
    for i, (x, start, topid, toplp) in enumerate(batch):
        ids[i, : len(x)] = torch.from_numpy(x)
        n = len(topid)
        rows.append(torch.full((n,), i))
        cols.append(torch.arange(start, start + n))
        tid.append(torch.from_numpy(topid))
        tlp.append(torch.from_numpy(toplp))
    rows, cols = torch.cat(rows), torch.cat(cols)
    tid, tlp = torch.cat(tid), torch.cat(tlp)  # (N, k)
    with torch.set_grad_enabled(train):
        h = model.model(input_ids=ids).last_hidden_state  # (B, L, D); right padding needs no mask
        logits = h[rows, cols] @ model.model.embed_tokens.weight.T  # (N, V): only answer positions
        logq = torch.log_softmax(logits, dim=-1)
        p = torch.softmax(tlp, dim=-1)  # the target's top-k, renormalised
        loss = -(p * logq.gather(1, tid)).sum(-1).mean()
    agree = (logits.argmax(-1) == tid[:, 0]).sum().item()
    return loss, agree, len(tid)


def make_batches(exs, batch: int, rng: random.Random):
    """Shuffle, sort within windows of 8 batches by length (little padding), shuffle batches."""
    order = list(range(len(exs)))
    rng.shuffle(order)
    win = batch * 8
    batches = []
    for w in range(0, len(order), win):
        chunk = sorted(order[w:w + win], key=lambda i: len(exs[i][0]))
        batches += [chunk[b:b + batch] for b in range(0, len(chunk), batch)]
    rng.shuffle(batches)
    return [[exs[i] for i in b] for b in batches]


def evaluate(model, exs, batch: int):
    import torch

    model.eval()
    tot_loss, agree, n = 0.0, 0, 0
    with torch.no_grad():
        for b in range(0, len(exs), batch):
            loss, a, k = batch_loss(model, exs[b:b + batch], train=False)
            tot_loss += loss.item() * k
            agree += a
            n += k
    model.train()
    return tot_loss / max(n, 1), agree / max(n, 1)


TRAIN_KEYS = ("hidden", "layers", "heads", "kv_heads", "intermediate", "epochs", "batch", "lr", "max_len", "seed")


def run_tag(args, shards: list) -> str:
    """Names a training run by its answer shards and settings, so that more prompts or other
    settings train a new draft instead of exporting a stale one, and a rerun reuses its own."""
    settings = json.dumps([sorted(Path(s).name for s in shards)] + [getattr(args, k) for k in TRAIN_KEYS])
    return f"s{len(shards)}-" + hashlib.sha1(settings.encode()).hexdigest()[:8]


def final_path(args, work: Path, shards: list) -> Path:
    return work / f"draft_final-{run_tag(args, shards)}.pt"


def stage_train(args, work: Path, shards: list) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    final = final_path(args, work, shards)
    if final.exists():
        log(f"reusing {final.name} (same answers and settings)")
        return
    data = load_generated(shards)
    train_ex = examples(data["train"], args.max_len)
    val_ex = examples(data["held_out"], args.max_len)
    ntok = sum(len(e[2]) for e in train_ex)
    log(f"train: {len(train_ex)} answers, {ntok} answer tokens; held out: {len(val_ex)} answers")

    torch.manual_seed(args.seed)
    cfg = draft_config(args, target_tokens(Path(args.gguf)))
    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in cfg.items() if k != "architectures"}))
    with torch.no_grad():
        emb = pca_embedding(target_embedding(Path(args.gguf)), args.hidden)
        model.model.embed_tokens.weight.copy_(torch.from_numpy(emb))
        # The residual stream starts as the input embedding, so a unit final norm makes the tied
        # head predict the input token again, confidently; start near uniform instead.
        model.model.norm.weight.fill_(0.1)
    nparams = sum(p.numel() for p in model.parameters())
    log(f"draft: {args.layers} layers, hidden {args.hidden}, {nparams / 1e6:.2f}M parameters")

    emb_params = [model.model.embed_tokens.weight]
    other = [p for n, p in model.named_parameters() if "embed_tokens" not in n]
    decay = [p for p in other if p.ndim == 2]
    no_decay = [p for p in other if p.ndim < 2]
    opt = torch.optim.AdamW([
        {"params": emb_params, "lr": args.lr / 3, "weight_decay": 0.0},
        {"params": decay, "lr": args.lr, "weight_decay": 0.01},
        {"params": no_decay, "lr": args.lr, "weight_decay": 0.0},
    ], betas=(0.9, 0.98))
    base = [g["lr"] for g in opt.param_groups]
    rng = random.Random(args.seed)
    steps_per_epoch = math.ceil(len(train_ex) / args.batch)
    total = max(1, int(args.epochs * steps_per_epoch))
    warm = max(1, total // 20)
    loss0, agree0 = evaluate(model, val_ex, args.batch)
    log(f"held-out before training: loss {loss0:.3f}, top-1 agreement {agree0:.3f}")
    model.train()
    step, t0, seen, run_loss, run_agree, run_n = 0, time.time(), 0, 0.0, 0, 0
    while step < total:
        for b in make_batches(train_ex, args.batch, rng):
            if step >= total:
                break
            for g, lr in zip(opt.param_groups, base):
                g["lr"] = lr * lr_scale(step, total, warm)
            loss, agree, n = batch_loss(model, b)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            seen += n
            run_loss, run_agree, run_n = run_loss + loss.item() * n, run_agree + agree, run_n + n
            if step % 10 == 0 or step == total:
                el = time.time() - t0
                log(f"step {step}/{total} loss {run_loss / run_n:.3f} top-1 {run_agree / run_n:.3f} "
                    f"{seen / el:.0f} tok/s, eta {el / step * (total - step) / 60:.1f} min")
                run_loss, run_agree, run_n = 0.0, 0, 0
            if step % steps_per_epoch == 0 or step == total:
                vl, va = evaluate(model, val_ex, args.batch)
                log(f"held-out after step {step}: loss {vl:.3f}, top-1 agreement {va:.3f}")
    from mlxspec.files import staged

    with staged(final) as [tmp]:  # whole or absent: a rerun keeps it because it exists
        torch.save({"config": cfg, "state_dict": model.state_dict(), "train_seconds": time.time() - t0,
                    "answers": len(train_ex), "answer_tokens": ntok, "steps": total}, tmp)


# ---------------------------------------------------------------- stage 4: export

def stage_export(args, work: Path, shards: list) -> None:
    """Write the mlx-lm folder: quantized weights, config, the GGUF's tokenizer and chat template."""
    import mlx.core as mx
    import mlx.nn as nn
    import torch
    from mlx_lm.models import llama

    ck = read_work(final_path(args, work, shards), lambda p: torch.load(p, weights_only=False))
    cfg = dict(ck["config"])
    cfg.pop("architectures", None)
    model = llama.Model(llama.ModelArgs.from_dict(cfg))
    weights = [(k, mx.array(v.float().numpy())) for k, v in ck["state_dict"].items()
               if k != "lm_head.weight" and "rotary_emb" not in k]
    model.load_weights(weights, strict=True)
    model.set_dtype(mx.bfloat16)
    if args.bits < 16:
        nn.quantize(model, group_size=64, bits=args.bits)
        cfg["quantization"] = {"group_size": 64, "bits": args.bits}
    final = Path(args.out)
    final.mkdir(parents=True, exist_ok=True)
    # Written whole in a folder beside it first, then moved in file by file (config last): an
    # export cut short leaves the old draft loading, never its config beside no weights.
    out = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    try:
        write_draft(out, model, cfg, args)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    for old in ("model.safetensors.index.json", "chat_template.jinja"):
        (final / old).unlink(missing_ok=True)
    for f in sorted(out.iterdir(), key=lambda f: f.name == "config.json"):
        os.replace(f, final / f.name)
    out.rmdir()
    meta = {k: ck[k] for k in ("train_seconds", "answers", "answer_tokens", "steps")}
    (work / "export.json").write_text(json.dumps(meta, indent=1))
    size = sum(f.stat().st_size for f in final.iterdir() if f.is_file())
    log(f"exported {final}: {size / 1e6:.1f} MB; training took {meta['train_seconds'] / 60:.1f} min")


def write_draft(out: Path, model, cfg: dict, args) -> None:
    """The mlx-lm folder's files in `out`: weights, config, the GGUF's tokenizer and chat template."""
    from mlx_lm.utils import save_config, save_model
    from transformers import AutoTokenizer

    save_model(out, model)
    (out / "model.safetensors.index.json").unlink(missing_ok=True)  # one shard: the index adds nothing
    cfg["architectures"] = ["LlamaForCausalLM"]
    save_config(cfg, out / "config.json")

    gguf = Path(args.gguf)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tok.save_pretrained(out)
    # Keep the chat template in tokenizer_config.json (one file, read by every loader).
    tc_path = out / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc["chat_template"] = tok.chat_template
    tc["model_max_length"] = cfg["max_position_embeddings"]
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"  # a class every transformers version knows
    for key in ("gguf_file", "is_local", "local_files_only", "backend"):
        tc.pop(key, None)
    tc_path.write_text(json.dumps(tc, indent=2, ensure_ascii=False) + "\n")
    (out / "chat_template.jinja").unlink(missing_ok=True)
    specials = {"bos_token": tok.bos_token, "eos_token": tok.eos_token, "unk_token": tok.unk_token,
                "pad_token": tok.pad_token}
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")


# ---------------------------------------------------------------- main

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf", required=True, help="the target's GGUF, whose vocabulary, special tokens, context "
                   "and rope the draft takes (the shipped draft's: SmolLM2-135M-Instruct Q4_1)")
    p.add_argument("--work", required=True, help="work dir for cached stages")
    p.add_argument("--out", metavar="FOLDER", help="the draft model's folder to write (required; "
                   "mlxspec/data/smollm2-draft is the shipped demo draft's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--stop-after", choices=["prompts", "generate", "train", "export"], default="export")
    # data
    p.add_argument("--prompts", type=int, default=4032, help="train prompts (half answered greedily, half at T)")
    p.add_argument("--prompt-file", action="append", default=[], metavar="JSONL", help=PROMPT_FILE_HELP)
    p.add_argument("--held-out", type=int, default=32)
    p.add_argument("--max-new", type=int, default=128, help="answer tokens per prompt at most")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-k", type=int, default=32, help="soft labels kept per answer position")
    p.add_argument("--gen-batch", type=positive_int, default=GEN_BATCH,
                   help="prompts answered together (another size writes its own shards)")
    # model
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=768)
    # training
    p.add_argument("--epochs", type=float, default=6.0)
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--max-len", type=int, default=320, help="prompt + answer tokens per training sequence")
    p.add_argument("--bits", type=int, default=8, choices=[4, 8, 16], help="export precision (16 = bf16)")
    args = p.parse_args(argv)
    if not args.out:  # no default: a trial run must not replace the shipped draft
        p.error("--out is required: the folder to write the draft model to (--out mlxspec/data/smollm2-draft "
                "replaces the shipped demo draft)")
    if args.bits < 16:  # MLX quantizes rows in groups of 64: said now, not after the training
        for flag, width in (("--hidden", args.hidden), ("--intermediate", args.intermediate)):
            if width % 64:
                p.error(f"{flag} {width}: --bits {args.bits} quantizes in groups of 64, so it must be a multiple of "
                        "64 (or give --bits 16)")
    for flag, folder in (("--out", args.out), ("--work", args.work)):
        if why := train_common.unwritable_folder(Path(folder)):
            p.error(f"{flag} {folder}: {why}")
    return args


def main(argv=None):
    args = parse_args(argv)
    work, t0 = train_common.start(args)
    prompts = stage_prompts(args, work)
    prompts.update(logged_prompt_files(args.prompt_file))
    if args.stop_after == "prompts":
        return
    shards = stage_generate(args, work, prompts)
    log(f"generate done ({time.time() - t0:.0f}s so far)")
    if args.stop_after == "generate":
        return
    stage_train(args, work, shards)
    log(f"train done ({time.time() - t0:.0f}s so far)")
    if args.stop_after == "train":
        return
    stage_export(args, work, shards)
    log(f"export done: {args.out} ({time.time() - t0:.0f}s in all)")

