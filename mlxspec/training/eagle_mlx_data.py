"""train_eagle.py --target's data stages in MLX: the target, its answers and its features.

The target answers through mlx-lm's batched generation; its hidden states come from one
teacher-forced pass of mlxspec's own backbone split (what the engine's verify passes
compute), so a head trains on the features it will read, in the precision the engine runs.
The shards are train_eagle.py's own (same batches, names and format).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from .draft_prompts import chat_ids
from . import train_common


# ---------------------------------------------------------------- the target

def load_target(ref: str, adapter_path=None):
    """(model, tokenizer, name): mlxspec's own loading path, in the engine's precision, with the
    fine-tuned adapter applied as the engine applies it (`adapter_path`)."""
    from mlxspec.backbone import split_model
    from mlxspec.errors import MlxSpecError
    from mlxspec.loading.adapters import apply_adapter
    from mlxspec.loading.model import load_model

    try:
        model, tok, _ = load_model(ref)
        split_model(model)  # a head needs the final hidden states behind a linear head (capped or scaled)
    except MlxSpecError as e:
        raise SystemExit(f"--target {ref}: {e}") from None
    if adapter_path:  # after the precision, as load_model(..., adapter_path=...) applies it for the engine
        try:
            apply_adapter(model, adapter_path)
        except MlxSpecError as e:
            raise SystemExit(f"--adapter-path {adapter_path}: {e}") from None
    return model, tok, Path(str(ref).rstrip("/")).name


def target_config(model) -> dict:
    """The fields train_eagle.py reads of a target, from an mlx-lm model's args."""
    a = model.args
    H, nh = a.hidden_size, a.num_attention_heads
    return {"hidden_size": H, "num_attention_heads": nh,
            "num_key_value_heads": getattr(a, "num_key_value_heads", None) or nh,
            "head_dim": getattr(a, "head_dim", None) or H // nh,
            "rms_norm_eps": float(getattr(a, "rms_norm_eps", 1e-6)),
            "max_position_embeddings": int(getattr(a, "max_position_embeddings", None) or 8192),
            "vocab_size": int(model.model.embed_tokens.weight.shape[0]),
            "intermediate_size": a.intermediate_size, "num_hidden_layers": len(model.model.layers),
            "rope_theta": float(getattr(a, "rope_theta", 10000.0)), "model_type": a.model_type}


def gen_dir(work: Path, model, adapter=None) -> Path:
    """Answer shards per target (its embedding's fingerprint, and its adapter's `adapter_digest`:
    an adapter leaves the embedding as it was), so two targets never share them."""
    from mlxspec.drafters.eagle_files import embedding_fingerprint

    identity = embedding_fingerprint(model)
    if adapter:  # only then: a plain target's shards keep their folder
        identity = [identity, adapter]
    key = hashlib.sha1(json.dumps(identity).encode()).hexdigest()[:8]
    return work / f"eagle-gen-mlx-{key}"


def prompt_ids(tok, prompt) -> list:
    """The ids the engine feeds for a chat; a tokenizer without a chat template gets the text."""
    if getattr(tok, "chat_template", None):
        return chat_ids(tok, prompt)
    text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
    return tok.encode(text)


# ---------------------------------------------------------------- stage 2: answers + features

def answer(model, tok, prompts: list, *, max_new: int, temperature: float, seed: int, batch: int,
           progress=None) -> list:
    """The target's answers (token lists, their end-of-sequence token included) by mlx-lm's
    batched generation: greedy at temperature 0, else sampled at it. `progress(finished,
    tokens)` is called every `train_common.HEARTBEAT` seconds while it runs."""
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_sampler

    mx.random.seed(seed)
    gen = BatchGenerator(model, max_tokens=max_new, stop_tokens=[[t] for t in tok.eos_token_ids],
                         sampler=make_sampler(temp=temperature), completion_batch_size=batch,
                         prefill_batch_size=min(batch, 8))
    uids = gen.insert(prompts, [max_new] * len(prompts))
    out = {u: [] for u in uids}
    finished, tokens, last = 0, 0, time.time()
    while responses := gen.next_generated():
        for r in responses:
            out[r.uid].append(int(r.token))
            tokens += 1
            finished += r.finish_reason is not None
        if progress is not None and time.time() - last >= train_common.HEARTBEAT:
            progress(finished, tokens)
            last = time.time()
    gen.close()
    return [out[u] for u in uids]


def features(model, seqs: list, layers=(), max_tokens: int = 4096) -> list:
    """One teacher-forced pass per group of sequences: [(final hidden states (n, H) float16,
    tapped layers' outputs (n, len(layers) * H) float16 or None)] per sequence."""
    from mlxspec.backbone import split_model, tapped

    run = tapped(model, layers) if layers else split_model(model)[0]
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    out = [None] * len(seqs)
    i = 0
    while i < len(order):
        L = len(seqs[order[i]])
        group = order[i: i + max(1, max_tokens // max(L, 1))]
        L = max(len(seqs[g]) for g in group)  # right-padded: the causal mask keeps pads out of earlier rows
        x = mx.array(np.array([seqs[g] + [0] * (L - len(seqs[g])) for g in group], np.int32))
        h = run(x)
        h, t = h if layers else (h, None)
        h = h.astype(mx.float16)
        t = t.astype(mx.float16) if t is not None else None
        mx.eval(h, t) if t is not None else mx.eval(h)
        for r, g in enumerate(group):
            n = len(seqs[g])
            out[g] = (np.array(h[r, :n]), np.array(t[r, :n]) if t is not None else None)
        i += len(group)
    return out


def stage_generate(args, work: Path, prompts: dict, model, tok, layers=()) -> list:
    """train_eagle.py's shards (same batches, names and format), made by the MLX target."""
    from .eagle_data import gen_batches, layers_path, save_layers, save_shard

    out_dir = gen_dir(work, model, getattr(args, "adapter_digest", None))
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    batches = gen_batches(args, prompts)
    todo = [] if args.finished_only else [b for b in batches if not (out_dir / f"{b[0]}.npz").exists()]
    ids_of = {job: prompt_ids(tok, prompts[job[0]][job[1]]["prompt"]) for _, _, jobs in todo for job in jobs}
    train_common.say_space(out_dir, ids_of.values(), args.max_new,
                           train_common.entry_bytes(target_config(model)["hidden_size"], layers))
    clock = train_common.AnswerClock(len(batches), len(todo))
    for n, (name, temp, jobs) in enumerate(batches):
        path = out_dir / f"{name}.npz"
        if path.exists():
            if layers and not layers_path(path, layers).exists():  # answers kept, these layers not yet
                ids, lens = train_common.read_arrays(path, "ids", "lens")
                stored = np.split(ids, np.cumsum(lens)[:-1])
                rows = features(model, [s.tolist() for s in stored], layers)
                save_layers(path, layers, np.concatenate([r[1] for r in rows]))
            paths.append(path)
            continue
        if args.finished_only:
            continue
        ids = [ids_of[job] for job in jobs]
        say = train_common.batch_progress(n, len(batches), name)
        answers = answer(model, tok, ids, max_new=args.max_new, temperature=temp,
                         seed=args.seed * 100003 + n, batch=args.gen_batch,
                         progress=lambda finished, tokens: say(f"{finished}/{len(ids)} answers finished, "
                                                               f"{tokens} tokens"))
        seqs = [p + a for p, a in zip(ids, answers)]
        rows = features(model, [s[:-1] for s in seqs], layers)  # the last token is never fed
        save_shard(path, [(s, f, t) for s, (f, t) in zip(seqs, rows)], ids, temp, layers)
        paths.append(path)
        clock.done(n, f"{name} (T={temp:g})", sum(len(a) for a in answers))
    return paths

