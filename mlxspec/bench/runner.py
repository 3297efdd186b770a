"""Interleaved bench runs: every mode on a prompt, then the next prompt.

For each prompt and temperature every setting runs once: vanilla (the engine with
speculative=False), each speculative setting (drafter x draft length x tree setting), and the
mlx-lm peer when the engine has a draft model, in an order that rotates by one setting from one
prompt to the next. Interleaving makes slow machine drift (thermals, other load) hit all modes
alike; rotating keeps drift within a prompt's block off any one setting. Before each run the
engine's caches are dropped (`engine.reset()`), so no mode reuses another's prompt cache. Each
setting (and temperature) learns in cost models of its own, kept from prompt to prompt as a
user of that setting would have them, so two settings of one drafter never teach each other;
the device's verify-cost curve is shared.

Warm-up comes first and is timed apart, so no first-use compilation lands in a timed run.
mlxspec's settings (vanilla and every drafter x k) are covered by one `engine.warmup()`:
every verify length they can use, plain steps and model drafters, at every temperature; its
timings also seed the cost model's V(j), so the bench measures no curve of its own. mlx-lm's
peer is not the engine: it gets short untimed runs of its own on the first prompt at every
temperature, one per verify length it can use.

All modes are timed the same way: tokens generated / seconds after prompt processing
(the engine's own `GenerationStats.seconds`; the peer is prefilled to the same point).
Each non-vanilla output is checked against vanilla (see `neartie`), mlxspec's sampled ones
too (with the bench's seed a sampled output is vanilla's, token for token; mlx-lm's sampled
runs are not compared): a divergence is "rounding", "bug" or "unclassified", judged by a
float32 reference pass outside the timing.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

from ..errors import InvalidArgumentError
from ..prompts import check_fits, check_num_draft, check_tree, encode_prompt
from ..reference import UNCLASSIFIED
from ..warmup import default_max_j
from .neartie import GreedyCheck, check_greedy
from .peer import PEER_NUM_DRAFT, mlx_lm_cannot_quantize, mlx_lm_cannot_trim, run_peer
from .prompts import BenchPrompt

WARMUP_TOKENS = 8  # tokens generated per setting in the untimed warm-up


@dataclass(frozen=True)
class Setting:
    mode: str  # "vanilla" | "speculative" | "mlx-lm"
    drafter: Optional[str]  # None for vanilla; "model" for the peer
    num_draft: str  # "auto" or a number as a string; "0" for vanilla
    tree: str = "auto"  # "auto", "off" (chains only) or a node cap as a string (see Engine.stream)
    lookup: str = "on"  # a model drafter's lookup companion: "on" or "off" (see Engine)


@dataclass
class RunRecord:
    """One timed generation. The first block of fields is the bench JSON's run schema."""

    prompt_id: str
    category: str
    mode: str
    drafter: Optional[str]
    num_draft: str
    prompt_tokens: int
    prompt_seconds: float
    tokens: int
    seconds: float
    tokens_per_second: float
    rounds: int
    drafted: int
    accepted: int
    acceptance_rate: float
    tokens_per_target_pass: float
    peak_memory_bytes: int
    matches_vanilla: Optional[bool]  # True: identical or a rounding divergence; False: a bug; None: not
    # compared (mlx-lm sampling) or unclassified (no float32 reference could run); vanilla itself: True
    # -- extras ---------------------------------------------------------------------------------
    order: int = 0  # execution index within the bench (0, 1, 2, ...)
    repeat: int = 0  # which pass over the prompts (`run_bench(repeats=...)`); runs pair within one
    temperature: float = 0.0
    accept_histogram: dict = field(default_factory=dict)  # accepted per drafting round -> rounds
    k_histogram: dict = field(default_factory=dict)  # draft length per round -> rounds
    mismatch: Optional[dict] = None  # first divergence vs vanilla (GreedyCheck fields + float32 evidence)
    mlx_lm_generation_tps: Optional[float] = None  # the peer's own figure, for reference
    divergence: Optional[str] = None  # None (identical or not compared) | "rounding" | "bug" | "unclassified"
    tree: str = "auto"  # the setting's tree option
    tree_rounds: int = 0  # rounds that verified a tree (branching), not a chain
    lookup: str = "on"  # the setting's lookup option
    lookup_rounds: int = 0  # a model drafter's rounds drafted by prompt lookup instead
    lookup_drafted: int = 0  # of drafted, by those rounds
    lookup_accepted: int = 0  # of accepted, from those rounds
    step_reached: List[int] = field(default_factory=list)  # the drafter's own chain drafts judged, by position
    step_accepted: List[int] = field(default_factory=list)  # ... and accepted (GenerationStats.step_acceptance)
    output_tokens: List[int] = field(default_factory=list, repr=False)  # not written to JSON

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("output_tokens")
        return d


@dataclass
class BenchResult:
    runs: List[RunRecord]
    settings: List[Setting]
    temperatures: List[float]
    max_tokens: int
    seed: int
    default_setting: Setting  # the one summarised as `speedup_vs_vanilla`
    peer_warmup_seconds: Dict[float, float] = field(default_factory=dict)  # temperature -> the peer's untimed runs
    engine_warmup_seconds: Optional[float] = None  # `engine.warmup()`: covers every mlxspec setting
    curve: Dict[int, float] = field(default_factory=dict)  # j -> seconds of a target pass, timed by the warm-up
    planned_runs: int = 0  # runs the suite asked for; more than len(runs) when Ctrl-C cut it short

    def warmup_seconds(self, s: Setting, temperature: float) -> Optional[float]:
        """Seconds of the warm-up that covered `s`: the peer's own runs, else the shared `engine.warmup()`."""
        if s.mode == "mlx-lm":
            return self.peer_warmup_seconds.get(temperature)
        return self.engine_warmup_seconds


def settings_for(engine, *, drafters: Optional[Sequence[str]] = None, num_drafts: Sequence = ("auto",),
                 peer: bool = True, trees: Sequence = ("auto",), lookups: Sequence = ("on",),
                 tokens: int = 0) -> List[Setting]:
    """Vanilla, then drafter x num_draft x tree x lookup speculative settings, then the peer (if a
    draft model exists). A drafter that cannot propose trees runs only the first tree setting, and
    one that is free (n-gram) only lookup "on" (the others would repeat it).

    No peer where mlx-lm's speculative decoding cannot run over `tokens` positions (`peer_blocker`).
    """
    for v in lookups:
        if v not in ("on", "off"):
            raise InvalidArgumentError(f"[bench] lookup must be 'on' or 'off', got {v!r}")
    if not drafters:  # the engine's default drafter, and the draft model too when there is one
        drafters = [engine.default_drafter] + (["model"] if "model" in engine.drafters else [])
        drafters = list(dict.fromkeys(d for d in drafters if d != "none")) or ["none"]
    for d in drafters:
        if d not in engine.drafters or d == "none":
            allowed = ", ".join(n for n in engine.drafters if n != "none")
            hint = {"model": " (no draft model is loaded: the pair has none, or --draft ngram/none left it out)",
                    "eagle": " (no EAGLE head is loaded: the pair names none, or --draft ngram/none left it out; "
                             "--head gives one)"}.get(d, "")
            raise InvalidArgumentError(f"[bench] drafter {d!r} is not available{hint}; allowed: {allowed}")
    ks = []
    for k in num_drafts:
        k = int(k) if isinstance(k, str) and k.isdigit() else k
        check_num_draft(k)
        ks.append("auto" if k in (None, "auto") else str(k))
    tree_opts = []
    for t in trees:
        t = int(t) if isinstance(t, str) and t.isdigit() else t
        check_tree(t)
        tree_opts.append("auto" if t is None else str(t))
    drafters, ks, tree_opts, lookups = (list(dict.fromkeys(x)) for x in (drafters, ks, tree_opts, lookups))

    def variants(d: str, k: str):
        # A fixed length drafts chains by the drafter alone: trees and lookup rounds never run
        # (a model drafter's chains still copy or not, by lookup), so those settings would repeat one run.
        drafter, fixed = engine.drafters[d], k != "auto"
        trees_d = tree_opts if hasattr(drafter, "propose_tree") and not fixed else tree_opts[:1]
        looks = lookups if drafter.uses_model and (not fixed or hasattr(drafter, "copying")) else ["on"]
        return [(t, lk) for t in trees_d for lk in looks]

    out = [Setting("vanilla", None, "0")]
    out += [Setting("speculative", d, k, t, lk) for d in drafters for k in ks for t, lk in variants(d, k)]
    if peer and engine.draft_model is not None and peer_blocker(engine, tokens) is None:
        out.append(Setting("mlx-lm", "model", str(PEER_NUM_DRAFT)))
    return out


def peer_blocker(engine, tokens: int) -> Optional[str]:
    """Why mlx-lm's speculative decoding cannot run on the engine's models over `tokens` positions
    (`run_tokens`), or None where it can."""
    if engine.max_kv_size is not None:  # it cannot roll back a wrapped window, and without one
        return "it cannot roll back a wrapped KV window (--max-kv-size)"  # it would see what vanilla no longer does
    if engine.kv_quant is not None:
        why = mlx_lm_cannot_quantize(engine.target_model, engine.draft_model, engine.kv_quant)
        if why:
            return why
    return mlx_lm_cannot_trim(engine.target_model, engine.draft_model, tokens)


def run_tokens(engine, prompts: List[BenchPrompt], max_tokens: int, encoded: Optional[List[List[int]]] = None) -> int:
    """The most positions one run's caches hold: the longest prompt (`encoded`: the prompts' ids, if
    already encoded), the answer and a draft round."""
    if encoded is None:
        encoded = [encode_prompt(p.messages(), engine.tokenizer, engine.vocab_size) for p in prompts]
    return max(len(ids) for ids in encoded) + max_tokens + PEER_NUM_DRAFT + 1


def default_setting(engine, settings: List[Setting]) -> Setting:
    """The engine's default drafter (else the first one) at auto k (else the first k), trees auto
    (else the first tree setting)."""
    spec = [s for s in settings if s.mode == "speculative"]
    if not spec:
        return settings[0]
    drafter = engine.default_drafter if any(s.drafter == engine.default_drafter for s in spec) else spec[0].drafter
    mine = [s for s in spec if s.drafter == drafter]
    mine = [s for s in mine if s.num_draft == "auto"] or mine
    mine = [s for s in mine if s.tree == "auto"] or mine
    return next((s for s in mine if s.lookup == "on"), mine[0])


def run_bench(engine, prompts: List[BenchPrompt], *, max_tokens: int = 64, temperatures: Sequence[float] = (0.0,),
              num_drafts: Sequence = ("auto",), drafters: Optional[Sequence[str]] = None, seed: int = 0,
              peer: bool = True, warmup: bool = True, trees: Sequence = ("auto",), lookups: Sequence = ("on",),
              on_run: Optional[Callable[[RunRecord], None]] = None, on_mismatch: Optional[Callable[[RunRecord], None]] = None,
              repeats: int = 1, on_warmup: Optional[Callable[[float], None]] = None) -> BenchResult:
    """Run every setting on every prompt, interleaved, and return the records in execution order.

    Args:
        engine: an `mlxspec.Engine` (with a tokenizer; a draft model enables the mlx-lm peer).
        prompts: the suite (`mlxspec.bench.prompts`).
        max_tokens: tokens per generation. Default 64.
        temperatures: each is a full pass over the settings. Default (0.0,).
        num_drafts: draft lengths ("auto" or ints). Default ("auto",).
        drafters: drafter names. Default: the engine's default drafter.
        seed: the same seed for every run. Default 0.
        peer: run mlx-lm's speculative decoding when the engine has a draft model. Default True.
        warmup: `engine.warmup()` (every mlxspec setting, all temperatures) and the peer's untimed runs
            first, timed apart (`BenchResult.warmup_seconds`). Default True.
        trees: tree settings ("auto", "off", or node caps). Default ("auto",).
        lookups: a model drafter's lookup companion, "on" and/or "off". Default ("on",).
        on_run: called with each record as it completes (progress bars).
        on_mismatch: called with a record whose greedy output differs from vanilla other than by a
            rounding divergence (`rec.divergence` is "bug" or "unclassified").
        repeats: passes over the whole suite, each run paired with the vanilla run of its own pass
            (a machine's slow minute then moves one pair, not a category's median). Default 1.
        on_warmup: called with the warm-up's seconds (the engine's and the peer's) once it is done,
            before the first timed run (a progress line's clock starts there).
    """
    if not prompts:
        raise InvalidArgumentError("[bench] no prompts to run")
    if engine.tokenizer is None:
        raise InvalidArgumentError("[bench] the engine needs a tokenizer (prompts are chat messages)")
    if repeats < 1:
        raise InvalidArgumentError(f"[bench] repeats must be >= 1, got {repeats}")
    temps = [float(t) for t in temperatures]
    if not temps or any(t < 0 for t in temps):
        raise InvalidArgumentError(f"[bench] temperatures must be >= 0, got {list(temperatures)}")
    encoded = [encode_prompt(p.messages(), engine.tokenizer, engine.vocab_size) for p in prompts]
    for p, ids in zip(prompts, encoded):  # which prompt, before any run (the engine would say "the prompt")
        check_fits(len(ids), getattr(engine, "context", None), what=f"[bench] prompt {p.id!r}",
                   remedy="shorten it or leave it out,")
    settings = settings_for(engine, drafters=drafters, num_drafts=num_drafts, peer=peer, trees=trees,
                            lookups=lookups, tokens=run_tokens(engine, prompts, max_tokens, encoded))

    peer_warm: Dict[float, float] = {}
    engine_warm, curve = None, {}
    if warmup:  # kernels and samplers compile on first use: never inside a timed run
        fixed = [int(s.num_draft) for s in settings if s.mode == "speculative" and s.num_draft != "auto"]
        t0 = time.perf_counter()
        info = engine.warmup(temperatures=temps, max_j=max([default_max_j()] + [k + 1 for k in fixed]))
        engine_warm, curve = time.perf_counter() - t0, dict(info.get("curve") or {})
        for s in settings:
            if s.mode == "mlx-lm":
                for t in temps:
                    peer_warm[t] = _warm_up_peer(engine, s, prompts[0], encoded[0], min(WARMUP_TOKENS, max_tokens),
                                                 t, seed)
        if on_warmup is not None:
            on_warmup(time.perf_counter() - t0)

    # Each setting learns into cost models of its own (the warm-up's timings to start from), so
    # two settings of one drafter (lookup on/off, trees auto/off) do not teach each other and
    # the one that runs second starts from nothing the first learnt. The device curve is shared.
    start = engine.costs
    runs: List[RunRecord] = []
    passes = [(rep, p, ids) for rep in range(repeats) for p, ids in zip(prompts, encoded)]
    try:
        _run_blocks(engine, passes, temps, settings, start, runs, max_tokens, seed, on_run, on_mismatch)
    except KeyboardInterrupt:  # Ctrl-C: the prompts run whole still compare fairly; none yet, nothing to show
        if not runs:
            raise
    finally:
        engine.costs = start
    return BenchResult(runs, settings, temps, max_tokens, seed, default_setting(engine, settings), peer_warm,
                       engine_warm, curve, planned_runs=len(passes) * len(temps) * len(settings))


def _run_blocks(engine, passes, temps, settings, start, runs, max_tokens, seed, on_run, on_mismatch) -> None:
    """Each prompt (and temperature) under every setting, appended to `runs` a whole block at a
    time: a block cut short (Ctrl-C) leaves nothing half-measured or unchecked behind."""
    block, own = 0, {}
    for rep, p, ids in passes:
        for t in temps:
            # The order rotates from one prompt to the next, so drift within a prompt's block
            # (a machine warming up, other load) does not always fall on the same setting.
            first = block % len(settings)
            block += 1
            done: List[RunRecord] = []
            for s in settings[first:] + settings[:first]:
                if (s, t) not in own:
                    own[s, t] = copy.deepcopy(start, {id(engine.curve): engine.curve})
                engine.costs = own[s, t]
                rec = _run_one(engine, s, p, ids, max_tokens, t, seed)
                rec.order, rec.repeat = len(runs) + len(done), rep
                done.append(rec)
                if on_run is not None:
                    on_run(rec)
            # Each output against vanilla's, outside the timing (vanilla may have run last).
            vanilla = next((r for r in done if r.mode == "vanilla"), None)
            # Sampled outputs too: a seed gives plain decoding's tokens whatever drafts (the race,
            # `mlxspec.sampling`); mlx-lm samples otherwise, so its sampled runs are not compared.
            for rec in done:
                if rec.mode == "vanilla":
                    rec.matches_vanilla = True
                elif (t == 0 or rec.mode == "speculative") and vanilla is not None:
                    check = check_greedy(engine.target_model, ids, vanilla.output_tokens, rec.output_tokens,
                                         max_kv_size=engine.max_kv_size, kv_quant=engine.kv_quant,
                                         temperature=t, seed=seed)
                    rec.divergence = check.divergence
                    rec.matches_vanilla = None if rec.divergence == UNCLASSIFIED else check.ok
                    if not check.identical:
                        rec.mismatch = _mismatch_dict(check, engine.tokenizer)
                    if not check.ok and on_mismatch is not None:
                        on_mismatch(rec)
            runs.extend(done)


def _warm_up_peer(engine, s: Setting, p: BenchPrompt, ids: List[int], max_tokens: int, temperature: float,
                  seed: int) -> float:
    """Seconds of the peer's untimed runs: `max_tokens` tokens, then one run per shorter draft length
    (a round cut by max_tokens drafts fewer), so every verify length it can use has run once."""
    t0 = time.perf_counter()
    _run_one(engine, s, p, ids, max_tokens, temperature, seed)
    for n in range(1, min(int(s.num_draft), max_tokens)):
        _run_one(engine, s, p, ids, n, temperature, seed)
    return time.perf_counter() - t0


def _run_one(engine, s: Setting, p: BenchPrompt, ids: List[int], max_tokens: int, temperature: float,
             seed: int) -> RunRecord:
    engine.reset()  # cold prompt cache for every run; the cost model keeps what it learned
    if s.mode == "mlx-lm":
        r = run_peer(engine.target_model, engine.draft_model, engine.tokenizer, ids, max_tokens=max_tokens,
                     temperature=temperature, seed=seed, num_draft=int(s.num_draft), kv_quant=engine.kv_quant)
        n = len(r.tokens)
        return RunRecord(
            p.id, p.category, s.mode, s.drafter, s.num_draft, r.prompt_tokens, r.prompt_seconds, n, r.seconds,
            r.tokens_per_second, r.rounds, r.drafted, r.accepted, r.accepted / r.drafted if r.drafted else 0.0,
            n / r.rounds if r.rounds else 0.0, r.peak_memory_bytes, None, temperature=temperature,
            accept_histogram=_str_keys(r.accept_histogram), k_histogram=_str_keys(r.k_histogram),
            mlx_lm_generation_tps=r.reported_tps, output_tokens=r.tokens)
    lookup = s.lookup == "on"  # passed on only where the engine's own setting differs
    res = engine.generate(ids, max_tokens=max_tokens, temperature=temperature, seed=seed,
                          speculative=s.mode == "speculative", drafter=s.drafter,
                          num_draft="auto" if s.num_draft == "auto" else int(s.num_draft),
                          tree=s.tree if s.tree in ("auto", "off") else int(s.tree),
                          **({"lookup": lookup} if lookup != getattr(engine, "lookup", True) else {}))
    st = res.stats
    return RunRecord(
        p.id, p.category, s.mode, s.drafter, s.num_draft, st.prompt_tokens, st.prompt_seconds, st.tokens, st.seconds,
        st.tokens_per_second, st.rounds, st.drafted, st.accepted, st.acceptance_rate, st.tokens_per_target_pass,
        st.peak_memory_bytes, None, temperature=temperature, accept_histogram=_str_keys(st.accept_histogram),
        k_histogram=_str_keys(st.k_histogram), tree=s.tree, tree_rounds=st.tree_rounds, lookup=s.lookup,
        lookup_rounds=st.lookup_rounds, lookup_drafted=st.lookup_drafted, lookup_accepted=st.lookup_accepted,
        step_reached=list(st.step_reached), step_accepted=list(st.step_accepted), output_tokens=list(res.tokens))


def _str_keys(h: dict) -> dict:
    return {str(k): v for k, v in sorted(h.items())}


def _mismatch_dict(check: GreedyCheck, tokenizer) -> dict:
    def show(t):
        return None if t is None else tokenizer.decode([t])

    evidence = check.judgement.as_dict() if check.judgement is not None else {
        "divergence": check.divergence, "reason": "the outputs end differently"}
    return {"position": check.position, "vanilla_token": check.expected, "token": check.got,
            "vanilla_text": show(check.expected), "text": show(check.got),
            "logprob_gap": check.logprob_gap, "near_tie": check.near_tie, **evidence}
