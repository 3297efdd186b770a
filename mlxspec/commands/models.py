"""`mlxspec models`: the curated pairs of models.toml, their sizes and whether they are cached."""

from __future__ import annotations

import json
import shutil


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "models",
        help="list the curated target/draft pairs and which are cached",
        description=(
            "List the target/draft pairs of models.toml: approximate weights sizes, the target's "
            "context and sliding window (for your own pairs that leave them out, read from their cached "
            "files), who drafts by default on this machine's backend (the draft "
            "model, the n-gram drafter or the pair's EAGLE head: whichever the bench measured faster "
            "there; in one process: a target sharded with --distributed drafts with n-gram where this "
            "says eagle), and whether the weights are already in the local cache (no network is used). "
            "Use a NAME with `mlxspec generate --pair NAME` or fetch it with `mlxspec pull NAME`."
        ),
    )
    p.add_argument("--json", action="store_true", help="print one JSON object per pair instead of a table")
    p.set_defaults(func=run)


def is_cached(ref: str) -> bool:
    """True when `ref` (a demo/model reference, or 'ngram'/'none') needs no download."""
    from ..errors import MlxSpecError
    from ..choices import WEIGHTLESS_DRAFTERS
    from ..loading.resolve import resolve_model

    if ref in WEIGHTLESS_DRAFTERS:
        return True
    try:
        resolve_model(ref, download=False)
        return True
    except MlxSpecError:
        return False


def run(args) -> int:
    from ..device import backend
    from ..loading.registry import pairs

    here = backend()
    rows = []
    for p in pairs().values():
        cached = is_cached(p.target) and is_cached(p.draft) and (not p.head or is_cached(p.head))
        rows.append({**p.__dict__, **_on_disk(p), "drafter_here": p.default_drafter(here), "cached": cached})
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    table = [("NAME", "TARGET", "DRAFT", "HEAD", "SIZE GB", "CONTEXT", "WINDOW", f"DRAFTER ({here.upper()})",
              "CACHED")] + [_cells(r) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    if sum(widths) + 2 * (len(widths) - 1) <= shutil.get_terminal_size().columns:
        for row in table:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        return 0
    # Too wide for the terminal (repo ids are long): a short block per pair.
    for i, r in enumerate(rows):
        window = f", window {r['window']}" if r["window"] else ""
        print(("\n" if i else "") + f"{r['name']}  (cached: {'yes' if r['cached'] else 'no'})")
        print(f"  target   {r['target']}" + (f"\n  adapter  {r['adapter']}{_fused(r)}" if r["adapter"] else "")
              + f"\n  draft    {r['draft']}" + (f"\n  head     {r['head']}" if r["head"] else ""))
        print(f"  size     {_size(r)} GB on disk, context {r['context'] or '?'}{window}")
        print(f"  drafter  {r['drafter_here']} on {here}")
    return 0


def _on_disk(p) -> dict:
    """A user's own pair leaves sizes and context out (0): what its cached files say instead."""
    from ..errors import MlxSpecError
    from ..loading.ondisk import trained_context, weights_bytes_on_disk
    from ..loading.resolve import resolve_model

    if p.target_gb:  # a curated pair: its figures as written
        return {}
    try:
        target = resolve_model(p.target, download=False)
        draft = resolve_model(p.draft, download=False) if p.draft_is_model else None
        return {"target_gb": _gb(weights_bytes_on_disk(target)),
                "draft_gb": _gb(weights_bytes_on_disk(draft)) if draft else 0.0,
                "context": p.context or trained_context(target) or 0}
    except (MlxSpecError, OSError, ValueError):  # not cached (said in CACHED), or unreadable: loading says why
        return {}


def _fused(r: dict) -> str:
    return " (fused at load)" if r.get("fuse_adapter") else ""


def _gb(size: int) -> float:
    return float(f"{size / 1e9:.3g}")  # three figures, as the curated sizes are written


def _cells(r: dict) -> tuple:
    target = f"{r['target']} + adapter {r['adapter']}{_fused(r)}" if r["adapter"] else r["target"]
    return (r["name"], target, r["draft"], r["head"] or "-", _size(r),
            str(r["context"] or "?"), str(r["window"] or "-"), r["drafter_here"], "yes" if r["cached"] else "no")


def _size(r: dict) -> str:
    """Target + draft GB as stored (a quantized GGUF loads larger, dequantized); "?" where a user's
    own pair leaves the size out (0)."""
    if not r["target_gb"]:
        return "?"
    return f"{r['target_gb']:g} + {r['draft_gb']:g}"
