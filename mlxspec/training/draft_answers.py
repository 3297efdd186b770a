"""train_draft.py's stage 2: the target's own answers to the prompts (greedy and at T), batched,
with the target's top-k log-probabilities at every answer position (the soft labels), in
shards under --work that a rerun finds finished; their batch plan is train_eagle.py's too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .draft_prompts import chat_ids
from .torch_target import cache_kw, kv_cache, left_padded, load_target
from .train_common import GEN_BATCH, AnswerClock, log, read_work


EOS = 2  # <|im_end|>
PAD = 2


def generate_batch(model, prompts_ids, *, max_new: int, temperature: float, top_k: int, gen):
    """Batched generation with left padding and a KV cache.

    Returns per row: (answer ids, top-k ids (T, k) int32, top-k log-probs (T, k) float16),
    where row t of the soft labels is the target's T=1 distribution for answer token t.
    """
    import torch

    B = len(prompts_ids)
    ids, mask, pos = left_padded(prompts_ids, PAD)
    cache_arg = cache_kw(model, kv_cache(ids.shape[1] + max_new))  # looked up once, not at every step
    done = torch.zeros(B, dtype=torch.bool)
    out_tok, out_ids, out_lp = [], [], []
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, **cache_arg,
                       use_cache=True, logits_to_keep=1).logits[:, -1].float()  # (B, V)
        for _ in range(max_new):
            lp = torch.log_softmax(logits, dim=-1)
            top_lp, top_id = lp.topk(top_k, dim=-1)  # (B, k)
            if temperature > 0:
                probs = torch.softmax(logits / temperature, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=gen).squeeze(1)
            else:
                nxt = top_id[:, 0]
            nxt = torch.where(done, torch.full_like(nxt, PAD), nxt)
            out_tok.append(nxt)
            out_ids.append(top_id.to(torch.int32))
            out_lp.append(top_lp.to(torch.float16))
            done = done | (nxt == EOS)
            if bool(done.all()):
                break
            mask = torch.cat([mask, torch.ones((B, 1), dtype=torch.long)], dim=1)
            pos = pos[:, -1:] + 1
            logits = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos, **cache_arg,
                           use_cache=True).logits[:, -1].float()
    toks = torch.stack(out_tok, 1).numpy()
    tids = torch.stack(out_ids, 1).numpy()
    tlps = torch.stack(out_lp, 1).numpy()
    rows = []
    for i in range(B):
        n = len(toks[i])
        stop = np.nonzero(toks[i] == EOS)[0]
        if len(stop):
            n = int(stop[0]) + 1  # keep <|im_end|>: the draft must predict the end too
        rows.append((toks[i, :n].astype(np.int32), tids[i, :n], tlps[i, :n]))
    return rows


def batch_mark(args) -> str:
    """The suffix of shards a --gen-batch other than the default writes. Batch n of another size
    holds other prompts, so it must never pass for a finished shard of this size."""
    return "" if args.gen_batch == GEN_BATCH else f"-b{args.gen_batch}"


def plan_batches(args, prompts: dict) -> list:
    """(shard name, temperature, [(split, prompt index, temperature)]) per generate batch: held-out
    prompts greedily, train prompts alternately greedy (even index) and at T, then each prompt
    file's the same way (shards named by the file's content)."""
    jobs = [("train", i, 0.0 if i % 2 == 0 else args.temperature) for i in range(len(prompts["train"]))]
    jobs += [("held_out", i, 0.0) for i in range(len(prompts["held_out"]))]
    files = sorted(k for k in prompts if k.startswith("file-"))
    for key in files:
        jobs += [(key, i, 0.0 if i % 2 == 0 else args.temperature) for i in range(len(prompts[key]))]
    # Batches in prompt order within each (split, temperature) group, so a larger --prompts
    # only appends batches: the finished ones stay valid.
    groups = {}
    for j in jobs:
        groups.setdefault((j[0], j[2]), []).append(j)
    batches = []
    for (sp, temp), js in sorted(groups.items(), key=lambda kv: (kv[0][0] != "held_out", kv[0][0], kv[0][1])):
        for b in range(0, len(js), args.gen_batch):
            batches.append((f"{sp}-t{temp:g}-{b // args.gen_batch:03d}{batch_mark(args)}", temp,
                            js[b:b + args.gen_batch]))

    def interleaved(prefix):  # greedy and sampled batches alternate, so a stopped run has both kinds
        greedy = [b for b in batches if b[0].startswith(prefix) and b[1] == 0]
        sampled = [b for b in batches if b[0].startswith(prefix) and b[1] > 0]
        return [b for pair in zip(greedy, sampled) for b in pair] + greedy[len(sampled):] + sampled[len(greedy):]

    # files last: adding one appends batches after the finished ones
    return ([b for b in batches if b[0].startswith("held_out")] + interleaved("train-")
            + [b for key in files for b in interleaved(key + "-")])


def stage_generate(args, work: Path, prompts: dict) -> list:
    """Answer shards for `plan_batches`' batches (finished ones are kept)."""
    import torch

    gen_dir = work / "gen"
    gen_dir.mkdir(exist_ok=True)
    batches = plan_batches(args, prompts)
    tok, model = None, None
    clock = AnswerClock(len(batches), sum(not (gen_dir / f"{b[0]}.npz").exists() for b in batches))
    for n, (name, temp, js) in enumerate(batches):
        path = gen_dir / f"{name}.npz"
        if path.exists():
            continue
        if model is None:
            log("loading the target (dequantizing the GGUF)")
            tok, model = load_target(Path(args.gguf))
        ids = [chat_ids(tok, prompts[j[0]][j[1]]["prompt"]) for j in js]
        gen = torch.Generator().manual_seed(args.seed * 100003 + n)
        rows = generate_batch(model, ids, max_new=args.max_new, temperature=temp, top_k=args.top_k, gen=gen)
        out = {}
        for k, (j, p, (ans, tid, tlp)) in enumerate(zip(js, ids, rows)):
            out[f"{k}_prompt"] = np.asarray(p, np.int32)
            out[f"{k}_answer"], out[f"{k}_topid"], out[f"{k}_toplp"] = ans, tid, tlp
            out[f"{k}_meta"] = np.asarray([1 if j[0] == "held_out" else 0, j[1], int(temp * 1000)], np.int32)
        from mlxspec.files import staged

        with staged(path) as [tmp]:
            np.savez(tmp, **out)
        clock.done(n, name, sum(len(r[0]) for r in rows))
    return [gen_dir / f"{b[0]}.npz" for b in batches]


def load_generated(paths):
    """{'train': [...], 'held_out': [...]} of dicts prompt/answer/topid/toplp/temp from these shards."""
    data = {"train": [], "held_out": []}
    for path in paths:
        def read(path):
            z = np.load(path)
            return [(z[f"{k}_meta"], {"prompt": z[f"{k}_prompt"], "answer": z[f"{k}_answer"],
                                      "topid": z[f"{k}_topid"], "toplp": z[f"{k}_toplp"]})
                    for k in range(len([f for f in z.files if f.endswith("_meta")]))]

        for (sp, idx, temp), arrays in read_work(path, read):
            data["train" if sp == 0 else "held_out"].append({"index": int(idx), "temp": temp / 1000, **arrays})
    for v in data.values():
        v.sort(key=lambda r: (r["index"], r["temp"]))
    return data

