"""What both of scripts/train_eagle.py's trainers share (PyTorch's, eagle_torch.py, and MLX's,
train_eagle_mlx.py): the head's settings and its start (--init), batches and the masks of
unrolled drafting steps, the run's name (what its checkpoints are found by) and time budget.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from pathlib import Path

import numpy as np

from .eagle_data import data_tag
from .train_common import log



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
    --epochs passes of --batch sequences, 3 % of them warm-up (train_common.lr_scale)."""
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


# Answer tokens under which a head is a trial: the demo head's trials on 240 prompts (25 K answer
# tokens) drafted 0.15-0.18 per token on the templated held-out prompts, its recipe's 600 K answer tokens 0.54
# there (smollm2-eagle's card).
FEW_ANSWER_TOKENS = 100_000


def say_data(train, held, nparams: int, args) -> None:
    """The train stage's opening line: the head's size and what it learns from, with a word when a
    head trained from scratch gets too little for drafting well (a trial run is fine, a surprise is
    not; continuing a head with --init on a few hundred answers is how it adapts, and says nothing)."""
    answers = sum(len(t[0]) - t[2] for t in train)
    log(f"head: {nparams / 1e6:.2f}M parameters; {len(train)} sequences, {sum(len(t[0]) - 1 for t in train)} "
        f"entries ({answers} answer tokens); held out {len(held)}")
    if answers < FEW_ANSWER_TOKENS and not getattr(args, "init_head", None):
        log(f"only {answers:,} answer tokens to learn from: the demo head learnt from 600 K and drafts 0.54 per "
            "token, trials of it on 25 K drafted 0.15-0.18; take this run as a trial, or give more --prompts "
            "and --prompt-file prompts")


# The settings every run is named by (`run_tag`), beside those it names only when not the default.
RUN_KEYS = ("draft_vocab", "intermediate", "epochs", "batch", "lr", "noise", "unroll", "unroll_weight",
            "ce_weight", "loss_on", "seed")


def run_flags(args) -> dict:
    """The flags that make a run what it is (those `run_tag` names it by), as a person types them."""
    init = getattr(args, "init_head", None)
    return {**{"--" + k.replace("_", "-"): getattr(args, k) for k in RUN_KEYS},
            "--feature-layers": args.layers or None, "--init": init["folder"] if init else None,
            "--head-layers": args.head_layers, "--context": getattr(args, "context", "head"),
            "--precision": getattr(args, "precision", "float32"), "--train-minutes": getattr(args, "train_minutes", None)}


def _shown(value) -> str:
    return "not given" if value is None else str(value)


def _run_note(ckpt: Path) -> Path:
    return ckpt.with_suffix(".run.json")


def _run_data(note: Path) -> tuple:
    """(the answers it trained on, its trainer) from a run's file name: head_ckpt-<data>-<hash>[-mlx]."""
    name = note.name.removesuffix(".run.json")
    mlx = name.endswith("-mlx")
    return name.removesuffix("-mlx").rsplit("-", 1)[0], mlx


def note_checkpoint(ckpt: Path, args, step: int, total: int) -> None:
    """Beside a run's checkpoint: its flags and how far it got, which a run started later on the same
    answers with other flags reads (`say_other_runs`)."""
    note = _run_note(ckpt)
    from mlxspec.files import write_atomic

    write_atomic(note, json.dumps({"flags": run_flags(args), "step": step, "total": total}, default=str) + "\n")


def say_other_runs(ckpt: Path, args) -> None:
    """A run that starts from step 0 says which unfinished runs of its trainer on the same answers it
    is not resuming, and the flags that part them from it: a rerun with one flag changed starts
    over, and hours of training should not be set aside without a word."""
    mine, flags = _run_note(ckpt), run_flags(args)
    for note in sorted(ckpt.parent.glob("head_ckpt-*.run.json")):
        if note == mine or _run_data(note) != _run_data(mine):
            continue
        try:
            other = json.loads(note.read_text())
            if other["step"] >= other["total"]:
                continue
            theirs = other["flags"]
            differ = [f"{k} {_shown(theirs.get(k))} there, {_shown(v)} here"
                      for k, v in flags.items() if _shown(theirs.get(k)) != _shown(v)]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # a note from another version, or half-written: it only ever informs
        why = f" ({'; '.join(differ)})" if differ else ""
        log(f"not resuming the run in {note.parent} that stopped at step {other['step']} of {other['total']}: "
            f"its flags differ{why}; this run starts at step 0, and the same command with that run's flags "
            "resumes it instead")


def run_tag(args, train) -> str:
    """Names a training run's files by its data and settings: resuming continues the same run,
    and new shards or other settings start a new one instead of reusing a stale head."""
    init = getattr(args, "init_head", None)  # continuing another head is another run
    settings = json.dumps([len(train)] + [getattr(args, k) for k in RUN_KEYS]
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


def window_config(args) -> dict:
    """The exported config's `window` (none for a head that reads the target's cache, or with 0)."""
    return {"window": args.window} if args.window and args.context != "target" else {}

