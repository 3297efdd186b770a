"""This device's verify-cost curve V(j), measured once and kept in the mlxspec cache.

V(j) is the time of one target pass over j tokens (forward, argmax, host read) after a
short KV prefix; the cost model needs its shape, V(j)/V(1), to judge how long a draft can
be before verifying it costs more than it saves. On a GPU the curve is flat for small j
(memory-bound), on a CPU it grows almost linearly. Each j is timed `repeats` times in
round-robin order (so drift hits all j alike) and the median kept.

The drafters' cost per drafted token, relative to one target step, is measured too.

File: `$MLXSPEC_HOME/calibration.json` (default home: `platformdirs.user_cache_dir("mlxspec")`),
    {"format": 1, "models": {<model key>: {"ratios": {"1": 1.0, "2": ...}, "seconds": {...},
                                           "draft_cost": {"ngram": ..., "model": ...}, ...}}}
keyed by `model_key(model)`: class, layers, hidden size, vocab, weights bytes, dtypes, backend
(and on the CPU the BLAS).
MLX is imported inside the functions, so `mlxspec --help` stays fast.
"""

from __future__ import annotations

import json
import math
import statistics
import time
import warnings
from pathlib import Path
from typing import Dict, List, Optional

from . import blas
from .device import backend, device_name
from .errors import InvalidArgumentError, MlxSpecError
from .files import locked, write_atomic
from .once import SaidOnce
from .paths import cache_dir

FORMAT = 1
MAX_J = 16  # longest pass timed (tokens)
PREFIX = 32  # KV prefix before the timed passes (tokens)
REPEATS = 7  # timings per j (median kept)


def calibration_path() -> Path:
    return cache_dir() / "calibration.json"


def model_key(model) -> str:
    """Identifies a model as loaded on this backend, e.g. "llama.Model/L30/H576/V49152/B103M.../float32/cpu+openblas"
    (on the CPU the BLAS MLX's matmuls use is part of it)."""
    from mlx.utils import tree_flatten

    from .modelmeta import logit_width, weights_bytes

    args = getattr(model, "args", None)
    layers = len(getattr(model, "layers", []) or [])
    hidden = getattr(args, "hidden_size", None)
    dtypes = sorted({str(v.dtype).replace("mlx.core.", "") for _, v in tree_flatten(model.parameters())})
    cls = f"{type(model).__module__.rsplit('.', 1)[-1]}.{type(model).__name__}"
    where = backend()
    if where == "cpu":  # the BLAS sets the CPU's curve (mlxspec.blas): a curve is not carried across
        where += "+" + blas.info()["name"]
    return f"{cls}/L{layers}/H{hidden}/V{logit_width(model)}/B{weights_bytes(model)}/{'+'.join(dtypes)}/{where}"


# -- measuring -------------------------------------------------------------------------------------
def _prefix_ids(model, n: int) -> List[int]:
    from .modelmeta import logit_width

    v = logit_width(model)
    return [(17 + 31 * i) % v for i in range(n)]  # deterministic, spread over the vocabulary


def measure_verify_seconds(model, *, max_j: int = MAX_J, prefix: int = PREFIX, repeats: int = REPEATS,
                           warmup: int = 2) -> Dict[int, float]:
    """Median seconds of a pass over j = 1..max_j tokens after `prefix` cached tokens.

    Args:
        model: an mlx-lm model (the target).
        max_j: longest pass. Default 16.
        prefix: KV tokens in the cache before each pass. Default 32.
        repeats: timed passes per j (median kept). Default 7.
        warmup: untimed rounds over every j first. Default 2.
    """
    import mlx.core as mx

    from .prompts import MAX_DRAFT
    from .sequence import Sequence

    if max_j < 1 or repeats < 1 or prefix < 1:
        raise InvalidArgumentError(f"[calibrate] max_j, repeats and prefix must be >= 1, got {max_j}, {repeats}, {prefix}")
    seq = Sequence(model, max_kv_size=None, headroom=max(MAX_DRAFT, max_j) + 1)
    ids = _prefix_ids(model, prefix + max_j)
    seq.prefill(ids[:prefix])
    times: Dict[int, List[float]] = {j: [] for j in range(1, max_j + 1)}
    for rep in range(warmup + repeats):
        for j in range(1, max_j + 1):
            t0 = time.perf_counter()
            logits = seq.forward(ids[prefix:prefix + j])
            mx.argmax(logits, axis=-1).tolist()  # the engine's verify ends in one host read too
            dt = time.perf_counter() - t0
            seq.rollback(j)
            if rep >= warmup:
                times[j].append(dt)
    return {j: statistics.median(ts) for j, ts in times.items()}


def measure_ngram_seconds(*, history: int = 512, k: int = 8, repeats: int = 50) -> float:
    """Median seconds per drafted token of the n-gram drafter on a self-repeating history."""
    from .drafters import NgramDrafter
    from .sampling import SamplingParams

    base = [(7 * i) % 97 for i in range(history // 2)]
    hist = base + base
    d = NgramDrafter()
    params = SamplingParams()
    d.propose(hist, k, params, None)  # builds the index once, as the engine's first round does
    times = []
    for i in range(repeats):
        hist.append(base[i % len(base)])
        t0 = time.perf_counter()
        n = len(d.propose(hist, k, params, None).tokens)
        times.append((time.perf_counter() - t0) / max(1, n))
    return statistics.median(times)


def calibrate(target_model, draft_model=None, *, max_j: int = MAX_J, prefix: int = PREFIX,
              repeats: int = REPEATS) -> dict:
    """Measure V(j) for the target and the drafters' per-token cost; returns the entry `save` stores."""
    seconds = measure_verify_seconds(target_model, max_j=max_j, prefix=prefix, repeats=repeats)
    v1 = seconds[1]
    draft_cost = {"ngram": measure_ngram_seconds() / v1}
    if draft_model is not None:
        d = measure_verify_seconds(draft_model, max_j=1, prefix=prefix, repeats=repeats)
        draft_cost["model"] = d[1] / v1
    return {
        "key": model_key(target_model),
        "backend": backend(),
        "device": device_name(),
        "ratios": {str(j): s / v1 for j, s in seconds.items()},
        "seconds": {str(j): s for j, s in seconds.items()},
        "draft_cost": draft_cost,  # seconds per drafted token / seconds of one target step
        "draft_key": model_key(draft_model) if draft_model is not None else None,
        "prefix": prefix,
        "repeats": repeats,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


# -- the file -------------------------------------------------------------------------------------
def read_file(path: Optional[Path] = None) -> dict:
    """The calibration document; an empty one when the file does not exist."""
    path = Path(path) if path else calibration_path()
    if not path.exists():
        return {"format": FORMAT, "models": {}}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise MlxSpecError(f"[calibrate] cannot read {path}: {e}; delete it and run `mlxspec calibrate` again") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), dict):
        raise MlxSpecError(f"[calibrate] {path} is not a calibration file (no 'models' object); delete it and recalibrate")
    return doc


def unreadable(path: Optional[Path] = None) -> Optional[str]:
    """Why the calibration file cannot be read (None: it can, or there is none)."""
    try:
        read_file(path)
    except MlxSpecError as e:
        return str(e)
    return None


def save(entry: dict, path: Optional[Path] = None, *, replace_unreadable: bool = False) -> Path:
    """Store `entry` (from `calibrate`) under its key, keeping other models' entries. Returns the path.

    A model drafter's cost saved before is kept when `entry` has none (a later calibration with
    another drafter). `replace_unreadable`: an unreadable file is moved to `<name>.bad` and a new
    one started (else MlxSpecError). MlxSpecError also when the folder cannot be written."""
    path = Path(path) if path else calibration_path()

    def update(entry=entry):
        path.parent.mkdir(parents=True, exist_ok=True)
        with locked(path):  # two calibrations saving at once: each keeps the other's entry
            try:
                doc = read_file(path)
            except MlxSpecError:
                if not replace_unreadable:
                    raise
                doc = {"models": {}}
                path.replace(bad_copy(path))
            old = doc["models"].get(entry["key"])
            if isinstance(old, dict) and entry.get("draft_key") is None and old.get("draft_key"):
                model_cost = _model_cost(old)
                if model_cost is not None:
                    entry = dict(entry, draft_key=old["draft_key"],
                                 draft_cost={**entry["draft_cost"], "model": model_cost})
            doc["format"] = FORMAT
            doc["models"][entry["key"]] = entry
            write_atomic(path, json.dumps(doc, indent=2) + "\n")  # never half a file, even interrupted

    _write_step(update, path)
    return path


def bad_copy(path: Path) -> Path:
    """Where an unreadable calibration file is kept when a new one replaces it: <name>.bad, or
    .bad.2, .bad.3... beside an earlier one (never over it)."""
    n, candidate = 1, path.with_name(path.name + ".bad")
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.bad.{n}")
    return candidate


def implausible(entry: dict, *, slack: float = 0.85) -> list:
    """The lengths whose timing is implausible in a calibration: a pass over j tokens that took
    under `slack` of a shorter pass's time. More tokens never cost less; a timing that fast or
    that slow was disturbed (another process, a clock change), and a curve with it would seed the
    cost model wrong. Returns "V(j)/V(1) r after V(i)/V(1) q" descriptions (empty: plausible)."""
    ratios = {int(j): float(r) for j, r in entry["ratios"].items()}
    said, top, at = [], 0.0, 1
    for j in sorted(ratios):
        if ratios[j] < slack * top:
            said.append(f"V({j})/V(1) {ratios[j]:.2f} after V({at})/V(1) {top:.2f}")
        if ratios[j] > top:
            top, at = ratios[j], j
    return said


def _write_step(step, path: Path) -> None:
    try:
        step()
    except OSError as e:
        raise MlxSpecError(f"[calibrate] cannot write {path}: {e.strerror or e}; make the folder writable, set "
                           f"MLXSPEC_HOME to a writable folder, or pass --no-save") from None


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _model_cost(entry: dict) -> Optional[float]:
    """An entry's saved cost of the draft model's drafted token, or None (none, or damaged)."""
    costs = entry.get("draft_cost")
    value = costs.get("model") if isinstance(costs, dict) else None
    return float(value) if _positive(value) else None


_SAID = SaidOnce(64)  # warnings about an unreadable file already given (loading and the bench both read it)


def load_entry(model, path: Optional[Path] = None) -> Optional[dict]:
    """The saved entry for this model on this backend, or None (no file, no entry, unreadable file:
    said in a warning, as the engine then starts from its guess)."""
    try:
        doc = read_file(path)
    except MlxSpecError as e:
        said = f"{e} (until then the engine starts from its guess of this device's costs)"
        if _SAID.first(said):
            warnings.warn(said, stacklevel=3)
        return None
    entry = doc["models"].get(model_key(model))
    return entry if isinstance(entry, dict) else None


def load_prior(model, path: Optional[Path] = None) -> Optional[Dict[int, float]]:
    """Saved V(j)/V(1) ratios for `model` on this backend ({1: 1.0, 2: ..., 16: ...}), or None.

    Pass the result as `Engine(..., cost_prior=load_prior(target_model))`.
    """
    return _ratios(load_entry(model, path), path)


def check_ratios(ratios) -> Optional[Dict[int, float]]:
    """V(j)/V(1) ratios as {j: ratio}: lengths j >= 1 (1 among them), finite positive ratios.
    None passes; anything else raises InvalidArgumentError saying what is wrong."""
    if ratios is None:
        return None
    try:
        out = {int(j): float(r) for j, r in dict(ratios).items()}
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"cost_prior must map pass lengths to V(j)/V(1) ratios, e.g. {{1: 1.0, 2: 1.2}}; "
                                   f"got {type(ratios).__name__} ({e})") from None
    bad = [f"{j}: {r}" for j, r in out.items() if j < 1 or not _positive(r)]
    if bad or (out and 1 not in out):
        why = f"lengths must be >= 1 and ratios finite and > 0, got {', '.join(bad[:4])}" if bad else "it has no length 1"
        raise InvalidArgumentError(f"cost_prior is not a V(j)/V(1) curve: {why}")
    return out


def _ratios(entry: Optional[dict], path: Optional[Path] = None) -> Optional[Dict[int, float]]:
    """An entry's V(j)/V(1) ratios, or None when it has none (a damaged curve: ignored, with a
    warning naming the file, `path` or the default one)."""
    if not entry or entry.get("ratios") is None:
        return None
    try:
        return check_ratios(entry["ratios"]) or None
    except InvalidArgumentError as e:
        warnings.warn(f"ignoring the saved calibration of this model in {Path(path) if path else calibration_path()} "
                      f"({e}); run `mlxspec calibrate` again", stacklevel=3)
        return None


def priors_for(target_model, draft_model=None) -> tuple:
    """(V(j)/V(1) ratios or None, the draft model's cost per token / one target step or None)."""
    entry = load_entry(target_model) or {}
    ratios = _ratios(entry)
    draft_ratio = None
    if draft_model is not None and entry.get("draft_key") == model_key(draft_model):
        draft_ratio = _model_cost(entry)
    return ratios, draft_ratio


# V(j)/V(1) = 1 + slope * (j - 1) until measured (and no calibration file says otherwise): GPUs verify
# several tokens for about the price of one; a CPU's price depends on what its matmuls run on.
# Measured on 2 x86 cores, demo target, warm-up curves against the pipelined plain step (the
# interpolation's anchor): float32 on OpenBLAS V(2) = 1.2x (1.5x at 5 tokens), bfloat16 1.5x,
# quantized 1.9x. A slope too steep is worse than one too shallow: it can keep drafting from
# ever being tried, while a first round at an optimistic guess times the real V.
PRIOR_SLOPE = {"metal": 0.1, "cuda": 0.1, "cpu": 0.5}
CPU_PRIOR_SLOPE = {"float32": 0.2, "bfloat16": 0.5, "float16": 0.5, "quantized": 0.9}


def prior_slope(target_model) -> float:
    """The cost model's V(j)/V(1) slope for this target on this device, before anything is timed."""
    kind = backend()
    if kind != "cpu":
        return PRIOR_SLOPE[kind]
    from .modelmeta import matmul_precision

    precision = matmul_precision(target_model)
    if precision == "float32" and not blas.fast():
        return CPU_PRIOR_SLOPE["quantized"]  # the reference BLAS: k rows cost nearly k single rows
    return CPU_PRIOR_SLOPE.get(precision, PRIOR_SLOPE["cpu"])


def curve_for(engine, *, measure: bool = True, repeats: int = 3) -> tuple:
    """(ratios, source) for the engine's target; source is "calibration file", "measured on the fly" or "none".

    Uses the saved curve when there is one, else (if `measure`) a quick measurement (`repeats`
    timings per j, default 3), else nothing (the cost model's default slope).
    """
    prior = load_prior(engine.target_model)
    if prior:
        return prior, "calibration file"
    if not measure:
        return None, "none"
    secs = measure_verify_seconds(engine.target_model, repeats=repeats, warmup=1)
    return {j: s / secs[1] for j, s in secs.items()}, "measured on the fly"


def apply_prior(engine, ratios: Optional[Dict[int, float]]) -> None:
    """Give every cost model of `engine` these V(j)/V(1) ratios (what `Engine(cost_prior=...)` does)."""
    if ratios:
        engine.set_cost_prior(ratios)
