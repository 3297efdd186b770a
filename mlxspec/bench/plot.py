"""`--plot PATH.png`: tokens/s by mode and category, acceptance and speedup vs k, the V(j) curve.

matplotlib is optional (`pip install matplotlib`, or the `plot` extra).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import MlxSpecError


def write_plot(doc: dict, path) -> None:
    """Render the bench document (from `report.to_json`) as a three-panel PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MlxSpecError("[bench] --plot needs matplotlib, which is not installed: pip install matplotlib") from None

    s = doc["summary"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))

    ax = axes[0]
    cats = list(s["by_category"])
    labels = list(next(iter(s["by_category"].values()))["tokens_per_second"]) if cats else []
    width = 0.8 / max(1, len(labels))
    for i, lab in enumerate(labels):
        ys = [s["by_category"][c]["tokens_per_second"][lab] or 0.0 for c in cats]
        ax.bar([x + i * width for x in range(len(cats))], ys, width, label=lab)
    ax.set_xticks([x + width * (len(labels) - 1) / 2 for x in range(len(cats))], cats, rotation=30, ha="right")
    ax.set_ylabel("tokens/s (median)")
    ax.set_title("Tokens/s by mode and category")
    ax.legend(fontsize=8)

    ax = axes[1]
    t0 = doc["settings"]["temperature"]
    for drafter in dict.fromkeys(r["drafter"] for r in s["settings"] if r["mode"] == "speculative"):
        rows = [r for r in s["settings"] if r["drafter"] == drafter and r["mode"] == "speculative"
                and r["temperature"] == t0 and r["num_draft"] != "auto"]
        rows.sort(key=lambda r: int(r["num_draft"]))
        ks = [int(r["num_draft"]) for r in rows]
        ax.plot(ks, [r["speedup_vs_vanilla"] or 0.0 for r in rows], "o-", label=f"{drafter} speedup")
        ax.plot(ks, [r["acceptance_rate"] or 0.0 for r in rows], "s--", label=f"{drafter} acceptance")
        auto = next((r for r in s["settings"] if r["drafter"] == drafter and r["num_draft"] == "auto"
                     and r["mode"] == "speculative" and r["temperature"] == t0), None)
        if auto and auto["speedup_vs_vanilla"]:
            ax.axhline(auto["speedup_vs_vanilla"], linestyle=":", color="gray", label=f"{drafter} auto speedup")
    ax.axhline(1.0, color="black", linewidth=0.5)
    ax.set_xlabel("draft length k")
    ax.set_title("Speedup vs vanilla and acceptance by k")
    ax.legend(fontsize=8)

    ax = axes[2]
    curve = doc.get("curve") or {}
    ratios = curve.get("ratios") or {}
    js = sorted(ratios, key=int)
    ax.plot([int(j) for j in js], [ratios[j] for j in js], "o-")
    ax.set_xlabel("tokens per target pass j")
    ax.set_ylabel("V(j) / V(1)")
    ax.set_title(f"Verify cost curve ({curve.get('source', 'none')})")

    dev = doc["device"]
    fig.suptitle(f"mlxspec bench: {doc['pair'].get('name') or doc['pair']['target']} on {dev['backend']} {dev['name']}")
    fig.tight_layout()
    # Drawn beside it and renamed into place: an interrupted run keeps the old plot whole.
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{path.suffix}")  # the suffix tells savefig the format
    try:
        fig.savefig(tmp, dpi=110)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
        plt.close(fig)
