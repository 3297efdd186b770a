"""Medians and speedups from bench records.

Speedups are computed pair by pair: a speculative run's tokens/s divided by the vanilla
(or mlx-lm) run's on the same prompt at the same temperature (and in the same pass over the
suite, with repeats), then the median over prompts (and passes). That cancels per-prompt
differences (length, EOS) that a ratio of medians keeps.
"""

from __future__ import annotations

import statistics
from typing import Dict, Iterable, List, Optional

from .interval import median_interval, per_prompt, ratio_interval
from .runner import BenchResult, RunRecord, Setting


def median(xs: Iterable[float]) -> Optional[float]:
    xs = list(xs)
    return statistics.median(xs) if xs else None


def setting_of(r: RunRecord) -> Setting:
    return Setting(r.mode, r.drafter, r.num_draft, r.tree, r.lookup)


def label(s: Setting) -> str:
    """Short display name: "vanilla", "ngram k=auto", "ngram k=auto tree=off", "eagle k=auto lookup=off",
    "mlx-lm k=3"."""
    if s.mode == "vanilla":
        return "vanilla"
    if s.mode == "mlx-lm":
        return f"mlx-lm k={s.num_draft}"
    return (f"{s.drafter} k={s.num_draft}" + ("" if s.tree == "auto" else f" tree={s.tree}")
            + ("" if s.lookup == "on" else f" lookup={s.lookup}"))


def chain_of(result: BenchResult, s: Setting) -> Optional[Setting]:
    """The chains-only twin of a tree setting, when the bench ran it."""
    twin = Setting(s.mode, s.drafter, s.num_draft, "off", s.lookup)
    return twin if s.tree != "off" and twin in result.settings else None


def pair_ratios(result: BenchResult, s: Setting, base: Setting, *, category: Optional[str] = None,
                temperature: Optional[float] = None) -> List[float]:
    """Per-prompt tokens/s ratios of setting `s` over setting `base` on the same prompt (`_key`)."""
    ref = {_key(r): r for r in result.runs if setting_of(r) == base}
    return [x for _, x in _ratios_over(result, s, ref, category, temperature)]


def _key(r: RunRecord) -> tuple:
    """What pairs two runs: the same prompt, temperature and pass over the suite."""
    return r.prompt_id, r.temperature, r.repeat


def _ratios_over(result: BenchResult, s: Setting, ref: Dict[tuple, RunRecord],
                 category: Optional[str], temperature: Optional[float]) -> List[tuple]:
    """(prompt id, ratio) per run of setting `s` that has a reference run."""
    out = []
    for r in result.runs:
        if setting_of(r) != s or (category is not None and r.category != category):
            continue
        if temperature is not None and r.temperature != temperature:
            continue
        b = ref.get(_key(r))
        if b is not None and b.tokens_per_second > 0:
            out.append((r.prompt_id, r.tokens_per_second / b.tokens_per_second))
    return out


def _by_key(runs: List[RunRecord], mode: str) -> Dict[tuple, RunRecord]:
    return {_key(r): r for r in runs if r.mode == mode}


def ratios(result: BenchResult, s: Setting, baseline_mode: str, *, category: Optional[str] = None,
           temperature: Optional[float] = None) -> List[float]:
    """Per-prompt tokens/s ratios of setting `s` over the baseline mode's run on the same prompt (`_key`)."""
    return [x for _, x in _ratios_over(result, s, _by_key(result.runs, baseline_mode), category, temperature)]


def speedup_interval(result: BenchResult, s: Setting, baseline_mode: str, *,
                     temperature: Optional[float] = None) -> Optional[list]:
    """[low, high, coverage]: the sign-test interval of the median per-prompt speedup over
    `baseline_mode` (`interval.median_interval`), or None under 2 prompts."""
    iv = median_interval(per_prompt(_ratios_over(result, s, _by_key(result.runs, baseline_mode), None, temperature)))
    return list(iv) if iv else None


def setting_rows(result: BenchResult) -> List[dict]:
    """One row per (setting, temperature): medians of every figure and the pairwise speedups."""
    has_peer = any(r.mode == "mlx-lm" for r in result.runs)
    rows = []
    for t in result.temperatures:
        for s in result.settings:
            runs = [r for r in result.runs if setting_of(r) == s and r.temperature == t]
            if not runs:
                continue
            k_hist: Dict[str, int] = {}
            acc_hist: Dict[str, int] = {}
            for r in runs:
                for k, v in r.k_histogram.items():
                    k_hist[k] = k_hist.get(k, 0) + v
                for k, v in r.accept_histogram.items():
                    acc_hist[k] = acc_hist.get(k, 0) + v
            vs_peer = median(ratios(result, s, "mlx-lm", temperature=t)) if has_peer and s.mode != "mlx-lm" else None
            chain = chain_of(result, s)
            rows.append({
                "mode": s.mode, "drafter": s.drafter, "num_draft": s.num_draft, "tree": s.tree, "temperature": t,
                "label": label(s),
                "runs": len(runs),
                "tokens_per_second": median(r.tokens_per_second for r in runs),
                "prompt_seconds": median(r.prompt_seconds for r in runs),
                "acceptance_rate": median(r.acceptance_rate for r in runs) if s.mode != "vanilla" else None,
                "tokens_per_target_pass": median(r.tokens_per_target_pass for r in runs),
                # pooled over the runs: of the drafter's own chain drafts the target judged, those accepted
                "judged_acceptance": (sum(map(sum, (r.step_accepted for r in runs))) / sum(map(sum, (r.step_reached for r in runs)))
                                      if any(r.step_reached for r in runs) else None),
                "judged_acceptance_interval": judged_interval(runs),
                "peak_memory_bytes": max(r.peak_memory_bytes for r in runs),
                "speedup_vs_vanilla": median(ratios(result, s, "vanilla", temperature=t)) if s.mode != "vanilla" else None,
                "speedup_vs_vanilla_interval": speedup_interval(result, s, "vanilla", temperature=t)
                if s.mode != "vanilla" else None,
                "speedup_vs_mlx_lm": vs_peer,
                "speedup_vs_chain": median(pair_ratios(result, s, chain, temperature=t)) if chain else None,
                "tree_rounds": sum(r.tree_rounds for r in runs),
                "lookup": s.lookup,
                "lookup_rounds": sum(r.lookup_rounds for r in runs),
                "lookup_acceptance": (sum(r.lookup_accepted for r in runs) / sum(r.lookup_drafted for r in runs)
                                      if any(r.lookup_drafted for r in runs) else None),
                "k_histogram": dict(sorted(k_hist.items(), key=lambda kv: int(kv[0]))),
                "accept_histogram": dict(sorted(acc_hist.items(), key=lambda kv: int(kv[0]))),
                **divergence_counts(runs),
                "warmup_seconds": result.warmup_seconds(s, t),
                "warmup": None if result.warmup_seconds(s, t) is None else
                "untimed runs" if s.mode == "mlx-lm" else "engine.warmup (shared)",
            })
    return rows


def judged_interval(runs: List[RunRecord]) -> Optional[list]:
    """95 % bootstrap interval of the pooled per-token acceptance, resampling prompts (a prompt's
    repeats pooled into one), or None when nothing was judged."""
    clusters: Dict[str, list] = {}
    for r in runs:
        c = clusters.setdefault(r.prompt_id, [0, 0])
        c[0] += sum(r.step_accepted)
        c[1] += sum(r.step_reached)
    if not any(d for _, d in clusters.values()):
        return None
    iv = ratio_interval([tuple(c) for c in clusters.values()])
    return list(iv) if iv else None


def divergence_counts(runs: List[RunRecord]) -> dict:
    """Divergences from vanilla by kind (greedy and seeded sampled runs); `mismatches` counts the bugs
    (what fails `--check`)."""
    bugs = sum(1 for r in runs if r.divergence == "bug")
    return {"mismatches": bugs, "bugs": bugs,
            "rounding_divergences": sum(1 for r in runs if r.divergence == "rounding"),
            "unclassified": sum(1 for r in runs if r.divergence == "unclassified")}


def rounding_divergence_rate(runs: List[RunRecord]) -> Optional[float]:
    """Rounding divergences per greedy token compared with vanilla, or None if nothing was compared.

    A run counts its tokens up to and including its first divergence (after it nothing is
    comparable), so this estimates the chance that a given token flips by rounding.
    """
    compared = [r for r in runs if r.mode != "vanilla" and r.matches_vanilla is not None and r.temperature == 0]
    tokens = sum(r.mismatch["position"] + 1 if r.mismatch else r.tokens for r in compared)
    return sum(1 for r in compared if r.divergence == "rounding") / tokens if tokens else None


def summarize(result: BenchResult) -> dict:
    """The JSON `summary`: default-setting speedups overall and per category, divergences, and tables."""
    s, t0 = result.default_setting, result.temperatures[0]
    has_peer = any(r.mode == "mlx-lm" for r in result.runs)

    chain = chain_of(result, s)

    def intervals() -> dict:
        """Overall only: a category's one to four prompts say little."""
        return {"speedup_vs_vanilla_interval": speedup_interval(result, s, "vanilla", temperature=t0),
                "speedup_vs_mlx_lm_interval": speedup_interval(result, s, "mlx-lm", temperature=t0) if has_peer else None}

    def speedups(category=None) -> dict:
        return {
            "speedup_vs_vanilla": median(ratios(result, s, "vanilla", category=category, temperature=t0)),
            "speedup_vs_mlx_lm": median(ratios(result, s, "mlx-lm", category=category, temperature=t0)) if has_peer else None,
            "speedup_vs_chain": median(pair_ratios(result, s, chain, category=category, temperature=t0)) if chain else None,
        }

    categories = list(dict.fromkeys(r.category for r in result.runs))
    by_category = {}
    for c in categories:
        entry = speedups(c)
        entry["tokens_per_second"] = {
            label(x): median(r.tokens_per_second for r in result.runs
                             if r.category == c and setting_of(r) == x and r.temperature == t0)
            for x in result.settings}
        entry["prompts"] = len({r.prompt_id for r in result.runs if r.category == c})
        by_category[c] = entry
    return {
        **speedups(),
        **intervals(),
        "by_category": by_category,
        **divergence_counts(result.runs),
        "near_ties": sum(1 for r in result.runs if r.mismatch and r.mismatch.get("near_tie")),  # = rounding
        "rounding_divergence_rate": rounding_divergence_rate(result.runs),
        "engine_warmup_seconds": result.engine_warmup_seconds,
        "peer_warmup_seconds": sum(result.peer_warmup_seconds.values()) if result.peer_warmup_seconds else None,
        "warmup_seconds": None if result.engine_warmup_seconds is None else
        result.engine_warmup_seconds + sum(result.peer_warmup_seconds.values()),
        "default_setting": {"drafter": s.drafter, "num_draft": s.num_draft, "temperature": t0,
                            **({"tree": s.tree} if s.tree != "auto" else {}),
                            **({"lookup": s.lookup} if s.lookup != "on" else {})},
        "settings": setting_rows(result),
    }
