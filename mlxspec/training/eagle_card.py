"""What an exported head says about how it was made: the config's `training` record, and a
model card (README.md beside the weights) with its data, time and held-out figures.

Both trainers (--gguf's PyTorch, --target's MLX) write them from the same record, so a head
folder tells on its own what went into it; the figures are the run's own, nothing else.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Optional

from .draft_prompts import read_prompt_file
from .eagle_training import train_steps


def training_record(args, meta: dict, script: str, **more) -> dict:
    """The config's `training` block. `meta`: the final checkpoint's (train_seconds, steps,
    sequences, entries, history, init); `more`: what one trainer adds (backend, precision...)."""
    import mlxspec

    planned = train_steps(meta["sequences"], args)[0]
    return {"script": script, **more, "seed": args.seed, "date": datetime.date.today().isoformat(),
            "mlxspec": mlxspec.__version__,
            "train_minutes": round(meta["train_seconds"] / 60, 2), "steps": meta["steps"],
            **({"steps_planned": planned} if meta["steps"] < planned else {}),  # cut by --train-minutes
            "sequences": meta["sequences"], "entries": meta["entries"],
            "held_out": meta["history"][-1] if meta["history"] else None,
            "data": {"templated_prompts": args.prompts, "held_out_prompts": args.held_out,
                     "prompt_files": {Path(p).name: len(read_prompt_file(p)) for p in args.prompt_file},
                     "max_new_tokens": args.max_new, "temperature": args.temperature},
            "epochs": args.epochs, "batch": args.batch, "lr": args.lr,
            **({"init": meta["init"]} if meta.get("init") else {})}


TITLE = "# An EAGLE head for "  # how a card this writes begins


def write_card(out: Path, record: dict, target: str, history: list) -> Optional[Path]:
    """README.md in `out`: the head's target, data, training time and held-out agreement (the
    head's first and later drafting steps right, teacher-forced, on the held-out prompts' answers).
    A README.md that this did not write (the shipped head's card, one of yours) is left as it is:
    None then."""
    path = out / "README.md"
    if path.exists() and not path.read_text(encoding="utf-8").startswith(TITLE):
        return None
    data = record["data"]
    files = "".join(f"; `{name}`: {n} prompts" for name, n in data["prompt_files"].items())
    cut = (f" (cut by --train-minutes from {record['steps_planned']:,})" if "steps_planned" in record else "")
    rows = "\n".join(f"| {h['step']:,} | {h['held_loss']:.4f} | "
                     + " / ".join(f"{a:.3f}" for a in h["held_top1"]) + " |" for h in history)
    lines = [
        f"{TITLE}{target}",
        "",
        f"Written by `{record['script']}` on {record['date']} (mlxspec {record['mlxspec']}, seed {record['seed']}).",
        f"Draft with it: `mlxspec generate --target {target} --drafter eagle --head {out}`; measure what it",
        f"gains on your machine with `mlxspec bench --target {target} --drafter eagle --head {out}`.",
        "",
        "## Data",
        "",
        f"The target's own answers (at most {data['max_new_tokens']} tokens each; "
        + ("all greedy" if data["temperature"] == 0 else
           f"every other batch greedy, the others at temperature {data['temperature']:g}")
        + f") to {data['templated_prompts']:,} templated prompts{files}; "
        f"{data['held_out_prompts']} more held out. {record['sequences']:,} sequences, "
        f"{record['entries']:,} entries trained on.",
        "",
        "## Training",
        "",
        f"{record['epochs']:g} epoch{'' if record['epochs'] == 1 else 's'}, batch {record['batch']}, peak learning rate {record['lr']:g}: "
        f"{record['steps']:,} steps{cut} in {record['train_minutes']:g} minutes"
        + (f", on {record['backend']}" if record.get("backend") else "")
        + (f", continuing {record['init'].get('head')}" if isinstance(record.get("init"), dict) else "") + ".",
        "",
        "## Held-out agreement",
        "",
        "Teacher-forced on the held-out prompts' answers: the loss, and the fraction of positions where",
        "the head's top token is the target's, at its first drafting step / the next ones.",
        "",
        "| step | loss | top-1 per step |",
        "|---|---|---|",
        rows,
        "",
    ]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path

