"""scripts/train_eagle.py's data (--gguf: the target run by PyTorch on the CPU): the target's own
answers to the prompts, with the hidden states its passes computed, cached in shards under
--work (stage 2), the tapped layers' outputs of shards made without them (2b), and the draft
vocabulary, the data's most frequent tokens (stage 3).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from . import draft_answers
from .eagle_args import ANSWER_SETTINGS
from . import torch_target
from . import train_common
from .draft_prompts import chat_ids
from .train_common import log


def step_arithmetic(precision: str):
    """The context a PyTorch pass runs in: bfloat16 (--precision for training steps,
    --generate-precision for the target's passes) autocasts its matmuls to bfloat16; the weights
    (and in training their gradients and the optimiser's state) stay float32."""
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bfloat16")


def load_target(gguf: Path):
    """(tokenizer, fp32 torch model with weights rounded to bfloat16, the engine's CPU precision)."""
    import torch

    tok, model = torch_target.load_target(gguf)
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
    `progress(step, finished)` is called every `train_common.HEARTBEAT` seconds while it runs.
    """
    import torch

    B = len(prompts_ids)
    ids, mask, pos = torch_target.left_padded(prompts_ids, pad)
    L = ids.shape[1]
    cache = torch_target.kv_cache(L + max_new)
    cache_arg = torch_target.cache_kw(model.model, cache)  # looked up once, not at every step

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
            if progress is not None and time.time() - beat >= train_common.HEARTBEAT:
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
    train_common.save_array(layers_path(shard, layers), rows)


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
        ids, lens = train_common.read_arrays(shard, "ids", "lens")
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
    mark = draft_answers.batch_mark(args)  # the held-out shard is one batch whatever the size
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




def check_work(work: Path, args, target: str, named: str = None) -> None:
    """Keep a --work folder to one target and one way of answering (`ANSWER_SETTINGS`): its
    shards, vocabulary and runs are named by prompts and training settings only, so another
    target or other answers would silently reuse them. The first run records them
    (work/answers.json); a later run that differs is refused, naming what differs. `target`:
    the target's identity (a fingerprint); `named`: how it was given, recorded and said beside
    it, never compared (one model may be named several ways)."""
    path = work / "answers.json"
    mine = {"target": target, **{k: getattr(args, k) for k in ANSWER_SETTINGS}}
    if path.exists():
        theirs = train_common.read_work(path, lambda p: json.loads(p.read_text(encoding="utf-8")))
        differ = [f"{k} {theirs.get(k)!r} there, {v!r} now" for k, v in mine.items() if theirs.get(k) != v]
        if theirs.get("target") != target and named:
            differ[0] = (f"target {theirs.get('target_named') or theirs.get('target')!r} there, {named!r} now "
                         f"(another model: {theirs.get('target')} vs {target})")
        if differ:
            raise SystemExit(f"{work} holds answers made otherwise ({'; '.join(differ)}): its shards, vocabulary "
                             f"and heads would be reused as if they were this run's. Give another --work folder, "
                             f"or the settings it was made with")
        return
    from mlxspec.files import write_atomic

    write_atomic(path, json.dumps({**mine, **({"target_named": named} if named else {})}, indent=1) + "\n")


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
    from mlxspec.files import staged

    with staged(path) as [tmp]:
        np.savez(tmp, ids=np.concatenate([np.asarray(r[0][:-1], np.int32) for r in rows]),
                 feats=np.concatenate([r[1] for r in rows]), lens=np.array([len(r[0]) - 1 for r in rows], np.int32),
                 plens=np.array([len(p) for p in prompts_ids], np.int32), temp=np.float32(temp))


def answer_marks(args) -> list:
    """What sets these answers apart from the defaults': a --generate-precision other than float32
    (other answers and features), a --gen-batch other than 48 (other prompts sampled at T, other
    padding). Empty for the defaults, so earlier work dirs keep their names."""
    prec = getattr(args, "generate_precision", "float32")
    size = getattr(args, "gen_batch", train_common.GEN_BATCH)
    return ([] if prec == "float32" else [prec]) + ([] if size == train_common.GEN_BATCH else [f"batch{size}"])


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
    todo = [] if args.finished_only else [b for b in batches if not (out_dir / f"{b[0]}.npz").exists()]
    if todo:
        log("loading the target (dequantizing the GGUF, weights rounded to bfloat16)")
        tok, model = load_target(Path(args.gguf))
        ids_of = {job: chat_ids(tok, prompts[job[0]][job[1]]["prompt"]) for _, _, jobs in todo for job in jobs}
        train_common.say_space(out_dir, ids_of.values(), args.max_new,
                               train_common.entry_bytes(model.config.hidden_size, layers))
    clock = train_common.AnswerClock(len(batches), len(todo))
    paths = []
    for n, (name, temp, jobs) in enumerate(batches):
        path = out_dir / f"{name}.npz"
        paths.append(path)
        if path.exists():
            continue
        if args.finished_only:
            paths.pop()
            continue
        ids = [ids_of[job] for job in jobs]
        gen = torch.Generator().manual_seed(args.seed * 100003 + n)
        eos = tok.eos_token_id
        with step_arithmetic(args.generate_precision):
            say = train_common.batch_progress(n, len(batches), name)
            rows = generate_batch(model, ids, max_new=args.max_new, temperature=temp, gen=gen, eos=eos,
                                  pad=tok.pad_token_id if tok.pad_token_id is not None else eos, layers=layers,
                                  progress=lambda step, finished: say(f"step {step}/{args.max_new}, "
                                                                      f"{finished}/{len(ids)} answers finished"))
        save_shard(path, rows, ids, temp, layers)
        clock.done(n, f"{name} (T={temp:g})", sum(len(r[0]) - len(p) for r, p in zip(rows, ids)))
    return paths


def load_features(shards: list, layers=()):
    """Train and held-out [(ids (L,), features (L, H) float16, prompt length, layer features
    (L, len(layers) * H) float16 or None)]; f[j] belongs to ids[j]. The features are views of
    memory maps of the shards (as many as the limit on open files allows; the rest are read whole):
    batches copy what they read, and the rest stays on disk."""
    train, held = [], []
    files = 2 if layers else 1
    room = train_common.room_for_maps(len(shards) * files) // files
    for k, shard in enumerate(shards):
        ids, lens, plens = train_common.read_arrays(shard, "ids", "lens", "plens")
        feats, = train_common.read_arrays(shard, "feats", mapped=k < room)
        multi = train_common.read_array(layers_path(shard, layers), mapped=k < room) if layers else None
        o = 0
        for n, p in zip(lens, plens):
            m = multi[o:o + n] if layers else None
            (held if shard.name.startswith("held_out") else train).append((ids[o:o + n], feats[o:o + n], int(p), m))
            o += n
    return train, held


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
        return train_common.read_work(path, np.load)
    counts = np.zeros(args.vocab_size, np.int64)
    for ids, _, p, _ in train:
        np.add.at(counts, ids[p:], 1)
    order = np.argsort(-counts, kind="stable")
    extra = order[~np.isin(order, base)][: args.draft_vocab - len(base)]
    top = np.sort(np.concatenate([base, extra])).astype(np.int32)
    train_common.save_array(path, top)
    log(f"draft vocabulary: {len(top)} tokens ({len(extra)} added to the --init head's {len(base)})" if init else
        f"draft vocabulary: {len(top)} tokens")
    log(f"they cover {counts[top].sum() / counts.sum():.4f} of answer tokens")
    return top


def target_config(gguf: Path) -> dict:
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    out = {k: getattr(c, k) for k in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                      "rms_norm_eps", "max_position_embeddings", "vocab_size", "intermediate_size",
                                      "num_hidden_layers")}
    rope = getattr(c, "rope_parameters", None) or {}  # newer transformers keep rope_theta there
    out["rope_theta"] = float(rope.get("rope_theta") or getattr(c, "rope_theta"))
    return out

