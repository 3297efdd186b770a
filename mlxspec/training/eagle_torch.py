"""scripts/train_eagle.py's head in PyTorch (--gguf): the modules, named like mlx-lm's llama block
so that export is a copy; the objective (the same as eagle_objective.py's in MLX); and the
train stage, resumable from its checkpoints.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np

from . import train_common
from . import train_draft
from .eagle_data import load_target, step_arithmetic, target_config
from .eagle_training import (TimeBudget, batch_tensors, context_mask, epoch_batches, first_loss_entry, head_config,
                            note_checkpoint, run_tag, say_data, say_other_runs, split_context, step_mask, train_steps,
                            widened, wider_mlp, window_starts)
from .train_common import log


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

    from mlxspec.files import staged

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
    say_data(train, held, nparams, args)
    context = context_kv(gguf, cfg) if cfg.get("context") == "target" else None
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    rng = random.Random(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    total, warm = train_steps(len(train), args)
    step, elapsed, history = 0, 0.0, []
    epoch_state, in_epoch = rng.getstate(), 0  # the current epoch's shuffle replays from this on resume
    if ckpt.exists():
        ck = train_common.read_work(ckpt, lambda p: torch.load(p, weights_only=False))
        head.load_state_dict(ck["head"])
        opt.load_state_dict(ck["opt"])
        step, elapsed, history = ck["step"], ck["elapsed"], ck["history"]
        epoch_state, in_epoch = ck["epoch_state"], ck["in_epoch"]
        gen.set_state(ck["gen"])
        total = ck.get("total", total)  # a run cut by --train-minutes resumes to its cut
        log(f"resumed at step {step}/{total}")
    else:
        say_other_runs(ckpt, args)

    def held_out(at: int, when: str) -> None:  # measured, kept for the card's rows, and said
        vl, va = evaluate(head, emb, w_draft, held, args, context)
        history.append({"step": at, "held_loss": vl, "held_top1": va})
        log(f"held-out {when}: loss {vl:.4f}, top-1 per step {' '.join(f'{a:.3f}' for a in va)}")

    if not history:  # the baseline the card's rows are read against (with --init: the head continued)
        held_out(0, "before training")
    budget = TimeBudget(args.train_minutes, step) if args.train_minutes else None
    t0 = time.time() - elapsed
    run = [0.0, [0.0] * args.unroll, 0]
    while step < total:
        rng.setstate(epoch_state)
        for b in epoch_batches(train, args.batch, rng)[in_epoch:]:
            if step >= total:
                break
            for g in opt.param_groups:
                g["lr"] = args.lr * train_common.lr_scale(step, total, warm)
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
                held_out(step, f"after step {step}")
                with staged(ckpt) as [tmp]:
                    torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "step": step,
                                "elapsed": time.time() - t0, "history": history, "epoch_state": epoch_state,
                                "in_epoch": in_epoch, "gen": gen.get_state(), "total": total}, tmp)
                note_checkpoint(ckpt, args, step, total)
        epoch_state, in_epoch = rng.getstate(), 0
    with staged(final) as [tmp]:  # whole or absent: a rerun returns it because it exists
        torch.save({"cfg": cfg, "head": head.state_dict(), "train_seconds": time.time() - t0, "steps": total,
                    "sequences": len(train), "entries": ntok, "history": history,
                    "init": init["lineage"] if init else None, "precision": args.precision}, tmp)
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

