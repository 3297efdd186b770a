"""`mlxspec bench --synthetic SHAPE`: the loop's speed on a named shape with random weights.

What it measures, side by side in one process, interleaved, after warming every shape:
  - V(j), the target's pass over j = 1..16 tokens (as `Engine.warmup` times it);
  - plain decoding through `Engine` against mlx-lm's `generate_step`, and the engine's host
    time per round (time not spent waiting for the device; not on a CPU, where a pass runs
    while it is enqueued);
  - with `--synthetic-draft`, speculation at a fixed k = 3 against mlx-lm's speculative decoding
    with the same draft and k (greedy, so both verify the very same drafts: only the loops
    differ), and the cost model's own choice;
  - the n-gram drafter at automatic k.
Acceptance on random weights means nothing (the text is noise): these runs compare loops.
Every figure is tokens generated / seconds after prompt processing, for every side.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, List, Optional

import mlx.core as mx

from .peer import mlx_lm_cannot_trim
from .synthetic import DRAFT_FOR, SHAPES, build, describe

PEER_K = 3  # the draft length both speculative loops use in the like-for-like comparison


def _prompt(vocab: int, n: int) -> List[int]:
    return [(17 + 31 * i) % vocab for i in range(n)]


def _prefill(models, ids: List[int]):
    """mlx-lm caches holding ids[:-1] for each model (the peers' prompt processing, untimed)."""
    from mlx_lm.models.cache import make_prompt_cache

    caches = []
    for m in models:
        c = make_prompt_cache(m)
        if len(ids) > 1:
            m(mx.array(ids[:-1], dtype=mx.uint32)[None], cache=c)
            mx.eval([x.state for x in c])
        caches.append(c)
    return caches


def peer_plain(model, ids: List[int], n: int) -> Dict:
    from mlx_lm.generate import generate_step

    (cache,) = _prefill([model], ids)
    t0 = time.perf_counter()
    count = sum(1 for _ in generate_step(mx.array(ids[-1:], dtype=mx.uint32), model, max_tokens=n, prompt_cache=cache))
    return {"tokens_per_second": count / (time.perf_counter() - t0)}


def peer_speculative(model, draft, ids: List[int], n: int, k: int) -> Dict:
    from mlx_lm.generate import speculative_generate_step

    tc, dc = _prefill([model, draft], ids)
    t0 = time.perf_counter()
    count = sum(1 for _ in speculative_generate_step(mx.array(ids[-1:], dtype=mx.uint32), model, draft,
                                                     num_draft_tokens=k, max_tokens=n, prompt_cache=tc + dc))
    return {"tokens_per_second": count / (time.perf_counter() - t0)}


def engine_run(engine, ids: List[int], n: int, **kw) -> Dict:
    from ..device import backend

    engine.reset()
    s = engine.generate(ids, max_tokens=n, **kw).stats
    # On MLX's CPU backend a pass runs while it is enqueued: the loop's own time cannot be told
    # from the passes' there, so the figure is left out rather than printed as the loop's.
    host = None if backend() == "cpu" else 1e3 * s.host_seconds_per_round
    return {"tokens_per_second": s.tokens_per_second, "host_ms_per_round": host,
            "acceptance_rate": s.acceptance_rate if s.drafted else None,  # a rate of nothing is not 0 %
            "tokens_per_target_pass": s.tokens_per_target_pass}


def run_synthetic(target: str, draft: Optional[str] = None, *, max_tokens: int = 128, prompt_tokens: int = 128,
                  repeats: int = 5, progress: Optional[Callable[[str], None]] = None) -> Dict:
    """Build the shapes, warm up, run every setting `repeats` times interleaved; returns the figures.

    Args:
        target: a name from `synthetic.SHAPES`.
        draft: a shape for the draft model, or None (n-gram and plain decoding only).
        max_tokens: tokens per run. Default 128.
        prompt_tokens: prompt length. Default 128.
        repeats: interleaved repetitions (medians reported). Default 5.
        progress: called with a short label before each step (a status line).
    """
    from ..device import describe as device
    from ..engine import Engine

    say = progress or (lambda _: None)
    say(f"building {target}")
    t_model = build(target)
    vocab = SHAPES[target]["vocab_size"]
    d_model = None
    if draft:
        say(f"building {draft}")
        d_model = build(draft, vocab_size=vocab, seed=1)
    engine = Engine(t_model, None, d_model, drafter="model" if d_model is not None else "ngram")
    say("warming up (every pass length compiles once)")
    warm = engine.warmup()
    ids = _prompt(vocab, prompt_tokens)
    n = max_tokens

    settings: Dict[str, Callable[[], Dict]] = {
        "engine plain": lambda: engine_run(engine, ids, n, speculative=False),
        "mlx-lm generate_step": lambda: peer_plain(t_model, ids, n),
        "engine ngram k=auto": lambda: engine_run(engine, ids, n, drafter="ngram"),
    }
    # mlx-lm's speculative decoding cannot trim a sliding window once it has wrapped (gpt-oss's)
    no_peer = mlx_lm_cannot_trim(t_model, d_model, prompt_tokens + n + PEER_K + 1) if d_model is not None else None
    if d_model is not None:
        settings[f"engine model k={PEER_K}"] = lambda: engine_run(engine, ids, n, drafter="model", num_draft=PEER_K)
        if no_peer is None:
            settings[f"mlx-lm speculative k={PEER_K}"] = lambda: peer_speculative(t_model, d_model, ids, n, PEER_K)
        settings["engine model k=auto"] = lambda: engine_run(engine, ids, n, drafter="model")
    runs: Dict[str, List[Dict]] = {name: [] for name in settings}
    t_warm_peers = time.perf_counter()
    for name, fn in settings.items():  # each setting once, untimed: the peers compile here too
        say(f"warm-up: {name}")
        fn()
    peer_warmup = time.perf_counter() - t_warm_peers
    for r in range(repeats):
        for name, fn in settings.items():
            say(f"repeat {r + 1}/{repeats}: {name}")
            runs[name].append(fn())

    def med(name, key="tokens_per_second"):
        vals = [x[key] for x in runs[name] if x.get(key) is not None]
        return statistics.median(vals) if vals else None

    def ratio(a, b):
        return statistics.median(x["tokens_per_second"] / y["tokens_per_second"] for x, y in zip(runs[a], runs[b]))

    rows = {name: {"tokens_per_second": med(name), "host_ms_per_round": med(name, "host_ms_per_round"),
                   "acceptance_rate": med(name, "acceptance_rate"),
                   "tokens_per_target_pass": med(name, "tokens_per_target_pass")} for name in runs}
    ratios = {"engine plain / generate_step": ratio("engine plain", "mlx-lm generate_step")}
    if d_model is not None:
        if no_peer is None:
            ratios[f"engine model k={PEER_K} / mlx-lm speculative k={PEER_K}"] = ratio(
                f"engine model k={PEER_K}", f"mlx-lm speculative k={PEER_K}")
        ratios["engine model k=auto / engine plain"] = ratio("engine model k=auto", "engine plain")
    ratios["engine ngram k=auto / engine plain"] = ratio("engine ngram k=auto", "engine plain")
    return {
        "target": describe(target), "draft": describe(draft) if draft else None, "device": device(),
        "max_tokens": n, "prompt_tokens": prompt_tokens, "repeats": repeats,
        "warmup_seconds": warm["seconds"], "peer_warmup_seconds": peer_warmup,
        "curve_ms": {str(j): 1e3 * s for j, s in sorted(warm["curve"].items())},
        "plain_step_ms": 1e3 * warm["plain"] if warm["plain"] else None,
        "settings": rows, "ratios": ratios,
        "note": "random weights: acceptance and tokens per pass mean nothing; compare loop speed only"
                + (f"; mlx-lm's speculative decoding is left out: {no_peer}" if no_peer else ""),
    }


def print_synthetic(doc: Dict, console) -> None:
    from rich.table import Table

    console.print(f"[bold]synthetic[/bold] {doc['target']}" + (f", draft {doc['draft']}" if doc["draft"] else "")
                  + f" on {doc['device']['backend']} {doc['device']['name']}")
    console.print(f"[yellow]{doc['note']}[/yellow]")
    curve = "  ".join(f"{j}:{ms:.2f}" for j, ms in doc["curve_ms"].items())
    console.print(f"V(j) in ms: {curve}")
    if doc["plain_step_ms"]:
        console.print(f"pipelined plain step: {doc['plain_step_ms']:.2f} ms")
    t = Table(title=f"{doc['max_tokens']} tokens, {doc['prompt_tokens']}-token prompt, medians of {doc['repeats']} "
                    "interleaved runs")
    for col in ("setting", "tok/s", "host ms/round", "accept", "tok/pass"):
        t.add_column(col, justify="left" if col == "setting" else "right")
    for name, r in doc["settings"].items():
        t.add_row(name, f"{r['tokens_per_second']:.1f}",
                  "-" if r["host_ms_per_round"] is None else f"{r['host_ms_per_round']:.3f}",
                  "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.0%}",
                  "-" if r["tokens_per_target_pass"] is None else f"{r['tokens_per_target_pass']:.2f}")
    console.print(t)
    for name, v in doc["ratios"].items():
        console.print(f"{name}: [bold]{v:.3f}[/bold]")
    console.print(f"warm-up {doc['warmup_seconds']:.1f} s (engine), {doc['peer_warmup_seconds']:.1f} s "
                  "(one untimed run of every setting); neither is in any figure above")


def default_draft(target: str) -> Optional[str]:
    return DRAFT_FOR.get(target)
