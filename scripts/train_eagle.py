"""Train an EAGLE head (mlxspec/drafters/eagle_head.py, drafted with by eagle.py) for a target by self-distillation (offline).

    python scripts/train_eagle.py --target REF --work WORKDIR --out my-head --prompt-file chats.jsonl
    python scripts/train_eagle.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf --work WORKDIR --seed 0

--target runs every stage in MLX on its default device (a Mac's GPU, an NVIDIA GPU through
MLX's CUDA backend, or the CPU) for any target mlxspec loads: a Hugging Face repo id, an MLX
folder (quantized or not) or a GGUF, of the llama, qwen2/qwen3, mistral, phi3 or gemma 1, 2 and 3
families, granite, cohere or gpt-oss (any whose logits are a linear head of its final hidden
state, or that head soft-capped as Gemma 2's or scaled as Granite's and Cohere's: the head's
laws are capped or scaled the same way). --gguf runs a llama target in PyTorch on the CPU instead, as
the demo head was made (faster than MLX's CPU backend there).

Stages (each cached under --work, so a rerun skips what is finished; a stopped train stage
resumes from its last checkpoint):
  1. prompts    train_draft.py's offline templated prompts (the first --held-out held out), plus
                every --prompt-file's prompts (JSONL, mlx-lm's "prompt" or "messages" format:
                your own chats, or scripts/code_prompts.py's), all trained on
  2. generate   the target's own answers (held-out greedy; train batches alternately greedy and
                at T=0.7), keeping the hidden states the generation computes anyway, float16:
                the final ones (after the final norm: what `backbone.split_model` gives the
                engine) and the outputs of the --feature-layers (`backbone.tapped`);
                --generate-precision bfloat16 runs these passes in bfloat16 (kept apart)
  2b. layers    the --feature-layers' outputs for shards generated without them (one pass over
                their cached answers, about 360 entries/s on 2 threads)
  3. vocab      the draft vocabulary: the --draft-vocab most frequent tokens of the data
                (cached per data size: appended shards give a new one); with --init, the
                head's own, widened by the data's most frequent others to a larger --draft-vocab
  4. train      fc(concat(embed(x[j+1]), f[j])) -> decoder layer -> norm, trained on smooth-L1
                to f[j+1] plus cross-entropy to the target's distribution of x[j+2] (within the
                draft vocabulary) on the entries that predict answer tokens (--loss-on); with
                feature layers (EAGLE-3), a real entry's f[j] is fc_layers(their outputs at j).
                Inputs get noise, and unrolled steps feed the head its own predicted features
                with the attention a drafting step has (EAGLE's robustness to drafting on its
                own output). Checkpoints are named by the data size and settings, so a rerun
                resumes the same run and never reuses a head trained on other data.
                With --init HEAD the run continues an exported head instead (its shape and
                draft vocabulary, which a larger --draft-vocab widens), e.g. the shipped one on
                your own --prompt-file.
                With --context target the head attends to the target's own last-layer keys and
                values (from the tapped input of that layer; GLIDE's idea) instead of keeping
                its own of every real entry (`mlxspec/drafters/context.py`).
  5. export     float16 MLX weights + config.json with the target's identity

With --gguf, PyTorch is used (never by mlxspec at run time); threads are capped at --threads.
The target runs in PyTorch, dequantized by transformers with its weights rounded to bfloat16
(the engine's CPU precision), because MLX's CPU backend is far slower here; see the model card.
With --target, the answers come from mlx-lm's batched generation and the features from one
teacher-forced pass of the engine's own backbone split (scripts/train_eagle_mlx.py, eagle_mlx_data.py); the
objective is the same (scripts/eagle_objective.py, checked against step-by-step drafting).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_draft  # noqa: E402
from draft_prompts import PROMPT_FILE_HELP, chat_ids  # noqa: E402
from train_draft import log  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- stage 2: answers + features

def step_arithmetic(precision: str):
    """The context a PyTorch pass runs in: bfloat16 (--precision for training steps,
    --generate-precision for the target's passes) autocasts its matmuls to bfloat16; the weights
    (and in training their gradients and the optimiser's state) stay float32."""
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bfloat16")


def load_target(gguf: Path):
    """(tokenizer, fp32 torch model with weights rounded to bfloat16, the engine's CPU precision)."""
    import torch

    tok, model = train_draft.load_target(gguf)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return tok, model


def generate_batch(model, prompts_ids, *, max_new: int, temperature: float, gen, eos: int, pad: int,
                   layers=(), progress=None):
    """Batched generation (left padding, KV cache) that keeps the hidden states it computes.

    Returns per row (prompt + answer ids (T,) int32, features (T-1, H) float16, layer features
    (T-1, len(layers) * H) float16 or None): the features of every fed position, after the
    target's final norm, and the outputs of `layers` (`tap_rows`); the last answer token is
    never fed. Finished rows leave the batch (once an eighth of it has finished, so the KV
    cache is not copied at every step): the batch no longer runs at the longest answer's cost.
    `progress(step, finished)` is called every `train_draft.HEARTBEAT` seconds while it runs.
    """
    import torch

    B = len(prompts_ids)
    ids, mask, pos = train_draft.left_padded(prompts_ids, pad)
    L = ids.shape[1]
    cache = train_draft.kv_cache(L + max_new)
    cache_arg = train_draft.cache_kw(model.model, cache)  # looked up once, not at every step

    def run(**kw):
        out = model.model(**cache_arg, use_cache=True, output_hidden_states=bool(layers), **kw)
        return out.last_hidden_state, (tap_rows(out.hidden_states, layers) if layers else None)

    with torch.inference_mode():
        first, first_tap = run(input_ids=ids, attention_mask=mask, position_ids=pos)  # (B, L, H)
        toks = torch.full((B, max_new), pad, dtype=torch.long)
        lens = torch.full((B,), max_new, dtype=torch.long)  # answer tokens per row
        steps = first.new_zeros((B, max_new, first.shape[-1]))  # features of answer tokens
        tapped = first_tap.new_zeros((B, max_new, first_tap.shape[-1])) if layers else None
        rows = torch.arange(B)  # which prompts the batch's rows are
        done = torch.zeros(B, dtype=torch.bool)
        last = first[:, -1]
        beat = time.time()
        for t in range(max_new):
            if progress is not None and time.time() - beat >= train_draft.HEARTBEAT:
                progress(t, int((lens < max_new).sum()))
                beat = time.time()
            logits = model.lm_head(last).float()  # (rows, V)
            if temperature > 0:
                nxt = torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1, generator=gen).squeeze(1)
            else:
                nxt = logits.argmax(-1)
            nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
            toks[rows[~done], t] = nxt[~done]
            ended = ~done & (nxt == eos)
            lens[rows[ended]] = t + 1  # keep <|im_end|>: the head must predict the end too
            done = done | ended
            if bool(done.all()) or t == max_new - 1:  # the last token is never fed
                break
            if int(done.sum()) * 8 >= len(rows):
                keep = torch.nonzero(~done).squeeze(1)
                cache.batch_select_indices(keep)
                rows, mask, pos, nxt, done = rows[keep], mask[keep], pos[keep], nxt[keep], done[keep]
            mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=torch.long)], dim=1)
            pos = pos[:, -1:] + 1
            h, tap = run(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos)
            last = h[:, -1]
            steps[rows, t] = last
            if layers:
                tapped[rows, t] = tap[:, -1]
    out = []
    for i, p in enumerate(prompts_ids):
        n = int(lens[i])
        seq = np.concatenate([np.asarray(p), toks[i, :n].numpy()]).astype(np.int32)
        feats = torch.cat([first[i, L - len(p):], steps[i, : n - 1]]).to(torch.float16).numpy()
        multi = (torch.cat([first_tap[i, L - len(p):], tapped[i, : n - 1]]).to(torch.float16).numpy()
                 if layers else None)
        out.append((seq, feats, multi))
    return out


def feature_layers(spec: str, num_layers: int) -> list:
    """The target layers (0-based) whose outputs the head reads: "final" (none: the final hidden
    state alone, EAGLE-1), "auto" (EAGLE-3's low, middle and high layer), or a comma list."""
    if spec == "final":
        return []
    if spec == "auto":
        return [2, num_layers // 2 - 1, num_layers - 4]
    from mlxspec.backbone import layers_fit

    try:
        layers = [int(x) for x in spec.split(",")]
    except ValueError:
        layers = None
    if not layers_fit(layers, num_layers):
        raise SystemExit(f"--feature-layers {spec}: distinct layer indices in 0..{num_layers - 1}, "
                         f"or 'auto' or 'final'")
    return layers


def tap_rows(hidden_states, layers):
    """transformers' hidden_states (embeddings, then each layer's output) -> the outputs of
    `layers`, each RMS-normalised without a weight (mlxspec.backbone.TAP_EPS), concatenated."""
    import torch

    from mlxspec.backbone import TAP_EPS

    parts = [hidden_states[i + 1].float() for i in layers]
    return torch.cat([x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + TAP_EPS) for x in parts], dim=-1)


def layers_path(shard: Path, layers) -> Path:
    return shard.with_name(shard.stem + "-L" + "-".join(map(str, layers)) + ".npy")


def save_layers(shard: Path, layers, rows: np.ndarray) -> None:
    """Write a shard's layer features atomically: a stopped run never leaves half a file."""
    train_draft.save_array(layers_path(shard, layers), rows)


def stage_layers(args, shards: list, layers) -> None:
    """The layer features of answer shards generated without them: one pass over each shard's
    cached prompt + answer ids (what the generate stage computes alongside, for new shards)."""
    import torch

    todo = [s for s in shards if not layers_path(s, layers).exists()]
    if not todo:
        return
    _, model = load_target(Path(args.gguf))
    t0, done = time.time(), 0
    for n, shard in enumerate(todo):
        ids, lens = train_draft.read_arrays(shard, "ids", "lens")
        out, o = [], 0
        with torch.inference_mode():
            for b in range(0, len(lens), 16):  # right-padded rows: causal, so padding changes nothing before it
                chunk = lens[b:b + 16]
                x = torch.zeros((len(chunk), int(chunk.max())), dtype=torch.long)
                m = torch.zeros_like(x)
                starts = o + np.concatenate([[0], np.cumsum(chunk)[:-1]])
                for i, (st, ln) in enumerate(zip(starts, chunk)):
                    x[i, :ln] = torch.from_numpy(ids[st:st + ln].astype(np.int64))
                    m[i, :ln] = 1
                o += int(chunk.sum())
                with step_arithmetic(args.generate_precision):  # as the shard's own features were computed
                    rows = tap_rows(model.model(input_ids=x, attention_mask=m, output_hidden_states=True).hidden_states,
                                    layers)
                out += [rows[i, :ln].to(torch.float16).numpy() for i, ln in enumerate(chunk)]
        save_layers(shard, layers, np.concatenate(out))
        done += int(lens.sum())
        el = time.time() - t0
        log(f"layers {n + 1}/{len(todo)} {shard.name}: {done} entries in {el:.0f}s ({done / el:.0f}/s)")


def gen_batches(args, prompts: dict) -> list:
    """[(shard name, temperature, [(split, index)])]: the held-out prompts greedily, then the
    train prompts alternately greedy and at T, then each prompt file's, --gen-batch a shard."""
    batches = [("held_out-000", 0.0, [("held_out", i) for i in range(len(prompts["held_out"]))])]
    train = list(range(len(prompts["train"])))
    mark = train_draft.batch_mark(args)  # the held-out shard is one batch whatever the size
    for b in range(0, len(train), args.gen_batch):  # batch b: greedy when b is even, else at T
        temp = 0.0 if (b // args.gen_batch) % 2 == 0 else args.temperature
        rows = train[b:b + args.gen_batch]
        batches.append((f"train-{b // args.gen_batch:03d}{mark}{partial(rows, args)}", temp,
                        [("train", i) for i in rows]))
    for key in sorted(k for k in prompts if k.startswith("file-")):
        for b in range(0, len(prompts[key]), args.gen_batch):
            temp = 0.0 if (b // args.gen_batch) % 2 == 0 else args.temperature
            rows = range(b, min(b + args.gen_batch, len(prompts[key])))
            batches.append((f"{key}-{b // args.gen_batch:03d}{mark}{partial(rows, args)}", temp,
                            [(key, i) for i in rows]))
    return batches


def partial(rows, args) -> str:
    """The suffix of a batch short of --gen-batch prompts (the last one): grown by a later run
    (more --prompts), it holds more prompts and must not pass for the finished shorter one."""
    return "" if len(rows) == args.gen_batch else f"-n{len(rows)}"


# The exported head's window (`--window`): about as long as most sequences the demo recipe trains
# on (a prompt, median 64 tokens, and up to 128 answer tokens). After 3,000 tokens of conversation
# the demo head drafted far better with a window of 256 than with none, and a little better than
# with 512 (model card, "Long conversations").
WINDOW = 256
ANSWER_SETTINGS = ("max_new", "temperature", "seed", "held_out")  # with the target: what the answers depend on


def check_work(work: Path, args, target: str) -> None:
    """Keep a --work folder to one target and one way of answering (`ANSWER_SETTINGS`): its
    shards, vocabulary and runs are named by prompts and training settings only, so another
    target or other answers would silently reuse them. The first run records them
    (work/answers.json); a later run that differs is refused, naming what differs."""
    path = work / "answers.json"
    mine = {"target": target, **{k: getattr(args, k) for k in ANSWER_SETTINGS}}
    if path.exists():
        theirs = train_draft.read_work(path, lambda p: json.loads(p.read_text(encoding="utf-8")))
        differ = [f"{k} {theirs.get(k)!r} there, {v!r} now" for k, v in mine.items() if theirs.get(k) != v]
        if differ:
            raise SystemExit(f"{work} holds answers made otherwise ({'; '.join(differ)}): its shards, vocabulary "
                             f"and heads would be reused as if they were this run's. Give another --work folder, "
                             f"or the settings it was made with")
        return
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(mine, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def llama_gguf(path: Path) -> None:
    """Refuse a --gguf of another architecture than llama's (Llama, Mistral, SmolLM2...): the
    PyTorch trainer starts the head from the target's last block by llama's names and reads plain
    logits. Imports mlxspec: call it after torch (see `start`)."""
    from mlxspec.errors import MlxSpecError
    from mlxspec.loading.gguf_header import read_header

    try:
        arch = read_header(path)[0].get("general.architecture")
    except MlxSpecError as e:
        raise SystemExit(f"--gguf {path}: {e}") from None
    if arch != "llama":
        raise SystemExit(f"--gguf {path}: a {arch!r} GGUF; the PyTorch trainer (--gguf) takes llama GGUFs only, as "
                         f"the demo head was made. Give --target {path} instead: every stage then runs in MLX, for "
                         "any family mlxspec loads")


def target_digest(path: Path) -> str:
    """The target file's SHA-256: it names the target a --work folder keeps to (two GGUFs of the
    same shapes are other targets) and tells the demo's GGUF apart. Imports mlxspec: call it
    after torch (see `start`)."""
    if not path.is_file():
        raise SystemExit(f"--gguf {path}: no such file")
    from mlxspec.loading.demo import file_sha256

    return file_sha256(path)


def save_shard(path: Path, rows, prompts_ids, temp: float, layers=()) -> None:
    """One answer shard, as `load_features` reads it: rows are (prompt + answer ids (T,), features
    (T-1, H) float16, layer features (T-1, len(layers) * H) or None), the last id never fed. The
    layers' file is written first and the shard atomically, so a shard never exists without them."""
    if layers:
        save_layers(path, layers, np.concatenate([r[2] for r in rows]))
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, ids=np.concatenate([np.asarray(r[0][:-1], np.int32) for r in rows]),
             feats=np.concatenate([r[1] for r in rows]), lens=np.array([len(r[0]) - 1 for r in rows], np.int32),
             plens=np.array([len(p) for p in prompts_ids], np.int32), temp=np.float32(temp))
    os.replace(tmp, path)


def answer_marks(args) -> list:
    """What sets these answers apart from the defaults': a --generate-precision other than float32
    (other answers and features), a --gen-batch other than 48 (other prompts sampled at T, other
    padding). Empty for the defaults, so earlier work dirs keep their names."""
    prec = getattr(args, "generate_precision", "float32")
    size = getattr(args, "gen_batch", train_draft.GEN_BATCH)
    return ([] if prec == "float32" else [prec]) + ([] if size == train_draft.GEN_BATCH else [f"batch{size}"])


def data_tag(args) -> str:
    """The suffix naming the answers' vocabulary and the runs trained on them, so that answers
    made otherwise never share them with the defaults' ("" for the defaults)."""
    marks = answer_marks(args)
    return "-gen-" + "-".join(marks) if marks else ""


def gen_dir(args, work: Path) -> Path:
    """The answers' shards: float32's in eagle-gen, bfloat16's in eagle-gen-bfloat16 (another
    --gen-batch's shards sit beside the default's, named apart by `gen_batches`)."""
    prec = getattr(args, "generate_precision", "float32")
    return work / ("eagle-gen" if prec == "float32" else f"eagle-gen-{prec}")


def stage_generate(args, work: Path, prompts: dict, layers=()) -> list:
    """Answer shards: held-out prompts greedily, then train prompts alternately greedy and at T,
    then each prompt file's (shards named by the file's content, so an edited file gets new ones)."""
    import torch

    out_dir = gen_dir(args, work)
    out_dir.mkdir(exist_ok=True)
    batches = gen_batches(args, prompts)
    tok = model = None
    t0, made = time.time(), 0
    paths = []
    for n, (name, temp, jobs) in enumerate(batches):
        path = out_dir / f"{name}.npz"
        paths.append(path)
        if path.exists():
            continue
        if args.finished_only:
            paths.pop()
            continue
        if model is None:
            log("loading the target (dequantizing the GGUF, weights rounded to bfloat16)")
            tok, model = load_target(Path(args.gguf))
        ids = [chat_ids(tok, prompts[sp][i]["prompt"]) for sp, i in jobs]
        gen = torch.Generator().manual_seed(args.seed * 100003 + n)
        eos = tok.eos_token_id
        with step_arithmetic(args.generate_precision):
            say = train_draft.batch_progress(n, len(batches), name)
            rows = generate_batch(model, ids, max_new=args.max_new, temperature=temp, gen=gen, eos=eos,
                                  pad=tok.pad_token_id if tok.pad_token_id is not None else eos, layers=layers,
                                  progress=lambda step, finished: say(f"step {step}/{args.max_new}, "
                                                                      f"{finished}/{len(ids)} answers finished"))
        save_shard(path, rows, ids, temp, layers)
        made += sum(len(r[0]) - len(p) for r, p in zip(rows, ids))
        el = time.time() - t0
        log(f"generate {n + 1}/{len(batches)} {name} (T={temp:g}): {made} answer tokens in {el:.0f}s "
            f"({made / el:.1f} tok/s)")
    return paths


def load_features(shards: list, layers=()):
    """Train and held-out [(ids (L,), features (L, H) float16, prompt length, layer features
    (L, len(layers) * H) float16 or None)]; f[j] belongs to ids[j]."""
    train, held = [], []
    for shard in shards:
        ids, feats, lens, plens = train_draft.read_arrays(shard, "ids", "feats", "lens", "plens")
        multi = train_draft.read_work(layers_path(shard, layers), np.load) if layers else None
        o = 0
        for n, p in zip(lens, plens):
            m = multi[o:o + n] if layers else None
            (held if shard.name.startswith("held_out") else train).append((ids[o:o + n], feats[o:o + n], int(p), m))
            o += n
    return train, held


# ---------------------------------------------------------------- stage 3: vocab

def stage_vocab(args, work: Path, train) -> np.ndarray:
    """The --draft-vocab most frequent tokens of the training answers (ids ascending). Continuing
    an --init head: its own vocabulary, widened to --draft-vocab by the data's most frequent
    tokens it lacks (its weights do not depend on the vocabulary: the logits rows are the
    target's own output rows)."""
    init = getattr(args, "init_head", None)
    base = init["vocab"] if init else np.zeros(0, np.int32)
    if len(base) == args.draft_vocab:
        return base
    tag = f"-w{init['digest']}" if init else ""
    path = work / f"vocab-{args.draft_vocab}-n{len(train)}{tag}{data_tag(args)}.npy"  # more answers, a new vocabulary
    if path.exists():
        return train_draft.read_work(path, np.load)
    counts = np.zeros(args.vocab_size, np.int64)
    for ids, _, p, _ in train:
        np.add.at(counts, ids[p:], 1)
    order = np.argsort(-counts, kind="stable")
    extra = order[~np.isin(order, base)][: args.draft_vocab - len(base)]
    top = np.sort(np.concatenate([base, extra])).astype(np.int32)
    train_draft.save_array(path, top)
    log(f"draft vocabulary: {len(top)} tokens ({len(extra)} added to the --init head's {len(base)})" if init else
        f"draft vocabulary: {len(top)} tokens")
    log(f"they cover {counts[top].sum() / counts.sum():.4f} of answer tokens")
    return top


# ---------------------------------------------------------------- stage 4: train

def rope(x, pos, theta: float):
    """Non-interleaved rotary embedding (mlx-lm's nn.RoPE traditional=False): x (B, h, L, d), pos (L,)."""
    import torch

    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = pos.float()[:, None] * inv[None]  # (L, d/2)
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def make_head(cfg: dict):
    """The head as PyTorch modules named like mlx-lm's llama block (so export is a rename-free copy)."""
    import torch
    from torch import nn

    H, I = cfg["hidden_size"], cfg["intermediate_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(H))

        def forward(self, x):
            return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg["rms_norm_eps"])

    def block():
        blk = nn.Module()
        blk.self_attn = nn.Module()
        for n, (i, o) in {"q_proj": (H, nh * hd), "k_proj": (H, nkv * hd), "v_proj": (H, nkv * hd),
                          "o_proj": (nh * hd, H)}.items():
            setattr(blk.self_attn, n, nn.Linear(i, o, bias=False))
        blk.mlp = nn.Module()
        for n, (i, o) in {"gate_proj": (H, I), "up_proj": (H, I), "down_proj": (I, H)}.items():
            setattr(blk.mlp, n, nn.Linear(i, o, bias=False))
        blk.input_layernorm, blk.post_attention_layernorm = RMSNorm(), RMSNorm()
        return blk

    def qkv(a, x, pos, start):
        B, L, _ = x.shape
        q = a.q_proj(x[:, start:]).view(B, L - start, nh, hd).transpose(1, 2)
        k = a.k_proj(x).view(B, L, nkv, hd).transpose(1, 2)
        v = a.v_proj(x).view(B, L, nkv, hd).transpose(1, 2)
        return rope(q, pos[start:], cfg["rope_theta"]), rope(k, pos, cfg["rope_theta"]), v

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2 * H, H)
            if cfg.get("feature_layers"):  # the tapped layers' outputs -> one feature (EAGLE-3)
                self.fc_layers = nn.Linear(len(cfg["feature_layers"]) * H, H)
            self.layers = nn.ModuleList([block() for _ in range(cfg.get("num_layers", 1))])
            self.norm = RMSNorm()

        def step(self, emb, feat, pos, past=None, mask=None, start=0):
            """One pass over (B, L) entries at positions `pos`; keys/values of `past` passes are
            visible through `mask`. The last layer computes only entries start.. (`mask`'s rows);
            the others lend it their keys and values (eagle_objective.block_pass, in MLX).

            Returns (predicted features (B, L - start, H), this pass's [(k, v) per layer])."""
            x = self.fc(torch.cat([emb, feat], dim=-1))
            kvs = []
            full = torch.ones(len(pos), len(pos), dtype=torch.bool).tril() if start and not past else None
            for i, blk in enumerate(self.layers):
                last = i == len(self.layers) - 1
                q, k, v = qkv(blk.self_attn, blk.input_layernorm(x), pos, start if last else 0)
                kvs.append((k, v))
                ks = torch.cat([p[i][0] for p in past] + [k], dim=2) if past else k
                vs = torch.cat([p[i][1] for p in past] + [v], dim=2) if past else v
                rep = nh // nkv
                o = torch.nn.functional.scaled_dot_product_attention(
                    q, ks.repeat_interleave(rep, 1), vs.repeat_interleave(rep, 1),
                    attn_mask=mask if last or full is None else full)
                B, _, L, _ = o.shape
                x = x[:, -L:] + blk.self_attn.o_proj(o.transpose(1, 2).reshape(B, L, nh * hd))
                m = blk.mlp
                h = blk.post_attention_layernorm(x)
                x = x + m.down_proj(torch.nn.functional.silu(m.gate_proj(h)) * m.up_proj(h))
            return self.norm(x), kvs

    return Head()


def head_config(args, target_cfg) -> dict:
    init = getattr(args, "init_head", None)
    if init:  # the continued head's shape
        return {"feature_layers": list(init["feature_layers"]), "num_layers": init["num_layers"],
                **({"context": "target"} if init.get("context") == "target" else {}), **init["layer"]}
    return {"feature_layers": list(args.layers), "num_layers": args.head_layers,
            **({"context": "target"} if reads_target(args) else {}),
            "hidden_size": target_cfg["hidden_size"], "intermediate_size": args.intermediate,
            "num_attention_heads": target_cfg["num_attention_heads"],
            "num_key_value_heads": target_cfg["num_key_value_heads"],
            "head_dim": target_cfg.get("head_dim") or target_cfg["hidden_size"] // target_cfg["num_attention_heads"],
            "rms_norm_eps": target_cfg["rms_norm_eps"], "rope_theta": target_cfg["rope_theta"],
            "max_position_embeddings": target_cfg["max_position_embeddings"]}


def init_head(ref: str, target_ref, out: Path) -> dict:
    """An exported head to continue training from (--init): its layer shape, feature layers,
    draft vocabulary and weights (float32 numpy, named like make_head's), and its weights'
    digest. mlxspec's own loader checks that it belongs to this target; it must not be the
    folder this run exports to (--out)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from mlxspec.drafters.eagle import load_head
    from mlxspec.loading.model import load_model
    from mlxspec.loading.resolve import resolve_model

    folder = resolve_model(ref, download=False).path
    if folder.resolve() == out.expanduser().resolve():
        raise SystemExit(f"--init and --out are the same folder ({folder}): export would overwrite the head this "
                         "run continues (and a rerun would continue the new one); pass another --out")
    target, _, _ = load_model(str(target_ref), download=False)
    head, ids, cfg = load_head(folder, target)  # wrong target or shapes: IncompatibleModelsError
    if ids is None:
        raise SystemExit(f"--init {ref}: the head drafts over the full vocabulary; training needs a draft "
                         "vocabulary (a head this script exported has one)")
    weights = {k: np.array(v.astype(mx.float32)) for k, v in tree_flatten(head.parameters())}
    digest = hashlib.sha1((folder / "model.safetensors").read_bytes()).hexdigest()[:10]
    # What the exported config says it continued: the reference without a local folder's path
    # (a shared head should not carry it), its weights' digest, and that head's own training.
    about = cfg.get("training")
    name = ref if ref.startswith("builtin:") else folder.name
    lineage = {"head": name, "weights": digest, **({"training": about} if about else {})}
    return {"folder": folder, "lineage": lineage, "layer": cfg["layer"], "feature_layers": list(cfg.get("feature_layers") or []),
            "num_layers": len(head.layers), "context": cfg.get("context", "head"),
            "vocab": np.array(ids).astype(np.int32), "weights": weights, "digest": digest}


def settle_draft_vocab(args) -> None:
    """--draft-vocab's default (4096, or the --init head's own size); an --init head's vocabulary
    can be widened, not narrowed (its tokens stay proposable)."""
    init = getattr(args, "init_head", None)
    own = len(init["vocab"]) if init else 0
    if args.draft_vocab is not None and args.draft_vocab < max(own, 1):
        raise SystemExit(f"--draft-vocab {args.draft_vocab}: " + (
            f"the --init head already drafts over {own} tokens; it can be widened (a number above {own}), "
            "not narrowed" if init else "a draft vocabulary needs at least one token"))
    whole = getattr(args, "vocab_size", None)  # the target's, once known
    if whole and args.draft_vocab is not None and args.draft_vocab > whole:
        raise SystemExit(f"--draft-vocab {args.draft_vocab}: the target has {whole} tokens; give at most {whole} "
                         f"({whole} drafts over all of them)")
    args.draft_vocab = args.draft_vocab or own or min(4096, whole or 4096)


def target_config(gguf: Path) -> dict:
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    out = {k: getattr(c, k) for k in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                      "rms_norm_eps", "max_position_embeddings", "vocab_size", "intermediate_size",
                                      "num_hidden_layers")}
    rope = getattr(c, "rope_parameters", None) or {}  # newer transformers keep rope_theta there
    out["rope_theta"] = float(rope.get("rope_theta") or getattr(c, "rope_theta"))
    return out


def padded_batch(batch, answers_only: bool = True):
    """Right-padded (B, L-1) numpy entries, for either trainer: tokens x[j+1] (int32), input
    features, targets f[j+1] (float32), loss mask (bool).

    The input features are f[j], or with tapped layers their outputs at j (B, L-1, taps * H).
    `answers_only`: the loss (and the agreement figures) cover only the entries that predict
    answer tokens, the ones the engine drafts; prompt entries are still fed, as context."""
    B, L = len(batch), max(len(b[0]) for b in batch) - 1
    H = batch[0][1].shape[1]
    taps = batch[0][3] is not None
    tok = np.zeros((B, L), np.int32)
    feat = np.zeros((B, L, batch[0][3].shape[1] if taps else H), np.float32)
    tgt = np.zeros((B, L, H), np.float32)
    mask = np.zeros((B, L), bool)
    for i, (ids, f, p, m) in enumerate(batch):
        n = len(ids) - 1
        tok[i, :n] = ids[1:]
        feat[i, :n] = (m if taps else f)[:-1]
        tgt[i, :n] = f[1:]
        # Entry j predicts x[j+2]; the answer starts at x[p]. With answers_only off, prompt entries
        # train too (more of the target's feature-to-token mapping, but not the text it drafts).
        mask[i, max(p - 2, 0) if answers_only else 0:n] = True
    return tok, feat, tgt, mask


def first_loss_entry(weights: np.ndarray) -> int:
    """The first column of a (B, L) loss mask where any row has loss (0 for none)."""
    cols = np.flatnonzero(np.asarray(weights).any(0))
    return int(cols[0]) if len(cols) else 0


def window_starts(first: int, steps: int) -> list:
    """The first entry each unrolled step computes when the loss starts at entry `first`.

    Step s must cover its own loss entries, and the later steps read it: step s+1's entry j
    reads step s's prediction at j-1, and step s' sees step t's entry at j-(s'-t). Entries
    before these (a long prompt, fed as context) only lend step 0 their keys and values, so
    their queries, MLP and later steps are never computed: the same loss for less work."""
    return [max(0, first - (steps - 1 - s)) for s in range(steps)]


def step_mask(L: int, s: int, starts: list) -> np.ndarray:
    """(L - starts[s], L + sum(L - starts[t] for t in 1..s)) boolean: which keys the entries
    starts[s].. of step s see, among step 0's L entries and steps 1..s's windows (numpy, for
    either trainer): the real entries up to j-s, then step t's entry at j-(s-t)."""
    vis = [np.tril(np.ones((L, L), dtype=bool), -s)]
    for t in range(1, s + 1):
        vis.append(np.tril(np.roll(np.eye(L, dtype=bool), -(s - t), axis=1))[:, starts[t]:])
    return np.concatenate(vis, axis=1)[starts[s]:]


def reads_target(args) -> bool:
    """Whether this run trains a head that reads the target's context (--context target)."""
    return getattr(args, "context", "head") == "target"


def tapped_layers(args, num_layers: int) -> list:
    """The target layers whose outputs the data stages keep: the head's feature layers, or for a
    head that reads the target's context the last layer's input (its keys and values are the context)."""
    return [num_layers - 2] if reads_target(args) else list(args.layers)


def context_mask(L: int, s: int, starts: list) -> np.ndarray:
    """`step_mask` for a head that reads the target's context (--context target): the columns are
    the target's last-layer keys at positions 0..L-1, then step 0's L entries and steps 1..s's
    windows. Drafting step s+1 of entry j sees the target's keys up to position j-s (what the
    target has run), step 0's entry j-s (the token the target chose, not yet run by it) and step
    t's entry at j-(s-t), the last being this one."""
    vis = [np.tril(np.ones((L, L), dtype=bool), -s)]
    vis += [np.tril(np.roll(np.eye(L, dtype=bool), -(s - t), axis=1))[:, starts[t] if t else 0:]
            for t in range(s + 1)]
    return np.concatenate(vis, axis=1)[starts[s]:]


def split_context(batch):
    """A --context target batch -> ((B, L, H) float32: the tapped input of the target's last layer
    at positions 0..L-1 of each sequence, zero past its end, whose keys and values the head attends
    to; the batch without them, for `padded_batch`: its taps are the context's, not input features)."""
    L = max(len(b[0]) for b in batch) - 1
    out = np.zeros((len(batch), L, batch[0][3].shape[1]), np.float32)
    for i, (ids, _, _, m) in enumerate(batch):
        out[i, : len(ids) - 1] = m[:-1]
    return out, [(ids, f, p, None) for ids, f, p, _ in batch]


def batch_tensors(batch, noise: float, gen, answers_only: bool = True):
    """`padded_batch` as torch tensors (tokens int64), the input features noised."""
    import torch

    tok, feat, tgt, mask = (torch.from_numpy(a) for a in padded_batch(batch, answers_only))
    tok = tok.long()
    if noise:
        scale = feat.pow(2).mean().sqrt()
        feat = feat + (torch.rand(feat.shape, generator=gen) - 0.5) * 2 * noise * scale
    return tok, feat, tgt, mask


def train_steps(sequences: int, args) -> tuple:
    """(optimiser steps, warm-up steps) of a run over `sequences` answers, for either trainer:
    --epochs passes of --batch sequences, 3 % of them warm-up (train_draft.lr_scale)."""
    total = max(1, int(args.epochs * math.ceil(sequences / args.batch)))
    return total, max(1, total // 30)


class TimeBudget:
    """--train-minutes: the train stage's steps cut to what fits in its wall-clock budget.

    The run's schedule (warm-up, then cosine) is laid out over its --epochs; PROBE[1] steps are
    timed after the first PROBE[0] (which compile), and if the rest would not fit, the run's
    total becomes the steps that do, at that pace with 5 % to spare, so the cosine still ends.
    Every REFIT steps after that the fit is made again at the pace since the probe (held-out
    checks and a machine that slowed included; on an H200 the probe's 40 ms a step became 47),
    never past the --epochs. Past the budget anyway, the run ends at the next step. Either way it
    saves and exports a head; the log says where it was cut. `clock` is time.time."""

    PROBE, REFIT = (10, 50), 500

    def __init__(self, minutes: float, step: int, clock=time.time):
        self.minutes, self.clock = minutes, clock
        self.end, self.start, self.mark, self.cap = clock() + minutes * 60, step, None, None

    def total(self, step: int, total: int, warm: int) -> int:
        """The run's total after `step` (of `total`, `warm` of them warm-up) has finished."""
        now = self.clock()
        if now >= self.end:
            if step < total:
                log(f"--train-minutes {self.minutes:g}: the budget ran out; the run ends at step {step} of {total}")
            return min(step, total)
        if self.mark is None:
            if step == self.start + self.PROBE[0]:
                self.mark = (step, now)
            return total
        since = step - self.mark[0]
        if since < self.PROBE[1] or (self.cap is not None and since % self.REFIT):
            return total
        self.cap = total if self.cap is None else self.cap  # the --epochs' total: a refit never goes past it
        pace = (now - self.mark[1]) / since
        fit = min(max(step + int(0.95 * (self.end - now) / max(pace, 1e-9)), warm + 1), self.cap)
        if fit != total:
            log(f"--train-minutes {self.minutes:g}: at {pace * 1000:.1f} ms a step, {fit} of the run's {self.cap} "
                "steps fit; its schedule now ends there")
        return fit


def epoch_batches(train, batch: int, rng: random.Random) -> list:
    """One epoch's batches of indices into `train`: shuffled, sorted by length within windows of
    16 batches (little padding, still shuffled), the batches shuffled again."""
    order = list(range(len(train)))
    rng.shuffle(order)
    win, out = batch * 16, []
    for w in range(0, len(order), win):
        chunk = sorted(order[w:w + win], key=lambda i: len(train[i][0]))
        out += [chunk[b:b + batch] for b in range(0, len(chunk), batch)]
    rng.shuffle(out)
    return out


def losses(head, emb, w_draft, batch, args, gen, *, train: bool, context=None):
    """(loss, per-step top-1 agreement with the target's argmax, positions) for one batch.

    `context` (--context target): the target's last-layer keys and values of a (B, L, H) batch of
    that layer's inputs (`context_kv`); the head attends to them instead of its own real entries."""
    import torch
    import torch.nn.functional as F

    if context is not None:
        ctx, batch = split_context(batch)
    tok, feat, tgt, mask = batch_tensors(batch, args.noise if train else 0.0, gen, args.loss_on == "answers")
    if hasattr(head, "fc_layers"):  # real entries read the tapped layers; drafted ones the head's own output
        feat = head.fc_layers(feat)
    L = tok.shape[1]
    e = emb[tok]  # (B, L, H)
    starts = window_starts(first_loss_entry(mask.numpy()), args.unroll)
    with torch.no_grad():
        p_t = torch.softmax(tgt[mask] @ w_draft.T, dim=-1)  # the target's next-token law, draft vocabulary
        top_t = p_t.argmax(-1)
    total, agree = 0.0, []
    past, pred, shift = [], None, 0
    if context is not None:
        past.append([context(ctx)])
        shift = 1  # entry j is token x[j+1]'s, at its position; the target's keys sit at their tokens'
    for s, w in enumerate(starts):  # step s computes entries w.. (window_starts)
        if s == 0:  # every entry feeds its keys and values; the window's entries are computed
            e_in, f_in, pos, start = e, feat, torch.arange(L), w
        elif w == 0:  # entry j now reads the feature the previous step predicted for position j
            e_in, f_in, pos, start = e, torch.cat([feat[:, :1], pred[:, :-1]], dim=1).detach(), torch.arange(L), 0
        else:
            prev = starts[s - 1]
            e_in, f_in, pos, start = e[:, w:], pred[:, w - 1 - prev: L - 1 - prev].detach(), torch.arange(w, L), 0
        # As drafting step s+1 sees them: real entries up to j-s, then the entry that step t
        # (1..s) made at j-(s-t), the last being this one.
        m = torch.from_numpy(context_mask(L, s, starts) if context is not None else step_mask(L, s, starts))
        pred, kv = head.step(e_in, f_in, pos + shift, past, m, start)
        past.append(kv)
        sel = mask[:, w:]
        logq = F.log_softmax(pred[sel] @ w_draft.T, dim=-1)
        reg = F.smooth_l1_loss(pred[sel], tgt[mask])
        ce = -(p_t * logq).sum(-1).mean()
        total = total + (reg + args.ce_weight * ce) * (args.unroll_weight ** s)
        agree.append((logq.argmax(-1) == top_t).float().sum().item())
    return total, agree, int(mask.sum())


def run_tag(args, train) -> str:
    """Names a training run's files by its data and settings: resuming continues the same run,
    and new shards or other settings start a new one instead of reusing a stale head."""
    keys = ("draft_vocab", "intermediate", "epochs", "batch", "lr", "noise", "unroll", "unroll_weight",
            "ce_weight", "loss_on", "seed")
    init = getattr(args, "init_head", None)  # continuing another head is another run
    settings = json.dumps([len(train)] + [getattr(args, k) for k in keys]
                          + ([args.layers] if args.layers else []) + ([init["digest"]] if init else [])
                          + ([f"L{args.head_layers}"] if args.head_layers != 1 else [])
                          + (["context-target"] if reads_target(args) else [])
                          + ([args.precision] if getattr(args, "precision", "float32") != "float32" else [])
                          # a run cut to a budget is not the whole run: a later one without it trains all --epochs
                          + ([f"minutes {args.train_minutes:g}"] if getattr(args, "train_minutes", None) else []))
    return f"n{len(train)}{data_tag(args)}-" + hashlib.sha1(settings.encode()).hexdigest()[:8]


def wider_mlp(theirs: dict, mine: dict) -> bool:
    """Whether block weights `mine` are `theirs` with only the MLP widened (same names, attention,
    norms and hidden size; values anything with a `.shape`)."""
    if set(theirs) != set(mine):
        return False
    for k, v in mine.items():
        t = tuple(theirs[k].shape)
        if k.endswith(("gate_proj.weight", "up_proj.weight")):
            ok = v.shape[1] == t[1] and v.shape[0] >= t[0]
        elif k.endswith("down_proj.weight"):
            ok = v.shape[0] == t[0] and v.shape[1] >= t[1]
        else:
            ok = tuple(v.shape) == t
        if not ok:
            return False
    return True


def widened(theirs: dict, mine: dict) -> dict:
    """Float32 numpy block weights: `theirs` in the first MLP units, `mine` (random) for the gate and
    up rows of the extra units, whose down-projection columns are zero. The block computes exactly
    what `theirs` does, and gradients still reach the new units (--intermediate above the target's)."""
    out = {k: np.array(v, dtype=np.float32) for k, v in mine.items()}
    for k, t in theirs.items():
        t = np.array(t, dtype=np.float32)
        if k.endswith(("gate_proj.weight", "up_proj.weight")):
            out[k][: t.shape[0]] = t
        elif k.endswith("down_proj.weight"):
            out[k][:] = 0.0
            out[k][:, : t.shape[1]] = t
        else:
            out[k] = t
    return out


def init_from_target(head, gguf: Path) -> None:
    """Start the head from the target's last layers (as many as it has) and final norm: the
    same feature space."""
    import torch

    with torch.no_grad():
        _, target = load_target(gguf)
        for blk, theirs in zip(head.layers, target.model.layers[-len(head.layers):]):
            last = {k: v for k, v in theirs.state_dict().items() if "rotary" not in k}
            mine = blk.state_dict()
            if set(last) == set(mine) and all(last[k].shape == mine[k].shape for k in mine):
                blk.load_state_dict(last)
            elif wider_mlp(last, mine):  # --intermediate above the target's: start as its layer
                log("the head's MLP is wider than the target's: its last layer, extra units silent at first")
                w = widened({k: v.float().numpy() for k, v in last.items()}, {k: v.numpy() for k, v in mine.items()})
                blk.load_state_dict({k: torch.from_numpy(v) for k, v in w.items()})
            else:  # another family's block (biases, other widths): start from random weights
                log("the target's last layers do not fit the head's blocks; initialising them randomly")
                break
        head.norm.weight.copy_(target.model.norm.weight)
        del target


def context_kv(gguf: Path, cfg: dict):
    """The target's last layer's keys and values, as its cache holds them, from that layer's
    (tapped) inputs: (B, L, H) numpy -> ((B, kv heads, L, d), (B, kv heads, L, d)) torch, RoPE'd
    at positions 0..L-1. Its norm and projections are the target's, frozen (the engine reads the
    target's own cache)."""
    _, target = load_target(gguf)
    attn = target.model.layers[-1].self_attn
    return context_kv_of(target.model.layers[-1].input_layernorm, attn.k_proj, attn.v_proj, cfg)


def context_kv_of(norm, k_proj, v_proj, cfg: dict):
    """`context_kv` from the target's last layer's input norm and key and value projections (torch modules)."""
    import torch

    nkv, hd = cfg["num_key_value_heads"], cfg["head_dim"]

    def kv(rows: np.ndarray):
        with torch.no_grad():
            x = norm(torch.from_numpy(rows))  # the taps are RMS-normalised already; the norm's scale is the same
            B, L, _ = x.shape
            k = rope(k_proj(x).view(B, L, nkv, hd).transpose(1, 2), torch.arange(L), cfg["rope_theta"])
            return k, v_proj(x).view(B, L, nkv, hd).transpose(1, 2)

    return kv


def stage_train(args, work: Path, train, held, vocab) -> Path:
    import torch

    tag = run_tag(args, train)
    final = work / f"head_final-{tag}.pt"
    if final.exists():
        return final
    ckpt = work / f"head_ckpt-{tag}.pt"
    gguf = Path(args.gguf)
    tcfg = target_config(gguf)
    cfg = head_config(args, tcfg)
    torch.manual_seed(args.seed)
    head = make_head(cfg)
    emb = torch.from_numpy(train_draft.target_embedding(gguf)).to(torch.bfloat16).float()  # the engine's precision
    out = torch.from_numpy(train_draft.target_embedding(gguf, output=True)).to(torch.bfloat16).float()
    w_draft = out[torch.from_numpy(vocab.astype(np.int64))]  # (N, H): the target's output rows (lm_head or tied)
    del out
    init = getattr(args, "init_head", None)
    if init:  # continue the --init head (its shape and vocabulary are this run's)
        with torch.no_grad():
            head.load_state_dict({k: torch.from_numpy(v) for k, v in init["weights"].items()}, strict=True)
        log(f"continuing {init['folder']} (weights {init['digest']})")
    else:
        init_from_target(head, gguf)
    nparams = sum(p.numel() for p in head.parameters())
    ntok = sum(len(t[0]) - 1 for t in train)
    log(f"head: {nparams / 1e6:.2f}M parameters; {len(train)} sequences, {ntok} entries; "
        f"held out {len(held)}")
    context = context_kv(gguf, cfg) if cfg.get("context") == "target" else None
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    rng = random.Random(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    total, warm = train_steps(len(train), args)
    step, elapsed, history = 0, 0.0, []
    epoch_state, in_epoch = rng.getstate(), 0  # the current epoch's shuffle replays from this on resume
    if ckpt.exists():
        ck = train_draft.read_work(ckpt, lambda p: torch.load(p, weights_only=False))
        head.load_state_dict(ck["head"])
        opt.load_state_dict(ck["opt"])
        step, elapsed, history = ck["step"], ck["elapsed"], ck["history"]
        epoch_state, in_epoch = ck["epoch_state"], ck["in_epoch"]
        gen.set_state(ck["gen"])
        total = ck.get("total", total)  # a run cut by --train-minutes resumes to its cut
        log(f"resumed at step {step}/{total}")
    budget = TimeBudget(args.train_minutes, step) if args.train_minutes else None
    t0 = time.time() - elapsed
    run = [0.0, [0.0] * args.unroll, 0]
    while step < total:
        rng.setstate(epoch_state)
        for b in epoch_batches(train, args.batch, rng)[in_epoch:]:
            if step >= total:
                break
            for g in opt.param_groups:
                g["lr"] = args.lr * train_draft.lr_scale(step, total, warm)
            with step_arithmetic(args.precision):
                loss, agree, n = losses(head, emb, w_draft, [train[i] for i in b], args, gen, train=True,
                                        context=context)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
            opt.step()
            step += 1
            in_epoch += 1
            total = budget.total(step, total, warm) if budget else total
            run[0] += loss.item() * n
            run[1] = [a + x for a, x in zip(run[1], agree)]
            run[2] += n
            if step % 20 == 0 or step == total:
                el = time.time() - t0
                tops = " ".join(f"{a / run[2]:.3f}" for a in run[1])
                log(f"step {step}/{total} loss {run[0] / run[2]:.4f} top-1 per step {tops} "
                    f"eta {el / step * (total - step) / 60:.1f} min")
                run = [0.0, [0.0] * args.unroll, 0]
            if step % args.ckpt_every == 0 or step == total:
                vl, va = evaluate(head, emb, w_draft, held, args, context)
                history.append({"step": step, "held_loss": vl, "held_top1": va})
                log(f"held-out after step {step}: loss {vl:.4f}, top-1 per step {' '.join(f'{a:.3f}' for a in va)}")
                torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "step": step,
                            "elapsed": time.time() - t0, "history": history, "epoch_state": epoch_state,
                            "in_epoch": in_epoch, "gen": gen.get_state(), "total": total}, ckpt.with_suffix(".tmp"))
                os.replace(ckpt.with_suffix(".tmp"), ckpt)
        epoch_state, in_epoch = rng.getstate(), 0
    torch.save({"cfg": cfg, "head": head.state_dict(), "train_seconds": time.time() - t0, "steps": total,
                "sequences": len(train), "entries": ntok, "history": history,
                "init": init["lineage"] if init else None, "precision": args.precision}, final)
    return final


def evaluate(head, emb, w_draft, held, args, context=None):
    import torch

    head.eval()
    tot, agree, n = 0.0, [0.0] * args.unroll, 0
    with torch.no_grad():
        for b in range(0, len(held), args.batch):
            loss, a, k = losses(head, emb, w_draft, held[b:b + args.batch], args, None, train=False, context=context)
            tot += loss.item() * k
            agree = [x + y for x, y in zip(agree, a)]
            n += k
    head.train()
    return tot / max(n, 1), [a / max(n, 1) for a in agree]


# ---------------------------------------------------------------- stage 5: export

def window_config(args) -> dict:
    """The exported config's `window` (none for a head that reads the target's cache, or with 0)."""
    return {"window": args.window} if args.window and args.context != "target" else {}


def stage_export(args, final: Path, vocab) -> None:
    import mlx.core as mx
    import torch
    from mlx_lm.models.llama import ModelArgs

    from mlxspec.drafters.eagle import EagleHead, load_head, save_head
    from mlxspec.loading.model import load_model

    ck = train_draft.read_work(final, lambda p: torch.load(p, weights_only=False))
    target, _, _ = load_model(str(args.gguf), download=False)  # mlxspec's own loading path
    cfg = dict(ck["cfg"])
    layers = cfg.pop("feature_layers", [])
    depth = cfg.pop("num_layers", 1)
    context = cfg.pop("context", "head")
    head = EagleHead(ModelArgs(model_type="llama", num_hidden_layers=depth, vocab_size=len(vocab), **cfg),
                     taps=len(layers), context=context)
    head.load_weights([(k, mx.array(v.float().numpy())) for k, v in ck["head"].items()], strict=True)
    extra = {**window_config(args), "training": {"script": "scripts/train_eagle.py", "seed": args.seed,
                          "train_minutes": round(ck["train_seconds"] / 60, 1), "steps": ck["steps"],
                          "sequences": ck["sequences"], "entries": ck["entries"],
                          "held_out": ck["history"][-1] if ck["history"] else None,
                          **({"init": ck["init"]} if ck.get("init") else {}),
                          # float32 (the default) is not written: earlier heads' configs stay as they were
                          **({"precision": ck["precision"]} if ck.get("precision", "float32") != "float32" else {})}}
    out = Path(args.out)
    save_head(out, head, mx.array(vocab), target, name=Path(args.gguf).stem, extra=extra, feature_layers=layers)
    load_head(out, target)  # the shipped folder must load against the target it was made for
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    log(f"exported {out}: {size / 1e6:.1f} MB; training took {ck['train_seconds'] / 60:.1f} min")


# ---------------------------------------------------------------- main

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--gguf", help="the target's GGUF, run by PyTorch on the CPU (how the demo head was made)")
    which.add_argument("--target", metavar="REF",
                       help="any target mlxspec loads (Hugging Face repo id, MLX folder, quantized or not, or GGUF), "
                            "run by MLX on its default device: a Mac's GPU, an NVIDIA GPU or the CPU; no PyTorch")
    p.add_argument("--adapter-path", metavar="PATH",
                   help="with --target: a fine-tuned adapter folder written by mlx_lm.lora, applied to the target "
                        "as mlxspec --adapter-path applies it; the head learns the adapted target's answers and "
                        "features (draft with the head under the same adapter: mlxspec --adapter-path, or a pair naming "
                        "both; default: none)")
    p.add_argument("--work", required=True, help="work dir for cached stages (shared with train_draft.py)")
    p.add_argument("--out", help="the head folder to write (default with --gguf: the shipped demo head's; "
                                 "required with --target)")
    p.add_argument("--seed", type=train_draft.non_negative_int, default=0,
                   help="seeds the templated prompts' choice, the sampled answers and training (default 0)")
    p.add_argument("--threads", type=train_draft.positive_int, default=2,
                   help="PyTorch threads (--gguf only; default 2: the performance cores)")
    p.add_argument("--stop-after", choices=["generate", "layers", "train", "export"], default="export",
                   help="end after this stage (default: export, the whole recipe); a later run resumes from it")
    # data (train_draft.py's generate stage)
    p.add_argument("--prompts", type=train_draft.non_negative_int, default=4032,
                   help="templated train prompts (half answered greedily, half at T); 0 for none")
    p.add_argument("--prompt-file", action="append", default=[], metavar="JSONL", help=PROMPT_FILE_HELP)
    p.add_argument("--held-out", type=train_draft.positive_int, default=32,
                   help="templated prompts kept out of training, answered greedily, for the agreement printed "
                        "each checkpoint (default 32)")
    p.add_argument("--max-new", type=train_draft.positive_int, default=128,
                   help="most tokens of each answer (default 128)")
    p.add_argument("--temperature", type=train_draft.non_negative_float, default=0.7,
                   help="of the answers not made greedily (every other batch; default 0.7; 0: all greedy)")
    p.add_argument("--gen-batch", type=train_draft.positive_int, default=train_draft.GEN_BATCH,
                   help="prompts answered together. On 2 cores in bfloat16, 192 answered short prompts 1.5x as "
                   "fast as 48 and long ones (code) 0.8x as fast. Another size writes its own shards, vocabulary "
                   "and runs (its batches hold other prompts)")
    p.add_argument("--finished-only", action="store_true",
                   help="train on the shards a (maybe still running) generate stage has finished; generate nothing")
    # head
    p.add_argument("--draft-vocab", type=train_draft.positive_int,
                   help="tokens the head may propose: the data's most frequent (default 4096; with --init, the "
                   "head's own, and a larger number widens it by the data's most frequent tokens it lacks)")
    p.add_argument("--intermediate", type=train_draft.positive_int, help="the head's MLP width (default: the target's). A wider one still starts as "
                   "the target's last layer, its extra units silent. The shipped demo head is 2x (3072): after 8 "
                   "epochs and 4 more with --init at --lr 3e-4 it gained 0.020 per token over the 1x head and "
                   "ran x1.05 as fast on a 2-core CPU, at 1.5x the head step and training time (model card)")
    p.add_argument("--head-layers", type=train_draft.positive_int, default=1,
                   help="decoder layers in the head (EAGLE uses 1; each costs about one target layer per draft step)")
    p.add_argument("--context", choices=["head", "target"], default="head",
                   help="what the head's attention reads for the positions the target has run: its own keys and "
                        "values of them (EAGLE; the shipped demo head), or the target's own last-layer keys and "
                        "values from the target's cache (as GLIDE does; Du et al. 2024): then the head keeps only "
                        "the current round's entries, and training taps the input of the target's last layer. For the "
                        "demo target it learnt faster at first and ended 0.011 per token behind (model card)")
    p.add_argument("--window", type=train_draft.non_negative_int, default=WINDOW,
                   help="entries of its own cache the exported head attends to (its latest, plus the first 4), "
                        "written to its config as `window`; 0: all of them. A head learns on sequences of a few "
                        "hundred tokens and drafts worse the further back it attends: after 3,000 tokens of "
                        "conversation the demo head's per-token acceptance was 0.27 attending to all and 0.60 with "
                        f"a window of 256 (model card, \"Long conversations\"). Default {WINDOW}; "
                        "with --context target it is not used (that head keeps no cache of its own)")
    p.add_argument("--feature-layers", default="final",
                   help="what the head reads for a committed position: 'final' (the target's final hidden state, "
                        "EAGLE-1; the shipped demo head), 'auto' (the outputs of EAGLE-3's low, middle and high "
                        "layer: 2, n/2-1, n-4 of n), or a comma list of layers")
    # training
    p.add_argument("--epochs", type=train_draft.positive_float, default=3.5,
                   help="passes over the answers; the demo head before the wider one used 8 on 5,323 prompts, 86 "
                        "minutes from scratch on 2 CPU cores (bench-suite per-token acceptance 0.40 after 4, 0.42 after "
                        "8; 4 more with --init at --lr 3e-4 gave 0.43 but no speed); the shipped, twice as wide head "
                        "8 and then 4 more that way")
    p.add_argument("--train-minutes", type=train_draft.positive_float, metavar="M",
                   help="a wall-clock budget for the train stage: after timing its first steps, a run that would "
                        "take longer is cut to the steps that fit, its learning-rate schedule ending there (the log "
                        "says where); for a GPU lent by the hour. A cut run is a run of its own: the same command without the "
                        "budget trains all --epochs rather than reusing it. Default: no budget, all --epochs")
    p.add_argument("--batch", type=train_draft.positive_int, default=8, help="sequences per step (default 8)")
    p.add_argument("--lr", type=train_draft.positive_float, default=1e-3,
                   help="AdamW's peak learning rate, after a 3 %% warm-up, then cosine (default 1e-3)")
    p.add_argument("--noise", type=train_draft.non_negative_float, default=0.1,
                   help="uniform input-feature noise, fraction of feature RMS (default 0.1)")
    p.add_argument("--unroll", type=train_draft.positive_int, default=2,
                   help="drafting steps simulated per entry (1 = teacher forcing only; default 2)")
    p.add_argument("--unroll-weight", type=train_draft.non_negative_float, default=0.8,
                   help="loss weight of each further unrolled step, as a power (default 0.8)")
    p.add_argument("--ce-weight", type=train_draft.non_negative_float, default=0.3,
                   help="weight of the token loss beside the feature regression (default 0.3)")
    p.add_argument("--loss-on", choices=["answers", "all"], default="answers",
                   help="entries the loss covers: those predicting answer tokens (what the engine drafts), or all")
    p.add_argument("--precision", choices=["float32", "bfloat16"], default="float32",
                   help="arithmetic of the training steps (--gguf only): bfloat16 autocasts them, the weights and "
                        "the optimiser stay float32; about 1.5x faster on CPUs with bfloat16 dot products "
                        "(AVX512-BF16), slower on those without. Held-out checks run in float32")
    p.add_argument("--generate-precision", choices=["float32", "bfloat16"], default="float32",
                   help="arithmetic of the target's passes that write the answers and their features (--gguf only): "
                        "bfloat16 autocasts them, 4.1x as fast on a 2-core CPU with bfloat16 dot products. Its "
                        "features differ from float32's by about 1 %% RMS (the training noise is 5.8 %%) and about "
                        "half its greedy answers part from float32's at a near tie; its answers are kept apart "
                        "(eagle-gen-bfloat16 in --work) and never mixed with float32's")
    p.add_argument("--ckpt-every", type=train_draft.positive_int, default=100,
                   help="steps between checkpoints (and held-out agreement lines; default 100): a rerun resumes "
                        "from the last one")
    p.add_argument("--init", metavar="HEAD",
                   help="continue training this exported head (a folder or builtin:NAME, e.g. builtin:smollm2-eagle) "
                        "instead of starting from the target's last layer: its shape, feature layers and draft "
                        "vocabulary replace --intermediate and --feature-layers (a larger --draft-vocab widens its "
                        "vocabulary). Adapting the shipped head to your --prompt-file takes minutes; use a lower "
                        "--lr (e.g. 3e-4)")
    args = p.parse_args(argv)
    if 0 < args.window < 5:
        p.error(f"--window {args.window}: at least 5 (the head's first 4 entries are always kept), or 0 for all")
    if args.head_layers < 1:
        p.error(f"--head-layers {args.head_layers}: a head needs at least one decoder layer")
    if args.context == "target" and (args.head_layers != 1 or args.feature_layers != "final"):
        p.error("--context target: the head is one decoder layer that reads the target's final hidden state "
                "(--head-layers 1, --feature-layers final); it attends to the target's last layer's keys and values")
    for flag, value in (("--precision", args.precision), ("--generate-precision", args.generate_precision)):
        if args.target and value != "float32":
            p.error(f"{flag} {value}: only the PyTorch trainer (--gguf) autocasts; --target runs in MLX, "
                    "in the target's own precision")
    if args.adapter_path and not args.target:
        p.error("--adapter-path needs --target: the PyTorch trainer (--gguf) runs the demo target as it is")
    if args.target and not args.out:
        p.error("--target needs --out: the folder to write its head to (the default is the demo head's)")
    if args.out and (why := unwritable_out(Path(args.out))):
        p.error(f"--out {args.out}: {why}")
    return args


SHIPPED = ROOT / "mlxspec/data/smollm2-eagle"


def default_out(args, digest: str) -> str:
    """--out, or for the demo target's GGUF (`digest`: its SHA-256, `target_digest`) the shipped
    head, which no other target may replace."""
    from mlxspec.loading.demo import MODELS

    if args.out:
        return args.out
    if digest not in {m.gguf_sha256 for m in MODELS.values()}:
        raise SystemExit(f"--out defaults to the shipped demo head ({SHIPPED}), which only the demo target may "
                         f"replace; give --out FOLDER for {args.gguf}")
    return str(SHIPPED)


def unwritable_out(out: Path) -> str:
    """Why a head may not be written to `out` ("" when it may): a file, or a folder holding
    something other than an EAGLE head (a model, say), would be overwritten."""
    if out.is_file():
        return "is a file; give a folder for the head"
    config = out / "config.json"
    if out.is_dir() and any(out.iterdir()):
        try:
            kind = json.loads(config.read_text(encoding="utf-8")).get("model_type")
        except (OSError, ValueError, AttributeError):
            kind = None
        if kind != "eagle_head":
            return ("holds files but no EAGLE head (config.json with model_type \"eagle_head\"); writing the head "
                    "there would overwrite them: give a new or empty folder, or an earlier head's")
    return ""


def main(argv=None):
    args = parse_args(argv)
    if args.target:
        import train_eagle_mlx

        return train_eagle_mlx.main(args)
    work, t0 = train_draft.start(args)
    digest = target_digest(Path(args.gguf))  # the whole file read once
    llama_gguf(Path(args.gguf))
    args.out = default_out(args, digest)
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


if __name__ == "__main__":
    train_draft.run_main(main)
