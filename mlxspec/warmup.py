"""Engine warm-up: run every shape the loop may use once, and time the target's passes.

On a GPU the first pass of each new shape compiles kernels (MLX's CUDA backend JIT-compiles
them; Metal builds pipelines), which takes far longer than the pass itself. A timed run
that pays for it measures the compiler, and a cost model that learns from it learns a
stall. `warm_up` runs, on a short synthetic prefix: target passes of 1..max_j tokens
(greedy and each sampling temperature asked for), pipelined plain steps, tree passes of
2..max_j tokens (when the engine drafts trees), and for each model drafter its catch-up
chunks, draft steps and tree drafts, then leaves the caches empty. The chain passes are
timed after their first (compiling) run, and those timings seed the engine's cost model,
so it starts from this device's real verify curve. On a GPU the loop then keeps every
round within the passes warmed (`longest_draft`).
"""

from __future__ import annotations

import time
from typing import Dict, Iterable, Optional

import mlx.core as mx

from .device import is_gpu
from .drafters import Draft, EagleDrafter, ModelDrafter, chaincopy
from .drafters.eagle import FEED_WHOLE
from .modelmeta import logit_width
from .prompts import MAX_DRAFT
from .rounds import plain_step, read, tree_round, verify_round
from .sampling import SamplingParams

PREFIX = 32  # tokens of synthetic context before the timed passes
CATCH_UP = (1, 2, 4, 8, 16, 32, 64, 128)  # a model drafter's catch-up chunk sizes (see ModelDrafter)
PLAIN_STEPS = 12  # pipelined plain steps timed


def default_max_j() -> int:
    """16 on a GPU (verify passes are nearly flat there); 8 on the CPU, where they grow steeply."""
    return 16 if is_gpu() else 8


def longest_draft(engine) -> int:
    """Most drafts (a chain's tokens or a tree's nodes) a round the cost model sizes may verify.

    On a GPU, a pass longer than warm-up ran compiles kernels mid-generation (on an H200 one
    64-token reply took 14 s instead of about 0.35, most likely so: its one tree of 18 nodes was
    longer than the 16-token passes warmed): there rounds stay within what `warm_up` ran.
    Never more than MAX_DRAFT (the caches' rollback room), which is the bound elsewhere and
    before any warm-up."""
    j = engine.warmed_passes
    return MAX_DRAFT if j is None or not is_gpu() else min(max(j - 1, 0), MAX_DRAFT)


def warm_up(engine, *, max_j: Optional[int] = None, temperatures: Iterable[float] = (0.0,),
            repeats: Optional[int] = None) -> Dict:
    """Warm every shape and seed the cost model; returns {"seconds", "curve", "plain"}.

    Args:
        engine: the `Engine`.
        max_j: longest target pass (tokens). Default: `default_max_j()`.
        temperatures: sampling settings whose kernels to warm too. Default (0.0,) (greedy).
        repeats: runs of each pass; all but the first are timed. Default 3: two timings of each
            length, so one slow one (a 2-core CPU's other work) does not bend the curve, as a
            single timing of V(1) at about 1.5x did in one bench (V(2) then printed at 0.76 of it).
    """
    t0 = time.perf_counter()
    max_j = max_j or default_max_j()
    repeats = repeats or 3
    engine.reset()
    target = engine.target
    V = logit_width(engine.target_model)
    ids = [(17 + 31 * i) % V for i in range(PREFIX + max_j)]
    target.prefill(ids[: PREFIX - 1])
    engine.curve.at_context(PREFIX)  # its timings are of passes after PREFIX positions
    last = ids[PREFIX - 1]
    drafts = ids[PREFIX : PREFIX + max_j]
    seed = 0
    curve: Dict[int, float] = {}
    for temp in dict.fromkeys(float(t) for t in temperatures):
        params = SamplingParams(temperature=temp)
        for rep in range(repeats):
            for j in range(1, max_j + 1):
                t = time.perf_counter()
                if j == 1:
                    p = plain_step(target, last, params, seed, PREFIX)
                else:
                    p = verify_round(target, last, Draft(drafts[: j - 1]), params, seed, PREFIX)
                read(p)
                dt = time.perf_counter() - t
                target.rollback(p.fed)
                if rep and temp == 0.0:
                    engine.curve.observe(j, dt, trusted=True)
                    curve[j] = min(dt, curve.get(j, dt))
        plain = _time_plain_steps(engine, last, params, seed)
        if engine.tree and not engine.coord.active:  # sharded targets verify chains only
            _warm_trees(engine, last, drafts, params, seed, max_j)
        for name, drafter in engine.drafters.items():
            if isinstance(drafter, ModelDrafter):
                _warm_drafter(engine, name, drafter, ids, params, seed, max_j, timed=temp == 0.0)
            elif isinstance(drafter, EagleDrafter):
                _warm_eagle(engine, name, drafter, ids, params, seed, max_j, timed=temp == 0.0)
    engine.reset()
    engine.warmed_passes = max_j
    return {"seconds": time.perf_counter() - t0, "curve": curve, "plain": plain}


def _tree_parents(n: int) -> list:
    """A tree of n nodes with a side branch at the root: two interleaved chains."""
    return [-1] + [max(i - 2, -1) for i in range(1, n)]


def _warm_trees(engine, last: int, drafts, params: SamplingParams, seed: int, max_j: int) -> None:
    """Tree passes of 2..max_j fed tokens, untimed: a tree pass has kernels of its own (an
    ancestor mask, one RoPE offset per row), compiled on a GPU per row count. Each is committed
    along its second branch, whose rows move next to the root: those gathers are kernels of
    their own too (on an H100 the first reply with lookup rounds, which keep such trees, took
    3.8-8 s for 64 tokens in three processes; with these warmed, 0.23 s)."""
    target = engine.target
    for j in range(2, max_j + 1):
        p = tree_round(target, last, Draft(drafts[: j - 1], parents=_tree_parents(j - 1)), params, seed, PREFIX)
        read(p)
        target.keep_path(p.start, list(range(1, j - 1, 2)))  # [] for a lone node: trimmed only
        engine.materialize()
        target.rollback(len(target.tokens) - p.start)


def _time_plain_steps(engine, last: int, params: SamplingParams, seed: int) -> Optional[float]:
    """Pipelined plain steps, as the loop runs them; returns the median period (seconds per token)."""
    target = engine.target
    start = len(target.tokens)
    p = plain_step(target, last, params, seed, PREFIX)
    periods = []
    t_prev = time.perf_counter()
    for i in range(PLAIN_STEPS):
        q = plain_step(target, p.token, params, seed, PREFIX + i + 1)
        new = read(p)[0]
        target.settle(q.start, new)
        now = time.perf_counter()
        if i >= 2:  # the first periods include the chain's start
            periods.append(now - t_prev)
            if params.greedy:
                engine.curve.observe_plain(now - t_prev)
        t_prev = now
        p = q
    read(p)
    target.rollback(len(target.tokens) - start)
    periods.sort()
    return periods[len(periods) // 2] if periods else None


def _warm_drafter(engine, name: str, drafter: ModelDrafter, ids, params: SamplingParams, seed: int, max_j: int,
                  *, timed: bool) -> None:
    """Catch-up chunks and draft steps of a model drafter; times a drafted token."""
    drafter.reset()
    for n in CATCH_UP:
        if n + 1 > len(ids):
            break
        drafter.reset()
        drafter.catch_up(ids[: n + 1])
    drafter.reset()
    if params.greedy:  # (its top token is int32, as in `ModelDrafter._draft`)
        _warm_copy_step(mx.zeros((drafter.target_vocab,), mx.float32), mx.array(0, dtype=mx.int32))
    _time_drafts(engine, name, drafter, ids, params, seed, max_j, timed=timed)
    _warm_tree_drafts(engine, drafter, ids, params, seed)


def _warm_copy_step(logits: mx.array, top: mx.array) -> None:
    """A greedy chain's copy step (`chaincopy.blend`, compiled per width of the drafter's (N,)
    logits and its top token's dtype): the synthetic prefix never repeats, so no warm-up draft copies."""
    mx.eval(chaincopy.blend(top, logits, 0, chaincopy.MIN_COPY, mx.array(True)))


def _warm_tree_drafts(engine, drafter, ids, params: SamplingParams, seed: int) -> None:
    """A model drafter's trees, untimed: fixed-shape ones (on the device; sampled too, their
    runners-up from `sampling.sample_race_two`) and, greedy, read ones."""
    if not (engine.tree and not engine.coord.active and hasattr(drafter, "propose_static_tree")):
        return
    drafter.propose_static_tree(ids[:PREFIX], 2, 1, params, seed).tokens.tolist()
    if params.greedy:
        drafter.propose_tree(ids[:PREFIX], 2, 4, params, seed)
    drafter.reset()


def _time_drafts(engine, name: str, drafter, ids, params: SamplingParams, seed: int, max_j: int, *, timed: bool):
    """Draft max_j - 1 tokens twice (the first compiles); the second times a drafted token."""
    k = max_j - 1
    for rep in range(2):
        t = time.perf_counter()
        drafter.propose(ids[:PREFIX], k, params, seed).tokens.tolist()
        dt = time.perf_counter() - t
        if rep and timed:
            engine.costs[name].observe_draft(k, dt)
    drafter.reset()


def _warm_eagle(engine, name: str, drafter: EagleDrafter, ids, params: SamplingParams, seed: int, max_j: int,
                *, timed: bool) -> None:
    """An EAGLE head's catch-ups of every size one call takes (on the target's real features of the
    prefix), its chain's copy step, draft steps and trees."""
    for n in range(1, min(FEED_WHOLE, PREFIX - 1) + 1):  # each one-call catch-up, on the target's real features
        drafter.reset()
        mx.eval(drafter._feed(ids, n), drafter.arrays())
    drafter.reset()
    if params.greedy:
        logits, _, top = drafter._top(mx.zeros((1, drafter.out_weight.shape[1]), drafter.out_weight.dtype))
        _warm_copy_step(logits, top)
    _time_drafts(engine, name, drafter, ids, params, seed, max_j, timed=timed)
    _warm_tree_drafts(engine, drafter, ids, params, seed)
