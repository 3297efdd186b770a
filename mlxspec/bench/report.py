"""Bench output: the JSON document, the CSV of runs, and the terminal tables.

JSON keys (read by tools outside mlxspec; only add keys, never rename):
    mlxspec_version, device{backend,name,os}, pair{name,target,draft,drafters},
    settings{max_tokens,temperature,num_draft,seed}, runs[...], summary{speedup_vs_vanilla,
    speedup_vs_mlx_lm, by_category{<cat>{speedup_vs_vanilla}}, mismatches}
Greedy checks (added): pair.working_dtype; per run `divergence` (null | "rounding" | "bug" |
"unclassified") and, when outputs differ, `mismatch` with the float32 evidence (float32_gap,
logit_magnitude, rounding_bound, reason); summary{bugs, rounding_divergences, unclassified,
rounding_divergence_rate} and the same counts per settings row. `mismatches` counts bugs only.
Sampled runs (temperature > 0) of mlxspec's modes are checked too (the same seed gives vanilla's
tokens); mlx-lm's sampled runs keep `matches_vanilla` null.
Warm-up (added): summary.engine_warmup_seconds (one `engine.warmup()`, shared by vanilla and every
speculative setting), summary.peer_warmup_seconds (mlx-lm's untimed runs), summary.warmup_seconds
(both), and per settings row `warmup_seconds` with `warmup` ("engine.warmup (shared)" | "untimed
runs"), none of it inside any timed run. The `curve` is the warm-up's V(j) (source "warm-up");
its `prior` is the path of the `mlxspec calibrate` file the cost models started from, or null.
Adapter (added): pair.adapter, the fine-tuned adapter on the target ({path, kind}) or null.
Sharding (added): pair.sharded, {ranks, how} for a target sharded over ranks (`--distributed`;
memory figures are rank 0's) or null.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from typing import Optional

from .. import __version__, blas
from ..device import describe as describe_device
from ..distributed import is_distributed
from ..files import write_atomic
from ..reference import dtype_name, working_dtype
from ..stats import plural
from .peer import PEER_NUM_DRAFT
from .runner import BenchResult, RunRecord, Setting
from .summary import label, setting_of, summarize

STDOUT = "-"  # `--json -` / `--csv -`: the data on stdout, the report on stderr


def device_line(device: dict) -> str:
    """"cpu AMD EPYC, OpenBLAS": the backend, the chip and, on the CPU, the BLAS its float32 matmuls
    use; on CUDA, whether attention ran without cuDNN (`device.adopt_attention`)."""
    text = f"{device['backend']} {device['name']}"
    if device["backend"] == "cpu" and device.get("blas"):
        text += f", {blas.label(device['blas'])}"
    if device.get("cudnn_attention") is False:
        text += ", attention without cuDNN"
    return text


def pair_info(engine, drafters) -> dict:
    """{"name", "target", "draft", "drafters", "working_dtype", "kv_cache", "adapter", "head", "head_note",
    "sharded"} from a loaded engine (loader attributes if present); kv_cache: its KV quantization
    (`--kv-bits`), None for full precision; adapter: the fine-tuned adapter on the target
    (`--adapter-path`: {"path", "kind"}), None for none; head: the EAGLE head's reference, None for
    none; head_note: how the adapter it was trained under differs from the target's, in words, None
    when they agree; sharded: {"ranks", "how"} for a target sharded over ranks (`--distributed`;
    memory figures are then rank 0's), None for one process."""
    t_info, d_info = getattr(engine, "target_info", None), getattr(engine, "draft_info", None)
    target = getattr(t_info, "ref", None) or type(engine.target_model).__module__.rsplit(".", 1)[-1]
    draft = None
    if engine.draft_model is not None:
        draft = getattr(d_info, "ref", None) or type(engine.draft_model).__module__.rsplit(".", 1)[-1]
    quant = getattr(engine, "kv_quant", None)
    return {"name": getattr(engine, "pair_name", None), "target": target, "draft": draft, "drafters": list(drafters),
            "working_dtype": dtype_name(working_dtype(engine.target_model)),
            "kv_cache": None if quant is None else {"bits": quant.bits, "group_size": quant.group_size,
                                                    "quantized_kv_start": quant.start},
            "adapter": ({"path": t_info.adapter, "kind": t_info.adapter_kind}
                        if getattr(t_info, "adapter", None) else None),
            "head": getattr(engine, "head_ref", None), "head_note": getattr(engine, "head_note", None),
            "sharded": ({"ranks": engine.coord.size, "how": getattr(t_info, "sharding", None)}
                        if is_distributed(engine) else None)}


def to_json(result: BenchResult, *, pair: dict, curve: Optional[dict] = None, prompts_source: str = "builtin") -> dict:
    """The full bench document (see the module docstring for the fixed keys)."""
    nums = list(dict.fromkeys(s.num_draft for s in result.settings if s.mode == "speculative"))
    trees = list(dict.fromkeys(s.tree for s in result.settings if s.mode == "speculative"))
    lookups = list(dict.fromkeys(s.lookup for s in result.settings if s.mode == "speculative"))
    return {
        "mlxspec_version": __version__,
        "device": describe_device(),
        "pair": pair,
        "settings": {
            "max_tokens": result.max_tokens, "temperature": result.temperatures[0],
            "temperatures": list(result.temperatures), "num_draft": nums, "tree": trees, "lookup": lookups,
            "seed": result.seed,
            "prompts": prompts_source, "prompt_count": len({r.prompt_id for r in result.runs}),
            "repeats": 1 + max((r.repeat for r in result.runs), default=0),
            "peer_num_draft": PEER_NUM_DRAFT if any(s.mode == "mlx-lm" for s in result.settings) else None,
            "timing": "tokens generated / seconds after prompt processing (same for every mode)",
        },
        "curve": curve,
        "runs": [r.as_dict() for r in result.runs],
        "summary": summarize(result),
    }


def write_json(doc: dict, path) -> None:
    """To `path`, or to stdout for "-"."""
    _write(path, json.dumps(doc, indent=2) + "\n")


def _write(path, text: str) -> None:
    if str(path) == STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write_atomic(path, text)  # an interrupted bench keeps the old file whole


CSV_COLUMNS = list(RunRecord.__dataclass_fields__)[:-1]  # every field but output_tokens


def write_csv(result: BenchResult, path) -> None:
    """One row per run; histogram and mismatch columns hold JSON."""
    out = io.StringIO(newline="")
    w = csv.DictWriter(out, fieldnames=CSV_COLUMNS)
    w.writeheader()
    for r in result.runs:
        d = r.as_dict()
        for k in ("accept_histogram", "k_histogram", "mismatch"):
            d[k] = json.dumps(d[k]) if d[k] is not None else ""
        w.writerow(d)
    _write(path, out.getvalue())


# -- terminal ------------------------------------------------------------------------------------
def _x(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _f(v: Optional[float], fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def _print_table(console, title: str, columns, rows, caption: str = None) -> None:
    """A table whose figures are never cut. A console too narrow for it whole gets its columns
    in several tables, each led by the first column, every column at least as wide as its longest
    word (a value's or its header's, which wraps between words) and the width left over shared
    by those that wrap: at 80 columns the one table had cut every figure to "1.…"."""
    from rich.table import Table
    from rich.text import Text

    cells = [[str(v) for v in row] for row in rows]
    plain = [[Text.from_markup(v).plain for v in row] for row in cells]
    natural = [max([len(columns[i])] + [len(row[i]) for row in plain]) for i in range(len(columns))]  # unwrapped
    fits = sum(n + 3 for n in natural) + 1 <= console.width  # +3 a column: its rule and padding
    # each column's least width: its longest word, the first column's whole values (never wrapped)
    need = [max([len(w) for row in plain for w in row[i].split()] + [len(w) for w in columns[i].split()]) + 3
            for i in range(len(columns))]
    need[0] = max([len(columns[0])] + [len(row[0]) for row in plain]) + 3
    groups, used = [[0]], need[0] + 1
    for i in range(1, len(columns)):
        if not fits and used + need[i] > console.width and len(groups[-1]) > 1:
            groups.append([0])
            used = need[0] + 1
        groups[-1].append(i)
        used += need[i]
    for n, group in enumerate(groups):
        # the console's width left over goes to the columns that wrap (histograms, headers), each as
        # much as it would use, or a share in proportion to that
        width = {i: need[i] - 3 for i in group}
        want = {i: max(0, natural[i] - width[i]) for i in group}
        slack = console.width - 1 - sum(need[i] for i in group)
        for i in group:
            width[i] += want[i] if sum(want.values()) <= slack else slack * want[i] // sum(want.values())
        t = Table(title=title + (f" ({n + 1} of {len(groups)})" if len(groups) > 1 else ""),
                  caption=caption if n == len(groups) - 1 else None)
        for i in group:
            t.add_column(columns[i], justify="left" if i == 0 else "right", no_wrap=i == 0,
                         width=None if fits else width[i])
        for row in cells:
            t.add_row(*(row[i] for i in group))
        console.print(t)


def print_report(doc: dict, console) -> None:
    """Headline, per-setting table, by-k table, per-category table and the V(j) curve."""
    s = doc["summary"]
    rows = s["settings"]
    many_t = len(doc["settings"]["temperatures"]) > 1

    _print_table(console, "Settings (medians over prompts; speedups pair by pair)",
                 ("setting", *(("temp",) if many_t else ()), "tok/s", "vs vanilla", "vs mlx-lm", "accept",
                  "tok/pass", "prefill s", "warm-up s", "peak MiB", "mismatch", "rounding"),
                 [(r["label"], *((f"{r['temperature']:g}",) if many_t else ()), _f(r["tokens_per_second"]),
                   _x(r["speedup_vs_vanilla"]), _x(r["speedup_vs_mlx_lm"]), _f(r["acceptance_rate"], "{:.0%}"),
                   _f(r["tokens_per_target_pass"], "{:.2f}"), _f(r["prompt_seconds"], "{:.3f}"),
                   _f(r.get("warmup_seconds"), "{:.2f}") + ("*" if (r.get("warmup") or "").startswith("engine") else ""),
                   f"{r['peak_memory_bytes'] / 2**20:.0f}",
                   f"[red]{r['mismatches']}[/red]" if r["mismatches"] else "0", str(r.get("rounding_divergences", 0)))
                  for r in rows])

    spec = [r for r in rows if r["mode"] != "vanilla"]
    if spec:
        lookups = any(r.get("lookup_rounds") for r in spec)  # a model drafter handed rounds to prompt lookup
        table = []
        for r in spec:
            name = "mlx-lm" if r["mode"] == "mlx-lm" else (
                r["drafter"] + ("" if r.get("tree", "auto") == "auto" else f" tree={r['tree']}")
                + (" lookup=off" if r.get("lookup") == "off" else ""))
            lk = (f"{r['lookup_rounds']} ({_f(r['lookup_acceptance'], '{:.0%}')})" if r.get("lookup_rounds") else "-",)
            table.append((name, r["num_draft"],
                          *((f"{r['temperature']:g}",) if many_t else ()), _f(r["acceptance_rate"], "{:.0%}"),
                          _f(r.get("judged_acceptance"), "{:.0%}"), _f(r["tokens_per_target_pass"], "{:.2f}"),
                          _x(r["speedup_vs_vanilla"]),
                          _x(r["speedup_vs_mlx_lm"]), *(lk if lookups else ()), _hist(r["k_histogram"]),
                          _hist(r["accept_histogram"])))
        _print_table(console, "Acceptance and speedup by draft length k",
                     ("drafter", "k", *(("temp",) if many_t else ()), "accept", "per token", "tok/pass", "vs vanilla",
                      "vs mlx-lm", *(("lookup rounds (accept)",) if lookups else ()), "chosen k (rounds)",
                      "accepted per round (rounds)"), table,
                     caption="accept: accepted / drafted, every round (the median of the runs' rates); per "
                             "token: of the drafter's own chain drafts the target judged, the fraction accepted "
                             "(tree and lookup rounds aside; pooled over the runs, as are lookup rounds' accept)")

    d = s["default_setting"]
    chain = label(Setting("speculative", d["drafter"], d["num_draft"], "off", d.get("lookup", "on")))
    shown = ["vanilla", label_of(d), chain, f"mlx-lm k={doc['settings']['peer_num_draft']}"]
    labels = [x for x in dict.fromkeys(shown)
              if s["by_category"] and x in next(iter(s["by_category"].values()))["tokens_per_second"]]
    vs_chain = s.get("speedup_vs_chain") is not None
    _print_table(console, f"By category (temperature {d['temperature']:g}; speedups of {label_of(d)})",
                 ("category", "prompts", *(f"{x} tok/s" for x in labels), "vs vanilla",
                  *(("vs chain",) if vs_chain else ()), "vs mlx-lm"),
                 [(cat, str(e.get("prompts", "")), *(_f(e["tokens_per_second"][x]) for x in labels),
                   _x(e["speedup_vs_vanilla"]),
                   *((_x(e["speedup_vs_chain"]),) if vs_chain else ()), _x(e["speedup_vs_mlx_lm"]))
                  for cat, e in s["by_category"].items()])
    if doc["settings"].get("repeats", 1) == 1 and any(e.get("prompts") == 1 for e in s["by_category"].values()):
        console.print("a category of one prompt, timed once, moves with this machine's noise from run to run "
                      "(--full: four prompts each; --repeats N: each run N times)")

    curve = doc.get("curve")
    if curve and curve.get("ratios"):
        pts = "  ".join(f"{j}:{r:.2f}" for j, r in sorted(curve["ratios"].items(), key=lambda kv: int(kv[0])))
        console.print(f"verify cost V(j)/V(1) ({curve['source']}): {pts}")
    else:
        console.print("verify cost V(j)/V(1): none (the cost model's default slope)")

    head = (f"[bold]{label_of(d)}" + (f" at T={d['temperature']:g}" if many_t else "")
            + f": {_x(s['speedup_vs_vanilla'])} vanilla"
            + (f", {_x(s['speedup_vs_chain'])} chain" if s.get("speedup_vs_chain") is not None else "")
            + (f", {_x(s['speedup_vs_mlx_lm'])} mlx-lm" if s["speedup_vs_mlx_lm"] is not None else "")
            + f"[/bold] (median of per-prompt ratios, {plural(doc['settings']['prompt_count'], 'prompt')}"
            + (f" x {doc['settings']['repeats']} passes" if doc['settings'].get('repeats', 1) > 1 else "") + ", "
            f"{doc['settings']['max_tokens']} tokens, {device_line(doc['device'])}"
            + (f"; the target sharded over {doc['pair']['sharded']['ranks']} ranks, memory figures rank 0's"
               if (doc.get("pair") or {}).get("sharded") else "") + ")")
    console.print(head)
    spread = interval_line(doc)
    if spread:
        console.print(spread)
    if doc["device"]["backend"] == "cpu" and doc["device"].get("blas") == "reference":
        console.print("[yellow]MLX's bundled reference BLAS ran the CPU's matmuls: with a system OpenBLAS "
                      "(e.g. `apt install libopenblas0`) mlxspec uses it and float32, about 2x faster and "
                      "with cheaper verify passes (README, \"Linux CPUs\")[/yellow]")
    if s.get("engine_warmup_seconds") is not None:
        console.print(f"warm-up (untimed, before any timed run): *engine.warmup() {s['engine_warmup_seconds']:.1f} s, "
                      "shared by vanilla and every speculative setting"
                      + (f"; mlx-lm's untimed runs {s['peer_warmup_seconds']:.1f} s"
                         if s.get("peer_warmup_seconds") is not None else ""))
    if s["mismatches"]:
        console.print(f"[bold red]{s['mismatches']} output(s) differ from vanilla beyond a near-tie: "
                      "a faster but different output is a bug, not a result.[/bold red]")
    temps = doc["settings"]["temperatures"]
    if 0 in temps:
        console.print(greedy_line(doc))
    if any(t > 0 for t in temps):
        console.print(greedy_line(doc, sampled=True))
    for line in rounding_lines(doc):
        console.print(line)


def interval_line(doc: dict) -> Optional[str]:
    """How far the headline's medians can be trusted: their sign-test intervals over the prompts."""
    s = doc["summary"]
    parts = [f"{iv[0]:.2f}-{iv[1]:.2f}x {name}" for name, iv in
             (("vanilla", s.get("speedup_vs_vanilla_interval")), ("mlx-lm", s.get("speedup_vs_mlx_lm_interval")))
             if iv]
    if not parts:
        return None
    cover = s.get("speedup_vs_vanilla_interval") or s.get("speedup_vs_mlx_lm_interval")
    n = doc["settings"]["prompt_count"]
    return (f"its {cover[2]:.0%} interval, for prompts like these (sign test over the {n} prompts, each once): "
            + ", ".join(parts))


def greedy_line(doc: dict, sampled: bool = False) -> str:
    """The counted line of greedy checks (or, `sampled`, of the seeded sampled runs' checks):
    identical, rounding divergences, bugs (and unclassified)."""
    runs = [r for r in doc["runs"] if r["mode"] != "vanilla" and (r["temperature"] > 0) == sampled
            and (r["matches_vanilla"] is not None or r.get("divergence"))]
    count = lambda kind: sum(1 for r in runs if r.get("divergence") == kind)  # noqa: E731
    identical = sum(1 for r in runs if r["matches_vanilla"] is True and not r.get("divergence"))
    dtype = doc["pair"].get("working_dtype") or "?"
    kv = doc["pair"].get("kv_cache")
    ref = ("the target fed in several shapes as reference: its KV cache is "
           f"{kv['bits']}-bit from {kv['quantized_kv_start']} tokens") if kv else "float32 reference"
    # (mlx-lm samples otherwise: its sampled runs are not counted)
    what = f"sampled checks vs vanilla (seed {doc['settings'].get('seed')}, " if sampled else "greedy checks vs vanilla ("
    rate = None if sampled else doc["summary"].get("rounding_divergence_rate")
    line = (f"{what}{dtype}, {ref}): {identical} identical, {count('rounding')} rounding divergence(s)"
            + (f" ({rate * 1000:.2f} per 1000 tokens)" if rate else "") + f", {count('bug')} bug(s)")
    if count("unclassified"):
        line += f", [yellow]{count('unclassified')} unclassified (no float32 reference; see --json)[/yellow]"
    return line


def rounding_lines(doc: dict, most: int = 10) -> list:
    """One calm line per rounding divergence (the first `most`): where, and the float32 evidence."""
    found = [r for r in doc["runs"] if r.get("divergence") == "rounding"]
    def name(r: dict) -> str:
        return label(Setting(r["mode"], r["drafter"], r["num_draft"], r.get("tree", "auto"), r.get("lookup", "on")))

    lines = [f"[dim]  rounding: {r['prompt_id']} {name(r)} at token {r['mismatch']['position']}: "
             f"{r['mismatch']['reason']}[/dim]" for r in found[:most]]
    if len(found) > most:
        lines.append(f"[dim]  ... and {len(found) - most} more (--json has them all)[/dim]")
    return lines


def label_of(d: dict) -> str:
    """Display label of the summary's default_setting {"drafter", "num_draft", ...}."""
    return label(Setting("speculative", d["drafter"], d["num_draft"], d.get("tree", "auto"), d.get("lookup", "on")))


def _hist(h: dict) -> str:
    return " ".join(f"{k}:{v}" for k, v in h.items()) or "-"


def mismatch_line(r: RunRecord) -> str:
    """The one-line report of a greedy mismatch that is not rounding (rich markup): loud for a bug."""
    m = r.mismatch or {}
    gap = m.get("logprob_gap")
    where = (f"{r.prompt_id} {label(setting_of(r))}: token {m.get('position')} is {m.get('text')!r} where "
             f"vanilla has {m.get('vanilla_text')!r}")
    if r.divergence == "unclassified":
        return f"[yellow]UNCLASSIFIED {where} ({m.get('reason')})[/yellow]"
    return (f"[bold red]MISMATCH[/bold red] [red]{where}"
            + (f" (log-prob gap {gap:.4f}, not a near-tie: {m.get('reason')})" if gap is not None
               else " (outputs end differently)") + "[/red]")


def report_console(stderr: bool = False):
    """stdout console (stderr's when stdout carries `--json -`); piped output (not a terminal) gets
    140 columns so tables are not cut."""
    from rich.console import Console

    console = Console(stderr=stderr)
    # soft_wrap: a long line stays one line in a file (wrapped at 140 it broke inside a value)
    return console if console.is_terminal else Console(width=140, soft_wrap=True, stderr=stderr)
